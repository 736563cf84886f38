//! Addressing symmetric windows (`include/symcomm/window.cuh`).
//!
//! A window is symmetric memory: every rank has a copy of the same size and every rank can load
//! and store every copy. Flat layout: rank r's copy starts at `base + r * stride`, so a peer
//! address is one multiply-add. Kernels receive [`WindowHandleRaw`] from the host by value and
//! view it as [`WindowHandle<T>`]; the library's operations take [`WindowSlice<T>`]
//! (`win.at(offset)`, like `&window[offset..]`).
//!
//! The addressing functions do not check (one multiply-add in inner loops); the operations of
//! the library do, once at entry. Kernels that address windows themselves check with
//! [`WindowHandle::fits`] and [`WindowHandle::holds`].

use core::marker::PhantomData;

use crate::abi::{SYMCOMM_DTYPE_NONE, SYMCOMM_RANK_REMOTE, WindowHandleRaw};

/// A window of elements of type `T`: the typed view of a [`WindowHandleRaw`]. Plain data.
///
/// Constructing one from a raw handle of another element type is allowed; the library's
/// operations check [`holds`](Self::holds) at entry.
#[repr(transparent)]
pub struct WindowHandle<T> {
    /// The handle the host built.
    pub raw: WindowHandleRaw,
    _t: PhantomData<*mut T>,
}

impl<T> Clone for WindowHandle<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for WindowHandle<T> {}

impl<T> WindowHandle<T> {
    /// The typed view of `raw`.
    #[inline(always)]
    pub fn new(raw: WindowHandleRaw) -> Self {
        WindowHandle {
            raw,
            _t: PhantomData,
        }
    }

    /// Element `index` of rank `peer`'s copy. Pre (not checked): `peer < nranks()`,
    /// `index <= count()`; dereferencing is the caller's `unsafe`.
    #[inline(always)]
    pub fn peer_ptr(&self, peer: u32, index: u64) -> *mut T {
        let addr = self.raw.base
            + u64::from(peer) * self.raw.stride
            + index * core::mem::size_of::<T>() as u64;
        addr as usize as *mut T
    }

    /// Element `index` of this rank's copy.
    #[inline(always)]
    pub fn local_ptr(&self, index: u64) -> *mut T {
        self.peer_ptr(self.raw.rank, index)
    }

    /// Elements per rank.
    #[inline(always)]
    pub fn count(&self) -> u64 {
        match core::mem::size_of::<T>() as u64 {
            0 => 0,
            n => self.raw.bytes / n,
        }
    }

    /// Ranks sharing the window.
    #[inline(always)]
    pub fn nranks(&self) -> u32 {
        self.raw.nranks
    }

    /// The rank this handle belongs to.
    #[inline(always)]
    pub fn rank(&self) -> u32 {
        self.raw.rank
    }

    /// Whether rank `peer` runs on this host, so that its copy is mapped here and plain loads
    /// and stores reach it ([`peer_ptr`](Self::peer_ptr), `put`, `get`). A rank of another host
    /// (communicators across hosts) is reached with signals and `put_with_signal`, through the
    /// proxy. False for `peer >= nranks()`.
    #[inline(always)]
    pub fn on_this_host(&self, peer: u32) -> bool {
        if peer >= self.raw.nranks {
            return false;
        }
        if self.raw.ranks == 0 {
            return true;
        }
        let table = self.raw.ranks as usize as *const u32;
        // SAFETY: a non-zero `ranks` is the host's table of `nranks` u32 entries (abi.h), alive
        // while the window is; `peer < nranks` (checked above).
        unsafe { *table.add(peer as usize) != SYMCOMM_RANK_REMOTE }
    }

    /// Whether elements of `T` may address the window: its element size is `size_of::<T>()`,
    /// or it is a byte window (element size 1), which any `T` may view.
    #[inline(always)]
    pub fn holds(&self) -> bool {
        self.raw.elem_size as usize == core::mem::size_of::<T>() || self.raw.elem_size == 1
    }

    /// Whether the window may hold elements of type code `dtype` (`SYMCOMM_DTYPE_*`): its own
    /// code, or `SYMCOMM_DTYPE_NONE`.
    #[inline(always)]
    pub fn holds_dtype(&self, dtype: u32) -> bool {
        self.raw.dtype == SYMCOMM_DTYPE_NONE || self.raw.dtype == dtype
    }

    /// Whether `blocks` consecutive blocks of `n` elements from element `index` lie inside each
    /// rank's copy. Exact for every argument (a product or sum that would wrap does not fit); an
    /// empty range fits at any index.
    #[inline(always)]
    pub fn fits(&self, index: u64, n: u64, blocks: u64) -> bool {
        if n == 0 || blocks == 0 {
            return true;
        }
        let cap = self.count();
        if n > cap / blocks {
            return false;
        }
        index <= cap && n * blocks <= cap - index
    }

    /// The slice of the window from element `offset` (what collectives and put / get take).
    #[inline(always)]
    pub fn at(&self, offset: u64) -> WindowSlice<T> {
        WindowSlice {
            window: *self,
            offset,
        }
    }
}

/// Elements of a window from element `offset` on, in every rank's copy (`window[offset..]`).
/// Element indices below are relative to `offset`.
pub struct WindowSlice<T> {
    /// The window.
    pub window: WindowHandle<T>,
    /// First element of the slice, in elements of `T` from the start of each rank's copy.
    pub offset: u64,
}

impl<T> Clone for WindowSlice<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for WindowSlice<T> {}

impl<T> WindowSlice<T> {
    /// Element `offset + i` of rank `peer`'s copy (not checked; see [`fits`](Self::fits)).
    #[inline(always)]
    pub fn peer_ptr(&self, peer: u32, i: u64) -> *mut T {
        self.window.peer_ptr(peer, self.offset + i)
    }

    /// Element `offset + i` of this rank's copy.
    #[inline(always)]
    pub fn local_ptr(&self, i: u64) -> *mut T {
        self.window.local_ptr(self.offset + i)
    }

    /// The slice from element `offset + i` of the same window.
    #[inline(always)]
    pub fn at(&self, i: u64) -> WindowSlice<T> {
        self.window.at(self.offset + i)
    }

    /// Ranks sharing the window.
    #[inline(always)]
    pub fn nranks(&self) -> u32 {
        self.window.nranks()
    }

    /// [`WindowHandle::on_this_host`].
    #[inline(always)]
    pub fn on_this_host(&self, peer: u32) -> bool {
        self.window.on_this_host(peer)
    }

    /// [`WindowHandle::holds`].
    #[inline(always)]
    pub fn holds(&self) -> bool {
        self.window.holds()
    }

    /// [`WindowHandle::holds_dtype`].
    #[inline(always)]
    pub fn holds_dtype(&self, dtype: u32) -> bool {
        self.window.holds_dtype(dtype)
    }

    /// Whether elements `[offset, offset + blocks * n)` lie inside each rank's copy.
    #[inline(always)]
    pub fn fits(&self, n: u64, blocks: u64) -> bool {
        self.window.fits(self.offset, n, blocks)
    }
}

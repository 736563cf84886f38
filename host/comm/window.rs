//! Symmetric windows: the same number of elements on every rank, every rank's copy addressable
//! by every rank's kernels.

use std::marker::PhantomData;
use std::sync::Arc;

use symcomm_device::abi::WindowHandleRaw;

use super::Communicator;
use super::memory::FlatMapping;
use crate::DevicePlain;
use crate::{Error, Result};

/// A symmetric window of `len()` elements of `T` per rank, allocated by
/// [`Communicator::alloc_window`].
///
/// Shared ownership, as in cudarc: a window holds its communicator (an [`Arc`]), so a struct
/// may keep both a communicator and its windows, and a window may outlive the caller's
/// communicator handle — the communicator is destroyed (goodbye to the peers, control plane
/// closed) when its last holder drops: the caller's handle, a window, or a [`Graph`] that
/// captured collectives of it.
///
/// Dropping a window unmaps this rank's view of every copy. That is not collective and is safe
/// for the peers: each rank's mappings keep the memory alive until that rank drops its own
/// window. The drop first waits for the host collectives already issued on this communicator;
/// collectives captured into a [`Graph`] keep the mapping alive instead, until the graph (and
/// its last launch) is gone. Kernels of your own that use the window must have finished (their
/// launch is `unsafe` for that).
///
/// [`Graph`]: crate::Graph
pub struct Window<T> {
    /// Declared first: unmapped (when no graph holds it) before the communicator may go.
    mapping: Arc<FlatMapping>,
    comm: Arc<Communicator>,
    count: usize,
    _elem: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Window<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("rank", &self.comm.rank())
            .field("len", &self.count)
            .field("elem", &std::any::type_name::<T>())
            .field("base", &format_args!("{:#x}", self.mapping.base()))
            .field("stride", &self.mapping.stride())
            .finish()
    }
}

/// The device handle of a window of `T` (`symcomm::WindowHandle<T>` in C++): the raw handle
/// with its element type. Pass it to kernels by value.
#[repr(transparent)]
pub struct WindowHandle<T> {
    raw: WindowHandleRaw,
    _elem: PhantomData<fn() -> T>,
}

impl<T> Clone for WindowHandle<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for WindowHandle<T> {}

impl<T> std::fmt::Debug for WindowHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("WindowHandle").field(&self.raw).finish()
    }
}

impl<T> Drop for Window<T> {
    // Waits for the queued host collectives; then the fields drop: the mapping's last holder
    // unmaps it (this window, or a graph that captured work on it), and the communicator goes
    // with its last holder.
    fn drop(&mut self) {
        self.comm.quiesce();
        self.comm.forget_region(self.mapping.id());
    }
}

// SAFETY: `repr(transparent)` over `WindowHandleRaw` (plain integers: device addresses, sizes,
// ranks; every bit pattern valid), whose C++ twin `WindowHandle<T>` kernels take by value.
unsafe impl<T: 'static> DevicePlain for WindowHandle<T> {}

impl<T> WindowHandle<T> {
    /// The untyped handle (`WindowHandleRaw`), as the built-in kernels take it.
    pub fn raw(&self) -> WindowHandleRaw {
        self.raw
    }
}

impl<T: DevicePlain> Window<T> {
    pub(super) fn new(comm: Arc<Communicator>, mapping: FlatMapping, count: usize) -> Self {
        Window {
            mapping: Arc::new(mapping),
            comm,
            count,
            _elem: PhantomData,
        }
    }

    /// Elements per rank.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the window has no elements (never: allocation refuses that).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes per rank.
    pub fn bytes(&self) -> u64 {
        (self.count * size_of::<T>()) as u64
    }

    /// The communicator this window belongs to (clone the [`Arc`] to keep it).
    pub fn communicator(&self) -> &Arc<Communicator> {
        &self.comm
    }

    /// The mapping, which graphs that capture work on the window keep alive.
    pub(super) fn mapping(&self) -> &Arc<FlatMapping> {
        &self.mapping
    }

    /// The device handle for kernels: rank r's copy at `base + r * stride`, with the element
    /// size and type code of `T` ([`DevicePlain::DTYPE`]), against which the device library's
    /// collectives and put / get check every range and type before touching memory.
    pub fn device_handle(&self) -> WindowHandle<T> {
        WindowHandle {
            raw: self.mapping.handle(
                self.comm.rank(),
                self.bytes(),
                size_of::<T>() as u32,
                T::DTYPE,
            ),
            _elem: PhantomData,
        }
    }

    fn check_range(&self, rank: u32, offset: usize, len: usize) -> Result<u64> {
        if rank >= self.comm.nranks() {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} of a window of {} ranks",
                self.comm.nranks()
            )));
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.count => Ok((offset * size_of::<T>()) as u64),
            _ => Err(Error::InvalidArgument(format!(
                "elements {offset}..{offset}+{len} are outside a window of {} elements",
                self.count
            ))),
        }
    }

    /// Copies `data` into this rank's copy from element `offset`. Synchronous; no kernel may
    /// be using that range.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] out of bounds; [`Error::Cuda`].
    pub fn write(&self, offset: usize, data: &[T]) -> Result<()> {
        self.write_rank(self.comm.rank(), offset, data)
    }

    /// Copies `data` into rank `rank`'s copy (a peer's, through the flat mapping) from element
    /// `offset`. Synchronous; no kernel may be using that range.
    ///
    /// # Errors
    /// As [`Self::write`].
    pub fn write_rank(&self, rank: u32, offset: usize, data: &[T]) -> Result<()> {
        let at = self.check_range(rank, offset, data.len())?;
        // SAFETY: `T: DevicePlain` has no padding, so its bytes are initialized.
        let bytes = unsafe {
            std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data))
        };
        self.mapping.write(rank, at, bytes)
    }

    /// Copies this rank's copy from element `offset` into `out`. Synchronous.
    ///
    /// # Errors
    /// As [`Self::write`].
    pub fn read(&self, offset: usize, out: &mut [T]) -> Result<()> {
        self.read_rank(self.comm.rank(), offset, out)
    }

    /// Copies rank `rank`'s copy from element `offset` into `out`. Synchronous.
    ///
    /// # Errors
    /// As [`Self::write`].
    pub fn read_rank(&self, rank: u32, offset: usize, out: &mut [T]) -> Result<()> {
        let at = self.check_range(rank, offset, out.len())?;
        // SAFETY: `T: DevicePlain` accepts every bit pattern, so any bytes written are a valid
        // `T`.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(
                out.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(out),
            )
        };
        self.mapping.read(rank, at, bytes)
    }

    /// This rank's copy as a vector. Synchronous.
    ///
    /// # Errors
    /// As [`Self::write`].
    pub fn to_vec(&self) -> Result<Vec<T>>
    where
        T: Default + Clone,
    {
        let mut v = vec![T::default(); self.count];
        self.read(0, &mut v)?;
        Ok(v)
    }
}

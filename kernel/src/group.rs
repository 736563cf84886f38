//! Cooperating groups, the first argument of every primitive (`include/symcomm/group.cuh`).
//!
//! A group names which threads call a primitive together. Every thread of the group must make
//! the same call with the same arguments (a collective call of the group); the primitive's
//! contract says which threads do the work and what holds on return.
//!
//! | group      | threads                              | `sync()`            |
//! |------------|--------------------------------------|---------------------|
//! | [`Thread`] | one thread acting alone              | nothing             |
//! | [`Warp`]   | the 32 threads of a full warp        | `bar.warp.sync`     |
//! | [`Cta`]    | every thread of the thread block     | `bar.sync 0`        |
//!
//! The size of a `Cta` is `block_dim().x * block_dim().y * block_dim().z`; `thread_rank()` is
//! the linear thread index. A `Warp` must be complete (a block size that is a multiple of 32).

use crate::arch;

/// Linear index of the calling thread in its CTA (`x + dim.x * (y + dim.y * z)`).
#[inline(always)]
pub fn linear_thread_index() -> u32 {
    let t = arch::thread_idx();
    let d = arch::block_dim();
    t.x + d.x * (t.y + d.y * t.z)
}

/// A cooperating group (see the module docs). Sealed: [`Thread`], [`Warp`] and [`Cta`].
pub trait Group: Copy + sealed::Sealed {
    /// The group's code at the C ABI of the device library (`kernel/ffi.cu`).
    #[doc(hidden)]
    const CODE: u32;
    /// The calling thread's index in the group.
    fn thread_rank(self) -> u32;
    /// Threads in the group.
    fn size(self) -> u32;
    /// Synchronizes the group (a collective call of the group), ordering memory among its
    /// threads.
    fn sync(self);
    /// Synchronizes the group like `sync()` and returns whether `pred` held on any thread.
    fn any(self, pred: bool) -> bool;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Thread {}
    impl Sealed for super::Warp {}
    impl Sealed for super::Cta {}
}

/// One thread acting alone.
#[derive(Debug, Clone, Copy, Default)]
pub struct Thread;

/// The 32 threads of the calling warp.
#[derive(Debug, Clone, Copy, Default)]
pub struct Warp;

/// Every thread of the calling CTA (thread block).
#[derive(Debug, Clone, Copy, Default)]
pub struct Cta;

impl Group for Thread {
    const CODE: u32 = 0;
    #[inline(always)]
    fn thread_rank(self) -> u32 {
        0
    }
    #[inline(always)]
    fn size(self) -> u32 {
        1
    }
    #[inline(always)]
    fn sync(self) {}
    #[inline(always)]
    fn any(self, pred: bool) -> bool {
        pred
    }
}

impl Group for Warp {
    const CODE: u32 = 1;
    #[inline(always)]
    fn thread_rank(self) -> u32 {
        linear_thread_index() % 32
    }
    #[inline(always)]
    fn size(self) -> u32 {
        32
    }
    #[inline(always)]
    fn sync(self) {
        arch::sync_warp();
    }
    #[inline(always)]
    fn any(self, pred: bool) -> bool {
        arch::warp_any(pred)
    }
}

impl Group for Cta {
    const CODE: u32 = 2;
    #[inline(always)]
    fn thread_rank(self) -> u32 {
        linear_thread_index()
    }
    #[inline(always)]
    fn size(self) -> u32 {
        let d = arch::block_dim();
        d.x * d.y * d.z
    }
    #[inline(always)]
    fn sync(self) {
        arch::sync_threads();
    }
    #[inline(always)]
    fn any(self, pred: bool) -> bool {
        arch::sync_threads_or(pred)
    }
}

//! Symmetric memory in the flat layout (DESIGN §3): every rank's copy of a window mapped into
//! one reserved virtual range, rank r's copy at `base + r * stride`, on both backends.
//!
//! - Emulator: each rank's copy is a `memfd` of `stride` bytes (zero-filled by the kernel). Its
//!   fd goes to the other local ranks ([`super::fdpass`]); each rank reserves `nranks * stride`
//!   bytes of address space (`PROT_NONE`) and maps every rank's memfd over its slot with
//!   `MAP_SHARED | MAP_FIXED`. Ranks that are threads of one process map the same memory at
//!   several addresses, exactly as separate processes do (see
//!   [`crate::backend::emu::memory::MemfdRange`]).
//! - CUDA: each rank's copy is a VMM allocation (`cuMemCreate`) exported as a POSIX fd; the
//!   fds travel the same way; each rank reserves a device virtual range, imports and maps every
//!   copy, and enables access for its GPU (see [`crate::backend::cuda::VmmRange`]).
//!
//! Fds are closed once mapped: the mappings keep the memory alive, and a rank that unmaps its
//! view leaves the others' views intact, so freeing never pulls memory from under a peer.

use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use symcomm_device::abi::{ErrorRecord, WindowHandleRaw};

use crate::backend::cuda::{HostMapped, VmmRange, VmmSegment};
use crate::backend::emu::memory::{self as emu, HeapBlock, MemfdRange};
use crate::backend::{Backend, PerBackend, on_backend};
use crate::{Error, Result};

/// Size granularity of one rank's copy on `backend`.
pub(crate) fn granularity(backend: &Backend) -> Result<u64> {
    on_backend!(backend.make(VmmSegment::granularity, || Ok(emu::granularity()))?, g => Ok(g))
}

/// This rank's copy of a window, before mapping, exportable as an fd: a VMM allocation and its
/// exported fd on CUDA, a memfd of `stride` bytes on the emulator.
pub(crate) struct Segment(PerBackend<VmmSegment, OwnedFd>);

impl Segment {
    /// Allocates `stride` bytes (a multiple of [`granularity`]) of zero-initialized memory.
    pub(crate) fn create(backend: &Backend, stride: u64, label: &str) -> Result<Self> {
        backend
            .make(
                |d| VmmSegment::create(d, stride),
                || emu::create_memfd(stride, label),
            )
            .map(Segment)
    }

    /// The fd to pass to the other local ranks.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        on_backend!(&self.0, s => s.as_fd())
    }
}

/// Every local rank's copy mapped in the flat layout; unmapped on drop.
pub(crate) struct FlatMapping {
    base: u64,
    stride: u64,
    nranks: u32,
    /// `None` once handed to `crate::sync_free` by the mapping's drop.
    range: Option<PerBackend<VmmRange, MemfdRange>>,
}

impl std::fmt::Debug for FlatMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlatMapping")
            .field("base", &format_args!("{:#x}", self.base))
            .field("stride", &self.stride)
            .field("nranks", &self.nranks)
            .finish_non_exhaustive()
    }
}

impl FlatMapping {
    /// Maps `fds[r]` (rank r's copy, `stride` bytes each) at `base + r * stride`.
    pub(crate) fn map(backend: &Backend, stride: u64, fds: Vec<OwnedFd>) -> Result<Self> {
        let nranks = u32::try_from(fds.len())
            .map_err(|_| Error::InvalidArgument("too many ranks".into()))?;
        let total = stride
            .checked_mul(u64::from(nranks))
            .and_then(|t| usize::try_from(t).ok())
            .and_then(NonZeroUsize::new)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "a window of {stride} bytes x {nranks} ranks does not fit the address space"
                ))
            })?;
        let range = match backend {
            Backend::Cuda(d) => PerBackend::Cuda(VmmRange::map(d, stride, fds)?),
            Backend::Emu => PerBackend::Emu(MemfdRange::map(stride, total, &fds)?),
        };
        Ok(FlatMapping {
            base: on_backend!(&range, r => r.base()),
            stride,
            nranks,
            range: Some(range),
        })
    }

    fn range(&self) -> &PerBackend<VmmRange, MemfdRange> {
        self.range
            .as_ref()
            .unwrap_or_else(|| unreachable!("a mapping is released only by its drop"))
    }

    /// Device address of rank 0's copy.
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    /// Bytes between consecutive ranks' copies.
    pub(crate) fn stride(&self) -> u64 {
        self.stride
    }

    /// Rank `rank`'s device handle of the mapping as a window of `bytes` bytes per rank whose
    /// elements are `elem_size` bytes of type `dtype` (`SYMCOMM_DTYPE_*` or `_NONE`; a byte
    /// window, which the device lets any element type use, is 1 and `_NONE`).
    pub(crate) fn handle(
        &self,
        rank: u32,
        bytes: u64,
        elem_size: u32,
        dtype: u32,
    ) -> WindowHandleRaw {
        WindowHandleRaw {
            base: self.base,
            stride: self.stride,
            bytes,
            rank,
            nranks: self.nranks,
            elem_size,
            dtype,
        }
    }

    /// Copies `data` into rank `rank`'s copy at byte `offset` (bounds checked by the caller).
    pub(crate) fn write(&self, rank: u32, offset: u64, data: &[u8]) -> Result<()> {
        let addr = self.base + u64::from(rank) * self.stride + offset;
        on_backend!(self.range(), r => r.write(addr, data))
    }

    /// Copies rank `rank`'s copy at byte `offset` into `out` (bounds checked by the caller).
    pub(crate) fn read(&self, rank: u32, offset: u64, out: &mut [u8]) -> Result<()> {
        let addr = self.base + u64::from(rank) * self.stride + offset;
        on_backend!(self.range(), r => r.read(addr, out))
    }

    /// Sets every byte of rank `rank`'s copy to zero.
    pub(crate) fn zero(&self, rank: u32) -> Result<()> {
        let addr = self.base + u64::from(rank) * self.stride;
        on_backend!(self.range(), r => r.zero(addr, self.stride))
    }
}

impl Drop for FlatMapping {
    fn drop(&mut self) {
        // Unmapping synchronizes the GPU (cuMemUnmap): only while no symcomm stream has work in
        // flight (`crate::sync_free`). The emulator models that wait (in `MemfdRange`'s drop).
        // Both ranges unmap and release on their own drop.
        if let Some(range) = self.range.take() {
            crate::sync_free::release(Box::new(move || drop(range)));
        }
    }
}

/// The per-rank words the device API reads and writes besides windows: the abort flag (host
/// writes, kernels poll) and the error record (kernels write, host reads). Host memory that the
/// device can address: plain heap memory on the emulator, mapped pinned memory on CUDA.
pub(crate) struct ControlBlock {
    host: *mut u8,
    device: u64,
    /// Owns the block's memory; only its drop matters. `None` once handed to
    /// `crate::sync_free` by the block's drop.
    memory: Option<PerBackend<HostMapped, HeapBlock>>,
}

impl Drop for ControlBlock {
    fn drop(&mut self) {
        // cuMemFreeHost synchronizes the GPU: only while no symcomm stream has work in flight
        // (`crate::sync_free`). The emulator models that wait (in `HeapBlock`'s drop).
        if let Some(memory) = self.memory.take() {
            crate::sync_free::release(Box::new(move || drop(memory)));
        }
    }
}

// SAFETY: the block is plain words accessed through atomics (abort flag, error status) or read
// as a whole after kernels finished; the pointer is to memory owned by `memory`.
unsafe impl Send for ControlBlock {}
// SAFETY: as for Send.
unsafe impl Sync for ControlBlock {}

const ABORT_OFFSET: usize = 0;
const ERROR_OFFSET: usize = 8;
const _: () = assert!(ERROR_OFFSET + size_of::<ErrorRecord>() <= 64);

impl ControlBlock {
    pub(crate) fn new(backend: &Backend) -> Result<Self> {
        let memory = backend.make(|d| HostMapped::new(d, 64), || Ok(HeapBlock::new()))?;
        Ok(ControlBlock {
            host: on_backend!(&memory, m => m.host_ptr()),
            device: on_backend!(&memory, m => m.device_ptr()),
            memory: Some(memory),
        })
    }

    fn abort(&self) -> &AtomicU32 {
        // SAFETY: ABORT_OFFSET is an 8-aligned word inside the 64-byte block, alive as long as
        // `self`; every access to it (host and kernels) is atomic.
        unsafe { AtomicU32::from_ptr(self.host.add(ABORT_OFFSET).cast()) }
    }

    fn error_status(&self) -> &AtomicU32 {
        // SAFETY: as for `abort`; `status` is the record's first field, written by kernels with
        // an atomic compare-and-swap.
        unsafe { AtomicU32::from_ptr(self.host.add(ERROR_OFFSET).cast()) }
    }

    /// Device address of the abort flag.
    pub(crate) fn abort_flag_addr(&self) -> u64 {
        self.device + ABORT_OFFSET as u64
    }

    /// Device address of the error record.
    pub(crate) fn error_addr(&self) -> u64 {
        self.device + ERROR_OFFSET as u64
    }

    /// Raises the abort flag (idempotent; any thread).
    pub(crate) fn raise_abort(&self) {
        self.abort().store(1, Ordering::Release);
    }

    /// Whether the abort flag is raised.
    pub(crate) fn abort_raised(&self) -> bool {
        self.abort().load(Ordering::Acquire) != 0
    }

    /// The error record, if a kernel recorded one.
    pub(crate) fn error(&self) -> Option<ErrorRecord> {
        if self.error_status().load(Ordering::Acquire) == 0 {
            return None;
        }
        // SAFETY: the record is 8-aligned inside the block; the fields after `status` are
        // written before a kernel finishes and the host reads them afterwards (a torn read of a
        // running kernel's record shows at worst a stale detail field).
        Some(unsafe { std::ptr::read_volatile(self.host.add(ERROR_OFFSET).cast::<ErrorRecord>()) })
    }
}

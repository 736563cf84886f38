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

use std::sync::Arc;

use symcomm_device::abi::{ErrorRecord, SYMCOMM_RANK_REMOTE, WindowHandleRaw};

use crate::backend::cuda::{VmmRange, VmmSegment};
use crate::backend::emu::memory::{self as emu, MemfdRange};
use crate::backend::{Backend, MappedHost, PerBackend, on_backend};
use crate::stream::Buffer;
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

/// Which ranks' copies a flat layout maps: all on one host; across hosts only this host's
/// ranks', each still at `base + rank * stride`, the others' places left as holes. The device
/// tells them apart by a table in device memory (`ranks` of DevComm and WindowHandleRaw, abi.h:
/// the rank, or `SYMCOMM_RANK_REMOTE`); on one host there is no table.
#[derive(Clone)]
pub(crate) struct RankSlots {
    /// Whether each rank's copy is mapped here.
    here: Arc<[bool]>,
    /// The device table, `None` on one host. Shared by every handle that names it.
    table: Option<Arc<Buffer>>,
}

impl RankSlots {
    /// Every one of `nranks` ranks on this host.
    pub(crate) fn one_host(nranks: u32) -> Self {
        RankSlots {
            here: vec![true; nranks as usize].into(),
            table: None,
        }
    }

    /// `nranks` ranks of which `here` run on this host; the table goes to `backend`'s device
    /// memory.
    pub(crate) fn across_hosts(backend: &Backend, nranks: u32, here: &[u32]) -> Result<Self> {
        let mut mapped = vec![false; nranks as usize];
        for &r in here {
            if let Some(m) = mapped.get_mut(r as usize) {
                *m = true;
            }
        }
        let words: Vec<u32> = (0u32..)
            .zip(&mapped)
            .map(|(r, &m)| if m { r } else { SYMCOMM_RANK_REMOTE })
            .collect();
        let table = Buffer::new(backend, words.len() * size_of::<u32>())?;
        table.write(0, &words)?;
        Ok(RankSlots {
            here: mapped.into(),
            table: Some(Arc::new(table)),
        })
    }

    /// Ranks of the layout.
    pub(crate) fn nranks(&self) -> u32 {
        self.here.len() as u32
    }

    /// The ranks whose copies are mapped here, ascending.
    pub(crate) fn mapped(&self) -> Vec<u32> {
        (0u32..)
            .zip(self.here.iter())
            .filter(|&(_, &m)| m)
            .map(|(r, _)| r)
            .collect()
    }

    /// Whether `rank`'s copy is mapped here (false for no rank).
    pub(crate) fn is_mapped(&self, rank: u32) -> bool {
        self.here.get(rank as usize).copied().unwrap_or(false)
    }

    /// The device address of the table, 0 on one host.
    pub(crate) fn table_addr(&self) -> u64 {
        self.table.as_ref().map_or(0, |t| t.addr())
    }
}

/// Every local rank's copy mapped in the flat layout; unmapped on drop.
pub(crate) struct FlatMapping {
    base: u64,
    stride: u64,
    slots: RankSlots,
    /// The allocation's number, the same on every rank of the communicator (what the proxy
    /// names a window by).
    id: u64,
    /// `None` once handed to `crate::sync_free` by the mapping's drop.
    range: Option<PerBackend<VmmRange, MemfdRange>>,
}

impl std::fmt::Debug for FlatMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlatMapping")
            .field("base", &format_args!("{:#x}", self.base))
            .field("stride", &self.stride)
            .field("nranks", &self.slots.nranks())
            .finish_non_exhaustive()
    }
}

impl FlatMapping {
    /// Maps `fds[i]` (the copy of the i-th rank that `slots` maps here, `stride` bytes each) at
    /// `base + rank * stride`, in a reservation for every rank of `slots`.
    pub(crate) fn map(
        backend: &Backend,
        stride: u64,
        fds: Vec<OwnedFd>,
        slots: RankSlots,
        id: u64,
    ) -> Result<Self> {
        let at = slots.mapped();
        if fds.len() != at.len() {
            return Err(Error::InvalidArgument(format!(
                "received {} memory handles for {} ranks on this host",
                fds.len(),
                at.len()
            )));
        }
        let nranks = slots.nranks();
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
            Backend::Cuda(d) => PerBackend::Cuda(VmmRange::map(d, stride, fds, &at, nranks)?),
            Backend::Emu => PerBackend::Emu(MemfdRange::map(stride, total, &fds, &at)?),
        };
        Ok(FlatMapping {
            base: on_backend!(&range, r => r.base()),
            stride,
            slots,
            id,
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
            nranks: self.slots.nranks(),
            elem_size,
            dtype,
            ranks: self.slots.table_addr(),
        }
    }

    /// The allocation's number (the same on every rank).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Device address of rank `rank`'s copy, or [`Error::InvalidArgument`] for a rank on
    /// another host (not mapped here).
    pub(crate) fn copy_addr(&self, rank: u32) -> Result<u64> {
        if !self.slots.is_mapped(rank) {
            return Err(Error::InvalidArgument(format!(
                "rank {rank}'s copy is on another host: only the copies of this host's ranks are \
                 mapped here"
            )));
        }
        Ok(self.base + u64::from(rank) * self.stride)
    }

    /// Copies `data` into rank `rank`'s copy at byte `offset` (bounds checked by the caller).
    pub(crate) fn write(&self, rank: u32, offset: u64, data: &[u8]) -> Result<()> {
        let addr = self.copy_addr(rank)? + offset;
        on_backend!(self.range(), r => r.write(addr, data))
    }

    /// Copies rank `rank`'s copy at byte `offset` into `out` (bounds checked by the caller).
    pub(crate) fn read(&self, rank: u32, offset: u64, out: &mut [u8]) -> Result<()> {
        let addr = self.copy_addr(rank)? + offset;
        on_backend!(self.range(), r => r.read(addr, out))
    }

    /// Sets every byte of rank `rank`'s copy to zero.
    pub(crate) fn zero(&self, rank: u32) -> Result<()> {
        let addr = self.copy_addr(rank)?;
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
    memory: MappedHost,
}

const ABORT_OFFSET: usize = 0;
const ERROR_OFFSET: usize = 8;
const _: () = assert!(ERROR_OFFSET + size_of::<ErrorRecord>() <= 64);

impl ControlBlock {
    pub(crate) fn new(backend: &Backend) -> Result<Self> {
        Ok(ControlBlock {
            memory: MappedHost::new(backend, 64)?,
        })
    }

    /// The block's byte at `offset` (< 64), for the host.
    fn host_at(&self, offset: usize) -> *mut u8 {
        self.memory.host_ptr().wrapping_add(offset)
    }

    fn abort(&self) -> &AtomicU32 {
        // SAFETY: ABORT_OFFSET is an 8-aligned word inside the 64-byte block, alive as long as
        // `self`; every access to it (host and kernels) is atomic.
        unsafe { AtomicU32::from_ptr(self.host_at(ABORT_OFFSET).cast()) }
    }

    fn error_status(&self) -> &AtomicU32 {
        // SAFETY: as for `abort`; `status` is the record's first field, written by kernels with
        // an atomic compare-and-swap.
        unsafe { AtomicU32::from_ptr(self.host_at(ERROR_OFFSET).cast()) }
    }

    /// Device address of the abort flag.
    pub(crate) fn abort_flag_addr(&self) -> u64 {
        self.memory.device_ptr() + ABORT_OFFSET as u64
    }

    /// Device address of the error record.
    pub(crate) fn error_addr(&self) -> u64 {
        self.memory.device_ptr() + ERROR_OFFSET as u64
    }

    /// Raises the abort flag (idempotent; any thread).
    pub(crate) fn raise_abort(&self) {
        self.abort().store(1, Ordering::Release);
    }

    /// Whether the abort flag is raised.
    pub(crate) fn abort_raised(&self) -> bool {
        self.abort().load(Ordering::Acquire) != 0
    }

    /// Records `rec` as this rank's error unless one is recorded already (first error wins, as
    /// on the device): for host threads that act for kernels (the proxy). Returns whether it
    /// was recorded.
    pub(crate) fn record(&self, rec: &ErrorRecord) -> bool {
        if self
            .error_status()
            .compare_exchange(0, rec.status, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        let rec_ptr = self.host_at(ERROR_OFFSET).cast::<ErrorRecord>();
        // SAFETY: the record lies inside the block, alive as long as `self`; winning the
        // compare-and-swap on `status` makes this thread its only writer, as on the device.
        unsafe {
            std::ptr::addr_of_mut!((*rec_ptr).rank).write_volatile(rec.rank);
            std::ptr::addr_of_mut!((*rec_ptr).peer).write_volatile(rec.peer);
            std::ptr::addr_of_mut!((*rec_ptr).op).write_volatile(rec.op);
            std::ptr::addr_of_mut!((*rec_ptr).detail).write_volatile(rec.detail);
            std::ptr::addr_of_mut!((*rec_ptr).time_ns).write_volatile(rec.time_ns);
        }
        true
    }

    /// The error record, if a kernel recorded one.
    pub(crate) fn error(&self) -> Option<ErrorRecord> {
        if self.error_status().load(Ordering::Acquire) == 0 {
            return None;
        }
        // SAFETY: the record is 8-aligned inside the block; the fields after `status` are
        // written before a kernel finishes and the host reads them afterwards (a torn read of a
        // running kernel's record shows at worst a stale detail field).
        Some(unsafe { std::ptr::read_volatile(self.host_at(ERROR_OFFSET).cast::<ErrorRecord>()) })
    }
}

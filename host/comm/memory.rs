//! Symmetric memory in the flat layout (DESIGN §3): every rank's copy of a window mapped into
//! one reserved virtual range, rank r's copy at `base + r * stride`, on both backends.
//!
//! - Emulator: each rank's copy is a `memfd` of `stride` bytes (zero-filled by the kernel). Its
//!   fd goes to the other local ranks ([`super::fdpass`]); each rank reserves `nranks * stride`
//!   bytes of address space (`PROT_NONE`) and maps every rank's memfd over its slot with
//!   `MAP_SHARED | MAP_FIXED`. Ranks that are threads of one process map the same memory at
//!   several addresses, exactly as separate processes do.
//! - CUDA: each rank's copy is a VMM allocation (`cuMemCreate`) exported as a POSIX fd; the
//!   fds travel the same way; each rank reserves a device virtual range, imports and maps every
//!   copy, and enables access for its GPU (see [`crate::backend::cuda::VmmRange`]).
//!
//! Fds are closed once mapped: the mappings keep the memory alive, and a rank that unmaps its
//! view leaves the others' views intact, so freeing never pulls memory from under a peer.

use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::mman::{MapFlags, ProtFlags, mmap, mmap_anonymous, munmap};

use symcomm_device::abi::{ErrorRecord, WindowHandleRaw};

use crate::backend::Backend;
use crate::backend::cuda::{HostMapped, VmmRange, VmmSegment};
use crate::{Error, Result};

fn sys_err(what: String) -> impl FnOnce(nix::errno::Errno) -> Error {
    move |e| Error::Io {
        what,
        source: std::io::Error::from(e),
    }
}

/// Size granularity of one rank's copy on `backend`.
pub(crate) fn granularity(backend: &Backend) -> Result<u64> {
    match backend {
        Backend::Emu => Ok(page_size()),
        Backend::Cuda(d) => VmmSegment::granularity(d),
    }
}

fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())
        .unwrap_or(4096)
}

/// This rank's copy of a window, before mapping: exportable as an fd.
pub(crate) enum Segment {
    /// A memfd of `stride` bytes.
    Emu(OwnedFd),
    /// A VMM allocation and its exported fd.
    Cuda(VmmSegment),
}

impl Segment {
    /// Allocates `stride` bytes (a multiple of [`granularity`]) of zero-initialized memory.
    pub(crate) fn create(backend: &Backend, stride: u64, label: &str) -> Result<Self> {
        match backend {
            Backend::Emu => {
                let fd = memfd_create(format!("symcomm:{label}").as_str(), MFdFlags::MFD_CLOEXEC)
                    .map_err(sys_err(format!("memfd_create for {label}")))?;
                let len = i64::try_from(stride).map_err(|_| {
                    Error::InvalidArgument(format!("{label}: {stride} bytes is too large"))
                })?;
                nix::unistd::ftruncate(&fd, len).map_err(sys_err(format!(
                    "sizing the memfd of {label} to {stride} bytes"
                )))?;
                Ok(Segment::Emu(fd))
            }
            Backend::Cuda(d) => Ok(Segment::Cuda(VmmSegment::create(d, stride)?)),
        }
    }

    /// The fd to pass to the other local ranks.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Segment::Emu(fd) => fd.as_fd(),
            Segment::Cuda(s) => s.fd(),
        }
    }
}

/// Every local rank's copy mapped in the flat layout; unmapped on drop.
pub(crate) struct FlatMapping {
    base: u64,
    stride: u64,
    nranks: u32,
    kind: MappingKind,
}

enum MappingKind {
    Emu,
    Cuda(VmmRange),
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
        match backend {
            Backend::Emu => {
                let len = NonZeroUsize::new(stride as usize)
                    .ok_or_else(|| Error::InvalidArgument("empty window copy".into()))?;
                // SAFETY: a fresh anonymous PROT_NONE reservation at an address of the kernel's
                // choosing; it overlaps nothing.
                let base = unsafe {
                    mmap_anonymous(
                        None,
                        total,
                        ProtFlags::PROT_NONE,
                        MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
                    )
                }
                .map_err(sys_err(format!("reserving {total} bytes of address space")))?;
                let mapping = FlatMapping {
                    base: base.as_ptr() as u64,
                    stride,
                    nranks,
                    kind: MappingKind::Emu,
                };
                for (r, fd) in fds.iter().enumerate() {
                    let at = NonZeroUsize::new(mapping.base as usize + r * stride as usize);
                    // SAFETY: `at..at+len` lies inside the reservation made above, which this
                    // mapping owns; MAP_FIXED replaces exactly that part of it.
                    unsafe {
                        mmap(
                            at,
                            len,
                            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                            MapFlags::MAP_SHARED | MapFlags::MAP_FIXED,
                            fd,
                            0,
                        )
                    }
                    .map_err(sys_err(format!("mapping rank {r}'s window copy")))?;
                }
                Ok(mapping)
            }
            Backend::Cuda(d) => {
                let range = VmmRange::map(d, stride, fds)?;
                Ok(FlatMapping {
                    base: range.base(),
                    stride,
                    nranks,
                    kind: MappingKind::Cuda(range),
                })
            }
        }
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
        match &self.kind {
            MappingKind::Emu => {
                // SAFETY: `addr..addr+len` lies in rank `rank`'s mapped copy (caller-checked
                // bounds, rank < nranks). The memory is shared with emulated kernels and other
                // processes, like a shared file mapping; plain bytes have no invalid values.
                unsafe {
                    std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len());
                }
                Ok(())
            }
            MappingKind::Cuda(r) => r.write(addr, data),
        }
    }

    /// Copies rank `rank`'s copy at byte `offset` into `out` (bounds checked by the caller).
    pub(crate) fn read(&self, rank: u32, offset: u64, out: &mut [u8]) -> Result<()> {
        let addr = self.base + u64::from(rank) * self.stride + offset;
        match &self.kind {
            MappingKind::Emu => {
                // SAFETY: as in `write`, reading.
                unsafe {
                    std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), out.len());
                }
                Ok(())
            }
            MappingKind::Cuda(r) => r.read(addr, out),
        }
    }

    /// Sets every byte of rank `rank`'s copy to zero.
    pub(crate) fn zero(&self, rank: u32) -> Result<()> {
        let addr = self.base + u64::from(rank) * self.stride;
        match &self.kind {
            MappingKind::Emu => {
                // SAFETY: rank `rank`'s whole mapped copy.
                unsafe { std::ptr::write_bytes(addr as *mut u8, 0, self.stride as usize) };
                Ok(())
            }
            MappingKind::Cuda(r) => r.zero(addr, self.stride),
        }
    }
}

impl Drop for FlatMapping {
    fn drop(&mut self) {
        // Unmapping synchronizes the GPU (cuMemUnmap): only while no symcomm stream has work in
        // flight (`crate::sync_free`). The emulator models that wait.
        let (base, len) = (
            self.base as usize,
            self.stride as usize * self.nranks as usize,
        );
        let free: Box<dyn FnOnce() + Send> = match std::mem::replace(
            &mut self.kind,
            MappingKind::Emu,
        ) {
            MappingKind::Emu => Box::new(move || {
                crate::sync_free::emulated_context_sync();
                if let (Some(base), true) = (NonNull::new(base as *mut c_void), len > 0) {
                    // SAFETY: the whole reservation made in `map`, owned by this mapping and
                    // unmapped once; no kernel uses it any more (the launch contract keeps
                    // windows alive past their kernels).
                    if let Err(e) = unsafe { munmap(base, len) } {
                        tracing::warn!(target: "symcomm::alloc", "munmap of a window failed: {e}");
                    }
                }
            }),
            // `VmmRange` unmaps and releases on its own drop.
            MappingKind::Cuda(range) => Box::new(move || drop(range)),
        };
        crate::sync_free::release(free);
    }
}

/// The per-rank words the device API reads and writes besides windows: the abort flag (host
/// writes, kernels poll) and the error record (kernels write, host reads). Host memory that the
/// device can address: plain heap memory on the emulator, mapped pinned memory on CUDA.
pub(crate) struct ControlBlock {
    host: *mut u8,
    device: u64,
    _keep: ControlMemory,
}

/// Owns the block's memory; only its drop matters.
enum ControlMemory {
    Emu(Box<[u64; 8]>),
    Cuda(HostMapped),
    /// Handed to `crate::sync_free` by the block's drop.
    Released,
}

impl Drop for ControlBlock {
    fn drop(&mut self) {
        // cuMemFreeHost synchronizes the GPU: only while no symcomm stream has work in flight
        // (`crate::sync_free`). The emulator models that wait.
        let free: Box<dyn FnOnce() + Send> =
            match std::mem::replace(&mut self._keep, ControlMemory::Released) {
                ControlMemory::Emu(mem) => Box::new(move || {
                    crate::sync_free::emulated_context_sync();
                    drop(mem);
                }),
                ControlMemory::Cuda(mem) => Box::new(move || drop(mem)),
                ControlMemory::Released => return,
            };
        crate::sync_free::release(free);
    }
}

// SAFETY: the block is plain words accessed through atomics (abort flag, error status) or read
// as a whole after kernels finished; the pointer is to memory owned by `_keep`.
unsafe impl Send for ControlBlock {}
// SAFETY: as for Send.
unsafe impl Sync for ControlBlock {}

const ABORT_OFFSET: usize = 0;
const ERROR_OFFSET: usize = 8;
const _: () = assert!(ERROR_OFFSET + size_of::<ErrorRecord>() <= 64);

impl ControlBlock {
    pub(crate) fn new(backend: &Backend) -> Result<Self> {
        match backend {
            Backend::Emu => {
                let mut mem = Box::new([0u64; 8]);
                let host = mem.as_mut_ptr().cast::<u8>();
                Ok(ControlBlock {
                    host,
                    device: host as u64,
                    _keep: ControlMemory::Emu(mem),
                })
            }
            Backend::Cuda(d) => {
                let mem = HostMapped::new(d, 64)?;
                Ok(ControlBlock {
                    host: mem.host_ptr(),
                    device: mem.device_ptr(),
                    _keep: ControlMemory::Cuda(mem),
                })
            }
        }
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

//! The emulator's memory, where device memory is host memory: window copies as `memfd`s mapped
//! in the flat layout ([`create_memfd`], [`MemfdRange`]), a communicator's control words
//! ([`HeapBlock`]) and ordinary buffers ([`HostBuffer`]). The backend-independent types that
//! hold them are `crate::comm::memory`'s (windows, control blocks) and [`crate::Buffer`].
//!
//! The drops of window and control memory model the driver's synchronizing frees (`cuMemUnmap`,
//! `cuMemFreeHost`): they first wait for the work queued on every emulator stream of the process
//! ([`crate::sync_free::emulated_context_sync`]), so callers free them through
//! [`crate::sync_free::release`] as they free the CUDA memory.

use std::alloc::Layout;
use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::mman::{MapFlags, ProtFlags, mmap, mmap_anonymous, munmap};

use crate::{DevicePlain, Error, Result};

fn sys_err(what: String) -> impl FnOnce(nix::errno::Errno) -> Error {
    move |e| Error::io(what, std::io::Error::from(e))
}

/// Size granularity of one rank's window copy: the page size.
pub(crate) fn granularity() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())
        .unwrap_or(4096)
}

/// This rank's copy of a window: a memfd of `stride` bytes (zero-filled by the kernel), named
/// after `label`.
pub(crate) fn create_memfd(stride: u64, label: &str) -> Result<OwnedFd> {
    let fd = memfd_create(format!("symcomm:{label}").as_str(), MFdFlags::MFD_CLOEXEC)
        .map_err(sys_err(format!("memfd_create for {label}")))?;
    let len = i64::try_from(stride)
        .map_err(|_| Error::InvalidArgument(format!("{label}: {stride} bytes is too large")))?;
    nix::unistd::ftruncate(&fd, len).map_err(sys_err(format!(
        "sizing the memfd of {label} to {stride} bytes"
    )))?;
    Ok(fd)
}

/// Every rank's memfd mapped in the flat layout: a `PROT_NONE` reservation of
/// `nranks * stride` bytes with rank r's copy mapped over `base + r * stride`
/// (`MAP_SHARED | MAP_FIXED`). Ranks that are threads of one process map the same memory at
/// several addresses, exactly as separate processes do. Unmapped on drop, after an
/// [`emulated_context_sync`](crate::sync_free::emulated_context_sync).
pub(crate) struct MemfdRange {
    base: NonNull<c_void>,
    len: usize,
}

// SAFETY: the range is owned by this value and only reached through raw addresses, from any
// thread (as device memory is); ordering those accesses is the callers' contract.
unsafe impl Send for MemfdRange {}
// SAFETY: as for Send; `&self` methods copy through raw pointers.
unsafe impl Sync for MemfdRange {}

impl MemfdRange {
    /// Maps `fds[i]` (rank `at[i]`'s copy, `stride` bytes each) at `base + at[i] * stride` of a
    /// fresh reservation of `total` bytes (a slot per rank; the slots of ranks on other hosts
    /// stay unmapped, `PROT_NONE`).
    pub(crate) fn map(
        stride: u64,
        total: NonZeroUsize,
        fds: &[OwnedFd],
        at: &[u32],
    ) -> Result<Self> {
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
        let range = MemfdRange {
            base,
            len: total.get(),
        };
        for (&r, fd) in at.iter().zip(fds) {
            let at = NonZeroUsize::new(range.base() as usize + r as usize * stride as usize);
            // SAFETY: `at..at+len` lies inside the reservation made above, which `range` owns;
            // MAP_FIXED replaces exactly that part of it.
            let mapped = unsafe {
                mmap(
                    at,
                    len,
                    ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                    MapFlags::MAP_SHARED | MapFlags::MAP_FIXED,
                    fd,
                    0,
                )
            };
            if let Err(e) = mapped {
                // Freed as a mapping's drop frees it: through the gate, never inline.
                crate::sync_free::release(Box::new(move || drop(range)));
                return Err(sys_err(format!("mapping rank {r}'s window copy"))(e));
            }
        }
        Ok(range)
    }

    /// Address of rank 0's copy.
    pub(crate) fn base(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// Refuses `bytes` bytes at `addr` unless they lie inside the range.
    fn check(&self, addr: u64, bytes: usize) -> Result<()> {
        let (start, end) = (self.base(), self.base() + self.len as u64);
        match addr.checked_add(bytes as u64) {
            Some(last) if addr >= start && last <= end => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "{bytes} bytes at {addr:#x} lie outside the window mapping at {start:#x}"
            ))),
        }
    }

    /// Copies `data` to address `addr` (inside this range).
    pub(crate) fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        self.check(addr, data.len())?;
        // SAFETY: `addr..addr+len` lies in the mapped copies (checked). The memory is shared
        // with emulated kernels and other processes, like a shared file mapping; plain bytes
        // have no invalid values.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len());
        }
        Ok(())
    }

    /// Copies the bytes at `addr` (inside this range) into `out`.
    pub(crate) fn read(&self, addr: u64, out: &mut [u8]) -> Result<()> {
        self.check(addr, out.len())?;
        // SAFETY: as in `write`, reading.
        unsafe {
            std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), out.len());
        }
        Ok(())
    }

    /// Sets `bytes` bytes at `addr` (inside this range) to zero.
    pub(crate) fn zero(&self, addr: u64, bytes: u64) -> Result<()> {
        let bytes = usize::try_from(bytes)
            .map_err(|_| Error::InvalidArgument(format!("zeroing {bytes} bytes")))?;
        self.check(addr, bytes)?;
        // SAFETY: as in `write`, for `bytes` bytes of the mapped copies.
        unsafe { std::ptr::write_bytes(addr as *mut u8, 0, bytes) };
        Ok(())
    }
}

impl Drop for MemfdRange {
    fn drop(&mut self) {
        crate::sync_free::emulated_context_sync();
        // SAFETY: the whole reservation made in `map`, owned by this value and unmapped once; no
        // kernel uses it any more (the launch contract keeps windows alive past their kernels).
        if let Err(e) = unsafe { munmap(self.base, self.len) } {
            tracing::warn!(target: "symcomm::alloc", "munmap of a window failed: {e}");
        }
    }
}

/// Host memory the device addresses (CUDA's is mapped pinned memory), zeroed and 8-aligned: a
/// communicator's control words, a proxy's ring. On the emulator kernels address it directly.
/// Freed on drop, after an [`emulated_context_sync`](crate::sync_free::emulated_context_sync).
pub(crate) struct HeapBlock {
    host: *mut u8,
    _mem: Box<[u64]>,
}

// SAFETY: the pointer is to the heap memory owned by `_mem`, which moves with the value; the
// block's users access it through atomics or after kernels finished (`ControlBlock`, `Proxy`).
unsafe impl Send for HeapBlock {}
// SAFETY: `&self` methods only hand out the pointer; every access through it is atomic or
// ordered by its users, as for Send.
unsafe impl Sync for HeapBlock {}

impl HeapBlock {
    /// `bytes` zeroed bytes (rounded up to whole 8-byte words), 8-aligned.
    pub(crate) fn new(bytes: usize) -> Self {
        let mut mem = vec![0u64; bytes.div_ceil(8)].into_boxed_slice();
        let host = mem.as_mut_ptr().cast::<u8>();
        HeapBlock { host, _mem: mem }
    }

    /// The block's first byte.
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// The block's device address: on the emulator its host address.
    pub(crate) fn device_ptr(&self) -> u64 {
        self.host as u64
    }
}

impl Drop for HeapBlock {
    fn drop(&mut self) {
        crate::sync_free::emulated_context_sync();
    }
}

/// Alignment of emulator buffers (CUDA allocations are at least this aligned too).
const BUFFER_ALIGN: usize = 256;

/// Zeroed, [`BUFFER_ALIGN`]-aligned host memory, addressed by emulated kernels through raw
/// addresses (so only ever accessed through raw pointers, never references): the emulator's
/// [`crate::Buffer`] memory.
pub(crate) struct HostBuffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the allocation is owned by this value and only reached through raw pointers, from any
// thread (as device memory is); ordering those accesses is the callers' contract.
unsafe impl Send for HostBuffer {}
// SAFETY: as for Send; `&self` methods copy through raw pointers.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Allocates `bytes` (not 0) zeroed bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a size the platform cannot describe; [`Error::Io`] when
    /// host memory is exhausted.
    pub(crate) fn new(bytes: usize) -> Result<Self> {
        let layout = Layout::from_size_align(bytes, BUFFER_ALIGN).map_err(|_| {
            Error::InvalidArgument(format!("{bytes} bytes is too large for a buffer"))
        })?;
        // SAFETY: the layout has a non-zero size (callers refuse 0 bytes).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| {
            Error::io(
                format!("allocating a {bytes}-byte emulator buffer"),
                std::io::ErrorKind::OutOfMemory.into(),
            )
        })?;
        Ok(HostBuffer { ptr, layout })
    }

    /// The address of the first byte, for kernel arguments and raw copies.
    pub(crate) fn addr(&self) -> u64 {
        // Exposed: emulated kernels and raw copies turn the integer back into a pointer.
        self.ptr.as_ptr().expose_provenance() as u64
    }

    /// Size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    /// `len` bytes at byte `offset`, if they lie inside the allocation.
    fn range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "{len} bytes at byte {offset} exceed a {}-byte buffer",
                self.len()
            ))),
        }
    }

    /// Copies `data` into the buffer at byte `offset`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range exceeds the buffer.
    pub(crate) fn write<T: DevicePlain>(&self, offset: usize, data: &[T]) -> Result<()> {
        let len = size_of_val(data);
        self.range(offset, len)?;
        // SAFETY: `offset + len` is within the allocation (checked); the source is `len`
        // initialized bytes (DevicePlain: no padding) of a slice that cannot overlap memory only
        // reached through raw pointers; no device work touches the range meanwhile (the
        // contract of `Buffer`).
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr().cast::<u8>(),
                self.ptr.as_ptr().add(offset),
                len,
            );
        }
        Ok(())
    }

    /// Copies the buffer's bytes at byte `offset` into `out`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range exceeds the buffer.
    pub(crate) fn read<T: DevicePlain>(&self, offset: usize, out: &mut [T]) -> Result<()> {
        let len = size_of_val(out);
        self.range(offset, len)?;
        // SAFETY: `offset + len` is within the allocation (checked) and initialized (zeroed at
        // allocation); `out` has room for `len` bytes, and any bytes are a valid `T`
        // (DevicePlain); no device work writes the range meanwhile (the contract of `Buffer`).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr().cast::<u8>(),
                len,
            );
        }
        Ok(())
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed exactly once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

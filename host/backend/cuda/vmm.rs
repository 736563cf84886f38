//! CUDA virtual memory management for symmetric windows: physical allocations exported as POSIX
//! fds (`cuMemCreate` + `cuMemExportToShareableHandle`), imported by every local rank
//! (`cuMemImportFromShareableHandle`) and mapped side by side into one reserved device range
//! (`cuMemAddressReserve` + `cuMemMap` + `cuMemSetAccess`) — the flat layout of DESIGN §3 — and
//! mapped pinned host memory (`cuMemHostAlloc`) for the abort flag and error record.
//!
//! Several ranks may share one GPU (threads or processes): each imports the others' allocations
//! into its own range, so each sees every copy at its own addresses.

use std::ffi::c_void;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys as dsys;

use super::CudaDevice;
use super::device::Context;
use super::loader::{check, init};
use super::memory::sync_legacy_stream;
use super::probe::{attribute, device_handle};
use crate::{Error, Result};

/// Driver entry points used here, checked once before the first use (cudarc panics on a
/// missing symbol). All exist since CUDA 10.2.
pub(super) const VMM_SYMBOLS: &[&str] = &[
    "cuMemCreate",
    "cuMemRelease",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemGetAllocationGranularity",
    "cuMemHostAlloc",
    "cuMemHostGetDevicePointer_v2",
    "cuMemFreeHost",
    "cuDeviceGetUuid_v2",
];

fn vmm_available() -> Result<()> {
    static STATE: OnceLock<Result<()>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            // SAFETY: only called with a `CudaDevice` in hand, so the driver library was loaded
            // and checked (`super::loader::driver`) and `culib` finds it without panicking.
            let lib = unsafe { dsys::culib() };
            let missing: Vec<&str> = VMM_SYMBOLS
                .iter()
                .copied()
                // SAFETY: a symbol-table lookup; the pointer is dropped unused.
                .filter(|s| unsafe { lib.get::<*const c_void>(s.as_bytes()) }.is_err())
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(Error::NoDriver(format!(
                    "the CUDA driver lacks {} (virtual memory management)",
                    missing.join(", ")
                )))
            }
        })
        .clone()
}

fn location(ctx: &Context) -> dsys::CUmemLocation {
    dsys::CUmemLocation {
        type_: dsys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ctx.ordinal as i32,
    }
}

fn alloc_prop(ctx: &Context) -> dsys::CUmemAllocationProp {
    // SAFETY: an all-integer C struct (plus one null pointer) for which zero is the documented
    // default of every field.
    let mut prop: dsys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = dsys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes =
        dsys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location = location(ctx);
    // A NIC may then read and write the window itself (GPUDirect RDMA, when UCX moves CUDA
    // memory between hosts): VMM memory is registrable with `nvidia-peermem` only when
    // allocated so, on devices that support it (as NCCL does for its cuMem allocations). An
    // attribute the driver does not know reads as unsupported.
    let rdma = attribute(
        ctx.device,
        dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
    );
    prop.allocFlags.gpuDirectRDMACapable = u8::from(rdma.is_ok_and(|v| v != 0));
    prop
}

/// The UUID of GPU `ordinal` (stable across processes, unlike ordinals under
/// `CUDA_VISIBLE_DEVICES`).
///
/// # Errors
/// [`Error::NoDriver`], [`Error::Cuda`].
pub fn gpu_uuid(ordinal: usize) -> Result<[u8; 16]> {
    init()?;
    vmm_available()?;
    let dev = device_handle(ordinal)?;
    // SAFETY: a plain 16-byte C struct; zero is a valid value.
    let mut uuid: dsys::CUuuid = unsafe { std::mem::zeroed() };
    // SAFETY: the driver is initialised; `dev` came from cuDeviceGet; the out-pointer is live.
    check("cuDeviceGetUuid_v2", unsafe {
        dsys::cuDeviceGetUuid_v2(&mut uuid, dev)
    })?;
    Ok(uuid.bytes.map(|b| b as u8))
}

/// One rank's copy of a window on its GPU: a physical allocation and its exported fd.
#[derive(Debug)]
pub struct VmmSegment {
    ctx: Arc<Context>,
    handle: dsys::CUmemGenericAllocationHandle,
    fd: OwnedFd,
}

impl VmmSegment {
    /// The allocation granularity of `device` (`CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`): sizes
    /// and strides of window copies are multiples of it.
    ///
    /// # Errors
    /// [`Error::NoDriver`] without VMM support; [`Error::Cuda`].
    pub fn granularity(device: &CudaDevice) -> Result<u64> {
        vmm_available()?;
        device.ctx.bind()?;
        let prop = alloc_prop(&device.ctx);
        let mut g = 0usize;
        // SAFETY: the context is current; `prop` and the out-pointer are live locals.
        check("cuMemGetAllocationGranularity", unsafe {
            dsys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                dsys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
        })?;
        Ok(g.max(1) as u64)
    }

    /// Allocates `bytes` (a multiple of the granularity) of device memory exportable as a POSIX
    /// fd.
    ///
    /// # Errors
    /// [`Error::Cuda`] (`CUDA_ERROR_OUT_OF_MEMORY`, `CUDA_ERROR_NOT_SUPPORTED` on GPUs without
    /// POSIX-fd export).
    pub fn create(device: &CudaDevice, bytes: u64) -> Result<Self> {
        vmm_available()?;
        device.ctx.bind()?;
        let prop = alloc_prop(&device.ctx);
        let mut handle: dsys::CUmemGenericAllocationHandle = 0;
        // SAFETY: the context is current; `prop` and the out-pointer are live locals.
        check("cuMemCreate", unsafe {
            dsys::cuMemCreate(&mut handle, bytes as usize, &prop, 0)
        })?;
        let mut raw: RawFd = -1;
        // SAFETY: `handle` is a live allocation created with POSIX-fd export; the out-pointer is
        // an int, as that handle type requires.
        let r = check("cuMemExportToShareableHandle", unsafe {
            dsys::cuMemExportToShareableHandle(
                ptr::from_mut(&mut raw).cast(),
                handle,
                dsys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        });
        if let Err(e) = r {
            // SAFETY: releases the allocation created above, used by nothing else.
            unsafe { dsys::cuMemRelease(handle) };
            return Err(e);
        }
        // SAFETY: the driver created `raw` for us; we own and close it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(VmmSegment {
            ctx: Arc::clone(&device.ctx),
            handle,
            fd,
        })
    }
}

impl AsFd for VmmSegment {
    /// The exported fd (to pass to the other local ranks).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for VmmSegment {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: our reference to the allocation, released once; mappings made from
            // imports of it keep the memory alive.
            let r = unsafe { dsys::cuMemRelease(self.handle) };
            if r != dsys::CUresult::CUDA_SUCCESS {
                tracing::warn!(target: "symcomm::alloc", error = ?r, "cuMemRelease failed");
            }
        }
    }
}

/// Every local rank's copy of a window mapped into one reserved device range of this rank's
/// GPU; unmapped and released on drop.
#[derive(Debug)]
pub struct VmmRange {
    ctx: Arc<Context>,
    base: dsys::CUdeviceptr,
    stride: u64,
    /// Bytes reserved at `base` (freed with exactly this size).
    reserved: usize,
    handles: Vec<dsys::CUmemGenericAllocationHandle>,
    /// The slots mapped so far (their copies' ranks), each unmapped on drop.
    mapped: Vec<u32>,
}

impl VmmRange {
    /// Reserves `nranks` slots of `stride` bytes, imports `fds[i]` (rank `at[i]`'s exported
    /// copy of `stride` bytes) and maps it at `base + at[i] * stride` with read-write access for
    /// `device`; the other slots stay unmapped (ranks on other hosts).
    ///
    /// # Errors
    /// [`Error::Cuda`]: import refused (a handle of another GPU without peer access), address
    /// space exhausted, `cuMemSetAccess` refused (`CUDA_ERROR_INVALID_DEVICE`: no P2P between
    /// the GPUs).
    pub fn map(
        device: &CudaDevice,
        stride: u64,
        fds: Vec<OwnedFd>,
        at: &[u32],
        nranks: u32,
    ) -> Result<Self> {
        vmm_available()?;
        device.ctx.bind()?;
        let total = stride as usize * nranks as usize;
        let mut base: dsys::CUdeviceptr = 0;
        // SAFETY: the context is current; the out-pointer is a live local; no fixed address.
        // Alignment 0 = the allocation granularity, which every stride is a multiple of (an
        // explicit stride alignment would have to be a power of two).
        check("cuMemAddressReserve", unsafe {
            dsys::cuMemAddressReserve(&mut base, total, 0, 0, 0)
        })?;
        let mut range = VmmRange {
            ctx: Arc::clone(&device.ctx),
            base,
            stride,
            reserved: total,
            handles: Vec::with_capacity(fds.len()),
            mapped: Vec::with_capacity(fds.len()),
        };
        for (&r, fd) in at.iter().zip(fds.iter()) {
            let mut handle: dsys::CUmemGenericAllocationHandle = 0;
            // SAFETY: for POSIX fds the "OS handle" argument is the fd value itself, cast to a
            // pointer; the fd stays open for the call.
            check("cuMemImportFromShareableHandle", unsafe {
                dsys::cuMemImportFromShareableHandle(
                    &mut handle,
                    ptr::without_provenance_mut(fd.as_raw_fd() as usize),
                    dsys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                )
            })?;
            range.handles.push(handle);
            // SAFETY: `[base + r*stride, +stride)` lies in our reservation and is unmapped;
            // `handle` is a live allocation of exactly `stride` bytes.
            check("cuMemMap", unsafe {
                dsys::cuMemMap(base + u64::from(r) * stride, stride as usize, 0, handle, 0)
            })?;
            range.mapped.push(r);
        }
        let access = dsys::CUmemAccessDesc {
            location: location(&device.ctx),
            flags: dsys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        for &r in &range.mapped {
            // SAFETY: slot r is mapped (above); one access descriptor.
            check("cuMemSetAccess", unsafe {
                dsys::cuMemSetAccess(base + u64::from(r) * stride, stride as usize, &access, 1)
            })?;
        }
        Ok(range)
    }

    /// Device address of rank 0's copy.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Copies host bytes to device address `addr` (inside this range; caller-checked).
    pub(crate) fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current; `addr..addr+len` is mapped (caller's bounds check);
        // the source is a live slice. Synchronous copy.
        check("cuMemcpyHtoD_v2", unsafe {
            dsys::cuMemcpyHtoD_v2(addr, data.as_ptr().cast(), data.len())
        })?;
        // From pageable memory the copy may return before the data reached the device, and
        // kernels on non-blocking streams would not wait for it.
        sync_legacy_stream()
    }

    /// Copies device bytes at `addr` (inside this range; caller-checked) to the host.
    pub(crate) fn read(&self, addr: u64, out: &mut [u8]) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: as in `write`, the other way.
        check("cuMemcpyDtoH_v2", unsafe {
            dsys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), addr, out.len())
        })
    }

    /// Zeroes `bytes` at `addr` (inside this range; caller-checked), synchronously.
    pub(crate) fn zero(&self, addr: u64, bytes: u64) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current; the range is mapped.
        check("cuMemsetD8_v2", unsafe {
            dsys::cuMemsetD8_v2(addr, 0, bytes as usize)
        })?;
        // Wait for the memset (legacy stream) only: a context-wide synchronize would also wait
        // for other ranks' kernels on this GPU, which may be waiting for this rank.
        sync_legacy_stream()
    }
}

impl Drop for VmmRange {
    fn drop(&mut self) {
        if self.ctx.bind().is_err() {
            return;
        }
        for &r in &self.mapped {
            // SAFETY: slot r was mapped in `map` and is unmapped once.
            unsafe {
                dsys::cuMemUnmap(self.base + u64::from(r) * self.stride, self.stride as usize)
            };
        }
        for &h in &self.handles {
            // SAFETY: each imported handle is released once.
            unsafe { dsys::cuMemRelease(h) };
        }
        if self.reserved > 0 {
            // SAFETY: the reservation made in `map` (exactly `reserved` bytes), now unmapped.
            unsafe { dsys::cuMemAddressFree(self.base, self.reserved) };
        }
    }
}

/// Pinned host memory mapped into the device's address space (`cuMemHostAlloc` with
/// `DEVICEMAP | PORTABLE`), zeroed; freed on drop.
#[derive(Debug)]
pub struct HostMapped {
    ctx: Arc<Context>,
    host: *mut c_void,
    device: u64,
}

// SAFETY: the memory is process-wide pinned memory; the pointer is owned by this value.
unsafe impl Send for HostMapped {}
// SAFETY: as for Send; no Rust-side mutation through `&self`.
unsafe impl Sync for HostMapped {}

impl HostMapped {
    /// Allocates `bytes` of zeroed mapped pinned memory.
    ///
    /// # Errors
    /// [`Error::Cuda`].
    pub fn new(device: &CudaDevice, bytes: usize) -> Result<Self> {
        vmm_available()?;
        device.ctx.bind()?;
        let mut host: *mut c_void = ptr::null_mut();
        // SAFETY: the context is current; the out-pointer is a live local.
        check("cuMemHostAlloc", unsafe {
            dsys::cuMemHostAlloc(
                &mut host,
                bytes,
                dsys::CU_MEMHOSTALLOC_DEVICEMAP | dsys::CU_MEMHOSTALLOC_PORTABLE,
            )
        })?;
        let mut mem = HostMapped {
            ctx: Arc::clone(&device.ctx),
            host,
            device: 0,
        };
        // SAFETY: `host` points at `bytes` freshly allocated bytes.
        unsafe { ptr::write_bytes(host.cast::<u8>(), 0, bytes) };
        let mut dptr: dsys::CUdeviceptr = 0;
        // SAFETY: `host` came from cuMemHostAlloc with DEVICEMAP; flags must be 0.
        check("cuMemHostGetDevicePointer_v2", unsafe {
            dsys::cuMemHostGetDevicePointer_v2(&mut dptr, host, 0)
        })?;
        mem.device = dptr;
        Ok(mem)
    }

    /// Host address.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host.cast()
    }

    /// Device address of the same bytes.
    pub fn device_ptr(&self) -> u64 {
        self.device
    }
}

impl Drop for HostMapped {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc in `new`, freed once.
            unsafe { dsys::cuMemFreeHost(self.host) };
        }
    }
}

//! One GPU: its retained primary context ([`Context`]) and the [`CudaDevice`] handle to it.
//! What a device makes lives with what it makes: modules (`module.rs`), memory (`memory.rs`),
//! streams (`stream.rs`), VMM (`vmm.rs`).

use std::ptr;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys as dsys;

use super::GpuInfo;
use super::loader::{DriverLib, check, init};
use super::probe::{device_count, device_handle, gpu_info};
use crate::{Error, Result};

/// A GPU's retained primary context; released when the last user is dropped.
#[derive(Debug)]
pub(super) struct Context {
    pub(super) ordinal: usize,
    pub(super) device: dsys::CUdevice,
    pub(super) ctx: dsys::CUcontext,
    pub(super) lib: DriverLib,
    /// Events of dropped [`Event`](super::stream::Event)s, kept for the next
    /// `record_event` (a collective records one per call: no `cuEventCreate` /
    /// `cuEventDestroy` pair per call); at most [`EVENT_POOL`], destroyed with the context.
    pub(super) events: Mutex<Vec<PooledEvent>>,
}

/// Most idle events a context keeps for reuse.
pub(super) const EVENT_POOL: usize = 64;

/// An idle event handle of a context's pool (a `CUevent` as an integer: the pool is shared by
/// threads).
#[derive(Debug)]
pub(super) struct PooledEvent(pub(super) usize);

// SAFETY: a CUcontext handle may be used from any thread (the driver API is thread-safe); it is
// made current on the calling thread before each use.
unsafe impl Send for Context {}
// SAFETY: as for Send; `Context` has no interior mutability on the Rust side.
unsafe impl Sync for Context {}

impl Context {
    /// Makes the context current on the calling thread.
    pub(super) fn bind(&self) -> Result<()> {
        // SAFETY: `self.ctx` is a primary context retained until `self` drops.
        check("cuCtxSetCurrent", unsafe {
            dsys::cuCtxSetCurrent(self.ctx)
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let pooled = std::mem::take(self.events.get_mut().unwrap_or_else(|p| p.into_inner()));
        if !pooled.is_empty() && self.bind().is_ok() {
            for PooledEvent(e) in pooled {
                // SAFETY: each pooled event was created in this context, is referenced by no
                // `Event` any more, and is destroyed exactly once, here.
                let _ = unsafe { dsys::cuEventDestroy_v2(ptr::with_exposed_provenance_mut(e)) };
            }
        }
        // SAFETY: the primary context was retained once in `CudaDevice::open`; this is the
        // matching release, after every module, buffer and stream (which hold an `Arc<Context>`)
        // is gone.
        let r = unsafe { dsys::cuDevicePrimaryCtxRelease_v2(self.device) };
        // DEINITIALIZED: the process is exiting and the driver has already torn everything down
        // (a context released by the background free thread after main returned).
        if r != dsys::CUresult::CUDA_SUCCESS && r != dsys::CUresult::CUDA_ERROR_DEINITIALIZED {
            tracing::warn!(target: "symcomm::cuda", ordinal = self.ordinal, error = ?r, "cuDevicePrimaryCtxRelease failed");
        }
    }
}

/// One GPU, through its primary context (the one the CUDA runtime and other libraries share).
///
/// Cheap to clone; modules, buffers and streams keep the context alive. All methods may be called
/// from any thread.
#[derive(Debug, Clone)]
pub struct CudaDevice {
    pub(super) ctx: Arc<Context>,
}

impl CudaDevice {
    /// Opens GPU `ordinal`: initialises the driver and retains the GPU's primary context.
    ///
    /// # Errors
    /// [`Error::NoDriver`] without libcuda; [`Error::InvalidArgument`] when there is no GPU
    /// `ordinal`; [`Error::Cuda`] when a driver call fails (`cuInit`: `CUDA_ERROR_NO_DEVICE`).
    pub fn open(ordinal: usize) -> Result<Self> {
        let lib = init()?;
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::InvalidArgument(format!(
                "no GPU {ordinal}: the driver sees {count}"
            )));
        }
        let device = device_handle(ordinal)?;
        let mut ctx: dsys::CUcontext = ptr::null_mut();
        // SAFETY: `device` came from cuDeviceGet; the out-pointer is a live local. Released in
        // `Context::drop`.
        check("cuDevicePrimaryCtxRetain", unsafe {
            dsys::cuDevicePrimaryCtxRetain(&mut ctx, device)
        })?;
        let ctx = Arc::new(Context {
            ordinal,
            device,
            ctx,
            lib,
            events: Mutex::new(Vec::new()),
        });
        ctx.bind()?;
        Ok(CudaDevice { ctx })
    }

    /// The driver ordinal of this GPU.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal
    }

    /// Name, SMs, memory and compute capability of this GPU.
    ///
    /// # Errors
    /// [`Error::Cuda`] when a driver query fails.
    pub fn info(&self) -> Result<GpuInfo> {
        gpu_info(self.ctx.ordinal, self.ctx.device)
    }

    /// Waits until all work on this GPU's context has finished (`cuCtxSynchronize`).
    ///
    /// # Errors
    /// [`Error::Cuda`]; a kernel fault of earlier work surfaces here (and makes the context
    /// unusable).
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current on this thread.
        check("cuCtxSynchronize", unsafe { dsys::cuCtxSynchronize() })
    }
}

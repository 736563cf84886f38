//! Device memory: buffers with host copies.

use std::ptr;
use std::sync::Arc;

use cudarc::driver::sys as dsys;

use super::device::Context;
use super::loader::check;
use super::{CudaDevice, Stream};
use crate::{DevicePlain, Error, Result};

impl CudaDevice {
    /// Allocates `bytes` bytes of device memory, zeroed (`cuMemAlloc` + `cuMemsetD8`, both
    /// finished on return). Device addresses are at least 256-byte aligned.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 bytes; [`Error::Cuda`] (`CUDA_ERROR_OUT_OF_MEMORY`).
    pub(crate) fn alloc_zeroed(&self, bytes: usize) -> Result<DeviceBuffer> {
        if bytes == 0 {
            return Err(Error::InvalidArgument(
                "a device buffer needs at least one byte".into(),
            ));
        }
        // A stream of the buffer's own: allocation, zeroing and the free are ordered on it
        // (stream-ordered allocator), so none of them synchronizes the context — with ranks
        // sharing the GPU, a context-wide synchronize (what cuMemFree does) would wait for a
        // peer's kernel that waits for this rank.
        let stream = self.create_stream()?;
        let mut ptr: dsys::CUdeviceptr = 0;
        // SAFETY: the context is current (create_stream bound it); the out-pointer is a live
        // local; `stream.stream` is a live stream of this context.
        check("cuMemAllocAsync", unsafe {
            dsys::cuMemAllocAsync(&mut ptr, bytes, stream.stream)
        })?;
        let buf = DeviceBuffer {
            ctx: Arc::clone(&self.ctx),
            ptr,
            bytes,
            stream,
        };
        // SAFETY: the whole allocation is written, in order after the allocation on its stream.
        check("cuMemsetD8Async", unsafe {
            dsys::cuMemsetD8Async(buf.ptr, 0, bytes, buf.stream.stream)
        })?;
        buf.stream.synchronize()?;
        Ok(buf)
    }
}

/// Device memory of one GPU, freed on drop.
///
/// Host copies ([`Self::write`], [`Self::read`], [`Self::zero`]) are synchronous and run on the
/// legacy default stream, which does not wait for [`Stream`]s: the caller orders them against
/// kernels that use the buffer (synchronize those streams first). A copy may run while an
/// unrelated kernel is still executing — that is how a host raises an abort flag.
#[derive(Debug)]
pub struct DeviceBuffer {
    pub(super) ctx: Arc<Context>,
    pub(super) ptr: dsys::CUdeviceptr,
    bytes: usize,
    /// The stream the allocation and its free are ordered on (see [`CudaDevice::alloc_zeroed`]).
    stream: Stream,
}

// SAFETY: a device address is valid from any thread of the process; the context is made current
// before each use.
unsafe impl Send for DeviceBuffer {}
// SAFETY: as for Send; `&self` methods only issue driver copies (the driver serializes them).
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// Device address of the first byte (what kernels receive, e.g. in `DevComm::signal_base`).
    pub fn addr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Always `false`: buffers hold at least one byte.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    pub(super) fn range<T>(&self, offset: usize, count: usize) -> Result<usize> {
        let len = count
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&len| offset.checked_add(len).is_some_and(|end| end <= self.bytes));
        len.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{count} x {} bytes at offset {offset} exceed a {}-byte device buffer",
                std::mem::size_of::<T>(),
                self.bytes
            ))
        })
    }

    /// Copies `data` to the buffer at byte `offset` and waits for the copy.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range exceeds the buffer; [`Error::Cuda`].
    pub fn write<T: DevicePlain>(&self, offset: usize, data: &[T]) -> Result<()> {
        let len = self.range::<T>(offset, data.len())?;
        if len == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the destination range is inside this allocation (checked above) and the source
        // slice holds `len` initialised bytes (DevicePlain: no padding).
        check("cuMemcpyHtoD_v2", unsafe {
            dsys::cuMemcpyHtoD_v2(self.ptr + offset as u64, data.as_ptr().cast(), len)
        })?;
        // From pageable memory the call may return once the data is staged, before it reached
        // the device; kernels on non-blocking streams would not wait for it.
        sync_legacy_stream()
    }

    /// Copies from the buffer at byte `offset` into `out` and waits for the copy.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range exceeds the buffer; [`Error::Cuda`].
    pub fn read<T: DevicePlain>(&self, offset: usize, out: &mut [T]) -> Result<()> {
        let len = self.range::<T>(offset, out.len())?;
        if len == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the source range is inside this allocation (checked above); `out` has room for
        // `len` bytes, and any bytes are a valid `T` (DevicePlain).
        check("cuMemcpyDtoH_v2", unsafe {
            dsys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr + offset as u64, len)
        })
    }

    /// Sets every byte to zero and waits.
    ///
    /// # Errors
    /// [`Error::Cuda`].
    pub fn zero(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the whole allocation is written; the context is current.
        check("cuMemsetD8_v2", unsafe {
            dsys::cuMemsetD8_v2(self.ptr, 0, self.bytes)
        })?;
        // cuMemsetD8 is asynchronous to the host: wait, so that "zeroed on return" holds for
        // kernels launched afterwards on non-blocking streams.
        sync_legacy_stream()
    }
}

/// Waits for the legacy default stream of the current context, where the synchronous copy and
/// set calls run; unlike `cuCtxSynchronize` this does not wait for kernels on [`Stream`]s.
pub(super) fn sync_legacy_stream() -> Result<()> {
    // SAFETY: a context is current (callers bind first); the null handle is the legacy default
    // stream.
    check("cuStreamSynchronize", unsafe {
        dsys::cuStreamSynchronize(ptr::null_mut())
    })
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind() {
            tracing::warn!(target: "symcomm::cuda", error = %e, "device memory not freed");
            return;
        }
        // SAFETY: the allocation came from cuMemAllocAsync on `self.stream` in this context and
        // is freed exactly once, in order on that stream (no context-wide synchronize); the
        // owner waited for the work that used it (Buffer's last use).
        let r = unsafe { dsys::cuMemFreeAsync(self.ptr, self.stream.stream) };
        if r != dsys::CUresult::CUDA_SUCCESS {
            tracing::warn!(target: "symcomm::cuda", error = ?r, "cuMemFreeAsync failed");
        }
    }
}

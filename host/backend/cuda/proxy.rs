//! The proxy's access to device memory on a GPU (`host/comm/proxy.rs`): copies on a stream of
//! its own.
//!
//! The stream is non-blocking: its copies never wait for kernels, which matters because the
//! kernel that handed the proxy an operation waits for the proxy (a copy on the legacy default
//! stream would wait for a kernel of a blocking stream, PyTorch's default one among them).

use std::ffi::c_void;

use cudarc::driver::sys as dsys;

use super::loader::check;
use super::{CudaDevice, Stream};
use crate::Result;

/// Copies between device memory and the proxy thread's host memory.
pub(crate) struct ProxyCopies {
    stream: Stream,
}

impl CudaDevice {
    /// The proxy's copies on this GPU.
    ///
    /// # Errors
    /// [`crate::Error::Cuda`].
    pub(crate) fn proxy_copies(&self) -> Result<ProxyCopies> {
        Ok(ProxyCopies {
            stream: self.create_stream()?,
        })
    }
}

impl ProxyCopies {
    /// Copies `out.len()` bytes from device address `src` into `out`, and waits.
    ///
    /// # Safety
    /// `src .. src + out.len()` is memory of this GPU's context that stays allocated during the
    /// call.
    pub(crate) unsafe fn read(&self, src: u64, out: &mut [u8]) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        self.stream.ctx.bind()?;
        // SAFETY: `out` has room for its length; the source range is allocated (the caller's
        // contract); the stream is live and of this context.
        check("cuMemcpyDtoHAsync_v2", unsafe {
            dsys::cuMemcpyDtoHAsync_v2(
                out.as_mut_ptr().cast::<c_void>(),
                src,
                out.len(),
                self.stream.stream,
            )
        })?;
        self.stream.synchronize()
    }

    /// Copies `data` to device address `dst`, then stores `value` into the 8-byte word at
    /// `signal` once the data is visible (`cuStreamWriteValue64_v2`'s default flags order it after
    /// every earlier operation of the stream, with a memory barrier), and waits for both.
    ///
    /// # Safety
    /// `dst .. dst + data.len()` and the 8-aligned word at `signal` are memory of this GPU's
    /// context that stays allocated during the call.
    pub(crate) unsafe fn write_and_signal(
        &self,
        dst: u64,
        data: &[u8],
        signal: u64,
        value: u64,
    ) -> Result<()> {
        self.stream.ctx.bind()?;
        if !data.is_empty() {
            // SAFETY: `data` holds its length; the destination range is allocated (the caller's
            // contract). From pageable memory the copy is staged before the call returns, and
            // the stream orders it before the store below.
            check("cuMemcpyHtoDAsync_v2", unsafe {
                dsys::cuMemcpyHtoDAsync_v2(
                    dst,
                    data.as_ptr().cast::<c_void>(),
                    data.len(),
                    self.stream.stream,
                )
            })?;
        }
        // SAFETY: the word is allocated and aligned (the caller's contract); flags 0 is
        // CU_STREAM_WRITE_VALUE_DEFAULT (a memory barrier before the write).
        check("cuStreamWriteValue64_v2", unsafe {
            dsys::cuStreamWriteValue64_v2(self.stream.stream, signal, value, 0)
        })?;
        self.stream.synchronize()
    }
}

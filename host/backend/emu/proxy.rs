//! The proxy's access to device memory on the emulator (`host/comm/proxy.rs`), where device
//! memory is host memory: plain copies and an atomic store, with the same contracts as CUDA's
//! (`host/backend/cuda/proxy.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::Result;

/// Copies between device memory and the proxy thread's host memory.
pub(crate) struct ProxyCopies;

impl ProxyCopies {
    /// Copies `out.len()` bytes from device address `src` into `out`.
    ///
    /// # Safety
    /// `src .. src + out.len()` is device memory that stays allocated during the call.
    pub(crate) unsafe fn read(&self, src: u64, out: &mut [u8]) -> Result<()> {
        if !out.is_empty() {
            // SAFETY: the source range is allocated (the caller's contract) and on the emulator
            // a device address is a host address; `out` is this thread's own memory.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, out.as_mut_ptr(), out.len()) };
        }
        Ok(())
    }

    /// Copies `data` to device address `dst`, then release-stores `value` into the word at
    /// `signal`, so that a kernel that acquires the word sees the data.
    ///
    /// # Safety
    /// `dst .. dst + data.len()` and the 8-aligned word at `signal` are device memory that stays
    /// allocated during the call; kernels access the word with atomics only.
    pub(crate) unsafe fn write_and_signal(
        &self,
        dst: u64,
        data: &[u8],
        signal: u64,
        value: u64,
    ) -> Result<()> {
        if !data.is_empty() {
            // SAFETY: the destination range is allocated (the caller's contract); what kernels
            // read there concurrently is the program's race, as with a put on one host.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len()) };
        }
        // SAFETY: an allocated, aligned word that kernels access with atomics only.
        let word = unsafe { AtomicU64::from_ptr(signal as *mut u64) };
        word.store(value, Ordering::Release);
        Ok(())
    }
}

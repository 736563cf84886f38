//! Host memory the device maps ([`MappedHost`]): mapped pinned memory on a GPU, heap memory on
//! the emulator.

use super::cuda::HostMapped;
use super::emu::memory::HeapBlock;
use super::{Backend, PerBackend, on_backend};
use crate::Result;

/// Zeroed host memory that kernels and stream copies reach through [`Self::device_ptr`] and the
/// host through [`Self::host_ptr`]: mapped pinned memory on a GPU (`cuMemHostAlloc`, page
/// aligned), heap memory on the emulator (8-byte aligned, whole 8-byte words). What symcomm
/// keeps there: the control block (abort flag, error record), the proxy's ring, the gates of
/// calls across hosts, and the staging of data between hosts.
///
/// Its free (`cuMemFreeHost`) synchronizes the GPU, so the drop hands it to
/// [`crate::sync_free::release`]: it runs once no symcomm stream has work in flight, which is
/// also what makes dropping memory that queued copies still use sound. The emulator models that
/// wait ([`HeapBlock`]'s drop).
pub(crate) struct MappedHost {
    host: *mut u8,
    device: u64,
    len: usize,
    /// `None` once handed to `sync_free` (the drop) or leaked.
    memory: Option<PerBackend<HostMapped, HeapBlock>>,
}

// SAFETY: the pointers are to memory owned by `memory`, which moves with the value; what is
// stored there is accessed through atomics or ordered by the users (documented at each).
unsafe impl Send for MappedHost {}
// SAFETY: as for Send; `&self` methods only hand out the addresses.
unsafe impl Sync for MappedHost {}

impl MappedHost {
    /// `bytes` zeroed bytes (at least one) for `backend`.
    ///
    /// # Errors
    /// [`crate::Error::Cuda`] (pinned memory exhausted, ...).
    pub(crate) fn new(backend: &Backend, bytes: usize) -> Result<MappedHost> {
        let bytes = bytes.max(1);
        let memory = backend.make(|d| HostMapped::new(d, bytes), || Ok(HeapBlock::new(bytes)))?;
        Ok(MappedHost {
            host: on_backend!(&memory, m => m.host_ptr()),
            device: on_backend!(&memory, m => m.device_ptr()),
            len: bytes,
            memory: Some(memory),
        })
    }

    /// The first byte, for the host.
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// The first byte's device address (the host address on the emulator).
    pub(crate) fn device_ptr(&self) -> u64 {
        self.device
    }

    /// Size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Keeps the memory allocated for the life of the process (for memory a stream may still
    /// reach after its owner went).
    pub(crate) fn leak(mut self) {
        std::mem::forget(self.memory.take());
    }
}

impl Drop for MappedHost {
    fn drop(&mut self) {
        if let Some(memory) = self.memory.take() {
            crate::sync_free::release(Box::new(move || drop(memory)));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn emulator_memory_is_zeroed_and_addressed_alike() {
        let m = MappedHost::new(&Backend::Emu, 20).unwrap();
        assert_eq!(m.len(), 20);
        assert_eq!(m.device_ptr(), m.host_ptr() as u64);
        // SAFETY: 20 bytes allocated above, no other user.
        let bytes = unsafe { std::slice::from_raw_parts(m.host_ptr(), 20) };
        assert_eq!(bytes, [0u8; 20]);
        assert_eq!(MappedHost::new(&Backend::Emu, 0).unwrap().len(), 1);
    }
}

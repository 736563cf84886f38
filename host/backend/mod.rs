//! Backends that run device code: CUDA GPUs and the CPU emulator.

// The CUDA layer's `pub` items beyond what `crate::cuda` and `Backend` make public are the raw
// layer that the `testing` feature exports (tests/gpu/ builds on it): without that feature
// they are crate-internal, and what only those tests call is unused.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub, dead_code))]
pub(crate) mod cuda;
// The emulator: its streams' queues and its memory, and (tests and the `testing` feature only)
// the in-process team harness.
pub(crate) mod emu;

/// Where a communicator's device code runs: one GPU, or the CPU emulator.
///
/// Cheap to clone (a CUDA device is a shared handle to its primary context).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Backend {
    /// A CUDA GPU (its primary context).
    Cuda(cuda::CudaDevice),
    /// The CPU emulator: kernels run on CPU threads, device memory is host memory.
    Emu,
}

impl Backend {
    /// `cuda:<ordinal>` or `emu`, for messages.
    pub fn name(&self) -> String {
        match self {
            Backend::Cuda(d) => format!("cuda:{}", d.ordinal()),
            Backend::Emu => "emu".to_owned(),
        }
    }

    /// Whether this is the emulator.
    pub fn is_emu(&self) -> bool {
        matches!(self, Backend::Emu)
    }
}

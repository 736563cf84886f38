//! Backends that run device code: CUDA GPUs and the CPU emulator.

pub mod cuda;
pub mod emu;

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

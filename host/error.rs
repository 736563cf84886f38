/// Result of every fallible symcomm call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the symcomm host crate.
///
/// CUDA failures name the call and the CUDA error (`cuModuleLoadData failed:
/// CUDA_ERROR_INVALID_IMAGE`); device-side failures carry the rank, peer and operation recorded by
/// the kernel.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No CUDA driver library (libcuda) could be loaded on this machine.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// A CUDA driver API call failed.
    #[error("{call} failed: {error}")]
    Cuda {
        /// The driver call (`cuInit`, `cuModuleLoadData`, ...).
        call: &'static str,
        /// The CUDA error name (`CUDA_ERROR_NO_DEVICE`).
        error: String,
    },
    /// NVRTC (run-time compilation) could not be loaded or failed.
    #[error("NVRTC {call} failed: {error}")]
    Nvrtc {
        /// The NVRTC call or step.
        call: &'static str,
        /// The NVRTC error and, for compilation, its log.
        error: String,
    },
    /// The kernel is not part of the embedded device code.
    #[error("unknown kernel `{0}`")]
    UnknownKernel(String),
    /// An argument is invalid; nothing was launched.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A bounded device-side wait passed its deadline.
    #[error("timeout on rank {rank} waiting for peer {peer} in {op}")]
    Timeout {
        /// Rank that timed out.
        rank: u32,
        /// Peer it waited for.
        peer: u32,
        /// Operation that waited.
        op: &'static str,
    },
    /// The communicator's abort flag stopped a device-side wait.
    #[error("aborted on rank {rank} while waiting for peer {peer} in {op}")]
    Aborted {
        /// Rank that saw the abort.
        rank: u32,
        /// Peer it waited for.
        peer: u32,
        /// Operation that waited.
        op: &'static str,
    },
    /// Device code or the emulator failed in another way.
    #[error(transparent)]
    Device(#[from] symcomm_device::Error),
    /// Logging could not be set up (bad `SYMCOMM_LOG`, unwritable `SYMCOMM_LOG_FILE`).
    #[error("logging setup: {0}")]
    Log(String),
    /// An I/O error, with what was being done.
    #[error("{what}: {source}")]
    Io {
        /// What failed.
        what: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

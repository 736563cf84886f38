use std::path::PathBuf;
use std::sync::Arc;

/// Errors of the device crate: building device code and running the emulator.
///
/// `Clone`: the I/O errors inside are shared (`Arc`), so an error can be reported again (a
/// failed stream's sticky error) without losing its kind or source.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tool (nvcc, ptxas, the host C++ compiler) could not be started.
    #[error("could not run {tool} ({path}): {source}")]
    ToolStart {
        /// The tool's name.
        tool: &'static str,
        /// The path that was run.
        path: PathBuf,
        /// Why it did not start.
        source: Arc<std::io::Error>,
    },
    /// A compiler ran and failed.
    #[error("{tool} failed on {what} (exit status {status}):\n{stderr}")]
    CompileFailed {
        /// The tool's name.
        tool: &'static str,
        /// What it was compiling.
        what: String,
        /// Its exit status, as printed by the OS.
        status: String,
        /// Its diagnostics.
        stderr: String,
    },
    /// ptxas reported register spills in a kernel that must not spill.
    #[error("kernel {kernel} spills on {arch}: {stores} bytes stored, {loads} bytes loaded")]
    Spills {
        /// Kernel (entry) name.
        kernel: String,
        /// Target architecture (sm_XX).
        arch: String,
        /// Spill store bytes.
        stores: u32,
        /// Spill load bytes.
        loads: u32,
    },
    /// Reading or writing a build input or output failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: Arc<std::io::Error>,
    },
    /// A required build-script environment variable is missing (`OUT_DIR`, ...).
    #[error("environment variable {0} is not set (is this running inside a build script?)")]
    MissingEnv(&'static str),
    /// The emulator refused a launch (bad configuration, unsupported feature, thread budget).
    #[error("emulator launch of {kernel} failed: {message}")]
    EmuLaunch {
        /// Kernel name.
        kernel: String,
        /// The runtime's explanation.
        message: String,
    },
    /// The emulator refused a GPU configuration (a bad value, or the GPU is in use).
    #[error("emulated GPU configuration: {0}")]
    EmuConfig(String),
}

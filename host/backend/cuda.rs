//! The CUDA backend (driver API through cudarc, loaded dynamically).
//!
//! Nothing here links against CUDA: libcuda and libnvrtc are opened at run time, on first use.
//! cudarc panics when a library or one of its symbols is missing, so every entry point first
//! checks — without panicking — that the library loads and exports every symbol this module calls
//! ([`driver_present`], and the NVRTC equivalent inside [`nvrtc_version`] / [`nvrtc_compile`]). A
//! machine without a driver gets [`Error::NoDriver`]; a machine without NVRTC gets
//! [`Error::Nvrtc`].
//!
//! - Probing: [`probe`] lists the GPUs, their properties and the peer-access matrix.
//! - Run-time compilation: [`nvrtc_compile`] compiles a module's embedded source to PTX (the
//!   fallback when the build had no nvcc, or the fatbin has no code for the GPU).
//! - Running kernels: [`CudaDevice`] (one GPU's primary context) loads [`CudaModule`]s, allocates
//!   [`DeviceBuffer`]s and creates [`Stream`]s; [`Stream::launch`] takes `void**` arguments like
//!   `cuLaunchKernel` (and like the emulator's raw launch of the test fixtures); [`Event`]s order
//!   streams; a stream's work can be captured into a [`Graph`] and replayed. The
//!   backend-independent `crate::stream::Stream` builds on these; of this layer only
//!   [`CudaDevice`] (opaque), the probes and the plain-data infos are public (`crate::cuda`), the
//!   rest is exported by the `testing` feature for symcomm's own GPU checks.
//!
//! Every CUDA failure becomes [`Error::Cuda`] with the call and the CUDA error name
//! (`cuModuleLoadDataEx failed: CUDA_ERROR_INVALID_IMAGE`). The driver API is thread-safe; every
//! method makes its device's context current on the calling thread before calling into it.
//!
//! One file a concept: `loader.rs` (opening the libraries, the symbol lists, mapping results to
//! errors), `probe.rs`, `nvrtc.rs`, `device.rs` (the primary context), `module.rs` (modules and
//! kernels), `stream.rs` (streams, events, graphs), `memory.rs` (device buffers),
//! `vmm.rs` (symmetric mappings, pinned host memory) and `proxy.rs` (the proxy's copies).
//!
//! [`Error::NoDriver`]: crate::Error::NoDriver
//! [`Error::Nvrtc`]: crate::Error::Nvrtc
//! [`Error::Cuda`]: crate::Error::Cuda

mod device;
mod loader;
mod memory;
mod module;
mod nvrtc;
mod probe;
mod proxy;
mod stream;
mod vmm;

pub use device::CudaDevice;
pub use memory::DeviceBuffer;
pub use module::{CudaFunction, CudaModule};
pub use nvrtc::nvrtc_version;
pub use probe::{CudaInfo, GpuInfo, driver_present, mps_enabled, probe};
pub(crate) use proxy::ProxyCopies;
pub(crate) use stream::HostCallback;
pub use stream::{Event, Graph, Stream};
pub use vmm::{HostMapped, VmmRange, VmmSegment, gpu_uuid};

// Named only through `crate::testing::cuda` (the `testing` feature).
#[cfg_attr(not(feature = "testing"), allow(unused_imports))]
pub use {
    module::ModuleOrigin,
    nvrtc::{nvrtc_compile, nvrtc_compile_with},
};

//! Fixtures for symcomm's own tests — **not part of the API**: no stability, no soundness
//! promises beyond each item's own contract. Present with the `testing` feature only, which
//! symcomm's dev-dependency on itself turns on for its tests and benches.
//!
//! - [`emu`]: N ranks of one process on the emulator without a communicator (no bootstrap, no
//!   control plane): a signal area, abort flag, error records and windows in the flat layout,
//!   and the raw launch of an embedded kernel (`tests/emu_*.rs`).
//! - [`cuda`]: the CUDA layer beneath [`Backend::Cuda`](crate::Backend::Cuda) — modules,
//!   functions, raw streams, events, graphs, device buffers, VMM — for the GPU checks
//!   (`tests/gpu/`) and the NVRTC check (`tests/nvrtc.rs`).
//! - [`wire`]: the bootstrap wire format as plain values, every frame's encoder and decoder
//!   (the fuzz targets in `fuzz/`, `tests/wire_props.rs`).
//! - [`parse`]: the one-value environment parsers (the `env` fuzz target).
//! - [`bytes_to_other_hosts`]: what a rank has sent between hosts, and
//!   [`exchanges_across_hosts`]: the call numbers its collectives across hosts took
//!   (`tests/coll.rs`).

use symcomm_device::image::{DeviceImage, Module};

use crate::Result;
use crate::backend::cuda::{CudaDevice, CudaModule, DeviceBuffer, Stream};

pub mod parse;
pub mod wire;

/// Bytes `comm`'s rank has sent to ranks on other hosts so far (collectives and send/recv over
/// UCX; 0 for a communicator on one host).
pub fn bytes_to_other_hosts(comm: &crate::Communicator) -> u64 {
    comm.bytes_to_other_hosts()
}

/// Call numbers `comm`'s collectives across hosts have taken so far: one per call, one per chunk
/// of a pipelined all-reduce (0 for a communicator on one host).
pub fn exchanges_across_hosts(comm: &crate::Communicator) -> u64 {
    comm.exchanges_across_hosts()
}

/// The emulator team harness and raw kernel launch.
pub mod emu {
    pub use crate::backend::emu::{EmuTeam, launch};
}

/// The raw CUDA layer (everything of the backend, with [`CudaDeviceExt`] for a device's
/// modules, memory and streams).
pub mod cuda {
    pub use super::CudaDeviceExt;
    pub use crate::backend::cuda::*;
}

/// The raw operations of a [`CudaDevice`] that the public API keeps to itself.
pub trait CudaDeviceExt {
    /// Loads `module` of `image`: its fatbin if it has code for this GPU, else NVRTC.
    ///
    /// # Errors
    /// As the backend's module loading.
    fn load_module(&self, image: &DeviceImage, module: &Module) -> Result<CudaModule>;
    /// Loads `module` of `image` from its embedded source through NVRTC, ignoring any fatbin.
    ///
    /// # Errors
    /// As the backend's module loading.
    fn load_module_nvrtc(&self, image: &DeviceImage, module: &Module) -> Result<CudaModule>;
    /// Allocates `bytes` bytes of zeroed device memory.
    ///
    /// # Errors
    /// As the backend's allocation.
    fn alloc_zeroed(&self, bytes: usize) -> Result<DeviceBuffer>;
    /// Creates a raw stream (`CU_STREAM_NON_BLOCKING`).
    ///
    /// # Errors
    /// As the backend's stream creation.
    fn create_stream(&self) -> Result<Stream>;
}

impl CudaDeviceExt for CudaDevice {
    fn load_module(&self, image: &DeviceImage, module: &Module) -> Result<CudaModule> {
        CudaDevice::load_module(self, image, module)
    }
    fn load_module_nvrtc(&self, image: &DeviceImage, module: &Module) -> Result<CudaModule> {
        CudaDevice::load_module_nvrtc(self, image, module)
    }
    fn alloc_zeroed(&self, bytes: usize) -> Result<DeviceBuffer> {
        CudaDevice::alloc_zeroed(self, bytes)
    }
    fn create_stream(&self) -> Result<Stream> {
        CudaDevice::create_stream(self)
    }
}

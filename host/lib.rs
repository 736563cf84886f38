//! symcomm: device-initiated GPU communication.
//!
//! The host crate: communicators over an authenticated bootstrap, symmetric memory windows, host
//! collectives, streams and launching your own kernels, on a GPU or on the CPU emulator. Device
//! code (CUDA C++) lives in `include/symcomm/` and `device/kernels/`; the `symcomm-device` crate
//! holds the ABI mirror, the emulator runtime and the build helper.
//!
//! # The API
//!
//! Everything public is named in the `pub use` list below (the implementation modules are
//! private); besides the items at the root, five namespaces group what belongs together:
//!
//! - [`abi`]: the plain-data structs and constants shared with the device code (`abi.h`).
//! - [`bootstrap`]: the rendezvous itself ([`bootstrap::init`], [`bootstrap::Bootstrap`], its
//!   protocol constants); the items a communicator needs are also at the root.
//! - [`cuda`]: what the CUDA driver shows (GPUs, NVRTC) and the device handle inside
//!   [`Backend::Cuda`].
//! - [`tune`]: the cost model that picks algorithms and launch geometry.
//! - [`log`]: a `tracing` subscriber configured from `SYMCOMM_LOG*`, for programs that want one
//!   (the library never installs one itself).
//!
//! The `testing` feature adds `testing`, the fixtures of symcomm's own tests (the emulator team
//! harness, the CUDA layer beneath [`Backend`]); it is not part of the API.

mod backend;
pub mod bootstrap;
mod comm;
mod config;
mod error;
mod image;
pub mod log;
mod plain;
mod residency;
mod stream;
mod sync_free;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tune;
mod ucx;

// Communicators, symmetric windows and host collectives.
pub use comm::coll::{DEFAULT_STAGING_BYTES, LANE_BARRIERS, MAX_STREAMS};
/// Barrier indices users' kernels may use, `[USER_BARRIER_FIRST, USER_BARRIER_END)`: never touched
/// by host collectives or send/recv (the `abi.h` constants).
pub use comm::coll::{USER_BARRIER_END, USER_BARRIER_FIRST};
pub use comm::{
    BufferRef, CommOptions, Communicator, DEFAULT_DEVICE_TIMEOUT, DEFAULT_HEARTBEAT,
    DEFAULT_HOSTS_CHUNK_BYTES, DEFAULT_PEER_TIMEOUT, DataType, Device, P2pGroup, RedOp, Window,
    WindowHandle,
};
// Streams, events, graphs, kernels and ordinary device memory, on either backend.
pub use backend::Backend;
pub use plain::DevicePlain;
pub use stream::{Buffer, Event, Graph, Kernel, KernelArgs, LaunchConfig, Stream};
// The device code embedded in this crate, and the type of users' own images.
pub use image::DEVICE_IMAGE;
pub use symcomm_device::image::DeviceImage;
// Bootstrap: what a communicator needs (the rest is in `bootstrap`).
pub use bootstrap::{BootstrapConfig, Launcher, LocalHint, LocalTeam, RankInfo, UniqueId};
// Algorithm selection: the names (the model is in `tune`).
pub use tune::{Algorithm, BackendKind, Collective};
// Every environment variable symcomm reads.
pub use config::{TUNABLES, Tunable};
// Errors.
pub use error::{BootstrapErrorKind, Error, Result};
pub use symcomm_device::abi;
pub use symcomm_device::layout::SignalLayout;
// The transport between hosts, as installed here.
pub use ucx::{UcxInfo, ucx_probe};

/// The CUDA driver as symcomm sees it, and the GPU handle of [`Backend::Cuda`].
///
/// Nothing links against CUDA: libcuda and libnvrtc are opened at run time, and a machine
/// without them gets [`Error::NoDriver`] / [`Error::Nvrtc`], never a panic.
pub mod cuda {
    pub use crate::backend::cuda::{
        CudaDevice, CudaInfo, GpuInfo, driver_present, nvrtc_version, probe,
    };
}

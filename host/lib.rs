//! symcomm: device-initiated GPU communication.
//!
//! The host crate: probing the CUDA driver, the embedded device code, the emulator backend, the
//! [`bootstrap`] rendezvous, and (in later versions) communicators, symmetric windows and host
//! collectives. Device code (CUDA C++) lives in `include/symcomm/` and `device/kernels/`; the
//! `symcomm-device` crate holds the ABI mirror, the emulator runtime and the build helper.

pub mod backend;
pub mod bootstrap;
pub mod comm;
pub mod config;
mod error;
pub mod image;
mod residency;
pub mod stream;
pub(crate) mod sync_free;
pub mod tune;

pub use backend::cuda::DevicePlain;
pub use bootstrap::UniqueId;
/// Barrier indices users' kernels may use, `[USER_BARRIER_FIRST, USER_BARRIER_END)`: never touched
/// by host collectives or send/recv (the `abi.h` constants).
pub use comm::coll::{USER_BARRIER_END, USER_BARRIER_FIRST};
pub use comm::{
    BufferRef, CommOptions, Communicator, DataType, Device, P2pGroup, RedOp, Window, WindowHandle,
};
pub use error::{BootstrapErrorKind, Error, Result};
pub use image::DEVICE_IMAGE;
pub use stream::{Buffer, Event, Graph, Kernel, KernelArg, KernelArgs, LaunchConfig, Stream};
pub use symcomm_device::abi;

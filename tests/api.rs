//! The public API's thread-safety contract, checked at compile time: every public type that a
//! program may hand to another thread or share between threads is `Send` and `Sync` (as
//! tokio's and cudarc's tests assert for theirs). A type that loses either fails to compile here.
//!
//! Not asserted, on purpose: the [`symcomm::DevicePlain`] trait (its implementors are
//! plain data) and `P2pGroup`, a builder that lives inside one
//! `Communicator::group` call (it is `Send` and `Sync` all the same, asserted below so a change
//! is noticed).

use symcomm::abi::{CollArgs, DevComm, ErrorRecord, P2pArgs, P2pOp, WindowHandleRaw};
use symcomm::bootstrap::{Bootstrap, RootLink, StrayStats};
use symcomm::cuda::{CudaDevice, CudaInfo, GpuInfo};
use symcomm::tune::ModelParams;
use symcomm::{
    Algorithm, Backend, BackendKind, BootstrapConfig, BootstrapErrorKind, Buffer, BufferRef,
    Collective, CommOptions, Communicator, DataType, Device, DeviceImage, Error, Event, Graph,
    Kernel, KernelArgs, LaunchConfig, Launcher, LocalHint, LocalTeam, P2pGroup, RankInfo, RedOp,
    Stream, Tunable, UniqueId, Window, WindowHandle,
};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn communicators_windows_and_collectives_are_send_and_sync() {
    assert_send_sync::<Communicator>();
    assert_send_sync::<CommOptions>();
    assert_send_sync::<Device>();
    assert_send_sync::<Window<f32>>();
    assert_send_sync::<Window<u8>>();
    assert_send_sync::<WindowHandle<f32>>();
    assert_send_sync::<BufferRef<'static>>();
    assert_send_sync::<P2pGroup<'static>>();
    assert_send_sync::<DataType>();
    assert_send_sync::<RedOp>();
}

#[test]
fn streams_kernels_and_memory_are_send_and_sync() {
    assert_send_sync::<Backend>();
    assert_send_sync::<CudaDevice>();
    assert_send_sync::<Stream>();
    assert_send_sync::<Event>();
    assert_send_sync::<Graph>();
    assert_send_sync::<Kernel>();
    assert_send_sync::<KernelArgs>();
    assert_send_sync::<LaunchConfig>();
    assert_send_sync::<Buffer>();
    assert_send_sync::<DeviceImage>();
}

#[test]
fn bootstrap_types_are_send_and_sync() {
    assert_send_sync::<UniqueId>();
    assert_send_sync::<BootstrapConfig>();
    assert_send_sync::<Launcher>();
    assert_send_sync::<LocalHint>();
    assert_send_sync::<LocalTeam>();
    assert_send_sync::<RankInfo>();
    assert_send_sync::<Bootstrap>();
    assert_send_sync::<RootLink>();
    assert_send_sync::<StrayStats>();
}

#[test]
fn errors_are_send_and_sync() {
    // Errors cross threads (a rank thread's result, `std::thread::scope` joins, `?` into
    // `Box<dyn Error + Send + Sync>`).
    assert_send_sync::<Error>();
    assert_send_sync::<BootstrapErrorKind>();
    assert_send_sync::<symcomm::Result<()>>();
}

#[test]
fn descriptions_and_abi_structs_are_send_and_sync() {
    assert_send_sync::<Collective>();
    assert_send_sync::<Algorithm>();
    assert_send_sync::<BackendKind>();
    assert_send_sync::<ModelParams>();
    assert_send_sync::<Tunable>();
    assert_send_sync::<CudaInfo>();
    assert_send_sync::<GpuInfo>();
    assert_send_sync::<DevComm>();
    assert_send_sync::<WindowHandleRaw>();
    assert_send_sync::<ErrorRecord>();
    assert_send_sync::<CollArgs>();
    assert_send_sync::<P2pOp>();
    assert_send_sync::<P2pArgs>();
}

/// Every name of the public API resolves at the root or in its namespace (a removed or renamed
/// item fails to compile here), and the curated list has one `Stream`, `Event` and `Graph`.
#[test]
fn the_public_api_names_resolve() {
    let _ = symcomm::DEVICE_IMAGE.name;
    let _ = (symcomm::USER_BARRIER_FIRST, symcomm::USER_BARRIER_END);
    let _ = (symcomm::LANE_BARRIERS, symcomm::DEFAULT_STAGING_BYTES);
    let _ = (
        symcomm::DEFAULT_DEVICE_TIMEOUT,
        symcomm::DEFAULT_HEARTBEAT,
        symcomm::DEFAULT_PEER_TIMEOUT,
    );
    assert!(symcomm::TUNABLES.iter().any(|t| t.name == "SYMCOMM_LOG"));
    let _: fn() -> symcomm::Result<bool> = symcomm::log::init;
    let _: fn() -> symcomm::Result<symcomm::log::LogConfig> = symcomm::log::LogConfig::from_env;
    assert!(symcomm::log::SUBSYSTEMS.contains(&"init"));
    let _: fn() -> bool = symcomm::cuda::driver_present;
    let _: fn() -> symcomm::Result<CudaInfo> = symcomm::cuda::probe;
    let _: fn() -> symcomm::Result<(i32, i32)> = symcomm::cuda::nvrtc_version;
    let _ = (
        symcomm::bootstrap::PROTOCOL_VERSION,
        symcomm::bootstrap::MAX_RANKS,
    );
    let _ = (symcomm::tune::CUDA_PARAMS, symcomm::tune::PIECE_BYTES);
}

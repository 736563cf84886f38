//! Which device a new communicator runs on.
//!
//! NCCL uses the calling thread's current CUDA device. This library links no CUDA runtime, so it
//! asks the driver for the device of the thread's current context (`cuCtxGetDevice`: the
//! runtime makes the device's primary context current in `cudaSetDevice` and on first use).
//! In order:
//! 1. `SYMCOMM_DEVICE=emu`: the CPU emulator; `SYMCOMM_DEVICE=cuda:<n>`: GPU n;
//! 2. the device of the calling thread's current CUDA context, if it has one;
//! 3. otherwise symcomm's choice: GPU `local rank % GPU count` (`SYMCOMM_DEVICE=cuda`, or
//!    unset: the emulator when there is no GPU).
//!
//! `ncclMemAlloc` takes no communicator: it allocates on the device a communicator created on
//! this thread now would use ([`for_alloc`]), where "local rank" is unknown: GPU 0, as the CUDA
//! runtime's default device.

use cudarc::driver::sys as dsys;
use symcomm::{Backend, Device};

use crate::error::Fail;

/// The device for a communicator created now, on this thread.
///
/// # Errors
/// `ncclInvalidArgument` for a malformed `SYMCOMM_DEVICE`.
pub(crate) fn for_init() -> Result<Device, Fail> {
    Ok(match Device::from_env()? {
        Device::Auto | Device::CudaLocal => match current_cuda_device() {
            Some(ordinal) => Device::Cuda(ordinal),
            None => Device::from_env()?,
        },
        chosen => chosen,
    })
}

/// The ordinal of the calling thread's current CUDA context's device, if the driver is present
/// and the thread has a current context.
fn current_cuda_device() -> Option<usize> {
    if !symcomm::cuda::driver_present() {
        return None;
    }
    let mut device: dsys::CUdevice = 0;
    // SAFETY: the driver library is loaded (checked above, so cudarc's loader does not panic);
    // the out-pointer is a live local. Without a current context the call fails and says so.
    let status = unsafe { dsys::cuCtxGetDevice(&mut device) };
    (status == dsys::CUresult::CUDA_SUCCESS)
        .then(|| usize::try_from(device).ok())
        .flatten()
}

/// The backend `ncclMemAlloc` allocates on, on this thread: [`for_init`]'s device, with GPU 0
/// where that depends on the local rank (the emulator when there is no GPU and
/// `SYMCOMM_DEVICE` is unset).
///
/// # Errors
/// `ncclInvalidArgument` for a malformed `SYMCOMM_DEVICE`, or `SYMCOMM_DEVICE=cuda` without a
/// GPU; the driver's errors opening the GPU.
pub(crate) fn for_alloc() -> Result<Backend, Fail> {
    let gpus = || symcomm::cuda::probe().map_or(0, |info| info.devices.len());
    let ordinal = match for_init()? {
        Device::Emu => return Ok(Backend::Emu),
        Device::Cuda(ordinal) => ordinal,
        Device::CudaLocal if gpus() == 0 => {
            return Err(Fail::invalid_argument("SYMCOMM_DEVICE=cuda but no GPU"));
        }
        Device::Auto if gpus() == 0 => return Ok(Backend::Emu),
        _ => 0,
    };
    Ok(Backend::Cuda(symcomm::cuda::CudaDevice::open(ordinal)?))
}

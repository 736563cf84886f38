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

use cudarc::driver::sys as dsys;
use symcomm::Device;

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

//! Probing: the driver version, the visible GPUs, their properties and the peer-access matrix.

use std::ffi::{CStr, c_char, c_int};

use cudarc::driver::sys as dsys;

use super::loader::{check, driver, init};
use crate::{Error, Result};

/// One GPU as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Driver ordinal (`CUDA_VISIBLE_DEVICES` applies).
    pub ordinal: usize,
    /// Marketing name (`NVIDIA H200`).
    pub name: String,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Total device memory, in bytes.
    pub memory_bytes: u64,
    /// Compute capability (major, minor): `(9, 0)` is `sm_90`.
    pub compute_capability: (u32, u32),
}

impl GpuInfo {
    /// The real architecture name for NVRTC and ptxas (`sm_90`).
    pub fn arch(&self) -> String {
        let (major, minor) = self.compute_capability;
        format!("sm_{major}{minor}")
    }
}

/// The CUDA driver and the GPUs it sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaInfo {
    /// Driver API version, `1000 * major + 10 * minor` (`13000` is CUDA 13.0).
    pub driver_version: i32,
    /// Every visible GPU, by ordinal.
    pub devices: Vec<GpuInfo>,
    /// `peer_access[i][j]`: GPU `i` can access GPU `j`'s memory (`cuDeviceCanAccessPeer`); the
    /// diagonal is `true`.
    pub peer_access: Vec<Vec<bool>>,
}

/// Whether the CUDA driver library (libcuda) can be loaded and exports every entry point this
/// backend uses. Says nothing about GPUs: [`probe`] does. Never panics; the answer is computed
/// once per process.
pub fn driver_present() -> bool {
    driver().is_ok()
}

/// Initialises the driver and describes it and every visible GPU.
///
/// # Errors
/// [`Error::NoDriver`] when libcuda cannot be loaded (or lacks an entry point);
/// [`Error::Cuda`] when a driver call fails — `cuInit` with `CUDA_ERROR_NO_DEVICE` on a machine
/// with a driver but no usable GPU.
pub fn probe() -> Result<CudaInfo> {
    init()?;
    let mut version: c_int = 0;
    // SAFETY: libcuda is loaded and initialised; the out-pointer is a live local.
    check("cuDriverGetVersion", unsafe {
        dsys::cuDriverGetVersion(&mut version)
    })?;
    let count = device_count()?;
    let mut handles = Vec::with_capacity(count);
    let mut devices = Vec::with_capacity(count);
    for ordinal in 0..count {
        let dev = device_handle(ordinal)?;
        devices.push(gpu_info(ordinal, dev)?);
        handles.push(dev);
    }
    let mut peer_access = vec![vec![false; count]; count];
    for (i, &di) in handles.iter().enumerate() {
        for (j, &dj) in handles.iter().enumerate() {
            peer_access[i][j] = if i == j {
                true
            } else {
                let mut can: c_int = 0;
                // SAFETY: both handles came from cuDeviceGet; the out-pointer is a live local.
                check("cuDeviceCanAccessPeer", unsafe {
                    dsys::cuDeviceCanAccessPeer(&mut can, di, dj)
                })?;
                can != 0
            };
        }
    }
    Ok(CudaInfo {
        driver_version: version,
        devices,
        peer_access,
    })
}

pub(super) fn device_count() -> Result<usize> {
    let mut count: c_int = 0;
    // SAFETY: the driver is initialised (callers run `init` first); the out-pointer is a local.
    check("cuDeviceGetCount", unsafe {
        dsys::cuDeviceGetCount(&mut count)
    })?;
    Ok(usize::try_from(count).unwrap_or(0))
}

pub(super) fn device_handle(ordinal: usize) -> Result<dsys::CUdevice> {
    let index = c_int::try_from(ordinal)
        .map_err(|_| Error::InvalidArgument(format!("GPU ordinal {ordinal} is out of range")))?;
    let mut dev: dsys::CUdevice = 0;
    // SAFETY: the driver is initialised; the out-pointer is a live local; a bad ordinal is
    // reported as CUDA_ERROR_INVALID_DEVICE.
    check("cuDeviceGet", unsafe { dsys::cuDeviceGet(&mut dev, index) })?;
    Ok(dev)
}

pub(super) fn attribute(dev: dsys::CUdevice, attr: dsys::CUdevice_attribute) -> Result<u32> {
    let mut value: c_int = 0;
    // SAFETY: `dev` came from cuDeviceGet; the out-pointer is a live local.
    check("cuDeviceGetAttribute", unsafe {
        dsys::cuDeviceGetAttribute(&mut value, attr, dev)
    })?;
    Ok(u32::try_from(value).unwrap_or(0))
}

/// Whether contexts on GPU `ordinal` are shared through MPS (`CU_DEVICE_ATTRIBUTE_MPS_ENABLED`),
/// so that kernels of different processes run concurrently.
///
/// # Errors
/// [`Error::Cuda`] when the driver refuses the query (drivers before CUDA 12.2 lack it).
pub fn mps_enabled(ordinal: usize) -> Result<bool> {
    let dev = device_handle(ordinal)?;
    Ok(attribute(
        dev,
        dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED,
    )? != 0)
}

pub(super) fn gpu_info(ordinal: usize, dev: dsys::CUdevice) -> Result<GpuInfo> {
    let mut name = [0 as c_char; 256];
    // SAFETY: the buffer holds `len` bytes and the driver NUL-terminates within them.
    check("cuDeviceGetName", unsafe {
        dsys::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, dev)
    })?;
    let bytes: Vec<u8> = name.iter().map(|&c| c as u8).collect();
    let name = CStr::from_bytes_until_nul(&bytes)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
    let mut memory: usize = 0;
    // SAFETY: `dev` came from cuDeviceGet; the out-pointer is a live local.
    check("cuDeviceTotalMem_v2", unsafe {
        dsys::cuDeviceTotalMem_v2(&mut memory, dev)
    })?;
    use dsys::CUdevice_attribute as A;
    Ok(GpuInfo {
        ordinal,
        name,
        sms: attribute(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        memory_bytes: memory as u64,
        compute_capability: (
            attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::backend::cuda::CudaDevice;

    #[test]
    fn missing_driver_is_an_error_not_a_panic() {
        if driver_present() {
            // A machine with a driver: probing either works or names the failing call.
            match probe() {
                Ok(info) => assert_eq!(info.peer_access.len(), info.devices.len()),
                Err(Error::Cuda { call, .. }) => assert!(call.starts_with("cu"), "{call}"),
                Err(e) => panic!("unexpected error {e}"),
            }
        } else {
            assert!(matches!(probe(), Err(Error::NoDriver(_))));
            let e = CudaDevice::open(0).unwrap_err();
            assert!(matches!(e, Error::NoDriver(_)), "{e}");
            assert!(e.to_string().starts_with("no CUDA driver: libcuda"), "{e}");
        }
    }

    #[test]
    fn arch_names_follow_the_compute_capability() {
        let gpu = GpuInfo {
            ordinal: 0,
            name: "x".into(),
            sms: 1,
            memory_bytes: 1,
            compute_capability: (9, 0),
        };
        assert_eq!(gpu.arch(), "sm_90");
    }
}

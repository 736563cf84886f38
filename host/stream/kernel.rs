//! Launch geometry ([`LaunchConfig`]) and kernels of an embedded image loaded for one backend
//! ([`Kernel`]).

use std::sync::Arc;

use symcomm_device::image::DeviceImage;

use crate::backend::cuda::CudaModule;
use crate::backend::emu::kernel::EmuKernel;
use crate::backend::{Backend, PerBackend, on_backend};
use crate::{Error, Result};

#[cfg(doc)]
use super::Stream;

/// The shape of a launch: CTAs (`grid`), threads per CTA (`block`) and dynamic shared memory per
/// CTA in bytes. Every dimension must be at least 1; the backend enforces CUDA's limits (1024
/// threads per CTA, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// CTAs in x, y, z.
    pub grid: [u32; 3],
    /// Threads per CTA in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory per CTA, in bytes.
    pub shared_bytes: u32,
    /// Every CTA of the launch must be resident at once (grid-scope code: CTAs wait for one
    /// another, or for peers' CTAs). Checked before launching: [`Stream::launch`] against the
    /// whole GPU (CUDA: a cooperative launch, `cuLaunchCooperativeKernel`), and
    /// [`Communicator::launch`](crate::Communicator::launch) against this rank's share when
    /// ranks share the GPU; a grid beyond it is refused with the budget named.
    pub co_resident: bool,
}

impl LaunchConfig {
    /// `ctas` CTAs of `threads` threads each, in x only, without dynamic shared memory.
    pub fn linear(ctas: u32, threads: u32) -> Self {
        LaunchConfig {
            grid: [ctas, 1, 1],
            block: [threads, 1, 1],
            shared_bytes: 0,
            co_resident: false,
        }
    }

    /// The same launch, with every CTA required to be resident at once (see
    /// [`LaunchConfig::co_resident`](#structfield.co_resident)).
    #[must_use]
    pub fn co_resident(self) -> Self {
        LaunchConfig {
            co_resident: true,
            ..self
        }
    }

    /// CTAs in the grid.
    pub fn ctas(&self) -> u64 {
        self.grid.iter().map(|&d| u64::from(d)).product()
    }

    /// Threads per CTA.
    pub fn threads(&self) -> u32 {
        self.block.iter().product()
    }

    /// The same launch with `bytes` of dynamic shared memory per CTA.
    #[must_use]
    pub fn with_shared_bytes(self, bytes: u32) -> Self {
        LaunchConfig {
            shared_bytes: bytes,
            ..self
        }
    }
}

/// A kernel of an embedded [`DeviceImage`], loaded for one backend; launched with
/// [`Stream::launch`] on streams of the same backend (and, for CUDA, the same GPU).
///
/// Cheap to clone. A module is loaded once per process and GPU (every kernel of it at once, not
/// at its first launch), and kept while any `Kernel` of it lives: later loads of its kernels,
/// by any rank of the process, are lookups. Load your kernels before launching anything that
/// waits for peers: loading new code may wait for the GPU to go idle (CUDA's lazy loading; the
/// emulator does the same), so a rank loading a module while a peer's kernel waits for that
/// rank hangs both until the device timeout. Communicators load symcomm's own kernels at init.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub(super) name: &'static str,
    pub(super) code: KernelCode,
}

pub(super) type KernelCode = PerBackend<Arc<CudaModule>, EmuKernel>;

impl Kernel {
    /// Loads kernel `name` of `image` for `backend`: on CUDA, its module (fatbin, or NVRTC
    /// fallback); on the emulator, its emulator entry point.
    ///
    /// # Errors
    /// [`Error::UnknownKernel`] when `image` has no kernel `name` (or its loaded module lacks
    /// it); on CUDA, [`Error::Cuda`] / [`Error::Nvrtc`] when the module cannot be loaded.
    pub fn load(backend: &Backend, image: &'static DeviceImage, name: &str) -> Result<Kernel> {
        let (module, kernel) = image
            .module_of(name)
            .ok_or_else(|| Error::UnknownKernel(name.to_owned()))?;
        let code = backend.make(
            |device| {
                let loaded = device.shared_module(image, module)?;
                // Fails early (UnknownKernel) if the loaded code lacks the entry.
                loaded.function(kernel.name)?;
                Ok(loaded)
            },
            || Ok(EmuKernel::new(image, module, kernel)),
        )?;
        Ok(Kernel {
            name: kernel.name,
            code,
        })
    }

    /// Every kernel of `image` loaded for `backend` now, held until the returned value drops
    /// (a communicator holds symcomm's own image from init on: see [`Kernel`]).
    ///
    /// # Errors
    /// As [`Kernel::load`].
    pub(crate) fn preload(backend: &Backend, image: &'static DeviceImage) -> Result<Vec<Kernel>> {
        image
            .modules
            .iter()
            .filter_map(|m| m.kernels.first())
            .map(|k| Kernel::load(backend, image, k.name))
            .collect()
    }

    /// The kernel's entry name.
    pub fn name(&self) -> &str {
        self.name
    }

    /// CTAs of `threads` threads with `shared_bytes` of dynamic shared memory that one SM holds
    /// at once: `cuOccupancyMaxActiveBlocksPerMultiprocessor` on CUDA; on the emulator what
    /// the sm_90 rules give for the kernel's ptxas report (1 without one), at most the emulated
    /// GPU's room per SM.
    ///
    /// # Errors
    /// [`Error::Cuda`] when the driver refuses the query; [`Error::Device`] for a malformed
    /// `SYMCOMM_EMU_SMS` / `SYMCOMM_EMU_CTAS_PER_SM`.
    pub fn occupancy(&self, threads: u32, shared_bytes: u32) -> Result<u32> {
        match &self.code {
            PerBackend::Cuda(module) => {
                module.function(self.name)?.occupancy(threads, shared_bytes)
            }
            PerBackend::Emu(k) => k.occupancy(threads, shared_bytes),
        }
    }

    /// CTAs of `threads` threads with `shared_bytes` of dynamic shared memory that the whole GPU
    /// holds at once ([`Kernel::occupancy`] x SMs), for every rank on it together.
    ///
    /// # Errors
    /// As [`Kernel::occupancy`].
    pub fn resident_ctas(&self, threads: u32, shared_bytes: u32) -> Result<u32> {
        let per_sm = self.occupancy(threads, shared_bytes)?;
        let sms = on_backend!(&self.code, code => code.sm_count()?);
        Ok(per_sm.saturating_mul(sms))
    }
}

/// Refuses a co-resident launch of more CTAs than `fits` (`whose` says whose budget that is).
pub(crate) fn check_co_resident(
    kernel: &Kernel,
    config: &LaunchConfig,
    fits: u32,
    whose: &str,
) -> Result<()> {
    if config.ctas() > u64::from(fits) {
        return Err(Error::InvalidArgument(format!(
            "co-resident launch of {} with {} CTAs of {} threads ({} B dynamic shared memory): \
             {whose} {fits} such CTAs at once, so CTAs that wait for one another would wait \
             forever; launch at most {fits}",
            kernel.name,
            config.ctas(),
            config.threads(),
            config.shared_bytes
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::DEVICE_IMAGE;

    #[test]
    fn unknown_kernels_are_refused() {
        let e = Kernel::load(&Backend::Emu, &DEVICE_IMAGE, "no_such_kernel").unwrap_err();
        assert!(
            matches!(e, Error::UnknownKernel(ref n) if n == "no_such_kernel"),
            "{e}"
        );
    }

    #[test]
    fn launch_configs_build() {
        assert_eq!(
            LaunchConfig::linear(4, 128).with_shared_bytes(64),
            LaunchConfig {
                grid: [4, 1, 1],
                block: [128, 1, 1],
                shared_bytes: 64,
                co_resident: false,
            }
        );
        let c = LaunchConfig::linear(4, 128).co_resident();
        assert!(c.co_resident);
        assert_eq!((c.ctas(), c.threads()), (4, 128));
    }
}

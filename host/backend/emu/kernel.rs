//! A kernel of an embedded image on the emulator: its entry point and its residency on the
//! emulated GPU.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use symcomm_device::emu::EmuEntry;
use symcomm_device::image::{DeviceImage, Kernel, KernelReport, Module};

use crate::Result;

/// The emulated GPU every emulator rank of a process runs on.
const EMU_GPU: u32 = 0;

/// A kernel's emulator entry and what the emulator's residency needs to know of it.
#[derive(Debug, Clone)]
pub(crate) struct EmuKernel {
    entry: EmuEntry,
    /// The kernel's sm_90 ptxas report (registers, static shared memory), when nvcc built it.
    report: Option<&'static KernelReport>,
    /// Its module, "loaded" while any kernel of it lives.
    _module: Arc<EmuModule>,
}

/// The emulator's stand-in for a module loaded on the GPU: nothing to load, but the first load of
/// a module in the process (no live kernel of it) waits for every emulator stream to drain, as
/// the CUDA driver's loading may wait for the context to go idle (lazy loading): a rank that
/// loads new code while a peer's kernel waits for it hangs here as on a GPU.
#[derive(Debug)]
struct EmuModule;

/// Modules of the process with a live kernel (the address of the module's description).
static LOADED: Mutex<Vec<(usize, Weak<EmuModule>)>> = Mutex::new(Vec::new());

impl EmuKernel {
    /// `kernel` of `module` of `image`, for the emulator.
    pub(crate) fn new(
        image: &'static DeviceImage,
        module: &'static Module,
        kernel: &'static Kernel,
    ) -> Self {
        EmuKernel {
            entry: kernel.emu_entry,
            report: image
                .report
                .iter()
                .find(|r| r.kernel == kernel.name && r.arch == "sm_90"),
            _module: load(module),
        }
    }

    /// CTAs of `threads` threads with `shared_bytes` of dynamic shared memory that one emulated
    /// SM holds at once: what the sm_90 rules give for the kernel's ptxas report (1 without
    /// one), at most the emulated GPU's room per SM.
    ///
    /// # Errors
    /// [`crate::Error::Device`] for a malformed `SYMCOMM_EMU_SMS` / `SYMCOMM_EMU_CTAS_PER_SM`.
    pub(crate) fn occupancy(&self, threads: u32, shared_bytes: u32) -> Result<u32> {
        let gpu = symcomm_device::emu::query_gpu(EMU_GPU)?;
        Ok(
            crate::residency::emu_occupancy(self.report, threads, shared_bytes)
                .min(gpu.ctas_per_sm),
        )
    }

    /// SMs of the emulated GPU.
    ///
    /// # Errors
    /// As [`Self::occupancy`].
    pub(crate) fn sm_count(&self) -> Result<u32> {
        Ok(symcomm_device::emu::query_gpu(EMU_GPU)?.sms)
    }

    /// Runs the kernel (named `name`) on the emulated GPU, `occupancy` CTAs per SM at once, and
    /// blocks until it finished.
    ///
    /// # Errors
    /// [`crate::Error::Device`] when the emulator refuses the launch configuration.
    ///
    /// # Safety
    /// As for `cuLaunchKernel`: `args` holds one pointer per kernel parameter, each pointing at a
    /// live value of exactly that parameter's type, and every address the kernel reaches through
    /// them stays valid until this returns.
    pub(crate) unsafe fn launch(
        &self,
        name: &str,
        occupancy: u32,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe {
            symcomm_device::emu::launch_on(
                EMU_GPU,
                occupancy,
                name,
                self.entry,
                grid,
                block,
                shared_bytes as usize,
                args,
            )
        }?;
        Ok(())
    }
}

/// `module`'s stand-in, shared while any kernel of it lives; a first load drains every emulator
/// stream first (see [`EmuModule`]).
fn load(module: &'static Module) -> Arc<EmuModule> {
    let key = std::ptr::from_ref(module) as usize;
    let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
    loaded.retain(|(_, m)| m.strong_count() > 0);
    if let Some(m) = loaded
        .iter()
        .filter(|(k, _)| *k == key)
        .find_map(|(_, m)| m.upgrade())
    {
        return m;
    }
    crate::sync_free::emulated_context_sync();
    let m = Arc::new(EmuModule);
    loaded.push((key, Arc::downgrade(&m)));
    m
}

//! The CPU emulator backend: runs the embedded kernels' emulator builds.
//!
//! [`launch`] runs one kernel of an embedded [`DeviceImage`](symcomm_device::image::DeviceImage)
//! and blocks until it finished. [`LocalTeam`] lays out the signal area, abort flag, error records
//! and one symmetric window for N ranks of one process in the flat layout (DESIGN §3) — the
//! in-process harness that the emulator tests use; communicators with windows for any number of
//! processes build on the same layout.

use std::ffi::c_void;

use symcomm_device::abi::{
    DevComm, ErrorRecord, SYMCOMM_ABI_VERSION, SYMCOMM_SIGNAL_SLOTS, WindowHandleRaw,
};
use symcomm_device::image::DeviceImage;

use crate::{Error, Result};

/// Launches kernel `name` of `image` on the emulator and waits for it to finish.
///
/// # Errors
/// [`Error::UnknownKernel`] when the image has no such kernel; [`Error::Device`] when the
/// emulator refuses the launch configuration.
///
/// # Safety
/// As for `cuLaunchKernel`: `args` holds one pointer per kernel parameter, each pointing at a live
/// value of exactly that parameter's type, and every address the kernel reaches through them
/// stays valid until this returns.
pub unsafe fn launch(
    image: &DeviceImage,
    name: &str,
    grid: [u32; 3],
    block: [u32; 3],
    args: &mut [*mut c_void],
) -> Result<()> {
    let (_, kernel) = image
        .module_of(name)
        .ok_or_else(|| Error::UnknownKernel(name.to_owned()))?;
    tracing::debug!(target: "symcomm::emu", kernel = name, ?grid, ?block, "launch");
    // SAFETY: forwarded from this function's contract.
    unsafe { symcomm_device::emu::launch(name, kernel.emu_entry, grid, block, 0, args) }?;
    Ok(())
}

/// Alignment of every window copy and of the signal area.
const ALIGN: usize = 256;

#[repr(C, align(256))]
#[derive(Clone, Copy)]
struct Block([u8; ALIGN]);

/// Zeroed host memory aligned to [`ALIGN`], addressed by the kernels through raw addresses.
struct Arena {
    blocks: Box<[Block]>,
}

impl Arena {
    fn new(bytes: usize) -> Self {
        Arena {
            blocks: vec![Block([0; ALIGN]); bytes.div_ceil(ALIGN).max(1)].into_boxed_slice(),
        }
    }
    fn addr(&mut self) -> u64 {
        self.blocks.as_mut_ptr() as u64
    }
}

/// N ranks of one process sharing a signal area and one symmetric window, in the flat layout:
/// rank r's copy at `base + r * stride`.
pub struct LocalTeam {
    nranks: u32,
    window_bytes: u64,
    window_stride: u64,
    signals: Arena,
    window: Arena,
    errors: Box<[ErrorRecord]>,
    abort: Box<u32>,
}

impl LocalTeam {
    /// A team of `nranks` ranks with a window of `window_bytes` bytes per rank, all zeroed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero ranks.
    pub fn new(nranks: u32, window_bytes: u64) -> Result<Self> {
        if nranks == 0 {
            return Err(Error::InvalidArgument(
                "a team needs at least one rank".into(),
            ));
        }
        let stride = window_bytes.div_ceil(ALIGN as u64).max(1) * ALIGN as u64;
        let n = nranks as usize;
        let signal_bytes = n * n * SYMCOMM_SIGNAL_SLOTS as usize * 8;
        let zero = ErrorRecord {
            status: 0,
            rank: 0,
            peer: 0,
            op: 0,
            detail: 0,
            time_ns: 0,
        };
        Ok(LocalTeam {
            nranks,
            window_bytes,
            window_stride: stride,
            signals: Arena::new(signal_bytes),
            window: Arena::new(stride as usize * n),
            errors: vec![zero; n].into_boxed_slice(),
            abort: Box::new(0),
        })
    }

    /// Ranks in the team.
    pub fn nranks(&self) -> u32 {
        self.nranks
    }

    /// Device handle of the communicator for `rank`, with waits bounded by `timeout_ns`.
    pub fn dev_comm(&mut self, rank: u32, timeout_ns: u64) -> DevComm {
        DevComm {
            abi_version: SYMCOMM_ABI_VERSION,
            rank,
            nranks: self.nranks,
            signal_slots: SYMCOMM_SIGNAL_SLOTS,
            signal_base: self.signals.addr(),
            signal_stride: u64::from(self.nranks) * u64::from(SYMCOMM_SIGNAL_SLOTS) * 8,
            abort_flag: std::ptr::from_mut::<u32>(&mut self.abort) as u64,
            error: std::ptr::from_mut(&mut self.errors[rank as usize]) as u64,
            timeout_ns,
        }
    }

    /// Device handle of the window for `rank`.
    pub fn window(&mut self, rank: u32) -> WindowHandleRaw {
        WindowHandleRaw {
            base: self.window.addr(),
            stride: self.window_stride,
            bytes: self.window_bytes,
            rank,
            nranks: self.nranks,
        }
    }

    /// The error record of `rank` (read between launches).
    pub fn error(&self, rank: u32) -> ErrorRecord {
        self.errors[rank as usize]
    }
}

//! The emulator's in-process team harness and raw launch: test fixtures.
//!
//! [`launch`] runs one kernel of an embedded [`DeviceImage`]
//! and blocks until it finished. [`EmuTeam`] lays out the signal area, abort flag, error records
//! and symmetric windows for N ranks of one process in the flat layout (DESIGN §3) — a bare test
//! fixture for driving kernels directly (no bootstrap, no control plane). Programs use a
//! [`Communicator`](crate::Communicator) on `Device::Emu`, whose windows have the same layout
//! and work across processes.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

use symcomm_device::abi::{
    DevComm, ErrorRecord, SYMCOMM_ABI_VERSION, SYMCOMM_COMM_SAME_GPU, SYMCOMM_DTYPE_NONE,
    SYMCOMM_LL_LINES, SYMCOMM_SIGNAL_WORDS, WindowHandleRaw,
};
use symcomm_device::image::DeviceImage;
use symcomm_device::layout::SignalLayout;

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
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: `Block` is plain bytes (align 256, size 256, no padding), so the boxed slice is
        // `blocks.len() * ALIGN` initialized bytes.
        unsafe {
            std::slice::from_raw_parts(self.blocks.as_ptr().cast::<u8>(), self.blocks.len() * ALIGN)
        }
    }
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_bytes`, with exclusive access through `&mut self`.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.blocks.as_mut_ptr().cast::<u8>(),
                self.blocks.len() * ALIGN,
            )
        }
    }
    fn addr(&mut self) -> u64 {
        self.blocks.as_mut_ptr() as u64
    }
}

/// N ranks of one process sharing a signal area and symmetric windows, in the flat layout: rank
/// r's copy of a window at `base + r * stride`.
pub struct EmuTeam {
    nranks: u32,
    signals: Arena,
    windows: Vec<LocalWindow>,
    errors: Box<[ErrorRecord]>,
    /// Read by the kernels (through `DevComm::abort_flag`) while they run, so only ever accessed
    /// atomically, and shared (`&self`) by the host thread that raises it.
    abort: Box<AtomicU32>,
}

struct LocalWindow {
    bytes: u64,
    stride: u64,
    arena: Arena,
}

impl EmuTeam {
    /// A team of `nranks` ranks with one window of `window_bytes` bytes per rank, all zeroed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero ranks.
    pub fn new(nranks: u32, window_bytes: u64) -> Result<Self> {
        Self::with_windows(nranks, &[window_bytes])
    }

    /// A team of `nranks` ranks with one window per entry of `window_bytes` (bytes per rank),
    /// all zeroed. Windows are numbered in that order.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero ranks.
    pub fn with_windows(nranks: u32, window_bytes: &[u64]) -> Result<Self> {
        if nranks == 0 {
            return Err(Error::InvalidArgument(
                "a team needs at least one rank".into(),
            ));
        }
        let n = nranks as usize;
        let signal_bytes = SignalLayout::new(nranks).total_bytes() as usize;
        let zero = ErrorRecord {
            status: 0,
            rank: 0,
            peer: 0,
            op: 0,
            detail: 0,
            time_ns: 0,
        };
        let windows = window_bytes
            .iter()
            .map(|&bytes| {
                let stride = bytes.div_ceil(ALIGN as u64).max(1) * ALIGN as u64;
                LocalWindow {
                    bytes,
                    stride,
                    arena: Arena::new(stride as usize * n),
                }
            })
            .collect();
        Ok(EmuTeam {
            nranks,
            signals: Arena::new(signal_bytes),
            windows,
            errors: vec![zero; n].into_boxed_slice(),
            abort: Box::new(AtomicU32::new(0)),
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
            signal_words: SYMCOMM_SIGNAL_WORDS,
            signal_base: self.signals.addr(),
            signal_stride: SignalLayout::new(self.nranks).stride,
            abort_flag: self.abort.as_ptr() as u64,
            error: std::ptr::from_mut(&mut self.errors[rank as usize]) as u64,
            timeout_ns,
            ll_offset: SignalLayout::new(self.nranks).ll_offset,
            ll_lines: SYMCOMM_LL_LINES,
            // The team's ranks share the emulated GPU.
            flags: SYMCOMM_COMM_SAME_GPU,
            ranks: 0,
            proxy: 0,
        }
    }

    /// Device handle of window 0 for `rank`.
    pub fn window(&mut self, rank: u32) -> WindowHandleRaw {
        self.window_of(0, rank)
    }

    /// Device handle of window `w` for `rank`: a byte window (`elem_size` 1, `SYMCOMM_DTYPE_NONE`),
    /// which collectives of every type accept; set the fields to type it. Panics if `w` does
    /// not exist (a test harness).
    pub fn window_of(&mut self, w: usize, rank: u32) -> WindowHandleRaw {
        let nranks = self.nranks;
        let win = &mut self.windows[w];
        WindowHandleRaw {
            base: win.arena.addr(),
            stride: win.stride,
            bytes: win.bytes,
            rank,
            nranks,
            elem_size: 1,
            dtype: SYMCOMM_DTYPE_NONE,
            ranks: 0,
        }
    }

    /// Rank `rank`'s copy of window `w` (read between launches).
    pub fn bytes(&self, w: usize, rank: u32) -> &[u8] {
        let win = &self.windows[w];
        let start = win.stride as usize * rank as usize;
        &win.arena.as_bytes()[start..start + win.bytes as usize]
    }

    /// Rank `rank`'s copy of window `w`, writable (between launches).
    pub fn bytes_mut(&mut self, w: usize, rank: u32) -> &mut [u8] {
        let win = &mut self.windows[w];
        let start = win.stride as usize * rank as usize;
        &mut win.arena.as_bytes_mut()[start..start + win.bytes as usize]
    }

    /// Raises (or clears) the abort flag that every device-side wait polls.
    ///
    /// Takes `&self`, so a host thread may call it while the ranks' kernels run (launched from
    /// other threads with handles from [`dev_comm`](Self::dev_comm)): the flag is an atomic that
    /// the kernels read with atomic loads.
    pub fn set_abort(&self, raised: bool) {
        self.abort.store(u32::from(raised), Ordering::Release);
    }

    /// Whether the abort flag is raised.
    pub fn abort_raised(&self) -> bool {
        self.abort.load(Ordering::Acquire) != 0
    }

    /// The error record of `rank` (read between launches).
    pub fn error(&self, rank: u32) -> ErrorRecord {
        self.errors[rank as usize]
    }

    /// Clears every rank's error record.
    pub fn clear_errors(&mut self) {
        for e in self.errors.iter_mut() {
            e.status = 0;
        }
    }
}

//! A team of ranks as streams on one GPU (flat layout, as the emulator's `EmuTeam`), and the
//! bounded wait with its abort-flag watchdog.

use super::*;
use symcomm::SignalLayout;

/// N ranks as streams on one GPU, in the flat layout of the emulator's `EmuTeam` (DESIGN §3):
/// one device allocation each for the signal area (`SignalLayout`: signal words and LL area,
/// zeroed; rank r's array at `signals + r * signal_stride`), the error records (one per rank), the abort flag, and
/// every window (rank r's copy at `base + r * stride`, the stride a multiple of 256 bytes).
pub(crate) struct GpuTeam {
    pub(crate) nranks: u32,
    pub(crate) signals: DeviceBuffer,
    pub(crate) abort: DeviceBuffer,
    pub(crate) errors: DeviceBuffer,
    pub(crate) windows: Vec<GpuWindow>,
}

/// One symmetric window of a [`GpuTeam`].
pub(crate) struct GpuWindow {
    pub(crate) buf: DeviceBuffer,
    /// Usable bytes per rank.
    pub(crate) bytes: u64,
    /// Bytes between consecutive ranks' copies.
    pub(crate) stride: u64,
}

pub(crate) const ERROR_RECORD_BYTES: usize = std::mem::size_of::<ErrorRecord>();

impl GpuTeam {
    /// A team with one window per entry of `window_bytes` (bytes per rank), everything zeroed.
    pub(crate) fn new(
        dev: &CudaDevice,
        nranks: u32,
        window_bytes: &[u64],
    ) -> symcomm::Result<Self> {
        let n = nranks as usize;
        let windows = window_bytes
            .iter()
            .map(|&bytes| {
                let stride = bytes.div_ceil(ALIGN).max(1) * ALIGN;
                Ok(GpuWindow {
                    buf: dev.alloc_zeroed(stride as usize * n)?,
                    bytes,
                    stride,
                })
            })
            .collect::<symcomm::Result<Vec<_>>>()?;
        Ok(GpuTeam {
            nranks,
            signals: dev.alloc_zeroed(SignalLayout::new(nranks).total_bytes() as usize)?,
            abort: dev.alloc_zeroed(4)?,
            errors: dev.alloc_zeroed(n * ERROR_RECORD_BYTES)?,
            windows,
        })
    }

    pub(crate) fn dev_comm(&self, rank: u32, timeout_ns: u64) -> DevComm {
        DevComm {
            abi_version: SYMCOMM_ABI_VERSION,
            rank,
            nranks: self.nranks,
            signal_words: SYMCOMM_SIGNAL_WORDS,
            signal_base: self.signals.addr(),
            signal_stride: SignalLayout::new(self.nranks).stride,
            abort_flag: self.abort.addr(),
            error: self.errors.addr() + u64::from(rank) * ERROR_RECORD_BYTES as u64,
            timeout_ns,
            ll_offset: SignalLayout::new(self.nranks).ll_offset,
            ll_lines: SYMCOMM_LL_LINES,
            // One GPU holds every rank of the harness.
            flags: SYMCOMM_COMM_SAME_GPU,
            ranks: 0,
            proxy: 0,
        }
    }

    /// Rank `rank`'s handle of window `w`.
    pub(crate) fn window(&self, w: usize, rank: u32) -> WindowHandleRaw {
        let win = &self.windows[w];
        WindowHandleRaw {
            base: win.buf.addr(),
            stride: win.stride,
            bytes: win.bytes,
            rank,
            nranks: self.nranks,
            elem_size: 1,
            dtype: SYMCOMM_DTYPE_NONE,
            ranks: 0,
        }
    }

    pub(crate) fn error(&self, rank: u32) -> symcomm::Result<ErrorRecord> {
        let mut rec = [ErrorRecord::default()];
        self.errors
            .read(rank as usize * ERROR_RECORD_BYTES, &mut rec)?;
        Ok(rec[0])
    }

    pub(crate) fn errors(&self) -> symcomm::Result<Vec<ErrorRecord>> {
        let mut recs = vec![ErrorRecord::default(); self.nranks as usize];
        self.errors.read(0, &mut recs)?;
        Ok(recs)
    }

    /// Zeroes the signal area, the error records and the abort flag: a fresh communicator over
    /// the same windows (after a failure left the barrier epochs out of step). No kernel may run.
    pub(crate) fn reset(&self) -> symcomm::Result<()> {
        self.signals.zero()?;
        self.errors.zero()?;
        self.abort.zero()
    }
}

/// Waits until every stream is idle, polling every 20 us (`spin`: without sleeping, for timing).
/// Past `deadline`, raises the team's abort flag; if the kernels still do not stop, reports and
/// exits the process (freeing memory under a running kernel is not an option).
pub(crate) fn wait(
    abort: &DeviceBuffer,
    streams: &[Stream],
    deadline: Duration,
    spin: bool,
) -> Result<(), String> {
    let start = Instant::now();
    let mut aborted = false;
    loop {
        let mut idle = true;
        for s in streams {
            idle &= s.is_idle().map_err(err)?;
        }
        if idle {
            return if aborted {
                Err(format!(
                    "kernels outlived their deadline; stopped by the host watchdog after {:?}",
                    start.elapsed()
                ))
            } else {
                Ok(())
            };
        }
        let waited = start.elapsed();
        if !aborted && waited > deadline {
            abort.write(0, &[1u32]).map_err(err)?;
            aborted = true;
        } else if waited > deadline + WATCHDOG_GRACE {
            println!(
                "FAIL hang kernels still running {waited:?} after launch, {WATCHDOG_GRACE:?} after the abort flag was raised"
            );
            std::process::exit(2);
        }
        if spin {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

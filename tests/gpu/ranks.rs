//! The ranks of a collective team on a backend: streams on one GPU, or threads on the emulator.

use super::*;

/// The ranks of one team with two windows (0: input, 1: output of out-of-place calls), each
/// `capacity()` bytes per rank, on the GPU (ranks as streams) or on the emulator (ranks as
/// threads). Calls use a prefix of each rank's copy.
pub(crate) trait Ranks {
    fn nranks(&self) -> u32;
    /// Bytes per rank of each window.
    fn capacity(&self) -> u64;
    /// Writes `data` at the start of rank `rank`'s copy of window `w`. No kernel may run.
    fn write(&mut self, w: usize, rank: u32, data: &[u8]) -> Result<(), String>;
    /// Reads the start of rank `rank`'s copy of window `w` into `out`. No kernel may run.
    fn read(&mut self, w: usize, rank: u32, out: &mut [u8]) -> Result<(), String>;
    /// Zeroes window `w` on every rank. No kernel may run.
    fn zero(&mut self, w: usize) -> Result<(), String>;
    fn comm(&mut self, rank: u32, timeout_ns: u64) -> DevComm;
    fn window(&mut self, w: usize, rank: u32) -> WindowHandleRaw;
    /// Launches `iters` rounds of `kernel(calls[r].0, calls[r].1)` on every rank r, back to back
    /// (`ctas` x `threads` per rank), and waits for all of them; bounded by the calls' own
    /// deadline plus a watchdog on the GPU. `spin`: poll without sleeping (timing).
    fn launch(
        &mut self,
        kernel: &str,
        ctas: u32,
        threads: u32,
        calls: &[(DevComm, CollArgs)],
        iters: u32,
        spin: bool,
    ) -> Result<(), String>;
    /// Every rank's error record.
    fn errors(&mut self) -> Result<Vec<ErrorRecord>, String>;
    /// Zeroes signals, error records and the abort flag (after a failure). Windows are kept.
    fn reset(&mut self) -> Result<(), String>;
}

/// Ranks as streams on one GPU (one stream per rank).
pub(crate) struct GpuRanks<'f> {
    pub(crate) team: GpuTeam,
    pub(crate) streams: Vec<Stream>,
    /// The collective kernels by entry name.
    pub(crate) funcs: &'f [(String, CudaFunction<'f>)],
}

impl<'f> GpuRanks<'f> {
    pub(crate) fn new(
        dev: &CudaDevice,
        funcs: &'f [(String, CudaFunction<'f>)],
        nranks: u32,
        window_bytes: u64,
    ) -> Result<Self, String> {
        let team = GpuTeam::new(dev, nranks, &[window_bytes, window_bytes]).map_err(err)?;
        let streams = (0..nranks)
            .map(|_| dev.create_stream())
            .collect::<symcomm::Result<Vec<_>>>()
            .map_err(err)?;
        Ok(GpuRanks {
            team,
            streams,
            funcs,
        })
    }

    pub(crate) fn offset(&self, w: usize, rank: u32, len: usize) -> Result<usize, String> {
        if len as u64 > self.team.windows[w].bytes {
            return Err(format!(
                "{len} bytes exceed the window's {} bytes per rank",
                self.team.windows[w].bytes
            ));
        }
        Ok((u64::from(rank) * self.team.windows[w].stride) as usize)
    }
}

impl Ranks for GpuRanks<'_> {
    fn nranks(&self) -> u32 {
        self.team.nranks
    }

    fn capacity(&self) -> u64 {
        self.team.windows[0].bytes
    }

    fn write(&mut self, w: usize, rank: u32, data: &[u8]) -> Result<(), String> {
        let at = self.offset(w, rank, data.len())?;
        self.team.windows[w].buf.write(at, data).map_err(err)
    }

    fn read(&mut self, w: usize, rank: u32, out: &mut [u8]) -> Result<(), String> {
        let at = self.offset(w, rank, out.len())?;
        self.team.windows[w].buf.read(at, out).map_err(err)
    }

    fn zero(&mut self, w: usize) -> Result<(), String> {
        self.team.windows[w].buf.zero().map_err(err)
    }

    fn comm(&mut self, rank: u32, timeout_ns: u64) -> DevComm {
        self.team.dev_comm(rank, timeout_ns)
    }

    fn window(&mut self, w: usize, rank: u32) -> WindowHandleRaw {
        self.team.window(w, rank)
    }

    fn launch(
        &mut self,
        kernel: &str,
        ctas: u32,
        threads: u32,
        calls: &[(DevComm, CollArgs)],
        iters: u32,
        spin: bool,
    ) -> Result<(), String> {
        let func = self
            .funcs
            .iter()
            .find(|(name, _)| name == kernel)
            .map(|(_, f)| f)
            .ok_or_else(|| format!("kernel {kernel} not loaded"))?;
        if calls.len() > self.streams.len() {
            return Err(format!(
                "{} calls for {} ranks",
                calls.len(),
                self.streams.len()
            ));
        }
        let timeout = calls.iter().map(|c| c.0.timeout_ns).max().unwrap_or(0);
        let mut failed = None;
        'iters: for _ in 0..iters {
            for (r, &(comm, args)) in calls.iter().enumerate() {
                let (mut comm, mut args) = (comm, args);
                let mut ptrs: [*mut c_void; 2] = [(&raw mut comm).cast(), (&raw mut args).cast()];
                // SAFETY: the kernel takes (DevComm, CollArgs) by value and the pointers are
                // copied at enqueue; every device address in them belongs to `self.team`, which
                // outlives the wait below (`wait` exits the process rather than return while a
                // kernel may still run).
                let launched = unsafe {
                    self.streams[r].launch(func, [ctas, 1, 1], [threads, 1, 1], 0, false, &mut ptrs)
                };
                if let Err(e) = launched {
                    failed = Some(format!("launch of rank {r}: {e}"));
                    break 'iters;
                }
            }
        }
        if failed.is_some() {
            // The ranks already launched would wait for the missing one until their deadline.
            let _ = self.team.abort.write(0, &[1u32]);
        }
        let waited = wait(
            &self.team.abort,
            &self.streams[..calls.len()],
            Duration::from_nanos(timeout) + WATCHDOG_GRACE,
            spin,
        );
        match (failed, waited) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(())) => Ok(()),
        }
    }

    fn errors(&mut self) -> Result<Vec<ErrorRecord>, String> {
        self.team.errors().map_err(err)
    }

    fn reset(&mut self) -> Result<(), String> {
        self.team.reset().map_err(err)
    }
}

/// Ranks as threads on the CPU emulator (a `EmuTeam`).
pub(crate) struct EmuRanks {
    pub(crate) nranks: u32,
    pub(crate) capacity: u64,
    pub(crate) team: EmuTeam,
}

impl EmuRanks {
    pub(crate) fn new(nranks: u32, window_bytes: u64) -> Result<Self, String> {
        Ok(EmuRanks {
            nranks,
            capacity: window_bytes,
            team: EmuTeam::with_windows(nranks, &[window_bytes, window_bytes]).map_err(err)?,
        })
    }
}

impl Ranks for EmuRanks {
    fn nranks(&self) -> u32 {
        self.nranks
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn write(&mut self, w: usize, rank: u32, data: &[u8]) -> Result<(), String> {
        let copy = self.team.bytes_mut(w, rank);
        copy.get_mut(..data.len())
            .ok_or_else(|| format!("{} bytes exceed the window", data.len()))?
            .copy_from_slice(data);
        Ok(())
    }

    fn read(&mut self, w: usize, rank: u32, out: &mut [u8]) -> Result<(), String> {
        let copy = self.team.bytes(w, rank);
        out.copy_from_slice(
            copy.get(..out.len())
                .ok_or_else(|| format!("{} bytes exceed the window", out.len()))?,
        );
        Ok(())
    }

    fn zero(&mut self, w: usize) -> Result<(), String> {
        for r in 0..self.nranks {
            self.team.bytes_mut(w, r).fill(0);
        }
        Ok(())
    }

    fn comm(&mut self, rank: u32, timeout_ns: u64) -> DevComm {
        self.team.dev_comm(rank, timeout_ns)
    }

    fn window(&mut self, w: usize, rank: u32) -> WindowHandleRaw {
        self.team.window_of(w, rank)
    }

    fn launch(
        &mut self,
        kernel: &str,
        ctas: u32,
        threads: u32,
        calls: &[(DevComm, CollArgs)],
        iters: u32,
        _spin: bool,
    ) -> Result<(), String> {
        for _ in 0..iters {
            let outcomes: Vec<Result<(), String>> = std::thread::scope(|s| {
                let handles: Vec<_> = calls
                    .iter()
                    .map(|&(comm, args)| {
                        s.spawn(move || {
                            let (mut comm, mut args) = (comm, args);
                            let mut ptrs: [*mut c_void; 2] =
                                [(&raw mut comm).cast(), (&raw mut args).cast()];
                            // SAFETY: the kernel takes (DevComm, CollArgs) by value; the team's
                            // memory, which the handles address, outlives the scope.
                            unsafe {
                                symcomm::testing::emu::launch(
                                    &DEVICE_IMAGE,
                                    kernel,
                                    [ctas, 1, 1],
                                    [threads, 1, 1],
                                    &mut ptrs,
                                )
                            }
                            .map_err(err)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err("an emulated rank panicked".into()))
                    })
                    .collect()
            });
            for o in outcomes {
                o?;
            }
        }
        Ok(())
    }

    fn errors(&mut self) -> Result<Vec<ErrorRecord>, String> {
        Ok((0..self.nranks).map(|r| self.team.error(r)).collect())
    }

    fn reset(&mut self) -> Result<(), String> {
        // A EmuTeam cannot zero its signal area: start over with fresh (zeroed) memory.
        self.team =
            EmuTeam::with_windows(self.nranks, &[self.capacity, self.capacity]).map_err(err)?;
        Ok(())
    }
}

//! Ranks as streams on one GPU: the GPU implementation of the case fixture's `Ranks`.

use super::*;

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

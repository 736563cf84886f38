//! The ping-pong ring: launch, check, and the back-to-back series.

use super::*;

/// Per rank, the ping-pong kernel's 3-word result, 16 bytes apart.
pub(crate) const RESULT_STRIDE: usize = 16;

/// One launch of the ring.
pub(crate) struct Launch<'a> {
    pub(crate) func: &'a CudaFunction<'a>,
    pub(crate) streams: &'a [Stream],
    /// Where the kernels write their results (RESULT_STRIDE bytes per rank).
    pub(crate) results: &'a DeviceBuffer,
    /// The ranks launched (a subset models a missing rank), each on `streams[rank]`.
    pub(crate) ranks: &'a [u32],
    pub(crate) rounds: u32,
    pub(crate) words: u32,
    pub(crate) threads: u32,
    pub(crate) timeout: Duration,
    /// Overrides `DevComm::abi_version` (to check that a stale one is refused).
    pub(crate) abi_version: Option<u32>,
}

/// Launches the ring, waits for it (with a host watchdog that raises the abort flag if the
/// kernels outlive their own deadline), and returns [status, #wrong, rounds] per launched rank
/// and the wall time from the first launch to the last completion.
pub(crate) fn run(team: &GpuTeam, l: &Launch<'_>) -> Result<(Vec<[u32; 3]>, Duration), String> {
    l.results.zero().map_err(err)?;
    let start = Instant::now();
    for &rank in l.ranks {
        let mut comm = team.dev_comm(rank, l.timeout.as_nanos() as u64);
        if let Some(v) = l.abi_version {
            comm.abi_version = v;
        }
        let mut win = team.window(0, rank);
        let (mut rounds, mut words) = (l.rounds, l.words);
        let mut result = l.results.addr() + (rank as usize * RESULT_STRIDE) as u64;
        let mut args: [*mut c_void; 5] = [
            (&raw mut comm).cast(),
            (&raw mut win).cast(),
            (&raw mut rounds).cast(),
            (&raw mut words).cast(),
            (&raw mut result).cast(),
        ];
        // SAFETY: the five pointers match the kernel's parameters (DevComm, WindowHandleRaw,
        // u32, u32, u32* as a 64-bit device address) and are copied at enqueue; every device
        // address in them belongs to `team` or `l.results`, which outlive the wait below (`wait`
        // exits the process rather than return while a kernel may still run).
        unsafe {
            l.streams[rank as usize].launch(
                l.func,
                [1, 1, 1],
                [l.threads, 1, 1],
                0,
                false,
                &mut args,
            )
        }
        .map_err(err)?;
    }
    wait(&team.abort, l.streams, l.timeout + WATCHDOG_GRACE, false)?;
    let took = start.elapsed();
    let mut out = Vec::new();
    for &rank in l.ranks {
        let mut r = [0u32; 3];
        l.results
            .read(rank as usize * RESULT_STRIDE, &mut r)
            .map_err(err)?;
        out.push(r);
    }
    Ok((out, took))
}

pub(crate) fn expect_ok(results: &[[u32; 3]], rounds: u32) -> Result<(), String> {
    for (rank, r) in results.iter().enumerate() {
        if *r != [SYMCOMM_STATUS_OK, 0, rounds] {
            return Err(format!(
                "rank {rank}: [status, #wrong, rounds] = {r:?}, expected [0, 0, {rounds}]"
            ));
        }
    }
    Ok(())
}

/// A ping-pong team of `nranks` ranks: one window of `window_bytes`, and the results buffer.
pub(crate) fn ping_pong_team(
    dev: &CudaDevice,
    nranks: u32,
    window_bytes: u64,
) -> symcomm::Result<(GpuTeam, DeviceBuffer)> {
    Ok((
        GpuTeam::new(dev, nranks, &[window_bytes])?,
        dev.alloc_zeroed(nranks as usize * RESULT_STRIDE)?,
    ))
}

/// `launches` back-to-back runs of the 2-rank ping-pong on one team, each checked; one report line
/// per launch.
pub(crate) fn ping_pong_series(
    report: &mut Report,
    prefix: &str,
    dev: &CudaDevice,
    module: &CudaModule,
    launches: usize,
    rounds: u32,
    words: u32,
) {
    let setup = (|| -> symcomm::Result<_> {
        let func = module.function(KERNEL)?;
        let streams = vec![dev.create_stream()?, dev.create_stream()?];
        let (team, results) = ping_pong_team(dev, 2, u64::from(words.max(1)) * 4)?;
        Ok((func, streams, team, results))
    })();
    let (func, streams, team, results) = match setup {
        Ok(s) => s,
        Err(e) => {
            report.record(&format!("{prefix}_setup"), Err(err(e)));
            return;
        }
    };
    for i in 1..=launches {
        let launch = Launch {
            func: &func,
            streams: &streams,
            results: &results,
            ranks: &[0, 1],
            rounds,
            words,
            threads: 128,
            timeout: TIMEOUT,
            abi_version: None,
        };
        let outcome = run(&team, &launch).and_then(|(res, took)| {
            expect_ok(&res, rounds)?;
            let rt_us = took.as_secs_f64() * 1e6 / f64::from(rounds);
            Ok((
                format!(
                    "ranks=2 rounds={rounds} words={words} threads=128 [status,#wrong,rounds]={:?} wall_ms={:.3} round_trip_us={rt_us:.3}",
                    res[0],
                    took.as_secs_f64() * 1e3
                ),
                json!({"ranks": 2, "rounds": rounds, "words": words, "wall_s": took.as_secs_f64(), "round_trip_us": rt_us}),
            ))
        });
        report.record(&format!("{prefix}_{i}"), outcome);
    }
}

pub(crate) fn origin_name(o: &ModuleOrigin) -> String {
    match o {
        ModuleOrigin::Fatbin => "fatbin".into(),
        ModuleOrigin::Nvrtc { arch } => format!("nvrtc:{arch}"),
        ModuleOrigin::Image => "image".into(),
    }
}

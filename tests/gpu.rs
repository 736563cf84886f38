//! GPU checks: a plain `main` (`harness = false`, `test = false`: `cargo test` neither builds nor
//! runs it) that needs a CUDA GPU. Build with `cargo test --release --test gpu --no-run`;
//! `scripts/gpu-check` packs the executable and runs it on a GPU machine.
//!
//! Prints one line per check, `PASS name …` or `FAIL name …`, and exits non-zero when any check
//! failed (also when there is no driver or no GPU). With `--json PATH` (or
//! `SYMCOMM_GPU_CHECK_JSON=PATH`) it also writes a JSON summary: every check with its detail and
//! figures, and under `figures` the collective bandwidth tables.
//!
//! Checks, on GPU 0 with the ranks of a team as streams on that GPU (flat layout, as the
//! emulator's `EmuTeam`):
//! - the driver probe, and NVRTC's version;
//! - the embedded `symcomm_ping_pong` kernel from the fatbin, 2 ranks, 3 launches back to back
//!   without resetting the signal area (epochs continue), exact data, with the round-trip latency;
//! - the same kernel compiled at run time with NVRTC for the GPU's architecture (the fallback of
//!   builds without nvcc);
//! - a missing rank times out within the deadline, the abort flag stops a wait, a stale ABI
//!   version is refused;
//! - the built-in collective kernels `symcomm_collective_<dtype>` (`coll_<kind>_<dtype>`, one line
//!   per kind and element type): every collective kind x {f32, bf16, u8, and fp8_e4m3 for the
//!   reductions} x {sum, max} for the reductions, for 2 and 4 ranks launched concurrently on one
//!   stream each, out of place and in place (NCCL's in-place offsets), grid scope (4 CTAs x 256
//!   threads) and CTA scope (2 CTAs, one collective per CTA on its own tile), counts 1, 1023 and
//!   65537, plus misaligned offsets; inputs whose results are exactly representable
//!   (tests/emu_collectives.rs), every output compared bit for bit (`#wrong`), every other byte of
//!   both windows compared with what was there before (`#clobbered`: canaries, and inputs that an
//!   out-of-place call must leave alone), every rank's error record checked. A failed case gets a
//!   fresh communicator (signals, error records and abort flag zeroed); after 2 stalled cases
//!   (timeouts, aborts, hangs stopped by the watchdog) a group stops, after 8 the matrix does,
//!   and groups not started within 80 s fail as not run, so a systematic hang cannot use up the
//!   run's time limit;
//! - figures (`perf_all_reduce_one_shot`, `perf_all_reduce_two_shot`): f32 sum all-reduce over 4
//!   ranks as streams, 8 B to 256 MB, the 4 ranks' grids together one CTA per SM (grid-scope
//!   barriers need every rank's CTAs resident at once); time per call over 20 back-to-back calls
//!   after 5 warm-up calls (host clock around the enqueue and the wait, so small messages include
//!   the launch of 4 kernels from one thread), in nccl-tests' columns (algbw = bytes / time,
//!   busbw = algbw x 2(n-1)/n), `#wrong` (elements, over all ranks) from the last timed call;
//!   and, as references, a device-to-device copy of 256 MB (`cuMemcpyDtoDAsync`) and the
//!   library's own copy loop (a 1-rank broadcast).
//!
//! `--emu` runs the collective checks and a small bandwidth sweep on the CPU emulator instead
//! (counts up to 4099 and 64-thread blocks; `--emu --full`: the GPU's counts and blocks), which
//! checks this harness itself — layouts, in-place offsets, expected values — on machines without
//! a GPU.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mod.rs"]
mod support;

use std::ffi::c_void;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{KINDS, blocks};
use symcomm::DEVICE_IMAGE;
use symcomm::abi::*;
use symcomm::testing::cuda::{
    self, CudaDevice, CudaDeviceExt, CudaFunction, CudaModule, DeviceBuffer, ModuleOrigin, Stream,
};
use symcomm::testing::emu::{self, EmuTeam};

const KERNEL: &str = "symcomm_ping_pong";
/// Alignment of each rank's window copy (DESIGN §3).
const ALIGN: u64 = 256;
/// Device-side deadline of every wait in the ping-pong runs.
const TIMEOUT: Duration = Duration::from_secs(10);
/// How long the host waits beyond a kernel's own deadline before raising the abort flag.
const WATCHDOG_GRACE: Duration = Duration::from_secs(5);

/// Outcome of one check: a one-line detail and named figures.
type Outcome = Result<(String, Value), String>;

#[derive(Default)]
struct Report {
    checks: Vec<Value>,
    failed: usize,
}

impl Report {
    fn record(&mut self, name: &str, outcome: Outcome) -> bool {
        let (pass, detail, figures) = match outcome {
            Ok((detail, figures)) => (true, detail, figures),
            Err(detail) => (false, detail, Value::Null),
        };
        println!("{} {name} {detail}", if pass { "PASS" } else { "FAIL" });
        if !pass {
            self.failed += 1;
        }
        self.checks.push(json!({
            "name": name, "pass": pass, "detail": detail, "figures": figures,
        }));
        pass
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

// ---------------------------------------------------------------------------------------------
// A team of ranks as streams on one GPU
// ---------------------------------------------------------------------------------------------

/// N ranks as streams on one GPU, in the flat layout of the emulator's `EmuTeam` (DESIGN §3):
/// one device allocation each for the signal area (N*N*SYMCOMM_SIGNAL_WORDS u64, zeroed; rank r's
/// array at `signals + r * signal_stride`), the error records (one per rank), the abort flag, and
/// every window (rank r's copy at `base + r * stride`, the stride a multiple of 256 bytes).
struct GpuTeam {
    nranks: u32,
    signals: DeviceBuffer,
    abort: DeviceBuffer,
    errors: DeviceBuffer,
    windows: Vec<GpuWindow>,
}

/// One symmetric window of a [`GpuTeam`].
struct GpuWindow {
    buf: DeviceBuffer,
    /// Usable bytes per rank.
    bytes: u64,
    /// Bytes between consecutive ranks' copies.
    stride: u64,
}

const ERROR_RECORD_BYTES: usize = std::mem::size_of::<ErrorRecord>();

impl GpuTeam {
    /// A team with one window per entry of `window_bytes` (bytes per rank), everything zeroed.
    fn new(dev: &CudaDevice, nranks: u32, window_bytes: &[u64]) -> symcomm::Result<Self> {
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
            signals: dev.alloc_zeroed(n * n * SYMCOMM_SIGNAL_WORDS as usize * 8)?,
            abort: dev.alloc_zeroed(4)?,
            errors: dev.alloc_zeroed(n * ERROR_RECORD_BYTES)?,
            windows,
        })
    }

    fn dev_comm(&self, rank: u32, timeout_ns: u64) -> DevComm {
        DevComm {
            abi_version: SYMCOMM_ABI_VERSION,
            rank,
            nranks: self.nranks,
            signal_words: SYMCOMM_SIGNAL_WORDS,
            signal_base: self.signals.device_ptr(),
            signal_stride: u64::from(self.nranks) * u64::from(SYMCOMM_SIGNAL_WORDS) * 8,
            abort_flag: self.abort.device_ptr(),
            error: self.errors.device_ptr() + u64::from(rank) * ERROR_RECORD_BYTES as u64,
            timeout_ns,
        }
    }

    /// Rank `rank`'s handle of window `w`.
    fn window(&self, w: usize, rank: u32) -> WindowHandleRaw {
        let win = &self.windows[w];
        WindowHandleRaw {
            base: win.buf.device_ptr(),
            stride: win.stride,
            bytes: win.bytes,
            rank,
            nranks: self.nranks,
            elem_size: 1,
            dtype: SYMCOMM_DTYPE_NONE,
        }
    }

    fn error(&self, rank: u32) -> symcomm::Result<ErrorRecord> {
        let mut rec = [ErrorRecord::default()];
        self.errors
            .read(rank as usize * ERROR_RECORD_BYTES, &mut rec)?;
        Ok(rec[0])
    }

    fn errors(&self) -> symcomm::Result<Vec<ErrorRecord>> {
        let mut recs = vec![ErrorRecord::default(); self.nranks as usize];
        self.errors.read(0, &mut recs)?;
        Ok(recs)
    }

    /// Zeroes the signal area, the error records and the abort flag: a fresh communicator over
    /// the same windows (after a failure left the barrier epochs out of step). No kernel may run.
    fn reset(&self) -> symcomm::Result<()> {
        self.signals.zero()?;
        self.errors.zero()?;
        self.abort.zero()
    }
}

/// Waits until every stream is idle, polling every 20 us (`spin`: without sleeping, for timing).
/// Past `deadline`, raises the team's abort flag; if the kernels still do not stop, reports and
/// exits the process (freeing memory under a running kernel is not an option).
fn wait(
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

// ---------------------------------------------------------------------------------------------
// Ping-pong
// ---------------------------------------------------------------------------------------------

/// Per rank, the ping-pong kernel's 3-word result, 16 bytes apart.
const RESULT_STRIDE: usize = 16;

/// One launch of the ring.
struct Launch<'a> {
    func: &'a CudaFunction<'a>,
    streams: &'a [Stream],
    /// Where the kernels write their results (RESULT_STRIDE bytes per rank).
    results: &'a DeviceBuffer,
    /// The ranks launched (a subset models a missing rank), each on `streams[rank]`.
    ranks: &'a [u32],
    rounds: u32,
    words: u32,
    threads: u32,
    timeout: Duration,
    /// Overrides `DevComm::abi_version` (to check that a stale one is refused).
    abi_version: Option<u32>,
}

/// Launches the ring, waits for it (with a host watchdog that raises the abort flag if the
/// kernels outlive their own deadline), and returns [status, #wrong, rounds] per launched rank
/// and the wall time from the first launch to the last completion.
fn run(team: &GpuTeam, l: &Launch<'_>) -> Result<(Vec<[u32; 3]>, Duration), String> {
    l.results.zero().map_err(err)?;
    let start = Instant::now();
    for &rank in l.ranks {
        let mut comm = team.dev_comm(rank, l.timeout.as_nanos() as u64);
        if let Some(v) = l.abi_version {
            comm.abi_version = v;
        }
        let mut win = team.window(0, rank);
        let (mut rounds, mut words) = (l.rounds, l.words);
        let mut result = l.results.device_ptr() + (rank as usize * RESULT_STRIDE) as u64;
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

fn expect_ok(results: &[[u32; 3]], rounds: u32) -> Result<(), String> {
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
fn ping_pong_team(
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
fn ping_pong_series(
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

fn origin_name(o: &ModuleOrigin) -> String {
    match o {
        ModuleOrigin::Fatbin => "fatbin".into(),
        ModuleOrigin::Nvrtc { arch } => format!("nvrtc:{arch}"),
        ModuleOrigin::Image => "image".into(),
    }
}

/// A fresh 3-rank team with only ranks 0 and 1 launched: rank 0 waits for the absent rank 2.
fn check_timeout(dev: &CudaDevice, module: &CudaModule) -> Outcome {
    let func = module.function(KERNEL).map_err(err)?;
    let streams = vec![
        dev.create_stream().map_err(err)?,
        dev.create_stream().map_err(err)?,
    ];
    let (team, results) = ping_pong_team(dev, 3, 64).map_err(err)?;
    let timeout = Duration::from_millis(200);
    let launch = Launch {
        func: &func,
        streams: &streams,
        results: &results,
        ranks: &[0, 1],
        rounds: 1,
        words: 16,
        threads: 32,
        timeout,
        abi_version: None,
    };
    let (res, took) = run(&team, &launch)?;
    if res[0][0] != SYMCOMM_STATUS_TIMEOUT || res[1][0] != SYMCOMM_STATUS_OK {
        return Err(format!(
            "statuses {:?}/{:?}, expected TIMEOUT for rank 0 and OK for rank 1",
            res[0], res[1]
        ));
    }
    let rec = team.error(0).map_err(err)?;
    if (rec.status, rec.rank, rec.peer, rec.op)
        != (SYMCOMM_STATUS_TIMEOUT, 0, 2, SYMCOMM_OP_SIGNAL_WAIT)
    {
        return Err(format!("rank 0's error record is {rec:?}"));
    }
    if took < timeout || took > timeout * 10 {
        return Err(format!(
            "returned after {took:?} with a {timeout:?} deadline"
        ));
    }
    Ok((
        format!(
            "rank 0 timed out waiting for rank 2 after {took:?} (deadline {timeout:?}); error record {rec:?}"
        ),
        json!({"deadline_s": timeout.as_secs_f64(), "wall_s": took.as_secs_f64()}),
    ))
}

/// Rank 0 alone, with the abort flag already raised and a long deadline: the wait stops at once.
fn check_abort(dev: &CudaDevice, module: &CudaModule) -> Outcome {
    let func = module.function(KERNEL).map_err(err)?;
    let streams = vec![dev.create_stream().map_err(err)?];
    let (team, results) = ping_pong_team(dev, 2, 64).map_err(err)?;
    team.abort.write(0, &[1u32]).map_err(err)?;
    let launch = Launch {
        func: &func,
        streams: &streams,
        results: &results,
        ranks: &[0],
        rounds: 1,
        words: 16,
        threads: 32,
        timeout: Duration::from_secs(20),
        abi_version: None,
    };
    let (res, took) = run(&team, &launch)?;
    let rec = team.error(0).map_err(err)?;
    if res[0][0] != SYMCOMM_STATUS_ABORTED || rec.status != SYMCOMM_STATUS_ABORTED {
        return Err(format!(
            "rank 0 result {:?}, error record {rec:?}; expected ABORTED",
            res[0]
        ));
    }
    if took > Duration::from_secs(2) {
        return Err(format!("the aborted wait took {took:?}"));
    }
    Ok((
        format!("rank 0 stopped by the abort flag after {took:?}"),
        json!({"wall_s": took.as_secs_f64()}),
    ))
}

fn check_abi_mismatch(dev: &CudaDevice, module: &CudaModule) -> Outcome {
    let func = module.function(KERNEL).map_err(err)?;
    let streams = vec![dev.create_stream().map_err(err)?];
    let (team, results) = ping_pong_team(dev, 1, 64).map_err(err)?;
    let launch = Launch {
        func: &func,
        streams: &streams,
        results: &results,
        ranks: &[0],
        rounds: 2,
        words: 4,
        threads: 2,
        timeout: Duration::from_secs(1),
        abi_version: Some(SYMCOMM_ABI_VERSION + 1),
    };
    let (res, _) = run(&team, &launch)?;
    if res[0] != [SYMCOMM_STATUS_ABI_MISMATCH, 0, 0] {
        return Err(format!(
            "result {:?}, expected [ABI_MISMATCH, 0, 0]",
            res[0]
        ));
    }
    Ok(("a stale ABI version is refused".into(), Value::Null))
}

// ---------------------------------------------------------------------------------------------
// Collectives: the ranks of a team on a backend
// ---------------------------------------------------------------------------------------------

/// The ranks of one team with two windows (0: input, 1: output of out-of-place calls), each
/// `capacity()` bytes per rank, on the GPU (ranks as streams) or on the emulator (ranks as
/// threads). Calls use a prefix of each rank's copy.
trait Ranks {
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
struct GpuRanks<'f> {
    team: GpuTeam,
    streams: Vec<Stream>,
    /// The collective kernels by entry name.
    funcs: &'f [(String, CudaFunction<'f>)],
}

impl<'f> GpuRanks<'f> {
    fn new(
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

    fn offset(&self, w: usize, rank: u32, len: usize) -> Result<usize, String> {
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
struct EmuRanks {
    nranks: u32,
    capacity: u64,
    team: EmuTeam,
}

impl EmuRanks {
    fn new(nranks: u32, window_bytes: u64) -> Result<Self, String> {
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
                                emu::launch(
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

// ---------------------------------------------------------------------------------------------
// Collectives: element types and values (after tests/emu_collectives.rs)
// ---------------------------------------------------------------------------------------------

/// Storage format of an element type.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fmt {
    F32,
    /// IEEE-like binary format (bf16, fp8) with exponent bits, mantissa bits, bias.
    Mini {
        ebits: u32,
        mbits: u32,
        bias: i32,
    },
    U8,
}

#[derive(Clone, Copy, Debug)]
struct DType {
    code: u32,
    name: &'static str,
    size: usize,
    fmt: Fmt,
}

const F32: DType = DType {
    code: SYMCOMM_DTYPE_F32,
    name: "f32",
    size: 4,
    fmt: Fmt::F32,
};
const BF16: DType = DType {
    code: SYMCOMM_DTYPE_BF16,
    name: "bf16",
    size: 2,
    fmt: Fmt::Mini {
        ebits: 8,
        mbits: 7,
        bias: 127,
    },
};
const FP8_E4M3: DType = DType {
    code: SYMCOMM_DTYPE_FP8_E4M3,
    name: "fp8_e4m3",
    size: 1,
    fmt: Fmt::Mini {
        ebits: 4,
        mbits: 3,
        bias: 7,
    },
};
const U8: DType = DType {
    code: SYMCOMM_DTYPE_U8,
    name: "u8",
    size: 1,
    fmt: Fmt::U8,
};

/// Element types of the reductions, and of the copy collectives.
const REDUCTION_DTYPES: [DType; 4] = [F32, BF16, U8, FP8_E4M3];
const COPY_DTYPES: [DType; 3] = [F32, BF16, U8];
const REDOPS: [(u32, &str); 2] = [(SYMCOMM_REDOP_SUM, "sum"), (SYMCOMM_REDOP_MAX, "max")];

impl DType {
    /// Bits of the integer `v`: exact for the floating-point types (every value the checks use is
    /// a small integer, exactly representable), wrapped for u8.
    fn encode(&self, v: i64) -> u64 {
        match self.fmt {
            Fmt::F32 => u64::from((v as f32).to_bits()),
            Fmt::U8 => (v as u64) & 0xff,
            Fmt::Mini { ebits, mbits, bias } => {
                let sign = if v < 0 { 1u64 << (ebits + mbits) } else { 0 };
                let a = v.unsigned_abs();
                if a == 0 {
                    return sign;
                }
                // a = 1.m x 2^e with e = floor(log2 a); integers >= 1 are normal numbers here.
                let e = 63 - a.leading_zeros();
                let man = ((a << mbits) >> e) - (1u64 << mbits);
                sign | (((i64::from(e) + i64::from(bias)) as u64) << mbits) | man
            }
        }
    }
}

fn kind_name(kind: u32) -> &'static str {
    match kind {
        SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT => "all_reduce_one_shot",
        SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT => "all_reduce_two_shot",
        SYMCOMM_COLL_ALL_GATHER => "all_gather",
        SYMCOMM_COLL_REDUCE_SCATTER => "reduce_scatter",
        SYMCOMM_COLL_BROADCAST => "broadcast",
        SYMCOMM_COLL_REDUCE => "reduce",
        SYMCOMM_COLL_SCATTER => "scatter",
        _ => "all_to_all",
    }
}

fn is_reduction(kind: u32) -> bool {
    matches!(
        kind,
        SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT
            | SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT
            | SYMCOMM_COLL_REDUCE_SCATTER
            | SYMCOMM_COLL_REDUCE
    )
}

fn status_name(s: u32) -> &'static str {
    match s {
        SYMCOMM_STATUS_OK => "OK",
        SYMCOMM_STATUS_TIMEOUT => "TIMEOUT",
        SYMCOMM_STATUS_ABORTED => "ABORTED",
        SYMCOMM_STATUS_MISMATCH => "MISMATCH",
        SYMCOMM_STATUS_ABI_MISMATCH => "ABI_MISMATCH",
        SYMCOMM_STATUS_INVALID_ARGUMENT => "INVALID_ARGUMENT",
        _ => "?",
    }
}

fn hash(rank: u32, i: u64, salt: u64) -> u64 {
    u64::from(rank)
        .wrapping_mul(0x9e37_79b9)
        .wrapping_add(i.wrapping_mul(0x85eb_ca6b))
        .wrapping_add(salt)
        .wrapping_mul(0xc2b2_ae35)
        >> 17
}

/// Input element `i` of `rank`, chosen so that reductions over <= 8 ranks are exact in the type
/// (nccl-tests style): small integers for sums, [-8, 8] for max, any bits for u8 (sums wrap),
/// [-256, 255] for the copy collectives (`op` None).
fn input(dt: &DType, op: Option<u32>, rank: u32, i: u64, salt: u64) -> i64 {
    let h = hash(rank, i, salt);
    match (dt.fmt, op) {
        (Fmt::U8, _) => (h & 0xff) as i64,
        (_, None) => (h % 512) as i64 - 256,
        (_, Some(SYMCOMM_REDOP_MAX)) => (h % 17) as i64 - 8,
        _ if dt.size == 1 => (h % 2) as i64,
        _ => (h % 4) as i64,
    }
}

/// The reduction of `vals` with `op` (sum or max) as the type computes it: exact for the inputs
/// above, u8 sums wrapped.
fn reduce_vals(dt: &DType, op: u32, vals: impl Iterator<Item = i64>) -> i64 {
    if op == SYMCOMM_REDOP_MAX {
        vals.max().unwrap_or(0)
    } else if dt.fmt == Fmt::U8 {
        vals.fold(0, |a, b| (a + b) & 0xff)
    } else {
        vals.sum()
    }
}

// ---------------------------------------------------------------------------------------------
// Collectives: one call on every rank of a team, and its check
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Case {
    kind: u32,
    dt: DType,
    /// Reduction operator (reductions only).
    op: u32,
    nranks: u32,
    count: u64,
    root: u32,
    in_place: bool,
    cta_scope: bool,
    /// Extra element offset of the input and the output (misalignment).
    src_shift: u64,
    dst_shift: u64,
    ctas: u32,
    threads: u32,
}

/// Where a case's buffers lie, in elements of each rank's window copy.
struct Layout {
    /// Tiles: CTAs at CTA scope (one collective each), else 1.
    tiles: u64,
    tile_stride: u64,
    /// Elements of each window copy the case uses.
    window_elems: u64,
    /// Input elements per rank and tile.
    in_elems: u64,
    soff: u64,
    doff: u64,
}

impl Case {
    fn reduction(&self) -> Option<u32> {
        is_reduction(self.kind).then_some(self.op)
    }

    fn label(&self) -> String {
        format!(
            "{} {}{} nranks={} count={} root={} {} {} shift={}/{} grid={}x{}",
            kind_name(self.kind),
            self.dt.name,
            match self.reduction() {
                Some(op) => format!(
                    " {}",
                    REDOPS.iter().find(|o| o.0 == op).map_or("?", |o| o.1)
                ),
                None => String::new(),
            },
            self.nranks,
            self.count,
            self.root,
            if self.in_place {
                "in-place"
            } else {
                "out-of-place"
            },
            if self.cta_scope { "cta" } else { "grid" },
            self.src_shift,
            self.dst_shift,
            self.ctas,
            self.threads
        )
    }

    fn layout(&self) -> Layout {
        let (in_blocks, out_blocks) = blocks(self.kind, u64::from(self.nranks));
        let tiles = if self.cta_scope {
            u64::from(self.ctas)
        } else {
            1
        };
        let body = self.count * in_blocks.max(out_blocks) + 3;
        let (soff, doff, span) = if self.in_place {
            (self.src_shift, self.src_shift, self.src_shift + body)
        } else {
            (
                self.src_shift,
                self.dst_shift,
                self.src_shift.max(self.dst_shift) + body,
            )
        };
        Layout {
            tiles,
            tile_stride: span,
            window_elems: tiles * span + span,
            in_elems: self.count * in_blocks,
            soff,
            doff,
        }
    }

    fn window_bytes(&self) -> u64 {
        self.layout().window_elems * self.dt.size as u64
    }

    /// Rank `rank`'s input and output offsets (tile 0), after NCCL's in-place conventions:
    /// all-gather reads its input from its own block of the output, reduce-scatter and scatter
    /// write their output into their own block of the input.
    fn offsets(&self, lay: &Layout, rank: u64) -> (u64, u64) {
        if !self.in_place {
            return (lay.soff, lay.doff);
        }
        match self.kind {
            SYMCOMM_COLL_ALL_GATHER => (lay.doff + rank * self.count, lay.doff),
            SYMCOMM_COLL_REDUCE_SCATTER | SYMCOMM_COLL_SCATTER => {
                (lay.soff, lay.soff + rank * self.count)
            }
            _ => (lay.soff, lay.doff),
        }
    }
}

const CANARY: u8 = 0xA5;

/// What one case found.
#[derive(Default)]
struct CaseResult {
    /// Output elements that differ from the expected bits.
    wrong: u64,
    /// Other elements of either window that changed (canaries, inputs of out-of-place calls).
    clobbered: u64,
    /// Non-OK error records, by rank.
    errors: Vec<(u32, ErrorRecord)>,
    /// The launch or the wait failed (the watchdog stopped a hang, a launch was refused).
    failure: Option<String>,
}

impl CaseResult {
    fn ok(&self) -> bool {
        self.wrong == 0 && self.clobbered == 0 && self.errors.is_empty() && self.failure.is_none()
    }

    /// The case used up its deadline (a timeout, an abort, a hang): systematic ones must not eat
    /// the whole time limit.
    fn stalled(&self) -> bool {
        self.failure.is_some()
            || self.errors.iter().any(|(_, e)| {
                e.status == SYMCOMM_STATUS_TIMEOUT || e.status == SYMCOMM_STATUS_ABORTED
            })
    }

    fn describe(&self) -> String {
        let mut s = format!("#wrong={} #clobbered={}", self.wrong, self.clobbered);
        for (r, e) in self.errors.iter().take(4) {
            s += &format!(
                " rank {r}: {} op {} peer {} detail {:#x}",
                status_name(e.status),
                e.op,
                e.peer,
                e.detail
            );
        }
        if let Some(f) = &self.failure {
            s += &format!(" {f}");
        }
        s
    }
}

/// Writes the `dt.size`-byte little-endian form of `bits` as element `e` of `img`.
fn put(img: &mut [u8], size: usize, e: u64, bits: u64) {
    let at = e as usize * size;
    img[at..at + size].copy_from_slice(&bits.to_le_bytes()[..size]);
}

/// Runs `c` on every rank of `team` at once (CTA scope: one independent collective per CTA on its
/// own tile) and checks every byte of the windows it uses.
fn run_case<R: Ranks>(team: &mut R, c: &Case, salt: u64, timeout: Duration) -> CaseResult {
    let mut res = CaseResult::default();
    if let Err(e) = exec_case(team, c, salt, timeout, &mut res) {
        res.failure = Some(e);
    }
    if !res.errors.is_empty() || res.failure.is_some() {
        // The barrier epochs are out of step now: a fresh communicator for the next case.
        if let Err(e) = team.reset() {
            res.failure = Some(format!(
                "{}; reset failed: {e}",
                res.failure.take().unwrap_or_default()
            ));
        }
    }
    res
}

fn exec_case<R: Ranks>(
    team: &mut R,
    c: &Case,
    salt: u64,
    timeout: Duration,
    res: &mut CaseResult,
) -> Result<(), String> {
    let n = c.nranks;
    let sz = c.dt.size;
    let lay = c.layout();
    let elems = lay.window_elems as usize;
    let wbytes = elems * sz;
    if wbytes as u64 > team.capacity() || team.nranks() != n {
        return Err(format!(
            "case needs {wbytes} bytes x {n} ranks, the team has {} x {}",
            team.capacity(),
            team.nranks()
        ));
    }
    let op = c.reduction();
    let enc = |v: i64| c.dt.encode(v);
    let val = |p: u32, t: u64, e: u64| input(&c.dt, op, p, e + (t << 32), salt);

    // Inputs, on a canary background.
    let src: Vec<Vec<u8>> = (0..n)
        .map(|r| {
            let mut img = vec![CANARY; wbytes];
            let (s, _) = c.offsets(&lay, u64::from(r));
            for t in 0..lay.tiles {
                for e in 0..lay.in_elems {
                    put(&mut img, sz, t * lay.tile_stride + s + e, enc(val(r, t, e)));
                }
            }
            img
        })
        .collect();
    // Reductions of every input element across the ranks, per tile.
    let red: Vec<Vec<u64>> = match op {
        Some(op) => (0..lay.tiles)
            .map(|t| {
                (0..lay.in_elems)
                    .map(|e| enc(reduce_vals(&c.dt, op, (0..n).map(|p| val(p, t, e)))))
                    .collect()
            })
            .collect(),
        None => Vec::new(),
    };
    // Expected output windows (in place: the input window) and which elements are outputs.
    let count = c.count;
    let mut expect = Vec::with_capacity(n as usize);
    for r in 0..n {
        let mut img = if c.in_place {
            src[r as usize].clone()
        } else {
            vec![CANARY; wbytes]
        };
        let mut out = vec![false; elems];
        let (_, d) = c.offsets(&lay, u64::from(r));
        let ru = u64::from(r);
        for t in 0..lay.tiles {
            let mut set = |e: u64, bits: u64| {
                let at = t * lay.tile_stride + d + e;
                put(&mut img, sz, at, bits);
                out[at as usize] = true;
            };
            for i in 0..count {
                match c.kind {
                    SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT | SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT => {
                        set(i, red[t as usize][i as usize]);
                    }
                    SYMCOMM_COLL_REDUCE => {
                        if r == c.root {
                            set(i, red[t as usize][i as usize]);
                        }
                    }
                    SYMCOMM_COLL_REDUCE_SCATTER => {
                        set(i, red[t as usize][(ru * count + i) as usize]);
                    }
                    SYMCOMM_COLL_ALL_GATHER => {
                        for p in 0..n {
                            set(u64::from(p) * count + i, enc(val(p, t, i)));
                        }
                    }
                    SYMCOMM_COLL_BROADCAST => set(i, enc(val(c.root, t, i))),
                    SYMCOMM_COLL_SCATTER => set(i, enc(val(c.root, t, ru * count + i))),
                    _ => {
                        for p in 0..n {
                            set(u64::from(p) * count + i, enc(val(p, t, ru * count + i)));
                        }
                    }
                }
            }
        }
        expect.push((img, out));
    }

    let dst_w = if c.in_place { 0 } else { 1 };
    let canvas = vec![CANARY; wbytes];
    for r in 0..n {
        team.write(0, r, &src[r as usize])?;
        if !c.in_place {
            team.write(1, r, &canvas)?;
        }
    }

    // Every rank at once.
    let calls: Vec<(DevComm, CollArgs)> = (0..n)
        .map(|r| {
            let (s, d) = c.offsets(&lay, u64::from(r));
            let comm = team.comm(r, timeout.as_nanos() as u64);
            let args = CollArgs {
                kind: c.kind,
                dtype: c.dt.code,
                redop: op.unwrap_or(0),
                root: c.root,
                scope: if c.cta_scope {
                    SYMCOMM_SCOPE_CTA
                } else {
                    SYMCOMM_SCOPE_GRID
                },
                index: 0,
                count: c.count,
                src_offset: s,
                dst_offset: d,
                tile_stride: lay.tile_stride,
                src: team.window(0, r),
                dst: team.window(dst_w, r),
            };
            (comm, args)
        })
        .collect();
    let kernel = format!("symcomm_collective_{}", c.dt.name);
    team.launch(&kernel, c.ctas, c.threads, &calls, 1, false)?;

    for (r, e) in team.errors()?.into_iter().enumerate() {
        if e.status != SYMCOMM_STATUS_OK {
            res.errors.push((r as u32, e));
        }
    }
    let mut got = vec![0u8; wbytes];
    for r in 0..n {
        let (want, out) = &expect[r as usize];
        team.read(dst_w, r, &mut got)?;
        if got != *want {
            for (e, &is_out) in out.iter().enumerate() {
                if got[e * sz..(e + 1) * sz] != want[e * sz..(e + 1) * sz] {
                    if is_out {
                        res.wrong += 1;
                    } else {
                        res.clobbered += 1;
                    }
                }
            }
        }
        if !c.in_place {
            // An out-of-place call leaves its input window alone.
            team.read(0, r, &mut got)?;
            let want = &src[r as usize];
            if got != *want {
                res.clobbered += got
                    .chunks(sz)
                    .zip(want.chunks(sz))
                    .filter(|(a, b)| a != b)
                    .count() as u64;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Collectives: the matrix of checks, one report line per (kind, dtype)
// ---------------------------------------------------------------------------------------------

struct MatrixConfig {
    nranks: Vec<u32>,
    /// Small, middle, large; the misaligned cases use the middle and the large one.
    counts: [u64; 3],
    /// CTAs x threads per rank at grid scope, and at CTA scope.
    grid: (u32, u32),
    cta: (u32, u32),
    /// Device-side deadline of every wait.
    timeout: Duration,
    /// Wall time for the whole matrix; groups not started by then fail as not run.
    budget: Duration,
}

/// Cases that stalled (timeouts, aborts, hangs: each costs a deadline) after which the rest of a
/// group, and the rest of the matrix, are skipped, so that a systematic hang cannot use up the
/// time limit of the whole run.
const MAX_STALLED_PER_GROUP: u32 = 2;
const MAX_STALLED: u32 = 8;

struct Group {
    kind: u32,
    dt: DType,
    cases: Vec<Case>,
}

/// Every kind x dtype, each with: rank counts x ops (reductions) x {out of place, in place} x
/// {grid, CTA scope} x counts, aligned, plus two misaligned cases (out of place at grid scope
/// with different input and output phases, in place at CTA scope); roots rotate.
fn matrix_groups(cfg: &MatrixConfig) -> Vec<Group> {
    let mut groups = Vec::new();
    for kind in KINDS {
        let (dtypes, ops): (&[DType], &[u32]) = if is_reduction(kind) {
            (&REDUCTION_DTYPES, &[SYMCOMM_REDOP_SUM, SYMCOMM_REDOP_MAX])
        } else {
            (&COPY_DTYPES, &[0])
        };
        for &dt in dtypes {
            let mut cases = Vec::new();
            for &nranks in &cfg.nranks {
                for &op in ops {
                    let mut case =
                        |count: u64, in_place: bool, cta_scope: bool, shifts: (u64, u64)| {
                            let (ctas, threads) = if cta_scope { cfg.cta } else { cfg.grid };
                            let root = cases.len() as u32 % nranks;
                            cases.push(Case {
                                kind,
                                dt,
                                op,
                                nranks,
                                count,
                                root,
                                in_place,
                                cta_scope,
                                src_shift: shifts.0,
                                dst_shift: shifts.1,
                                ctas,
                                threads,
                            });
                        };
                    for (in_place, cta_scope) in
                        [(false, false), (false, true), (true, false), (true, true)]
                    {
                        for count in cfg.counts {
                            case(count, in_place, cta_scope, (0, 0));
                        }
                    }
                    case(cfg.counts[2], false, false, (1, 3));
                    case(cfg.counts[1], true, true, (1, 1));
                }
            }
            groups.push(Group { kind, dt, cases });
        }
    }
    groups
}

/// Bytes per rank and window that the cases of `nranks` ranks need.
fn matrix_capacity(groups: &[Group], nranks: u32) -> u64 {
    groups
        .iter()
        .flat_map(|g| g.cases.iter())
        .filter(|c| c.nranks == nranks)
        .map(Case::window_bytes)
        .max()
        .unwrap_or(ALIGN)
}

/// Runs every group on the team of its rank count; one report line per group.
fn run_matrix<R: Ranks>(
    report: &mut Report,
    teams: &mut [R],
    groups: &[Group],
    cfg: &MatrixConfig,
) -> Value {
    let start = Instant::now();
    let mut stalled = 0u32;
    let mut totals = (0u64, 0u64, 0u64, 0u64); // cases, wrong, clobbered, failed cases
    for (gi, g) in groups.iter().enumerate() {
        let name = format!("coll_{}_{}", kind_name(g.kind), g.dt.name);
        if stalled >= MAX_STALLED {
            report.record(
                &name,
                Err(format!("not run: {stalled} earlier cases stalled")),
            );
            continue;
        }
        if start.elapsed() > cfg.budget {
            report.record(
                &name,
                Err(format!(
                    "not run: the collective checks used up their {:?} budget",
                    cfg.budget
                )),
            );
            continue;
        }
        let t0 = Instant::now();
        let (mut wrong, mut clobbered, mut error_cases, mut run) = (0u64, 0u64, 0u64, 0u64);
        let mut failures: Vec<String> = Vec::new();
        let mut group_stalled = 0u32;
        for (ci, c) in g.cases.iter().enumerate() {
            let Some(team) = teams.iter_mut().find(|t| t.nranks() == c.nranks) else {
                failures.push(format!("{}: no team of {} ranks", c.label(), c.nranks));
                continue;
            };
            let salt = 0x5eed_c011 ^ ((gi as u64) << 20) ^ ci as u64;
            let r = run_case(team, c, salt, cfg.timeout);
            run += 1;
            wrong += r.wrong;
            clobbered += r.clobbered;
            if !r.errors.is_empty() || r.failure.is_some() {
                error_cases += 1;
            }
            if !r.ok() {
                failures.push(format!("{}: {}", c.label(), r.describe()));
            }
            if r.stalled() {
                stalled += 1;
                group_stalled += 1;
                if group_stalled >= MAX_STALLED_PER_GROUP || stalled >= MAX_STALLED {
                    failures.push(format!(
                        "stopped after {group_stalled} stalled cases ({run} of {} run)",
                        g.cases.len()
                    ));
                    break;
                }
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        totals.0 += run;
        totals.1 += wrong;
        totals.2 += clobbered;
        totals.3 += failures.len() as u64;
        let ranks: Vec<String> = cfg.nranks.iter().map(u32::to_string).collect();
        let detail = format!(
            "{run} cases (ranks {}{}; out of place, in place; grid {}x{}, cta {}x{}; counts {:?}; +misaligned) #wrong={wrong} #clobbered={clobbered} error_cases={error_cases} {secs:.2} s",
            ranks.join(","),
            if is_reduction(g.kind) {
                "; sum, max"
            } else {
                ""
            },
            cfg.grid.0,
            cfg.grid.1,
            cfg.cta.0,
            cfg.cta.1,
            cfg.counts,
        );
        let figures = json!({
            "cases": run, "wrong": wrong, "clobbered": clobbered, "error_cases": error_cases,
            "seconds": secs, "failures": failures.iter().take(8).collect::<Vec<_>>(),
        });
        if failures.is_empty() {
            report.record(&name, Ok((detail, figures)));
        } else {
            let shown: Vec<&str> = failures.iter().take(3).map(String::as_str).collect();
            report.record(
                &name,
                Err(format!(
                    "{detail}; {} failing case(s), first: {}",
                    failures.len(),
                    shown.join(" | ")
                )),
            );
        }
    }
    json!({
        "cases": totals.0, "wrong": totals.1, "clobbered": totals.2, "failed_cases": totals.3,
        "seconds": start.elapsed().as_secs_f64(),
    })
}

// ---------------------------------------------------------------------------------------------
// Figures: all-reduce bandwidth, nccl-tests style
// ---------------------------------------------------------------------------------------------

struct PerfConfig {
    /// Message sizes in bytes (f32 elements: multiples of 4).
    sizes: Vec<u64>,
    warmup: u32,
    iters: u32,
    ctas: u32,
    threads: u32,
    timeout: Duration,
}

/// Runs `warmup` calls, then times `iters` back-to-back calls (host clock around the enqueue and
/// the wait); returns the time per call.
fn time_calls<R: Ranks>(
    team: &mut R,
    kernel: &str,
    calls: &[(DevComm, CollArgs)],
    cfg: &PerfConfig,
) -> Result<Duration, String> {
    team.launch(kernel, cfg.ctas, cfg.threads, calls, cfg.warmup, true)?;
    let t0 = Instant::now();
    team.launch(kernel, cfg.ctas, cfg.threads, calls, cfg.iters, true)?;
    Ok(t0.elapsed() / cfg.iters.max(1))
}

/// Grid-scope f32 calls of `kind` on every rank: `count` elements from window 0 to window 1.
fn perf_calls<R: Ranks>(
    team: &mut R,
    kind: u32,
    count: u64,
    timeout: Duration,
) -> Vec<(DevComm, CollArgs)> {
    (0..team.nranks())
        .map(|r| {
            let comm = team.comm(r, timeout.as_nanos() as u64);
            let args = CollArgs {
                kind,
                dtype: SYMCOMM_DTYPE_F32,
                redop: SYMCOMM_REDOP_SUM,
                root: 0,
                scope: SYMCOMM_SCOPE_GRID,
                index: 0,
                count,
                src_offset: 0,
                dst_offset: 0,
                tile_stride: 0,
                src: team.window(0, r),
                dst: team.window(1, r),
            };
            (comm, args)
        })
        .collect()
}

fn fmt_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KB", b >> 10),
        b => format!("{b} B"),
    }
}

/// The all-reduce `kind` (f32 sum, out of place) at every size of `cfg`, one nccl-tests row per
/// size: the result of the last timed call is checked bit for bit (`#wrong`).
fn perf_sweep<R: Ranks>(team: &mut R, kind: u32, cfg: &PerfConfig, label: &str) -> Outcome {
    let n = team.nranks();
    let max_count = cfg.sizes.iter().copied().max().unwrap_or(0) / 4;
    if max_count * 4 > team.capacity() {
        return Err(format!(
            "{} B per rank needed, the team has {}",
            max_count * 4,
            team.capacity()
        ));
    }
    // Inputs 1..=4 (sums never 0, so the zeroed output before each size catches missing
    // writes); exact in f32.
    const SALT: u64 = 0xba5e;
    let value = |r: u32, i: u64| 1 + (hash(r, i, SALT) % 4) as u32;
    let mut img = vec![0u8; (max_count * 4) as usize];
    for r in 0..n {
        for (i, chunk) in img.chunks_exact_mut(4).enumerate() {
            chunk.copy_from_slice(&(value(r, i as u64) as f32).to_bits().to_le_bytes());
        }
        team.write(0, r, &img)?;
    }
    let expected: Vec<u32> = (0..max_count)
        .map(|i| ((0..n).map(|r| value(r, i)).sum::<u32>() as f32).to_bits())
        .collect();
    let kernel = "symcomm_collective_f32";
    let busbw_factor = 2.0 * f64::from(n - 1) / f64::from(n);
    println!(
        "# {label}: {} ranks as streams, grid {} x {} per rank, {} warm-up + {} timed calls per size, out of place",
        n, cfg.ctas, cfg.threads, cfg.warmup, cfg.iters
    );
    println!(
        "# {:>12} {:>12} {:>8} {:>6} {:>10} {:>8} {:>8} {:>7}",
        "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"
    );
    println!(
        "# {:>12} {:>12} {:>8} {:>6} {:>10} {:>8} {:>8} {:>7}",
        "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", ""
    );
    let mut rows = Vec::new();
    let mut total_wrong = 0u64;
    let mut got = vec![0u8; (max_count * 4) as usize];
    for &size in &cfg.sizes {
        let count = size / 4;
        team.zero(1)?;
        let calls = perf_calls(team, kind, count, cfg.timeout);
        let t = match time_calls(team, kernel, &calls, cfg) {
            Ok(t) => t,
            Err(e) => {
                let _ = team.reset();
                return Err(format!("at {size} B: {e}"));
            }
        };
        let errors: Vec<String> = team
            .errors()?
            .iter()
            .enumerate()
            .filter(|(_, e)| e.status != SYMCOMM_STATUS_OK)
            .map(|(r, e)| format!("rank {r}: {} op {}", status_name(e.status), e.op))
            .collect();
        if !errors.is_empty() {
            let _ = team.reset();
            return Err(format!("at {size} B: {}", errors.join(", ")));
        }
        let mut wrong = 0u64;
        for r in 0..n {
            let out = &mut got[..(count * 4) as usize];
            team.read(1, r, out)?;
            wrong += out
                .chunks_exact(4)
                .zip(&expected)
                .filter(|(g, w)| u32::from_le_bytes([g[0], g[1], g[2], g[3]]) != **w)
                .count() as u64;
        }
        total_wrong += wrong;
        let secs = t.as_secs_f64();
        let algbw = size as f64 / secs / 1e9;
        let busbw = algbw * busbw_factor;
        println!(
            "  {size:>12} {count:>12} {:>8} {:>6} {:>10.2} {algbw:>8.2} {busbw:>8.2} {wrong:>7}",
            "float",
            "sum",
            secs * 1e6
        );
        rows.push(json!({
            "size": size, "count": count, "type": "float", "redop": "sum",
            "time_us": secs * 1e6, "algbw_gbps": algbw, "busbw_gbps": busbw, "wrong": wrong,
        }));
    }
    let first = rows.first().cloned().unwrap_or(Value::Null);
    let peak = rows
        .iter()
        .max_by(|a, b| {
            let (x, y) = (a["busbw_gbps"].as_f64(), b["busbw_gbps"].as_f64());
            x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal)
        })
        .cloned()
        .unwrap_or(Value::Null);
    let detail = format!(
        "{n} ranks, {} sizes {}..{}: {} in {:.2} us, peak busbw {:.2} GB/s at {}, #wrong={total_wrong}",
        rows.len(),
        fmt_bytes(cfg.sizes.first().copied().unwrap_or(0)),
        fmt_bytes(cfg.sizes.last().copied().unwrap_or(0)),
        fmt_bytes(first["size"].as_u64().unwrap_or(0)),
        first["time_us"].as_f64().unwrap_or(0.0),
        peak["busbw_gbps"].as_f64().unwrap_or(0.0),
        fmt_bytes(peak["size"].as_u64().unwrap_or(0)),
    );
    let figures = json!({
        "nranks": n, "ctas": cfg.ctas, "threads": cfg.threads, "warmup": cfg.warmup,
        "iters": cfg.iters, "busbw_factor": busbw_factor, "rows": rows,
    });
    if total_wrong == 0 {
        Ok((detail, figures))
    } else {
        Err(detail)
    }
}

/// The library's own copy loop as a bandwidth reference: a 1-rank broadcast of `bytes` (f32).
fn copy_kernel_bandwidth<R: Ranks>(team: &mut R, bytes: u64, cfg: &PerfConfig) -> Outcome {
    let calls = perf_calls(team, SYMCOMM_COLL_BROADCAST, bytes / 4, cfg.timeout);
    let t = time_calls(team, "symcomm_collective_f32", &calls, cfg)?;
    let errors = team.errors()?;
    if let Some(e) = errors.iter().find(|e| e.status != SYMCOMM_STATUS_OK) {
        return Err(format!("{} op {}", status_name(e.status), e.op));
    }
    let gbps = bytes as f64 / t.as_secs_f64() / 1e9;
    println!(
        "# reference: copy kernel (1-rank broadcast, grid {} x {}) of {}: {:.2} us, {gbps:.2} GB/s copied (memory traffic twice that)",
        cfg.ctas,
        cfg.threads,
        fmt_bytes(bytes),
        t.as_secs_f64() * 1e6
    );
    Ok((
        format!(
            "1-rank broadcast of {} in {:.2} us: {gbps:.2} GB/s",
            fmt_bytes(bytes),
            t.as_secs_f64() * 1e6
        ),
        json!({"bytes": bytes, "time_us": t.as_secs_f64() * 1e6, "gbps": gbps,
               "ctas": cfg.ctas, "threads": cfg.threads}),
    ))
}

/// Device-to-device copy bandwidth of the driver (`cuMemcpyDtoDAsync`) between two windows of a
/// 1-rank team, `warmup` + `iters` copies back to back on one stream.
fn memcpy_bandwidth(team: &GpuRanks<'_>, bytes: u64, cfg: &PerfConfig) -> Outcome {
    let (src, dst) = (&team.team.windows[0].buf, &team.team.windows[1].buf);
    let stream = &team.streams[0];
    let copies = |k: u32| -> Result<(), String> {
        for _ in 0..k {
            // SAFETY: both buffers belong to `team`, which outlives the synchronize below; no
            // kernel runs on them meanwhile.
            unsafe { stream.copy_device(dst, 0, src, 0, bytes as usize) }.map_err(err)?;
        }
        stream.synchronize().map_err(err)
    };
    copies(cfg.warmup)?;
    let t0 = Instant::now();
    copies(cfg.iters)?;
    let t = t0.elapsed() / cfg.iters.max(1);
    let gbps = bytes as f64 / t.as_secs_f64() / 1e9;
    println!(
        "# reference: cuMemcpyDtoDAsync of {}: {:.2} us, {gbps:.2} GB/s copied (memory traffic twice that)",
        fmt_bytes(bytes),
        t.as_secs_f64() * 1e6
    );
    Ok((
        format!(
            "cuMemcpyDtoDAsync of {} in {:.2} us: {gbps:.2} GB/s",
            fmt_bytes(bytes),
            t.as_secs_f64() * 1e6
        ),
        json!({"bytes": bytes, "time_us": t.as_secs_f64() * 1e6, "gbps": gbps}),
    ))
}

/// Records `outcome` and keeps its figures under `figures[key]`.
fn record_figures(
    report: &mut Report,
    figures: &mut serde_json::Map<String, Value>,
    name: &str,
    key: &str,
    outcome: Outcome,
) {
    if let Ok((_, f)) = &outcome {
        figures.insert(key.into(), f.clone());
    }
    report.record(name, outcome);
}

// ---------------------------------------------------------------------------------------------
// Collectives on the GPU
// ---------------------------------------------------------------------------------------------

/// The built-in collective kernels of every dtype checked, from the fatbin (or NVRTC).
fn collective_kernel_names() -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for dt in REDUCTION_DTYPES.iter().chain(COPY_DTYPES.iter()) {
        let name = format!("symcomm_collective_{}", dt.name);
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// The collective checks on the GPU: every kind x dtype x op x placement x scope x count, 2 and 4
/// ranks; 2 s device deadlines, at most 80 s in all.
fn gpu_matrix_config() -> MatrixConfig {
    MatrixConfig {
        nranks: vec![2, 4],
        counts: [1, 1023, 65537],
        grid: (4, 256),
        cta: (2, 256),
        timeout: Duration::from_secs(2),
        budget: Duration::from_secs(80),
    }
}

fn collective_checks_gpu(
    report: &mut Report,
    summary: &mut serde_json::Map<String, Value>,
    dev: &CudaDevice,
) {
    // One module per source file (collectives_float.cu, _fp8.cu, _int.cu).
    let start = Instant::now();
    let names = collective_kernel_names();
    let mut modules: Vec<(&'static str, CudaModule)> = Vec::new();
    for name in &names {
        let Some((desc, _)) = DEVICE_IMAGE.module_of(name) else {
            report.record(
                "load_collectives",
                Err(format!("no kernel {name} embedded")),
            );
            return;
        };
        if modules.iter().any(|(src, _)| *src == desc.source) {
            continue;
        }
        match dev.load_module(&DEVICE_IMAGE, desc) {
            Ok(m) => modules.push((desc.source, m)),
            Err(e) => {
                report.record("load_collectives", Err(format!("{}: {e}", desc.source)));
                return;
            }
        }
    }
    let mut funcs: Vec<(String, CudaFunction<'_>)> = Vec::new();
    for name in &names {
        let found = DEVICE_IMAGE
            .module_of(name)
            .and_then(|(desc, _)| modules.iter().find(|(src, _)| *src == desc.source))
            .map(|(_, m)| m.function(name));
        match found {
            Some(Ok(f)) => funcs.push((name.clone(), f)),
            Some(Err(e)) => {
                report.record("load_collectives", Err(format!("{name}: {e}")));
                return;
            }
            None => {
                report.record("load_collectives", Err(format!("{name}: no module")));
                return;
            }
        }
    }
    let origins: Vec<String> = modules
        .iter()
        .map(|(src, m)| format!("{src} from {}", origin_name(m.origin())))
        .collect();
    report.record(
        "load_collectives",
        Ok((
            format!(
                "{} kernels in {:.1} ms: {}",
                funcs.len(),
                start.elapsed().as_secs_f64() * 1e3,
                origins.join(", ")
            ),
            json!({"kernels": names, "load_s": start.elapsed().as_secs_f64()}),
        )),
    );

    // Correctness: every kind x dtype x op x placement x scope x count, 2 and 4 ranks.
    let cfg = gpu_matrix_config();
    let groups = matrix_groups(&cfg);
    let mut teams = Vec::new();
    for &n in &cfg.nranks {
        match GpuRanks::new(dev, &funcs, n, matrix_capacity(&groups, n)) {
            Ok(t) => teams.push(t),
            Err(e) => {
                report.record(&format!("coll_team_{n}"), Err(e));
                return;
            }
        }
    }
    let totals = run_matrix(report, &mut teams, &groups, &cfg);
    summary.insert("collectives".into(), totals);
    drop(teams);

    // Figures: all-reduce one-shot and two-shot over 4 ranks as streams, 8 B .. 256 MB.
    let (sms, arch) = match dev.info() {
        Ok(i) => (i.sms, i.arch()),
        Err(e) => {
            report.record("perf_setup", Err(err(e)));
            return;
        }
    };
    // 512 threads when ptxas reports at most 128 registers (then one CTA of every rank fits on an
    // SM), else 256. Every rank's CTAs must be resident at once (grid-scope barriers pair CTA b of
    // every rank), so the grids together never exceed one CTA per SM.
    let regs = DEVICE_IMAGE
        .report
        .iter()
        .find(|r| r.kernel == "symcomm_collective_f32" && r.arch == arch)
        .map(|r| r.registers);
    let threads = if regs.is_some_and(|r| r <= 128) {
        512
    } else {
        256
    };
    let nranks = 4;
    let max_bytes = 256u64 << 20;
    let pcfg = PerfConfig {
        sizes: (0..=25).map(|k| 8u64 << k).collect(),
        warmup: 5,
        iters: 20,
        ctas: (sms / nranks).clamp(1, 128),
        threads,
        timeout: Duration::from_secs(5),
    };
    let mut figures = serde_json::Map::new();
    match GpuRanks::new(dev, &funcs, nranks, max_bytes) {
        Ok(mut team) => {
            for (kind, key) in [
                (SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT, "all_reduce_one_shot"),
                (SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT, "all_reduce_two_shot"),
            ] {
                let outcome = perf_sweep(&mut team, kind, &pcfg, key);
                record_figures(report, &mut figures, &format!("perf_{key}"), key, outcome);
            }
        }
        Err(e) => {
            report.record("perf_team", Err(e));
        }
    }
    // References: the copy loop of the library over all SMs, and the driver's copy.
    let copy_cfg = PerfConfig {
        ctas: sms.clamp(1, 128),
        ..pcfg
    };
    match GpuRanks::new(dev, &funcs, 1, max_bytes) {
        Ok(mut team) => {
            let outcome = copy_kernel_bandwidth(&mut team, max_bytes, &copy_cfg);
            record_figures(
                report,
                &mut figures,
                "perf_copy_kernel",
                "copy_kernel",
                outcome,
            );
            let outcome = memcpy_bandwidth(&team, max_bytes, &copy_cfg);
            record_figures(
                report,
                &mut figures,
                "perf_memcpy_dtod",
                "memcpy_dtod",
                outcome,
            );
        }
        Err(e) => {
            report.record("perf_copy_team", Err(e));
        }
    }
    summary.insert("figures".into(), Value::Object(figures));
}

// ---------------------------------------------------------------------------------------------
// The same collective checks on the emulator (`--emu`)
// ---------------------------------------------------------------------------------------------

/// `full`: the GPU's matrix (counts up to 65537, 256 threads); else smaller counts and blocks.
fn emu_checks(report: &mut Report, summary: &mut serde_json::Map<String, Value>, full: bool) {
    comm_checks(report, symcomm::Device::Emu, 4099);
    if comm_only() {
        return;
    }
    let cfg = if full {
        MatrixConfig {
            timeout: Duration::from_secs(60),
            budget: Duration::from_secs(3600),
            ..gpu_matrix_config()
        }
    } else {
        MatrixConfig {
            nranks: vec![2, 4],
            counts: [1, 1023, 4099],
            grid: (4, 64),
            cta: (2, 64),
            timeout: Duration::from_secs(60),
            budget: Duration::from_secs(3600),
        }
    };
    let groups = matrix_groups(&cfg);
    let mut teams = Vec::new();
    for &n in &cfg.nranks {
        match EmuRanks::new(n, matrix_capacity(&groups, n)) {
            Ok(t) => teams.push(t),
            Err(e) => {
                report.record(&format!("coll_team_{n}"), Err(e));
                return;
            }
        }
    }
    let totals = run_matrix(report, &mut teams, &groups, &cfg);
    summary.insert("collectives".into(), totals);

    let pcfg = PerfConfig {
        sizes: (0..=6).map(|k| 8u64 << (2 * k)).collect(),
        warmup: 1,
        iters: 2,
        ctas: 2,
        threads: 64,
        timeout: Duration::from_secs(60),
    };
    let max_bytes = pcfg.sizes.iter().copied().max().unwrap_or(8);
    let mut figures = serde_json::Map::new();
    match EmuRanks::new(4, max_bytes) {
        Ok(mut team) => {
            for (kind, key) in [
                (SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT, "all_reduce_one_shot"),
                (SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT, "all_reduce_two_shot"),
            ] {
                let outcome = perf_sweep(&mut team, kind, &pcfg, key);
                record_figures(report, &mut figures, &format!("perf_{key}"), key, outcome);
            }
        }
        Err(e) => {
            report.record("perf_team", Err(e));
        }
    }
    match EmuRanks::new(1, max_bytes) {
        Ok(mut team) => {
            let outcome = copy_kernel_bandwidth(&mut team, max_bytes, &pcfg);
            record_figures(
                report,
                &mut figures,
                "perf_copy_kernel",
                "copy_kernel",
                outcome,
            );
        }
        Err(e) => {
            report.record("perf_copy_team", Err(e));
        }
    }
    summary.insert("figures".into(), Value::Object(figures));
}

// ---------------------------------------------------------------------------------------------
// Communicators: ranks as threads, windows exchanged through the library (VMM + fds on CUDA,
// memfd on the emulator), the built-in all-reduce launched through Stream / Kernel
// ---------------------------------------------------------------------------------------------

/// Runs `body` on `nranks` communicator ranks as threads on `device`, each with its own
/// communicator; the ranks' results, or the first failed rank's error.
fn comm_threads<T: Send>(
    device: symcomm::Device,
    nranks: u32,
    body: impl Fn(&symcomm::Communicator) -> Result<T, String> + Sync,
) -> Result<Vec<T>, String> {
    let id = symcomm::UniqueId::new_on("127.0.0.1".parse().map_err(err)?).map_err(err)?;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..nranks)
            .map(|r| {
                let (id, body) = (&id, &body);
                s.spawn(move || -> Result<T, String> {
                    let config = symcomm::bootstrap::BootstrapConfig::new(id.clone(), r, nranks)
                        .with_timeout(Duration::from_secs(60))
                        .with_host_id("gpu-check");
                    let options = symcomm::CommOptions::default().with_device_timeout(TIMEOUT);
                    let comm =
                        symcomm::Communicator::init_with(&config, device, &options).map_err(err)?;
                    body(&comm)
                })
            })
            .collect();
        hs.into_iter()
            .enumerate()
            .map(|(r, h)| {
                h.join()
                    .unwrap_or_else(|_| Err("rank thread panicked".into()))
                    .map_err(|e| format!("rank {r}: {e}"))
            })
            .collect()
    })
}

/// `nranks` communicator ranks as threads on `device`: windows of `count` f32, every rank's copy
/// read back by every rank, then `iters` one-shot all-reduces through the library's Stream and
/// Kernel, checked bit for bit.
fn comm_windows_check(device: symcomm::Device, nranks: u32, count: usize, iters: u32) -> Outcome {
    use symcomm::{KernelArgs, LaunchConfig};
    let value = |r: u32, i: usize| (r * 1000 + (i % 251) as u32) as f32;
    let per_rank = comm_threads(device, nranks, |comm| {
        let r = comm.rank();
        let src = comm.alloc_window::<f32>(count).map_err(err)?;
        let dst = comm.alloc_window::<f32>(count).map_err(err)?;
        let mine: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
        src.write(0, &mine).map_err(err)?;
        comm.barrier().map_err(err)?;
        let mut wrong = 0;
        let mut got = vec![0f32; count];
        for peer in 0..nranks {
            src.read_rank(peer, 0, &mut got).map_err(err)?;
            wrong += (0..count)
                .filter(|&i| got[i].to_bits() != value(peer, i).to_bits())
                .count();
        }
        let stream = comm.create_stream().map_err(err)?;
        let kernel = comm
            .load_kernel(&DEVICE_IMAGE, "symcomm_collective_f32")
            .map_err(err)?;
        let args = support::one_shot_sum_f32(
            src.device_handle().raw(),
            dst.device_handle().raw(),
            count as u64,
        );
        let kargs = KernelArgs::new()
            .arg(&comm.device_handle().map_err(err)?)
            .arg(&args);
        let t = Instant::now();
        for _ in 0..iters {
            // SAFETY: (DevComm, CollArgs) by value, as the kernel takes them; the windows
            // outlive the launches (synchronized below).
            unsafe { stream.launch(&kernel, LaunchConfig::linear(8, 256), &kargs) }.map_err(err)?;
        }
        stream.synchronize().map_err(err)?;
        let per_launch_us = t.elapsed().as_secs_f64() * 1e6 / f64::from(iters);
        comm.check_error().map_err(err)?;
        dst.read(0, &mut got).map_err(err)?;
        wrong += (0..count)
            .filter(|&i| {
                let want: f32 = (0..nranks).map(|p| value(p, i)).sum();
                got[i].to_bits() != want.to_bits()
            })
            .count();
        Ok((wrong, per_launch_us, src.device_handle().raw().stride))
    })?;
    let mut wrong = 0;
    let mut worst_us = 0f64;
    let mut stride = 0;
    for (w, us, st) in per_rank {
        wrong += w;
        worst_us = worst_us.max(us);
        stride = st;
    }
    let detail = format!(
        "{nranks} ranks as threads: windows of {count} f32 (stride {stride} B) exchanged, {iters} all-reduces, #wrong {wrong}, {worst_us:.1} us/launch (slowest rank)"
    );
    if wrong == 0 {
        Ok((
            detail,
            json!({"nranks": nranks, "count": count, "us_per_launch": worst_us, "stride": stride}),
        ))
    } else {
        Err(detail)
    }
}

/// Streams taking turns on one collective lane: each of `streams` streams issues three staged
/// all-reduces (ordinary buffers, copied through the lane's staging windows) and is dropped at
/// once — on CUDA that returns with the work still queued — so the next stream's first call
/// must wait for the lane's last work before reusing its barriers and staging windows; a
/// long-lived stream keeps the other lane. Every result checked bit for bit.
fn comm_lanes_check(device: symcomm::Device, nranks: u32, count: usize, streams: u32) -> Outcome {
    use symcomm::{DataType, RedOp};
    let value =
        |salt: usize, r: u32, i: usize| (salt as u32 * 1000 + r * 10 + (i % 7) as u32) as f32;
    let wrong: usize = comm_threads(device, nranks, |comm| {
        let keep = comm.create_stream().map_err(err)?;
        let bufs = (0..=streams)
            .map(|_| Ok((comm.alloc_buffer(count * 4)?, comm.alloc_buffer(count * 4)?)))
            .collect::<symcomm::Result<Vec<_>>>()
            .map_err(err)?;
        for (salt, (inp, _)) in bufs.iter().enumerate() {
            let mine: Vec<f32> = (0..count).map(|i| value(salt, comm.rank(), i)).collect();
            inp.write(0, &mine).map_err(err)?;
        }
        comm.barrier().map_err(err)?;
        let sum = |(inp, out): &(symcomm::Buffer, symcomm::Buffer), s: &symcomm::Stream| {
            comm.all_reduce(inp, out, count, DataType::F32, RedOp::Sum, s)
                .map_err(err)
        };
        sum(&bufs[streams as usize], &keep)?;
        for b in &bufs[..streams as usize] {
            let s = comm.create_stream().map_err(err)?;
            for _ in 0..3 {
                sum(b, &s)?;
            }
        }
        // The last stream on the lane waits for the ones before it: synchronizing it covers
        // them all.
        let last = comm.create_stream().map_err(err)?;
        sum(&bufs[0], &last)?;
        last.synchronize().map_err(err)?;
        keep.synchronize().map_err(err)?;
        comm.check_error().map_err(err)?;
        let mut wrong = 0;
        let mut got = vec![0f32; count];
        for (salt, (_, out)) in bufs.iter().enumerate() {
            out.read(0, &mut got).map_err(err)?;
            wrong += (0..count)
                .filter(|&i| {
                    let want: f32 = (0..nranks).map(|p| value(salt, p, i)).sum();
                    got[i].to_bits() != want.to_bits()
                })
                .count();
        }
        Ok(wrong)
    })?
    .into_iter()
    .sum();
    let detail = format!(
        "{nranks} ranks as threads: {streams} streams one after another on one lane, each dropped right after 3 staged all-reduces of {count} f32, #wrong {wrong}"
    );
    if wrong == 0 {
        Ok((
            detail,
            json!({"nranks": nranks, "count": count, "streams": streams}),
        ))
    } else {
        Err(detail)
    }
}

fn comm_checks(report: &mut Report, device: symcomm::Device, count: usize) {
    for n in [2u32, 4] {
        report.record(
            &format!("comm_windows_threads_{n}"),
            comm_windows_check(device, n, count, 5),
        );
        report.record(
            &format!("comm_lane_turnover_threads_{n}"),
            comm_lanes_check(device, n, count, 4),
        );
    }
    if device != symcomm::Device::Emu {
        report.record("comm_mixed_devices", comm_mixed_devices_check(device));
        report.record("occupancy_model", occupancy_model_check(device));
        for n in [4u32, 8] {
            report.record(
                &format!("co_residency_threads_{n}"),
                co_residency_check(device, n),
            );
        }
        report.record(
            "free_while_peer_queued",
            free_while_peer_queued_check(device),
        );
    }
}

/// Two ranks as threads on one GPU (one CUDA context): rank 0 drops a window and queues its next
/// all-reduce while rank 1 is still before its own drop. `cuMemUnmap` synchronizes the context,
/// so an inline free on rank 1 would wait for rank 0's all-reduce, which waits for rank 1's: a
/// hang until the device timeout. symcomm frees only while its streams are idle
/// (host/sync_free.rs); the emulator twin is tests/residency.rs.
fn free_while_peer_queued_check(device: symcomm::Device) -> Outcome {
    use symcomm::{DataType, RedOp};
    let n = 1usize << 20;
    let per_rank = comm_threads(device, 2, |comm| {
        let r = comm.rank();
        let stream = comm.create_stream().map_err(err)?;
        let a = comm.alloc_window::<u64>(n).map_err(err)?;
        let b = comm.alloc_window::<u64>(n).map_err(err)?;
        let input: Vec<u64> = (0..n as u64).map(|i| i * 3 + u64::from(r)).collect();
        a.write(0, &input).map_err(err)?;
        comm.barrier().map_err(err)?;
        let sum = || comm.all_reduce(&a, &a, n, DataType::U64, RedOp::Sum, &stream);
        sum().map_err(err)?;
        if r == 1 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let start = Instant::now();
        drop(b);
        sum().map_err(err)?;
        stream.synchronize().map_err(err)?;
        comm.check_error().map_err(err)?;
        let elapsed = start.elapsed();
        let got = a.to_vec().map_err(err)?;
        let wrong = (0..n).filter(|&i| got[i] != (i as u64 * 6 + 1) * 2).count();
        Ok((wrong, elapsed))
    })?;
    let detail: Vec<String> = per_rank
        .iter()
        .enumerate()
        .map(|(r, (wrong, elapsed))| {
            format!("rank {r}: #wrong {wrong}, drop + all-reduce {elapsed:?}")
        })
        .collect();
    if per_rank
        .iter()
        .all(|(wrong, elapsed)| *wrong == 0 && *elapsed < Duration::from_secs(5))
    {
        Ok((detail.join("; "), Value::Null))
    } else {
        Err(detail.join("; "))
    }
}

/// The emulator's occupancy model against the GPU's: for every built-in kernel at the block
/// sizes symcomm launches, `cuOccupancyMaxActiveBlocksPerMultiprocessor` and what the emulator
/// computes from the kernel's sm_90 ptxas report must agree (else the emulator's residency
/// scheduler would be more forgiving than the GPU, or stricter).
fn occupancy_model_check(device: symcomm::Device) -> Outcome {
    let symcomm::Device::Cuda(ordinal) = device else {
        return Err("not a CUDA device".into());
    };
    let gpu = symcomm::Backend::Cuda(CudaDevice::open(ordinal).map_err(err)?);
    let emu = symcomm::Backend::Emu;
    let mut lines = Vec::new();
    let mut bad = Vec::new();
    let mut names = collective_kernel_names();
    names.push("symcomm_sendrecv".into());
    for name in &names {
        let on_gpu = symcomm::Kernel::load(&gpu, &DEVICE_IMAGE, name).map_err(err)?;
        let on_emu = symcomm::Kernel::load(&emu, &DEVICE_IMAGE, name).map_err(err)?;
        for threads in [64u32, 512] {
            let g = on_gpu.occupancy(threads, 0).map_err(err)?;
            let e = on_emu.occupancy(threads, 0).map_err(err)?;
            lines.push(format!("{name}@{threads}: gpu {g}, emulator {e}"));
            if g != e {
                bad.push(format!(
                    "{name} at {threads} threads: GPU {g} CTAs/SM, emulator {e}"
                ));
            }
        }
    }
    if bad.is_empty() {
        Ok((lines.join("; "), Value::Null))
    } else {
        Err(bad.join("; "))
    }
}

/// `nranks` ranks as threads on one GPU: the share of each is what the GPU holds divided among
/// them; a co-resident launch beyond it is refused, and an all-reduce large enough to want more
/// CTAs than the share (64 MiB) completes bit-exact with every launch capped.
fn co_residency_check(device: symcomm::Device, nranks: u32) -> Outcome {
    use symcomm::{CommOptions, Communicator, DataType, KernelArgs, LaunchConfig, RedOp};
    let id = symcomm::UniqueId::new_on("127.0.0.1".parse().map_err(err)?).map_err(err)?;
    let count = 16usize << 20; // 64 MiB of f32
    let per_rank: Vec<Result<(u32, usize), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..nranks)
            .map(|r| {
                let id = &id;
                s.spawn(move || -> Result<(u32, usize), String> {
                    let config = symcomm::bootstrap::BootstrapConfig::new(id.clone(), r, nranks)
                        .with_timeout(Duration::from_secs(60))
                        .with_host_id("gpu-check");
                    let options = CommOptions::default().with_device_timeout(TIMEOUT);
                    let comm = Communicator::init_with(&config, device, &options).map_err(err)?;
                    let kernel = comm
                        .load_kernel(&DEVICE_IMAGE, "symcomm_collective_f32")
                        .map_err(err)?;
                    let share = comm.co_resident_share(&kernel, 512, 0).map_err(err)?;
                    let w = comm.alloc_window::<f32>(count).map_err(err)?;
                    let stream = comm.create_stream().map_err(err)?;
                    let kargs = KernelArgs::new()
                        .arg(&comm.device_handle().map_err(err)?)
                        .arg(&support::one_shot_sum_f32(
                            w.device_handle().raw(),
                            w.device_handle().raw(),
                            0,
                        ));
                    let big = LaunchConfig::linear(share + 1, 512).co_resident();
                    // SAFETY: refused before launching (checked below).
                    match unsafe { comm.launch(&stream, &kernel, big, &kargs) } {
                        Err(symcomm::Error::InvalidArgument(_)) => {}
                        other => return Err(format!("launch beyond the share: {other:?}")),
                    }
                    let mine: Vec<f32> =
                        (0..count).map(|i| ((i + r as usize) % 7) as f32).collect();
                    w.write(0, &mine).map_err(err)?;
                    comm.barrier().map_err(err)?;
                    comm.all_reduce(&w, &w, count, DataType::F32, RedOp::Sum, &stream)
                        .map_err(err)?;
                    stream.synchronize().map_err(err)?;
                    comm.check_error().map_err(err)?;
                    let mut got = vec![0f32; count];
                    w.read(0, &mut got).map_err(err)?;
                    let wrong = (0..count)
                        .filter(|&i| {
                            let want: usize = (0..nranks as usize).map(|p| (i + p) % 7).sum();
                            got[i].to_bits() != (want as f32).to_bits()
                        })
                        .count();
                    Ok((share, wrong))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    });
    let mut detail = Vec::new();
    let mut ok = true;
    for (r, res) in per_rank.iter().enumerate() {
        match res {
            Ok((share, wrong)) => {
                detail.push(format!("rank {r}: share {share}, #wrong {wrong}"));
                ok &= *wrong == 0;
            }
            Err(e) => {
                detail.push(format!("rank {r}: {e}"));
                ok = false;
            }
        }
    }
    if ok {
        Ok((detail.join("; "), Value::Null))
    } else {
        Err(detail.join("; "))
    }
}

/// Rank 0 on `device`, rank 1 on the emulator: init fails on both with `Mismatch`.
fn comm_mixed_devices_check(device: symcomm::Device) -> Outcome {
    let id = symcomm::UniqueId::new_on("127.0.0.1".parse().map_err(err)?).map_err(err)?;
    let results: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = [device, symcomm::Device::Emu]
            .into_iter()
            .enumerate()
            .map(|(r, d)| {
                let id = &id;
                s.spawn(move || {
                    let config = symcomm::bootstrap::BootstrapConfig::new(id.clone(), r as u32, 2)
                        .with_timeout(Duration::from_secs(30))
                        .with_host_id("gpu-check");
                    match symcomm::Communicator::init_with(
                        &config,
                        d,
                        &symcomm::CommOptions::default(),
                    ) {
                        Ok(_) => "initialized".to_owned(),
                        Err(e @ symcomm::Error::Mismatch { .. }) => format!("Mismatch: {e}"),
                        Err(e) => format!("other error: {e}"),
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| "panicked".into()))
            .collect()
    });
    if results.iter().all(|r| r.starts_with("Mismatch")) {
        Ok((results.join("; "), Value::Null))
    } else {
        Err(results.join("; "))
    }
}

// ---------------------------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------------------------

/// `--comm-only`: only the communicator checks.
fn comm_only() -> bool {
    std::env::args().skip(1).any(|a| a == "--comm-only")
}

fn json_path() -> Option<PathBuf> {
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--json" {
            return args.next().map(PathBuf::from);
        }
        if let Some(p) = a.strip_prefix("--json=") {
            return Some(PathBuf::from(p));
        }
    }
    std::env::var_os("SYMCOMM_GPU_CHECK_JSON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

fn run_checks(report: &mut Report, summary: &mut serde_json::Map<String, Value>) {
    report.record(
        "nvrtc_version",
        cuda::nvrtc_version()
            .map(|(major, minor)| {
                (
                    format!("NVRTC {major}.{minor}"),
                    json!({"major": major, "minor": minor}),
                )
            })
            .map_err(err),
    );

    let info = match cuda::probe() {
        Ok(info) => info,
        Err(e) => {
            report.record("probe", Err(err(e)));
            return;
        }
    };
    let gpus: Vec<String> = info
        .devices
        .iter()
        .map(|g| {
            format!(
                "[{}] {} {} {} SMs {:.1} GiB",
                g.ordinal,
                g.name,
                g.arch(),
                g.sms,
                g.memory_bytes as f64 / (1u64 << 30) as f64
            )
        })
        .collect();
    let devices: Vec<Value> = info
        .devices
        .iter()
        .map(|g| {
            json!({
                "ordinal": g.ordinal, "name": g.name, "sms": g.sms, "memory_bytes": g.memory_bytes,
                "compute_capability": [g.compute_capability.0, g.compute_capability.1],
            })
        })
        .collect();
    summary.insert(
        "cuda".into(),
        json!({
            "driver_version": info.driver_version,
            "devices": devices,
            "peer_access": info.peer_access,
        }),
    );
    let has_gpu = !info.devices.is_empty();
    report.record(
        "probe",
        if has_gpu {
            Ok((
                format!(
                    "driver {} with {} GPU(s): {}",
                    info.driver_version,
                    info.devices.len(),
                    gpus.join(", ")
                ),
                json!({"driver_version": info.driver_version, "gpus": info.devices.len()}),
            ))
        } else {
            Err(format!("driver {} sees no GPU", info.driver_version))
        },
    );
    if !has_gpu {
        return;
    }
    comm_checks(report, symcomm::Device::Cuda(0), 1 << 20);
    if comm_only() {
        return;
    }

    let dev = match CudaDevice::open(0) {
        Ok(d) => d,
        Err(e) => {
            report.record("open_gpu0", Err(err(e)));
            return;
        }
    };
    let Some((module_desc, _)) = DEVICE_IMAGE.module_of(KERNEL) else {
        report.record("image", Err(format!("no kernel {KERNEL} embedded")));
        return;
    };

    // The embedded fatbin (or, in a build without nvcc, the NVRTC fallback `load_module` takes).
    let start = Instant::now();
    match dev.load_module(&DEVICE_IMAGE, module_desc) {
        Ok(module) => {
            let origin = origin_name(module.origin());
            let ok = module_desc.fatbin.is_none() || *module.origin() == ModuleOrigin::Fatbin;
            report.record(
                "load_module",
                if ok {
                    Ok((
                        format!(
                            "{} from {origin} in {:.1} ms",
                            module_desc.source,
                            start.elapsed().as_secs_f64() * 1e3
                        ),
                        json!({"origin": origin, "load_s": start.elapsed().as_secs_f64()}),
                    ))
                } else {
                    Err(format!(
                        "the embedded fatbin was not used (origin {origin})"
                    ))
                },
            );
            ping_pong_series(report, "ping_pong_fatbin", &dev, &module, 3, 1000, 4096);
            ping_pong_series(
                report,
                "ping_pong_latency_1word",
                &dev,
                &module,
                1,
                10_000,
                1,
            );
            report.record("timeout_missing_rank", check_timeout(&dev, &module));
            report.record("abort_flag", check_abort(&dev, &module));
            report.record("abi_mismatch", check_abi_mismatch(&dev, &module));
        }
        Err(e) => {
            report.record("load_module", Err(err(e)));
        }
    }

    // The run-time fallback: the kernel compiled from its embedded source by NVRTC.
    let start = Instant::now();
    match dev.load_module_nvrtc(&DEVICE_IMAGE, module_desc) {
        Ok(module) => {
            report.record(
                "load_module_nvrtc",
                Ok((
                    format!(
                        "{} from {} in {:.1} ms",
                        module_desc.source,
                        origin_name(module.origin()),
                        start.elapsed().as_secs_f64() * 1e3
                    ),
                    json!({"origin": origin_name(module.origin()), "load_s": start.elapsed().as_secs_f64()}),
                )),
            );
            ping_pong_series(report, "ping_pong_nvrtc", &dev, &module, 2, 1000, 4096);
        }
        Err(e) => {
            report.record("load_module_nvrtc", Err(err(e)));
        }
    }

    // The device collectives: correctness matrix, then the bandwidth figures.
    collective_checks_gpu(report, summary, &dev);
}

fn main() -> ExitCode {
    let json_path = json_path();
    let on_emu = std::env::args().skip(1).any(|a| a == "--emu");
    let full = std::env::args().skip(1).any(|a| a == "--full");
    let mut report = Report::default();
    let mut summary = serde_json::Map::new();
    let start = Instant::now();
    if on_emu {
        summary.insert("backend".into(), json!("emulator"));
        emu_checks(&mut report, &mut summary, full);
    } else {
        summary.insert("backend".into(), json!("cuda"));
        run_checks(&mut report, &mut summary);
    }
    let pass = report.failed == 0;
    println!(
        "{} gpu checks{}: {} run, {} failed, {:.1} s",
        if pass { "PASS" } else { "FAIL" },
        if on_emu { " (emulator)" } else { "" },
        report.checks.len(),
        report.failed,
        start.elapsed().as_secs_f64()
    );
    if let Some(path) = json_path {
        summary.insert("pass".into(), json!(pass));
        summary.insert("failed".into(), json!(report.failed));
        summary.insert("seconds".into(), json!(start.elapsed().as_secs_f64()));
        summary.insert("checks".into(), Value::Array(report.checks));
        let text = serde_json::to_string_pretty(&Value::Object(summary)).unwrap_or_default();
        if let Err(e) = std::fs::write(&path, text + "\n") {
            println!("FAIL json could not write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

//! GPU checks: a plain `main` (`harness = false`, `test = false`: `cargo test` neither builds nor
//! runs it) that needs a CUDA GPU. Build with `cargo test --release --test gpu --no-run`;
//! `scripts/gpu-check` packs the executable and runs it on a GPU machine.
//!
//! Prints one line per check, `PASS name …` or `FAIL name …`, and exits non-zero when any check
//! failed (also when there is no driver or no GPU). With `--json PATH` (or
//! `SYMCOMM_GPU_CHECK_JSON=PATH`) it also writes a JSON summary: every check with its detail and
//! figures.
//!
//! Checks, on GPU 0 with the ranks of a team as streams on that GPU (flat layout, as the
//! emulator's `LocalTeam`):
//! - the driver probe, and NVRTC's version;
//! - the embedded `symcomm_ping_pong` kernel from the fatbin, 2 ranks, 3 launches back to back
//!   without resetting the signal area (epochs continue), exact data, with the round-trip latency;
//! - the same kernel compiled at run time with NVRTC for the GPU's architecture (the fallback of
//!   builds without nvcc);
//! - a missing rank times out within the deadline, the abort flag stops a wait, a stale ABI
//!   version is refused.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::c_void;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use symcomm::DEVICE_IMAGE;
use symcomm::abi::{
    DevComm, ErrorRecord, SYMCOMM_ABI_VERSION, SYMCOMM_OP_SIGNAL_WAIT, SYMCOMM_SIGNAL_SLOTS,
    SYMCOMM_STATUS_ABI_MISMATCH, SYMCOMM_STATUS_ABORTED, SYMCOMM_STATUS_OK, SYMCOMM_STATUS_TIMEOUT,
    WindowHandleRaw,
};
use symcomm::backend::cuda::{
    self, CudaDevice, CudaFunction, CudaModule, DeviceBuffer, ModuleOrigin, Stream,
};

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

/// One device buffer per piece of a team's state, in the flat layout: rank r's signal array at
/// `signals + r * signal_stride`, rank r's window copy at `window + r * stride`.
struct GpuTeam {
    nranks: u32,
    window_bytes: u64,
    stride: u64,
    signals: DeviceBuffer,
    window: DeviceBuffer,
    abort: DeviceBuffer,
    errors: DeviceBuffer,
    /// Per rank, the kernel's 3-word result, 16 bytes apart.
    results: DeviceBuffer,
}

const RESULT_STRIDE: usize = 16;

impl GpuTeam {
    fn new(dev: &CudaDevice, nranks: u32, window_bytes: u64) -> symcomm::Result<Self> {
        let n = nranks as usize;
        let stride = window_bytes.div_ceil(ALIGN).max(1) * ALIGN;
        Ok(GpuTeam {
            nranks,
            window_bytes,
            stride,
            signals: dev.alloc_zeroed(n * n * SYMCOMM_SIGNAL_SLOTS as usize * 8)?,
            window: dev.alloc_zeroed(stride as usize * n)?,
            abort: dev.alloc_zeroed(4)?,
            errors: dev.alloc_zeroed(n * std::mem::size_of::<ErrorRecord>())?,
            results: dev.alloc_zeroed(n * RESULT_STRIDE)?,
        })
    }

    fn dev_comm(&self, rank: u32, timeout_ns: u64) -> DevComm {
        DevComm {
            abi_version: SYMCOMM_ABI_VERSION,
            rank,
            nranks: self.nranks,
            signal_slots: SYMCOMM_SIGNAL_SLOTS,
            signal_base: self.signals.device_ptr(),
            signal_stride: u64::from(self.nranks) * u64::from(SYMCOMM_SIGNAL_SLOTS) * 8,
            abort_flag: self.abort.device_ptr(),
            error: self.errors.device_ptr()
                + u64::from(rank) * std::mem::size_of::<ErrorRecord>() as u64,
            timeout_ns,
        }
    }

    fn window(&self, rank: u32) -> WindowHandleRaw {
        WindowHandleRaw {
            base: self.window.device_ptr(),
            stride: self.stride,
            bytes: self.window_bytes,
            rank,
            nranks: self.nranks,
        }
    }

    fn error(&self, rank: u32) -> symcomm::Result<ErrorRecord> {
        let mut rec = [ErrorRecord::default()];
        self.errors
            .read(rank as usize * std::mem::size_of::<ErrorRecord>(), &mut rec)?;
        Ok(rec[0])
    }
}

/// One launch of the ring.
struct Launch<'a> {
    func: &'a CudaFunction<'a>,
    streams: &'a [Stream],
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
    team.results.zero().map_err(err)?;
    let start = Instant::now();
    for &rank in l.ranks {
        let mut comm = team.dev_comm(rank, l.timeout.as_nanos() as u64);
        if let Some(v) = l.abi_version {
            comm.abi_version = v;
        }
        let mut win = team.window(rank);
        let (mut rounds, mut words) = (l.rounds, l.words);
        let mut result = team.results.device_ptr() + (rank as usize * RESULT_STRIDE) as u64;
        let mut args: [*mut c_void; 5] = [
            (&raw mut comm).cast(),
            (&raw mut win).cast(),
            (&raw mut rounds).cast(),
            (&raw mut words).cast(),
            (&raw mut result).cast(),
        ];
        // SAFETY: the five pointers match the kernel's parameters (DevComm, WindowHandleRaw,
        // u32, u32, u32* as a 64-bit device address) and are copied at enqueue; every device
        // address in them belongs to `team`, which outlives the wait below (`wait` exits the
        // process rather than return while a kernel may still run).
        unsafe {
            l.streams[rank as usize].launch(l.func, [1, 1, 1], [l.threads, 1, 1], 0, &mut args)
        }
        .map_err(err)?;
    }
    wait(team, l.streams, l.timeout + WATCHDOG_GRACE)?;
    let took = start.elapsed();
    let mut out = Vec::new();
    for &rank in l.ranks {
        let mut r = [0u32; 3];
        team.results
            .read(rank as usize * RESULT_STRIDE, &mut r)
            .map_err(err)?;
        out.push(r);
    }
    Ok((out, took))
}

/// Waits until every stream is idle. Past `deadline`, raises the team's abort flag; if the
/// kernels still do not stop, reports and exits the process (freeing memory under a running
/// kernel is not an option).
fn wait(team: &GpuTeam, streams: &[Stream], deadline: Duration) -> Result<(), String> {
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
            team.abort.write(0, &[1u32]).map_err(err)?;
            aborted = true;
        } else if waited > deadline + WATCHDOG_GRACE {
            println!(
                "FAIL hang kernels still running {waited:?} after launch, {WATCHDOG_GRACE:?} after the abort flag was raised"
            );
            std::process::exit(2);
        }
        std::thread::sleep(Duration::from_micros(20));
    }
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
        let team = GpuTeam::new(dev, 2, u64::from(words.max(1)) * 4)?;
        Ok((func, streams, team))
    })();
    let (func, streams, team) = match setup {
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
    let team = GpuTeam::new(dev, 3, 64).map_err(err)?;
    let timeout = Duration::from_millis(200);
    let launch = Launch {
        func: &func,
        streams: &streams,
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
    let team = GpuTeam::new(dev, 2, 64).map_err(err)?;
    team.abort.write(0, &[1u32]).map_err(err)?;
    let launch = Launch {
        func: &func,
        streams: &streams,
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
    let team = GpuTeam::new(dev, 1, 64).map_err(err)?;
    let launch = Launch {
        func: &func,
        streams: &streams,
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
    summary.insert("cuda".into(), json!(info));
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
}

fn main() -> ExitCode {
    let json_path = json_path();
    let mut report = Report::default();
    let mut summary = serde_json::Map::new();
    let start = Instant::now();
    run_checks(&mut report, &mut summary);
    let pass = report.failed == 0;
    println!(
        "{} gpu checks: {} run, {} failed, {:.1} s",
        if pass { "PASS" } else { "FAIL" },
        report.checks.len(),
        report.failed,
        start.elapsed().as_secs_f64()
    );
    if let Some(path) = json_path {
        summary.insert("pass".into(), json!(pass));
        summary.insert("failed".into(), json!(report.failed));
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

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
//!   65537, plus misaligned offsets; the emulator tests' value model (tests/support/values.rs:
//!   reduction inputs whose results are exactly representable, arbitrary bits for the
//!   data-movement collectives), every output compared bit for bit (`#wrong`), every other byte of
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
//! - `hosts_put_ring`, `hosts_all_reduce`, `hosts_graph_all_reduce`, `hosts_send_recv_direct`,
//!   `hosts_send_recv_staged` (also with `--emu`): 4 ranks as threads on two simulated hosts
//!   (UCX between them; the bundle carries a UCX built with CUDA): the put ring through the
//!   proxy, a host all-reduce across the hosts, one captured in a CUDA graph and replayed (the
//!   worker's host function and stream wait), and send/recv rings of 1 and 64 MiB with UCX
//!   moving the device memory itself (GPUDirect where it can) and staged through pinned host
//!   memory in waves (GB/s each way), bit-exact (tests/gpu/hosts.rs).
//!
//! - `one_hardware_queue_threads_4` (also with `--emu`): this executable again, as a child
//!   process with `CUDA_DEVICE_MAX_CONNECTIONS=1`: 4 ranks as threads whose streams all share
//!   one hardware queue; whether launches symcomm does not order deadlock there (a figure: the
//!   emulator's model says they do), and the windows and lane-turnover checks, which symcomm
//!   orders, bit-exact (tests/gpu/queues.rs).
//!
//! - `perf_fused_rmsnorm`: the fused all-reduce + residual + RMSNorm kernel against the unfused
//!   pair (host all-reduce, then `symcomm_residual_rmsnorm_bf16`), bf16, hidden 8192, 1..128
//!   tokens, 4 ranks as threads through the communicator, each at 512 threads (two packs per
//!   thread) and 1024 (one); both results compared bit for bit.
//!
//! `--emu` runs the collective checks and a small bandwidth sweep on the CPU emulator instead
//! (counts up to 4099 and 64-thread blocks; `--emu --full`: the GPU's counts and blocks), which
//! checks this harness itself — layouts, in-place offsets, expected values — on machines without
//! a GPU.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../support/mod.rs"]
mod support;

mod collectives;
mod comm;
mod emu;
mod faults;
mod fused;
mod harness;
mod hosts;
mod matrix;
mod perf;
mod ping_pong;
mod queues;
mod ranks;

use collectives::*;
use comm::*;
use emu::*;
use faults::*;
use fused::*;
use harness::*;
use hosts::*;
use matrix::*;
use perf::*;
use ping_pong::*;
use queues::*;
use ranks::*;

use std::ffi::c_void;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::KINDS;
use support::cases::*;
use support::values::{DType, dtype, hash};
use symcomm::DEVICE_IMAGE;
use symcomm::abi::*;
use symcomm::testing::cuda::{
    self, CudaDevice, CudaDeviceExt, CudaFunction, CudaModule, DeviceBuffer, ModuleOrigin, Stream,
};

pub(crate) const KERNEL: &str = "symcomm_ping_pong";
/// Alignment of each rank's window copy (DESIGN §3).
pub(crate) const ALIGN: u64 = 256;
/// Device-side deadline of every wait in the ping-pong runs.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(10);
/// How long the host waits beyond a kernel's own deadline before raising the abort flag.
pub(crate) const WATCHDOG_GRACE: Duration = Duration::from_secs(5);

/// Outcome of one check: a one-line detail and named figures.
pub(crate) type Outcome = Result<(String, Value), String>;

#[derive(Default)]
pub(crate) struct Report {
    pub(crate) checks: Vec<Value>,
    pub(crate) failed: usize,
}

impl Report {
    pub(crate) fn record(&mut self, name: &str, outcome: Outcome) -> bool {
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

/// `--comm-only`: only the communicator checks.
pub(crate) fn comm_only() -> bool {
    std::env::args().skip(1).any(|a| a == "--comm-only")
}

pub(crate) fn json_path() -> Option<PathBuf> {
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

pub(crate) fn run_checks(report: &mut Report, summary: &mut serde_json::Map<String, Value>) {
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

pub(crate) fn main() -> ExitCode {
    if let Some(code) = one_queue_child() {
        return code;
    }
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

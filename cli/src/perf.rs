//! `symcomm perf [COLLECTIVE] [OPTIONS]`: an nccl-tests compatible benchmark of the host
//! collectives (`reference/nccl.md` §3): the same options, the same table, the same busbw
//! factors, every result checked.
//!
//! - **Collectives.** `all_reduce` (default), `all_gather`, `reduce_scatter`, `broadcast`,
//!   `reduce`, `scatter`, `all_to_all`, `sendrecv` (nccl-tests' ring: one group per call with a
//!   send to rank r + 1 and a receive from rank r − 1; in place, both on the same memory, as
//!   nccl-tests does). nccl-tests spellings such as `alltoall` or `all_reduce_perf` work too.
//! - **Ranks.** `-t N` ranks as threads of this process (default 4). Started by `symcomm launch`,
//!   torchrun or mpirun (`RANK`, `OMPI_COMM_WORLD_RANK` or `PMI_RANK` set), the process is one
//!   rank of that job (`-t` is ignored) and only rank 0 prints. `--device emu|cuda|cuda:N|auto`
//!   (default `SYMCOMM_DEVICE`, else `auto`: a GPU when there is one, else the emulator).
//! - **Options** are nccl-tests v2.19's letters and meanings; an option given twice takes its
//!   last value (getopt's rule). `-g` must be 1: each rank drives one GPU (more ranks: `-t`, or
//!   processes through `symcomm launch`).
//! - **Sizes.** `-b` to `-e` bytes (K, M, G suffixes = powers of 1024), times `-f` per step, or
//!   plus `-i` bytes when `-f` is 1 or absent and `-i` is given (nccl-tests' rule). The size `S`
//!   of a row is nccl-tests': the larger of the send and receive buffers (all-gather: the
//!   gathered output; reduce-scatter, scatter: the scattered input; all-to-all: one rank's
//!   whole buffer), `count` the per-rank parameter passed to the call. For those four, as
//!   nccl-tests' `getCollByteCount`, `count = S / typesize / nranks` rounded down to a multiple
//!   of `16 / typesize` (16 bytes per rank's block), and `S = count · nranks · typesize`.
//!   Defaults: CUDA `-b 8 -e 256M -f 2 -n 20 -w 5`; emulator `-b 8 -e 1M -f 4 -n 3 -w 1` (the
//!   emulator runs kernels on CPU threads; this sweep takes about a second with 4 ranks on 2
//!   cores). A default `-e` below an explicit `-b` is raised to it (and a default `-b` above an
//!   explicit `-e` lowered); an explicit `-b` above an explicit `-e` is an error.
//! - **Roots.** `-r R` (default 0) for broadcast, reduce and scatter; `-r -1` runs the whole
//!   sweep once per root, roots in turn (a row each, the `root` column telling them apart).
//!   Types (`-d all`), then ops (`-o all`), then roots, each with its own warm-up, as nccl-tests
//!   loops. `-N C` repeats the sweep C times (0: until interrupted).
//! - **Buffers.** `--buffers window` (default): symmetric windows, the zero-copy path;
//!   `--buffers device`: ordinary device memory, through the communicator's staging windows.
//!   Both are allocated once, `-e` bytes; in place uses the receive buffer with NCCL's offsets
//!   (all-gather: send = recv + rank·count; reduce-scatter, scatter: recv = send + rank·count;
//!   the others: the same memory). Call number i of a row (and warm-up call i) moves both
//!   buffers by `T · (i mod ⌊-e / T⌋)` bytes, T the call's larger buffer (nccl-tests' rotation
//!   against cache effects); the untimed call before the timing and the checks use offset 0.
//! - **Timing** (nccl-tests' `BenchTime`). Per type, op and root, `-w` warm-up calls at every
//!   size from `-b` doubling up to `-e`. Per size, out of place then in place: one untimed
//!   call, a host barrier, then `-n` iterations of `-m` calls each (enqueued back to back:
//!   symcomm has no group fusion of collectives) and a stream synchronize; time = elapsed /
//!   (n·m). `-z 1`: each call waited for, then a barrier; `-z 2`: each call waited for;
//!   `-z 3`: each call waited for, and after each iteration a barrier outside the time. `-G K`:
//!   the n·m calls are captured in a graph (emulator graphs too: the recorded calls queued
//!   again) launched K times, time = elapsed / (n·m·K); each check's call is also captured and
//!   replayed, so graphs are checked. `-C 1`: the time columns (`cputime`) show the host time
//!   of enqueuing the calls (graph launches for `-G`) instead. `-a` combines the ranks' times:
//!   0 rank 0's, 1 the mean (default), 2 the minimum, 3 the maximum. algbw = S / time
//!   (GB = 1e9 B), busbw = algbw × nccl-tests' factor ([`Collective::bus_factor`]).
//! - **Checks** (`-c N`, default 1; 0 turns them off and `#wrong` shows `N/A`). After timing,
//!   N times: fresh inputs (a new seed each time), the output poisoned, one call, every output
//!   element compared bit for bit with the value computed here; the first check with errors
//!   ends the loop, as in nccl-tests. Inputs are small integers, so every reduction is exact
//!   whatever the order: sums and avg use values in `0..=k` with `k·nranks` exactly
//!   representable (fp8 e5m2: sums up to 8; when even `nranks` is too many, exactly one rank
//!   contributes a 1); prod uses ±1 and, on one rank per element, 2; min/max use `-8..=8`
//!   (unsigned: `0..=16`); data movement uses hashed values (full-width bit patterns for
//!   integers). Float avg is the one inexact result: it must be within 2 ulp of `sum / nranks`
//!   (nccl-tests' tolerance); integer avg is the sum divided by nranks, truncated. Every type
//!   of `-d all` is encodable this way, so `-d all` runs all twelve (`-o all` all five ops).
//!   Reduce's output on the other ranks than the root must stay untouched (as nccl-tests
//!   checks): the poison out of place, the rank's own input in place. `#wrong` sums the
//!   mismatching elements over the ranks.
//! - **Aggregation.** Each rank's times are combined by `-a` and its `#wrong` summed with
//!   all-reduces (u64) on a small window — with threads too, so a failing rank aborts its
//!   communicator and the others stop with an error instead of waiting forever. Every rank
//!   learns the same figures; rank 0 checks that they are consistent with its own.
//! - **Output.** `#` lines (run parameters, ranks, backend, buffers), the nccl-tests header,
//!   one row per size with nccl-tests' 13 columns (`--algo-column` appends `algo`: the
//!   algorithm symcomm's model, or `SYMCOMM_ALGO`, chose for that size), then
//!   `# Out of bounds values : N OK|FAILED` (N = the number of out-of-place / in-place results
//!   with errors), `# Avg bus bandwidth    : X` (the mean busbw over every row, both columns;
//!   ` OK` or ` FAILED` appended when `NCCL_TESTS_MIN_BW` is set) and
//!   `# Collective test concluded: ...`. `--json` prints one JSON document on stdout instead:
//!   `{"collective", "nranks", "mode", "backend", "buffers", "dtype", "op", "root",
//!   "rows": [{"size", "count", "type", "redop", "root", "out_of_place": {"time_us", "algbw",
//!   "busbw", "wrong"}, "in_place": {..}, "algorithm"}], "avg_busbw", "out_of_bounds",
//!   "wrong", "min_bw_ok"}` (`wrong` null when checks are off; `root` -1 and `redop` "none"
//!   where they do not apply, as in the table; `min_bw_ok` only with `NCCL_TESTS_MIN_BW`).
//!   `-J FILE.json` writes nccl-tests' JSON report (format version 3: `config`, `results` with
//!   `out_of_place` / `in_place` `{time|cpu_time, alg_bw, bus_bw, nwrong}`,
//!   `out_of_bounds`, `average_bus_bandwidth`, `errors`, UTC `start_time` / `end_time`) beside
//!   the table; an existing file is kept and `FILE.json.0`, `.1`, ... used, as nccl-tests
//!   does. Its `env` lists the `NCCL_*`, `SYMCOMM_*` and `CUDA_*` variables only, with
//!   `SYMCOMM_ID` and `SYMCOMM_SECRET` redacted (they carry the rendezvous secret);
//!   `nccl_version` is 0 (no NCCL library is involved).
//! - **Exit status** (nccl-tests' `testResult_t`): 0 success; 1 internal error; 2 device
//!   (CUDA, NVRTC, emulator) error; 3 communicator error (nccl-tests' NCCL errors: a rank lost
//!   or aborted, a mismatch, a refused argument, a failed rendezvous); 4 timeout; 5 not
//!   supported by the backend; 6 bad arguments (nccl-tests itself exits 255 for bad sizes and
//!   falls back to float / sum for unknown types / ops); 7 (`testNumResults`) when any
//!   element is wrong or the average bus bandwidth is below 0.9 × `NCCL_TESTS_MIN_BW` GB/s.
//!   Errors are printed prefixed with the rank.
//!
//! The parts: `desc.rs` (what each collective does: the description table), `values.rs` (element
//! encodings and the values the checks use), `mem.rs` (a buffer: a window or device memory),
//! `plan.rs` (the arguments checked, the backend's defaults filled in), `report.rs` (results and
//! their printing) and `bench.rs` (one rank's run).
//!
//! [`Collective::bus_factor`]: symcomm::Collective::bus_factor

use std::net::{IpAddr, Ipv4Addr};
use std::process::ExitCode;

use symcomm::bootstrap::BootstrapConfig;
use symcomm::{CommOptions, Communicator, Device, UniqueId};

mod bench;
mod desc;
mod mem;
mod plan;
mod report;
mod values;

use bench::run_rank;
use plan::{Failure, Request, TestResult};
use report::Summary;

/// nccl-tests' testInvalidUsage: the exit status for bad arguments.
pub(crate) const INVALID_USAGE: u8 = TestResult::InvalidUsage as u8;
/// Most ranks `-t` starts.
const MAX_THREAD_RANKS: u32 = 1024;

/// How the buffers of the benchmark are allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BufferKind {
    /// Symmetric windows (`alloc_window`): the zero-copy path.
    Window,
    /// Ordinary device memory (`alloc_buffer`): copied through the staging windows.
    Device,
}

impl BufferKind {
    fn name(self) -> &'static str {
        match self {
            BufferKind::Window => "window",
            BufferKind::Device => "device",
        }
    }
}

/// `symcomm perf` options (nccl-tests' letters and meanings). As with nccl-tests' getopt, an
/// option given twice takes its last value.
#[derive(Debug, clap::Args)]
#[command(args_override_self = true)]
pub(crate) struct PerfArgs {
    /// all_reduce, all_gather, reduce_scatter, broadcast, reduce, scatter, all_to_all or
    /// sendrecv (nccl-tests names such as `alltoall` and `all_reduce_perf` work too).
    #[arg(value_name = "COLLECTIVE", default_value = "all_reduce")]
    collective: String,

    /// Smallest size in bytes; K, M, G suffixes (powers of 1024) [default: 8].
    #[arg(short = 'b', long = "minbytes", value_name = "BYTES", value_parser = parse_size)]
    minbytes: Option<u64>,

    /// Largest size in bytes; K, M, G suffixes [default: 256M on CUDA, 1M on the emulator].
    #[arg(short = 'e', long = "maxbytes", value_name = "BYTES", value_parser = parse_size)]
    maxbytes: Option<u64>,

    /// Multiply the size by F per step; 0 or 1 steps by -i bytes instead [default: 2 on CUDA,
    /// 4 on the emulator, unless -i is given].
    #[arg(short = 'f', long = "stepfactor", value_name = "F")]
    stepfactor: Option<u64>,

    /// Add BYTES per step when -f is 1 or absent [default: 1M].
    #[arg(short = 'i', long = "stepbytes", value_name = "BYTES", value_parser = parse_size)]
    stepbytes: Option<u64>,

    /// Timed iterations per size [default: 20 on CUDA, 3 on the emulator].
    #[arg(
        short = 'n',
        long = "iters",
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    iters: Option<u32>,

    /// Calls per timed iteration (nccl-tests' aggregated iterations; symcomm has no group
    /// fusion of collectives, so they are enqueued back to back); time is per call.
    #[arg(
        short = 'm',
        long = "agg_iters",
        value_name = "N",
        default_value_t = 1,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    agg_iters: u32,

    /// Warm-up calls at every power-of-two multiple of -b up to -e [default: 5 on CUDA, 1 on
    /// the emulator].
    #[arg(short = 'w', long = "warmup_iters", value_name = "N")]
    warmup: Option<u32>,

    /// Run the whole sweep N times, a table section each; 0 runs until interrupted.
    #[arg(
        short = 'N',
        long = "run_cycles",
        value_name = "N",
        default_value_t = 1
    )]
    run_cycles: u32,

    /// Correctness checks per size and placement; 0 turns checking off (#wrong shows N/A).
    #[arg(short = 'c', long = "check", value_name = "N", default_value_t = 1)]
    check: u32,

    /// Reduction: sum, prod, min, max, avg, or all (ignored by collectives without one).
    #[arg(short = 'o', long = "op", value_name = "OP", default_value = "sum")]
    op: String,

    /// Element type: float, double, half, bfloat16, f8e4m3, f8e5m2, int8, uint8, int32,
    /// uint32, int64, uint64 (or f32, bf16, u8, ...), or all.
    #[arg(
        short = 'd',
        long = "datatype",
        value_name = "TYPE",
        default_value = "float"
    )]
    dtype: String,

    /// Root rank of broadcast, reduce and scatter; -1 runs the sweep once per root, each in
    /// turn.
    #[arg(
        short = 'r',
        long = "root",
        value_name = "RANK",
        default_value_t = 0,
        allow_negative_numbers = true,
        value_parser = clap::value_parser!(i64).range(-1..=i64::from(u32::MAX))
    )]
    root: i64,

    /// 0: no waits; 1: wait for each call and a barrier; 2: wait for each call; 3: wait and a
    /// barrier after each iteration (-n), the barrier outside the time.
    #[arg(
        short = 'z',
        long = "blocking",
        value_name = "0..3",
        default_value_t = 0,
        value_parser = clap::value_parser!(u8).range(0..=3)
    )]
    blocking: u8,

    /// Capture the timed calls (and each check's call) in a graph and launch it N times; the
    /// time is per call of all launches. 0: no graph.
    #[arg(short = 'G', long = "cudagraph", value_name = "N", default_value_t = 0)]
    graph_launches: u32,

    /// 1: the time columns report the CPU time of enqueuing the calls (`cputime`) instead.
    #[arg(
        short = 'C',
        long = "report_cputime",
        value_name = "0|1",
        default_value_t = 0
    )]
    report_cputime: u32,

    /// How the ranks' times combine: 0 rank 0's, 1 the mean, 2 the minimum, 3 the maximum.
    #[arg(
        short = 'a',
        long = "average",
        value_name = "0..3",
        default_value_t = 1,
        value_parser = clap::value_parser!(u8).range(0..=3)
    )]
    average: u8,

    /// Also write nccl-tests' JSON report to FILE (which must end in .json; an existing file
    /// is kept and FILE.0, FILE.1, ... used instead), the table still printed.
    #[arg(short = 'J', long = "output_file", value_name = "FILE")]
    output_file: Option<std::path::PathBuf>,

    /// GPUs per rank: only 1 (every rank drives one GPU; use -t or `symcomm launch` for more
    /// ranks).
    #[arg(short = 'g', long = "ngpus", value_name = "1", default_value_t = 1)]
    ngpus: u32,

    /// Ranks as threads of this process (ignored when a launcher started it).
    #[arg(
        short = 't',
        long = "nthreads",
        value_name = "N",
        default_value_t = 4,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_THREAD_RANKS))
    )]
    nthreads: u32,

    /// Symmetric windows (zero-copy) or ordinary device buffers (staged copies) [default:
    /// window when every rank is on one host, device across hosts (where the host phases stage
    /// windows like device buffers)]
    #[arg(long, value_enum, value_name = "KIND")]
    buffers: Option<BufferKind>,

    /// Append an `algo` column (the algorithm chosen for each size) to the table; without it
    /// the rows have exactly nccl-tests' 13 columns.
    #[arg(long)]
    algo_column: bool,

    /// Print one JSON document on stdout instead of the table.
    #[arg(long)]
    json: bool,

    /// emu, cuda, cuda:N or auto [default: SYMCOMM_DEVICE, else auto].
    #[arg(long, value_name = "DEVICE")]
    device: Option<String>,

    /// Also measure a stream-ordered device-to-device copy of the largest size on each rank
    /// (the memory-bandwidth reference for busbw), printed after the table (JSON:
    /// `copy_bandwidth_gbps`, rank 0's).
    #[arg(long)]
    copy_bandwidth: bool,
}

/// Parses `8`, `64K`, `1M`, `2G` (powers of 1024; `k`, `m`, `g` too).
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        _ => (t, 0),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(1u64 << shift))
        .ok_or_else(|| format!("`{text}` is not a size in bytes (such as 8, 64K, 1M, 2G)"))
}

/// Whether a launcher started this process as one rank of a job.
fn launched() -> bool {
    ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// Runs `symcomm perf`; the exit status is described in the module docs.
pub(crate) fn run(args: &PerfArgs) -> ExitCode {
    let req = match Request::from_args(args) {
        Ok(r) => r,
        Err(msg) => {
            eprintln!("symcomm perf: {msg}");
            return ExitCode::from(TestResult::InvalidUsage as u8);
        }
    };
    let device = match args.device.as_deref() {
        Some(d) => Device::parse(d),
        None => Device::from_env(),
    };
    let device = match device {
        Ok(d) => d,
        Err(e) => {
            eprintln!("symcomm perf: {e}");
            return ExitCode::from(TestResult::InvalidUsage as u8);
        }
    };
    let results: Vec<(u32, Result<Summary, Failure>)> = if launched() {
        let result = BootstrapConfig::from_env()
            .and_then(|config| Communicator::init_with(&config, device, &CommOptions::from_env()?))
            .map_err(Failure::from)
            .and_then(|comm| run_rank(&comm, &req, "processes").map(|s| (comm.rank(), s)));
        let rank = std::env::var("RANK")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        vec![match result {
            Ok((r, s)) => (r, Ok(s)),
            Err(e) => (rank, Err(e)),
        }]
    } else {
        run_threads(&req, args.nthreads, device)
    };
    finish(&req, results)
}

/// `nranks` ranks as threads of this process.
fn run_threads(req: &Request, nranks: u32, device: Device) -> Vec<(u32, Result<Summary, Failure>)> {
    let id = match UniqueId::new_on(IpAddr::V4(Ipv4Addr::LOCALHOST)) {
        Ok(id) => id,
        Err(e) => return vec![(0, Err(Failure::from(e)))],
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..nranks)
            .map(|r| {
                let id = &id;
                std::thread::Builder::new()
                    .name(format!("perf-rank-{r}"))
                    .spawn_scoped(s, move || {
                        Communicator::init(id, r, nranks, device)
                            .map_err(Failure::from)
                            .and_then(|comm| run_rank(&comm, req, "threads"))
                    })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                let result = match h {
                    Ok(h) => h
                        .join()
                        .unwrap_or_else(|_| Err(Failure::internal("rank thread panicked"))),
                    Err(e) => Err(Failure::internal(format!(
                        "cannot start a rank thread: {e}"
                    ))),
                };
                (r as u32, result)
            })
            .collect()
    })
}

/// The exit status from every (local) rank's outcome (nccl-tests' `testResult_t`); prints the
/// errors.
fn finish(req: &Request, results: Vec<(u32, Result<Summary, Failure>)>) -> ExitCode {
    let mut usage = None;
    let mut failures = Vec::new();
    let mut summary = None;
    for (rank, r) in &results {
        match r {
            Ok(s) => summary = summary.or(Some(s)),
            Err(Failure::Usage(msg)) => usage = Some(msg.clone()),
            Err(Failure::Run(code, msg)) => {
                eprintln!("symcomm perf: rank {rank}: {msg}");
                failures.push(*code);
            }
        }
    }
    if let Some(msg) = &usage {
        eprintln!("symcomm perf: {msg}");
    }
    let code = status(
        usage.is_some(),
        &failures,
        summary.map(|s| (s.out_of_bounds(), s.bandwidth_ok(req.min_bw))),
    );
    if code == TestResult::NumResults && !req.json {
        eprintln!(
            "symcomm perf: wrong results (see #wrong) or bus bandwidth below NCCL_TESTS_MIN_BW"
        );
    }
    ExitCode::from(code as u8)
}

/// The exit status: bad arguments; else the first failure that is not a consequence of another
/// rank's (the communicator's errors come last: a rank that fails aborts its communicator, and
/// the others then fail with it); else wrong results or a bandwidth below the bound
/// (`testNumResults`); else success.
fn status(
    usage: bool,
    failures: &[TestResult],
    results: Option<(u32, Option<bool>)>,
) -> TestResult {
    if usage {
        return TestResult::InvalidUsage;
    }
    if let Some(&code) = failures
        .iter()
        .find(|c| **c != TestResult::NcclError)
        .or(failures.first())
    {
        return code;
    }
    match results {
        Some((0, None | Some(true))) => TestResult::Success,
        Some(_) => TestResult::NumResults,
        None => TestResult::InternalError,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert!(parse_size("x").is_err());
        assert!(parse_size("").is_err());
    }

    /// nccl-tests' exit codes: testInvalidUsage 6, the failure's own class before the
    /// communicator errors it causes elsewhere, testNumResults 7 for #wrong > 0 or a bandwidth
    /// below NCCL_TESTS_MIN_BW.
    #[test]
    fn exit_codes() {
        use TestResult as T;
        assert_eq!(status(false, &[], Some((0, None))), T::Success);
        assert_eq!(status(false, &[], Some((0, Some(true)))), T::Success);
        assert_eq!(status(false, &[], Some((2, None))), T::NumResults);
        assert_eq!(status(false, &[], Some((0, Some(false)))), T::NumResults);
        assert_eq!(status(true, &[T::NcclError], None), T::InvalidUsage);
        assert_eq!(status(false, &[T::NcclError, T::Timeout], None), T::Timeout);
        assert_eq!(
            status(false, &[T::NcclError, T::NcclError], None),
            T::NcclError
        );
        assert_eq!(
            status(false, &[T::CudaError], Some((0, None))),
            T::CudaError
        );
        assert_eq!(status(false, &[], None), T::InternalError);
        assert_eq!(
            [
                T::Success,
                T::InternalError,
                T::CudaError,
                T::NcclError,
                T::Timeout
            ]
            .map(|t| t as u8),
            [0, 1, 2, 3, 4]
        );
        assert_eq!(
            [T::NotImplemented, T::InvalidUsage, T::NumResults].map(|t| t as u8),
            [5, 6, 7]
        );
        let timeout = symcomm::Error::HostTimeout {
            rank: 0,
            what: "barrier".into(),
            timeout_ms: 1,
        };
        assert_eq!(T::of(&timeout), T::Timeout);
        assert_eq!(
            T::of(&symcomm::Error::InvalidArgument("x".into())),
            T::NcclError
        );
        assert_eq!(
            T::of(&symcomm::Error::Cuda {
                call: "cuInit",
                error: "CUDA_ERROR_NO_DEVICE".into()
            }),
            T::CudaError
        );
    }
}

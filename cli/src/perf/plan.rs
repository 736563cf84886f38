//! The plan: what to run, with the backend's defaults filled in.

use symcomm::{Collective, DataType, RedOp};

use super::desc::{DESCS, Desc};
use super::values::Fmt;
use super::{BufferKind, PerfArgs};

/// nccl-tests' default additive step (`-i`).
const DEFAULT_STEP_BYTES: u64 = 1 << 20;

/// How sizes grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    Factor(u64),
    Bytes(u64),
}

/// The sizes of a run (`-b`, `-e`, `-f` / `-i`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sweep {
    pub(super) min: u64,
    pub(super) max: u64,
    pub(super) step: Step,
}

impl Sweep {
    pub(super) fn sizes(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut s = self.min;
        while s <= self.max {
            out.push(s);
            let next = match self.step {
                Step::Factor(f) => s.checked_mul(f),
                Step::Bytes(b) => s.checked_add(b),
            };
            match next {
                Some(n) if n > s => s = n,
                _ => break,
            }
        }
        out
    }

    /// nccl-tests' warm-up sizes: -b, then doubling while at most -e (from 1 when -b is 0).
    pub(super) fn warmup_sizes(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut s = self.min;
        while s <= self.max {
            out.push(s);
            match s.checked_mul(2) {
                Some(0) => s = 1,
                Some(n) => s = n,
                None => break,
            }
        }
        out
    }

    pub(super) fn step_text(&self) -> String {
        match self.step {
            Step::Factor(f) => format!("{f}(factor)"),
            Step::Bytes(b) => format!("{b}(bytes)"),
        }
    }
}

/// nccl-tests' `testResult_t`: the exit status of `symcomm perf` (its `main` returns it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TestResult {
    Success = 0,
    /// Something in `symcomm perf` itself (a rank thread panicked, the report not written).
    InternalError = 1,
    /// The device: a CUDA driver, NVRTC or emulator error.
    CudaError = 2,
    /// The communicator (nccl-tests' NCCL errors): a rank lost, aborted, a mismatch, a refused
    /// argument, a failed rendezvous.
    NcclError = 3,
    /// A deadline passed (device-side wait, host collective, rendezvous).
    Timeout = 4,
    /// The backend cannot serve the request.
    NotImplemented = 5,
    /// Bad arguments.
    InvalidUsage = 6,
    /// Wrong results (#wrong above 0), or an average bus bandwidth below 0.9 ×
    /// `NCCL_TESTS_MIN_BW` (nccl-tests' `testNumResults`).
    NumResults = 7,
}

impl TestResult {
    /// The class of a library error.
    pub(crate) fn of(e: &symcomm::Error) -> TestResult {
        use symcomm::Error as E;
        if e.is_timeout() {
            return TestResult::Timeout;
        }
        match e {
            E::NoDriver(_)
            | E::Cuda { .. }
            | E::Nvrtc { .. }
            | E::UnknownKernel(_)
            | E::Device(_) => TestResult::CudaError,
            E::Unsupported(_) => TestResult::NotImplemented,
            _ => TestResult::NcclError,
        }
    }
}

/// A usage error or a failure, with the exit status it gives.
#[derive(Debug)]
pub(super) enum Failure {
    Usage(String),
    Run(TestResult, String),
}

impl Failure {
    pub(super) fn internal(msg: impl Into<String>) -> Failure {
        Failure::Run(TestResult::InternalError, msg.into())
    }
}

impl From<symcomm::Error> for Failure {
    fn from(e: symcomm::Error) -> Self {
        Failure::Run(TestResult::of(&e), e.to_string())
    }
}

/// How the ranks' times combine (`-a`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Average {
    Rank0,
    Mean,
    Min,
    Max,
}

/// The arguments checked, before the backend is known.
#[derive(Debug, Clone)]
pub(super) struct Request {
    pub(super) desc: &'static Desc,
    pub(super) dtypes: Vec<DataType>,
    /// `[None]` for collectives without an op.
    pub(super) ops: Vec<Option<RedOp>>,
    pub(super) dtype_text: String,
    pub(super) op_text: String,
    /// `-r`: a rank, or -1 for every root in turn.
    pub(super) root: i64,
    minbytes: Option<u64>,
    maxbytes: Option<u64>,
    stepfactor: Option<u64>,
    stepbytes: Option<u64>,
    iters: Option<u32>,
    warmup: Option<u32>,
    pub(super) check: u32,
    /// `--buffers`; `None`: by the communicator ([`Plan::buffers`]).
    pub(super) buffers: Option<BufferKind>,
    pub(super) json: bool,
    pub(super) copy_bandwidth: bool,
    /// `-m`: calls per timed iteration.
    pub(super) agg_iters: u32,
    /// `-N`: sweeps; 0 until interrupted.
    pub(super) run_cycles: u32,
    /// `-z`: 0..=3.
    pub(super) blocking: u8,
    /// `-G`: graph launches; 0 none.
    pub(super) graph_launches: u32,
    /// `-C`.
    pub(super) report_cputime: bool,
    /// `-a`.
    pub(super) average: Average,
    /// `-J`.
    pub(super) output_file: Option<std::path::PathBuf>,
    /// `--algo-column`.
    pub(super) algo_column: bool,
    /// `NCCL_TESTS_MIN_BW`: the average bus bandwidth below 0.9 × which the run fails.
    pub(super) min_bw: Option<f64>,
    /// The command line, for the JSON report.
    pub(super) argv: Vec<String>,
}

/// The defaults of one backend.
struct Defaults {
    maxbytes: u64,
    factor: u64,
    iters: u32,
    warmup: u32,
}

const CUDA_DEFAULTS: Defaults = Defaults {
    maxbytes: 256 << 20,
    factor: 2,
    iters: 20,
    warmup: 5,
};
const EMU_DEFAULTS: Defaults = Defaults {
    maxbytes: 1 << 20,
    factor: 4,
    iters: 3,
    warmup: 1,
};
const DEFAULT_MINBYTES: u64 = 8;

/// Everything a rank runs.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub(super) req: Request,
    /// `--buffers`, or windows when every rank is on one host and device buffers otherwise.
    pub(super) buffers: BufferKind,
    pub(super) sweep: Sweep,
    pub(super) iters: u32,
    pub(super) warmup: u32,
    /// The roots each sweep runs with (one sweep per root; `[0]` for collectives without one).
    pub(super) roots: Vec<u32>,
}

impl Request {
    pub(super) fn from_args(a: &PerfArgs) -> Result<Request, String> {
        let coll = Collective::parse(&a.collective).ok_or_else(|| {
            format!(
                "unknown collective `{}`; expected one of {}",
                a.collective,
                DESCS.map(|d| d.coll.name()).join(", ")
            )
        })?;
        let desc = Desc::find(coll)
            .ok_or_else(|| format!("{} is not available yet in symcomm perf", coll.name()))?;
        let dtypes = if a.dtype == "all" {
            DataType::ALL
                .into_iter()
                .filter(|d| Fmt::of(*d).is_some())
                .collect()
        } else {
            let d = DataType::parse(&a.dtype)
                .filter(|d| Fmt::of(*d).is_some())
                .ok_or_else(|| {
                    format!(
                        "unknown datatype `{}`; expected all or one of {}",
                        a.dtype,
                        DataType::ALL.map(DataType::name).join(", ")
                    )
                })?;
            vec![d]
        };
        let known = [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::Avg];
        let ops: Vec<RedOp> = if a.op == "all" {
            known.to_vec()
        } else {
            let o = RedOp::parse(&a.op)
                .filter(|o| known.contains(o))
                .ok_or_else(|| {
                    format!(
                        "unknown op `{}`; expected all or one of {}",
                        a.op,
                        known.map(RedOp::name).join(", ")
                    )
                })?;
            vec![o]
        };
        let ops = if coll.has_op() {
            ops.into_iter().map(Some).collect()
        } else {
            vec![None]
        };
        if a.ngpus != 1 {
            return Err(format!(
                "-g {}: symcomm drives one GPU per rank (-g 1); for more ranks use -t N (threads) \
                 or `symcomm launch -n N` (processes)",
                a.ngpus
            ));
        }
        if a.graph_launches > 0 && a.blocking > 0 {
            return Err(format!(
                "-z {} waits for each call, which a graph capture (-G {}) cannot: use one of them",
                a.blocking, a.graph_launches
            ));
        }
        if let Some(path) = &a.output_file {
            let json = path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| e.eq_ignore_ascii_case("json"));
            if !json {
                return Err(format!(
                    "-J {}: only JSON output files are supported; the name must end in .json",
                    path.display()
                ));
            }
        }
        let min_bw = match std::env::var("NCCL_TESTS_MIN_BW") {
            Ok(v) => Some(
                v.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| format!("NCCL_TESTS_MIN_BW={v:?} is not a bandwidth in GB/s"))?,
            ),
            Err(_) => None,
        };
        if let (Some(b), Some(e)) = (a.minbytes, a.maxbytes) {
            if b > e {
                return Err(format!(
                    "minbytes ({b}) is larger than maxbytes ({e}): -b must not exceed -e"
                ));
            }
        }
        Ok(Request {
            desc,
            dtypes,
            ops,
            dtype_text: a.dtype.clone(),
            op_text: if coll.has_op() {
                a.op.clone()
            } else {
                "none".into()
            },
            root: a.root,
            minbytes: a.minbytes,
            maxbytes: a.maxbytes,
            stepfactor: a.stepfactor,
            stepbytes: a.stepbytes,
            iters: a.iters,
            warmup: a.warmup,
            check: a.check,
            buffers: a.buffers,
            json: a.json,
            copy_bandwidth: a.copy_bandwidth,
            agg_iters: a.agg_iters,
            run_cycles: a.run_cycles,
            blocking: a.blocking,
            graph_launches: a.graph_launches,
            report_cputime: a.report_cputime != 0,
            average: match a.average {
                0 => Average::Rank0,
                2 => Average::Min,
                3 => Average::Max,
                _ => Average::Mean,
            },
            output_file: a.output_file.clone(),
            algo_column: a.algo_column,
            min_bw,
            argv: std::env::args().collect(),
        })
    }

    /// Fills in the defaults of the backend (`emu`) and checks what needs the rank count.
    pub(super) fn plan(&self, emu: bool, nranks: u32, one_host: bool) -> Result<Plan, Failure> {
        let d = if emu { &EMU_DEFAULTS } else { &CUDA_DEFAULTS };
        let (min, max) = match (self.minbytes, self.maxbytes) {
            (Some(b), Some(e)) => (b, e),
            (Some(b), None) => (b, d.maxbytes.max(b)),
            (None, Some(e)) => (DEFAULT_MINBYTES.min(e), e),
            (None, None) => (DEFAULT_MINBYTES, d.maxbytes),
        };
        let factor = match (self.stepfactor, self.stepbytes) {
            (Some(f), _) => f,
            (None, Some(_)) => 1,
            (None, None) => d.factor,
        };
        let step = if factor > 1 {
            if min == 0 {
                return Err(Failure::Usage(
                    "-b 0 with a step factor never grows; give -b above 0 or a step in bytes (-f 1 -i BYTES)"
                        .into(),
                ));
            }
            Step::Factor(factor)
        } else {
            match self.stepbytes.unwrap_or(DEFAULT_STEP_BYTES) {
                0 => return Err(Failure::Usage("-i must be above 0".into())),
                b => Step::Bytes(b),
            }
        };
        let roots = if !self.desc.coll.has_root() {
            vec![0]
        } else if self.root == -1 {
            (0..nranks).collect()
        } else {
            match u32::try_from(self.root) {
                Ok(r) if r < nranks => vec![r],
                _ => {
                    return Err(Failure::Usage(format!(
                        "root {} is out of range for {nranks} ranks (-r -1: every root)",
                        self.root
                    )));
                }
            }
        };
        Ok(Plan {
            req: self.clone(),
            buffers: self.buffers.unwrap_or(if one_host {
                BufferKind::Window
            } else {
                BufferKind::Device
            }),
            sweep: Sweep { min, max, step },
            iters: self.iters.unwrap_or(d.iters),
            warmup: self.warmup.unwrap_or(d.warmup),
            roots,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn sweep_sizes() {
        let s = Sweep {
            min: 8,
            max: 1 << 20,
            step: Step::Factor(4),
        };
        assert_eq!(s.sizes().len(), 9);
        let s = Sweep {
            min: 0,
            max: 10,
            step: Step::Bytes(4),
        };
        assert_eq!(s.sizes(), vec![0, 4, 8]);
        assert_eq!(s.warmup_sizes(), vec![0, 1, 2, 4, 8]);
        let s = Sweep {
            min: 24,
            max: 100,
            step: Step::Factor(8),
        };
        assert_eq!(s.warmup_sizes(), vec![24, 48, 96]);
    }
}

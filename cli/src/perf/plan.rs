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

    pub(super) fn step_text(&self) -> String {
        match self.step {
            Step::Factor(f) => format!("{f}(factor)"),
            Step::Bytes(b) => format!("{b}(bytes)"),
        }
    }
}

/// A usage error (exit status 2) or a failure (exit status 1).
#[derive(Debug)]
pub(super) enum Failure {
    Usage(String),
    Run(String),
}

impl From<symcomm::Error> for Failure {
    fn from(e: symcomm::Error) -> Self {
        Failure::Run(e.to_string())
    }
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
    pub(super) root: u32,
    minbytes: Option<u64>,
    maxbytes: Option<u64>,
    stepfactor: Option<u64>,
    stepbytes: Option<u64>,
    iters: Option<u32>,
    warmup: Option<u32>,
    pub(super) check: u32,
    pub(super) buffers: BufferKind,
    pub(super) json: bool,
    pub(super) copy_bandwidth: bool,
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
    pub(super) sweep: Sweep,
    pub(super) iters: u32,
    pub(super) warmup: u32,
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
        })
    }

    /// Fills in the defaults of the backend (`emu`) and checks what needs the rank count.
    pub(super) fn plan(&self, emu: bool, nranks: u32) -> Result<Plan, Failure> {
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
        if self.desc.coll.has_root() && self.root >= nranks {
            return Err(Failure::Usage(format!(
                "root {} is out of range for {nranks} ranks",
                self.root
            )));
        }
        Ok(Plan {
            req: self.clone(),
            sweep: Sweep { min, max, step },
            iters: self.iters.unwrap_or(d.iters),
            warmup: self.warmup.unwrap_or(d.warmup),
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
    }
}

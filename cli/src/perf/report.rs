//! Results and their printing: the nccl-tests table, or one JSON document.

use std::io::Write as _;

use serde::Serialize;
use symcomm::Communicator;

use super::BufferKind;
use super::plan::Plan;

/// One placement's figures, aggregated over the ranks.
#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct Timing {
    pub(super) time_us: f64,
    pub(super) algbw: f64,
    pub(super) busbw: f64,
    /// `None` when checks are off.
    pub(super) wrong: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct Row {
    pub(super) size: u64,
    pub(super) count: u64,
    #[serde(rename = "type")]
    pub(super) dtype: &'static str,
    pub(super) redop: &'static str,
    pub(super) root: i64,
    pub(super) out_of_place: Timing,
    pub(super) in_place: Timing,
    pub(super) algorithm: &'static str,
}

#[derive(Debug, Serialize)]
struct JsonReport<'a> {
    collective: &'static str,
    nranks: u32,
    mode: &'static str,
    backend: String,
    buffers: &'static str,
    dtype: &'a str,
    op: &'a str,
    root: i64,
    rows: &'a [Row],
    avg_busbw: f64,
    out_of_bounds: u32,
    wrong: Option<u64>,
    copy_bandwidth_gbps: Option<f64>,
}

/// What every rank learns from a run (from the aggregated figures, so the same on every rank).
#[derive(Debug, Default)]
pub(super) struct Summary {
    pub(super) rows: Vec<Row>,
    /// This rank's device-to-device copy bandwidth at the largest size, GB/s (`--copy-bandwidth`).
    pub(super) copy_gbps: Option<f64>,
}

impl Summary {
    fn avg_busbw(&self) -> f64 {
        let bws: Vec<f64> = self
            .rows
            .iter()
            .flat_map(|r| [r.out_of_place.busbw, r.in_place.busbw])
            .collect();
        if bws.is_empty() {
            0.0
        } else {
            bws.iter().sum::<f64>() / bws.len() as f64
        }
    }

    /// Results (row × placement) with wrong elements.
    pub(super) fn out_of_bounds(&self) -> u32 {
        self.rows
            .iter()
            .flat_map(|r| [r.out_of_place.wrong, r.in_place.wrong])
            .filter(|w| w.is_some_and(|w| w > 0))
            .count() as u32
    }

    fn wrong(&self, checked: bool) -> Option<u64> {
        checked.then(|| {
            self.rows
                .iter()
                .flat_map(|r| [r.out_of_place.wrong, r.in_place.wrong])
                .map(|w| w.unwrap_or(0))
                .sum()
        })
    }
}

/// C's `%g` (6 significant digits, trailing zeros dropped).
fn fmt_g(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    if !x.is_finite() {
        return format!("{x}");
    }
    let sci = format!("{x:.5e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s.to_owned()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mant), exp.abs())
    } else {
        let decimals = (5 - exp).max(0) as usize;
        trim(&format!("{x:.decimals$}"))
    }
}

/// nccl-tests' time column: 2 decimals below 100 µs, 1 below 10 ms, none above.
fn fmt_time(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

fn header_lines() -> [String; 3] {
    let e = "";
    [
        format!(
            "# {e:>10}  {e:>12}  {e:>8}  {e:>6}  {e:>6}           out-of-place                       in-place"
        ),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  {:>6} {:>6}  algo",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong"
        ),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  {:>6}",
            "(B)", "(elements)", e, e, e, "(us)", "(GB/s)", "(GB/s)", e, "(us)", "(GB/s)", "(GB/s)"
        ),
    ]
}

fn row_line(r: &Row) -> String {
    let group = |t: &Timing| {
        let wrong = t.wrong.map_or_else(|| "N/A".to_owned(), |w| w.to_string());
        format!(
            "  {}  {:6.2}  {:6.2}  {wrong:>5}",
            fmt_time(t.time_us),
            t.algbw,
            t.busbw
        )
    };
    format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}{}{}  {}",
        r.size,
        r.count,
        r.dtype,
        r.redop,
        r.root,
        group(&r.out_of_place),
        group(&r.in_place),
        r.algorithm
    )
}

/// Rank 0's output: the table as it goes, or the JSON document at the end.
pub(super) struct Printer {
    pub(super) json: bool,
}

impl Printer {
    fn line(&self, s: &str) {
        if !self.json {
            println!("{s}");
        }
    }

    pub(super) fn header(&self, comm: &Communicator, plan: &Plan, mode: &str) {
        let r = &plan.req;
        let threads = if mode == "threads" { comm.nranks() } else { 1 };
        self.line(&format!(
            "# symcomm perf {} (nccl-tests columns), symcomm {}",
            r.desc.coll.name(),
            env!("CARGO_PKG_VERSION")
        ));
        self.line(&format!(
            "# nThread {threads} nGpus 1 minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} agg iters: 1 validation: {} graph: 0",
            plan.sweep.min,
            plan.sweep.max,
            plan.sweep.step_text(),
            plan.warmup,
            plan.iters,
            r.check
        ));
        self.line("#");
        self.line("# Using devices");
        for info in comm.table() {
            let host = info.host_id.split('/').next().unwrap_or(&info.host_id);
            self.line(&format!(
                "#  Rank {:2} Group  0 Pid {:6} on {host:>10}",
                info.rank, info.pid
            ));
        }
        let how = if mode == "threads" {
            "threads of one process"
        } else {
            "processes"
        };
        self.line(&format!(
            "# Ranks: {} as {how}; backend: {}; buffers: {}",
            comm.nranks(),
            comm.backend().name(),
            match r.buffers {
                BufferKind::Window => "window (symmetric windows, zero-copy)",
                BufferKind::Device => "device (ordinary device memory, staged copies)",
            }
        ));
        self.line(
            "# algo: the algorithm symcomm's model (or SYMCOMM_ALGO) chose for each size; time: mean over ranks",
        );
        self.line("#");
        for h in header_lines() {
            self.line(h.trim_end());
        }
    }

    pub(super) fn row(&self, r: &Row) {
        self.line(&row_line(r));
    }

    pub(super) fn footer(&self, comm: &Communicator, plan: &Plan, mode: &'static str, s: &Summary) {
        let checked = plan.req.check > 0;
        if self.json {
            let report = JsonReport {
                collective: plan.req.desc.coll.name(),
                nranks: comm.nranks(),
                mode,
                backend: comm.backend().name(),
                buffers: plan.req.buffers.name(),
                dtype: &plan.req.dtype_text,
                op: &plan.req.op_text,
                root: root_column(plan),
                rows: &s.rows,
                avg_busbw: s.avg_busbw(),
                out_of_bounds: s.out_of_bounds(),
                wrong: s.wrong(checked),
                copy_bandwidth_gbps: s.copy_gbps,
            };
            match serde_json::to_string_pretty(&report) {
                Ok(text) => println!("{text}"),
                Err(e) => eprintln!("symcomm perf: JSON output: {e}"),
            }
        } else {
            let oob = s.out_of_bounds();
            self.line(&format!(
                "# Out of bounds values : {oob} {}",
                if oob > 0 { "FAILED" } else { "OK" }
            ));
            self.line(&format!(
                "# Avg bus bandwidth    : {}",
                fmt_g(s.avg_busbw())
            ));
            if let Some(gbps) = s.copy_gbps {
                self.line(&format!(
                    "# Device copy bandwidth: {} GB/s (rank 0, stream-ordered copy of {} bytes)",
                    fmt_g(gbps),
                    plan.sweep.max
                ));
            }
            self.line("#");
        }
        let _ = std::io::stdout().flush();
    }
}

pub(super) fn root_column(plan: &Plan) -> i64 {
    if plan.req.desc.coll.has_root() {
        i64::from(plan.req.root)
    } else {
        -1
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn g_format() {
        assert_eq!(fmt_g(0.0), "0");
        assert_eq!(fmt_g(1.5), "1.5");
        assert_eq!(fmt_g(0.00123456789), "0.00123457");
        assert_eq!(fmt_g(123456.0), "123456");
        assert_eq!(fmt_g(1234567.0), "1.23457e+06");
        assert_eq!(fmt_g(0.00001), "1e-05");
    }
}

//! Results and their printing: the nccl-tests table, or one JSON document.

use std::io::Write as _;

use serde::Serialize;
use symcomm::Communicator;

use super::BufferKind;
use super::plan::{Average, Failure, Plan, Step};

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
    /// Against `NCCL_TESTS_MIN_BW` (absent when it is not set).
    #[serde(skip_serializing_if = "Option::is_none")]
    min_bw_ok: Option<bool>,
}

/// What every rank learns from a run (from the combined figures, so the same on every rank).
#[derive(Debug, Default)]
pub(super) struct Summary {
    /// Every row (none kept when `-N 0` runs until interrupted).
    pub(super) rows: Vec<Row>,
    keep_rows: bool,
    bw_sum: f64,
    bw_count: u64,
    /// Results (row × placement) with wrong elements.
    errors: u32,
    wrong: u64,
    /// This rank's device-to-device copy bandwidth at the largest size, GB/s (`--copy-bandwidth`).
    pub(super) copy_gbps: Option<f64>,
}

impl Summary {
    pub(super) fn new(keep_rows: bool) -> Summary {
        Summary {
            keep_rows,
            ..Summary::default()
        }
    }

    pub(super) fn push(&mut self, row: Row) {
        for t in [&row.out_of_place, &row.in_place] {
            self.bw_sum += t.busbw;
            self.bw_count += 1;
            let w = t.wrong.unwrap_or(0);
            self.wrong += w;
            if w > 0 {
                self.errors += 1;
            }
        }
        if self.keep_rows {
            self.rows.push(row);
        }
    }

    /// The mean busbw over every row, both placements.
    pub(super) fn avg_busbw(&self) -> f64 {
        if self.bw_count == 0 {
            0.0
        } else {
            self.bw_sum / self.bw_count as f64
        }
    }

    /// Results (row × placement) with wrong elements.
    pub(super) fn out_of_bounds(&self) -> u32 {
        self.errors
    }

    fn wrong(&self, checked: bool) -> Option<u64> {
        checked.then_some(self.wrong)
    }

    /// Against `NCCL_TESTS_MIN_BW`: `None` when it is not set, else whether the average bus
    /// bandwidth is at least 0.9 × it (nccl-tests' rule).
    pub(super) fn bandwidth_ok(&self, min_bw: Option<f64>) -> Option<bool> {
        min_bw.map(|m| self.avg_busbw() >= m * 0.9)
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

/// C's `%.{prec}e` (a sign and at least two exponent digits).
fn c_exp(x: f64, prec: usize) -> String {
    let r = format!("{x:.prec$e}");
    let (mant, exp) = r.split_once('e').unwrap_or((&r, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mant}e{sign}{:02}", exp.abs())
}

/// nccl-tests' `getFloatStr`: `value` in `width` characters with 2, 1 or 0 decimals, whichever
/// fits first, else in exponent form.
fn float_str(value: f64, width: usize) -> String {
    for prec in [2, 1, 0] {
        let s = format!("{value:>width$.prec$}");
        if s.len() <= width {
            return s;
        }
    }
    let e = c_exp(value, if width >= 7 { 1 } else { 0 });
    format!("{e:>width$}")
}

/// The three header lines of the table (`cputime` for `-C`; the `algo` column for
/// `--algo-column`).
fn header_lines(cputime: bool, algo: bool) -> [String; 3] {
    let e = "";
    let t = if cputime { "cputime" } else { "time" };
    let algo = if algo { "  algo" } else { "" };
    [
        format!(
            "# {e:>10}  {e:>12}  {e:>8}  {e:>6}  {e:>6}           out-of-place                       in-place"
        ),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {t:>7}  {:>6}  {:>6}  {:>6}  {t:>7}  {:>6}  {:>6}  {:>6}{algo}",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "algbw",
            "busbw",
            "#wrong",
            "algbw",
            "busbw",
            "#wrong"
        ),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}",
            "(B)", "(elements)", e, e, e, "(us)", "(GB/s)", "(GB/s)", e, "(us)", "(GB/s)", "(GB/s)"
        ),
    ]
}

/// One row as nccl-tests prints it (`%6g` for #wrong, `N/A` without checks), plus the
/// algorithm when `algo`.
fn row_line(r: &Row, algo: bool) -> String {
    let group = |t: &Timing| {
        let wrong = t
            .wrong
            .map_or_else(|| "N/A".to_owned(), |w| fmt_g(w as f64));
        format!(
            "  {}  {}  {}  {wrong:>6}",
            float_str(t.time_us, 7),
            float_str(t.algbw, 6),
            float_str(t.busbw, 6)
        )
    };
    let mut line = format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}{}{}",
        r.size,
        r.count,
        r.dtype,
        r.redop,
        r.root,
        group(&r.out_of_place),
        group(&r.in_place),
    );
    if algo {
        line.push_str("  ");
        line.push_str(r.algorithm);
    }
    line
}

/// The current UTC time as nccl-tests' JSON writes its times (`%Y-%m-%d %H:%M:%S`).
fn now_text() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil-from-days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Environment variables the JSON report lists (nccl-tests lists them all): those that steer
/// NCCL, symcomm and CUDA, with the values that carry the rendezvous secret redacted.
fn report_env() -> Vec<String> {
    let mut vars: Vec<String> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            if !["NCCL_", "SYMCOMM_", "CUDA_"]
                .iter()
                .any(|p| k.starts_with(p))
            {
                return None;
            }
            let v = if k == "SYMCOMM_ID" || k == "SYMCOMM_SECRET" {
                "<redacted>".to_owned()
            } else {
                v.to_string_lossy().into_owned()
            };
            Some(format!("{k}={v}"))
        })
        .collect();
    vars.sort();
    vars
}

/// The `-J` file: opened (created, never overwritten) before the run, written at its end.
struct JsonFile {
    file: std::fs::File,
    start_time: String,
}

impl JsonFile {
    /// Creates `path`, or `path.0`, `path.1`, ... when it exists (as nccl-tests does).
    fn create(path: &std::path::Path) -> Result<(JsonFile, std::path::PathBuf), Failure> {
        let mut candidate = path.to_path_buf();
        for i in 0..1000u32 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&candidate)
            {
                Ok(file) => {
                    return Ok((
                        JsonFile {
                            file,
                            start_time: now_text(),
                        },
                        candidate,
                    ));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let mut name = path.as_os_str().to_owned();
                    name.push(format!(".{i}"));
                    candidate = name.into();
                }
                Err(e) => {
                    return Err(Failure::Usage(format!(
                        "-J {}: cannot create the file: {e}",
                        candidate.display()
                    )));
                }
            }
        }
        Err(Failure::Usage(format!(
            "-J {}: the file and its first 1000 numbered variants exist",
            path.display()
        )))
    }
}

/// Rank 0's output: the table as it goes (or the `--json` document at the end), and the `-J`
/// file.
pub(super) struct Printer {
    json: bool,
    algo_column: bool,
    cputime: bool,
    file: Option<(JsonFile, std::path::PathBuf)>,
}

impl Printer {
    /// Rank 0's printer (`None` on the other ranks); creates the `-J` file.
    pub(super) fn new(plan: &Plan, rank0: bool) -> Result<Option<Printer>, Failure> {
        if !rank0 {
            return Ok(None);
        }
        let r = &plan.req;
        let file = r.output_file.as_deref().map(JsonFile::create).transpose()?;
        Ok(Some(Printer {
            json: r.json,
            algo_column: r.algo_column,
            cputime: r.report_cputime,
            file,
        }))
    }

    fn line(&self, s: &str) {
        if !self.json {
            println!("{s}");
        }
    }

    pub(super) fn header(&self, comm: &Communicator, plan: &Plan, mode: &str) {
        let r = &plan.req;
        let threads = if mode == "threads" { comm.nranks() } else { 1 };
        self.line(&format!(
            "# symcomm perf {} (nccl-tests {} columns), symcomm {}",
            r.desc.coll.name(),
            NCCL_TESTS_VERSION,
            env!("CARGO_PKG_VERSION")
        ));
        self.line(&format!(
            "# nThread {threads} nGpus 1 minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} agg iters: {} validation: {} graph: {}",
            plan.sweep.min,
            plan.sweep.max,
            plan.sweep.step_text(),
            plan.warmup,
            plan.iters,
            r.agg_iters,
            r.check,
            r.graph_launches
        ));
        match r.blocking {
            1 => self.line("# Blocking Enabled: wait and barrier after each inner iteration (-m)"),
            2 => self.line("# Blocking Enabled: wait after each inner iteration (-m), no barrier"),
            3 => self.line(
                "# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier",
            ),
            _ => {}
        }
        if let Some((_, path)) = &self.file {
            self.line(&format!("# Writing JSON output to {}", path.display()));
        }
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
            match plan.buffers {
                BufferKind::Window => "window (symmetric windows, zero-copy)",
                BufferKind::Device => "device (ordinary device memory, staged copies)",
            }
        ));
        let average = match r.average {
            Average::Rank0 => "rank 0's",
            Average::Mean => "mean over ranks",
            Average::Min => "minimum over ranks",
            Average::Max => "maximum over ranks",
        };
        let algo = if self.algo_column {
            "algo: the algorithm symcomm's model (or SYMCOMM_ALGO) chose for each size"
        } else {
            "--algo-column shows the algorithm chosen for each size"
        };
        self.line(&format!("# time: {average}; {algo}"));
        self.line("#");
        for h in header_lines(self.cputime, self.algo_column) {
            self.line(h.trim_end());
        }
    }

    pub(super) fn row(&self, r: &Row) {
        self.line(&row_line(r, self.algo_column));
    }

    pub(super) fn footer(
        &mut self,
        comm: &Communicator,
        plan: &Plan,
        mode: &'static str,
        s: &Summary,
    ) -> Result<(), Failure> {
        let checked = plan.req.check > 0;
        let bw_ok = s.bandwidth_ok(plan.req.min_bw);
        if self.json {
            let report = JsonReport {
                collective: plan.req.desc.coll.name(),
                nranks: comm.nranks(),
                mode,
                backend: comm.backend().name(),
                buffers: plan.buffers.name(),
                dtype: &plan.req.dtype_text,
                op: &plan.req.op_text,
                root: if plan.req.desc.coll.has_root() {
                    plan.req.root
                } else {
                    -1
                },
                rows: &s.rows,
                avg_busbw: s.avg_busbw(),
                out_of_bounds: s.out_of_bounds(),
                wrong: s.wrong(checked),
                copy_bandwidth_gbps: s.copy_gbps,
                min_bw_ok: bw_ok,
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
            let verdict = match bw_ok {
                None => "",
                Some(true) => " OK",
                Some(false) => " FAILED",
            };
            self.line(&format!(
                "# Avg bus bandwidth    : {}{verdict}",
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
            self.line(&format!(
                "# Collective test concluded: symcomm perf {}",
                plan.req.desc.coll.name()
            ));
            self.line("#");
        }
        let _ = std::io::stdout().flush();
        if let Some((file, path)) = self.file.take() {
            let doc = nccl_tests_json(comm, plan, mode, s, &file.start_time);
            let mut f = file.file;
            serde_json::to_writer_pretty(&mut f, &doc)
                .map_err(std::io::Error::from)
                .and_then(|()| f.write_all(b"\n"))
                .map_err(|e| {
                    Failure::internal(format!("-J {}: writing the report: {e}", path.display()))
                })?;
        }
        Ok(())
    }
}

/// nccl-tests' version whose columns, options and JSON report `symcomm perf` follows.
const NCCL_TESTS_VERSION: &str = "2.19";

/// nccl-tests' JSON report (version 3 of its format: `config`, `results` with one object per
/// row, `out_of_bounds`, `average_bus_bandwidth`, `errors`).
fn nccl_tests_json(
    comm: &Communicator,
    plan: &Plan,
    mode: &str,
    s: &Summary,
    start_time: &str,
) -> serde_json::Value {
    use serde_json::{Value, json};
    let r = &plan.req;
    let checked = r.check > 0;
    let placement = |t: &Timing| {
        let mut o = serde_json::Map::new();
        let key = if r.report_cputime { "cpu_time" } else { "time" };
        o.insert(key.into(), json!(t.time_us));
        o.insert("alg_bw".into(), json!(t.algbw));
        o.insert("bus_bw".into(), json!(t.busbw));
        o.insert(
            "nwrong".into(),
            if checked {
                json!(t.wrong.unwrap_or(0) as f64)
            } else {
                Value::Null
            },
        );
        Value::Object(o)
    };
    let results: Vec<Value> = s
        .rows
        .iter()
        .map(|row| {
            json!({
                "size": row.size,
                "count": row.count,
                "type": row.dtype,
                "redop": row.redop,
                "root": format!("{:6}", row.root),
                "out_of_place": placement(&row.out_of_place),
                "in_place": placement(&row.in_place),
                "actual_iterations": plan.iters,
                "experiment_name": "",
                "algorithm": row.algorithm,
            })
        })
        .collect();
    let devices: Vec<Value> = comm
        .table()
        .iter()
        .map(|info| {
            json!({
                "rank": info.rank,
                "group": 0,
                "pid": info.pid,
                "hostname": info.host_id.split('/').next().unwrap_or(&info.host_id),
                "device": 0,
                "device_hex": "",
                "device_info": comm.backend().name(),
            })
        })
        .collect();
    let mut config = json!({
        "nthreads": if mode == "threads" { comm.nranks() } else { 1 },
        "ngpus": 1,
        "minimum_bytes": plan.sweep.min,
        "maximum_bytes": plan.sweep.max,
        "warmup_iters": plan.warmup,
        "iterations": plan.iters,
        "aggregated_iterations": r.agg_iters,
        "validation": r.check,
        "graph": r.graph_launches,
        "blocking_collectives": r.blocking > 0,
        "per_iter_timing": false,
        "per_iter_skip": 0,
        "parallel_init": false,
        "devices": devices,
    });
    let step = match plan.sweep.step {
        Step::Factor(f) => ("step_factor", f),
        Step::Bytes(b) => ("step_bytes", b),
    };
    if let Some(o) = config.as_object_mut() {
        o.insert(step.0.into(), json!(step.1));
    }
    let oob = s.out_of_bounds();
    json!({
        "version": 3,
        "start_time": start_time,
        "args": r.argv,
        "env": report_env(),
        "nccl_version": 0,
        "symcomm_version": env!("CARGO_PKG_VERSION"),
        "collective": r.desc.coll.name(),
        "backend": comm.backend().name(),
        "config": config,
        "results": results,
        "out_of_bounds": {"count": oob, "okay": oob == 0},
        "average_bus_bandwidth": {
            "bandwidth": s.avg_busbw(),
            "okay": s.bandwidth_ok(r.min_bw).map_or(json!("unchecked"), |ok| json!(ok)),
        },
        "errors": [],
        "end_time": now_text(),
    })
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

    /// nccl-tests' getFloatStr: 2, 1 or 0 decimals, whichever fits, then exponent form.
    #[test]
    fn float_columns() {
        assert_eq!(float_str(12.345, 7), "  12.35");
        assert_eq!(float_str(12345.6, 7), "12345.6");
        assert_eq!(float_str(1234567.0, 7), "1234567");
        assert_eq!(float_str(123456789.0, 7), "1.2e+08");
        assert_eq!(float_str(1234.5, 6), "1234.5");
        assert_eq!(float_str(9999999.0, 6), " 1e+07");
    }
}

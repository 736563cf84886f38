//! The collective matrix: one report line per (kind, dtype).

use super::*;

/// Element types of the reductions, and of the copy collectives.
pub(crate) fn reduction_dtypes() -> [DType; 4] {
    ["f32", "bf16", "u8", "fp8_e4m3"].map(dtype)
}

pub(crate) fn copy_dtypes() -> [DType; 3] {
    ["f32", "bf16", "u8"].map(dtype)
}

pub(crate) struct MatrixConfig {
    pub(crate) nranks: Vec<u32>,
    /// Small, middle, large; the misaligned cases use the middle and the large one.
    pub(crate) counts: [u64; 3],
    /// CTAs x threads per rank at grid scope, and at CTA scope.
    pub(crate) grid: (u32, u32),
    pub(crate) cta: (u32, u32),
    /// Device-side deadline of every wait.
    pub(crate) timeout: Duration,
    /// Wall time for the whole matrix; groups not started by then fail as not run.
    pub(crate) budget: Duration,
}

/// Cases that stalled (timeouts, aborts, hangs: each costs a deadline) after which the rest of a
/// group, and the rest of the matrix, are skipped, so that a systematic hang cannot use up the
/// time limit of the whole run.
pub(crate) const MAX_STALLED_PER_GROUP: u32 = 2;
pub(crate) const MAX_STALLED: u32 = 8;

pub(crate) struct Group {
    pub(crate) kind: u32,
    pub(crate) dt: DType,
    pub(crate) cases: Vec<Case>,
}

/// Every kind x dtype, each with: rank counts x ops (reductions) x {out of place, in place} x
/// {grid, CTA scope} x counts, aligned, plus two misaligned cases (out of place at grid scope
/// with different input and output phases, in place at CTA scope); roots rotate.
pub(crate) fn matrix_groups(cfg: &MatrixConfig) -> Vec<Group> {
    let mut groups = Vec::new();
    for kind in KINDS {
        let (dtypes, ops): (Vec<DType>, &[u32]) = if is_reduction(kind) {
            (
                reduction_dtypes().to_vec(),
                &[SYMCOMM_REDOP_SUM, SYMCOMM_REDOP_MAX],
            )
        } else {
            (copy_dtypes().to_vec(), &[0])
        };
        for &dt in &dtypes {
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
pub(crate) fn matrix_capacity(groups: &[Group], nranks: u32) -> u64 {
    groups
        .iter()
        .flat_map(|g| g.cases.iter())
        .filter(|c| c.nranks == nranks)
        .map(Case::window_bytes)
        .max()
        .unwrap_or(ALIGN)
}

/// Runs every group on the team of its rank count; one report line per group.
pub(crate) fn run_matrix<R: Ranks>(
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

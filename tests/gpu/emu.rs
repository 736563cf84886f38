//! The same collective checks on the emulator (`--emu`).

use super::*;

/// `full`: the GPU's matrix (counts up to 65537, 256 threads); else smaller counts and blocks.
pub(crate) fn emu_checks(
    report: &mut Report,
    summary: &mut serde_json::Map<String, Value>,
    full: bool,
) {
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
                (SYMCOMM_COLL_ALL_REDUCE_LL, "all_reduce_ll"),
            ] {
                let outcome = perf_sweep(&mut team, kind, &pcfg, key);
                record_figures(report, &mut figures, &format!("perf_{key}"), key, outcome);
            }
            let outcome = launch_floor(&mut team, &pcfg);
            record_figures(
                report,
                &mut figures,
                "perf_launch_floor",
                "launch_floor",
                outcome,
            );
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
    // Fused all-reduce + RMSNorm against the unfused pair, small rows (kernels on CPU threads).
    let fcfg = FusedConfig {
        nranks: 2,
        hidden: 1024,
        tokens: vec![1, 4],
        warmup: 1,
        iters: 2,
    };
    record_fused(report, &mut figures, symcomm::Device::Emu, &fcfg);
    // The GPU run's ratios, at the emulator's sizes (its largest, 32 KB, for the bandwidth).
    let outcome = goal_ratios(&figures, 8 << 10, max_bytes, "copy_kernel");
    record_figures(
        report,
        &mut figures,
        "perf_goal_ratios",
        "goal_ratios",
        outcome,
    );
    summary.insert("figures".into(), Value::Object(figures));
}

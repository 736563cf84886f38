//! The collective checks and figures on the GPU.

use super::*;

/// The built-in collective kernels of every dtype checked, from the fatbin (or NVRTC).
pub(crate) fn collective_kernel_names() -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for dt in reduction_dtypes().iter().chain(copy_dtypes().iter()) {
        let name = format!("symcomm_collective_{}", dt.name);
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// The collective checks on the GPU: every kind x dtype x op x placement x scope x count, 2 and 4
/// ranks; 2 s device deadlines, at most 80 s in all.
pub(crate) fn gpu_matrix_config() -> MatrixConfig {
    MatrixConfig {
        nranks: vec![2, 4],
        counts: [1, 1023, 65537],
        grid: (4, 256),
        cta: (2, 256),
        timeout: Duration::from_secs(2),
        budget: Duration::from_secs(80),
    }
}

pub(crate) fn collective_checks_gpu(
    report: &mut Report,
    summary: &mut serde_json::Map<String, Value>,
    dev: &CudaDevice,
) {
    // One module per source file (collective_f32.cu, collective_u8.cu, ...: one per element type).
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
                (SYMCOMM_COLL_ALL_REDUCE_LL, "all_reduce_ll"),
            ] {
                // LL is for small messages (twice the bytes, rounds of 2 KB per CTA): up to 4 MB.
                let ll_cfg = PerfConfig {
                    sizes: pcfg
                        .sizes
                        .iter()
                        .copied()
                        .filter(|&s| s <= 4 << 20)
                        .collect(),
                    ..pcfg.clone()
                };
                let cfg = if kind == SYMCOMM_COLL_ALL_REDUCE_LL {
                    &ll_cfg
                } else {
                    &pcfg
                };
                let outcome = perf_sweep(&mut team, kind, cfg, key);
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
    // Fused all-reduce + residual + RMSNorm against the unfused pair: decode shapes, 4 ranks.
    let fcfg = FusedConfig {
        nranks,
        hidden: 8192,
        tokens: vec![1, 2, 4, 8, 16, 32, 64, 128],
        warmup: 5,
        iters: 20,
    };
    record_fused(report, &mut figures, symcomm::Device::Cuda(0), &fcfg);
    let outcome = goal_ratios(&figures, 8 << 10, 256 << 20, "memcpy_dtod");
    record_figures(
        report,
        &mut figures,
        "perf_goal_ratios",
        "goal_ratios",
        outcome,
    );
    summary.insert("figures".into(), Value::Object(figures));
}

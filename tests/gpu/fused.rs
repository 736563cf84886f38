//! The fused all-reduce + residual + RMSNorm kernel against the unfused pair, through the
//! library's communicator (ranks as threads, one stream each): decode shapes, bf16.
//!
//! Fused: `symcomm_allreduce_residual_rmsnorm_bf16` on the partial outputs' window. Unfused: the
//! host all-reduce (`Communicator::all_reduce`, the algorithm the model picks) of that window into
//! another one, then `symcomm_residual_rmsnorm_bf16` on the sum (the same norm code, no peer
//! access), both on the same stream. Inputs are exact (sums of small multiples of 1/2 in bf16), so
//! the two must agree bit for bit (`#wrong` counts differing elements of `out` and
//! `residual_out`), and `residual_out` must equal the sum plus the residual computed here.
//!
//! Two block sizes, both kernels at each: `hidden / 16` threads (16 elements per thread, two
//! 16-byte packs in bf16: the fewest the kernel takes) and one pack per thread (`hidden / 8`, at
//! most 1024): a thread then loads its row in one memory round trip instead of two, at the cost of
//! fewer CTAs resident per SM (the grid's cap, `co_resident_share`, is per block size).

use super::*;
use support::rmsnorm::AllReduceRmsNormArgs;
use symcomm::{DataType, KernelArgs, LaunchConfig, RedOp};

pub(crate) struct FusedConfig {
    pub(crate) nranks: u32,
    pub(crate) hidden: u32,
    pub(crate) tokens: Vec<u32>,
    pub(crate) warmup: u32,
    pub(crate) iters: u32,
}

/// bf16 bits of `v`, which must be exact in bf16 (the inputs here are).
fn bf16(v: f32) -> u16 {
    (v.to_bits() >> 16) as u16
}

fn partial_val(rank: u32, e: u64) -> f32 {
    ((u64::from(rank) * 7 + e * 3) % 9) as f32 * 0.5 - 2.0
}

fn residual_val(e: u64) -> f32 {
    ((e * 5 + 3) % 17) as f32 * 0.25 - 2.0
}

fn gamma_val(i: u64) -> f32 {
    ((i * 7 + 1) % 23 + 1) as f32 * 0.0625
}

/// One rank's figures for one token count and block size.
struct RankRow {
    fused_us: f64,
    unfused_us: f64,
    grid: u32,
    wrong: u64,
}

/// The block sizes compared for rows of `h` bf16 elements: 16 elements per thread and one 16-byte
/// pack (8 elements) per thread, in whole warps, at most 1024 threads (the same size once only).
fn block_sizes(h: u32) -> Vec<u32> {
    let warps = |per_thread: u32| (h.div_ceil(per_thread).div_ceil(32).max(1) * 32).min(1024);
    let mut v = vec![warps(16), warps(8)];
    v.dedup();
    v
}

/// Times `calls` (one round of launches): `warmup` rounds, a host barrier, then `iters` rounds
/// between the host clock's reads and a synchronize; the time per round.
fn time_rounds(
    comm: &symcomm::Communicator,
    stream: &symcomm::Stream,
    cfg: &FusedConfig,
    round: &dyn Fn() -> Result<(), String>,
) -> Result<f64, String> {
    for _ in 0..cfg.warmup {
        round()?;
    }
    stream.synchronize().map_err(err)?;
    comm.barrier().map_err(err)?;
    let t0 = Instant::now();
    for _ in 0..cfg.iters {
        round()?;
    }
    stream.synchronize().map_err(err)?;
    Ok(t0.elapsed().as_secs_f64() * 1e6 / f64::from(cfg.iters.max(1)))
}

/// Fused against unfused at every token count of `cfg`; one row each (slowest rank's times).
pub(crate) fn fused_vs_unfused(device: symcomm::Device, cfg: &FusedConfig) -> Outcome {
    let h = cfg.hidden;
    let max_tokens = cfg.tokens.iter().copied().max().unwrap_or(1);
    let elems = max_tokens as usize * h as usize;
    let blocks = block_sizes(h);
    let per_rank: Vec<Vec<Vec<RankRow>>> = comm_threads(device, cfg.nranks, |comm| {
        let r = comm.rank();
        let stream = comm.create_stream().map_err(err)?;
        let partial = comm.alloc_window::<u16>(elems).map_err(err)?;
        let sum = comm.alloc_window::<u16>(elems).map_err(err)?;
        let buf = || comm.alloc_buffer(elems * 2).map_err(err);
        let (residual, res_f, out_f, res_u, out_u) = (buf()?, buf()?, buf()?, buf()?, buf()?);
        let gamma = comm.alloc_buffer(h as usize * 2).map_err(err)?;
        let bits = |f: &dyn Fn(u64) -> f32, n: usize| -> Vec<u16> {
            (0..n as u64).map(|e| bf16(f(e))).collect()
        };
        partial
            .write(0, &bits(&|e| partial_val(r, e), elems))
            .map_err(err)?;
        residual
            .write(0, &bits(&residual_val, elems))
            .map_err(err)?;
        gamma.write(0, &bits(&gamma_val, h as usize)).map_err(err)?;
        let fused = comm
            .load_kernel(&DEVICE_IMAGE, "symcomm_allreduce_residual_rmsnorm_bf16")
            .map_err(err)?;
        let norm = comm
            .load_kernel(&DEVICE_IMAGE, "symcomm_residual_rmsnorm_bf16")
            .map_err(err)?;
        let dev_comm = comm.device_handle().map_err(err)?;
        comm.barrier().map_err(err)?;
        let mut rows = Vec::new();
        for &tokens in &cfg.tokens {
            let mut per_block = Vec::new();
            for &threads in &blocks {
                // Every rank's CTAs must be resident at once (the fused kernel's barriers pair CTA b
                // of every rank): at most this rank's share of the GPU, within the user barrier slots.
                let share = comm.co_resident_share(&fused, threads, 0).map_err(err)?;
                let grid = tokens.clamp(
                    1,
                    share.min(SYMCOMM_USER_BARRIER_END - SYMCOMM_USER_BARRIER_FIRST),
                );
                let args = |window: WindowHandleRaw, res_out: u64, out: u64| AllReduceRmsNormArgs {
                    partial: window,
                    partial_offset: 0,
                    residual: residual.addr(),
                    residual_out: res_out,
                    out,
                    gamma: gamma.addr(),
                    tokens,
                    hidden: h,
                    eps: 1e-5,
                    first_slot: SYMCOMM_USER_BARRIER_FIRST,
                };
                let fused_args = KernelArgs::new().arg(&dev_comm).arg(&args(
                    partial.device_handle().raw(),
                    res_f.addr(),
                    out_f.addr(),
                ));
                let norm_args = KernelArgs::new().arg(&dev_comm).arg(&args(
                    sum.device_handle().raw(),
                    res_u.addr(),
                    out_u.addr(),
                ));
                let launch = LaunchConfig::linear(grid, threads).co_resident();
                let count = tokens as usize * h as usize;
                let fused_round = || {
                    // SAFETY: (DevComm, AllReduceRmsNormArgs<bf16>) by value, as the kernel takes
                    // them; every buffer and window outlives the synchronize in `time_rounds`.
                    unsafe { comm.launch(&stream, &fused, launch, &fused_args) }.map_err(err)
                };
                let unfused_round = || {
                    comm.all_reduce(&partial, &sum, count, DataType::Bf16, RedOp::Sum, &stream)
                        .map_err(err)?;
                    // SAFETY: as above; the norm half needs no co-residency (no barrier).
                    unsafe {
                        comm.launch(
                            &stream,
                            &norm,
                            LaunchConfig::linear(grid, threads),
                            &norm_args,
                        )
                    }
                    .map_err(err)
                };
                let fused_us = time_rounds(comm, &stream, cfg, &fused_round)?;
                let unfused_us = time_rounds(comm, &stream, cfg, &unfused_round)?;
                comm.check_error().map_err(err)?;
                // Both outputs bit for bit, and residual_out = sum + residual exactly.
                let read = |b: &symcomm::Buffer| -> Result<Vec<u16>, String> {
                    let mut v = vec![0u16; count];
                    b.read(0, &mut v).map_err(err)?;
                    Ok(v)
                };
                let (rf, of, ru, ou) = (read(&res_f)?, read(&out_f)?, read(&res_u)?, read(&out_u)?);
                let mut wrong = 0u64;
                for e in 0..count {
                    let x: f32 = (0..cfg.nranks).map(|p| partial_val(p, e as u64)).sum();
                    let want = bf16(x + residual_val(e as u64));
                    wrong += u64::from(rf[e] != want)
                        + u64::from(ru[e] != rf[e])
                        + u64::from(ou[e] != of[e]);
                }
                per_block.push(RankRow {
                    fused_us,
                    unfused_us,
                    grid,
                    wrong,
                });
            }
            rows.push(per_block);
        }
        Ok(rows)
    })?;

    let blocks_text: Vec<String> = blocks.iter().map(u32::to_string).collect();
    println!(
        "# fused all-reduce + residual + RMSNorm (bf16, hidden {h}, {} ranks as threads, blocks {}) \
         against the host all-reduce + symcomm_residual_rmsnorm_bf16; {} warm-up + {} timed rounds, slowest rank; \
         fused/unfused: each at its faster block",
        cfg.nranks,
        blocks_text.join(" and "),
        cfg.warmup,
        cfg.iters
    );
    println!(
        "# {:>7} {:>6} {:>5} {:>11} {:>11} {:>14} {:>7}",
        "tokens", "block", "grid", "fused(us)", "unfused(us)", "fused/unfused", "#wrong"
    );
    let mut rows = Vec::new();
    let mut total_wrong = 0;
    for (k, &tokens) in cfg.tokens.iter().enumerate() {
        let mut best = (f64::INFINITY, f64::INFINITY);
        let mut per_block = Vec::new();
        for (b, &threads) in blocks.iter().enumerate() {
            let at = |f: &dyn Fn(&RankRow) -> f64| {
                per_rank
                    .iter()
                    .map(|rows| f(&rows[k][b]))
                    .fold(0f64, f64::max)
            };
            let (fused_us, unfused_us) = (at(&|r| r.fused_us), at(&|r| r.unfused_us));
            let wrong: u64 = per_rank.iter().map(|rows| rows[k][b].wrong).sum();
            let grid = per_rank[0][k][b].grid;
            total_wrong += wrong;
            best = (best.0.min(fused_us), best.1.min(unfused_us));
            println!(
                "  {tokens:>7} {threads:>6} {grid:>5} {fused_us:>11.2} {unfused_us:>11.2} {:>14.3} {wrong:>7}",
                fused_us / unfused_us
            );
            per_block.push(json!({
                "threads": threads, "grid": grid, "fused_us": fused_us, "unfused_us": unfused_us,
                "wrong": wrong,
            }));
        }
        let ratio = best.0 / best.1;
        println!(
            "  {tokens:>7} {:>6} {:>5} {:>11.2} {:>11.2} {ratio:>14.3}",
            "best", "", best.0, best.1
        );
        rows.push(json!({
            "tokens": tokens, "fused_us": best.0, "unfused_us": best.1,
            "fused_over_unfused": ratio, "blocks": per_block,
        }));
    }
    let ratios: Vec<f64> = rows
        .iter()
        .filter_map(|r| r["fused_over_unfused"].as_f64())
        .collect();
    let gmean = (ratios.iter().map(|x| x.ln()).sum::<f64>() / ratios.len().max(1) as f64).exp();
    let detail = format!(
        "{} ranks, hidden {h}, tokens {:?}: fused / unfused {gmean:.3} (geometric mean), #wrong={total_wrong}",
        cfg.nranks, cfg.tokens
    );
    let figures = json!({
        "nranks": cfg.nranks, "hidden": h, "threads": blocks, "warmup": cfg.warmup,
        "iters": cfg.iters, "fused_over_unfused_gmean": gmean, "rows": rows,
    });
    if total_wrong == 0 {
        Ok((detail, figures))
    } else {
        Err(detail)
    }
}

/// [`fused_vs_unfused`], recorded as `perf_fused_rmsnorm` with its figures under `fused_rmsnorm`.
pub(crate) fn record_fused(
    report: &mut Report,
    figures: &mut serde_json::Map<String, Value>,
    device: symcomm::Device,
    cfg: &FusedConfig,
) {
    let outcome = fused_vs_unfused(device, cfg);
    record_figures(
        report,
        figures,
        "perf_fused_rmsnorm",
        "fused_rmsnorm",
        outcome,
    );
}

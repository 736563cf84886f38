//! Figures: all-reduce bandwidth sweeps (nccl-tests style) and the copy bandwidth references.

use super::*;

#[derive(Clone)]
pub(crate) struct PerfConfig {
    /// Message sizes in bytes (f32 elements: multiples of 4).
    pub(crate) sizes: Vec<u64>,
    pub(crate) warmup: u32,
    pub(crate) iters: u32,
    pub(crate) ctas: u32,
    pub(crate) threads: u32,
    pub(crate) timeout: Duration,
}

/// Runs `warmup` calls, then times `iters` back-to-back calls (host clock around the enqueue and
/// the wait); returns the time per call.
pub(crate) fn time_calls<R: Ranks>(
    team: &mut R,
    kernel: &str,
    calls: &[(DevComm, CollArgs)],
    cfg: &PerfConfig,
) -> Result<Duration, String> {
    team.launch(kernel, cfg.ctas, cfg.threads, calls, cfg.warmup, true)?;
    let t0 = Instant::now();
    team.launch(kernel, cfg.ctas, cfg.threads, calls, cfg.iters, true)?;
    Ok(t0.elapsed() / cfg.iters.max(1))
}

/// Grid-scope f32 calls of `kind` on every rank: `count` elements from window 0 to window 1.
pub(crate) fn perf_calls<R: Ranks>(
    team: &mut R,
    kind: u32,
    count: u64,
    timeout: Duration,
) -> Vec<(DevComm, CollArgs)> {
    (0..team.nranks())
        .map(|r| {
            let comm = team.comm(r, timeout.as_nanos() as u64);
            let args = CollArgs {
                kind,
                dtype: SYMCOMM_DTYPE_F32,
                redop: SYMCOMM_REDOP_SUM,
                root: 0,
                scope: SYMCOMM_SCOPE_GRID,
                index: 0,
                count,
                src_offset: 0,
                dst_offset: 0,
                tile_stride: 0,
                src: team.window(0, r),
                dst: team.window(1, r),
                ..Default::default()
            };
            (comm, args)
        })
        .collect()
}

pub(crate) fn fmt_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KB", b >> 10),
        b => format!("{b} B"),
    }
}

/// The all-reduce `kind` (f32 sum, out of place) at every size of `cfg`, one nccl-tests row per
/// size: the result of the last timed call is checked bit for bit (`#wrong`).
pub(crate) fn perf_sweep<R: Ranks>(
    team: &mut R,
    kind: u32,
    cfg: &PerfConfig,
    label: &str,
) -> Outcome {
    let n = team.nranks();
    let max_count = cfg.sizes.iter().copied().max().unwrap_or(0) / 4;
    if max_count * 4 > team.capacity() {
        return Err(format!(
            "{} B per rank needed, the team has {}",
            max_count * 4,
            team.capacity()
        ));
    }
    // Inputs 1..=4 (sums never 0, so the zeroed output before each size catches missing
    // writes); exact in f32.
    const SALT: u64 = 0xba5e;
    let value = |r: u32, i: u64| 1 + (hash(r, i, SALT) % 4) as u32;
    let mut img = vec![0u8; (max_count * 4) as usize];
    for r in 0..n {
        for (i, chunk) in img.chunks_exact_mut(4).enumerate() {
            chunk.copy_from_slice(&(value(r, i as u64) as f32).to_bits().to_le_bytes());
        }
        team.write(0, r, &img)?;
    }
    let expected: Vec<u32> = (0..max_count)
        .map(|i| ((0..n).map(|r| value(r, i)).sum::<u32>() as f32).to_bits())
        .collect();
    let kernel = "symcomm_collective_f32";
    let busbw_factor = 2.0 * f64::from(n - 1) / f64::from(n);
    println!(
        "# {label}: {} ranks as streams, grid {} x {} per rank, {} warm-up + {} timed calls per size, out of place",
        n, cfg.ctas, cfg.threads, cfg.warmup, cfg.iters
    );
    println!(
        "# {:>12} {:>12} {:>8} {:>6} {:>10} {:>8} {:>8} {:>7}",
        "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"
    );
    println!(
        "# {:>12} {:>12} {:>8} {:>6} {:>10} {:>8} {:>8} {:>7}",
        "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", ""
    );
    let mut rows = Vec::new();
    let mut total_wrong = 0u64;
    let mut got = vec![0u8; (max_count * 4) as usize];
    for &size in &cfg.sizes {
        let count = size / 4;
        team.zero(1)?;
        let calls = perf_calls(team, kind, count, cfg.timeout);
        let t = match time_calls(team, kernel, &calls, cfg) {
            Ok(t) => t,
            Err(e) => {
                let _ = team.reset();
                return Err(format!("at {size} B: {e}"));
            }
        };
        let errors: Vec<String> = team
            .errors()?
            .iter()
            .enumerate()
            .filter(|(_, e)| e.status != SYMCOMM_STATUS_OK)
            .map(|(r, e)| format!("rank {r}: {} op {}", status_name(e.status), e.op))
            .collect();
        if !errors.is_empty() {
            let _ = team.reset();
            return Err(format!("at {size} B: {}", errors.join(", ")));
        }
        let mut wrong = 0u64;
        for r in 0..n {
            let out = &mut got[..(count * 4) as usize];
            team.read(1, r, out)?;
            wrong += out
                .chunks_exact(4)
                .zip(&expected)
                .filter(|(g, w)| u32::from_le_bytes([g[0], g[1], g[2], g[3]]) != **w)
                .count() as u64;
        }
        total_wrong += wrong;
        let secs = t.as_secs_f64();
        let algbw = size as f64 / secs / 1e9;
        let busbw = algbw * busbw_factor;
        println!(
            "  {size:>12} {count:>12} {:>8} {:>6} {:>10.2} {algbw:>8.2} {busbw:>8.2} {wrong:>7}",
            "float",
            "sum",
            secs * 1e6
        );
        rows.push(json!({
            "size": size, "count": count, "type": "float", "redop": "sum",
            "time_us": secs * 1e6, "algbw_gbps": algbw, "busbw_gbps": busbw, "wrong": wrong,
        }));
    }
    let first = rows.first().cloned().unwrap_or(Value::Null);
    let peak = rows
        .iter()
        .max_by(|a, b| {
            let (x, y) = (a["busbw_gbps"].as_f64(), b["busbw_gbps"].as_f64());
            x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal)
        })
        .cloned()
        .unwrap_or(Value::Null);
    let detail = format!(
        "{n} ranks, {} sizes {}..{}: {} in {:.2} us, peak busbw {:.2} GB/s at {}, #wrong={total_wrong}",
        rows.len(),
        fmt_bytes(cfg.sizes.first().copied().unwrap_or(0)),
        fmt_bytes(cfg.sizes.last().copied().unwrap_or(0)),
        fmt_bytes(first["size"].as_u64().unwrap_or(0)),
        first["time_us"].as_f64().unwrap_or(0.0),
        peak["busbw_gbps"].as_f64().unwrap_or(0.0),
        fmt_bytes(peak["size"].as_u64().unwrap_or(0)),
    );
    let figures = json!({
        "nranks": n, "ctas": cfg.ctas, "threads": cfg.threads, "warmup": cfg.warmup,
        "iters": cfg.iters, "busbw_factor": busbw_factor, "rows": rows,
    });
    if total_wrong == 0 {
        Ok((detail, figures))
    } else {
        Err(detail)
    }
}

/// The library's own copy loop as a bandwidth reference: a 1-rank broadcast of `bytes` (f32).
pub(crate) fn copy_kernel_bandwidth<R: Ranks>(
    team: &mut R,
    bytes: u64,
    cfg: &PerfConfig,
) -> Outcome {
    let calls = perf_calls(team, SYMCOMM_COLL_BROADCAST, bytes / 4, cfg.timeout);
    let t = time_calls(team, "symcomm_collective_f32", &calls, cfg)?;
    let errors = team.errors()?;
    if let Some(e) = errors.iter().find(|e| e.status != SYMCOMM_STATUS_OK) {
        return Err(format!("{} op {}", status_name(e.status), e.op));
    }
    let gbps = bytes as f64 / t.as_secs_f64() / 1e9;
    println!(
        "# reference: copy kernel (1-rank broadcast, grid {} x {}) of {}: {:.2} us, {gbps:.2} GB/s copied (memory traffic twice that)",
        cfg.ctas,
        cfg.threads,
        fmt_bytes(bytes),
        t.as_secs_f64() * 1e6
    );
    Ok((
        format!(
            "1-rank broadcast of {} in {:.2} us: {gbps:.2} GB/s",
            fmt_bytes(bytes),
            t.as_secs_f64() * 1e6
        ),
        json!({"bytes": bytes, "time_us": t.as_secs_f64() * 1e6, "gbps": gbps,
               "ctas": cfg.ctas, "threads": cfg.threads}),
    ))
}

/// Device-to-device copy bandwidth of the driver (`cuMemcpyDtoDAsync`) between two windows of a
/// 1-rank team, `warmup` + `iters` copies back to back on one stream.
pub(crate) fn memcpy_bandwidth(team: &GpuRanks<'_>, bytes: u64, cfg: &PerfConfig) -> Outcome {
    let (src, dst) = (&team.team.windows[0].buf, &team.team.windows[1].buf);
    let stream = &team.streams[0];
    let copies = |k: u32| -> Result<(), String> {
        for _ in 0..k {
            // SAFETY: both buffers belong to `team`, which outlives the synchronize below; no
            // kernel runs on them meanwhile.
            unsafe { stream.copy_device(dst, 0, src, 0, bytes as usize) }.map_err(err)?;
        }
        stream.synchronize().map_err(err)
    };
    copies(cfg.warmup)?;
    let t0 = Instant::now();
    copies(cfg.iters)?;
    let t = t0.elapsed() / cfg.iters.max(1);
    let gbps = bytes as f64 / t.as_secs_f64() / 1e9;
    println!(
        "# reference: cuMemcpyDtoDAsync of {}: {:.2} us, {gbps:.2} GB/s copied (memory traffic twice that)",
        fmt_bytes(bytes),
        t.as_secs_f64() * 1e6
    );
    Ok((
        format!(
            "cuMemcpyDtoDAsync of {} in {:.2} us: {gbps:.2} GB/s",
            fmt_bytes(bytes),
            t.as_secs_f64() * 1e6
        ),
        json!({"bytes": bytes, "time_us": t.as_secs_f64() * 1e6, "gbps": gbps}),
    ))
}

/// Records `outcome` and keeps its figures under `figures[key]`.
pub(crate) fn record_figures(
    report: &mut Report,
    figures: &mut serde_json::Map<String, Value>,
    name: &str,
    key: &str,
    outcome: Outcome,
) {
    if let Ok((_, f)) = &outcome {
        figures.insert(key.into(), f.clone());
    }
    report.record(name, outcome);
}

/// The floor the latency goals are measured against: the collective kernel launched on every
/// rank with nothing to move (an LL all-reduce of 0 elements: the entry checks and one CTA sync),
/// timed as the sweeps are.
pub(crate) fn launch_floor<R: Ranks>(team: &mut R, cfg: &PerfConfig) -> Outcome {
    let calls = perf_calls(team, SYMCOMM_COLL_ALL_REDUCE_LL, 0, cfg.timeout);
    let t = time_calls(team, "symcomm_collective_f32", &calls, cfg)?;
    if let Some(e) = team
        .errors()?
        .iter()
        .find(|e| e.status != SYMCOMM_STATUS_OK)
    {
        return Err(format!("{} op {}", status_name(e.status), e.op));
    }
    let us = t.as_secs_f64() * 1e6;
    println!(
        "# floor: an empty collective launch ({} ranks, grid {} x {}): {us:.2} us",
        team.nranks(),
        cfg.ctas,
        cfg.threads
    );
    Ok((
        format!("empty collective launch: {us:.2} us"),
        json!({"time_us": us, "nranks": team.nranks()}),
    ))
}

/// The goals' ratios from the figures of one run: the `small`-byte all-reduce time over the empty
/// launch (LL and one-shot), and the `large`-byte two-shot bus bandwidth over the copy bandwidth
/// of `figures[copy]` (on a GPU: 8 KB, 256 MB and the driver's device-to-device copy). Err names
/// the figures that are missing.
pub(crate) fn goal_ratios(
    figures: &serde_json::Map<String, Value>,
    small: u64,
    large: u64,
    copy: &str,
) -> Outcome {
    let row = |key: &str, size: u64| -> Option<&Value> {
        figures.get(key)?["rows"]
            .as_array()?
            .iter()
            .find(|r| r["size"].as_u64() == Some(size))
    };
    let num = |v: Option<&Value>, field: &str| v.and_then(|v| v[field].as_f64());
    let floor = num(figures.get("launch_floor"), "time_us");
    let (what, copy) = (copy, num(figures.get(copy), "gbps"));
    let ll = num(row("all_reduce_ll", small), "time_us");
    let one = num(row("all_reduce_one_shot", small), "time_us");
    let two = num(row("all_reduce_two_shot", large), "busbw_gbps");
    let two_algbw = num(row("all_reduce_two_shot", large), "algbw_gbps");
    let two_ranks = num(figures.get("all_reduce_two_shot"), "nranks");
    let (Some(floor), Some(copy), Some(ll), Some(one), Some(two), Some(two_algbw), Some(n)) =
        (floor, copy, ll, one, two, two_algbw, two_ranks)
    else {
        return Err(format!(
            "figures missing: floor {floor:?}, {what} {copy:?}, ll {small} B {ll:?}, one-shot \
             {small} B {one:?}, two-shot {large} B {two:?}"
        ));
    };
    let r = json!({
        "small_bytes": small, "large_bytes": large, "copy": what,
        "ll_small_over_floor": ll / floor,
        "one_shot_small_over_floor": one / floor,
        "ll_small_minus_floor_us": ll - floor,
        "two_shot_large_busbw_over_copy": two / copy,
        // The measure: bytes the push two-shot moves through memory per second (each
        // of the n ranks on the GPU reads its share of n inputs and writes it to n outputs: 2 S)
        // over the copy's (reads plus writes: 2 bytes per byte copied).
        "two_shot_large_moved_over_copy": n * two_algbw / copy,
    });
    println!(
        "# goals: {} all-reduce LL {ll:.2} us = floor + {:.2} us ({:.2}x), one-shot {one:.2} us \
         ({:.2}x); {} two-shot busbw {two:.2} GB/s = {:.2} of {what}'s {copy:.2} GB/s, bytes \
         moved {:.2} of the copy's",
        fmt_bytes(small),
        ll - floor,
        ll / floor,
        one / floor,
        fmt_bytes(large),
        two / copy,
        n * two_algbw / copy
    );
    Ok((format!("{r}"), r))
}

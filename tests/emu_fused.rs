//! The fused all-reduce + residual add + RMSNorm kernels (`device/kernels/fused_allreduce_rmsnorm.cu`)
//! on the emulator, against an unfused reference computed here: the sum over ranks in f32 in rank
//! order, the residual add, RMSNorm in f32 with the kernel's formula, bf16 rounded to nearest even.
//!
//! Inputs are nccl-tests style (small multiples of 1/2 and 1/4), so the all-reduce, the residual
//! add and even the sum of squares are exact: `residual_out` must match bit for bit, and `out`
//! within one bf16 ulp / 1e-5 relative (rsqrt is an approximation on GPUs). Every case prints
//! #wrong (outside the tolerance) and #inexact (bits differ, within it).
//!
//! The unfused pair (the built-in all-reduce, then `symcomm_residual_rmsnorm_<T>` on its output
//! window) gives the fused kernel's outputs bit for bit.
//!
//! Covered: ranks 1, 2, 3, 4; hidden 4096 and 8192 (and small rows that exercise the per-thread
//! pack loop); tokens 1, 7, 64, 200 with fewer CTAs than rows and one CTA per row; bf16 and f32;
//! residual in place and not; back-to-back launches on one team whose ranks rewrite their partial
//! outputs without any host synchronization between ranks (the closing barrier must protect
//! them); a missing rank (Timeout), ranks disagreeing on the shape (Mismatch), and refused
//! arguments (InvalidArgument).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::c_void;
use std::time::Instant;

use support::rmsnorm::AllReduceRmsNormArgs;
use symcomm::DEVICE_IMAGE;
use symcomm::abi::{
    CollArgs, DevComm, SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT, SYMCOMM_DTYPE_BF16, SYMCOMM_DTYPE_F16,
    SYMCOMM_DTYPE_F32, SYMCOMM_OP_BARRIER, SYMCOMM_OP_COLLECTIVE, SYMCOMM_REDOP_SUM,
    SYMCOMM_SCOPE_GRID, SYMCOMM_STATUS_INVALID_ARGUMENT, SYMCOMM_STATUS_MISMATCH,
    SYMCOMM_STATUS_OK, SYMCOMM_STATUS_TIMEOUT, SYMCOMM_USER_BARRIER_END,
};
use symcomm::testing::emu::{EmuTeam, launch};

#[path = "support/mod.rs"]
mod support;

// ---------------------------------------------------------------------------------------------
// Element types.

#[derive(Clone, Copy, Debug, PartialEq)]
enum Dt {
    Bf16,
    F32,
}

impl Dt {
    fn size(self) -> usize {
        match self {
            Dt::Bf16 => 2,
            Dt::F32 => 4,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Dt::Bf16 => "bf16",
            Dt::F32 => "f32",
        }
    }
    fn kernel(self) -> String {
        format!("symcomm_allreduce_residual_rmsnorm_{}", self.name())
    }
    /// Bits of `v` rounded to the type (round to nearest even).
    fn encode(self, v: f32) -> u32 {
        match self {
            Dt::Bf16 => u32::from(f32_to_bf16_rne(v)),
            Dt::F32 => v.to_bits(),
        }
    }
    fn decode(self, bits: u32) -> f32 {
        match self {
            Dt::Bf16 => f32::from_bits(bits << 16),
            Dt::F32 => f32::from_bits(bits),
        }
    }
    /// Rounds `v` to the type and back.
    fn round(self, v: f32) -> f32 {
        self.decode(self.encode(v))
    }
    fn write(self, buf: &mut [u8], i: usize, v: f32) {
        let b = self.encode(v).to_le_bytes();
        buf[i * self.size()..(i + 1) * self.size()].copy_from_slice(&b[..self.size()]);
    }
    fn read_bits(self, buf: &[u8], i: usize) -> u32 {
        let mut b = [0u8; 4];
        b[..self.size()].copy_from_slice(&buf[i * self.size()..(i + 1) * self.size()]);
        u32::from_le_bytes(b)
    }
}

/// f32 -> bfloat16 bits, round to nearest, ties to even; NaN -> 0x7fff; overflow to infinity.
fn f32_to_bf16_rne(v: f32) -> u16 {
    let x = v.to_bits();
    if x & 0x7fff_ffff > 0x7f80_0000 {
        return 0x7fff;
    }
    ((x + 0x7fff + ((x >> 16) & 1)) >> 16) as u16
}

/// Position of `bits` on the number line (ordered integers: adjacent floats differ by 1).
fn ordered(dt: Dt, bits: u32) -> i64 {
    let (sign, mag) = match dt {
        Dt::Bf16 => (bits & 0x8000 != 0, i64::from(bits & 0x7fff)),
        Dt::F32 => (bits & 0x8000_0000 != 0, i64::from(bits & 0x7fff_ffff)),
    };
    if sign { -mag } else { mag }
}

// ---------------------------------------------------------------------------------------------
// Inputs (exact in bf16 and f32: the sum over <= 4 ranks lies in [-8, 8] in steps of 1/2, plus a
// residual in [-2, 2] in steps of 1/4; squares are multiples of 1/16 below 100, and their sum over
// a row of 8192 stays below 2^20, so every partial sum of squares is exact in f32 too).

fn partial_val(rank: u32, t: u64, i: u64, iter: u64) -> f32 {
    let h = (u64::from(rank) * 7 + t * 13 + i * 3 + iter * 5) % 9;
    (h as f32 - 4.0) * 0.5
}

fn residual_val(t: u64, i: u64) -> f32 {
    let h = (t * 11 + i * 5 + 3) % 17;
    (h as f32 - 8.0) * 0.25
}

fn gamma_val(i: u64) -> f32 {
    let h = (i * 7 + 1) % 23;
    let sign = if i % 5 == 4 { -1.0 } else { 1.0 };
    sign * (h as f32 + 1.0) * 0.0625
}

/// The unfused reference for one row: (residual_out, out), before rounding to the type.
/// `partials[r]` is rank r's row (already in the type, so exact); `residual` and `gamma` likewise.
fn reference_row(
    partials: &[Vec<f32>],
    residual: &[f32],
    gamma: &[f32],
    eps: f32,
) -> (Vec<f32>, Vec<f32>) {
    let h = residual.len();
    let mut y = vec![0f32; h];
    let mut sum_sq = 0f32;
    for i in 0..h {
        // All-reduce: rank order, f32.
        let mut x = partials[0][i];
        for p in &partials[1..] {
            x += p[i];
        }
        y[i] = x + residual[i];
        sum_sq += y[i] * y[i];
    }
    let inv_rms = 1.0 / (sum_sq / h as f32 + eps).sqrt();
    let out = (0..h).map(|i| y[i] * inv_rms * gamma[i]).collect();
    (y, out)
}

// ---------------------------------------------------------------------------------------------
// One team, its buffers, and launches.

/// Windows of the team: the symmetric `partial` window, then per-rank local buffers (they live in
/// windows only because that gives the harness aligned memory; the kernel uses their local copy).
const W_PARTIAL: usize = 0;
const W_RESIDUAL: usize = 1;
const W_RESIDUAL_OUT: usize = 2;
const W_OUT: usize = 3;
const W_GAMMA: usize = 4;
/// The sum of the partials (the unfused pair's all-reduce output), laid out as `partial`.
const W_SUM: usize = 5;

#[derive(Clone, Copy, Debug)]
struct Shape {
    dt: Dt,
    nranks: u32,
    hidden: u32,
    tokens: u32,
    ctas: u32,
    threads: u32,
    in_place: bool,
    first_slot: u32,
    /// Elements before token 0's row in the partial window (a multiple of the pack size).
    partial_offset: u64,
    eps: f32,
}

impl Shape {
    fn elems(&self) -> u64 {
        u64::from(self.tokens) * u64::from(self.hidden)
    }
    fn label(&self) -> String {
        format!(
            "{} nranks={} hidden={} tokens={} grid={}x{} {} slot={} offset={} eps={:e}",
            self.dt.name(),
            self.nranks,
            self.hidden,
            self.tokens,
            self.ctas,
            self.threads,
            if self.in_place {
                "in-place"
            } else {
                "out-of-place"
            },
            self.first_slot,
            self.partial_offset,
            self.eps
        )
    }
}

fn new_team(s: &Shape) -> EmuTeam {
    let sz = s.dt.size() as u64;
    let rows = s.elems() * sz;
    EmuTeam::with_windows(
        s.nranks,
        &[
            (s.partial_offset + s.elems()) * sz,
            rows,
            rows,
            rows,
            u64::from(s.hidden) * sz,
            (s.partial_offset + s.elems()) * sz,
        ],
    )
    .unwrap()
}

/// Address of element 0 of rank `r`'s copy of window `w`.
fn local_addr(team: &mut EmuTeam, w: usize, r: u32) -> u64 {
    let h = team.window_of(w, r);
    h.base + u64::from(r) * h.stride
}

fn args_of(team: &mut EmuTeam, s: &Shape, r: u32) -> AllReduceRmsNormArgs {
    let residual = local_addr(team, W_RESIDUAL, r);
    AllReduceRmsNormArgs {
        partial: team.window_of(W_PARTIAL, r),
        partial_offset: s.partial_offset,
        residual,
        residual_out: if s.in_place {
            residual
        } else {
            local_addr(team, W_RESIDUAL_OUT, r)
        },
        out: local_addr(team, W_OUT, r),
        gamma: local_addr(team, W_GAMMA, r),
        tokens: s.tokens,
        hidden: s.hidden,
        eps: s.eps,
        first_slot: s.first_slot,
    }
}

const TIMEOUT_NS: u64 = 30_000_000_000;

/// Launches the kernel of `s.dt` once on rank `comm.rank` (blocking).
fn launch_rank(s: &Shape, comm: DevComm, args: AllReduceRmsNormArgs) {
    // SAFETY: the fused kernels take (DevComm, AllReduceRmsNormArgs<T>) by value, whose layout
    // the mirror above matches (96 bytes, same field order); the team's memory, which every
    // address in them points into, outlives the launch.
    unsafe { launch_kernel(&s.dt.kernel(), s.ctas, s.threads, comm, args) };
}

/// Launches `kernel(comm, args)` once (blocking).
///
/// # Safety
/// `kernel` takes (DevComm, A) by value, and every address in `comm` and `args` stays valid
/// until the launch returns.
unsafe fn launch_kernel<A: Copy>(kernel: &str, ctas: u32, threads: u32, comm: DevComm, args: A) {
    let (mut comm, mut args) = (comm, args);
    let mut ptrs: [*mut c_void; 2] = [(&raw mut comm).cast(), (&raw mut args).cast()];
    // SAFETY: forwarded from this function's contract.
    unsafe {
        launch(
            &DEVICE_IMAGE,
            kernel,
            [ctas, 1, 1],
            [threads, 1, 1],
            &mut ptrs,
        )
    }
    .unwrap();
}

/// Launches every rank in `ranks` concurrently, each with its own (comm, args).
fn launch_all(s: &Shape, calls: Vec<(DevComm, AllReduceRmsNormArgs)>) {
    std::thread::scope(|scope| {
        for (comm, args) in calls {
            scope.spawn(move || launch_rank(s, comm, args));
        }
    });
}

/// Writes the inputs of iteration `iter` (partials of every rank, residual and gamma).
fn fill(team: &mut EmuTeam, s: &Shape) {
    let h = u64::from(s.hidden);
    for r in 0..s.nranks {
        let buf = team.bytes_mut(W_PARTIAL, r);
        for e in 0..s.elems() {
            let v = partial_val(r, e / h, e % h, 0);
            s.dt.write(buf, (s.partial_offset + e) as usize, v);
        }
        let buf = team.bytes_mut(W_RESIDUAL, r);
        for e in 0..s.elems() {
            s.dt.write(buf, e as usize, residual_val(e / h, e % h));
        }
        let buf = team.bytes_mut(W_GAMMA, r);
        for i in 0..h {
            s.dt.write(buf, i as usize, gamma_val(i));
        }
        // Outputs start as NaN-like garbage, so that an unwritten element is wrong.
        team.bytes_mut(W_OUT, r).fill(0xff);
        if !s.in_place {
            team.bytes_mut(W_RESIDUAL_OUT, r).fill(0xff);
        }
    }
}

#[derive(Default, Debug)]
struct Counts {
    /// Elements outside the tolerance (residual_out: any bit difference).
    wrong: u64,
    /// `out` elements whose bits differ from the reference but lie within the tolerance.
    inexact: u64,
    /// Largest distance of `out` from the reference, in ulps of the type.
    max_ulps: i64,
}

/// Compares one rank's row `t` of residual_out / out with the reference.
#[allow(clippy::too_many_arguments)]
fn check_row(
    dt: Dt,
    eps: f32,
    partials: &[Vec<f32>],
    residual: &[f32],
    gamma: &[f32],
    res_out: &[u8],
    out: &[u8],
    row: usize,
    counts: &mut Counts,
) {
    let h = residual.len();
    let (y, want) = reference_row(partials, residual, gamma, eps);
    for i in 0..h {
        let e = row * h + i;
        if dt.read_bits(res_out, e) != dt.encode(y[i]) {
            counts.wrong += 1;
        }
        let got_bits = dt.read_bits(out, e);
        let want_bits = dt.encode(want[i]);
        if got_bits == want_bits {
            continue;
        }
        let ulps = (ordered(dt, got_bits) - ordered(dt, want_bits)).abs();
        counts.max_ulps = counts.max_ulps.max(ulps);
        let ok = match dt {
            Dt::Bf16 => ulps <= 1,
            Dt::F32 => {
                let (g, w) = (dt.decode(got_bits), want[i]);
                (g - w).abs() <= 1e-5 * w.abs() + 1e-30
            }
        };
        if ok {
            counts.inexact += 1;
        } else {
            counts.wrong += 1;
        }
    }
}

/// Checks every rank's outputs after one launch whose partials were those of iteration `iter`
/// and whose input residual was `residual_in(t, i)`.
fn check_outputs(
    team: &EmuTeam,
    s: &Shape,
    iter: u64,
    residual_in: &dyn Fn(u64, u64) -> f32,
) -> Counts {
    let h = u64::from(s.hidden);
    let gamma: Vec<f32> = (0..h).map(|i| s.dt.round(gamma_val(i))).collect();
    let res_w = if s.in_place {
        W_RESIDUAL
    } else {
        W_RESIDUAL_OUT
    };
    let mut counts = Counts::default();
    for t in 0..u64::from(s.tokens) {
        let partials: Vec<Vec<f32>> = (0..s.nranks)
            .map(|r| {
                (0..h)
                    .map(|i| s.dt.round(partial_val(r, t, i, iter)))
                    .collect()
            })
            .collect();
        let residual: Vec<f32> = (0..h).map(|i| s.dt.round(residual_in(t, i))).collect();
        for r in 0..s.nranks {
            check_row(
                s.dt,
                s.eps,
                &partials,
                &residual,
                &gamma,
                team.bytes(res_w, r),
                team.bytes(W_OUT, r),
                t as usize,
                &mut counts,
            );
        }
    }
    counts
}

fn errors(team: &EmuTeam, n: u32) -> Vec<u32> {
    (0..n).map(|r| team.error(r).status).collect()
}

/// Threads per CTA for a row of `hidden` elements: hidden / 16 rounded up to whole warps.
fn default_threads(hidden: u32) -> u32 {
    hidden.div_ceil(16).div_ceil(32).max(1) * 32
}

fn run_and_check(s: &Shape) {
    let start = Instant::now();
    let mut team = new_team(s);
    fill(&mut team, s);
    let calls = (0..s.nranks)
        .map(|r| (team.dev_comm(r, TIMEOUT_NS), args_of(&mut team, s, r)))
        .collect();
    launch_all(s, calls);
    let errs = errors(&team, s.nranks);
    let c = check_outputs(&team, s, 0, &residual_val);
    println!(
        "{}: #wrong={} #inexact={} max_ulps={} ({:.2?})",
        s.label(),
        c.wrong,
        c.inexact,
        c.max_ulps,
        start.elapsed()
    );
    assert!(
        errs.iter().all(|&e| e == SYMCOMM_STATUS_OK),
        "{}: error records {errs:?}",
        s.label()
    );
    assert_eq!(c.wrong, 0, "{}: #wrong", s.label());
}

fn shape(dt: Dt, nranks: u32, hidden: u32, tokens: u32, ctas: u32) -> Shape {
    Shape {
        dt,
        nranks,
        hidden,
        tokens,
        ctas,
        threads: default_threads(hidden),
        in_place: false,
        first_slot: 0,
        partial_offset: 0,
        eps: 1e-5,
    }
}

// ---------------------------------------------------------------------------------------------
// Tests.

/// Ranks {1, 2, 3, 4} x hidden {4096, 8192} x tokens {1, 7, 64, 200} x {bf16, f32}, a covering
/// selection: every value of every dimension appears with both types, rows loop over CTAs
/// (tokens > grid) and one CTA per row, residual in place and not, slot and offset shifts.
#[test]
fn matches_the_unfused_reference() {
    let cases = [
        (Dt::Bf16, 1, 4096, 7, 4),
        (Dt::F32, 1, 8192, 1, 1),
        (Dt::Bf16, 2, 8192, 64, 8),
        (Dt::F32, 2, 4096, 200, 6),
        (Dt::Bf16, 3, 4096, 200, 7),
        (Dt::F32, 3, 8192, 7, 7),
        (Dt::Bf16, 4, 8192, 200, 16),
        (Dt::F32, 4, 4096, 64, 64),
        (Dt::Bf16, 4, 4096, 1, 1),
        (Dt::F32, 4, 8192, 7, 3),
    ];
    for (k, &(dt, nranks, hidden, tokens, ctas)) in cases.iter().enumerate() {
        let mut s = shape(dt, nranks, hidden, tokens, ctas);
        s.in_place = k % 2 == 1;
        s.first_slot = [0, 5, 100][k % 3];
        s.partial_offset = [0, 8, 64][k % 3];
        // A large epsilon changes the result visibly (the mean of y^2 is a few units here).
        s.eps = [1e-5, 0.5, 1e-6, 2.0][k % 4];
        run_and_check(&s);
    }
}

/// The unfused pair: the built-in one-shot all-reduce of the partials into another window, then
/// `symcomm_residual_rmsnorm_<T>` on that window (its own copy only, no barrier). With sums exact
/// in the type, its outputs are the fused kernel's bit for bit, and both match the reference.
#[test]
fn unfused_pair_matches_the_fused_kernel() {
    let cases = [
        (Dt::Bf16, 4, 8192, 7, 3),
        (Dt::F32, 3, 4096, 5, 5),
        (Dt::Bf16, 2, 4096, 64, 8),
        (Dt::F32, 1, 512, 3, 2),
    ];
    for (k, &(dt, nranks, hidden, tokens, ctas)) in cases.iter().enumerate() {
        let mut s = shape(dt, nranks, hidden, tokens, ctas);
        s.in_place = k % 2 == 0;
        s.partial_offset = [0, 8][k % 2];
        let res_w = if s.in_place {
            W_RESIDUAL
        } else {
            W_RESIDUAL_OUT
        };
        // Fused first; keep every rank's outputs.
        let mut team = new_team(&s);
        fill(&mut team, &s);
        let calls = (0..s.nranks)
            .map(|r| (team.dev_comm(r, TIMEOUT_NS), args_of(&mut team, &s, r)))
            .collect();
        launch_all(&s, calls);
        assert!(
            errors(&team, s.nranks)
                .iter()
                .all(|&e| e == SYMCOMM_STATUS_OK)
        );
        let fused: Vec<(Vec<u8>, Vec<u8>)> = (0..s.nranks)
            .map(|r| (team.bytes(res_w, r).to_vec(), team.bytes(W_OUT, r).to_vec()))
            .collect();

        // Unfused, on a fresh team with the same inputs.
        let mut team = new_team(&s);
        fill(&mut team, &s);
        let dtype = match dt {
            Dt::Bf16 => SYMCOMM_DTYPE_BF16,
            Dt::F32 => SYMCOMM_DTYPE_F32,
        };
        let calls: Vec<_> = (0..s.nranks)
            .map(|r| {
                let sum = CollArgs {
                    kind: SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
                    dtype,
                    redop: SYMCOMM_REDOP_SUM,
                    root: 0,
                    scope: SYMCOMM_SCOPE_GRID,
                    index: 0,
                    count: s.elems(),
                    src_offset: s.partial_offset,
                    dst_offset: s.partial_offset,
                    tile_stride: 0,
                    src: team.window_of(W_PARTIAL, r),
                    dst: team.window_of(W_SUM, r),
                    ..Default::default()
                };
                let norm = AllReduceRmsNormArgs {
                    partial: team.window_of(W_SUM, r),
                    ..args_of(&mut team, &s, r)
                };
                (team.dev_comm(r, TIMEOUT_NS), sum, norm)
            })
            .collect();
        let s = &s;
        std::thread::scope(|scope| {
            for &(comm, sum, norm) in &calls {
                scope.spawn(move || {
                    let norm_kernel = format!("symcomm_residual_rmsnorm_{}", s.dt.name());
                    let coll_kernel = format!("symcomm_collective_{}", s.dt.name());
                    // SAFETY: (DevComm, CollArgs) and (DevComm, AllReduceRmsNormArgs<T>) by
                    // value, as the kernels take them; the team outlives the scope.
                    unsafe {
                        launch_kernel(&coll_kernel, 4, 64, comm, sum);
                        launch_kernel(&norm_kernel, s.ctas, s.threads, comm, norm);
                    }
                });
            }
        });
        assert!(
            errors(&team, s.nranks)
                .iter()
                .all(|&e| e == SYMCOMM_STATUS_OK),
            "{}: error records {:?}",
            s.label(),
            errors(&team, s.nranks)
        );
        let c = check_outputs(&team, s, 0, &residual_val);
        let differ: usize = (0..s.nranks)
            .map(|r| {
                let (res, out) = &fused[r as usize];
                let bits = |a: &[u8], b: &[u8]| a.iter().zip(b).filter(|(x, y)| x != y).count();
                bits(res, team.bytes(res_w, r)) + bits(out, team.bytes(W_OUT, r))
            })
            .sum();
        println!(
            "{}: unfused #wrong={} #inexact={}, bytes differing from the fused kernel {differ}",
            s.label(),
            c.wrong,
            c.inexact
        );
        assert_eq!(c.wrong, 0, "{}: #wrong", s.label());
        assert_eq!(differ, 0, "{}: unfused differs from fused", s.label());
    }
}

/// Rows that do not fill the CTA, fill it exactly, or need every one of a thread's packs; and a
/// CTA of 1024 threads (more than the row needs).
#[test]
fn row_and_block_shapes() {
    let mut cases = vec![
        // bf16: 8 elements per pack, 2 packs per thread; f32: 4 per pack, 4 packs per thread.
        shape(Dt::Bf16, 3, 8, 5, 2),
        shape(Dt::Bf16, 2, 512, 3, 3),
        shape(Dt::F32, 2, 512, 3, 2),
        shape(Dt::F32, 3, 4, 9, 4),
        shape(Dt::F32, 4, 1000, 2, 2),
        shape(Dt::Bf16, 2, 4096, 3, 3),
    ];
    // Exactly 16 elements per thread: every thread uses all of its packs.
    cases[1].threads = 32;
    cases[2].threads = 32;
    cases[4].threads = 64;
    cases[5].threads = 1024;
    cases[5].in_place = true;
    cases[0].eps = 0.5;
    cases[3].eps = 3.0;
    for s in &cases {
        run_and_check(s);
    }
}

/// Back-to-back launches on one team: each rank thread, on its own (no host synchronization
/// between ranks), writes its partial outputs for iteration k and launches; the residual is
/// updated in place, so iteration k's input residual is iteration k-1's output. Barrier epochs
/// continue across launches, and the closing barrier keeps a fast rank from overwriting its
/// partial outputs while a slow peer still reads them.
#[test]
fn back_to_back_launches() {
    const ITERS: u64 = 6;
    for (dt, nranks) in [(Dt::Bf16, 4), (Dt::F32, 3)] {
        let mut s = shape(dt, nranks, 4096, 7, 3);
        s.in_place = true;
        let start = Instant::now();
        let mut team = new_team(&s);
        fill(&mut team, &s);
        let h = u64::from(s.hidden);
        let calls: Vec<(DevComm, AllReduceRmsNormArgs, u64)> = (0..s.nranks)
            .map(|r| {
                let partial = local_addr(&mut team, W_PARTIAL, r);
                (
                    team.dev_comm(r, TIMEOUT_NS),
                    args_of(&mut team, &s, r),
                    partial,
                )
            })
            .collect();
        // Each rank keeps the first token row of every iteration's residual_out and out.
        let rows: Vec<Vec<(Vec<u8>, Vec<u8>)>> = std::thread::scope(|scope| {
            let joins: Vec<_> = calls
                .into_iter()
                .enumerate()
                .map(|(r, (comm, args, partial))| {
                    let s = &s;
                    scope.spawn(move || {
                        let row_bytes = s.hidden as usize * s.dt.size();
                        let mut kept = Vec::new();
                        for iter in 0..ITERS {
                            let mut buf = vec![0u8; s.elems() as usize * s.dt.size()];
                            for e in 0..s.elems() {
                                let v = partial_val(r as u32, e / h, e % h, iter);
                                s.dt.write(&mut buf, e as usize, v);
                            }
                            // SAFETY: this rank's copy of the partial window holds
                            // partial_offset + elems elements at `partial`; no kernel of this
                            // rank runs, and the previous launch's closing barrier guarantees
                            // that no peer still reads it.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    buf.as_ptr(),
                                    (partial as *mut u8)
                                        .add(s.partial_offset as usize * s.dt.size()),
                                    buf.len(),
                                );
                            }
                            launch_rank(s, comm, args);
                            // SAFETY: the residual and out buffers of this rank hold `elems`
                            // elements; only this rank's kernel writes them, and it returned.
                            let (res, out) = unsafe {
                                (
                                    std::slice::from_raw_parts(
                                        args.residual as *const u8,
                                        row_bytes,
                                    )
                                    .to_vec(),
                                    std::slice::from_raw_parts(args.out as *const u8, row_bytes)
                                        .to_vec(),
                                )
                            };
                            kept.push((res, out));
                        }
                        kept
                    })
                })
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        let errs = errors(&team, s.nranks);
        assert!(
            errs.iter().all(|&e| e == SYMCOMM_STATUS_OK),
            "back-to-back {}: error records {errs:?}",
            s.label()
        );
        // Replay the reference: the residual of row 0 evolves by iteration.
        let gamma: Vec<f32> = (0..h).map(|i| s.dt.round(gamma_val(i))).collect();
        let mut residual: Vec<f32> = (0..h).map(|i| s.dt.round(residual_val(0, i))).collect();
        let mut counts = Counts::default();
        for iter in 0..ITERS {
            let partials: Vec<Vec<f32>> = (0..s.nranks)
                .map(|r| {
                    (0..h)
                        .map(|i| s.dt.round(partial_val(r, 0, i, iter)))
                        .collect()
                })
                .collect();
            for kept in &rows {
                let (res, out) = &kept[iter as usize];
                check_row(
                    s.dt,
                    s.eps,
                    &partials,
                    &residual,
                    &gamma,
                    res,
                    out,
                    0,
                    &mut counts,
                );
            }
            let (y, _) = reference_row(&partials, &residual, &gamma, s.eps);
            residual = y.iter().map(|&v| s.dt.round(v)).collect();
        }
        // The whole final state too: every row's residual after ITERS in-place updates.
        let final_residual = |t: u64, i: u64| {
            let mut v = s.dt.round(residual_val(t, i));
            for iter in 0..ITERS {
                let mut x = s.dt.round(partial_val(0, t, i, iter));
                for r in 1..s.nranks {
                    x += s.dt.round(partial_val(r, t, i, iter));
                }
                v = s.dt.round(x + v);
            }
            v
        };
        let mut final_wrong = 0u64;
        for r in 0..s.nranks {
            let buf = team.bytes(W_RESIDUAL, r);
            for e in 0..s.elems() {
                if s.dt.read_bits(buf, e as usize) != s.dt.encode(final_residual(e / h, e % h)) {
                    final_wrong += 1;
                }
            }
        }
        println!(
            "back-to-back x{ITERS} {}: #wrong={} (final residual #wrong={final_wrong}) #inexact={} max_ulps={} ({:.2?})",
            s.label(),
            counts.wrong,
            counts.inexact,
            counts.max_ulps,
            start.elapsed()
        );
        assert_eq!(
            (counts.wrong, final_wrong),
            (0, 0),
            "back-to-back {}",
            s.label()
        );
    }
}

/// A rank that never launches: every other rank's barrier times out (short deadline) and
/// records Timeout in its ErrorRecord; the team's epochs are then out of step, so it is dropped.
#[test]
fn missing_rank_times_out() {
    let s = shape(Dt::Bf16, 3, 4096, 7, 2);
    let mut team = new_team(&s);
    fill(&mut team, &s);
    let timeout_ns = 200_000_000;
    let calls = (0..s.nranks - 1)
        .map(|r| (team.dev_comm(r, timeout_ns), args_of(&mut team, &s, r)))
        .collect();
    let start = Instant::now();
    launch_all(&s, calls);
    let took = start.elapsed();
    println!("missing rank: launches returned after {took:.2?}");
    for r in 0..s.nranks - 1 {
        let e = team.error(r);
        assert_eq!(e.status, SYMCOMM_STATUS_TIMEOUT, "rank {r}: {e:?}");
        assert_eq!(e.op, SYMCOMM_OP_BARRIER, "rank {r}: {e:?}");
        assert_eq!(
            e.peer,
            s.nranks - 1,
            "rank {r} waited for the missing rank: {e:?}"
        );
    }
    assert_eq!(team.error(s.nranks - 1).status, SYMCOMM_STATUS_OK);
    assert!(took.as_secs() < 20, "timeouts took {took:?}");
}

/// Ranks that disagree on the shape (one rank passes another token count) all report
/// Mismatch instead of exchanging rows.
#[test]
fn mismatched_shapes_are_detected() {
    let s = shape(Dt::F32, 3, 512, 4, 2);
    let mut team = new_team(&s);
    fill(&mut team, &s);
    let calls = (0..s.nranks)
        .map(|r| {
            let mut a = args_of(&mut team, &s, r);
            if r == 1 {
                a.tokens -= 1;
            }
            (team.dev_comm(r, 5_000_000_000), a)
        })
        .collect();
    launch_all(&s, calls);
    let errs = errors(&team, s.nranks);
    println!("mismatched tokens: error records {errs:?}");
    assert!(
        errs.iter().all(|&e| e == SYMCOMM_STATUS_MISMATCH),
        "every rank sees the mismatch: {errs:?}"
    );
}

/// Arguments the kernel refuses before communicating, on every rank: a row that is not whole
/// packs, a row longer than the CTA holds, a CTA that is not whole warps, a misaligned buffer, a
/// partial row range beyond the window, barrier indices beyond SYMCOMM_USER_BARRIER_END, a
/// partial window of another element size or type.
#[test]
fn invalid_arguments_are_refused() {
    type Tweak = fn(&mut Shape, &mut AllReduceRmsNormArgs);
    let tweaks: [(&str, Tweak); 8] = [
        ("hidden not whole packs", |_, a| a.hidden = 12),
        ("hidden > 16 x threads", |s, a| {
            s.threads = 32;
            a.hidden = 1024;
            a.tokens = 1;
        }),
        ("threads not whole warps", |s, _| s.threads = 48),
        ("misaligned residual", |_, a| a.residual += 2),
        ("partial beyond the window", |_, a| a.partial_offset = 8),
        // CTA 1 would use index SYMCOMM_USER_BARRIER_END, whose word is send/recv's.
        ("grid beyond the barrier indices", |_, a| {
            a.first_slot = SYMCOMM_USER_BARRIER_END - 1;
        }),
        ("partial window of f32 elements (bf16 kernel)", |_, a| {
            (a.partial.elem_size, a.partial.dtype) = (4, SYMCOMM_DTYPE_F32);
        }),
        ("partial window of f16 elements (bf16 kernel)", |_, a| {
            (a.partial.elem_size, a.partial.dtype) = (2, SYMCOMM_DTYPE_F16);
        }),
    ];
    for (what, tweak) in tweaks {
        let mut s = shape(Dt::Bf16, 2, 256, 4, 2);
        let mut team = new_team(&s);
        fill(&mut team, &s);
        let mut calls = Vec::new();
        for r in 0..s.nranks {
            let mut a = args_of(&mut team, &s, r);
            let mut s2 = s;
            tweak(&mut s2, &mut a);
            s.threads = s2.threads;
            calls.push((team.dev_comm(r, 5_000_000_000), a));
        }
        launch_all(&s, calls);
        for r in 0..s.nranks {
            let e = team.error(r);
            assert_eq!(
                (e.status, e.op),
                (SYMCOMM_STATUS_INVALID_ARGUMENT, SYMCOMM_OP_COLLECTIVE),
                "{what}: rank {r}: {e:?}"
            );
        }
    }
}

#[test]
fn bf16_rounding_is_to_nearest_even() {
    assert_eq!(f32_to_bf16_rne(1.0), 0x3f80);
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (down).
    assert_eq!(f32_to_bf16_rne(f32::from_bits(0x3f80_8000)), 0x3f80);
    // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (up).
    assert_eq!(f32_to_bf16_rne(f32::from_bits(0x3f81_8000)), 0x3f82);
    assert_eq!(f32_to_bf16_rne(f32::from_bits(0x3f80_8001)), 0x3f81);
    assert_eq!(f32_to_bf16_rne(-2.5), 0xc020);
    assert_eq!(f32_to_bf16_rne(f32::MAX), 0x7f80);
    assert_eq!(f32_to_bf16_rne(f32::NAN), 0x7fff);
}

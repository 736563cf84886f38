//! The device library's collectives on the emulator, through the built-in kernels
//! `symcomm_collective_<dtype>`: every collective x dtype x op x rank count x count x in/out of
//! place x grid/CTA scope x offsets, checked like nccl-tests (inputs whose results are exactly
//! representable, bit-exact comparison, a tolerance only for avg, `#wrong` counted), plus the
//! bytes around every output checked untouched.
//!
//! The full cross product is far too large, so each test covers every value of every dimension
//! with a seeded pairwise-style selection; the seed is printed and `SYMCOMM_TEST_SEED` replays it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::needless_range_loop
)]

#[path = "support/mod.rs"]
mod support;

use std::ffi::c_void;

use support::blocks;
use support::values::{DTYPES, DType, OPS, Rng, Val, input, reduce_vals, seed};
use symcomm::DEVICE_IMAGE;
use symcomm::abi::*;
use symcomm::testing::emu::{EmuTeam, launch};

// ---------------------------------------------------------------------------------------------
// One collective call on a fresh team and its check.

#[derive(Clone, Copy, Debug)]
struct Case {
    kind: u32,
    dt: DType,
    op: u32,
    nranks: u32,
    count: u64,
    root: u32,
    in_place: bool,
    cta_scope: bool,
    /// Extra element offset of the input and output (misalignment).
    src_shift: u64,
    dst_shift: u64,
    ctas: u32,
    threads: u32,
}

const KINDS: [(u32, &str); 8] = [
    (SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT, "all_reduce_one_shot"),
    (SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT, "all_reduce_two_shot"),
    (SYMCOMM_COLL_ALL_GATHER, "all_gather"),
    (SYMCOMM_COLL_REDUCE_SCATTER, "reduce_scatter"),
    (SYMCOMM_COLL_BROADCAST, "broadcast"),
    (SYMCOMM_COLL_REDUCE, "reduce"),
    (SYMCOMM_COLL_SCATTER, "scatter"),
    (SYMCOMM_COLL_ALL_TO_ALL, "all_to_all"),
];

fn kind_name(kind: u32) -> &'static str {
    KINDS.iter().find(|k| k.0 == kind).map(|k| k.1).unwrap()
}

fn is_reduction(kind: u32) -> bool {
    matches!(
        kind,
        SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT
            | SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT
            | SYMCOMM_COLL_REDUCE_SCATTER
            | SYMCOMM_COLL_REDUCE
    )
}

const CANARY: u8 = 0xA5;

struct Outcome {
    wrong: u64,
    untouched_bad: u64,
    errors: Vec<u32>,
}

/// Runs `c` (CTA scope: one independent collective per CTA on its own tile) and checks it.
fn run_case(c: &Case, salt: u64) -> Outcome {
    let n = u64::from(c.nranks);
    let sz = c.dt.size as u64;
    let (in_blocks, out_blocks) = blocks(c.kind, n);
    let tiles = if c.cta_scope { u64::from(c.ctas) } else { 1 };
    // Offsets (elements) of input and output inside a tile, following NCCL's in-place rules.
    let (soff, doff, tile_stride, span) = if c.in_place {
        let base = c.src_shift;
        let span = base + c.count * in_blocks.max(out_blocks) + 3;
        match c.kind {
            SYMCOMM_COLL_ALL_GATHER => (base, base, span, span), // soff = doff + rank*count, per rank
            SYMCOMM_COLL_REDUCE_SCATTER | SYMCOMM_COLL_SCATTER => (base, base, span, span),
            _ => (base, base, span, span),
        }
    } else {
        let span = c.src_shift.max(c.dst_shift) + c.count * in_blocks.max(out_blocks) + 3;
        (c.src_shift, c.dst_shift, span, span)
    };
    let window_elems = tiles * tile_stride + span;
    let windows = if c.in_place {
        vec![window_elems * sz]
    } else {
        vec![window_elems * sz, window_elems * sz]
    };
    let mut team = EmuTeam::with_windows(c.nranks, &windows).unwrap();
    let dst_w = if c.in_place { 0 } else { 1 };

    // Per rank: input offset (elements) and output offset, for tile 0.
    let offs = |rank: u64| -> (u64, u64) {
        if !c.in_place {
            return (soff, doff);
        }
        match c.kind {
            SYMCOMM_COLL_ALL_GATHER => (doff + rank * c.count, doff),
            SYMCOMM_COLL_REDUCE_SCATTER | SYMCOMM_COLL_SCATTER => (soff, soff + rank * c.count),
            _ => (soff, doff),
        }
    };

    // Fill: canary everywhere, then inputs.
    let mut inputs = vec![
        vec![vec![Val::I(0); (c.count * in_blocks) as usize]; tiles as usize];
        c.nranks as usize
    ];
    for r in 0..c.nranks {
        for w in 0..windows.len() {
            team.bytes_mut(w, r).fill(CANARY);
        }
        let (s, _) = offs(u64::from(r));
        for t in 0..tiles {
            for e in 0..c.count * in_blocks {
                let v = input(&c.dt, c.op, r, e + t * 1000, salt);
                inputs[r as usize][t as usize][e as usize] = v;
                let at = ((t * tile_stride + s + e) * sz) as usize;
                let bits = c.dt.encode(v).to_le_bytes();
                team.bytes_mut(0, r)[at..at + c.dt.size].copy_from_slice(&bits[..c.dt.size]);
            }
        }
    }
    // Expected outputs per rank and tile: (element index in dst window, value).
    let mut expect: Vec<Vec<(u64, Val)>> = vec![Vec::new(); c.nranks as usize];
    for (r, expect_r) in expect.iter_mut().enumerate() {
        let (_, d) = offs(r as u64);
        for t in 0..tiles as usize {
            let at = |e: u64| t as u64 * tile_stride + d + e;
            let inp = |p: usize, e: u64| inputs[p][t][e as usize];
            let all = |e: u64| {
                (0..c.nranks as usize)
                    .map(|p| inp(p, e))
                    .collect::<Vec<_>>()
            };
            for i in 0..c.count {
                match c.kind {
                    SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT | SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT => {
                        expect_r.push((at(i), reduce_vals(&c.dt, c.op, &all(i))))
                    }
                    SYMCOMM_COLL_REDUCE => {
                        if r as u32 == c.root {
                            expect_r.push((at(i), reduce_vals(&c.dt, c.op, &all(i))))
                        }
                    }
                    SYMCOMM_COLL_REDUCE_SCATTER => expect_r.push((
                        at(i),
                        reduce_vals(&c.dt, c.op, &all(r as u64 * c.count + i)),
                    )),
                    SYMCOMM_COLL_ALL_GATHER => {
                        for p in 0..c.nranks as usize {
                            expect_r.push((at(p as u64 * c.count + i), inp(p, i)));
                        }
                    }
                    SYMCOMM_COLL_BROADCAST => expect_r.push((at(i), inp(c.root as usize, i))),
                    SYMCOMM_COLL_SCATTER => {
                        expect_r.push((at(i), inp(c.root as usize, r as u64 * c.count + i)))
                    }
                    _ => {
                        for p in 0..c.nranks as usize {
                            expect_r
                                .push((at(p as u64 * c.count + i), inp(p, r as u64 * c.count + i)));
                        }
                    }
                }
            }
        }
    }

    // Launch every rank concurrently.
    let kernel = format!("symcomm_collective_{}", c.dt.name);
    let calls: Vec<(DevComm, CollArgs)> = (0..c.nranks)
        .map(|r| {
            let (s, d) = offs(u64::from(r));
            let comm = team.dev_comm(r, 30_000_000_000);
            let args = CollArgs {
                kind: c.kind,
                dtype: c.dt.code,
                redop: c.op,
                root: c.root,
                scope: if c.cta_scope {
                    SYMCOMM_SCOPE_CTA
                } else {
                    SYMCOMM_SCOPE_GRID
                },
                index: 0,
                count: c.count,
                src_offset: s,
                dst_offset: d,
                tile_stride,
                src: team.window_of(0, r),
                dst: team.window_of(dst_w, r),
            };
            (comm, args)
        })
        .collect();
    std::thread::scope(|s| {
        for (comm, args) in calls {
            let kernel = kernel.as_str();
            s.spawn(move || {
                let (mut comm, mut args) = (comm, args);
                let mut ptrs: [*mut c_void; 2] = [(&raw mut comm).cast(), (&raw mut args).cast()];
                // SAFETY: the kernel takes (DevComm, CollArgs) by value; the team's memory, which
                // the handles address, outlives the scope.
                unsafe {
                    launch(
                        &DEVICE_IMAGE,
                        kernel,
                        [c.ctas, 1, 1],
                        [c.threads, 1, 1],
                        &mut ptrs,
                    )
                }
                .unwrap();
            });
        }
    });

    let errors: Vec<u32> = (0..c.nranks).map(|r| team.error(r).status).collect();
    let mut wrong = 0u64;
    let mut untouched_bad = 0u64;
    for r in 0..c.nranks {
        let bytes = team.bytes(dst_w, r).to_vec();
        let mut written = vec![false; (bytes.len() as u64 / sz) as usize];
        for &(e, want) in &expect[r as usize] {
            written[e as usize] = true;
            let at = (e * sz) as usize;
            let mut raw = [0u8; 8];
            raw[..c.dt.size].copy_from_slice(&bytes[at..at + c.dt.size]);
            let got = c.dt.decode(u64::from_le_bytes(raw));
            let ok = match (got, want) {
                (Val::F(g), Val::F(w)) if c.op == SYMCOMM_REDOP_AVG && is_reduction(c.kind) => {
                    (g - w).abs() <= w.abs() * c.dt.epsilon() + f64::MIN_POSITIVE
                }
                (g, w) => g == w,
            };
            wrong += u64::from(!ok);
        }
        // Outside the outputs, the output window keeps its canary, except where in place inputs
        // live (they are the same window then).
        if !c.in_place {
            for (e, &was_written) in written.iter().enumerate() {
                if !was_written
                    && bytes[e * c.dt.size..(e + 1) * c.dt.size]
                        .iter()
                        .any(|&b| b != CANARY)
                {
                    untouched_bad += 1;
                }
            }
        }
    }
    Outcome {
        wrong,
        untouched_bad,
        errors,
    }
}

// ---------------------------------------------------------------------------------------------
// Case selection.

const RANKS: [u32; 6] = [1, 2, 3, 4, 5, 8];

fn counts(n: u32) -> Vec<u64> {
    let n = u64::from(n);
    vec![0, 1, n.saturating_sub(1).max(1), n + 1, 61, 1023, 1025]
}

fn check(c: &Case, salt: u64) {
    let o = run_case(c, salt);
    let label = format!(
        "{} {} {} nranks={} count={} root={} {} {} shift={}/{} grid={}x{}",
        kind_name(c.kind),
        c.dt.name,
        OPS.iter().find(|o| o.0 == c.op).map(|o| o.1).unwrap_or("-"),
        c.nranks,
        c.count,
        c.root,
        if c.in_place {
            "in-place"
        } else {
            "out-of-place"
        },
        if c.cta_scope { "cta" } else { "grid" },
        c.src_shift,
        c.dst_shift,
        c.ctas,
        c.threads
    );
    assert!(
        o.errors.iter().all(|&e| e == SYMCOMM_STATUS_OK),
        "{label}: error records {:?}",
        o.errors
    );
    assert_eq!(
        (o.wrong, o.untouched_bad),
        (0, 0),
        "{label}: (#wrong, #clobbered)"
    );
}

/// Every kind x dtype x op once per rank count (all 60 dtype x op pairs for each reduction kind,
/// all 12 dtypes for each copy kind), with the other dimensions drawn from the seeded generator
/// so that, across the run, every count, shift, scope, placement and launch shape appears.
#[test]
fn every_kind_dtype_and_op() {
    let mut rng = Rng(seed());
    let mut cases = 0;
    for &(kind, _) in &KINDS {
        for dt in DTYPES {
            let ops: Vec<u32> = if is_reduction(kind) {
                OPS.iter().map(|o| o.0).collect()
            } else {
                vec![0]
            };
            for op in ops {
                let nranks = rng.pick(&RANKS);
                let cta_scope = rng.next() % 2 == 0;
                let in_place = rng.next() % 2 == 0;
                let c = Case {
                    kind,
                    dt,
                    op,
                    nranks,
                    count: rng.pick(&counts(nranks)),
                    root: (rng.next() % u64::from(nranks)) as u32,
                    in_place,
                    cta_scope,
                    src_shift: rng.pick(&[0, 1, 3, 8]),
                    dst_shift: rng.pick(&[0, 2, 5, 8]),
                    ctas: rng.pick(&[1, 2, 3]),
                    threads: rng.pick(&[8, 32, 64]),
                };
                check(&c, rng.next());
                cases += 1;
            }
        }
    }
    println!("{cases} cases passed");
}

/// Every rank count x count x kind (f32 sum / u8 for variety), in place and out of place, grid
/// and CTA scope: the shape dimensions crossed fully for the cheap types.
#[test]
fn every_rank_count_and_count() {
    let mut rng = Rng(seed() ^ 1);
    let mut cases = 0;
    for nranks in RANKS {
        for count in counts(nranks) {
            for &(kind, _) in &KINDS {
                for (in_place, cta_scope) in [(false, false), (true, true)] {
                    let dt = if rng.next() % 2 == 0 {
                        DTYPES[0]
                    } else {
                        DTYPES[7]
                    };
                    let c = Case {
                        kind,
                        dt,
                        op: SYMCOMM_REDOP_SUM,
                        nranks,
                        count,
                        root: (rng.next() % u64::from(nranks)) as u32,
                        in_place,
                        cta_scope,
                        src_shift: rng.pick(&[0, 1, 7]),
                        dst_shift: rng.pick(&[0, 3, 4]),
                        ctas: rng.pick(&[1, 2]),
                        threads: 32,
                    };
                    check(&c, rng.next());
                    cases += 1;
                }
            }
        }
    }
    println!("{cases} cases passed");
}

/// Large messages (~1M elements) through every kind once, grid scope with several CTAs.
#[test]
fn large_counts() {
    let mut rng = Rng(seed() ^ 2);
    for &(kind, _) in &KINDS {
        let nranks = if is_reduction(kind) { 4 } else { 3 };
        let (inb, outb) = blocks(kind, u64::from(nranks));
        let count = (1u64 << 20) / inb.max(outb) + 1;
        let c = Case {
            kind,
            dt: DTYPES[0],
            op: SYMCOMM_REDOP_SUM,
            nranks,
            count,
            root: nranks - 1,
            in_place: rng.next() % 2 == 0,
            cta_scope: false,
            src_shift: 1,
            dst_shift: 1,
            ctas: 4,
            threads: 128,
        };
        check(&c, rng.next());
    }
}

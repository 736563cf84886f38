//! The device library's collectives on the emulator, through the built-in kernels
//! `symcomm_collective_<dtype>`: every collective x dtype x op x rank count x count x in/out of
//! place x grid/CTA scope x offsets, checked like nccl-tests (inputs whose results are exactly
//! representable, bit-exact comparison, a tolerance only for avg, `#wrong` counted), plus every
//! other byte of both windows checked untouched (`#clobbered`). The cases and their check are the
//! GPU checks' (`support::cases`, run by `tests/gpu/` on a GPU), here on ranks as threads.
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

use std::time::Duration;

use support::KINDS;
use support::blocks;
use support::cases::{Case, EmuRanks, is_reduction, run_case};
use support::values::{DTYPES, OPS, Rng, seed};
use symcomm::abi::*;

// ---------------------------------------------------------------------------------------------
// Case selection.

const RANKS: [u32; 6] = [1, 2, 3, 4, 5, 8];

fn counts(n: u32) -> Vec<u64> {
    let n = u64::from(n);
    vec![0, 1, n.saturating_sub(1).max(1), n + 1, 61, 1023, 1025]
}

/// Runs `c` on a fresh team of emulated ranks (threads) and fails on any difference.
fn check(c: &Case, salt: u64) {
    let mut team = EmuRanks::new(c.nranks, c.window_bytes()).unwrap();
    let res = run_case(&mut team, c, salt, Duration::from_secs(30));
    assert!(res.ok(), "{}: {}", c.label(), res.describe());
}

/// Every kind x dtype x op once per rank count (all 60 dtype x op pairs for each reduction kind,
/// all 12 dtypes for each copy kind), with the other dimensions drawn from the seeded generator
/// so that, across the run, every count, shift, scope, placement and launch shape appears.
#[test]
fn every_kind_dtype_and_op() {
    let mut rng = Rng(seed());
    let mut cases = 0;
    for kind in KINDS {
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
            for kind in KINDS {
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
    for kind in KINDS {
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

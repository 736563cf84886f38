//! Failure semantics of the device collectives on the emulator, through the built-in kernels
//! `symcomm_collective_<dtype>` (ranks as threads of this process, one `EmuTeam` per case):
//!
//! - a rank that never arrives: every launched rank returns after the deadline with Timeout,
//!   naming the missing peer;
//! - the host raising the abort flag while the kernels wait: every rank returns at once with
//!   Aborted (and a flag raised before the launch stops the wait at once too);
//! - ranks calling different collectives (count, dtype, reduction, algorithm, root, kind, in
//!   place or not), on a fresh team or after matching calls: Mismatch on every rank, promptly,
//!   naming a peer that called something else, with nothing written;
//! - invalid arguments given to every rank: InvalidArgument (or AbiMismatch) on every rank,
//!   promptly, with nothing written;
//! - back-to-back launches with no host action and no synchronization between them (graph
//!   replay): the epochs of the barriers continue in device memory, across kinds, dtypes, grid
//!   shapes and the 32-bit epoch wrap, with every result checked.
//!
//! The ping-pong kernel's failure paths are in `emu_ping_pong.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mod.rs"]
mod support;

use std::ffi::c_void;
use std::time::{Duration, Instant};

use support::cases::kind_name;
use support::{KINDS, blocks};
use symcomm::abi::*;
use symcomm::testing::emu::{EmuTeam, launch};
use symcomm::{DEVICE_IMAGE, DataType};

/// Fill of every window byte that no collective is supposed to write.
const CANARY: u8 = 0xA5;
/// Deadline of the runs that must finish without waiting for it: long, so that a run that
/// wrongly waits for a deadline fails the `PROMPT` check instead of passing by luck.
const LONG: Duration = Duration::from_secs(30);
/// What "promptly" means (a failed call must not wait for any deadline).
const PROMPT: Duration = Duration::from_secs(5);

/// The built-in kernel of a dtype code.
fn kernel_of(dtype: u32) -> &'static str {
    DataType::ALL[dtype as usize].kernel_name()
}

/// Bytes per element of a dtype code.
fn elem_size(dtype: u32) -> u64 {
    DataType::ALL[dtype as usize].size() as u64
}

fn dur(d: Duration) -> u64 {
    d.as_nanos() as u64
}

// ---------------------------------------------------------------------------------------------
// Launching.

/// One launch of a collective kernel by one rank.
#[derive(Clone, Copy, Debug)]
struct Launch {
    kernel: &'static str,
    comm: DevComm,
    args: CollArgs,
    grid: u32,
    block: u32,
}

impl Launch {
    fn rank(&self) -> u32 {
        self.comm.rank
    }

    /// Runs the launch and blocks until the kernel finished.
    fn run(&self) {
        let (mut comm, mut args) = (self.comm, self.args);
        let mut ptrs: [*mut c_void; 2] = [(&raw mut comm).cast(), (&raw mut args).cast()];
        // SAFETY: the kernel takes (DevComm, CollArgs) by value and `ptrs` points at locals of
        // exactly those types; the team's memory that the handles address outlives every launch
        // (the teams of this file outlive the thread scopes that launch).
        unsafe {
            launch(
                &DEVICE_IMAGE,
                self.kernel,
                [self.grid, 1, 1],
                [self.block, 1, 1],
                &mut ptrs,
            )
        }
        .expect("emulator launch");
    }
}

/// Runs each rank's launches, one thread per rank, in order and with no host synchronization
/// between them; `after(rank, k)` runs on the rank's thread after its launch k. Meanwhile this
/// thread runs `during`. Returns, per rank, when its first launch started and its last one
/// returned, and the values `after` returned.
fn run_sequences<R: Send>(
    seqs: &[Vec<Launch>],
    during: impl FnOnce(),
    after: impl Fn(u32, usize) -> R + Sync,
) -> Vec<(Instant, Instant, Vec<R>)> {
    std::thread::scope(|s| {
        let after = &after;
        let joins: Vec<_> = seqs
            .iter()
            .map(|seq| {
                s.spawn(move || {
                    let start = Instant::now();
                    let mut out = Vec::new();
                    for (k, l) in seq.iter().enumerate() {
                        l.run();
                        out.push(after(l.rank(), k));
                    }
                    (start, Instant::now(), out)
                })
            })
            .collect();
        during();
        joins
            .into_iter()
            .map(|j| j.join().expect("rank thread"))
            .collect()
    })
}

/// Runs one launch per rank concurrently (see `run_sequences`); returns when each one started
/// and returned.
fn run_concurrently(calls: &[Launch], during: impl FnOnce()) -> Vec<(Instant, Instant)> {
    let seqs: Vec<Vec<Launch>> = calls.iter().map(|c| vec![*c]).collect();
    run_sequences(&seqs, during, |_, _| ())
        .into_iter()
        .map(|(start, end, _)| (start, end))
        .collect()
}

/// The wall time of each launch.
fn durations(times: &[(Instant, Instant)]) -> Vec<Duration> {
    times.iter().map(|(s, e)| *e - *s).collect()
}

/// Runs one launch per rank concurrently and checks that every rank returned promptly (a
/// failed call must not wait for any deadline); returns each launch with its rank's error
/// record.
fn run_promptly<'a>(
    team: &EmuTeam,
    calls: &'a [Launch],
    label: &str,
) -> Vec<(&'a Launch, ErrorRecord)> {
    let took = durations(&run_concurrently(calls, || {}));
    calls
        .iter()
        .zip(&took)
        .map(|(c, t)| {
            let r = c.rank();
            assert!(*t < PROMPT, "{label}: rank {r} took {t:?}");
            (c, team.error(r))
        })
        .collect()
}

/// A team whose windows are all canary.
fn canary_team(nranks: u32, window_bytes: &[u64]) -> EmuTeam {
    let mut team = EmuTeam::with_windows(nranks, window_bytes).expect("team");
    for w in 0..window_bytes.len() {
        for r in 0..nranks {
            team.bytes_mut(w, r).fill(CANARY);
        }
    }
    team
}

/// Every window copy of every rank in `ranks` still holds only the canary.
fn assert_untouched(
    team: &EmuTeam,
    windows: usize,
    ranks: impl IntoIterator<Item = u32>,
    label: &str,
) {
    for r in ranks {
        for w in 0..windows {
            let bad = team.bytes(w, r).iter().filter(|&&b| b != CANARY).count();
            assert_eq!(bad, 0, "{label}: rank {r} window {w}: {bad} bytes written");
        }
    }
}

/// A grid-scope collective on windows 0 (input) and 1 (output) at offset 0, as every rank calls
/// it in these tests unless a field is overridden.
fn coll(team: &mut EmuTeam, rank: u32, kind: u32, dtype: u32, count: u64) -> CollArgs {
    CollArgs {
        kind,
        dtype,
        redop: SYMCOMM_REDOP_SUM,
        root: 0,
        scope: SYMCOMM_SCOPE_GRID,
        index: 0,
        count,
        src_offset: 0,
        dst_offset: 0,
        tile_stride: 0,
        src: team.window_of(0, rank),
        dst: team.window_of(1, rank),
        ..Default::default()
    }
}

/// The barrier index recorded in a barrier failure's detail is one of the launch's slots.
fn assert_slot(rec: &ErrorRecord, args: &CollArgs, grid: u32, label: &str) {
    let slot = rec.detail >> 32;
    let first = u64::from(args.index);
    assert!(
        (first..first + u64::from(grid)).contains(&slot),
        "{label}: rank {}: barrier index {slot} is not one of the launch's [{first}, {})",
        rec.rank,
        first + u64::from(grid)
    );
}

// ---------------------------------------------------------------------------------------------
// A rank that never arrives; the abort flag.

const WAIT_KINDS: [u32; 4] = [
    SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
    SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT,
    SYMCOMM_COLL_ALL_GATHER,
    SYMCOMM_COLL_BROADCAST,
];

/// Grid shapes (CTAs, threads per CTA): fewer threads than ranks makes one thread poll several
/// peers in turn.
const SHAPES: [(u32, u32); 4] = [(1, 32), (2, 3), (3, 1), (2, 64)];

/// Launches of `kind` for every rank of the team except `missing`.
fn all_but(
    team: &mut EmuTeam,
    missing: u32,
    kind: u32,
    timeout: Duration,
    (grid, block): (u32, u32),
    index: u32,
) -> Vec<Launch> {
    let n = team.nranks();
    (0..n)
        .filter(|&r| r != missing)
        .map(|r| Launch {
            kernel: kernel_of(SYMCOMM_DTYPE_F32),
            comm: team.dev_comm(r, dur(timeout)),
            args: CollArgs {
                root: n - 1,
                index,
                ..coll(team, r, kind, SYMCOMM_DTYPE_F32, 37)
            },
            grid,
            block,
        })
        .collect()
}

#[test]
fn a_rank_that_never_arrives_times_out_every_launched_rank() {
    let timeout = Duration::from_millis(200);
    let mut case = 0;
    for (nranks, missing) in [(2u32, 1u32), (3, 0), (4, 2)] {
        for kind in WAIT_KINDS {
            let shape = SHAPES[case % SHAPES.len()];
            let index = (case as u32 * 13) % 100;
            case += 1;
            let label = format!(
                "{} nranks={nranks} missing={missing} grid={shape:?} index={index}",
                kind_name(kind)
            );
            let bytes = 37 * 4 * u64::from(nranks);
            let mut team = canary_team(nranks, &[bytes, bytes]);
            let calls = all_but(&mut team, missing, kind, timeout, shape, index);
            let took = durations(&run_concurrently(&calls, || {}));
            for (c, t) in calls.iter().zip(&took) {
                let r = c.rank();
                assert!(
                    *t >= timeout && *t < timeout * 20,
                    "{label}: rank {r} returned after {t:?} with a {timeout:?} deadline"
                );
                let rec = team.error(r);
                assert_eq!(
                    (rec.status, rec.rank, rec.peer, rec.op),
                    (SYMCOMM_STATUS_TIMEOUT, r, missing, SYMCOMM_OP_BARRIER),
                    "{label}: rank {r}'s (status, rank, peer, op); record {rec:?}"
                );
                assert_slot(&rec, &c.args, shape.0, &label);
            }
            assert_eq!(
                team.error(missing).status,
                SYMCOMM_STATUS_OK,
                "{label}: the rank that never ran has an error"
            );
            // The first barrier failed: no output was written.
            assert_untouched(&team, 2, 0..nranks, &label);
        }
    }
}

/// Launches queued behind a failed one on the same rank (its stream) fail at once, because the
/// rank's error record already holds an error: four launches with a missing peer take about one
/// deadline, not four. The record keeps the first error (Timeout, the missing peer).
#[test]
fn launches_queued_behind_a_failed_one_fail_at_once() {
    let timeout = Duration::from_secs(2);
    let mut team = canary_team(2, &[37 * 4 * 2, 37 * 4 * 2]);
    let seq: Vec<Launch> = (0..4u32)
        .map(|k| Launch {
            // Each launch on other barrier indices and with another kind, as a real queue would.
            args: CollArgs {
                index: 10 * k,
                ..coll(&mut team, 0, WAIT_KINDS[k as usize], SYMCOMM_DTYPE_F32, 37)
            },
            kernel: kernel_of(SYMCOMM_DTYPE_F32),
            comm: team.dev_comm(0, dur(timeout)),
            grid: 2,
            block: 32,
        })
        .collect();
    let (start, end, _) = run_sequences(&[seq], || {}, |_, _| ()).remove(0);
    let took = end - start;
    assert!(
        took >= timeout && took < timeout * 3 / 2,
        "4 launches behind a missing peer took {took:?} with a {timeout:?} deadline"
    );
    let rec = team.error(0);
    assert_eq!(
        (rec.status, rec.rank, rec.peer, rec.op),
        (SYMCOMM_STATUS_TIMEOUT, 0, 1, SYMCOMM_OP_BARRIER),
        "the first error is kept; record {rec:?}"
    );
    // Either CTA of the first launch (barrier indices 0 and 1) may record it first.
    assert!(
        rec.detail >> 32 < 2,
        "the first launch's barrier indices; record {rec:?}"
    );
}

#[test]
fn raising_the_abort_flag_stops_every_waiting_rank() {
    let raise_after = Duration::from_millis(100);
    for (case, (nranks, missing, kind)) in [
        (2u32, 0u32, SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT),
        (3, 2, SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT),
        (4, 1, SYMCOMM_COLL_ALL_GATHER),
        (3, 1, SYMCOMM_COLL_BROADCAST),
    ]
    .into_iter()
    .enumerate()
    {
        let shape = SHAPES[case % SHAPES.len()];
        let label = format!(
            "{} nranks={nranks} missing={missing} grid={shape:?}",
            kind_name(kind)
        );
        let bytes = 37 * 4 * u64::from(nranks);
        let mut team = canary_team(nranks, &[bytes, bytes]);
        let calls = all_but(&mut team, missing, kind, LONG, shape, 3);
        assert!(!team.abort_raised());
        // The host raises the flag while the kernels run (EmuTeam::set_abort takes &self).
        let mut raised_at = None;
        let times = run_concurrently(&calls, || {
            std::thread::sleep(raise_after);
            raised_at = Some(Instant::now());
            team.set_abort(true);
        });
        let raised_at = raised_at.unwrap();
        assert!(team.abort_raised());
        for (c, (_, end)) in calls.iter().zip(&times) {
            let r = c.rank();
            // Still waiting when the flag went up (the deadline is far), and stopped promptly.
            assert!(
                *end >= raised_at && *end - raised_at < PROMPT,
                "{label}: rank {r} returned {:?} after the flag went up",
                end.saturating_duration_since(raised_at)
            );
            let rec = team.error(r);
            assert_eq!(
                (rec.status, rec.rank, rec.peer, rec.op),
                (SYMCOMM_STATUS_ABORTED, r, missing, SYMCOMM_OP_BARRIER),
                "{label}: rank {r}'s (status, rank, peer, op); record {rec:?}"
            );
            assert_slot(&rec, &c.args, shape.0, &label);
        }
        assert_eq!(team.error(missing).status, SYMCOMM_STATUS_OK, "{label}");
        assert_untouched(&team, 2, 0..nranks, &label);
    }

    // A flag raised before the launch stops the wait at once.
    let mut team = canary_team(3, &[1024, 1024]);
    team.set_abort(true);
    let calls = all_but(
        &mut team,
        0,
        SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
        LONG,
        (2, 32),
        0,
    );
    for (c, rec) in run_promptly(&team, &calls, "pre-raised abort") {
        // The peer is the missing rank, or a launched one that had not arrived yet when the
        // flag was seen.
        assert_eq!(
            (rec.status, rec.rank, rec.op),
            (SYMCOMM_STATUS_ABORTED, c.rank(), SYMCOMM_OP_BARRIER),
            "pre-raised abort: rank {}: {rec:?}",
            c.rank()
        );
        assert!(
            rec.peer < 3 && rec.peer != c.rank(),
            "pre-raised abort: {rec:?}"
        );
    }
    team.set_abort(false);
    assert!(!team.abort_raised());
}

// ---------------------------------------------------------------------------------------------
// Mismatched calls.

/// What a rank calls: (kind, dtype, redop, root, count).
type Call = (u32, u32, u32, u32, u64);

/// A mismatch scenario: the call of the "even" ranks and the call of the "odd" ranks.
struct Mismatch {
    what: &'static str,
    common: Call,
    odd: Call,
}

const MISMATCHES: [Mismatch; 8] = [
    Mismatch {
        what: "count",
        common: (
            SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
            SYMCOMM_DTYPE_F32,
            SYMCOMM_REDOP_SUM,
            0,
            40,
        ),
        odd: (
            SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
            SYMCOMM_DTYPE_F32,
            SYMCOMM_REDOP_SUM,
            0,
            41,
        ),
    },
    Mismatch {
        what: "count (all-gather)",
        common: (SYMCOMM_COLL_ALL_GATHER, SYMCOMM_DTYPE_U8, 0, 0, 64),
        odd: (SYMCOMM_COLL_ALL_GATHER, SYMCOMM_DTYPE_U8, 0, 0, 0),
    },
    Mismatch {
        what: "dtype of the same size",
        common: (
            SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
            SYMCOMM_DTYPE_F32,
            SYMCOMM_REDOP_SUM,
            0,
            40,
        ),
        odd: (
            SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
            SYMCOMM_DTYPE_I32,
            SYMCOMM_REDOP_SUM,
            0,
            40,
        ),
    },
    Mismatch {
        what: "dtype of another size",
        common: (
            SYMCOMM_COLL_REDUCE_SCATTER,
            SYMCOMM_DTYPE_U8,
            SYMCOMM_REDOP_MAX,
            0,
            33,
        ),
        odd: (
            SYMCOMM_COLL_REDUCE_SCATTER,
            SYMCOMM_DTYPE_F64,
            SYMCOMM_REDOP_MAX,
            0,
            33,
        ),
    },
    Mismatch {
        what: "reduction op",
        common: (
            SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT,
            SYMCOMM_DTYPE_I64,
            SYMCOMM_REDOP_SUM,
            0,
            50,
        ),
        odd: (
            SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT,
            SYMCOMM_DTYPE_I64,
            SYMCOMM_REDOP_MAX,
            0,
            50,
        ),
    },
    Mismatch {
        what: "algorithm (one-shot vs two-shot)",
        common: (
            SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
            SYMCOMM_DTYPE_BF16,
            SYMCOMM_REDOP_SUM,
            0,
            40,
        ),
        odd: (
            SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT,
            SYMCOMM_DTYPE_BF16,
            SYMCOMM_REDOP_SUM,
            0,
            40,
        ),
    },
    Mismatch {
        what: "root",
        common: (SYMCOMM_COLL_BROADCAST, SYMCOMM_DTYPE_U32, 0, 0, 40),
        odd: (SYMCOMM_COLL_BROADCAST, SYMCOMM_DTYPE_U32, 0, 1, 40),
    },
    Mismatch {
        what: "kind (reduce vs scatter)",
        common: (
            SYMCOMM_COLL_REDUCE,
            SYMCOMM_DTYPE_I8,
            SYMCOMM_REDOP_SUM,
            1,
            20,
        ),
        odd: (SYMCOMM_COLL_SCATTER, SYMCOMM_DTYPE_I8, 0, 1, 20),
    },
];

/// Which ranks make the odd call: one at the end, one at the start, or half of the team.
fn odd_ranks(nranks: u32) -> Vec<u32> {
    match nranks {
        2 => vec![1],
        3 => vec![0],
        _ => (nranks / 2..nranks).collect(),
    }
}

#[test]
fn mismatched_calls_fail_on_every_rank_without_writing() {
    let mut case = 0usize;
    for m in &MISMATCHES {
        for nranks in [2u32, 3, 4] {
            let (grid, block) = SHAPES[case % SHAPES.len()];
            let cta_scope = case % 3 == 1;
            let index = (case as u32 * 7) % 64;
            let warm_up = case % 2 == 0;
            case += 1;
            let label = format!(
                "{} nranks={nranks} grid={grid}x{block} {} index={index} warm_up={warm_up}",
                m.what,
                if cta_scope { "cta" } else { "grid" }
            );
            let odd = odd_ranks(nranks);
            let call_of = |r: u32| if odd.contains(&r) { m.odd } else { m.common };
            // Room for the largest call: count * nranks elements of 8 bytes per tile.
            let tile = (m.common.4.max(m.odd.4) * u64::from(nranks) + 8) * 8;
            let bytes = tile * u64::from(grid);
            let mut team = canary_team(nranks, &[bytes, bytes]);
            let calls: Vec<Launch> = (0..nranks)
                .map(|r| {
                    let (kind, dtype, redop, root, count) = call_of(r);
                    Launch {
                        kernel: kernel_of(dtype),
                        comm: team.dev_comm(r, dur(LONG)),
                        args: CollArgs {
                            redop,
                            root,
                            index,
                            scope: if cta_scope {
                                SYMCOMM_SCOPE_CTA
                            } else {
                                SYMCOMM_SCOPE_GRID
                            },
                            tile_stride: tile / elem_size(dtype),
                            ..coll(&mut team, r, kind, dtype, count)
                        },
                        grid,
                        block,
                    }
                })
                .collect();
            if warm_up {
                // Matching calls first (count 0: nothing written), so that the mismatch is found
                // at a later epoch of the same barrier indices.
                let warm: Vec<Launch> = calls
                    .iter()
                    .map(|c| Launch {
                        kernel: kernel_of(SYMCOMM_DTYPE_F32),
                        args: CollArgs {
                            kind: SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT,
                            dtype: SYMCOMM_DTYPE_F32,
                            redop: SYMCOMM_REDOP_SUM,
                            count: 0,
                            ..c.args
                        },
                        ..*c
                    })
                    .collect();
                run_concurrently(&warm, || {});
                run_concurrently(&warm, || {});
                for r in 0..nranks {
                    assert_eq!(team.error(r).status, SYMCOMM_STATUS_OK, "{label}: warm-up");
                }
            }
            for (c, rec) in run_promptly(&team, &calls, &label) {
                let r = c.rank();
                assert_eq!(
                    (rec.status, rec.rank, rec.op),
                    (SYMCOMM_STATUS_MISMATCH, r, SYMCOMM_OP_BARRIER),
                    "{label}: rank {r}'s (status, rank, op); record {rec:?}"
                );
                assert!(
                    rec.peer < nranks && call_of(rec.peer) != call_of(r),
                    "{label}: rank {r} names peer {} as the mismatched one, but it made the same call",
                    rec.peer
                );
                assert_slot(&rec, &c.args, grid, &label);
            }
            // The mismatch is found at the first barrier: nothing was written anywhere.
            assert_untouched(&team, 2, 0..nranks, &label);
        }
    }
}

/// Ranks that disagree on in place (same window, NCCL's in-place offsets) fail with Mismatch on
/// every rank: the in-place forms run other barrier sequences (one-shot all-reduce, all-to-all)
/// or read peers' buffers through other windows.
#[test]
fn mixing_in_place_and_out_of_place_is_a_mismatch() {
    let count = 300u64;
    for (i, kind) in KINDS.into_iter().enumerate() {
        let nranks = 2 + (i as u32 % 3);
        let in_place_ranks = odd_ranks(nranks);
        let label = format!(
            "{} nranks={nranks} in place on {in_place_ranks:?}",
            kind_name(kind)
        );
        let bytes = count * u64::from(nranks) * 4 * 2;
        let mut team = canary_team(nranks, &[bytes, bytes]);
        let calls: Vec<Launch> = (0..nranks)
            .map(|r| {
                let mut args = coll(&mut team, r, kind, SYMCOMM_DTYPE_F32, count);
                args.root = nranks - 1;
                if in_place_ranks.contains(&r) {
                    args.dst = args.src;
                    let own = u64::from(r) * count;
                    match kind {
                        SYMCOMM_COLL_ALL_GATHER | SYMCOMM_COLL_ALL_GATHER_LL => {
                            args.src_offset = own;
                        }
                        SYMCOMM_COLL_REDUCE_SCATTER
                        | SYMCOMM_COLL_REDUCE_SCATTER_LL
                        | SYMCOMM_COLL_SCATTER => args.dst_offset = own,
                        _ => {}
                    }
                }
                Launch {
                    kernel: kernel_of(SYMCOMM_DTYPE_F32),
                    comm: team.dev_comm(r, dur(LONG)),
                    args,
                    grid: 1 + (i as u32 % 2),
                    block: 8,
                }
            })
            .collect();
        // LL calls compare fingerprints in the header lines, the others in their first barrier.
        let ll = [
            SYMCOMM_COLL_ALL_REDUCE_LL,
            SYMCOMM_COLL_ALL_GATHER_LL,
            SYMCOMM_COLL_REDUCE_SCATTER_LL,
            SYMCOMM_COLL_BROADCAST_LL,
        ];
        let op = if ll.contains(&kind) {
            SYMCOMM_OP_LL_WAIT
        } else {
            SYMCOMM_OP_BARRIER
        };
        for (c, rec) in run_promptly(&team, &calls, &label) {
            let r = c.rank();
            assert_eq!(
                (rec.status, rec.rank, rec.op),
                (SYMCOMM_STATUS_MISMATCH, r, op),
                "{label}: rank {r}'s (status, rank, op); record {rec:?}"
            );
            assert_ne!(
                in_place_ranks.contains(&rec.peer),
                in_place_ranks.contains(&r),
                "{label}: rank {r} names peer {} as the mismatched one",
                rec.peer
            );
        }
        assert_untouched(&team, 2, 0..nranks, &label);
    }
}

// ---------------------------------------------------------------------------------------------
// Invalid arguments (the same on every rank).

struct Invalid {
    what: &'static str,
    nranks: u32,
    grid: u32,
    block: u32,
    /// The kernel's dtype (the args' dtype may differ).
    kernel_dtype: u32,
    /// Builds rank r's arguments from the valid f32 one-shot all-reduce of 24 elements.
    args: fn(CollArgs, &DevComm) -> CollArgs,
    /// Expected (status, op, detail).
    expect: fn(&CollArgs) -> (u32, u32, u64),
    /// The output stays all canary.
    untouched: bool,
    abi_version: u32,
    /// `DevComm::ll_lines` (0: a communicator without an LL area).
    ll_lines: u32,
}

/// The record of a collective refusing `a` for `reason` (SYMCOMM_REFUSED_*).
fn refused(a: &CollArgs, reason: u32) -> (u32, u32, u64) {
    (
        SYMCOMM_STATUS_INVALID_ARGUMENT,
        SYMCOMM_OP_COLLECTIVE,
        u64::from(reason) << 32 | u64::from(a.kind),
    )
}

fn same_window(mut a: CollArgs) -> CollArgs {
    a.dst = a.src;
    a
}

fn invalid_cases() -> Vec<Invalid> {
    let base = Invalid {
        what: "",
        nranks: 2,
        grid: 1,
        block: 32,
        kernel_dtype: SYMCOMM_DTYPE_F32,
        args: |a, _| a,
        expect: |a| refused(a, SYMCOMM_REFUSED_CODE),
        untouched: true,
        abi_version: SYMCOMM_ABI_VERSION,
        ll_lines: SYMCOMM_LL_LINES,
    };
    vec![
        Invalid {
            what: "kind == SYMCOMM_COLL_COUNT",
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_COUNT,
                ..a
            },
            ..base
        },
        Invalid {
            what: "kind == u32::MAX",
            nranks: 3,
            grid: 2,
            args: |a, _| CollArgs {
                kind: u32::MAX,
                ..a
            },
            ..base
        },
        Invalid {
            what: "dtype == SYMCOMM_DTYPE_COUNT",
            nranks: 4,
            args: |a, _| CollArgs {
                dtype: SYMCOMM_DTYPE_COUNT,
                ..a
            },
            ..base
        },
        Invalid {
            what: "dtype of another kernel (f64 on the f32 kernel)",
            nranks: 3,
            args: |a, _| CollArgs {
                dtype: SYMCOMM_DTYPE_F64,
                ..a
            },
            ..base
        },
        Invalid {
            what: "dtype of the same size (u32 on the f32 kernel)",
            nranks: 2,
            args: |a, _| CollArgs {
                dtype: SYMCOMM_DTYPE_U32,
                kind: SYMCOMM_COLL_ALL_GATHER,
                ..a
            },
            ..base
        },
        Invalid {
            what: "redop == SYMCOMM_REDOP_COUNT",
            nranks: 2,
            grid: 3,
            block: 1,
            args: |a, _| CollArgs {
                redop: SYMCOMM_REDOP_COUNT,
                ..a
            },
            ..base
        },
        Invalid {
            what: "redop 77 (reduce-scatter, u8 kernel)",
            nranks: 4,
            kernel_dtype: SYMCOMM_DTYPE_U8,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_REDUCE_SCATTER,
                dtype: SYMCOMM_DTYPE_U8,
                redop: 77,
                ..a
            },
            ..base
        },
        Invalid {
            what: "scope 2",
            nranks: 3,
            args: |a, _| CollArgs { scope: 2, ..a },
            ..base
        },
        Invalid {
            what: "broadcast root == nranks",
            nranks: 3,
            grid: 2,
            args: |a, c| CollArgs {
                kind: SYMCOMM_COLL_BROADCAST,
                root: c.nranks,
                ..a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_ROOT),
            ..base
        },
        Invalid {
            what: "reduce root > nranks",
            nranks: 2,
            args: |a, c| CollArgs {
                kind: SYMCOMM_COLL_REDUCE,
                root: c.nranks + 5,
                ..a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_ROOT),
            ..base
        },
        Invalid {
            what: "scatter root == nranks (CTA scope)",
            nranks: 4,
            grid: 2,
            args: |a, c| CollArgs {
                kind: SYMCOMM_COLL_SCATTER,
                root: c.nranks,
                scope: SYMCOMM_SCOPE_CTA,
                tile_stride: 200,
                ..a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_ROOT),
            ..base
        },
        Invalid {
            what: "one-shot all-reduce, output overlapping the input",
            nranks: 3,
            args: |a, _| CollArgs {
                dst_offset: 5,
                ..same_window(a)
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_OVERLAP),
            ..base
        },
        Invalid {
            what: "two-shot all-reduce, input overlapping the output (CTA scope)",
            nranks: 2,
            grid: 3,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT,
                src_offset: 8,
                scope: SYMCOMM_SCOPE_CTA,
                tile_stride: 100,
                ..same_window(a)
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_OVERLAP),
            ..base
        },
        Invalid {
            what: "all-gather, input inside the output but not at the rank's block",
            nranks: 4,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_ALL_GATHER,
                src_offset: 1,
                ..same_window(a)
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_OVERLAP),
            ..base
        },
        Invalid {
            what: "reduce-scatter, output inside the input but not at the rank's block",
            nranks: 3,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_REDUCE_SCATTER,
                dst_offset: 3,
                ..same_window(a)
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_OVERLAP),
            ..base
        },
        Invalid {
            what: "broadcast, overlapping",
            nranks: 2,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_BROADCAST,
                dst_offset: 1,
                ..same_window(a)
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_OVERLAP),
            ..base
        },
        Invalid {
            what: "reduce, overlapping",
            nranks: 3,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_REDUCE,
                src_offset: 23,
                ..same_window(a)
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_OVERLAP),
            ..base
        },
        Invalid {
            what: "scatter, overlapping",
            nranks: 2,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_SCATTER,
                dst_offset: 1,
                ..same_window(a)
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_OVERLAP),
            ..base
        },
        Invalid {
            what: "all-to-all, overlapping",
            nranks: 4,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_ALL_TO_ALL,
                dst_offset: 2,
                ..same_window(a)
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_OVERLAP),
            ..base
        },
        Invalid {
            what: "in-place all-to-all with fewer threads than ranks",
            nranks: 4,
            block: 3,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_ALL_TO_ALL,
                ..same_window(a)
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_CTA_SIZE),
            ..base
        },
        Invalid {
            what: "in-place all-to-all with one thread (grid of 2)",
            nranks: 3,
            grid: 2,
            block: 1,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_ALL_TO_ALL,
                ..same_window(a)
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_CTA_SIZE),
            ..base
        },
        Invalid {
            what: "input offset + count wraps around 2^64",
            nranks: 3,
            args: |a, _| CollArgs {
                src_offset: u64::MAX - 3,
                ..a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_SRC_RANGE),
            ..base
        },
        Invalid {
            what: "output offset + count wraps around 2^64 (all-gather)",
            nranks: 2,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_ALL_GATHER,
                dst_offset: u64::MAX - 30,
                ..a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_DST_RANGE),
            ..base
        },
        Invalid {
            what: "count far past the mapping (one-shot all-reduce: reads would fault)",
            nranks: 2,
            args: |a, _| CollArgs {
                count: 1 << 40,
                ..a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_SRC_RANGE),
            ..base
        },
        Invalid {
            what: "count * nranks wraps around 2^64 (all-to-all)",
            nranks: 4,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_ALL_TO_ALL,
                count: 1 << 62,
                ..a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_SRC_RANGE),
            ..base
        },
        Invalid {
            what: "CTA scope: the second CTA's tile is past the window",
            nranks: 3,
            grid: 2,
            args: |a, _| CollArgs {
                scope: SYMCOMM_SCOPE_CTA,
                tile_stride: 1000,
                ..a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_SRC_RANGE),
            // The first CTA's tile is valid and done.
            untouched: false,
            ..base
        },
        Invalid {
            what: "CTA scope: the third CTA's tile offset wraps around 2^64",
            nranks: 2,
            grid: 3,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_BROADCAST,
                scope: SYMCOMM_SCOPE_CTA,
                dst_offset: 5,
                tile_stride: 1 << 63,
                ..a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_SRC_RANGE),
            untouched: false,
            ..base
        },
        Invalid {
            what: "f32 input window reduced as i32",
            nranks: 3,
            kernel_dtype: SYMCOMM_DTYPE_I32,
            args: |mut a, _| {
                a.dtype = SYMCOMM_DTYPE_I32;
                (a.src.elem_size, a.src.dtype) = (4, SYMCOMM_DTYPE_F32);
                (a.dst.elem_size, a.dst.dtype) = (4, SYMCOMM_DTYPE_I32);
                a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_DTYPE),
            ..base
        },
        Invalid {
            what: "f32 output window of a u32 all-gather",
            nranks: 2,
            kernel_dtype: SYMCOMM_DTYPE_U32,
            args: |mut a, _| {
                (a.kind, a.dtype) = (SYMCOMM_COLL_ALL_GATHER, SYMCOMM_DTYPE_U32);
                (a.dst.elem_size, a.dst.dtype) = (4, SYMCOMM_DTYPE_F32);
                a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_DTYPE),
            ..base
        },
        Invalid {
            what: "untyped window of 8-byte elements reduced as f32",
            nranks: 2,
            args: |mut a, _| {
                (a.src.elem_size, a.src.dtype) = (8, SYMCOMM_DTYPE_NONE);
                a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_ELEM_SIZE),
            ..base
        },
        Invalid {
            what: "window handle of element size 0",
            nranks: 2,
            args: |mut a, _| {
                a.dst.elem_size = 0;
                a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_ELEM_SIZE),
            ..base
        },
        Invalid {
            what: "window of fewer ranks than the communicator",
            nranks: 3,
            args: |mut a, _| {
                a.src.nranks = 2;
                a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_PEER),
            ..base
        },
        Invalid {
            what: "barrier index out of range",
            nranks: 3,
            args: |a, _| CollArgs {
                index: SYMCOMM_USER_BARRIER_END,
                ..a
            },
            expect: |a| {
                (
                    SYMCOMM_STATUS_INVALID_ARGUMENT,
                    SYMCOMM_OP_BARRIER,
                    u64::from(a.index),
                )
            },
            ..base
        },
        Invalid {
            what: "barrier index out of range for the second CTA only",
            nranks: 2,
            grid: 2,
            args: |a, _| CollArgs {
                index: SYMCOMM_USER_BARRIER_END - 1,
                ..a
            },
            expect: |_| {
                (
                    SYMCOMM_STATUS_INVALID_ARGUMENT,
                    SYMCOMM_OP_BARRIER,
                    u64::from(SYMCOMM_USER_BARRIER_END),
                )
            },
            // The first CTA does its part.
            untouched: false,
            ..base
        },
        Invalid {
            what: "stale ABI version",
            nranks: 3,
            grid: 2,
            expect: |a| {
                (
                    SYMCOMM_STATUS_ABI_MISMATCH,
                    SYMCOMM_OP_COLLECTIVE,
                    u64::from(a.kind),
                )
            },
            abi_version: SYMCOMM_ABI_VERSION + 1,
            ..base
        },
        Invalid {
            what: "LL all-reduce on a communicator without an LL area",
            nranks: 3,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_ALL_REDUCE_LL,
                ..a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_LL),
            ll_lines: 0,
            ..base
        },
        Invalid {
            what: "LL all-gather on a communicator without an LL area",
            nranks: 2,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_ALL_GATHER_LL,
                ..a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_LL),
            ll_lines: 0,
            ..base
        },
        Invalid {
            what: "LL all-gather on a barrier index past the LL area",
            nranks: 3,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_ALL_GATHER_LL,
                index: SYMCOMM_USER_BARRIER_END,
                ..a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_LL),
            ..base
        },
        Invalid {
            what: "LL reduce-scatter on a communicator without an LL area",
            nranks: 3,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_REDUCE_SCATTER_LL,
                ..a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_LL),
            ll_lines: 0,
            ..base
        },
        Invalid {
            what: "LL broadcast on a barrier index past the LL area",
            nranks: 2,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_BROADCAST_LL,
                index: SYMCOMM_USER_BARRIER_END,
                ..a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_LL),
            ..base
        },
        Invalid {
            what: "LL broadcast with a root out of range",
            nranks: 3,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_BROADCAST_LL,
                root: 3,
                ..a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_ROOT),
            ..base
        },
        Invalid {
            what: "LL all-reduce on a barrier index past the LL area",
            nranks: 2,
            args: |a, _| CollArgs {
                kind: SYMCOMM_COLL_ALL_REDUCE_LL,
                index: SYMCOMM_USER_BARRIER_END,
                ..a
            },
            expect: |a| refused(a, SYMCOMM_REFUSED_LL),
            ..base
        },
    ]
}

#[test]
fn invalid_arguments_are_refused_on_every_rank() {
    for case in invalid_cases() {
        let label = format!(
            "{} (nranks={} grid={}x{})",
            case.what, case.nranks, case.grid, case.block
        );
        let bytes = 256 * 4 * u64::from(case.grid.max(2));
        let mut team = canary_team(case.nranks, &[bytes, bytes]);
        let calls: Vec<Launch> = (0..case.nranks)
            .map(|r| {
                let mut comm = team.dev_comm(r, dur(LONG));
                comm.abi_version = case.abi_version;
                comm.ll_lines = case.ll_lines;
                let valid = coll(
                    &mut team,
                    r,
                    SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
                    SYMCOMM_DTYPE_F32,
                    24,
                );
                Launch {
                    kernel: kernel_of(case.kernel_dtype),
                    args: (case.args)(valid, &comm),
                    comm,
                    grid: case.grid,
                    block: case.block,
                }
            })
            .collect();
        for (c, rec) in run_promptly(&team, &calls, &label) {
            let r = c.rank();
            let (status, op, detail) = (case.expect)(&c.args);
            // Argument errors involve no peer: the record names the rank itself.
            assert_eq!(
                (rec.status, rec.rank, rec.peer, rec.op, rec.detail),
                (status, r, r, op, detail),
                "{label}: rank {r}'s (status, rank, peer, op, detail); record {rec:?}"
            );
        }
        if case.untouched {
            assert_untouched(&team, 2, 0..case.nranks, &label);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Barrier indices and send/recv's signal words.

/// Every word of the team's signal area (read between launches).
fn signal_words(team: &mut EmuTeam) -> Vec<u64> {
    let comm = team.dev_comm(0, 0);
    let words = (comm.nranks * comm.nranks * comm.signal_words) as usize;
    // SAFETY: the team's signal area holds nranks * nranks * signal_words aligned u64 words from
    // `signal_base`, and no kernel runs while the team is borrowed mutably.
    unsafe { std::slice::from_raw_parts(comm.signal_base as *const u64, words) }.to_vec()
}

/// A one-operation `symcomm_sendrecv` launch: `kind` (SYMCOMM_P2P_SEND or _RECV) of `buf` with
/// `peer`, through window `stage` of the team.
fn p2p_args(
    team: &mut EmuTeam,
    rank: u32,
    stage: usize,
    kind: u32,
    peer: u32,
    buf: &mut [u8],
) -> P2pArgs {
    let mut args = P2pArgs {
        stage: team.window_of(stage, rank),
        nops: 1,
        ..P2pArgs::default()
    };
    args.ops[0] = P2pOp {
        addr: buf.as_mut_ptr() as u64,
        bytes: buf.len() as u64,
        peer,
        kind,
        ..P2pOp::default()
    };
    args
}

/// Runs `symcomm_sendrecv` (the CTAs its operations ask for) and blocks until the kernel
/// finished.
fn run_sendrecv(comm: DevComm, args: P2pArgs) {
    let (mut comm, mut args) = (comm, args);
    let mut ptrs: [*mut c_void; 2] = [(&raw mut comm).cast(), (&raw mut args).cast()];
    // SAFETY: the kernel takes (DevComm, P2pArgs) by value and `ptrs` points at locals of exactly
    // those types; the team and the buffers that `args` addresses outlive the launch (they
    // belong to the caller's frame, which waits for it).
    unsafe {
        launch(
            &DEVICE_IMAGE,
            "symcomm_sendrecv",
            [
                args.ops[..args.nops as usize]
                    .iter()
                    .map(|o| o.ctas.max(1))
                    .sum(),
                1,
                1,
            ],
            [64, 1, 1],
            &mut ptrs,
        )
    }
    .expect("emulator launch");
}

/// Barrier indices from SYMCOMM_USER_BARRIER_END to the end of the signal words would use
/// send/recv's words: a kernel's barrier there is refused with InvalidArgument on every rank,
/// touching no signal word, and a send/recv between the ranks afterwards works. (Before the
/// limit came down from 192, a barrier at 188 stored its epoch into the receiver's "data ready"
/// word, and the receiver, launched before the sender, took a chunk never sent: Mismatch.)
#[test]
fn barriers_on_send_recv_words_are_refused_and_send_recv_still_works() {
    const MSG: usize = 1000;
    let past_words = SYMCOMM_SIGNAL_WORDS - SYMCOMM_BARRIER_WORD_FIRST;
    for index in SYMCOMM_USER_BARRIER_END..past_words {
        let label = format!("barrier index {index}");
        let bytes = 37 * 4 * 2;
        let mut team = canary_team(2, &[bytes, bytes, 4096]);
        let calls: Vec<Launch> = (0..2)
            .map(|r| Launch {
                kernel: kernel_of(SYMCOMM_DTYPE_F32),
                comm: team.dev_comm(r, dur(LONG)),
                args: CollArgs {
                    index,
                    ..coll(
                        &mut team,
                        r,
                        SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
                        SYMCOMM_DTYPE_F32,
                        37,
                    )
                },
                grid: 1,
                block: 32,
            })
            .collect();
        for (c, rec) in run_promptly(&team, &calls, &label) {
            let r = c.rank();
            assert_eq!(
                (rec.status, rec.rank, rec.peer, rec.op, rec.detail),
                (
                    SYMCOMM_STATUS_INVALID_ARGUMENT,
                    r,
                    r,
                    SYMCOMM_OP_BARRIER,
                    u64::from(index)
                ),
                "{label}: rank {r}'s (status, rank, peer, op, detail); record {rec:?}"
            );
        }
        assert_untouched(&team, 2, 0..2, &label);
        assert!(
            signal_words(&mut team).iter().all(|&w| w == 0),
            "{label}: a refused barrier wrote signal words"
        );

        // Rank 1 receives from rank 0; it starts first, so a stale "data ready" word would let
        // it take the chunk before the sender has sent it.
        team.clear_errors();
        let mut sent: Vec<u8> = (0..MSG).map(|i| (i * 7 + 3) as u8).collect();
        let mut got = vec![0u8; MSG];
        let send = (
            team.dev_comm(0, dur(PROMPT)),
            p2p_args(&mut team, 0, 2, SYMCOMM_P2P_SEND, 1, &mut sent),
        );
        let recv = (
            team.dev_comm(1, dur(PROMPT)),
            p2p_args(&mut team, 1, 2, SYMCOMM_P2P_RECV, 0, &mut got),
        );
        std::thread::scope(|s| {
            let receiver = s.spawn(move || run_sendrecv(recv.0, recv.1));
            std::thread::sleep(Duration::from_millis(100));
            run_sendrecv(send.0, send.1);
            receiver.join().expect("receiver thread");
        });
        for r in 0..2 {
            let rec = team.error(r);
            assert_eq!(
                rec.status, SYMCOMM_STATUS_OK,
                "{label}: send/recv after it: rank {r}: {rec:?}"
            );
        }
        assert!(
            got == sent,
            "{label}: send/recv after it delivered other bytes"
        );
    }
}

/// A receiver that cuts the staging window into other channels than its sender (one channel
/// against eight: the slots of every piece but the first differ) records Mismatch before it
/// copies a byte — the sender's first piece carries its layout with the message length — and the
/// sender, whose pieces are never consumed, times out. Before the layout was part of that word,
/// the receiver took the first piece as the whole message and read the rest from slots the sender
/// never wrote.
#[test]
fn a_staging_layout_mismatch_is_a_mismatch_before_any_byte_moves() {
    const MSG: usize = 1000;
    let mut team = canary_team(2, &[16, 16, 4096]);
    let mut sent: Vec<u8> = (0..MSG).map(|i| (i * 5 + 1) as u8).collect();
    let mut got = vec![0u8; MSG];
    let mut send_args = p2p_args(&mut team, 0, 2, SYMCOMM_P2P_SEND, 1, &mut sent);
    send_args.channels = 8;
    send_args.ops[0].ctas = 8;
    let mut recv_args = p2p_args(&mut team, 1, 2, SYMCOMM_P2P_RECV, 0, &mut got);
    recv_args.channels = 1;
    let send = (team.dev_comm(0, dur(Duration::from_millis(500))), send_args);
    let recv = (team.dev_comm(1, dur(PROMPT)), recv_args);
    std::thread::scope(|s| {
        let receiver = s.spawn(move || run_sendrecv(recv.0, recv.1));
        run_sendrecv(send.0, send.1);
        receiver.join().expect("receiver thread");
    });
    let (tx, rx) = (team.error(0), team.error(1));
    assert_eq!(
        (rx.status, rx.rank, rx.peer),
        (SYMCOMM_STATUS_MISMATCH, 1, 0),
        "receiver: {rx:?}"
    );
    assert_eq!(
        (tx.status, tx.rank, tx.peer),
        (SYMCOMM_STATUS_TIMEOUT, 0, 1),
        "sender: {tx:?}"
    );
    assert!(got.iter().all(|&b| b == 0), "the receiver wrote bytes");
}

// ---------------------------------------------------------------------------------------------
// Bounds: ranges at and past the end of the windows.

/// Every kind, out of place (input short, output short) and in place, on windows whose handles
/// claim exactly the bytes the call needs — the call runs and writes nothing past them — or one
/// byte less — every rank refuses it with the range's reason and writes nothing at all. The
/// team's memory reaches past the handles' sizes, so a write past them would hit the canary.
#[test]
fn ranges_past_the_window_are_refused_on_every_rank_for_every_kind() {
    const COUNT: u64 = 10;
    const TEAM_BYTES: u64 = 4096;
    for (case, &kind) in KINDS.iter().enumerate() {
        for nranks in [2u32, 3] {
            let (sb, db) = blocks(kind, u64::from(nranks));
            // (label, input bytes, output bytes, in place, accepted reasons)
            let need = |blocks: u64| blocks * COUNT * 4;
            let variants = [
                ("exact", need(sb), need(db), false, &[][..]),
                (
                    "input short",
                    need(sb) - 1,
                    need(db),
                    false,
                    &[SYMCOMM_REFUSED_SRC_RANGE][..],
                ),
                (
                    "output short",
                    need(sb),
                    need(db) - 1,
                    false,
                    &[SYMCOMM_REFUSED_DST_RANGE][..],
                ),
                ("in place, exact", need(sb.max(db)), 0, true, &[][..]),
                // In place, a rank's own block may still fit in the input or output while the
                // whole range does not: either reason.
                (
                    "in place, short",
                    need(sb.max(db)) - 1,
                    0,
                    true,
                    &[SYMCOMM_REFUSED_SRC_RANGE, SYMCOMM_REFUSED_DST_RANGE][..],
                ),
            ];
            for (what, src_bytes, dst_bytes, in_place, reasons) in variants {
                // Typed windows (f32) in one case of two, byte windows in the other.
                let typed = (case + nranks as usize) % 2 == 0;
                let label = format!("{} {what} nranks={nranks} typed={typed}", kind_name(kind));
                let mut team = canary_team(nranks, &[TEAM_BYTES, TEAM_BYTES]);
                let calls: Vec<Launch> = (0..nranks)
                    .map(|r| {
                        let mut a = coll(&mut team, r, kind, SYMCOMM_DTYPE_F32, COUNT);
                        a.root = nranks - 1;
                        a.src.bytes = src_bytes;
                        a.dst.bytes = dst_bytes;
                        if in_place {
                            a.dst = a.src;
                            let own = u64::from(r) * COUNT;
                            match kind {
                                SYMCOMM_COLL_ALL_GATHER | SYMCOMM_COLL_ALL_GATHER_LL => {
                                    a.src_offset = own;
                                }
                                SYMCOMM_COLL_REDUCE_SCATTER
                                | SYMCOMM_COLL_REDUCE_SCATTER_LL
                                | SYMCOMM_COLL_SCATTER => {
                                    a.dst_offset = own;
                                }
                                _ => {}
                            }
                        }
                        if typed {
                            for w in [&mut a.src, &mut a.dst] {
                                (w.elem_size, w.dtype) = (4, SYMCOMM_DTYPE_F32);
                            }
                        }
                        Launch {
                            kernel: kernel_of(SYMCOMM_DTYPE_F32),
                            comm: team.dev_comm(r, dur(LONG)),
                            args: a,
                            grid: 2,
                            block: 32,
                        }
                    })
                    .collect();
                for (c, rec) in run_promptly(&team, &calls, &label) {
                    let r = c.rank();
                    if reasons.is_empty() {
                        assert_eq!(rec.status, SYMCOMM_STATUS_OK, "{label}: rank {r}: {rec:?}");
                        continue;
                    }
                    let reason = (rec.detail >> 32) as u32;
                    assert_eq!(
                        (rec.status, rec.rank, rec.peer, rec.op, rec.detail as u32),
                        (
                            SYMCOMM_STATUS_INVALID_ARGUMENT,
                            r,
                            r,
                            SYMCOMM_OP_COLLECTIVE,
                            kind
                        ),
                        "{label}: rank {r}'s record {rec:?}"
                    );
                    assert!(
                        reasons.contains(&reason),
                        "{label}: rank {r}: reason {reason}, expected one of {reasons:?}"
                    );
                }
                if reasons.is_empty() {
                    // Nothing past what the handles claim.
                    for r in 0..nranks {
                        for (w, end) in [(0, src_bytes), (1, dst_bytes)] {
                            let past = &team.bytes(w, r)[end as usize..];
                            let bad = past.iter().filter(|&&b| b != CANARY).count();
                            assert_eq!(
                                bad, 0,
                                "{label}: rank {r} window {w}: {bad} bytes written past the end"
                            );
                        }
                    }
                } else {
                    assert_untouched(&team, 2, 0..nranks, &label);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Back-to-back launches and graph replay.

/// Integer element types of the back-to-back tests: (code, bits, signed).
#[derive(Clone, Copy, Debug)]
struct IntType {
    code: u32,
    bits: u32,
    signed: bool,
}

const U8: IntType = IntType::new(SYMCOMM_DTYPE_U8, 8, false);
const I8: IntType = IntType::new(SYMCOMM_DTYPE_I8, 8, true);
const I32: IntType = IntType::new(SYMCOMM_DTYPE_I32, 32, true);
const U32: IntType = IntType::new(SYMCOMM_DTYPE_U32, 32, false);
const I64: IntType = IntType::new(SYMCOMM_DTYPE_I64, 64, true);
const U64: IntType = IntType::new(SYMCOMM_DTYPE_U64, 64, false);

impl IntType {
    const fn new(code: u32, bits: u32, signed: bool) -> Self {
        IntType { code, bits, signed }
    }
    fn size(self) -> usize {
        (self.bits / 8) as usize
    }
    fn mask(self) -> u64 {
        if self.bits == 64 {
            u64::MAX
        } else {
            (1u64 << self.bits) - 1
        }
    }
    /// The value of `bits` as a wide integer (sign-extended when signed).
    fn value(self, bits: u64) -> i128 {
        let u = bits & self.mask();
        if self.signed && (u >> (self.bits - 1)) & 1 == 1 {
            i128::from(u) - (1i128 << self.bits)
        } else {
            i128::from(u)
        }
    }
    fn wrap(self, v: i128) -> u64 {
        (v as u64) & self.mask()
    }
    /// The reduction of `xs` (rank order) as the device computes it: sums and products wrap,
    /// avg divides the wrapped sum with truncation.
    fn reduce(self, op: u32, xs: &[u64]) -> u64 {
        let vals: Vec<i128> = xs.iter().map(|&x| self.value(x)).collect();
        let sum = || vals.iter().fold(0u64, |a, &b| self.wrap(i128::from(a) + b));
        match op {
            SYMCOMM_REDOP_SUM => sum(),
            SYMCOMM_REDOP_PROD => vals
                .iter()
                .fold(1u64, |a, &b| a.wrapping_mul(b as u64) & self.mask()),
            SYMCOMM_REDOP_MIN => self.wrap(*vals.iter().min().unwrap()),
            SYMCOMM_REDOP_MAX => self.wrap(*vals.iter().max().unwrap()),
            _ => self.wrap(self.value(sum()) / vals.len() as i128),
        }
    }
    fn read(self, bytes: &[u8], elem: u64) -> u64 {
        let at = elem as usize * self.size();
        let mut raw = [0u8; 8];
        raw[..self.size()].copy_from_slice(&bytes[at..at + self.size()]);
        u64::from_le_bytes(raw)
    }
    fn write(self, bytes: &mut [u8], elem: u64, v: u64) {
        let at = elem as usize * self.size();
        bytes[at..at + self.size()].copy_from_slice(&v.to_le_bytes()[..self.size()]);
    }
}

/// A copy of `len` bytes of rank `rank`'s copy of `win`, read through its address while other
/// ranks' kernels may run (they only read this copy; it is written by this rank's own kernels,
/// which are not running).
fn snapshot(win: &WindowHandleRaw, rank: u32, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let src = (win.base + u64::from(rank) * win.stride) as *const u8;
    // SAFETY: `src` is the start of rank `rank`'s copy, `len` <= its size, in a team that
    // outlives the launching scope; no kernel writes that copy while this runs (see above).
    unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), len) };
    out
}

/// Graph replay: each rank launches the in-place all-reduce of its whole window 20 times in a
/// row, its thread never waiting for the others between launches and the host touching nothing
/// but reads; each launch multiplies the (wrapping) sums by nranks, checked after every launch.
#[test]
fn replayed_launches_continue_their_epochs_in_device_memory() {
    const LAUNCHES: usize = 20;
    /// One replay: `kinds` are launched in turn; `first_epoch` is where every barrier index's
    /// epoch starts (0 for a fresh team, near 2^32 to cross the 32-bit epoch wrap).
    struct Replay {
        nranks: u32,
        ty: IntType,
        count: u64,
        grid: u32,
        block: u32,
        cta_scope: bool,
        kinds: &'static [u32],
        first_epoch: u32,
    }
    const BOTH: &[u32] = &[
        SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
        SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT,
    ];
    const ALL3: &[u32] = &[
        SYMCOMM_COLL_ALL_REDUCE_LL,
        SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
        SYMCOMM_COLL_ALL_REDUCE_LL,
        SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT,
    ];
    let configs = [
        Replay {
            nranks: 3,
            ty: U64,
            count: 1001,
            grid: 2,
            block: 32,
            cta_scope: false,
            kinds: BOTH,
            first_epoch: 0,
        },
        Replay {
            nranks: 4,
            ty: U32,
            count: 37,
            grid: 3,
            block: 8,
            cta_scope: true,
            kinds: &[
                SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT,
                SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
            ],
            first_epoch: 0,
        },
        Replay {
            nranks: 2,
            ty: U8,
            count: 300,
            grid: 1,
            block: 1,
            cta_scope: false,
            kinds: &[SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT],
            first_epoch: 0,
        },
        Replay {
            nranks: 5,
            ty: I32,
            count: 77,
            grid: 2,
            block: 64,
            cta_scope: false,
            kinds: &[SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT],
            first_epoch: 0,
        },
        Replay {
            nranks: 3,
            ty: I64,
            count: 100,
            grid: 2,
            block: 16,
            cta_scope: false,
            kinds: BOTH,
            first_epoch: u32::MAX - 6,
        },
        // LL: back-to-back rounds on both buffers, mixed with the barrier algorithms on the same
        // indices, several rounds per launch (u8 x 5000 = 3 rounds on one CTA), and the flag's
        // wrap (first_epoch also starts the LL epoch words just below 2^32 - 1 rounds).
        Replay {
            nranks: 3,
            ty: U8,
            count: 5000,
            grid: 1,
            block: 32,
            cta_scope: false,
            kinds: &[SYMCOMM_COLL_ALL_REDUCE_LL],
            first_epoch: 0,
        },
        Replay {
            nranks: 4,
            ty: U32,
            count: 999,
            grid: 2,
            block: 16,
            cta_scope: true,
            kinds: ALL3,
            first_epoch: 0,
        },
        Replay {
            nranks: 2,
            ty: U64,
            count: 700,
            grid: 3,
            block: 64,
            cta_scope: false,
            kinds: ALL3,
            first_epoch: u32::MAX - 6,
        },
    ];
    for Replay {
        nranks,
        ty,
        count,
        grid,
        block,
        cta_scope,
        kinds,
        first_epoch,
    } in configs
    {
        let label = format!(
            "{:?} nranks={nranks} count={count} grid={grid}x{block} cta_scope={cta_scope} first_epoch={first_epoch:#x}",
            ty
        );
        let tiles = if cta_scope { u64::from(grid) } else { 1 };
        let elems = count * tiles;
        let len = elems as usize * ty.size();
        let mut team = EmuTeam::new(nranks, len as u64).expect("team");
        if first_epoch != 0 {
            // As if every barrier index had completed `first_epoch` barriers on every rank, and
            // `first_epoch` LL rounds (so that the LL flags wrap during the replay).
            let comm = team.dev_comm(0, 0);
            for r in 0..u64::from(nranks) {
                let array = (comm.signal_base + r * comm.signal_stride) as *mut u64;
                for i in 0..(nranks * comm.signal_words) as usize {
                    // SAFETY: rank r's signal array holds nranks * signal_words aligned u64 words
                    // at its start (SignalLayout); no kernel runs yet.
                    unsafe { array.add(i).write(u64::from(first_epoch) << 32) };
                }
                let epochs =
                    (comm.signal_base + r * comm.signal_stride + comm.ll_offset) as *mut u64;
                for i in 0..SYMCOMM_USER_BARRIER_END as usize {
                    // SAFETY: the LL area starts with one aligned u64 epoch word per barrier index.
                    unsafe { epochs.add(i).write(u64::from(first_epoch)) };
                }
            }
        }
        let mut sum = vec![0u64; elems as usize];
        for r in 0..nranks {
            let bytes = team.bytes_mut(0, r);
            for e in 0..elems {
                let v = ty.wrap(i128::from(r) * 1000 + i128::from(e) + 1);
                ty.write(bytes, e, v);
                sum[e as usize] = ty.wrap(i128::from(sum[e as usize]) + i128::from(v));
            }
        }
        let seqs: Vec<Vec<Launch>> = (0..nranks)
            .map(|r| {
                let comm = team.dev_comm(r, dur(LONG));
                let win = team.window(r);
                (0..LAUNCHES)
                    .map(|k| Launch {
                        kernel: kernel_of(ty.code),
                        comm,
                        args: CollArgs {
                            kind: kinds[k % kinds.len()],
                            dtype: ty.code,
                            redop: SYMCOMM_REDOP_SUM,
                            root: 0,
                            scope: if cta_scope {
                                SYMCOMM_SCOPE_CTA
                            } else {
                                SYMCOMM_SCOPE_GRID
                            },
                            index: 0,
                            count,
                            src_offset: 0,
                            dst_offset: 0,
                            tile_stride: count,
                            src: win,
                            dst: win,
                            ..Default::default()
                        },
                        grid,
                        block,
                    })
                    .collect()
            })
            .collect();
        let wins: Vec<WindowHandleRaw> = (0..nranks).map(|r| team.window(r)).collect();
        let start = Instant::now();
        let results = run_sequences(&seqs, || {}, |r, _| snapshot(&wins[r as usize], r, len));
        let took = start.elapsed();
        assert!(
            took < PROMPT * 4,
            "{label}: {LAUNCHES} launches took {took:?}"
        );
        for r in 0..nranks {
            let rec = team.error(r);
            assert_eq!(rec.status, SYMCOMM_STATUS_OK, "{label}: rank {r}: {rec:?}");
        }
        for (r, (_, _, snaps)) in results.iter().enumerate() {
            let mut want = sum.clone();
            for (k, snap) in snaps.iter().enumerate() {
                let wrong = (0..elems)
                    .filter(|&e| ty.read(snap, e) != want[e as usize])
                    .count();
                assert_eq!(
                    wrong,
                    0,
                    "{label}: rank {r} after launch {k}: {wrong} wrong elements (first: got {} want {})",
                    ty.read(snap, 0),
                    want[0]
                );
                for w in &mut want {
                    *w = ty.wrap(i128::from(*w) * i128::from(nranks));
                }
            }
        }
    }
}

/// One launch of the back-to-back sequence.
#[derive(Clone, Copy, Debug)]
struct Step {
    kind: u32,
    ty: IntType,
    op: u32,
    root: u32,
    count: u64,
    grid: u32,
    block: u32,
    cta_scope: bool,
    in_place: bool,
    index: u32,
    /// Element offset of the step's region (the same in both windows).
    base: u64,
    /// Misalignment of the input and output inside the region (elements).
    shift: (u64, u64),
    tile_stride: u64,
}

impl Step {
    fn tiles(&self) -> u64 {
        if self.cta_scope {
            u64::from(self.grid)
        } else {
            1
        }
    }
    /// (input elements, output elements) per rank, in units of count.
    fn blocks(&self, n: u64) -> (u64, u64) {
        blocks(self.kind, n)
    }
    /// (window, first element) of rank r's input and output in tile 0, following NCCL's
    /// in-place conventions.
    fn offsets(&self, r: u64) -> ((usize, u64), (usize, u64)) {
        if !self.in_place {
            return ((0, self.base + self.shift.0), (1, self.base + self.shift.1));
        }
        let b = self.base + self.shift.0;
        match self.kind {
            SYMCOMM_COLL_ALL_GATHER | SYMCOMM_COLL_ALL_GATHER_LL => {
                ((0, b + r * self.count), (0, b))
            }
            SYMCOMM_COLL_REDUCE_SCATTER | SYMCOMM_COLL_REDUCE_SCATTER_LL | SYMCOMM_COLL_SCATTER => {
                ((0, b), (0, b + r * self.count))
            }
            _ => ((0, b), (0, b)),
        }
    }
}

fn input_value(ty: IntType, op: u32, rank: u32, step: usize, e: u64) -> u64 {
    let mut z = (u64::from(rank) << 48) ^ ((step as u64) << 32) ^ e;
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    if op == SYMCOMM_REDOP_PROD {
        // Small factors keep products interesting after wrapping.
        return ty.wrap(i128::from(z % 7) - 3);
    }
    z & ty.mask()
}

/// Many launches of every kind, dtype and grid shape in a row on one team, each rank's thread
/// running its whole sequence without waiting for the others (so one rank may start launch k+1,
/// with another grid shape and barrier indices, while a peer still runs launch k). Each step has
/// its own region of the windows, written before the first launch; at the end both windows must
/// equal their initial contents with every step's outputs applied.
#[test]
fn back_to_back_launches_of_every_kind_and_grid_shape() {
    const KINDS: [u32; 12] = [
        SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
        SYMCOMM_COLL_ALL_GATHER_LL,
        SYMCOMM_COLL_ALL_GATHER,
        SYMCOMM_COLL_BROADCAST_LL,
        SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT,
        SYMCOMM_COLL_BROADCAST,
        SYMCOMM_COLL_REDUCE_SCATTER,
        SYMCOMM_COLL_REDUCE_SCATTER_LL,
        SYMCOMM_COLL_SCATTER,
        SYMCOMM_COLL_REDUCE,
        SYMCOMM_COLL_ALL_REDUCE_LL,
        SYMCOMM_COLL_ALL_TO_ALL,
    ];
    const TYPES: [IntType; 6] = [U32, I64, U8, I32, U64, I8];
    const OPS: [u32; 5] = [
        SYMCOMM_REDOP_SUM,
        SYMCOMM_REDOP_MAX,
        SYMCOMM_REDOP_MIN,
        SYMCOMM_REDOP_PROD,
        SYMCOMM_REDOP_AVG,
    ];
    const GRIDS: [(u32, u32); 6] = [(1, 32), (3, 8), (2, 1), (4, 64), (2, 32), (1, 5)];
    const COUNTS: [u64; 7] = [0, 1, 17, 64, 129, 5, 250];
    const STEPS: usize = 64;
    for nranks in [2u32, 3, 4, 5, 8] {
        let n = u64::from(nranks);
        let mut steps = Vec::new();
        let mut bytes = 0u64;
        for i in 0..STEPS {
            let kind = KINDS[i % KINDS.len()];
            let (grid, mut block) = GRIDS[(i + nranks as usize) % GRIDS.len()];
            let in_place = i % 4 == 2 || i % 7 == 3;
            if in_place && kind == SYMCOMM_COLL_ALL_TO_ALL {
                block = block.max(nranks);
            }
            let ty = TYPES[(i / 2) % TYPES.len()];
            let count = COUNTS[(i * 3 + nranks as usize) % COUNTS.len()];
            let shift = ((i % 3) as u64, ((i / 3) % 4) as u64);
            let tile_stride = count * n + 8;
            let elem = ty.size() as u64;
            let base = bytes.div_ceil(16) * 16 / elem;
            let cta_scope = i % 5 == 1 || i % 5 == 4;
            let step = Step {
                kind,
                ty,
                op: OPS[(i / 3) % OPS.len()],
                root: (i as u32 * 5) % nranks,
                count,
                grid,
                block,
                cta_scope,
                in_place,
                index: ((i * 11) % 60) as u32,
                base,
                shift,
                tile_stride,
            };
            bytes = (base + step.tiles() * tile_stride + 8) * elem;
            steps.push(step);
        }
        let mut team = EmuTeam::with_windows(nranks, &[bytes, bytes]).expect("team");
        // Initial image: canary, then each step's inputs.
        let mut image = vec![vec![vec![CANARY; bytes as usize]; 2]; nranks as usize];
        for (k, s) in steps.iter().enumerate() {
            let (in_blocks, _) = s.blocks(n);
            for r in 0..nranks {
                let ((w, soff), _) = s.offsets(u64::from(r));
                let own_block_only = s.in_place
                    && (s.kind == SYMCOMM_COLL_ALL_GATHER || s.kind == SYMCOMM_COLL_ALL_GATHER_LL);
                let elems = if own_block_only {
                    s.count
                } else {
                    s.count * in_blocks
                };
                for t in 0..s.tiles() {
                    for e in 0..elems {
                        let v = input_value(s.ty, s.op, r, k, t * 100_000 + e);
                        s.ty.write(&mut image[r as usize][w], soff + t * s.tile_stride + e, v);
                    }
                }
            }
        }
        for (r, windows) in image.iter().enumerate() {
            for (w, bytes) in windows.iter().enumerate() {
                team.bytes_mut(w, r as u32).copy_from_slice(bytes);
            }
        }
        // Expected final image: every step's outputs applied, in step order.
        let mut expect = image.clone();
        for s in &steps {
            let input = |p: u32, t: u64, e: u64| {
                let ((w, soff), _) = s.offsets(u64::from(p));
                s.ty.read(&image[p as usize][w], soff + t * s.tile_stride + e)
            };
            for r in 0..nranks {
                let (_, (w, doff)) = s.offsets(u64::from(r));
                let mut out = Vec::new();
                for t in 0..s.tiles() {
                    let at = |j: u64| doff + t * s.tile_stride + j;
                    let red = |f: &dyn Fn(u32) -> u64| {
                        let xs: Vec<u64> = (0..nranks).map(f).collect();
                        s.ty.reduce(s.op, &xs)
                    };
                    for i in 0..s.count {
                        match s.kind {
                            SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT
                            | SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT
                            | SYMCOMM_COLL_ALL_REDUCE_LL => {
                                out.push((at(i), red(&|p| input(p, t, i))))
                            }
                            SYMCOMM_COLL_REDUCE => {
                                if r == s.root {
                                    out.push((at(i), red(&|p| input(p, t, i))));
                                }
                            }
                            SYMCOMM_COLL_REDUCE_SCATTER | SYMCOMM_COLL_REDUCE_SCATTER_LL => {
                                out.push((at(i), red(&|p| input(p, t, u64::from(r) * s.count + i))))
                            }
                            SYMCOMM_COLL_ALL_GATHER | SYMCOMM_COLL_ALL_GATHER_LL => {
                                for p in 0..nranks {
                                    out.push((at(u64::from(p) * s.count + i), input(p, t, i)));
                                }
                            }
                            SYMCOMM_COLL_BROADCAST | SYMCOMM_COLL_BROADCAST_LL => {
                                out.push((at(i), input(s.root, t, i)))
                            }
                            SYMCOMM_COLL_SCATTER => {
                                out.push((at(i), input(s.root, t, u64::from(r) * s.count + i)))
                            }
                            _ => {
                                for p in 0..nranks {
                                    out.push((
                                        at(u64::from(p) * s.count + i),
                                        input(p, t, u64::from(r) * s.count + i),
                                    ));
                                }
                            }
                        }
                    }
                }
                for (e, v) in out {
                    s.ty.write(&mut expect[r as usize][w], e, v);
                }
            }
        }

        let seqs: Vec<Vec<Launch>> = (0..nranks)
            .map(|r| {
                let comm = team.dev_comm(r, dur(LONG));
                steps
                    .iter()
                    .map(|s| {
                        let ((sw, soff), (dw, doff)) = s.offsets(u64::from(r));
                        Launch {
                            kernel: kernel_of(s.ty.code),
                            comm,
                            args: CollArgs {
                                kind: s.kind,
                                dtype: s.ty.code,
                                redop: s.op,
                                root: s.root,
                                scope: if s.cta_scope {
                                    SYMCOMM_SCOPE_CTA
                                } else {
                                    SYMCOMM_SCOPE_GRID
                                },
                                index: s.index,
                                count: s.count,
                                src_offset: soff,
                                dst_offset: doff,
                                tile_stride: s.tile_stride,
                                src: team.window_of(sw, r),
                                dst: team.window_of(dw, r),
                                ..Default::default()
                            },
                            grid: s.grid,
                            block: s.block,
                        }
                    })
                    .collect()
            })
            .collect();
        let start = Instant::now();
        run_sequences(&seqs, || {}, |_, _| ());
        let took = start.elapsed();
        assert!(
            took < PROMPT * 4,
            "nranks={nranks}: {STEPS} launches took {took:?}"
        );
        for r in 0..nranks {
            let rec = team.error(r);
            assert_eq!(
                rec.status, SYMCOMM_STATUS_OK,
                "nranks={nranks}: rank {r}: {rec:?}"
            );
        }
        for (r, windows) in expect.iter().enumerate() {
            for (w, want) in windows.iter().enumerate() {
                let got = team.bytes(w, r as u32);
                if got != want.as_slice() {
                    let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
                    let step = steps
                        .iter()
                        .rposition(|s| s.base * s.ty.size() as u64 <= at as u64)
                        .unwrap();
                    panic!(
                        "nranks={nranks} rank {r} window {w}: first difference at byte {at} (got {:#x}, want {:#x}), in the region of step {step}: {:?}",
                        got[at], want[at], steps[step]
                    );
                }
            }
        }
    }
}

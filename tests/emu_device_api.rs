//! The device API v2 on the emulator, through the test kernels of `device/kernels/device_api.cu`
//! (ranks as threads of this process):
//!
//! - semaphores (`semaphore_signal` / `semaphore_wait`, expected counts in device memory): a ring
//!   on 1-4 ranks relaunched 20 times with identical arguments and no host step between launches
//!   (graph-replay style), for every group (Thread, Warp, Cta); a word outside the users' range
//!   is refused and a signal that never comes times out, both leaving the expected count as it was;
//! - `barrier<Thread>`, `barrier<Warp>` (one index per warp) and `barrier<Cta>` with user
//!   fingerprints, back to back; ranks passing different user tags both get Mismatch, and the
//!   host's error names the barrier index and the peer's fingerprint;
//! - the group form of `signal_wait_until` (Warp, Cta): every thread sees the peer's data;
//! - `grid_sync` across 8 CTAs of 64 threads, several phases, back-to-back launches and another
//!   grid size on the same state word; a CTA that never arrives makes the others time out;
//! - `record_user_error`: the record says SYMCOMM_OP_USER with the user's code, later waits fail
//!   at once with its status, and the host's error names the code;
//! - `cta_part` / `two_shot_part`: grid-scope collectives (one-shot and two-shot all-reduce,
//!   all-gather, reduce-scatter, all-to-all, in and out of place) where each CTA writes only its
//!   part of the input and reads only its part of the output, with no grid-wide sync: the parts
//!   cover every output element exactly once and every value is exact.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::c_void;
use std::time::{Duration, Instant};

use symcomm::abi::*;
use symcomm::testing::emu::{EmuTeam, launch};
use symcomm::{DEVICE_IMAGE, Error};

const LONG: u64 = 30_000_000_000;
const GROUP_THREAD: u32 = 0;
const GROUP_WARP: u32 = 1;
const GROUP_CTA: u32 = 2;

/// Launches `kernel` on the emulator and blocks until it finished.
///
/// # Safety
/// As for [`launch`]: `args` match the kernel's parameters and everything they reach outlives
/// the call.
unsafe fn run(kernel: &str, grid: u32, block: u32, args: &mut [*mut c_void]) {
    // SAFETY: forwarded from this function's contract.
    unsafe { launch(&DEVICE_IMAGE, kernel, [grid, 1, 1], [block, 1, 1], args) }
        .expect("emulator launch");
}

fn ptr<T>(v: &mut T) -> *mut c_void {
    std::ptr::from_mut(v).cast()
}

#[test]
fn semaphore_ring_survives_identical_relaunches_for_every_group() {
    const LAUNCHES: u64 = 20;
    const ROUNDS: u32 = 3;
    for nranks in 1u32..=4 {
        for (group, threads) in [(GROUP_THREAD, 1u32), (GROUP_WARP, 32), (GROUP_CTA, 64)] {
            let words = 67u32;
            let mut team = EmuTeam::new(nranks, u64::from(words) * 4).expect("team");
            let handles: Vec<(DevComm, WindowHandleRaw)> = (0..nranks)
                .map(|r| (team.dev_comm(r, LONG), team.window(r)))
                .collect();
            // Per rank: expected data count, expected acknowledgement count, rounds sent.
            let mut states = vec![[0u64; 3]; nranks as usize];
            std::thread::scope(|s| {
                for ((comm, win), state) in handles.into_iter().zip(states.iter_mut()) {
                    s.spawn(move || {
                        for l in 0..LAUNCHES {
                            let (mut comm, mut win) = (comm, win);
                            let (mut rounds, mut words, mut group) = (ROUNDS, words, group);
                            let mut state_ptr = state.as_mut_ptr();
                            let mut result = [0u32; 3];
                            let mut result_ptr = result.as_mut_ptr();
                            let mut args = [
                                ptr(&mut comm),
                                ptr(&mut win),
                                ptr(&mut rounds),
                                ptr(&mut words),
                                ptr(&mut group),
                                ptr(&mut state_ptr),
                                ptr(&mut result_ptr),
                            ];
                            // SAFETY: the arguments match symcomm_test_semaphore_ring's
                            // parameters and point at locals (and this rank's state) that
                            // outlive the blocking launch; the team outlives the scope.
                            unsafe { run("symcomm_test_semaphore_ring", 1, threads, &mut args) };
                            assert_eq!(
                                result,
                                [SYMCOMM_STATUS_OK, 0, ROUNDS],
                                "nranks={nranks} group={group} launch={l} rank={}: [status, #wrong, rounds]",
                                comm.rank
                            );
                        }
                    });
                }
            });
            let total = LAUNCHES * u64::from(ROUNDS);
            for (r, st) in states.iter().enumerate() {
                assert_eq!(
                    *st,
                    [total, total - 1, total],
                    "nranks={nranks} group={group} rank={r}: counts kept in device memory"
                );
                assert_eq!(team.error(r as u32).status, SYMCOMM_STATUS_OK);
            }
        }
    }
}

/// Runs symcomm_test_barrier on every rank with per-rank tags, `launches` times back to back per
/// rank, and returns each rank's results of its last launch.
fn barrier_runs(
    team: &mut EmuTeam,
    group: u32,
    threads: u32,
    tags: &[u32],
    rounds: u32,
    words: u32,
    launches: u32,
) -> Vec<[u32; 3]> {
    let handles: Vec<(DevComm, WindowHandleRaw)> = (0..team.nranks())
        .map(|r| (team.dev_comm(r, LONG), team.window(r)))
        .collect();
    std::thread::scope(|s| {
        let joins: Vec<_> = handles
            .into_iter()
            .zip(tags.iter().copied())
            .map(|((comm, win), tag)| {
                s.spawn(move || {
                    let mut last = [0u32; 3];
                    for _ in 0..launches {
                        let (mut comm, mut win, mut tag) = (comm, win, tag);
                        let (mut group, mut index) = (group, SYMCOMM_USER_BARRIER_FIRST);
                        let (mut rounds, mut words) = (rounds, words);
                        let mut result = [0u32; 3];
                        let mut result_ptr = result.as_mut_ptr();
                        let mut args = [
                            ptr(&mut comm),
                            ptr(&mut win),
                            ptr(&mut group),
                            ptr(&mut index),
                            ptr(&mut tag),
                            ptr(&mut rounds),
                            ptr(&mut words),
                            ptr(&mut result_ptr),
                        ];
                        // SAFETY: the arguments match symcomm_test_barrier's parameters and
                        // point at locals that outlive the blocking launch.
                        unsafe { run("symcomm_test_barrier", 1, threads, &mut args) };
                        last = result;
                    }
                    last
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().expect("rank")).collect()
    })
}

#[test]
fn barriers_of_every_group_order_data_back_to_back() {
    let (rounds, words) = (4u32, 45u32);
    for nranks in [1u32, 2, 3] {
        // (group, threads, groups per CTA)
        for (group, threads, groups) in [
            (GROUP_THREAD, 1u32, 1u32),
            (GROUP_WARP, 64, 2),
            (GROUP_CTA, 96, 1),
        ] {
            let mut team = EmuTeam::new(nranks, u64::from(words * groups) * 4).expect("team");
            let tags = vec![7u32; nranks as usize];
            let res = barrier_runs(&mut team, group, threads, &tags, rounds, words, 3);
            for (r, got) in res.iter().enumerate() {
                assert_eq!(
                    *got,
                    [SYMCOMM_STATUS_OK, 0, rounds * groups],
                    "nranks={nranks} group={group} rank={r}: [status, #wrong, rounds]"
                );
            }
        }
    }
}

#[test]
fn different_user_tags_are_a_mismatch_on_both_ranks() {
    let mut team = EmuTeam::new(2, 64).expect("team");
    let start = Instant::now();
    let res = barrier_runs(&mut team, GROUP_CTA, 64, &[1, 2], 1, 8, 1);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "a mismatch returns promptly"
    );
    for r in 0..2u32 {
        assert_eq!(res[r as usize][0], SYMCOMM_STATUS_MISMATCH, "rank {r}");
        assert_eq!(res[r as usize][2], 0, "rank {r}: no round completed");
        let rec = team.error(r);
        assert_eq!(
            (rec.status, rec.rank, rec.peer, rec.op, rec.detail >> 32),
            (
                SYMCOMM_STATUS_MISMATCH,
                r,
                1 - r,
                SYMCOMM_OP_BARRIER,
                u64::from(SYMCOMM_USER_BARRIER_FIRST)
            ),
            "rank {r}: {rec:?}"
        );
        let e = Error::from_record(&rec);
        let text = e.to_string();
        assert!(
            matches!(e, Error::Mismatch { .. })
                && text.contains(&format!("barrier index {SYMCOMM_USER_BARRIER_FIRST}"))
                && text.contains(&format!("{:#010x}", rec.detail as u32)),
            "{text}"
        );
    }
}

#[test]
fn group_wait_hands_the_peer_data_to_every_thread() {
    for (group, threads) in [(GROUP_WARP, 32u32), (GROUP_CTA, 128)] {
        let words = 300u32;
        let mut team = EmuTeam::new(2, u64::from(words) * 4).expect("team");
        for epoch in 1u64..=3 {
            let handles: Vec<(DevComm, WindowHandleRaw)> = (0..2)
                .map(|r| (team.dev_comm(r, LONG), team.window(r)))
                .collect();
            let res: Vec<[u32; 2]> = std::thread::scope(|s| {
                let joins: Vec<_> = handles
                    .into_iter()
                    .map(|(comm, win)| {
                        s.spawn(move || {
                            let (mut comm, mut win, mut group, mut words, mut epoch) =
                                (comm, win, group, words, epoch);
                            let mut result = [0u32; 2];
                            let mut result_ptr = result.as_mut_ptr();
                            let mut args = [
                                ptr(&mut comm),
                                ptr(&mut win),
                                ptr(&mut group),
                                ptr(&mut words),
                                ptr(&mut epoch),
                                ptr(&mut result_ptr),
                            ];
                            // SAFETY: the arguments match symcomm_test_group_wait's parameters
                            // and point at locals that outlive the blocking launch.
                            unsafe { run("symcomm_test_group_wait", 1, threads, &mut args) };
                            result
                        })
                    })
                    .collect();
                joins.into_iter().map(|j| j.join().expect("rank")).collect()
            });
            assert_eq!(
                res,
                vec![[SYMCOMM_STATUS_OK, 0]; 2],
                "group={group} epoch={epoch}"
            );
        }
    }
}

/// Runs symcomm_test_grid_sync on a one-rank team and returns [status, wrong, phases] per CTA.
fn grid_run(
    team: &mut EmuTeam,
    state: &mut u64,
    data: &mut [u32],
    ctas: u32,
    phases: u32,
    skip: u32,
    timeout_ns: u64,
) -> Vec<[u32; 3]> {
    let mut comm = team.dev_comm(0, timeout_ns);
    let mut state_ptr = std::ptr::from_mut(state);
    let mut data_ptr = data.as_mut_ptr();
    let (mut phases, mut skip) = (phases, skip);
    let mut result = vec![0u32; 3 * ctas as usize];
    let mut result_ptr = result.as_mut_ptr();
    let mut args = [
        ptr(&mut comm),
        ptr(&mut state_ptr),
        ptr(&mut data_ptr),
        ptr(&mut phases),
        ptr(&mut skip),
        ptr(&mut result_ptr),
    ];
    assert!(data.len() >= ctas as usize * 64);
    // SAFETY: the arguments match symcomm_test_grid_sync's parameters; `data` holds a word per
    // thread of the grid and `result` three per CTA; all outlive the blocking launch.
    unsafe { run("symcomm_test_grid_sync", ctas, 64, &mut args) };
    result.chunks(3).map(|c| [c[0], c[1], c[2]]).collect()
}

#[test]
fn grid_sync_orders_phases_across_ctas_and_launches() {
    let mut team = EmuTeam::new(1, 64).expect("team");
    let mut state = 0u64;
    let mut data = vec![0u32; 8 * 64];
    for (launch_no, ctas) in [8u32, 8, 8, 3, 8].into_iter().enumerate() {
        let res = grid_run(&mut team, &mut state, &mut data, ctas, 5, u32::MAX, LONG);
        for (b, got) in res.iter().enumerate() {
            assert_eq!(
                *got,
                [SYMCOMM_STATUS_OK, 0, 5],
                "launch {launch_no} ({ctas} CTAs), CTA {b}: [status, #wrong, phases]"
            );
        }
        assert_eq!(
            state & 0xffff_ffff,
            0,
            "no arrival left over after launch {launch_no}"
        );
    }
    assert_eq!(state >> 32, 5 * 10, "one generation per grid_sync");
}

#[test]
fn grid_sync_times_out_when_a_cta_never_arrives() {
    let mut team = EmuTeam::new(1, 64).expect("team");
    let mut state = 0u64;
    let mut data = vec![0u32; 8 * 64];
    let timeout = Duration::from_millis(200);
    let start = Instant::now();
    let res = grid_run(
        &mut team,
        &mut state,
        &mut data,
        8,
        2,
        5,
        timeout.as_nanos() as u64,
    );
    let took = start.elapsed();
    assert!(
        took >= timeout && took < timeout * 20,
        "{took:?} with a {timeout:?} deadline"
    );
    for (b, got) in res.iter().enumerate() {
        if b == 5 {
            assert_eq!(*got, [0, 0, 0], "the skipped CTA");
        } else {
            assert_eq!(got[0], SYMCOMM_STATUS_TIMEOUT, "CTA {b}: {got:?}");
            assert_eq!(got[2], 0, "CTA {b}: no phase completed");
        }
    }
    let rec = team.error(0);
    assert_eq!(
        (rec.status, rec.peer, rec.op, rec.detail),
        (SYMCOMM_STATUS_TIMEOUT, 0, SYMCOMM_OP_GRID_SYNC, 0)
    );
    assert!(
        Error::from_record(&rec)
            .to_string()
            .contains("grid_sync generation 0"),
        "{}",
        Error::from_record(&rec)
    );
}

#[test]
fn user_errors_are_recorded_and_stop_later_waits() {
    for (group, threads) in [(GROUP_WARP, 32u32), (GROUP_CTA, 64)] {
        let mut team = EmuTeam::new(1, 64).expect("team");
        let mut comm = team.dev_comm(0, LONG);
        let (mut group, mut code, mut value) = (group, 0x2au32, 7u32);
        let mut result = [0u32; 1];
        let mut result_ptr = result.as_mut_ptr();
        let mut args = [
            ptr(&mut comm),
            ptr(&mut group),
            ptr(&mut code),
            ptr(&mut value),
            ptr(&mut result_ptr),
        ];
        let start = Instant::now();
        // SAFETY: the arguments match symcomm_test_user_error's parameters and point at locals
        // that outlive the blocking launch.
        unsafe { run("symcomm_test_user_error", 1, threads, &mut args) };
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the wait after the recorded error returns at once"
        );
        assert_eq!(result[0], SYMCOMM_STATUS_INVALID_ARGUMENT, "group {group}");
        let rec = team.error(0);
        assert_eq!(
            (rec.status, rec.rank, rec.peer, rec.op, rec.detail),
            (
                SYMCOMM_STATUS_INVALID_ARGUMENT,
                0,
                0,
                SYMCOMM_OP_USER,
                (0x2a << 32) | 7
            )
        );
        let text = Error::from_record(&rec).to_string();
        assert!(text.contains("user code 0x2a, value 7"), "{text}");
    }
}

#[test]
fn semaphore_failures_leave_the_expected_count_unchanged() {
    // (word, timeout, status, detail, prompt)
    let timeout = Duration::from_millis(200);
    let cases = [
        (
            SYMCOMM_USER_SIGNAL_END,
            LONG,
            SYMCOMM_STATUS_INVALID_ARGUMENT,
            (1u64 << 32) | u64::from(SYMCOMM_USER_SIGNAL_END),
            true,
        ),
        (
            5,
            timeout.as_nanos() as u64,
            SYMCOMM_STATUS_TIMEOUT,
            4,
            false,
        ),
    ];
    for (group, threads) in [(GROUP_WARP, 32u32), (GROUP_CTA, 64)] {
        for (word, timeout_ns, status, detail, prompt) in cases {
            let mut team = EmuTeam::new(2, 64).expect("team");
            let mut comm = team.dev_comm(0, timeout_ns);
            let (mut group, mut peer, mut word) = (group, 1u32, word);
            let mut expected = 3u64;
            let mut expected_ptr = std::ptr::from_mut(&mut expected);
            let mut result = [0u32; 1];
            let mut result_ptr = result.as_mut_ptr();
            let mut args = [
                ptr(&mut comm),
                ptr(&mut group),
                ptr(&mut peer),
                ptr(&mut word),
                ptr(&mut expected_ptr),
                ptr(&mut result_ptr),
            ];
            let start = Instant::now();
            // SAFETY: the arguments match symcomm_test_semaphore_wait's parameters and point at
            // locals that outlive the blocking launch.
            unsafe { run("symcomm_test_semaphore_wait", 1, threads, &mut args) };
            let took = start.elapsed();
            let label = format!("group {group} word {word}");
            assert_eq!(result[0], status, "{label}");
            assert_eq!(expected, 3, "{label}: the expected count is unchanged");
            let rec = team.error(0);
            assert_eq!(
                (rec.status, rec.op, rec.detail),
                (status, SYMCOMM_OP_SIGNAL_WAIT, detail),
                "{label}: {rec:?}"
            );
            if prompt {
                assert!(took < Duration::from_secs(5), "{label}: refused at once");
            } else {
                assert!(
                    took >= timeout && took < timeout * 20,
                    "{label}: {took:?} with a {timeout:?} deadline"
                );
            }
        }
    }
}

/// Runs symcomm_test_cta_part on every rank (threads) and returns each rank's [status, #wrong]
/// and marks (one word per output element).
fn cta_part_run(
    team: &mut EmuTeam,
    kind: u32,
    in_place: bool,
    count: u64,
    grid: u32,
    block: u32,
) -> Vec<([u32; 2], Vec<u32>)> {
    let n = team.nranks();
    let out_len = match kind {
        PART_ALL_GATHER | PART_ALL_TO_ALL => count * u64::from(n),
        _ => count,
    } as usize;
    let handles: Vec<(DevComm, WindowHandleRaw, WindowHandleRaw)> = (0..n)
        .map(|r| {
            (
                team.dev_comm(r, LONG),
                team.window_of(0, r),
                team.window_of(1, r),
            )
        })
        .collect();
    std::thread::scope(|s| {
        let joins: Vec<_> = handles
            .into_iter()
            .map(|(comm, src, dst)| {
                s.spawn(move || {
                    let (mut comm, mut src, mut dst) = (comm, src, dst);
                    let (mut kind, mut in_place, mut count) = (kind, u32::from(in_place), count);
                    let mut first_slot = SYMCOMM_USER_BARRIER_FIRST;
                    let mut marks = vec![0u32; out_len.max(1)];
                    let mut marks_ptr = marks.as_mut_ptr();
                    let mut result = [0u32; 2];
                    let mut result_ptr = result.as_mut_ptr();
                    let mut args = [
                        ptr(&mut comm),
                        ptr(&mut src),
                        ptr(&mut dst),
                        ptr(&mut kind),
                        ptr(&mut in_place),
                        ptr(&mut count),
                        ptr(&mut first_slot),
                        ptr(&mut marks_ptr),
                        ptr(&mut result_ptr),
                    ];
                    // SAFETY: the arguments match symcomm_test_cta_part's parameters; `marks`
                    // holds a word per output element; everything outlives the blocking launch,
                    // and the team (the windows) outlives the scope.
                    unsafe { run("symcomm_test_cta_part", grid, block, &mut args) };
                    marks.truncate(out_len);
                    (result, marks)
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().expect("rank")).collect()
    })
}

const PART_ONE_SHOT: u32 = 0;
const PART_TWO_SHOT: u32 = 1;
const PART_ALL_GATHER: u32 = 2;
const PART_REDUCE_SCATTER: u32 = 3;
const PART_ALL_TO_ALL: u32 = 4;

#[test]
fn each_cta_works_on_its_own_part_without_a_grid_sync() {
    let counts = [1u64, 37, 4099];
    for nranks in [2u32, 3, 4] {
        let bytes = counts[2] * u64::from(nranks) * 4;
        let mut team = EmuTeam::with_windows(nranks, &[bytes, bytes]).expect("team");
        for kind in [
            PART_ONE_SHOT,
            PART_TWO_SHOT,
            PART_ALL_GATHER,
            PART_REDUCE_SCATTER,
            PART_ALL_TO_ALL,
        ] {
            for in_place in [false, true] {
                for &count in &counts {
                    // A CUDA-like grid, and one whose parts are uneven (some empty for count 1).
                    for (grid, block) in [(8u32, 64u32), (3, 32)] {
                        let res = cta_part_run(&mut team, kind, in_place, count, grid, block);
                        for (r, (result, marks)) in res.iter().enumerate() {
                            let what = format!(
                                "nranks={nranks} kind={kind} in_place={in_place} count={count} \
                                 grid={grid}x{block} rank={r}"
                            );
                            assert_eq!(*result, [SYMCOMM_STATUS_OK, 0], "{what}: [status, #wrong]");
                            let off: Vec<usize> = marks
                                .iter()
                                .enumerate()
                                .filter(|&(_, &m)| m != 1)
                                .map(|(i, _)| i)
                                .collect();
                            assert!(
                                off.is_empty(),
                                "{what}: output elements not read exactly once by the CTAs' parts: {:?}",
                                &off[..off.len().min(8)]
                            );
                        }
                    }
                }
            }
        }
    }
}

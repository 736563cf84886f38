//! The built-in ping-pong (token ring) kernel on the emulator: ranks as threads of this process,
//! every rank count of the matrix, back-to-back launches, and the failure paths (a rank that never
//! arrives times out within the deadline; a stale ABI version is refused).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::c_void;
use std::time::{Duration, Instant};

use symcomm::DEVICE_IMAGE;
use symcomm::abi::{
    DevComm, SYMCOMM_OP_SIGNAL_WAIT, SYMCOMM_STATUS_ABI_MISMATCH, SYMCOMM_STATUS_OK,
    SYMCOMM_STATUS_TIMEOUT, WindowHandleRaw,
};
use symcomm::testing::emu::{EmuTeam, launch};

const KERNEL: &str = "symcomm_ping_pong";

/// Launches the ring on `ranks` (a subset of the team may be launched, to model a missing rank)
/// and returns [status, wrong, rounds] per launched rank.
fn run(
    team: &mut EmuTeam,
    ranks: &[u32],
    timeout_ns: u64,
    rounds: u32,
    words: u32,
    threads: u32,
) -> Vec<[u32; 3]> {
    let handles: Vec<(DevComm, WindowHandleRaw)> = ranks
        .iter()
        .map(|&r| (team.dev_comm(r, timeout_ns), team.window(r)))
        .collect();
    std::thread::scope(|s| {
        let joins: Vec<_> = handles
            .into_iter()
            .map(|(mut comm, mut win)| {
                s.spawn(move || {
                    let mut result = [0u32; 3];
                    let mut rounds = rounds;
                    let mut words = words;
                    let mut result_ptr = result.as_mut_ptr();
                    let mut args: [*mut c_void; 5] = [
                        (&raw mut comm).cast(),
                        (&raw mut win).cast(),
                        (&raw mut rounds).cast(),
                        (&raw mut words).cast(),
                        (&raw mut result_ptr).cast(),
                    ];
                    // SAFETY: the five pointers match the kernel's parameters (DevComm,
                    // WindowHandleRaw, u32, u32, u32*) and point at locals that outlive the
                    // blocking launch; the team's memory outlives the scope.
                    unsafe { launch(&DEVICE_IMAGE, KERNEL, [1, 1, 1], [threads, 1, 1], &mut args) }
                        .expect("emulator launch");
                    result
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().expect("rank thread"))
            .collect()
    })
}

#[test]
fn ring_is_exact_for_every_rank_count_and_back_to_back_launches() {
    for nranks in [1u32, 2, 3, 4, 5, 8] {
        for (words, threads) in [(0u32, 1u32), (1, 1), (nranks + 1, 3), (1021, 32)] {
            let mut team = EmuTeam::new(nranks, u64::from(words.max(1)) * 4).expect("team");
            let ranks: Vec<u32> = (0..nranks).collect();
            for launch_no in 0..3 {
                let res = run(&mut team, &ranks, 20_000_000_000, 4, words, threads);
                for (r, got) in res.iter().enumerate() {
                    assert_eq!(
                        *got,
                        [SYMCOMM_STATUS_OK, 0, 4],
                        "nranks={nranks} words={words} threads={threads} launch={launch_no} rank={r}: [status, #wrong, rounds]"
                    );
                }
            }
        }
    }
}

#[test]
fn missing_rank_times_out_within_the_deadline() {
    let mut team = EmuTeam::new(3, 64).expect("team");
    let timeout = Duration::from_millis(200);
    let start = Instant::now();
    // Rank 2 never launches: rank 0 sends to 1, rank 1 forwards to 2, and rank 0 waits for rank 2.
    let res = run(&mut team, &[0, 1], timeout.as_nanos() as u64, 1, 16, 4);
    let took = start.elapsed();
    assert_eq!(
        res[0][0], SYMCOMM_STATUS_TIMEOUT,
        "rank 0 waits for the absent rank 2"
    );
    assert_eq!(
        res[1][0], SYMCOMM_STATUS_OK,
        "rank 1 got its token and forwarded it"
    );
    assert!(
        took >= timeout && took < timeout * 20,
        "returned after {took:?} with a {timeout:?} deadline"
    );
    let rec = team.error(0);
    assert_eq!(
        (rec.status, rec.rank, rec.peer, rec.op),
        (SYMCOMM_STATUS_TIMEOUT, 0, 2, SYMCOMM_OP_SIGNAL_WAIT)
    );
    assert_eq!(team.error(1).status, SYMCOMM_STATUS_OK);
}

#[test]
fn stale_abi_version_is_refused() {
    let mut team = EmuTeam::new(1, 64).expect("team");
    let mut comm = team.dev_comm(0, 1_000_000_000);
    comm.abi_version += 1;
    let mut win = team.window(0);
    let mut result = [0u32; 3];
    let (mut rounds, mut words, mut result_ptr) = (2u32, 4u32, result.as_mut_ptr());
    let mut args: [*mut c_void; 5] = [
        (&raw mut comm).cast(),
        (&raw mut win).cast(),
        (&raw mut rounds).cast(),
        (&raw mut words).cast(),
        (&raw mut result_ptr).cast(),
    ];
    // SAFETY: as in `run`.
    unsafe { launch(&DEVICE_IMAGE, KERNEL, [1, 1, 1], [2, 1, 1], &mut args) }.expect("launch");
    assert_eq!(result, [SYMCOMM_STATUS_ABI_MISMATCH, 0, 0]);
}

#[test]
fn bad_launches_are_refused_before_running() {
    let mut args: [*mut c_void; 0] = [];
    // SAFETY: the launch is refused before any kernel code runs (empty grid / oversized block /
    // unknown kernel), so the empty argument list is never read.
    unsafe {
        assert!(launch(&DEVICE_IMAGE, KERNEL, [0, 1, 1], [1, 1, 1], &mut args).is_err());
        assert!(launch(&DEVICE_IMAGE, KERNEL, [1, 1, 1], [1025, 1, 1], &mut args).is_err());
        let e = launch(
            &DEVICE_IMAGE,
            "no_such_kernel",
            [1, 1, 1],
            [1, 1, 1],
            &mut args,
        )
        .unwrap_err();
        assert!(e.to_string().contains("no_such_kernel"), "{e}");
    }
}

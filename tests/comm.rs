//! Communicators with ranks as threads of this process, on the emulator: init / windows /
//! destroy for 1-8 ranks, the flat layout seen from every rank, built-in kernels running on
//! windows, collective-call agreement (size mismatches, bad arguments), abort from another
//! thread, simulated multi-host teams, and init failures (wrong secret, missing rank).
//! Ranks as processes (kill -9, SIGSTOP, `symcomm launch`) are in `comm_procs.rs`; the
//! init/destroy leak check is in `comm_leaks.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mod.rs"]
mod support;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};
use support::with_ranks;

use symcomm::abi::*;
use symcomm::bootstrap::BootstrapConfig;
use symcomm::{
    CommOptions, Communicator, DataType, Device, Error, RedOp, Result, Stream, UniqueId,
};

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn config(id: &UniqueId, rank: u32, nranks: u32, timeout: Duration) -> BootstrapConfig {
    BootstrapConfig::new(id.clone(), rank, nranks)
        .with_timeout(timeout)
        .with_host_id("test-host")
}

#[test]
fn one_to_eight_ranks_init_allocate_and_see_each_others_copies() {
    for nranks in [1u32, 2, 3, 5, 8] {
        let t = Instant::now();
        let handles = with_ranks(nranks, |comm| {
            assert_eq!(comm.nranks(), nranks);
            assert!(comm.spans_one_host());
            let dev = comm.device_handle().unwrap();
            assert_eq!((dev.rank, dev.nranks), (comm.rank(), nranks));
            assert_ne!(dev.signal_base, 0);
            assert!(dev.signal_stride >= u64::from(nranks) * u64::from(SYMCOMM_SIGNAL_WORDS) * 8);
            // The LL area follows the signal words inside each rank's array.
            let layout = symcomm::SignalLayout::new(nranks);
            assert_eq!(
                (dev.ll_offset, dev.ll_lines),
                (layout.ll_offset, SYMCOMM_LL_LINES)
            );
            assert!(dev.signal_stride >= layout.stride);
            // The emulator's ranks share its one GPU: barriers at GPU scope.
            assert_eq!(comm.gpu_ranks(), nranks);
            assert_eq!(dev.flags & SYMCOMM_COMM_SAME_GPU, SYMCOMM_COMM_SAME_GPU);
            let count = 1000 + nranks as usize;
            let w = comm.alloc_window::<u32>(count).unwrap();
            assert_eq!(w.len(), count);
            // Zeroed, then each rank writes its own pattern.
            assert!(w.to_vec().unwrap().iter().all(|&v| v == 0));
            let mine: Vec<u32> = (0..count as u32).map(|i| comm.rank() << 24 | i).collect();
            w.write(0, &mine).unwrap();
            comm.barrier().unwrap();
            let mut wrong = 0;
            for peer in 0..nranks {
                let mut got = vec![0u32; count];
                w.read_rank(peer, 0, &mut got).unwrap();
                wrong += got
                    .iter()
                    .enumerate()
                    .filter(|&(i, &v)| v != (peer << 24 | i as u32))
                    .count();
            }
            assert_eq!(wrong, 0, "rank {}: #wrong {wrong}", comm.rank());
            comm.barrier().unwrap();
            // A peer writes into our copy through its own view.
            let next = (comm.rank() + 1) % nranks;
            w.write_rank(next, 7, &[0xdead_0000 | comm.rank()]).unwrap();
            comm.barrier().unwrap();
            let mut got = [0u32];
            w.read(7, &mut got).unwrap();
            let prev = (comm.rank() + nranks - 1) % nranks;
            assert_eq!(got[0], 0xdead_0000 | prev);
            comm.barrier().unwrap();
            let h = w.device_handle().raw();
            drop(w);
            // A second window after freeing the first.
            let w2 = comm.alloc_window::<u8>(3).unwrap();
            assert_eq!(w2.device_handle().raw().bytes, 3);
            (h, dev)
        });
        for (r, (h, dev)) in handles.iter().enumerate() {
            assert_eq!(
                (h.rank, h.nranks, h.bytes),
                (r as u32, nranks, (1000 + nranks as u64) * 4)
            );
            assert_eq!(h.stride, handles[0].0.stride, "strides agree");
            assert_eq!(dev.signal_stride, handles[0].1.signal_stride);
            assert_eq!(h.stride % 4096, 0);
        }
        eprintln!("{nranks} ranks: {:?}", t.elapsed());
    }
}

#[test]
fn built_in_all_reduce_runs_on_communicator_windows() {
    for nranks in [2u32, 3, 4] {
        let count = 1031usize;
        let results = with_ranks(nranks, |comm| {
            let src = comm.alloc_window::<f32>(count).unwrap();
            let dst = comm.alloc_window::<f32>(count).unwrap();
            let input: Vec<f32> = (0..count)
                .map(|i| (comm.rank() * 1000 + i as u32 % 97) as f32)
                .collect();
            src.write(0, &input).unwrap();
            comm.barrier().unwrap();
            // Twice: the barrier epochs continue in the communicator's signal area.
            for _ in 0..2 {
                support::all_reduce(&comm, &src, &dst, count as u64).unwrap();
            }
            let got = dst.to_vec().unwrap();
            (0..count)
                .filter(|&i| {
                    let want: u32 = (0..nranks).map(|r| r * 1000 + i as u32 % 97).sum();
                    got[i].to_bits() != (want as f32).to_bits()
                })
                .count()
        });
        assert_eq!(
            results,
            vec![0; nranks as usize],
            "#wrong per rank, {nranks} ranks"
        );
    }
}

#[test]
fn mismatched_window_sizes_fail_on_every_rank_and_the_communicator_stays_usable() {
    let out = with_ranks(3, |comm| {
        let count = if comm.rank() == 2 { 200 } else { 100 };
        let e = comm.alloc_window::<f32>(count).unwrap_err();
        // A different element size with the same byte count still mismatches.
        let e2 = if comm.rank() == 1 {
            comm.alloc_window::<u64>(50).unwrap_err()
        } else {
            comm.alloc_window::<u32>(100).unwrap_err()
        };
        let w = comm.alloc_window::<f32>(64).unwrap();
        comm.barrier().unwrap();
        (
            e.to_string(),
            matches!(e, Error::Mismatch { .. }),
            matches!(e2, Error::Mismatch { .. }),
            w.len(),
        )
    });
    for (r, (msg, m1, m2, len)) in out.iter().enumerate() {
        assert!(*m1 && *m2, "rank {r}: {msg}");
        assert!(
            msg.contains("800") && msg.contains("400"),
            "rank {r}: {msg}"
        );
        assert_eq!(*len, 64);
    }
}

#[test]
fn a_bad_count_on_one_rank_fails_every_rank_and_the_next_call_passes() {
    let out = with_ranks(3, |comm| {
        let count = if comm.rank() == 1 { 0 } else { 16 };
        let e = comm.alloc_window::<u16>(count).unwrap_err();
        let huge = comm.alloc_window::<u64>(usize::MAX / 4).unwrap_err();
        let w = comm.alloc_window::<u16>(16).unwrap();
        (e, huge, w.len())
    });
    for (r, (e, huge, len)) in out.iter().enumerate() {
        if r == 1 {
            assert!(matches!(e, Error::InvalidArgument(_)), "rank 1: {e}");
        } else {
            // With rank 1's own words (its error travels in the allocation request).
            assert!(
                matches!(e, Error::PeerFailed { rank: 1, message, .. }
                    if message.contains("at least one element")),
                "rank {r}: {e}"
            );
        }
        assert!(
            matches!(huge, Error::InvalidArgument(_)),
            "rank {r}: {huge}"
        );
        assert_eq!(*len, 16);
    }
}

#[test]
fn window_reads_and_writes_out_of_bounds_are_refused() {
    with_ranks(2, |comm| {
        let w = comm.alloc_window::<u32>(10).unwrap();
        assert!(matches!(
            w.write(8, &[1, 2, 3]),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            w.read(usize::MAX, &mut [0]),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            w.read_rank(2, 0, &mut [0]),
            Err(Error::InvalidArgument(_))
        ));
        w.write(7, &[1, 2, 3]).unwrap();
    });
}

#[test]
fn abort_from_another_thread_stops_a_waiting_kernel_and_peers_see_the_rank_lost() {
    let id = UniqueId::new_on(LOOPBACK).unwrap();
    let gate = Barrier::new(2);
    thread::scope(|s| {
        let r0 = s.spawn(|| {
            let c = config(&id, 0, 2, Duration::from_secs(20));
            let comm = Communicator::init_with(&c, Device::Emu, &support::test_options()).unwrap();
            let a = comm.alloc_window::<f32>(256).unwrap();
            let b = comm.alloc_window::<f32>(256).unwrap();
            gate.wait();
            let t = Instant::now();
            let result = thread::scope(|inner| {
                inner.spawn(|| {
                    thread::sleep(Duration::from_millis(300));
                    comm.abort();
                });
                // Rank 1 never launches: this waits until the abort.
                support::all_reduce(&comm, &a, &b, 256)
            });
            let waited = t.elapsed();
            let later = comm.alloc_window::<f32>(4).unwrap_err();
            (result, waited, later)
        });
        let r1 = s.spawn(|| {
            let c = config(&id, 1, 2, Duration::from_secs(20));
            let comm = Communicator::init_with(&c, Device::Emu, &support::test_options()).unwrap();
            let _a = comm.alloc_window::<f32>(256).unwrap();
            let _b = comm.alloc_window::<f32>(256).unwrap();
            gate.wait();
            let t = Instant::now();
            loop {
                match comm.check_error() {
                    Err(e) => return (e, t.elapsed()),
                    Ok(()) if t.elapsed() > Duration::from_secs(10) => {
                        panic!("rank 1 never saw rank 0 go")
                    }
                    Ok(()) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        let (result, waited, later) = r0.join().unwrap();
        assert!(
            matches!(result, Err(Error::Aborted { rank: 0, .. })),
            "rank 0: {result:?}"
        );
        assert!(waited < Duration::from_secs(5), "abort took {waited:?}");
        assert!(
            matches!(later, Error::Aborted { .. }),
            "after abort: {later}"
        );
        let (e, seen) = r1.join().unwrap();
        assert!(matches!(e, Error::PeerLost { rank: 0, .. }), "rank 1: {e}");
        assert!(
            seen < Duration::from_secs(5),
            "rank 1 noticed after {seen:?}"
        );
    });
}

/// A window of `count` elements, each this rank's `value`, all-reduced: the number of elements
/// that differ from `want`.
fn sum_of_values(comm: &Communicator, value: f32, want: f32) -> usize {
    let count = 257usize;
    let src = comm.alloc_window::<f32>(count).unwrap();
    let dst = comm.alloc_window::<f32>(count).unwrap();
    src.write(0, &vec![value; count]).unwrap();
    comm.barrier().unwrap();
    support::all_reduce(comm, &src, &dst, count as u64).unwrap();
    let got = dst.to_vec().unwrap();
    got.iter().filter(|v| v.to_bits() != want.to_bits()).count()
}

#[test]
fn split_makes_a_communicator_per_color_ranked_by_key_and_the_parent_stays_usable() {
    let nranks = 5u32;
    let results = with_ranks(nranks, |comm| {
        let me = comm.rank();
        // Colors 0 (ranks 0, 2) and 1 (ranks 1, 3); rank 4 joins none. Keys reverse the order.
        let color = (me < 4).then_some(me % 2);
        let child = comm.split(color, -(me as i32)).unwrap();
        let mut wrong = 0;
        let shape = child.as_ref().map(|c| {
            let members: Vec<u32> = (0..4).filter(|r| r % 2 == me % 2).collect();
            let want: f32 = members.iter().map(|&r| r as f32 + 1.0).sum();
            wrong += sum_of_values(c, me as f32 + 1.0, want);
            (c.rank(), c.nranks())
        });
        // The parent still runs collectives, and splits again: one color, equal keys (the
        // parent's order).
        wrong += sum_of_values(&comm, 1.0, nranks as f32);
        let again = comm.split(Some(9), 0).unwrap().unwrap();
        wrong += sum_of_values(&again, 2.0, 2.0 * nranks as f32);
        (shape, (again.rank(), again.nranks()), wrong)
    });
    let want = [
        (Some((1, 2)), (0, 5), 0),
        (Some((1, 2)), (1, 5), 0),
        (Some((0, 2)), (2, 5), 0),
        (Some((0, 2)), (3, 5), 0),
        (None, (4, 5), 0),
    ];
    assert_eq!(
        results, want,
        "(rank, nranks) in the split, in the second one, #wrong"
    );
}

#[test]
fn destroying_one_rank_is_not_a_fault_for_the_others() {
    let out = with_ranks(3, |comm| {
        let _w = comm.alloc_window::<u8>(100).unwrap();
        comm.barrier().unwrap();
        if comm.rank() == 2 {
            return Ok(());
        }
        // Rank 2 drops its communicator now; give its goodbye time to arrive.
        thread::sleep(Duration::from_millis(300));
        comm.check_error()
    });
    for (r, o) in out.iter().enumerate() {
        assert!(o.is_ok(), "rank {r}: {o:?}");
    }
}

/// One host collective on every rank of `comm`, waited for, then the communicator's state.
fn one_all_reduce(comm: &Communicator, w: &symcomm::Window<f32>) -> Result<()> {
    let stream = Stream::new(comm.backend())?;
    comm.all_reduce(w, w, w.len(), DataType::F32, RedOp::Sum, &stream)?;
    stream.synchronize()?;
    comm.check_error()
}

#[test]
fn a_rank_that_destroys_its_communicator_while_peers_wait_for_it_is_reported_promptly() {
    // Ranks 0 and 1 make one more collective call than rank 2, which destroys its communicator
    // meanwhile: they wait for a rank that will never come. Its goodbye (relayed by the root to
    // rank 1) says after how many calls it left, so both report it at once instead of waiting
    // for the device timeout (30 s here).
    let survivors = Barrier::new(2);
    let out = with_ranks(3, |comm| {
        let w = comm.alloc_window::<f32>(64).unwrap();
        one_all_reduce(&comm, &w).unwrap();
        if comm.rank() == 2 {
            thread::sleep(Duration::from_millis(300));
            return (Ok(()), Duration::ZERO);
        }
        let t = Instant::now();
        let r = one_all_reduce(&comm, &w);
        let waited = t.elapsed();
        // Ranks 0 and 1 leave together: neither may see the other depart first.
        survivors.wait();
        (r, waited)
    });
    for (r, (o, waited)) in out.iter().enumerate().take(2) {
        match o {
            Err(Error::PeerLost { rank: 2, reason }) => {
                assert!(
                    reason.contains("destroyed its communicator after 1 collective calls"),
                    "rank {r}: {reason}"
                );
            }
            other => panic!("rank {r}: {other:?}"),
        }
        assert!(
            *waited < Duration::from_secs(10),
            "rank {r} waited {waited:?}"
        );
    }
}

#[test]
fn calls_that_need_a_destroyed_rank_fail_at_once_and_the_rest_is_no_fault() {
    let survivors = Barrier::new(2);
    let out = with_ranks(3, |comm| {
        let w = comm.alloc_window::<f32>(64).unwrap();
        one_all_reduce(&comm, &w).unwrap();
        if comm.rank() == 1 {
            return Vec::new();
        }
        // Rank 1 drops its communicator now; give its goodbye time to arrive (at rank 2 via the
        // root).
        thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        let calls = vec![
            comm.check_error(),
            comm.barrier(),
            one_all_reduce(&comm, &w),
            comm.alloc_window::<f32>(8).map(drop),
        ];
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        // Ranks 0 and 2 leave together: neither may see the other depart mid-way.
        survivors.wait();
        calls
    });
    for r in [0, 2] {
        let calls = &out[r];
        assert!(calls[0].is_ok(), "rank {r}: check_error: {:?}", calls[0]);
        for c in &calls[1..] {
            assert!(
                matches!(c, Err(Error::PeerLost { rank: 1, reason })
                    if reason.contains("destroyed its communicator after 1 collective calls")),
                "rank {r}: {c:?}"
            );
        }
    }
}

#[test]
fn a_host_call_completes_for_everyone_when_a_rank_leaves_right_after_it() {
    // Rank 1 destroys its communicator as soon as the barrier returns; the news of that may
    // overtake the barrier's result on its way to the others (seen on a loaded machine), and
    // must not fail a barrier rank 1 took part in.
    for round in 0..20 {
        let out = with_ranks(4, |comm| {
            if comm.rank() == 0 {
                thread::sleep(Duration::from_millis(5));
            }
            let r = comm.barrier();
            if comm.rank() != 1 {
                thread::sleep(Duration::from_millis(50));
            }
            r
        });
        for (r, o) in out.iter().enumerate() {
            assert!(o.is_ok(), "round {round}, rank {r}: {o:?}");
        }
    }
}

#[test]
fn peers_of_an_aborted_rank_are_told_it_aborted() {
    // Rank 1 aborts; the root and (through it) rank 2 report that, not a dead process.
    let out = with_ranks(3, |comm| {
        comm.barrier().unwrap();
        if comm.rank() == 1 {
            comm.abort();
            return comm.check_error();
        }
        let t = Instant::now();
        loop {
            match comm.check_error() {
                Ok(()) if t.elapsed() > Duration::from_secs(10) => panic!("never told"),
                Ok(()) => thread::sleep(Duration::from_millis(10)),
                e => return e,
            }
        }
    });
    assert!(
        matches!(out[1], Err(Error::Aborted { rank: 1, .. })),
        "{:?}",
        out[1]
    );
    for r in [0, 2] {
        assert!(
            matches!(&out[r], Err(Error::PeerLost { rank: 1, reason })
                if reason == "it aborted its communicator"),
            "rank {r}: {:?}",
            out[r]
        );
    }
}

#[test]
fn after_a_host_timeout_check_error_reports_what_calls_return() {
    // Rank 1 skips a barrier: rank 0's times out (the call sequences diverged), and from then
    // on check_error and every host call report that same HostTimeout (before: check_error was
    // Ok and calls said InvalidArgument).
    let id = UniqueId::new_on(LOOPBACK).unwrap();
    let gate = Barrier::new(2);
    thread::scope(|s| {
        let r1 = s.spawn(|| {
            let c = config(&id, 1, 2, Duration::from_secs(1));
            let _comm = Communicator::init_with(&c, Device::Emu, &support::test_options()).unwrap();
            gate.wait();
            gate.wait();
        });
        let c = config(&id, 0, 2, Duration::from_secs(1));
        let comm = Communicator::init_with(&c, Device::Emu, &support::test_options()).unwrap();
        gate.wait();
        let first = comm.barrier();
        let state = comm.check_error();
        let later = comm.barrier();
        gate.wait();
        r1.join().unwrap();
        assert!(
            matches!(first, Err(Error::HostTimeout { rank: 0, .. })),
            "{first:?}"
        );
        for e in [&state, &later] {
            match e {
                Err(Error::HostTimeout { rank: 0, what, .. }) => {
                    assert!(
                        what.contains("barrier") && what.contains("earlier"),
                        "{what}"
                    )
                }
                other => panic!("{other:?}"),
            }
        }
    });
}

/// Ranks on two hosts: each host's ranks form the local team, and the device handle and windows
/// span both hosts (other hosts' ranks reached through the proxy: `ranks` and `proxy` are set).
#[test]
fn ranks_on_different_hosts_get_host_teams_and_handles_across_hosts() {
    let id = UniqueId::new_on(LOOPBACK).unwrap();
    let out: Vec<_> = thread::scope(|s| {
        let hs: Vec<_> = (0..4u32)
            .map(|r| {
                let id = &id;
                s.spawn(move || {
                    let c = config(id, r, 4, Duration::from_secs(20)).with_host_id(if r < 2 {
                        "host-a"
                    } else {
                        "host-b"
                    });
                    let comm =
                        Communicator::init_with(&c, Device::Emu, &support::test_options()).unwrap();
                    let team = comm.local_team().ranks().to_vec();
                    let dev = comm.device_handle().unwrap();
                    let win = comm.alloc_window::<u8>(8).unwrap().device_handle();
                    comm.barrier().unwrap();
                    (team, dev, win)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, (team, dev, win)) in out.iter().enumerate() {
        assert_eq!(team, &if r < 2 { vec![0, 1] } else { vec![2, 3] });
        assert_eq!((dev.rank, dev.nranks), (r as u32, 4));
        assert!(dev.ranks != 0 && dev.proxy != 0, "rank {r}: {dev:?}");
        assert_eq!(win.raw().nranks, 4, "rank {r}: {win:?}");
        assert!(win.raw().ranks != 0, "rank {r}: {win:?}");
    }
}

#[test]
fn a_wrong_secret_fails_fast_and_a_missing_rank_is_named() {
    let id = UniqueId::new_on(LOOPBACK).unwrap();
    let impostor = UniqueId::from_parts(id.addr(), [0x5a; 16]).unwrap();
    let t = Instant::now();
    let out: Vec<Result<Arc<Communicator>>> = thread::scope(|s| {
        let good = s.spawn(|| {
            Communicator::init_with(
                &config(&id, 0, 3, Duration::from_secs(2)),
                Device::Emu,
                &support::test_options(),
            )
        });
        let bad = s.spawn(|| {
            Communicator::init_with(
                &config(&impostor, 1, 3, Duration::from_secs(2)),
                Device::Emu,
                &support::test_options(),
            )
        });
        let good2 = s.spawn(|| {
            Communicator::init_with(
                &config(&id, 2, 3, Duration::from_secs(2)),
                Device::Emu,
                &support::test_options(),
            )
        });
        vec![
            good.join().unwrap(),
            bad.join().unwrap(),
            good2.join().unwrap(),
        ]
    });
    let e1 = out[1].as_ref().unwrap_err();
    assert!(matches!(e1, Error::AuthFailed(_)), "impostor: {e1}");
    for r in [0, 2] {
        match out[r].as_ref().unwrap_err() {
            Error::InitTimeout { missing, .. } => assert_eq!(missing, &vec![1], "rank {r}"),
            e => panic!("rank {r}: {e}"),
        }
    }
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
}

#[test]
fn device_and_option_strings_parse() {
    assert_eq!(Device::parse("emu").unwrap(), Device::Emu);
    assert_eq!(Device::parse("auto").unwrap(), Device::Auto);
    assert_eq!(Device::parse("cuda:3").unwrap(), Device::Cuda(3));
    assert!(Device::parse("gpu").is_err());
    assert!(Device::parse("cuda:x").is_err());
    let id = UniqueId::new_on(LOOPBACK).unwrap();
    let bad = CommOptions::default().with_liveness(Duration::from_secs(2), Duration::from_secs(1));
    let e = Communicator::init_with(
        &config(&id, 0, 1, Duration::from_secs(1)),
        Device::Emu,
        &bad,
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}

/// Set in the environment of the child process of
/// `bad_tunables_are_refused_by_init_before_the_rendezvous`.
const BAD_TUNABLE_CHILD: &str = "SYMCOMM_TEST_BAD_TUNABLE_CHILD";

/// Bad values of tunables the collectives read later (`SYMCOMM_ALGO`, `SYMCOMM_STAGING_BYTES`)
/// fail `init` at once, before the rendezvous (issue 11: they failed only at the first
/// collective). Each value runs in a child process of this test binary (environment variables
/// are process-wide): rank 1 of 2 with no root, so reaching the rendezvous would wait for its
/// 20 s timeout.
#[test]
fn bad_tunables_are_refused_by_init_before_the_rendezvous() {
    if std::env::var_os(BAD_TUNABLE_CHILD).is_some() {
        let id = UniqueId::new_on(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
        let c = config(&id, 1, 2, Duration::from_secs(20));
        let t = Instant::now();
        let e = Communicator::init_with(&c, Device::Emu, &support::test_options()).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        println!("child error: {e}");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for (name, value) in [
        ("SYMCOMM_ALGO", "ring"),
        ("SYMCOMM_STAGING_BYTES", "12"),
        ("SYMCOMM_STAGING_BYTES", "lots"),
    ] {
        let out = std::process::Command::new(&exe)
            .args([
                "--exact",
                "bad_tunables_are_refused_by_init_before_the_rendezvous",
                "--nocapture",
            ])
            .env(BAD_TUNABLE_CHILD, "1")
            .env(name, value)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}={value}: {text}");
        assert!(
            text.contains("child error: invalid argument: ")
                && text.contains(name)
                && text.contains(value),
            "{name}={value}: {text}"
        );
    }
}

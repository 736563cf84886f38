//! The `rk_*` kernels of `device/src/primitives.rs` on the emulator, 2..5 ranks as threads of
//! this process (`Device::Emu`): every family of symcomm-kernel's Rust API (signals,
//! semaphores, ordered memory operations, barriers, put / get, collectives, grid_sync and
//! cta_part), each result checked exactly against a host reference; the failure paths
//! (Timeout, Aborted, Mismatch, InvalidArgument) as typed `symcomm::Error`s from `check_error`;
//! `on_this_host` and `put_with_signal` across simulated hosts (the proxy);
//! and the example binary itself, with ranks as threads and as processes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use symcomm::abi::{
    SYMCOMM_STATUS_ABORTED, SYMCOMM_STATUS_INVALID_ARGUMENT, SYMCOMM_STATUS_MISMATCH,
    SYMCOMM_STATUS_OK, SYMCOMM_STATUS_TIMEOUT, SYMCOMM_USER_BARRIER_END,
    SYMCOMM_USER_BARRIER_FIRST, SYMCOMM_USER_SIGNAL_END,
};
use symcomm::bootstrap::BootstrapConfig;
use symcomm::{
    CommOptions, Communicator, Device, DevicePlain, Error, KernelArgs, LaunchConfig, Stream,
    UniqueId, Window,
};

include!(concat!(env!("OUT_DIR"), "/rust_kernel_device_image.rs"));

const OK: u64 = SYMCOMM_STATUS_OK as u64;
/// A failed call must return well before any long deadline.
const PROMPT: Duration = Duration::from_secs(5);

fn options(timeout: Duration) -> CommOptions {
    CommOptions::default().with_device_timeout(timeout)
}

/// Runs `f` on `n` ranks, one thread each, on the emulator; returns each rank's result.
fn with_ranks<R: Send>(
    n: u32,
    opts: &CommOptions,
    f: impl Fn(&Communicator) -> R + Sync,
) -> Vec<R> {
    with_ranks_on_hosts(&vec!["rk-host"; n as usize], opts, f)
}

/// [`with_ranks`] with rank `r` on simulated host `hosts[r]` (its `SYMCOMM_HOST_ID`: ranks with
/// different ids are on different hosts, UCX between them).
fn with_ranks_on_hosts<R: Send>(
    hosts: &[&str],
    opts: &CommOptions,
    f: impl Fn(&Communicator) -> R + Sync,
) -> Vec<R> {
    let n = hosts.len() as u32;
    let id = UniqueId::new_on(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
    let done = Barrier::new(n as usize);
    thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (id, f, done) = (&id, &f, &done);
                s.spawn(move || {
                    let config =
                        BootstrapConfig::new(id.clone(), r, n).with_host_id(hosts[r as usize]);
                    let comm = Communicator::init_with(&config, Device::Emu, opts).unwrap();
                    let out = f(&comm);
                    // No rank destroys its communicator while another still uses it.
                    done.wait();
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Launches kernel `name` with `args` on `stream` (not synchronized).
fn launch(comm: &Communicator, stream: &Stream, name: &str, cfg: LaunchConfig, args: &KernelArgs) {
    let kernel = comm.load_kernel(&DEVICE_IMAGE, name).unwrap();
    // SAFETY: every test passes the kernel's parameters in order and type (see each kernel's
    // signature in device/src/primitives.rs), and synchronizes the stream before the windows
    // and the communicator drop.
    unsafe { comm.launch(stream, &kernel, cfg, args) }.unwrap();
}

fn zeroed<T: DevicePlain + Default>(comm: &Communicator, n: usize) -> Window<T> {
    let w = comm.alloc_window::<T>(n).unwrap();
    w.write(0, &vec![T::default(); n]).unwrap();
    w
}

/// Counts the differences between `got` and `want`, printing the first few.
fn wrong<T: PartialEq + std::fmt::Debug>(label: &str, got: &[T], want: &[T]) -> usize {
    assert_eq!(got.len(), want.len(), "{label}: lengths");
    let bad: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
    for &i in bad.iter().take(5) {
        eprintln!("{label}: [{i}] got {:?}, want {:?}", got[i], want[i]);
    }
    bad.len()
}

fn ring(comm: &Communicator) -> (u32, u32, u32, u32) {
    let (me, n) = (comm.rank(), comm.nranks());
    (me, n, (me + 1) % n, (me + n - 1) % n)
}

// ---------------------------------------------------------------------------------------------
// Signals and semaphores.

fn ring_value(rank: u32, epoch: u64, i: u32) -> u32 {
    rank.wrapping_mul(1_000_000)
        .wrapping_add((epoch as u32).wrapping_mul(1000))
        .wrapping_add(i)
}

#[test]
fn signal_set_and_wait_around_the_ring_for_every_group_back_to_back() {
    for n in 2..=5 {
        let len = 45u32;
        let launches = 9u32;
        let bad = with_ranks(n, &options(Duration::from_secs(30)), |comm| {
            let (_, _, _, prev) = ring(comm);
            let data = zeroed::<u32>(comm, (launches * len) as usize);
            let out = zeroed::<u64>(comm, (launches * (len + 2)) as usize);
            let s = comm.create_stream().unwrap();
            comm.barrier().unwrap();
            // Three launches per group, back to back (no host synchronization between them).
            for launch_no in 0..launches {
                let group = launch_no / 3;
                let epoch = u64::from(launch_no) + 1;
                let args = KernelArgs::new()
                    .arg(&comm.device_handle().unwrap())
                    .arg(&data.device_handle())
                    .arg(&out.device_handle())
                    .arg(&group)
                    .arg(&5u32)
                    .arg(&epoch)
                    .arg(&launch_no)
                    .arg(&len);
                launch(
                    comm,
                    &s,
                    "rk_signal_ring",
                    LaunchConfig::linear(1, 64),
                    &args,
                );
            }
            s.synchronize().unwrap();
            comm.check_error().unwrap();
            let got = out.to_vec().unwrap();
            let mut want = Vec::new();
            for l in 0..launches {
                want.extend([OK, OK]);
                want.extend((0..len).map(|i| u64::from(ring_value(prev, u64::from(l) + 1, i))));
            }
            wrong(&format!("ring n={n} rank {}", comm.rank()), &got, &want)
        });
        assert_eq!(bad.iter().sum::<usize>(), 0, "n={n}: {bad:?}");
    }
}

#[test]
fn signal_add_from_every_rank_into_every_peer() {
    for n in 2..=5 {
        let adds = 4u32;
        let total = (n * adds) as usize;
        let per = 2 * total + n as usize;
        let bad = with_ranks(n, &options(Duration::from_secs(30)), |comm| {
            let me = comm.rank();
            let out = zeroed::<u64>(comm, 2 * per);
            let s = comm.create_stream().unwrap();
            comm.barrier().unwrap();
            for launch_no in 0..2u32 {
                let args = KernelArgs::new()
                    .arg(&comm.device_handle().unwrap())
                    .arg(&out.device_handle())
                    .arg(&7u32)
                    .arg(&adds)
                    .arg(&launch_no) // scope: Gpu, then Sys
                    .arg(&launch_no);
                launch(
                    comm,
                    &s,
                    "rk_signal_add",
                    LaunchConfig::linear(1, 32),
                    &args,
                );
            }
            s.synchronize().unwrap();
            comm.check_error().unwrap();
            let got = out.to_vec().unwrap();
            let mut bad = 0;
            for l in 0..2usize {
                let o = &got[l * per..(l + 1) * per];
                let delta = u64::from(me) + 1;
                for p in 0..n as usize {
                    // The previous values that thread p + n*j saw: every earlier add of this
                    // rank to that word, in some order.
                    let mut prevs: Vec<u64> =
                        (0..adds as usize).map(|j| o[p + n as usize * j]).collect();
                    prevs.sort_unstable();
                    let base = l as u64 * u64::from(adds) * delta;
                    let want: Vec<u64> = (0..u64::from(adds)).map(|j| base + j * delta).collect();
                    bad += wrong(
                        &format!("add n={n} rank {me} launch {l} peer {p}"),
                        &prevs,
                        &want,
                    );
                }
                bad += wrong("add statuses", &o[total..], &vec![OK; total + n as usize]);
            }
            bad
        });
        assert_eq!(bad.iter().sum::<usize>(), 0, "n={n}: {bad:?}");
    }
}

#[test]
fn semaphores_around_the_ring_count_across_launches() {
    for n in 2..=5 {
        let rounds = 3u32;
        let launches = 3u32;
        let all = (rounds * launches) as usize;
        let bad = with_ranks(n, &options(Duration::from_secs(30)), |comm| {
            let (me, _, _, prev) = ring(comm);
            let data = zeroed::<u64>(comm, all);
            let expected = zeroed::<u64>(comm, 1);
            let out = zeroed::<u64>(comm, 3 * all);
            let s = comm.create_stream().unwrap();
            comm.barrier().unwrap();
            for launch_no in 0..launches {
                let args = KernelArgs::new()
                    .arg(&comm.device_handle().unwrap())
                    .arg(&data.device_handle())
                    .arg(&expected.device_handle())
                    .arg(&out.device_handle())
                    .arg(&launch_no) // group: Thread, Warp, Cta
                    .arg(&9u32)
                    .arg(&rounds)
                    .arg(&launch_no);
                launch(comm, &s, "rk_semaphore", LaunchConfig::linear(1, 64), &args);
            }
            s.synchronize().unwrap();
            comm.check_error().unwrap();
            let got = out.to_vec().unwrap();
            let want: Vec<u64> = (0..all as u64)
                .flat_map(|g| [OK, OK, (u64::from(prev) << 32) | g])
                .collect();
            wrong(&format!("semaphore n={n} rank {me}"), &got, &want)
                + wrong("expected count", &expected.to_vec().unwrap(), &[all as u64])
        });
        assert_eq!(bad.iter().sum::<usize>(), 0, "n={n}: {bad:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Ordered memory operations.

#[test]
fn ordered_loads_stores_and_atomics_on_window_words_at_both_scopes() {
    const WORDS: usize = 16;
    const FLAGS: usize = 4;
    for n in 2..=5 {
        let adds = 3u32;
        let outs = with_ranks(n, &options(Duration::from_secs(30)), |comm| {
            let ctr = zeroed::<u64>(comm, 2 * WORDS);
            let flag = zeroed::<u32>(comm, 2 * FLAGS);
            let out = zeroed::<u64>(comm, 2 * WORDS);
            let s = comm.create_stream().unwrap();
            comm.barrier().unwrap();
            for launch_no in 0..2u32 {
                let args = KernelArgs::new()
                    .arg(&comm.device_handle().unwrap())
                    .arg(&ctr.device_handle())
                    .arg(&flag.device_handle())
                    .arg(&out.device_handle())
                    .arg(&launch_no) // scope: Gpu, then Sys
                    .arg(&adds)
                    .arg(&SYMCOMM_USER_BARRIER_FIRST)
                    .arg(&0x3e3u32)
                    .arg(&(u64::from(launch_no) + 1))
                    .arg(&launch_no);
                launch(comm, &s, "rk_memory", LaunchConfig::linear(1, 32), &args);
            }
            s.synchronize().unwrap();
            comm.check_error().unwrap();
            out.to_vec().unwrap()
        });
        let mut bad = 0;
        for l in 0..2 {
            let b = l * WORDS;
            let epoch = l as u64 + 1;
            let olds: Vec<u64> = outs.iter().map(|o| o[b]).collect();
            let winners: Vec<usize> = (0..n as usize).filter(|&r| olds[r] == 0).collect();
            assert_eq!(winners.len(), 1, "launch {l}: CAS olds {olds:?}");
            let w = winners[0] as u64;
            let sum: u64 = (1..=u64::from(n)).sum::<u64>() * u64::from(adds);
            for (r, o) in outs.iter().enumerate() {
                let prev = (r as u64 + u64::from(n) - 1) % u64::from(n);
                let payload = (prev << 32) | epoch;
                let cas = if r as u64 == w { 0 } else { w + 1 };
                let want = [
                    cas,
                    0,
                    payload,
                    0,
                    !payload,
                    OK,
                    sum,
                    u64::from(adds * n),
                    w + 1,
                    OK,
                ];
                bad += wrong(
                    &format!("memory n={n} launch {l} rank {r}"),
                    &o[b..b + 10],
                    &want,
                );
            }
        }
        assert_eq!(bad, 0, "n={n}");
    }
}

// ---------------------------------------------------------------------------------------------
// Barriers.

fn barrier_value(from: u32, to: u32, g: u64) -> u64 {
    (g << 40) | (u64::from(from) << 20) | u64::from(to)
}

/// Arguments of `rk_barrier`.
#[allow(clippy::too_many_arguments)]
fn barrier_args(
    comm: &Communicator,
    data: &Window<u64>,
    out: &Window<u64>,
    group: u32,
    slot: u32,
    tag: u32,
    rounds: u32,
    launch_no: u32,
) -> KernelArgs {
    KernelArgs::new()
        .arg(&comm.device_handle().unwrap())
        .arg(&data.device_handle())
        .arg(&out.device_handle())
        .arg(&group)
        .arg(&slot)
        .arg(&tag)
        .arg(&12u64)
        .arg(&rounds)
        .arg(&launch_no)
}

#[test]
fn barriers_with_user_fingerprints_publish_every_group_writes() {
    for n in 2..=5 {
        let rounds = 3u32;
        let launches = 3u32;
        let all = (rounds * launches) as usize;
        let nn = n as usize;
        let bad = with_ranks(n, &options(Duration::from_secs(30)), |comm| {
            let me = comm.rank();
            let data = zeroed::<u64>(comm, all * nn);
            let out = zeroed::<u64>(comm, all * (nn + 1));
            let s = comm.create_stream().unwrap();
            comm.barrier().unwrap();
            for launch_no in 0..launches {
                let slot = SYMCOMM_USER_BARRIER_FIRST + 2;
                let args =
                    barrier_args(comm, &data, &out, launch_no, slot, 0x77, rounds, launch_no);
                launch(comm, &s, "rk_barrier", LaunchConfig::linear(1, 64), &args);
            }
            s.synchronize().unwrap();
            comm.check_error().unwrap();
            let want: Vec<u64> = (0..all as u64)
                .flat_map(|g| (0..n).map(move |p| barrier_value(p, me, g)).chain([OK]))
                .collect();
            wrong(
                &format!("barrier n={n} rank {me}"),
                &out.to_vec().unwrap(),
                &want,
            )
        });
        assert_eq!(bad.iter().sum::<usize>(), 0, "n={n}: {bad:?}");
    }
}

/// One `rk_barrier` launch of one round per rank in `launching` (the others launch nothing),
/// with `tag_of(rank)` and `slot`, while `during(comm)` runs on a second thread of each rank;
/// returns per rank: the barrier's status (None: did not launch), `check_error()`, the time.
fn barrier_fault(
    n: u32,
    timeout: Duration,
    launching: impl Fn(u32) -> bool + Sync,
    tag_of: impl Fn(u32) -> u32 + Sync,
    slot: u32,
    during: impl Fn(&Communicator) + Sync,
) -> Vec<(Option<u64>, symcomm::Result<()>, Duration)> {
    with_ranks(n, &options(timeout), |comm| {
        let me = comm.rank();
        let nn = n as usize;
        let data = zeroed::<u64>(comm, nn);
        let out = zeroed::<u64>(comm, nn + 1);
        let s = comm.create_stream().unwrap();
        comm.barrier().unwrap();
        let start = Instant::now();
        let status = thread::scope(|inner| {
            inner.spawn(|| during(comm));
            if !launching(me) {
                return None;
            }
            let args = barrier_args(comm, &data, &out, 2, slot, tag_of(me), 1, 0);
            launch(comm, &s, "rk_barrier", LaunchConfig::linear(1, 64), &args);
            // A stream of an aborted communicator may report the abort itself.
            match s.synchronize() {
                Ok(()) | Err(Error::Aborted { .. }) => {}
                Err(e) => panic!("rank {me}: synchronize: {e}"),
            }
            Some(out.to_vec().unwrap()[nn])
        });
        (status, comm.check_error(), start.elapsed())
    })
}

#[test]
fn a_rank_that_never_arrives_times_out_the_barrier() {
    let got = barrier_fault(
        3,
        Duration::from_millis(300),
        |r| r != 2,
        |_| 5,
        SYMCOMM_USER_BARRIER_FIRST,
        |_| {},
    );
    for (r, (status, err, took)) in got.iter().enumerate() {
        assert!(*took < PROMPT, "rank {r} took {took:?}");
        if r == 2 {
            assert_eq!(*status, None);
            assert!(err.is_ok(), "rank 2 launched nothing: {err:?}");
            continue;
        }
        assert_eq!(*status, Some(u64::from(SYMCOMM_STATUS_TIMEOUT)), "rank {r}");
        assert!(
            matches!(err, Err(Error::Timeout { rank, peer: 2, .. }) if *rank == r as u32),
            "rank {r}: {err:?}"
        );
    }
}

#[test]
fn abort_stops_a_waiting_barrier_and_the_peer_sees_the_rank_lost() {
    let got = barrier_fault(
        2,
        Duration::from_secs(30),
        |r| r == 0,
        |_| 5,
        SYMCOMM_USER_BARRIER_FIRST,
        |comm| {
            if comm.rank() == 0 {
                thread::sleep(Duration::from_millis(300));
                comm.abort();
            } else {
                // Rank 1 launches nothing and waits until it hears that rank 0 is gone.
                let t = Instant::now();
                while comm.check_error().is_ok() {
                    assert!(t.elapsed() < PROMPT, "rank 1 never saw rank 0 go");
                    thread::sleep(Duration::from_millis(10));
                }
            }
        },
    );
    let (status, err, took) = &got[0];
    assert_eq!(*status, Some(u64::from(SYMCOMM_STATUS_ABORTED)));
    assert!(
        matches!(err, Err(Error::Aborted { rank: 0, .. })),
        "rank 0: {err:?}"
    );
    assert!(*took < PROMPT, "rank 0 took {took:?}");
    let (status, err, took) = &got[1];
    assert_eq!(*status, None);
    assert!(
        matches!(err, Err(Error::PeerLost { rank: 0, .. })),
        "rank 1: {err:?}"
    );
    assert!(*took < PROMPT, "rank 1 took {took:?}");
}

#[test]
fn ranks_with_different_fingerprint_tags_get_mismatch() {
    for n in [2, 3] {
        let got = barrier_fault(
            n,
            Duration::from_secs(30),
            |_| true,
            |r| if r == 0 { 1 } else { 2 },
            SYMCOMM_USER_BARRIER_FIRST + 1,
            |_| {},
        );
        for (r, (status, err, took)) in got.iter().enumerate() {
            assert!(*took < PROMPT, "n={n} rank {r} took {took:?}");
            assert_eq!(
                *status,
                Some(u64::from(SYMCOMM_STATUS_MISMATCH)),
                "n={n} rank {r}"
            );
            assert!(
                matches!(err, Err(Error::Mismatch { rank, .. }) if *rank == r as u32),
                "n={n} rank {r}: {err:?}"
            );
        }
    }
}

#[test]
fn a_barrier_index_past_the_users_range_is_an_invalid_argument() {
    let got = barrier_fault(
        2,
        Duration::from_secs(30),
        |_| true,
        |_| 5,
        SYMCOMM_USER_BARRIER_END,
        |_| {},
    );
    for (r, (status, err, took)) in got.iter().enumerate() {
        assert!(*took < PROMPT, "rank {r} took {took:?}");
        assert_eq!(
            *status,
            Some(u64::from(SYMCOMM_STATUS_INVALID_ARGUMENT)),
            "rank {r}"
        );
        assert!(
            matches!(err, Err(Error::InvalidArgument(_))),
            "rank {r}: {err:?}"
        );
    }
}

#[test]
fn a_signal_word_past_the_users_range_is_an_invalid_argument() {
    let got = with_ranks(2, &options(Duration::from_secs(30)), |comm| {
        let data = zeroed::<u32>(comm, 8);
        let out = zeroed::<u64>(comm, 10);
        let s = comm.create_stream().unwrap();
        comm.barrier().unwrap();
        let start = Instant::now();
        let args = KernelArgs::new()
            .arg(&comm.device_handle().unwrap())
            .arg(&data.device_handle())
            .arg(&out.device_handle())
            .arg(&2u32)
            .arg(&SYMCOMM_USER_SIGNAL_END)
            .arg(&1u64)
            .arg(&0u32)
            .arg(&8u32);
        launch(
            comm,
            &s,
            "rk_signal_ring",
            LaunchConfig::linear(1, 64),
            &args,
        );
        s.synchronize().unwrap();
        (out.to_vec().unwrap(), comm.check_error(), start.elapsed())
    });
    let inv = u64::from(SYMCOMM_STATUS_INVALID_ARGUMENT);
    for (r, (out, err, took)) in got.iter().enumerate() {
        assert!(*took < PROMPT, "rank {r} took {took:?}");
        assert_eq!(out[..2], [inv, inv], "rank {r}: set and wait statuses");
        assert!(
            matches!(err, Err(Error::InvalidArgument(_))),
            "rank {r}: {err:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Put / get.

/// Element `i` of rank `r`'s source in the put / get tests (as u64; u32 keeps the low half).
fn p2p_value(r: u32, i: usize) -> u64 {
    ((u64::from(r) + 1) << 33) | (u64::from(r) << 20) | i as u64
}

trait Word: DevicePlain + Default + PartialEq + std::fmt::Debug {
    const BYTES: u32;
    fn of(v: u64) -> Self;
}
impl Word for u32 {
    const BYTES: u32 = 4;
    fn of(v: u64) -> Self {
        v as u32
    }
}
impl Word for u64 {
    const BYTES: u32 = 8;
    fn of(v: u64) -> Self {
        v
    }
}

const CANARY: u64 = 0xA5A5_A5A5_A5A5_A5A5;

/// Runs `rk_p2p` on windows of `W` for every group and mode, with `count` elements from
/// offset `src_off` to `dst_off`; returns #wrong. `epoch` numbers the put_with_signal calls.
#[allow(clippy::too_many_arguments)]
fn p2p_cases<W: Word>(
    comm: &Communicator,
    s: &Stream,
    len: usize,
    count: usize,
    src_off: usize,
    dst_off: usize,
    epoch: &mut u64,
) -> usize {
    let (me, _, _, prev) = ring(comm);
    let src = comm.alloc_window::<W>(len).unwrap();
    let dst = comm.alloc_window::<W>(len).unwrap();
    let out = comm.alloc_window::<u64>(4).unwrap();
    let mut bad = 0;
    for group in [1u32, 2] {
        for mode in 0..3u32 {
            *epoch += 1;
            let mine: Vec<W> = (0..len).map(|i| W::of(p2p_value(me, i))).collect();
            src.write(0, &mine).unwrap();
            dst.write(0, &vec![W::of(CANARY); len]).unwrap();
            out.write(0, &[CANARY; 4]).unwrap();
            comm.barrier().unwrap();
            let args = KernelArgs::new()
                .arg(&comm.device_handle().unwrap())
                .arg(&src.device_handle().raw())
                .arg(&dst.device_handle().raw())
                .arg(&out.device_handle())
                .arg(&W::BYTES)
                .arg(&group)
                .arg(&mode)
                .arg(&(count as u64))
                .arg(&(src_off as u64))
                .arg(&(dst_off as u64))
                .arg(&11u32)
                .arg(&*epoch)
                .arg(&(SYMCOMM_USER_BARRIER_FIRST + 3));
            launch(comm, s, "rk_p2p", LaunchConfig::linear(1, 64), &args);
            s.synchronize().unwrap();
            comm.check_error().unwrap();
            let label = format!(
                "p2p {}B group {group} mode {mode} count {count} rank {me} of {}",
                W::BYTES,
                comm.nranks()
            );
            let statuses = if mode == 0 {
                vec![OK, OK, CANARY]
            } else {
                vec![OK; 3]
            };
            bad += wrong(
                &format!("{label} statuses"),
                &out.to_vec().unwrap()[..3],
                &statuses,
            );
            // Every mode moves the previous rank's src[src_off, +count) here, to
            // dst[dst_off, +count); the rest of dst keeps the canary, src is unchanged.
            let mut want = vec![W::of(CANARY); len];
            for i in 0..count {
                want[dst_off + i] = W::of(p2p_value(prev, src_off + i));
            }
            bad += wrong(&format!("{label} dst"), &dst.to_vec().unwrap(), &want);
            bad += wrong(&format!("{label} src"), &src.to_vec().unwrap(), &mine);
            comm.barrier().unwrap();
        }
    }
    bad
}

#[test]
fn put_get_and_put_with_signal_move_exactly_the_range() {
    for n in 2..=5 {
        let bad = with_ranks(n, &options(Duration::from_secs(30)), |comm| {
            let s = comm.create_stream().unwrap();
            let mut epoch = 0;
            p2p_cases::<u32>(comm, &s, 64, 37, 3, 5, &mut epoch)
                + p2p_cases::<u64>(comm, &s, 64, 37, 3, 5, &mut epoch)
                + p2p_cases::<u32>(comm, &s, 300, 257, 1, 40, &mut epoch)
                + p2p_cases::<u64>(comm, &s, 16, 1, 15, 0, &mut epoch)
        });
        assert_eq!(bad.iter().sum::<usize>(), 0, "n={n}: {bad:?}");
    }
}

/// `rk_p2p` with a destination range that does not fit; returns (out[0..3], check_error).
fn out_of_range_put(mode: u32) -> Vec<(Vec<u64>, symcomm::Result<()>, Vec<u32>)> {
    with_ranks(3, &options(Duration::from_millis(300)), |comm| {
        let src = comm.alloc_window::<u32>(64).unwrap();
        let dst = comm.alloc_window::<u32>(64).unwrap();
        let out = comm.alloc_window::<u64>(4).unwrap();
        src.write(0, &[7; 64]).unwrap();
        dst.write(0, &[CANARY as u32; 64]).unwrap();
        out.write(0, &[CANARY; 4]).unwrap();
        let s = comm.create_stream().unwrap();
        comm.barrier().unwrap();
        let args = KernelArgs::new()
            .arg(&comm.device_handle().unwrap())
            .arg(&src.device_handle().raw())
            .arg(&dst.device_handle().raw())
            .arg(&out.device_handle())
            .arg(&4u32)
            .arg(&2u32)
            .arg(&mode)
            .arg(&10u64)
            .arg(&0u64)
            .arg(&60u64) // 60 + 10 > 64
            .arg(&11u32)
            .arg(&1u64)
            .arg(&(SYMCOMM_USER_BARRIER_FIRST + 3));
        launch(comm, &s, "rk_p2p", LaunchConfig::linear(1, 64), &args);
        s.synchronize().unwrap();
        let err = comm.check_error();
        comm.barrier().unwrap();
        (
            out.to_vec().unwrap()[..3].to_vec(),
            err,
            dst.to_vec().unwrap(),
        )
    })
}

#[test]
fn an_out_of_range_put_is_refused_with_nothing_written() {
    let inv = u64::from(SYMCOMM_STATUS_INVALID_ARGUMENT);
    // put: the status says so, nothing is recorded (put has no communicator), the barrier after
    // it passes.
    for (r, (out, err, dst)) in out_of_range_put(0).iter().enumerate() {
        assert_eq!(out, &[inv, OK, CANARY], "put rank {r}");
        assert!(err.is_ok(), "put rank {r}: {err:?}");
        assert!(
            dst.iter().all(|&v| v == CANARY as u32),
            "put rank {r}: dst written"
        );
    }
    // put_with_signal: refused and recorded; the wait after it returns the recorded status.
    for (r, (out, err, dst)) in out_of_range_put(2).iter().enumerate() {
        assert_eq!(out[0], inv, "put_with_signal rank {r}");
        assert_eq!(out[1], inv, "put_with_signal rank {r}: the wait");
        assert!(
            matches!(err, Err(Error::InvalidArgument(_))),
            "put_with_signal rank {r}: {err:?}"
        );
        assert!(
            dst.iter().all(|&v| v == CANARY as u32),
            "put_with_signal rank {r}: dst written"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Collectives.

/// A host element type of the collectives: the kernel's dtype code, exact conversion from the
/// small integers of these tests, the bits compared.
trait El: DevicePlain + Default {
    const CODE: u32;
    fn of(v: i128) -> Self;
    fn bits(self) -> u64;
    fn canary() -> Self;
}

macro_rules! int_el {
    ($t:ty, $code:expr) => {
        impl El for $t {
            const CODE: u32 = $code;
            fn of(v: i128) -> Self {
                v as $t
            }
            fn bits(self) -> u64 {
                self as u64
            }
            fn canary() -> Self {
                CANARY as $t
            }
        }
    };
}
int_el!(i32, 8);
int_el!(u32, 9);
int_el!(i64, 10);
int_el!(u64, 11);

impl El for f32 {
    const CODE: u32 = 0;
    fn of(v: i128) -> Self {
        v as f32
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
    fn canary() -> Self {
        f32::from_bits(CANARY as u32)
    }
}
impl El for f64 {
    const CODE: u32 = 1;
    fn of(v: i128) -> Self {
        v as f64
    }
    fn bits(self) -> u64 {
        self.to_bits()
    }
    fn canary() -> Self {
        f64::from_bits(CANARY)
    }
}
/// bfloat16 bits (the upper half of a binary32): exact for the integers used here (|v| <= 256).
impl El for u16 {
    const CODE: u32 = 3;
    fn of(v: i128) -> Self {
        let f = v as f32;
        assert_eq!(f.to_bits() & 0xffff, 0, "{v} is not exact in bf16");
        (f.to_bits() >> 16) as u16
    }
    fn bits(self) -> u64 {
        u64::from(self)
    }
    fn canary() -> Self {
        CANARY as u16
    }
}

const ALL_REDUCE_ONE_SHOT: u32 = 0;
const ALL_REDUCE_TWO_SHOT: u32 = 1;
const ALL_GATHER: u32 = 2;
const REDUCE_SCATTER: u32 = 3;
const BROADCAST: u32 = 4;
const REDUCE: u32 = 5;
const SCATTER: u32 = 6;
const ALL_TO_ALL: u32 = 7;
const ALL_REDUCE_LL: u32 = 8;
const ALL_GATHER_LL: u32 = 9;
const REDUCE_SCATTER_LL: u32 = 10;
const BROADCAST_LL: u32 = 11;
const KIND_NAMES: [&str; 12] = [
    "all_reduce_one_shot",
    "all_reduce_two_shot",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "scatter",
    "all_to_all",
    "all_reduce_ll",
    "all_gather_ll",
    "reduce_scatter_ll",
    "broadcast_ll",
];
const SUM: u32 = 0;
const PROD: u32 = 1;
const MIN: u32 = 2;
const MAX: u32 = 3;

#[derive(Clone, Copy, Debug)]
struct Case {
    kind: u32,
    op: u32,
    root: u32,
    count: usize,
    in_place: bool,
    grid: bool,
}

/// Element j of rank r's input: small integers, so every reduction is exact in every type.
fn input<T: El>(case: &Case, r: u32, j: usize) -> i128 {
    let (r, j) = (i128::from(r), j as i128);
    if case.op == PROD && matches!(case.kind, 0 | 1 | 3 | 5 | 8 | 10) {
        return (j + 2 * r) % 3 + 1;
    }
    let small = (j * 7 + r * 13) % 41;
    match T::CODE {
        // bf16: exact up to 256 only.
        3 => small - 20,
        // unsigned: exercise the high bits of u64.
        11 => small + ((r + 1) << 40) + (j << 20),
        9 => small + (r << 16) + (j << 8),
        // Below 2^24 / 5 in magnitude: sums of up to 5 ranks are exact in f32.
        _ => small - 20 + r * 100 + j * 1000,
    }
}

fn reduce_ref(op: u32, vals: impl Iterator<Item = i128>) -> i128 {
    let vals: Vec<i128> = vals.collect();
    match op {
        SUM => vals.iter().sum(),
        PROD => vals.iter().product(),
        MIN => *vals.iter().min().unwrap(),
        _ => *vals.iter().max().unwrap(),
    }
}

/// Runs one collective case on this rank with windows `a` (and `b` when out of place) of `W`
/// elements each; returns #wrong (statuses, every element of both windows).
fn coll_case<T: El>(
    comm: &Communicator,
    s: &Stream,
    case: &Case,
    a: &Window<T>,
    b: &Window<T>,
    status: &Window<u64>,
) -> usize {
    let (me, n) = (comm.rank(), comm.nranks());
    let (nn, mu) = (n as usize, me as usize);
    let c = case.count;
    let len = a.len();
    // Offsets (odd, different), and NCCL's in-place conventions.
    let (so, d_o) = if !case.in_place {
        (3, 5)
    } else {
        match case.kind {
            ALL_GATHER | ALL_GATHER_LL => (5 + mu * c, 5),
            REDUCE_SCATTER | REDUCE_SCATTER_LL | SCATTER => (5, 5 + mu * c),
            _ => (5, 5),
        }
    };
    let extent = match case.kind {
        REDUCE_SCATTER | REDUCE_SCATTER_LL | SCATTER | ALL_TO_ALL => nn * c,
        _ => c,
    };
    let mut sw = vec![T::canary(); len];
    for j in 0..extent {
        sw[so + j] = T::of(input::<T>(case, me, j));
    }
    a.write(0, &sw).unwrap();
    if !case.in_place {
        b.write(0, &vec![T::canary(); len]).unwrap();
    }
    status.write(0, &[CANARY; 4]).unwrap();
    // The expected windows: the inputs, with the outputs written over them.
    let mut want_a: Vec<u64> = sw.iter().map(|v| v.bits()).collect();
    let mut want_b = vec![T::canary().bits(); len];
    {
        let dst = if case.in_place {
            &mut want_a
        } else {
            &mut want_b
        };
        let red =
            |j: usize| T::of(reduce_ref(case.op, (0..n).map(|r| input::<T>(case, r, j)))).bits();
        let val = |r: u32, j: usize| T::of(input::<T>(case, r, j)).bits();
        match case.kind {
            ALL_REDUCE_ONE_SHOT | ALL_REDUCE_TWO_SHOT | ALL_REDUCE_LL => {
                (0..c).for_each(|i| dst[d_o + i] = red(i))
            }
            ALL_GATHER | ALL_GATHER_LL => {
                (0..nn).for_each(|r| (0..c).for_each(|i| dst[d_o + r * c + i] = val(r as u32, i)))
            }
            REDUCE_SCATTER | REDUCE_SCATTER_LL => {
                (0..c).for_each(|i| dst[d_o + i] = red(mu * c + i))
            }
            BROADCAST | BROADCAST_LL => (0..c).for_each(|i| dst[d_o + i] = val(case.root, i)),
            REDUCE if me == case.root => (0..c).for_each(|i| dst[d_o + i] = red(i)),
            REDUCE => {}
            SCATTER => (0..c).for_each(|i| dst[d_o + i] = val(case.root, mu * c + i)),
            _ => (0..nn).for_each(|r| {
                (0..c).for_each(|i| dst[d_o + r * c + i] = val(r as u32, mu * c + i))
            }),
        }
    }
    comm.barrier().unwrap();
    let (ctas, first) = if case.grid {
        (3u32, SYMCOMM_USER_BARRIER_FIRST)
    } else {
        (1, SYMCOMM_USER_BARRIER_FIRST + 7)
    };
    let dst = if case.in_place { a } else { b };
    let args = KernelArgs::new()
        .arg(&comm.device_handle().unwrap())
        .arg(&a.device_handle().raw())
        .arg(&dst.device_handle().raw())
        .arg(&status.device_handle())
        .arg(&case.kind)
        .arg(&T::CODE)
        .arg(&case.op)
        .arg(&case.root)
        .arg(&(c as u64))
        .arg(&(so as u64))
        .arg(&(d_o as u64))
        .arg(&u32::from(case.grid))
        .arg(&first);
    launch(
        comm,
        s,
        "rk_collective",
        LaunchConfig::linear(ctas, 64).co_resident(),
        &args,
    );
    s.synchronize().unwrap();
    comm.check_error().unwrap();
    let label = format!(
        "{} dtype {} {case:?} rank {me} of {n}",
        KIND_NAMES[case.kind as usize],
        T::CODE
    );
    let mut want_status = vec![CANARY; 4];
    want_status[..ctas as usize].fill(OK);
    let mut bad = wrong(
        &format!("{label} status"),
        &status.to_vec().unwrap(),
        &want_status,
    );
    let got_a: Vec<u64> = a.to_vec().unwrap().into_iter().map(El::bits).collect();
    bad += wrong(&format!("{label} window a"), &got_a, &want_a);
    if !case.in_place {
        let got_b: Vec<u64> = b.to_vec().unwrap().into_iter().map(El::bits).collect();
        bad += wrong(&format!("{label} window b"), &got_b, &want_b);
    }
    comm.barrier().unwrap();
    bad
}

/// Every kind, in place and out of place, at grid and CTA scope, for element type `T`.
fn coll_cases<T: El>(comm: &Communicator, s: &Stream, counts: &[usize], ops: &[u32]) -> usize {
    let n = comm.nranks() as usize;
    let max = counts.iter().max().copied().unwrap_or(0);
    let len = n * max + 16;
    let a = comm.alloc_window::<T>(len).unwrap();
    let b = comm.alloc_window::<T>(len).unwrap();
    let status = comm.alloc_window::<u64>(4).unwrap();
    let mut bad = 0;
    let mut k = 0u32;
    for &count in counts {
        for kind in 0..12u32 {
            let reducing = matches!(kind, 0 | 1 | 3 | 5 | 8 | 10);
            let kind_ops: &[u32] = if reducing { ops } else { &[SUM] };
            for &op in kind_ops {
                for in_place in [false, true] {
                    k += 1;
                    let case = Case {
                        kind,
                        op,
                        root: k % comm.nranks(),
                        count,
                        in_place,
                        grid: k % 2 == 0,
                    };
                    bad += coll_case::<T>(comm, s, &case, &a, &b, &status);
                }
            }
        }
    }
    bad
}

#[test]
fn collectives_from_rust_match_the_host_reference_bit_for_bit() {
    for n in 2..=5 {
        let bad = with_ranks(n, &options(Duration::from_secs(30)), |comm| {
            let s = comm.create_stream().unwrap();
            coll_cases::<f32>(comm, &s, &[37, 1], &[SUM, PROD, MIN, MAX])
                + coll_cases::<i32>(comm, &s, &[37], &[SUM, MIN])
                + coll_cases::<u64>(comm, &s, &[37], &[SUM, MAX])
                + coll_cases::<u16>(comm, &s, &[37], &[SUM, PROD])
        });
        assert_eq!(bad.iter().sum::<usize>(), 0, "n={n}: {bad:?}");
    }
}

#[test]
fn collectives_of_the_other_element_types_and_larger_counts() {
    for n in [3, 4] {
        let bad = with_ranks(n, &options(Duration::from_secs(30)), |comm| {
            let s = comm.create_stream().unwrap();
            coll_cases::<f64>(comm, &s, &[21], &[SUM])
                + coll_cases::<u32>(comm, &s, &[21], &[MAX])
                + coll_cases::<i64>(comm, &s, &[21], &[MIN])
                + coll_cases::<f32>(comm, &s, &[0, 517], &[SUM])
        });
        assert_eq!(bad.iter().sum::<usize>(), 0, "n={n}: {bad:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// grid_sync and cta_part.

fn grid_value(g: u64, b: u32, t: u32) -> u64 {
    (g << 32) | (u64::from(b) << 16) | u64::from(t)
}

#[test]
fn grid_sync_orders_the_ctas_of_a_launch_and_cta_part_tiles_the_block() {
    let (ctas, threads, rounds, launches) = (4u32, 64u32, 3u32, 2u32);
    let (g, bt) = (ctas as usize, threads as usize);
    for (n, count) in [(2u32, 1001u64), (3, 4096), (2, 5)] {
        let outs = with_ranks(n, &options(Duration::from_secs(30)), |comm| {
            let state = zeroed::<u64>(comm, 1);
            let data = zeroed::<u64>(comm, 2 * g * bt);
            let out = zeroed::<u64>(comm, 8 * g + g * bt + (rounds * launches) as usize * g);
            let s = comm.create_stream().unwrap();
            for launch_no in 0..launches {
                let args = KernelArgs::new()
                    .arg(&comm.device_handle().unwrap())
                    .arg(&state.device_handle())
                    .arg(&data.device_handle())
                    .arg(&out.device_handle())
                    .arg(&count)
                    .arg(&rounds)
                    .arg(&SYMCOMM_USER_BARRIER_FIRST)
                    .arg(&launch_no);
                let cfg = LaunchConfig::linear(ctas, threads).co_resident();
                launch(comm, &s, "rk_grid", cfg, &args);
            }
            s.synchronize().unwrap();
            comm.check_error().unwrap();
            (out.to_vec().unwrap(), state.to_vec().unwrap()[0])
        });
        for (r, (o, st)) in outs.iter().enumerate() {
            let label = format!("grid n={n} count {count} rank {r}");
            // cta_part at grid scope tiles [0, count) in CTA order, cut at 16-byte packs.
            for (j, size) in [(0usize, 4u64), (1, 8), (2, 2)] {
                let parts: Vec<(u64, u64)> = (0..g)
                    .map(|b| (o[8 * b + 2 * j], o[8 * b + 2 * j + 1]))
                    .collect();
                assert_eq!(parts[0].0, 0, "{label}: {size}-byte parts {parts:?}");
                assert_eq!(
                    parts[g - 1].1,
                    count,
                    "{label}: {size}-byte parts {parts:?}"
                );
                for b in 0..g {
                    assert!(parts[b].0 <= parts[b].1, "{label}: {parts:?}");
                    if b + 1 < g {
                        assert_eq!(parts[b].1, parts[b + 1].0, "{label}: {parts:?}");
                    }
                    if parts[b].1 < count {
                        assert_eq!(
                            parts[b].1 * size % 16,
                            0,
                            "{label}: {size}-byte parts {parts:?}"
                        );
                    }
                }
                if count >= 4096 {
                    assert!(
                        parts.iter().all(|p| p.1 > p.0),
                        "{label}: an empty part {parts:?}"
                    );
                }
            }
            // At CTA scope, the whole block.
            for b in 0..g {
                assert_eq!((o[8 * b + 6], o[8 * b + 7]), (0, count), "{label}: CTA {b}");
            }
            let wrong_reads = &o[8 * g..8 * g + g * bt];
            assert!(
                wrong_reads.iter().all(|&w| w == 0),
                "{label}: wrong reads {:?}",
                wrong_reads.iter().filter(|&&w| w != 0).count()
            );
            let statuses = &o[8 * g + g * bt..];
            assert!(
                statuses.iter().all(|&s| s == OK),
                "{label}: grid_sync statuses {statuses:?}"
            );
            // Six completed generations, count back at 0.
            assert_eq!(
                *st,
                u64::from(rounds * launches) << 32,
                "{label}: state word"
            );
        }
        let _ = grid_value(0, 0, 0);
    }
}

// ---------------------------------------------------------------------------------------------
// The example binary.

const EXAMPLE: &str = env!("CARGO_BIN_EXE_rust-kernel");

fn check_example_output(label: &str, out: &std::process::Output, ranks: usize) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{label}: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let ok_lines = stdout.lines().filter(|l| l.contains("#wrong 0")).count();
    assert_eq!(ok_lines, ranks, "{label}: stdout:\n{stdout}");
    assert!(
        !stdout.contains("#wrong 1") && stdout.contains("rust-kernel: PASS"),
        "{label}: {stdout}"
    );
}

#[test]
fn the_example_passes_with_ranks_as_threads() {
    for n in [2, 3, 5] {
        let out = Command::new(EXAMPLE)
            .args([
                "--ranks",
                &n.to_string(),
                "--rows",
                "40",
                "--cols",
                "513",
                "--iters",
                "2",
            ])
            .env("SYMCOMM_DEVICE", "emu")
            .env_remove("RANK")
            .env_remove("SYMCOMM_ID")
            .output()
            .unwrap();
        check_example_output(&format!("{n} threads"), &out, n);
    }
}

#[test]
fn the_example_passes_with_ranks_as_processes() {
    for n in [2u32, 3] {
        // What `symcomm launch -n N` gives each rank: SYMCOMM_ID (root and secret), RANK,
        // WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE.
        let id = UniqueId::new_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
            .unwrap()
            .to_string();
        let children: Vec<_> = (0..n)
            .map(|r| {
                Command::new(EXAMPLE)
                    .args(["--rows", "40", "--cols", "513", "--iters", "2"])
                    .env("SYMCOMM_DEVICE", "emu")
                    .env("SYMCOMM_ID", &id)
                    .env_remove("SYMCOMM_SECRET")
                    .env("RANK", r.to_string())
                    .env("WORLD_SIZE", n.to_string())
                    .env("LOCAL_RANK", r.to_string())
                    .env("LOCAL_WORLD_SIZE", n.to_string())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for (r, child) in children.into_iter().enumerate() {
            let out = child.wait_with_output().unwrap();
            check_example_output(&format!("{n} processes, rank {r}"), &out, 1);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Across hosts.

/// `rk_hosts_ring` on ranks of simulated hosts h0, h1, h0 (UCX between them): `on_this_host`
/// follows the hosts, and a `put_with_signal` ring from Rust reaches the next rank through the
/// proxy when it is on another host, exactly; two launches (epochs 1, 2).
#[test]
fn on_this_host_and_put_with_signal_across_hosts() {
    const COUNT: u32 = 37;
    const WORD: u32 = 3;
    let hosts = ["h0", "h1", "h0"];
    let n = hosts.len() as u32;
    let outs = with_ranks_on_hosts(&hosts, &options(Duration::from_secs(20)), |comm| {
        let data = zeroed::<u32>(comm, 2 * COUNT as usize);
        let s = comm.create_stream().unwrap();
        let mut seen = Vec::new();
        for epoch in 1..=2u64 {
            let out = zeroed::<u64>(comm, n as usize + 3);
            let args = KernelArgs::new()
                .arg(&comm.device_handle().unwrap())
                .arg(&data.device_handle())
                .arg(&out.device_handle())
                .arg(&COUNT)
                .arg(&WORD)
                .arg(&epoch);
            launch(
                comm,
                &s,
                "rk_hosts_ring",
                LaunchConfig::linear(1, 64),
                &args,
            );
            s.synchronize().unwrap();
            seen.push(out.to_vec().unwrap());
        }
        comm.check_error().unwrap();
        seen
    });
    for (r, seen) in outs.iter().enumerate() {
        let here: Vec<u64> = hosts.iter().map(|h| u64::from(*h == hosts[r])).collect();
        for (k, out) in seen.iter().enumerate() {
            let mut want = here.clone();
            want.extend([OK, OK, 0]);
            assert_eq!(
                out, &want,
                "rank {r}, launch {k}: on_this_host, put, wait, #wrong"
            );
        }
    }
}

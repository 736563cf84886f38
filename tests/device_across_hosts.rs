//! Device-initiated operations across hosts, and how host calls there meet streams and graphs,
//! on the emulator: ranks on simulated hosts (distinct `SYMCOMM_HOST_ID`s, UCX over TCP between them),
//! kernels that signal and put to ranks of their own host with stores and to other hosts' ranks
//! through the proxy — the same calls.
//!
//! - `put_ring_across_hosts`: a ring of `put_with_signal` (every hop local or remote by the
//!   layout), a `signal_add` tally to every rank and a `barrier`, for each group kind, two
//!   launches back to back, on 2 hosts x 1 rank, 2 x 2 interleaved and 3 hosts uneven; every
//!   word checked bit for bit.
//! - `remote_peers_are_refused`: `put` / `get` (loads and stores) and the device collectives
//!   refuse a rank on another host with `SYMCOMM_REFUSED_REMOTE`, touching nothing; a
//!   `signal_add` that asks for the remote previous value too; the host API refuses another
//!   host's copy of a window.
//! - `windows_in_host_collectives_across_hosts`: windows of a communicator spanning hosts in
//!   the host collectives.
//! - `a_kernel_waiting_for_a_lost_host_returns_promptly`: a kernel waiting for a signal from a
//!   rank of another host that aborts returns Aborted at once, not at its deadline.
//! - `calls_across_hosts_replay_from_a_graph`: an all-reduce and a send/recv ring across hosts
//!   captured in a graph, replayed with new inputs between calls made outside it, bit-exact;
//!   also staged through mapped host memory as on a GPU (`_staged`).
//! - `calls_across_hosts_do_not_block_the_caller`: a call returns while its stream is still busy
//!   with earlier work, and runs once the stream gets there.
//! - `calls_on_two_streams_run_in_the_order_they_were_made`: calls on two streams, one of them
//!   held up on one rank only, still meet in the same order on every rank.
//! - `a_communicator_dropped_right_after_a_call_still_makes_it`: the call runs once its stream
//!   gets there, after the caller dropped the communicator.
//! - `a_failed_call_across_hosts_is_reported_and_its_stream_goes_on`: a call whose peer is gone
//!   lets its stream go on, and `check_error` and the next call report the loss; also staged.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use support::ring::{GROUP_CTA, GROUP_THREAD, GROUP_WARP, put_ring};
use symcomm::abi::{SYMCOMM_STATUS_INVALID_ARGUMENT, SYMCOMM_STATUS_OK};
use symcomm::{
    Buffer, CommOptions, Communicator, DEVICE_IMAGE, DataType, Device, Error, KernelArgs,
    LaunchConfig, RedOp,
};

fn options() -> CommOptions {
    CommOptions::default().with_device_timeout(Duration::from_secs(20))
}

/// Runs `body` on ranks placed on `hosts` (emulator), panicking with the first failure.
fn on_hosts<T: Send>(hosts: &[&str], body: impl Fn(Arc<Communicator>) -> T + Sync) -> Vec<T> {
    on_hosts_staged(hosts, false, body)
}

/// [`on_hosts`], the bytes between hosts staged through mapped host memory as on a GPU when
/// `staged` (pieces of 512 B: chunks of 4 KiB).
fn on_hosts_staged<T: Send>(
    hosts: &[&str],
    staged: bool,
    body: impl Fn(Arc<Communicator>) -> T + Sync,
) -> Vec<T> {
    let options = options()
        .with_hosts_staging(staged)
        .with_hosts_chunk_bytes(if staged { 4096 } else { 4 << 20 });
    support::try_with_ranks_on_hosts(Device::Emu, hosts, &options, |c| Ok(body(c)))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The ring on `hosts`, for every group kind, two launches each.
fn ring_on(hosts: &[&str]) {
    const ROUNDS: u32 = 5;
    const WORDS: u32 = 37;
    let n = hosts.len();
    let results = on_hosts(hosts, |comm| {
        let win = comm.alloc_window::<u32>(2 * WORDS as usize).unwrap();
        let state = Buffer::new(comm.backend(), 8).unwrap();
        let mut out = Vec::new();
        for (group, threads) in [(GROUP_THREAD, 1), (GROUP_WARP, 32), (GROUP_CTA, 64)] {
            for launch in 0..2 {
                let (r, took) = put_ring(&comm, group, threads, ROUNDS, WORDS, &state, &win)
                    .unwrap_or_else(|e| panic!("group {group} launch {launch}: {e}"));
                comm.check_error()
                    .unwrap_or_else(|e| panic!("group {group} launch {launch}: {e}"));
                out.push((group, launch, r, took));
            }
        }
        out
    });
    for (rank, runs) in results.iter().enumerate() {
        for &(group, launch, r, took) in runs {
            assert_eq!(
                r,
                [SYMCOMM_STATUS_OK, 0, ROUNDS],
                "hosts {hosts:?}: rank {rank}, group {group}, launch {launch}: [status, wrong, rounds]"
            );
            if rank == 0 && launch == 1 {
                println!(
                    "put ring on {n} ranks {hosts:?}, group {group}: {:.0} us per round (emulator)",
                    took.as_secs_f64() * 1e6 / f64::from(ROUNDS)
                );
            }
        }
    }
}

#[test]
fn put_ring_across_hosts() {
    ring_on(&["h0", "h1"]);
    ring_on(&["h0", "h1", "h0", "h1"]);
    ring_on(&["h0", "h0", "h1", "h2"]);
}

/// `symcomm_test_peer_op` with `op` on `peer`: the status it returned.
fn peer_op(comm: &Communicator, win: &symcomm::Window<u32>, peer: u32, op: u32) -> u32 {
    let kernel = comm
        .load_kernel(&DEVICE_IMAGE, "symcomm_test_peer_op")
        .unwrap();
    let stream = comm.create_stream().unwrap();
    let result = Buffer::new(comm.backend(), 4).unwrap();
    let args = KernelArgs::new()
        .arg(&comm.device_handle().unwrap())
        .arg(&win.device_handle().raw())
        .arg(&peer)
        .arg(&op)
        .arg(&result.addr());
    // SAFETY: the kernel takes (DevComm, WindowHandleRaw, u32, u32, u32*); the window holds at
    // least nranks u32; everything outlives the launch, waited for below.
    unsafe { comm.launch(&stream, &kernel, LaunchConfig::linear(1, 32), &args) }.unwrap();
    stream.synchronize().unwrap();
    let mut out = [0u32; 1];
    result.read(0, &mut out).unwrap();
    out[0]
}

/// What one rank of `remote_peers_are_refused` saw (statuses of device operations, host calls).
struct Answers {
    put_remote: u32,
    get_remote: u32,
    put_local: u32,
    clean: symcomm::Result<()>,
    write_remote: symcomm::Result<()>,
    read_local: symcomm::Result<u32>,
    pws: u32,
    after_pws: symcomm::Result<()>,
    coll: u32,
    recorded: symcomm::Result<()>,
    previous: u32,
    /// put_with_signal from shared memory and from the stack to the remote rank, and from
    /// shared memory to the local one.
    sources: [u32; 3],
}

#[test]
fn remote_peers_are_refused() {
    const PUT: u32 = 0;
    const GET: u32 = 1;
    const PUT_WITH_SIGNAL: u32 = 2;
    const SIGNAL_ADD_PREVIOUS: u32 = 4;
    const ALL_REDUCE: u32 = 5;
    const PUT_WITH_SIGNAL_FROM_SHARED: u32 = 6;
    const PUT_WITH_SIGNAL_FROM_STACK: u32 = 7;
    let results = on_hosts(&["h0", "h0", "h1"], |comm| {
        let rank = comm.rank();
        let win = comm.alloc_window::<u32>(8).unwrap();
        win.write(0, &[rank + 1; 8]).unwrap();
        let remote = if rank == 2 { 0 } else { 2 };
        let local = if rank == 2 { 2 } else { 1 - rank };
        // Loads and stores: refused for the remote rank, done for the local one; nothing
        // recorded (put and get have no communicator to record in).
        let put_remote = peer_op(&comm, &win, remote, PUT);
        let get_remote = peer_op(&comm, &win, remote, GET);
        let put_local = peer_op(&comm, &win, local, PUT);
        comm.barrier().unwrap();
        let clean = comm.check_error();
        // The host API: another host's copy is not mapped here.
        let write_remote = win.write_rank(remote, 0, &[7]);
        let read_local = {
            let mut v = [0u32; 1];
            win.read_rank(local, 0, &mut v).map(|()| v[0])
        };
        // put_with_signal to a remote rank with a range outside the window is refused before
        // the proxy: here it is in range, so it goes through (rank 2 waits for nobody).
        let pws = peer_op(&comm, &win, remote, PUT_WITH_SIGNAL);
        comm.barrier().unwrap();
        let after_pws = comm.check_error();
        // A collective of the device library on a communicator spanning hosts: every rank
        // refuses it (and records it).
        let coll = peer_op(&comm, &win, remote, ALL_REDUCE);
        let recorded = comm.check_error();
        let previous = peer_op(&comm, &win, remote, SIGNAL_ADD_PREVIOUS);
        // The proxy reads a put's source with a copy: global memory only, on the emulator as
        // on a GPU; from shared memory to a rank of this host is a plain put.
        let from_shared = peer_op(&comm, &win, remote, PUT_WITH_SIGNAL_FROM_SHARED);
        let from_stack = peer_op(&comm, &win, remote, PUT_WITH_SIGNAL_FROM_STACK);
        let shared_local = peer_op(&comm, &win, local, PUT_WITH_SIGNAL_FROM_SHARED);
        Answers {
            put_remote,
            get_remote,
            put_local,
            clean,
            write_remote,
            read_local,
            pws,
            after_pws,
            coll,
            recorded,
            previous,
            sources: [from_shared, from_stack, shared_local],
        }
    });
    for (rank, r) in results.into_iter().enumerate() {
        assert_eq!(
            r.put_remote, SYMCOMM_STATUS_INVALID_ARGUMENT,
            "rank {rank}: put to another host"
        );
        assert_eq!(
            r.get_remote, SYMCOMM_STATUS_INVALID_ARGUMENT,
            "rank {rank}: get from another host"
        );
        assert_eq!(
            r.put_local, SYMCOMM_STATUS_OK,
            "rank {rank}: put on this host"
        );
        r.clean
            .unwrap_or_else(|e| panic!("rank {rank}: after put/get: {e}"));
        let msg = r.write_remote.unwrap_err().to_string();
        assert!(msg.contains("another host"), "rank {rank}: {msg}");
        r.read_local
            .unwrap_or_else(|e| panic!("rank {rank}: read a local copy: {e}"));
        assert_eq!(
            r.pws, SYMCOMM_STATUS_OK,
            "rank {rank}: put_with_signal to another host"
        );
        r.after_pws
            .unwrap_or_else(|e| panic!("rank {rank}: after put_with_signal: {e}"));
        assert_eq!(
            r.coll, SYMCOMM_STATUS_INVALID_ARGUMENT,
            "rank {rank}: device all-reduce"
        );
        match r.recorded {
            Err(Error::InvalidArgument(m)) => {
                assert!(
                    m.contains("another host") && m.contains("all_reduce"),
                    "rank {rank}: {m}"
                )
            }
            other => panic!("rank {rank}: device all-reduce across hosts: {other:?}"),
        }
        assert_eq!(
            r.previous, SYMCOMM_STATUS_INVALID_ARGUMENT,
            "rank {rank}: signal_add with previous"
        );
        let bad = SYMCOMM_STATUS_INVALID_ARGUMENT;
        assert_eq!(
            r.sources,
            [bad, bad, SYMCOMM_STATUS_OK],
            "rank {rank}: put_with_signal from shared memory / the stack to another host, from \
             shared memory to this host"
        );
    }
}

#[test]
fn windows_in_host_collectives_across_hosts() {
    const COUNT: usize = 1001;
    let results = on_hosts(&["h0", "h1", "h0", "h1"], |comm| {
        let rank = comm.rank();
        let send = comm.alloc_window::<i32>(COUNT).unwrap();
        let recv = comm.alloc_window::<i32>(COUNT).unwrap();
        let input: Vec<i32> = (0..COUNT as i32).map(|i| i * 3 + rank as i32).collect();
        send.write(0, &input).unwrap();
        let stream = comm.create_stream().unwrap();
        comm.all_reduce(&send, &recv, COUNT, DataType::I32, RedOp::Sum, &stream)
            .unwrap();
        // In place, in the receive window.
        comm.all_reduce(&recv, &recv, COUNT, DataType::I32, RedOp::Sum, &stream)
            .unwrap();
        stream.synchronize().unwrap();
        recv.to_vec().unwrap()
    });
    // Sum over 4 ranks of (3i + r), then times 4.
    let want: Vec<i32> = (0..COUNT as i32).map(|i| (12 * i + 6) * 4).collect();
    for (rank, got) in results.iter().enumerate() {
        let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
        assert_eq!(wrong, 0, "rank {rank}: #wrong");
    }
}

/// A host lost while a kernel waits for its signal: rank 0 (host h0) aborts instead of joining
/// the ring, and rank 1's kernel, waiting for rank 0's proxied signal with a 30 s deadline,
/// returns Aborted as soon as the loss is known (the abort flag), and `check_error` names rank 0.
#[test]
fn a_kernel_waiting_for_a_lost_host_returns_promptly() {
    const DEADLINE: Duration = Duration::from_secs(30);
    const BEFORE_ABORT: Duration = Duration::from_millis(300);
    let opts = CommOptions::default().with_device_timeout(DEADLINE);
    let results = support::try_with_ranks_on_hosts(Device::Emu, &["h0", "h1"], &opts, |comm| {
        let e = |e: Error| e.to_string();
        let win = comm.alloc_window::<u32>(8).map_err(e)?;
        let state = Buffer::new(comm.backend(), 8).map_err(e)?;
        comm.barrier().map_err(e)?;
        if comm.rank() == 0 {
            std::thread::sleep(BEFORE_ABORT);
            comm.abort();
            return Ok(None);
        }
        let (r, took) = put_ring(&comm, GROUP_CTA, 32, 1, 4, &state, &win)?;
        Ok(Some((r, took, comm.check_error())))
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let (r, took, checked) = results[1].as_ref().expect("rank 1's outcome");
    assert_eq!(
        r[0],
        symcomm::abi::SYMCOMM_STATUS_ABORTED,
        "[status, wrong, rounds] {r:?}"
    );
    assert!(
        *took < DEADLINE / 3,
        "the waiting kernel returned after {took:?} (deadline {DEADLINE:?})"
    );
    match checked {
        Err(Error::PeerLost { rank: 0, .. }) => {}
        other => panic!("check_error on rank 1: {other:?}"),
    }
    println!(
        "kernel waiting for a lost host: returned {:.0} ms after the abort",
        (took.saturating_sub(BEFORE_ABORT)).as_secs_f64() * 1e3
    );
}

/// An all-reduce (windows) and a send/recv ring (buffers) across hosts captured in a graph and
/// replayed three times with new inputs, with an all-reduce outside the graph between replays:
/// every result bit-exact.
#[test]
fn calls_across_hosts_replay_from_a_graph() {
    replay_from_a_graph(false);
}

/// [`calls_across_hosts_replay_from_a_graph`], staged as on a GPU.
#[test]
fn calls_across_hosts_replay_from_a_graph_staged() {
    replay_from_a_graph(true);
}

fn replay_from_a_graph(staged: bool) {
    const COUNT: usize = 1001;
    let hosts = ["h0", "h1", "h0", "h1"];
    let n = hosts.len() as i32;
    let results = on_hosts_staged(&hosts, staged, |comm| {
        let (rank, nranks) = (comm.rank(), comm.nranks());
        let (next, prev) = ((rank + 1) % nranks, (rank + nranks - 1) % nranks);
        let send = comm.alloc_window::<i32>(COUNT).unwrap();
        let recv = comm.alloc_window::<i32>(COUNT).unwrap();
        let out = comm.alloc_buffer(COUNT * 4).unwrap();
        let got_ring = comm.alloc_buffer(COUNT * 4).unwrap();
        let stream = comm.create_stream().unwrap();
        stream.begin_capture().unwrap();
        comm.all_reduce(&send, &recv, COUNT, DataType::I32, RedOp::Sum, &stream)
            .unwrap();
        comm.group(&stream, |g| {
            g.send(&send, COUNT, DataType::I32, next)?;
            g.recv(&got_ring, COUNT, DataType::I32, prev)
        })
        .unwrap();
        let graph = stream.end_capture().unwrap();
        let mut wrong = Vec::new();
        for replay in 0..3i32 {
            let value = |r: i32, i: i32| i * 7 + r * 100 + replay * 1000;
            let mine: Vec<i32> = (0..COUNT as i32).map(|i| value(rank as i32, i)).collect();
            send.write(0, &mine).unwrap();
            graph.launch(&stream).unwrap();
            // Outside the graph, on the same stream: twice the sum of the inputs.
            comm.all_reduce(&recv, &out, COUNT, DataType::I32, RedOp::Sum, &stream)
                .unwrap();
            stream.synchronize().unwrap();
            comm.check_error().unwrap();
            let sum = |i: i32| (0..n).map(|r| value(r, i)).sum::<i32>();
            let (r, o) = (recv.to_vec().unwrap(), values(&out, COUNT));
            let ring = values(&got_ring, COUNT);
            let count = |f: &dyn Fn(usize) -> bool| (0..COUNT).filter(|&i| !f(i)).count();
            wrong.push([
                count(&|i| r[i] == sum(i as i32)),
                count(&|i| o[i] == n * sum(i as i32)),
                count(&|i| ring[i] == value(prev as i32, i as i32)),
            ]);
        }
        wrong
    });
    for (rank, wrong) in results.iter().enumerate() {
        assert_eq!(
            wrong,
            &vec![[0; 3]; 3],
            "rank {rank}: #wrong per replay [graph all-reduce, all-reduce after it, ring]"
        );
    }
}

/// The first `n` i32 of `buf`.
fn values(buf: &Buffer, n: usize) -> Vec<i32> {
    let mut v = vec![0i32; n];
    buf.read(0, &mut v).unwrap();
    v
}

/// Holds a stream with work of the caller's (an emulator host function) for `held` (from
/// another thread: the caller goes on meanwhile), or until dropped first (dropping a stream
/// waits for its work, so a test that fails early must release it).
struct Hold(Arc<std::sync::atomic::AtomicBool>);

impl Hold {
    fn on(stream: &symcomm::Stream, held: Duration) -> Hold {
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let f = Arc::clone(&flag);
        stream
            .enqueue_host(move || {
                while !f.load(std::sync::atomic::Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(())
            })
            .unwrap();
        let f = Arc::clone(&flag);
        std::thread::spawn(move || {
            std::thread::sleep(held);
            f.store(true, std::sync::atomic::Ordering::Release);
        });
        Hold(flag)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// A call across hosts returns while its stream still runs earlier work (held for `HELD`),
/// and its result is right once the stream got there.
#[test]
fn calls_across_hosts_do_not_block_the_caller() {
    const COUNT: usize = 4099;
    const HELD: Duration = Duration::from_millis(1500);
    let results = on_hosts(&["h0", "h1"], |comm| {
        let rank = comm.rank() as i32;
        let buf = comm.alloc_buffer(COUNT * 4).unwrap();
        buf.write(0, &vec![rank + 1; COUNT]).unwrap();
        let stream = comm.create_stream().unwrap();
        // The first call sets up the worker's stream on the host's communicator.
        comm.all_reduce(&buf, &buf, COUNT, DataType::I32, RedOp::Sum, &stream)
            .unwrap();
        stream.synchronize().unwrap();
        let _hold = Hold::on(&stream, HELD);
        let t = std::time::Instant::now();
        comm.all_reduce(&buf, &buf, COUNT, DataType::I32, RedOp::Sum, &stream)
            .unwrap();
        let returned = t.elapsed();
        stream.synchronize().unwrap();
        comm.check_error().unwrap();
        let got = values(&buf, COUNT);
        // (1 + 2), then twice that.
        (returned, got.iter().filter(|&&v| v != 6).count())
    });
    for (rank, (returned, wrong)) in results.iter().enumerate() {
        assert_eq!(*wrong, 0, "rank {rank}: #wrong");
        assert!(
            *returned < HELD / 3,
            "rank {rank}: the call returned after {returned:?}, its stream held for {HELD:?}"
        );
    }
}

/// Every rank makes an all-reduce on one stream, then one on a second stream; rank 0's first
/// stream is held for a while, the other ranks' second. The calls must still meet in the order
/// they were made (else the ranks would pair different calls): both results right on every
/// rank.
#[test]
fn calls_on_two_streams_run_in_the_order_they_were_made() {
    const COUNT: usize = 1000;
    let results = on_hosts(&["h0", "h1", "h1"], |comm| {
        let rank = comm.rank() as i32;
        let a = comm.alloc_buffer(COUNT * 4).unwrap();
        let b = comm.alloc_buffer(COUNT * 4).unwrap();
        a.write(0, &vec![rank + 1; COUNT]).unwrap();
        b.write(0, &vec![10 * (rank + 1); COUNT]).unwrap();
        let (s1, s2) = (comm.create_stream().unwrap(), comm.create_stream().unwrap());
        // Rank 0's first stream is held, the others' second: calls that ran in the order
        // their streams reach them would meet in different orders.
        let _hold = Hold::on(
            if rank == 0 { &s1 } else { &s2 },
            Duration::from_millis(300),
        );
        comm.all_reduce(&a, &a, COUNT, DataType::I32, RedOp::Sum, &s1)
            .unwrap();
        comm.all_reduce(&b, &b, COUNT, DataType::I32, RedOp::Sum, &s2)
            .unwrap();
        s1.synchronize().unwrap();
        s2.synchronize().unwrap();
        comm.check_error().unwrap();
        let wrong =
            |buf: &Buffer, want: i32| values(buf, COUNT).iter().filter(|&&v| v != want).count();
        (wrong(&a, 6), wrong(&b, 60))
    });
    for (rank, wrong) in results.iter().enumerate() {
        assert_eq!(
            *wrong,
            (0, 0),
            "rank {rank}: #wrong (first call, second call)"
        );
    }
}

/// Rank 1 aborts once rank 0's all-reduce is queued behind held work: when the stream reaches
/// the call, the exchange fails at once, the stream goes on (no hang), and `check_error` and the
/// next call report the lost peer.
#[test]
fn a_failed_call_across_hosts_is_reported_and_its_stream_goes_on() {
    failed_call_goes_on(false);
}

/// [`a_failed_call_across_hosts_is_reported_and_its_stream_goes_on`], staged as on a GPU (the
/// failure ends the waves, and the staging copies are waited for).
#[test]
fn a_failed_staged_call_across_hosts_is_reported_and_its_stream_goes_on() {
    failed_call_goes_on(true);
}

fn failed_call_goes_on(staged: bool) {
    const COUNT: usize = 777;
    let results = on_hosts_staged(&["h0", "h1"], staged, |comm| {
        let buf = comm.alloc_buffer(COUNT * 4).unwrap();
        let stream = comm.create_stream().unwrap();
        comm.all_reduce(&buf, &buf, COUNT, DataType::I32, RedOp::Sum, &stream)
            .unwrap();
        stream.synchronize().unwrap();
        // Rank 0's call is queued (behind a second of held work) before rank 1 aborts.
        let _hold = Hold::on(&stream, Duration::from_secs(1));
        if comm.rank() == 0 {
            comm.all_reduce(&buf, &buf, COUNT, DataType::I32, RedOp::Sum, &stream)
                .unwrap();
        }
        comm.barrier().unwrap();
        if comm.rank() == 1 {
            comm.abort();
            return None;
        }
        let t = std::time::Instant::now();
        let synced = stream.synchronize();
        let took = t.elapsed();
        let next = comm.all_reduce(&buf, &buf, COUNT, DataType::I32, RedOp::Sum, &stream);
        Some((synced, took, comm.check_error(), next))
    });
    let (synced, took, checked, next) = results[0].as_ref().expect("rank 0's outcome");
    assert!(synced.is_ok(), "the stream failed: {synced:?}");
    assert!(
        *took < Duration::from_secs(10),
        "the stream passed the call after {took:?}"
    );
    for (what, r) in [("check_error", checked), ("the next call", next)] {
        match r {
            Err(Error::PeerLost { rank: 1, .. }) => {}
            other => panic!("{what} on rank 0: {other:?}"),
        }
    }
    println!(
        "a call across hosts whose peer was lost (staged: {staged}): its stream went on after \
         {took:?}"
    );
}

/// Every rank queues an all-reduce across hosts behind held work and drops its communicator at
/// once: the call still runs when the stream gets there (its job keeps the communicator), and the
/// result is right on every rank.
#[test]
fn a_communicator_dropped_right_after_a_call_still_makes_it() {
    const COUNT: usize = 2048;
    let results = on_hosts(&["h0", "h1", "h0", "h1"], |comm| {
        let rank = comm.rank() as i32;
        let buf = Buffer::new(comm.backend(), COUNT * 4).unwrap();
        buf.write(0, &vec![rank; COUNT]).unwrap();
        let stream = symcomm::Stream::new(comm.backend()).unwrap();
        let hold = Hold::on(&stream, Duration::from_millis(300));
        comm.all_reduce(&buf, &buf, COUNT, DataType::I32, RedOp::Sum, &stream)
            .unwrap();
        let weak = Arc::downgrade(&comm);
        drop(comm);
        stream.synchronize().unwrap();
        drop(hold);
        // The worker dropped the last reference after the call.
        let t = std::time::Instant::now();
        while weak.strong_count() > 0 && t.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(5));
        }
        (
            values(&buf, COUNT).iter().filter(|&&v| v != 6).count(),
            weak.strong_count(),
        )
    });
    for (rank, (wrong, alive)) in results.iter().enumerate() {
        assert_eq!(
            (*wrong, *alive),
            (0, 0),
            "rank {rank}: (#wrong, communicators still alive)"
        );
    }
}

/// Once a call's stream has passed it, the worker no longer holds the communicator: the
/// caller's drop right after a synchronize is the last one, which says goodbye before the
/// process may exit (a reference held a moment longer made a rank exit without one, and its
/// peers report it lost). Checked after each of 30 calls.
#[test]
fn a_finished_call_across_hosts_holds_no_reference() {
    const CALLS: usize = 30;
    let results = on_hosts(&["h0", "h1"], |comm| {
        let buf = Buffer::new(comm.backend(), 64).unwrap();
        let stream = symcomm::Stream::new(comm.backend()).unwrap();
        let mut held = 0;
        for _ in 0..CALLS {
            comm.all_reduce(&buf, &buf, 16, DataType::I32, RedOp::Sum, &stream)
                .unwrap();
            stream.synchronize().unwrap();
            held += usize::from(Arc::strong_count(&comm) > 1);
        }
        held
    });
    assert_eq!(
        results,
        vec![0; 2],
        "calls after which the communicator was still held elsewhere, per rank"
    );
}

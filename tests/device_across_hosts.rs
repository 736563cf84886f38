//! Device-initiated operations across hosts, and the limits of host calls there, on the
//! emulator: ranks on simulated hosts (distinct `SYMCOMM_HOST_ID`s, UCX over TCP between them),
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
//! - `capturing_a_call_across_hosts_is_refused_and_the_next_call_passes`: graph capture of a
//!   collective or send/recv across hosts is `Unsupported`, captures nothing, and the
//!   communicator stays usable.

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
    support::try_with_ranks_on_hosts(Device::Emu, hosts, &options(), |c| Ok(body(c)))
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

/// A collective or send/recv across hosts on a capturing stream is refused with `Unsupported`
/// (its inter-host phase runs on the calling thread), nothing is captured, and the next call
/// outside the capture passes.
#[test]
fn capturing_a_call_across_hosts_is_refused_and_the_next_call_passes() {
    const COUNT: usize = 257;
    let results = on_hosts(&["h0", "h1"], |comm| {
        let (rank, peer) = (comm.rank(), 1 - comm.rank());
        let send = comm.alloc_window::<i32>(COUNT).unwrap();
        let recv = comm.alloc_window::<i32>(COUNT).unwrap();
        send.write(0, &vec![rank as i32 + 1; COUNT]).unwrap();
        let stream = comm.create_stream().unwrap();
        stream.begin_capture().unwrap();
        let coll = comm.all_reduce(&send, &recv, COUNT, DataType::I32, RedOp::Sum, &stream);
        let p2p = comm.group(&stream, |g| {
            g.send(&send, COUNT, DataType::I32, peer)?;
            g.recv(&recv, COUNT, DataType::I32, peer)
        });
        let captured = stream.end_capture().unwrap().is_empty();
        comm.all_reduce(&send, &recv, COUNT, DataType::I32, RedOp::Sum, &stream)
            .unwrap();
        stream.synchronize().unwrap();
        (coll, p2p, captured, recv.to_vec().unwrap())
    });
    for (rank, (coll, p2p, empty, got)) in results.into_iter().enumerate() {
        for (what, r) in [("all_reduce", coll), ("send/recv", p2p)] {
            match r {
                Err(Error::Unsupported(m)) => {
                    assert!(m.contains("captured"), "rank {rank}: {what}: {m}")
                }
                other => panic!("rank {rank}: {what} while capturing: {other:?}"),
            }
        }
        assert!(
            empty,
            "rank {rank}: the refused calls left nodes in the graph"
        );
        assert!(
            got.iter().all(|&v| v == 3),
            "rank {rank}: all-reduce after the capture"
        );
    }
}

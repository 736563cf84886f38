//! Shared ownership on the emulator, ranks as threads: a struct holds a communicator and its
//! windows side by side; windows outlive the caller's communicator handle (the communicator is
//! destroyed with its last holder); graphs that captured collectives keep what those use — the
//! windows' mappings, the buffers' memory, the communicator — alive after the caller dropped
//! them, and their drop waits for their last launch. Before graphs kept anything, the replays
//! below read and wrote unmapped memory (memfd windows, 40 MiB buffers that the allocator
//! returns to the system at once): SIGSEGV.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mod.rs"]
mod support;

use std::sync::{Arc, Weak};
use support::with_ranks;

use symcomm::{Buffer, Communicator, DataType, Graph, RedOp, Stream, Window};

/// What a framework integration keeps: the communicator and its windows in one struct.
struct Model {
    comm: Arc<Communicator>,
    stream: Stream,
    grads: Window<f32>,
    out: Window<f32>,
}

impl Model {
    fn new(comm: Arc<Communicator>, n: usize) -> Model {
        Model {
            stream: comm.create_stream().unwrap(),
            grads: comm.alloc_window(n).unwrap(),
            out: comm.alloc_window(n).unwrap(),
            comm,
        }
    }
}

fn value(salt: u32, r: u32, i: usize) -> f32 {
    (salt * 100 + r * 10 + (i % 7) as u32) as f32
}

/// Checks `got` bit for bit against `scale` times the rank-order sum of `value(salt, r, i)`.
fn check_sum(got: &[f32], nranks: u32, salt: u32, scale: f32, what: &str) {
    for (i, g) in got.iter().enumerate() {
        let want = scale * (0..nranks).map(|r| value(salt, r, i)).sum::<f32>();
        assert_eq!(
            g.to_bits(),
            want.to_bits(),
            "{what}: element {i}: {g} != {want}"
        );
    }
}

#[test]
fn a_struct_holds_a_communicator_and_its_windows_which_outlive_the_handle() {
    const N: usize = 2000;
    with_ranks(3, |comm| {
        let (me, nr) = (comm.rank(), comm.nranks());
        let weak: Weak<Communicator> = Arc::downgrade(&comm);
        let model = Model::new(comm, N);
        let mine: Vec<f32> = (0..N).map(|i| value(1, me, i)).collect();
        model.grads.write(0, &mine).unwrap();
        model.comm.barrier().unwrap();
        model
            .comm
            .all_reduce(
                &model.grads,
                &model.out,
                N,
                DataType::F32,
                RedOp::Sum,
                &model.stream,
            )
            .unwrap();
        model.stream.synchronize().unwrap();
        check_sum(&model.out.to_vec().unwrap(), nr, 1, 1.0, "in the struct");

        // The caller's handle goes; the windows keep the communicator, which stays a member.
        let Model {
            comm,
            stream,
            grads,
            out,
        } = model;
        drop(comm);
        assert!(
            weak.upgrade().is_some(),
            "the windows hold the communicator"
        );
        let comm = Arc::clone(grads.communicator());
        assert!(Arc::ptr_eq(&comm, out.communicator()));
        let mine: Vec<f32> = (0..N).map(|i| value(2, me, i)).collect();
        grads.write(0, &mine).unwrap();
        comm.barrier().unwrap();
        comm.all_reduce(&grads, &out, N, DataType::F32, RedOp::Sum, &stream)
            .unwrap();
        // A window allocated through a window's communicator belongs to the same one.
        let extra = comm.alloc_window::<f32>(N).unwrap();
        comm.all_reduce(&out, &extra, N, DataType::F32, RedOp::Sum, &stream)
            .unwrap();
        stream.synchronize().unwrap();
        comm.check_error().unwrap();
        check_sum(
            &out.to_vec().unwrap(),
            nr,
            2,
            1.0,
            "after the handle dropped",
        );
        check_sum(
            &extra.to_vec().unwrap(),
            nr,
            2,
            nr as f32,
            "a further window",
        );
        comm.barrier().unwrap();
        drop(comm);
        drop((grads, extra));
        assert!(weak.upgrade().is_some(), "one window left");
        // The last window destroys the communicator (a goodbye: not a fault for the peers).
        drop(out);
        assert!(
            weak.upgrade().is_none(),
            "the last window destroyed the communicator"
        );
    });
}

/// Captures, on every rank: `k -> b2` (all-reduce), and the chain `a -> t` (all-reduce),
/// `t -> next rank's u` (send/recv), `u -> b` (all-reduce); then drops `k`, `t` and `u` (windows
/// only a graph still uses) and replays with fresh inputs in `a`, checking `b` and `b2` bit for
/// bit; at the end launches without synchronizing and drops the graph at once (its drop waits
/// for the last launch before it unmaps).
#[test]
fn graphs_keep_captured_windows_mapped_after_they_drop() {
    const N: usize = 3000;
    with_ranks(3, |comm| {
        let (me, nr) = (comm.rank(), comm.nranks());
        let (next, prev) = ((me + 1) % nr, (me + nr - 1) % nr);
        let s = comm.create_stream().unwrap();
        let a = comm.alloc_window::<f32>(N).unwrap();
        let b = comm.alloc_window::<f32>(N).unwrap();
        let b2 = comm.alloc_window::<f32>(N).unwrap();
        let k = comm.alloc_window::<f32>(N).unwrap();
        let t = comm.alloc_window::<f32>(N).unwrap();
        let u = comm.alloc_window::<f32>(N).unwrap();
        k.write(0, &(0..N).map(|i| value(7, me, i)).collect::<Vec<_>>())
            .unwrap();
        // The lane's staging windows are a collective allocation: set up before capturing.
        comm.all_reduce(&a, &b, 1, DataType::F32, RedOp::Sum, &s)
            .unwrap();
        s.synchronize().unwrap();
        comm.barrier().unwrap();
        s.begin_capture().unwrap();
        comm.all_reduce(&k, &b2, N, DataType::F32, RedOp::Sum, &s)
            .unwrap();
        comm.all_reduce(&a, &t, N, DataType::F32, RedOp::Sum, &s)
            .unwrap();
        comm.group(&s, |g| {
            g.send(&t, N, DataType::F32, next)?;
            g.recv(&u, N, DataType::F32, prev)
        })
        .unwrap();
        comm.all_reduce(&u, &b, N, DataType::F32, RedOp::Sum, &s)
            .unwrap();
        let graph = s.end_capture().unwrap();
        drop((k, t, u));
        let zeros = vec![0f32; N];
        let replay = |salt: u32, graph: &Graph| {
            a.write(0, &(0..N).map(|i| value(salt, me, i)).collect::<Vec<_>>())
                .unwrap();
            b.write(0, &zeros).unwrap();
            b2.write(0, &zeros).unwrap();
            comm.barrier().unwrap();
            graph.launch(&s).unwrap();
        };
        for salt in 0..4 {
            replay(salt, &graph);
            s.synchronize().unwrap();
            comm.check_error().unwrap();
            check_sum(&b.to_vec().unwrap(), nr, salt, nr as f32, "b");
            check_sum(&b2.to_vec().unwrap(), nr, 7, 1.0, "b2");
            comm.barrier().unwrap();
        }
        // Launches still queued when the graph drops: the drop waits for the last one.
        replay(9, &graph);
        graph.launch(&s).unwrap();
        graph.launch(&s).unwrap();
        drop(graph);
        s.synchronize().unwrap();
        comm.check_error().unwrap();
        check_sum(
            &b.to_vec().unwrap(),
            nr,
            9,
            nr as f32,
            "b after the graph dropped",
        );
        check_sum(
            &b2.to_vec().unwrap(),
            nr,
            7,
            1.0,
            "b2 after the graph dropped",
        );
        comm.barrier().unwrap();
    });
}

/// 40 MiB buffers (the allocator returns them to the system at once on free) used by captured
/// staged collectives and send/recv, dropped before the replays.
#[test]
fn graphs_keep_captured_buffers_allocated_after_they_drop() {
    const BYTES: usize = 40 << 20;
    const N: usize = 5000;
    with_ranks(2, |comm| {
        let (me, nr) = (comm.rank(), comm.nranks());
        let peer = 1 - me;
        let s = comm.create_stream().unwrap();
        let src = comm.alloc_buffer(BYTES).unwrap();
        let mid = comm.alloc_buffer(BYTES).unwrap();
        let got = comm.alloc_buffer(BYTES).unwrap();
        let out = comm.alloc_buffer(BYTES).unwrap();
        src.write(0, &(0..N).map(|i| value(3, me, i)).collect::<Vec<_>>())
            .unwrap();
        comm.all_reduce(&src, &mid, 1, DataType::F32, RedOp::Sum, &s)
            .unwrap();
        s.synchronize().unwrap();
        comm.barrier().unwrap();
        s.begin_capture().unwrap();
        comm.all_reduce(&src, &mid, N, DataType::F32, RedOp::Sum, &s)
            .unwrap();
        comm.group(&s, |g| {
            g.send(&mid, N, DataType::F32, peer)?;
            g.recv(&got, N, DataType::F32, peer)
        })
        .unwrap();
        comm.all_reduce(&got, &out, N, DataType::F32, RedOp::Sum, &s)
            .unwrap();
        let graph = s.end_capture().unwrap();
        drop((src, mid, got));
        let zeros = vec![0f32; N];
        for round in 0..3 {
            out.write(0, &zeros).unwrap();
            comm.barrier().unwrap();
            graph.launch(&s).unwrap();
            s.synchronize().unwrap();
            comm.check_error().unwrap();
            let mut v = vec![0f32; N];
            out.read(0, &mut v).unwrap();
            check_sum(&v, nr, 3, nr as f32, &format!("round {round}"));
            comm.barrier().unwrap();
        }
        graph.launch(&s).unwrap();
        drop(graph);
        s.synchronize().and_then(|()| comm.check_error()).unwrap();
    });
}

/// A graph of staged collectives keeps the communicator (signal area, staging windows, control
/// plane) alive after the caller dropped its handle and buffer: the replays still run with the
/// peers, and the graph's drop destroys the communicator.
#[test]
fn graphs_keep_the_communicator_after_its_handle_drops() {
    const N: usize = 4096;
    with_ranks(3, |comm| {
        let (me, nr) = (comm.rank(), comm.nranks());
        let weak = Arc::downgrade(&comm);
        let s = comm.create_stream().unwrap();
        let src: Buffer = comm.alloc_buffer(N * 4).unwrap();
        let out: Buffer = comm.alloc_buffer(N * 4).unwrap();
        src.write(0, &(0..N).map(|i| value(5, me, i)).collect::<Vec<_>>())
            .unwrap();
        comm.all_reduce(&src, &out, 1, DataType::F32, RedOp::Sum, &s)
            .unwrap();
        s.synchronize().unwrap();
        comm.barrier().unwrap();
        s.begin_capture().unwrap();
        comm.all_reduce(&src, &out, N, DataType::F32, RedOp::Max, &s)
            .unwrap();
        comm.all_reduce(&out, &out, N, DataType::F32, RedOp::Sum, &s)
            .unwrap();
        let graph = s.end_capture().unwrap();
        // Nothing orders the ranks from here on but the graph's own kernels.
        comm.barrier().unwrap();
        drop(src);
        drop(comm);
        assert!(weak.upgrade().is_some(), "the graph holds the communicator");
        for _ in 0..3 {
            graph.launch(&s).unwrap();
            s.synchronize().unwrap();
            let mut v = vec![0f32; N];
            out.read(0, &mut v).unwrap();
            for (i, x) in v.iter().enumerate() {
                let want = nr as f32 * value(5, nr - 1, i);
                assert_eq!(x.to_bits(), want.to_bits(), "element {i}");
            }
        }
        drop(graph);
        assert!(
            weak.upgrade().is_none(),
            "the graph's drop destroyed the communicator"
        );
    });
}

#[test]
fn shared_handles_are_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<Arc<Communicator>>();
    check::<Window<f32>>();
    check::<Graph>();
    check::<Buffer>();
    check::<Model>();
}

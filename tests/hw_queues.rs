//! Ranks as threads on one GPU share its hardware queues. With one queue
//! (`CUDA_DEVICE_MAX_CONNECTIONS=1`, as Megatron and Transformer Engine set it) every stream of
//! the process goes through it, in the order work was queued: a kernel that waits for a peer's
//! kernel queued behind it in that queue waits forever. The emulator models the queues
//! (host/backend/emu/queue.rs), and symcomm orders its launches among the ranks of a context
//! (host/comm/launch_order.rs); these tests check both.
//!
//! One test in this binary: the number of queues is read when the process makes its first
//! stream, so it is set before anything else runs, and no other test shares the process.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::with_ranks_using;
use symcomm::{CommOptions, DataType, Error, KernelArgs, LaunchConfig, RedOp};

const RANKS: u32 = 4;
const COUNT: usize = 1000;
const LAUNCHES: u32 = 5;

fn options(timeout: Duration) -> CommOptions {
    CommOptions::default().with_device_timeout(timeout)
}

/// The expected sum of `value(r, i)` over the ranks, bit for bit.
fn want(value: impl Fn(u32, usize) -> f32, i: usize) -> f32 {
    (0..RANKS).map(|r| value(r, i)).sum()
}

#[test]
fn one_hardware_queue() {
    // SAFETY: the only test of this binary, and nothing else runs yet: no other thread reads
    // the environment.
    unsafe { std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", "1") };
    unordered_launches_deadlock();
    ordered_user_launches_complete();
    collectives_complete();
}

/// Without ordering, back-to-back launches of ranks as threads deadlock in the one hardware
/// queue (the emulator shows what the GPU would do): each rank's second kernel waits at the
/// queue's head for its first, which waits for the peers' first kernels queued behind it. The
/// bounded waits report it.
fn unordered_launches_deadlock() {
    let start = Instant::now();
    let results = with_ranks_using(RANKS, &options(Duration::from_secs(2)), |comm| {
        let w = comm.alloc_window::<f32>(COUNT).unwrap();
        let stream = comm.create_stream().unwrap();
        let kernel = comm
            .load_kernel(&symcomm::DEVICE_IMAGE, "symcomm_collective_f32")
            .unwrap();
        let raw = w.device_handle().raw();
        let args = KernelArgs::new()
            .arg(&comm.device_handle().unwrap())
            .arg(&support::one_shot_sum_f32(raw, raw, COUNT as u64));
        // Every rank queues both launches before the ranks start them.
        comm.barrier().unwrap();
        for _ in 0..2 {
            // SAFETY: (DevComm, CollArgs) by value; the window outlives the launches (the
            // stream is synchronized below).
            unsafe { stream.launch(&kernel, LaunchConfig::linear(2, 64), &args) }.unwrap();
        }
        let synced = stream.synchronize();
        let checked = comm.check_error();
        synced.and(checked)
    });
    let timeouts = results
        .iter()
        .filter(|r| matches!(r, Err(Error::Timeout { .. })))
        .count();
    assert!(
        timeouts > 0,
        "no rank timed out with {RANKS} ranks' launches in one hardware queue: {results:?}"
    );
    eprintln!(
        "unordered: {timeouts} of {RANKS} ranks timed out, in {:?}",
        start.elapsed()
    );
}

/// Co-resident launches through the communicator are ordered: the same launches complete.
fn ordered_user_launches_complete() {
    let value = |r: u32, i: usize| (r * 1000 + (i % 251) as u32) as f32;
    let wrong: usize = with_ranks_using(RANKS, &options(Duration::from_secs(30)), |comm| {
        let r = comm.rank();
        let src = comm.alloc_window::<f32>(COUNT).unwrap();
        let dst = comm.alloc_window::<f32>(COUNT).unwrap();
        src.write(0, &(0..COUNT).map(|i| value(r, i)).collect::<Vec<_>>())
            .unwrap();
        let stream = comm.create_stream().unwrap();
        let kernel = comm
            .load_kernel(&symcomm::DEVICE_IMAGE, "symcomm_collective_f32")
            .unwrap();
        let args =
            KernelArgs::new()
                .arg(&comm.device_handle().unwrap())
                .arg(&support::one_shot_sum_f32(
                    src.device_handle().raw(),
                    dst.device_handle().raw(),
                    COUNT as u64,
                ));
        comm.barrier().unwrap();
        for _ in 0..LAUNCHES {
            let config = LaunchConfig::linear(2, 64).co_resident();
            // SAFETY: as above.
            unsafe { comm.launch(&stream, &kernel, config, &args) }.unwrap();
        }
        stream.synchronize().unwrap();
        comm.check_error().unwrap();
        let got = dst.to_vec().unwrap();
        (0..COUNT)
            .filter(|&i| got[i].to_bits() != want(value, i).to_bits())
            .count()
    })
    .into_iter()
    .sum();
    assert_eq!(wrong, 0, "#wrong");
}

/// Host collectives on both lanes (windows and ordinary buffers through the staging windows)
/// and send/recv rings (out of place, and in place: exchanges), back to back: all complete,
/// bit-exact.
fn collectives_complete() {
    let value = |r: u32, i: usize| (r * 100 + (i % 97) as u32) as f32;
    let wrong: usize = with_ranks_using(RANKS, &options(Duration::from_secs(30)), |comm| {
        let (r, n) = (comm.rank(), comm.nranks());
        let mine: Vec<f32> = (0..COUNT).map(|i| value(r, i)).collect();
        let win = comm.alloc_window::<f32>(COUNT).unwrap();
        let buf = comm.alloc_buffer(COUNT * 4).unwrap();
        let (a, b) = (comm.create_stream().unwrap(), comm.create_stream().unwrap());
        let recv = comm.alloc_buffer(COUNT * 4).unwrap();
        let read = |b: &symcomm::Buffer| {
            let mut v = vec![0f32; COUNT];
            b.read(0, &mut v).unwrap();
            v
        };
        let mut wrong = 0;
        for _ in 0..3 {
            win.write(0, &mine).unwrap();
            buf.write(0, &mine).unwrap();
            for _ in 0..LAUNCHES {
                comm.all_reduce(&win, &win, COUNT, DataType::F32, RedOp::Max, &a)
                    .unwrap();
                comm.all_reduce(&buf, &buf, COUNT, DataType::F32, RedOp::Max, &b)
                    .unwrap();
            }
            // A ring of send/recv on the first stream.
            comm.group(&a, |g| {
                g.send(&win, COUNT, DataType::F32, (r + 1) % n)?;
                g.recv(&recv, COUNT, DataType::F32, (r + n - 1) % n)
            })
            .unwrap();
            // And in place (one exchange operation per rank) on the other stream: it waits for
            // the ring (send/recv groups take turns across streams).
            comm.group(&b, |g| {
                g.send(&recv, COUNT, DataType::F32, (r + 1) % n)?;
                g.recv(&recv, COUNT, DataType::F32, (r + n - 1) % n)
            })
            .unwrap();
            a.synchronize().unwrap();
            b.synchronize().unwrap();
            comm.check_error().unwrap();
            let max = |i: usize| value(n - 1, i);
            for got in [win.to_vec().unwrap(), read(&buf), read(&recv)] {
                wrong += (0..COUNT)
                    .filter(|&i| got[i].to_bits() != max(i).to_bits())
                    .count();
            }
        }
        wrong
    })
    .into_iter()
    .sum();
    assert_eq!(wrong, 0, "#wrong");
}

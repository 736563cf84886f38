//! Host collectives beyond the value matrix (`coll.rs`), on the emulator with ranks as threads:
//! the bad-input table (each documented error before anything is launched, then the next valid
//! call passes), cross-rank mismatches (device fingerprints -> `Mismatch` on every rank),
//! send / recv and groups (rings, self-sends, multi-chunk messages, windows and buffers, bad
//! groups), graph capture and replay with fresh inputs each time, two streams at once, and stream
//! lanes (freed when their streams drop, taken by later streams, agreed across ranks, kept by
//! graphs).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mod.rs"]
mod support;

use std::thread;
use std::time::Duration;
use support::{with_ranks, with_ranks_using};

use symcomm::{BufferRef, CommOptions, Communicator, DataType, Error, RedOp, Stream};

/// A valid all-reduce of `n` f32 on windows, checked exactly; panics on any difference.
fn valid_all_reduce(comm: &Communicator, stream: &Stream, n: usize, salt: u32) {
    let a = comm.alloc_window::<f32>(n).unwrap();
    let b = comm.alloc_window::<f32>(n).unwrap();
    let value = |r: u32, i: usize| (r * 7 + salt + (i % 13) as u32) as f32;
    a.write(
        0,
        &(0..n).map(|i| value(comm.rank(), i)).collect::<Vec<_>>(),
    )
    .unwrap();
    comm.barrier().unwrap();
    comm.all_reduce(&a, &b, n, DataType::F32, RedOp::Sum, stream)
        .unwrap();
    stream.synchronize().unwrap();
    comm.check_error().unwrap();
    let got = b.to_vec().unwrap();
    for (i, g) in got.iter().enumerate() {
        let want: f32 = (0..comm.nranks()).map(|r| value(r, i)).sum();
        assert_eq!(g.to_bits(), want.to_bits(), "element {i}");
    }
    comm.barrier().unwrap();
}

#[test]
fn bad_inputs_are_typed_errors_and_the_next_call_passes() {
    with_ranks(3, |comm| {
        let s = comm.create_stream().unwrap();
        let w = comm.alloc_window::<f32>(64).unwrap();
        let bytes = comm.alloc_window::<u8>(256).unwrap();
        let small = comm.alloc_buffer(16).unwrap();
        let mut cases: Vec<(&str, symcomm::Result<()>)> = vec![
            (
                "count overflow",
                comm.all_reduce(&w, &w, usize::MAX, DataType::F64, RedOp::Sum, &s),
            ),
            (
                "recv too small",
                comm.all_reduce(&w, &small, 64, DataType::F32, RedOp::Sum, &s),
            ),
            (
                "all_gather recv too small",
                comm.all_gather(&w, w.range(0, 64).unwrap(), 64, DataType::F32, &s),
            ),
            (
                "misaligned",
                comm.all_reduce(
                    bytes.range(1, 8).unwrap(),
                    bytes.range(128, 8).unwrap(),
                    2,
                    DataType::F32,
                    RedOp::Sum,
                    &s,
                ),
            ),
            (
                "root out of range",
                comm.broadcast(&w, &w, 4, DataType::F32, 3, &s),
            ),
            (
                "overlap without in place",
                comm.all_reduce(
                    w.range(0, 10).unwrap(),
                    w.range(5, 10).unwrap(),
                    10,
                    DataType::F32,
                    RedOp::Sum,
                    &s,
                ),
            ),
            (
                "all_gather overlapping at a non-in-place offset",
                comm.all_gather(
                    w.range(1, 4).unwrap(),
                    w.range(0, 12).unwrap(),
                    4,
                    DataType::F32,
                    &s,
                ),
            ),
            (
                "null buffer",
                comm.all_reduce(
                    // SAFETY: refused before anything reads it.
                    unsafe { BufferRef::from_raw(0, 64) },
                    &w,
                    16,
                    DataType::F32,
                    RedOp::Sum,
                    &s,
                ),
            ),
            (
                "an f32 window reduced as i32",
                comm.all_reduce(&w, &w, 4, DataType::I32, RedOp::Sum, &s),
            ),
            (
                "an f32 window gathered as f64",
                comm.all_gather(w.range(0, 2).unwrap(), &w, 2, DataType::F64, &s),
            ),
            (
                "send to a peer out of range",
                comm.send(&w, 4, DataType::F32, 3, &s),
            ),
            (
                "two sends to one peer in a group",
                comm.group(&s, |g| {
                    g.send(&w, 4, DataType::F32, 0)?;
                    g.send(&w, 4, DataType::F32, 0)
                }),
            ),
        ];
        // A third stream: two lanes are taken by the first two streams used (`s`, then `s2`).
        valid_all_reduce(&comm, &s, 10, 0);
        let s2 = comm.create_stream().unwrap();
        let s3 = comm.create_stream().unwrap();
        comm.all_reduce(&w, &w, 1, DataType::F32, RedOp::Max, &s2)
            .unwrap();
        s2.synchronize().unwrap();
        cases.push((
            "a third stream",
            comm.all_reduce(&w, &w, 1, DataType::F32, RedOp::Max, &s3),
        ));
        for (what, r) in cases {
            assert!(
                matches!(r, Err(Error::InvalidArgument(_))),
                "rank {}: {what}: {r:?}",
                comm.rank()
            );
        }
        // Nothing ran: the stream is clean and the next valid call works.
        s.synchronize().unwrap();
        comm.check_error().unwrap();
        valid_all_reduce(&comm, &s, 1000, 1);
        // Byte windows (u8) and 2-byte ones (u16: bf16 values) hold any type of their size.
        let halves = comm.alloc_window::<u16>(32).unwrap();
        comm.all_reduce(
            bytes.range(0, 64).unwrap(),
            bytes.range(128, 64).unwrap(),
            16,
            DataType::F32,
            RedOp::Sum,
            &s,
        )
        .unwrap();
        comm.all_reduce(&halves, &halves, 32, DataType::Bf16, RedOp::Sum, &s)
            .unwrap();
        s.synchronize().unwrap();
        comm.check_error().unwrap();
    });
}

#[test]
fn a_count_mismatch_across_ranks_is_a_mismatch_on_every_rank() {
    let out = with_ranks_using(
        2,
        &CommOptions::default().with_device_timeout(Duration::from_secs(20)),
        |comm| {
            let s = comm.create_stream().unwrap();
            let a = comm.alloc_window::<i32>(100).unwrap();
            let b = comm.alloc_window::<i32>(100).unwrap();
            let n = if comm.rank() == 0 { 50 } else { 51 };
            comm.all_reduce(&a, &b, n, DataType::I32, RedOp::Sum, &s)
                .unwrap();
            s.synchronize().unwrap();
            let first = comm.check_error();
            // Sticky: later calls report it before launching anything.
            let later = comm.all_reduce(&a, &b, 10, DataType::I32, RedOp::Sum, &s);
            (first, later)
        },
    );
    for (r, (first, later)) in out.iter().enumerate() {
        assert!(
            matches!(first, Err(Error::Mismatch { .. })),
            "rank {r}: {first:?}"
        );
        assert!(
            matches!(later, Err(Error::Mismatch { .. })),
            "rank {r}: {later:?}"
        );
    }
}

#[test]
fn send_recv_rings_self_sends_and_multi_chunk_messages() {
    for nranks in [1u32, 2, 3, 4] {
        with_ranks(nranks, |comm| {
            let s = comm.create_stream().unwrap();
            let (me, n) = (comm.rank(), comm.nranks());
            let next = (me + 1) % n;
            let prev = (me + n - 1) % n;
            // 1.5 M u32 = 6 MB: more than one chunk of the staging window (4 MiB / nranks).
            for count in [0usize, 1, 1023, 1_500_000] {
                let value = |r: u32, i: usize| (r << 24) ^ (i as u32).wrapping_mul(2_654_435_761);
                let out = comm.alloc_buffer(count.max(1) * 4).unwrap();
                let inp = comm.alloc_window::<u32>(count.max(1)).unwrap();
                let back = comm.alloc_window::<u32>(count.max(1)).unwrap();
                inp.write(0, &(0..count).map(|i| value(me, i)).collect::<Vec<_>>())
                    .unwrap();
                comm.barrier().unwrap();
                // Ring: send to next, receive from prev (window -> buffer), plus a self-send
                // (window -> window) in the same group.
                comm.group(&s, |g| {
                    g.send(&inp, count, DataType::U32, next)?;
                    g.recv(&out, count, DataType::U32, prev)?;
                    if n > 1 {
                        g.send(&inp, count, DataType::U32, me)?;
                        g.recv(&back, count, DataType::U32, me)?;
                    }
                    Ok(())
                })
                .unwrap();
                s.synchronize().unwrap();
                comm.check_error().unwrap();
                let mut got = vec![0u32; count];
                out.read(0, &mut got).unwrap();
                let wrong = (0..count).filter(|&i| got[i] != value(prev, i)).count();
                assert_eq!(wrong, 0, "{n} ranks, count {count}: ring #wrong");
                if n > 1 {
                    back.read(0, &mut got).unwrap();
                    let wrong = (0..count).filter(|&i| got[i] != value(me, i)).count();
                    assert_eq!(wrong, 0, "{n} ranks, count {count}: self #wrong");
                }
                comm.barrier().unwrap();
            }
            // Lone send and recv between ranks 0 and 1, twice (the pair's counters continue).
            if n >= 2 && me < 2 {
                let buf = comm.alloc_buffer(4 * 100).unwrap();
                for round in 0..2u32 {
                    if me == 0 {
                        buf.write(0, &vec![round + 10; 100]).unwrap();
                        comm.send(&buf, 100, DataType::U32, 1, &s).unwrap();
                    } else {
                        comm.recv(&buf, 100, DataType::U32, 0, &s).unwrap();
                    }
                    s.synchronize().unwrap();
                    comm.check_error().unwrap();
                    if me == 1 {
                        let mut got = vec![0u32; 100];
                        buf.read(0, &mut got).unwrap();
                        assert!(got.iter().all(|&v| v == round + 10), "round {round}");
                    }
                }
            }
        });
    }
}

/// Send/recv with a GPU's launch geometry (CTAs of 512 threads, the staging window cut into
/// SYMCOMM_P2P_CHANNELS channels, several CTAs per operation): a ring plus a self-send, then the
/// ring in place, each twice (the channels' counters continue), with messages of one element,
/// of a few pieces (fewer channels than 8) and of many pieces per channel, bit-exact.
#[test]
fn send_recv_on_several_channels_and_ctas_per_operation() {
    let options = CommOptions::default()
        .with_device_timeout(Duration::from_secs(60))
        .with_emu_cuda_geometry(true);
    with_ranks_using(3, &options, |comm| {
        let s = comm.create_stream().unwrap();
        let (me, n) = (comm.rank(), comm.nranks());
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        // 4 MiB / 3 ranks: 1.33 MiB regions, 8 channels of two 85 KiB pieces.
        for count in [1usize, 70_001, 1_000_003] {
            for round in 0..2u32 {
                let value =
                    |r: u32, i: usize| (r << 24) ^ round ^ (i as u32).wrapping_mul(2_246_822_519);
                let inp = comm.alloc_buffer(count * 4).unwrap();
                let out = comm.alloc_buffer(count * 4).unwrap();
                let back = comm.alloc_buffer(count * 4).unwrap();
                let mine: Vec<u32> = (0..count).map(|i| value(me, i)).collect();
                inp.write(0, &mine).unwrap();
                comm.group(&s, |g| {
                    g.send(&inp, count, DataType::U32, next)?;
                    g.recv(&out, count, DataType::U32, prev)?;
                    g.send(&inp, count, DataType::U32, me)?;
                    g.recv(&back, count, DataType::U32, me)
                })
                .unwrap();
                // In place: `inp` becomes prev's data.
                comm.group(&s, |g| {
                    g.send(&inp, count, DataType::U32, next)?;
                    g.recv(&inp, count, DataType::U32, prev)
                })
                .unwrap();
                s.synchronize().unwrap();
                comm.check_error().unwrap();
                let mut got = vec![0u32; count];
                for (what, buf, from) in [
                    ("ring", &out, prev),
                    ("self", &back, me),
                    ("in place", &inp, prev),
                ] {
                    buf.read(0, &mut got).unwrap();
                    let wrong = (0..count).filter(|&i| got[i] != value(from, i)).count();
                    assert_eq!(wrong, 0, "count {count}, round {round}: {what} #wrong");
                }
            }
        }
    });
}

#[test]
fn in_place_send_recv_rings_and_overlap_rules() {
    for nranks in [1u32, 2, 3, 5] {
        with_ranks(nranks, |comm| {
            let s = comm.create_stream().unwrap();
            let (me, n) = (comm.rank(), comm.nranks());
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            for count in [1usize, 999, 1_200_001] {
                let value = |r: u32, i: usize| (r << 24) ^ (i as u32).wrapping_mul(40_503);
                let buf = comm.alloc_buffer(count * 4).unwrap();
                buf.write(0, &(0..count).map(|i| value(me, i)).collect::<Vec<_>>())
                    .unwrap();
                comm.barrier().unwrap();
                // A send and a receive of the same bytes: in place, in either posting order.
                comm.group(&s, |g| {
                    if me % 2 == 0 {
                        g.send(&buf, count, DataType::U32, next)?;
                        g.recv(&buf, count, DataType::U32, prev)
                    } else {
                        g.recv(&buf, count, DataType::U32, prev)?;
                        g.send(&buf, count, DataType::U32, next)
                    }
                })
                .unwrap();
                s.synchronize().unwrap();
                comm.check_error().unwrap();
                let mut got = vec![0u32; count];
                buf.read(0, &mut got).unwrap();
                let wrong = (0..count).filter(|&i| got[i] != value(prev, i)).count();
                assert_eq!(wrong, 0, "{n} ranks, count {count}: in-place ring #wrong");
                comm.barrier().unwrap();
            }
            // Partial overlaps with a receive, and two receives into one buffer, are refused.
            let w = comm.alloc_window::<u32>(64).unwrap();
            for (what, r) in [
                (
                    "recv overlapping a send partly",
                    comm.group(&s, |g| {
                        g.send(w.range(0, 32)?, 32, DataType::U32, next)?;
                        g.recv(w.range(16, 32)?, 32, DataType::U32, prev)
                    }),
                ),
                (
                    "two receives into one buffer",
                    comm.group(&s, |g| {
                        g.recv(w.range(0, 32)?, 32, DataType::U32, prev)?;
                        g.recv(w.range(8, 8)?, 8, DataType::U32, next)
                    }),
                ),
            ] {
                if n > 1 || what.starts_with("recv") {
                    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{what}: {r:?}");
                }
            }
            // Two sends of one buffer are fine (both read it).
            let out = comm.alloc_buffer(8 * 4).unwrap();
            let out2 = comm.alloc_buffer(8 * 4).unwrap();
            w.write(0, &[me + 1; 8]).unwrap();
            comm.barrier().unwrap();
            comm.group(&s, |g| {
                g.send(w.range(0, 8)?, 8, DataType::U32, next)?;
                g.send(w.range(0, 8)?, 8, DataType::U32, prev)?;
                g.recv(&out, 8, DataType::U32, prev)?;
                g.recv(&out2, 8, DataType::U32, next)
            })
            .or_else(|e| if n <= 2 { Ok(()) } else { Err(e) })
            .unwrap();
            if n > 2 {
                s.synchronize().unwrap();
                comm.check_error().unwrap();
                let mut got = [0u32; 8];
                out.read(0, &mut got).unwrap();
                assert_eq!(got, [prev + 1; 8]);
                out2.read(0, &mut got).unwrap();
                assert_eq!(got, [next + 1; 8]);
            }
        });
    }
}

#[test]
fn a_length_mismatch_in_send_recv_fails_both_sides() {
    let out = with_ranks_using(
        2,
        &CommOptions::default().with_device_timeout(Duration::from_millis(500)),
        |comm| {
            let s = comm.create_stream().unwrap();
            let buf = comm.alloc_buffer(4096).unwrap();
            if comm.rank() == 0 {
                comm.send(&buf, 100, DataType::U8, 1, &s).unwrap();
            } else {
                comm.recv(&buf, 200, DataType::U8, 0, &s).unwrap();
            }
            s.synchronize().unwrap();
            comm.check_error()
        },
    );
    assert!(
        matches!(
            out[0],
            Err(Error::Timeout {
                rank: 0,
                peer: 1,
                ..
            })
        ),
        "{:?}",
        out[0]
    );
    assert!(
        matches!(out[1], Err(Error::Mismatch { rank: 1, .. })),
        "{:?}",
        out[1]
    );
}

#[test]
fn captured_collectives_replay_with_fresh_inputs() {
    with_ranks(3, |comm| {
        let s = comm.create_stream().unwrap();
        let n = 777usize;
        let (me, nr) = (comm.rank(), comm.nranks());
        let a = comm.alloc_window::<f32>(n).unwrap();
        let b = comm.alloc_window::<f32>(n).unwrap();
        let gin = comm.alloc_buffer(n * 4).unwrap();
        let gout = comm.alloc_buffer(n * 4 * nr as usize).unwrap();
        let ring = comm.alloc_buffer(n * 4).unwrap();
        // A stream's first collective sets up its lane (a collective allocation): refused
        // while capturing, with nothing recorded.
        s.begin_capture().unwrap();
        let first = comm.all_reduce(&a, &b, n, DataType::F32, RedOp::Sum, &s);
        assert!(matches!(first, Err(Error::InvalidArgument(_))), "{first:?}");
        assert!(s.end_capture().unwrap().is_empty());
        // Warm up the lane, then capture.
        comm.all_reduce(&a, &b, 1, DataType::F32, RedOp::Sum, &s)
            .unwrap();
        s.synchronize().unwrap();
        comm.barrier().unwrap();
        s.begin_capture().unwrap();
        comm.all_reduce(&a, &b, n, DataType::F32, RedOp::Sum, &s)
            .unwrap();
        comm.all_gather(&gin, &gout, n, DataType::F32, &s).unwrap();
        comm.group(&s, |g| {
            g.send(&gin, n, DataType::F32, (me + 1) % nr)?;
            g.recv(&ring, n, DataType::F32, (me + nr - 1) % nr)
        })
        .unwrap();
        let graph = s.end_capture().unwrap();
        assert!(!graph.is_empty());
        for replay in 0..20u32 {
            let value = |r: u32, i: usize| (replay * 100 + r * 10 + (i % 7) as u32) as f32;
            let mine: Vec<f32> = (0..n).map(|i| value(me, i)).collect();
            a.write(0, &mine).unwrap();
            gin.write(0, &mine).unwrap();
            comm.barrier().unwrap();
            graph.launch(&s).unwrap();
            s.synchronize().unwrap();
            comm.check_error().unwrap();
            let sum = b.to_vec().unwrap();
            let mut gathered = vec![0f32; n * nr as usize];
            gout.read(0, &mut gathered).unwrap();
            let mut from_prev = vec![0f32; n];
            ring.read(0, &mut from_prev).unwrap();
            let prev = (me + nr - 1) % nr;
            for i in 0..n {
                let want: f32 = (0..nr).map(|r| value(r, i)).sum();
                assert_eq!(sum[i].to_bits(), want.to_bits(), "replay {replay} sum {i}");
                for r in 0..nr {
                    assert_eq!(gathered[r as usize * n + i], value(r, i), "replay {replay}");
                }
                assert_eq!(from_prev[i], value(prev, i), "replay {replay} ring");
            }
            comm.barrier().unwrap();
        }
    });
}

#[test]
fn two_streams_run_collectives_at_once() {
    with_ranks(3, |comm| {
        let (s1, s2) = (comm.create_stream().unwrap(), comm.create_stream().unwrap());
        let n = 5000usize;
        let a1 = comm.alloc_window::<i64>(n).unwrap();
        let b1 = comm.alloc_window::<i64>(n).unwrap();
        let a2 = comm.alloc_buffer(n * 8).unwrap();
        let b2 = comm.alloc_buffer(n * 8 * 3).unwrap();
        let v = |r: u32, i: usize| i64::from(r) * 1_000_000 + i as i64;
        let mine: Vec<i64> = (0..n).map(|i| v(comm.rank(), i)).collect();
        a1.write(0, &mine).unwrap();
        a2.write(0, &mine).unwrap();
        comm.barrier().unwrap();
        for _ in 0..3 {
            comm.all_reduce(&a1, &b1, n, DataType::I64, RedOp::Max, &s1)
                .unwrap();
            comm.all_gather(&a2, &b2, n, DataType::I64, &s2).unwrap();
        }
        s1.synchronize().unwrap();
        s2.synchronize().unwrap();
        comm.check_error().unwrap();
        let max = b1.to_vec().unwrap();
        let mut gathered = vec![0i64; n * 3];
        b2.read(0, &mut gathered).unwrap();
        for i in 0..n {
            assert_eq!(max[i], v(2, i));
            for r in 0..3 {
                assert_eq!(gathered[r as usize * n + i], v(r, i));
            }
        }
    });
}

/// Send/recv groups between the same ranks on two streams at once: the pairs' send/recv signal
/// words are shared by the lanes, so the groups take turns (each waits for the other stream's
/// latest group); every message arrives, bit-exact. (Before, the two kernels counted on the same
/// words and timed out, or worse.)
#[test]
fn send_recv_on_two_streams_at_once() {
    with_ranks(3, |comm| {
        let (me, n) = (comm.rank(), comm.nranks());
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let (s1, s2) = (comm.create_stream().unwrap(), comm.create_stream().unwrap());
        let count = 70_001usize;
        let v = |r: u32, k: u32, i: usize| (r << 28) ^ (k << 20) ^ i as u32;
        let bufs: Vec<_> = (0..4u32)
            .map(|k| {
                let send = comm.alloc_buffer(count * 4).unwrap();
                send.write(0, &(0..count).map(|i| v(me, k, i)).collect::<Vec<_>>())
                    .unwrap();
                (send, comm.alloc_buffer(count * 4).unwrap())
            })
            .collect();
        comm.barrier().unwrap();
        for (k, (send, recv)) in bufs.iter().enumerate() {
            let s = if k % 2 == 0 { &s1 } else { &s2 };
            comm.group(s, |g| {
                g.send(send, count, DataType::U32, next)?;
                g.recv(recv, count, DataType::U32, prev)
            })
            .unwrap();
        }
        s1.synchronize().unwrap();
        s2.synchronize().unwrap();
        comm.check_error().unwrap();
        let mut got = vec![0u32; count];
        for (k, (_, recv)) in bufs.iter().enumerate() {
            recv.read(0, &mut got).unwrap();
            let wrong = (0..count)
                .filter(|&i| got[i] != v(prev, k as u32, i))
                .count();
            assert_eq!(wrong, 0, "group {k}: #wrong");
        }
    });
}

#[test]
fn dropping_windows_right_after_an_asynchronous_call_waits_for_it() {
    with_ranks(3, |comm| {
        let s = comm.create_stream().unwrap();
        let n = 1 << 20;
        for round in 0..3 {
            let a = comm.alloc_window::<f32>(n).unwrap();
            let b = comm.alloc_window::<f32>(n).unwrap();
            a.write(0, &vec![1.0; n]).unwrap();
            comm.barrier().unwrap();
            comm.all_reduce(&a, &b, n, DataType::F32, RedOp::Sum, &s)
                .unwrap();
            comm.all_reduce(&b, &b, n, DataType::F32, RedOp::Max, &s)
                .unwrap();
            if round == 2 {
                let got = {
                    s.synchronize().unwrap();
                    b.to_vec().unwrap()
                };
                assert!(got.iter().all(|&v| v == 3.0));
            }
            // No synchronize: the drops must wait for the queued kernels, which read and write
            // these windows (the emulator would fault on unmapped memory otherwise).
            drop(a);
            drop(b);
            s.synchronize().unwrap();
            comm.check_error().unwrap();
        }
    });
}

/// Dropping a `Buffer` right after a call that uses it, without synchronizing, waits for the
/// call: `comm.all_reduce(&buf, &buf, ..)` then `drop(buf)` is safe code, so it must not free
/// memory the queued copies still write. The buffers are large enough (40 MiB) that the
/// allocator returns them to the system at once; before the drop waited, the staging path's
/// copy-out wrote into unmapped memory (SIGSEGV). The same for a send/recv group.
#[test]
fn buffers_dropped_right_after_a_call() {
    const N: usize = 10 << 20; // f32 elements: 40 MiB
    let outs = with_ranks(2, |comm| {
        let stream = comm.create_stream().unwrap();
        let backend = symcomm::Backend::Emu;
        for round in 0..2 {
            let buf = symcomm::Buffer::new(&backend, N * 4).unwrap();
            let other = symcomm::Buffer::new(&backend, N * 4).unwrap();
            buf.write(0, &vec![1.0f32 + comm.rank() as f32; N]).unwrap();
            comm.barrier().unwrap();
            if round == 0 {
                comm.all_reduce(&buf, &other, N, DataType::F32, RedOp::Sum, &stream)
                    .unwrap();
            } else {
                let peer = 1 - comm.rank();
                comm.group(&stream, |g| {
                    g.send(&buf, N, DataType::F32, peer)?;
                    g.recv(&other, N, DataType::F32, peer)
                })
                .unwrap();
            }
            drop(buf);
            drop(other);
        }
        stream.synchronize().and_then(|()| comm.check_error())
    });
    for (r, o) in outs.iter().enumerate() {
        assert!(o.is_ok(), "rank {r}: {o:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Stream lanes: a lane is freed when its stream drops and taken by the next new stream
// ---------------------------------------------------------------------------------------------

/// The buffers of [`LaneBuffers::issue`]: windows for the zero-copy path, ordinary buffers for the
/// staged one (through the lane's staging windows).
struct LaneBuffers {
    n: usize,
    win_in: symcomm::Window<f32>,
    win_out: symcomm::Window<f32>,
    buf_in: symcomm::Buffer,
    buf_out: symcomm::Buffer,
    ring: symcomm::Buffer,
}

fn lane_value(salt: u32, r: u32, i: usize) -> f32 {
    (salt * 1000 + r * 10 + (i % 7) as u32) as f32
}

impl LaneBuffers {
    fn new(comm: &Communicator, n: usize) -> LaneBuffers {
        LaneBuffers {
            n,
            win_in: comm.alloc_window::<f32>(n).unwrap(),
            win_out: comm.alloc_window::<f32>(n).unwrap(),
            buf_in: comm.alloc_buffer(n * 4).unwrap(),
            buf_out: comm.alloc_buffer(n * 4 * comm.nranks() as usize).unwrap(),
            ring: comm.alloc_buffer(n * 4).unwrap(),
        }
    }

    /// Issues an all-reduce on windows, an all-gather of buffers and a send/recv ring on
    /// `stream` with inputs made from `salt`, without waiting for them.
    fn issue(&self, comm: &Communicator, stream: &Stream, salt: u32) -> symcomm::Result<()> {
        let (me, nr, n) = (comm.rank(), comm.nranks(), self.n);
        let mine: Vec<f32> = (0..n).map(|i| lane_value(salt, me, i)).collect();
        self.win_in.write(0, &mine).unwrap();
        self.buf_in.write(0, &mine).unwrap();
        comm.barrier().unwrap();
        comm.all_reduce(
            &self.win_in,
            &self.win_out,
            n,
            DataType::F32,
            RedOp::Sum,
            stream,
        )?;
        comm.all_gather(&self.buf_in, &self.buf_out, n, DataType::F32, stream)?;
        comm.group(stream, |g| {
            g.send(&self.buf_in, n, DataType::F32, (me + 1) % nr)?;
            g.recv(&self.ring, n, DataType::F32, (me + nr - 1) % nr)
        })
    }

    /// Checks bit-exactly what [`Self::issue`] with `salt` computed (its stream has run it).
    fn check(&self, comm: &Communicator, salt: u32) {
        comm.check_error().unwrap();
        let (me, nr, n) = (comm.rank(), comm.nranks(), self.n);
        let sum = self.win_out.to_vec().unwrap();
        let mut gathered = vec![0f32; n * nr as usize];
        self.buf_out.read(0, &mut gathered).unwrap();
        let mut from_prev = vec![0f32; n];
        self.ring.read(0, &mut from_prev).unwrap();
        let prev = (me + nr - 1) % nr;
        for i in 0..n {
            let want: f32 = (0..nr).map(|r| lane_value(salt, r, i)).sum();
            assert_eq!(sum[i].to_bits(), want.to_bits(), "salt {salt}: sum {i}");
            for r in 0..nr {
                let got = gathered[r as usize * n + i];
                assert_eq!(
                    got.to_bits(),
                    lane_value(salt, r, i).to_bits(),
                    "salt {salt}"
                );
            }
            let want = lane_value(salt, prev, i);
            assert_eq!(
                from_prev[i].to_bits(),
                want.to_bits(),
                "salt {salt}: ring {i}"
            );
        }
        comm.barrier().unwrap();
    }

    /// [`Self::issue`], synchronize, [`Self::check`].
    fn round(&self, comm: &Communicator, stream: &Stream, salt: u32) {
        self.issue(comm, stream, salt).unwrap();
        stream.synchronize().unwrap();
        self.check(comm, salt);
    }
}

/// More streams over a communicator's life than it has lanes: each stream takes a lane at its
/// first collective and frees it when it drops (here right after its calls, without
/// synchronizing: the next stream's calls must wait for the dropped one's), while one stream
/// keeps the other lane; then both lanes change hands at once. Every result bit-exact. Before
/// lanes were freed, the third stream was refused for the communicator's whole life.
#[test]
fn streams_used_one_after_another_take_turns_on_the_lanes() {
    for nranks in [2u32, 4] {
        with_ranks(nranks, |comm| {
            let bufs = LaneBuffers::new(&comm, 1500);
            let keep = comm.create_stream().unwrap();
            bufs.round(&comm, &keep, 0);
            for salt in 1..=4 {
                let s = comm.create_stream().unwrap();
                bufs.issue(&comm, &s, salt).unwrap();
                if salt % 2 == 0 {
                    s.synchronize().unwrap();
                }
                drop(s);
                bufs.check(&comm, salt);
                bufs.round(&comm, &keep, 10 + salt);
            }
            drop(keep);
            let (s1, s2) = (comm.create_stream().unwrap(), comm.create_stream().unwrap());
            bufs.round(&comm, &s2, 20);
            bufs.round(&comm, &s1, 21);
            bufs.round(&comm, &s2, 22);
        });
    }
}

/// A collective on one stream more than there are lanes, while the others are alive, is a
/// typed error naming the limit and the way out (drop a stream); nothing runs, the streams in
/// use go on, and once one of them drops the refused stream gets its lane.
#[test]
fn one_stream_more_than_the_lanes_is_refused_until_one_drops() {
    with_ranks(2, |comm| {
        let bufs = LaneBuffers::new(&comm, 700);
        let (s1, s2, s3) = (
            comm.create_stream().unwrap(),
            comm.create_stream().unwrap(),
            comm.create_stream().unwrap(),
        );
        bufs.round(&comm, &s1, 1);
        bufs.round(&comm, &s2, 2);
        for r in [
            comm.all_reduce(
                &bufs.win_in,
                &bufs.win_out,
                4,
                DataType::F32,
                RedOp::Sum,
                &s3,
            ),
            comm.send(&bufs.buf_in, 4, DataType::F32, 0, &s3),
        ] {
            match r {
                Err(Error::InvalidArgument(m)) => {
                    // The limit (`MAX_STREAMS`) and the way to free a lane.
                    assert!(m.contains("2 streams") && m.contains("drop"), "{m}");
                }
                other => panic!("rank {}: {other:?}", comm.rank()),
            }
        }
        assert!(s3.is_idle().unwrap());
        bufs.round(&comm, &s1, 3);
        bufs.round(&comm, &s2, 4);
        drop(s2);
        bufs.round(&comm, &s3, 5);
        bufs.round(&comm, &s1, 6);
    });
}

/// Ranks whose streams in use differ when a new stream takes a lane would put it on different
/// lanes (or on none): every rank gets an error before anything runs (the ranks agree on the
/// lane), never a hang or wrong data; the communicator goes on once the ranks agree again.
#[test]
fn ranks_with_different_streams_in_use_get_an_error_on_every_rank() {
    let out = with_ranks(2, |comm| {
        let bufs = LaneBuffers::new(&comm, 300);
        let me = comm.rank();
        let mut a = Some(comm.create_stream().unwrap());
        let mut b = Some(comm.create_stream().unwrap());
        bufs.round(&comm, a.as_ref().unwrap(), 1);
        bufs.round(&comm, b.as_ref().unwrap(), 2);
        let c = comm.create_stream().unwrap();
        // Rank 0 frees the first lane; rank 1 has none free for `c`.
        if me == 0 {
            a = None;
        }
        let full = bufs.issue(&comm, &c, 3);
        // Rank 1 frees the second lane: `c` would take lane 0 on rank 0 and lane 1 on rank 1.
        if me == 1 {
            b = None;
        }
        let differ = bufs.issue(&comm, &c, 4);
        // Agreement again: both lanes free everywhere.
        drop((a.take(), b.take()));
        bufs.round(&comm, &c, 5);
        (full, differ)
    });
    for (r, (full, differ)) in out.iter().enumerate() {
        match full {
            Err(Error::InvalidArgument(m)) if r == 1 => assert!(m.contains("drop"), "{m}"),
            Err(Error::PeerFailed { rank: 1, .. }) if r == 0 => {}
            other => panic!("rank {r}: {other:?}"),
        }
        assert!(
            matches!(differ, Err(Error::Mismatch { .. })),
            "rank {r}: {differ:?}"
        );
    }
}

/// A graph that captured collectives keeps their lane: after its stream dropped, the lane is
/// still in use (a new stream is refused while the other lane is taken too) until the graph
/// drops, and the drop waits for the graph's last replay, here held back on another stream, so
/// that the next stream on the lane never runs beside it.
#[test]
fn a_graph_keeps_its_lane_until_it_drops_and_its_replays_finish() {
    with_ranks(2, |comm| {
        let bufs = LaneBuffers::new(&comm, 900);
        let sa = comm.create_stream().unwrap();
        bufs.round(&comm, &sa, 1);
        sa.begin_capture().unwrap();
        bufs.issue(&comm, &sa, 0).unwrap();
        let graph = sa.end_capture().unwrap();
        let sb = comm.create_stream().unwrap();
        bufs.round(&comm, &sb, 2);
        drop(sa);
        let sc = comm.create_stream().unwrap();
        match comm.all_reduce(
            &bufs.win_in,
            &bufs.win_out,
            4,
            DataType::F32,
            RedOp::Sum,
            &sc,
        ) {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains("lane 0: a graph that captured"), "{m}");
            }
            other => panic!("rank {}: {other:?}", comm.rank()),
        }
        // Replay on a stream without a lane, behind a slow host function; `issue(.., 0)`'s
        // inputs are the ones recorded (the writes happen now, before the replay runs).
        let sd = comm.create_stream().unwrap();
        let mine: Vec<f32> = (0..bufs.n).map(|i| lane_value(7, comm.rank(), i)).collect();
        bufs.win_in.write(0, &mine).unwrap();
        bufs.buf_in.write(0, &mine).unwrap();
        comm.barrier().unwrap();
        sd.enqueue_host(|| {
            thread::sleep(Duration::from_millis(300));
            Ok(())
        })
        .unwrap();
        graph.launch(&sd).unwrap();
        drop(graph);
        assert!(
            sd.is_idle().unwrap(),
            "the graph dropped before its replay finished"
        );
        bufs.check(&comm, 7);
        bufs.round(&comm, &sc, 8);
        bufs.round(&comm, &sb, 9);
    });
}

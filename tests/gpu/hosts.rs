//! Across hosts on one machine: ranks as threads with two simulated host ids (distinct
//! `SYMCOMM_HOST_ID`s, UCX over the machine's loopback between them), so that the paths between
//! hosts run on this device — the proxy that carries kernels' signals and puts to another host's
//! ranks (on a GPU: its ring in mapped pinned memory, its copies and `cuStreamWriteValue64` on a
//! stream of its own), and the host collectives between hosts: their worker thread, and the
//! host function and stream wait (`cuLaunchHostFunc`, `cuStreamWaitValue32` on mapped host
//! memory) that order a call with its stream, also captured in a CUDA graph.

use super::*;

use support::ring::{GROUP_CTA, GROUP_THREAD, GROUP_WARP, put_ring};

/// Ranks 0 and 2 on one host, 1 and 3 on the other: every ring hop crosses hosts.
const HOSTS: [&str; 4] = ["gpu-check-a", "gpu-check-b", "gpu-check-a", "gpu-check-b"];

/// The checks across hosts, on `device`.
pub(crate) fn hosts_checks(report: &mut Report, device: symcomm::Device) {
    report.record("hosts_put_ring", hosts_put_ring_check(device));
    report.record("hosts_all_reduce", hosts_all_reduce_check(device));
    report.record(
        "hosts_graph_all_reduce",
        hosts_graph_all_reduce_check(device),
    );
    report.record(
        "hosts_send_recv_direct",
        hosts_send_recv_check(device, false),
    );
    report.record(
        "hosts_send_recv_staged",
        hosts_send_recv_check(device, true),
    );
}

fn on_hosts<T: Send>(
    device: symcomm::Device,
    body: impl Fn(&symcomm::Communicator) -> Result<T, String> + Sync,
) -> Result<Vec<T>, String> {
    let options = symcomm::CommOptions::default().with_device_timeout(TIMEOUT);
    support::try_with_ranks_on_hosts(device, &HOSTS, &options, |comm| body(&comm))
}

/// Send/recv rings across the two hosts, every rank sending 1 and 64 MiB of u32 (4 MiB on the
/// emulator, whose staging copies are CPU copies) to the next rank (on the other host) and
/// receiving from the previous one, bit-exact. `staged`: the bytes between hosts staged through
/// pinned host memory in waves (on the emulator too, as on a GPU); else direct: UCX moves the
/// device memory itself, which on a GPU needs a UCX built with CUDA (the bundle's is: without
/// CUDA support found, the check fails rather than measure staging under the wrong name).
/// Figures: GB/s each way per rank (UCX between the two simulated hosts of one machine: shared
/// memory, CUDA IPC or copies, as UCX picks).
fn hosts_send_recv_check(device: symcomm::Device, staged: bool) -> Outcome {
    let on_gpu = !matches!(device, symcomm::Device::Emu);
    if on_gpu && !staged {
        let ucx = symcomm::ucx_probe().map_err(err)?;
        if !ucx.cuda_memory {
            return Err(format!(
                "UCX {} reports no CUDA memory support here (the bundle's is built with CUDA;                  is its libuct_cuda loadable?): data between hosts would be staged",
                ucx.version
            ));
        }
    }
    let sizes_mib: [usize; 2] = if on_gpu { [1, 64] } else { [1, 4] };
    const CALLS: u32 = 5;
    let options = symcomm::CommOptions::default()
        .with_device_timeout(TIMEOUT)
        .with_hosts_staging(staged);
    let per_rank = support::try_with_ranks_on_hosts(device, &HOSTS, &options, |comm| {
        let (me, n) = (comm.rank(), comm.nranks());
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let stream = comm.create_stream().map_err(err)?;
        let value = |r: u32, i: usize| (r << 28) ^ (i as u32).wrapping_mul(2_654_435_761);
        let mut rates = Vec::new();
        let mut wrong = 0usize;
        for mib in sizes_mib {
            let count = mib << 18;
            let send = symcomm::Buffer::new(comm.backend(), count * 4).map_err(err)?;
            let recv = symcomm::Buffer::new(comm.backend(), count * 4).map_err(err)?;
            let mine: Vec<u32> = (0..count).map(|i| value(me, i)).collect();
            send.write(0, &mine).map_err(err)?;
            let ring = || {
                comm.group(&stream, |g| {
                    g.send(&send, count, symcomm::DataType::U32, next)?;
                    g.recv(&recv, count, symcomm::DataType::U32, prev)
                })
            };
            ring().map_err(err)?;
            stream.synchronize().map_err(err)?;
            let t = Instant::now();
            for _ in 0..CALLS {
                ring().map_err(err)?;
            }
            stream.synchronize().map_err(err)?;
            let secs = t.elapsed().as_secs_f64() / f64::from(CALLS);
            comm.check_error().map_err(err)?;
            let mut got = vec![0u32; count];
            recv.read(0, &mut got).map_err(err)?;
            wrong += (0..count).filter(|&i| got[i] != value(prev, i)).count();
            rates.push((count * 4) as f64 / secs / 1e9);
        }
        Ok((wrong, rates))
    })?;
    let wrong: usize = per_rank.iter().map(|(w, _)| w).sum();
    if wrong != 0 {
        return Err(format!("#wrong {wrong} over the 4 ranks"));
    }
    let gbs = &per_rank[0].1;
    Ok((
        format!(
            "4 ranks on 2 hosts, {}: {:.2} GB/s at {} MiB, {:.2} GB/s at {} MiB each way per \
             rank; #wrong 0",
            if staged {
                "staged through pinned memory"
            } else {
                "direct (UCX moves the device memory)"
            },
            gbs[0],
            sizes_mib[0],
            gbs[1],
            sizes_mib[1]
        ),
        json!({"mib": sizes_mib, "gb_per_s": gbs, "staged": staged}),
    ))
}

/// The put ring (`put_with_signal` to the next rank, a `signal_add` tally to every rank and a
/// `barrier` per round) for each group kind, two launches back to back (signal values continue
/// across launches); every word checked. Figures: microseconds per round.
fn hosts_put_ring_check(device: symcomm::Device) -> Outcome {
    const ROUNDS: u32 = 20;
    const WORDS: u32 = 1000;
    let groups = [(GROUP_THREAD, 1u32), (GROUP_WARP, 32), (GROUP_CTA, 256)];
    let per_rank = on_hosts(device, |comm| {
        let win = comm.alloc_window::<u32>(2 * WORDS as usize).map_err(err)?;
        let state = symcomm::Buffer::new(comm.backend(), 8).map_err(err)?;
        let mut per_round = Vec::new();
        for (group, threads) in groups {
            for launch in 0..2 {
                let (r, took) = put_ring(comm, group, threads, ROUNDS, WORDS, &state, &win)?;
                comm.check_error()
                    .map_err(|e| format!("group {group} launch {launch}: {e}"))?;
                if r != [SYMCOMM_STATUS_OK, 0, ROUNDS] {
                    return Err(format!(
                        "group {group} launch {launch}: [status, wrong, rounds] {r:?}"
                    ));
                }
                if launch == 1 {
                    per_round.push(took.as_secs_f64() * 1e6 / f64::from(ROUNDS));
                }
            }
        }
        Ok(per_round)
    })?;
    let us = &per_rank[0];
    Ok((
        format!(
            "4 ranks on 2 hosts, {ROUNDS} rounds of {WORDS} u32: {:.0} / {:.0} / {:.0} us per round \
             (thread / warp / CTA)",
            us[0], us[1], us[2]
        ),
        json!({"us_per_round": {"thread": us[0], "warp": us[1], "cta": us[2]}}),
    ))
}

/// A host all-reduce (i32 sum, odd count) across the two hosts, out of place and in place, on
/// device buffers; bit-exact.
fn hosts_all_reduce_check(device: symcomm::Device) -> Outcome {
    const COUNT: usize = 100_003;
    let per_rank = on_hosts(device, |comm| {
        let rank = comm.rank() as i32;
        let send = symcomm::Buffer::new(comm.backend(), COUNT * 4).map_err(err)?;
        let recv = symcomm::Buffer::new(comm.backend(), COUNT * 4).map_err(err)?;
        let input: Vec<i32> = (0..COUNT as i32).map(|i| (i % 1009) * 3 + rank).collect();
        send.write(0, &input).map_err(err)?;
        let stream = comm.create_stream().map_err(err)?;
        let (i32t, sum) = (symcomm::DataType::I32, symcomm::RedOp::Sum);
        let t = Instant::now();
        comm.all_reduce(&send, &recv, COUNT, i32t, sum, &stream)
            .map_err(err)?;
        comm.all_reduce(&recv, &recv, COUNT, i32t, sum, &stream)
            .map_err(err)?;
        stream.synchronize().map_err(err)?;
        let took = t.elapsed();
        let mut got = vec![0i32; COUNT];
        recv.read(0, &mut got).map_err(err)?;
        // Sum over 4 ranks of (3v + r) is 12v + 6; the in-place call multiplies by 4.
        let wrong = (0..COUNT)
            .filter(|&i| got[i] != (12 * (i as i32 % 1009) + 6) * 4)
            .count();
        Ok((wrong, took))
    })?;
    let wrong: usize = per_rank.iter().map(|(w, _)| w).sum();
    if wrong != 0 {
        return Err(format!("#wrong {wrong} over the 4 ranks"));
    }
    let ms = per_rank[0].1.as_secs_f64() * 1e3 / 2.0;
    Ok((
        format!("4 ranks on 2 hosts, {COUNT} i32: #wrong 0, {ms:.2} ms per call"),
        json!({"ms_per_call": ms}),
    ))
}

/// An all-reduce across the two hosts captured in a graph and replayed with new inputs (written
/// between replays), then one more outside the graph; bit-exact after every replay. Figures:
/// milliseconds per replay.
fn hosts_graph_all_reduce_check(device: symcomm::Device) -> Outcome {
    const COUNT: usize = 65_537;
    const REPLAYS: i32 = 3;
    let per_rank = on_hosts(device, |comm| {
        let rank = comm.rank() as i32;
        let send = symcomm::Buffer::new(comm.backend(), COUNT * 4).map_err(err)?;
        let recv = symcomm::Buffer::new(comm.backend(), COUNT * 4).map_err(err)?;
        let stream = comm.create_stream().map_err(err)?;
        let (i32t, sum) = (symcomm::DataType::I32, symcomm::RedOp::Sum);
        stream.begin_capture().map_err(err)?;
        let captured = comm.all_reduce(&send, &recv, COUNT, i32t, sum, &stream);
        let graph = stream.end_capture().map_err(err)?;
        captured.map_err(err)?;
        let mut wrong = 0;
        let mut took = std::time::Duration::ZERO;
        let value = |r: i32, i: usize, k: i32| (i as i32 % 1013) * 5 + r + 100 * k;
        let mut got = vec![0i32; COUNT];
        for k in 0..=REPLAYS {
            let input: Vec<i32> = (0..COUNT).map(|i| value(rank, i, k)).collect();
            send.write(0, &input).map_err(err)?;
            let t = Instant::now();
            if k < REPLAYS {
                graph.launch(&stream).map_err(err)?;
            } else {
                comm.all_reduce(&send, &recv, COUNT, i32t, sum, &stream)
                    .map_err(err)?;
            }
            stream.synchronize().map_err(err)?;
            if k < REPLAYS {
                took += t.elapsed();
            }
            comm.check_error().map_err(err)?;
            recv.read(0, &mut got).map_err(err)?;
            wrong += (0..COUNT)
                .filter(|&i| got[i] != (0..4).map(|r| value(r, i, k)).sum::<i32>())
                .count();
        }
        Ok((wrong, took))
    })?;
    let wrong: usize = per_rank.iter().map(|(w, _)| w).sum();
    if wrong != 0 {
        return Err(format!("#wrong {wrong} over the 4 ranks"));
    }
    let ms = per_rank[0].1.as_secs_f64() * 1e3 / f64::from(REPLAYS);
    Ok((
        format!(
            "4 ranks on 2 hosts, {COUNT} i32 from a graph, {REPLAYS} replays and a call outside: \
             #wrong 0, {ms:.2} ms per replay"
        ),
        json!({"ms_per_replay": ms}),
    ))
}

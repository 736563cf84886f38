//! Communicator checks: ranks as threads, windows exchanged through the library.

use super::*;

/// Runs `body` on `nranks` communicator ranks as threads on `device`, each with its own
/// communicator (the tests' fixture, with the GPU checks' device timeout); the ranks' results,
/// or the first failed rank's error.
pub(crate) fn comm_threads<T: Send>(
    device: symcomm::Device,
    nranks: u32,
    body: impl Fn(&symcomm::Communicator) -> Result<T, String> + Sync,
) -> Result<Vec<T>, String> {
    let options = symcomm::CommOptions::default().with_device_timeout(TIMEOUT);
    support::try_with_ranks_on(device, nranks, &options, |comm| body(&comm))
}

/// `nranks` communicator ranks as threads on `device`: windows of `count` f32, every rank's copy
/// read back by every rank, then `iters` one-shot all-reduces launched back to back through
/// `Communicator::launch` (co-resident: ordered among the ranks sharing the GPU, so that the
/// launches never wait for one another in a shared hardware queue), checked bit for bit.
pub(crate) fn comm_windows_check(
    device: symcomm::Device,
    nranks: u32,
    count: usize,
    iters: u32,
) -> Outcome {
    use symcomm::{KernelArgs, LaunchConfig};
    let value = |r: u32, i: usize| (r * 1000 + (i % 251) as u32) as f32;
    let per_rank = comm_threads(device, nranks, |comm| {
        let r = comm.rank();
        let src = comm.alloc_window::<f32>(count).map_err(err)?;
        let dst = comm.alloc_window::<f32>(count).map_err(err)?;
        let mine: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
        src.write(0, &mine).map_err(err)?;
        comm.barrier().map_err(err)?;
        let mut wrong = 0;
        let mut got = vec![0f32; count];
        for peer in 0..nranks {
            src.read_rank(peer, 0, &mut got).map_err(err)?;
            wrong += (0..count)
                .filter(|&i| got[i].to_bits() != value(peer, i).to_bits())
                .count();
        }
        let stream = comm.create_stream().map_err(err)?;
        let kernel = comm
            .load_kernel(&DEVICE_IMAGE, "symcomm_collective_f32")
            .map_err(err)?;
        let args = support::one_shot_sum_f32(
            src.device_handle().raw(),
            dst.device_handle().raw(),
            count as u64,
        );
        let kargs = KernelArgs::new()
            .arg(&comm.device_handle().map_err(err)?)
            .arg(&args);
        let t = Instant::now();
        for _ in 0..iters {
            // SAFETY: (DevComm, CollArgs) by value, as the kernel takes them; the windows
            // outlive the launches (synchronized below).
            unsafe {
                comm.launch(
                    &stream,
                    &kernel,
                    LaunchConfig::linear(8, 256).co_resident(),
                    &kargs,
                )
            }
            .map_err(err)?;
        }
        stream.synchronize().map_err(err)?;
        let per_launch_us = t.elapsed().as_secs_f64() * 1e6 / f64::from(iters);
        comm.check_error().map_err(err)?;
        dst.read(0, &mut got).map_err(err)?;
        wrong += (0..count)
            .filter(|&i| {
                let want: f32 = (0..nranks).map(|p| value(p, i)).sum();
                got[i].to_bits() != want.to_bits()
            })
            .count();
        Ok((wrong, per_launch_us, src.device_handle().raw().stride))
    })?;
    let mut wrong = 0;
    let mut worst_us = 0f64;
    let mut stride = 0;
    for (w, us, st) in per_rank {
        wrong += w;
        worst_us = worst_us.max(us);
        stride = st;
    }
    let detail = format!(
        "{nranks} ranks as threads: windows of {count} f32 (stride {stride} B) exchanged, {iters} all-reduces, #wrong {wrong}, {worst_us:.1} us/launch (slowest rank)"
    );
    if wrong == 0 {
        Ok((
            detail,
            json!({"nranks": nranks, "count": count, "us_per_launch": worst_us, "stride": stride}),
        ))
    } else {
        Err(detail)
    }
}

/// Streams taking turns on one collective lane: each of `streams` streams issues three staged
/// all-reduces (ordinary buffers, copied through the lane's staging windows) and is dropped at
/// once — on CUDA that returns with the work still queued — so the next stream's first call
/// must wait for the lane's last work before reusing its barriers and staging windows; a
/// long-lived stream keeps the other lane. Every result checked bit for bit.
pub(crate) fn comm_lanes_check(
    device: symcomm::Device,
    nranks: u32,
    count: usize,
    streams: u32,
) -> Outcome {
    use symcomm::{DataType, RedOp};
    let value =
        |salt: usize, r: u32, i: usize| (salt as u32 * 1000 + r * 10 + (i % 7) as u32) as f32;
    let wrong: usize = comm_threads(device, nranks, |comm| {
        let keep = comm.create_stream().map_err(err)?;
        let bufs = (0..=streams)
            .map(|_| Ok((comm.alloc_buffer(count * 4)?, comm.alloc_buffer(count * 4)?)))
            .collect::<symcomm::Result<Vec<_>>>()
            .map_err(err)?;
        for (salt, (inp, _)) in bufs.iter().enumerate() {
            let mine: Vec<f32> = (0..count).map(|i| value(salt, comm.rank(), i)).collect();
            inp.write(0, &mine).map_err(err)?;
        }
        comm.barrier().map_err(err)?;
        let sum = |(inp, out): &(symcomm::Buffer, symcomm::Buffer), s: &symcomm::Stream| {
            comm.all_reduce(inp, out, count, DataType::F32, RedOp::Sum, s)
                .map_err(err)
        };
        sum(&bufs[streams as usize], &keep)?;
        for b in &bufs[..streams as usize] {
            let s = comm.create_stream().map_err(err)?;
            for _ in 0..3 {
                sum(b, &s)?;
            }
        }
        // The last stream on the lane waits for the ones before it: synchronizing it covers
        // them all.
        let last = comm.create_stream().map_err(err)?;
        sum(&bufs[0], &last)?;
        last.synchronize().map_err(err)?;
        keep.synchronize().map_err(err)?;
        comm.check_error().map_err(err)?;
        let mut wrong = 0;
        let mut got = vec![0f32; count];
        for (salt, (_, out)) in bufs.iter().enumerate() {
            out.read(0, &mut got).map_err(err)?;
            wrong += (0..count)
                .filter(|&i| {
                    let want: f32 = (0..nranks).map(|p| value(salt, p, i)).sum();
                    got[i].to_bits() != want.to_bits()
                })
                .count();
        }
        Ok(wrong)
    })?
    .into_iter()
    .sum();
    let detail = format!(
        "{nranks} ranks as threads: {streams} streams one after another on one lane, each dropped right after 3 staged all-reduces of {count} f32, #wrong {wrong}"
    );
    if wrong == 0 {
        Ok((
            detail,
            json!({"nranks": nranks, "count": count, "streams": streams}),
        ))
    } else {
        Err(detail)
    }
}

pub(crate) fn comm_checks(report: &mut Report, device: symcomm::Device, count: usize) {
    for n in [2u32, 4] {
        report.record(
            &format!("comm_windows_threads_{n}"),
            comm_windows_check(device, n, count, 5),
        );
        report.record(
            &format!("comm_lane_turnover_threads_{n}"),
            comm_lanes_check(device, n, count, 4),
        );
    }
    report.record(
        "one_hardware_queue_threads_4",
        one_queue_check(device, count),
    );
    hosts_checks(report, device);
    if device != symcomm::Device::Emu {
        report.record("comm_mixed_devices", comm_mixed_devices_check(device));
        report.record("occupancy_model", occupancy_model_check(device));
        for n in [4u32, 8] {
            report.record(
                &format!("co_residency_threads_{n}"),
                co_residency_check(device, n),
            );
        }
        report.record(
            "free_while_peer_queued",
            free_while_peer_queued_check(device),
        );
    }
}

/// Two ranks as threads on one GPU (one CUDA context): rank 0 drops a window and queues its next
/// all-reduce while rank 1 is still before its own drop. `cuMemUnmap` synchronizes the context,
/// so an inline free on rank 1 would wait for rank 0's all-reduce, which waits for rank 1's: a
/// hang until the device timeout. symcomm frees only while its streams are idle
/// (host/sync_free.rs); the emulator twin is tests/residency.rs.
pub(crate) fn free_while_peer_queued_check(device: symcomm::Device) -> Outcome {
    use symcomm::{DataType, RedOp};
    let n = 1usize << 20;
    let per_rank = comm_threads(device, 2, |comm| {
        let r = comm.rank();
        let stream = comm.create_stream().map_err(err)?;
        let a = comm.alloc_window::<u64>(n).map_err(err)?;
        let b = comm.alloc_window::<u64>(n).map_err(err)?;
        let input: Vec<u64> = (0..n as u64).map(|i| i * 3 + u64::from(r)).collect();
        a.write(0, &input).map_err(err)?;
        comm.barrier().map_err(err)?;
        let sum = || comm.all_reduce(&a, &a, n, DataType::U64, RedOp::Sum, &stream);
        sum().map_err(err)?;
        if r == 1 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let start = Instant::now();
        drop(b);
        sum().map_err(err)?;
        stream.synchronize().map_err(err)?;
        comm.check_error().map_err(err)?;
        let elapsed = start.elapsed();
        let got = a.to_vec().map_err(err)?;
        let wrong = (0..n).filter(|&i| got[i] != (i as u64 * 6 + 1) * 2).count();
        Ok((wrong, elapsed))
    })?;
    let detail: Vec<String> = per_rank
        .iter()
        .enumerate()
        .map(|(r, (wrong, elapsed))| {
            format!("rank {r}: #wrong {wrong}, drop + all-reduce {elapsed:?}")
        })
        .collect();
    if per_rank
        .iter()
        .all(|(wrong, elapsed)| *wrong == 0 && *elapsed < Duration::from_secs(5))
    {
        Ok((detail.join("; "), Value::Null))
    } else {
        Err(detail.join("; "))
    }
}

/// The emulator's occupancy model against the GPU's: for every built-in kernel at the block
/// sizes symcomm launches, `cuOccupancyMaxActiveBlocksPerMultiprocessor` and what the emulator
/// computes from the kernel's sm_90 ptxas report must agree (else the emulator's residency
/// scheduler would be more forgiving than the GPU, or stricter).
pub(crate) fn occupancy_model_check(device: symcomm::Device) -> Outcome {
    let symcomm::Device::Cuda(ordinal) = device else {
        return Err("not a CUDA device".into());
    };
    let gpu = symcomm::Backend::Cuda(CudaDevice::open(ordinal).map_err(err)?);
    let emu = symcomm::Backend::Emu;
    let mut lines = Vec::new();
    let mut bad = Vec::new();
    let mut names = collective_kernel_names();
    names.push("symcomm_sendrecv".into());
    for name in &names {
        let on_gpu = symcomm::Kernel::load(&gpu, &DEVICE_IMAGE, name).map_err(err)?;
        let on_emu = symcomm::Kernel::load(&emu, &DEVICE_IMAGE, name).map_err(err)?;
        for threads in [64u32, 512] {
            let g = on_gpu.occupancy(threads, 0).map_err(err)?;
            let e = on_emu.occupancy(threads, 0).map_err(err)?;
            lines.push(format!("{name}@{threads}: gpu {g}, emulator {e}"));
            if g != e {
                bad.push(format!(
                    "{name} at {threads} threads: GPU {g} CTAs/SM, emulator {e}"
                ));
            }
        }
    }
    if bad.is_empty() {
        Ok((lines.join("; "), Value::Null))
    } else {
        Err(bad.join("; "))
    }
}

/// `nranks` ranks as threads on one GPU: the share of each is what the GPU holds divided among
/// them; a co-resident launch beyond it is refused, and an all-reduce large enough to want more
/// CTAs than the share (64 MiB) completes bit-exact with every launch capped.
pub(crate) fn co_residency_check(device: symcomm::Device, nranks: u32) -> Outcome {
    use symcomm::{CommOptions, Communicator, DataType, KernelArgs, LaunchConfig, RedOp};
    let id = symcomm::UniqueId::new_on("127.0.0.1".parse().map_err(err)?).map_err(err)?;
    let count = 16usize << 20; // 64 MiB of f32
    let per_rank: Vec<Result<(u32, usize), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..nranks)
            .map(|r| {
                let id = &id;
                s.spawn(move || -> Result<(u32, usize), String> {
                    let config = symcomm::bootstrap::BootstrapConfig::new(id.clone(), r, nranks)
                        .with_timeout(Duration::from_secs(60))
                        .with_host_id("gpu-check");
                    let options = CommOptions::default().with_device_timeout(TIMEOUT);
                    let comm = Communicator::init_with(&config, device, &options).map_err(err)?;
                    let kernel = comm
                        .load_kernel(&DEVICE_IMAGE, "symcomm_collective_f32")
                        .map_err(err)?;
                    let share = comm.co_resident_share(&kernel, 512, 0).map_err(err)?;
                    let w = comm.alloc_window::<f32>(count).map_err(err)?;
                    let stream = comm.create_stream().map_err(err)?;
                    let kargs = KernelArgs::new()
                        .arg(&comm.device_handle().map_err(err)?)
                        .arg(&support::one_shot_sum_f32(
                            w.device_handle().raw(),
                            w.device_handle().raw(),
                            0,
                        ));
                    let big = LaunchConfig::linear(share + 1, 512).co_resident();
                    // SAFETY: refused before launching (checked below).
                    match unsafe { comm.launch(&stream, &kernel, big, &kargs) } {
                        Err(symcomm::Error::InvalidArgument(_)) => {}
                        other => return Err(format!("launch beyond the share: {other:?}")),
                    }
                    let mine: Vec<f32> =
                        (0..count).map(|i| ((i + r as usize) % 7) as f32).collect();
                    w.write(0, &mine).map_err(err)?;
                    comm.barrier().map_err(err)?;
                    comm.all_reduce(&w, &w, count, DataType::F32, RedOp::Sum, &stream)
                        .map_err(err)?;
                    stream.synchronize().map_err(err)?;
                    comm.check_error().map_err(err)?;
                    let mut got = vec![0f32; count];
                    w.read(0, &mut got).map_err(err)?;
                    let wrong = (0..count)
                        .filter(|&i| {
                            let want: usize = (0..nranks as usize).map(|p| (i + p) % 7).sum();
                            got[i].to_bits() != (want as f32).to_bits()
                        })
                        .count();
                    Ok((share, wrong))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    });
    let mut detail = Vec::new();
    let mut ok = true;
    for (r, res) in per_rank.iter().enumerate() {
        match res {
            Ok((share, wrong)) => {
                detail.push(format!("rank {r}: share {share}, #wrong {wrong}"));
                ok &= *wrong == 0;
            }
            Err(e) => {
                detail.push(format!("rank {r}: {e}"));
                ok = false;
            }
        }
    }
    if ok {
        Ok((detail.join("; "), Value::Null))
    } else {
        Err(detail.join("; "))
    }
}

/// Rank 0 on `device`, rank 1 on the emulator: init fails on both with `Mismatch`.
pub(crate) fn comm_mixed_devices_check(device: symcomm::Device) -> Outcome {
    let id = symcomm::UniqueId::new_on("127.0.0.1".parse().map_err(err)?).map_err(err)?;
    let results: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = [device, symcomm::Device::Emu]
            .into_iter()
            .enumerate()
            .map(|(r, d)| {
                let id = &id;
                s.spawn(move || {
                    let config = symcomm::bootstrap::BootstrapConfig::new(id.clone(), r as u32, 2)
                        .with_timeout(Duration::from_secs(30))
                        .with_host_id("gpu-check");
                    match symcomm::Communicator::init_with(
                        &config,
                        d,
                        &symcomm::CommOptions::default(),
                    ) {
                        Ok(_) => "initialized".to_owned(),
                        Err(e @ symcomm::Error::Mismatch { .. }) => format!("Mismatch: {e}"),
                        Err(e) => format!("other error: {e}"),
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| "panicked".into()))
            .collect()
    });
    if results.iter().all(|r| r.starts_with("Mismatch")) {
        Ok((results.join("; "), Value::Null))
    } else {
        Err(results.join("; "))
    }
}

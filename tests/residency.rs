//! Co-residency on the emulator: its residency scheduler (an H200-like emulated GPU: 132 SMs,
//! CTAs admitted in launch order against each SM's room, freed only when they return) makes a
//! launch that needs more co-resident CTAs than the GPU holds fail as it would on the GPU, and
//! the host's co-residency budget keeps symcomm's own launches and users' co-resident launches
//! within it.
//!
//! The tests fill the emulated GPU of this process, so they run one at a time (`SERIAL`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mod.rs"]
mod support;

use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};
use support::with_ranks_using;

use symcomm::tune;
use symcomm::{CommOptions, DataType, Error, KernelArgs, LaunchConfig, RedOp, Window};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The emulated GPU: H200-like by default, and its configuration refused while in use.
#[test]
fn emulated_gpu_defaults_and_configuration() {
    let _s = serial();
    let g = symcomm_device::emu::query_gpu(0).unwrap();
    assert_eq!((g.sms, g.ctas_per_sm), (132, 32), "{g:?}");
    // Another GPU of the process can be configured while idle, and reports it.
    symcomm_device::emu::configure_gpu(9, 4, 2).unwrap();
    let g9 = symcomm_device::emu::query_gpu(9).unwrap();
    assert_eq!((g9.sms, g9.ctas_per_sm, g9.resident), (4, 2, 0));
    for (gpu, sms, per_sm) in [(64, 1, 1), (0, 0, 1), (0, 1025, 1), (0, 1, 0), (0, 1, 65)] {
        let e = symcomm_device::emu::configure_gpu(gpu, sms, per_sm).unwrap_err();
        assert!(e.to_string().contains("emulated GPU"), "{e}");
    }
    assert!(symcomm_device::emu::query_gpu(64).is_err());
}

/// What the budget is on the H200-like emulated GPU: the built-in collective kernels take a
/// whole SM per CTA of 512 threads (more than 64 registers per thread), so the share of each
/// (rank, lane) is 132 / (ranks x 2).
#[test]
fn shares_on_an_h200_like_gpu() {
    let _s = serial();
    for (n, want) in [(1u32, 66u32), (2, 33), (4, 16), (8, 8)] {
        let got = with_ranks_using(
            n,
            &CommOptions::default().with_device_timeout(Duration::from_secs(30)),
            |comm| {
                assert_eq!(comm.gpu_ranks(), n);
                let k = comm
                    .load_kernel(&symcomm::DEVICE_IMAGE, "symcomm_collective_f32")
                    .unwrap();
                assert_eq!(k.occupancy(tune::CUDA_THREADS, 0).unwrap(), 1);
                assert_eq!(k.resident_ctas(tune::CUDA_THREADS, 0).unwrap(), 132);
                comm.co_resident_share(&k, tune::CUDA_THREADS, 0).unwrap()
            },
        );
        assert!(got.iter().all(|&s| s == want), "n={n}: {got:?}");
    }
}

/// A planted launch that cannot be co-resident: 4 ranks each launch the built-in all-reduce
/// with 64 CTAs of 512 threads, uncapped (straight on the stream). 3 ranks' grids fill the 132
/// SMs, so no CTA index is resident on every rank: every resident CTA waits for a peer that can
/// never be admitted, and the bounded waits report a Timeout on every rank instead of hanging.
/// The same launch through `Communicator::launch` as a co-resident launch is refused up front,
/// naming the budget; at the budget it runs.
#[test]
fn planted_launch_beyond_the_budget_is_reported() {
    let _s = serial();
    const N: u32 = 4;
    const CTAS: u32 = 64;
    let timeout = Duration::from_secs(3);
    let count: u64 = u64::from(CTAS) * 16 * 1024; // 64 KiB of f32 per CTA
    let results = with_ranks_using(
        N,
        &CommOptions::default().with_device_timeout(timeout),
        |comm| {
            let kernel = comm
                .load_kernel(&symcomm::DEVICE_IMAGE, "symcomm_collective_f32")
                .unwrap();
            let stream = comm.create_stream().unwrap();
            let src = comm.alloc_window::<f32>(count as usize).unwrap();
            let dst = comm.alloc_window::<f32>(count as usize).unwrap();
            let dev = comm.device_handle().unwrap();
            let args = support::one_shot_sum_f32(
                src.device_handle().raw(),
                dst.device_handle().raw(),
                count,
            );
            let kargs = KernelArgs::new().arg(&dev).arg(&args);
            let threads = tune::CUDA_THREADS;
            let share = comm.co_resident_share(&kernel, threads, 0).unwrap();

            // Refused before anything runs, with the budget named.
            let big = LaunchConfig::linear(CTAS, threads).co_resident();
            // SAFETY: (DevComm, CollArgs) by value; the windows outlive the stream's work (it is
            // synchronized below, before they drop).
            let refused = unsafe { comm.launch(&stream, &kernel, big, &kargs) }.unwrap_err();
            let msg = refused.to_string();
            assert!(
                matches!(refused, Error::InvalidArgument(_))
                    && msg.contains(&format!("{share} such CTAs")),
                "{msg}"
            );
            // At the budget it runs (every rank the same grid).
            comm.barrier().unwrap();
            let fits = LaunchConfig::linear(share, threads).co_resident();
            // SAFETY: as above.
            unsafe { comm.launch(&stream, &kernel, fits, &kargs) }.unwrap();
            stream.synchronize().unwrap();
            comm.check_error().unwrap();

            // The planted launch: all ranks at once, uncapped.
            comm.barrier().unwrap();
            let t = Instant::now();
            // SAFETY: as above.
            unsafe { stream.launch(&kernel, LaunchConfig::linear(CTAS, threads), &kargs) }.unwrap();
            let synced = stream.synchronize();
            let outcome = synced.and_then(|()| comm.check_error());
            (outcome, t.elapsed())
        },
    );
    for (r, (outcome, took)) in results.iter().enumerate() {
        match outcome {
            Err(e) if e.to_string().contains("timeout") => {}
            other => panic!("rank {r}: expected a timeout, got {other:?}"),
        }
        // Bounded: each wait gives up at the timeout, and the CTAs admitted after the first
        // ones retired give up within a few more.
        assert!(*took < timeout * 8, "rank {r}: {took:?}");
    }
}

/// Two ranks of one communicator on one stream: the kernel queued first would wait for its
/// peer's, queued behind it on the same stream, until the timeout. The second rank to claim the
/// stream is refused before anything runs, its peer fails the same call (PeerFailed) instead of
/// waiting, and the call then goes through with a stream per rank.
#[test]
fn two_ranks_on_one_stream_are_refused() {
    let _s = serial();
    let shared = symcomm::Stream::new(&symcomm::Backend::Emu).unwrap();
    let results = with_ranks_using(
        2,
        &CommOptions::default().with_device_timeout(Duration::from_secs(20)),
        |comm| {
            let (f32t, sum) = (symcomm::DataType::F32, symcomm::RedOp::Sum);
            let w = comm.alloc_window::<f32>(1024).unwrap();
            w.write(0, &vec![1.0f32 + comm.rank() as f32; 1024])
                .unwrap();
            let refused = comm.all_reduce(&w, &w, 1024, f32t, sum, &shared).err();
            let own = comm.create_stream().unwrap();
            comm.all_reduce(&w, &w, 1024, f32t, sum, &own).unwrap();
            own.synchronize().unwrap();
            comm.check_error().unwrap();
            let mut out = vec![0f32; 1024];
            w.read(0, &mut out).unwrap();
            (refused.map(|e| e.to_string()), out)
        },
    );
    let errors: Vec<&str> = results.iter().filter_map(|(e, _)| e.as_deref()).collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("of the same communicator already runs collectives")),
        "{errors:?}"
    );
    for (r, (_, out)) in results.iter().enumerate() {
        assert!(out.iter().all(|&v| v == 3.0), "rank {r}: {:?}", &out[..4]);
    }
}

/// Freeing memory synchronizes the GPU on CUDA (`cuMemUnmap`), and the emulator models that
/// wait. Rank 0 drops a window and starts its next all-reduce while rank 1 is still before its
/// own drop: a free that waited for the GPU there would wait for rank 0's queued all-reduce,
/// which waits for rank 1's, which rank 1 cannot launch until its free returned — a hang until
/// the device timeout (the failure before frees waited for an idle moment).
#[test]
fn freeing_a_window_never_waits_for_a_peers_queued_collective() {
    let _s = serial();
    let n = 512usize;
    let results = with_ranks_using(
        2,
        &CommOptions::default().with_device_timeout(Duration::from_secs(5)),
        |comm| {
            let stream = comm.create_stream().unwrap();
            let r = comm.rank() as u64;
            let a = comm.alloc_window::<u64>(n).unwrap();
            let b = comm.alloc_window::<u64>(n).unwrap();
            let input: Vec<u64> = (0..n as u64).map(|i| i * 3 + r).collect();
            a.write(0, &input).unwrap();
            let sum =
                |x: &Window<u64>| comm.all_reduce(x, x, n, DataType::U64, RedOp::Sum, &stream);
            sum(&a).unwrap();
            if r == 1 {
                // Rank 0 frees and queues its next all-reduce first.
                thread::sleep(Duration::from_millis(300));
            }
            let start = Instant::now();
            drop(b);
            sum(&a).unwrap();
            stream.synchronize().unwrap();
            comm.check_error()
                .unwrap_or_else(|e| panic!("rank {r}: after drop + all-reduce: {e}"));
            (a.to_vec().unwrap(), start.elapsed())
        },
    );
    // Two in-place sums of 2 ranks: (2i*3 + 1) * 2.
    let want: Vec<u64> = (0..n as u64).map(|i| (i * 6 + 1) * 2).collect();
    for (r, (got, elapsed)) in results.iter().enumerate() {
        assert_eq!(got, &want, "rank {r}");
        assert!(
            *elapsed < Duration::from_secs(4),
            "rank {r}: drop + all-reduce took {elapsed:?}"
        );
    }
}

/// A rank's one-shot sum all-reduce of `w` in place with `kernel` (`symcomm_collective_f32`),
/// launched through the communicator on 2 co-resident CTAs, then waited for.
fn one_shot_with(
    comm: &symcomm::Communicator,
    kernel: &symcomm::Kernel,
    w: &Window<f32>,
    n: usize,
    stream: &symcomm::Stream,
) -> symcomm::Result<()> {
    let raw = w.device_handle().raw();
    let args = KernelArgs::new()
        .arg(&comm.device_handle()?)
        .arg(&support::one_shot_sum_f32(raw, raw, n as u64));
    // SAFETY: the kernel takes (DevComm, CollArgs); the window and the communicator outlive the
    // launch, which is waited for below.
    unsafe {
        comm.launch(
            stream,
            kernel,
            LaunchConfig::linear(2, 64).co_resident(),
            &args,
        )
    }?;
    stream.synchronize()?;
    comm.check_error()
}

/// A copy of symcomm's image whose modules are new to the process (the same code under other
/// module descriptions): loading it is loading new code.
fn fresh_image() -> &'static symcomm::DeviceImage {
    let modules: Vec<symcomm_device::image::Module> = symcomm::DEVICE_IMAGE
        .modules
        .iter()
        .map(|m| symcomm_device::image::Module {
            source: m.source,
            source_name: m.source_name,
            fatbin: m.fatbin,
            kernels: m.kernels,
        })
        .collect();
    Box::leak(Box::new(symcomm::DeviceImage {
        modules: Box::leak(modules.into_boxed_slice()),
        ..symcomm::DEVICE_IMAGE
    }))
}

/// Loading code may wait for the GPU to go idle (CUDA's lazy loading: seen on an H200, where
/// ranks as threads that each loaded the collectives' module and launched at once timed out), and
/// the emulator models that wait. Rank 0 launches a one-shot all-reduce, which waits for rank 1's;
/// rank 1 loads the same kernel only then: a load that waited for the GPU would wait for rank 0's
/// kernel until its device timeout. symcomm loads each module once per process (its own kernels
/// at init), so rank 1's load is a lookup and both finish at once.
#[test]
fn loading_a_loaded_kernel_never_waits_for_a_peers_queued_collective() {
    let _s = serial();
    let n = 1000usize;
    let results = with_ranks_using(
        2,
        &CommOptions::default().with_device_timeout(Duration::from_secs(5)),
        |comm| {
            let r = comm.rank();
            let stream = comm.create_stream().unwrap();
            let w = comm.alloc_window::<f32>(n).unwrap();
            let mine: Vec<f32> = (0..n).map(|i| (i % 13) as f32 + r as f32).collect();
            w.write(0, &mine).unwrap();
            comm.barrier().unwrap();
            if r == 1 {
                // Rank 0 loads and queues its all-reduce first.
                thread::sleep(Duration::from_millis(300));
            }
            let start = Instant::now();
            let kernel = comm
                .load_kernel(&symcomm::DEVICE_IMAGE, "symcomm_collective_f32")
                .unwrap();
            let loaded = start.elapsed();
            one_shot_with(&comm, &kernel, &w, n, &stream)
                .unwrap_or_else(|e| panic!("rank {r}: {e}"));
            (w.to_vec().unwrap(), loaded, start.elapsed())
        },
    );
    let want: Vec<f32> = (0..n).map(|i| 2.0 * (i % 13) as f32 + 1.0).collect();
    for (r, (got, loaded, total)) in results.iter().enumerate() {
        assert_eq!(got, &want, "rank {r}");
        assert!(
            *loaded < Duration::from_secs(1),
            "rank {r}: the load took {loaded:?}"
        );
        assert!(
            *total < Duration::from_secs(4),
            "rank {r}: load + all-reduce took {total:?}"
        );
    }
}

/// The planted counterpart: rank 1 loads code the process has never loaded (a fresh copy of the
/// image) while rank 0's all-reduce waits for it. The emulator's load waits for the GPU like the
/// driver's, so rank 0's kernel runs into its device timeout and rank 1's load returns only then —
/// a bounded failure, which is what the GPU does and what symcomm's preloading avoids.
#[test]
fn planted_loading_new_code_while_a_peer_waits_times_out() {
    let _s = serial();
    let n = 1000usize;
    let timeout = Duration::from_secs(2);
    let fresh = fresh_image();
    let results = with_ranks_using(
        2,
        &CommOptions::default().with_device_timeout(timeout),
        |comm| {
            let r = comm.rank();
            let stream = comm.create_stream().unwrap();
            let w = comm.alloc_window::<f32>(n).unwrap();
            comm.barrier().unwrap();
            let image = if r == 1 {
                thread::sleep(Duration::from_millis(300));
                fresh
            } else {
                &symcomm::DEVICE_IMAGE
            };
            let start = Instant::now();
            let kernel = comm.load_kernel(image, "symcomm_collective_f32").unwrap();
            let loaded = start.elapsed();
            (one_shot_with(&comm, &kernel, &w, n, &stream), loaded)
        },
    );
    let (rank0, _) = &results[0];
    assert!(
        matches!(rank0, Err(Error::Timeout { .. })),
        "rank 0 should time out waiting for rank 1, got {rank0:?}"
    );
    let (_, loaded1) = &results[1];
    assert!(
        *loaded1 >= timeout - Duration::from_millis(500),
        "rank 1's load of new code should wait for rank 0's kernel (its timeout), took {loaded1:?}"
    );
}

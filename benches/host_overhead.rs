//! Host-path overhead of one collective call: argument validation, algorithm selection and
//! launch preparation, with the kernel excluded. Measured by issuing calls into a stream that
//! is capturing (a graph records the launch instead of running it), so only the host path is
//! timed; also the same calls issued for real (host path + enqueue, the kernel running
//! concurrently on the emulator's worker) for reference. Target: under 2 us per call on a
//! development machine. Prints figures, asserts nothing.
//!
//! `cargo bench --bench host_overhead` (2 ranks as threads, emulator; `SYMCOMM_DEVICE=cuda:0`
//! measures the CUDA path where a GPU is present).

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use symcomm::bootstrap::BootstrapConfig;
use symcomm::{CommOptions, Communicator, DataType, Device, RedOp, UniqueId};

const CALLS: u32 = 20_000;

fn main() -> symcomm::Result<()> {
    let device = Device::from_env()?;
    let id = UniqueId::new_on(IpAddr::V4(Ipv4Addr::LOCALHOST))?;
    let results: Vec<symcomm::Result<Vec<(String, f64)>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2u32)
            .map(|r| {
                let id = &id;
                s.spawn(move || -> symcomm::Result<Vec<(String, f64)>> {
                    let c = BootstrapConfig::new(id.clone(), r, 2)
                        .with_timeout(Duration::from_secs(60));
                    let comm = Communicator::init_with(&c, device, &CommOptions::default())?;
                    measure(&comm)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(symcomm::Error::InvalidArgument("rank panicked".into()))
                })
            })
            .collect()
    });
    for (r, res) in results.into_iter().enumerate() {
        let figures = res?;
        if r == 0 {
            println!(
                "# symcomm host-path overhead per collective call ({CALLS} calls, 2 ranks as threads)"
            );
            for (what, us) in figures {
                println!("{what:<58} {us:>8.3} us/call");
            }
        }
    }
    Ok(())
}

fn measure(comm: &Communicator) -> symcomm::Result<Vec<(String, f64)>> {
    let stream = comm.create_stream()?;
    let a = comm.alloc_window::<f32>(1024)?;
    let b = comm.alloc_window::<f32>(1024)?;
    let buf = comm.alloc_buffer(4096)?;
    // First call: lane setup (staging windows) and kernel loading happen here, not below.
    comm.all_reduce(&a, &b, 1024, DataType::F32, RedOp::Sum, &stream)?;
    stream.synchronize()?;
    comm.barrier()?;
    let mut figures = Vec::new();

    stream.begin_capture()?;
    let t = Instant::now();
    for _ in 0..CALLS {
        comm.all_reduce(&a, &b, 1024, DataType::F32, RedOp::Sum, &stream)?;
    }
    let window = t.elapsed();
    let t = Instant::now();
    for _ in 0..CALLS / 10 {
        comm.all_reduce(&buf, &buf, 1024, DataType::F32, RedOp::Sum, &stream)?;
    }
    let staged = t.elapsed() * 10;
    drop(stream.end_capture()?);
    figures.push((
        "all_reduce, windows: validate + select + prepare (captured)".to_owned(),
        per_call(window),
    ));
    figures.push((
        "all_reduce, device buffer: + staging copies (captured)".to_owned(),
        per_call(staged),
    ));
    let t = Instant::now();
    let mut bad = 0u32;
    for _ in 0..CALLS {
        bad += u32::from(
            comm.all_reduce(&a, &b, usize::MAX, DataType::F64, RedOp::Sum, &stream)
                .is_err(),
        );
    }
    figures.push((
        "all_reduce, refused argument (validation only)".to_owned(),
        per_call(t.elapsed()),
    ));
    assert_eq!(bad, CALLS);
    comm.barrier()?;
    let t = Instant::now();
    for _ in 0..200 {
        comm.all_reduce(&a, &b, 1024, DataType::F32, RedOp::Sum, &stream)?;
    }
    let issued = t.elapsed();
    stream.synchronize()?;
    let run = t.elapsed();
    comm.check_error()?;
    figures.push((
        "all_reduce, issued for real (host path + enqueue)".to_owned(),
        issued.as_secs_f64() * 1e6 / 200.0,
    ));
    figures.push((
        format!(
            "all_reduce, end to end on {} (reference)",
            comm.backend().name()
        ),
        run.as_secs_f64() * 1e6 / 200.0,
    ));
    Ok(figures)
}

fn per_call(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6 / f64::from(CALLS)
}

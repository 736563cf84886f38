//! A fused kernel written in Rust on symcomm windows: all-reduce + bias + GELU
//! (`device/src/lib.rs`, `allreduce_bias_gelu`), compiled to PTX by `build.rs` with symcomm's
//! build helper and launched on N ranks — on the emulator here (the same Rust code, built for the
//! host), unchanged on a GPU.
//!
//! ```text
//! cargo run --release -p rust-kernel -- [--ranks N] [--rows R] [--cols C] [--iters K] [--compare-builtin]
//!     N ranks as threads of this process (default 4)
//! symcomm launch -n N target/release/rust-kernel [--rows R] ...
//!     N ranks as processes (the launcher's variables are read by Communicator::from_env)
//! ```
//! `SYMCOMM_DEVICE` picks the backend (`auto`: a GPU if there is one, else the emulator;
//! `emu`; `cuda:<n>`). Every rank checks its output against a host reference, bit for bit, and
//! prints `#wrong`; the exit status is non-zero if any element is wrong or anything fails.
//!
//! `--compare-builtin` then runs the device library's all-reduce from a Rust kernel
//! (`rust_all_reduce`, one-shot and two-shot) against the host collective (the built-in C++
//! kernel) on the same windows, 4 KiB..64 MiB: results bit for bit equal, time per call printed
//! with the ratio Rust / built-in.

use std::net::{IpAddr, Ipv4Addr};
use std::process::ExitCode;
use std::time::Instant;

use symcomm::bootstrap::BootstrapConfig;
use symcomm::{CommOptions, Communicator, Device, KernelArgs, LaunchConfig, Result, UniqueId};
use tracing_subscriber::filter::LevelFilter;

include!(concat!(env!("OUT_DIR"), "/rust_kernel_device_image.rs"));

#[derive(Debug, Clone, Copy)]
struct Shape {
    rows: u32,
    cols: u32,
    iters: u32,
    compare_builtin: bool,
}

/// Rank `rank`'s partial product: small integers, so every sum is exact in f32.
fn partial(rank: u32, i: usize) -> f32 {
    ((i * 7 + rank as usize * 13) % 29) as f32 - 14.0
}

fn bias(col: usize) -> f32 {
    (col % 5) as f32 - 2.0
}

/// The unfused reference: sum over ranks in rank order, plus bias, through the same GELU (the
/// kernel crate's, built for the host: bit-identical arithmetic on every target).
fn reference(nranks: u32, shape: Shape, i: usize) -> f32 {
    let sum = (0..nranks).fold(0.0f32, |acc, r| acc + partial(r, i));
    rust_kernel_device::gelu(sum + bias(i % shape.cols as usize))
}

/// One rank: windows, inputs, `iters` launches, the check. Returns #wrong.
fn run_rank(comm: &Communicator, shape: Shape) -> Result<usize> {
    let n = shape.rows as usize * shape.cols as usize;
    let rank = comm.rank();
    let partials = comm.alloc_window::<f32>(n)?;
    let biases = comm.alloc_window::<f32>(shape.cols as usize)?;
    let out = comm.alloc_window::<f32>(n)?;
    partials.write(0, &(0..n).map(|i| partial(rank, i)).collect::<Vec<_>>())?;
    biases.write(0, &(0..shape.cols as usize).map(bias).collect::<Vec<_>>())?;

    let stream = comm.create_stream()?;
    let kernel = comm.load_kernel(&DEVICE_IMAGE, "allreduce_bias_gelu")?;
    let args = KernelArgs::new()
        .arg(&comm.device_handle()?)
        .arg(&partials.device_handle())
        .arg(&biases.device_handle())
        .arg(&out.device_handle())
        .arg(&shape.rows)
        .arg(&shape.cols)
        // The first of the users' barrier indices: the host's collectives use the ones below.
        .arg(&symcomm::abi::SYMCOMM_USER_BARRIER_FIRST);
    let config = LaunchConfig::linear(shape.rows.clamp(1, 32), 128);
    let start = Instant::now();
    for _ in 0..shape.iters {
        // SAFETY: the arguments match the kernel's parameters in order and type (DevComm, three
        // WindowHandle<f32>, three u32), and the windows and the communicator outlive
        // the launches: the stream is synchronized below, before they drop.
        unsafe { stream.launch(&kernel, config, &args) }?;
    }
    stream.synchronize()?;
    let elapsed = start.elapsed();
    comm.check_error()?;

    let got = out.to_vec()?;
    let wrong = (0..n)
        .filter(|&i| got[i].to_bits() != reference(comm.nranks(), shape, i).to_bits())
        .count();
    let checksum: f64 = got.iter().map(|&v| f64::from(v)).sum();
    let wrong = if shape.compare_builtin {
        wrong + compare_builtin(comm)?
    } else {
        wrong
    };
    println!(
        "rank {rank}/{} on {}: {} x {} f32, {} launches in {:.2} ms, checksum {checksum}, #wrong {wrong}",
        comm.nranks(),
        comm.backend().name(),
        shape.rows,
        shape.cols,
        shape.iters,
        elapsed.as_secs_f64() * 1e3,
    );
    Ok(wrong)
}

/// The Rust kernel `rust_all_reduce` (the device library's grid-scope all-reduce called from
/// Rust) against the host collective on the same windows: bit-exact, timed. Returns #wrong.
fn compare_builtin(comm: &Communicator) -> Result<usize> {
    const MAX: usize = 16 << 20; // 64 MiB of f32
    let src = comm.alloc_window::<f32>(MAX)?;
    let dst = comm.alloc_window::<f32>(MAX)?;
    let rank = comm.rank();
    // Small integers: every sum is exact, so every algorithm gives the same bits.
    src.write(
        0,
        &(0..MAX)
            .map(|i| ((i * 3 + rank as usize * 7) % 17) as f32)
            .collect::<Vec<_>>(),
    )?;
    let stream = comm.create_stream()?;
    let kernel = comm.load_kernel(&DEVICE_IMAGE, "rust_all_reduce")?;
    let threads = 256;
    // Grid-scope collectives wait across CTAs and ranks: a co-resident grid, within this rank's
    // share of its GPU, and at most 32 CTAs (barrier indices from SYMCOMM_USER_BARRIER_FIRST).
    let ctas = comm.co_resident_share(&kernel, threads, 0)?.min(32);
    let mut wrong = 0;
    let mut count = 1024usize;
    while count <= MAX {
        let iters = if count <= 1 << 16 { 20 } else { 5 };
        let time = |run: &dyn Fn() -> Result<()>| -> Result<f64> {
            run()?; // warm-up
            stream.synchronize()?;
            comm.barrier()?;
            let start = Instant::now();
            for _ in 0..iters {
                run()?;
            }
            stream.synchronize()?;
            Ok(start.elapsed().as_secs_f64() * 1e6 / f64::from(iters))
        };
        let builtin_us = time(&|| {
            comm.all_reduce(
                &src,
                &dst,
                count,
                symcomm::DataType::F32,
                symcomm::RedOp::Sum,
                &stream,
            )
        })?;
        let mut want = vec![0.0f32; count];
        dst.read(0, &mut want)?;
        let mut rust_us = [0.0f64; 2];
        for algo in 0..2u32 {
            let count64 = count as u64;
            let args = KernelArgs::new()
                .arg(&comm.device_handle()?)
                .arg(&src.device_handle())
                .arg(&dst.device_handle())
                .arg(&count64)
                .arg(&0u32)
                .arg(&algo)
                .arg(&symcomm::abi::SYMCOMM_USER_BARRIER_FIRST);
            let config = LaunchConfig::linear(ctas, threads).co_resident();
            // SAFETY: the arguments match rust_all_reduce's parameters (DevComm, two
            // WindowHandle<f32>, u64, three u32), and the windows outlive the launches (the
            // stream is synchronized in `time`).
            rust_us[algo as usize] =
                time(&|| unsafe { comm.launch(&stream, &kernel, config, &args) })?;
            comm.check_error()?;
            let mut got = vec![0.0f32; count];
            dst.read(0, &mut got)?;
            wrong += (0..count)
                .filter(|&i| got[i].to_bits() != want[i].to_bits())
                .count();
        }
        if rank == 0 {
            println!(
                "compare-builtin {:>10} B  built-in {:>9.1} us  rust one-shot {:>9.1} us ({:.2}x)  rust two-shot {:>9.1} us ({:.2}x)",
                count * 4,
                builtin_us,
                rust_us[0],
                rust_us[0] / builtin_us,
                rust_us[1],
                rust_us[1] / builtin_us
            );
        }
        count *= 16;
    }
    Ok(wrong)
}

fn parse_args() -> std::result::Result<(u32, Shape), String> {
    let mut ranks = 4;
    let mut shape = Shape {
        rows: 48,
        cols: 1000,
        iters: 3,
        compare_builtin: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = |name: &str| -> std::result::Result<u32, String> {
            let v = args.next().ok_or(format!("{name} needs a value"))?;
            v.parse()
                .ok()
                .filter(|&x| x > 0)
                .ok_or(format!("{name} {v}: expected a positive integer"))
        };
        if flag == "--compare-builtin" {
            shape.compare_builtin = true;
            continue;
        }
        match flag.as_str() {
            "--ranks" => ranks = value("--ranks")?,
            "--rows" => shape.rows = value("--rows")?,
            "--cols" => shape.cols = value("--cols")?,
            "--iters" => shape.iters = value("--iters")?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok((ranks, shape))
}

/// symcomm only emits `tracing` events (targets `symcomm::<subsystem>`); a program shows them by
/// installing a subscriber. This one prints to stderr at the level `SYMCOMM_LOG` names
/// (`off`, `error`, `warn` (default), `info`, `debug`, `trace`).
fn init_logging() -> std::result::Result<(), String> {
    let level = match std::env::var("SYMCOMM_LOG") {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<LevelFilter>()
            .map_err(|e| format!("SYMCOMM_LOG={v}: {e}"))?,
        _ => LevelFilter::WARN,
    };
    // An already-installed subscriber is fine.
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .try_init();
    Ok(())
}

fn main() -> ExitCode {
    if let Err(e) = init_logging() {
        eprintln!("rust-kernel: {e}");
        return ExitCode::from(2);
    }
    let (ranks, shape) = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rust-kernel: {e}");
            return ExitCode::from(2);
        }
    };
    let launched = std::env::var_os("RANK").is_some() || std::env::var_os("SYMCOMM_ID").is_some();
    let results: Vec<Result<usize>> = if launched {
        // One rank of a launched job (symcomm launch, torchrun, mpirun, srun).
        vec![Communicator::from_env().and_then(|comm| run_rank(&comm, shape))]
    } else {
        // Ranks as threads of this process.
        let device = match Device::from_env() {
            Ok(d) => d,
            Err(e) => {
                eprintln!("rust-kernel: {e}");
                return ExitCode::from(2);
            }
        };
        let id = match UniqueId::new_on(IpAddr::V4(Ipv4Addr::LOCALHOST)) {
            Ok(id) => id,
            Err(e) => {
                eprintln!("rust-kernel: {e}");
                return ExitCode::FAILURE;
            }
        };
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..ranks)
                .map(|r| {
                    let id = &id;
                    s.spawn(move || {
                        let config = BootstrapConfig::new(id.clone(), r, ranks);
                        let comm =
                            Communicator::init_with(&config, device, &CommOptions::from_env()?)?;
                        run_rank(&comm, shape)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(symcomm::Error::InvalidArgument(
                            "rank thread panicked".into(),
                        ))
                    })
                })
                .collect()
        })
    };
    let mut ok = true;
    for r in results {
        match r {
            Ok(0) => {}
            Ok(wrong) => {
                eprintln!("rust-kernel: {wrong} wrong elements");
                ok = false;
            }
            Err(e) => {
                eprintln!("rust-kernel: {e}");
                ok = false;
            }
        }
    }
    if ok {
        println!("rust-kernel: PASS");
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

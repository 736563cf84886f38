//! A fused kernel written in Rust on symcomm windows: all-reduce + bias + GELU
//! (`device/src/lib.rs`, `allreduce_bias_gelu`), compiled to PTX by `build.rs` with symcomm's
//! build helper and launched on N ranks — on the emulator here (the same Rust code, built for the
//! host), unchanged on a GPU.
//!
//! ```text
//! cargo run --release -p rust-kernel -- [--ranks N] [--rows R] [--cols C] [--iters K]
//!     N ranks as threads of this process (default 4)
//! symcomm launch -n N target/release/rust-kernel [--rows R] ...
//!     N ranks as processes (the launcher's variables are read by Communicator::from_env)
//! ```
//! `SYMCOMM_DEVICE` picks the backend (`auto`: a GPU if there is one, else the emulator;
//! `emu`; `cuda:<n>`). Every rank checks its output against a host reference, bit for bit, and
//! prints `#wrong`; the exit status is non-zero if any element is wrong or anything fails.

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

fn parse_args() -> std::result::Result<(u32, Shape), String> {
    let mut ranks = 4;
    let mut shape = Shape {
        rows: 48,
        cols: 1000,
        iters: 3,
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

//! The `symcomm` command-line tool.
//!
//! `symcomm info` — version, embedded device code, available backends, tunables.
//! `symcomm launch -n N PROGRAM [ARGS]...` — runs N ranks of a program on this machine.
//! `symcomm perf [COLLECTIVE] [OPTIONS]` — nccl-tests compatible benchmark of the collectives.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod info;
mod launch;
mod perf;

/// symcomm: device-initiated GPU communication.
#[derive(Debug, Parser)]
#[command(name = "symcomm", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the version, the embedded device code (architectures, PTX ISA, per-kernel registers,
    /// spills and shared memory), the nvcc that built it, the backends available here (CUDA
    /// driver, GPUs, peer access; the emulator) and the tunables.
    Info {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run N copies of PROGRAM on this machine as ranks 0..N of one job.
    ///
    /// Each rank gets a fresh bootstrap id (root 127.0.0.1, new secret) in SYMCOMM_ID, and
    /// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and SYMCOMM_LAUNCHER=symcomm. Output lines
    /// are prefixed with `[rank] `; SIGINT and SIGTERM are forwarded to every rank. When a rank
    /// fails, the others get SIGTERM (SIGKILL after --grace-ms) and the launcher exits with the
    /// failing rank's status (128 + S for signal S); 124 after --timeout; 2 for bad arguments.
    Launch(launch::LaunchArgs),
    /// Benchmark a collective like nccl-tests: the same options (-b -e -f -i -n -m -w -N -c -o
    /// -d -r -z -G -C -a -J -g), the same table (size, count, type, redop, root, then time,
    /// algbw, busbw and #wrong out of place and in place) and busbw factors, every result
    /// checked.
    ///
    /// Ranks are -t threads of this process (default 4), or, under `symcomm launch` / torchrun
    /// (RANK set), this process is one rank and rank 0 prints. Exit status as nccl-tests'
    /// testResult_t: 0 success, 1 internal error, 2 device (CUDA/emulator) error, 3
    /// communicator error, 4 timeout, 5 not implemented, 6 bad arguments, 7 wrong results
    /// (#wrong > 0) or an average bus bandwidth below 0.9 × NCCL_TESTS_MIN_BW.
    ///
    /// nccl-tests options also accepted: -m (calls per iteration), -N (sweeps), -z (blocking),
    /// -G (graph launches), -C (CPU time), -a (how ranks' times combine), -J (JSON file),
    /// -g 1, -r -1 (every root); an option given twice takes its last value.
    Perf(perf::PerfArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // `symcomm perf` exits with nccl-tests' testInvalidUsage (6) for bad arguments, clap's
        // included; --help and --version print and exit 0 as usual.
        Err(e) if e.use_stderr() && std::env::args().nth(1).as_deref() == Some("perf") => {
            let _ = e.print();
            return ExitCode::from(perf::INVALID_USAGE);
        }
        Err(e) => e.exit(),
    };
    if let Err(e) = symcomm::log::init() {
        eprintln!("symcomm: logging setup: {e}");
        return ExitCode::from(2);
    }
    match cli.command {
        Command::Info { json } => info::run(json),
        Command::Launch(args) => launch::run(&args),
        Command::Perf(args) => perf::run(&args),
    }
}

//! The `symcomm` command-line tool.
//!
//! `symcomm info` — version, embedded device code, available backends, tunables.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod info;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = symcomm::log::init() {
        eprintln!("symcomm: {e}");
        return ExitCode::from(2);
    }
    match cli.command {
        Command::Info { json } => info::run(json),
    }
}

//! Reference sweeps of every host collective on the emulator (4 ranks as threads, 8 B..1 MiB),
//! printed in nccl-tests columns by `symcomm perf`: figures for comparing emulator changes, not
//! GPU performance. Nothing is asserted beyond `symcomm perf`'s own data check (#wrong).
//!
//! `cargo bench --bench emu_sweep`

use std::process::Command;

fn main() {
    let mut failed = Vec::new();
    for coll in [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "reduce",
        "scatter",
        "all_to_all",
        "sendrecv",
    ] {
        println!("## {coll}");
        let status = Command::new(env!("CARGO_BIN_EXE_symcomm"))
            .args(["perf", coll, "-t", "4", "-b", "8", "-e", "1M", "-f", "8"])
            .args(["-n", "5", "-w", "1", "--device", "emu"])
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => failed.push(format!("{coll}: {s}")),
            Err(e) => failed.push(format!("{coll}: {e}")),
        }
    }
    if !failed.is_empty() {
        eprintln!("emu_sweep: failed: {}", failed.join("; "));
        std::process::exit(1);
    }
}

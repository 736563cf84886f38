//! Communicators with ranks as separate processes, on the emulator. A plain `main` (harness =
//! false): run without `SYMCOMM_TEST_ROLE` it is the parent and runs each scenario, starting
//! copies of this executable as the ranks (directly, or through `symcomm launch`); with it set,
//! it is one rank (`from_env`). Prints `PASS`/`FAIL` per scenario, exits non-zero on failure.
//!
//! - windows across processes: memfds passed with SCM_RIGHTS, every rank reads every other
//!   rank's copy and runs the built-in all-reduce on them (#wrong = 0), directly and via
//!   `symcomm launch -n 3`;
//! - `kill -9` of a non-root rank and of the root while the others wait in a collective: every
//!   survivor returns `PeerLost` naming it within a few seconds and exits cleanly;
//! - `SIGSTOP` of a rank (alive but silent): the survivors' heartbeat check declares it lost.
//!
//! Spawning, collecting and the fault runs are in `tests/support/procs.rs`, shared with the
//! reliability scoreboard (`reliability.rs`), which runs each fault several times and more kinds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../tests/support/mod.rs"]
mod support;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use support::procs::{self, Fault, ROLE};

const COUNT: usize = 4099;

fn main() -> ExitCode {
    if let Ok(role) = std::env::var(ROLE) {
        return worker(&role);
    }
    type Scenario = fn() -> Result<(), String>;
    let scenarios: [(&str, Scenario); 5] = [
        ("windows_across_processes", windows_across_processes),
        ("windows_via_symcomm_launch", windows_via_symcomm_launch),
        ("kill_9_of_a_rank_while_others_wait", || {
            kill_scenario(2, Fault::Kill)
        }),
        ("kill_9_of_the_root_while_others_wait", || {
            kill_scenario(0, Fault::Kill)
        }),
        ("sigstop_of_a_rank_is_a_missed_heartbeat", || {
            kill_scenario(1, Fault::Stop)
        }),
    ];
    let mut failed = 0;
    for (name, f) in scenarios {
        let t = Instant::now();
        match f() {
            Ok(()) => println!("PASS {name} ({:.2} s)", t.elapsed().as_secs_f64()),
            Err(e) => {
                failed += 1;
                println!("FAIL {name}: {e}");
            }
        }
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

// ------------------------------------------------------------------------------------------
// Ranks
// ------------------------------------------------------------------------------------------

fn worker(role: &str) -> ExitCode {
    if role == "fault" {
        return procs::fault_rank();
    }
    let comm = match procs::init_rank() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let rank = comm.rank();
    let src = comm.alloc_window::<f32>(COUNT).unwrap();
    let dst = comm.alloc_window::<f32>(COUNT).unwrap();
    let value = |r: u32, i: usize| (r * 100 + (i % 89) as u32) as f32;
    match role {
        "windows" => {
            let mine: Vec<f32> = (0..COUNT).map(|i| value(rank, i)).collect();
            src.write(0, &mine).unwrap();
            comm.barrier().unwrap();
            let mut wrong = 0;
            for peer in 0..comm.nranks() {
                let mut got = vec![0f32; COUNT];
                src.read_rank(peer, 0, &mut got).unwrap();
                wrong += (0..COUNT)
                    .filter(|&i| got[i].to_bits() != value(peer, i).to_bits())
                    .count();
            }
            support::all_reduce(&comm, &src, &dst, COUNT as u64).unwrap();
            let got = dst.to_vec().unwrap();
            wrong += (0..COUNT)
                .filter(|&i| {
                    let want: f32 = (0..comm.nranks()).map(|r| value(r, i)).sum();
                    got[i].to_bits() != want.to_bits()
                })
                .count();
            comm.barrier().unwrap();
            // The ranks share the emulated GPU but not a process: `.gpu` scope does not cover
            // their threads (one program's), so the library must synchronize at `.sys`.
            let flags = comm.device_handle().unwrap().flags;
            let scope_ok = comm.gpu_ranks() == comm.nranks()
                && flags & symcomm::abi::SYMCOMM_COMM_SAME_GPU == 0;
            println!(
                "RESULT rank={rank} pid={} wrong={wrong} gpu_ranks={} flags={flags:#x}",
                std::process::id(),
                comm.gpu_ranks()
            );
            if wrong == 0 && scope_ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        other => {
            println!("unknown role {other}");
            ExitCode::from(2)
        }
    }
}

// ------------------------------------------------------------------------------------------
// Parent
// ------------------------------------------------------------------------------------------

fn windows_across_processes() -> Result<(), String> {
    let mut children = procs::spawn_ranks(3, &[(ROLE, "windows".to_owned())]);
    let rx = procs::collect_lines(&mut children);
    let codes = procs::wait_all(
        &mut children,
        Instant::now() + Duration::from_secs(60),
        None,
    )?;
    let mut lines = Vec::new();
    procs::drain_lines(&rx, &mut lines, Duration::from_secs(10));
    let pids: std::collections::BTreeSet<&str> = lines
        .iter()
        .filter_map(|(_, l)| l.split_whitespace().find(|w| w.starts_with("pid=")))
        .collect();
    let ok = lines.iter().filter(|(_, l)| l.contains("wrong=0")).count();
    if codes != vec![0, 0, 0] || ok != 3 || pids.len() != 3 {
        return Err(format!("exit codes {codes:?}, output {lines:?}"));
    }
    Ok(())
}

fn windows_via_symcomm_launch() -> Result<(), String> {
    let exe = std::env::current_exe().unwrap();
    let out = procs::launch(
        env!("CARGO_BIN_EXE_symcomm"),
        &["-n", "3", "--timeout", "60", "--", exe.to_str().unwrap()],
    )
    .env(ROLE, "windows")
    .env("SYMCOMM_DEVICE", "emu")
    .output()
    .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let results: Vec<&str> = text.lines().filter(|l| l.contains("RESULT")).collect();
    let prefixed = (0..3).all(|r| {
        results.iter().any(|l| {
            l.starts_with(&format!("[{r}]"))
                && l.contains(&format!("rank={r} "))
                && l.contains("wrong=0")
        })
    });
    if !out.status.success() || !prefixed {
        return Err(format!(
            "status {:?}, stdout:\n{text}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// Three ranks; `victim` is killed or stopped while the others wait for it in a collective.
/// Every survivor must report `PeerLost { victim }` promptly and exit 0.
fn kill_scenario(victim: u32, fault: Fault) -> Result<(), String> {
    let run = procs::fault_run(3, victim, fault)?;
    let lost: Vec<&String> = run
        .lines
        .iter()
        .filter(|(_, l)| l.starts_with("LOST"))
        .map(|(_, l)| l)
        .collect();
    println!(
        "  {fault:?} rank {victim}: survivors done {:.0} ms after the signal; {lost:?}",
        run.took.as_secs_f64() * 1e3
    );
    Ok(())
}

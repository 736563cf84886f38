//! Communicators with ranks as separate processes, on the emulator. A plain `main` (harness =
//! false): run without `SYMCOMM_TEST_ROLE` it is the parent and runs each scenario, starting
//! copies of this executable as the ranks (directly, or through `symcomm launch`); with it set,
//! it is one rank (`from_env`). Prints `PASS`/`FAIL` per scenario, exits non-zero on failure.
//!
//! - windows across processes: memfds passed with SCM_RIGHTS, every rank reads every other
//!   rank's copy and runs the built-in all-reduce on them (#wrong = 0), directly and via
//!   `symcomm launch -n 3`;
//! - `kill -9` of a non-root rank and of the root while the others wait in a kernel: every
//!   survivor returns `PeerLost` naming it within a few seconds and exits cleanly;
//! - `SIGSTOP` of a rank (alive but silent): the survivors' heartbeat check declares it lost.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../tests/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use symcomm::{Communicator, Error};

const ROLE: &str = "SYMCOMM_TEST_ROLE";
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
            kill_scenario(2, "KILL")
        }),
        ("kill_9_of_the_root_while_others_wait", || {
            kill_scenario(0, "KILL")
        }),
        ("sigstop_of_a_rank_is_a_missed_heartbeat", || {
            kill_scenario(1, "STOP")
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
    let comm = match Communicator::from_env() {
        Ok(c) => c,
        Err(e) => {
            println!("INIT-FAILED {e}");
            return ExitCode::from(3);
        }
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
            println!(
                "RESULT rank={rank} pid={} wrong={wrong}",
                std::process::id()
            );
            if wrong == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        "wait" => {
            let victim: u32 = std::env::var("SYMCOMM_TEST_VICTIM")
                .unwrap()
                .parse()
                .unwrap();
            comm.barrier().unwrap();
            println!("READY rank={rank}");
            if rank == victim {
                std::thread::sleep(Duration::from_secs(60));
                return ExitCode::FAILURE;
            }
            let t = Instant::now();
            // The victim never launches: this waits until its loss raises the abort flag.
            let result = support::all_reduce(&comm, &src, &dst, COUNT as u64);
            let after = t.elapsed().as_millis();
            let checked = comm.check_error();
            let later = comm.barrier();
            println!(
                "LOST rank={rank} after_ms={after} result={result:?} check={checked:?} later={later:?}"
            );
            let named = |r: &symcomm::Result<()>| matches!(r, Err(Error::PeerLost { rank, .. }) if *rank == victim);
            if named(&result) && named(&checked) && named(&later) {
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

/// A fresh root address with a secret, as `symcomm launch` makes it: a free port (bound, read
/// and released here, since rank 0 is another process) and a random secret.
fn fresh_id() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    symcomm::UniqueId::from_parts(port, symcomm::UniqueId::random_secret().unwrap())
        .unwrap()
        .to_string()
}

fn spawn_ranks(n: u32, role: &str, extra: &[(&str, String)]) -> Vec<Child> {
    let exe = std::env::current_exe().unwrap();
    let id = fresh_id();
    (0..n)
        .map(|r| {
            let mut cmd = Command::new(&exe);
            cmd.env(ROLE, role)
                .env("SYMCOMM_ID", &id)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("LOCAL_WORLD_SIZE", n.to_string())
                .env("SYMCOMM_DEVICE", "emu")
                .env("SYMCOMM_INIT_TIMEOUT", "30s")
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            for (k, v) in extra {
                cmd.env(k, v);
            }
            cmd.spawn().unwrap()
        })
        .collect()
}

/// Forwards each child's stdout lines as (rank, line) to one channel.
fn collect_lines(children: &mut [Child]) -> mpsc::Receiver<(usize, String)> {
    let (tx, rx) = mpsc::channel();
    for (r, c) in children.iter_mut().enumerate() {
        let out = c.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((r, line));
            }
        });
    }
    rx
}

/// Waits for every child to exit by `deadline`; kills the rest and fails past it.
fn wait_all(
    children: &mut [Child],
    deadline: Instant,
    skip: Option<usize>,
) -> Result<Vec<i32>, String> {
    let mut codes = vec![None; children.len()];
    loop {
        for (r, c) in children.iter_mut().enumerate() {
            if codes[r].is_none() && Some(r) != skip {
                if let Some(s) = c.try_wait().unwrap() {
                    codes[r] = Some(s.code().unwrap_or(-1));
                }
            }
        }
        if codes
            .iter()
            .enumerate()
            .all(|(r, c)| c.is_some() || Some(r) == skip)
        {
            return Ok(codes.into_iter().map(|c| c.unwrap_or(0)).collect());
        }
        if Instant::now() > deadline {
            for c in children.iter_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            return Err(format!(
                "ranks still running at the deadline (exit codes so far {codes:?})"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn windows_across_processes() -> Result<(), String> {
    let mut children = spawn_ranks(3, "windows", &[]);
    let rx = collect_lines(&mut children);
    let codes = wait_all(
        &mut children,
        Instant::now() + Duration::from_secs(60),
        None,
    )?;
    let lines: Vec<(usize, String)> = rx.try_iter().collect();
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
    let out = Command::new(env!("CARGO_BIN_EXE_symcomm"))
        .args(["launch", "-n", "3", "--timeout", "60", "--"])
        .arg(std::env::current_exe().unwrap())
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

/// Three ranks; `victim` is killed (`KILL`) or stopped (`STOP`) while the others wait for it
/// in a kernel. Every survivor must report `PeerLost { victim }` promptly and exit 0.
fn kill_scenario(victim: u32, how: &str) -> Result<(), String> {
    let peer_timeout_ms = 1500;
    let extra = [
        ("SYMCOMM_TEST_VICTIM", victim.to_string()),
        ("SYMCOMM_HEARTBEAT", "100ms".to_string()),
        ("SYMCOMM_PEER_TIMEOUT", format!("{peer_timeout_ms}ms")),
        // Long device deadline: only the loss may end the survivors' wait.
        ("SYMCOMM_TIMEOUT", "120s".to_string()),
    ];
    let mut children = spawn_ranks(3, "wait", &extra);
    let rx = collect_lines(&mut children);
    let mut ready = 0;
    let mut lines = Vec::new();
    let start = Instant::now();
    while ready < 3 {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok((r, l)) => {
                ready += usize::from(l.starts_with("READY"));
                lines.push((r, l));
            }
            Err(_) => {
                for c in children.iter_mut() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(format!(
                    "ranks not ready after {:?}: {lines:?}",
                    start.elapsed()
                ));
            }
        }
    }
    // Let the survivors enter their wait.
    std::thread::sleep(Duration::from_millis(300));
    let pid = nix::unistd::Pid::from_raw(children[victim as usize].id() as i32);
    let signal = if how == "KILL" {
        nix::sys::signal::Signal::SIGKILL
    } else {
        nix::sys::signal::Signal::SIGSTOP
    };
    let hit = Instant::now();
    nix::sys::signal::kill(pid, signal).map_err(|e| e.to_string())?;
    let codes = wait_all(
        &mut children,
        hit + Duration::from_secs(20),
        Some(victim as usize),
    );
    let took = hit.elapsed();
    // Clean up the victim (stopped or killed).
    let _ = children[victim as usize].kill();
    let _ = children[victim as usize].wait();
    let codes = codes?;
    lines.extend(rx.try_iter());
    let lost: Vec<&String> = lines
        .iter()
        .filter(|(_, l)| l.starts_with("LOST"))
        .map(|(_, l)| l)
        .collect();
    let limit = if how == "KILL" {
        Duration::from_secs(5)
    } else {
        Duration::from_millis(peer_timeout_ms + 5000)
    };
    let survivors_ok = codes
        .iter()
        .enumerate()
        .all(|(r, &c)| r == victim as usize || c == 0);
    if !survivors_ok || lost.len() != 2 || took > limit {
        return Err(format!(
            "{how} of rank {victim}: survivors' exit codes {codes:?} after {took:?} (limit \
             {limit:?}); lines {lines:?}"
        ));
    }
    println!(
        "  {how} rank {victim}: survivors done {:.0} ms after the signal; {lost:?}",
        took.as_secs_f64() * 1e3
    );
    Ok(())
}

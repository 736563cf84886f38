//! Ranks on two "hosts" with separate IP stacks (issue 16): two network namespaces joined by a
//! veth pair (`tests/support/netns.rs`), the ranks `symcomm perf` processes inside them, UCX
//! over TCP on the veth link (no shared memory between the hosts). A plain `main`
//! (harness = false) that prints a `PASS`/`FAIL` line per scenario and exits non-zero when any
//! failed — or when the namespaces cannot be created (root and iproute2 are needed; nothing is
//! skipped).
//!
//! Scenarios:
//! - every collective and send/recv, interleaved 2 + 2 ranks and uneven 1 + 2, every data type
//!   (all-reduce: every operator too), in and out of place, `symcomm perf`'s bit-exact check
//!   (#wrong 0, exit status 0);
//! - faults in the middle of a stream of all-reduces (2 + 2 ranks, `SYMCOMM_HEARTBEAT=100ms`,
//!   `SYMCOMM_PEER_TIMEOUT=1500ms`): `kill -9` of both ranks of host 1, after which host 0's
//!   ranks must fail with a lost peer, and the link taken down, after which every rank must
//!   fail (each side loses the other); each within its bound, never a hang. Detection latency
//!   (from the fault to each survivor's exit, the parent's clock) is printed;
//! - `symcomm launch --nnodes 2 --node-rank K --master-addr ...`, one per host, 2 ranks each,
//!   running an all-reduce: the job of 4 ranks forms across the hosts and is bit-exact.
//!
//! `cargo test -p symcomm-cli --test hosts -- WORD…` runs the scenarios whose names contain a
//! WORD.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../tests/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, ExitCode};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::netns::Net;

const SYMCOMM: &str = env!("CARGO_BIN_EXE_symcomm");

/// Longest one correctness job may take.
const JOB_LIMIT: Duration = Duration::from_secs(180);
/// Liveness settings of the fault runs.
const HEARTBEAT_MS: u64 = 100;
const PEER_TIMEOUT_MS: u64 = 1500;
/// Fault runs per fault.
const FAULT_RUNS: usize = 3;

/// `symcomm perf` status for a communicator error (a lost peer) and a timeout.
const COMM_ERROR: i32 = 3;
const TIMEOUT: i32 = 4;

fn main() -> ExitCode {
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let net = match Net::new() {
        Ok(n) => n,
        Err(e) => {
            println!("FAIL setting up two hosts: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "two hosts: namespaces {} ({}) and {} ({}), veth {} <-> {}, UCX_TLS=tcp",
        net.ns[0], net.addr[0], net.ns[1], net.addr[1], net.dev[0], net.dev[1]
    );
    type Scenario = fn(&Net) -> Result<String, String>;
    let scenarios: [(&str, Scenario); 5] = [
        ("every collective, 2 + 2 ranks interleaved", |n| {
            collectives(n, &[0, 1, 0, 1])
        }),
        ("every collective, 1 + 2 ranks", |n| {
            collectives(n, &[0, 1, 1])
        }),
        ("kill -9 of every rank of host 1", |n| {
            faults(n, Fault::Kill)
        }),
        ("the link taken down", |n| faults(n, Fault::LinkDown)),
        ("symcomm launch on each host", launch_on_two_hosts),
    ];
    let mut failed = 0;
    let mut ran = 0;
    for (name, scenario) in scenarios {
        if !only.is_empty() && !only.iter().any(|w| name.contains(w.as_str())) {
            continue;
        }
        ran += 1;
        let t = Instant::now();
        match scenario(&net) {
            Ok(what) => println!("PASS {name} ({:.1} s): {what}", t.elapsed().as_secs_f64()),
            Err(e) => {
                failed += 1;
                println!("FAIL {name} ({:.1} s): {e}", t.elapsed().as_secs_f64());
            }
        }
    }
    if ran == 0 {
        println!("FAIL no scenario's name contains any of {only:?}");
        return ExitCode::FAILURE;
    }
    if failed == 0 {
        println!("all {ran} scenarios passed");
        ExitCode::SUCCESS
    } else {
        println!("{failed} of {ran} scenarios FAILED");
        ExitCode::FAILURE
    }
}

/// Waits for every child until `deadline` (then kills them all and fails); their exit codes
/// (-1: a signal) and every rank's stdout + stderr.
fn finish(children: Vec<Child>, deadline: Instant) -> Result<Vec<(i32, String)>, String> {
    let mut readers = Vec::new();
    let mut children: Vec<Child> = children
        .into_iter()
        .map(|mut c| {
            let (out, err) = (c.stdout.take().unwrap(), c.stderr.take().unwrap());
            readers.push((support::procs::read_all(out), support::procs::read_all(err)));
            c
        })
        .collect();
    let codes = support::procs::wait_all(&mut children, deadline, None);
    let texts: Vec<String> = readers
        .into_iter()
        .map(|(o, e)| format!("{}{}", o.join().unwrap(), e.join().unwrap()))
        .collect();
    let codes = codes.map_err(|e| format!("{e}; output: {texts:?}"))?;
    Ok(codes.into_iter().zip(texts).collect())
}

/// Every collective through `symcomm perf` with rank `r` on host `hosts[r]`.
fn collectives(net: &Net, hosts: &[usize]) -> Result<String, String> {
    let mut rows = 0;
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
        let mut args = vec![
            coll, "-b", "8", "-e", "12K", "-f", "12", "-n", "1", "-w", "1", "-d", "all",
        ];
        if coll == "all_reduce" {
            args.extend(["-o", "all"]);
        }
        let ranks = net.spawn_perf(SYMCOMM, hosts, &args, &[]);
        let out = finish(ranks, Instant::now() + JOB_LIMIT).map_err(|e| format!("{coll}: {e}"))?;
        for (r, (code, text)) in out.iter().enumerate() {
            if *code != 0 {
                return Err(format!("{coll}: rank {r} exited {code}: {text}"));
            }
        }
        let table = &out[0].1;
        if !table.contains("on netns-host-1") {
            return Err(format!("{coll}: rank 0 lists no rank on host 1: {table}"));
        }
        if !table.contains("# Out of bounds values : 0 OK") {
            return Err(format!("{coll}: not every value was right: {table}"));
        }
        // The data rows (nccl-tests' columns; #wrong is the 9th and 13th).
        let data: Vec<&str> = table
            .lines()
            .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
            .collect();
        let wrong = data.iter().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() < 13 || w[8] != "0" || w[12] != "0"
        });
        if data.is_empty() || wrong {
            return Err(format!("{coll}: rows with #wrong (or none): {table}"));
        }
        rows += data.len();
    }
    Ok(format!(
        "8 collectives, {rows} rows (sizes × types × operators), #wrong 0 in and out of place"
    ))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    Kill,
    LinkDown,
}

/// [`FAULT_RUNS`] runs of `fault` on 2 + 2 ranks in a stream of all-reduces.
fn faults(net: &Net, fault: Fault) -> Result<String, String> {
    let mut latencies = Vec::new();
    for run in 0..FAULT_RUNS {
        let r = fault_run(net, fault);
        if fault == Fault::LinkDown {
            net.set_link(true)?;
        }
        latencies.extend(r.map_err(|e| format!("run {run}: {e}"))?);
    }
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(format!(
        "{} survivors in {FAULT_RUNS} runs failed with a lost peer; detection latency (fault \
         to exit) min / median / max {:.0} / {:.0} / {:.0} ms (peer timeout {PEER_TIMEOUT_MS} \
         ms)",
        latencies.len(),
        ms(latencies[0]),
        ms(latencies[latencies.len() / 2]),
        ms(latencies[latencies.len() - 1])
    ))
}

/// One fault run: the ranks all-reduce until interrupted (`-N 0`); once rank 0 printed a row,
/// the fault; the survivors (host 0's ranks for a kill, every rank for a link down) must exit
/// with a lost peer or a timeout within the bound. Their detection latencies.
fn fault_run(net: &Net, fault: Fault) -> Result<Vec<Duration>, String> {
    let hosts = [0, 0, 1, 1];
    let env = [
        ("SYMCOMM_HEARTBEAT", format!("{HEARTBEAT_MS}ms")),
        ("SYMCOMM_PEER_TIMEOUT", format!("{PEER_TIMEOUT_MS}ms")),
        ("SYMCOMM_TIMEOUT", "60s".to_owned()),
    ];
    let args = [
        "all_reduce",
        "-b",
        "64K",
        "-e",
        "64K",
        "-n",
        "5",
        "-w",
        "1",
        "-N",
        "0",
    ];
    let mut children = net.spawn_perf(SYMCOMM, &hosts, &args, &env);
    // Rank 0's stdout line by line, until its first data row.
    let (tx, rx) = mpsc::channel();
    let out = children[0].stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let errs: Vec<_> = children
        .iter_mut()
        .map(|c| support::procs::read_all(c.stderr.take().unwrap()))
        .collect();
    let started = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    let running = loop {
        match rx.recv_timeout(started.saturating_duration_since(Instant::now())) {
            Ok(l) if l.trim_start().starts_with(|c: char| c.is_ascii_digit()) => break true,
            Ok(l) => seen.push(l),
            Err(_) => break false,
        }
    };
    if !running {
        support::procs::kill_all(&mut children);
        let errs: Vec<String> = errs.into_iter().map(|e| e.join().unwrap()).collect();
        return Err(format!("no row from rank 0 in 60 s: {seen:?} {errs:?}"));
    }
    std::thread::sleep(Duration::from_millis(300));
    let survivors: Vec<usize> = match fault {
        Fault::Kill => vec![0, 1],
        Fault::LinkDown => vec![0, 1, 2, 3],
    };
    let hit = Instant::now();
    match fault {
        Fault::Kill => {
            for c in &mut children[2..] {
                let _ = c.kill();
            }
        }
        Fault::LinkDown => {
            if let Err(e) = net.set_link(false) {
                support::procs::kill_all(&mut children);
                return Err(e);
            }
        }
    }
    let limit = Duration::from_millis(PEER_TIMEOUT_MS) + Duration::from_secs(10);
    let mut exits: Vec<Option<(i32, Duration)>> = vec![None; children.len()];
    while survivors.iter().any(|&r| exits[r].is_none()) && hit.elapsed() < limit {
        for &r in &survivors {
            if exits[r].is_none() {
                if let Some(s) = children[r].try_wait().unwrap() {
                    exits[r] = Some((s.code().unwrap_or(-1), hit.elapsed()));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    support::procs::kill_all(&mut children);
    let errs: Vec<String> = errs.into_iter().map(|e| e.join().unwrap()).collect();
    let mut latencies = Vec::new();
    for &r in &survivors {
        match exits[r] {
            None => {
                return Err(format!(
                    "rank {r} still running {limit:?} after the fault; stderr: {errs:?}"
                ));
            }
            Some((code, took)) => {
                let said = errs[r].to_lowercase();
                if !(code == COMM_ERROR || code == TIMEOUT) || !said.contains("lost") {
                    return Err(format!(
                        "rank {r} exited {code} without reporting a lost peer: {}",
                        errs[r]
                    ));
                }
                latencies.push(took);
            }
        }
    }
    Ok(latencies)
}

/// One `symcomm launch -n 2 --nnodes 2 --node-rank h --master-addr <host 0>` per host, the
/// ranks running `symcomm perf all_reduce`: global ranks 0-1 on host 0 and 2-3 on host 1.
fn launch_on_two_hosts(net: &Net) -> Result<String, String> {
    let secret = "0123456789abcdef0123456789abcdef";
    let launchers: Vec<Child> = (0..2)
        .map(|h| {
            let node_rank = h.to_string();
            let mut cmd = net.command(h, SYMCOMM);
            cmd.args([
                "launch",
                "-n",
                "2",
                "--nnodes",
                "2",
                "--node-rank",
                &node_rank,
            ])
            .args(["--master-addr", net.addr[0], "--timeout", "120", "--"])
            .args([
                SYMCOMM,
                "perf",
                "all_reduce",
                "-b",
                "8",
                "-e",
                "4K",
                "-f",
                "8",
            ])
            .args(["-n", "1", "-w", "1", "-d", "all"])
            .envs(net.host_env(h))
            .env("SYMCOMM_SECRET", secret)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
            cmd.spawn().unwrap()
        })
        .collect();
    let out = finish(launchers, Instant::now() + JOB_LIMIT)?;
    for (h, (code, text)) in out.iter().enumerate() {
        if *code != 0 {
            return Err(format!("the launcher on host {h} exited {code}: {text}"));
        }
        if text.contains(secret) {
            return Err(format!("the secret appears in host {h}'s output"));
        }
    }
    // Rank 0 prints the table; its rank lines say where every rank ran (the ranks of host 1's
    // launcher are global ranks 2 and 3).
    let table = &out[0].1;
    if !table.contains("[0] # Out of bounds values : 0 OK") {
        return Err(format!("not every value was right: {table}"));
    }
    for (rank, host) in [(0, 0), (1, 0), (2, 1), (3, 1)] {
        let line = format!("Rank {rank:2} ");
        let placed = table
            .lines()
            .any(|l| l.contains(&line) && l.trim_end().ends_with(&format!("netns-host-{host}")));
        if !placed {
            return Err(format!("rank {rank} is not listed on host {host}: {table}"));
        }
    }
    Ok("4 ranks, 2 per host, from two launchers: all-reduce of every type bit-exact".into())
}

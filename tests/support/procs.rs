//! Ranks as processes of the test executable, for `cli/tests/comm_procs.rs` and
//! `cli/tests/reliability.rs` (plain `main`s that re-execute themselves as the ranks, the role
//! named by [`ROLE`]): spawning ranks, collecting their output lines, bounded waits, and one
//! fault run (a rank killed, stopped, destroying or aborting its communicator while the others
//! wait for it in a collective), both its parent side ([`fault_run`]) and its rank side
//! ([`fault_rank`]).
//!
//! Times that cross processes are CLOCK_REALTIME microseconds ([`now_us`]): every rank runs on
//! this machine, so they share the clock, and a survivor's own timestamp at its error excludes
//! the pipe and the parent's scheduling from the latency.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use symcomm::{Communicator, DataType, Error, RedOp, Stream, UniqueId};

/// The variable that makes the test executable one rank (its value: the role).
pub(crate) const ROLE: &str = "SYMCOMM_TEST_ROLE";

/// The heartbeat interval of fault runs (`SYMCOMM_HEARTBEAT`).
pub(crate) const HEARTBEAT_MS: u64 = 100;
/// The peer timeout of fault runs (`SYMCOMM_PEER_TIMEOUT`): a stopped rank is lost after it.
pub(crate) const PEER_TIMEOUT_MS: u64 = 1500;

/// Elements of the all-reduce the survivors of a fault run wait in.
const COUNT: usize = 4099;

/// CLOCK_REALTIME in microseconds since the epoch.
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// The value of `key=value` in a whitespace-separated line.
pub(crate) fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// A fresh root address with a secret, as `symcomm launch` makes it: a free port (not held here,
/// since rank 0 is another process) and a random secret.
pub(crate) fn fresh_id() -> String {
    let ip = std::net::Ipv4Addr::LOCALHOST;
    let port = symcomm::bootstrap::free_port(ip.into()).unwrap();
    UniqueId::from_parts((ip, port).into(), UniqueId::random_secret().unwrap())
        .unwrap()
        .to_string()
}

/// `n` copies of this executable as the ranks of one job on the emulator (a fresh
/// `SYMCOMM_ID`, the launcher variables, a 30 s init timeout), with `env` on top; stdout piped.
pub(crate) fn spawn_ranks(n: u32, env: &[(&str, String)]) -> Vec<Child> {
    let exe = std::env::current_exe().unwrap();
    let id = fresh_id();
    (0..n)
        .map(|r| {
            let mut cmd = Command::new(&exe);
            cmd.env("SYMCOMM_ID", &id)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("LOCAL_WORLD_SIZE", n.to_string())
                .env("SYMCOMM_DEVICE", "emu")
                .env("SYMCOMM_INIT_TIMEOUT", "30s")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            for (k, v) in env {
                cmd.env(k, v);
            }
            cmd.spawn().unwrap()
        })
        .collect()
}

/// `symcomm launch ARGS…` (`symcomm`: the binary's path) with a clean rank environment: no
/// `SYMCOMM_ID` or `MASTER_*` of the caller's, stdin closed.
pub(crate) fn launch(symcomm: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(symcomm);
    cmd.arg("launch")
        .args(args)
        .stdin(Stdio::null())
        .env_remove("SYMCOMM_ID")
        .env_remove("MASTER_ADDR")
        .env_remove("MASTER_PORT");
    cmd
}

/// Forwards each child's stdout lines as (child index, line) to one channel.
pub(crate) fn collect_lines(children: &mut [Child]) -> mpsc::Receiver<(usize, String)> {
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

/// Reads `pipe` to its end on a thread of its own; the thread returns the text.
pub(crate) fn read_all(
    mut pipe: impl std::io::Read + Send + 'static,
) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Kills and reaps every child.
pub(crate) fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Receives lines into `lines` until `count` of them contain `pat`; fails (saying what came)
/// when that takes longer than `limit`.
pub(crate) fn await_lines(
    rx: &mpsc::Receiver<(usize, String)>,
    lines: &mut Vec<(usize, String)>,
    pat: &str,
    count: usize,
    limit: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    let mut seen = lines.iter().filter(|(_, l)| l.contains(pat)).count();
    while seen < count {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((r, l)) => {
                seen += usize::from(l.contains(pat));
                lines.push((r, l));
            }
            Err(_) => {
                return Err(format!(
                    "{seen} of {count} `{pat}` lines after {limit:?}: {lines:?}"
                ));
            }
        }
    }
    Ok(())
}

/// Receives the remaining lines into `lines` once the children are gone: until every reader of
/// [`collect_lines`] reached the end of its pipe, or `limit` passed. (A child's last lines may
/// still be on their way after its exit is seen; `try_iter` there would lose them on a loaded
/// machine.)
pub(crate) fn drain_lines(
    rx: &mpsc::Receiver<(usize, String)>,
    lines: &mut Vec<(usize, String)>,
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        lines.push(line);
    }
}

/// Waits for every child but `skip` to exit by `deadline`; returns their exit codes (-1: killed
/// by a signal; 0 for `skip`). Past the deadline it kills them all and fails.
pub(crate) fn wait_all(
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
            kill_all(children);
            return Err(format!(
                "ranks still running at the deadline (exit codes so far {codes:?})"
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ------------------------------------------------------------------------------------------
// Fault runs
// ------------------------------------------------------------------------------------------

/// What happens to the victim of a fault run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// `kill -9` from the parent.
    Kill,
    /// `SIGSTOP` from the parent: alive but silent, lost at the peer timeout.
    Stop,
    /// The victim drops its communicator (a goodbye) having made one collective call fewer.
    Destroy,
    /// The victim calls `abort()`.
    Abort,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Stop => "stop",
            Fault::Destroy => "destroy",
            Fault::Abort => "abort",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Fault::Kill, Fault::Stop, Fault::Destroy, Fault::Abort]
            .into_iter()
            .find(|f| f.name() == name)
    }

    /// What the survivors' `PeerLost` reason must say.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Fault::Kill => "its connection closed without a goodbye",
            Fault::Stop => "it sent no heartbeat within the peer timeout",
            Fault::Destroy => "it destroyed its communicator after 1 collective calls",
            Fault::Abort => "it aborted its communicator",
        }
    }

    /// How long after the fault the survivors may take to exit (generous for a loaded
    /// machine; a stopped rank is noticed only at the peer timeout).
    pub(crate) fn limit(self) -> Duration {
        match self {
            Fault::Stop => Duration::from_millis(PEER_TIMEOUT_MS + 5000),
            _ => Duration::from_secs(5),
        }
    }
}

/// The environment of a fault run's ranks: the role, victim and fault, short liveness
/// timeouts, and a device deadline so long that only the fault may end the survivors' wait.
/// A survivor that reports the loss correctly exits `lost_exit`.
pub(crate) fn fault_env(victim: u32, fault: Fault, lost_exit: u8) -> Vec<(&'static str, String)> {
    vec![
        (ROLE, "fault".to_owned()),
        ("SYMCOMM_TEST_VICTIM", victim.to_string()),
        ("SYMCOMM_TEST_FAULT", fault.name().to_owned()),
        ("SYMCOMM_TEST_LOST_EXIT", lost_exit.to_string()),
        ("SYMCOMM_HEARTBEAT", format!("{HEARTBEAT_MS}ms")),
        ("SYMCOMM_PEER_TIMEOUT", format!("{PEER_TIMEOUT_MS}ms")),
        ("SYMCOMM_TIMEOUT", "120s".to_owned()),
    ]
}

/// One fault run, as the parent sees it.
#[derive(Debug)]
pub(crate) struct FaultRun {
    /// Each survivor's detection latency: from the fault (the parent's signal, or the victim's
    /// own timestamp just before it destroys or aborts) to the survivor's error, both
    /// CLOCK_REALTIME.
    pub(crate) latencies: Vec<Duration>,
    /// From the fault until the last survivor exited, as the parent saw it.
    pub(crate) took: Duration,
    /// Every line the ranks printed.
    pub(crate) lines: Vec<(usize, String)>,
}

/// Runs `nranks` ranks ([`fault_rank`]); once all are ready and waiting, `victim` suffers
/// `fault`. Every survivor must report `PeerLost { victim }` with `fault`'s reason (the
/// collective, `check_error` and a later call) and exit 0 within [`Fault::limit`].
pub(crate) fn fault_run(nranks: u32, victim: u32, fault: Fault) -> Result<FaultRun, String> {
    let mut children = spawn_ranks(nranks, &fault_env(victim, fault, 0));
    let rx = collect_lines(&mut children);
    let mut lines = Vec::new();
    let ready = await_lines(
        &rx,
        &mut lines,
        "READY",
        nranks as usize,
        Duration::from_secs(30),
    );
    if let Err(e) = ready {
        kill_all(&mut children);
        return Err(format!("ranks not ready: {e}"));
    }
    // The survivors enter their wait; a destroying or aborting victim waits as long itself.
    std::thread::sleep(Duration::from_millis(300));
    let hit = Instant::now();
    let mut fault_us = None;
    if let Some(signal) = match fault {
        Fault::Kill => Some(nix::sys::signal::Signal::SIGKILL),
        Fault::Stop => Some(nix::sys::signal::Signal::SIGSTOP),
        Fault::Destroy | Fault::Abort => None,
    } {
        let pid = nix::unistd::Pid::from_raw(children[victim as usize].id() as i32);
        fault_us = Some(now_us());
        if let Err(e) = nix::sys::signal::kill(pid, signal) {
            kill_all(&mut children);
            return Err(format!("{signal:?} to rank {victim}: {e}"));
        }
    }
    let codes = wait_all(&mut children, hit + fault.limit(), Some(victim as usize));
    let took = hit.elapsed();
    // The victim is stopped, killed, or idle after its goodbye or abort.
    kill_all(&mut children);
    drain_lines(&rx, &mut lines, Duration::from_secs(10));
    let codes = codes.map_err(|e| format!("{e}; lines {lines:?}"))?;
    let fault_us = fault_us.or_else(|| {
        lines
            .iter()
            .find(|(_, l)| l.starts_with("LEAVING"))
            .and_then(|(_, l)| field(l, "at_us")?.parse().ok())
    });
    let Some(fault_us) = fault_us else {
        return Err(format!("the victim never said when it left: {lines:?}"));
    };
    let lost: Vec<&String> = lines
        .iter()
        .filter(|(_, l)| l.starts_with("LOST"))
        .map(|(_, l)| l)
        .collect();
    let latencies: Vec<Duration> = lost
        .iter()
        .filter_map(|l| field(l, "at_us")?.parse::<u64>().ok())
        .map(|at| Duration::from_micros(at.saturating_sub(fault_us)))
        .collect();
    let survivors_ok = codes
        .iter()
        .enumerate()
        .all(|(r, &c)| r == victim as usize || c == 0);
    let named = lost.iter().all(|l| field(l, "named") == Some("yes"));
    let survivors = nranks as usize - 1;
    if !survivors_ok || !named || lost.len() != survivors || latencies.len() != survivors {
        return Err(format!(
            "{fault:?} of rank {victim}: survivors' exit codes {codes:?} after {took:?}; lines \
             {lines:?}"
        ));
    }
    Ok(FaultRun {
        latencies,
        took,
        lines,
    })
}

/// This process's rank: `Communicator::from_env()`; on failure it prints `INIT-FAILED <error>`
/// and gives the exit code (3).
pub(crate) fn init_rank() -> Result<Arc<Communicator>, ExitCode> {
    Communicator::from_env().map_err(|e| {
        println!("INIT-FAILED {e}");
        ExitCode::from(3)
    })
}

/// The rank side of [`fault_run`] (role `fault`, configured by [`fault_env`]): init, two windows
/// and a warm-up all-reduce on every rank (so that the stream's lane exists and the later wait
/// is in the kernel), `READY`; then the victim waits to be signalled, or after 300 ms says
/// `LEAVING at_us=…` and destroys or aborts its communicator, and idles until killed. The
/// others make one more all-reduce, which waits for the victim until the fault ends it, and
/// print `LOST at_us=… named=yes|no` with the error of the call, of `check_error` and of a later
/// barrier (`named`: all three are `PeerLost` of the victim with the fault's reason).
pub(crate) fn fault_rank() -> ExitCode {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let victim: u32 = var("SYMCOMM_TEST_VICTIM").parse().unwrap();
    let fault = Fault::from_name(&var("SYMCOMM_TEST_FAULT")).unwrap();
    let lost_exit: u8 = var("SYMCOMM_TEST_LOST_EXIT").parse().unwrap_or(0);
    let comm = match init_rank() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let rank = comm.rank();
    let stream = Stream::new(comm.backend()).unwrap();
    let src = comm.alloc_window::<f32>(COUNT).unwrap();
    let dst = comm.alloc_window::<f32>(COUNT).unwrap();
    let all_reduce = || -> symcomm::Result<()> {
        comm.all_reduce(&src, &dst, COUNT, DataType::F32, RedOp::Sum, &stream)?;
        stream.synchronize()?;
        comm.check_error()
    };
    all_reduce().unwrap();
    comm.barrier().unwrap();
    println!("READY rank={rank} pid={}", std::process::id());
    if rank == victim {
        if matches!(fault, Fault::Destroy | Fault::Abort) {
            std::thread::sleep(Duration::from_millis(300));
            println!("LEAVING rank={rank} at_us={}", now_us());
            if fault == Fault::Abort {
                comm.abort();
            } else {
                drop((src, dst, stream));
                drop(comm);
            }
        }
        // Killed by the parent (at once, or after the survivors reported).
        std::thread::sleep(Duration::from_secs(60));
        return ExitCode::FAILURE;
    }
    let result = all_reduce();
    let at = now_us();
    let checked = comm.check_error();
    let later = comm.barrier();
    let named = |r: &symcomm::Result<()>| {
        matches!(r, Err(Error::PeerLost { rank, reason })
            if *rank == victim && reason.contains(fault.reason()))
    };
    let ok = named(&result) && named(&checked) && named(&later);
    println!(
        "LOST rank={rank} at_us={at} named={} result={result:?} check={checked:?} later={later:?}",
        if ok { "yes" } else { "no" }
    );
    if ok {
        ExitCode::from(lost_exit)
    } else {
        ExitCode::FAILURE
    }
}

//! `symcomm launch -n N [--] PROGRAM [ARGS]...`: runs N copies of a program on this machine as
//! ranks `0..N` of one job — a small local stand-in for `torchrun` / `mpirun`.
//!
//! - **Rendezvous.** The launcher makes a fresh [`UniqueId`] whose root is `127.0.0.1` on a free
//!   port, with a new 128-bit secret, and gives every rank `SYMCOMM_ID=<id>`, `RANK=r`,
//!   `WORLD_SIZE=N`, `LOCAL_RANK=r`, `LOCAL_WORLD_SIZE=N` and `SYMCOMM_LAUNCHER=symcomm`, so
//!   [`BootstrapConfig::from_env`](symcomm::bootstrap::BootstrapConfig::from_env) yields rank `r`
//!   of `N` with that id. `MASTER_ADDR` / `MASTER_PORT` are not set; an inherited
//!   `SYMCOMM_SECRET` is removed (it would conflict with `SYMCOMM_ID`). The port is found by
//!   binding `127.0.0.1:0` and closing the socket again, so rank 0 can bind it (another process
//!   could take it in between; the rendezvous then fails with a clear error).
//! - **Output.** Every line a rank writes to stdout / stderr goes to the launcher's stdout /
//!   stderr prefixed with `[r] ` (rank right-aligned to the width of `N-1`), whole lines at a
//!   time, so lines of different ranks never mix; a last line without a newline gets one. Lines
//!   longer than 1 MiB are split. `--no-prefix` instead hands the ranks the launcher's own
//!   stdout / stderr. Rank 0 reads the launcher's stdin when that is not a terminal; every other
//!   rank (and rank 0 when stdin is a terminal) reads `/dev/null`.
//! - **Process groups.** Each rank runs in its own process group, and the launcher signals whole
//!   groups, so a rank's own children (a shell's commands, a Python worker pool) are stopped too.
//!   A rank also gets `SIGTERM` if the launcher dies without stopping it (Linux parent-death
//!   signal; the rank's own children are not covered by that).
//! - **Signals.** `SIGINT` and `SIGTERM` sent to the launcher are forwarded to every rank (the
//!   ranks are not in the terminal's foreground group, so Ctrl-C reaches them exactly once, via
//!   the launcher). What the ranks then do decides the outcome. Such a signal arriving while the
//!   launcher is already stopping the job kills every rank at once.
//! - **Failure.** When a rank exits unsuccessfully (non-zero status or killed by a signal), the
//!   launcher prints `symcomm launch: rank R exited with status X; stopping the other ranks`,
//!   sends `SIGTERM` to the other ranks, `SIGKILL`s whatever is left after `--grace-ms`
//!   (default 3000), and exits with rank R's status (128 + S for a rank killed by signal S, as
//!   shells report it). When every rank succeeds it exits 0.
//! - **Which rank is blamed.** When one rank dies the others usually fail a few milliseconds
//!   later because of it (symcomm reports `PeerLost` to them), and the kernel may even let them
//!   finish exiting before the dead rank's own exit is visible. So when the first failure is
//!   seen the launcher waits [`BLAME_WINDOW`] (100 ms, less when every rank has exited by then)
//!   before it stops the job, collecting every failure in that window, and then names the *root
//!   cause*: a rank killed by a signal other than `SIGABRT` and `SIGPIPE` (a kill from outside,
//!   or a crash) comes first, since ranks that lose a peer exit by themselves (or abort, or die
//!   of `SIGPIPE` writing to it); then the rank seen failing first (the launcher is woken by
//!   `SIGCHLD`, so it sees exits about as they happen); then the lowest rank. Ranks that fail
//!   after the window, or die of the launcher's own `SIGTERM`, are never named.
//! - **Timeout.** With `--timeout SECS`, a job still running after SECS seconds is stopped the
//!   same way and the launcher exits 124 (as `timeout(1)` does).
//! - **Errors.** Bad arguments (`-n 0`, no program) and a program that cannot be started exit 2
//!   with a message, leaving no rank behind.
//!
//! Exits are observed with `waitid(WNOWAIT)`, which leaves each exited rank a zombie until the
//! launcher is done: its process id, and so its process-group id, cannot be reused meanwhile,
//! which keeps signalling the group of a rank that already exited safe.

use std::ffi::OsString;
use std::fmt;
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;
use symcomm::bootstrap::UniqueId;

/// Most ranks one launch starts.
const MAX_LAUNCH_RANKS: u32 = 1024;
/// How often the launcher looks for exited ranks and deadlines when no signal wakes it sooner
/// (`SIGCHLD` wakes it as soon as a rank exits).
const POLL: Duration = Duration::from_millis(20);
/// Longest line passed on whole; longer ones are split into pieces of this size.
const MAX_LINE: usize = 1 << 20;
/// How long the launcher waits, once every rank has exited, for the rest of their output (a
/// rank's background process may keep its pipe open).
const DRAIN: Duration = Duration::from_secs(2);
/// Stack size of the launcher's threads (two per rank, doing little).
const THREAD_STACK: usize = 256 * 1024;
/// Exit status for bad arguments and ranks that cannot be started.
const USAGE_ERROR: u8 = 2;
/// Exit status when `--timeout` expires.
const TIMED_OUT: u8 = 124;
/// How long after the first failure the launcher keeps collecting failures before it names
/// the root cause and stops the job (see the module docs).
const BLAME_WINDOW: Duration = Duration::from_millis(100);
/// The blame rule of the module docs, for `symcomm launch --help`.
const BLAME_HELP: &str = "\
When a rank fails, the launcher collects the failures of the next 100 ms, then names the root \
cause and exits with its status: a rank killed by a signal other than SIGABRT and SIGPIPE (a \
kill or a crash: ranks that lose a peer exit, abort or get SIGPIPE by themselves) comes first, \
then the rank seen failing first, then the lowest rank. Ranks that fail later, or die of the \
launcher's own SIGTERM, are never named.";

/// `symcomm launch` options.
#[derive(Debug, clap::Args)]
#[command(after_help = BLAME_HELP)]
pub(crate) struct LaunchArgs {
    /// Number of ranks (copies of PROGRAM) to start, 1 to 1024.
    #[arg(
        short = 'n',
        long = "nranks",
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_LAUNCH_RANKS))
    )]
    nranks: u32,

    /// When a rank fails or the timeout expires, how long the other ranks get to exit after
    /// SIGTERM before they are killed with SIGKILL, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 3000)]
    grace_ms: u64,

    /// Pass the ranks' output through unchanged (the ranks write to the launcher's own stdout
    /// and stderr) instead of prefixing each line with `[rank] `.
    #[arg(long)]
    no_prefix: bool,

    /// Stop every rank and exit with status 124 when the job runs longer than SECS seconds
    /// (fractions allowed).
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    timeout: Option<Duration>,

    /// The program every rank runs, then its arguments (put `--` before them when they could
    /// be taken for launcher options).
    #[arg(
        value_name = "PROGRAM [ARGS]",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
}

/// Parses a positive number of seconds.
fn parse_secs(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 || secs > 1e9 {
        return Err("expected a positive number of seconds".into());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// How a rank ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// It exited with this status.
    Exited(i32),
    /// A signal with this number killed it.
    Signaled(i32),
}

impl Outcome {
    fn success(self) -> bool {
        self == Outcome::Exited(0)
    }

    /// The launcher's exit status for this outcome: the rank's own, or 128 + the signal.
    fn exit_code(self) -> u8 {
        match self {
            Outcome::Exited(code) => u8::try_from(code).unwrap_or(1),
            Outcome::Signaled(sig) => u8::try_from(128 + sig).unwrap_or(255),
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Outcome::Exited(code) => write!(f, "{code}"),
            Outcome::Signaled(sig) => match Signal::try_from(sig) {
                Ok(s) => write!(f, "{} (killed by {})", self.exit_code(), s.as_str()),
                Err(_) => write!(f, "{} (killed by signal {sig})", self.exit_code()),
            },
        }
    }
}

/// The variables every rank gets (besides the launcher's own environment).
fn rank_env(id: &str, rank: u32, nranks: u32) -> [(&'static str, String); 6] {
    [
        ("SYMCOMM_ID", id.to_owned()),
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", nranks.to_string()),
        ("LOCAL_RANK", rank.to_string()),
        ("LOCAL_WORLD_SIZE", nranks.to_string()),
        ("SYMCOMM_LAUNCHER", "symcomm".to_owned()),
    ]
}

/// A fresh id rooted at `127.0.0.1` on a port that was free a moment ago.
///
/// Not [`UniqueId::new_on`]: that keeps the port's listening socket in *this* process for an
/// in-process rank 0, and rank 0 here is a child that must bind the port itself.
fn fresh_id() -> symcomm::Result<UniqueId> {
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map_err(|source| symcomm::Error::io("finding a free port on 127.0.0.1", source))?
        .port();
    UniqueId::from_parts(
        SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        UniqueId::random_secret()?,
    )
}

/// One started rank.
struct Rank {
    child: Child,
    /// Its process group (= its process id).
    group: Pid,
    /// Set once it has exited (it stays a zombie until the launcher reaps it at the end).
    outcome: Option<Outcome>,
}

impl Rank {
    /// Looks for an exit without reaping the process.
    fn poll(&mut self) -> Option<Outcome> {
        if self.outcome.is_none() {
            let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
            self.outcome = match waitid(Id::Pid(self.group), flags) {
                Ok(WaitStatus::Exited(_, code)) => Some(Outcome::Exited(code)),
                Ok(WaitStatus::Signaled(_, sig, _)) => Some(Outcome::Signaled(sig as i32)),
                Ok(_) => None,
                // A status nix cannot express (a real-time signal): let std reap and decode it.
                Err(_) => match self.child.try_wait() {
                    Ok(Some(status)) => Some(match (status.code(), status.signal()) {
                        (Some(code), _) => Outcome::Exited(code),
                        (None, Some(sig)) => Outcome::Signaled(sig),
                        (None, None) => Outcome::Exited(1),
                    }),
                    Ok(None) => None,
                    Err(e) => {
                        eprintln!("symcomm launch: cannot wait for a rank: {e}");
                        Some(Outcome::Exited(1))
                    }
                },
            };
        }
        self.outcome
    }
}

/// Sends `sig` to every rank's process group. The groups of exited ranks are still pinned by
/// their zombies, so this never reaches an unrelated process; errors (an empty group) are
/// ignored.
fn signal_all(ranks: &[Rank], sig: Signal) {
    for rank in ranks {
        let _ = killpg(rank.group, sig);
    }
}

/// Kills every rank and reaps it (for a launch that could not start completely).
fn abandon(ranks: &mut [Rank]) {
    signal_all(ranks, Signal::SIGKILL);
    for rank in ranks {
        let _ = rank.child.wait();
    }
}

/// Runs in each child before `exec`: unblocks the `signals` the launcher blocks for itself
/// (std leaves the parent's signal mask in place) and makes the child get SIGTERM when the
/// launcher dies. (The parent-death signal fires when the spawning *thread* ends: children are
/// spawned from the main thread, which lives as long as the launcher.)
fn prepare_child(cmd: &mut Command, signals: SigSet) {
    let launcher = nix::unistd::getpid();
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe
    // operations are allowed: it makes three system calls (rt_sigprocmask, prctl, getppid) and
    // allocates and locks nothing (an `Errno` converts to an `io::Error` without allocating).
    unsafe {
        cmd.pre_exec(move || {
            signals.thread_unblock()?;
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
            // The launcher died before the line above took effect.
            if nix::unistd::getppid() != launcher {
                return Err(nix::errno::Errno::ESRCH.into());
            }
            Ok(())
        });
    }
}

/// Copies `src` line by line to the launcher's stdout or stderr with `prefix` before each
/// line, writing each line whole under the stream's lock. After a write error (the launcher's
/// output closed) it keeps reading, so that the rank never blocks on a full pipe.
fn pump(src: impl Read, prefix: &str, to_stderr: bool) {
    let mut reader = BufReader::with_capacity(64 * 1024, src);
    let mut line = prefix.as_bytes().to_vec();
    let mut writable = true;
    let mut emit = |line: &mut Vec<u8>| {
        if !line.ends_with(b"\n") {
            line.push(b'\n');
        }
        if writable {
            let written = if to_stderr {
                let mut out = io::stderr().lock();
                out.write_all(line).and_then(|()| out.flush())
            } else {
                let mut out = io::stdout().lock();
                out.write_all(line).and_then(|()| out.flush())
            };
            writable = written.is_ok();
        }
        line.truncate(prefix.len());
    };
    loop {
        let (used, complete) = match reader.fill_buf() {
            Ok([]) => break,
            Ok(buf) => {
                let room = MAX_LINE - (line.len() - prefix.len());
                let take = &buf[..buf.len().min(room)];
                match take.iter().position(|&b| b == b'\n') {
                    Some(i) => {
                        line.extend_from_slice(&take[..=i]);
                        (i + 1, true)
                    }
                    None => {
                        line.extend_from_slice(take);
                        (take.len(), line.len() - prefix.len() >= MAX_LINE)
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        reader.consume(used);
        if complete {
            emit(&mut line);
        }
    }
    if line.len() > prefix.len() {
        emit(&mut line);
    }
}

/// Runs `symcomm launch`.
pub(crate) fn run(args: &LaunchArgs) -> ExitCode {
    let usage_error = |msg: String| {
        eprintln!("symcomm launch: {msg}");
        ExitCode::from(USAGE_ERROR)
    };
    let nranks = args.nranks;
    if nranks == 0 || nranks > MAX_LAUNCH_RANKS {
        return usage_error(format!("-n must be 1 to {MAX_LAUNCH_RANKS}, got {nranks}"));
    }
    let Some((program, program_args)) = args.command.split_first() else {
        return usage_error("no program to run".into());
    };

    // SIGINT / SIGTERM (to forward) and SIGCHLD (a rank exited: look now) are blocked in every
    // launcher thread (threads inherit the mask; this runs before any is started) and taken by
    // one thread with sigwait, which hands them to the wait loop below. Children unblock them
    // again before exec (`prepare_child`).
    let mut forwarded = SigSet::empty();
    forwarded.add(Signal::SIGINT);
    forwarded.add(Signal::SIGTERM);
    forwarded.add(Signal::SIGCHLD);
    if let Err(e) = forwarded.thread_block() {
        return usage_error(format!("cannot block SIGINT, SIGTERM and SIGCHLD: {e}"));
    }
    let (signal_tx, signals) = mpsc::channel::<Signal>();
    let waiter = thread::Builder::new()
        .name("signals".into())
        .stack_size(THREAD_STACK)
        .spawn(move || {
            while let Ok(sig) = forwarded.wait() {
                if signal_tx.send(sig).is_err() {
                    break;
                }
            }
        });
    if let Err(e) = waiter {
        return usage_error(format!("cannot start the signal thread: {e}"));
    }

    let id = match fresh_id() {
        Ok(id) => id.to_string(),
        Err(e) => return usage_error(format!("cannot make a bootstrap id: {e}")),
    };

    let prefixed = !args.no_prefix;
    let width = (nranks - 1).to_string().len();
    let stdin_to_rank0 = !io::stdin().is_terminal();
    let (pump_done_tx, pump_done) = mpsc::channel::<()>();
    let mut pumps = 0usize;
    let mut ranks: Vec<Rank> = Vec::with_capacity(nranks as usize);
    for r in 0..nranks {
        let mut cmd = Command::new(program);
        cmd.args(program_args)
            .env_remove("SYMCOMM_SECRET")
            .envs(rank_env(&id, r, nranks))
            .process_group(0)
            .stdin(if r == 0 && stdin_to_rank0 {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        if prefixed {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        prepare_child(&mut cmd, forwarded);
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                abandon(&mut ranks);
                return usage_error(format!(
                    "cannot start rank {r}: `{}`: {e}",
                    program.to_string_lossy()
                ));
            }
        };
        // Its own process group (`process_group(0)`), named by its pid; pids fit in `pid_t`.
        let group = Pid::from_raw(child.id() as i32);
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        ranks.push(Rank {
            child,
            group,
            outcome: None,
        });
        let prefix = format!("[{r:>width$}] ");
        let streams: [(Option<Box<dyn Read + Send>>, bool); 2] = [
            (stdout.map(|s| Box::new(s) as Box<dyn Read + Send>), false),
            (stderr.map(|s| Box::new(s) as Box<dyn Read + Send>), true),
        ];
        for (stream, to_stderr) in streams {
            let Some(stream) = stream else { continue };
            let prefix = prefix.clone();
            let done = pump_done_tx.clone();
            let started = thread::Builder::new()
                .name(format!("rank{r}-{}", if to_stderr { "err" } else { "out" }))
                .stack_size(THREAD_STACK)
                .spawn(move || {
                    pump(stream, &prefix, to_stderr);
                    let _ = done.send(());
                });
            match started {
                Ok(_) => pumps += 1,
                Err(e) => {
                    abandon(&mut ranks);
                    return usage_error(format!("cannot start an output thread: {e}"));
                }
            }
        }
    }
    drop(pump_done_tx);

    let code = supervise(&mut ranks, &signals, args);

    // Every rank has exited; reap them and let the output threads finish.
    for rank in &mut ranks {
        let _ = rank.child.wait();
    }
    let drain_until = Instant::now() + DRAIN;
    for _ in 0..pumps {
        let left = drain_until.saturating_duration_since(Instant::now());
        if pump_done.recv_timeout(left).is_err() {
            break;
        }
    }
    ExitCode::from(code)
}

/// Why the launcher is stopping the job.
enum Stopping {
    /// A rank ended this way.
    Failed(Outcome),
    /// `--timeout` expired.
    TimedOut,
}

/// A failure seen in the blame window: the rank, how it ended, and in which look at the
/// ranks it was seen (earlier looks first).
type Seen = (usize, Outcome, u64);

/// Whether a failure looks like a cause rather than a consequence of another rank's loss:
/// killed by a signal that a rank that lost a peer does not bring on itself (`SIGABRT` from
/// `abort()`, `SIGPIPE` from writing to the lost peer).
fn killed_from_outside(outcome: Outcome) -> bool {
    matches!(outcome, Outcome::Signaled(sig)
        if sig != Signal::SIGABRT as i32 && sig != Signal::SIGPIPE as i32)
}

/// The root cause among the failures of the blame window (see the module docs).
fn root_cause(failed: &[Seen]) -> Option<(usize, Outcome)> {
    failed
        .iter()
        .copied()
        .min_by_key(|&(rank, outcome, look)| (!killed_from_outside(outcome), look, rank))
        .map(|(rank, outcome, _)| (rank, outcome))
}

/// Waits until every rank has exited, forwarding signals, stopping the job when a rank fails
/// or the timeout expires; returns the launcher's exit status.
fn supervise(ranks: &mut [Rank], signals: &mpsc::Receiver<Signal>, args: &LaunchArgs) -> u8 {
    let start = Instant::now();
    let grace = Duration::from_millis(args.grace_ms);
    // (why, SIGKILL deadline, SIGKILL sent)
    let mut stopping: Option<(Stopping, Instant, bool)> = None;
    // Once a rank failed: until when failures are collected, and the failures so far.
    let mut blame: Option<(Instant, Vec<Seen>)> = None;
    // A signal that woke the wait at the bottom of the loop, handled at the top.
    let mut woken_by: Option<Signal> = None;
    let mut look = 0u64;
    loop {
        for sig in woken_by.take().into_iter().chain(signals.try_iter()) {
            if sig == Signal::SIGCHLD {
                // Only a wake-up: the look below finds who exited.
                continue;
            }
            match &mut stopping {
                None => {
                    eprintln!(
                        "symcomm launch: got {}; forwarding it to every rank",
                        sig.as_str()
                    );
                    signal_all(ranks, sig);
                }
                Some((_, _, killed)) => {
                    eprintln!(
                        "symcomm launch: got {} while stopping; killing every rank",
                        sig.as_str()
                    );
                    signal_all(ranks, Signal::SIGKILL);
                    *killed = true;
                }
            }
        }

        look += 1;
        let mut running = 0;
        for (r, rank) in ranks.iter_mut().enumerate() {
            let already = rank.outcome.is_some();
            match rank.poll() {
                None => running += 1,
                Some(outcome) if !already && !outcome.success() && stopping.is_none() => {
                    blame
                        .get_or_insert_with(|| (Instant::now() + BLAME_WINDOW, Vec::new()))
                        .1
                        .push((r, outcome, look));
                }
                Some(_) => {}
            }
        }
        if let Some((until, failed)) = &blame {
            if running == 0 || Instant::now() >= *until {
                if let Some((rank, outcome)) = root_cause(failed) {
                    if running > 0 {
                        eprintln!(
                            "symcomm launch: rank {rank} exited with status {outcome}; stopping the other ranks"
                        );
                    } else {
                        eprintln!("symcomm launch: rank {rank} exited with status {outcome}");
                    }
                    signal_all(ranks, Signal::SIGTERM);
                    stopping = Some((Stopping::Failed(outcome), Instant::now() + grace, false));
                }
                blame = None;
            }
        }
        if stopping.is_none()
            && blame.is_none()
            && running > 0
            && args.timeout.is_some_and(|t| start.elapsed() >= t)
        {
            eprintln!(
                "symcomm launch: the job ran longer than --timeout {:?}; stopping every rank",
                args.timeout.unwrap_or_default()
            );
            signal_all(ranks, Signal::SIGTERM);
            stopping = Some((Stopping::TimedOut, Instant::now() + grace, false));
        }

        if running == 0 && stopping.is_none() {
            return 0;
        }
        if let Some((why, deadline, killed)) = &mut stopping {
            if running == 0 {
                // Whatever the ranks left behind in their groups goes too.
                signal_all(ranks, Signal::SIGKILL);
                return match why {
                    Stopping::Failed(outcome) => outcome.exit_code(),
                    Stopping::TimedOut => TIMED_OUT,
                };
            }
            if !*killed && Instant::now() >= *deadline {
                let left: Vec<usize> = ranks
                    .iter()
                    .enumerate()
                    .filter(|(_, rank)| rank.outcome.is_none())
                    .map(|(r, _)| r)
                    .collect();
                eprintln!(
                    "symcomm launch: ranks {left:?} still running {} ms after SIGTERM; killing them",
                    grace.as_millis()
                );
                signal_all(ranks, Signal::SIGKILL);
                *killed = true;
            }
        }
        // Until a rank exits (SIGCHLD), a signal to forward arrives, or the next check.
        let wait = match &blame {
            Some((until, _)) => until.saturating_duration_since(Instant::now()).min(POLL),
            None => POLL,
        };
        match signals.recv_timeout(wait) {
            Ok(sig) => woken_by = Some(sig),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            // The signal thread is gone (it never ends by itself): poll at the plain rate.
            Err(mpsc::RecvTimeoutError::Disconnected) => thread::sleep(wait),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::collections::HashMap;

    use clap::Parser;
    use symcomm::bootstrap::{BootstrapConfig, Launcher, LocalHint};

    use super::*;
    use crate::{Cli, Command as Sub};

    #[test]
    fn launcher_variables_make_rank_r_of_n_with_the_id() {
        let id = fresh_id().unwrap();
        assert_eq!(id.addr().ip(), Ipv4Addr::LOCALHOST);
        assert_ne!(id.addr().port(), 0);
        let text = id.to_string();
        assert!(text.starts_with("symcomm1:127.0.0.1:"), "{text}");
        for nranks in [1u32, 3, 8, MAX_LAUNCH_RANKS] {
            for rank in [0, nranks / 2, nranks - 1] {
                let vars: HashMap<&str, String> =
                    rank_env(&text, rank, nranks).into_iter().collect();
                assert!(!vars.contains_key("MASTER_ADDR") && !vars.contains_key("MASTER_PORT"));
                let config = BootstrapConfig::from_vars(|name| vars.get(name).cloned()).unwrap();
                assert_eq!(config.rank, rank);
                assert_eq!(config.nranks, nranks);
                assert_eq!(config.id, id);
                assert_eq!(config.id.fingerprint(), id.fingerprint());
                assert_eq!(config.launcher, Launcher::Torchrun);
                assert_eq!(
                    config.local_hint,
                    Some(LocalHint {
                        local_rank: rank,
                        local_size: Some(nranks)
                    })
                );
                assert!(config.authenticated);
            }
        }
    }

    #[test]
    fn every_launch_gets_its_own_secret() {
        let a = fresh_id().unwrap();
        let b = fresh_id().unwrap();
        assert_ne!(a.fingerprint(), b.fingerprint());
    }

    #[test]
    fn exit_statuses_follow_the_shell_convention() {
        assert_eq!(Outcome::Exited(0).exit_code(), 0);
        assert!(Outcome::Exited(0).success());
        assert_eq!(Outcome::Exited(7).exit_code(), 7);
        assert!(!Outcome::Exited(7).success());
        assert_eq!(Outcome::Signaled(9).exit_code(), 137);
        assert!(!Outcome::Signaled(15).success());
        assert_eq!(Outcome::Signaled(9).to_string(), "137 (killed by SIGKILL)");
        assert_eq!(Outcome::Exited(3).to_string(), "3");
    }

    #[test]
    fn the_root_cause_is_a_kill_then_the_first_seen_then_the_lowest_rank() {
        use Outcome::{Exited, Signaled};
        assert_eq!(root_cause(&[]), None);
        // kill -9 of rank 1, seen after the ranks that lost it.
        assert_eq!(
            root_cause(&[(0, Exited(3), 1), (1, Signaled(9), 2), (2, Exited(3), 2)]),
            Some((1, Signaled(9)))
        );
        // A crash beats ranks that aborted or got SIGPIPE because of it.
        assert_eq!(
            root_cause(&[
                (0, Signaled(6), 1),
                (1, Signaled(13), 1),
                (3, Signaled(11), 2)
            ]),
            Some((3, Signaled(11)))
        );
        // Otherwise the first seen, then the lowest rank.
        assert_eq!(
            root_cause(&[(1, Signaled(6), 2), (4, Exited(7), 1)]),
            Some((4, Exited(7)))
        );
        assert_eq!(
            root_cause(&[(4, Exited(7), 1), (1, Exited(3), 1)]),
            Some((1, Exited(3)))
        );
    }

    fn parse(args: &[&str]) -> Result<LaunchArgs, clap::Error> {
        let cli = Cli::try_parse_from(["symcomm", "launch"].iter().chain(args))?;
        match cli.command {
            Sub::Launch(args) => Ok(args),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn everything_after_the_program_belongs_to_it() {
        let a = parse(&["-n", "2", "prog", "-n", "3", "--timeout", "x"]).unwrap();
        assert_eq!(a.nranks, 2);
        assert_eq!(a.command, ["prog", "-n", "3", "--timeout", "x"]);
        assert_eq!(a.grace_ms, 3000);
        assert!(!a.no_prefix && a.timeout.is_none());
        let a = parse(&["--nranks=4", "--no-prefix", "--timeout", "1.5", "--", "-x"]).unwrap();
        assert_eq!((a.nranks, a.no_prefix), (4, true));
        assert_eq!(a.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(a.command, ["-x"]);
    }

    #[test]
    fn bad_arguments_are_usage_errors() {
        for bad in [
            &["-n", "0", "prog"][..],
            &["-n", "1025", "prog"],
            &["-n", "2"],
            &["prog"],
            &["-n", "2", "--timeout", "0", "prog"],
            &["-n", "2", "--timeout", "-1", "prog"],
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
        }
    }
}

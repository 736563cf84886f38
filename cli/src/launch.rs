//! `symcomm launch -n N [--] PROGRAM [ARGS]...`: runs N copies of a program on this machine as
//! ranks `0..N` of one job — a small local stand-in for `torchrun` / `mpirun`. With
//! `--nnodes M --node-rank K --master-addr HOST [--master-port P]` it starts the N ranks of host
//! K of a job on M hosts (one `symcomm launch` per host, as with torchrun's options of the same
//! names): ranks `K*N .. K*N+N` of `M*N`.
//!
//! - **Several hosts.** Every rank gets `RANK` (global), `WORLD_SIZE=M*N`, `LOCAL_RANK`,
//!   `LOCAL_WORLD_SIZE=N`, `MASTER_ADDR=HOST`, `MASTER_PORT=P` (default 29500; symcomm's root,
//!   global rank 0 on host 0, listens on `P + 1`, torch's store keeps `P`) and
//!   `SYMCOMM_LAUNCHER=symcomm`; an inherited `SYMCOMM_ID` is removed. The hosts cannot agree
//!   on a fresh secret, so `SYMCOMM_SECRET` (32 hex digits, the same on every host) must be set
//!   in the launcher's environment, and the ranks inherit it. Each host's launcher supervises
//!   only its own ranks: when a rank on another host dies, the ranks here learn it from symcomm
//!   (`PeerLost`) and fail, and this launcher then stops the rest as below.
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
use std::net::{Ipv4Addr, SocketAddr};
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
/// Most hosts of one job.
const MAX_NODES: u32 = 1 << 16;
/// Most ranks of one job across hosts (symcomm's ranks across hosts fit in 20 bits).
const MAX_JOB_RANKS: u64 = 1 << 20;
/// `--master-port`'s default (torchrun's).
const DEFAULT_MASTER_PORT: u16 = 29500;
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
    /// Number of ranks (copies of PROGRAM) to start on this host, 1 to 1024.
    #[arg(
        short = 'n',
        long = "nranks",
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_LAUNCH_RANKS))
    )]
    nranks: u32,

    /// Number of hosts of the job: run one `symcomm launch` with the same -n on each, with
    /// --node-rank 0..NNODES and the same --master-addr / --master-port and SYMCOMM_SECRET.
    #[arg(
        long,
        value_name = "NNODES",
        default_value_t = 1,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_NODES))
    )]
    nnodes: u32,

    /// This host's index among the job's hosts, 0 to NNODES-1: its ranks are
    /// NODE_RANK*N .. NODE_RANK*N+N-1.
    #[arg(long, value_name = "K", default_value_t = 0)]
    node_rank: u32,

    /// Address (name or IP) of host 0, where rank 0 runs the rendezvous (required with --nnodes > 1).
    #[arg(long, value_name = "HOST")]
    master_addr: Option<String>,

    /// MASTER_PORT for the ranks (torch's store port); symcomm's rendezvous listens on PORT + 1.
    #[arg(long, value_name = "PORT", default_value_t = DEFAULT_MASTER_PORT)]
    master_port: u16,

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

/// Where the ranks meet.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Rendezvous {
    /// Every rank is here: a fresh id (`SYMCOMM_ID`), its root on 127.0.0.1.
    Local(String),
    /// Ranks on several hosts: `MASTER_ADDR` / `MASTER_PORT`, the secret from `SYMCOMM_SECRET`.
    Hosts { addr: String, port: u16 },
}

/// The ranks this launcher starts and the job they belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Job {
    rendezvous: Rendezvous,
    /// The global rank of the first one.
    first: u32,
    /// How many (this host's ranks).
    count: u32,
    /// Ranks of the whole job.
    world: u32,
}

impl Job {
    /// The job `args` describe. `secret` is `SYMCOMM_SECRET` from the launcher's environment
    /// (checked, never echoed). A single-host job gets a fresh id (`fresh`).
    fn from_args(
        args: &LaunchArgs,
        secret: Option<&str>,
        fresh: impl FnOnce() -> symcomm::Result<UniqueId>,
    ) -> Result<Job, String> {
        let count = args.nranks;
        if count == 0 || count > MAX_LAUNCH_RANKS {
            return Err(format!("-n must be 1 to {MAX_LAUNCH_RANKS}, got {count}"));
        }
        if args.node_rank >= args.nnodes {
            return Err(format!(
                "--node-rank must be 0 to {} (--nnodes {}), got {}",
                args.nnodes - 1,
                args.nnodes,
                args.node_rank
            ));
        }
        if args.nnodes == 1 {
            if args.master_addr.is_some() {
                return Err(
                    "--master-addr is for jobs on several hosts (--nnodes > 1); \
                            one host's ranks meet on 127.0.0.1"
                        .into(),
                );
            }
            let id = fresh().map_err(|e| format!("cannot make a bootstrap id: {e}"))?;
            return Ok(Job {
                rendezvous: Rendezvous::Local(id.to_string()),
                first: 0,
                count,
                world: count,
            });
        }
        let world = u64::from(count) * u64::from(args.nnodes);
        if world > MAX_JOB_RANKS {
            return Err(format!(
                "-n {count} x --nnodes {} = {world} ranks; at most {MAX_JOB_RANKS}",
                args.nnodes
            ));
        }
        let Some(addr) = args.master_addr.clone().filter(|a| !a.trim().is_empty()) else {
            return Err(format!(
                "--nnodes {} needs --master-addr: the address of host 0 (--node-rank 0), \
                 where rank 0 runs the rendezvous",
                args.nnodes
            ));
        };
        match secret.map(str::trim) {
            None | Some("") => {
                return Err(
                    "a job on several hosts needs SYMCOMM_SECRET: the same 32 hex digits \
                            in every host's environment (e.g. `openssl rand -hex 16`), so that \
                            only this job's ranks can join"
                        .into(),
                );
            }
            Some(s) if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) => {
                return Err(format!(
                    "SYMCOMM_SECRET must be 32 hex digits (128 bits), got {} characters",
                    s.chars().count()
                ));
            }
            Some(_) => {}
        }
        if args.master_port == u16::MAX {
            return Err(format!(
                "--master-port {}: the rendezvous listens on PORT + 1, which is not a port",
                args.master_port
            ));
        }
        Ok(Job {
            rendezvous: Rendezvous::Hosts {
                addr,
                port: args.master_port,
            },
            first: args.node_rank * count,
            count,
            // At most MAX_JOB_RANKS (checked above).
            world: u32::try_from(world).unwrap_or(u32::MAX),
        })
    }

    /// The variables this launcher's `i`-th rank gets (besides the launcher's own environment).
    fn rank_env(&self, i: u32) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("RANK", (self.first + i).to_string()),
            ("WORLD_SIZE", self.world.to_string()),
            ("LOCAL_RANK", i.to_string()),
            ("LOCAL_WORLD_SIZE", self.count.to_string()),
            ("SYMCOMM_LAUNCHER", "symcomm".to_owned()),
        ];
        match &self.rendezvous {
            Rendezvous::Local(id) => env.push(("SYMCOMM_ID", id.clone())),
            Rendezvous::Hosts { addr, port } => {
                env.push(("MASTER_ADDR", addr.clone()));
                env.push(("MASTER_PORT", port.to_string()));
            }
        }
        env
    }

    /// The inherited variable that would conflict with the rendezvous (`SYMCOMM_ID` and
    /// `SYMCOMM_SECRET` cannot both be set).
    fn conflicting_var(&self) -> &'static str {
        match self.rendezvous {
            Rendezvous::Local(_) => "SYMCOMM_SECRET",
            Rendezvous::Hosts { .. } => "SYMCOMM_ID",
        }
    }
}

/// A fresh id rooted at `127.0.0.1` on a port that is free now and outside the kernel's
/// ephemeral range ([`symcomm::bootstrap::free_port`]).
///
/// Not [`UniqueId::new_on`]: that keeps the port's listening socket in *this* process for an
/// in-process rank 0, and rank 0 here is a child that must bind the port itself.
fn fresh_id() -> symcomm::Result<UniqueId> {
    let port = symcomm::bootstrap::free_port(Ipv4Addr::LOCALHOST.into())?;
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
    let secret = std::env::var("SYMCOMM_SECRET").ok();
    let job = match Job::from_args(args, secret.as_deref(), fresh_id) {
        Ok(job) => job,
        Err(msg) => return usage_error(msg),
    };
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

    let prefixed = !args.no_prefix;
    let width = (job.world - 1).to_string().len();
    let stdin_to_rank0 = !io::stdin().is_terminal();
    let (pump_done_tx, pump_done) = mpsc::channel::<()>();
    let mut pumps = 0usize;
    let mut ranks: Vec<Rank> = Vec::with_capacity(job.count as usize);
    for i in 0..job.count {
        let r = job.first + i;
        let mut cmd = Command::new(program);
        cmd.args(program_args)
            .env_remove(job.conflicting_var())
            .envs(job.rank_env(i))
            .process_group(0)
            .stdin(if i == 0 && stdin_to_rank0 {
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

    let code = supervise(&mut ranks, job.first, &signals, args);

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
/// Ranks are named globally: `ranks[i]` is rank `first + i`.
fn supervise(
    ranks: &mut [Rank],
    first: u32,
    signals: &mpsc::Receiver<Signal>,
    args: &LaunchArgs,
) -> u8 {
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
                if let Some((i, outcome)) = root_cause(failed) {
                    let rank = u64::from(first) + i as u64;
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
                let left: Vec<u64> = ranks
                    .iter()
                    .enumerate()
                    .filter(|(_, rank)| rank.outcome.is_none())
                    .map(|(i, _)| u64::from(first) + i as u64)
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
            let args = parse(&["-n", &nranks.to_string(), "prog"]).unwrap();
            let job = Job::from_args(&args, Some("not even hex"), || Ok(id.clone())).unwrap();
            assert_eq!(job.rendezvous, Rendezvous::Local(text.clone()));
            assert_eq!(job.conflicting_var(), "SYMCOMM_SECRET");
            for rank in [0, nranks / 2, nranks - 1] {
                let vars: HashMap<&str, String> = job.rank_env(rank).into_iter().collect();
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

    const SECRET: &str = "00112233445566778899aabbccddeeff";

    #[test]
    fn several_hosts_number_ranks_host_by_host_and_meet_at_the_master() {
        let mut roots = Vec::new();
        for node in 0..3u32 {
            let node_rank = node.to_string();
            let args = parse(&[
                "-n",
                "4",
                "--nnodes",
                "3",
                "--node-rank",
                &node_rank,
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                "4000",
                "prog",
            ])
            .unwrap();
            let job =
                Job::from_args(&args, Some(SECRET), || panic!("no fresh id across hosts")).unwrap();
            assert_eq!((job.first, job.count, job.world), (node * 4, 4, 12));
            assert_eq!(job.conflicting_var(), "SYMCOMM_ID");
            for i in 0..4 {
                let mut vars: HashMap<&str, String> = job.rank_env(i).into_iter().collect();
                assert_eq!(vars["MASTER_PORT"], "4000");
                assert!(!vars.contains_key("SYMCOMM_ID"));
                vars.insert("SYMCOMM_SECRET", SECRET.to_owned());
                let config = BootstrapConfig::from_vars(|name| vars.get(name).cloned()).unwrap();
                assert_eq!((config.rank, config.nranks), (node * 4 + i, 12));
                assert_eq!(
                    config.local_hint,
                    Some(LocalHint {
                        local_rank: i,
                        local_size: Some(4)
                    })
                );
                assert!(config.authenticated);
                // torch's store keeps MASTER_PORT; symcomm's root listens on the next port.
                assert_eq!(
                    config.id.addr(),
                    SocketAddr::from((Ipv4Addr::LOCALHOST, 4001))
                );
                roots.push(config.id.fingerprint());
            }
        }
        // Every rank of every host derives the same id (root and secret).
        assert!(roots.windows(2).all(|w| w[0] == w[1]));
        // The default port is torchrun's.
        let args = parse(&["-n", "1", "--nnodes", "2", "--master-addr", "h0", "prog"]).unwrap();
        let job = Job::from_args(&args, Some(SECRET), || panic!("fresh")).unwrap();
        assert_eq!(
            job.rendezvous,
            Rendezvous::Hosts {
                addr: "h0".into(),
                port: 29500
            }
        );
    }

    #[test]
    fn several_hosts_need_a_master_a_secret_and_a_node_rank_in_range() {
        let job = |argv: &[&str], secret: Option<&str>| {
            let args = parse(argv).unwrap();
            Job::from_args(&args, secret, fresh_id)
        };
        let two = ["-n", "2", "--nnodes", "2", "--master-addr", "10.0.0.1"];
        let with = |extra: &[&'static str]| -> Vec<&'static str> {
            two.iter().chain(extra).copied().collect()
        };
        let e = job(&with(&["--node-rank", "2", "p"]), Some(SECRET)).unwrap_err();
        assert!(e.contains("--node-rank must be 0 to 1"), "{e}");
        let e = job(&["-n", "2", "--nnodes", "2", "p"], Some(SECRET)).unwrap_err();
        assert!(e.contains("needs --master-addr"), "{e}");
        let e = job(&with(&["p"]), None).unwrap_err();
        assert!(e.contains("needs SYMCOMM_SECRET"), "{e}");
        let leaked = "0123456789abcdef-not-a-secret-at-all";
        let e = job(&with(&["p"]), Some(leaked)).unwrap_err();
        assert!(e.contains("32 hex digits") && !e.contains(leaked), "{e}");
        let e = job(&with(&["--master-port", "65535", "p"]), Some(SECRET)).unwrap_err();
        assert!(e.contains("not a port"), "{e}");
        let e = job(&["-n", "2", "--master-addr", "10.0.0.1", "p"], Some(SECRET)).unwrap_err();
        assert!(e.contains("several hosts"), "{e}");
        let e = job(
            &["-n", "1024", "--nnodes", "2000", "--master-addr", "a", "p"],
            Some(SECRET),
        )
        .unwrap_err();
        assert!(e.contains("at most 1048576"), "{e}");
        for bad in [
            &["-n", "2", "--nnodes", "0", "p"][..],
            &["-n", "2", "--node-rank", "x", "p"],
        ] {
            assert_eq!(parse(bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
        assert!(job(&with(&["--node-rank", "1", "p"]), Some(SECRET)).is_ok());
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

//! Rank 0: listen, handshake each connection on its own thread, admit authenticated ranks, and
//! hand out the rank table — or stop everyone with a clear verdict.
//!
//! One coordinator (the caller's thread) owns all state: it polls the listener, a wake-up
//! socket and the admitted ranks' connections. Handshake threads only read, check and prove;
//! they pass authenticated connections to the coordinator over a channel, which decides (rank
//! checks, duplicates) and answers. So a slow or hostile connection can only ever hold its own
//! thread, for at most its handshake deadline.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::auth::{self, Label, Nonce};
use super::id::{self, Reserved, Secret};
use super::net;
use super::wire::{
    self, Abort, AbortCode, Auth, Challenge, Claims, FrameError, FrameType, Hello, read_frame,
    remaining, write_frame,
};
use super::{
    Bootstrap, BootstrapConfig, DEFAULT_HANDSHAKE_TIMEOUT, MAX_PENDING_HANDSHAKES,
    PROTOCOL_VERSION, RankInfo, RootLink, StrayStats,
};
use crate::{BootstrapErrorKind, Error, Result};

/// How long the root gives a small write (a verdict, a table) to an admitted rank.
const WRITE_GRACE: Duration = Duration::from_secs(2);

fn io_err(what: &str) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        what: what.to_owned(),
        source,
    }
}

pub(super) fn run(config: &BootstrapConfig, host_id: String, start: Instant) -> Result<Bootstrap> {
    let deadline = start + config.timeout;
    let addr = config.id.addr();
    let listener = match id::take_reservation(&config.id) {
        Reserved::Listener(l) => l,
        Reserved::Consumed => {
            return Err(Error::InvalidArgument(format!(
                "UniqueId for {addr} (secret fingerprint {}) was already used by an earlier init \
                 in this process; ids are single-use, create a new one per rendezvous",
                config.id.fingerprint()
            )));
        }
        Reserved::NotHere => {
            net::bind_listener(addr, (config.timeout / 4).min(Duration::from_secs(2)))?
        }
    };
    let me = RankInfo {
        rank: 0,
        host_id,
        addr: addr.ip(),
        pid: std::process::id(),
    };
    if config.nranks == 1 {
        return Bootstrap::new(
            config,
            vec![me],
            RootLink::Root { peers: vec![None] },
            StrayStats::default(),
        );
    }

    let mut root = Root::new(config, listener, deadline)?;
    let result = root.rendezvous().and_then(|()| root.send_tables(me));
    let strays = root.finish();
    let (table, peers) = result?;
    if strays.total() > 0 {
        tracing::warn!(
            target: "symcomm::bootstrap",
            "root {addr}: dropped {} stray connection(s) during the rendezvous: {strays:?}",
            strays.total()
        );
    }
    Bootstrap::new(config, table, RootLink::Root { peers }, strays)
}

/// An admitted rank.
struct Member {
    stream: TcpStream,
    peer: SocketAddr,
    claims: Claims,
    client_nonce: Nonce,
    root_nonce: Nonce,
}

/// What a handshake thread hands the coordinator.
struct Joined {
    conn: u64,
    stream: TcpStream,
    peer: SocketAddr,
    claims: Claims,
    /// The claim bytes exactly as received (the root's proof covers them).
    body: Vec<u8>,
    client_nonce: Nonce,
    root_nonce: Nonce,
}

/// How a handshake thread ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Joined,
    ClosedEarly,
    Malformed,
    TimedOut,
    AuthFailed,
    VersionMismatch,
}

struct Pending {
    handle: JoinHandle<Outcome>,
    /// Shut down when the rendezvous ends, to cut the handshake short.
    stream: TcpStream,
    /// Set before that shutdown, so the thread counts its end as cut short rather than as the
    /// peer's doing.
    cut: Arc<AtomicBool>,
}

struct Root<'a> {
    config: &'a BootstrapConfig,
    listener: TcpListener,
    deadline: Instant,
    handshake_timeout: Duration,
    wake_rx: UnixStream,
    wake_tx: Arc<UnixStream>,
    tx: Sender<Joined>,
    rx: Receiver<Joined>,
    pending: HashMap<u64, Pending>,
    /// Handshake threads that passed their connection on; joined at the end.
    handed_over: Vec<JoinHandle<Outcome>>,
    next_conn: u64,
    members: Vec<Option<Member>>,
    strays: StrayStats,
}

impl<'a> Root<'a> {
    fn new(config: &'a BootstrapConfig, listener: TcpListener, deadline: Instant) -> Result<Self> {
        listener
            .set_nonblocking(true)
            .map_err(io_err("setting the bootstrap listener non-blocking"))?;
        let (wake_rx, wake_tx) =
            UnixStream::pair().map_err(io_err("creating the bootstrap wake-up socket"))?;
        wake_rx
            .set_nonblocking(true)
            .map_err(io_err("setting the wake-up socket non-blocking"))?;
        wake_tx
            .set_nonblocking(true)
            .map_err(io_err("setting the wake-up socket non-blocking"))?;
        let (tx, rx) = mpsc::channel();
        let handshake_timeout = config
            .handshake_timeout
            .unwrap_or(DEFAULT_HANDSHAKE_TIMEOUT.min(config.timeout));
        Ok(Root {
            config,
            listener,
            deadline,
            handshake_timeout,
            wake_rx,
            wake_tx: Arc::new(wake_tx),
            tx,
            rx,
            pending: HashMap::new(),
            handed_over: Vec::new(),
            next_conn: 0,
            members: (0..config.nranks).map(|_| None).collect(),
            strays: StrayStats::default(),
        })
    }

    fn joined(&self) -> u32 {
        self.members.iter().filter(|m| m.is_some()).count() as u32
    }

    /// Runs until every rank joined, the deadline passed, or a fatal disagreement.
    fn rendezvous(&mut self) -> Result<()> {
        loop {
            self.reap();
            while let Ok(j) = self.rx.try_recv() {
                self.admit(j)?;
            }
            if self.joined() + 1 == self.config.nranks {
                return Ok(());
            }
            let Some(left) = remaining(self.deadline) else {
                return Err(self.time_out());
            };
            let ms = left.as_millis().clamp(1, 250) as u16;
            let ranks: Vec<usize> = (0..self.members.len())
                .filter(|&r| self.members[r].is_some())
                .collect();
            let ready: Vec<bool> = {
                let mut fds = vec![
                    PollFd::new(self.listener.as_fd(), PollFlags::POLLIN),
                    PollFd::new(self.wake_rx.as_fd(), PollFlags::POLLIN),
                ];
                for &r in &ranks {
                    if let Some(m) = &self.members[r] {
                        fds.push(PollFd::new(m.stream.as_fd(), PollFlags::POLLIN));
                    }
                }
                match poll(&mut fds, PollTimeout::from(ms)) {
                    Ok(_) => {}
                    Err(Errno::EINTR) => continue,
                    Err(e) => {
                        return Err(Error::Io {
                            what: "polling the bootstrap sockets".into(),
                            source: io::Error::from(e),
                        });
                    }
                }
                fds.iter()
                    .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                    .collect()
            };
            if ready[0] {
                self.accept_all();
            }
            if ready[1] {
                let mut buf = [0u8; 64];
                while matches!((&self.wake_rx).read(&mut buf), Ok(n) if n > 0) {}
            }
            for (i, &r) in ranks.iter().enumerate() {
                if ready.get(2 + i).copied().unwrap_or(false) {
                    self.check_member(r);
                }
            }
        }
    }

    /// Accepts every queued connection and starts its handshake.
    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => self.start_handshake(stream, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(
                        target: "symcomm::bootstrap",
                        "root {}: accept failed: {e}",
                        self.config.id.addr()
                    );
                    std::thread::sleep(Duration::from_millis(10));
                    return;
                }
            }
        }
    }

    fn start_handshake(&mut self, stream: TcpStream, peer: SocketAddr) {
        if self.pending.len() >= MAX_PENDING_HANDSHAKES {
            self.strays.overflow += 1;
            tracing::warn!(
                target: "symcomm::bootstrap",
                "root {}: dropped connection from {peer}: {MAX_PENDING_HANDSHAKES} handshakes \
                 already running",
                self.config.id.addr()
            );
            return;
        }
        let clone = match stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_nodelay(true))
            .and_then(|()| stream.try_clone())
        {
            Ok(c) => c,
            Err(e) => {
                self.strays.overflow += 1;
                tracing::warn!(
                    target: "symcomm::bootstrap",
                    "root {}: dropped connection from {peer}: {e}",
                    self.config.id.addr()
                );
                return;
            }
        };
        let conn = self.next_conn;
        self.next_conn += 1;
        let cut = Arc::new(AtomicBool::new(false));
        let ctx = Handshake {
            conn,
            peer,
            root: self.config.id.addr(),
            secret: self.config.id.secret().clone(),
            nranks: self.config.nranks,
            deadline: (Instant::now() + self.handshake_timeout).min(self.deadline),
            cut: Arc::clone(&cut),
            tx: self.tx.clone(),
            wake: Arc::clone(&self.wake_tx),
        };
        match std::thread::Builder::new()
            .name("symcomm-bootstrap-handshake".into())
            .spawn(move || ctx.run(stream))
        {
            Ok(handle) => {
                self.pending.insert(
                    conn,
                    Pending {
                        handle,
                        stream: clone,
                        cut,
                    },
                );
            }
            Err(e) => {
                self.strays.overflow += 1;
                tracing::warn!(
                    target: "symcomm::bootstrap",
                    "root {}: dropped connection from {peer}: cannot start a thread: {e}",
                    self.config.id.addr()
                );
            }
        }
    }

    /// Joins finished handshake threads and counts their outcomes.
    fn reap(&mut self) {
        let done: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.handle.is_finished())
            .map(|(&c, _)| c)
            .collect();
        for conn in done {
            if let Some(p) = self.pending.remove(&conn) {
                let outcome = p.handle.join().unwrap_or(Outcome::Malformed);
                self.count(outcome);
            }
        }
    }

    fn count(&mut self, outcome: Outcome) {
        let s = &mut self.strays;
        match outcome {
            Outcome::Joined => {}
            Outcome::ClosedEarly => s.closed_early += 1,
            Outcome::Malformed => s.malformed += 1,
            Outcome::TimedOut => s.timed_out += 1,
            Outcome::AuthFailed => s.auth_failed += 1,
            Outcome::VersionMismatch => s.version_mismatch += 1,
        }
    }

    /// Decides on an authenticated connection.
    fn admit(&mut self, j: Joined) -> Result<()> {
        if let Some(p) = self.pending.remove(&j.conn) {
            // The thread's only remaining step is to return; its stream now lives in `j`.
            self.handed_over.push(p.handle);
        }
        let nranks = self.config.nranks;
        let c = &j.claims;
        if c.nranks != nranks {
            let detail = format!(
                "rank {} (pid {}, {}) was started with nranks = {}, but the root has nranks = \
                 {nranks}; every rank must be given the same number of ranks",
                c.rank, c.pid, j.peer, c.nranks
            );
            return Err(self.stop_all(
                Some(&j.stream),
                AbortCode::NranksMismatch,
                nranks,
                BootstrapErrorKind::NranksMismatch,
                detail,
            ));
        }
        if c.rank == 0 {
            let detail = format!(
                "rank 0 joined as a client (pid {}, {}), but rank 0 is the root at {}; every \
                 process needs its own rank",
                c.pid,
                j.peer,
                self.config.id.addr()
            );
            return Err(self.stop_all(
                Some(&j.stream),
                AbortCode::DuplicateRank,
                0,
                BootstrapErrorKind::DuplicateRank,
                detail,
            ));
        }
        if c.rank >= nranks {
            self.strays.bad_rank += 1;
            let message = format!("rank {} is out of range for {nranks} ranks", c.rank);
            tracing::warn!(
                target: "symcomm::bootstrap",
                "root {}: refused {}: {message}",
                self.config.id.addr(),
                j.peer
            );
            let abort = Abort {
                code: AbortCode::RankOutOfRange,
                value: c.rank,
                missing: Vec::new(),
                message,
            };
            let _ = write_frame(&j.stream, &abort.encode(), Instant::now() + WRITE_GRACE);
            return Ok(());
        }
        let r = c.rank as usize;
        if let Some(old) = &self.members[r] {
            if alive(&old.stream) {
                let detail = format!(
                    "rank {r} joined twice: pid {} at {} and pid {} at {}; every process needs \
                     its own rank",
                    old.claims.pid, old.peer, c.pid, j.peer
                );
                return Err(self.stop_all(
                    Some(&j.stream),
                    AbortCode::DuplicateRank,
                    c.rank,
                    BootstrapErrorKind::DuplicateRank,
                    detail,
                ));
            }
            tracing::warn!(
                target: "symcomm::bootstrap",
                "root {}: rank {r} rejoined from {} (its connection from {} had closed)",
                self.config.id.addr(),
                j.peer,
                old.peer
            );
            self.members[r] = None;
        }
        let proof = auth::mac(
            self.config.id.secret(),
            Label::Root,
            &j.client_nonce,
            &j.root_nonce,
            &j.body,
        );
        match write_frame(
            &j.stream,
            &wire::encode_welcome(&proof),
            Instant::now() + WRITE_GRACE,
        ) {
            Ok(()) => {
                tracing::debug!(
                    target: "symcomm::bootstrap",
                    "root {}: rank {r} joined from {} (pid {}, host {})",
                    self.config.id.addr(),
                    j.peer,
                    c.pid,
                    c.host_id
                );
                self.members[r] = Some(Member {
                    stream: j.stream,
                    peer: j.peer,
                    claims: j.claims,
                    client_nonce: j.client_nonce,
                    root_nonce: j.root_nonce,
                });
            }
            Err(e) => tracing::warn!(
                target: "symcomm::bootstrap",
                "root {}: rank {r} from {} left during its handshake: {e}",
                self.config.id.addr(),
                j.peer
            ),
        }
        Ok(())
    }

    /// An admitted rank's connection became readable before the table went out: it closed
    /// (the rank is missing again and may rejoin) or broke protocol (dropped).
    fn check_member(&mut self, r: usize) {
        let Some(m) = &self.members[r] else { return };
        match peek(&m.stream) {
            Liveness::Alive => {}
            Liveness::Closed => {
                tracing::warn!(
                    target: "symcomm::bootstrap",
                    "root {}: rank {r} ({}) closed its connection before the rendezvous \
                     finished; waiting for it to rejoin",
                    self.config.id.addr(),
                    m.peer
                );
                self.members[r] = None;
            }
            Liveness::Unexpected => {
                tracing::warn!(
                    target: "symcomm::bootstrap",
                    "root {}: rank {r} ({}) sent data out of turn; dropped",
                    self.config.id.addr(),
                    m.peer
                );
                self.members[r] = None;
            }
        }
    }

    fn time_out(&mut self) -> Error {
        let missing: Vec<u32> = (1..self.config.nranks)
            .filter(|&r| self.members[r as usize].is_none())
            .collect();
        let message = format!(
            "{} of {} ranks joined the root at {} within {:?}",
            self.joined() + 1,
            self.config.nranks,
            self.config.id.addr(),
            self.config.timeout
        );
        self.broadcast(&Abort {
            code: AbortCode::Timeout,
            value: 0,
            missing: missing.clone(),
            message,
        });
        Error::InitTimeout {
            rank: 0,
            missing,
            timeout_ms: u64::try_from(self.config.timeout.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// Stops the rendezvous for everyone (admitted ranks and `extra`) with the same verdict.
    fn stop_all(
        &mut self,
        extra: Option<&TcpStream>,
        code: AbortCode,
        value: u32,
        kind: BootstrapErrorKind,
        detail: String,
    ) -> Error {
        let abort = Abort {
            code,
            value,
            missing: Vec::new(),
            message: detail.clone(),
        };
        if let Some(s) = extra {
            let _ = write_frame(s, &abort.encode(), Instant::now() + WRITE_GRACE);
        }
        self.broadcast(&abort);
        Error::Bootstrap { kind, detail }
    }

    /// Sends `abort` to every admitted rank and closes their connections.
    fn broadcast(&mut self, abort: &Abort) {
        let frame = abort.encode();
        let until = Instant::now() + WRITE_GRACE;
        for m in self.members.iter_mut().filter_map(Option::take) {
            let _ = write_frame(&m.stream, &frame, until);
        }
    }

    /// Sends every rank the table, each with its own MAC.
    fn send_tables(&mut self, me: RankInfo) -> Result<(Vec<RankInfo>, Vec<Option<TcpStream>>)> {
        let mut table = vec![me];
        for m in self.members.iter().flatten() {
            table.push(RankInfo {
                rank: m.claims.rank,
                host_id: m.claims.host_id.clone(),
                addr: m.claims.addr,
                pid: m.claims.pid,
            });
        }
        let body = wire::encode_table_body(&table);
        let until = Instant::now() + WRITE_GRACE;
        let mut failed = None;
        for m in self.members.iter().flatten() {
            let tag = auth::mac(
                self.config.id.secret(),
                Label::Table,
                &m.client_nonce,
                &m.root_nonce,
                &body,
            );
            if let Err(e) = write_frame(&m.stream, &wire::encode_table(&body, &tag), until) {
                failed = Some((m.claims.rank, e));
                break;
            }
        }
        if let Some((rank, e)) = failed {
            let detail = format!("rank {rank} was lost while the root sent the rank table: {e}");
            return Err(self.stop_all(
                None,
                AbortCode::Stopped,
                rank,
                BootstrapErrorKind::Disconnected,
                detail,
            ));
        }
        let peers = std::mem::take(&mut self.members)
            .into_iter()
            .map(|m| {
                m.map(|m| {
                    let _ = m.stream.set_read_timeout(None);
                    let _ = m.stream.set_write_timeout(None);
                    m.stream
                })
            })
            .collect();
        Ok((table, peers))
    }

    /// Cuts every unfinished handshake short, joins every thread, and returns the counts.
    fn finish(mut self) -> StrayStats {
        for p in self.pending.values() {
            // A peer that already hung up ends its handshake by itself (its thread may just
            // not have run yet); only the ones still open are cut short.
            if !peer_hung_up(&p.stream) {
                p.cut.store(true, Ordering::SeqCst);
            }
            let _ = p.stream.shutdown(std::net::Shutdown::Both);
        }
        for (_, p) in std::mem::take(&mut self.pending) {
            let outcome = p.handle.join().unwrap_or(Outcome::Malformed);
            self.count(outcome);
        }
        for h in std::mem::take(&mut self.handed_over) {
            let _ = h.join();
        }
        // Connections authenticated after the end: drop them (their ranks see the close).
        while self.rx.try_recv().is_ok() {}
        self.strays
    }
}

enum Liveness {
    Alive,
    Closed,
    Unexpected,
}

fn peek(stream: &TcpStream) -> Liveness {
    if stream.set_nonblocking(true).is_err() {
        return Liveness::Closed;
    }
    let mut byte = [0u8; 1];
    let state = match stream.peek(&mut byte) {
        Ok(0) => Liveness::Closed,
        Ok(_) => Liveness::Unexpected,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Liveness::Alive,
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Liveness::Alive,
        Err(_) => Liveness::Closed,
    };
    let _ = stream.set_nonblocking(false);
    state
}

/// Whether the peer closed its side (FIN or reset), without consuming anything.
fn peer_hung_up(stream: &TcpStream) -> bool {
    // nix has no name for Linux's POLLRDHUP (peer shut down its writing side).
    let rdhup = PollFlags::from_bits_retain(nix::libc::POLLRDHUP);
    let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLIN | rdhup)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => fds[0]
            .revents()
            .is_some_and(|r| r.intersects(rdhup | PollFlags::POLLHUP | PollFlags::POLLERR)),
        Err(_) => false,
    }
}

fn alive(stream: &TcpStream) -> bool {
    !matches!(peek(stream), Liveness::Closed)
}

/// One connection's handshake, on its own thread.
struct Handshake {
    conn: u64,
    peer: SocketAddr,
    root: SocketAddr,
    secret: Secret,
    nranks: u32,
    deadline: Instant,
    /// Set when the rendezvous ended while this handshake was still open.
    cut: Arc<AtomicBool>,
    tx: Sender<Joined>,
    wake: Arc<UnixStream>,
}

impl Handshake {
    fn run(self, stream: TcpStream) -> Outcome {
        match self.steps(&stream) {
            Ok((claims, body, client_nonce, root_nonce)) => {
                let joined = Joined {
                    conn: self.conn,
                    stream,
                    peer: self.peer,
                    claims,
                    body,
                    client_nonce,
                    root_nonce,
                };
                if self.tx.send(joined).is_ok() {
                    // Non-blocking: a full wake-up buffer already means "look".
                    let _ = (&*self.wake).write(&[1]);
                }
                Outcome::Joined
            }
            Err((outcome, why)) => {
                if !self.cut.load(Ordering::SeqCst) {
                    tracing::warn!(
                        target: "symcomm::bootstrap",
                        "root {}: dropped connection from {}: {why}",
                        self.root,
                        self.peer
                    );
                }
                outcome
            }
        }
    }

    /// Classifies a read/write failure.
    fn failed(&self, e: FrameError) -> (Outcome, String) {
        if self.cut.load(Ordering::SeqCst) {
            return (Outcome::TimedOut, "the rendezvous ended first".into());
        }
        let outcome = match &e {
            FrameError::Eof => Outcome::ClosedEarly,
            FrameError::Timeout => Outcome::TimedOut,
            FrameError::Io(io) => match io.kind() {
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe => Outcome::ClosedEarly,
                _ => Outcome::Malformed,
            },
            FrameError::Truncated
            | FrameError::UnknownType(_)
            | FrameError::Unexpected(_)
            | FrameError::TooLong { .. }
            | FrameError::Malformed(_) => Outcome::Malformed,
        };
        (outcome, e.to_string())
    }

    fn refuse(&self, stream: &TcpStream, code: AbortCode, value: u32, message: String) {
        let abort = Abort {
            code,
            value,
            missing: Vec::new(),
            message,
        };
        let _ = write_frame(stream, &abort.encode(), self.deadline);
    }

    #[allow(clippy::type_complexity)]
    fn steps(
        &self,
        stream: &TcpStream,
    ) -> std::result::Result<(Claims, Vec<u8>, Nonce, Nonce), (Outcome, String)> {
        let (_, payload) = read_frame(stream, self.deadline, &[FrameType::Hello], self.nranks)
            .map_err(|e| self.failed(e))?;
        let hello = Hello::decode(&payload, PROTOCOL_VERSION)
            .map_err(|e| (Outcome::Malformed, e.to_string()))?;
        if hello.version != PROTOCOL_VERSION {
            let message = format!(
                "this root speaks bootstrap protocol version {PROTOCOL_VERSION}, the client {}",
                hello.version
            );
            self.refuse(
                stream,
                AbortCode::VersionMismatch,
                PROTOCOL_VERSION,
                message.clone(),
            );
            return Err((Outcome::VersionMismatch, message));
        }
        let root_nonce = auth::nonce().map_err(|e| (Outcome::Malformed, e.to_string()))?;
        let challenge = Challenge {
            version: PROTOCOL_VERSION,
            nonce: root_nonce,
        };
        write_frame(stream, &challenge.encode(), self.deadline).map_err(|e| self.failed(e))?;
        let (_, payload) = read_frame(stream, self.deadline, &[FrameType::Auth], self.nranks)
            .map_err(|e| self.failed(e))?;
        let (auth, body) =
            Auth::decode(&payload).map_err(|e| (Outcome::Malformed, e.to_string()))?;
        if !auth::verify(
            &self.secret,
            Label::Client,
            &hello.nonce,
            &root_nonce,
            body,
            &auth.mac,
        ) {
            self.refuse(
                stream,
                AbortCode::AuthFailed,
                0,
                "authentication failed".into(),
            );
            return Err((
                Outcome::AuthFailed,
                format!(
                    "authentication failed (claimed rank {}): wrong secret",
                    auth.claims.rank
                ),
            ));
        }
        Ok((auth.claims, body.to_vec(), hello.nonce, root_nonce))
    }
}

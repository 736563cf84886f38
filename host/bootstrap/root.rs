//! Rank 0: listen, handshake every connection without blocking, admit authenticated ranks,
//! and hand out the rank table — or stop everyone with a clear verdict.
//!
//! One coordinator (the caller's thread) does all of it with non-blocking sockets and one
//! `poll`: it accepts, reads each connection's frames as their bytes arrive, answers, checks
//! proofs, and watches the admitted ranks. An unauthenticated connection has no thread, slot
//! or buffer beyond its socket and the frame it is sending, and holds even that only until its
//! deadline or until a newer connection needs the room — the admission rule in the module docs
//! of `bootstrap`, which is what lets legitimate ranks in under a flood.

use std::collections::{BTreeSet, HashMap};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::auth::{self, Label, Nonce};
use super::id::{self, Reserved};
use super::net;
use super::wire::{
    self, Abort, AbortCode, Auth, Challenge, Claims, FrameError, FrameType, HEADER_LEN, Hello,
    decode_header, remaining, write_frame,
};
use super::{
    Bootstrap, BootstrapConfig, DEFAULT_HANDSHAKE_TIMEOUT, MAX_PENDING_HANDSHAKES,
    PROTOCOL_VERSION, RankInfo, RootLink, StrayStats,
};
use crate::{BootstrapErrorKind, Error, Result};

/// How long the root gives a small write (a verdict, a table) to an admitted rank.
const WRITE_GRACE: Duration = Duration::from_secs(2);
/// How long a new connection has to deliver its whole hello (capped by the handshake timeout).
/// A rank sends it as soon as it is connected, so only strays ever need more.
const HELLO_TIMEOUT: Duration = Duration::from_secs(1);
/// Most connections accepted per turn of the loop before the connections already held are
/// served again (the accept queue of a flooded port never empties).
const ACCEPT_BATCH: usize = 256;
/// The first this many dropped connections are logged one by one (warnings)…
const LOG_BURST: u32 = 8;
/// …the rest as one warning per this interval with the count (each also at debug level).
const LOG_EVERY: Duration = Duration::from_secs(1);
/// Most distinct ranks remembered as claimed by connections that failed authentication.
const MAX_AUTH_CLAIMS: usize = 64;
/// Fewest unauthenticated connections the root holds, whatever the descriptor limit.
const MIN_CAPACITY: usize = 16;

#[cfg(test)]
thread_local! {
    /// Tests: the capacity and hello deadline of roots run on this thread.
    static LIMITS_FOR_TESTS: std::cell::Cell<Option<(usize, Duration)>> =
        const { std::cell::Cell::new(None) };
}

/// How many unauthenticated connections the root holds at once: [`MAX_PENDING_HANDSHAKES`],
/// but at most a quarter of the process's file-descriptor limit, so that a flood cannot use up
/// the descriptors the rest of the process needs.
fn capacity() -> usize {
    #[cfg(test)]
    if let Some((c, _)) = LIMITS_FOR_TESTS.with(std::cell::Cell::get) {
        return c;
    }
    let limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|soft| soft.parse::<usize>().ok())
        })
        // "unlimited", or no /proc: assume the common default.
        .unwrap_or(1024);
    (limit / 4).clamp(MIN_CAPACITY, MAX_PENDING_HANDSHAKES)
}

/// [`HELLO_TIMEOUT`] (tests may set another).
fn hello_timeout() -> Duration {
    #[cfg(test)]
    if let Some((_, t)) = LIMITS_FOR_TESTS.with(std::cell::Cell::get) {
        return t;
    }
    HELLO_TIMEOUT
}

fn io_err(what: &str) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::io(what.to_owned(), source)
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

/// An authenticated connection, for the coordinator to decide on.
struct Joined {
    stream: TcpStream,
    peer: SocketAddr,
    claims: Claims,
    /// The claim bytes exactly as received (the root's proof covers them).
    body: Vec<u8>,
    client_nonce: Nonce,
    root_nonce: Nonce,
}

/// Why an unauthenticated connection was dropped (one [`StrayStats`] counter each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    ClosedEarly,
    Malformed,
    TimedOut,
    AuthFailed,
    VersionMismatch,
    /// Dropped to make room for a newer connection.
    Evicted,
}

/// Where a connection is in its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Owes its hello (it may have sent part of it).
    Hello,
    /// Was challenged; owes its proof.
    Auth {
        client_nonce: Nonce,
        root_nonce: Nonce,
    },
}

/// Eviction class of connections that owe their hello ([`Stage::Hello`])…
const OWES_HELLO: u8 = 0;
/// …and of those that owe their proof ([`Stage::Auth`]).
const OWES_PROOF: u8 = 1;

impl Stage {
    /// The eviction class ([`Root::evict`]).
    fn class(self) -> u8 {
        match self {
            Stage::Hello => OWES_HELLO,
            Stage::Auth { .. } => OWES_PROOF,
        }
    }
}

/// An accepted connection that has not authenticated yet; its socket is non-blocking.
struct Incoming {
    stream: TcpStream,
    peer: SocketAddr,
    accepted: Instant,
    stage: Stage,
    deadline: Instant,
    /// The bytes of the frame being received.
    frame: Vec<u8>,
    /// That frame's whole length, once its header is in and checked.
    frame_len: Option<usize>,
}

impl Incoming {
    /// Reads what has arrived of the current frame, never past its end: `Ok(Some(payload))`
    /// once it is complete, `Ok(None)` while more is to come. Header checks (type, length) as
    /// in [`wire::read_frame`].
    fn read_frame(
        &mut self,
        allowed: &[FrameType],
        nranks: u32,
    ) -> std::result::Result<Option<Vec<u8>>, FrameError> {
        const CHUNK: usize = 256;
        let mut chunk = [0u8; CHUNK];
        loop {
            let want = match self.frame_len {
                None if self.frame.len() == HEADER_LEN => {
                    let mut header = [0u8; HEADER_LEN];
                    header.copy_from_slice(&self.frame);
                    let (_, len) = decode_header(header, allowed, nranks)?;
                    self.frame_len = Some(HEADER_LEN + len as usize);
                    continue;
                }
                None => HEADER_LEN - self.frame.len(),
                Some(total) if self.frame.len() == total => {
                    let payload = self.frame.split_off(HEADER_LEN);
                    self.frame.clear();
                    self.frame_len = None;
                    return Ok(Some(payload));
                }
                Some(total) => total - self.frame.len(),
            };
            match (&self.stream).read(&mut chunk[..want.min(CHUNK)]) {
                Ok(0) if self.frame.is_empty() => return Err(FrameError::Eof),
                Ok(0) => return Err(FrameError::Truncated),
                Ok(n) => self.frame.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FrameError::Io(e)),
            }
        }
    }

    /// Sends a small frame without waiting: a fresh connection's send buffer always has room
    /// for one, so a frame that does not fit at once means the peer is not reading.
    fn send_now(&self, frame: &[u8]) -> std::result::Result<(), FrameError> {
        loop {
            return match (&self.stream).write(frame) {
                Ok(n) if n == frame.len() => Ok(()),
                Ok(_) => Err(FrameError::Timeout),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(FrameError::Timeout),
                Err(e) => Err(FrameError::Io(e)),
            };
        }
    }
}

/// Classifies a failed read or write of an unauthenticated connection.
fn classify(e: &FrameError) -> Outcome {
    match e {
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
    }
}

/// Logs dropped connections without letting a flood flood the log: the first [`LOG_BURST`]
/// one by one, then a count every [`LOG_EVERY`].
struct DropLog {
    logged: u32,
    unlogged: u32,
    since: Instant,
}

impl DropLog {
    fn new() -> Self {
        DropLog {
            logged: 0,
            unlogged: 0,
            since: Instant::now(),
        }
    }

    fn dropped(&mut self, root: SocketAddr, peer: SocketAddr, why: &str) {
        if self.logged < LOG_BURST {
            self.logged += 1;
            let more = if self.logged == LOG_BURST {
                "; further drops are counted and logged once a second"
            } else {
                ""
            };
            tracing::warn!(
                target: "symcomm::bootstrap",
                "root {root}: dropped connection from {peer}: {why}{more}"
            );
            self.since = Instant::now();
        } else {
            self.unlogged += 1;
            tracing::debug!(
                target: "symcomm::bootstrap",
                "root {root}: dropped connection from {peer}: {why}"
            );
        }
    }

    /// Logs the count of drops not logged one by one, at most once per [`LOG_EVERY`].
    fn tick(&mut self, root: SocketAddr, strays: &StrayStats) {
        if self.unlogged > 0 && self.since.elapsed() >= LOG_EVERY {
            tracing::warn!(
                target: "symcomm::bootstrap",
                "root {root}: dropped {} more stray connection(s) in the last {:.1} s (so far: \
                 {strays:?})",
                self.unlogged,
                self.since.elapsed().as_secs_f64()
            );
            self.unlogged = 0;
            self.since = Instant::now();
        }
    }
}

struct Root<'a> {
    config: &'a BootstrapConfig,
    listener: TcpListener,
    deadline: Instant,
    handshake_timeout: Duration,
    hello_timeout: Duration,
    /// Most connections in `incoming`.
    capacity: usize,
    incoming: HashMap<u64, Incoming>,
    /// `incoming` in eviction order: (stage class, connection number), oldest first within
    /// each class.
    order: BTreeSet<(u8, u64)>,
    /// How many of `incoming` still owe their hello (class 0).
    owing_hello: usize,
    next_conn: u64,
    members: Vec<Option<Member>>,
    strays: StrayStats,
    log: DropLog,
    /// Ranks claimed by connections that failed authentication (for the timeout's error).
    auth_claims: BTreeSet<u32>,
    /// The verdict that ended a failed rendezvous.
    verdict: Option<Abort>,
}

impl<'a> Root<'a> {
    fn new(config: &'a BootstrapConfig, listener: TcpListener, deadline: Instant) -> Result<Self> {
        listener
            .set_nonblocking(true)
            .map_err(io_err("setting the bootstrap listener non-blocking"))?;
        let handshake_timeout = config
            .handshake_timeout
            .unwrap_or(DEFAULT_HANDSHAKE_TIMEOUT.min(config.timeout));
        Ok(Root {
            config,
            listener,
            deadline,
            handshake_timeout,
            hello_timeout: hello_timeout().min(handshake_timeout),
            capacity: capacity(),
            incoming: HashMap::new(),
            order: BTreeSet::new(),
            owing_hello: 0,
            next_conn: 0,
            members: (0..config.nranks).map(|_| None).collect(),
            strays: StrayStats::default(),
            log: DropLog::new(),
            auth_claims: BTreeSet::new(),
            verdict: None,
        })
    }

    fn joined(&self) -> u32 {
        self.members.iter().filter(|m| m.is_some()).count() as u32
    }

    /// Runs until every rank joined, the deadline passed, or a fatal disagreement.
    fn rendezvous(&mut self) -> Result<()> {
        loop {
            if self.joined() + 1 == self.config.nranks {
                return Ok(());
            }
            let Some(left) = remaining(self.deadline) else {
                return Err(self.time_out());
            };
            let now = Instant::now();
            self.expire(now);
            self.log.tick(self.config.id.addr(), &self.strays);
            let next = self
                .incoming
                .values()
                .map(|c| c.deadline.saturating_duration_since(now))
                .min()
                .unwrap_or(left)
                .min(left);
            let ms = next.as_millis().clamp(1, 250) as u16;

            let ranks: Vec<usize> = (0..self.members.len())
                .filter(|&r| self.members[r].is_some())
                .collect();
            let conns: Vec<u64> = self.incoming.keys().copied().collect();
            let ready: Vec<bool> = {
                let mut fds = Vec::with_capacity(1 + ranks.len() + conns.len());
                fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
                for &r in &ranks {
                    if let Some(m) = &self.members[r] {
                        fds.push(PollFd::new(m.stream.as_fd(), PollFlags::POLLIN));
                    }
                }
                for conn in &conns {
                    if let Some(c) = self.incoming.get(conn) {
                        fds.push(PollFd::new(c.stream.as_fd(), PollFlags::POLLIN));
                    }
                }
                match poll(&mut fds, PollTimeout::from(ms)) {
                    Ok(_) => {}
                    Err(Errno::EINTR) => continue,
                    Err(e) => {
                        return Err(Error::io(
                            "polling the bootstrap sockets",
                            io::Error::from(e),
                        ));
                    }
                }
                fds.iter()
                    .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                    .collect()
            };
            // What has arrived first, so that nothing that already sent its hello is
            // evicted by the connections accepted below.
            for (i, &conn) in conns.iter().enumerate() {
                if ready.get(1 + ranks.len() + i).copied().unwrap_or(false) {
                    self.advance(conn)?;
                }
            }
            for (i, &r) in ranks.iter().enumerate() {
                if ready.get(1 + i).copied().unwrap_or(false) {
                    self.check_member(r);
                }
            }
            if ready[0] {
                self.accept_some();
            }
        }
    }

    /// Accepts up to [`ACCEPT_BATCH`] queued connections.
    fn accept_some(&mut self) {
        for _ in 0..ACCEPT_BATCH {
            match self.listener.accept() {
                Ok((stream, peer)) => self.hold(stream, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(e.raw_os_error(), Some(code) if code == Errno::EMFILE as i32
                        || code == Errno::ENFILE as i32)
                        && !self.order.is_empty() =>
                {
                    // Out of descriptors: the connection that matters least makes room.
                    self.evict(&format!("out of file descriptors ({e})"));
                }
                Err(e) => {
                    // Out of file descriptors with nothing to let go, and the like: back off
                    // instead of spinning.
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

    /// Takes a new connection in, making room first when the table is full.
    fn hold(&mut self, stream: TcpStream, peer: SocketAddr) {
        if let Err(e) = stream
            .set_nonblocking(true)
            .and_then(|()| stream.set_nodelay(true))
        {
            self.count(Outcome::Malformed);
            self.log
                .dropped(self.config.id.addr(), peer, &e.to_string());
            return;
        }
        while self.incoming.len() >= self.capacity && !self.order.is_empty() {
            let why = format!(
                "{} unauthenticated connections held, and this one was the next to go (see the \
                 admission guarantee)",
                self.incoming.len()
            );
            self.evict(&why);
        }
        let conn = self.next_conn;
        self.next_conn += 1;
        let now = Instant::now();
        self.order.insert((OWES_HELLO, conn));
        self.owing_hello += 1;
        self.incoming.insert(
            conn,
            Incoming {
                stream,
                peer,
                accepted: now,
                stage: Stage::Hello,
                deadline: (now + self.hello_timeout).min(self.deadline),
                frame: Vec::new(),
                frame_len: None,
            },
        );
    }

    /// Drops one connection to make room, from the class over its half share: while at least
    /// half of the connections held owe their hello, the one that has owed it the longest;
    /// otherwise the one that has owed its proof the longest. (So with `capacity` held, a
    /// connection owing its hello goes only after `capacity / 2 - 1` newer ones arrived, and one
    /// owing its proof only after `capacity / 2` others sent a hello after it.)
    fn evict(&mut self, why: &str) {
        let class = if self.owing_hello * 2 >= self.incoming.len() {
            OWES_HELLO
        } else {
            OWES_PROOF
        };
        let Some(&(_, conn)) = self
            .order
            .range((class, 0)..)
            .next()
            .or_else(|| self.order.first())
        else {
            return;
        };
        let age = self
            .incoming
            .get(&conn)
            .map(|c| c.accepted.elapsed())
            .unwrap_or_default();
        self.drop_conn(
            conn,
            Outcome::Evicted,
            &format!("{why}; it was accepted {age:.0?} ago"),
        );
    }

    /// Drops connections past their deadline.
    fn expire(&mut self, now: Instant) {
        let late: Vec<u64> = self
            .incoming
            .iter()
            .filter(|(_, c)| c.deadline <= now)
            .map(|(&conn, _)| conn)
            .collect();
        for conn in late {
            let why = match self.incoming.get(&conn).map(|c| c.stage) {
                Some(Stage::Hello) => format!("no hello within {:?}", self.hello_timeout),
                _ => format!("no proof within {:?}", self.handshake_timeout),
            };
            self.drop_conn(conn, Outcome::TimedOut, &why);
        }
    }

    /// Removes a connection (closing it), counts and logs why.
    fn drop_conn(&mut self, conn: u64, outcome: Outcome, why: &str) {
        if let Some(c) = self.incoming.remove(&conn) {
            self.forget(conn, c.stage);
            self.count(outcome);
            self.log.dropped(self.config.id.addr(), c.peer, why);
        }
    }

    /// Takes a connection that left `incoming` out of the eviction order.
    fn forget(&mut self, conn: u64, stage: Stage) {
        if self.order.remove(&(stage.class(), conn)) && stage == Stage::Hello {
            self.owing_hello -= 1;
        }
    }

    fn count(&mut self, outcome: Outcome) {
        let s = &mut self.strays;
        match outcome {
            Outcome::ClosedEarly => s.closed_early += 1,
            Outcome::Malformed => s.malformed += 1,
            Outcome::TimedOut => s.timed_out += 1,
            Outcome::AuthFailed => s.auth_failed += 1,
            Outcome::VersionMismatch => s.version_mismatch += 1,
            Outcome::Evicted => s.overflow += 1,
        }
    }

    /// Reads what a readable connection sent and takes the next handshake step when a frame
    /// is complete. Errors only for a verdict that stops the rendezvous (see [`Root::admit`]).
    fn advance(&mut self, conn: u64) -> Result<()> {
        let nranks = self.config.nranks;
        let Some(c) = self.incoming.get_mut(&conn) else {
            return Ok(());
        };
        let stage = c.stage;
        let allowed = match stage {
            Stage::Hello => [FrameType::Hello],
            Stage::Auth { .. } => [FrameType::Auth],
        };
        let payload = match c.read_frame(&allowed, nranks) {
            Ok(Some(p)) => p,
            Ok(None) => return Ok(()),
            Err(e) => {
                self.drop_conn(conn, classify(&e), &e.to_string());
                return Ok(());
            }
        };
        match stage {
            Stage::Hello => {
                self.on_hello(conn, &payload);
                Ok(())
            }
            Stage::Auth {
                client_nonce,
                root_nonce,
            } => self.on_auth(conn, &payload, client_nonce, root_nonce),
        }
    }

    /// A complete hello: refuse another version, else challenge.
    fn on_hello(&mut self, conn: u64, payload: &[u8]) {
        let hello = match Hello::decode(payload, PROTOCOL_VERSION) {
            Ok(h) => h,
            Err(e) => return self.drop_conn(conn, Outcome::Malformed, &e.to_string()),
        };
        if hello.version != PROTOCOL_VERSION {
            let message = format!(
                "this root speaks bootstrap protocol version {PROTOCOL_VERSION}, the client {}",
                hello.version
            );
            self.refuse(conn, AbortCode::VersionMismatch, PROTOCOL_VERSION, &message);
            return self.drop_conn(conn, Outcome::VersionMismatch, &message);
        }
        let root_nonce = match auth::nonce() {
            Ok(n) => n,
            Err(e) => return self.drop_conn(conn, Outcome::Malformed, &e.to_string()),
        };
        let challenge = Challenge {
            version: PROTOCOL_VERSION,
            nonce: root_nonce,
        };
        let Some(c) = self.incoming.get_mut(&conn) else {
            return;
        };
        if let Err(e) = c.send_now(&challenge.encode()) {
            let outcome = match e {
                FrameError::Timeout => Outcome::Malformed,
                _ => classify(&e),
            };
            return self.drop_conn(conn, outcome, &format!("sending the challenge: {e}"));
        }
        let stage = Stage::Auth {
            client_nonce: hello.nonce,
            root_nonce,
        };
        c.stage = stage;
        c.deadline = (c.accepted + self.handshake_timeout).min(self.deadline);
        self.forget(conn, Stage::Hello);
        self.order.insert((stage.class(), conn));
    }

    /// A complete proof: admit the connection, or refuse a wrong one.
    fn on_auth(
        &mut self,
        conn: u64,
        payload: &[u8],
        client_nonce: Nonce,
        root_nonce: Nonce,
    ) -> Result<()> {
        let (auth, body) = match Auth::decode(payload) {
            Ok(a) => a,
            Err(e) => {
                self.drop_conn(conn, Outcome::Malformed, &e.to_string());
                return Ok(());
            }
        };
        if !auth::verify(
            self.config.id.secret(),
            Label::Client,
            &client_nonce,
            &root_nonce,
            body,
            &auth.mac,
        ) {
            self.refuse(conn, AbortCode::AuthFailed, 0, "authentication failed");
            if self.auth_claims.len() < MAX_AUTH_CLAIMS {
                self.auth_claims.insert(auth.claims.rank);
            }
            self.drop_conn(
                conn,
                Outcome::AuthFailed,
                &format!(
                    "authentication failed (claimed rank {}): wrong secret",
                    auth.claims.rank
                ),
            );
            return Ok(());
        }
        let body = body.to_vec();
        let Some(c) = self.incoming.remove(&conn) else {
            return Ok(());
        };
        self.forget(conn, c.stage);
        if let Err(e) = c.stream.set_nonblocking(false) {
            self.count(Outcome::ClosedEarly);
            self.log
                .dropped(self.config.id.addr(), c.peer, &e.to_string());
            return Ok(());
        }
        self.admit(Joined {
            stream: c.stream,
            peer: c.peer,
            claims: auth.claims,
            body,
            client_nonce,
            root_nonce,
        })
    }

    /// Tells an unauthenticated connection why it is refused (best effort, without waiting).
    fn refuse(&self, conn: u64, code: AbortCode, value: u32, message: &str) {
        if let Some(c) = self.incoming.get(&conn) {
            let abort = Abort {
                code,
                value,
                missing: Vec::new(),
                message: message.to_owned(),
            };
            let _ = c.send_now(&abort.encode());
        }
    }

    /// Decides on an authenticated connection.
    fn admit(&mut self, j: Joined) -> Result<()> {
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
            auth_failed: self.auth_claims.iter().copied().collect(),
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

    /// Sends `abort` to every admitted rank and closes their connections (and keeps it for the
    /// connections still handshaking, [`Root::finish`]).
    fn broadcast(&mut self, abort: &Abort) {
        self.verdict = Some(abort.clone());
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

    /// Closes every connection still handshaking and returns the counts: what each had sent
    /// decides its counter (a close, garbage), else it was cut short by the end. Each is told
    /// first (best effort) that the rendezvous is over — with the verdict of a failed one — so
    /// that a late rank fails at once instead of reconnecting until its timeout.
    fn finish(mut self) -> StrayStats {
        let nranks = self.config.nranks;
        let verdict = self.verdict.take().unwrap_or_else(|| Abort {
            code: AbortCode::Stopped,
            value: 0,
            missing: Vec::new(),
            message: format!(
                "the rendezvous at {} is over: all {nranks} ranks joined without this connection",
                self.config.id.addr()
            ),
        });
        let verdict = verdict.encode();
        for (_, mut c) in std::mem::take(&mut self.incoming) {
            let allowed = match c.stage {
                Stage::Hello => [FrameType::Hello],
                Stage::Auth { .. } => [FrameType::Auth],
            };
            let outcome = match c.read_frame(&allowed, nranks) {
                Err(e) => classify(&e),
                Ok(_) => {
                    let _ = c.send_now(&verdict);
                    Outcome::TimedOut
                }
            };
            self.count(outcome);
        }
        self.order.clear();
        self.owing_hello = 0;
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

fn alive(stream: &TcpStream) -> bool {
    !matches!(peek(stream), Liveness::Closed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::net::{IpAddr, Ipv4Addr};
    use std::thread::JoinHandle;

    use super::*;
    use crate::bootstrap::{UniqueId, init_with};

    const LONG: Duration = Duration::from_secs(30);

    /// A root for `nranks` ranks holding at most `capacity` unauthenticated connections (hello
    /// deadline 30 s, so that only making room drops a connection).
    fn root(id: &UniqueId, nranks: u32, capacity: usize) -> JoinHandle<Result<Bootstrap>> {
        let config = BootstrapConfig::new(id.clone(), 0, nranks)
            .with_timeout(LONG)
            .with_host_id("h");
        std::thread::spawn(move || {
            LIMITS_FOR_TESTS.with(|l| l.set(Some((capacity, LONG))));
            init_with(&config)
        })
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    /// Sends a hello on `s`; returns both nonces once challenged.
    fn say_hello(s: &TcpStream) -> (Nonce, Nonce) {
        let cn = auth::nonce().unwrap();
        let h = Hello {
            version: PROTOCOL_VERSION,
            nonce: cn,
        };
        write_frame(s, &h.encode(), soon()).unwrap();
        let (_, p) = wire::read_frame(s, soon(), &[FrameType::Challenge], 2).unwrap();
        (cn, Challenge::decode(&p, PROTOCOL_VERSION).unwrap().nonce)
    }

    /// Connects and sends a hello; returns the stream and both nonces once challenged.
    fn hello(id: &UniqueId) -> (TcpStream, Nonce, Nonce) {
        let s = TcpStream::connect(id.addr()).unwrap();
        let (cn, rn) = say_hello(&s);
        (s, cn, rn)
    }

    /// Sends rank 1's proof; returns the frame type of the root's answer.
    fn prove(id: &UniqueId, s: &TcpStream, cn: &Nonce, rn: &Nonce) -> FrameType {
        let claims = Claims {
            rank: 1,
            nranks: 2,
            pid: std::process::id(),
            addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            host_id: "h".into(),
        };
        let mac = auth::mac(id.secret(), Label::Client, cn, rn, &claims.encode_body());
        write_frame(s, &Auth { claims, mac }.encode(), soon()).unwrap();
        let allowed = [FrameType::Welcome, FrameType::Abort];
        wire::read_frame(s, soon(), &allowed, 2).unwrap().0
    }

    /// Whether the root closed `s` (within `wait`).
    fn closed(s: &TcpStream, wait: Duration) -> bool {
        s.set_read_timeout(Some(wait)).unwrap();
        let mut b = [0u8; 16];
        match (&*s).read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
        }
    }

    #[test]
    fn silent_connections_never_push_out_one_that_sent_its_hello() {
        let id = UniqueId::new_on(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
        let cap = 8;
        let root = root(&id, 2, cap);
        let (rank, cn, rn) = hello(&id);
        // Three times the capacity of silent connections: each one past the capacity pushes
        // out the oldest silent one, never the rank.
        let silent: Vec<TcpStream> = (0..3 * cap)
            .map(|_| TcpStream::connect(id.addr()).unwrap())
            .collect();
        let pushed_out = 3 * cap - (cap - 1);
        assert!(closed(&silent[pushed_out - 1], Duration::from_secs(5)));
        for (i, s) in silent.iter().enumerate() {
            let gone = closed(
                s,
                Duration::from_millis(if i < pushed_out { 2000 } else { 20 }),
            );
            assert_eq!(gone, i < pushed_out, "silent connection {i}");
        }
        assert_eq!(prove(&id, &rank, &cn, &rn), FrameType::Welcome);
        let b = root.join().unwrap().unwrap();
        let s = b.strays();
        assert_eq!(s.overflow as usize, pushed_out, "{s:?}");
        assert_eq!(s.timed_out as usize, cap - 1, "{s:?}");
        assert_eq!(s.total() as usize, 3 * cap, "{s:?}");
    }

    #[test]
    fn a_new_connection_outlasts_half_the_capacity_of_newer_ones() {
        let id = UniqueId::new_on(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
        let cap = 8;
        let root = root(&id, 2, cap);
        // The root full of connections that sent a hello and stall before their proof.
        let stalled: Vec<_> = (0..cap).map(|_| hello(&id)).collect();
        // The rank connects (pushing out the oldest stalled one) but is slow to say hello:
        // `cap / 2 - 1` newer silent connections arrive first, each pushing out a stalled one.
        let rank = TcpStream::connect(id.addr()).unwrap();
        let silent: Vec<TcpStream> = (0..cap / 2 - 1)
            .map(|_| TcpStream::connect(id.addr()).unwrap())
            .collect();
        assert!(closed(&stalled[cap / 2 - 1].0, Duration::from_secs(5)));
        for (i, (s, _, _)) in stalled.iter().enumerate() {
            let gone = closed(
                s,
                Duration::from_millis(if i < cap / 2 { 2000 } else { 20 }),
            );
            assert_eq!(gone, i < cap / 2, "stalled connection {i}");
        }
        let (cn, rn) = say_hello(&rank);
        assert_eq!(prove(&id, &rank, &cn, &rn), FrameType::Welcome);
        let b = root.join().unwrap().unwrap();
        assert_eq!(b.strays().overflow as usize, cap / 2, "{:?}", b.strays());
        drop(silent);
    }

    #[test]
    fn a_rank_still_handshaking_at_the_end_is_told_at_once() {
        let id = UniqueId::new_on(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
        let root = root(&id, 2, 8);
        // A second "rank 1" that is challenged but has not proved itself when the real one
        // completes the rendezvous.
        let (late, _, _) = hello(&id);
        let config = BootstrapConfig::new(id.clone(), 1, 2)
            .with_timeout(LONG)
            .with_host_id("h");
        init_with(&config).unwrap();
        root.join().unwrap().unwrap();
        let (kind, p) = wire::read_frame(&late, soon(), &[FrameType::Abort], 2).unwrap();
        assert_eq!(kind, FrameType::Abort);
        let abort = Abort::decode(&p).unwrap();
        assert_eq!(abort.code, AbortCode::Stopped);
        assert!(abort.message.contains("is over"), "{}", abort.message);
    }

    #[test]
    fn drop_logging_is_rate_limited() {
        let root: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let mut log = DropLog::new();
        for _ in 0..LOG_BURST + 5 {
            log.dropped(root, root, "test");
        }
        assert_eq!((log.logged, log.unlogged), (LOG_BURST, 5));
        log.tick(root, &StrayStats::default());
        assert_eq!(log.unlogged, 5, "a summary at most once a second");
        log.since -= LOG_EVERY;
        log.tick(root, &StrayStats::default());
        assert_eq!(log.unlogged, 0);
    }
}

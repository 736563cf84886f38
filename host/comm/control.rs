//! The control plane of a communicator: the bootstrap links kept open after the rendezvous
//! (every rank to the root, the root to every rank), used for
//!
//! - **liveness**: heartbeats both ways every `heartbeat`; a link that closes without a
//!   goodbye (the peer process died: EOF arrives at once, even for `kill -9`) or stays silent
//!   for `peer_timeout` marks that rank lost, and so does a goodbye that says the peer aborted.
//!   The root tells every other rank (`PeerLost` frames), so every survivor learns of any rank's
//!   loss, and each rank's `on_fault` callback raises its abort flag so kernels waiting on the
//!   lost rank return;
//! - **departures**: a communicator destroyed on purpose says goodbye with the number of
//!   collective calls and host-side all-gathers it made, and the root passes that on
//!   (`Departed` frames). A departure is not a fault by itself (an all-gather the departed rank
//!   made before it left still completes, even when the news of its departure overtakes the
//!   result): a survivor that made no more calls goes on (its later calls that
//!   need the departed rank fail at once with [`Error::PeerLost`]); one that made more — it
//!   has a collective queued that the departed rank will never join — treats it as a loss;
//! - **host-side all-gathers** of small records (window sizes, socket names, success flags),
//!   relayed by the root. Every gather carries a tag naming the operation, so ranks making
//!   different calls see a mismatch instead of mixing up data.
//!
//! One monitor thread per rank reads the links (poll + bounded frame reads); callers write under
//! a per-link lock, with deadlines. A host-side operation waits at most `op_timeout`.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::payload::Tag;
use crate::bootstrap::RootLink;
use crate::bootstrap::wire::{
    self, Contribution, Farewell, FrameType, LostReason, MAX_GATHER, read_frame, write_frame,
};
use crate::{Error, Result};

/// Longest a frame that has started arriving may take to complete, and a write to finish.
const FRAME_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest the aborting goodbye may take to write (`abort` returns at once).
const ABORT_WRITE: Duration = Duration::from_millis(50);

/// Timing of the control plane.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ControlTiming {
    /// Interval between heartbeats.
    pub(crate) heartbeat: Duration,
    /// Silence after which a peer is lost.
    pub(crate) peer_timeout: Duration,
    /// Longest wait of a host-side collective operation (all ranks must make the call).
    pub(crate) op_timeout: Duration,
}

/// Called (from the monitor thread) with the rank that was lost, once per communicator.
pub(crate) type OnFault = Box<dyn Fn(u32) + Send + Sync>;

struct Link {
    rank: u32,
    stream: TcpStream,
    write: Mutex<()>,
}

#[derive(Default)]
struct State {
    /// The first rank lost, as the [`Error::PeerLost`] every later host operation returns.
    fault: Option<Error>,
    /// Ranks whose communicator said goodbye (indexed by rank), with what they had done.
    departed: Vec<Option<Left>>,
    /// Collective calls this rank made ([`Control::begin_call`]).
    calls: u64,
    /// Host-side all-gathers this rank started (the last one's sequence number).
    gathers: u64,
    /// Root: contributions of gathers still missing some rank.
    pending: BTreeMap<u64, Vec<Option<Contribution>>>,
    /// Completed gathers not yet collected by the caller.
    done: BTreeMap<u64, Vec<Contribution>>,
    /// Set when a host-side operation timed out (ranks disagree on the sequence of calls): the
    /// [`Error::HostTimeout`] every later host operation returns.
    broken: Option<Error>,
    /// This rank aborted: its links are shut down and losses are no longer reported.
    aborted: bool,
    /// This rank's communicator is being destroyed (it is saying goodbye): a peer's link
    /// closing now is no fault (the root that got this rank's goodbye owes it none).
    closing: bool,
}

/// What a departed rank had done when it said goodbye.
#[derive(Debug, Clone, Copy)]
struct Left {
    /// Collective calls.
    calls: u64,
    /// Host-side all-gathers started (each one's contribution reached the root before the
    /// goodbye).
    gathers: u64,
}

struct Shared {
    rank: u32,
    nranks: u32,
    links: Vec<Link>,
    timing: ControlTiming,
    state: Mutex<State>,
    cond: Condvar,
    on_fault: OnFault,
}

/// The control plane of one rank; see the module docs. Dropping it says goodbye to the peers
/// and joins the monitor thread.
pub(crate) struct Control {
    shared: Arc<Shared>,
    wake: UnixStream,
    monitor: Option<JoinHandle<()>>,
    seq: Mutex<u64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves plain data behind; keep going.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Control {
    /// Takes over the links of a finished rendezvous and starts the monitor thread.
    pub(crate) fn start(
        rank: u32,
        nranks: u32,
        link: RootLink,
        timing: ControlTiming,
        on_fault: OnFault,
    ) -> Result<Self> {
        let io_err = |what: &str| {
            let what = what.to_owned();
            move |source| Error::io(what, source)
        };
        let mut links = Vec::new();
        match link {
            RootLink::Root { peers } => {
                for (r, s) in peers.into_iter().enumerate() {
                    if let Some(stream) = s {
                        links.push(Link {
                            rank: r as u32,
                            stream,
                            write: Mutex::new(()),
                        });
                    }
                }
            }
            RootLink::Rank { root } => links.push(Link {
                rank: 0,
                stream: root,
                write: Mutex::new(()),
            }),
        }
        for l in &links {
            l.stream
                .set_nonblocking(false)
                .map_err(io_err("configuring a control link"))?;
        }
        let (wake, wake_rx) =
            UnixStream::pair().map_err(io_err("creating the monitor's wake-up socket"))?;
        wake_rx
            .set_nonblocking(true)
            .map_err(io_err("configuring the monitor's wake-up socket"))?;
        let shared = Arc::new(Shared {
            rank,
            nranks,
            links,
            timing,
            state: Mutex::new(State {
                departed: vec![None; nranks as usize],
                ..State::default()
            }),
            cond: Condvar::new(),
            on_fault,
        });
        let monitor = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("symcomm-monitor-{rank}"))
                .spawn(move || monitor(&shared, &wake_rx))
                .map_err(io_err("starting the monitor thread"))?
        };
        Ok(Control {
            shared,
            wake,
            monitor: Some(monitor),
            seq: Mutex::new(0),
        })
    }

    /// What makes host operations fail, if anything: a lost rank, a local abort, an earlier
    /// host timeout — the error every later call returns.
    pub(crate) fn fault(&self) -> Option<Error> {
        state_error(&lock(&self.shared.state), &self.shared)
    }

    /// Counts one collective call (every rank counts the same calls), after checking that it
    /// can complete: [`Error::PeerLost`] when a rank destroyed its communicator already.
    pub(crate) fn begin_call(&self) -> Result<()> {
        let mut st = lock(&self.shared.state);
        if let Some(e) = refusal(&st, &self.shared, None) {
            return Err(e);
        }
        st.calls += 1;
        Ok(())
    }

    /// [`Error::PeerLost`] when `peer` destroyed its communicator (point-to-point calls with it
    /// cannot complete).
    pub(crate) fn check_peer(&self, peer: u32) -> Result<()> {
        match departed_error(&lock(&self.shared.state), Some(peer), None) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Host-side all-gather: every rank calls it with the same `tag` in the same order; returns
    /// every rank's contribution, in rank order. Bounded by the op timeout.
    ///
    /// Errors: [`Error::PeerLost`] after a fault; [`Error::Mismatch`] when ranks passed different
    /// tags (every rank gets it); [`Error::HostTimeout`] when not every rank made the call in
    /// time (the control plane is unusable afterwards: the ranks' call sequences diverged).
    pub(crate) fn all_gather(&self, tag: Tag, what: &str, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        if data.len() > MAX_GATHER {
            return Err(Error::InvalidArgument(format!(
                "host all-gather of {} bytes (at most {MAX_GATHER})",
                data.len()
            )));
        }
        let shared = &*self.shared;
        let mut seq_guard = lock(&self.seq);
        let seq = *seq_guard + 1;
        {
            let mut st = lock(&shared.state);
            if let Some(e) = refusal(&st, shared, Some(seq)) {
                return Err(e);
            }
            st.gathers = seq;
        }
        *seq_guard = seq;
        let mine = Contribution {
            tag: tag.code(),
            data: data.to_vec(),
        };
        if shared.nranks == 1 {
            return Ok(vec![mine.data]);
        }
        if shared.rank == 0 {
            if let Some(all) = contribute(shared, seq, 0, mine) {
                broadcast_gathered(shared, seq, all);
            }
        } else {
            let frame = wire::encode_gather(seq, &mine);
            if !send(&shared.links[0], &frame) {
                lose(shared, 0, LostReason::Disconnected);
            }
        }
        let deadline = Instant::now() + shared.timing.op_timeout;
        let mut st = lock(&shared.state);
        let all = loop {
            if let Some(all) = st.done.remove(&seq) {
                break all;
            }
            if let Some(e) = refusal(&st, shared, Some(seq)) {
                return Err(e);
            }
            let now = Instant::now();
            if now >= deadline {
                let timeout = |what: String| Error::HostTimeout {
                    rank: shared.rank,
                    what,
                    timeout_ms: shared.timing.op_timeout.as_millis() as u64,
                };
                st.broken = Some(timeout(format!(
                    "{what} (host operation {seq}, an earlier call: the control plane is unusable since)"
                )));
                return Err(timeout(what.to_owned()));
            }
            st = shared
                .cond
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        };
        drop(st);
        if let Some((peer, other)) = all.iter().enumerate().find(|(_, c)| c.tag != tag.code()) {
            let theirs = Tag::from_code(other.tag).map_or_else(String::new, |t| format!("{t:?}, "));
            return Err(Error::Mismatch {
                rank: shared.rank,
                peer: peer as u32,
                what: format!(
                    "rank {} called {what} while rank {peer} made another host call ({theirs}tag {:#x})",
                    shared.rank, other.tag
                ),
            });
        }
        Ok(all.into_iter().map(|c| c.data).collect())
    }

    /// Local abort: says so to the peers (an aborting goodbye: they raise their own abort flags
    /// and report this rank as aborted), shuts every link down, stops reporting losses, and
    /// makes later host operations fail. Any thread; returns at once (a link busy with another
    /// write gets no goodbye: that peer sees the link close instead).
    pub(crate) fn abort(&self) {
        let (calls, gathers) = {
            let mut st = lock(&self.shared.state);
            if st.aborted {
                return;
            }
            st.aborted = true;
            (st.calls, st.gathers)
        };
        self.shared.cond.notify_all();
        let bye = wire::encode_goodbye(Farewell::Aborted, calls, gathers);
        for l in &self.shared.links {
            if let Ok(_guard) = l.write.try_lock() {
                let _ = write_frame(&l.stream, &bye, Instant::now() + ABORT_WRITE);
            }
            let _ = l.stream.shutdown(Shutdown::Both);
        }
    }

    /// A barrier over the control plane (an empty all-gather).
    pub(crate) fn barrier(&self, tag: Tag, what: &str) -> Result<()> {
        self.all_gather(tag, what, &[]).map(|_| ())
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        let (departed, aborted, calls, gathers) = {
            let mut st = lock(&self.shared.state);
            st.closing = true;
            (st.departed.clone(), st.aborted, st.calls, st.gathers)
        };
        let goodbye = wire::encode_goodbye(Farewell::Destroyed, calls, gathers);
        for l in &self.shared.links {
            if departed[l.rank as usize].is_none() && !aborted {
                let _ = send(l, &goodbye);
            }
        }
        let _ = (&self.wake).write_all(&[1]);
        if let Some(h) = self.monitor.take() {
            let _ = h.join();
        }
        for l in &self.shared.links {
            let _ = l.stream.shutdown(Shutdown::Both);
        }
    }
}

fn lost_reason(why: LostReason) -> &'static str {
    match why {
        LostReason::Disconnected => "its connection closed without a goodbye (process died?)",
        LostReason::HeartbeatMissed => "it sent no heartbeat within the peer timeout",
        LostReason::Aborted => "it aborted its communicator",
    }
}

/// The error of every host operation in this state: a lost rank, then a local abort, then an
/// earlier host timeout (the same [`Error::HostTimeout`] again).
fn state_error(st: &State, shared: &Shared) -> Option<Error> {
    if let Some(e) = &st.fault {
        return Some(e.clone());
    }
    if st.aborted {
        return Some(aborted_error(shared.rank));
    }
    st.broken.clone()
}

/// The error of host calls after [`Control::abort`].
pub(crate) fn aborted_error(rank: u32) -> Error {
    Error::Aborted {
        rank,
        peer: rank,
        op: "Communicator::abort",
        detail: "the communicator was aborted on this host".to_owned(),
    }
}

/// Why a call that needs every rank cannot run: [`state_error`], else a departed rank (for host
/// all-gather number `gather`: one that left before starting it).
fn refusal(st: &State, shared: &Shared, gather: Option<u64>) -> Option<Error> {
    state_error(st, shared).or_else(|| departed_error(st, None, gather))
}

/// [`Error::PeerLost`] for `peer` (or the lowest rank, `None`) if it destroyed its communicator
/// — for host all-gather number `gather`, only if it left before starting it.
fn departed_error(st: &State, peer: Option<u32>, gather: Option<u64>) -> Option<Error> {
    let missing = |left: &Left| gather.is_none_or(|seq| left.gathers < seq);
    let (rank, left) = st
        .departed
        .iter()
        .enumerate()
        .filter(|(r, _)| peer.is_none_or(|p| p as usize == *r))
        .find_map(|(r, l)| l.filter(missing).map(|l| (r as u32, l)))?;
    Some(Error::PeerLost {
        rank,
        reason: format!(
            "it destroyed its communicator after {} collective calls (this rank made {})",
            left.calls, st.calls
        ),
    })
}

/// Writes a whole frame to `link` (bounded); false on failure.
fn send(link: &Link, frame: &[u8]) -> bool {
    let _guard = lock(&link.write);
    write_frame(&link.stream, frame, Instant::now() + FRAME_TIMEOUT).is_ok()
}

/// Root: records `rank`'s contribution to gather `seq`; returns the gather once complete.
fn contribute(shared: &Shared, seq: u64, rank: u32, c: Contribution) -> Option<Vec<Contribution>> {
    let mut st = lock(&shared.state);
    let n = shared.nranks as usize;
    let slot = st.pending.entry(seq).or_insert_with(|| vec![None; n]);
    slot[rank as usize] = Some(c);
    if slot.iter().any(Option::is_none) {
        return None;
    }
    Some(
        st.pending
            .remove(&seq)
            .unwrap_or_default()
            .into_iter()
            .flatten()
            .collect(),
    )
}

/// Root: sends a completed gather to every other rank, then releases the root's own caller.
/// In that order: the caller may destroy the communicator as soon as it returns, and its
/// goodbye must not overtake the result on any link.
fn broadcast_gathered(shared: &Shared, seq: u64, all: Vec<Contribution>) {
    let frame = wire::encode_gathered(seq, &all);
    for l in &shared.links {
        if !send(l, &frame) && lock(&shared.state).departed[l.rank as usize].is_none() {
            lose(shared, l.rank, LostReason::Disconnected);
        }
    }
    lock(&shared.state).done.insert(seq, all);
    shared.cond.notify_all();
}

/// Marks `rank` lost (once; a rank that said goodbye first is not lost), raises the fault
/// callback, and on the root tells the other ranks.
fn lose(shared: &Shared, rank: u32, why: LostReason) {
    if lock(&shared.state).departed[rank as usize].is_some() {
        return;
    }
    if fail(shared, rank, lost_reason(why).to_owned()) && shared.rank == 0 {
        let frame = wire::encode_peer_lost(rank, why);
        for l in shared.links.iter().filter(|l| l.rank != rank) {
            let _ = send(l, &frame);
        }
    }
}

/// Records the communicator's first fault (`rank` and the reason of its [`Error::PeerLost`])
/// and raises the fault callback; false when there was one already, or this rank aborted.
fn fail(shared: &Shared, rank: u32, reason: String) -> bool {
    {
        let mut st = lock(&shared.state);
        if st.aborted || st.closing || st.fault.is_some() {
            return false;
        }
        tracing::error!(
            target: "symcomm::init",
            "rank {}: rank {rank} is lost: {reason}; aborting this communicator",
            shared.rank,
        );
        st.fault = Some(Error::PeerLost { rank, reason });
        shared.cond.notify_all();
    }
    (shared.on_fault)(rank);
    true
}

/// `rank` destroyed its communicator after `calls` collective calls: recorded (once), passed on
/// by the root, and a fault when this rank made more calls (they wait for the departed rank).
fn depart(shared: &Shared, rank: u32, left: Left) {
    let calls = left.calls;
    let ahead = {
        let mut st = lock(&shared.state);
        if st.departed[rank as usize].is_some() {
            return;
        }
        st.departed[rank as usize] = Some(left);
        shared.cond.notify_all();
        (st.calls > calls).then_some(st.calls)
    };
    tracing::debug!(target: "symcomm::init", "rank {}: rank {rank} destroyed its communicator after {calls} collective calls", shared.rank);
    if shared.rank == 0 {
        let frame = wire::encode_departed(rank, calls, left.gathers);
        for l in shared.links.iter().filter(|l| l.rank != rank) {
            let _ = send(l, &frame);
        }
    }
    if let Some(mine) = ahead {
        fail(
            shared,
            rank,
            format!(
                "it destroyed its communicator after {calls} collective calls while this rank \
                 made {mine}: the calls it never joins cannot complete"
            ),
        );
    }
}

/// The monitor thread: reads every link, answers nothing, sends heartbeats, detects losses.
fn monitor(shared: &Shared, wake: &UnixStream) {
    let hb = shared.timing.heartbeat;
    let n = shared.links.len();
    let mut last_seen = vec![Instant::now(); n];
    let mut live = vec![true; n];
    let mut next_beat = Instant::now() + hb;
    let beat = wire::encode_empty(FrameType::Heartbeat);
    let allowed: &[FrameType] = if shared.rank == 0 {
        &[FrameType::Heartbeat, FrameType::Gather, FrameType::Goodbye]
    } else {
        &[
            FrameType::Heartbeat,
            FrameType::Gathered,
            FrameType::PeerLost,
            FrameType::Departed,
            FrameType::Goodbye,
        ]
    };
    loop {
        let wait = next_beat.saturating_duration_since(Instant::now());
        let ms = wait.as_millis().clamp(1, u128::from(u16::MAX)) as u16;
        let watched: Vec<usize> = (0..n).filter(|&i| live[i]).collect();
        let ready: Vec<bool> = {
            let mut fds = vec![PollFd::new(wake.as_fd(), PollFlags::POLLIN)];
            for &i in &watched {
                fds.push(PollFd::new(
                    shared.links[i].stream.as_fd(),
                    PollFlags::POLLIN,
                ));
            }
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => {
                    tracing::error!(target: "symcomm::init", "rank {}: polling the control links failed: {e}", shared.rank);
                    return;
                }
            }
            fds.iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect()
        };
        if ready[0] {
            let mut buf = [0u8; 16];
            match (&*wake).read(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                _ => return,
            }
        }
        for (k, &i) in watched.iter().enumerate() {
            if !ready[k + 1] {
                continue;
            }
            let link = &shared.links[i];
            let frame = read_frame(
                &link.stream,
                Instant::now() + FRAME_TIMEOUT,
                allowed,
                shared.nranks,
            );
            last_seen[i] = Instant::now();
            match frame {
                Ok((FrameType::Gather, payload)) => match wire::decode_gather(&payload) {
                    Ok((seq, c)) => {
                        if let Some(all) = contribute(shared, seq, link.rank, c) {
                            broadcast_gathered(shared, seq, all);
                        }
                    }
                    Err(e) => {
                        tracing::error!(target: "symcomm::init", "rank {}: bad gather frame from rank {}: {e}", shared.rank, link.rank);
                        live[i] = false;
                        lose(shared, link.rank, LostReason::Disconnected);
                    }
                },
                Ok((FrameType::Gathered, payload)) => {
                    match wire::decode_gathered(&payload, shared.nranks) {
                        Ok((seq, all)) => {
                            lock(&shared.state).done.insert(seq, all);
                            shared.cond.notify_all();
                        }
                        Err(e) => {
                            tracing::error!(target: "symcomm::init", "rank {}: bad gathered frame from the root: {e}", shared.rank);
                            live[i] = false;
                            lose(shared, 0, LostReason::Disconnected);
                        }
                    }
                }
                Ok((FrameType::PeerLost, payload)) => {
                    if let Ok((rank, why)) = wire::decode_peer_lost(&payload) {
                        if rank < shared.nranks {
                            lose(shared, rank, why);
                        }
                    }
                }
                Ok((FrameType::Goodbye, payload)) => {
                    live[i] = false;
                    match wire::decode_goodbye(&payload) {
                        Ok((Farewell::Destroyed, calls, gathers)) => {
                            depart(shared, link.rank, Left { calls, gathers });
                        }
                        Ok((Farewell::Aborted, ..)) => {
                            lose(shared, link.rank, LostReason::Aborted);
                        }
                        Err(e) => {
                            tracing::error!(target: "symcomm::init", "rank {}: bad goodbye from rank {}: {e}", shared.rank, link.rank);
                            lose(shared, link.rank, LostReason::Disconnected);
                        }
                    }
                }
                Ok((FrameType::Departed, payload)) => {
                    if let Ok((rank, calls, gathers)) = wire::decode_departed(&payload) {
                        if rank < shared.nranks && rank != shared.rank {
                            depart(shared, rank, Left { calls, gathers });
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(target: "symcomm::init", "rank {}: control link to rank {} failed: {e}", shared.rank, link.rank);
                    live[i] = false;
                    lose(shared, link.rank, LostReason::Disconnected);
                }
            }
        }
        let now = Instant::now();
        if now >= next_beat {
            next_beat = now + hb;
            for (alive, link) in live.iter_mut().zip(&shared.links) {
                if *alive && !send(link, &beat) {
                    *alive = false;
                    lose(shared, link.rank, LostReason::Disconnected);
                }
            }
        }
        for ((alive, seen), link) in live.iter_mut().zip(&last_seen).zip(&shared.links) {
            if *alive && now.duration_since(*seen) > shared.timing.peer_timeout {
                *alive = false;
                lose(shared, link.rank, LostReason::HeartbeatMissed);
            }
        }
    }
}

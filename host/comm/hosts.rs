//! Collectives across hosts: hierarchical, with the ranks of each host as a communicator of their
//! own (split from this one: symmetric memory and the built-in kernels) and UCX between hosts.
//!
//! Every call has the same three phases: the host's ranks combine or spread the data among
//! themselves (a collective of the host's communicator), ranks exchange over UCX with ranks of
//! the other hosts, and the host's ranks spread what came back. Which ranks exchange:
//!
//! - **Rails** (every collective but all-to-all, which is direct anyway, when every host has the same number `L`
//!   of ranks): the ranks with the same index on every host form a rail, and each rank moves
//!   only its own share between hosts. All-reduce: the host reduce-scatters the vector into `L`
//!   shards, the ranks of each rail all-reduce their shard's partial results, the host
//!   all-gathers the shards. The rail's all-reduce is one-shot (each rank sends its partial
//!   to the others and combines: `(H-1) S / L` bytes per rank for `H` hosts and `S` bytes per
//!   rank, spread over `L` ranks and their NICs) or, for large shards on three hosts or more,
//!   two-shot (a direct reduce-scatter then all-gather among the rail: `2 (H-1) S / (H L)`
//!   bytes in two rounds), by the model (`tune::rail_all_reduce`).
//!   Reduce-scatter: the host reduce-scatters the blocks laid out by rail, and each rank sends
//!   each other host's rail rank that rank's partial block. All-gather: each rank swaps its own
//!   block with its rail, then the host all-gathers the rails' blocks.
//!   Reduce: as all-reduce's first phase, then each rank sends its partial shard to its rail's
//!   rank on the root's host, which combines them, and the root's host gathers the shards.
//!   Broadcast: the root's host broadcasts, each of its ranks sends its shard to its rail, the
//!   other hosts all-gather the shards. Scatter: the root scatters its blocks laid out by rail
//!   on its host, whose ranks send each block along their rail.
//! - **Leaders** (hosts with different numbers of ranks): one rank
//!   per host (the root, on the root's host; elsewhere the host's first rank) exchanges the
//!   host's part with the other hosts' leaders.
//!
//! Reductions happen on the device: partial results of every host are combined in host order
//! with `symcomm_combine`, so every rank gets the same bits.
//!
//! Calls are stream-ordered and asynchronous, as on one host, and can be captured in graphs: the
//! caller's stream hands each call to this rank's worker thread and waits for it (`worker.rs`),
//! and the worker runs the three phases on a stream of its own, moving the bytes between hosts
//! within [`Communicator::op_timeout`] per exchange. All-reduce, reduce and broadcast are
//! pipelined in chunks of [`CommOptions::hosts_chunk_bytes`](crate::CommOptions::hosts_chunk_bytes):
//! the next chunk's first phase runs on the worker's stream while the worker moves the current
//! chunk's bytes between hosts, and the current chunk's last phase while it moves the next one's.
//! How a message crosses (in pieces; handed to UCX in place, or staged through pinned host
//! memory): `wire.rs`.

mod wire;
mod worker;

use std::cell::Cell;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use super::Communicator;
use super::coll::{BufferRef, Call};
use super::memory::FlatMapping;
use super::payload::{self, Tag};
use super::proxy::Proxy;
use crate::image::DEVICE_IMAGE;
use crate::stream::{Buffer, Event, Kernel, KernelArgs, LaunchConfig, Stream};
use crate::tune::{self, Collective};
use crate::ucx::Ucx;
use crate::{Error, RedOp, Result};
use symcomm_device::abi::{P2pOp, SYMCOMM_P2P_RECV, SYMCOMM_P2P_SEND};

/// Threads per CTA of the combining kernel (a grid-stride loop) on a GPU; on the emulator
/// [`COMBINE_THREADS_EMU`], in one CTA.
const COMBINE_THREADS: u32 = 256;
/// On the emulator every CTA thread is a fiber with its own stack, set up at every launch: 256
/// CTAs of 256 threads made a 256 KB all-reduce across 2 hosts take 366 ms (8.5 ms with one CTA)
/// and one CTA of 256 threads an 8-byte one 3.4 ms (1.5 ms with 32).
const COMBINE_THREADS_EMU: u32 = 32;

/// Bytes of a worker address per host all-gather round (a contribution holds at most
/// `MAX_GATHER` bytes).
const ADDRESS_CHUNK: usize = 960;

/// The multi-host state of a communicator, set up by its first collective across hosts.
pub(super) struct Hosts {
    /// The thread that runs the calls, and the words their streams wait on (`worker.rs`).
    /// Declared before the rest: its drop ends the thread first.
    worker: worker::Worker,
    /// This host's ranks (rank `i` of it is `hosts[mine][i]` of the parent).
    local: Arc<Communicator>,
    ucx: Ucx,
    /// Every host's ranks (ranks of the parent, ascending), hosts in the order of their first
    /// rank.
    hosts: Vec<Vec<u32>>,
    /// This rank's host.
    mine: usize,
    /// `symcomm_combine`, its threads per CTA and the most CTAs worth launching (its
    /// grid-stride loop covers any count): what the GPU holds at once, one on the emulator.
    combine: OnceLock<(Kernel, u32, u64)>,
    calls: Mutex<Calls>,
    /// Bytes this rank has sent to other hosts (collectives and send/recv).
    sent_bytes: AtomicU64,
    /// What carries kernels' signals to other hosts (`proxy.rs`).
    proxy: Proxy,
    /// Bytes of the vector per pipelined chunk of an all-reduce
    /// ([`CommOptions::hosts_chunk_bytes`](crate::CommOptions::hosts_chunk_bytes), the same on
    /// every rank).
    chunk_bytes: u64,
    gates: Arc<worker::Gates>,
    /// The first call that failed: every later call and `check_error` report it.
    failed: OnceLock<Error>,
    /// Whether messages cross through staging memory (`wire.rs`, [`wire::stages`]): on a GPU
    /// whose UCX cannot move CUDA memory, and wherever
    /// [`CommOptions::hosts_staging`](crate::CommOptions::hosts_staging) asks for it.
    staged: bool,
    staging: Mutex<Option<wire::Staging>>,
}

/// Starts this rank's proxy, with UCX endpoints of its own to the ranks of other hosts
/// (`remote`). Collective.
fn start_proxy(comm: &Communicator, remote: Vec<u32>) -> Result<Proxy> {
    let ucx = comm.agree(Tag::Ucx, "starting the proxy's UCX", Ucx::new(comm.rank))?;
    let addresses = exchange_addresses(comm, &ucx.address())?;
    let connected = remote
        .iter()
        .map(|&r| ucx.connect(r, &addresses[r as usize]))
        .collect::<Result<Vec<()>>>();
    comm.agree(Tag::Ucx, "connecting the proxy's endpoints", connected)?;
    let started = comm
        .signals
        .as_ref()
        .ok_or_else(|| Error::Unsupported("the signal area is missing".to_owned()))
        .and_then(|signals| {
            Proxy::start(
                ucx,
                comm.rank,
                remote,
                signals,
                Arc::clone(&comm.block),
                comm.backend(),
            )
        });
    comm.agree(Tag::Ucx, "starting the proxy", started)
}

impl Communicator {
    /// Lets this rank's proxy write its copy of `mapping` (`bytes` per rank), if it has one.
    pub(super) fn proxy_region(&self, mapping: &FlatMapping, bytes: u64) -> Result<()> {
        match self.hosts.get() {
            Some(Ok(h)) => h.proxy.add_region(mapping, self.rank, bytes),
            _ => Ok(()),
        }
    }

    /// Forgets allocation `id` in this rank's proxy (its window is gone).
    pub(super) fn forget_region(&self, id: u64) {
        if let Some(Ok(h)) = self.hosts.get() {
            h.proxy.remove_region(id);
        }
    }
}

/// What consecutive calls share (one call at a time).
struct Calls {
    /// The number of the next call (the same on every rank): the UCX tag of its messages.
    seq: u64,
    /// Scratch device memory, grown on demand: buffers 0 and 1 of each of the two chunks in
    /// flight of a pipelined call ([`Phases::slot`]).
    scratch: [Option<Buffer>; 4],
    /// Recorded after the previous call's last phase: the scratch memory is free once it ran.
    last: Option<Event>,
    /// Messages sent to and received from each rank by send/recv (their UCX tags, with
    /// [`P2P_TAG`]).
    sent: Vec<u64>,
    received: Vec<u64>,
}

/// [`Msg::buf`] of a message straight from or into the caller's memory (send/recv, broadcast's
/// whole shards), without a copy through scratch memory (`wire.rs` moves it from and to there).
const CALLERS: usize = usize::MAX;

/// The tag bit of send/recv messages (collectives number their messages by call, send/recv per
/// pair of ranks).
const P2P_TAG: u64 = 1 << 43;
/// Where a collective's exchange round goes in its messages' tags (below [`P2P_TAG`]; call
/// numbers stay below it).
const ROUND_SHIFT: u32 = 40;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The ranks of every host in `host_ids` (one per rank), hosts in the order of their first rank.
fn group_hosts<'a>(host_ids: impl IntoIterator<Item = &'a str>) -> Vec<Vec<u32>> {
    let mut names: Vec<&str> = Vec::new();
    let mut hosts: Vec<Vec<u32>> = Vec::new();
    for (rank, id) in (0u32..).zip(host_ids) {
        match names.iter().position(|n| *n == id) {
            Some(h) => hosts[h].push(rank),
            None => {
                names.push(id);
                hosts.push(vec![rank]);
            }
        }
    }
    hosts
}

impl Communicator {
    /// Sets up the multi-host state (a collective step of init, on communicators whose ranks
    /// span several hosts). A failure (no UCX on some rank) is kept and returned by every call
    /// that needs the state, not by init: the control plane works without it.
    pub(super) fn set_up_hosts(&self) {
        let state = Hosts::new(self).map(Arc::new).map_err(|e| {
            tracing::warn!(
                target: "symcomm::hosts",
                "rank {}: collectives across hosts are unavailable: {e}",
                self.rank
            );
            e.to_string()
        });
        let _ = self.hosts.set(state);
    }

    /// The multi-host state.
    fn hosts(&self) -> Result<Arc<Hosts>> {
        match self.hosts.get() {
            Some(Ok(h)) => Ok(Arc::clone(h)),
            Some(Err(e)) => Err(Error::Unsupported(format!(
                "communication across hosts could not be set up: {e}"
            ))),
            None => Err(Error::Unsupported(format!(
                "rank {}: communication across hosts was not set up (the ranks are on one host)",
                self.rank
            ))),
        }
    }

    /// Bytes this rank has sent to ranks on other hosts so far (0 on one host).
    #[cfg(feature = "testing")]
    pub(crate) fn bytes_to_other_hosts(&self) -> u64 {
        match self.hosts.get() {
            Some(Ok(h)) => h.sent_bytes.load(std::sync::atomic::Ordering::Relaxed),
            _ => 0,
        }
    }

    /// Call numbers taken by collectives across hosts so far (0 on one host).
    #[cfg(feature = "testing")]
    pub(crate) fn exchanges_across_hosts(&self) -> u64 {
        match self.hosts.get() {
            Some(Ok(h)) => lock(&h.calls).seq,
            _ => 0,
        }
    }

    /// A validated collective call of a communicator whose ranks span several hosts: queued on
    /// `stream` for this rank's worker (`worker.rs`).
    pub(super) fn collective_across_hosts(&self, call: &Call<'_>, stream: &Stream) -> Result<()> {
        let hosts = self.hosts()?;
        // SAFETY: the caller's buffers stay valid until its stream has passed the call (the
        // collectives' contract); a graph that captures it keeps them (`submit` retains them).
        // Windows of this communicator are plain memory to the host's communicator.
        let detached = unsafe { worker::detach(call) };
        let bytes = call.send.bytes.max(call.recv.bytes);
        let pieces = 1 + bytes / hosts.chunk_bytes.max(1);
        hosts.submit(
            self,
            worker::Work::Collective(detached),
            stream,
            &[&call.send, &call.recv],
            call.coll.name(),
            pieces,
        )
    }

    /// A validated send/recv group of a communicator whose ranks span several hosts: queued as
    /// a collective is (the operations with ranks of this host as one group of the host's
    /// communicator, the others over UCX through scratch memory).
    pub(super) fn group_across_hosts(
        &self,
        ops: &[P2pOp],
        refs: &[BufferRef<'_>],
        stream: &Stream,
    ) -> Result<()> {
        let hosts = self.hosts()?;
        let refs: Vec<&BufferRef<'_>> = refs.iter().collect();
        hosts.submit(
            self,
            worker::Work::Group(ops.to_vec()),
            stream,
            &refs,
            "send/recv",
            1,
        )
    }

    /// The first failed call across hosts, if one failed (`check_error`).
    pub(super) fn hosts_fault(&self) -> Option<Error> {
        match self.hosts.get() {
            Some(Ok(h)) => h.failed.get().cloned(),
            _ => None,
        }
    }
}

/// One direction of a send/recv operation.
#[derive(Clone, Copy)]
struct Part {
    addr: u64,
    bytes: u64,
    peer: u32,
    send: bool,
}

impl Hosts {
    fn group(&self, comm: &Communicator, ops: &[P2pOp], stream: &Stream) -> Result<()> {
        let mut calls = lock(&self.calls);
        if let Some(e) = calls.last.take() {
            e.synchronize()?;
        }
        let mut parts = Vec::with_capacity(ops.len() * 2);
        for o in ops {
            let part = |peer, send| Part {
                addr: o.addr,
                bytes: o.bytes,
                peer,
                send,
            };
            match o.kind {
                SYMCOMM_P2P_SEND => parts.push(part(o.peer, true)),
                SYMCOMM_P2P_RECV => parts.push(part(o.peer, false)),
                _ => parts.extend([part(o.peer, true), part(o.recv_peer, false)]),
            }
        }
        let here = &self.hosts[self.mine];
        let (local, remote): (Vec<Part>, Vec<Part>) =
            parts.into_iter().partition(|p| here.contains(&p.peer));
        // Scratch 0: every remote message, one 16-byte aligned block each.
        let mut offsets = Vec::with_capacity(remote.len());
        let mut at = 0u64;
        for p in &remote {
            offsets.push(at);
            at += p.bytes.next_multiple_of(16);
        }
        let calls = &mut *calls;
        let (sent, received) = (&mut calls.sent, &mut calls.received);
        let mut msgs: Vec<(bool, Msg, u64)> = Vec::with_capacity(remote.len());
        for (p, &offset) in remote.iter().zip(&offsets) {
            let counter = if p.send {
                &mut sent[p.peer as usize]
            } else {
                &mut received[p.peer as usize]
            };
            let tag = P2P_TAG | *counter;
            *counter += 1;
            let m = Msg {
                peer: p.peer,
                tag,
                buf: 0,
                offset,
                bytes: p.bytes,
            };
            msgs.push((p.send, m, p.addr));
        }
        let mut phases = Phases::new(self, comm, stream, &mut calls.scratch, "send/recv");
        // Messages cross from and into the caller's memory, except where ranges overlap: a
        // send that a receive of the group overwrites (the local group runs before the
        // exchange) and receives into overlapping memory go through scratch memory. (No empty
        // message is direct: its address may be null.)
        let receives: Vec<(usize, u64, u64)> = local
            .iter()
            .filter(|p| !p.send)
            .map(|p| (usize::MAX, p.addr, p.bytes))
            .chain(
                msgs.iter()
                    .enumerate()
                    .filter(|(_, (send, _, _))| !*send)
                    .map(|(i, (_, m, a))| (i, *a, m.bytes)),
            )
            .collect();
        for (i, (_, m, addr)) in msgs.iter_mut().enumerate() {
            let (start, end) = (*addr, *addr + m.bytes);
            let clear = receives
                .iter()
                .all(|&(j, a, n)| j == i || n == 0 || end <= a || a + n <= start);
            if m.bytes > 0 && clear {
                (m.buf, m.offset) = (CALLERS, *addr);
            }
        }
        phases.grow(0, at)?;
        let base = phases.scratch_addr(0);
        // What leaves is copied out before the local group may overwrite it (in place).
        for (_, m, addr) in msgs.iter().filter(|(send, m, _)| *send && m.buf != CALLERS) {
            phases.copy(base + m.offset, *addr, m.bytes)?;
        }
        if !local.is_empty() {
            let index = |r: u32| here.iter().position(|&x| x == r).unwrap_or(0) as u32;
            self.local.group(stream, |g| {
                for p in &local {
                    // SAFETY: the caller's validated operation (its memory is the group's
                    // contract); this call waits for the stream before it returns.
                    let b = unsafe { BufferRef::from_raw(p.addr, p.bytes) };
                    let count = usize::try_from(p.bytes).unwrap_or(usize::MAX);
                    if p.send {
                        g.send(b, count, crate::DataType::U8, index(p.peer))?;
                    } else {
                        g.recv(b, count, crate::DataType::U8, index(p.peer))?;
                    }
                }
                Ok(())
            })?;
        }
        let (sends, recvs): (Vec<_>, Vec<_>) = msgs.into_iter().partition(|(s, _, _)| *s);
        let sends: Vec<Msg> = sends.into_iter().map(|(_, m, _)| m).collect();
        let recvs: Vec<(Msg, u64)> = recvs.into_iter().map(|(_, m, a)| (m, a)).collect();
        let recv_msgs: Vec<Msg> = recvs.iter().map(|(m, _)| *m).collect();
        phases.exchange(&sends, &recv_msgs)?;
        for (m, addr) in recvs.iter().filter(|(m, _)| m.buf != CALLERS) {
            phases.copy(*addr, base + m.offset, m.bytes)?;
        }
        stream.synchronize()
    }

    fn new(comm: &Communicator) -> Result<Hosts> {
        let hosts = group_hosts(comm.table.iter().map(|r| r.host_id.as_str()));
        let mine = hosts
            .iter()
            .position(|h| h.contains(&comm.rank))
            .ok_or_else(|| Error::InvalidArgument(format!("rank {} has no host", comm.rank)))?;
        let color =
            u32::try_from(mine).map_err(|_| Error::InvalidArgument("too many hosts".to_owned()))?;
        let key = i32::try_from(comm.rank)
            .map_err(|_| Error::InvalidArgument("too many ranks".to_owned()))?;
        let local = comm
            .split(Some(color), key)?
            .ok_or_else(|| Error::Unsupported("the host's communicator is missing".to_owned()))?;
        debug_assert_eq!(local.nranks() as usize, hosts[mine].len());
        let ucx = comm.agree(Tag::Ucx, "starting UCX", Ucx::new(comm.rank))?;
        let addresses = exchange_addresses(comm, &ucx.address())?;
        let remote: Vec<u32> = hosts
            .iter()
            .enumerate()
            .filter(|&(h, _)| h != mine)
            .flat_map(|(_, ranks)| ranks.iter().copied())
            .collect();
        let connected = remote
            .iter()
            .map(|&r| ucx.connect(r, &addresses[r as usize]))
            .collect::<Result<Vec<()>>>();
        comm.agree(Tag::Ucx, "connecting UCX endpoints", connected)?;
        let proxy = start_proxy(comm, remote)?;
        let chunk_bytes = agree_on_chunk(comm)?;
        tracing::info!(
            target: "symcomm::hosts",
            "rank {}: {} hosts, this one has ranks {:?}; {}",
            comm.rank,
            hosts.len(),
            hosts[mine],
            ucx.describe()
        );
        let staged = wire::stages(
            comm.backend().is_emu(),
            ucx.cuda_memory(),
            comm.options().hosts_staging,
        );
        tracing::info!(
            target: "symcomm::hosts",
            "rank {}: data between hosts {}",
            comm.rank,
            if staged { "staged through mapped host memory" } else { "handed to UCX in place" }
        );
        Ok(Hosts {
            local,
            ucx,
            hosts,
            mine,
            combine: OnceLock::new(),
            calls: Mutex::new(Calls {
                seq: 0,
                scratch: [None, None, None, None],
                last: None,
                sent: vec![0; comm.nranks as usize],
                received: vec![0; comm.nranks as usize],
            }),
            sent_bytes: AtomicU64::new(0),
            proxy,
            chunk_bytes,
            worker: worker::Worker::start(comm)?,
            gates: Arc::new(worker::Gates::new(comm.backend())?),
            failed: OnceLock::new(),
            staged,
            staging: Mutex::new(None),
        })
    }

    /// Keeps `e` as the first failure of a call across hosts.
    fn fail(&self, e: Error) {
        tracing::warn!(target: "symcomm::hosts", "a call across hosts failed: {e}");
        let _ = self.failed.set(e);
    }

    /// Device address of this rank's proxy queue (`DevComm::proxy`).
    pub(super) fn proxy_addr(&self) -> u64 {
        self.proxy.addr()
    }

    /// The host that holds `rank`, and its index there.
    fn place(&self, rank: u32) -> (usize, u32) {
        for (h, ranks) in self.hosts.iter().enumerate() {
            if let Some(i) = ranks.iter().position(|&r| r == rank) {
                return (h, i as u32);
            }
        }
        (0, 0)
    }

    /// The leader of host `h` for a call rooted at `root` (`None`: no root).
    fn leader(&self, h: usize, root: Option<u32>) -> u32 {
        match root {
            Some(r) if self.place(r).0 == h => r,
            _ => self.hosts[h][0],
        }
    }

    fn run(&self, comm: &Communicator, call: &Call<'_>, stream: &Stream) -> Result<()> {
        let mut calls = lock(&self.calls);
        if let Some(e) = calls.last.take() {
            e.synchronize()?;
        }
        let seq = calls.seq;
        let mut run = Run {
            p: Phases::new(self, comm, stream, &mut calls.scratch, call.coll.name()),
            call: *call,
            seq,
            seqs: 1,
            es: call.dtype.size() as u64,
        };
        let done = match call.coll {
            Collective::AllReduce => run.all_reduce(),
            Collective::Reduce => run.reduce(),
            Collective::Broadcast => run.broadcast(),
            Collective::AllGather => run.all_gather(),
            Collective::ReduceScatter => run.reduce_scatter(),
            Collective::Scatter => run.scatter(),
            Collective::AllToAll => run.all_to_all(),
            // Send/recv comes as a group (Self::group), never as a collective call.
            Collective::SendRecv => Err(Error::InvalidArgument(
                "send/recv across hosts goes through a group".to_owned(),
            )),
        };
        // Every chunk took a call number (the same on every rank), also when the call failed
        // part way: the next call's messages never match this one's.
        let seqs = run.seqs;
        drop(run);
        calls.seq = seq + seqs;
        match done {
            Ok(()) => calls.last = Some(stream.record_event()?),
            // What the call queued before it failed may still use the scratch memory: the
            // next call waits for it too.
            Err(e) => {
                calls.last = stream.record_event().ok();
                return Err(e);
            }
        }
        Ok(())
    }
}

/// Every rank's UCX worker address, through the host all-gather (in rounds of
/// [`ADDRESS_CHUNK`] bytes: an address can be longer than one contribution).
fn exchange_addresses(comm: &Communicator, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
    let what = "exchanging UCX addresses";
    let lengths = comm.gather(
        Tag::UcxAddress,
        what,
        &(mine.len() as u64).to_le_bytes(),
        |b| Ok(b.try_into().map(u64::from_le_bytes).unwrap_or(u64::MAX)),
    )?;
    let longest = lengths.iter().copied().max().unwrap_or(0);
    let rounds = usize::try_from(longest)
        .map_err(|_| Error::InvalidArgument("a UCX address does not fit".to_owned()))?
        .div_ceil(ADDRESS_CHUNK);
    let mut all = vec![Vec::new(); lengths.len()];
    for round in 0..rounds {
        let start = (round * ADDRESS_CHUNK).min(mine.len());
        let end = (start + ADDRESS_CHUNK).min(mine.len());
        let parts = comm.gather(Tag::UcxAddress, what, &mine[start..end], |b| Ok(b.to_vec()))?;
        for (a, p) in all.iter_mut().zip(parts) {
            a.extend_from_slice(&p);
        }
    }
    for (r, (a, &len)) in all.iter().zip(&lengths).enumerate() {
        if a.len() as u64 != len {
            return Err(Error::PeerFailed {
                rank: r as u32,
                what: what.to_owned(),
                message: format!("its address has {} bytes, announced {len}", a.len()),
            });
        }
    }
    Ok(all)
}

/// Every rank's [`CommOptions::hosts_chunk_bytes`](crate::CommOptions::hosts_chunk_bytes):
/// chunks are cut the same way on every rank, so ranks that differ are refused.
fn agree_on_chunk(comm: &Communicator) -> Result<u64> {
    let mine = comm.options().hosts_chunk_bytes;
    let all = comm.gather(
        Tag::HostsChunk,
        "agreeing on the chunk size across hosts",
        &payload::encode_chunk_bytes(mine),
        payload::decode_chunk_bytes,
    )?;
    match all.iter().enumerate().find(|&(_, &b)| b != mine) {
        None => Ok(mine),
        Some((r, b)) => Err(Error::InvalidArgument(format!(
            "SYMCOMM_HOSTS_CHUNK_BYTES differs between ranks: {mine} on rank {}, {b} on rank {r}",
            comm.rank
        ))),
    }
}

/// The moves of one call across hosts: copies on the stream, scratch memory, UCX messages.
struct Phases<'r> {
    hosts: &'r Hosts,
    comm: &'r Communicator,
    stream: &'r Stream,
    scratch: &'r mut [Option<Buffer>; 4],
    /// The operation, for errors.
    what: &'static str,
    /// Which pair of scratch buffers the current chunk uses (0 or 1; 0 when not pipelined):
    /// scratch buffer `i` of the phases is `scratch[i + 2 * slot]`.
    slot: usize,
    /// Set by a pipelined call: the event after the current chunk's first phase, which its
    /// first exchange waits for instead of the whole stream (the next chunk's first phase is
    /// queued behind it and runs during the exchange). Taken by that exchange.
    ready: Cell<Option<Event>>,
}

/// One collective call across hosts (or one chunk of a pipelined call).
struct Run<'r, 'a> {
    p: Phases<'r>,
    call: Call<'a>,
    /// The call's number: the UCX tag of its messages (each chunk of a pipelined call has its
    /// own).
    seq: u64,
    /// Call numbers the call takes (its chunks when pipelined).
    seqs: u64,
    /// Bytes per element.
    es: u64,
}

impl<'r> std::ops::Deref for Run<'r, '_> {
    type Target = Phases<'r>;
    fn deref(&self) -> &Phases<'r> {
        &self.p
    }
}

impl std::ops::DerefMut for Run<'_, '_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.p
    }
}

/// A message of the inter-host phase: `bytes` bytes at `offset` of scratch buffer `buf` (or, with
/// `buf` [`CALLERS`], at address `offset` of the caller's memory), to or from `peer`, with UCX
/// tag `tag`.
#[derive(Clone, Copy)]
struct Msg {
    peer: u32,
    tag: u64,
    buf: usize,
    offset: u64,
    bytes: u64,
}

/// Where all-reduce on rails keeps what in scratch 0 (byte offsets; see
/// [`Run::rail_layout`]), and its sizes.
struct RailLayout {
    two_shot: bool,
    /// Elements per shard (per rank of a host), and its bytes.
    shard: u64,
    block: u64,
    /// Two-shot: elements per piece of a shard (one per host), and its bytes.
    piece: u64,
    pb: u64,
    /// This rank's partial shard, and the reduced shard.
    partial_at: u64,
    result_at: u64,
    /// Bytes of scratch 0.
    scratch: u64,
}

impl<'r> Phases<'r> {
    fn new(
        hosts: &'r Hosts,
        comm: &'r Communicator,
        stream: &'r Stream,
        scratch: &'r mut [Option<Buffer>; 4],
        what: &'static str,
    ) -> Self {
        Phases {
            hosts,
            comm,
            stream,
            scratch,
            what,
            slot: 0,
            ready: Cell::new(None),
        }
    }
}

impl Phases<'_> {
    /// Grows scratch buffer `i` to at least `bytes` bytes (at least one). A buffer replaced by
    /// a larger one is freed once the stream ran what was queued on it.
    fn grow(&mut self, i: usize, bytes: u64) -> Result<()> {
        let need = usize::try_from(bytes.max(1))
            .map_err(|_| Error::InvalidArgument(format!("{bytes} bytes of scratch memory")))?;
        let i = i + 2 * self.slot;
        match &self.scratch[i] {
            Some(b) if b.len() >= need => return Ok(()),
            Some(_) => self.stream.synchronize()?,
            None => {}
        }
        self.scratch[i] = None;
        self.scratch[i] = Some(Buffer::new(self.comm.backend(), need)?);
        Ok(())
    }

    /// Scratch buffer `i` as a collective buffer.
    fn scratch_ref(&self, i: usize) -> BufferRef<'_> {
        self.scratch[i + 2 * self.slot]
            .as_ref()
            .map_or_else(BufferRef::empty, BufferRef::from)
    }

    fn scratch_addr(&self, i: usize) -> u64 {
        self.scratch[i + 2 * self.slot]
            .as_ref()
            .map_or(0, Buffer::addr)
    }

    /// Queues a copy of `bytes` bytes from device address `src` to `dst` (nothing when they are
    /// the same).
    fn copy(&self, dst: u64, src: u64, bytes: u64) -> Result<()> {
        if dst == src || bytes == 0 {
            return Ok(());
        }
        // SAFETY: both ranges lie in the call's validated buffers or in this call's scratch
        // memory (sized by the callers for these ranges), which stay allocated until the stream
        // ran the copy: the call waits for its stream before its inter-host phase and before
        // the next call reuses the scratch memory; the user's buffers are the caller's
        // contract (as for every collective).
        unsafe { self.stream.copy_raw(dst, src, bytes) }
    }
}

impl<'a> Run<'_, 'a> {
    fn local(&self) -> &Communicator {
        &self.hosts.local
    }

    fn me(&self) -> u32 {
        self.comm.rank
    }

    fn my_ranks(&self) -> &[u32] {
        &self.hosts.hosts[self.hosts.mine]
    }

    fn bytes(&self, elems: u64) -> u64 {
        elems * self.es
    }

    /// The operator of the partial (per-host) reductions: Avg sums, the last step divides.
    fn partial_op(&self) -> RedOp {
        match self.call.op {
            RedOp::Avg => RedOp::Sum,
            op => op,
        }
    }

    /// `dst = combine(k blocks of count elements at src)` on the stream, with the call's operator
    /// (Avg divides by the communicator's size).
    fn combine(&self, src: u64, dst: u64, count: u64, k: u32) -> Result<()> {
        let (kernel, threads, most) = match self.hosts.combine.get() {
            Some(k) => k,
            None => {
                let kernel = self.local().load_kernel(&DEVICE_IMAGE, "symcomm_combine")?;
                let (threads, most) = if self.comm.backend().is_emu() {
                    (COMBINE_THREADS_EMU, 1)
                } else {
                    let most = kernel.resident_ctas(COMBINE_THREADS, 0)?;
                    (COMBINE_THREADS, u64::from(most).max(1))
                };
                self.hosts.combine.get_or_init(|| (kernel, threads, most))
            }
        };
        let threads = *threads;
        let ctas = count.div_ceil(u64::from(threads)).clamp(1, *most) as u32;
        let (dtype, redop, divisor) = (
            self.call.dtype.code(),
            self.call.op.code(),
            self.comm.nranks,
        );
        let args = KernelArgs::new()
            .arg(&src)
            .arg(&dst)
            .arg(&count)
            .arg(&k)
            .arg(&dtype)
            .arg(&redop)
            .arg(&divisor);
        // SAFETY: the arguments are symcomm_combine's, in order and with their types; `src`
        // holds k blocks of `count` elements (this call's scratch memory) and `dst` is the first
        // block, other scratch memory of this call, or the call's validated receive buffer; both stay allocated until the stream ran
        // the kernel (see Self::copy).
        unsafe {
            self.stream
                .launch(kernel, LaunchConfig::linear(ctas, threads), &args)
        }
    }

    /// The leaders of every host for a call rooted at `root`, with this rank's host's first.
    fn leaders(&self, root: Option<u32>) -> Vec<u32> {
        (0..self.hosts.hosts.len())
            .map(|h| self.hosts.leader(h, root))
            .collect()
    }

    /// A message of this call to the leader of every host but `skip` (for the call's root),
    /// `at(host)` = (offset in scratch 0, bytes).
    fn to_leaders(&self, skip: usize, at: impl Fn(usize) -> (u64, u64)) -> Vec<Msg> {
        let leaders = self.leaders(self.root());
        (0..leaders.len())
            .filter(|&h| h != skip)
            .map(|h| {
                let (offset, bytes) = at(h);
                Msg {
                    tag: self.seq,
                    peer: leaders[h],
                    buf: 0,
                    offset,
                    bytes,
                }
            })
            .collect()
    }

    /// The leaders reduce `bytes` of partial results (each at the start of scratch 0's block of
    /// their host) into the whole: every leader sends its block to the leaders of `to` (hosts
    /// whose leader needs the result) and combines what it receives into `dst`. Scratch 0 holds
    /// one block per host (the caller put this host's partial result into its own block).
    fn reduce_among_leaders(&self, count: u64, to: &[usize], dst: u64) -> Result<()> {
        let block = self.bytes(count);
        let leaders = self.leaders(self.root());
        let mine = self.hosts.mine;
        let me = self.me();
        let sends: Vec<Msg> = to
            .iter()
            .filter(|&&h| h != mine)
            .map(|&h| Msg {
                tag: self.seq,
                peer: leaders[h],
                buf: 0,
                offset: mine as u64 * block,
                bytes: block,
            })
            .collect();
        let recvs: Vec<Msg> = if to.contains(&mine) {
            (0..leaders.len())
                .filter(|&h| h != mine)
                .map(|h| Msg {
                    tag: self.seq,
                    peer: leaders[h],
                    buf: 0,
                    offset: h as u64 * block,
                    bytes: block,
                })
                .collect()
        } else {
            Vec::new()
        };
        debug_assert_eq!(leaders[mine], me);
        self.exchange(&sends, &recvs)?;
        if to.contains(&mine) {
            let k = u32::try_from(leaders.len()).unwrap_or(u32::MAX);
            self.combine(self.scratch_addr(0), dst, count, k)?;
        }
        Ok(())
    }

    fn root(&self) -> Option<u32> {
        self.call.coll.has_root().then_some(self.call.root)
    }

    /// This rank's index on its host, and the index of its host's leader.
    fn local_leader(&self) -> u32 {
        let leader = self.hosts.leader(self.hosts.mine, self.root());
        self.hosts.place(leader).1
    }

    fn is_leader(&self) -> bool {
        self.hosts.leader(self.hosts.mine, self.root()) == self.me()
    }

    /// Phase 1 of the reductions: the host's partial result (Avg as Sum) on the host's leader,
    /// in its host's block of scratch 0. Returns whether this rank is the leader.
    fn host_partial(&mut self) -> Result<bool> {
        let c = self.call;
        let (count, h) = (c.count, self.hosts.hosts.len() as u64);
        let block = self.bytes(count);
        let leader = self.is_leader();
        if leader {
            self.grow(0, h * block)?;
        }
        let part = if leader {
            self.scratch_ref(0)
                .part(self.hosts.mine as u64 * block, block)
        } else {
            c.recv
        };
        let op = self.partial_op();
        self.local().reduce(
            c.send,
            part,
            count as usize,
            c.dtype,
            op,
            self.local_leader(),
            self.stream,
        )?;
        Ok(leader)
    }

    /// The ranks per host when every host has the same number: then the reductions and the
    /// all-gather run on *rails* (the ranks with the same index on every host exchange their
    /// shares directly, every rank moving its own share of the bytes between hosts) instead of
    /// through one leader per host.
    fn rails(&self) -> Option<u64> {
        let l = self.hosts.hosts[0].len();
        self.hosts
            .hosts
            .iter()
            .all(|r| r.len() == l)
            .then_some(l as u64)
    }

    /// The ranks with this rank's index on every host (its rail), hosts in order.
    fn rail(&self) -> Vec<u32> {
        let j = self.hosts.place(self.me()).1 as usize;
        self.hosts.hosts.iter().map(|r| r[j]).collect()
    }

    /// A message of `bytes` bytes of this call with the rail rank of every host but `skip`, at
    /// byte `at(host)` of scratch 0.
    fn along_rail(&self, skip: usize, bytes: u64, at: impl Fn(usize) -> u64) -> Vec<Msg> {
        let rail = self.rail();
        (0..rail.len())
            .filter(|&k| k != skip)
            .map(|k| Msg {
                tag: self.seq,
                peer: rail[k],
                buf: 0,
                offset: at(k),
                bytes,
            })
            .collect()
    }

    /// The rail exchange: to the rail rank of every other host `k`, `bytes` bytes at
    /// `send_at(k)` (scratch buffer, byte offset); from each, `bytes` bytes into `recv_at(k)`.
    /// `round` numbers the exchanges of one call (their messages' tags differ).
    fn swap_on_rail(
        &self,
        round: u64,
        bytes: u64,
        send_at: impl Fn(usize) -> (usize, u64),
        recv_at: impl Fn(usize) -> (usize, u64),
    ) -> Result<()> {
        let rail = self.rail();
        let mine = self.hosts.mine;
        let tag = self.seq | round << ROUND_SHIFT;
        let msg = |k: usize, (buf, offset): (usize, u64)| Msg {
            tag,
            peer: rail[k],
            buf,
            offset,
            bytes,
        };
        let others = || (0..rail.len()).filter(move |&k| k != mine);
        let sends: Vec<Msg> = others().map(|k| msg(k, send_at(k))).collect();
        let recvs: Vec<Msg> = others().map(|k| msg(k, recv_at(k))).collect();
        self.exchange(&sends, &recvs)
    }

    /// Where all-reduce on rails (`l` ranks on every host) keeps what in scratch 0, for this
    /// call's count: the host reduce-scatters the vector into `l` shards (padded to a multiple
    /// of `l` elements in scratch 1 when it is not one), the ranks of each rail all-reduce their
    /// shard's partial results (one-shot or two-shot, by the model: `tune::rail_all_reduce`),
    /// and the host all-gathers the shards.
    ///
    /// One-shot: a block per host, each host's partial shard (this host's in its own block); the
    /// result in block 0. Two-shot: the partial shard split into h pieces (padded to h pieces of
    /// `piece` elements), then every host's partial of this rank's piece, then the reduced
    /// pieces (the result).
    fn rail_layout(&self, l: u64) -> RailLayout {
        let h = self.hosts.hosts.len() as u64;
        let shard = self.call.count.div_ceil(l);
        let block = self.bytes(shard);
        let mine = self.hosts.mine as u64;
        let hosts = u32::try_from(h).unwrap_or(u32::MAX);
        let two_shot = tune::rail_all_reduce(hosts, block) == tune::RailAllReduce::TwoShot;
        let piece = shard.div_ceil(h);
        let pb = self.bytes(piece);
        let (partial_at, result_at, scratch) = if two_shot {
            (0, 2 * h * pb, 3 * h * pb)
        } else {
            (mine * block, 0, h * block)
        };
        RailLayout {
            two_shot,
            shard,
            block,
            piece,
            pb,
            partial_at,
            result_at,
            scratch,
        }
    }

    /// All-reduce on rails, phase 1: this rank's partial shard (see [`Self::rail_layout`]).
    fn all_reduce_on_rails_first(&mut self, l: u64) -> Result<()> {
        let at = self.rail_layout(l);
        self.grow(0, at.scratch)?;
        self.partial_shard(l, at.partial_at)
    }

    /// All-reduce on rails, phases 2 and 3: the rail's all-reduce of the shard, then the shards
    /// to every rank of the host.
    fn all_reduce_on_rails_rest(&mut self, l: u64) -> Result<()> {
        let at = self.rail_layout(l);
        let h = self.hosts.hosts.len() as u64;
        let mine = self.hosts.mine as u64;
        let hosts = u32::try_from(h).unwrap_or(u32::MAX);
        let s0 = self.scratch_addr(0);
        if at.two_shot {
            let (pb, got, reduced) = (at.pb, h * at.pb, 2 * h * at.pb);
            let at_k = |base: u64| move |k: usize| (0, base + k as u64 * pb);
            self.swap_on_rail(0, pb, at_k(0), at_k(got))?;
            self.copy(s0 + got + mine * pb, s0 + mine * pb, pb)?;
            self.combine(s0 + got, s0 + reduced + mine * pb, at.piece, hosts)?;
            self.swap_on_rail(1, pb, |_| at_k(reduced)(mine as usize), at_k(reduced))?;
        } else {
            let block = at.block;
            let at_k = |k: usize| (0, k as u64 * block);
            self.swap_on_rail(0, block, |_| at_k(mine as usize), at_k)?;
            self.combine(s0, s0, at.shard, hosts)?;
        }
        self.gather_shards(l, at.result_at, true)
    }

    /// Phase 1 of the reductions on rails: this rank's shard (of `ceil(count / l)` elements) of
    /// the host's partial result (Avg as Sum), at byte `at` of scratch 0 (grown by the caller).
    /// A count that is no multiple of `l` is padded in scratch 1 first.
    fn partial_shard(&mut self, l: u64, at: u64) -> Result<()> {
        let c = self.call;
        let shard = c.count.div_ceil(l);
        let block = self.bytes(shard);
        let send = if shard * l != c.count {
            self.grow(1, l * block)?;
            self.copy(self.scratch_addr(1), c.send.addr, self.bytes(c.count))?;
            self.scratch_ref(1).part(0, l * block)
        } else {
            c.send
        };
        let part = self.scratch_ref(0).part(at, block);
        let op = self.partial_op();
        self.local()
            .reduce_scatter(send, part, shard as usize, c.dtype, op, self.stream)
    }

    /// The last phase on rails: every rank's shard (at byte `at` of scratch 0) to every rank of
    /// the host, into `recv` when `into_recv`, else only into scratch 1 (padded: `l` shards).
    fn gather_shards(&mut self, l: u64, at: u64, into_recv: bool) -> Result<()> {
        let c = self.call;
        let shard = c.count.div_ceil(l);
        let block = self.bytes(shard);
        if into_recv && shard * l == c.count {
            let result = self.scratch_ref(0).part(at, block);
            return self
                .local()
                .all_gather(result, c.recv, shard as usize, c.dtype, self.stream);
        }
        self.grow(1, l * block)?;
        let result = self.scratch_ref(0).part(at, block);
        let gathered = self.scratch_ref(1).part(0, l * block);
        self.local()
            .all_gather(result, gathered, shard as usize, c.dtype, self.stream)?;
        if into_recv {
            self.copy(c.recv.addr, self.scratch_addr(1), self.bytes(c.count))?;
        }
        Ok(())
    }

    /// Runs the call in chunks of [`Hosts::chunk_bytes`] (a multiple of `l` elements: only the
    /// last chunk may need padding into shards), pipelined two deep: chunk `k + 1`'s `first`
    /// phase (on this host's ranks) is queued before chunk `k`'s `rest` (its exchanges between
    /// hosts and last phase), whose first exchange waits only for chunk `k`'s first phase, so
    /// the stream runs the one while this thread moves the other's bytes; the two chunks in
    /// flight use separate scratch memory. A vector of one element type, the same on every rank
    /// (all-reduce, reduce, broadcast).
    fn in_chunks(
        &mut self,
        l: u64,
        first: fn(&mut Self) -> Result<()>,
        rest: fn(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let whole = self.call;
        let chunk = (self.hosts.chunk_bytes / self.es / l).max(1) * l;
        let n = whole.count.div_ceil(chunk).max(1);
        self.seqs = n;
        let seq = self.seq;
        let es = self.es;
        let enter = |run: &mut Self, k: u64| {
            if n > 1 {
                let count = chunk.min(whole.count - k * chunk);
                let (at, len) = (k * chunk * es, count * es);
                run.call = Call {
                    send: whole.send.part(at, len),
                    recv: whole.recv.part(at, len),
                    count,
                    ..whole
                };
            }
            run.seq = seq + k;
            run.p.slot = (k % 2) as usize;
        };
        let mut queued: Option<(u64, Option<Event>)> = None;
        for k in 0..=n {
            if k < n {
                enter(self, k);
                first(self)?;
            }
            let ready = if k < n && n > 1 {
                Some(self.stream.record_event()?)
            } else {
                None
            };
            let next = (k < n).then_some((k, ready));
            if let Some((j, e)) = std::mem::replace(&mut queued, next) {
                enter(self, j);
                self.ready.set(e);
                rest(self)?;
            }
        }
        Ok(())
    }

    fn all_reduce(&mut self) -> Result<()> {
        let l = self.rails().unwrap_or(1);
        self.in_chunks(l, Self::all_reduce_first, Self::all_reduce_rest)
    }

    /// All-reduce's phase 1: on rails, this rank's partial shard; through leaders, the host's
    /// partial result on its leader.
    fn all_reduce_first(&mut self) -> Result<()> {
        match self.rails() {
            Some(l) => self.all_reduce_on_rails_first(l),
            None => self.host_partial().map(drop),
        }
    }

    /// All-reduce after phase 1: on rails, the rail's all-reduce and the host's all-gather;
    /// through leaders, every leader gets every host's part and combines them into its recv,
    /// then gives the result to its host.
    fn all_reduce_rest(&mut self) -> Result<()> {
        if let Some(l) = self.rails() {
            return self.all_reduce_on_rails_rest(l);
        }
        if self.is_leader() {
            let all: Vec<usize> = (0..self.hosts.hosts.len()).collect();
            let c = self.call;
            self.reduce_among_leaders(c.count, &all, c.recv.addr)?;
        }
        self.spread_from_leader()
    }

    /// The last phase of all-reduce and broadcast: the leader's `recv` to every rank of its host.
    fn spread_from_leader(&self) -> Result<()> {
        self.host_broadcast(self.call.recv)
    }

    /// The host's broadcast from its leader: the leader's `send` into every rank's `recv`.
    fn host_broadcast(&self, send: BufferRef<'_>) -> Result<()> {
        let c = self.call;
        let lroot = self.local_leader();
        self.local()
            .broadcast(send, c.recv, c.count as usize, c.dtype, lroot, self.stream)
    }

    fn reduce(&mut self) -> Result<()> {
        let l = self.rails().unwrap_or(1);
        self.in_chunks(l, Self::reduce_first, Self::reduce_rest)
    }

    /// Reduce's phase 1: as all-reduce's, into this host's block of scratch 0 on rails.
    fn reduce_first(&mut self) -> Result<()> {
        let Some(l) = self.rails() else {
            return self.host_partial().map(drop);
        };
        let h = self.hosts.hosts.len() as u64;
        let block = self.bytes(self.call.count.div_ceil(l));
        self.grow(0, h * block)?;
        self.partial_shard(l, self.hosts.mine as u64 * block)
    }

    /// Reduce after phase 1: on rails, each rank sends its partial shard to its rail's rank on
    /// the root's host, which combines every host's, and the root's host gathers the shards
    /// (the root keeps them); through leaders, the root's leader combines every host's part.
    fn reduce_rest(&mut self) -> Result<()> {
        let c = self.call;
        let root_host = self.hosts.place(c.root).0;
        let Some(l) = self.rails() else {
            if self.is_leader() {
                self.reduce_among_leaders(c.count, &[root_host], c.recv.addr)?;
            }
            return Ok(());
        };
        let h = self.hosts.hosts.len() as u64;
        let block = self.bytes(c.count.div_ceil(l));
        let mine = self.hosts.mine;
        if mine != root_host {
            let to = Msg {
                tag: self.seq,
                peer: self.rail()[root_host],
                buf: 0,
                offset: mine as u64 * block,
                bytes: block,
            };
            return self.exchange(&[to], &[]);
        }
        let recvs = self.along_rail(mine, block, |k| k as u64 * block);
        self.exchange(&[], &recvs)?;
        let s0 = self.scratch_addr(0);
        let shard = c.count.div_ceil(l);
        self.combine(s0, s0, shard, u32::try_from(h).unwrap_or(u32::MAX))?;
        self.gather_shards(l, 0, false)?;
        if self.me() == c.root {
            self.copy(c.recv.addr, self.scratch_addr(1), self.bytes(c.count))?;
        }
        Ok(())
    }

    fn broadcast(&mut self) -> Result<()> {
        let l = self.rails().unwrap_or(1);
        self.in_chunks(l, Self::broadcast_first, Self::broadcast_rest)
    }

    /// Broadcast's phase 1, on the root's host: the host's own broadcast, and what leaves the
    /// host copied to scratch 0 (on rails every rank's shard, a `1/l` of the vector, padded; else
    /// the whole vector on the root). Nothing elsewhere.
    fn broadcast_first(&mut self) -> Result<()> {
        let c = self.call;
        if self.hosts.mine != self.hosts.place(c.root).0 {
            return Ok(());
        }
        self.host_broadcast(c.send)?;
        let bytes = self.bytes(c.count);
        match self.rails() {
            // Whole shards leave from `recv` itself (`broadcast_rest`).
            Some(l) if c.count % l == 0 => Ok(()),
            Some(l) => {
                let padded = l * self.bytes(c.count.div_ceil(l));
                self.grow(0, padded)?;
                self.copy(self.scratch_addr(0), c.recv.addr, bytes)
            }
            None if self.me() == c.root => {
                self.grow(0, bytes)?;
                self.copy(self.scratch_addr(0), c.send.addr, bytes)
            }
            None => Ok(()),
        }
    }

    /// Broadcast after phase 1. On rails: each rank of the root's host sends its shard to its
    /// rail, and every other host all-gathers the shards — from and into `recv` itself when the
    /// count is a multiple of the rail count (no copy through scratch memory; else the last
    /// shard is padded there). Through leaders: the root sends the vector to every other host's
    /// leader, which gives it to its host.
    fn broadcast_rest(&mut self) -> Result<()> {
        let c = self.call;
        let root_host = self.hosts.place(c.root).0;
        let at_root = self.hosts.mine == root_host;
        let Some(l) = self.rails() else {
            let block = self.bytes(c.count);
            if self.me() == c.root {
                let sends = self.to_leaders(root_host, |_| (0, block));
                return self.exchange(&sends, &[]);
            }
            if self.is_leader() && !at_root {
                self.grow(0, block)?;
                let from = Msg {
                    tag: self.seq,
                    peer: c.root,
                    buf: 0,
                    offset: 0,
                    bytes: block,
                };
                self.exchange(&[], &[from])?;
                self.copy(c.recv.addr, self.scratch_addr(0), block)?;
            }
            return if at_root {
                Ok(())
            } else {
                self.spread_from_leader()
            };
        };
        let shard = c.count.div_ceil(l);
        let block = self.bytes(shard);
        let j = u64::from(self.hosts.place(self.me()).1);
        let whole = c.count % l == 0;
        if at_root {
            let mut sends = self.along_rail(root_host, block, |_| j * block);
            if whole {
                for m in &mut sends {
                    (m.buf, m.offset) = (CALLERS, c.recv.addr + j * block);
                }
            }
            return self.exchange(&sends, &[]);
        }
        if whole {
            let from = Msg {
                tag: self.seq,
                peer: self.rail()[root_host],
                buf: CALLERS,
                offset: c.recv.addr + j * block,
                bytes: block,
            };
            self.exchange(&[], &[from])?;
            // In place: this rank's shard is already at its place in `recv`.
            let mine = c.recv.part(j * block, block);
            return self
                .local()
                .all_gather(mine, c.recv, shard as usize, c.dtype, self.stream);
        }
        self.grow(0, l * block)?;
        let from = Msg {
            tag: self.seq,
            peer: self.rail()[root_host],
            buf: 0,
            offset: j * block,
            bytes: block,
        };
        self.exchange(&[], &[from])?;
        self.grow(1, l * block)?;
        let mine = self.scratch_ref(0).part(j * block, block);
        let all = self.scratch_ref(1).part(0, l * block);
        self.local()
            .all_gather(mine, all, shard as usize, c.dtype, self.stream)?;
        self.copy(c.recv.addr, self.scratch_addr(1), self.bytes(c.count))
    }

    /// All-gather on rails (`l` ranks on every host): every rank swaps its block with its rail
    /// (so it holds the blocks of its rail, hosts in order), the host all-gathers those, and
    /// each rank puts every block at its rank's place.
    fn all_gather_on_rails(&mut self, l: u64) -> Result<()> {
        let c = self.call;
        let h = self.hosts.hosts.len() as u64;
        let block = self.bytes(c.count);
        let mine = self.hosts.mine;
        self.grow(0, h * block)?;
        self.grow(1, l * h * block)?;
        self.copy(
            self.scratch_addr(0) + mine as u64 * block,
            c.send.addr,
            block,
        )?;
        let at = move |k: usize| (0, k as u64 * block);
        self.swap_on_rail(0, block, |_| at(mine), at)?;
        // Scratch 1: for each index j on a host, the blocks of the ranks with index j, hosts
        // in order.
        let rail = self.scratch_ref(0).part(0, h * block);
        let all = self.scratch_ref(1).part(0, l * h * block);
        let per_rail = usize::try_from(h * c.count).unwrap_or(usize::MAX);
        self.local()
            .all_gather(rail, all, per_rail, c.dtype, self.stream)?;
        self.relay_by_rail(true, c.recv.addr, self.scratch_addr(1), block)
    }

    /// Copies every rank's `block` bytes between its place in `ranked` (rank order) and its
    /// place in `railed` (by rail: for each index j on a host, the ranks with index j, hosts in
    /// order): into `ranked` when `to_ranked`, else into `railed`.
    fn relay_by_rail(&self, to_ranked: bool, ranked: u64, railed: u64, block: u64) -> Result<()> {
        let hosts = &self.hosts.hosts;
        let mut i = 0u64;
        for j in 0..hosts[0].len() {
            for ranks in hosts {
                let (r, k) = (ranked + u64::from(ranks[j]) * block, railed + i * block);
                let (dst, src) = if to_ranked { (r, k) } else { (k, r) };
                self.copy(dst, src, block)?;
                i += 1;
            }
        }
        Ok(())
    }

    /// Reduce-scatter on rails (`l` ranks on every host): each rank's blocks are laid out by
    /// rail (for each index j on a host, the blocks of the ranks with index j, hosts in order),
    /// the host reduce-scatters that (rank j gets its rail's blocks, reduced over the host),
    /// then every rank sends each host's partial to the rail rank there and combines the
    /// partials of its own block in host order.
    fn reduce_scatter_on_rails(&mut self, l: u64) -> Result<()> {
        let c = self.call;
        let h = self.hosts.hosts.len() as u64;
        let block = self.bytes(c.count);
        let mine = self.hosts.mine;
        self.grow(0, h * block)?;
        self.grow(1, l * h * block)?;
        self.relay_by_rail(false, c.send.addr, self.scratch_addr(1), block)?;
        let all = self.scratch_ref(1).part(0, l * h * block);
        let rail = self.scratch_ref(0).part(0, h * block);
        let per_rail = usize::try_from(h * c.count).unwrap_or(usize::MAX);
        let op = self.partial_op();
        self.local()
            .reduce_scatter(all, rail, per_rail, c.dtype, op, self.stream)?;
        // Block k of scratch 0 is the host's partial of the block of host k's rail rank: send it
        // there; receive every host's partial of this rank's block into scratch 1.
        self.swap_on_rail(
            0,
            block,
            |k| (0, k as u64 * block),
            |k| (1, k as u64 * block),
        )?;
        let partials = self.scratch_addr(1);
        self.copy(
            partials + mine as u64 * block,
            self.scratch_addr(0) + mine as u64 * block,
            block,
        )?;
        let k = u32::try_from(h).unwrap_or(u32::MAX);
        self.combine(partials, c.recv.addr, c.count, k)
    }

    fn all_gather(&mut self) -> Result<()> {
        if let Some(l) = self.rails() {
            return self.all_gather_on_rails(l);
        }
        let c = self.call;
        let block = self.bytes(c.count);
        let n = u64::from(self.comm.nranks);
        let mine = self.my_ranks().to_vec();
        let local_n = mine.len() as u64;
        // Phase 1: the host's blocks (in host order) on every rank of it, in scratch 1.
        self.grow(1, local_n * block)?;
        let t = self.scratch_ref(1);
        self.local()
            .all_gather(c.send, t, c.count as usize, c.dtype, self.stream)?;
        if self.is_leader() {
            // Phase 2: the leaders swap their hosts' blocks (scratch 0: one region per host,
            // in host order), then put every block at its rank's place.
            self.grow(0, n * block)?;
            let hosts = &self.hosts.hosts;
            let starts: Vec<u64> = hosts
                .iter()
                .scan(0u64, |acc, r| {
                    let s = *acc;
                    *acc += r.len() as u64 * block;
                    Some(s)
                })
                .collect();
            let me = self.hosts.mine;
            let t_addr = self.scratch_addr(1);
            let s_addr = self.scratch_addr(0);
            self.copy(s_addr + starts[me], t_addr, local_n * block)?;
            let leaders = self.leaders(None);
            let sends: Vec<Msg> = (0..hosts.len())
                .filter(|&h| h != me)
                .map(|h| Msg {
                    tag: self.seq,
                    peer: leaders[h],
                    buf: 0,
                    offset: starts[me],
                    bytes: local_n * block,
                })
                .collect();
            let recvs: Vec<Msg> = (0..hosts.len())
                .filter(|&h| h != me)
                .map(|h| Msg {
                    tag: self.seq,
                    peer: leaders[h],
                    buf: 0,
                    offset: starts[h],
                    bytes: hosts[h].len() as u64 * block,
                })
                .collect();
            self.exchange(&sends, &recvs)?;
            for (h, ranks) in hosts.iter().enumerate() {
                for (i, &r) in ranks.iter().enumerate() {
                    let from = s_addr + starts[h] + i as u64 * block;
                    self.copy(c.recv.addr + u64::from(r) * block, from, block)?;
                }
            }
        }
        // Phase 3: the whole result from the leader to its host.
        let lroot = self.local_leader();
        let total = usize::try_from(n * c.count).unwrap_or(usize::MAX);
        self.local()
            .broadcast(c.recv, c.recv, total, c.dtype, lroot, self.stream)
    }

    fn reduce_scatter(&mut self) -> Result<()> {
        if let Some(l) = self.rails() {
            return self.reduce_scatter_on_rails(l);
        }
        let c = self.call;
        let n = u64::from(self.comm.nranks);
        let h = self.hosts.hosts.len() as u64;
        let whole = self.bytes(n * c.count);
        let block = self.bytes(c.count);
        let leader = self.is_leader();
        let mine = self.my_ranks().to_vec();
        let total = usize::try_from(n * c.count).unwrap_or(usize::MAX);
        // Phase 1: the host's partial reduction of every rank's blocks on the leader.
        self.grow(0, h * whole)?;
        self.grow(1, whole + mine.len() as u64 * block)?;
        let part = self
            .scratch_ref(0)
            .part(self.hosts.mine as u64 * whole, whole);
        let op = self.partial_op();
        self.local()
            .reduce(c.send, part, total, c.dtype, op, 0, self.stream)?;
        // Phase 2: the leaders combine every host's (into scratch 1) and lay out the blocks of
        // their host's ranks in host order.
        let full = self.scratch_addr(1);
        let laid = full + whole;
        if leader {
            let all: Vec<usize> = (0..self.hosts.hosts.len()).collect();
            self.reduce_among_leaders(n * c.count, &all, full)?;
            for (i, &r) in mine.iter().enumerate() {
                self.copy(laid + i as u64 * block, full + u64::from(r) * block, block)?;
            }
        }
        // Phase 3: each block to its rank.
        let p = self.scratch_ref(1).part(whole, mine.len() as u64 * block);
        self.local()
            .scatter(p, c.recv, c.count as usize, c.dtype, 0, self.stream)
    }

    /// Scatter on rails (`l` ranks on every host): the root lays its blocks out by rail and
    /// scatters them on its host (each rank gets the blocks of its rail), whose ranks send each
    /// block to its rank along the rail.
    fn scatter_on_rails(&mut self) -> Result<()> {
        let c = self.call;
        let h = self.hosts.hosts.len() as u64;
        let n = u64::from(self.comm.nranks);
        let block = self.bytes(c.count);
        let (root_host, _) = self.hosts.place(c.root);
        let mine = self.hosts.mine;
        let rail = self.rail();
        self.grow(0, h * block)?;
        if mine != root_host {
            let from = Msg {
                tag: self.seq,
                peer: rail[root_host],
                buf: 0,
                offset: 0,
                bytes: block,
            };
            self.exchange(&[], &[from])?;
            return self.copy(c.recv.addr, self.scratch_addr(0), block);
        }
        self.grow(1, n * block)?;
        if self.me() == c.root {
            self.relay_by_rail(false, c.send.addr, self.scratch_addr(1), block)?;
        }
        let laid = self.scratch_ref(1).part(0, n * block);
        let blocks = self.scratch_ref(0).part(0, h * block);
        let per_rail = usize::try_from(h * c.count).unwrap_or(usize::MAX);
        let lroot = self.local_leader();
        self.local()
            .scatter(laid, blocks, per_rail, c.dtype, lroot, self.stream)?;
        let sends = self.along_rail(root_host, block, |k| k as u64 * block);
        self.exchange(&sends, &[])?;
        let own = self.scratch_addr(0) + root_host as u64 * block;
        self.copy(c.recv.addr, own, block)
    }

    fn scatter(&mut self) -> Result<()> {
        if self.rails().is_some() {
            return self.scatter_on_rails();
        }
        let c = self.call;
        let block = self.bytes(c.count);
        let root_host = self.hosts.place(c.root).0;
        let lroot = self.local_leader();
        let hosts = self.hosts.hosts.clone();
        let mine = self.hosts.mine;
        let local_n = hosts[mine].len() as u64;
        if self.me() == c.root {
            // Every host's blocks in its host order, host after host (scratch 0).
            let n = u64::from(self.comm.nranks);
            self.grow(0, n * block)?;
            let s = self.scratch_addr(0);
            let mut starts = Vec::with_capacity(hosts.len());
            let mut at = 0u64;
            for ranks in &hosts {
                starts.push(at);
                for &r in ranks {
                    self.copy(s + at, c.send.addr + u64::from(r) * block, block)?;
                    at += block;
                }
            }
            let sends = self.to_leaders(root_host, |h| (starts[h], hosts[h].len() as u64 * block));
            self.exchange(&sends, &[])?;
            let p = self.scratch_ref(0).part(starts[mine], local_n * block);
            return self
                .local()
                .scatter(p, c.recv, c.count as usize, c.dtype, lroot, self.stream);
        }
        self.grow(0, local_n * block)?;
        if self.is_leader() && mine != root_host {
            let from = Msg {
                tag: self.seq,
                peer: c.root,
                buf: 0,
                offset: 0,
                bytes: local_n * block,
            };
            self.exchange(&[], &[from])?;
        }
        let p = self.scratch_ref(0).part(0, local_n * block);
        self.local()
            .scatter(p, c.recv, c.count as usize, c.dtype, lroot, self.stream)
    }

    fn all_to_all(&mut self) -> Result<()> {
        let c = self.call;
        let block = self.bytes(c.count);
        let n = u64::from(self.comm.nranks);
        let hosts = self.hosts.hosts.clone();
        let mine = hosts[self.hosts.mine].clone();
        let local_n = mine.len() as u64;
        // Scratch 0: [the blocks for this host's ranks, in host order | what they send back]
        // [the blocks for every remote rank | what every remote rank sends], one block each.
        let local_bytes = local_n * block;
        self.grow(0, 2 * local_bytes + 2 * (n - local_n) * block)?;
        let s = self.scratch_addr(0);
        for (i, &r) in mine.iter().enumerate() {
            self.copy(
                s + i as u64 * block,
                c.send.addr + u64::from(r) * block,
                block,
            )?;
        }
        let remote: Vec<u32> = (0..self.comm.nranks)
            .filter(|r| !mine.contains(r))
            .collect();
        let out = 2 * local_bytes;
        let back = out + remote.len() as u64 * block;
        for (i, &r) in remote.iter().enumerate() {
            self.copy(
                s + out + i as u64 * block,
                c.send.addr + u64::from(r) * block,
                block,
            )?;
        }
        let src = self.scratch_ref(0).part(0, local_bytes);
        let dst = self.scratch_ref(0).part(local_bytes, local_bytes);
        self.local()
            .all_to_all(src, dst, c.count as usize, c.dtype, self.stream)?;
        let msg = |i: usize, r: u32, base: u64| Msg {
            tag: self.seq,
            peer: r,
            buf: 0,
            offset: base + i as u64 * block,
            bytes: block,
        };
        let sends: Vec<Msg> = remote
            .iter()
            .enumerate()
            .map(|(i, &r)| msg(i, r, out))
            .collect();
        let recvs: Vec<Msg> = remote
            .iter()
            .enumerate()
            .map(|(i, &r)| msg(i, r, back))
            .collect();
        self.exchange(&sends, &recvs)?;
        for (i, &r) in mine.iter().enumerate() {
            let from = s + local_bytes + i as u64 * block;
            self.copy(c.recv.addr + u64::from(r) * block, from, block)?;
        }
        for (i, &r) in remote.iter().enumerate() {
            self.copy(
                c.recv.addr + u64::from(r) * block,
                s + back + i as u64 * block,
                block,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::group_hosts;

    #[test]
    fn hosts_are_grouped_in_the_order_of_their_first_rank() {
        assert_eq!(
            group_hosts(["a", "b", "a", "c", "b"]),
            [vec![0, 2], vec![1, 4], vec![3]]
        );
        assert_eq!(group_hosts(["x"; 3]), [vec![0, 1, 2]]);
        assert!(group_hosts([]).is_empty());
    }
}

//! The collectives and send/recv: each entry point checks its arguments (errors returned by the
//! call itself, nothing queued), then runs at once or, inside a group, at `ncclGroupEnd`.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

use symcomm::{BufferRef, DataType, RedOp};

use crate::comm::{self, Comm};
use crate::error::{Fail, guard};
use crate::group;
use crate::premul::{FIRST_OP, PreMul};
use crate::types::{CommPtr, NcclResult, data_type, rank_arg, red_op};

/// A collective's kind (NCCL's set that symcomm runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Scatter,
}

impl Kind {
    /// Blocks of `count` elements in the (send, receive) buffers on `n` ranks.
    fn blocks(self, n: u64) -> (u64, u64) {
        match self {
            Kind::AllGather => (1, n),
            Kind::ReduceScatter | Kind::Scatter => (n, 1),
            Kind::AllToAll => (n, n),
            _ => (1, 1),
        }
    }
}

/// One checked call, ready to run.
pub(crate) enum Work {
    Coll {
        kind: Kind,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: RedOp,
        /// A pre-multiplied sum's op (`op` is then `Sum`).
        premul: Option<Arc<PreMul>>,
        root: u32,
        stream: usize,
    },
    P2p {
        is_send: bool,
        buf: u64,
        count: usize,
        dtype: DataType,
        peer: u32,
        stream: usize,
    },
    /// `ncclGather`: sends and receives to and from the root, run with the p2p of its group.
    Gather(GatherCall),
}

/// A checked `ncclGather` on one rank.
pub(crate) struct GatherCall {
    send: u64,
    recv: u64,
    count: usize,
    dtype: DataType,
    root: u32,
    stream: usize,
}

/// Bytes of `blocks` blocks of `count` elements of `dtype`.
fn bytes(count: usize, dtype: DataType, blocks: u64) -> Result<u64, Fail> {
    (count as u64)
        .checked_mul(dtype.size() as u64)
        .and_then(|b| b.checked_mul(blocks))
        .ok_or_else(|| {
            Fail::invalid_argument(format!(
                "count {count} of {} x {blocks} blocks overflows",
                dtype.name()
            ))
        })
}

/// Runs `work` of one communicator: the collectives in call order, then every send and receive
/// together as one symcomm group (they must share a stream).
pub(crate) fn run(comm: &Comm, work: Vec<Work>) -> Result<(), Fail> {
    let n = comm.inner.nranks();
    let mut p2p = Vec::new();
    for w in work {
        match w {
            Work::Coll {
                kind,
                send,
                recv,
                count,
                dtype,
                op,
                premul,
                root,
                stream,
            } => {
                let (sb, rb) = kind.blocks(u64::from(n));
                let me = comm.inner.rank();
                // Buffers NCCL reads or writes on the root only may be anything elsewhere: use
                // the other buffer, in place, where the kernel does not touch it.
                let (sbytes, rbytes) = (bytes(count, dtype, sb)?, bytes(count, dtype, rb)?);
                let send = match kind {
                    Kind::Broadcast if me != root => recv,
                    // Symcomm stages every rank's send buffer: off the root, scratch memory
                    // stands in for the one NCCL ignores there (which may be NULL or short).
                    Kind::Scatter if me != root && sbytes > 0 => comm.scratch(None, sbytes)?,
                    _ => send,
                };
                let recv = if kind == Kind::Reduce && me != root && recv == 0 {
                    send
                } else {
                    recv
                };
                let c = &comm.inner;
                comm.on_stream(stream, |st| {
                    let send = match &premul {
                        Some(p) => {
                            // SAFETY: NCCL's contract, as below, for the send buffer.
                            unsafe { comm.premul.scale(comm, p, send, count as u64 * sb, st) }?
                        }
                        None => send,
                    };
                    // SAFETY: NCCL's contract: the buffers hold `count` elements per block on
                    // this rank's device (host memory on the emulator) and stay allocated,
                    // untouched by other work, until the stream has run the call (the scratch
                    // buffer of a pre-multiplied sum lives as long as the communicator).
                    let (s, r) = unsafe {
                        (
                            BufferRef::from_raw(send, sbytes),
                            BufferRef::from_raw(recv, rbytes),
                        )
                    };
                    Ok(match kind {
                        Kind::AllReduce => c.all_reduce(s, r, count, dtype, op, st),
                        Kind::Broadcast => c.broadcast(s, r, count, dtype, root, st),
                        Kind::Reduce => c.reduce(s, r, count, dtype, op, root, st),
                        Kind::AllGather => c.all_gather(s, r, count, dtype, st),
                        Kind::ReduceScatter => c.reduce_scatter(s, r, count, dtype, op, st),
                        Kind::AllToAll => c.all_to_all(s, r, count, dtype, st),
                        Kind::Scatter => c.scatter(s, r, count, dtype, root, st),
                    }?)
                })?;
            }
            p @ Work::P2p { .. } => p2p.push(p),
            Work::Gather(call) => gather(comm, &call, &mut p2p)?,
        }
    }
    let Some(Work::P2p { stream, .. }) = p2p.first() else {
        return Ok(());
    };
    let stream = *stream;
    // Symcomm's groups hold one send and one receive per peer; NCCL's any number, matched in
    // call order. Round k holds the k-th send to and the k-th receive from each peer: the k-th
    // send of one rank to another meets the other's k-th receive from it in the same round, so
    // running the rounds one after the other, each as one symcomm group, cannot deadlock.
    let mut rounds: Vec<Vec<P2pOp<'_>>> = Vec::new();
    let mut seen: HashMap<(bool, u32), usize> = HashMap::new();
    for w in p2p {
        if let Work::P2p {
            is_send,
            buf,
            count,
            dtype,
            peer,
            stream: s,
        } = w
        {
            if s != stream {
                return Err(Fail::invalid_usage(
                    "the sends and receives of one communicator in a group must use one stream",
                ));
            }
            let b = bytes(count, dtype, 1)?;
            let k = seen.entry((is_send, peer)).or_default();
            if rounds.len() <= *k {
                rounds.push(Vec::new());
            }
            // SAFETY: as for the collectives above.
            rounds[*k].push((
                is_send,
                unsafe { BufferRef::from_raw(buf, b) },
                count,
                dtype,
                peer,
            ));
            *k += 1;
        }
    }
    rounds.iter().try_for_each(|ops| {
        comm.on_stream(stream, |st| {
            Ok(comm.inner.group(st, |g| {
                ops.iter()
                    .try_for_each(|&(is_send, buf, count, dtype, peer)| {
                        if is_send {
                            g.send(buf, count, dtype, peer)
                        } else {
                            g.recv(buf, count, dtype, peer)
                        }
                    })
            })?)
        })
    })
}

/// A send or receive of a group: (is a send, buffer, count, type, peer).
type P2pOp<'a> = (bool, BufferRef<'a>, usize, DataType, u32);

/// `ncclGather` on this rank: off the root one send to it; on the root one receive per other
/// rank into its block, queued in `p2p` (they run with the group's other sends and receives),
/// and its own block copied now, in stream order, unless in place.
fn gather(comm: &Comm, call: &GatherCall, p2p: &mut Vec<Work>) -> Result<(), Fail> {
    let &GatherCall {
        send,
        recv,
        count,
        dtype,
        root,
        stream,
    } = call;
    let me = comm.inner.rank();
    if count == 0 {
        return Ok(());
    }
    let block = bytes(count, dtype, 1)?;
    if me != root {
        p2p.push(Work::P2p {
            is_send: true,
            buf: send,
            count,
            dtype,
            peer: root,
            stream,
        });
        return Ok(());
    }
    for peer in (0..comm.inner.nranks()).filter(|&p| p != root) {
        p2p.push(Work::P2p {
            is_send: false,
            buf: recv + u64::from(peer) * block,
            count,
            dtype,
            peer,
            stream,
        });
    }
    let own = recv + u64::from(root) * block;
    if send != own {
        // SAFETY: NCCL's contract: the send buffer holds `count` elements and the receive
        // buffer `nranks * count` on the root's device, live until the stream ran the call;
        // `copy_raw` refuses overlapping ranges (a gather neither in nor out of place).
        comm.on_stream(stream, |st| Ok(unsafe { st.copy_raw(own, send, block) }?))?;
    }
    Ok(())
}

/// Looks up `comm`, checks it is usable, and submits what `make` builds from it.
fn submit(comm: CommPtr, make: impl FnOnce(&Comm) -> Result<Work, Fail>) -> Result<(), Fail> {
    let c = comm::lookup(comm)?;
    c.check_usable()?;
    let work = make(&c)?;
    group::submit(c, work)
}

/// A collective's buffer, count and type arguments as C passes them, plus its op and root for
/// the calls that have them.
struct Args {
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    root: c_int,
}

impl Args {
    fn new(send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int) -> Self {
        Args {
            send,
            recv,
            count,
            dtype,
            op: 0,
            root: 0,
        }
    }

    fn op(self, op: c_int) -> Self {
        Args { op, ..self }
    }

    fn root(self, root: c_int) -> Self {
        Args { root, ..self }
    }
}

fn collective(kind: Kind, a: Args, comm: CommPtr, stream: *mut c_void) -> Result<(), Fail> {
    submit(comm, |c| {
        let dtype = data_type(a.dtype)?;
        let (op, premul) = if a.op >= FIRST_OP {
            let p = c.premul.find(a.op)?;
            if p.dtype != dtype {
                return Err(Fail::invalid_argument(format!(
                    "reduction op {} was made for {}, the call is on {}",
                    a.op,
                    p.dtype.name(),
                    dtype.name()
                )));
            }
            (RedOp::Sum, Some(p))
        } else {
            (red_op(a.op)?, None)
        };
        let n = c.inner.nranks();
        let root = rank_arg("root", a.root, n)?;
        let (sb, rb) = kind.blocks(u64::from(n));
        bytes(a.count, dtype, sb.max(rb))?;
        Ok(Work::Coll {
            kind,
            send: a.send as u64,
            recv: a.recv as u64,
            count: a.count,
            dtype,
            op,
            premul,
            root,
            stream: stream as usize,
        })
    })
}

/// `ncclAllReduce`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    comm: CommPtr,
    stream: *mut c_void,
) -> NcclResult {
    guard("ncclAllReduce", || {
        collective(
            Kind::AllReduce,
            Args::new(sendbuff, recvbuff, count, datatype).op(op),
            comm,
            stream,
        )
    })
}

/// `ncclBroadcast`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: CommPtr,
    stream: *mut c_void,
) -> NcclResult {
    guard("ncclBroadcast", || {
        collective(
            Kind::Broadcast,
            Args::new(sendbuff, recvbuff, count, datatype).root(root),
            comm,
            stream,
        )
    })
}

/// `ncclBcast`: in-place broadcast.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: CommPtr,
    stream: *mut c_void,
) -> NcclResult {
    guard("ncclBcast", || {
        collective(
            Kind::Broadcast,
            Args::new(buff, buff, count, datatype).root(root),
            comm,
            stream,
        )
    })
}

/// `ncclReduce` (`recvbuff` is used on the root only).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    root: c_int,
    comm: CommPtr,
    stream: *mut c_void,
) -> NcclResult {
    guard("ncclReduce", || {
        collective(
            Kind::Reduce,
            Args::new(sendbuff, recvbuff, count, datatype)
                .op(op)
                .root(root),
            comm,
            stream,
        )
    })
}

/// `ncclAllGather` (`sendcount` elements per rank).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    comm: CommPtr,
    stream: *mut c_void,
) -> NcclResult {
    guard("ncclAllGather", || {
        collective(
            Kind::AllGather,
            Args::new(sendbuff, recvbuff, sendcount, datatype),
            comm,
            stream,
        )
    })
}

/// `ncclReduceScatter` (`recvcount` elements per rank).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    op: c_int,
    comm: CommPtr,
    stream: *mut c_void,
) -> NcclResult {
    guard("ncclReduceScatter", || {
        collective(
            Kind::ReduceScatter,
            Args::new(sendbuff, recvbuff, recvcount, datatype).op(op),
            comm,
            stream,
        )
    })
}

/// `ncclAlltoAll` (`count` elements to and from each rank).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    comm: CommPtr,
    stream: *mut c_void,
) -> NcclResult {
    guard("ncclAlltoAll", || {
        collective(
            Kind::AllToAll,
            Args::new(sendbuff, recvbuff, count, datatype),
            comm,
            stream,
        )
    })
}

fn p2p(
    is_send: bool,
    buf: *const c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    comm: CommPtr,
    stream: *mut c_void,
) -> Result<(), Fail> {
    submit(comm, |c| {
        let dtype = data_type(dtype)?;
        let peer = rank_arg("peer", peer, c.inner.nranks())?;
        bytes(count, dtype, 1)?;
        Ok(Work::P2p {
            is_send,
            buf: buf as u64,
            count,
            dtype,
            peer,
            stream: stream as usize,
        })
    })
}

/// `ncclSend`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: CommPtr,
    stream: *mut c_void,
) -> NcclResult {
    guard("ncclSend", || {
        p2p(true, sendbuff, count, datatype, peer, comm, stream)
    })
}

/// `ncclRecv`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: CommPtr,
    stream: *mut c_void,
) -> NcclResult {
    guard("ncclRecv", || {
        p2p(false, recvbuff, count, datatype, peer, comm, stream)
    })
}

/// `ncclScatter` (NCCL 2.28): block i of the root's `sendbuff` (`recvcount` elements) into rank
/// i's `recvbuff`; `sendbuff` is read on the root only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    root: c_int,
    comm: CommPtr,
    stream: *mut c_void,
) -> NcclResult {
    guard("ncclScatter", || {
        collective(
            Kind::Scatter,
            Args::new(sendbuff, recvbuff, recvcount, datatype).root(root),
            comm,
            stream,
        )
    })
}

/// `ncclGather` (NCCL 2.28): every rank's `sendcount` elements into block i of the root's
/// `recvbuff`; `recvbuff` is used on the root only. A group of sends and receives to and from
/// the root (inside `ncclGroupStart` / `ncclGroupEnd`, part of that group's).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    root: c_int,
    comm: CommPtr,
    stream: *mut c_void,
) -> NcclResult {
    guard("ncclGather", || {
        submit(comm, |c| {
            let dtype = data_type(datatype)?;
            let n = c.inner.nranks();
            let root = rank_arg("root", root, n)?;
            bytes(sendcount, dtype, u64::from(n))?;
            let me = c.inner.rank();
            let null = |what: &str| Fail::invalid_argument(format!("{what} is NULL"));
            if sendcount > 0 && sendbuff.is_null() {
                return Err(null("sendbuff"));
            }
            if sendcount > 0 && me == root && recvbuff.is_null() {
                return Err(null("recvbuff (on the root)"));
            }
            if me == root {
                // In place is sendbuff == recvbuff + root * sendcount; other overlaps are not.
                let block = bytes(sendcount, dtype, 1)?;
                let (s0, r0) = (sendbuff as u64, recvbuff as u64);
                let r1 = r0.saturating_add(block * u64::from(n));
                let own = r0 + u64::from(root) * block;
                if block > 0 && s0 < r1 && r0 < s0.saturating_add(block) && s0 != own {
                    return Err(Fail::invalid_argument(
                        "the send and recv buffers overlap without being in place (in place: \
                         sendbuff = recvbuff + root * sendcount)",
                    ));
                }
            }
            Ok(Work::Gather(GatherCall {
                send: sendbuff as u64,
                recv: recvbuff as u64,
                count: sendcount,
                dtype,
                root,
                stream: stream as usize,
            }))
        })
    })
}

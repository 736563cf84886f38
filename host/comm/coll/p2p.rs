//! Point-to-point: sends and receives, alone or posted together in a [`P2pGroup`].

use std::marker::PhantomData;

use symcomm_device::abi::{
    P2pArgs, P2pOp, SYMCOMM_P2P_EXCHANGE, SYMCOMM_P2P_MAX_OPS, SYMCOMM_P2P_RECV, SYMCOMM_P2P_SEND,
};

use super::{BufferRef, DataType};
use crate::comm::Communicator;
use crate::stream::{Buffer, KernelArgs, LaunchConfig, Stream};
use crate::tune;
use crate::{Error, Result};

/// Sends and receives posted together and launched as one kernel by [`Communicator::group`]:
/// they progress concurrently, so a rank may post them in any order without deadlock (for
/// example a send to the next pipeline stage and a receive from the previous one). A send and a
/// receive on exactly the same bytes run in place (each chunk leaves before its replacement
/// arrives); any other overlap with a receive buffer is refused.
#[derive(Debug)]
pub struct P2pGroup<'a> {
    nranks: u32,
    ops: Vec<P2pOp>,
    /// The [`Buffer`]s the operations use (their drops wait for the group's launch).
    buffers: Vec<&'a Buffer>,
    /// The operations' buffers, which a graph that captures the group keeps alive.
    refs: Vec<BufferRef<'a>>,
    _borrow: PhantomData<&'a ()>,
}

impl<'a> P2pGroup<'a> {
    fn add(
        &mut self,
        is_send: bool,
        buf: BufferRef<'a>,
        count: usize,
        dtype: DataType,
        peer: u32,
    ) -> Result<()> {
        let what = if is_send { "send" } else { "recv" };
        let bad = |m: String| Err(Error::InvalidArgument(format!("{what}: {m}")));
        if peer >= self.nranks {
            return bad(format!("peer {peer} of {} ranks", self.nranks));
        }
        let Some(bytes) = (count as u64).checked_mul(dtype.size() as u64) else {
            return bad(format!("count {count} overflows"));
        };
        if buf.bytes < bytes {
            return bad(format!(
                "the buffer has {} bytes; {count} elements of {} need {bytes}",
                buf.bytes,
                dtype.name()
            ));
        }
        if buf.addr % dtype.size() as u64 != 0 {
            return bad(format!(
                "the buffer (address {:#x}) is not aligned to {} bytes",
                buf.addr,
                dtype.size()
            ));
        }
        if bytes > 0 && buf.addr == 0 {
            return bad("the buffer is null".into());
        }
        let sends_to = |o: &P2pOp| o.kind != SYMCOMM_P2P_RECV && o.peer == peer;
        let recvs_from = |o: &P2pOp| match o.kind {
            SYMCOMM_P2P_RECV => o.peer == peer,
            SYMCOMM_P2P_EXCHANGE => o.recv_peer == peer,
            _ => false,
        };
        if self
            .ops
            .iter()
            .any(|o| if is_send { sends_to(o) } else { recvs_from(o) })
        {
            return bad(format!(
                "a group holds at most one {what} per peer (peer {peer} has one)"
            ));
        }
        if bytes == 0 {
            return Ok(());
        }
        if let Some(b) = buf.buffer {
            self.buffers.push(b);
        }
        self.refs.push(buf);
        // Overlaps: sends may share memory; a receive may overlap nothing else, except a send
        // of exactly the same bytes (in place), which becomes one exchange.
        let (lo, hi) = (buf.addr, buf.addr + bytes);
        let overlapping: Vec<usize> = (0..self.ops.len())
            .filter(|&k| {
                let o = &self.ops[k];
                let writes = o.kind != SYMCOMM_P2P_SEND;
                (writes || !is_send) && lo < o.addr + o.bytes && o.addr < hi
            })
            .collect();
        match overlapping.as_slice() {
            [] => {}
            [k] if self.ops[*k].addr == buf.addr
                && self.ops[*k].bytes == bytes
                && (self.ops[*k].kind == SYMCOMM_P2P_SEND) != is_send
                && self.ops[*k].kind != SYMCOMM_P2P_EXCHANGE =>
            {
                let o = &mut self.ops[*k];
                let (to, from) = if is_send {
                    (peer, o.peer)
                } else {
                    (o.peer, peer)
                };
                o.kind = SYMCOMM_P2P_EXCHANGE;
                o.peer = to;
                o.recv_peer = from;
                return Ok(());
            }
            _ => {
                return bad(
                    "its buffer overlaps another operation of the group (only a send and a \
                     receive of exactly the same bytes may share memory: in place)"
                        .into(),
                );
            }
        }
        if self.ops.len() >= SYMCOMM_P2P_MAX_OPS as usize {
            return bad(format!(
                "a group holds at most {SYMCOMM_P2P_MAX_OPS} operations"
            ));
        }
        self.ops.push(P2pOp {
            addr: buf.addr,
            bytes,
            peer,
            kind: if is_send {
                SYMCOMM_P2P_SEND
            } else {
                SYMCOMM_P2P_RECV
            },
            recv_peer: 0,
            reserved: 0,
        });
        Ok(())
    }

    /// Posts a send of `count` elements of `buf` to rank `peer` (who posts the matching
    /// receive with the same count and type).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`]: peer out of range, buffer too small or misaligned, a second
    /// send to the same peer in this group, more than `SYMCOMM_P2P_MAX_OPS` operations.
    pub fn send(
        &mut self,
        buf: impl Into<BufferRef<'a>>,
        count: usize,
        dtype: DataType,
        peer: u32,
    ) -> Result<()> {
        self.add(true, buf.into(), count, dtype, peer)
    }

    /// Posts a receive of `count` elements from rank `peer` into `buf`.
    ///
    /// # Errors
    /// As [`Self::send`].
    pub fn recv(
        &mut self,
        buf: impl Into<BufferRef<'a>>,
        count: usize,
        dtype: DataType,
        peer: u32,
    ) -> Result<()> {
        self.add(false, buf.into(), count, dtype, peer)
    }
}

impl Communicator {
    /// Sends `count` elements of `buf` to rank `peer`, stream-ordered; the peer calls
    /// [`Self::recv`] (or posts the receive in a [`Self::group`]). A lone send completes only
    /// when the peer receives — post sends and receives that depend on each other in one group.
    ///
    /// # Errors
    /// As [`P2pGroup::send`], the communicator's sticky error, backend errors.
    pub fn send<'a>(
        &self,
        buf: impl Into<BufferRef<'a>>,
        count: usize,
        dtype: DataType,
        peer: u32,
        stream: &Stream,
    ) -> Result<()> {
        let buf = buf.into();
        self.group(stream, |g| g.send(buf, count, dtype, peer))
    }

    /// Receives `count` elements from rank `peer` into `buf`, stream-ordered.
    ///
    /// # Errors
    /// As [`Self::send`].
    pub fn recv<'a>(
        &self,
        buf: impl Into<BufferRef<'a>>,
        count: usize,
        dtype: DataType,
        peer: u32,
        stream: &Stream,
    ) -> Result<()> {
        let buf = buf.into();
        self.group(stream, |g| g.recv(buf, count, dtype, peer))
    }

    /// Posts the sends and receives that `build` adds, then launches them as one kernel on
    /// `stream` (one CTA per operation, all progressing together). Nothing is launched when
    /// `build` or validation fails. Data moves through the stream's staging window in chunks
    /// of `SYMCOMM_STAGING_BYTES / nranks` bytes.
    ///
    /// ```no_run
    /// # use symcomm::{Communicator, DataType};
    /// # fn f(comm: &Communicator, stream: &symcomm::Stream, a: &symcomm::Buffer, b: &symcomm::Buffer) -> symcomm::Result<()> {
    /// let (next, prev) = ((comm.rank() + 1) % comm.nranks(), (comm.rank() + comm.nranks() - 1) % comm.nranks());
    /// comm.group(stream, |g| {
    ///     g.send(a, 1024, DataType::F32, next)?;
    ///     g.recv(b, 1024, DataType::F32, prev)
    /// })?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`P2pGroup::send`], and [`Error::InvalidArgument`] for a stream of another backend;
    /// the stream errors of [`Self::all_reduce`].
    pub fn group<'a>(
        &self,
        stream: &Stream,
        build: impl FnOnce(&mut P2pGroup<'a>) -> Result<()>,
    ) -> Result<()> {
        let mut group = P2pGroup {
            nranks: self.nranks,
            ops: Vec::new(),
            buffers: Vec::new(),
            refs: Vec::new(),
            _borrow: PhantomData,
        };
        build(&mut group)?;
        self.check_stream(stream, "send/recv")?;
        self.check_error()?;
        if group.ops.is_empty() {
            return Ok(());
        }
        for op in &group.ops {
            self.control.check_peer(op.peer)?;
        }
        let lane = self.lane(stream)?;
        let threads = tune::base_threads(self.geometry_kind());
        let kernel = self.builtin_kernel(
            &self.coll.p2p_kernel,
            "symcomm_sendrecv",
            threads,
            SYMCOMM_P2P_MAX_OPS,
        )?;
        if group.ops.len() as u32 > kernel.max_ctas {
            return Err(Error::InvalidArgument(format!(
                "a send/recv group of {} operations runs one CTA per operation, and every CTA \
                 must be resident with its peer's: this rank's share of its GPU is {} CTAs of \
                 {threads} threads ({} ranks of this communicator share the GPU); split the \
                 group",
                group.ops.len(),
                kernel.max_ctas,
                self.gpu_ranks
            )));
        }
        let mut args = P2pArgs {
            stage: lane.stage_handle(&lane.stage_in, self.rank),
            nops: group.ops.len() as u32,
            reserved: 0,
            ops: [P2pOp::default(); SYMCOMM_P2P_MAX_OPS as usize],
        };
        args.ops[..group.ops.len()].copy_from_slice(&group.ops);
        let kargs = KernelArgs::new().arg(&self.device_handle()?).arg(&args);
        let retain = || self.retained(&lane, &group.refs);
        // SAFETY: `symcomm_sendrecv(DevComm, P2pArgs)` by value; the staging window lives as
        // long as the lane; the drops of windows and buffers wait for the call, a graph that
        // records it keeps them alive (`retain`), and raw buffers stay valid until the stream
        // has run it (the BufferRef contract).
        let issued = unsafe {
            stream.launch_retaining(
                &kernel.kernel,
                LaunchConfig::linear(group.ops.len() as u32, kernel.threads),
                &kargs,
                &retain,
            )
        };
        self.track(&lane, stream, group.buffers.iter().copied());
        issued
    }
}

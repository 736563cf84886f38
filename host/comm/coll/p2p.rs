//! Point-to-point: sends and receives, alone or posted together in a [`P2pGroup`].

use std::marker::PhantomData;
use std::sync::Arc;

use symcomm_device::abi::{
    P2pArgs, P2pOp, SYMCOMM_P2P_CHANNELS, SYMCOMM_P2P_EXCHANGE, SYMCOMM_P2P_MAX_OPS,
    SYMCOMM_P2P_RECV, SYMCOMM_P2P_SEND,
};

use super::{BufferRef, DataType, Lane};
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
            ctas: 1,
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
    /// `build` or validation fails. Data moves through the stream's staging window: each pair
    /// of ranks has `SYMCOMM_STAGING_BYTES / nranks` bytes of it, cut into up to
    /// `SYMCOMM_P2P_CHANNELS` (8) channels of two slots, so a large message moves as pieces of
    /// one slot on several CTAs at once, double-buffered (the CTAs come from this rank's share
    /// of its GPU, split among the group's operations). Groups run one at a time: a group on
    /// another stream than the previous group's first waits, in stream order, for that stream's
    /// latest call (each pair's send/recv signal words serve every stream); groups captured into
    /// a graph are not ordered so, and must not replay while send/recv runs on another stream.
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
        self.check_backend(stream, "send/recv")?;
        self.check_error()?;
        if group.ops.is_empty() {
            return Ok(());
        }
        for op in &group.ops {
            self.control.check_peer(op.peer)?;
        }
        if !self.spans_one_host() {
            return self.group_across_hosts(&group.ops, &group.refs, stream);
        }
        let lane = self.lane(stream)?;
        self.after_previous_group(&lane, stream)?;
        let threads = tune::base_threads(self.geometry_kind());
        let kernel = self.builtin_kernel(
            &self.coll.p2p_kernel,
            "symcomm_sendrecv",
            threads,
            SYMCOMM_P2P_MAX_OPS * SYMCOMM_P2P_CHANNELS,
        )?;
        if group.ops.len() as u32 > kernel.max_ctas {
            return Err(Error::InvalidArgument(format!(
                "a send/recv group of {} operations runs at least one CTA per operation, and \
                 every CTA must be resident with its peer's: this rank's share of its GPU is {} \
                 CTAs of {threads} threads ({} ranks of this communicator share the GPU); split \
                 the group",
                group.ops.len(),
                kernel.max_ctas,
                self.gpu_ranks
            )));
        }
        let stage = lane.stage_handle(&lane.stage_in, self.rank);
        let channels = tune::p2p_channels(self.geometry_kind());
        let Some(layout) = StageLayout::new(stage.bytes, self.nranks, channels) else {
            return Err(Error::InvalidArgument(format!(
                "send/recv: a staging window of {} bytes (SYMCOMM_STAGING_BYTES) leaves less than \
                 32 bytes per pair of {} ranks",
                stage.bytes, self.nranks
            )));
        };
        let ctas = layout.share_ctas(&group.ops, kernel.max_ctas);
        let mut args = P2pArgs {
            stage,
            nops: group.ops.len() as u32,
            channels: layout.channels,
            ops: [P2pOp::default(); SYMCOMM_P2P_MAX_OPS as usize],
        };
        for (slot, (op, ctas)) in args.ops.iter_mut().zip(group.ops.iter().zip(&ctas)) {
            *slot = P2pOp { ctas: *ctas, ..*op };
        }
        let grid: u32 = ctas.iter().sum();
        let kargs = KernelArgs::new().arg(&self.device_handle()?).arg(&args);
        let retain = || self.retained(&lane, &group.refs);
        // SAFETY: `symcomm_sendrecv(DevComm, P2pArgs)` by value; the staging window lives as
        // long as the lane; the drops of windows and buffers wait for the call, a graph that
        // records it keeps them alive (`retain`), and raw buffers stay valid until the stream
        // has run it (the BufferRef contract).
        let issued = unsafe {
            stream.launch_retaining(
                &kernel.kernel,
                LaunchConfig::linear(grid, kernel.threads),
                &kargs,
                &retain,
            )
        };
        // A rank's send/recv kernel waits for the kernels of the peers it exchanges with: one
        // count per send and per receive (an exchange is both), as each peer counts them.
        let peers = group.ops.iter().flat_map(|op| {
            let exchange = op.kind == SYMCOMM_P2P_EXCHANGE;
            std::iter::once(op.peer).chain(exchange.then_some(op.recv_peer))
        });
        let issued = self.order_launch(lane.index, stream, peers, issued);
        self.track(&lane, stream, group.buffers.iter().copied());
        issued
    }

    /// Send/recv groups of a communicator run one at a time: every pair's send/recv signal
    /// words (`abi.h`) are shared by the lanes, so two groups between the same ranks on two
    /// streams at once would count on the same words. Before a group on `lane`, `stream` waits
    /// for the latest call of the lane of the previous group when that was another lane (the
    /// ranks issue their groups in the same order, so they agree on it). Groups recorded into a
    /// graph are not ordered this way (a capturing stream cannot wait for an event): do not
    /// replay them while send/recv runs on another stream.
    fn after_previous_group(&self, lane: &Arc<Lane>, stream: &Stream) -> Result<()> {
        if stream.is_capturing() {
            return Ok(());
        }
        let mut previous = self
            .coll
            .p2p_lane
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(other) = previous.as_ref().filter(|p| !Arc::ptr_eq(p, lane))
            && let Some(ev) = other.last_call()
        {
            stream.wait_event(&ev)?;
        }
        *previous = Some(Arc::clone(lane));
        Ok(())
    }
}

/// How the staging window is cut for send/recv: the device's `layout_of`
/// (device/kernels/sendrecv.cu) in Rust. Each (sender, receiver) pair has `region` bytes, cut
/// into `channels` channels (as many as asked for, while each keeps two 16-byte slots) of two
/// `piece`-byte slots; a message of `b` bytes is `ceil(b / piece)` pieces and uses
/// `min(channels, pieces)` channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StageLayout {
    channels: u32,
    piece: u64,
}

impl StageLayout {
    /// The layout of a staging window of `stage_bytes` bytes among `nranks` ranks with up to
    /// `channels` channels (1..=SYMCOMM_P2P_CHANNELS); `None` when a pair's region is under 32
    /// bytes (two 16-byte slots).
    fn new(stage_bytes: u64, nranks: u32, channels: u32) -> Option<StageLayout> {
        let region = (stage_bytes / u64::from(nranks)) & !15;
        let want = u64::from(channels.clamp(1, SYMCOMM_P2P_CHANNELS));
        let channels = (region / 32).clamp(1, want) as u32;
        let piece = (region / (2 * u64::from(channels))) & !15;
        (piece > 0).then_some(StageLayout { channels, piece })
    }

    /// Channels a message of `bytes` bytes uses (0 for an empty one).
    fn channels_of(&self, bytes: u64) -> u32 {
        bytes.div_ceil(self.piece).min(u64::from(self.channels)) as u32
    }

    /// CTAs per operation (`P2pOp::ctas`): one each, then one more at a time, round-robin, to
    /// every operation with channels left without a CTA, while the `budget` lasts. Pre:
    /// `ops.len() <= budget`.
    fn share_ctas(&self, ops: &[P2pOp], budget: u32) -> Vec<u32> {
        let want: Vec<u32> = ops
            .iter()
            .map(|o| self.channels_of(o.bytes).max(1))
            .collect();
        let mut ctas = vec![1u32; ops.len()];
        let mut left = budget.saturating_sub(ops.len() as u32);
        while left > 0 {
            let before = left;
            for (c, w) in ctas.iter_mut().zip(&want) {
                if left > 0 && *c < *w {
                    *c += 1;
                    left -= 1;
                }
            }
            if left == before {
                break;
            }
        }
        ctas
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn op(bytes: u64) -> P2pOp {
        P2pOp {
            bytes,
            ..P2pOp::default()
        }
    }

    #[test]
    fn the_staging_layout_matches_the_device_formula() {
        // 4 MiB among 4 ranks: 1 MiB regions, 8 channels of two 64 KiB slots.
        let l = StageLayout::new(4 << 20, 4, 8).unwrap();
        assert_eq!(
            l,
            StageLayout {
                channels: 8,
                piece: 64 << 10
            }
        );
        assert_eq!(
            [0, 1, 64 << 10, (64 << 10) + 1, 100 << 20].map(|b| l.channels_of(b)),
            [0, 1, 1, 2, 8]
        );
        // Small regions: fewer channels, 16-byte pieces; under 32 bytes none.
        assert_eq!(
            StageLayout::new(256, 4, 8),
            Some(StageLayout {
                channels: 2,
                piece: 16
            })
        );
        assert_eq!(
            StageLayout::new(100, 3, 8),
            Some(StageLayout {
                channels: 1,
                piece: 16
            })
        );
        assert_eq!(StageLayout::new(4096, 200, 8), None);
        // One channel (the emulator's): two slots of half the region; 0 and 9 as the device
        // reads them (1 and 8).
        assert_eq!(
            StageLayout::new(4 << 20, 4, 1),
            Some(StageLayout {
                channels: 1,
                piece: 512 << 10
            })
        );
        assert_eq!(
            StageLayout::new(4 << 20, 4, 0),
            StageLayout::new(4 << 20, 4, 1)
        );
        assert_eq!(
            StageLayout::new(4 << 20, 4, 9),
            StageLayout::new(4 << 20, 4, 8)
        );
    }

    #[test]
    fn ctas_are_shared_round_robin_within_the_budget() {
        let l = StageLayout::new(4 << 20, 4, 8).unwrap();
        let ops = [op(100 << 20), op(10), op(3 * (64 << 10))];
        assert_eq!(l.share_ctas(&ops, 3), [1, 1, 1]);
        assert_eq!(l.share_ctas(&ops, 6), [3, 1, 2]);
        assert_eq!(l.share_ctas(&ops, 64), [8, 1, 3]);
        assert_eq!(l.share_ctas(&[op(0)], 64), [1]);
    }
}

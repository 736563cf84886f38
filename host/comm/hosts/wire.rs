//! How the messages of a call cross hosts ([`Phases::exchange`]).
//!
//! Every message moves as **pieces** of [`Hosts::piece`] bytes (the last one shorter; an empty
//! message as one empty piece), sent and received in order under the message's tag (UCX matches
//! messages of one tag from one sender in the order they were sent). Every rank cuts them the
//! same way (the piece size follows the chunk size, which the ranks agreed on), so how a rank
//! moves its pieces is its own choice:
//!
//! - **direct** (the default where UCX can reach the memory: the emulator, whose device memory
//!   is host memory, and a GPU whose UCX moves CUDA memory — GPUDirect RDMA where the NIC and
//!   driver allow it, else UCX's own staging): UCX reads and writes the messages' memory in
//!   place, every piece posted at once;
//! - **staged** (a GPU whose UCX was built without CUDA; anywhere with
//!   [`CommOptions::hosts_staging`]): the pieces go through mapped host memory ([`Staging`]) in
//!   waves. Wave `w` holds piece `w` of every message that has one, in one half of the staging
//!   memory (halves alternate). Two waves are in flight at a time: wave `w + 1` is posted as
//!   soon as its half is ready, before wave `w` completed, so the network does not idle for a
//!   round trip between waves. Once wave `w` crossed, a stream of its own copies its arrived
//!   pieces to the device and another copies wave `w + 2`'s outgoing pieces into the half it
//!   left, while wave `w + 1` crosses. So the copies across PCIe overlap the network, the memory
//!   is bounded by two pieces per message and direction, and every rank's waves pair up with its
//!   peers' (wave `w` of a message is piece `w` on both sides).
//!
//! [`CommOptions::hosts_staging`]: crate::CommOptions::hosts_staging

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{CALLERS, Hosts, Msg, Phases, lock};
use crate::backend::{Backend, MappedHost};
use crate::stream::{Event, Stream};
use crate::ucx::{DeviceBytes, Op, Outbox};
use crate::{Error, Result};

/// Alignment of a message's slot in the staging memory.
const SLOT_ALIGN: u64 = 256;
/// Largest piece: staging memory is at most this per message, direction and half.
const MAX_PIECE: u64 = 4 << 20;

/// The piece size for chunks of `chunk_bytes` (agreed on by every rank): an eighth of a chunk,
/// so that a message of a chunk's size crosses in several waves (the staging copies overlap the
/// network only across waves), between [`SLOT_ALIGN`] and [`MAX_PIECE`] bytes. Not calibrated on
/// a GPU yet: each wave also costs a round trip (its sends complete when received).
pub(super) fn piece_bytes(chunk_bytes: u64) -> u64 {
    (chunk_bytes / 8 / SLOT_ALIGN * SLOT_ALIGN).clamp(SLOT_ALIGN, MAX_PIECE)
}

/// Whether a rank stages its messages between hosts ([`Staging`]) rather than handing UCX their
/// memory: when asked to (`asked`: [`CommOptions::hosts_staging`]), or when the memory is a
/// GPU's (not the `emulator`'s) and UCX cannot move CUDA memory (`ucx_moves_cuda`).
///
/// [`CommOptions::hosts_staging`]: crate::CommOptions::hosts_staging
pub(super) fn stages(emulator: bool, ucx_moves_cuda: bool, asked: bool) -> bool {
    asked || (!emulator && !ucx_moves_cuda)
}

/// The staging memory of one rank's calls across hosts and the streams that copy through it,
/// made at the first staged exchange and grown on demand.
pub(super) struct Staging {
    /// Device to host copies (outgoing pieces).
    up: Stream,
    /// Host to device copies (arrived pieces).
    down: Stream,
    /// Two halves (waves alternate) of outgoing and of arrived pieces.
    out: [Option<MappedHost>; 2],
    into: [Option<MappedHost>; 2],
}

/// Where each message's piece lies in a half of the staging memory (byte offsets), and the
/// bytes a half needs.
fn slots(msgs: &[Msg], piece: u64) -> (Vec<u64>, u64) {
    let mut at = 0u64;
    let offsets = msgs
        .iter()
        .map(|m| {
            let o = at;
            at += m.bytes.min(piece).next_multiple_of(SLOT_ALIGN);
            o
        })
        .collect();
    (offsets, at)
}

/// Bytes `w * piece ..` of `m` in wave `w`, if it has a piece there (an empty message has one
/// empty piece, in wave 0).
fn in_wave(m: &Msg, piece: u64, w: u64) -> Option<(u64, u64)> {
    let start = w * piece;
    (start < m.bytes || (w == 0 && m.bytes == 0)).then(|| (start, piece.min(m.bytes - start)))
}

/// Every piece of `m`: `(start, bytes)` in the message, in order (wave `w` holds the `w`-th).
fn pieces(m: &Msg, piece: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
    (0..).map_while(move |w| in_wave(m, piece, w))
}

/// `half` grown to at least `bytes` bytes of mapped host memory (its old memory is free: no
/// copy or exchange uses it between calls).
fn grow<'h>(
    half: &'h mut Option<MappedHost>,
    bytes: u64,
    backend: &Backend,
) -> Result<&'h MappedHost> {
    let need = usize::try_from(bytes.max(1))
        .map_err(|_| Error::InvalidArgument(format!("{bytes} bytes of staging memory")))?;
    if half.as_ref().is_none_or(|h| h.len() < need) {
        *half = None;
        *half = Some(MappedHost::new(backend, need)?);
    }
    half.as_ref()
        .ok_or_else(|| Error::InvalidArgument("staging memory missing".to_owned()))
}

impl Staging {
    fn new(backend: &Backend) -> Result<Staging> {
        Ok(Staging {
            up: Stream::new(backend)?,
            down: Stream::new(backend)?,
            out: [None, None],
            into: [None, None],
        })
    }
}

impl Hosts {
    /// Bytes per piece of a message between hosts.
    fn piece(&self) -> u64 {
        piece_bytes(self.chunk_bytes)
    }
}

/// The two halves of staging memory of one direction, grown for an exchange (waves alternate).
type Halves<'h> = [&'h MappedHost; 2];

/// The half of wave `w`.
fn half(h: Halves<'_>, w: u64) -> &MappedHost {
    h[(w % 2) as usize]
}

impl Phases<'_> {
    /// Waits for the stream (or for the chunk's first phase, when pipelined), then sends and
    /// receives `msgs` over UCX (see the module's docs), bounded by the communicator's
    /// operation timeout. When it returns, the received bytes are in place for the stream's
    /// later work.
    pub(super) fn exchange(&self, sends: &[Msg], recvs: &[Msg]) -> Result<()> {
        match self.ready.take() {
            Some(e) => e.synchronize()?,
            None => self.stream.synchronize()?,
        }
        if sends.is_empty() && recvs.is_empty() {
            return Ok(());
        }
        if self.hosts.staged {
            self.exchange_staged(sends, recvs)?;
        } else {
            self.exchange_direct(sends, recvs)?;
        }
        let sent: u64 = sends.iter().map(|m| m.bytes).sum();
        self.hosts.sent_bytes.fetch_add(sent, Ordering::Relaxed);
        Ok(())
    }

    /// One UCX exchange of `ops`, bounded by `deadline`.
    fn cross(&self, ops: &mut [Op<'_>], deadline: Instant) -> Result<()> {
        let mut check = || self.comm.check_error().err();
        self.hosts
            .ucx
            .exchange(ops, self.what, deadline, &mut check)
    }

    /// Every piece at once, in the messages' own memory: the emulator's (host memory), or a
    /// GPU's when UCX moves CUDA memory ([`stages`]), in the context current on this thread
    /// (the stream's, bound by the synchronize in `exchange`).
    fn exchange_direct(&self, sends: &[Msg], recvs: &[Msg]) -> Result<()> {
        let piece = self.hosts.piece();
        let deadline = Instant::now() + self.comm.op_timeout;
        let cuda = !self.comm.backend().is_emu();
        let mut ops: Vec<Op<'_>> = Vec::new();
        for (m, send) in sends
            .iter()
            .map(|m| (m, true))
            .chain(recvs.iter().map(|m| (m, false)))
        {
            for (start, n) in pieces(m, piece) {
                // SAFETY: the device's memory (the emulator's is host memory): scratch of this
                // call (the callers sized it for the message) or the caller's validated memory
                // ([`CALLERS`]: send/recv, which waits for the exchange before returning),
                // allocated until the call returns; no device work touches it: the stream was
                // synchronized above and the previous call's work had finished (other streams'
                // use of the caller's memory is the caller's contract, as for every
                // collective); a receive's range overlaps no other message's (the callers give
                // each message its own block of scratch memory, and send/recv takes the
                // caller's memory only where no other message's range overlaps it).
                let data =
                    unsafe { DeviceBytes::new(self.base(m) + m.offset + start, n as usize, cuda) };
                let (peer, tag) = (m.peer, m.tag);
                ops.push(if send {
                    Op::SendDevice { peer, tag, data }
                } else {
                    Op::RecvDevice { peer, tag, data }
                });
            }
        }
        self.cross(&mut ops, deadline)
    }

    /// The pieces in waves through mapped host memory (see the module's docs).
    fn exchange_staged(&self, sends: &[Msg], recvs: &[Msg]) -> Result<()> {
        let hosts = self.hosts;
        let backend = hosts.local.backend();
        let piece = hosts.piece();
        let deadline = Instant::now() + self.comm.op_timeout;
        let mut staging = lock(&hosts.staging);
        let st = match &mut *staging {
            Some(st) => st,
            none => none.insert(Staging::new(backend)?),
        };
        let (out_at, out_bytes) = slots(sends, piece);
        let (into_at, into_bytes) = slots(recvs, piece);
        let ([o0, o1], [i0, i1]) = (&mut st.out, &mut st.into);
        let out = [grow(o0, out_bytes, backend)?, grow(o1, out_bytes, backend)?];
        let into = [
            grow(i0, into_bytes, backend)?,
            grow(i1, into_bytes, backend)?,
        ];
        let (up, down) = (&st.up, &st.down);
        let crossed = self.waves(
            (up, down),
            (out, into),
            sends,
            recvs,
            (&out_at, &into_at),
            deadline,
        );
        // Also after a failure: no copy may still use the messages' memory once this returns
        // (its stream's next work, or the caller's, may reuse it).
        let up = up.synchronize();
        let down = down.synchronize();
        crossed.and(up).and(down)
    }

    /// The waves of [`Self::exchange_staged`], with its copy streams and staging memory (up:
    /// outgoing, down: arriving); `at` the messages' slots in a half.
    ///
    /// Two waves are in flight at a time: wave `w + 1` is posted as soon as its pieces are in
    /// their half (its up-copies done, and the arrived pieces of wave `w - 1`, which used the
    /// same half, copied down), before wave `w` is waited for; so the network does not idle for
    /// a round trip between waves. Once wave `w` crossed, its arrived pieces are queued for the
    /// device and wave `w + 2`'s outgoing ones into the half it leaves.
    fn waves(
        &self,
        (up_stream, down_stream): (&Stream, &Stream),
        (out, into): (Halves<'_>, Halves<'_>),
        sends: &[Msg],
        recvs: &[Msg],
        (out_at, into_at): (&[u64], &[u64]),
        deadline: Instant,
    ) -> Result<()> {
        let piece = self.hosts.piece();
        let ucx = &self.hosts.ucx;
        let waves = sends
            .iter()
            .chain(recvs)
            .map(|m| m.bytes.div_ceil(piece))
            .max()
            .unwrap_or(0)
            .max(1);
        // Queues wave `w`'s outgoing pieces into their half; the event follows them.
        let up = |w: u64| -> Result<Event> {
            let base = half(out, w).device_ptr();
            for (m, at) in sends.iter().zip(out_at) {
                if let Some((start, n)) = in_wave(m, piece, w).filter(|&(_, n)| n > 0) {
                    // SAFETY: the source lies in the message's memory (scratch of this call or
                    // the caller's validated buffer, as for every message); the destination is
                    // the message's slot in this half, sized by `slots`; nothing else uses that
                    // slot until the wave crossed (the half's previous wave crossed before this
                    // is queued).
                    unsafe {
                        up_stream.copy_raw(base + at, self.base(m) + m.offset + start, n)?;
                    }
                }
            }
            up_stream.record_event()
        };
        // Posts wave `w` (its half filled: waited for by the caller).
        let post = |w: u64| -> Result<crate::ucx::Flight<'_>> {
            let out_host = half(out, w).host_ptr();
            let into_host = half(into, w).host_ptr();
            let mut ops: Vec<Op<'_>> = Vec::with_capacity(sends.len() + recvs.len());
            for (m, &at) in sends.iter().zip(out_at) {
                if let Some((_, n)) = in_wave(m, piece, w) {
                    // SAFETY: the message's slot of this half (in bounds: `slots`), filled by
                    // the up-copies the caller waited for; no copy writes this half until the
                    // wave crossed.
                    let data = unsafe {
                        std::slice::from_raw_parts(out_host.add(at as usize), n as usize)
                    };
                    ops.push(Op::Send {
                        peer: m.peer,
                        tag: m.tag,
                        data,
                    });
                }
            }
            for (m, &at) in recvs.iter().zip(into_at) {
                if let Some((_, n)) = in_wave(m, piece, w) {
                    // SAFETY: the message's slot of this half: in bounds, no other op's slot,
                    // and no copy reads this half until the wave crossed (its previous wave's
                    // down-copies were waited for by the caller).
                    let data = unsafe {
                        std::slice::from_raw_parts_mut(into_host.add(at as usize), n as usize)
                    };
                    ops.push(Op::Recv {
                        peer: m.peer,
                        tag: m.tag,
                        data,
                    });
                }
            }
            // SAFETY: the halves are the rank's staging memory, alive until the communicator
            // goes; this function's flights are waited for or dropped (aborted) before it
            // returns, and no copy touches a half while its wave is in flight (above).
            unsafe { ucx.post(&mut ops, self.what) }
        };
        let mut check = || self.comm.check_error().err();
        // Per half: the last up-copies into it and down-copies out of it.
        let mut copied_up: [Option<Event>; 2] = [Some(up(0)?), None];
        let mut copied_down: [Option<Event>; 2] = [None, None];
        // Makes half `w % 2` ready for wave `w` and posts it. Its copies are waited for while
        // UCX progresses the wave in flight (over TCP the bytes move only as UCX is progressed).
        let mut idle = Outbox::default();
        let mut launch = |w: u64, up: &mut Option<Event>, down: &mut Option<Event>| {
            for e in [up.take(), down.take()].into_iter().flatten() {
                while !e.is_complete()? {
                    if Instant::now() >= deadline {
                        return Err(Error::HostTimeout {
                            rank: self.comm.rank,
                            what: format!("{}: staging copies", self.what),
                            timeout_ms: self.comm.op_timeout.as_millis() as u64,
                        });
                    }
                    if !ucx.progress(&mut idle, self.what)? {
                        std::thread::yield_now();
                    }
                }
            }
            post(w)
        };
        let mut flight = Some(launch(0, &mut copied_up[0], &mut copied_down[0])?);
        if waves > 1 {
            copied_up[1] = Some(up(1)?);
        }
        for w in 0..waves {
            let next = if w + 1 < waves {
                let j = ((w + 1) % 2) as usize;
                Some(launch(w + 1, &mut copied_up[j], &mut copied_down[j])?)
            } else {
                None
            };
            if let Some(f) = flight.take() {
                f.wait(self.what, deadline, &mut check)?;
            }
            flight = next;
            let i = (w % 2) as usize;
            let into_dev = half(into, w).device_ptr();
            for (m, at) in recvs.iter().zip(into_at) {
                if let Some((start, n)) = in_wave(m, piece, w).filter(|&(_, n)| n > 0) {
                    // SAFETY: as for the outgoing copies, the other way: the piece's place in
                    // the message's memory, from its slot of this half.
                    unsafe {
                        down_stream.copy_raw(self.base(m) + m.offset + start, into_dev + at, n)?;
                    }
                }
            }
            copied_down[i] = Some(down_stream.record_event()?);
            if w + 2 < waves {
                copied_up[i] = Some(up(w + 2)?);
            }
        }
        Ok(())
    }

    /// The address `m.offset` is relative to: its scratch buffer's, or 0 for the caller's memory.
    fn base(&self, m: &Msg) -> u64 {
        if m.buf == CALLERS {
            return 0;
        }
        let base = self.scratch_addr(m.buf);
        debug_assert!(base != 0);
        base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(bytes: u64) -> Msg {
        Msg {
            peer: 1,
            tag: 7,
            buf: 0,
            offset: 0,
            bytes,
        }
    }

    #[test]
    fn gpus_stage_only_when_ucx_cannot_move_their_memory_or_when_asked() {
        // (emulator, UCX moves CUDA memory, asked) -> stages
        let table = [
            ((true, false, false), false),
            ((true, true, false), false),
            ((true, false, true), true),
            ((false, false, false), true),
            ((false, true, false), false),
            ((false, true, true), true),
            ((false, false, true), true),
        ];
        for ((emulator, cuda, asked), want) in table {
            assert_eq!(
                stages(emulator, cuda, asked),
                want,
                "{emulator} {cuda} {asked}"
            );
        }
    }

    #[test]
    fn pieces_follow_the_chunk_and_stay_bounded() {
        assert_eq!(piece_bytes(4 << 20), 512 << 10);
        assert_eq!(piece_bytes(1), SLOT_ALIGN);
        assert_eq!(piece_bytes(70_000), 8_704);
        assert_eq!(piece_bytes(1 << 30), MAX_PIECE);
    }

    #[test]
    fn waves_cover_every_byte_once_and_empty_messages_once() {
        let piece = 1000;
        for bytes in [0u64, 1, 999, 1000, 1001, 5000, 5001] {
            let m = msg(bytes);
            let mut covered = 0;
            let mut pieces = 0;
            for w in 0..10 {
                if let Some((start, n)) = in_wave(&m, piece, w) {
                    assert_eq!(start, covered, "{bytes} bytes, wave {w}");
                    covered += n;
                    pieces += 1;
                }
            }
            assert_eq!(covered, bytes);
            assert_eq!(pieces, bytes.div_ceil(piece).max(1), "{bytes} bytes");
        }
    }

    #[test]
    fn slots_are_aligned_and_hold_a_piece_each() {
        let (at, total) = slots(&[msg(10), msg(0), msg(5000), msg(300)], 1000);
        assert_eq!(at, [0, 256, 256, 1280]);
        assert_eq!(total, 1792);
    }
}

//! Lanes: the barrier indices and staging windows that serve one stream at a time, how the
//! ranks bind a new stream to one, and the tracking of each lane's latest work.

use std::sync::{Arc, Mutex, Weak};

use symcomm_device::abi::{SYMCOMM_DTYPE_NONE, WindowHandleRaw};

use super::{LANE_BARRIERS, MAX_STREAMS};
use crate::comm::memory::FlatMapping;
use crate::comm::payload::{self, LaneProposal, Tag};
use crate::comm::{Communicator, peers_succeeded};
use crate::stream::{Buffer, Stream, StreamToken};
use crate::{Error, Result};

/// What binding a stream to a lane is called in errors.
const BINDING: &str = "binding a stream to a collective lane";

/// Streams in use by the collectives of every communicator of the process, with their users
/// (communicator group, rank, the `Stream` value): two ranks of one communicator must not share a
/// stream, since the kernel queued first would wait for its peer's, queued behind it. Entries of
/// dropped `Stream` values no longer count (their keys may be reused by new streams).
static STREAM_USERS: Mutex<Vec<StreamUser>> = Mutex::new(Vec::new());

struct StreamUser {
    stream: usize,
    group: u64,
    rank: u32,
    token: Weak<StreamToken>,
}

/// A `Stream` value's entry in [`STREAM_USERS`], removed when the claim drops.
struct StreamClaim {
    stream: usize,
    group: u64,
    rank: u32,
    token: Weak<StreamToken>,
}

impl StreamClaim {
    fn take(stream: &Stream, group: u64, rank: u32) -> Result<StreamClaim> {
        let key = stream.key();
        let mut users = STREAM_USERS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        users.retain(|u| u.token.strong_count() > 0);
        if let Some(other) = users
            .iter()
            .find(|u| u.stream == key && u.group == group && u.rank != rank)
        {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} passed a stream that rank {} of the same communicator already \
                 runs collectives on: a rank's kernel would wait for its peer's, queued behind it \
                 on the same stream; give every rank its own stream",
                other.rank
            )));
        }
        let token = Arc::downgrade(stream.token());
        users.push(StreamUser {
            stream: key,
            group,
            rank,
            token: Weak::clone(&token),
        });
        Ok(StreamClaim {
            stream: key,
            group,
            rank,
            token,
        })
    }
}

impl Drop for StreamClaim {
    fn drop(&mut self) {
        let mut users = STREAM_USERS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(i) = users.iter().position(|u| {
            (u.stream, u.group, u.rank) == (self.stream, self.group, self.rank)
                && Weak::ptr_eq(&u.token, &self.token)
        }) {
            users.swap_remove(i);
        }
    }
}

/// One lane: barrier indices and staging windows that serve one stream at a time. The ranks
/// bind their k-th new stream to the same lane (agreed at binding); a lane is free again once
/// the `Stream` values it served and the graphs that captured its collectives have dropped.
pub(super) struct Lane {
    pub(super) index: u32,
    pub(super) first_barrier: u32,
    pub(super) stage_in: FlatMapping,
    pub(super) stage_out: FlatMapping,
    pub(super) stage_bytes: u64,
    /// Recorded after the lane's latest call (outside captures): drops of windows and of the
    /// communicator wait for it, so they never unmap memory a queued call still uses, and the
    /// lane's next stream waits for it before its first call.
    last: Mutex<Option<Arc<crate::stream::Event>>>,
    binding: Mutex<Binding>,
}

/// Whom a lane serves.
#[derive(Default)]
struct Binding {
    /// The stream's [`Stream::key`].
    key: usize,
    /// The `Stream` values of that stream that issued collectives (several when they wrap one
    /// CUDA stream), each with its claim.
    streams: Vec<StreamClaim>,
    /// Kept alive by the graphs that captured the lane's collectives ([`Stream::keep_for_graph`]).
    graphs: Weak<GraphHold>,
    /// Captured into a graph symcomm cannot reach (a CUDA capture begun elsewhere): the lane is
    /// never freed.
    pinned: bool,
}

/// What a graph keeps of a lane it captured collectives on.
struct GraphHold;

impl Binding {
    fn streams_alive(&self) -> bool {
        self.streams.iter().any(|c| c.token.strong_count() > 0)
    }

    /// Whether the lane serves `stream`: a `Stream` value that used it, or another value of the
    /// same stream while one of those lives (which then joins).
    fn serves(&mut self, stream: &Stream, group: u64, rank: u32) -> Result<bool> {
        self.streams.retain(|c| c.token.strong_count() > 0);
        let token = Arc::downgrade(stream.token());
        if self.streams.iter().any(|c| Weak::ptr_eq(&c.token, &token)) {
            return Ok(true);
        }
        if self.streams.is_empty() || self.key != stream.key() {
            return Ok(false);
        }
        self.streams.push(StreamClaim::take(stream, group, rank)?);
        Ok(true)
    }

    /// Why the lane cannot take a new stream, or `None` when it can.
    fn in_use(&self) -> Option<&'static str> {
        if self.streams_alive() {
            Some("a stream that is alive")
        } else if self.pinned {
            Some("a graph captured outside symcomm (kept for good)")
        } else if self.graphs.strong_count() > 0 {
            Some("a graph that captured collectives on it")
        } else {
            None
        }
    }
}

impl Lane {
    /// Rank `rank`'s handle of one of the lane's staging windows: bytes, used as any type.
    pub(super) fn stage_handle(&self, m: &FlatMapping, rank: u32) -> WindowHandleRaw {
        m.handle(rank, self.stage_bytes, 1, SYMCOMM_DTYPE_NONE)
    }

    /// The event recorded after the lane's latest call (outside captures), if any.
    pub(super) fn last_call(&self) -> Option<Arc<crate::stream::Event>> {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn binding(&self) -> std::sync::MutexGuard<'_, Binding> {
        self.binding
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Called for a call recorded by a capture on `stream`: the capture's graph keeps the lane
    /// in use while it exists and until its last launch finished; a capture symcomm does not own
    /// pins the lane for good.
    fn keep_for_graph(&self, stream: &Stream) {
        let mut b = self.binding();
        let hold = b.graphs.upgrade().unwrap_or_else(|| {
            let h = Arc::new(GraphHold);
            b.graphs = Arc::downgrade(&h);
            h
        });
        if !stream.retain_for_graph(hold) {
            b.pinned = true;
        }
    }
}

impl Communicator {
    /// The lane of `stream`. A stream's first call binds it to a lane, collectively: every rank
    /// proposes the lowest free lane (one that serves no live stream and no graph) or a new one,
    /// and all fail unless they all propose the same, so that the ranks' k-th new streams share
    /// barrier epochs and peers. A reused lane's new stream first waits, in stream order, for the
    /// lane's last call; a new lane allocates its staging windows (collective).
    pub(super) fn lane(&self, stream: &Stream) -> Result<Arc<Lane>> {
        let mut lanes = self
            .coll
            .lanes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for lane in lanes.iter() {
            if lane.binding().serves(stream, self.group, self.rank)? {
                return Ok(Arc::clone(lane));
            }
        }
        // The checks are local: a refused rank joins the agreement with its error, so that its
        // peers fail too (PeerFailed) instead of waiting for it.
        let pick = self.pick_lane(stream, &lanes);
        let proposal = pick.as_ref().map(|(index, _, stage_bytes)| LaneProposal {
            index: *index,
            new: stage_bytes.is_some(),
        });
        let all = self.gather(
            Tag::Lane,
            BINDING,
            &payload::encode_lane_proposal(&proposal),
            payload::decode_lane_proposal,
        )?;
        let (index, claim, stage_bytes) = pick?;
        let all = peers_succeeded(BINDING, all)?;
        let lane_name =
            |l: LaneProposal| format!("{} lane {}", if l.new { "new" } else { "free" }, l.index);
        let mine = LaneProposal {
            index,
            new: stage_bytes.is_some(),
        };
        if let Some((r, &other)) = all.iter().enumerate().find(|&(_, l)| *l != mine) {
            return Err(Error::Mismatch {
                rank: self.rank,
                peer: r as u32,
                what: format!(
                    "rank {} binds a new stream to collective {}, rank {r} to {}: the ranks \
                     have different streams in use; use streams in the same order, and drop \
                     them at the same points, on every rank",
                    self.rank,
                    lane_name(mine),
                    lane_name(other)
                ),
            });
        }
        let lane = match stage_bytes {
            None => Arc::clone(&lanes[index as usize]),
            Some(stage_bytes) => {
                let stage_in = self.alloc_flat(Ok(stage_bytes), 1, "staging input")?;
                let stage_out = self.alloc_flat(Ok(stage_bytes), 1, "staging output")?;
                let lane = Arc::new(Lane {
                    index,
                    first_barrier: LANE_BARRIERS * index,
                    stage_in,
                    stage_out,
                    stage_bytes,
                    last: Mutex::new(None),
                    binding: Mutex::new(Binding::default()),
                });
                lanes.push(Arc::clone(&lane));
                lane
            }
        };
        *lane.binding() = Binding {
            key: stream.key(),
            streams: vec![claim],
            graphs: Weak::new(),
            pinned: false,
        };
        tracing::debug!(target: "symcomm::coll", "rank {}: a stream takes collective lane {}", self.rank, lane.index);
        Ok(lane)
    }

    /// This rank's choice of lane for a stream that has none: (lane index, the stream's claim,
    /// staging bytes when the lane is new). For a reused lane, `stream` already waits for its
    /// last call (harmless if the ranks then disagree).
    fn pick_lane(
        &self,
        stream: &Stream,
        lanes: &[Arc<Lane>],
    ) -> Result<(u32, StreamClaim, Option<u64>)> {
        if stream.is_capturing() {
            return Err(Error::InvalidArgument(
                "the first collective on a stream binds it to a lane (the ranks agree on it; a \
                 new lane's staging windows are a collective allocation), which a graph cannot \
                 capture: issue one collective on this stream before capturing"
                    .into(),
            ));
        }
        if legacy_stream_shared(stream.cuda_raw(), self.gpu_ranks_in_process) {
            return Err(Error::InvalidArgument(format!(
                "the legacy default stream: {} ranks of this process share this GPU, and their \
                 kernels on one stream would run one after the other while they wait for each \
                 other; create a stream per rank (comm.create_stream())",
                self.gpu_ranks_in_process
            )));
        }
        let free = lanes.iter().find(|l| l.binding().in_use().is_none());
        let (index, stage_bytes) = match free {
            Some(lane) => {
                let last = lane
                    .last
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(ev) = last.as_ref() {
                    stream.wait_event(ev)?;
                }
                (lane.index, None)
            }
            None if lanes.len() < MAX_STREAMS => (lanes.len() as u32, Some(self.staging_bytes()?)),
            None => {
                let uses: Vec<String> = lanes
                    .iter()
                    .filter_map(|l| Some(format!("lane {}: {}", l.index, l.binding().in_use()?)))
                    .collect();
                return Err(Error::InvalidArgument(format!(
                    "this communicator runs collectives on at most {MAX_STREAMS} streams at \
                     once, and its lanes are in use ({}): issue the call on one of those \
                     streams, or drop one of them (with the graphs that captured collectives on \
                     it) first, on every rank; its lane then serves the next new stream",
                    uses.join("; ")
                )));
            }
        };
        Ok((
            index,
            StreamClaim::take(stream, self.group, self.rank)?,
            stage_bytes,
        ))
    }

    /// Remembers the lane's latest work (see [`Lane::last`]).
    /// The same event marks the last use of the call's buffers (`buffers`, [`Buffer::used_by`]):
    /// one event per call.
    pub(super) fn track<'b>(
        &self,
        lane: &Lane,
        stream: &Stream,
        buffers: impl IntoIterator<Item = &'b Buffer>,
    ) {
        if stream.is_capturing() {
            lane.keep_for_graph(stream);
            return;
        }
        match stream.record_event() {
            Ok(ev) => {
                let ev = Arc::new(ev);
                for b in buffers {
                    b.used_by(&ev);
                }
                *lane
                    .last
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(ev);
            }
            Err(e) => {
                tracing::debug!(target: "symcomm::coll", "rank {}: recording a call's completion: {e}", self.rank)
            }
        }
    }

    /// Waits until every call issued through the collectives has finished (bounded: kernels
    /// wait at most the device timeout). Called before memory they may use is unmapped.
    pub(in crate::comm) fn quiesce(&self) {
        let lanes = self
            .coll
            .lanes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for lane in lanes.iter() {
            let last = lane
                .last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(ev) = last.as_ref() {
                if let Err(e) = ev.synchronize() {
                    tracing::warn!(target: "symcomm::coll", "rank {}: waiting for queued collectives: {e}", self.rank);
                }
            }
        }
    }
}

/// Whether a CUDA stream handle `raw` is the legacy default stream (0, or `CU_STREAM_LEGACY`) of
/// a context that `ranks` ranks of one communicator share on one GPU (ranks as threads of one
/// process): their kernels would queue behind each other on it while each waits for the others.
/// Ranks in separate processes each have their own legacy stream (PyTorch's blocking NCCL calls
/// pass it).
fn legacy_stream_shared(raw: Option<u64>, ranks: u32) -> bool {
    matches!(raw, Some(0 | 1)) && ranks > 1
}

#[cfg(test)]
mod tests {
    use super::legacy_stream_shared;

    #[test]
    fn the_legacy_stream_is_refused_only_when_ranks_share_the_process() {
        // Ranks as threads of one process on one GPU: refused (0 and CU_STREAM_LEGACY).
        assert!(legacy_stream_shared(Some(0), 4));
        assert!(legacy_stream_shared(Some(1), 2));
        // One rank of this process on the GPU (ranks as processes, torch's NCCL): its own.
        assert!(!legacy_stream_shared(Some(0), 1));
        // Other streams (per-thread default stream 2, created streams) and the emulator.
        assert!(!legacy_stream_shared(Some(2), 4));
        assert!(!legacy_stream_shared(Some(0x7f00_1234_0000), 4));
        assert!(!legacy_stream_shared(None, 4));
    }
}

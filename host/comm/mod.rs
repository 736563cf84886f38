//! The communicator: one per rank (its public contract is on [`Communicator`]).
//!
//! It owns the bootstrap links (kept alive as the control plane: heartbeats, peer-loss
//! detection, small host-side all-gathers), the backend (a GPU or the emulator), the
//! device-visible abort flag and error record, the signal area the device API uses, and the
//! connections to the other ranks of its host over which window memory handles travel.
//!
//! The parts: `options.rs` (where kernels run and the timing: [`Device`], [`CommOptions`]),
//! `init.rs` (joining: the rendezvous, the device checks, the local team's links), `alloc.rs`
//! (the collective allocation behind windows and the signal area), `record.rs` (the errors
//! kernels record, in words), `control.rs` (the control plane), `payload.rs` (its tags and
//! typed payloads), `fdpass.rs` (memory handles between the ranks of a host), `memory.rs` (the
//! flat window layout, the control block), `window.rs` ([`Window`]), `split.rs`
//! ([`Communicator::split`]) and `coll.rs` + `coll/` (the
//! host collectives). This file has the [`Communicator`] type, its accessors and the pieces they
//! share (the agreement of a step among the ranks, typed gathers).

mod alloc;
pub(crate) mod coll;
mod control;
mod fdpass;
mod hosts;
mod init;
mod launch_order;
mod memory;
mod options;
pub(crate) mod payload;
mod proxy;
mod record;
mod split;
mod window;

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use symcomm_device::abi::{
    DevComm, SYMCOMM_ABI_VERSION, SYMCOMM_COMM_SAME_GPU, SYMCOMM_LL_LINES, SYMCOMM_SIGNAL_WORDS,
};
use symcomm_device::image::DeviceImage;
use symcomm_device::layout::SignalLayout;

use crate::backend::Backend;
use crate::bootstrap::{LocalTeam, RankInfo};
use crate::stream::{Kernel, KernelArgs, LaunchConfig, Stream};
use crate::{Error, Result};

pub use coll::{BufferRef, DataType, P2pGroup, RedOp};
pub use options::{
    CommOptions, DEFAULT_DEVICE_TIMEOUT, DEFAULT_HEARTBEAT, DEFAULT_HOSTS_CHUNK_BYTES,
    DEFAULT_PEER_TIMEOUT, Device,
};
pub(crate) use record::error_from_record;
pub use window::{Window, WindowHandle};

use control::Control;
use fdpass::LocalLinks;
use memory::{ControlBlock, FlatMapping, RankSlots};
use payload::{Outcome, Tag};

/// One rank's communicator. It holds the bootstrap links (the control plane: heartbeats,
/// peer-loss detection), the backend (a GPU or the emulator), the device-visible abort flag and
/// error record, the signal area the device API uses, and its windows' memory.
///
/// ```no_run
/// use symcomm::{Communicator, Device, UniqueId};
/// # fn main() -> symcomm::Result<()> {
/// // Rank 0 creates the id and hands its string form to the others (or use `from_env`).
/// let id = UniqueId::new()?;
/// let comm = Communicator::init(&id, 0, 1, Device::Emu)?;
/// let window = comm.alloc_window::<f32>(1024)?;
/// window.write(0, &[1.0; 1024])?;
/// let dev_comm = comm.device_handle()?;       // kernel argument: DevComm
/// let win = window.device_handle();           // kernel argument: WindowHandle<float>
/// # let _ = (dev_comm, win);
/// # Ok(())
/// # }
/// ```
///
/// # Collective calls
/// `init`, `alloc_window` and `barrier` are collective: every rank calls them, in the same
/// order. Mismatched calls (different sizes, a different call) return [`Error::Mismatch`] on
/// every rank; a rank that never calls makes the others return [`Error::HostTimeout`] after the
/// init timeout. A bad argument on one rank makes every rank return an error (the bad rank its
/// own, the others [`Error::PeerFailed`]) and the communicator stays usable.
///
/// # Faults
/// When a rank dies (its control connection closes without a goodbye — `kill -9` included),
/// stops sending heartbeats for `SYMCOMM_PEER_TIMEOUT`, or aborts ([`Communicator::abort`],
/// which tells the peers so), every other rank raises its abort flag: kernels waiting in
/// symcomm primitives return, and [`Communicator::check_error`] and every later call report
/// [`Error::PeerLost`] (the reason says which of the three). After a fault, destroy the
/// communicator (drop it, its windows and the graphs that captured its collectives: it goes
/// with its last holder).
///
/// A rank that *destroys* its communicator says goodbye with the number of host collective
/// calls it made, and every rank learns of it. That is no fault for a rank that made as many
/// calls ([`Communicator::check_error`] stays `Ok`); its later calls that need the departed rank
/// — collectives, host barriers and window allocations, send/recv with it — fail at once with
/// [`Error::PeerLost`] ("destroyed its communicator after N collective calls"). A rank that made
/// more calls has work queued that the departed rank will never join: that is a fault, reported
/// at once as above instead of after the device timeout. (Graph replays and your own kernels are
/// not counted: a kernel of yours that waits on a departed rank ends at the device timeout.)
///
/// A host operation that times out ([`Error::HostTimeout`]: the ranks' call sequences
/// diverged) leaves the control plane unusable: from then on [`Communicator::check_error`] and
/// every host call return that timeout again.
///
/// # Host collectives
/// `all_reduce`, `broadcast`, `reduce`, `all_gather`, `reduce_scatter`, `scatter`, `all_to_all`
/// and send/recv ([`P2pGroup`]) are stream-ordered and asynchronous; they launch the device
/// library's built-in kernels (`symcomm_collective_<dtype>`).
///
/// Every call: validates its arguments (typed errors, nothing launched; the next valid call
/// works), picks an algorithm ([`crate::tune`]: the alpha-beta model, or `SYMCOMM_ALGO`), and
/// enqueues work on the caller's stream:
/// - both buffers symmetric windows of this communicator: one kernel launch, zero copies;
/// - otherwise (ordinary device memory, [`Buffer`](crate::Buffer), cudarc slices): the data goes through the
///   communicator's staging windows in chunks (copy in, collective, copy out, all on the
///   stream), so any size works with bounded extra memory.
///
/// Every rank must make the same calls in the same order with the same count, type, op, root and
/// kind of buffers (windows or not); differences surface as [`Error::Mismatch`] from the device
/// (call fingerprints) on every rank. Nothing host-side is baked into launches that a CUDA-graph
/// replay would make stale (barrier epochs live in device memory).
///
/// # Streams and lanes
/// A communicator serves collectives on up to [`MAX_STREAMS`](crate::MAX_STREAMS) streams at
/// once, and on as many streams as you like over its life. A stream's first collective (or send/recv) binds
/// it to a *lane* — its own barrier indices and staging windows — collectively: every rank takes
/// the lowest free lane for it, and the ranks check that they agree (one host round trip), so
/// use streams in the same order, and drop them at the same points, on every rank; ranks that
/// disagree all get an error ([`Error::Mismatch`]) and nothing runs. A lane is free again once
/// every `Stream` value of its stream has dropped and so has every [`Graph`](crate::Graph)
/// that captured collectives on it (a graph keeps its lane, and its drop waits for its last launch; a capture
/// begun outside symcomm keeps the lane for good). The next stream on a lane waits, in stream
/// order, for the lane's last call before its first. A collective on one more stream than
/// [`MAX_STREAMS`](crate::MAX_STREAMS) in use at once is [`Error::InvalidArgument`] (nothing runs, the communicator
/// goes on): drop one of the streams in use first. Bind a stream once and keep it (wrap a CUDA
/// stream once, not per call): each new binding is a host round trip among the ranks.
///
/// Ranks as threads of one process on one GPU share its hardware queues
/// (`CUDA_DEVICE_MAX_CONNECTIONS`, 8 unless set): streams beyond that share a queue, in which
/// work a rank queued early could wait for a peer's kernel queued behind it. So there, a
/// collective call (and a co-resident [`Self::launch`]) returns only once every such peer has
/// queued its own kernel of the same call: the ranks' threads move in step, one call apart at
/// most, and any number of streams, even one hardware queue, is safe. A rank whose peer does
/// not make the call in time gets [`Error::HostTimeout`]. Work captured into a graph is queued
/// when the graph is launched, and those launches are not ordered: with several ranks of a
/// process on one GPU, keep `CUDA_DEVICE_MAX_CONNECTIONS` at or above their streams (ranks x
/// [`MAX_STREAMS`](crate::MAX_STREAMS)) when replaying graphs.
///
/// # Barrier indices
/// Host collectives use barrier indices `[0, HOST_BARRIER_END)`
/// ([`LANE_BARRIERS`](crate::LANE_BARRIERS) per lane); barrier indices
/// [`USER_BARRIER_FIRST`](crate::USER_BARRIER_FIRST)`..`[`USER_BARRIER_END`](crate::USER_BARRIER_END) are never used by them: user
/// kernels may run on those concurrently. The ranges are defined once, in `abi.h`
/// ([`crate::abi`]); the constants here are the same values.
///
/// # Ownership
/// Shared ownership, as cudarc's contexts: [`Self::init`] returns an [`Arc`], and every
/// [`Window`] (and every [`Graph`](crate::Graph) that captured collectives) holds one too, so a
/// struct may keep a communicator and its windows side by side.
///
/// `Send + Sync`: host calls may come from any thread; collective calls are serialized
/// internally and must be made in the same order on every rank. The communicator is destroyed
/// when its last holder drops: that says goodbye to the other ranks (who do not treat that as a
/// fault) and frees everything it holds. Until then — while a window or a graph of it lives on
/// after the caller dropped its handle — it stays a member of the communicator as before
/// (heartbeats, the peers' collectives with it). Kernels of your own that use its handles must
/// have finished.
pub struct Communicator {
    rank: u32,
    nranks: u32,
    backend: Backend,
    table: Vec<RankInfo>,
    local: LocalTeam,
    options: CommOptions,
    op_timeout: Duration,
    /// Ranks of this communicator on this rank's GPU, itself included (by GPU UUID; on the
    /// emulator every rank of the host shares emulated GPU 0): the co-residency budget of each
    /// GPU is divided among them.
    gpu_ranks: u32,
    /// Of those, the ranks in this rank's process (itself included): they share one CUDA
    /// context, and with it the legacy default stream; when they are every rank, the device
    /// library synchronizes at `.gpu` scope (`SYMCOMM_COMM_SAME_GPU`).
    gpu_ranks_in_process: u32,
    /// With other ranks in this process on this GPU (one CUDA context): the order in which
    /// they queue kernels that wait for one another (`launch_order.rs`).
    order: Option<launch_order::LaunchOrder>,
    /// The same on every rank of this communicator and different for another one (a hash of
    /// its UniqueId): tells this communicator's ranks apart from other communicators' in the
    /// process-wide stream registry of the collectives.
    group: u64,
    coll: coll::CollState,
    signals: Option<FlatMapping>,
    /// Where each rank's copy of the signal area and of windows lies (only this host's ranks'
    /// are mapped).
    slots: RankSlots,
    links: Option<LocalLinks>,
    exchange_seq: Mutex<u64>,
    /// What communicators split from this one inherit.
    lineage: split::Lineage,
    /// symcomm's own kernels, loaded at init and held for the communicator's life (see
    /// [`Kernel`](crate::Kernel): no collective loads code while peers wait).
    _builtins: Vec<crate::stream::Kernel>,
    /// Across hosts: this host's communicator and the UCX endpoints, set up by init
    /// (`hosts.rs`), or why they could not be.
    hosts: std::sync::OnceLock<std::result::Result<Arc<hosts::Hosts>, String>>,
    control: Control,
    block: Arc<ControlBlock>,
    /// This communicator's own `Arc` (every communicator lives in one): what windows and
    /// graphs hold.
    me: Weak<Communicator>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("backend", &self.backend.name())
            .field("local_team", &self.local.ranks())
            .finish_non_exhaustive()
    }
}

impl Communicator {
    /// This communicator's `Arc` (what windows and graphs hold).
    fn shared(&self) -> Result<Arc<Communicator>> {
        self.me
            .upgrade()
            .ok_or_else(|| Error::InvalidArgument("the communicator is being destroyed".to_owned()))
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> u32 {
        self.nranks
    }

    /// The backend this rank's kernels run on.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The ranks on this rank's host.
    pub fn local_team(&self) -> &LocalTeam {
        &self.local
    }

    /// Every rank's host identity, address and pid, indexed by rank.
    pub fn table(&self) -> &[RankInfo] {
        &self.table
    }

    /// The options this communicator runs with.
    pub fn options(&self) -> &CommOptions {
        &self.options
    }

    /// Whether every rank is on this host (windows and device handles need that until an
    /// inter-node transport exists).
    pub fn spans_one_host(&self) -> bool {
        self.local.size() == self.nranks
    }

    /// The device handle of this communicator, for kernels (`symcomm::DevComm` in C++): rank,
    /// signal area, abort flag, error record, wait deadline.
    ///
    /// Across hosts, kernels signal ranks of this host with stores and ranks of other hosts
    /// through this rank's proxy (a host thread that carries each signal or `put_with_signal`
    /// over UCX, where the peer's proxy applies it): the same calls, at network cost (tens of
    /// microseconds instead of about one). Loads and stores reach only this host's ranks: `put`,
    /// `get` and the device library's collectives refuse other hosts' ranks
    /// (`SYMCOMM_REFUSED_REMOTE`); host collectives work across hosts.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the signal area is missing (init failed to map it).
    pub fn device_handle(&self) -> Result<DevComm> {
        let signals = self
            .signals
            .as_ref()
            .ok_or_else(|| Error::Unsupported("the signal area is not mapped".to_owned()))?;
        let proxy = match self.hosts.get() {
            Some(Ok(h)) => h.proxy_addr(),
            _ => 0,
        };
        Ok(DevComm {
            abi_version: SYMCOMM_ABI_VERSION,
            rank: self.rank,
            nranks: self.nranks,
            signal_words: SYMCOMM_SIGNAL_WORDS,
            signal_base: signals.base(),
            signal_stride: signals.stride(),
            abort_flag: self.block.abort_flag_addr(),
            error: self.block.error_addr(),
            timeout_ns: u64::try_from(self.options.device_timeout.as_nanos()).unwrap_or(u64::MAX),
            ll_offset: SignalLayout::new(self.nranks).ll_offset,
            ll_lines: SYMCOMM_LL_LINES,
            // `.gpu` scope covers the threads of one program on one GPU (PTX ISA, "Scope"): ranks
            // in other processes are outside it even on the same GPU, so they get `.sys`.
            flags: if self.gpu_ranks_in_process == self.nranks {
                SYMCOMM_COMM_SAME_GPU
            } else {
                0
            },
            ranks: self.slots.table_addr(),
            proxy,
        })
    }

    /// A new stream on this communicator's backend (a CUDA stream of its GPU, or an emulator
    /// queue) for launching kernels that use its handles. Not collective.
    ///
    /// # Errors
    /// [`Error::Cuda`].
    pub fn create_stream(&self) -> Result<Stream> {
        Stream::new(&self.backend)
    }

    /// Loads kernel `name` of `image` (the `DEVICE_IMAGE` that the build helper generated for
    /// your crate, or symcomm's own [`crate::DEVICE_IMAGE`]) for this communicator's backend:
    /// the fatbin (or NVRTC from the embedded source) on CUDA, the emulator entry point on the
    /// emulator. Not collective.
    ///
    /// # Errors
    /// [`Error::UnknownKernel`]; [`Error::Cuda`] / [`Error::Nvrtc`] when loading fails.
    pub fn load_kernel(&self, image: &'static DeviceImage, name: &str) -> Result<Kernel> {
        Kernel::load(&self.backend, image, name)
    }

    /// Ranks of this communicator on this rank's GPU, itself included (the emulator counts the
    /// host's ranks, which share emulated GPU 0). Each GPU's co-residency budget is divided
    /// among them.
    pub fn gpu_ranks(&self) -> u32 {
        self.gpu_ranks
    }

    /// CTAs of `kernel` (`threads` threads, `shared_bytes` of dynamic shared memory) that one
    /// co-resident launch of this rank may use: the CTAs its GPU holds at once
    /// ([`Kernel::resident_ctas`]) divided among the [`Self::gpu_ranks`] ranks on it and
    /// [`MAX_STREAMS`](crate::MAX_STREAMS) lanes each. The built-in collectives cap every
    /// launch to it; [`Self::launch`] refuses co-resident launches beyond it. The guarantee holds
    /// while each rank keeps at most that many co-resident kernels (its collective lanes and its
    /// own) in flight at once, and nothing else fills the GPU.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when not even one CTA per lane fits (too many ranks on one GPU for
    /// this kernel's size); as [`Kernel::occupancy`].
    pub fn co_resident_share(
        &self,
        kernel: &Kernel,
        threads: u32,
        shared_bytes: u32,
    ) -> Result<u32> {
        let resident = kernel.resident_ctas(threads, shared_bytes)?;
        let lanes = coll::MAX_STREAMS as u32;
        let share = crate::residency::share(resident, self.gpu_ranks, lanes);
        if share == 0 {
            return Err(Error::Unsupported(format!(
                "kernel {} with CTAs of {threads} threads: the GPU holds {resident} at once, \
                 fewer than the {} ranks sharing it x {lanes} lanes; use fewer ranks per GPU \
                 (or smaller CTAs)",
                kernel.name(),
                self.gpu_ranks
            )));
        }
        Ok(share)
    }

    /// Launches `kernel` on `stream` as [`Stream::launch`] does, and for a co-resident launch
    /// ([`LaunchConfig::co_resident`], what grid-scope code whose CTAs wait for one another or
    /// for peers' CTAs needs) first checks the grid against this rank's share of its GPU
    /// ([`Self::co_resident_share`]): a grid beyond it could leave CTAs that never become
    /// resident while their peers wait for them, so it is refused with the budget named.
    ///
    /// A co-resident launch is collective among the ranks of this communicator that share this
    /// rank's CUDA context (ranks as threads of one process on one GPU): each of them makes the
    /// same co-resident launches in the same order, and each returns once all of them queued
    /// theirs — so that no rank queues later work ahead of a peer's kernel in a hardware queue,
    /// where it would wait for a kernel waiting for it (see
    /// [streams and lanes](Self#streams-and-lanes)). Elsewhere it returns once queued.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a co-resident grid beyond the share, a stream of another
    /// backend; as [`Stream::launch`] and [`Self::co_resident_share`]; for a co-resident launch
    /// with peers in this context, [`Error::HostTimeout`] when one of them has not made its
    /// launch within the operation timeout, or the communicator's fault.
    ///
    /// # Safety
    /// As [`Stream::launch`].
    pub unsafe fn launch(
        &self,
        stream: &Stream,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &KernelArgs,
    ) -> Result<()> {
        self.check_backend(stream, &format!("launch of {}", kernel.name()))?;
        if config.co_resident {
            let share = self.co_resident_share(kernel, config.threads(), config.shared_bytes)?;
            let whose = format!(
                "this rank's share of its GPU ({} ranks of the communicator on it, {} lanes each) is",
                self.gpu_ranks,
                coll::MAX_STREAMS
            );
            crate::stream::check_co_resident(kernel, &config, share, &whose)?;
        }
        // SAFETY: forwarded from this function's contract.
        let issued = unsafe { stream.launch(kernel, config, args) };
        if config.co_resident {
            self.order_launch(launch_order::USER_LANE, stream, 0..self.nranks, issued)
        } else {
            issued
        }
    }

    /// A host-side barrier over the control plane (not stream-ordered). Collective.
    ///
    /// # Errors
    /// [`Error::PeerLost`], [`Error::HostTimeout`], [`Error::Mismatch`] (another rank made a
    /// different collective call).
    pub fn barrier(&self) -> Result<()> {
        self.control.barrier(Tag::Barrier, "barrier")
    }

    /// Aborts this communicator from any thread, returning at once: raises the abort flag (this
    /// rank's kernels waiting in symcomm primitives return `Aborted`), tells the other ranks and
    /// closes the control links, so every other rank reports this rank lost ([`Error::PeerLost`]:
    /// "it aborted its communicator") and aborts too.
    /// Later calls return [`Error::Aborted`]. Drop the communicator afterwards.
    pub fn abort(&self) {
        tracing::warn!(target: "symcomm::init", "rank {}: communicator aborted", self.rank);
        self.block.raise_abort();
        self.control.abort();
    }

    /// Reports an asynchronous error: a lost rank ([`Error::PeerLost`]), an error a kernel
    /// recorded ([`Error::Timeout`], [`Error::Aborted`], [`Error::Mismatch`],
    /// [`Error::InvalidArgument`] with rank, peer and operation), a local [`Self::abort`], an
    /// earlier [`Error::HostTimeout`] (see [Faults](Self#faults)), or the failure of a call
    /// across hosts (which runs after the call returned: its stream goes on, and this reports
    /// it). Errors are sticky: once one is reported, the communicator should be destroyed. Cheap;
    /// never blocks. Kernels record their error before they finish, so call it after
    /// synchronizing the stream for a complete answer.
    ///
    /// # Errors
    /// As described.
    pub fn check_error(&self) -> Result<()> {
        if let Some(e) = self.control.fault() {
            return Err(e);
        }
        if let Some(rec) = self.block.error() {
            return Err(error_from_record(&rec));
        }
        if let Some(e) = self.hosts_fault() {
            return Err(e);
        }
        if self.block.abort_raised() {
            return Err(control::aborted_error(self.rank));
        }
        Ok(())
    }

    /// All ranks report the outcome of a step; every rank fails if any did (this rank with its
    /// own error, the others with [`Error::PeerFailed`]).
    fn agree<T>(&self, tag: Tag, what: &str, mine: Result<T>) -> Result<T> {
        let all = self.gather(
            tag,
            what,
            &payload::encode_status(&mine),
            payload::decode_status,
        );
        let value = mine?;
        peers_succeeded(what, all?)?;
        Ok(value)
    }

    /// A host-side all-gather of typed contributions: `mine` encoded, every rank's decoded with
    /// `decode` (in rank order). A contribution that does not decode fails the call with
    /// [`Error::PeerFailed`] naming its rank.
    fn gather<T>(
        &self,
        tag: Tag,
        what: &str,
        mine: &[u8],
        decode: fn(&[u8]) -> std::result::Result<T, crate::bootstrap::wire::FrameError>,
    ) -> Result<Vec<T>> {
        let all = self.control.all_gather(tag, what, mine)?;
        all.iter()
            .enumerate()
            .map(|(r, bytes)| {
                decode(bytes).map_err(|e| Error::PeerFailed {
                    rank: r as u32,
                    what: what.to_owned(),
                    message: format!("its contribution does not decode ({e})"),
                })
            })
            .collect()
    }
}

/// Every rank's value, or [`Error::PeerFailed`] for the first rank that failed `what` (with its
/// error's message).
fn peers_succeeded<T>(what: &str, all: Vec<Outcome<T>>) -> Result<Vec<T>> {
    all.into_iter()
        .enumerate()
        .map(|(r, outcome)| {
            outcome.map_err(|message| Error::PeerFailed {
                rank: r as u32,
                what: what.to_owned(),
                message,
            })
        })
        .collect()
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Collectives still queued use the signal area and the staging windows.
        self.quiesce();
    }
}

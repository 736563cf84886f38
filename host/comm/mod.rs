//! The communicator: one per rank (its public contract is on [`Communicator`]).
//!
//! It owns the bootstrap links (kept alive as the control plane: heartbeats, peer-loss
//! detection, small host-side all-gathers), the backend (a GPU or the emulator), the
//! device-visible abort flag and error record, the signal area the device API uses, and the
//! connections to the other ranks of its host over which window memory handles travel.

pub(crate) mod coll;
mod control;
mod fdpass;
mod memory;
mod window;

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use symcomm_device::abi::{DevComm, ErrorRecord, SYMCOMM_ABI_VERSION, SYMCOMM_SIGNAL_WORDS};
use symcomm_device::image::DeviceImage;

use crate::backend::{Backend, cuda};
use crate::bootstrap::{self, BootstrapConfig, LocalTeam, RankInfo, UniqueId};
use crate::config::raw_value;
use crate::stream::{Kernel, KernelArgs, LaunchConfig, Stream};
use crate::{Error, Result};

pub use coll::{BufferRef, DataType, P2pGroup, RedOp};
pub use window::{Window, WindowHandle};

use control::{Control, ControlTiming};
use fdpass::{Listener, LocalLinks};
use memory::{ControlBlock, FlatMapping, Segment};

/// Default deadline of every device-side wait (`SYMCOMM_TIMEOUT`).
pub const DEFAULT_DEVICE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default interval between control-plane heartbeats (`SYMCOMM_HEARTBEAT`).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
/// Default silence after which a rank is declared lost (`SYMCOMM_PEER_TIMEOUT`).
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(15);

// Tags of the host-side all-gathers (ranks must agree on them).
const TAG_INIT: u32 = 0x100;
const TAG_DEVICES: u32 = 0x103;
const TAG_P2P: u32 = 0x104;
const TAG_LINKS: u32 = 0x101;
const TAG_LINKS_DONE: u32 = 0x102;
const TAG_ALLOC: u32 = 0x200;
const TAG_SEGMENT: u32 = 0x201;
const TAG_MAPPED: u32 = 0x202;
const TAG_LANE: u32 = 0x203;
const TAG_BARRIER: u32 = 0x300;

/// Where a communicator's kernels run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Device {
    /// CUDA when a driver and at least one GPU are present (GPU `local rank % GPU count`),
    /// else the emulator.
    Auto,
    /// CUDA GPU `ordinal`. Several ranks may share one GPU.
    Cuda(usize),
    /// A CUDA GPU chosen by local rank (`local rank % GPU count`); an error without a GPU.
    CudaLocal,
    /// The CPU emulator.
    Emu,
}

impl Device {
    /// `SYMCOMM_DEVICE`: `auto` (default), `emu`, `cuda` (= auto among GPUs: local rank modulo
    /// the GPU count) or `cuda:<ordinal>`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another value.
    pub fn from_env() -> Result<Self> {
        match raw_value("SYMCOMM_DEVICE") {
            None => Ok(Device::Auto),
            Some(v) => Device::parse(&v),
        }
    }

    /// Parses `auto`, `emu`, `cuda` or `cuda:<ordinal>`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another value.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || {
            Error::InvalidArgument(format!(
                "SYMCOMM_DEVICE={text}: expected auto, emu, cuda or cuda:<ordinal>"
            ))
        };
        match text.trim() {
            "auto" => Ok(Device::Auto),
            "emu" => Ok(Device::Emu),
            "cuda" => Ok(Device::CudaLocal),
            t => t
                .strip_prefix("cuda:")
                .and_then(|o| o.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(bad),
        }
    }

    /// The backend for the rank with local index `local_rank`.
    fn open(self, local_rank: u32) -> Result<Backend> {
        let gpus = || -> Result<usize> { Ok(cuda::probe()?.devices.len()) };
        match self {
            Device::Emu => Ok(Backend::Emu),
            Device::CudaLocal => {
                let n = gpus()?;
                if n == 0 {
                    return Err(Error::InvalidArgument(
                        "SYMCOMM_DEVICE=cuda but no GPU".into(),
                    ));
                }
                Ok(Backend::Cuda(cuda::CudaDevice::open(
                    local_rank as usize % n,
                )?))
            }
            Device::Cuda(ordinal) => Ok(Backend::Cuda(cuda::CudaDevice::open(ordinal)?)),
            Device::Auto => match gpus() {
                Ok(n) if n > 0 => Ok(Backend::Cuda(cuda::CudaDevice::open(
                    local_rank as usize % n,
                )?)),
                _ => Ok(Backend::Emu),
            },
        }
    }
}

/// Timing of a communicator beyond the bootstrap's (whose init timeout also bounds host-side
/// collective calls).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CommOptions {
    /// Deadline of every device-side wait (`DevComm::timeout_ns`; `SYMCOMM_TIMEOUT`).
    pub device_timeout: Duration,
    /// Interval between heartbeats on the control links (`SYMCOMM_HEARTBEAT`).
    pub heartbeat: Duration,
    /// Silence after which a rank is lost (`SYMCOMM_PEER_TIMEOUT`). A rank whose process dies is
    /// detected at once (its connection closes); this bounds hangs and partitions.
    pub peer_timeout: Duration,
    /// On the emulator, launch the built-in kernels with the CUDA launch geometry (CTAs of 512
    /// threads, as many as the co-residency budget allows) instead of the emulator's small one,
    /// so the partitioning, barrier-index and vector paths of GPU-sized grids run on the CPU
    /// under the emulator's residency scheduler (`SYMCOMM_EMU_GEOMETRY=cuda`; slower). No effect
    /// on CUDA.
    pub emu_cuda_geometry: bool,
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            device_timeout: DEFAULT_DEVICE_TIMEOUT,
            heartbeat: DEFAULT_HEARTBEAT,
            peer_timeout: DEFAULT_PEER_TIMEOUT,
            emu_cuda_geometry: false,
        }
    }
}

impl CommOptions {
    /// Defaults overridden by `SYMCOMM_TIMEOUT`, `SYMCOMM_HEARTBEAT`, `SYMCOMM_PEER_TIMEOUT`
    /// (`30`, `2.5s`, `500ms`, `2m`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a value that does not parse, or a peer timeout not above
    /// the heartbeat interval.
    pub fn from_env() -> Result<Self> {
        let mut o = CommOptions::default();
        let get = |name: &str, into: &mut Duration| -> Result<()> {
            if let Some(v) = raw_value(name) {
                *into = bootstrap::parse_timeout(&v)
                    .map_err(|why| Error::InvalidArgument(format!("{name}={v}: {why}")))?;
            }
            Ok(())
        };
        get("SYMCOMM_TIMEOUT", &mut o.device_timeout)?;
        get("SYMCOMM_HEARTBEAT", &mut o.heartbeat)?;
        get("SYMCOMM_PEER_TIMEOUT", &mut o.peer_timeout)?;
        if let Some(v) = raw_value("SYMCOMM_EMU_GEOMETRY") {
            o.emu_cuda_geometry = match v.as_str() {
                "cuda" => true,
                "emu" => false,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "SYMCOMM_EMU_GEOMETRY={v}: expected `cuda` or `emu`"
                    )));
                }
            };
        }
        o.validate()?;
        Ok(o)
    }

    /// Sets the device-side wait deadline.
    pub fn with_device_timeout(mut self, t: Duration) -> Self {
        self.device_timeout = t;
        self
    }

    /// Sets [`CommOptions::emu_cuda_geometry`].
    #[must_use]
    pub fn with_emu_cuda_geometry(mut self, on: bool) -> Self {
        self.emu_cuda_geometry = on;
        self
    }

    /// Sets the heartbeat interval and the peer timeout.
    pub fn with_liveness(mut self, heartbeat: Duration, peer_timeout: Duration) -> Self {
        self.heartbeat = heartbeat;
        self.peer_timeout = peer_timeout;
        self
    }

    fn validate(&self) -> Result<()> {
        if self.heartbeat.is_zero() || self.peer_timeout <= self.heartbeat {
            return Err(Error::InvalidArgument(format!(
                "the peer timeout ({:?}) must exceed the heartbeat interval ({:?}), which must \
                 not be zero",
                self.peer_timeout, self.heartbeat
            )));
        }
        if self.device_timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "the device timeout must not be zero".into(),
            ));
        }
        Ok(())
    }
}

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
    /// The same on every rank of this communicator and different for another one (a hash of
    /// its UniqueId): tells this communicator's ranks apart from other communicators' in the
    /// process-wide stream registry of the collectives.
    group: u64,
    coll: coll::CollState,
    signals: Option<FlatMapping>,
    links: Option<LocalLinks>,
    exchange_seq: Mutex<u64>,
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

/// `[1]` for success, `[0, message...]` for a failure (message cut to fit a gather).
fn encode_status<T>(r: &Result<T>) -> Vec<u8> {
    match r {
        Ok(_) => vec![1],
        Err(e) => {
            let msg = e.to_string();
            let mut end = msg.len().min(900);
            while !msg.is_char_boundary(end) {
                end -= 1;
            }
            let mut v = vec![0];
            v.extend_from_slice(&msg.as_bytes()[..end]);
            v
        }
    }
}

impl Communicator {
    /// Joins communicator `id` as `rank` of `nranks` on `device`. Collective: every rank calls
    /// it concurrently (threads or processes). Settings not given here come from the
    /// environment: `SYMCOMM_INIT_TIMEOUT`, `SYMCOMM_HOST_ID`, `SYMCOMM_SOCKET_IFNAME`,
    /// `SYMCOMM_TIMEOUT`, `SYMCOMM_HEARTBEAT`, `SYMCOMM_PEER_TIMEOUT`.
    ///
    /// # Errors
    /// The bootstrap's ([`crate::bootstrap::init`]: [`Error::AuthFailed`],
    /// [`Error::InitTimeout`] naming the missing ranks, ...), [`Error::NoDriver`] /
    /// [`Error::Cuda`] for a CUDA device, [`Error::PeerFailed`] when another rank failed its
    /// part of init.
    pub fn init(id: &UniqueId, rank: u32, nranks: u32, device: Device) -> Result<Arc<Self>> {
        let mut config = BootstrapConfig::new(id.clone(), rank, nranks);
        config.apply_overrides(&|name: &str| raw_value(name))?;
        Self::init_with(&config, device, &CommOptions::from_env()?)
    }

    /// Joins the communicator the launcher describes: [`BootstrapConfig::from_env`] (torchrun,
    /// `symcomm launch`, Open MPI, MPICH, Slurm variables, `SYMCOMM_ID` / `SYMCOMM_SECRET`),
    /// [`Device::from_env`] (`SYMCOMM_DEVICE`) and [`CommOptions::from_env`].
    ///
    /// # Errors
    /// As [`Self::init`], and [`Error::InvalidArgument`] for missing or malformed variables.
    pub fn from_env() -> Result<Arc<Self>> {
        let config = BootstrapConfig::from_env()?;
        Self::init_with(&config, Device::from_env()?, &CommOptions::from_env()?)
    }

    /// Joins the communicator described by `config` on `device` with `options`.
    ///
    /// # Errors
    /// As [`Self::init`].
    pub fn init_with(
        config: &BootstrapConfig,
        device: Device,
        options: &CommOptions,
    ) -> Result<Arc<Self>> {
        options.validate()?;
        // Tunables read later by the collectives: a bad value is refused now, before the
        // rendezvous, not at the first collective.
        crate::tune::algo_from_env()?;
        coll::staging_bytes_from_env()?;
        let start = Instant::now();
        let boot = bootstrap::init_with(config)?;
        let rank = boot.rank();
        let nranks = boot.nranks();
        let table = boot.table().to_vec();
        let local = boot.local_team().clone();
        let timing = ControlTiming {
            heartbeat: options.heartbeat,
            peer_timeout: options.peer_timeout,
            op_timeout: config.timeout,
        };
        // The backend opens after the rendezvous (Auto needs the local rank); its result is
        // agreed on below, so a rank that cannot open its GPU fails every rank's init.
        let backend = device.open(local.index());
        let block = match &backend {
            Ok(b) => ControlBlock::new(b).map(Arc::new),
            Err(_) => ControlBlock::new(&Backend::Emu).map(Arc::new),
        }?;
        let on_fault = {
            let block = Arc::clone(&block);
            Box::new(move |_lost: u32| block.raise_abort())
        };
        let control = Control::start(rank, nranks, boot.into_link(), timing, on_fault)?;
        let backend_name = backend.as_ref().map(Backend::name).unwrap_or_default();
        let (backend, status) = match backend {
            Ok(b) => (b, Ok(())),
            Err(e) => (Backend::Emu, Err(e)),
        };
        let mut comm = Communicator {
            rank,
            nranks,
            backend,
            table,
            local,
            options: options.clone(),
            op_timeout: config.timeout,
            gpu_ranks: 1,
            group: {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                config.id.to_string().hash(&mut h);
                h.finish()
            },
            coll: coll::CollState::default(),
            signals: None,
            links: None,
            exchange_seq: Mutex::new(0),
            control,
            block,
            me: Weak::new(),
        };
        comm.agree(TAG_INIT, "opening the device", status)?;
        if comm.spans_one_host() {
            comm.check_devices()?;
            comm.connect_local_team()?;
            let bytes = u64::from(nranks) * u64::from(SYMCOMM_SIGNAL_WORDS) * 8;
            comm.signals = Some(comm.alloc_flat(Ok(bytes), 8, "signal area")?);
        }
        tracing::info!(
            target: "symcomm::init",
            "rank {rank}/{nranks}: communicator ready on {backend_name} in {:.1} ms (local team {:?})",
            start.elapsed().as_secs_f64() * 1e3,
            comm.local.ranks()
        );
        Ok(Arc::new_cyclic(|me| {
            comm.me = Weak::clone(me);
            comm
        }))
    }

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
    /// # Errors
    /// [`Error::Unsupported`] when the ranks span several hosts.
    pub fn device_handle(&self) -> Result<DevComm> {
        let signals = self
            .signals
            .as_ref()
            .ok_or_else(|| self.multi_host("device handles"))?;
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
        })
    }

    /// Allocates a symmetric window of `count` elements of `T` on every rank. Collective; every
    /// rank passes the same `count` (and `T`'s size). The memory is zeroed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `count` 0 or a size that overflows (on the bad rank; the
    /// others get [`Error::PeerFailed`]); [`Error::Mismatch`] on every rank when sizes differ;
    /// [`Error::Unsupported`] across hosts; backend errors (out of memory). After any of these
    /// the communicator stays usable.
    pub fn alloc_window<T: cuda::DevicePlain>(&self, count: usize) -> Result<Window<T>> {
        let elem = size_of::<T>() as u64;
        let bytes = (count as u64)
            .checked_mul(elem)
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "a window needs at least one element and fewer than 2^64 bytes (count {count} of {elem} bytes)"
                ))
            });
        let comm = self.shared()?;
        let mapping = self.alloc_flat(bytes, elem as u32, std::any::type_name::<T>())?;
        Ok(Window::new(comm, mapping, count))
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
    /// # Errors
    /// [`Error::InvalidArgument`] for a co-resident grid beyond the share, a stream of another
    /// backend; as [`Stream::launch`] and [`Self::co_resident_share`].
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
        if stream.is_emu() != matches!(self.backend, Backend::Emu) {
            return Err(Error::InvalidArgument(format!(
                "launch of {}: the stream belongs to another backend than this communicator ({})",
                kernel.name(),
                self.backend.name()
            )));
        }
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
        unsafe { stream.launch(kernel, config, args) }
    }

    /// A host-side barrier over the control plane (not stream-ordered). Collective.
    ///
    /// # Errors
    /// [`Error::PeerLost`], [`Error::HostTimeout`], [`Error::Mismatch`] (another rank made a
    /// different collective call).
    pub fn barrier(&self) -> Result<()> {
        self.control.barrier(TAG_BARRIER, "barrier")
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
    /// [`Error::InvalidArgument`] with rank, peer and operation), a local [`Self::abort`], or
    /// an earlier [`Error::HostTimeout`] (see [Faults](Self#faults)). Errors are sticky: once one is reported, the communicator should be destroyed. Cheap;
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
        if self.block.abort_raised() {
            return Err(control::aborted_error(self.rank));
        }
        Ok(())
    }

    fn multi_host(&self, what: &str) -> Error {
        Error::Unsupported(format!(
            "{what} need every rank on one host; rank {}'s host has ranks {:?} of {} (no \
             inter-node transport yet)",
            self.rank,
            self.local.ranks(),
            self.nranks
        ))
    }

    /// All ranks report the outcome of a step; every rank fails if any did (this rank with its
    /// own error, the others with [`Error::PeerFailed`]).
    fn agree<T>(&self, tag: u32, what: &str, mine: Result<T>) -> Result<T> {
        let all = self.control.all_gather(tag, what, &encode_status(&mine));
        let value = mine?;
        for (r, s) in all?.iter().enumerate() {
            if s.first() != Some(&1) {
                let msg = String::from_utf8_lossy(s.get(1..).unwrap_or_default());
                return Err(Error::PeerFailed {
                    rank: r as u32,
                    what: what.to_owned(),
                    message: msg.into_owned(),
                });
            }
        }
        Ok(value)
    }

    /// Every rank of the team uses the same kind of device, and on CUDA every GPU can reach
    /// every other rank's GPU (peer access); both checked on every rank, failing them all.
    fn check_devices(&mut self) -> Result<()> {
        let uuid = match &self.backend {
            Backend::Emu => None,
            Backend::Cuda(d) => Some(cuda::gpu_uuid(d.ordinal()).unwrap_or([0; 16])),
        };
        let mut mine = vec![u8::from(uuid.is_some())];
        mine.extend_from_slice(&uuid.unwrap_or([0; 16]));
        let all = self
            .control
            .all_gather(TAG_DEVICES, "comparing devices", &mine)?;
        // Ranks of the local team on the same device as this one (all the same kind here, or
        // the check below fails).
        let sharing: Vec<u32> = self
            .local
            .ranks()
            .iter()
            .copied()
            .filter(|&r| all.get(r as usize) == Some(&mine))
            .collect();
        self.gpu_ranks = sharing.len().max(1) as u32;
        if let Backend::Cuda(d) = &self.backend {
            self.warn_sharing(d.ordinal(), &sharing);
        }
        let kind = |d: &[u8]| {
            if d.first() == Some(&1) {
                "a CUDA GPU"
            } else {
                "the emulator"
            }
        };
        if let Some((peer, theirs)) = all
            .iter()
            .enumerate()
            .find(|(_, d)| d.first() != mine.first())
        {
            return Err(Error::Mismatch {
                rank: self.rank,
                peer: peer as u32,
                what: format!(
                    "rank {} runs on {}, rank {peer} on {}: every rank of a communicator needs the same kind of device",
                    self.rank,
                    kind(&mine),
                    kind(theirs)
                ),
            });
        }
        let reachable = match &self.backend {
            Backend::Emu => Ok(()),
            Backend::Cuda(d) => Self::peer_access(d.ordinal(), &mine[1..], &all),
        };
        self.agree(TAG_P2P, "checking peer access between the GPUs", reachable)
    }

    /// Warnings for ranks that share GPU `ordinal` (`sharing`, this rank included) where the
    /// hardware would serialize them: fewer hardware queues (`CUDA_DEVICE_MAX_CONNECTIONS`,
    /// default 8) than their streams, or ranks in other processes without MPS (contexts of
    /// different processes are time-sliced, never concurrent: each barrier costs a context
    /// switch, and a kernel waiting for a peer's runs out its time slice).
    fn warn_sharing(&self, ordinal: usize, sharing: &[u32]) {
        if sharing.len() < 2 {
            return;
        }
        let streams = sharing.len() * coll::MAX_STREAMS;
        let connections = std::env::var("CUDA_DEVICE_MAX_CONNECTIONS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(8);
        if connections < streams {
            tracing::warn!(
                target: "symcomm::init",
                "rank {}: {} ranks share GPU {ordinal} with up to {streams} collective streams, \
                 but CUDA_DEVICE_MAX_CONNECTIONS allows {connections} hardware queues: kernels \
                 of different ranks may be serialized and wait for each other until their \
                 timeout; set CUDA_DEVICE_MAX_CONNECTIONS={streams} or more",
                self.rank,
                sharing.len()
            );
        }
        let me = self.table.get(self.rank as usize).map(|r| r.pid);
        let other_processes = sharing
            .iter()
            .filter(|&&r| self.table.get(r as usize).map(|i| i.pid) != me)
            .count();
        if other_processes > 0 && !cuda::mps_enabled(ordinal).unwrap_or(false) {
            tracing::warn!(
                target: "symcomm::init",
                "rank {}: GPU {ordinal} is shared with {other_processes} rank(s) in other \
                 processes without MPS: their kernels are time-sliced, not concurrent, so every \
                 barrier waits for a context switch; start the MPS daemon \
                 (nvidia-cuda-mps-control -d) or run the ranks as threads of one process",
                self.rank
            );
        }
    }

    /// Whether GPU `ordinal` (uuid `mine`) can access the GPU of every rank in `all` that is
    /// visible to this process (ranks on GPUs it cannot see are left to the driver's checks).
    fn peer_access(ordinal: usize, mine: &[u8], all: &[Vec<u8>]) -> Result<()> {
        let info = cuda::probe()?;
        let uuids: Vec<Option<[u8; 16]>> = (0..info.devices.len())
            .map(|o| cuda::gpu_uuid(o).ok())
            .collect();
        for (r, desc) in all.iter().enumerate() {
            let theirs = desc.get(1..).unwrap_or_default();
            if theirs == mine || theirs.iter().all(|&b| b == 0) {
                continue;
            }
            let Some(o) = uuids
                .iter()
                .position(|u| u.as_ref().map(|u| &u[..]) == Some(theirs))
            else {
                continue;
            };
            let ok = info
                .peer_access
                .get(ordinal)
                .and_then(|row| row.get(o))
                .copied()
                .unwrap_or(false);
            if !ok {
                return Err(Error::Unsupported(format!(
                    "GPU {ordinal} cannot access GPU {o} of rank {r} (no peer-to-peer access): \
                     windows need NVLink or PCIe P2P between the GPUs of a host"
                )));
            }
        }
        Ok(())
    }

    /// Connects the local team's fd-passing sockets (leader listens, the others connect).
    fn connect_local_team(&mut self) -> Result<()> {
        let team = self.local.ranks().to_vec();
        if team.len() > fdpass::MAX_LOCAL {
            return Err(Error::Unsupported(format!(
                "{} ranks on one host (at most {})",
                team.len(),
                fdpass::MAX_LOCAL
            )));
        }
        if team.len() == 1 {
            self.links = Some(LocalLinks::Alone);
            return Ok(());
        }
        let leader = team[0];
        let listener = if self.rank == leader {
            Some(Listener::open(team.len()))
        } else {
            None
        };
        let name = match &listener {
            Some(Ok(l)) => l.name().to_vec(),
            _ => Vec::new(),
        };
        let mut payload = vec![u8::from(!matches!(listener, Some(Err(_))))];
        payload.extend_from_slice(&name);
        let all = self
            .control
            .all_gather(TAG_LINKS, "connecting the local team", &payload)?;
        let theirs = &all[leader as usize];
        if theirs.first() != Some(&1) {
            return Err(Error::PeerFailed {
                rank: leader,
                what: "opening the local socket".into(),
                message: "see that rank's error".into(),
            });
        }
        let deadline = Instant::now() + self.op_timeout;
        let links = match listener {
            Some(l) => LocalLinks::accept(l?, &team, &self.table, deadline),
            None => LocalLinks::connect(
                &theirs[1..],
                self.rank,
                &self.table[leader as usize],
                deadline,
            ),
        };
        self.links = Some(self.agree(TAG_LINKS_DONE, "connecting the local team", links)?);
        Ok(())
    }

    /// The collective allocation behind windows and the signal area: agree on the size, create
    /// this rank's copy, exchange handles within the host, map every copy. A rank whose request
    /// is already invalid (`bytes` is an error) still takes part in the agreement, so that every
    /// rank fails together instead of waiting.
    fn alloc_flat(&self, bytes: Result<u64>, elem: u32, label: &str) -> Result<FlatMapping> {
        // This rank's request: its size and allocation granularity, or why it cannot allocate.
        let request = bytes.and_then(|b| {
            if self.links.is_none() || !self.spans_one_host() {
                return Err(self.multi_host("windows"));
            }
            Ok((b, memory::granularity(&self.backend)?))
        });
        let (b, g) = request.as_ref().map_or((0, 0), |&r| r);
        let mut payload = vec![u8::from(request.is_ok())];
        payload.extend_from_slice(&b.to_be_bytes());
        payload.extend_from_slice(&elem.to_be_bytes());
        payload.extend_from_slice(&g.to_be_bytes());
        let all = self
            .control
            .all_gather(TAG_ALLOC, "alloc_window", &payload)?;
        let (bytes, mut granularity) = request?;
        let links = self
            .links
            .as_ref()
            .ok_or_else(|| self.multi_host("windows"))?;
        for (r, req) in all.iter().enumerate() {
            let Some((their_bytes, their_elem, their_gran)) = decode_alloc_request(req) else {
                return Err(Error::PeerFailed {
                    rank: r as u32,
                    what: "alloc_window".into(),
                    message: "invalid request on that rank".into(),
                });
            };
            if (their_bytes, their_elem) != (bytes, elem) {
                return Err(Error::Mismatch {
                    rank: self.rank,
                    peer: r as u32,
                    what: format!(
                        "alloc_window: rank {} asks for {bytes} bytes ({elem}-byte elements), rank {r} for {their_bytes} bytes ({their_elem}-byte elements)",
                        self.rank
                    ),
                });
            }
            granularity = granularity.max(their_gran.max(1));
        }
        let stride = bytes.div_ceil(granularity) * granularity;
        let segment = self.agree(
            TAG_SEGMENT,
            "allocating window memory",
            Segment::create(&self.backend, stride, label),
        )?;
        let seq = {
            let mut s = self
                .exchange_seq
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *s += 1;
            *s
        };
        let deadline = Instant::now() + self.op_timeout;
        let mapped = links.exchange(seq, segment.fd(), deadline).and_then(|fds| {
            if fds.len() != self.local.size() as usize {
                return Err(Error::InvalidArgument(format!(
                    "received {} memory handles for {} local ranks",
                    fds.len(),
                    self.local.size()
                )));
            }
            FlatMapping::map(&self.backend, stride, fds)
        });
        let mapping = self.agree(TAG_MAPPED, "mapping window memory", mapped)?;
        if let Backend::Cuda(_) = self.backend {
            // VMM memory is not zeroed by the driver.
            mapping.zero(self.rank)?;
            self.control.barrier(TAG_MAPPED, "zeroing window memory")?;
        }
        tracing::debug!(target: "symcomm::alloc", "rank {}: {label}: {bytes} bytes per rank, stride {stride}, base {:#x}", self.rank, mapping.base());
        Ok(mapping)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Collectives still queued use the signal area and the staging windows.
        self.quiesce();
    }
}

/// A rank's allocation request `[ok][bytes u64][elem u32][granularity u64]` (big-endian), or
/// `None` when the rank could not make one.
fn decode_alloc_request(req: &[u8]) -> Option<(u64, u32, u64)> {
    if req.first() != Some(&1) {
        return None;
    }
    let bytes = u64::from_be_bytes(req.get(1..9)?.try_into().ok()?);
    let elem = u32::from_be_bytes(req.get(9..13)?.try_into().ok()?);
    let gran = u64::from_be_bytes(req.get(13..21)?.try_into().ok()?);
    Some((bytes, elem, gran))
}

/// Name of a `SYMCOMM_OP_*` code.
fn op_name(op: u32) -> &'static str {
    match op {
        symcomm_device::abi::SYMCOMM_OP_SIGNAL_WAIT => "signal_wait",
        symcomm_device::abi::SYMCOMM_OP_BARRIER => "barrier",
        symcomm_device::abi::SYMCOMM_OP_COLLECTIVE => "collective",
        symcomm_device::abi::SYMCOMM_OP_SIGNAL => "signal",
        symcomm_device::abi::SYMCOMM_OP_USER => "user kernel",
        symcomm_device::abi::SYMCOMM_OP_GRID_SYNC => "grid_sync",
        symcomm_device::abi::SYMCOMM_OP_PUT => "put_with_signal",
        _ => "device operation",
    }
}

/// What a record's operation and detail word say, in words (the encodings are at each
/// recording site in include/symcomm: barrier.cuh, signal.cuh, grid.cuh, collectives.cuh), e.g.
/// "barrier index 130", "signal word 3 from peer 1", "user code 0x2a, value 7".
pub(crate) fn describe_record(rec: &ErrorRecord) -> String {
    use symcomm_device::abi as a;
    let (hi, lo) = ((rec.detail >> 32) as u32, rec.detail as u32);
    let invalid = rec.status == a::SYMCOMM_STATUS_INVALID_ARGUMENT;
    match rec.op {
        a::SYMCOMM_OP_BARRIER if invalid => format!(
            "barrier index {} (users' indices are [{}, {}))",
            rec.detail,
            a::SYMCOMM_USER_BARRIER_FIRST,
            a::SYMCOMM_USER_BARRIER_END
        ),
        a::SYMCOMM_OP_BARRIER if rec.status == a::SYMCOMM_STATUS_MISMATCH => format!(
            "barrier index {hi}: peer {} arrived with fingerprint {lo:#010x}, this rank with another",
            rec.peer
        ),
        a::SYMCOMM_OP_BARRIER => format!("barrier index {hi}"),
        a::SYMCOMM_OP_SIGNAL | a::SYMCOMM_OP_SIGNAL_WAIT if invalid => format!(
            "signal word {lo} {} peer {hi} (users' signal words are [0, {}), peers the team's ranks)",
            if rec.op == a::SYMCOMM_OP_SIGNAL {
                "to"
            } else {
                "from"
            },
            a::SYMCOMM_USER_SIGNAL_END
        ),
        a::SYMCOMM_OP_SIGNAL_WAIT => {
            format!("signal wait for peer {} (awaited {})", rec.peer, rec.detail)
        }
        a::SYMCOMM_OP_COLLECTIVE => format!("collective kind {}", rec.detail),
        a::SYMCOMM_OP_USER => format!("user code {hi:#x}, value {lo}"),
        a::SYMCOMM_OP_GRID_SYNC => format!("grid_sync generation {}", rec.detail),
        op => format!("operation {op}, detail {:#x}", rec.detail),
    }
}

/// Words for an InvalidArgument record's detail: what refused (the collective kind, or the
/// put's peer) and why (`SYMCOMM_REFUSED_*` in bits 32..39).
fn refusal(rec: &ErrorRecord, describe: &str) -> String {
    use symcomm_device::abi as a;
    let (op, detail) = (rec.op, rec.detail);
    let low = detail as u32;
    let what = match op {
        a::SYMCOMM_OP_COLLECTIVE => match low {
            a::SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT => "all_reduce (one-shot)".to_owned(),
            a::SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT => "all_reduce (two-shot)".to_owned(),
            a::SYMCOMM_COLL_ALL_GATHER => "all_gather".to_owned(),
            a::SYMCOMM_COLL_REDUCE_SCATTER => "reduce_scatter".to_owned(),
            a::SYMCOMM_COLL_BROADCAST => "broadcast".to_owned(),
            a::SYMCOMM_COLL_REDUCE => "reduce".to_owned(),
            a::SYMCOMM_COLL_SCATTER => "scatter".to_owned(),
            a::SYMCOMM_COLL_ALL_TO_ALL => "all_to_all".to_owned(),
            k => format!("collective kind {k}"),
        },
        a::SYMCOMM_OP_PUT => format!("put_with_signal to rank {low}"),
        _ => {
            return format!(
                "a device-side precondition of {} failed: {describe}",
                op_name(op)
            );
        }
    };
    let why = match (detail >> 32) as u32 & 0xff {
        a::SYMCOMM_REFUSED_CODE => {
            "a kind, dtype, reduction or scope code is invalid or not the kernel's"
        }
        a::SYMCOMM_REFUSED_ROOT => "the root is not a rank",
        a::SYMCOMM_REFUSED_OVERLAP => "the input and output overlap without being in place",
        a::SYMCOMM_REFUSED_CTA_SIZE => {
            "in-place all_to_all needs at least as many threads per CTA as ranks"
        }
        a::SYMCOMM_REFUSED_SRC_RANGE => "the input range does not fit in its window",
        a::SYMCOMM_REFUSED_DST_RANGE => "the output range does not fit in its window",
        a::SYMCOMM_REFUSED_ELEM_SIZE => "the element size is not the window's",
        a::SYMCOMM_REFUSED_DTYPE => "the element type is not the window's",
        a::SYMCOMM_REFUSED_PEER => "a peer is not a rank of the window",
        _ => "a device-side precondition failed",
    };
    format!("{what} refused its arguments on the device: {why} (detail {detail:#x})")
}

/// The error a kernel recorded.
pub(crate) fn error_from_record(rec: &ErrorRecord) -> Error {
    use symcomm_device::abi as a;
    let op = op_name(rec.op);
    let detail = describe_record(rec);
    match rec.status {
        a::SYMCOMM_STATUS_TIMEOUT => Error::Timeout {
            rank: rec.rank,
            peer: rec.peer,
            op,
            detail,
        },
        a::SYMCOMM_STATUS_ABORTED => Error::Aborted {
            rank: rec.rank,
            peer: rec.peer,
            op,
            detail,
        },
        a::SYMCOMM_STATUS_MISMATCH => Error::Mismatch {
            rank: rec.rank,
            peer: rec.peer,
            what: format!("{op}: the peer's call fingerprint differs ({detail})"),
        },
        a::SYMCOMM_STATUS_ABI_MISMATCH => Error::Unsupported(format!(
            "rank {}: a kernel was built against another symcomm ABI version (host has {SYMCOMM_ABI_VERSION})",
            rec.rank
        )),
        a::SYMCOMM_STATUS_INVALID_ARGUMENT => {
            Error::InvalidArgument(format!("rank {}: {}", rec.rank, refusal(rec, &detail)))
        }
        s => Error::InvalidArgument(format!(
            "rank {}: a device-side precondition of {op} failed (status {s}: {detail})",
            rec.rank
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn documented_defaults_match_the_constants() {
        let default = |name: &str| {
            let t = crate::config::TUNABLES
                .iter()
                .find(|t| t.name == name)
                .unwrap();
            bootstrap::parse_timeout(t.default).unwrap()
        };
        assert_eq!(default("SYMCOMM_TIMEOUT"), DEFAULT_DEVICE_TIMEOUT);
        assert_eq!(default("SYMCOMM_HEARTBEAT"), DEFAULT_HEARTBEAT);
        assert_eq!(default("SYMCOMM_PEER_TIMEOUT"), DEFAULT_PEER_TIMEOUT);
        assert_eq!(
            default("SYMCOMM_INIT_TIMEOUT"),
            bootstrap::DEFAULT_INIT_TIMEOUT
        );
    }

    #[test]
    fn device_records_become_typed_errors() {
        use symcomm_device::abi as a;
        let rec = |status| ErrorRecord {
            status,
            rank: 2,
            peer: 5,
            op: a::SYMCOMM_OP_BARRIER,
            detail: 9,
            time_ns: 1,
        };
        assert!(matches!(
            error_from_record(&rec(a::SYMCOMM_STATUS_TIMEOUT)),
            Error::Timeout {
                rank: 2,
                peer: 5,
                op: "barrier",
                ..
            }
        ));
        assert!(matches!(
            error_from_record(&rec(a::SYMCOMM_STATUS_ABORTED)),
            Error::Aborted {
                rank: 2,
                peer: 5,
                ..
            }
        ));
        assert!(matches!(
            error_from_record(&rec(a::SYMCOMM_STATUS_MISMATCH)),
            Error::Mismatch {
                rank: 2,
                peer: 5,
                ..
            }
        ));
        assert!(matches!(
            error_from_record(&rec(a::SYMCOMM_STATUS_ABI_MISMATCH)),
            Error::Unsupported(_)
        ));
        assert!(matches!(
            error_from_record(&rec(a::SYMCOMM_STATUS_INVALID_ARGUMENT)),
            Error::InvalidArgument(_)
        ));
        // A refused signal call (a signal word outside the users' range) names the operation.
        let refused = ErrorRecord {
            op: a::SYMCOMM_OP_SIGNAL,
            ..rec(a::SYMCOMM_STATUS_INVALID_ARGUMENT)
        };
        assert!(
            matches!(&error_from_record(&refused), Error::InvalidArgument(m) if m.contains("of signal")),
            "{}",
            error_from_record(&refused)
        );
    }

    #[test]
    fn device_records_are_decoded_into_words() {
        use symcomm_device::abi as a;
        let rec = |status, op, peer, detail| ErrorRecord {
            status,
            rank: 0,
            peer,
            op,
            detail,
            time_ns: 1,
        };
        let text = |r: ErrorRecord| error_from_record(&r).to_string();
        let cases = [
            (
                rec(
                    a::SYMCOMM_STATUS_TIMEOUT,
                    a::SYMCOMM_OP_BARRIER,
                    1,
                    130 << 32,
                ),
                "barrier index 130",
            ),
            (
                rec(
                    a::SYMCOMM_STATUS_ABORTED,
                    a::SYMCOMM_OP_BARRIER,
                    1,
                    131 << 32,
                ),
                "barrier index 131",
            ),
            (
                rec(
                    a::SYMCOMM_STATUS_MISMATCH,
                    a::SYMCOMM_OP_BARRIER,
                    1,
                    (130 << 32) | 0xdead_beef,
                ),
                "barrier index 130: peer 1 arrived with fingerprint 0xdeadbeef",
            ),
            (
                rec(
                    a::SYMCOMM_STATUS_INVALID_ARGUMENT,
                    a::SYMCOMM_OP_BARRIER,
                    0,
                    200,
                ),
                "barrier index 200 (users' indices are [128, 187))",
            ),
            (
                rec(
                    a::SYMCOMM_STATUS_INVALID_ARGUMENT,
                    a::SYMCOMM_OP_SIGNAL_WAIT,
                    0,
                    (1 << 32) | 70,
                ),
                "signal word 70 from peer 1",
            ),
            (
                rec(
                    a::SYMCOMM_STATUS_INVALID_ARGUMENT,
                    a::SYMCOMM_OP_SIGNAL,
                    0,
                    (2 << 32) | 3,
                ),
                "signal word 3 to peer 2",
            ),
            (
                rec(a::SYMCOMM_STATUS_TIMEOUT, a::SYMCOMM_OP_SIGNAL_WAIT, 1, 7),
                "signal wait for peer 1 (awaited 7)",
            ),
            (
                rec(
                    a::SYMCOMM_STATUS_MISMATCH,
                    a::SYMCOMM_OP_USER,
                    1,
                    (0x2a << 32) | 9,
                ),
                "user code 0x2a, value 9",
            ),
            (
                rec(a::SYMCOMM_STATUS_TIMEOUT, a::SYMCOMM_OP_GRID_SYNC, 0, 4),
                "grid_sync generation 4",
            ),
            (
                rec(
                    a::SYMCOMM_STATUS_INVALID_ARGUMENT,
                    a::SYMCOMM_OP_COLLECTIVE,
                    0,
                    3,
                ),
                "reduce_scatter refused its arguments",
            ),
        ];
        for (r, want) in cases {
            let got = text(r);
            assert!(got.contains(want), "{r:?}: {got:?} lacks {want:?}");
        }
        // The variant follows the status, for users' codes too.
        assert!(matches!(
            error_from_record(&rec(a::SYMCOMM_STATUS_MISMATCH, a::SYMCOMM_OP_USER, 1, 0)),
            Error::Mismatch { peer: 1, .. }
        ));
        assert!(matches!(
            error_from_record(&rec(
                a::SYMCOMM_STATUS_TIMEOUT,
                a::SYMCOMM_OP_GRID_SYNC,
                0,
                0
            )),
            Error::Timeout {
                op: "grid_sync",
                ..
            }
        ));
    }

    #[test]
    fn device_refusals_are_told_in_words() {
        use symcomm_device::abi as a;
        let msg = |op, detail| {
            let rec = ErrorRecord {
                status: a::SYMCOMM_STATUS_INVALID_ARGUMENT,
                rank: 1,
                peer: 1,
                op,
                detail,
                time_ns: 0,
            };
            error_from_record(&rec).to_string()
        };
        let m = msg(
            a::SYMCOMM_OP_COLLECTIVE,
            u64::from(a::SYMCOMM_REFUSED_DST_RANGE) << 32 | u64::from(a::SYMCOMM_COLL_ALL_GATHER),
        );
        assert!(
            m.contains("all_gather") && m.contains("output range does not fit"),
            "{m}"
        );
        let m = msg(
            a::SYMCOMM_OP_COLLECTIVE,
            u64::from(a::SYMCOMM_REFUSED_DTYPE) << 32 | u64::from(a::SYMCOMM_COLL_REDUCE),
        );
        assert!(m.contains("reduce") && m.contains("element type"), "{m}");
        let m = msg(
            a::SYMCOMM_OP_PUT,
            u64::from(a::SYMCOMM_REFUSED_PEER) << 32 | 7,
        );
        assert!(
            m.contains("put_with_signal to rank 7") && m.contains("not a rank"),
            "{m}"
        );
    }
}

//! Host collectives on a [`Communicator`]: the entry points and their launch (the contract users
//! see is on [`Communicator`]: "Host collectives", "Streams and lanes").
//!
//! The parts: `types.rs` (element types, reduction ops, buffer arguments), `lanes.rs` (binding
//! streams to lanes, tracking their last work), `staging.rs` (the staged path through the
//! lanes' staging windows), `validate.rs` (the host-side checks of a call) and `p2p.rs`
//! (send/recv and their groups).

use std::sync::{Arc, Mutex, OnceLock};

use symcomm_device::abi::{
    CollArgs, SYMCOMM_HOST_BARRIER_END, SYMCOMM_HOST_LANE_BARRIERS, SYMCOMM_SCOPE_GRID,
    SYMCOMM_USER_BARRIER_END, SYMCOMM_USER_BARRIER_FIRST,
};

use super::Communicator;
use crate::stream::{Buffer, Kernel, KernelArgs, LaunchConfig, RetainFn, Retained, Stream};
use crate::tune::{self, Algorithm, BackendKind, Collective};
use crate::{Error, Result};

mod lanes;
mod p2p;
mod staging;
mod types;
mod validate;

use lanes::Lane;
pub use p2p::P2pGroup;
pub use staging::DEFAULT_STAGING_BYTES;
// For `crate::testing::parse` (the fuzz targets).
#[cfg(feature = "testing")]
pub(crate) use staging::parse_staging_bytes;
pub(super) use staging::staging_bytes_from_env;
pub use types::{BufferRef, DataType, RedOp};

/// Streams one communicator serves collectives on at once: its lanes (host policy: each lane
/// takes its own [`LANE_BARRIERS`] barrier indices from the host's
/// `[0, SYMCOMM_HOST_BARRIER_END)`). A lane serves one stream at a time (see
/// [streams and lanes](Communicator#streams-and-lanes)).
pub const MAX_STREAMS: usize = 2;
/// Barrier indices of each lane (also the most CTAs of one collective launch):
/// `SYMCOMM_HOST_LANE_BARRIERS`.
pub const LANE_BARRIERS: u32 = SYMCOMM_HOST_LANE_BARRIERS;
/// First barrier index of users' kernels; host collectives never use it or any above
/// (`SYMCOMM_USER_BARRIER_FIRST`).
pub const USER_BARRIER_FIRST: u32 = SYMCOMM_USER_BARRIER_FIRST;
/// End (exclusive) of users' barrier indices (`SYMCOMM_USER_BARRIER_END`): the device refuses a
/// barrier at this index or above, whose signal word would be one of send/recv's.
pub const USER_BARRIER_END: u32 = SYMCOMM_USER_BARRIER_END;

// The lanes exactly fill the host's barrier indices, which end where the users' begin.
const _: () = assert!(MAX_STREAMS as u32 * LANE_BARRIERS == SYMCOMM_HOST_BARRIER_END);
const _: () = assert!(SYMCOMM_HOST_BARRIER_END == USER_BARRIER_FIRST);
const _: () = assert!(USER_BARRIER_FIRST < USER_BARRIER_END);

/// A built-in kernel, loaded, with its launch shape on this communicator.
pub(super) struct Builtin {
    kernel: Kernel,
    /// Threads per CTA.
    threads: u32,
    /// Most CTAs one launch may use: this rank's per-lane share of the CTAs its GPU holds at
    /// once (see [`crate::residency`]), within the lane's barrier indices.
    max_ctas: u32,
}

/// Per-communicator state of the host collectives.
#[derive(Default)]
pub(super) struct CollState {
    /// Lane `i` has barrier indices `[i * LANE_BARRIERS, (i + 1) * LANE_BARRIERS)`.
    lanes: Mutex<Vec<Arc<Lane>>>,
    kernels: [OnceLock<Builtin>; 12],
    p2p_kernel: OnceLock<Builtin>,
    /// The lane of the latest send/recv group issued outside captures (see `p2p.rs`).
    p2p_lane: Mutex<Option<Arc<Lane>>>,
    algo: OnceLock<Option<Algorithm>>,
}

/// One validated call.
#[derive(Clone, Copy)]
pub(super) struct Call<'a> {
    pub(super) coll: Collective,
    pub(super) send: BufferRef<'a>,
    pub(super) recv: BufferRef<'a>,
    pub(super) count: u64,
    pub(super) dtype: DataType,
    pub(super) op: RedOp,
    pub(super) root: u32,
}

/// (blocks of `count` elements in the send buffer, in the receive buffer).
fn layout(coll: Collective, n: u64) -> (u64, u64) {
    match coll {
        Collective::AllGather => (1, n),
        Collective::ReduceScatter | Collective::Scatter => (n, 1),
        Collective::AllToAll => (n, n),
        _ => (1, 1),
    }
}

impl Communicator {
    /// All-reduce: every rank's `send[0..count)` reduced with `op` into every rank's
    /// `recv[0..count)`. In place: `send` and `recv` the same memory.
    ///
    /// # Errors
    /// See [the collectives](Communicator#host-collectives): [`Error::InvalidArgument`] (counts, sizes,
    /// alignment, aliasing, foreign windows, windows of another element type — a `Window<f32>`
    /// is not an `I32` buffer, see [`DevicePlain::DTYPE`] — a stream while [`MAX_STREAMS`] others
    /// are in use; nothing launched); on a stream's first call, [`Error::Mismatch`] /
    /// [`Error::PeerFailed`] when the ranks cannot bind it to the same lane; the communicator's
    /// sticky error ([`Error::PeerLost`], device errors), backend errors.
    ///
    /// [`DevicePlain::DTYPE`]: crate::DevicePlain::DTYPE
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce<'a>(
        &self,
        send: impl Into<BufferRef<'a>>,
        recv: impl Into<BufferRef<'a>>,
        count: usize,
        dtype: DataType,
        op: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        self.collective(
            Collective::AllReduce,
            send.into(),
            recv.into(),
            count,
            dtype,
            op,
            0,
            stream,
        )
    }

    /// Broadcast: rank `root`'s `send[0..count)` into every rank's `recv[0..count)` (`send` is
    /// read on the root only). In place: `send` and `recv` the same memory.
    ///
    /// # Errors
    /// As [`Self::all_reduce`], and a `root` out of range.
    pub fn broadcast<'a>(
        &self,
        send: impl Into<BufferRef<'a>>,
        recv: impl Into<BufferRef<'a>>,
        count: usize,
        dtype: DataType,
        root: u32,
        stream: &Stream,
    ) -> Result<()> {
        self.collective(
            Collective::Broadcast,
            send.into(),
            recv.into(),
            count,
            dtype,
            RedOp::Sum,
            root,
            stream,
        )
    }

    /// Reduce: every rank's `send[0..count)` reduced with `op` into rank `root`'s
    /// `recv[0..count)` (other ranks' `recv` untouched).
    ///
    /// # Errors
    /// As [`Self::broadcast`].
    #[allow(clippy::too_many_arguments)]
    pub fn reduce<'a>(
        &self,
        send: impl Into<BufferRef<'a>>,
        recv: impl Into<BufferRef<'a>>,
        count: usize,
        dtype: DataType,
        op: RedOp,
        root: u32,
        stream: &Stream,
    ) -> Result<()> {
        self.collective(
            Collective::Reduce,
            send.into(),
            recv.into(),
            count,
            dtype,
            op,
            root,
            stream,
        )
    }

    /// All-gather: rank r's `send[0..count)` into every rank's `recv[r*count..(r+1)*count)`.
    /// In place: `send` is `recv[rank*count..]`.
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn all_gather<'a>(
        &self,
        send: impl Into<BufferRef<'a>>,
        recv: impl Into<BufferRef<'a>>,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<()> {
        self.collective(
            Collective::AllGather,
            send.into(),
            recv.into(),
            count,
            dtype,
            RedOp::Sum,
            0,
            stream,
        )
    }

    /// Reduce-scatter: block r (`send[r*count..(r+1)*count)`) of every rank, reduced with `op`,
    /// into rank r's `recv[0..count)`. In place: `recv` is `send[rank*count..]`.
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn reduce_scatter<'a>(
        &self,
        send: impl Into<BufferRef<'a>>,
        recv: impl Into<BufferRef<'a>>,
        count: usize,
        dtype: DataType,
        op: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        self.collective(
            Collective::ReduceScatter,
            send.into(),
            recv.into(),
            count,
            dtype,
            op,
            0,
            stream,
        )
    }

    /// Scatter: block r of rank `root`'s `send` (`send[r*count..(r+1)*count)`) into rank r's
    /// `recv[0..count)` (`send` read on the root only). In place: `recv` is
    /// `send[rank*count..]`.
    ///
    /// # Errors
    /// As [`Self::broadcast`].
    pub fn scatter<'a>(
        &self,
        send: impl Into<BufferRef<'a>>,
        recv: impl Into<BufferRef<'a>>,
        count: usize,
        dtype: DataType,
        root: u32,
        stream: &Stream,
    ) -> Result<()> {
        self.collective(
            Collective::Scatter,
            send.into(),
            recv.into(),
            count,
            dtype,
            RedOp::Sum,
            root,
            stream,
        )
    }

    /// All-to-all: rank r's `send[p*count..(p+1)*count)` into rank p's
    /// `recv[r*count..(r+1)*count)`. In place: `send` and `recv` the same memory.
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn all_to_all<'a>(
        &self,
        send: impl Into<BufferRef<'a>>,
        recv: impl Into<BufferRef<'a>>,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<()> {
        self.collective(
            Collective::AllToAll,
            send.into(),
            recv.into(),
            count,
            dtype,
            RedOp::Sum,
            0,
            stream,
        )
    }

    /// Ordinary device memory of `bytes` bytes on this communicator's backend (zeroed).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 bytes; [`Error::Cuda`].
    pub fn alloc_buffer(&self, bytes: usize) -> Result<Buffer> {
        Buffer::new(&self.backend, bytes)
    }

    /// The algorithm the model (or `SYMCOMM_ALGO`) picks for `coll` on `bytes` bytes here.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad `SYMCOMM_ALGO`.
    pub fn algorithm_for(&self, coll: Collective, bytes: u64) -> Result<Algorithm> {
        Ok(tune::choose(
            coll,
            bytes,
            self.nranks,
            self.backend.kind(),
            self.forced_algo()?,
        ))
    }

    fn forced_algo(&self) -> Result<Option<Algorithm>> {
        if let Some(a) = self.coll.algo.get() {
            return Ok(*a);
        }
        let a = tune::algo_from_env()?;
        Ok(*self.coll.algo.get_or_init(|| a))
    }

    /// The launch geometry's backend: CUDA's on CUDA, and on the emulator when
    /// [`CommOptions::emu_cuda_geometry`](super::CommOptions::emu_cuda_geometry) asks for it.
    fn geometry_kind(&self) -> BackendKind {
        if self.options.emu_cuda_geometry {
            BackendKind::Cuda
        } else {
            self.backend.kind()
        }
    }

    fn kernel_for(&self, dtype: DataType) -> Result<&Builtin> {
        let threads = tune::threads(self.nranks, self.geometry_kind());
        self.builtin_kernel(
            &self.coll.kernels[dtype as usize],
            dtype.kernel_name(),
            threads,
            LANE_BARRIERS,
        )
    }

    /// Built-in kernel `name` for CTAs of `threads` threads, at most `limit` CTAs per launch,
    /// loaded on first use into `cell`.
    fn builtin_kernel<'k>(
        &self,
        cell: &'k OnceLock<Builtin>,
        name: &str,
        threads: u32,
        limit: u32,
    ) -> Result<&'k Builtin> {
        if let Some(k) = cell.get() {
            return Ok(k);
        }
        let kernel = self.load_kernel(&crate::DEVICE_IMAGE, name)?;
        let share = self.co_resident_share(&kernel, threads, 0)?;
        Ok(cell.get_or_init(|| Builtin {
            kernel,
            threads,
            max_ctas: share.min(limit),
        }))
    }

    #[allow(clippy::too_many_arguments)]
    fn collective(
        &self,
        coll: Collective,
        send: BufferRef<'_>,
        recv: BufferRef<'_>,
        count: usize,
        dtype: DataType,
        op: RedOp,
        root: u32,
        stream: &Stream,
    ) -> Result<()> {
        let call = Call {
            coll,
            send,
            recv,
            count: count as u64,
            dtype,
            op,
            root,
        };
        self.validate(&call, stream)?;
        self.check_error()?;
        if call.count == 0 {
            return Ok(());
        }
        self.control.begin_call()?;
        if !self.spans_one_host() {
            return self.collective_across_hosts(&call, stream);
        }
        let lane = self.lane(stream)?;
        if self.nranks == 1 {
            return self.copy_alone(&call, &lane, stream);
        }
        let n = u64::from(self.nranks);
        let (sb, rb) = layout(coll, n);
        let msg_bytes = call.count * dtype.size() as u64 * sb.max(rb);
        let algo = tune::choose(
            coll,
            msg_bytes,
            self.nranks,
            self.backend.kind(),
            self.forced_algo()?,
        );
        let kind = algo.kind_code(coll).ok_or_else(|| {
            Error::Unsupported(format!("{} has no {} algorithm", coll.name(), algo.name()))
        })?;
        let builtin = self.kernel_for(dtype)?;
        let dev = self.device_handle()?;
        let retain = || self.retained(&lane, [&send, &recv]);
        let issued = match (send.window, recv.window) {
            (Some((sw, soff, _)), Some((rw, roff, _))) => {
                let size = dtype.size() as u64;
                let args = CollArgs {
                    kind,
                    dtype: dtype.code(),
                    redop: op.code(),
                    root,
                    scope: SYMCOMM_SCOPE_GRID,
                    index: lane.first_barrier,
                    count: call.count,
                    src_offset: soff / size,
                    dst_offset: roff / size,
                    tile_stride: 0,
                    src: sw,
                    dst: rw,
                    ..Default::default()
                };
                self.launch_coll(
                    builtin, &lane, stream, &dev, &args, msg_bytes, coll, algo, &retain,
                )
            }
            _ => self.staged(&call, &lane, algo, kind, builtin, stream, &dev, &retain),
        };
        self.track(
            &lane,
            stream,
            [send.buffer, recv.buffer].into_iter().flatten(),
        );
        issued
    }

    /// A collective of a communicator of one rank: every one of the seven is a copy of `count`
    /// elements from `send` to `recv` (nothing in place; Avg divides by one), done as a copy on
    /// the stream rather than a kernel (on the emulator a launch costs ~200 µs, a copy ~µs; the
    /// host's phases of collectives across hosts with one rank per host are such calls).
    fn copy_alone(&self, call: &Call<'_>, lane: &Arc<Lane>, stream: &Stream) -> Result<()> {
        let bytes = call.count * call.dtype.size() as u64;
        let retain = || self.retained(lane, [&call.send, &call.recv]);
        let issued = if call.send.addr == call.recv.addr {
            Ok(())
        } else {
            // SAFETY: both ranges were validated (at least `count` elements each, on this
            // communicator's device); their drops wait for the call (`track` below) and a graph
            // that records it keeps them alive (`retain`).
            unsafe { stream.copy_raw_retaining(call.recv.addr, call.send.addr, bytes, &retain) }
        };
        self.track(
            lane,
            stream,
            [call.send.buffer, call.recv.buffer].into_iter().flatten(),
        );
        issued
    }

    /// What a graph that records work of this communicator on `lane` with `buffers` keeps
    /// alive: the buffers' memory (windows' mappings, [`Buffer`]s), the lane (its staging
    /// windows) and the communicator (signal area, control block). Outside captures the drops
    /// wait for the work instead ([`Self::track`], [`Buffer::used_by`]).
    fn retained<'b>(
        &self,
        lane: &Arc<Lane>,
        buffers: impl IntoIterator<Item = &'b BufferRef<'b>>,
    ) -> Vec<Retained> {
        let mut keep: Vec<Retained> = buffers
            .into_iter()
            .filter_map(BufferRef::retained)
            .collect();
        keep.push(Arc::clone(lane) as Retained);
        if let Ok(comm) = self.shared() {
            keep.push(comm as Retained);
        }
        keep
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_coll(
        &self,
        builtin: &Builtin,
        lane: &Lane,
        stream: &Stream,
        dev: &symcomm_device::abi::DevComm,
        args: &CollArgs,
        msg_bytes: u64,
        coll: Collective,
        algo: Algorithm,
        retain: RetainFn<'_>,
    ) -> Result<()> {
        let (grid, block) = tune::geometry(
            coll,
            algo,
            msg_bytes,
            self.nranks,
            self.geometry_kind(),
            builtin.max_ctas,
        );
        debug_assert_eq!(block, builtin.threads);
        let kargs = KernelArgs::new().arg(dev).arg(args);
        // SAFETY: the built-in kernel takes (DevComm, CollArgs) by value; the windows named in
        // `args` belong to this communicator (validated) or to its lane; their drops (and the
        // communicator's) wait for the call, and a graph that records it keeps them alive
        // (`retain`).
        let issued = unsafe {
            stream.launch_retaining(
                &builtin.kernel,
                LaunchConfig::linear(grid, block),
                &kargs,
                retain,
            )
        };
        // Every rank's kernel of a collective waits for every other's.
        self.order_launch(lane.index, stream, 0..self.nranks, issued)
    }
}

//! Host collectives on a [`Communicator`]: entry points, lanes, staging, validation, send/recv
//! (the contract users see is on [`Communicator`]: "Host collectives", "Streams and lanes").

use std::marker::PhantomData;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use symcomm_device::abi::{
    CollArgs, P2pArgs, P2pOp, SYMCOMM_DTYPE_NONE, SYMCOMM_HOST_BARRIER_END,
    SYMCOMM_HOST_LANE_BARRIERS, SYMCOMM_P2P_EXCHANGE, SYMCOMM_P2P_MAX_OPS, SYMCOMM_P2P_RECV,
    SYMCOMM_P2P_SEND, SYMCOMM_SCOPE_GRID, SYMCOMM_USER_BARRIER_END, SYMCOMM_USER_BARRIER_FIRST,
    WindowHandleRaw,
};

use super::{Communicator, Window, memory::FlatMapping};
use crate::backend::Backend;
use crate::backend::cuda::DevicePlain;
use crate::stream::{
    Buffer, Kernel, KernelArgs, LaunchConfig, RetainFn, Retained, Stream, StreamToken,
};
use crate::tune::{self, Algorithm, BackendKind, Collective};
use crate::{Error, Result};

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
/// What binding a stream to a lane is called in errors.
const BINDING: &str = "binding a stream to a collective lane";
/// Default bytes of each staging window (`SYMCOMM_STAGING_BYTES`); a lane has two
/// (input and output).
pub const DEFAULT_STAGING_BYTES: u64 = 4 << 20;

/// Element type of a collective. Names as in nccl-tests (`float`, `bfloat16`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DataType {
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// FP8 E4M3 (OCP).
    Fp8E4m3,
    /// FP8 E5M2 (OCP).
    Fp8E5m2,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

impl DataType {
    /// Every type, in `SYMCOMM_DTYPE_*` code order.
    pub const ALL: [DataType; 12] = [
        DataType::F32,
        DataType::F64,
        DataType::F16,
        DataType::Bf16,
        DataType::Fp8E4m3,
        DataType::Fp8E5m2,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
    ];

    /// The `SYMCOMM_DTYPE_*` code.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F16 | DataType::Bf16 => 2,
            _ => 1,
        }
    }

    /// The nccl-tests name (`float`, `double`, `half`, `bfloat16`, `f8e4m3`, `f8e5m2`, `int8`,
    /// `uint8`, `int32`, `uint32`, `int64`, `uint64`).
    pub fn name(self) -> &'static str {
        [
            "float", "double", "half", "bfloat16", "f8e4m3", "f8e5m2", "int8", "uint8", "int32",
            "uint32", "int64", "uint64",
        ][self as usize]
    }

    /// Parses a nccl-tests name or a Rust-style one (`f32`, `bf16`, `fp8_e4m3`, `u8`, ...).
    pub fn parse(s: &str) -> Option<Self> {
        let rust = [
            "f32", "f64", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "i8", "u8", "i32", "u32", "i64",
            "u64",
        ];
        DataType::ALL
            .into_iter()
            .find(|d| d.name() == s || rust[*d as usize] == s)
    }

    /// Whether the type is a floating-point one.
    pub fn is_float(self) -> bool {
        (self as u32) < 6
    }

    fn kernel(self) -> &'static str {
        [
            "symcomm_collective_f32",
            "symcomm_collective_f64",
            "symcomm_collective_f16",
            "symcomm_collective_bf16",
            "symcomm_collective_fp8_e4m3",
            "symcomm_collective_fp8_e5m2",
            "symcomm_collective_i8",
            "symcomm_collective_u8",
            "symcomm_collective_i32",
            "symcomm_collective_u32",
            "symcomm_collective_i64",
            "symcomm_collective_u64",
        ][self as usize]
    }
}

/// Reduction operation. Every type supports every op; sums of small floating-point types
/// accumulate in f32 and round once; `Avg` divides the sum by the rank count (integer division
/// for integers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RedOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Average (sum / ranks).
    Avg,
}

impl RedOp {
    /// Every op, in `SYMCOMM_REDOP_*` code order.
    pub const ALL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::Avg];

    /// The `SYMCOMM_REDOP_*` code.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// `sum`, `prod`, `min`, `max`, `avg` (nccl-tests names).
    pub fn name(self) -> &'static str {
        ["sum", "prod", "min", "max", "avg"][self as usize]
    }

    /// Parses [`RedOp::name`].
    pub fn parse(s: &str) -> Option<Self> {
        RedOp::ALL.into_iter().find(|o| o.name() == s)
    }
}

/// A buffer argument of a collective: (part of) a symmetric window of this communicator —
/// used in place, zero-copy — or ordinary device memory, copied through the staging windows.
///
/// Lifetime: collectives are asynchronous. Dropping a window, a [`Buffer`] or the communicator
/// waits for the calls already issued through the collectives; a graph that captured calls
/// keeps their windows, buffers and communicator alive until it drops (see
/// [`Graph`](crate::Graph)). Raw memory ([`Self::from_raw`]) must stay allocated until the
/// stream has run the call (or the last launch of a graph that captured it), as with NCCL and
/// CUDA: synchronize the stream (or an event recorded after the call) first.
#[derive(Debug, Clone, Copy)]
pub struct BufferRef<'a> {
    /// Device address of this rank's first byte.
    addr: u64,
    bytes: u64,
    /// The whole window and the byte offset into it, with its communicator's identity.
    window: Option<(WindowHandleRaw, u64, usize)>,
    /// The [`Buffer`] the memory belongs to: calls record their last use of it, which its drop
    /// waits for.
    buffer: Option<&'a Buffer>,
    /// The window's mapping, which a graph that captures the call keeps alive.
    mapping: Option<&'a Arc<FlatMapping>>,
    _borrow: PhantomData<&'a ()>,
}

impl<'a> BufferRef<'a> {
    /// Ordinary device memory at `addr` (on the emulator: host memory) of `bytes` bytes — for
    /// example a cudarc `CudaSlice`'s device pointer.
    ///
    /// # Safety
    /// `addr..addr + bytes` is device memory of the communicator's GPU (emulator: host memory)
    /// that stays allocated, and is not used by other work, until the collectives using it have
    /// finished in stream order.
    pub unsafe fn from_raw(addr: u64, bytes: u64) -> BufferRef<'static> {
        BufferRef {
            addr,
            bytes,
            window: None,
            buffer: None,
            mapping: None,
            _borrow: PhantomData,
        }
    }

    /// Bytes in the buffer.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether it is (part of) a symmetric window.
    pub fn is_window(&self) -> bool {
        self.window.is_some()
    }

    /// What a graph that records a call on this buffer keeps alive: the window's mapping or the
    /// buffer's memory (raw memory: nothing).
    fn retained(&self) -> Option<Retained> {
        match (self.mapping, self.buffer) {
            (Some(m), _) => Some(Arc::clone(m) as Retained),
            (None, Some(b)) => Some(b.retained()),
            (None, None) => None,
        }
    }
}

impl<'a, T: DevicePlain> From<&'a Window<T>> for BufferRef<'a> {
    fn from(w: &'a Window<T>) -> Self {
        w.range(0, w.len()).unwrap_or(BufferRef {
            addr: 0,
            bytes: 0,
            window: None,
            buffer: None,
            mapping: None,
            _borrow: PhantomData,
        })
    }
}

impl<'a> From<&'a Buffer> for BufferRef<'a> {
    fn from(b: &'a Buffer) -> Self {
        BufferRef {
            addr: b.addr(),
            bytes: b.len() as u64,
            window: None,
            buffer: Some(b),
            mapping: None,
            _borrow: PhantomData,
        }
    }
}

impl<T: DevicePlain> Window<T> {
    /// Elements `offset..offset + len` of this window as a collective buffer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] out of bounds.
    pub fn range(&self, offset: usize, len: usize) -> Result<BufferRef<'_>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => {}
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "elements {offset}..{offset}+{len} are outside a window of {}",
                    self.len()
                )));
            }
        }
        let raw = self.device_handle().raw();
        let off = (offset * size_of::<T>()) as u64;
        Ok(BufferRef {
            addr: raw.base + u64::from(raw.rank) * raw.stride + off,
            bytes: (len * size_of::<T>()) as u64,
            window: Some((raw, off, Arc::as_ptr(self.communicator()) as usize)),
            buffer: None,
            mapping: Some(self.mapping()),
            _borrow: PhantomData,
        })
    }
}

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
    index: u32,
    first_barrier: u32,
    stage_in: FlatMapping,
    stage_out: FlatMapping,
    stage_bytes: u64,
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

/// A built-in kernel, loaded, with its launch shape on this communicator.
pub(super) struct Builtin {
    kernel: Kernel,
    /// Threads per CTA.
    threads: u32,
    /// Most CTAs one launch may use: this rank's per-lane share of the CTAs its GPU holds at
    /// once (see [`crate::residency`]), within the lane's barrier indices.
    max_ctas: u32,
}

impl Lane {
    /// Rank `rank`'s handle of one of the lane's staging windows: bytes, used as any type.
    fn stage_handle(&self, m: &FlatMapping, rank: u32) -> WindowHandleRaw {
        m.handle(rank, self.stage_bytes, 1, SYMCOMM_DTYPE_NONE)
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

/// Per-communicator state of the host collectives.
#[derive(Default)]
pub(super) struct CollState {
    /// Lane `i` has barrier indices `[i * LANE_BARRIERS, (i + 1) * LANE_BARRIERS)`.
    lanes: Mutex<Vec<Arc<Lane>>>,
    kernels: [OnceLock<Builtin>; 12],
    p2p_kernel: OnceLock<Builtin>,
    algo: OnceLock<Option<Algorithm>>,
}

/// One validated call.
struct Call<'a> {
    coll: Collective,
    send: BufferRef<'a>,
    recv: BufferRef<'a>,
    count: u64,
    dtype: DataType,
    op: RedOp,
    root: u32,
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
            self.backend_kind(),
            self.forced_algo()?,
        ))
    }

    fn backend_kind(&self) -> BackendKind {
        match self.backend {
            Backend::Cuda(_) => BackendKind::Cuda,
            _ => BackendKind::Emu,
        }
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
            self.backend_kind()
        }
    }

    fn kernel_for(&self, dtype: DataType) -> Result<&Builtin> {
        let threads = tune::threads(self.nranks, self.geometry_kind());
        self.builtin_kernel(
            &self.coll.kernels[dtype as usize],
            dtype.kernel(),
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

    /// The checks every call makes of its stream and of the communicator's topology.
    fn check_stream(&self, stream: &Stream, what: &str) -> Result<()> {
        if stream.is_emu() != matches!(self.backend, Backend::Emu) {
            return Err(Error::InvalidArgument(format!(
                "{what}: the stream belongs to another backend than this communicator ({})",
                self.backend.name()
            )));
        }
        if !self.spans_one_host() {
            return Err(self.multi_host(what));
        }
        Ok(())
    }

    /// The lane of `stream`. A stream's first call binds it to a lane, collectively: every rank
    /// proposes the lowest free lane (one that serves no live stream and no graph) or a new one,
    /// and all fail unless they all propose the same, so that the ranks' k-th new streams share
    /// barrier epochs and peers. A reused lane's new stream first waits, in stream order, for the
    /// lane's last call; a new lane allocates its staging windows (collective).
    fn lane(&self, stream: &Stream) -> Result<Arc<Lane>> {
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
        // `[1][lane u32][new u8]`, or the error.
        let mut proposal = super::encode_status(&pick);
        if let Ok((index, _, stage_bytes)) = &pick {
            proposal.extend_from_slice(&index.to_be_bytes());
            proposal.push(u8::from(stage_bytes.is_some()));
        }
        let all = self
            .control
            .all_gather(super::TAG_LANE, BINDING, &proposal)?;
        let (index, claim, stage_bytes) = pick?;
        let theirs = |p: &[u8]| match *p {
            [1, a, b, c, d, new] => Some((u32::from_be_bytes([a, b, c, d]), new == 1)),
            _ => None,
        };
        if let Some((r, p)) = all.iter().enumerate().find(|(_, p)| theirs(p).is_none()) {
            return Err(Error::PeerFailed {
                rank: r as u32,
                what: BINDING.to_owned(),
                message: String::from_utf8_lossy(p.get(1..).unwrap_or_default()).into_owned(),
            });
        }
        let lane_name =
            |(i, new): (u32, bool)| format!("{} lane {i}", if new { "new" } else { "free" });
        let mine = (index, stage_bytes.is_some());
        if let Some((r, other)) = all
            .iter()
            .filter_map(|p| theirs(p))
            .enumerate()
            .find(|&(_, l)| l != mine)
        {
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
        if matches!(stream.cuda_raw(), Some(0 | 1)) && self.gpu_ranks > 1 {
            return Err(Error::InvalidArgument(format!(
                "the legacy default stream: {} ranks share this GPU, and their kernels on one \
                 stream would run one after the other while they wait for each other; create \
                 a stream per rank (comm.create_stream())",
                self.gpu_ranks
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

    fn staging_bytes(&self) -> Result<u64> {
        staging_bytes_from_env()
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
        let lane = self.lane(stream)?;
        let n = u64::from(self.nranks);
        let (sb, rb) = layout(coll, n);
        let msg_bytes = call.count * dtype.size() as u64 * sb.max(rb);
        let algo = tune::choose(
            coll,
            msg_bytes,
            self.nranks,
            self.backend_kind(),
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
                };
                self.launch_coll(builtin, stream, &dev, &args, msg_bytes, coll, &retain)
            }
            _ => self.staged(&call, &lane, kind, builtin, stream, &dev, &retain),
        };
        self.track(
            &lane,
            stream,
            [send.buffer, recv.buffer].into_iter().flatten(),
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

    /// Remembers the lane's latest work (see [`Lane::last`]).
    /// The same event marks the last use of the call's buffers (`buffers`, [`Buffer::used_by`]):
    /// one event per call.
    fn track<'b>(
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
    pub(super) fn quiesce(&self) {
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

    #[allow(clippy::too_many_arguments)]
    fn launch_coll(
        &self,
        builtin: &Builtin,
        stream: &Stream,
        dev: &symcomm_device::abi::DevComm,
        args: &CollArgs,
        msg_bytes: u64,
        coll: Collective,
        retain: RetainFn<'_>,
    ) -> Result<()> {
        let (grid, block) = tune::geometry(
            coll,
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
        unsafe {
            stream.launch_retaining(
                &builtin.kernel,
                LaunchConfig::linear(grid, block),
                &kargs,
                retain,
            )
        }
    }

    /// The staged path: chunks of at most what the staging windows hold, each copied in, run,
    /// copied out in stream order.
    #[allow(clippy::too_many_arguments)]
    fn staged(
        &self,
        call: &Call<'_>,
        lane: &Lane,
        kind: u32,
        kernel: &Builtin,
        stream: &Stream,
        dev: &symcomm_device::abi::DevComm,
        retain: RetainFn<'_>,
    ) -> Result<()> {
        let n = u64::from(self.nranks);
        let size = call.dtype.size() as u64;
        let (sb, rb) = layout(call.coll, n);
        // Elements per rank block per chunk: the same on every rank.
        let cap = lane.stage_bytes / size / sb.max(rb);
        if cap == 0 {
            return Err(Error::InvalidArgument(format!(
                "SYMCOMM_STAGING_BYTES ({}) is too small for {} ranks of {}",
                lane.stage_bytes,
                n,
                call.dtype.name()
            )));
        }
        let stage_in = lane.stage_in.base() + u64::from(self.rank) * lane.stage_in.stride();
        let stage_out = lane.stage_out.base() + u64::from(self.rank) * lane.stage_out.stride();
        let (win_in, win_out) = (
            lane.stage_handle(&lane.stage_in, self.rank),
            lane.stage_handle(&lane.stage_out, self.rank),
        );
        let mut off = 0;
        while off < call.count {
            let c = cap.min(call.count - off);
            for j in 0..sb {
                // SAFETY: validated: the send buffer holds sb * count elements; the staging
                // input holds sb * cap >= sb * c elements of this rank; stream-ordered after
                // the previous chunk's kernel, which no peer reads after it ended.
                unsafe {
                    stream.copy_raw_retaining(
                        stage_in + j * c * size,
                        call.send.addr + (j * call.count + off) * size,
                        c * size,
                        retain,
                    )
                }?;
            }
            let args = CollArgs {
                kind,
                dtype: call.dtype.code(),
                redop: call.op.code(),
                root: call.root,
                scope: SYMCOMM_SCOPE_GRID,
                index: lane.first_barrier,
                count: c,
                src_offset: 0,
                dst_offset: 0,
                tile_stride: 0,
                src: win_in,
                dst: win_out,
            };
            self.launch_coll(
                kernel,
                stream,
                dev,
                &args,
                c * size * sb.max(rb),
                call.coll,
                retain,
            )?;
            let writes_recv = call.coll != Collective::Reduce || self.rank == call.root;
            if writes_recv {
                for j in 0..rb {
                    // SAFETY: as above, for the receive buffer (rb * count elements) and this
                    // rank's staging output, after the chunk's kernel in stream order.
                    unsafe {
                        stream.copy_raw_retaining(
                            call.recv.addr + (j * call.count + off) * size,
                            stage_out + j * c * size,
                            c * size,
                            retain,
                        )
                    }?;
                }
            }
            off += c;
        }
        Ok(())
    }

    /// Host-side checks of one call; nothing is launched when they fail.
    fn validate(&self, call: &Call<'_>, stream: &Stream) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(format!("{}: {m}", call.coll.name())));
        self.check_stream(stream, "collectives")?;
        let n = u64::from(self.nranks);
        if call.coll.has_root() && call.root >= self.nranks {
            return bad(format!("root {} of {} ranks", call.root, self.nranks));
        }
        let size = call.dtype.size() as u64;
        let (sb, rb) = layout(call.coll, n);
        let need = |blocks: u64| {
            call.count
                .checked_mul(blocks)
                .and_then(|e| e.checked_mul(size))
        };
        let (Some(send_bytes), Some(recv_bytes)) = (need(sb), need(rb)) else {
            return bad(format!("count {} overflows", call.count));
        };
        let me = std::ptr::from_ref(self) as usize;
        for (what, b, need) in [
            ("send", &call.send, send_bytes),
            ("recv", &call.recv, recv_bytes),
        ] {
            if b.bytes < need {
                return bad(format!(
                    "the {what} buffer has {} bytes; {} elements of {} x {} blocks need {need}",
                    b.bytes,
                    call.count,
                    call.dtype.name(),
                    if what == "send" { sb } else { rb }
                ));
            }
            if b.addr % size != 0 || b.window.is_some_and(|(_, off, _)| off % size != 0) {
                return bad(format!(
                    "the {what} buffer (address {:#x}) is not aligned to {} bytes",
                    b.addr, size
                ));
            }
            if b.window.is_some_and(|(_, _, owner)| owner != me) {
                return bad(format!("the {what} window belongs to another communicator"));
            }
            // The device refuses these too (after the launch, as a sticky error): refuse here.
            if let Some((w, _, _)) = b.window {
                let size_ok = w.elem_size == 1 || u64::from(w.elem_size) == size;
                let type_ok = w.dtype == SYMCOMM_DTYPE_NONE || w.dtype == call.dtype.code();
                if !size_ok || !type_ok {
                    return bad(format!(
                        "the {what} window holds {} elements; a {} collective cannot use it \
                         (a window of u8 holds any type; of u16, i16 or a user type, any type of that size)",
                        DataType::ALL.get(w.dtype as usize).map_or_else(
                            || format!("{}-byte", w.elem_size),
                            |d| d.name().to_owned()
                        ),
                        call.dtype.name()
                    ));
                }
            }
            if b.addr == 0 && need > 0 {
                return bad(format!("the {what} buffer is null"));
            }
        }
        // Aliasing: only NCCL's in-place conventions may overlap.
        let (s0, s1) = (call.send.addr, call.send.addr + send_bytes);
        let (r0, r1) = (call.recv.addr, call.recv.addr + recv_bytes);
        if send_bytes > 0 && recv_bytes > 0 && s0 < r1 && r0 < s1 {
            let rank_off = u64::from(self.rank) * call.count * size;
            let in_place = match call.coll {
                Collective::AllGather => s0 == r0 + rank_off,
                Collective::ReduceScatter | Collective::Scatter => r0 == s0 + rank_off,
                _ => s0 == r0,
            };
            if !in_place {
                return bad(
                    "the send and recv buffers overlap without being in place (in place: the \
                     same memory; all_gather: send = recv + rank*count; reduce_scatter and \
                     scatter: recv = send + rank*count)"
                        .into(),
                );
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Point-to-point
// ---------------------------------------------------------------------------------------------

// SAFETY: `P2pArgs` is the all-integer `repr(C)` mirror of abi.h's struct (layout pinned on both
// sides), with device addresses as integers.
unsafe impl crate::stream::KernelArg for P2pArgs {}

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
        let threads = match self.geometry_kind() {
            BackendKind::Emu => tune::EMU_THREADS,
            BackendKind::Cuda => tune::CUDA_THREADS,
        };
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

/// The staging bytes per lane: `SYMCOMM_STAGING_BYTES` (4096..=16 GiB) or the default (read now).
///
/// # Errors
/// [`Error::InvalidArgument`] for a value outside that range or not a number.
pub(super) fn staging_bytes_from_env() -> Result<u64> {
    match crate::config::raw_value("SYMCOMM_STAGING_BYTES") {
        None => Ok(DEFAULT_STAGING_BYTES),
        Some(v) => v
            .parse::<u64>()
            .ok()
            .filter(|&b| (4096..=(1 << 34)).contains(&b))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "SYMCOMM_STAGING_BYTES={v}: expected a byte count from 4096 to 16 GiB"
                ))
            }),
    }
}

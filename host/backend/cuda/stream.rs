//! Streams, the events that order them, and the graphs captured from them.

use std::ffi::{c_uint, c_void};
use std::ptr;
use std::sync::Arc;

use cudarc::driver::sys as dsys;

use super::device::{Context, EVENT_POOL, PooledEvent};
use super::loader::{check, cuda_error};
use super::{CudaDevice, CudaFunction, DeviceBuffer};
use crate::{Error, Result};

impl CudaDevice {
    /// Creates a stream that does not synchronize with the legacy default stream
    /// (`CU_STREAM_NON_BLOCKING`), so that [`DeviceBuffer`] copies and other streams' work do not
    /// wait for its kernels — kernels that wait for each other (ranks as streams) must not be
    /// serialized behind one another.
    ///
    /// # Errors
    /// [`Error::Cuda`].
    pub(crate) fn create_stream(&self) -> Result<Stream> {
        self.ctx.bind()?;
        let mut stream: dsys::CUstream = ptr::null_mut();
        // SAFETY: the context is current; the out-pointer is a live local.
        check("cuStreamCreate", unsafe {
            dsys::cuStreamCreate(
                &mut stream,
                dsys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint,
            )
        })?;
        Ok(Stream {
            ctx: Arc::clone(&self.ctx),
            stream,
            owned: true,
        })
    }

    /// Wraps an existing stream of this GPU's primary context — one made by another library
    /// (cudarc's `CudaStream::cu_stream()`, PyTorch's `torch.cuda.Stream.cuda_stream`) — without
    /// taking ownership: dropping the returned [`Stream`] leaves the stream alive. `handle` is
    /// the `CUstream` as an integer; 0 is the legacy default stream.
    ///
    /// # Safety
    /// `handle` is 0 or a live `CUstream` created in this GPU's primary context, and it stays
    /// alive (not destroyed by its owner) for as long as the returned [`Stream`], and every
    /// [`Event`] recorded on it, is in use.
    pub(crate) unsafe fn wrap_stream(&self, handle: u64) -> Stream {
        Stream {
            ctx: Arc::clone(&self.ctx),
            // A CUstream is an opaque driver handle, never dereferenced on the Rust side.
            stream: ptr::with_exposed_provenance_mut(handle as usize),
            owned: false,
        }
    }
}

/// A CUDA stream of one GPU: created by [`CudaDevice::create_stream`] (`CU_STREAM_NON_BLOCKING`,
/// destroyed on drop; work already queued still completes), or an external stream wrapped by
/// [`CudaDevice::wrap_stream`] (never destroyed here).
#[derive(Debug)]
pub struct Stream {
    pub(super) ctx: Arc<Context>,
    pub(super) stream: dsys::CUstream,
    /// Whether this value created the stream and so destroys it on drop.
    owned: bool,
}

/// A stream's idleness, asked by the registry of synchronizing frees while the stream lives
/// (`crate::sync_free` removes it before the stream is destroyed).
pub(crate) struct StreamProbe {
    ctx: Arc<Context>,
    stream: usize,
}

impl crate::sync_free::StreamProbe for StreamProbe {
    fn idle(&self) -> bool {
        if self.ctx.bind().is_err() {
            return true;
        }
        let stream: dsys::CUstream = std::ptr::with_exposed_provenance_mut(self.stream);
        // SAFETY: the context is current; the registry asks only while the stream lives.
        // Anything but "not ready" (done, or a failed stream that runs nothing more) is idle.
        !matches!(
            unsafe { dsys::cuStreamQuery(stream) },
            dsys::CUresult::CUDA_ERROR_NOT_READY
        )
    }

    fn settle(&self, _deadline: std::time::Instant) -> bool {
        true
    }
}

// SAFETY: stream handles may be used from any thread (thread-safe driver API); the context is
// made current before each use.
unsafe impl Send for Stream {}
// SAFETY: as for Send; enqueueing from several threads is allowed by the driver.
unsafe impl Sync for Stream {}

impl Stream {
    /// Enqueues kernel `func` on this stream with `grid` x `block` threads and `shared_bytes` of
    /// dynamic shared memory, and returns without waiting.
    ///
    /// `args` holds one pointer per kernel parameter, as for `cuLaunchKernel`; the values are
    /// copied at enqueue time, so the pointed-to locals may die after this returns.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty grid or block, a kernel of another GPU, or an
    /// argument count that differs from the kernel's (when the driver reports it); [`Error::Cuda`] when the launch is refused
    /// (`CUDA_ERROR_INVALID_VALUE` for a block too large, ...). A fault while the kernel runs
    /// surfaces at the next synchronization.
    ///
    /// With `cooperative`, a cooperative launch (`cuLaunchCooperativeKernel`): the driver
    /// guarantees every CTA is resident at once, or refuses the launch
    /// (`CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`).
    ///
    /// # Safety
    /// Each `args[i]` points at a live value of exactly kernel parameter `i`'s type, and every
    /// device address the kernel reaches through them (buffers, handles) stays allocated until the
    /// kernel has finished ([`Stream::synchronize`]).
    pub unsafe fn launch(
        &self,
        func: &CudaFunction<'_>,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        cooperative: bool,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        if grid.contains(&0) || block.contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "empty launch of {}: grid {grid:?}, block {block:?}",
                func.name
            )));
        }
        if func.module.ctx.ctx != self.ctx.ctx {
            return Err(Error::InvalidArgument(format!(
                "kernel {} belongs to GPU {}, the stream to GPU {}",
                func.name, func.module.ctx.ordinal, self.ctx.ordinal
            )));
        }
        if let Some(sizes) = &func.param_sizes {
            if sizes.len() != args.len() {
                return Err(Error::InvalidArgument(format!(
                    "kernel {} takes {} parameters, {} given",
                    func.name,
                    sizes.len(),
                    args.len()
                )));
            }
        }
        self.ctx.bind()?;
        tracing::debug!(target: "symcomm::cuda", kernel = %func.name, ?grid, ?block, shared_bytes, "launch");
        let params = if args.is_empty() {
            ptr::null_mut()
        } else {
            args.as_mut_ptr()
        };
        if cooperative {
            // SAFETY: as for cuLaunchKernel below (cooperative launches take no `extra`).
            return check("cuLaunchCooperativeKernel", unsafe {
                dsys::cuLaunchCooperativeKernel(
                    func.func,
                    grid[0],
                    grid[1],
                    grid[2],
                    block[0],
                    block[1],
                    block[2],
                    shared_bytes,
                    self.stream,
                    params,
                )
            });
        }
        // SAFETY: the context is current; `func` and `self.stream` are live handles of it;
        // `params` holds one pointer per parameter (this function's contract); no `extra`.
        check("cuLaunchKernel", unsafe {
            dsys::cuLaunchKernel(
                func.func,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_bytes,
                self.stream,
                params,
                ptr::null_mut(),
            )
        })
    }

    /// Whether the driver says the stream is being captured into a graph (by anyone: symcomm,
    /// PyTorch, the user), `cuStreamIsCapturing`. A failed query counts as capturing, so that
    /// callers refuse what a capture cannot hold rather than invalidate it.
    pub fn is_capturing(&self) -> bool {
        if self.ctx.bind().is_err() {
            return true;
        }
        let mut status = dsys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the context is current, `self.stream` is a live stream of it, the
        // out-pointer is a live local.
        let r = unsafe { dsys::cuStreamIsCapturing(self.stream, &mut status) };
        r != dsys::CUresult::CUDA_SUCCESS
            || status != dsys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    }

    /// Enqueues a copy of `bytes` bytes from `src` at byte `src_offset` to `dst` at byte
    /// `dst_offset` (`cuMemcpyDtoDAsync`) and returns without waiting; the copy runs in stream
    /// order with this stream's kernels (a reference for memory bandwidth, a staging copy).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a range exceeds its buffer or a buffer belongs to another
    /// GPU; [`Error::Cuda`].
    ///
    /// # Safety
    /// Both buffers stay allocated until the copy has finished ([`Stream::synchronize`]), and no
    /// other work writes the destination range, or writes the source range, while it runs.
    pub unsafe fn copy_device(
        &self,
        dst: &DeviceBuffer,
        dst_offset: usize,
        src: &DeviceBuffer,
        src_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        dst.range::<u8>(dst_offset, bytes)?;
        src.range::<u8>(src_offset, bytes)?;
        if dst.ctx.ctx != self.ctx.ctx || src.ctx.ctx != self.ctx.ctx {
            return Err(Error::InvalidArgument(format!(
                "a device copy on GPU {} between buffers of GPUs {} and {}",
                self.ctx.ordinal, src.ctx.ordinal, dst.ctx.ordinal
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the context is current and the stream live; both ranges lie inside their
        // allocations (checked above), which stay allocated until the copy finished (this
        // function's contract).
        check("cuMemcpyDtoDAsync_v2", unsafe {
            dsys::cuMemcpyDtoDAsync_v2(
                dst.ptr + dst_offset as u64,
                src.ptr + src_offset as u64,
                bytes,
                self.stream,
            )
        })
    }

    /// Enqueues a copy of `bytes` bytes from device address `src` to device address `dst`
    /// (`cuMemcpyDtoDAsync`) and returns without waiting. 0 bytes enqueue nothing.
    ///
    /// # Errors
    /// [`Error::Cuda`] (`CUDA_ERROR_INVALID_VALUE` for an address the driver does not know).
    ///
    /// # Safety
    /// `[dst, dst + bytes)` and `[src, src + bytes)` are device memory of this GPU (or memory it
    /// can reach), do not overlap, and stay allocated until the copy has finished (while
    /// capturing: until the last launch of the captured graph has finished); no other work
    /// writes either range, or reads the destination, while the copy runs.
    pub unsafe fn copy_raw(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the context is current and the stream live; the ranges are valid device memory
        // until the copy finished (this function's contract).
        check("cuMemcpyDtoDAsync_v2", unsafe {
            dsys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream)
        })
    }

    /// Enqueues setting `bytes` bytes at device address `dst` to `byte` (`cuMemsetD8Async`) and
    /// returns without waiting. 0 bytes enqueue nothing.
    ///
    /// # Errors
    /// [`Error::Cuda`].
    ///
    /// # Safety
    /// As for [`Self::copy_raw`], for the one range `[dst, dst + bytes)`.
    pub unsafe fn memset_raw(&self, dst: u64, byte: u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the context is current and the stream live; the range is valid device memory
        // until the set finished (this function's contract).
        check("cuMemsetD8Async", unsafe {
            dsys::cuMemsetD8Async(dst, byte, bytes, self.stream)
        })
    }

    /// Enqueues `callback` to run on a driver thread in stream order (`cuLaunchHostFunc`):
    /// after everything queued before it finished, before what is queued after it starts. The
    /// callback must not call CUDA, block on work that is not ordered before it, or panic
    /// across the call (a panic is caught and logged). `owned`: the callback runs once and the
    /// trampoline frees it (an ordinary launch); otherwise the caller keeps `callback` alive
    /// for every run (a capture: the graph holds it and runs it on every launch).
    ///
    /// # Errors
    /// [`Error::Cuda`]; nothing is queued then.
    pub(crate) fn call_host(&self, callback: Arc<HostCallback>, owned: bool) -> Result<()> {
        self.ctx.bind()?;
        let (data, tramp): (*const HostCallback, dsys::CUhostFn) = if owned {
            (Arc::into_raw(callback), Some(run_owned_callback))
        } else {
            (Arc::as_ptr(&callback), Some(run_kept_callback))
        };
        // SAFETY: the context is current and the stream live; `data` points to a live
        // callback, freed only by `run_owned_callback` (owned) or kept by the caller.
        let r = check("cuLaunchHostFunc", unsafe {
            dsys::cuLaunchHostFunc(self.stream, tramp, data.cast_mut().cast::<c_void>())
        });
        if r.is_err() && owned {
            // SAFETY: the driver refused the call, so the trampoline never runs: the reference
            // made by `into_raw` above is still ours to drop.
            drop(unsafe { Arc::from_raw(data) });
        }
        r
    }

    /// Enqueues a wait until the 32-bit word at `addr` equals `value` (`cuStreamWaitValue32`,
    /// `CU_STREAM_WAIT_VALUE_EQ`): later work of the stream starts only then. The driver's
    /// wait has no bound: whoever writes the word must guarantee that it does.
    ///
    /// # Errors
    /// [`Error::Cuda`].
    ///
    /// # Safety
    /// `addr` is a 4-aligned word of device-mapped memory (pinned host memory mapped for this
    /// context) that stays allocated until the wait finished.
    pub(crate) unsafe fn wait_word(&self, addr: u64, value: u32) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current and the stream live; the word is the caller's
        // contract.
        check("cuStreamWaitValue32_v2", unsafe {
            dsys::cuStreamWaitValue32_v2(
                self.stream,
                addr,
                value,
                dsys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as c_uint,
            )
        })
    }

    /// Enqueues storing `value` into the 32-bit word at `addr` (`cuStreamWriteValue32`, default
    /// flags: after every earlier operation of the stream, with a memory barrier).
    ///
    /// # Errors
    /// [`Error::Cuda`].
    ///
    /// # Safety
    /// As for [`Self::wait_word`], until the store ran.
    pub(crate) unsafe fn write_word(&self, addr: u64, value: u32) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: as for `wait_word`.
        check("cuStreamWriteValue32_v2", unsafe {
            dsys::cuStreamWriteValue32_v2(self.stream, addr, value, 0)
        })
    }

    /// Starts capturing this stream (`cuStreamBeginCapture`, `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`):
    /// work enqueued from now on is recorded into a graph instead of running, until
    /// [`Self::end_capture`] — which must be called on the same thread. While the capture lasts,
    /// this thread must not make calls the driver considers unsafe during a capture
    /// (synchronous copies such as [`DeviceBuffer::write`], `cuCtxSynchronize`, synchronizing or
    /// querying this stream); the driver refuses them and invalidates the capture.
    ///
    /// # Errors
    /// [`Error::Cuda`]: `CUDA_ERROR_ILLEGAL_STATE` when the stream is already capturing,
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` for the legacy default stream.
    pub fn begin_capture(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current and the stream live.
        check("cuStreamBeginCapture_v2", unsafe {
            dsys::cuStreamBeginCapture_v2(
                self.stream,
                dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })
    }

    /// Ends the capture begun with [`Self::begin_capture`] (`cuStreamEndCapture`) and
    /// instantiates what was recorded (`cuGraphInstantiateWithFlags`, no flags). The capture
    /// ends even when this fails.
    ///
    /// # Errors
    /// [`Error::Cuda`]: `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when an operation during the
    /// capture was refused, `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD` from another thread than
    /// the one that began it (the capture goes on then), `CUDA_ERROR_ILLEGAL_STATE` when the
    /// stream is not capturing; a failed instantiation.
    pub fn end_capture(&self) -> Result<Graph> {
        self.ctx.bind()?;
        let mut graph = Graph {
            ctx: Arc::clone(&self.ctx),
            graph: ptr::null_mut(),
            exec: ptr::null_mut(),
            nodes: 0,
        };
        // SAFETY: the context is current and the stream live; the out-pointer is a field of a
        // live local, which owns (and destroys) the graph from now on.
        check("cuStreamEndCapture", unsafe {
            dsys::cuStreamEndCapture(self.stream, &mut graph.graph)
        })?;
        if graph.graph.is_null() {
            return Err(cuda_error(
                "cuStreamEndCapture",
                dsys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            ));
        }
        // SAFETY: `graph.graph` is a live graph; a null node array asks for the count only,
        // written to a live field.
        check("cuGraphGetNodes", unsafe {
            dsys::cuGraphGetNodes(graph.graph, ptr::null_mut(), &mut graph.nodes)
        })?;
        // SAFETY: the context is current; `graph.graph` is a live graph; the out-pointer is a
        // live field, destroyed by `Graph::drop`.
        check("cuGraphInstantiateWithFlags", unsafe {
            dsys::cuGraphInstantiateWithFlags(&mut graph.exec, graph.graph, 0)
        })?;
        Ok(graph)
    }

    /// Enqueues one run of `graph` (`cuGraphLaunch`) and returns without waiting. Runs of one
    /// graph never overlap: each is ordered after the previous work of this stream and after
    /// the previous run of `graph`, on whichever stream. On a capturing stream the run is
    /// recorded (as a child graph).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a graph of another GPU; [`Error::Cuda`].
    pub fn launch_graph(&self, graph: &Graph) -> Result<()> {
        if graph.ctx.ctx != self.ctx.ctx {
            return Err(Error::InvalidArgument(format!(
                "a graph of GPU {} launched on a stream of GPU {}",
                graph.ctx.ordinal, self.ctx.ordinal
            )));
        }
        self.ctx.bind()?;
        // SAFETY: the context is current; the executable graph and the stream are live handles
        // of it.
        check("cuGraphLaunch", unsafe {
            dsys::cuGraphLaunch(graph.exec, self.stream)
        })
    }

    /// Blocks until all work enqueued on this stream has finished.
    ///
    /// # Errors
    /// [`Error::Cuda`]: a kernel fault of this or earlier work (`CUDA_ERROR_ILLEGAL_ADDRESS`).
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current and the stream is live.
        check("cuStreamSynchronize", unsafe {
            dsys::cuStreamSynchronize(self.stream)
        })
    }

    /// Whether all work enqueued on this stream has finished, without blocking (`cuStreamQuery`);
    /// lets a host watchdog bound its wait and raise the communicator's abort flag.
    ///
    /// # Errors
    /// [`Error::Cuda`]: a kernel fault, as for [`Self::synchronize`].
    pub fn is_idle(&self) -> Result<bool> {
        self.ctx.bind()?;
        // SAFETY: the context is current and the stream is live.
        done("cuStreamQuery", unsafe { dsys::cuStreamQuery(self.stream) })
    }

    /// What the registry of synchronizing frees (`crate::sync_free`) asks this stream: whether
    /// it is idle. Used only while the stream lives.
    pub(crate) fn probe(&self) -> StreamProbe {
        StreamProbe {
            ctx: Arc::clone(&self.ctx),
            stream: self.stream.expose_provenance(),
        }
    }

    /// The `CUstream` handle as an integer (0 for the legacy default stream), for passing to
    /// other CUDA libraries. Valid while `self` lives (for a wrapped stream: while its owner
    /// keeps it).
    pub fn raw(&self) -> u64 {
        self.stream.expose_provenance() as u64
    }

    /// Records an event (`cuEventRecord` of an idle event of the context's pool, or of a new one:
    /// `cuEventCreate` without timing) that completes when all work enqueued on this stream so far
    /// has finished.
    ///
    /// # Errors
    /// [`Error::Cuda`] (a sticky error of earlier work surfaces here).
    pub fn record_event(&self) -> Result<Event> {
        self.ctx.bind()?;
        let pooled = self
            .ctx
            .events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        let event: dsys::CUevent = match pooled {
            Some(PooledEvent(e)) => ptr::with_exposed_provenance_mut(e),
            None => {
                let mut event: dsys::CUevent = ptr::null_mut();
                // SAFETY: the context is current; the out-pointer is a live local. Returned to
                // the pool or destroyed in `Event::drop`.
                check("cuEventCreate", unsafe {
                    dsys::cuEventCreate(
                        &mut event,
                        dsys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint,
                    )
                })?;
                event
            }
        };
        let event = Event {
            ctx: Arc::clone(&self.ctx),
            event,
        };
        // SAFETY: the context is current; the event and the stream are live handles of it.
        check("cuEventRecord", unsafe {
            dsys::cuEventRecord(event.event, self.stream)
        })?;
        Ok(event)
    }

    /// Makes work enqueued on this stream after this call wait until `event` has completed
    /// (`cuStreamWaitEvent`); returns without blocking the host. `event` may come from another
    /// stream or GPU, and may be dropped right after this returns.
    ///
    /// # Errors
    /// [`Error::Cuda`].
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current; the stream and the event are live handles; flags must
        // be 0 (CU_EVENT_WAIT_DEFAULT).
        check("cuStreamWaitEvent", unsafe {
            dsys::cuStreamWaitEvent(self.stream, event.event, 0)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.owned {
            // Wrapped external stream: its owner destroys it.
            return;
        }
        if let Err(e) = self.ctx.bind() {
            tracing::warn!(target: "symcomm::cuda", error = %e, "stream not destroyed");
            return;
        }
        // SAFETY: the stream was created in this context and is destroyed exactly once; queued
        // work still completes (driver semantics).
        let r = unsafe { dsys::cuStreamDestroy_v2(self.stream) };
        if r != dsys::CUresult::CUDA_SUCCESS {
            tracing::warn!(target: "symcomm::cuda", error = ?r, "cuStreamDestroy failed");
        }
    }
}

/// A CUDA event recorded on a [`Stream`] ([`Stream::record_event`]); on drop it goes back to its
/// context's pool for the next `record_event` (or, with the pool full, is destroyed: the driver
/// defers that until the recorded work completed).
#[derive(Debug)]
pub struct Event {
    ctx: Arc<Context>,
    event: dsys::CUevent,
}

// SAFETY: event handles may be used from any thread (thread-safe driver API); the context is made
// current before each use.
unsafe impl Send for Event {}
// SAFETY: as for Send; `&self` methods only query or wait.
unsafe impl Sync for Event {}

impl Event {
    /// Blocks until the work recorded by the event has finished (`cuEventSynchronize`).
    ///
    /// # Errors
    /// [`Error::Cuda`]: a kernel fault of the recorded work.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current and the event is live.
        check("cuEventSynchronize", unsafe {
            dsys::cuEventSynchronize(self.event)
        })
    }

    /// Whether the recorded work has finished, without blocking (`cuEventQuery`).
    ///
    /// # Errors
    /// [`Error::Cuda`]: a kernel fault, as for [`Self::synchronize`].
    pub fn is_complete(&self) -> Result<bool> {
        self.ctx.bind()?;
        // SAFETY: the context is current and the event is live.
        done("cuEventQuery", unsafe { dsys::cuEventQuery(self.event) })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // Back to the pool: a later cuEventRecord re-records it; waits already enqueued on it
        // (cuStreamWaitEvent) keep the recording they saw.
        {
            let mut pool = self.ctx.events.lock().unwrap_or_else(|p| p.into_inner());
            if pool.len() < EVENT_POOL {
                pool.push(PooledEvent(self.event.expose_provenance()));
                return;
            }
        }
        if let Err(e) = self.ctx.bind() {
            tracing::warn!(target: "symcomm::cuda", error = %e, "event not destroyed");
            return;
        }
        // SAFETY: the event was created in this context and is destroyed exactly once; the driver
        // releases it once the recorded work completed.
        let r = unsafe { dsys::cuEventDestroy_v2(self.event) };
        if r != dsys::CUresult::CUDA_SUCCESS {
            tracing::warn!(target: "symcomm::cuda", error = ?r, "cuEventDestroy failed");
        }
    }
}

/// An executable CUDA graph: the work captured on a [`Stream`] ([`Stream::end_capture`]),
/// instantiated; launched with [`Stream::launch_graph`]. Dropping it destroys the executable
/// graph (`cuGraphExecDestroy`; the driver defers that until a running launch completed) and
/// the graph (`cuGraphDestroy`).
#[derive(Debug)]
pub struct Graph {
    ctx: Arc<Context>,
    /// Null until the capture ended.
    graph: dsys::CUgraph,
    /// Null until the graph was instantiated.
    exec: dsys::CUgraphExec,
    /// Nodes of the graph (`cuGraphGetNodes`).
    nodes: usize,
}

// SAFETY: graph handles may be used from any thread (thread-safe driver API); the context is made
// current before each use.
unsafe impl Send for Graph {}
// SAFETY: as for Send; `&self` methods only launch (the driver orders launches of one graph).
unsafe impl Sync for Graph {}

impl Graph {
    /// Nodes of the graph (kernel launches, copies, sets; a graph launched during the capture
    /// counts as one child-graph node).
    pub fn node_count(&self) -> usize {
        self.nodes
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind() {
            tracing::warn!(target: "symcomm::cuda", error = %e, "graph not destroyed");
            return;
        }
        if !self.exec.is_null() {
            // SAFETY: the executable graph was instantiated in this context and is destroyed
            // exactly once; a running launch of it completes first (driver semantics).
            let r = unsafe { dsys::cuGraphExecDestroy(self.exec) };
            if r != dsys::CUresult::CUDA_SUCCESS {
                tracing::warn!(target: "symcomm::cuda", error = ?r, "cuGraphExecDestroy failed");
            }
        }
        if !self.graph.is_null() {
            // SAFETY: the graph came from cuStreamEndCapture and is destroyed exactly once; the
            // executable graph made from it no longer depends on it.
            let r = unsafe { dsys::cuGraphDestroy(self.graph) };
            if r != dsys::CUresult::CUDA_SUCCESS {
                tracing::warn!(target: "symcomm::cuda", error = ?r, "cuGraphDestroy failed");
            }
        }
    }
}

/// The answer of a non-blocking query (`cuStreamQuery`, `cuEventQuery`): finished, not yet, or
/// the error it reports.
fn done(call: &'static str, r: dsys::CUresult) -> Result<bool> {
    match r {
        dsys::CUresult::CUDA_SUCCESS => Ok(true),
        dsys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        r => Err(cuda_error(call, r)),
    }
}

/// A host function queued on a stream ([`Stream::call_host`]); boxed, so that the driver gets a
/// thin pointer to it.
pub(crate) struct HostCallback(pub(crate) Box<dyn Fn() + Send + Sync>);

/// Runs a callback queued for one run, and frees it.
unsafe extern "C" fn run_owned_callback(data: *mut c_void) {
    // SAFETY: `call_host` passed `Arc::into_raw` of the callback, for this one run.
    let callback = unsafe { Arc::from_raw(data.cast_const().cast::<HostCallback>()) };
    run_callback(&callback);
}

/// Runs a callback that its owner (a graph) keeps alive.
unsafe extern "C" fn run_kept_callback(data: *mut c_void) {
    // SAFETY: `call_host` passed `Arc::as_ptr` of a callback that the caller keeps alive for
    // every run.
    let callback = unsafe { &*data.cast_const().cast::<HostCallback>() };
    run_callback(callback);
}

/// A panic must not unwind into the driver.
fn run_callback(callback: &HostCallback) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(&callback.0)).is_err() {
        tracing::error!(target: "symcomm::cuda", "a host function queued on a stream panicked");
    }
}

//! Streams ([`Stream`]) and the events that order them ([`Event`]).

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::ThreadId;

use super::graph::{CudaGraph, EmuGraph};
use super::{Graph, Kernel, KernelArgs, LaunchConfig, RetainFn, Retained, check_co_resident};
use crate::backend::cuda::{self, CudaDevice, CudaModule};
use crate::backend::emu::queue::{EmuEvent, EmuStream, HostFn};
use crate::backend::{Backend, PerBackend, on_backend};
use crate::tune::BackendKind;
use crate::{Error, Result};

#[cfg(doc)]
use super::Buffer;

/// An in-order queue of kernel launches on one backend.
///
/// A [`Stream`] is made for a [`Backend`] and runs what is enqueued on it in order (per-stream
/// FIFO), asynchronously to the caller: [`Stream::launch`] returns as soon as the launch is
/// queued, and [`Stream::synchronize`] waits for everything queued so far. Streams are
/// independent of each other unless ordered with [`Event`]s ([`Stream::record_event`],
/// [`Stream::wait_event`]).
///
/// - **CUDA**: a `CUstream` of the device's primary context (`CU_STREAM_NON_BLOCKING`), or an
///   external one wrapped with [`Stream::from_cuda_raw`]; launches are `cuLaunchKernel`, events
///   are CUDA events, and errors follow CUDA: a refused launch fails at [`Stream::launch`], a
///   fault while a kernel runs surfaces at the next synchronization.
/// - **Emulator**: a queue served by one worker thread per stream. A queued kernel launch runs
///   every CTA of the launch concurrently on CPU threads (as co-resident CTAs on a GPU) while the
///   caller goes on; the worker waits for the launch to finish before it starts the next item.
///   Kernels on different streams run concurrently, so ranks launched on one stream each (from
///   one host thread) can wait for one another, as ranks as streams do on a GPU. Every failure
///   on an emulator stream is *sticky*: the first error (a launch the emulator refuses, a failed
///   host item, a failed wait) is kept, later queued items are skipped, and
///   [`Stream::synchronize`] and every later enqueue return it. A stream in that state stays
///   unusable; make a new one. Dropping an emulator stream waits for its queued work.
///
/// Kernels are loaded once per backend with [`Kernel::load`] and take their parameters by value
/// from a [`KernelArgs`] builder, whose values the stream keeps until the launch ran. Besides
/// kernels, a stream runs raw device copies and sets ([`Stream::copy_raw`],
/// [`Stream::memset_raw`]) on ordinary device memory ([`Buffer`]) or windows.
///
/// **Graphs**: between [`Stream::begin_capture`] and [`Stream::end_capture`] a stream records
/// what is enqueued on it instead of running it; the resulting [`Graph`] replays the recorded
/// work with one call ([`Graph::launch`]), as often as needed. On CUDA this is stream capture
/// into a CUDA graph; on the emulator the recorded items are queued again on each launch. Kernels
/// whose state lives in device memory (the built-in kernels keep their epochs there) continue
/// across replays without host help.
///
/// `Send + Sync`: any thread may enqueue; items enqueued from several threads at once run in the
/// order the calls took effect. Dropping a stream waits for its queued work on the emulator; on
/// CUDA it returns at once (the driver finishes queued work), and a wrapped external stream
/// ([`Stream::from_cuda_raw`]) is left alive. A capture still open when the stream drops is
/// ended and its graph discarded.
pub struct Stream {
    /// The stream's entry in the registry of synchronizing frees (`crate::sync_free`); declared
    /// first so that it drops before the stream is destroyed.
    _frees: crate::sync_free::Registration,
    pub(super) inner: StreamInner,
    /// `Some` between [`Stream::begin_capture`] and [`Stream::end_capture`]. Held while work is
    /// recorded (and, on CUDA, while a launch is captured), so that a capture cannot end halfway
    /// through an enqueue.
    capture: Mutex<Option<Capture>>,
    /// This value's identity (see [`StreamToken`]). Declared last: dropped after the stream's
    /// teardown, which on the emulator waits for the queued work.
    token: Arc<StreamToken>,
}

/// The identity of one [`Stream`] value while it lives: bookkeeping that must end with the value
/// (a communicator's stream lanes) keeps a `Weak` to it, so that a dropped stream can never be
/// mistaken for a new one (its key may be reused, its token's allocation is not while a `Weak`
/// to it exists).
pub(crate) struct StreamToken(());

pub(super) type StreamInner = PerBackend<cuda::Stream, EmuStream>;

/// What a capturing stream has recorded so far.
pub(super) struct Capture {
    /// The thread that began the capture, the only one that may end it (CUDA's thread-local
    /// capture mode, kept on the emulator so that programs behave the same on both).
    thread: ThreadId,
    /// Emulator: the recorded items, in order.
    pub(super) items: Vec<HostFn>,
    /// CUDA: the modules of the recorded launches, which the graph keeps loaded.
    modules: Vec<Arc<CudaModule>>,
    /// What the recorded work uses and the graph keeps alive (see [`Retained`]).
    retained: Vec<Retained>,
}

impl Capture {
    pub(super) fn keep(&mut self, module: &Arc<CudaModule>) {
        if !self.modules.iter().any(|m| Arc::ptr_eq(m, module)) {
            self.modules.push(Arc::clone(module));
        }
    }

    pub(super) fn retain(&mut self, what: impl IntoIterator<Item = Retained>) {
        for r in what {
            if !self.retained.iter().any(|k| Arc::ptr_eq(k, &r)) {
                self.retained.push(r);
            }
        }
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Before the queue lock: the capture lock is always taken first.
        let capturing = self.is_capturing();
        match &self.inner {
            PerBackend::Cuda(s) => f
                .debug_struct("Stream::Cuda")
                .field("stream", s)
                .field("capturing", &capturing)
                .finish(),
            PerBackend::Emu(e) => {
                let st = e.progress();
                f.debug_struct("Stream::Emu")
                    .field("enqueued", &st.enqueued)
                    .field("completed", &st.completed)
                    .field("failed", &st.failed)
                    .field("capturing", &capturing)
                    .finish()
            }
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let open = self
            .capture
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let (Some(_), PerBackend::Cuda(s)) = (open, &self.inner) {
            // The driver's capture must end before the stream is destroyed; the graph is
            // discarded (recorded emulator items simply drop).
            if let Err(e) = s.end_capture() {
                tracing::warn!(target: "symcomm::stream", error = %e, "capture of a dropped stream not ended");
            }
        }
    }
}

impl Stream {
    /// A new stream: on CUDA a non-blocking `CUstream` of the device's primary context
    /// (`CU_STREAM_NON_BLOCKING`); on the emulator a queue with its own worker thread.
    ///
    /// # Errors
    /// [`Error::Cuda`]; [`Error::Io`] when the emulator's worker thread cannot be started.
    pub fn new(backend: &Backend) -> Result<Stream> {
        let inner = backend.make(CudaDevice::create_stream, EmuStream::new)?;
        Ok(Stream::with_inner(inner))
    }

    fn with_inner(inner: StreamInner) -> Stream {
        let probe: Arc<dyn crate::sync_free::StreamProbe> = match &inner {
            PerBackend::Cuda(s) => Arc::new(s.probe()),
            PerBackend::Emu(e) => e.probe(),
        };
        Stream {
            _frees: crate::sync_free::register(probe),
            inner,
            capture: Mutex::new(None),
            token: Arc::new(StreamToken(())),
        }
    }

    /// Wraps an existing `CUstream` of `device`'s primary context without owning it: dropping the
    /// returned stream neither destroys nor synchronizes it. This is how work of another CUDA
    /// library joins a symcomm stream order — for cudarc 0.19, pass
    /// `cudarc::driver::CudaStream::cu_stream()` as an integer
    /// (`Stream::from_cuda_raw(&device, cuda_stream.cu_stream() as u64)`), where the cudarc
    /// context is the same GPU's primary context (`cudarc::driver::CudaContext::new(ordinal)`
    /// retains it, as [`CudaDevice::open`] does). `handle` 0 is the legacy default stream.
    ///
    /// # Safety
    /// `handle` is 0 or a live `CUstream` created in `device`'s primary context, and its owner
    /// keeps it alive while the returned stream, or an [`Event`] recorded on it, is in use.
    /// Work that symcomm enqueues while another library captures the stream
    /// (`cuStreamBeginCapture` outside [`Self::begin_capture`]) goes into that library's graph,
    /// which symcomm does not see: its owner keeps the windows, buffers and communicator the
    /// recorded calls use alive until that graph's last launch finished.
    pub unsafe fn from_cuda_raw(device: &CudaDevice, handle: u64) -> Stream {
        // SAFETY: forwarded from this function's contract.
        let stream = unsafe { device.wrap_stream(handle) };
        Stream::with_inner(PerBackend::Cuda(stream))
    }

    /// The `CUstream` handle as an integer (0: the legacy default stream), for passing this
    /// stream to other CUDA libraries; `None` on the emulator. Valid while `self` lives.
    pub fn cuda_raw(&self) -> Option<u64> {
        self.inner.cuda().map(cuda::Stream::raw)
    }

    /// The CUDA stream underneath (for CUDA-only operations such as
    /// [`cuda::Stream::copy_device`]); `None` on the emulator.
    #[cfg(test)]
    pub(crate) fn as_cuda(&self) -> Option<&cuda::Stream> {
        self.inner.cuda()
    }

    /// The backend the stream belongs to.
    pub(crate) fn backend_kind(&self) -> BackendKind {
        self.inner.kind()
    }

    /// Whether this is an emulator stream.
    pub fn is_emu(&self) -> bool {
        self.inner.is_emu()
    }

    /// An identity for per-stream bookkeeping: two `Stream` values alive at the same time have
    /// the same key exactly when they enqueue to the same underlying stream (the same `CUstream`
    /// of one GPU — 0 for the legacy default stream — or the same emulator queue). A key may be
    /// reused once its stream is gone.
    pub fn key(&self) -> usize {
        match &self.inner {
            PerBackend::Cuda(s) => s.raw() as usize,
            PerBackend::Emu(e) => e.key(),
        }
    }

    /// This value's identity: unique among all `Stream` values ever created while a `Weak` to
    /// it is kept; it dies when the value drops (after its teardown).
    pub(crate) fn token(&self) -> &Arc<StreamToken> {
        &self.token
    }

    /// While this stream captures (through [`Self::begin_capture`]), makes the resulting graph
    /// keep `what` alive: until the graph drops and its last launch has finished (a graph that
    /// keeps something waits for that in its drop), and in graphs that launch it during their
    /// capture too. Returns whether it is kept: `false` when the stream is not capturing, or
    /// captures for someone else (a CUDA capture begun outside symcomm, whose graph it cannot
    /// reach).
    pub(crate) fn retain_for_graph(&self, what: Retained) -> bool {
        match self.capture().as_mut() {
            Some(c) => {
                c.retain(std::iter::once(what));
                true
            }
            None => false,
        }
    }

    pub(super) fn capture(&self) -> MutexGuard<'_, Option<Capture>> {
        // Only this module's short critical sections hold the lock; after a panic inside one
        // the capture state is still consistent.
        self.capture.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Refuses `what` while the stream is capturing.
    fn not_capturing(&self, what: &str) -> Result<()> {
        if self.is_capturing() {
            return Err(Error::InvalidArgument(format!(
                "{what} is not allowed while the stream is capturing a graph (end_capture first)"
            )));
        }
        Ok(())
    }

    /// Emulator: queues `item`, or records it while the stream is capturing. Either way a
    /// failed stream refuses it with its sticky error.
    fn submit(&self, emu: &EmuStream, item: HostFn, retain: RetainFn<'_>) -> Result<()> {
        let mut capture = self.capture();
        match capture.as_mut() {
            Some(c) => {
                emu.sticky()?;
                c.items.push(item);
                c.retain(retain());
                Ok(())
            }
            None => emu.push(item),
        }
    }

    /// Enqueues `kernel` with `config` and `args`, and returns without waiting for it to run
    /// (while capturing: records it).
    ///
    /// The argument values are copied (CUDA) or kept by the stream (emulator), so `args` may be
    /// dropped or changed once this returns; a captured launch keeps them for every replay.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty grid or block, a co-resident launch
    /// ([`LaunchConfig::co_resident`]) of more CTAs than the whole GPU holds at once, or a kernel
    /// loaded for another backend (or, on CUDA, another GPU, or with a parameter count the driver
    /// reports as different); nothing is queued then. On CUDA, [`Error::Cuda`] when the driver refuses the
    /// launch. On the emulator, the stream's sticky error if it has failed; a launch the
    /// emulator refuses ([`Error::Device`], e.g. more than 1024 threads per CTA) or a failure
    /// while the kernel runs surfaces at [`Self::synchronize`] and later calls.
    ///
    /// # Safety
    /// `args` holds exactly the kernel's parameters, in order and with their types, and every
    /// device address the kernel reaches through them (windows, signal areas, result buffers)
    /// stays valid until the launch has finished — until this stream is synchronized (or an
    /// event recorded after the launch completed). While capturing: until the last launch of
    /// the resulting [`Graph`] has finished.
    pub unsafe fn launch(
        &self,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &KernelArgs,
    ) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.launch_retaining(kernel, config, args, &Vec::new) }
    }

    /// [`Self::launch`], and when the launch is recorded into a capture, the graph keeps what
    /// `retain` returns alive (the host collectives' communicator, windows and buffers), so that
    /// safe code cannot free memory a replay uses.
    ///
    /// # Safety
    /// As [`Self::launch`], except for what `retain` keeps alive.
    pub(crate) unsafe fn launch_retaining(
        &self,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &KernelArgs,
        retain: RetainFn<'_>,
    ) -> Result<()> {
        let LaunchConfig {
            grid,
            block,
            shared_bytes,
            co_resident,
        } = config;
        if grid.contains(&0) || block.contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "empty launch of {}: grid {grid:?}, block {block:?}",
                kernel.name
            )));
        }
        if co_resident {
            let fits = kernel.resident_ctas(config.threads(), shared_bytes)?;
            check_co_resident(kernel, &config, fits, "the GPU holds")?;
        }
        // No synchronizing free runs while a launch is being enqueued (`crate::sync_free`).
        let _launching = crate::sync_free::launching();
        // The message is formatted only when the backends differ (launches are a hot path).
        match kernel.code.pair(
            &self.inner,
            format_args!("kernel {}", kernel.name),
            "the stream",
        )? {
            PerBackend::Cuda((module, stream)) => {
                let func = module.function(kernel.name)?;
                let mut ptrs = args.pointers();
                let mut capture = self.capture();
                // SAFETY: `ptrs` points into `args`, alive for this call, one pointer per
                // parameter (this function's contract); the driver copies the values before
                // returning and never writes through them. Device addresses stay valid until the
                // launch finished (contract).
                unsafe { stream.launch(&func, grid, block, shared_bytes, co_resident, &mut ptrs) }?;
                if let Some(c) = capture.as_mut() {
                    c.keep(module);
                    c.retain(retain());
                }
                Ok(())
            }
            PerBackend::Emu((k, emu)) => {
                let (name, k) = (kernel.name, k.clone());
                let occupancy = k.occupancy(config.threads(), shared_bytes)?;
                let args = args.clone();
                tracing::debug!(target: "symcomm::stream", kernel = name, ?grid, ?block, shared_bytes, occupancy, "enqueue emulator launch");
                let item: HostFn = Arc::new(move || {
                    let mut ptrs = args.pointers();
                    // SAFETY: `ptrs` points into `args`, owned by this closure for the whole
                    // blocking launch and read only by the kernel entry; that the values match
                    // the kernel's parameters and that the device addresses stay valid until the
                    // launch (or the last replay of a graph that recorded it) finished is the
                    // contract of `Stream::launch`.
                    unsafe { k.launch(name, occupancy, grid, block, shared_bytes, &mut ptrs) }
                });
                self.submit(emu, item, retain)
            }
        }
    }

    /// Enqueues a copy of `bytes` bytes from device address `src` to device address `dst`, in
    /// stream order, and returns without waiting (while capturing: records it). 0 bytes enqueue
    /// nothing. CUDA: `cuMemcpyDtoDAsync`; emulator: a queued `memcpy` of host memory (device
    /// addresses are host addresses there: [`Buffer::addr`], window and team addresses).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a null address, a range past the end of the address
    /// space, or overlapping ranges; nothing is enqueued then. [`Error::Cuda`]; the sticky
    /// error of a failed emulator stream.
    ///
    /// # Safety
    /// `[dst, dst + bytes)` and `[src, src + bytes)` are device memory of the stream's backend
    /// (on CUDA, of its GPU or memory it can reach) and stay valid until the copy has finished
    /// (while capturing: until the last launch of the resulting [`Graph`] has finished); no
    /// other work writes either range, or reads the destination, while the copy runs.
    pub unsafe fn copy_raw(&self, dst: u64, src: u64, bytes: u64) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.copy_raw_retaining(dst, src, bytes, &Vec::new) }
    }

    /// [`Self::copy_raw`], keeping what `retain` returns alive in a graph that records the copy
    /// (see [`Self::launch_retaining`]).
    ///
    /// # Safety
    /// As [`Self::copy_raw`], except for what `retain` keeps alive.
    pub(crate) unsafe fn copy_raw_retaining(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        retain: RetainFn<'_>,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let n = raw_range("copy_raw destination", dst, bytes)?;
        raw_range("copy_raw source", src, bytes)?;
        // Neither end overflows (checked above).
        if dst < src + bytes && src < dst + bytes {
            return Err(Error::InvalidArgument(format!(
                "copy_raw of {bytes} bytes between overlapping ranges at {dst:#x} and {src:#x}"
            )));
        }
        match &self.inner {
            PerBackend::Cuda(s) => {
                // Held across the copy, as for launches: a capture cannot end in between.
                let mut capture = self.capture();
                // SAFETY: forwarded from this function's contract; the ranges do not overlap
                // (checked above).
                unsafe { s.copy_raw(dst, src, n) }?;
                if let Some(c) = capture.as_mut() {
                    c.retain(retain());
                }
                Ok(())
            }
            PerBackend::Emu(emu) => self.submit(
                emu,
                Arc::new(move || {
                    // SAFETY: both ranges are `n` bytes of live host memory that nothing else
                    // accesses while the copy runs (this function's contract), and they do not
                    // overlap (checked); the addresses came from pointers whose provenance was
                    // exposed when they were turned into integers.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            std::ptr::with_exposed_provenance::<u8>(src as usize),
                            std::ptr::with_exposed_provenance_mut::<u8>(dst as usize),
                            n,
                        );
                    }
                    Ok(())
                }),
                retain,
            ),
        }
    }

    /// Enqueues setting `bytes` bytes at device address `dst` to `byte`, in stream order, and
    /// returns without waiting (while capturing: records it). 0 bytes enqueue nothing. CUDA:
    /// `cuMemsetD8Async`; emulator: a queued `memset` of host memory.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a null address or a range past the end of the address
    /// space; [`Error::Cuda`]; the sticky error of a failed emulator stream.
    ///
    /// # Safety
    /// As for [`Self::copy_raw`], for the one range `[dst, dst + bytes)`.
    pub unsafe fn memset_raw(&self, dst: u64, byte: u8, bytes: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let n = raw_range("memset_raw destination", dst, bytes)?;
        match &self.inner {
            // SAFETY: forwarded from this function's contract.
            PerBackend::Cuda(s) => unsafe { s.memset_raw(dst, byte, n) },
            PerBackend::Emu(emu) => self.submit(
                emu,
                Arc::new(move || {
                    // SAFETY: the range is `n` bytes of live host memory that nothing else
                    // accesses while the set runs (this function's contract); the address came
                    // from a pointer whose provenance was exposed.
                    unsafe {
                        std::ptr::write_bytes(
                            std::ptr::with_exposed_provenance_mut::<u8>(dst as usize),
                            byte,
                            n,
                        );
                    }
                    Ok(())
                }),
                &Vec::new,
            ),
        }
    }

    /// Enqueues a host function that runs in stream order (after everything queued before it,
    /// before everything queued after it), on the emulator's worker thread. An `Err` (or a
    /// panic) fails the stream like a failed launch. Emulator only: the staging copies and
    /// bookkeeping of emulator collectives.
    ///
    /// While capturing, the function is recorded and runs once per launch of the resulting
    /// [`Graph`] (never during the capture) — hence `Fn`: keep state that must change from run
    /// to run behind a lock or an atomic.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on a CUDA stream; the sticky error of a failed emulator stream.
    pub fn enqueue_host<F>(&self, f: F) -> Result<()>
    where
        F: Fn() -> Result<()> + Send + Sync + 'static,
    {
        // A host function may wait for peers' work, as a kernel does: it is queued as a launch
        // is, never while a synchronizing free runs (`crate::sync_free`), whose context sync
        // would otherwise wait for it while holding off the launches it may wait for.
        let _launching = crate::sync_free::launching();
        match &self.inner {
            PerBackend::Emu(emu) => self.submit(emu, Arc::new(f), &Vec::new),
            PerBackend::Cuda(_) => Err(Error::InvalidArgument(
                "host functions can only be enqueued on emulator streams".to_owned(),
            )),
        }
    }

    /// Enqueues `f` to run on the host in stream order: after everything queued before it has
    /// finished, before anything queued after it starts. CUDA: `cuLaunchHostFunc`, on a driver
    /// thread — so `f` must not call CUDA, nor wait for work that is not ordered before it, and
    /// whatever it drops must not either; emulator: the stream's worker. A panic in `f` is
    /// caught and logged (CUDA) or fails the stream (emulator).
    ///
    /// While capturing, `f` is recorded and runs on every launch of the graph, which keeps it;
    /// in a capture begun outside symcomm (CUDA), `f` is kept for the life of the process.
    ///
    /// # Errors
    /// [`Error::Cuda`]; the sticky error of a failed emulator stream.
    pub(crate) fn call_host<F>(&self, f: F) -> Result<()>
    where
        F: Fn() + Send + Sync + 'static,
    {
        // What a host function starts may wait for peers, as a kernel does: a synchronizing
        // free must not slip in between (`crate::sync_free`).
        let _launching = crate::sync_free::launching();
        match &self.inner {
            PerBackend::Cuda(s) => {
                // Held across the call, as for launches: a capture cannot end in between.
                let mut capture = self.capture();
                let callback = Arc::new(cuda::HostCallback(Box::new(f)));
                if let Some(c) = capture.as_mut() {
                    s.call_host(Arc::clone(&callback), false)?;
                    c.retain([callback as Retained]);
                } else if s.is_capturing() {
                    s.call_host(Arc::clone(&callback), false)?;
                    // No graph of ours to keep it: it lives as long as the process.
                    std::mem::forget(callback);
                } else {
                    s.call_host(callback, true)?;
                }
                Ok(())
            }
            PerBackend::Emu(emu) => self.submit(
                emu,
                Arc::new(move || {
                    f();
                    Ok(())
                }),
                &Vec::new,
            ),
        }
    }

    /// Enqueues a wait until the 32-bit word at device address `addr` holds `value`: later work
    /// of the stream starts only then. CUDA: `cuStreamWaitValue32` (`EQ`), which has no bound of
    /// its own — whoever writes the word must guarantee that it does; emulator: a host item
    /// polling the word, which fails the stream with `timeout` after `bound`.
    ///
    /// # Errors
    /// [`Error::Cuda`]; the sticky error of a failed emulator stream.
    ///
    /// # Safety
    /// `addr` is a 4-aligned word of device-mapped host memory (emulator: host memory) that
    /// stays allocated until the wait finished (while capturing: for every launch of the graph).
    pub(crate) unsafe fn wait_word(
        &self,
        addr: u64,
        value: u32,
        bound: std::time::Duration,
        timeout: Error,
    ) -> Result<()> {
        // The wait depends on other work, as a kernel waiting for peers does (`crate::sync_free`:
        // a synchronizing free must not start while it is being queued).
        let _launching = crate::sync_free::launching();
        match &self.inner {
            PerBackend::Cuda(s) => {
                let _capture = self.capture();
                // SAFETY: forwarded from this function's contract.
                unsafe { s.wait_word(addr, value) }
            }
            PerBackend::Emu(emu) => self.submit(
                emu,
                Arc::new(move || {
                    // SAFETY: a live, aligned word (this function's contract), accessed
                    // atomically by every party.
                    let word = unsafe { emu_word(addr) };
                    // Sleeps until a host thread says it wrote a word (`words_written`), looking
                    // again at least every millisecond.
                    let start = std::time::Instant::now();
                    let (lock, written) = &WORDS_WRITTEN;
                    let mut seen = lock.lock().unwrap_or_else(PoisonError::into_inner);
                    while word.load(std::sync::atomic::Ordering::Acquire) != value {
                        if start.elapsed() >= bound {
                            return Err(timeout.clone());
                        }
                        seen = written
                            .wait_timeout(seen, std::time::Duration::from_millis(1))
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                    }
                    Ok(())
                }),
                &Vec::new,
            ),
        }
    }

    /// Enqueues storing `value` into the 32-bit word at device address `addr`, after everything
    /// queued before it. CUDA: `cuStreamWriteValue32`; emulator: an atomic release store.
    ///
    /// # Errors
    /// [`Error::Cuda`]; the sticky error of a failed emulator stream.
    ///
    /// # Safety
    /// As for [`Self::wait_word`], until the store ran.
    pub(crate) unsafe fn write_word(&self, addr: u64, value: u32) -> Result<()> {
        match &self.inner {
            PerBackend::Cuda(s) => {
                let _capture = self.capture();
                // SAFETY: forwarded from this function's contract.
                unsafe { s.write_word(addr, value) }
            }
            PerBackend::Emu(emu) => self.submit(
                emu,
                Arc::new(move || {
                    // SAFETY: as for `wait_word`.
                    let word = unsafe { emu_word(addr) };
                    word.store(value, std::sync::atomic::Ordering::Release);
                    Ok(())
                }),
                &Vec::new,
            ),
        }
    }

    /// Blocks until all work enqueued on this stream so far has finished.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] while the stream is capturing (on CUDA the driver would
    /// invalidate the capture). The first failure of the stream's work: on CUDA [`Error::Cuda`]
    /// (a kernel fault); on the emulator the sticky error (a refused launch, a failed host
    /// function or wait).
    pub fn synchronize(&self) -> Result<()> {
        self.not_capturing("synchronize")?;
        on_backend!(&self.inner, s => s.synchronize())
    }

    /// Whether all work enqueued so far has finished, without blocking (a host watchdog's poll).
    ///
    /// # Errors
    /// As [`Self::synchronize`] (so [`Error::InvalidArgument`] while capturing).
    pub fn is_idle(&self) -> Result<bool> {
        self.not_capturing("is_idle")?;
        on_backend!(&self.inner, s => s.is_idle())
    }

    /// Records an event that completes when all work enqueued on this stream so far has
    /// finished.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] while the stream is capturing; [`Error::Cuda`]; on the
    /// emulator, the sticky error of a failed stream.
    pub fn record_event(&self) -> Result<Event> {
        self.not_capturing("record_event")?;
        let inner = match &self.inner {
            PerBackend::Cuda(s) => PerBackend::Cuda(s.record_event()?),
            PerBackend::Emu(s) => PerBackend::Emu(s.record_event()?),
        };
        Ok(Event { inner })
    }

    /// Makes work enqueued on this stream after this call wait until `event` completed, without
    /// blocking the caller. `event` may be dropped once this returns.
    ///
    /// On the emulator the wait is a queued item; if the work `event` recorded failed, this
    /// stream fails with the same error.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `event` comes from a stream of the other backend, or
    /// while this stream is capturing; [`Error::Cuda`]; the sticky error of a failed emulator
    /// stream.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.not_capturing("wait_event")?;
        let pair = event.inner.pair(&self.inner, "the event", "the stream")?;
        on_backend!(pair, (e, s) => s.wait_event(e))
    }

    /// Starts capturing: from now on [`Self::launch`], [`Self::copy_raw`],
    /// [`Self::memset_raw`], [`Self::enqueue_host`] and [`Graph::launch`] on this stream record
    /// their work instead of running it, until [`Self::end_capture`] turns the record into a
    /// [`Graph`]. Work enqueued before this call runs as usual. While capturing,
    /// [`Self::synchronize`], [`Self::is_idle`], [`Self::record_event`] and
    /// [`Self::wait_event`] are refused. An enqueue refused while capturing (an empty grid, ...)
    /// returns its error at once and records nothing; the capture goes on.
    ///
    /// The capture belongs to the calling thread: only it may end it. On CUDA this is
    /// `cuStreamBeginCapture` in `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`, so until the capture ends
    /// that thread must not make calls the driver forbids during a capture — synchronous copies
    /// such as [`Buffer::write`] / [`Buffer::read`], synchronizing the device or another stream
    /// (the driver returns `CUDA_ERROR_STREAM_CAPTURE_*` and invalidates the capture, which
    /// [`Self::end_capture`] then reports).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the stream is already capturing; the sticky error of a
    /// failed emulator stream; [`Error::Cuda`] (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` for the
    /// legacy default stream, or a stream another library is capturing).
    pub fn begin_capture(&self) -> Result<()> {
        let mut capture = self.capture();
        if capture.is_some() {
            return Err(Error::InvalidArgument(
                "begin_capture: the stream is already capturing a graph".to_owned(),
            ));
        }
        match &self.inner {
            PerBackend::Cuda(s) => s.begin_capture()?,
            PerBackend::Emu(emu) => emu.sticky()?,
        }
        *capture = Some(Capture {
            thread: std::thread::current().id(),
            items: Vec::new(),
            modules: Vec::new(),
            retained: Vec::new(),
        });
        Ok(())
    }

    /// Ends the capture begun by [`Self::begin_capture`] on this thread and returns what was
    /// recorded as a [`Graph`] (on CUDA: `cuStreamEndCapture` + `cuGraphInstantiateWithFlags`).
    /// The stream then runs work as usual again. Nothing recorded has run.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the stream is not capturing, or when called on another
    /// thread than the one that began the capture (the capture goes on then). On CUDA,
    /// [`Error::Cuda`] when the driver invalidated the capture (`CUDA_ERROR_STREAM_CAPTURE_*`:
    /// an operation it forbids happened during the capture) or cannot instantiate the graph;
    /// the capture has ended then.
    pub fn end_capture(&self) -> Result<Graph> {
        let mut capture = self.capture();
        let recorded = match capture.take() {
            None => {
                return Err(Error::InvalidArgument(
                    "end_capture: the stream is not capturing (begin_capture first)".to_owned(),
                ));
            }
            Some(c) if c.thread != std::thread::current().id() => {
                *capture = Some(c);
                return Err(Error::InvalidArgument(
                    "end_capture must be called on the thread that called begin_capture; the \
                     capture goes on"
                        .to_owned(),
                ));
            }
            Some(c) => c,
        };
        let inner = match &self.inner {
            PerBackend::Cuda(s) => PerBackend::Cuda(CudaGraph {
                exec: s.end_capture()?,
                modules: recorded.modules,
                last: Mutex::new(None),
            }),
            PerBackend::Emu(_) => PerBackend::Emu(EmuGraph {
                items: recorded.items,
                last: Mutex::new(None),
            }),
        };
        Ok(Graph {
            inner,
            retained: recorded.retained,
        })
    }

    /// Whether the stream is capturing: between [`Self::begin_capture`] and
    /// [`Self::end_capture`], or on CUDA in a capture begun by anyone else (PyTorch's graphs, the
    /// user's own `cuStreamBeginCapture`), as the driver reports (`cuStreamIsCapturing`).
    pub fn is_capturing(&self) -> bool {
        self.capture().is_some() || self.inner.cuda().is_some_and(cuda::Stream::is_capturing)
    }
}

/// Emulator: the word at device address `addr` (host memory there), as [`Stream::wait_word`]
/// and [`Stream::write_word`] access it.
///
/// # Safety
/// `addr` is a live, 4-aligned word, accessed only atomically while the reference lives.
unsafe fn emu_word<'a>(addr: u64) -> &'a std::sync::atomic::AtomicU32 {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        std::sync::atomic::AtomicU32::from_ptr(std::ptr::with_exposed_provenance_mut::<u32>(
            addr as usize,
        ))
    }
}

/// Emulator: what a stream's wait on a word ([`Stream::wait_word`]) sleeps on.
static WORDS_WRITTEN: (Mutex<()>, std::sync::Condvar) = (Mutex::new(()), std::sync::Condvar::new());

/// Wakes the emulator's stream waits on words ([`Stream::wait_word`]): a host thread calls it
/// after it stored into a word a stream may wait on. (On CUDA the GPU polls the word itself.)
pub(crate) fn words_written() {
    let (lock, written) = &WORDS_WRITTEN;
    // Taken, so that a waiter between its look at the word and its sleep cannot miss this.
    drop(lock.lock().unwrap_or_else(PoisonError::into_inner));
    written.notify_all();
}

/// The address range `[addr, addr + bytes)` of a raw copy or set as a length in bytes; refuses
/// null addresses and ranges past the end of the address space. `bytes` is not 0.
fn raw_range(what: &str, addr: u64, bytes: u64) -> Result<usize> {
    let end = addr.checked_add(bytes);
    match (addr, end, usize::try_from(bytes)) {
        (1.., Some(_), Ok(n)) => Ok(n),
        _ => Err(Error::InvalidArgument(format!(
            "{what}: {bytes} bytes at {addr:#x} is not a valid address range"
        ))),
    }
}

/// A point in a [`Stream`]'s work ([`Stream::record_event`]): complete once everything enqueued
/// on that stream before the event has finished. Other streams wait for it with
/// [`Stream::wait_event`]; the host with [`Event::synchronize`] or [`Event::is_complete`].
pub struct Event {
    inner: EventInner,
}

type EventInner = PerBackend<cuda::Event, EmuEvent>;

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            PerBackend::Cuda(e) => f.debug_tuple("Event::Cuda").field(e).finish(),
            PerBackend::Emu(e) => f
                .debug_struct("Event::Emu")
                .field("ticket", &e.ticket())
                .finish(),
        }
    }
}

impl Event {
    /// Blocks until the recorded work has finished.
    ///
    /// # Errors
    /// The failure of the recorded work (on CUDA a kernel fault; on the emulator the stream's
    /// error if it failed at or before the event).
    pub fn synchronize(&self) -> Result<()> {
        on_backend!(&self.inner, e => e.synchronize())
    }

    /// Whether the recorded work has finished, without blocking.
    ///
    /// # Errors
    /// As [`Self::synchronize`].
    pub fn is_complete(&self) -> Result<bool> {
        on_backend!(&self.inner, e => e.is_complete())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{Duration, Instant};

    use symcomm_device::abi::{SYMCOMM_STATUS_OK, SYMCOMM_STATUS_TIMEOUT};

    use super::super::test_support::{PING_PONG, enqueued, gate, is_invalid, serial, words};
    use super::*;
    use crate::DEVICE_IMAGE;
    use crate::backend::emu::EmuTeam;
    use crate::backend::emu::queue::WORKER_NAME;
    use crate::stream::Buffer;

    /// A 3-word result buffer the kernel writes through its device address.
    fn result_buf() -> Arc<[AtomicU32; 3]> {
        Arc::new([AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0)])
    }

    fn read(buf: &[AtomicU32; 3]) -> [u32; 3] {
        [0, 1, 2].map(|i| buf[i].load(Ordering::Acquire))
    }

    fn ping_pong_args(
        team: &mut EmuTeam,
        rank: u32,
        timeout_ns: u64,
        rounds: u32,
        words: u32,
        result: &[AtomicU32; 3],
    ) -> KernelArgs {
        KernelArgs::new()
            .arg(&team.dev_comm(rank, timeout_ns))
            .arg(&team.window(rank))
            .arg(&rounds)
            .arg(&words)
            .arg(&(result.as_ptr() as u64))
    }

    #[test]
    fn ranks_on_separate_streams_run_concurrently() {
        let _g = serial();
        let (rounds, words, launches) = (4u32, 64u32, 3usize);
        let mut team = EmuTeam::new(2, u64::from(words) * 4).unwrap();
        let kernel = Kernel::load(&Backend::Emu, &DEVICE_IMAGE, PING_PONG).unwrap();
        assert_eq!(kernel.name(), PING_PONG);
        let results: Vec<Vec<Arc<[AtomicU32; 3]>>> = (0..2)
            .map(|_| (0..launches).map(|_| result_buf()).collect())
            .collect();
        let streams = [
            Stream::new(&Backend::Emu).unwrap(),
            Stream::new(&Backend::Emu).unwrap(),
        ];
        let config = LaunchConfig::linear(1, 32);
        let timeout = 20_000_000_000;
        // Rank 0's launches go first; they cannot finish before rank 1's start, so the launch
        // call must return while the kernel is still running.
        for result in &results[0] {
            let args = ping_pong_args(&mut team, 0, timeout, rounds, words, result);
            // SAFETY: the arguments match symcomm_ping_pong(DevComm, WindowHandleRaw, u32, u32,
            // u32*); the team and the result buffers outlive the streams' work (synchronized
            // below before anything is dropped).
            unsafe { streams[0].launch(&kernel, config, &args) }.unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(!streams[0].is_idle().unwrap(), "rank 0 waits for rank 1");
        for result in &results[1] {
            let args = ping_pong_args(&mut team, 1, timeout, rounds, words, result);
            // SAFETY: as above.
            unsafe { streams[1].launch(&kernel, config, &args) }.unwrap();
        }
        for s in &streams {
            s.synchronize().unwrap();
            assert!(s.is_idle().unwrap());
        }
        for (rank, per_rank) in results.iter().enumerate() {
            for (launch, r) in per_rank.iter().enumerate() {
                assert_eq!(
                    read(r),
                    [SYMCOMM_STATUS_OK, 0, rounds],
                    "rank {rank} launch {launch}: [status, #wrong, rounds]"
                );
            }
        }
    }

    /// A free that synchronizes (inline here: every stream idle) holds off launches while it
    /// runs, and its context sync waits for everything queued on every stream. A host function
    /// queued meanwhile that waits for a launch (as one waiting for a peer's kernel does) must
    /// wait for the free instead; queued inside it, the free waited for the function, which
    /// waited for a launch the free held off: 3 s here (the function's own bound), a hang in
    /// general (before: `device_across_hosts` saw a call block for its stream's whole hold).
    #[test]
    fn host_functions_are_not_queued_inside_a_synchronizing_free() {
        let _g = serial();
        let (held, other) = (
            Stream::new(&Backend::Emu).unwrap(),
            Stream::new(&Backend::Emu).unwrap(),
        );
        let (started, running) = std::sync::mpsc::channel();
        let freer = std::thread::spawn(move || {
            crate::sync_free::release(Box::new(move || {
                started.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(200));
                crate::sync_free::emulated_context_sync();
            }));
        });
        running.recv().unwrap();
        let launched = Arc::new(AtomicU32::new(0));
        let t = Instant::now();
        let seen = Arc::clone(&launched);
        held.enqueue_host(move || {
            let deadline = Instant::now() + Duration::from_secs(3);
            while seen.load(Ordering::Acquire) == 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(())
        })
        .unwrap();
        let set = Arc::clone(&launched);
        other
            .call_host(move || set.store(1, Ordering::Release))
            .unwrap();
        let elapsed = t.elapsed();
        freer.join().unwrap();
        held.synchronize().unwrap();
        other.synchronize().unwrap();
        assert!(
            elapsed < Duration::from_millis(1500),
            "queuing a host function and then a launch took {elapsed:?}"
        );
    }

    #[test]
    fn work_runs_in_order_with_kernels() {
        let _g = serial();
        let mut team = EmuTeam::new(1, 64).unwrap();
        let kernel = Kernel::load(&Backend::Emu, &DEVICE_IMAGE, PING_PONG).unwrap();
        let stream = Stream::new(&Backend::Emu).unwrap();
        let log = Arc::new(Mutex::new(Vec::<String>::new()));
        let result = result_buf();
        let push = |s: &'static str| {
            let log = Arc::clone(&log);
            move || {
                log.lock().unwrap().push(s.to_owned());
                Ok(())
            }
        };
        stream
            .enqueue_host({
                let f = push("first");
                move || {
                    std::thread::sleep(Duration::from_millis(50));
                    f()
                }
            })
            .unwrap();
        let args = ping_pong_args(&mut team, 0, 20_000_000_000, 3, 16, &result);
        // SAFETY: as in `ranks_on_separate_streams_run_concurrently`; one rank rings to itself.
        unsafe { stream.launch(&kernel, LaunchConfig::linear(1, 4), &args) }.unwrap();
        {
            let (log, result) = (Arc::clone(&log), Arc::clone(&result));
            stream
                .enqueue_host(move || {
                    // Runs after the kernel finished: its result is there.
                    log.lock()
                        .unwrap()
                        .push(format!("after kernel {:?}", read(&result)));
                    Ok(())
                })
                .unwrap();
        }
        stream.enqueue_host(push("last")).unwrap();
        stream.synchronize().unwrap();
        assert_eq!(
            *log.lock().unwrap(),
            ["first", "after kernel [0, 0, 3]", "last"]
        );
    }

    #[test]
    fn errors_are_sticky_and_later_work_is_skipped() {
        let _g = serial();
        let mut team = EmuTeam::new(1, 64).unwrap();
        let kernel = Kernel::load(&Backend::Emu, &DEVICE_IMAGE, PING_PONG).unwrap();
        let stream = Stream::new(&Backend::Emu).unwrap();
        let result = result_buf();
        let args = ping_pong_args(&mut team, 0, 1_000_000_000, 1, 4, &result);

        // Empty dimensions are refused before anything is queued; the stream stays usable.
        // SAFETY: refused before queueing.
        let e = unsafe { stream.launch(&kernel, LaunchConfig::linear(0, 32), &args) }.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        stream.synchronize().unwrap();

        let ran = Arc::new(AtomicU32::new(0));
        stream
            .enqueue_host(|| {
                std::thread::sleep(Duration::from_millis(200));
                Ok(())
            })
            .unwrap();
        // Over CUDA's 1024 threads per CTA: queued, then refused by the emulator.
        // SAFETY: the arguments match the kernel; the launch is refused before it runs.
        unsafe { stream.launch(&kernel, LaunchConfig::linear(1, 2048), &args) }.unwrap();
        {
            let ran = Arc::clone(&ran);
            stream
                .enqueue_host(move || {
                    ran.store(1, Ordering::SeqCst);
                    Ok(())
                })
                .unwrap();
        }
        let e = stream.synchronize().unwrap_err();
        assert!(
            matches!(e, Error::Device(symcomm_device::Error::EmuLaunch { .. })),
            "{e}"
        );
        assert!(e.to_string().contains(PING_PONG), "{e}");
        assert_eq!(
            ran.load(Ordering::SeqCst),
            0,
            "work after the failure is skipped"
        );
        // Sticky: later launches, host items, events and synchronizations fail the same way.
        // SAFETY: refused (the stream has failed).
        let again = unsafe { stream.launch(&kernel, LaunchConfig::linear(1, 1), &args) };
        assert_eq!(again.unwrap_err().to_string(), e.to_string());
        assert!(stream.enqueue_host(|| Ok(())).is_err());
        assert!(stream.record_event().is_err());
        assert!(stream.is_idle().is_err());
        assert_eq!(stream.synchronize().unwrap_err().to_string(), e.to_string());
        assert_eq!(read(&result), [0, 0, 0], "the refused kernel never ran");
    }

    #[test]
    fn failed_host_items_and_panics_fail_the_stream() {
        let _g = serial();
        let stream = Stream::new(&Backend::Emu).unwrap();
        let before = stream.record_event().unwrap();
        stream
            .enqueue_host(|| Err(Error::InvalidArgument("staging failed".into())))
            .unwrap();
        let after = stream.record_event();
        let e = stream.synchronize().unwrap_err();
        assert_eq!(e.to_string(), "invalid argument: staging failed");
        before.synchronize().unwrap();
        // Recorded before the failure was known (or refused once it was): either way it fails.
        if let Ok(after) = after {
            assert!(after.synchronize().is_err());
            assert!(after.is_complete().is_err());
        }

        let stream = Stream::new(&Backend::Emu).unwrap();
        stream.enqueue_host(|| panic!("boom")).unwrap();
        let e = stream.synchronize().unwrap_err();
        assert!(e.to_string().contains("panicked: boom"), "{e}");
    }

    #[test]
    fn sticky_errors_keep_their_variant_and_source() {
        let _g = serial();
        // Any variant (before `Error: Clone`, those the stream could not copy came back as an
        // emulator launch error with their message).
        let stream = Stream::new(&Backend::Emu).unwrap();
        stream
            .enqueue_host(|| {
                Err(Error::PeerLost {
                    rank: 3,
                    reason: "gone".into(),
                })
            })
            .unwrap();
        for e in [
            stream.synchronize().unwrap_err(),
            stream.enqueue_host(|| Ok(())).unwrap_err(),
            stream.is_idle().unwrap_err(),
        ] {
            assert!(
                matches!(&e, Error::PeerLost { rank: 3, reason } if reason == "gone"),
                "{e:?}"
            );
        }
        // An I/O error comes back with its source, shared rather than rebuilt from its text.
        let stream = Stream::new(&Backend::Emu).unwrap();
        stream
            .enqueue_host(|| {
                Err(Error::io(
                    "waiting",
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                ))
            })
            .unwrap();
        let (Error::Io { source: first, .. }, Error::Io { source: again, .. }) = (
            stream.synchronize().unwrap_err(),
            stream.synchronize().unwrap_err(),
        ) else {
            panic!("not I/O errors");
        };
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(first.kind(), std::io::ErrorKind::TimedOut);
        assert!(
            Error::Io {
                what: "waiting".into(),
                source: first
            }
            .is_timeout()
        );
    }

    #[test]
    fn events_order_streams() {
        let _g = serial();
        let a = Stream::new(&Backend::Emu).unwrap();
        let b = Stream::new(&Backend::Emu).unwrap();
        let log = Arc::new(Mutex::new(Vec::<&str>::new()));
        {
            let log = Arc::clone(&log);
            a.enqueue_host(move || {
                std::thread::sleep(Duration::from_millis(100));
                log.lock().unwrap().push("a");
                Ok(())
            })
            .unwrap();
        }
        let event = a.record_event().unwrap();
        assert!(!event.is_complete().unwrap());
        b.wait_event(&event).unwrap();
        {
            let log = Arc::clone(&log);
            b.enqueue_host(move || {
                log.lock().unwrap().push("b");
                Ok(())
            })
            .unwrap();
        }
        let start = Instant::now();
        b.synchronize().unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(50),
            "b waited for a"
        );
        assert_eq!(*log.lock().unwrap(), ["a", "b"]);
        assert!(event.is_complete().unwrap());
        event.synchronize().unwrap();
        // An event of the stream itself, and one with nothing before it.
        a.wait_event(&a.record_event().unwrap()).unwrap();
        let empty = Stream::new(&Backend::Emu).unwrap().record_event().unwrap();
        assert!(empty.is_complete().unwrap());
        b.wait_event(&empty).unwrap();
        b.synchronize().unwrap();
    }

    #[test]
    fn a_failed_event_fails_the_waiting_stream() {
        let _g = serial();
        let a = Stream::new(&Backend::Emu).unwrap();
        let b = Stream::new(&Backend::Emu).unwrap();
        a.enqueue_host(|| {
            std::thread::sleep(Duration::from_millis(50));
            Err(Error::InvalidArgument("upstream".into()))
        })
        .unwrap();
        let event = a.record_event().unwrap();
        b.wait_event(&event).unwrap();
        let e = b.synchronize().unwrap_err();
        assert_eq!(e.to_string(), "invalid argument: upstream");
        assert!(a.synchronize().is_err());
    }

    #[test]
    fn timeouts_are_reported_by_the_kernel_not_the_stream() {
        let _g = serial();
        // Rank 1 of a 2-rank team never launches: rank 0 times out, which the kernel records in
        // its result (the stream itself succeeds).
        let mut team = EmuTeam::new(2, 64).unwrap();
        let kernel = Kernel::load(&Backend::Emu, &DEVICE_IMAGE, PING_PONG).unwrap();
        let stream = Stream::new(&Backend::Emu).unwrap();
        let result = result_buf();
        let args = ping_pong_args(&mut team, 0, 100_000_000, 1, 4, &result);
        // SAFETY: as in `ranks_on_separate_streams_run_concurrently`.
        unsafe { stream.launch(&kernel, LaunchConfig::linear(1, 2), &args) }.unwrap();
        stream.synchronize().unwrap();
        assert_eq!(read(&result)[0], SYMCOMM_STATUS_TIMEOUT);
    }

    #[test]
    fn emulator_streams_have_no_cuda_handle() {
        let _g = serial();
        let s = Stream::new(&Backend::Emu).unwrap();
        assert!(s.is_emu());
        assert_eq!(s.cuda_raw(), None);
        assert!(s.as_cuda().is_none());
        assert!(format!("{s:?}").contains("Emu"), "{s:?}");
    }

    /// Worker threads of emulator streams alive in this process, and all threads.
    fn threads() -> (usize, usize) {
        let mut named = 0;
        let mut all = 0;
        for entry in std::fs::read_dir("/proc/self/task").unwrap() {
            let entry = entry.unwrap();
            all += 1;
            // A thread may exit between the listing and the read.
            if let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) {
                named += usize::from(comm.trim_end() == WORKER_NAME);
            }
        }
        (named, all)
    }

    #[test]
    fn dropped_streams_leave_no_threads() {
        let _g = serial();
        let (named_before, all_before) = threads();
        let streams: Vec<Stream> = (0..50)
            .map(|_| Stream::new(&Backend::Emu).unwrap())
            .collect();
        // A worker names itself when it starts: once it has run an item, it is counted.
        for s in &streams {
            s.enqueue_host(|| Ok(())).unwrap();
            s.synchronize().unwrap();
        }
        let (named_live, all_live) = threads();
        assert_eq!(named_live, named_before + 50);
        assert!(all_live >= all_before + 50);
        drop(streams);
        // Drop joined every worker, so nothing is left to wait for. The workers are counted
        // exactly by name; the total only up to the test harness's and other modules' tests'
        // threads, which may start or end meanwhile.
        let (named_after, all_after) = threads();
        assert_eq!(
            named_after, named_before,
            "stream workers outlived their streams"
        );
        assert!(
            all_after <= all_before + 4,
            "{all_after} threads after dropping 50 streams, {all_before} before them"
        );
    }

    #[test]
    fn raw_copies_and_sets_run_in_stream_order() {
        let _g = serial();
        let mut team = EmuTeam::new(1, 64).unwrap();
        let kernel = Kernel::load(&Backend::Emu, &DEVICE_IMAGE, PING_PONG).unwrap();
        let stream = Stream::new(&Backend::Emu).unwrap();
        let a = Arc::new(Buffer::new(&Backend::Emu, 64).unwrap());
        let b = Buffer::new(&Backend::Emu, 64).unwrap();
        let result = Buffer::new(&Backend::Emu, 16).unwrap();
        let pattern: [u32; 16] = std::array::from_fn(|i| i as u32 + 1);
        // The host item holds the stream until the test has checked that nothing ran yet.
        let (release, gate) = gate();
        {
            let a = Arc::clone(&a);
            stream
                .enqueue_host(move || {
                    gate();
                    a.write(0, &pattern)
                })
                .unwrap();
        }
        // SAFETY: all ranges lie inside `a`, `b` and `result`, which outlive the stream's work
        // (synchronized below); nothing else touches them meanwhile.
        unsafe {
            stream.copy_raw(b.addr(), a.addr(), 64).unwrap();
            stream.memset_raw(a.addr() + 16, 0xab, 16).unwrap();
            // Set the result words to garbage: the kernel must overwrite them (it needs them
            // zeroed, which the next set does).
            stream.memset_raw(result.addr(), 0xff, 12).unwrap();
            stream.memset_raw(result.addr(), 0, 12).unwrap();
        }
        assert!(
            !stream.is_idle().unwrap(),
            "the copies wait for the host item"
        );
        assert_eq!(
            words::<16>(&b, 0),
            [0; 16],
            "enqueued copies return without running"
        );
        drop(release);
        let args = KernelArgs::new()
            .arg(&team.dev_comm(0, 20_000_000_000))
            .arg(&team.window(0))
            .arg(&3u32)
            .arg(&16u32)
            .arg(&result.addr());
        // SAFETY: the arguments match symcomm_ping_pong; the team and `result` outlive the
        // launch (synchronized below).
        unsafe { stream.launch(&kernel, LaunchConfig::linear(1, 4), &args) }.unwrap();
        // After the kernel: its result lands in `b`'s last 12 bytes.
        // SAFETY: as above.
        unsafe { stream.copy_raw(b.addr() + 52, result.addr(), 12) }.unwrap();
        // Zero bytes: nothing is enqueued, not even for a null address.
        let before = enqueued(&stream);
        // SAFETY: nothing is accessed.
        unsafe {
            stream.copy_raw(0, 0, 0).unwrap();
            stream.memset_raw(0, 1, 0).unwrap();
        }
        assert_eq!(enqueued(&stream), before);
        stream.synchronize().unwrap();

        // `b` got the pattern written by the host item (not the zeros before it), then the
        // kernel's result; the set after the copy did not reach `b`.
        let mut expect_b = pattern;
        expect_b[13..].copy_from_slice(&[SYMCOMM_STATUS_OK, 0, 3]);
        assert_eq!(words::<16>(&b, 0), expect_b);
        let mut a_bytes = [0u8; 64];
        a.read(0, &mut a_bytes).unwrap();
        for (i, &byte) in a_bytes.iter().enumerate() {
            let want = if (16..32).contains(&i) {
                0xab
            } else {
                pattern[i / 4].to_ne_bytes()[i % 4]
            };
            assert_eq!(byte, want, "byte {i} of a");
        }
        assert_eq!(words::<3>(&result, 0), [SYMCOMM_STATUS_OK, 0, 3]);

        // Refused before anything is queued; the stream stays usable.
        // SAFETY: every call is refused before it touches memory.
        unsafe {
            is_invalid(stream.copy_raw(a.addr(), a.addr() + 8, 16), "overlapping");
            is_invalid(stream.copy_raw(a.addr() + 8, a.addr(), 9), "overlapping");
            is_invalid(stream.copy_raw(0, a.addr(), 4), "copy_raw destination");
            is_invalid(stream.copy_raw(a.addr(), 0, 4), "copy_raw source");
            is_invalid(
                stream.memset_raw(u64::MAX - 2, 0, 4),
                "memset_raw destination",
            );
        }
        assert_eq!(enqueued(&stream), before);
        // Adjacent ranges do not overlap.
        // SAFETY: both ranges lie inside `a`; synchronized below.
        unsafe { stream.copy_raw(a.addr() + 8, a.addr(), 8) }.unwrap();
        stream.synchronize().unwrap();
        assert_eq!(words::<4>(&a, 0), [1, 2, 1, 2]);
    }
}

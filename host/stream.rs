//! Streams, events, graphs, kernels and buffers for both backends (the contract users see is on
//! [`Stream`]).

use std::alloc::Layout;
use std::any::Any;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{JoinHandle, ThreadId};

use symcomm_device::abi::{CollArgs, DevComm, ErrorRecord, WindowHandleRaw};
use symcomm_device::emu::EmuEntry;
use symcomm_device::image::{DeviceImage, KernelReport};

use crate::backend::Backend;
use crate::backend::cuda::{self, CudaDevice, CudaModule, DeviceBuffer};
use crate::{DevicePlain, Error, Result};

// ---------------------------------------------------------------------------------------------
// Kernel arguments
// ---------------------------------------------------------------------------------------------

/// A value that may be passed to a kernel by value, byte for byte ([`KernelArgs::arg`]).
///
/// # Safety
/// Implementors are plain data: `Copy`, no padding bytes (every byte of a value is initialized),
/// alignment at most 8, and no pointers to host state whose lifetime a launch could outlive
/// (device addresses are passed as `u64`). The type's layout is the one the kernel parameter
/// expects (`#[repr(C)]` twins of the C++ structs).
pub unsafe trait KernelArg: Copy + 'static {}

macro_rules! kernel_arg {
    ($($t:ty),*) => {$(
        // SAFETY: primitive integers and floats have no padding and alignment <= 8; the ABI
        // structs are all-integer `repr(C)` with no padding and alignment 8, pinned by the layout
        // assertions in abi.h and abi.rs, and carry device addresses as `u64`.
        unsafe impl KernelArg for $t {}
    )*};
}
kernel_arg!(
    u8,
    u16,
    u32,
    u64,
    i8,
    i16,
    i32,
    i64,
    f32,
    f64,
    DevComm,
    WindowHandleRaw,
    CollArgs,
    ErrorRecord
);

/// Kernel parameters, by value, in order: `KernelArgs::new().arg(&comm).arg(&win).arg(&n)`.
///
/// Owns copies of the values (each stored at an 8-byte-aligned offset), so a builder may be
/// dropped or reused right after [`Stream::launch`] returns: the stream keeps what it needs
/// until the launch ran. The types must match the kernel's parameters one for one; nothing
/// checks that on the emulator (CUDA checks the count when the driver reports it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelArgs {
    /// The values' bytes; u64 words give every value 8-byte alignment.
    words: Vec<u64>,
    /// Index in `words` where each value starts.
    starts: Vec<usize>,
}

impl KernelArgs {
    /// No parameters yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `value` as the next parameter (builder style).
    #[must_use]
    pub fn arg<T: KernelArg>(mut self, value: &T) -> Self {
        self.push(value);
        self
    }

    /// Appends `value` as the next parameter.
    pub fn push<T: KernelArg>(&mut self, value: &T) -> &mut Self {
        const {
            assert!(
                std::mem::align_of::<T>() <= 8,
                "kernel arguments are at most 8-aligned"
            )
        };
        let size = std::mem::size_of::<T>();
        let start = self.words.len();
        self.words.resize(start + size.div_ceil(8).max(1), 0);
        // SAFETY: the destination is the `size.div_ceil(8)` words just added (at least `size`
        // bytes, owned by `self.words`); the source is `size` initialized bytes (KernelArg: no
        // padding); the two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                std::ptr::from_ref(value).cast::<u8>(),
                self.words.as_mut_ptr().add(start).cast::<u8>(),
                size,
            );
        }
        self.starts.push(start);
        self
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// Whether there are no parameters.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// One pointer per parameter, as `cuLaunchKernel` and the emulator take them; valid while
    /// `self` is neither moved nor changed.
    ///
    /// The pointers are `*mut` only because that is the C signature: the CUDA driver copies the
    /// values and the emulator's entry points read them, so nothing writes through them.
    fn pointers(&self) -> Vec<*mut c_void> {
        let base = self.words.as_ptr();
        self.starts
            .iter()
            .map(|&start| base.wrapping_add(start).cast_mut().cast::<c_void>())
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Launch configuration and kernels
// ---------------------------------------------------------------------------------------------

/// The shape of a launch: CTAs (`grid`), threads per CTA (`block`) and dynamic shared memory per
/// CTA in bytes. Every dimension must be at least 1; the backend enforces CUDA's limits (1024
/// threads per CTA, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// CTAs in x, y, z.
    pub grid: [u32; 3],
    /// Threads per CTA in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory per CTA, in bytes.
    pub shared_bytes: u32,
    /// Every CTA of the launch must be resident at once (grid-scope code: CTAs wait for one
    /// another, or for peers' CTAs). Checked before launching: [`Stream::launch`] against the
    /// whole GPU (CUDA: a cooperative launch, `cuLaunchCooperativeKernel`), and
    /// [`Communicator::launch`](crate::Communicator::launch) against this rank's share when
    /// ranks share the GPU; a grid beyond it is refused with the budget named.
    pub co_resident: bool,
}

impl LaunchConfig {
    /// `ctas` CTAs of `threads` threads each, in x only, without dynamic shared memory.
    pub fn linear(ctas: u32, threads: u32) -> Self {
        LaunchConfig {
            grid: [ctas, 1, 1],
            block: [threads, 1, 1],
            shared_bytes: 0,
            co_resident: false,
        }
    }

    /// The same launch, with every CTA required to be resident at once (see
    /// [`LaunchConfig::co_resident`](#structfield.co_resident)).
    #[must_use]
    pub fn co_resident(self) -> Self {
        LaunchConfig {
            co_resident: true,
            ..self
        }
    }

    /// CTAs in the grid.
    pub fn ctas(&self) -> u64 {
        self.grid.iter().map(|&d| u64::from(d)).product()
    }

    /// Threads per CTA.
    pub fn threads(&self) -> u32 {
        self.block.iter().product()
    }

    /// The same launch with `bytes` of dynamic shared memory per CTA.
    #[must_use]
    pub fn with_shared_bytes(self, bytes: u32) -> Self {
        LaunchConfig {
            shared_bytes: bytes,
            ..self
        }
    }
}

/// A kernel of an embedded [`DeviceImage`], loaded for one backend; launched with
/// [`Stream::launch`] on streams of the same backend (and, for CUDA, the same GPU).
///
/// Cheap to clone. On CUDA each `load` loads the kernel's module into the GPU (kept until the
/// last clone drops), so load once and reuse; each launch looks the entry up in the module
/// (`cuModuleGetFunction`, a table lookup in the driver).
#[derive(Debug, Clone)]
pub struct Kernel {
    name: &'static str,
    code: KernelCode,
}

#[derive(Debug, Clone)]
enum KernelCode {
    Cuda(Arc<CudaModule>),
    Emu(EmuKernel),
}

/// A kernel's emulator entry and what the emulator's residency needs to know of it.
#[derive(Debug, Clone, Copy)]
struct EmuKernel {
    entry: EmuEntry,
    /// The kernel's sm_90 ptxas report (registers, static shared memory), when nvcc built it.
    report: Option<&'static KernelReport>,
}

/// The emulated GPU every emulator rank of a process runs on.
const EMU_GPU: u32 = 0;

impl Kernel {
    /// Loads kernel `name` of `image` for `backend`: on CUDA, its module (fatbin, or NVRTC
    /// fallback); on the emulator, its emulator entry point.
    ///
    /// # Errors
    /// [`Error::UnknownKernel`] when `image` has no kernel `name` (or its loaded module lacks
    /// it); on CUDA, [`Error::Cuda`] / [`Error::Nvrtc`] when the module cannot be loaded.
    pub fn load(backend: &Backend, image: &'static DeviceImage, name: &str) -> Result<Kernel> {
        let (module, kernel) = image
            .module_of(name)
            .ok_or_else(|| Error::UnknownKernel(name.to_owned()))?;
        let code = match backend {
            Backend::Cuda(device) => {
                let loaded = device.load_module(image, module)?;
                // Fails early (UnknownKernel) if the loaded code lacks the entry.
                loaded.function(kernel.name)?;
                KernelCode::Cuda(Arc::new(loaded))
            }
            Backend::Emu => KernelCode::Emu(EmuKernel {
                entry: kernel.emu_entry,
                report: image
                    .report
                    .iter()
                    .find(|r| r.kernel == kernel.name && r.arch == "sm_90"),
            }),
        };
        Ok(Kernel {
            name: kernel.name,
            code,
        })
    }

    /// The kernel's entry name.
    pub fn name(&self) -> &str {
        self.name
    }

    /// CTAs of `threads` threads with `shared_bytes` of dynamic shared memory that one SM holds
    /// at once: `cuOccupancyMaxActiveBlocksPerMultiprocessor` on CUDA; on the emulator what
    /// the sm_90 rules give for the kernel's ptxas report (1 without one), at most the emulated
    /// GPU's room per SM.
    ///
    /// # Errors
    /// [`Error::Cuda`] when the driver refuses the query; [`Error::Device`] for a malformed
    /// `SYMCOMM_EMU_SMS` / `SYMCOMM_EMU_CTAS_PER_SM`.
    pub fn occupancy(&self, threads: u32, shared_bytes: u32) -> Result<u32> {
        match &self.code {
            KernelCode::Cuda(module) => {
                module.function(self.name)?.occupancy(threads, shared_bytes)
            }
            KernelCode::Emu(k) => {
                let gpu = symcomm_device::emu::query_gpu(EMU_GPU)?;
                Ok(
                    crate::residency::emu_occupancy(k.report, threads, shared_bytes)
                        .min(gpu.ctas_per_sm),
                )
            }
        }
    }

    /// CTAs of `threads` threads with `shared_bytes` of dynamic shared memory that the whole GPU
    /// holds at once ([`Kernel::occupancy`] x SMs), for every rank on it together.
    ///
    /// # Errors
    /// As [`Kernel::occupancy`].
    pub fn resident_ctas(&self, threads: u32, shared_bytes: u32) -> Result<u32> {
        let per_sm = self.occupancy(threads, shared_bytes)?;
        let sms = match &self.code {
            KernelCode::Cuda(module) => module.sm_count()?,
            KernelCode::Emu(_) => symcomm_device::emu::query_gpu(EMU_GPU)?.sms,
        };
        Ok(per_sm.saturating_mul(sms))
    }
}

/// Refuses a co-resident launch of more CTAs than `fits` (`whose` says whose budget that is).
pub(crate) fn check_co_resident(
    kernel: &Kernel,
    config: &LaunchConfig,
    fits: u32,
    whose: &str,
) -> Result<()> {
    if config.ctas() > u64::from(fits) {
        return Err(Error::InvalidArgument(format!(
            "co-resident launch of {} with {} CTAs of {} threads ({} B dynamic shared memory): \
             {whose} {fits} such CTAs at once, so CTAs that wait for one another would wait \
             forever; launch at most {fits}",
            kernel.name,
            config.ctas(),
            config.threads(),
            config.shared_bytes
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The emulator's queue
// ---------------------------------------------------------------------------------------------

/// Work queued on an emulator stream. `Fn` and shared, so that a graph can queue one recorded
/// item again on every launch.
type HostFn = Arc<dyn Fn() -> Result<()> + Send + Sync + 'static>;

/// Name of emulator stream worker threads (what `/proc/<pid>/task/*/comm` shows).
const WORKER_NAME: &str = "symcomm-stream";

/// State shared by an emulator stream, its worker thread, its events and the streams that wait
/// on those events.
struct Queue {
    state: Mutex<QueueState>,
    /// Signalled when an item is queued or the stream closes (the worker waits on it).
    work: Condvar,
    /// Signalled when an item completed (synchronize, events and waiting streams wait on it).
    progress: Condvar,
}

struct QueueState {
    items: VecDeque<HostFn>,
    /// Items ever queued; item k (1-based) is the k-th queued.
    enqueued: u64,
    /// Items run or skipped, in order: items `1..=completed` are done.
    completed: u64,
    /// The first failure: the failed item's number and its error.
    error: Option<(u64, Error)>,
    /// The stream is dropping: the worker exits once `items` is empty.
    closing: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // Items run outside the lock, so a poisoned lock only means a panic inside this module's
        // short critical sections; the state is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `item`, unless the stream has failed.
    fn push(&self, item: HostFn) -> Result<()> {
        self.push_all(std::iter::once(item)).map(|_| ())
    }

    /// Queues `items` back to back (no other enqueue comes between them), unless the stream has
    /// failed; returns the ticket of the last one (the current ticket if there are none).
    fn push_all(&self, items: impl IntoIterator<Item = HostFn>) -> Result<u64> {
        let mut st = self.lock();
        if let Some((_, e)) = &st.error {
            return Err(replicate(e));
        }
        for item in items {
            st.items.push_back(item);
            st.enqueued += 1;
        }
        let ticket = st.enqueued;
        drop(st);
        self.work.notify_one();
        Ok(ticket)
    }

    /// The stream's error, if it failed.
    fn sticky(&self) -> Result<()> {
        match &self.lock().error {
            Some((_, e)) => Err(replicate(e)),
            None => Ok(()),
        }
    }

    /// Blocks until items `1..=ticket` are done; fails with the error of the first failed one
    /// among them.
    fn wait_for(&self, ticket: u64) -> Result<()> {
        let mut st = self.lock();
        while st.completed < ticket {
            st = self
                .progress
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
        match &st.error {
            Some((failed, e)) if *failed <= ticket => Err(replicate(e)),
            _ => Ok(()),
        }
    }

    /// Whether items `1..=ticket` are done, failing as [`Self::wait_for`].
    fn reached(&self, ticket: u64) -> Result<bool> {
        let st = self.lock();
        match &st.error {
            Some((failed, e)) if *failed <= ticket => Err(replicate(e)),
            _ => Ok(st.completed >= ticket),
        }
    }

    /// The worker: runs items in order until the stream closes and the queue is empty.
    fn serve(&self) {
        loop {
            let (item, ticket, failed) = {
                let mut st = self.lock();
                loop {
                    if let Some(item) = st.items.pop_front() {
                        break (item, st.completed + 1, st.error.is_some());
                    }
                    if st.closing {
                        return;
                    }
                    st = self.work.wait(st).unwrap_or_else(PoisonError::into_inner);
                }
            };
            // After a failure later work is skipped (it may depend on the failed item) but still
            // counted, so that waiters on this stream finish.
            let result = if failed { Ok(()) } else { run_item(&item) };
            let mut st = self.lock();
            st.completed = ticket;
            if let Err(e) = result {
                tracing::debug!(target: "symcomm::stream", item = ticket, error = %e, "emulator stream failed");
                st.error.get_or_insert((ticket, e));
            }
            drop(st);
            self.progress.notify_all();
        }
    }
}

impl crate::sync_free::StreamProbe for Queue {
    fn idle(&self) -> bool {
        let st = self.lock();
        st.completed >= st.enqueued
    }

    fn settle(&self, deadline: std::time::Instant) -> bool {
        let mut st = self.lock();
        let ticket = st.enqueued;
        while st.completed < ticket {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .progress
                .wait_timeout(st, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}

/// Runs one queued item; a panic inside it becomes an error, so the worker lives on and waiters
/// are released.
fn run_item(item: &HostFn) -> Result<()> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| item())) {
        Ok(result) => result,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string payload".to_owned());
            Err(Error::Device(symcomm_device::Error::EmuLaunch {
                kernel: "<host function>".to_owned(),
                message: format!("panicked: {what}"),
            }))
        }
    }
}

/// A copy of `e`, for the sticky error that every later call on a failed stream returns (the
/// error type is not `Clone`: it may hold an `io::Error`, copied here by kind and message).
///
/// Exact for the errors stream work produces (launch, driver, emulator, host-function and I/O
/// errors); any other variant a host function returns is reported with its message under
/// [`Error::Device`].
fn replicate(e: &Error) -> Error {
    match e {
        Error::NoDriver(s) => Error::NoDriver(s.clone()),
        Error::Cuda { call, error } => Error::Cuda {
            call,
            error: error.clone(),
        },
        Error::Nvrtc { call, error } => Error::Nvrtc {
            call,
            error: error.clone(),
        },
        Error::UnknownKernel(s) => Error::UnknownKernel(s.clone()),
        Error::InvalidArgument(s) => Error::InvalidArgument(s.clone()),
        Error::Timeout {
            rank,
            peer,
            op,
            detail,
        } => Error::Timeout {
            rank: *rank,
            peer: *peer,
            op,
            detail: detail.clone(),
        },
        Error::Aborted {
            rank,
            peer,
            op,
            detail,
        } => Error::Aborted {
            rank: *rank,
            peer: *peer,
            op,
            detail: detail.clone(),
        },
        Error::Device(d) => Error::Device(replicate_device(d)),
        Error::Io { what, source } => Error::Io {
            what: what.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        other => Error::Device(symcomm_device::Error::EmuLaunch {
            kernel: "<stream work>".to_owned(),
            message: other.to_string(),
        }),
    }
}

fn replicate_device(e: &symcomm_device::Error) -> symcomm_device::Error {
    use symcomm_device::Error as D;
    match e {
        D::EmuLaunch { kernel, message } => D::EmuLaunch {
            kernel: kernel.clone(),
            message: message.clone(),
        },
        D::ToolStart { tool, path, source } => D::ToolStart {
            tool,
            path: path.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        D::CompileFailed {
            tool,
            what,
            status,
            stderr,
        } => D::CompileFailed {
            tool,
            what: what.clone(),
            status: status.clone(),
            stderr: stderr.clone(),
        },
        D::Spills {
            kernel,
            arch,
            stores,
            loads,
        } => D::Spills {
            kernel: kernel.clone(),
            arch: arch.clone(),
            stores: *stores,
            loads: *loads,
        },
        D::Io { path, source } => D::Io {
            path: path.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        D::MissingEnv(v) => D::MissingEnv(v),
        // A variant added to the device crate later: keep its message.
        other => D::EmuLaunch {
            kernel: "<stream>".to_owned(),
            message: other.to_string(),
        },
    }
}

/// An emulator stream: the shared queue and its worker thread.
struct EmuStream {
    queue: Arc<Queue>,
    worker: Option<JoinHandle<()>>,
}

impl EmuStream {
    fn new() -> Result<Self> {
        let queue = Arc::new(Queue {
            state: Mutex::new(QueueState {
                items: VecDeque::new(),
                enqueued: 0,
                completed: 0,
                error: None,
                closing: false,
            }),
            work: Condvar::new(),
            progress: Condvar::new(),
        });
        let served = Arc::clone(&queue);
        let worker = std::thread::Builder::new()
            .name(WORKER_NAME.to_owned())
            .spawn(move || served.serve())
            .map_err(|source| Error::Io {
                what: "starting an emulator stream's worker thread".to_owned(),
                source,
            })?;
        Ok(EmuStream {
            queue,
            worker: Some(worker),
        })
    }
}

impl Drop for EmuStream {
    fn drop(&mut self) {
        self.queue.lock().closing = true;
        self.queue.work.notify_all();
        if let Some(worker) = self.worker.take() {
            if worker.thread().id() == std::thread::current().id() {
                // Dropped by one of its own items: the worker exits by itself once the queue is
                // empty (joining itself would deadlock).
                return;
            }
            if worker.join().is_err() {
                tracing::warn!(target: "symcomm::stream", "emulator stream worker panicked");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Streams and events
// ---------------------------------------------------------------------------------------------

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
    inner: StreamInner,
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

enum StreamInner {
    Cuda(cuda::Stream),
    Emu(EmuStream),
}

/// What a capturing stream has recorded so far.
struct Capture {
    /// The thread that began the capture, the only one that may end it (CUDA's thread-local
    /// capture mode, kept on the emulator so that programs behave the same on both).
    thread: ThreadId,
    /// Emulator: the recorded items, in order.
    items: Vec<HostFn>,
    /// CUDA: the modules of the recorded launches, which the graph keeps loaded.
    modules: Vec<Arc<CudaModule>>,
    /// What the recorded work uses and the graph keeps alive (see [`Retained`]).
    retained: Vec<Retained>,
}

/// Something recorded work uses (a communicator, a window's mapping, a buffer's memory) that a
/// [`Graph`] keeps alive for as long as it can be launched, and past its last launch.
pub(crate) type Retained = Arc<dyn Any + Send + Sync>;

/// What a piece of work uses, produced only when the work is recorded into a capture.
pub(crate) type RetainFn<'k> = &'k dyn Fn() -> Vec<Retained>;

impl Capture {
    fn keep(&mut self, module: &Arc<CudaModule>) {
        if !self.modules.iter().any(|m| Arc::ptr_eq(m, module)) {
            self.modules.push(Arc::clone(module));
        }
    }

    fn retain(&mut self, what: impl IntoIterator<Item = Retained>) {
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
            StreamInner::Cuda(s) => f
                .debug_struct("Stream::Cuda")
                .field("stream", s)
                .field("capturing", &capturing)
                .finish(),
            StreamInner::Emu(e) => {
                let st = e.queue.lock();
                f.debug_struct("Stream::Emu")
                    .field("enqueued", &st.enqueued)
                    .field("completed", &st.completed)
                    .field("failed", &st.error.is_some())
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
        if let (Some(_), StreamInner::Cuda(s)) = (open, &self.inner) {
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
        let inner = match backend {
            Backend::Cuda(device) => StreamInner::Cuda(device.create_stream()?),
            Backend::Emu => StreamInner::Emu(EmuStream::new()?),
        };
        Ok(Stream::with_inner(inner))
    }

    fn with_inner(inner: StreamInner) -> Stream {
        let probe: Arc<dyn crate::sync_free::StreamProbe> = match &inner {
            StreamInner::Cuda(s) => Arc::new(s.probe()),
            StreamInner::Emu(e) => e.queue.clone(),
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
        Stream::with_inner(StreamInner::Cuda(stream))
    }

    /// The `CUstream` handle as an integer (0: the legacy default stream), for passing this
    /// stream to other CUDA libraries; `None` on the emulator. Valid while `self` lives.
    pub fn cuda_raw(&self) -> Option<u64> {
        match &self.inner {
            StreamInner::Cuda(s) => Some(s.raw()),
            StreamInner::Emu(_) => None,
        }
    }

    /// The CUDA stream underneath (for CUDA-only operations such as
    /// [`cuda::Stream::copy_device`]); `None` on the emulator.
    #[cfg(test)]
    pub(crate) fn as_cuda(&self) -> Option<&cuda::Stream> {
        match &self.inner {
            StreamInner::Cuda(s) => Some(s),
            StreamInner::Emu(_) => None,
        }
    }

    /// Whether this is an emulator stream.
    pub fn is_emu(&self) -> bool {
        matches!(self.inner, StreamInner::Emu(_))
    }

    /// An identity for per-stream bookkeeping: two `Stream` values alive at the same time have
    /// the same key exactly when they enqueue to the same underlying stream (the same `CUstream`
    /// of one GPU — 0 for the legacy default stream — or the same emulator queue). A key may be
    /// reused once its stream is gone.
    pub fn key(&self) -> usize {
        match &self.inner {
            StreamInner::Cuda(s) => s.raw() as usize,
            StreamInner::Emu(e) => Arc::as_ptr(&e.queue).expose_provenance(),
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

    fn capture(&self) -> MutexGuard<'_, Option<Capture>> {
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
                emu.queue.sticky()?;
                c.items.push(item);
                c.retain(retain());
                Ok(())
            }
            None => emu.queue.push(item),
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
        match (&self.inner, &kernel.code) {
            (StreamInner::Cuda(stream), KernelCode::Cuda(module)) => {
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
            (StreamInner::Emu(emu), KernelCode::Emu(k)) => {
                let name = kernel.name;
                let entry = k.entry;
                let occupancy = kernel.occupancy(config.threads(), shared_bytes)?;
                let args = args.clone();
                tracing::debug!(target: "symcomm::stream", kernel = name, ?grid, ?block, shared_bytes, occupancy, "enqueue emulator launch");
                let item: HostFn = Arc::new(move || {
                    let mut ptrs = args.pointers();
                    // SAFETY: `ptrs` points into `args`, owned by this closure for the whole
                    // blocking launch and read only by the kernel entry; that the values match
                    // the kernel's parameters and that the device addresses stay valid until the
                    // launch (or the last replay of a graph that recorded it) finished is the
                    // contract of `Stream::launch`.
                    unsafe {
                        symcomm_device::emu::launch_on(
                            EMU_GPU,
                            occupancy,
                            name,
                            entry,
                            grid,
                            block,
                            shared_bytes as usize,
                            &mut ptrs,
                        )
                    }?;
                    Ok(())
                });
                self.submit(emu, item, retain)
            }
            (StreamInner::Cuda(_), KernelCode::Emu(_)) => Err(Error::InvalidArgument(format!(
                "kernel {} was loaded for the emulator, the stream is a CUDA stream",
                kernel.name
            ))),
            (StreamInner::Emu(_), KernelCode::Cuda(_)) => Err(Error::InvalidArgument(format!(
                "kernel {} was loaded for CUDA, the stream is an emulator stream",
                kernel.name
            ))),
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
            StreamInner::Cuda(s) => {
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
            StreamInner::Emu(emu) => self.submit(
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
            StreamInner::Cuda(s) => unsafe { s.memset_raw(dst, byte, n) },
            StreamInner::Emu(emu) => self.submit(
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
        match &self.inner {
            StreamInner::Emu(emu) => self.submit(emu, Arc::new(f), &Vec::new),
            StreamInner::Cuda(_) => Err(Error::InvalidArgument(
                "host functions can only be enqueued on emulator streams".to_owned(),
            )),
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
        match &self.inner {
            StreamInner::Cuda(s) => s.synchronize(),
            StreamInner::Emu(emu) => {
                let target = emu.queue.lock().enqueued;
                emu.queue.wait_for(target)?;
                emu.queue.sticky()
            }
        }
    }

    /// Whether all work enqueued so far has finished, without blocking (a host watchdog's poll).
    ///
    /// # Errors
    /// As [`Self::synchronize`] (so [`Error::InvalidArgument`] while capturing).
    pub fn is_idle(&self) -> Result<bool> {
        self.not_capturing("is_idle")?;
        match &self.inner {
            StreamInner::Cuda(s) => s.is_idle(),
            StreamInner::Emu(emu) => {
                let st = emu.queue.lock();
                match &st.error {
                    Some((_, e)) => Err(replicate(e)),
                    None => Ok(st.completed >= st.enqueued),
                }
            }
        }
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
            StreamInner::Cuda(s) => EventInner::Cuda(s.record_event()?),
            StreamInner::Emu(emu) => {
                let st = emu.queue.lock();
                if let Some((_, e)) = &st.error {
                    return Err(replicate(e));
                }
                EventInner::Emu {
                    queue: Arc::clone(&emu.queue),
                    ticket: st.enqueued,
                }
            }
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
        match (&self.inner, &event.inner) {
            (StreamInner::Cuda(s), EventInner::Cuda(e)) => s.wait_event(e),
            (StreamInner::Emu(emu), EventInner::Emu { queue, ticket }) => {
                if Arc::ptr_eq(&emu.queue, queue) {
                    // Recorded on this stream: in-order execution already waits for it.
                    return emu.queue.sticky();
                }
                let (other, ticket) = (Arc::clone(queue), *ticket);
                emu.queue.push(Arc::new(move || other.wait_for(ticket)))
            }
            _ => Err(Error::InvalidArgument(
                "an event of one backend cannot order a stream of the other (CUDA / emulator)"
                    .to_owned(),
            )),
        }
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
            StreamInner::Cuda(s) => s.begin_capture()?,
            StreamInner::Emu(emu) => emu.queue.sticky()?,
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
            StreamInner::Cuda(s) => GraphInner::Cuda {
                exec: s.end_capture()?,
                modules: recorded.modules,
                last: Mutex::new(None),
            },
            StreamInner::Emu(_) => GraphInner::Emu {
                items: recorded.items,
                last: Mutex::new(None),
            },
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
        self.capture().is_some() || matches!(&self.inner, StreamInner::Cuda(s) if s.is_capturing())
    }
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

// ---------------------------------------------------------------------------------------------
// Graphs
// ---------------------------------------------------------------------------------------------

/// Work recorded on a [`Stream`] between [`Stream::begin_capture`] and [`Stream::end_capture`],
/// replayed with [`Graph::launch`] on any stream of the same backend (and, on CUDA, GPU).
///
/// Each launch runs the recorded items once more, in the recorded order, as one unit in the
/// target stream's order: after the work enqueued before it, before the work enqueued after it.
/// Runs of one graph never overlap: a launch also waits for the previous launch of the same graph
/// on another stream (as CUDA orders launches of one executable graph). Kernel arguments, copy
/// and set addresses are the recorded ones; state that must change from run to run lives in
/// device memory (as the built-in kernels' epochs do) or behind the host functions' own locks.
///
/// - **CUDA**: an instantiated CUDA graph (`cuGraphLaunch`); it keeps the recorded kernels'
///   modules loaded. Dropping it destroys the executable graph (the driver defers that until
///   a running launch completed) and the graph; drop it only after its launches have finished if
///   no [`Kernel`] keeps their modules loaded.
/// - **Emulator**: the recorded items, queued again on each launch; a running launch keeps them
///   alive, so the graph may drop at any time. A recorded item that fails fails the stream it
///   runs on (its sticky error), as queued work does.
///
/// **What recorded collectives use stays alive.** A graph that captured host collectives or
/// send/recv ([`Communicator`](crate::Communicator)'s) holds what they use: the communicator
/// (its signal area, control block and staging windows), the windows' mappings and the
/// [`Buffer`]s' memory. So a [`Window`](crate::Window) or [`Buffer`] dropped while such a graph
/// exists stays mapped (allocated) until the graph drops, and every launch of the graph finds
/// it. Dropping such a graph waits for its last launch first (bounded: symcomm's kernels wait
/// at most the device timeout), then releases what it holds, which the last holder frees. A
/// graph launched into another capture passes what it holds on to the outer graph. Work
/// recorded by captures symcomm did not begin (another library's `cuStreamBeginCapture` on a
/// wrapped stream, see [`Stream::from_cuda_raw`]) is outside this: its owner keeps the memory
/// alive.
/// It also keeps their stream's lane (see [streams and lanes](crate::Communicator#streams-and-lanes)) in use while it
/// exists, so that the lane's next stream never runs beside a replay.
///
/// `Send + Sync`: it may be launched from any thread.
pub struct Graph {
    inner: GraphInner,
    /// What the recorded work uses (see the type's docs); after `inner` in drop order.
    retained: Vec<Retained>,
}

enum GraphInner {
    Cuda {
        /// Declared first: destroyed before the modules its kernel nodes use are unloaded.
        exec: cuda::Graph,
        modules: Vec<Arc<CudaModule>>,
        /// Recorded after the latest launch while the graph retains something: its drop waits
        /// for it (launches of one executable graph run one after the other).
        last: Mutex<Option<cuda::Event>>,
    },
    Emu {
        items: Vec<HostFn>,
        /// The queue and ticket of the last item of the previous launch.
        last: Mutex<Option<(Arc<Queue>, u64)>>,
    },
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            GraphInner::Cuda { exec, .. } => f.debug_tuple("Graph::Cuda").field(exec).finish(),
            GraphInner::Emu { items, .. } => f
                .debug_struct("Graph::Emu")
                .field("items", &items.len())
                .finish(),
        }
    }
}

impl Graph {
    /// Enqueues one run of the recorded work on `stream` and returns without waiting; on a
    /// capturing stream the run is recorded (on CUDA as a child graph). What recorded host
    /// collectives and send/recv use, the graph keeps alive (see the type's docs); for work
    /// recorded through the `unsafe` [`Stream::launch`] and [`Stream::copy_raw`], their
    /// contracts extend to every launch of the graph.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `stream` belongs to the other backend (or, on CUDA,
    /// another GPU); [`Error::Cuda`]; the sticky error of a failed emulator stream.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        // No synchronizing free runs while a launch is being enqueued (`crate::sync_free`).
        let _launching = crate::sync_free::launching();
        match (&self.inner, &stream.inner) {
            (
                GraphInner::Cuda {
                    exec,
                    modules,
                    last,
                },
                StreamInner::Cuda(s),
            ) => {
                let mut capture = stream.capture();
                // Held across the launch and its event, so that `last` follows the launch order.
                let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
                s.launch_graph(exec)?;
                if let Some(c) = capture.as_mut() {
                    for m in modules {
                        c.keep(m);
                    }
                    c.retain(self.retained.iter().cloned());
                } else if s.is_capturing() {
                    // Recorded into a capture begun outside symcomm, whose graph it cannot
                    // reach: what this graph retains stays alive for good.
                    for k in &self.retained {
                        std::mem::forget(Arc::clone(k));
                    }
                } else if !self.retained.is_empty() {
                    match s.record_event() {
                        Ok(ev) => *last = Some(ev),
                        Err(e) => {
                            // Without an event the drop could not wait for this launch: wait now.
                            tracing::warn!(target: "symcomm::stream", error = %e, "no event after a graph launch; synchronizing");
                            let _ = s.synchronize();
                        }
                    }
                }
                Ok(())
            }
            (GraphInner::Emu { items, last }, StreamInner::Emu(emu)) => {
                let mut capture = stream.capture();
                if let Some(c) = capture.as_mut() {
                    emu.queue.sticky()?;
                    c.items.extend(items.iter().cloned());
                    c.retain(self.retained.iter().cloned());
                    return Ok(());
                }
                let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
                let wait: Option<HostFn> = match &*last {
                    Some((queue, ticket)) if !Arc::ptr_eq(queue, &emu.queue) => {
                        let (queue, ticket) = (Arc::clone(queue), *ticket);
                        Some(Arc::new(move || queue.wait_for(ticket)))
                    }
                    // Never launched, or last on this stream: in-order execution suffices.
                    _ => None,
                };
                let ticket = emu
                    .queue
                    .push_all(wait.into_iter().chain(items.iter().cloned()))?;
                *last = Some((Arc::clone(&emu.queue), ticket));
                Ok(())
            }
            _ => Err(Error::InvalidArgument(
                "a graph of one backend cannot run on a stream of the other (CUDA / emulator)"
                    .to_owned(),
            )),
        }
    }

    /// Recorded items: on the emulator every recorded launch, copy, set and host function (a
    /// graph launched during the capture adds its items); on CUDA the graph's node count (a
    /// graph launched during the capture is one child-graph node).
    pub fn len(&self) -> usize {
        match &self.inner {
            GraphInner::Cuda { exec, .. } => exec.node_count(),
            GraphInner::Emu { items, .. } => items.len(),
        }
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if self.retained.is_empty() {
            return;
        }
        // What the graph retains outlives its last launch (launches of one graph never overlap,
        // so the last one finishing means all did); bounded like every symcomm kernel.
        let waited = match &mut self.inner {
            GraphInner::Cuda { last, .. } => last
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
                .map(|ev| ev.synchronize()),
            GraphInner::Emu { last, .. } => last
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
                .map(|(queue, ticket)| queue.wait_for(ticket)),
        };
        if let Some(Err(e)) = waited {
            // A failed launch: nothing of it runs any more (CUDA's context error; the emulator
            // skipped the rest).
            tracing::debug!(target: "symcomm::stream", error = %e, "a dropped graph's last launch failed");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------------------------

/// Alignment of emulator buffers (CUDA allocations are at least this aligned too).
const BUFFER_ALIGN: usize = 256;

/// Ordinary (not symmetric) device memory of one backend, zeroed at allocation and freed on
/// drop: a GPU allocation (`cuMemAlloc`) on CUDA, 256-byte-aligned host memory on the emulator.
/// Kernels, [`Stream::copy_raw`] and [`Stream::memset_raw`] reach it through [`Self::addr`].
///
/// [`Self::write`] and [`Self::read`] are synchronous host copies that do not wait for any
/// stream: the caller orders them against device work that uses the buffer (synchronize those
/// streams first). On CUDA they must not be called on a thread that is capturing a stream
/// ([`Stream::begin_capture`]).
///
/// Lifetime: dropping a buffer waits for the last host collective or send/recv that used it (an
/// event each such call records), so `comm.all_reduce(&buf, &buf, ..)` followed by `drop(buf)`
/// is sound. A [`Graph`] that captured such calls keeps the memory allocated until it drops
/// (after its last launch), so replays after the buffer dropped are sound too. Kernels launched
/// by the caller ([`Stream::launch`], `unsafe`) are not tracked: their contract is that the
/// memory outlives them. On CUDA the memory comes from
/// the stream-ordered allocator and is freed in stream order (`cuMemFreeAsync`), so a drop never
/// synchronizes the whole context — which, with ranks sharing a GPU, would wait for another
/// rank's kernel that waits for this rank.
///
/// `Send + Sync`.
pub struct Buffer {
    /// Shared with graphs that captured collectives on the buffer (see [`Self::retained`]).
    inner: Arc<BufferInner>,
    /// Recorded after the latest host collective or send/recv that used the buffer.
    last_use: Mutex<Option<Arc<Event>>>,
}

enum BufferInner {
    Cuda(DeviceBuffer),
    Emu(HostMemory),
}

/// Zeroed, [`BUFFER_ALIGN`]-aligned host memory, addressed by emulated kernels through raw
/// addresses (so only ever accessed through raw pointers, never references).
struct HostMemory {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the allocation is owned by this value and only reached through raw pointers, from any
// thread (as device memory is); ordering those accesses is the callers' contract.
unsafe impl Send for HostMemory {}
// SAFETY: as for Send; `&self` methods copy through raw pointers.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    fn new(bytes: usize) -> Result<Self> {
        let layout = Layout::from_size_align(bytes, BUFFER_ALIGN).map_err(|_| {
            Error::InvalidArgument(format!("{bytes} bytes is too large for a buffer"))
        })?;
        // SAFETY: the layout has a non-zero size (callers refuse 0 bytes).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::Io {
            what: format!("allocating a {bytes}-byte emulator buffer"),
            source: std::io::ErrorKind::OutOfMemory.into(),
        })?;
        Ok(HostMemory { ptr, layout })
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed exactly once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // Bounded: the work waited for is symcomm's collectives, whose waits are bounded.
        let last = self
            .last_use
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(ev) = last {
            if let Err(e) = ev.synchronize() {
                tracing::warn!(target: "symcomm::stream", "waiting for a buffer's last use: {e}");
            }
        }
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.is_emu() {
            "Buffer::Emu"
        } else {
            "Buffer::Cuda"
        };
        f.debug_struct(kind)
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .finish()
    }
}

impl Buffer {
    /// Allocates `bytes` bytes of zeroed device memory for `backend`
    /// (`cuMemAlloc` and a memset on CUDA; aligned host memory on the emulator). The address
    /// is at least 256-byte aligned.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 bytes (or a size the platform cannot describe);
    /// [`Error::Cuda`] (`CUDA_ERROR_OUT_OF_MEMORY`); [`Error::Io`] when host memory is exhausted.
    pub fn new(backend: &Backend, bytes: usize) -> Result<Buffer> {
        if bytes == 0 {
            return Err(Error::InvalidArgument(
                "a buffer needs at least one byte".to_owned(),
            ));
        }
        let inner = match backend {
            Backend::Cuda(device) => BufferInner::Cuda(device.alloc_zeroed(bytes)?),
            Backend::Emu => BufferInner::Emu(HostMemory::new(bytes)?),
        };
        Ok(Buffer {
            inner: Arc::new(inner),
            last_use: Mutex::new(None),
        })
    }

    /// Remembers that work enqueued before `done` (an event of its stream, outside captures) uses
    /// the buffer, so that the drop waits for it.
    pub(crate) fn used_by(&self, done: &Arc<Event>) {
        *self.last_use.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(done));
    }

    /// The memory, for a graph that records work on it to keep alive.
    pub(crate) fn retained(&self) -> Retained {
        Arc::clone(&self.inner) as Retained
    }

    /// The device address of the first byte (on the emulator a host address), for kernel
    /// arguments and raw copies. Valid while `self` lives.
    pub fn addr(&self) -> u64 {
        match &*self.inner {
            BufferInner::Cuda(b) => b.device_ptr(),
            // Exposed: emulated kernels and raw copies turn the integer back into a pointer.
            BufferInner::Emu(m) => m.ptr.as_ptr().expose_provenance() as u64,
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        match &*self.inner {
            BufferInner::Cuda(b) => b.len(),
            BufferInner::Emu(m) => m.layout.size(),
        }
    }

    /// Always `false`: buffers hold at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether this is emulator (host) memory.
    pub fn is_emu(&self) -> bool {
        matches!(*self.inner, BufferInner::Emu(_))
    }

    /// The CUDA allocation underneath; `None` on the emulator.
    #[cfg(test)]
    pub(crate) fn as_cuda(&self) -> Option<&DeviceBuffer> {
        match &*self.inner {
            BufferInner::Cuda(b) => Some(b),
            BufferInner::Emu(_) => None,
        }
    }

    /// Byte offset and length of elements `offset_elems..offset_elems + count` of type `T`.
    fn byte_range<T>(&self, offset_elems: usize, count: usize) -> Result<(usize, usize)> {
        let size = std::mem::size_of::<T>();
        offset_elems
            .checked_mul(size)
            .zip(count.checked_mul(size))
            .filter(|&(offset, len)| offset.checked_add(len).is_some_and(|end| end <= self.len()))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{count} elements of {size} bytes at element {offset_elems} exceed a \
                     {}-byte buffer",
                    self.len()
                ))
            })
    }

    /// Copies `data` into the buffer starting at element `offset_elems` (in units of `T`) and
    /// waits for the copy. See the type's docs for ordering against device work.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range exceeds the buffer; [`Error::Cuda`].
    pub fn write<T: DevicePlain>(&self, offset_elems: usize, data: &[T]) -> Result<()> {
        let (offset, len) = self.byte_range::<T>(offset_elems, data.len())?;
        match &*self.inner {
            BufferInner::Cuda(b) => b.write(offset, data),
            BufferInner::Emu(m) => {
                // SAFETY: `offset + len` is within the allocation (checked); the source is `len`
                // initialized bytes (DevicePlain: no padding) of a slice that cannot overlap
                // memory only reached through raw pointers; no device work touches the range
                // meanwhile (the type's contract).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        data.as_ptr().cast::<u8>(),
                        m.ptr.as_ptr().add(offset),
                        len,
                    );
                }
                Ok(())
            }
        }
    }

    /// Copies elements `offset_elems..offset_elems + out.len()` (in units of `T`) into `out`
    /// and waits for the copy. See the type's docs for ordering against device work.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range exceeds the buffer; [`Error::Cuda`].
    pub fn read<T: DevicePlain>(&self, offset_elems: usize, out: &mut [T]) -> Result<()> {
        let (offset, len) = self.byte_range::<T>(offset_elems, out.len())?;
        match &*self.inner {
            BufferInner::Cuda(b) => b.read(offset, out),
            BufferInner::Emu(m) => {
                // SAFETY: `offset + len` is within the allocation (checked) and initialized
                // (zeroed at allocation); `out` has room for `len` bytes, and any bytes are a
                // valid `T` (DevicePlain); no device work writes the range meanwhile (the type's
                // contract).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        m.ptr.as_ptr().add(offset),
                        out.as_mut_ptr().cast::<u8>(),
                        len,
                    );
                }
                Ok(())
            }
        }
    }
}

/// A point in a [`Stream`]'s work ([`Stream::record_event`]): complete once everything enqueued
/// on that stream before the event has finished. Other streams wait for it with
/// [`Stream::wait_event`]; the host with [`Event::synchronize`] or [`Event::is_complete`].
pub struct Event {
    inner: EventInner,
}

enum EventInner {
    Cuda(cuda::Event),
    /// Complete when the queue's items `1..=ticket` are done.
    Emu {
        queue: Arc<Queue>,
        ticket: u64,
    },
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            EventInner::Cuda(e) => f.debug_tuple("Event::Cuda").field(e).finish(),
            EventInner::Emu { ticket, .. } => f
                .debug_struct("Event::Emu")
                .field("ticket", ticket)
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
        match &self.inner {
            EventInner::Cuda(e) => e.synchronize(),
            EventInner::Emu { queue, ticket } => queue.wait_for(*ticket),
        }
    }

    /// Whether the recorded work has finished, without blocking.
    ///
    /// # Errors
    /// As [`Self::synchronize`].
    pub fn is_complete(&self) -> Result<bool> {
        match &self.inner {
            EventInner::Cuda(e) => e.is_complete(),
            EventInner::Emu { queue, ticket } => queue.reached(*ticket),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{Duration, Instant};

    use symcomm_device::abi::{SYMCOMM_STATUS_OK, SYMCOMM_STATUS_TIMEOUT};

    use super::*;
    use crate::DEVICE_IMAGE;
    use crate::backend::emu::EmuTeam;

    const PING_PONG: &str = "symcomm_ping_pong";

    /// Serializes this module's tests: the thread-count check must not see other tests' streams.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn serial() -> MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
    }

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
    fn unknown_kernels_are_refused() {
        let e = Kernel::load(&Backend::Emu, &DEVICE_IMAGE, "no_such_kernel").unwrap_err();
        assert!(
            matches!(e, Error::UnknownKernel(ref n) if n == "no_such_kernel"),
            "{e}"
        );
    }

    #[test]
    fn kernel_args_are_aligned_and_round_trip() {
        let comm = DevComm {
            rank: 3,
            nranks: 4,
            timeout_ns: 77,
            ..DevComm::default()
        };
        let win = WindowHandleRaw {
            base: 0x1000,
            stride: 256,
            bytes: 100,
            rank: 3,
            nranks: 4,
            elem_size: 4,
            dtype: symcomm_device::abi::SYMCOMM_DTYPE_F32,
        };
        let args = KernelArgs::new()
            .arg(&7u8)
            .arg(&comm)
            .arg(&-2i16)
            .arg(&win)
            .arg(&1.5f32)
            .arg(&u64::MAX)
            .arg(&0.25f64);
        assert_eq!(args.len(), 7);
        assert!(!args.is_empty() && KernelArgs::new().is_empty());
        let p = args.pointers();
        assert_eq!(p.len(), 7);
        for ptr in &p {
            assert_eq!(
                *ptr as usize % 8,
                0,
                "parameter at {ptr:?} is not 8-aligned"
            );
        }
        // SAFETY: each pointer addresses the value pushed at that index, of that type, aligned
        // (checked above), inside `args`, which is alive and unchanged.
        unsafe {
            assert_eq!(*p[0].cast::<u8>(), 7);
            assert_eq!(*p[1].cast::<DevComm>(), comm);
            assert_eq!(*p[2].cast::<i16>(), -2);
            assert_eq!(*p[3].cast::<WindowHandleRaw>(), win);
            assert_eq!(*p[4].cast::<f32>(), 1.5);
            assert_eq!(*p[5].cast::<u64>(), u64::MAX);
            assert_eq!(*p[6].cast::<f64>(), 0.25);
        }
        // A clone owns its own copy.
        let copy = args.clone();
        drop(args);
        // SAFETY: as above, for the clone's storage.
        unsafe { assert_eq!(*copy.pointers()[3].cast::<WindowHandleRaw>(), win) };
        let mut built = KernelArgs::new();
        built.push(&1u32).push(&2u32);
        assert_eq!(built, KernelArgs::new().arg(&1u32).arg(&2u32));
        assert_eq!(
            LaunchConfig::linear(4, 128).with_shared_bytes(64),
            LaunchConfig {
                grid: [4, 1, 1],
                block: [128, 1, 1],
                shared_bytes: 64,
                co_resident: false,
            }
        );
        let c = LaunchConfig::linear(4, 128).co_resident();
        assert!(c.co_resident);
        assert_eq!((c.ctas(), c.threads()), (4, 128));
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

    /// A gate for a host item: the returned function blocks until the sender is dropped (also
    /// when a failing test unwinds, so a held stream never hangs the test).
    fn gate() -> (
        std::sync::mpsc::Sender<()>,
        impl Fn() + Send + Sync + 'static,
    ) {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = Mutex::new(rx);
        (tx, move || {
            let _ = rx.lock().unwrap().recv();
        })
    }

    /// A buffer's u32 words `offset..offset + N`.
    fn words<const N: usize>(buf: &Buffer, offset: usize) -> [u32; N] {
        let mut out = [0u32; N];
        buf.read(offset, &mut out).unwrap();
        out
    }

    fn emu_queue(stream: &Stream) -> &Arc<Queue> {
        match &stream.inner {
            StreamInner::Emu(e) => &e.queue,
            StreamInner::Cuda(_) => panic!("not an emulator stream"),
        }
    }

    fn is_invalid(r: Result<impl fmt::Debug>, needle: &str) {
        match r {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(needle), "{m:?} lacks {needle:?}"),
            other => panic!("expected InvalidArgument({needle:?}), got {other:?}"),
        }
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
        let before = emu_queue(&stream).lock().enqueued;
        // SAFETY: nothing is accessed.
        unsafe {
            stream.copy_raw(0, 0, 0).unwrap();
            stream.memset_raw(0, 1, 0).unwrap();
        }
        assert_eq!(emu_queue(&stream).lock().enqueued, before);
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
        assert_eq!(emu_queue(&stream).lock().enqueued, before);
        // Adjacent ranges do not overlap.
        // SAFETY: both ranges lie inside `a`; synchronized below.
        unsafe { stream.copy_raw(a.addr() + 8, a.addr(), 8) }.unwrap();
        stream.synchronize().unwrap();
        assert_eq!(words::<4>(&a, 0), [1, 2, 1, 2]);
    }

    #[test]
    fn buffers_round_trip_and_check_bounds() {
        is_invalid(Buffer::new(&Backend::Emu, 0), "at least one byte");
        let buf = Buffer::new(&Backend::Emu, 100).unwrap();
        assert!(buf.is_emu() && buf.as_cuda().is_none());
        assert_eq!((buf.len(), buf.is_empty()), (100, false));
        assert_eq!(buf.addr() % 256, 0, "{buf:?}");
        let mut bytes = [1u8; 100];
        buf.read(0, &mut bytes).unwrap();
        assert_eq!(bytes, [0; 100], "zeroed at allocation");

        buf.write(3, &[7u32, 8, 9]).unwrap();
        assert_eq!(words::<5>(&buf, 2), [0, 7, 8, 9, 0]);
        let mut b = [0u8; 4];
        buf.read(16, &mut b).unwrap();
        assert_eq!(b, 8u32.to_ne_bytes(), "element offsets are in units of T");
        // u64 element 5: bytes 40..48.
        buf.write(5, &[u64::MAX - 1]).unwrap();
        let mut w = [0u64; 1];
        buf.read(5, &mut w).unwrap();
        assert_eq!(w, [u64::MAX - 1]);
        let ne = (u64::MAX - 1).to_ne_bytes();
        let halves = [0, 4].map(|i| u32::from_ne_bytes(ne[i..i + 4].try_into().unwrap()));
        assert_eq!(words::<3>(&buf, 9), [0, halves[0], halves[1]]);

        // The last element fits; one more does not; nothing is written by a refused call.
        buf.write(24, &[5u32]).unwrap();
        is_invalid(buf.write(24, &[5u32, 6]), "exceed a 100-byte buffer");
        is_invalid(buf.read(25, &mut [0u32; 1]), "exceed");
        is_invalid(buf.write(usize::MAX, &[1u16]), "exceed");
        is_invalid(buf.read(usize::MAX / 2, &mut [0u64; 1]), "exceed");
        buf.write::<u32>(25, &[]).unwrap();
        assert_eq!(words::<2>(&buf, 23), [0, 5]);
    }

    /// Appends `tag` to `log` when run.
    fn log_item(
        log: &Arc<Mutex<Vec<&'static str>>>,
        tag: &'static str,
    ) -> impl Fn() -> Result<()> + Send + Sync + 'static {
        let log = Arc::clone(log);
        move || {
            log.lock().unwrap().push(tag);
            Ok(())
        }
    }

    #[test]
    fn graphs_replay_recorded_work_and_kernel_epochs_continue() {
        let _g = serial();
        let (rounds, words_per_round, replays) = (3u32, 32u32, 20usize);
        let mut team = EmuTeam::new(2, u64::from(words_per_round) * 4).unwrap();
        let kernel = Kernel::load(&Backend::Emu, &DEVICE_IMAGE, PING_PONG).unwrap();
        let streams = [
            Stream::new(&Backend::Emu).unwrap(),
            Stream::new(&Backend::Emu).unwrap(),
        ];
        // Per rank: the kernel's result words, a snapshot of them, and what each run of the
        // host item saw: (result, snapshot).
        let results: Vec<Arc<Buffer>> = (0..2)
            .map(|_| Arc::new(Buffer::new(&Backend::Emu, 12).unwrap()))
            .collect();
        let snapshots: Vec<Arc<Buffer>> = (0..2)
            .map(|_| Arc::new(Buffer::new(&Backend::Emu, 12).unwrap()))
            .collect();
        type Seen = Arc<Mutex<Vec<([u32; 3], [u32; 3])>>>;
        let seen: Vec<Seen> = (0..2).map(|_| Seen::default()).collect();
        let config = LaunchConfig::linear(1, 32);
        let mut graphs = Vec::new();
        for (rank, stream) in streams.iter().enumerate() {
            let (result, snapshot) = (&results[rank], &snapshots[rank]);
            assert!(!stream.is_capturing());
            stream.begin_capture().unwrap();
            assert!(stream.is_capturing());
            {
                let (seen, result, snapshot) = (
                    Arc::clone(&seen[rank]),
                    Arc::clone(result),
                    Arc::clone(snapshot),
                );
                stream
                    .enqueue_host(move || {
                        let r = words::<3>(&result, 0);
                        let s = words::<3>(&snapshot, 0);
                        seen.lock().unwrap().push((r, s));
                        Ok(())
                    })
                    .unwrap();
            }
            let args = ping_pong_args_at(&mut team, rank as u32, rounds, words_per_round, result);
            // SAFETY: the ranges lie in this rank's result and snapshot buffers, and the
            // arguments match symcomm_ping_pong; buffers and team outlive every launch of the
            // graph (the streams are synchronized before anything drops).
            unsafe {
                stream.copy_raw(snapshot.addr(), result.addr(), 12).unwrap();
                stream.memset_raw(result.addr(), 0, 12).unwrap();
                stream.launch(&kernel, config, &args).unwrap();
            }
            let graph = stream.end_capture().unwrap();
            assert!(!stream.is_capturing());
            assert_eq!(graph.len(), 4);
            assert!(!graph.is_empty());
            assert!(format!("{graph:?}").contains("items: 4"), "{graph:?}");
            graphs.push(graph);
        }
        // Recording ran nothing.
        std::thread::sleep(Duration::from_millis(20));
        for (rank, stream) in streams.iter().enumerate() {
            assert!(stream.is_idle().unwrap());
            assert_eq!(emu_queue(stream).lock().enqueued, 0);
            assert!(seen[rank].lock().unwrap().is_empty());
        }

        for _ in 0..replays {
            for (graph, stream) in graphs.iter().zip(&streams) {
                graph.launch(stream).unwrap();
            }
        }
        for s in &streams {
            s.synchronize().unwrap();
        }
        let ok = [SYMCOMM_STATUS_OK, 0, rounds];
        for rank in 0..2 {
            let seen = seen[rank].lock().unwrap();
            assert_eq!(seen.len(), replays, "rank {rank}: host item runs");
            // Run k's host item sees run k-1's kernel result (the set before each kernel and the
            // kernel's own bounded waits ran in order) and run k-2's result in the snapshot
            // (copied before the set).
            for (k, &(r, s)) in seen.iter().enumerate() {
                let want_r = if k >= 1 { ok } else { [0; 3] };
                let want_s = if k >= 2 { ok } else { [0; 3] };
                assert_eq!(
                    (r, s),
                    (want_r, want_s),
                    "rank {rank} run {k}: (result, snapshot)"
                );
            }
            assert_eq!(words::<3>(&results[rank], 0), ok, "rank {rank}: last run");
            assert_eq!(words::<3>(&snapshots[rank], 0), ok);
        }
        // 20 runs of 3 rounds each continued the epochs: one more plain launch per rank, after
        // the replays, still pairs up.
        for (rank, stream) in streams.iter().enumerate() {
            // SAFETY: as above.
            unsafe { stream.memset_raw(results[rank].addr(), 0, 12) }.unwrap();
            let args = ping_pong_args_at(
                &mut team,
                rank as u32,
                rounds,
                words_per_round,
                &results[rank],
            );
            // SAFETY: as above.
            unsafe { stream.launch(&kernel, config, &args) }.unwrap();
        }
        for (rank, stream) in streams.iter().enumerate() {
            stream.synchronize().unwrap();
            assert_eq!(words::<3>(&results[rank], 0), ok);
        }
    }

    fn ping_pong_args_at(
        team: &mut EmuTeam,
        rank: u32,
        rounds: u32,
        words: u32,
        result: &Buffer,
    ) -> KernelArgs {
        KernelArgs::new()
            .arg(&team.dev_comm(rank, 20_000_000_000))
            .arg(&team.window(rank))
            .arg(&rounds)
            .arg(&words)
            .arg(&result.addr())
    }

    #[test]
    fn capture_misuse_is_refused_and_the_stream_works_after() {
        let _g = serial();
        let stream = Stream::new(&Backend::Emu).unwrap();
        let other = Stream::new(&Backend::Emu).unwrap();
        let kernel = Kernel::load(&Backend::Emu, &DEVICE_IMAGE, PING_PONG).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        is_invalid(stream.end_capture(), "not capturing");

        stream.enqueue_host(log_item(&log, "before")).unwrap();
        stream.begin_capture().unwrap();
        is_invalid(stream.begin_capture(), "already capturing");
        is_invalid(stream.synchronize(), "synchronize is not allowed while");
        is_invalid(stream.is_idle(), "is_idle");
        is_invalid(stream.record_event(), "record_event");
        let event = other.record_event().unwrap();
        is_invalid(stream.wait_event(&event), "wait_event");
        // SAFETY: refused before queueing or recording.
        is_invalid(
            unsafe { stream.launch(&kernel, LaunchConfig::linear(0, 1), &KernelArgs::new()) },
            "empty launch",
        );
        // Only the thread that began the capture may end it.
        std::thread::scope(|s| {
            s.spawn(|| is_invalid(stream.end_capture(), "the thread that called begin_capture"))
                .join()
                .unwrap();
        });
        assert!(stream.is_capturing(), "refusals do not end the capture");
        stream.enqueue_host(log_item(&log, "recorded")).unwrap();
        let graph = stream.end_capture().unwrap();
        assert_eq!(graph.len(), 1);
        is_invalid(stream.end_capture(), "not capturing");

        // The stream works as before; the recorded item ran only when the graph was launched.
        stream.enqueue_host(log_item(&log, "after")).unwrap();
        stream.synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), ["before", "after"]);
        graph.launch(&stream).unwrap();
        stream.record_event().unwrap().synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), ["before", "after", "recorded"]);

        // An empty capture gives an empty graph.
        stream.begin_capture().unwrap();
        let empty = stream.end_capture().unwrap();
        assert!(empty.is_empty());
        empty.launch(&stream).unwrap();
        stream.synchronize().unwrap();

        // A stream dropped while capturing discards the record.
        let dropped = Stream::new(&Backend::Emu).unwrap();
        dropped.begin_capture().unwrap();
        dropped.enqueue_host(log_item(&log, "never")).unwrap();
        drop(dropped);
        assert_eq!(log.lock().unwrap().len(), 3);
    }

    #[test]
    fn graph_launches_are_ordered_across_streams_and_nest() {
        let _g = serial();
        let a = Stream::new(&Backend::Emu).unwrap();
        let b = Stream::new(&Backend::Emu).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        a.begin_capture().unwrap();
        {
            let item = log_item(&log, "g");
            a.enqueue_host(move || {
                std::thread::sleep(Duration::from_millis(60));
                item()
            })
            .unwrap();
        }
        let graph = a.end_capture().unwrap();

        // The launch on `b` waits for the one on `a`: the two runs do not overlap.
        let start = Instant::now();
        graph.launch(&a).unwrap();
        graph.launch(&b).unwrap();
        b.enqueue_host(log_item(&log, "b")).unwrap();
        b.synchronize().unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(120),
            "runs of one graph overlapped: {:?}",
            start.elapsed()
        );
        assert_eq!(*log.lock().unwrap(), ["g", "g", "b"]);
        a.synchronize().unwrap();

        // A graph launched during a capture is recorded into the new graph, in order.
        b.begin_capture().unwrap();
        b.enqueue_host(log_item(&log, "x")).unwrap();
        graph.launch(&b).unwrap();
        b.enqueue_host(log_item(&log, "y")).unwrap();
        let outer = b.end_capture().unwrap();
        assert_eq!(outer.len(), 3);
        log.lock().unwrap().clear();
        outer.launch(&a).unwrap();
        outer.launch(&a).unwrap();
        a.synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), ["x", "g", "y", "x", "g", "y"]);
    }

    #[test]
    fn a_failed_replay_fails_the_stream() {
        let _g = serial();
        let stream = Stream::new(&Backend::Emu).unwrap();
        let runs = Arc::new(AtomicU32::new(0));
        stream.begin_capture().unwrap();
        {
            let runs = Arc::clone(&runs);
            stream
                .enqueue_host(move || {
                    if runs.fetch_add(1, Ordering::SeqCst) == 2 {
                        return Err(Error::InvalidArgument("third run".into()));
                    }
                    Ok(())
                })
                .unwrap();
        }
        let graph = stream.end_capture().unwrap();
        // Hold the stream until every launch is queued: launches after the failure is known are
        // refused (checked below).
        let (release, gate) = gate();
        stream
            .enqueue_host(move || {
                gate();
                Ok(())
            })
            .unwrap();
        for _ in 0..5 {
            graph.launch(&stream).unwrap();
        }
        drop(release);
        let e = stream.synchronize().unwrap_err();
        assert_eq!(e.to_string(), "invalid argument: third run");
        assert_eq!(runs.load(Ordering::SeqCst), 3, "later runs are skipped");
        // Sticky: further launches and captures are refused with the same error.
        assert_eq!(
            graph.launch(&stream).unwrap_err().to_string(),
            e.to_string()
        );
        assert_eq!(
            stream.begin_capture().unwrap_err().to_string(),
            e.to_string()
        );
        assert!(!stream.is_capturing());
    }

    #[test]
    fn streams_events_and_kernels_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Stream>();
        check::<Event>();
        check::<Kernel>();
        check::<KernelArgs>();
        check::<Buffer>();
        check::<Graph>();
        fn send<T: Send>() {}
        send::<KernelArgs>();
    }
}

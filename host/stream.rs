//! Streams: in-order, asynchronous queues of kernel launches, for both backends.
//!
//! A [`Stream`] is made for a [`Backend`] and runs what is enqueued on it in order (per-stream
//! FIFO), asynchronously to the caller: [`Stream::launch`] returns as soon as the launch is
//! queued, and [`Stream::synchronize`] waits for everything queued so far. Streams are
//! independent of each other unless ordered with [`Event`]s ([`Stream::record_event`],
//! [`Stream::wait_event`]).
//!
//! - **CUDA**: a `CUstream` of the device's primary context (`CU_STREAM_NON_BLOCKING`), or an
//!   external one wrapped with [`Stream::from_cuda_raw`]; launches are `cuLaunchKernel`, events
//!   are CUDA events, and errors follow CUDA: a refused launch fails at [`Stream::launch`], a
//!   fault while a kernel runs surfaces at the next synchronization.
//! - **Emulator**: a queue served by one worker thread per stream. A queued kernel launch runs
//!   every CTA of the launch concurrently on CPU threads (as co-resident CTAs on a GPU) while the
//!   caller goes on; the worker waits for the launch to finish before it starts the next item.
//!   Kernels on different streams run concurrently, so ranks launched on one stream each (from
//!   one host thread) can wait for one another, as ranks as streams do on a GPU. Every failure
//!   on an emulator stream is *sticky*: the first error (a launch the emulator refuses, a failed
//!   host item, a failed wait) is kept, later queued items are skipped, and
//!   [`Stream::synchronize`] and every later enqueue return it. A stream in that state stays
//!   unusable; make a new one. Dropping an emulator stream waits for its queued work.
//!
//! Kernels are loaded once per backend with [`Kernel::load`] and take their parameters by value
//! from a [`KernelArgs`] builder, whose values the stream keeps until the launch ran.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use symcomm_device::abi::{CollArgs, DevComm, ErrorRecord, WindowHandleRaw};
use symcomm_device::emu::EmuEntry;
use symcomm_device::image::DeviceImage;

use crate::backend::Backend;
use crate::backend::cuda::{self, CudaDevice, CudaModule};
use crate::{Error, Result};

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
}

impl LaunchConfig {
    /// `ctas` CTAs of `threads` threads each, in x only, without dynamic shared memory.
    pub fn linear(ctas: u32, threads: u32) -> Self {
        LaunchConfig {
            grid: [ctas, 1, 1],
            block: [threads, 1, 1],
            shared_bytes: 0,
        }
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
    Emu(EmuEntry),
}

impl Kernel {
    /// Loads kernel `name` of `image` for `backend`: on CUDA, its module (fatbin, or NVRTC
    /// fallback, see [`CudaDevice::load_module`]); on the emulator, its emulator entry point.
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
            Backend::Emu => KernelCode::Emu(kernel.emu_entry),
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
}

// ---------------------------------------------------------------------------------------------
// The emulator's queue
// ---------------------------------------------------------------------------------------------

/// Work queued on an emulator stream.
type HostFn = Box<dyn FnOnce() -> Result<()> + Send + 'static>;

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
        let mut st = self.lock();
        if let Some((_, e)) = &st.error {
            return Err(replicate(e));
        }
        st.items.push_back(item);
        st.enqueued += 1;
        drop(st);
        self.work.notify_one();
        Ok(())
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
            let result = if failed { Ok(()) } else { run_item(item) };
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

/// Runs one queued item; a panic inside it becomes an error, so the worker lives on and waiters
/// are released.
fn run_item(item: HostFn) -> Result<()> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(item)) {
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
        Error::Timeout { rank, peer, op } => Error::Timeout {
            rank: *rank,
            peer: *peer,
            op,
        },
        Error::Aborted { rank, peer, op } => Error::Aborted {
            rank: *rank,
            peer: *peer,
            op,
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

/// An in-order queue of kernel launches on one backend (see the [module docs](self)).
///
/// `Send + Sync`: any thread may enqueue; items enqueued from several threads at once run in the
/// order the calls took effect. Dropping a stream waits for its queued work on the emulator; on
/// CUDA it returns at once (the driver finishes queued work), and a wrapped external stream
/// ([`Stream::from_cuda_raw`]) is left alive.
pub struct Stream {
    inner: StreamInner,
}

enum StreamInner {
    Cuda(cuda::Stream),
    Emu(EmuStream),
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            StreamInner::Cuda(s) => f.debug_tuple("Stream::Cuda").field(s).finish(),
            StreamInner::Emu(e) => {
                let st = e.queue.lock();
                f.debug_struct("Stream::Emu")
                    .field("enqueued", &st.enqueued)
                    .field("completed", &st.completed)
                    .field("failed", &st.error.is_some())
                    .finish()
            }
        }
    }
}

impl Stream {
    /// A new stream: on CUDA a non-blocking `CUstream` of the device's primary context
    /// ([`CudaDevice::create_stream`]); on the emulator a queue with its own worker thread.
    ///
    /// # Errors
    /// [`Error::Cuda`]; [`Error::Io`] when the emulator's worker thread cannot be started.
    pub fn new(backend: &Backend) -> Result<Stream> {
        let inner = match backend {
            Backend::Cuda(device) => StreamInner::Cuda(device.create_stream()?),
            Backend::Emu => StreamInner::Emu(EmuStream::new()?),
        };
        Ok(Stream { inner })
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
    pub unsafe fn from_cuda_raw(device: &CudaDevice, handle: u64) -> Stream {
        // SAFETY: forwarded from this function's contract.
        let stream = unsafe { device.wrap_stream(handle) };
        Stream {
            inner: StreamInner::Cuda(stream),
        }
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
    pub fn as_cuda(&self) -> Option<&cuda::Stream> {
        match &self.inner {
            StreamInner::Cuda(s) => Some(s),
            StreamInner::Emu(_) => None,
        }
    }

    /// Whether this is an emulator stream.
    pub fn is_emu(&self) -> bool {
        matches!(self.inner, StreamInner::Emu(_))
    }

    /// Enqueues `kernel` with `config` and `args`, and returns without waiting for it to run.
    ///
    /// The argument values are copied (CUDA) or kept by the stream (emulator), so `args` may be
    /// dropped or changed once this returns.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty grid or block, or a kernel loaded for another
    /// backend (or, on CUDA, another GPU, or with a parameter count the driver reports as
    /// different); nothing is queued then. On CUDA, [`Error::Cuda`] when the driver refuses the
    /// launch. On the emulator, the stream's sticky error if it has failed; a launch the
    /// emulator refuses ([`Error::Device`], e.g. more than 1024 threads per CTA) or a failure
    /// while the kernel runs surfaces at [`Self::synchronize`] and later calls.
    ///
    /// # Safety
    /// `args` holds exactly the kernel's parameters, in order and with their types, and every
    /// device address the kernel reaches through them (windows, signal areas, result buffers)
    /// stays valid until the launch has finished — until this stream is synchronized (or an
    /// event recorded after the launch completed).
    pub unsafe fn launch(
        &self,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &KernelArgs,
    ) -> Result<()> {
        let LaunchConfig {
            grid,
            block,
            shared_bytes,
        } = config;
        if grid.contains(&0) || block.contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "empty launch of {}: grid {grid:?}, block {block:?}",
                kernel.name
            )));
        }
        match (&self.inner, &kernel.code) {
            (StreamInner::Cuda(stream), KernelCode::Cuda(module)) => {
                let func = module.function(kernel.name)?;
                let mut ptrs = args.pointers();
                // SAFETY: `ptrs` points into `args`, alive for this call, one pointer per
                // parameter (this function's contract); the driver copies the values before
                // returning and never writes through them. Device addresses stay valid until the
                // launch finished (contract).
                unsafe { stream.launch(&func, grid, block, shared_bytes, &mut ptrs) }
            }
            (StreamInner::Emu(emu), &KernelCode::Emu(entry)) => {
                let name = kernel.name;
                let args = args.clone();
                tracing::debug!(target: "symcomm::stream", kernel = name, ?grid, ?block, shared_bytes, "enqueue emulator launch");
                emu.queue.push(Box::new(move || {
                    let mut ptrs = args.pointers();
                    // SAFETY: `ptrs` points into `args`, owned by this closure for the whole
                    // blocking launch and read only by the kernel entry; that the values match
                    // the kernel's parameters and that the device addresses stay valid until the
                    // launch finished is the contract of `Stream::launch`, whose caller
                    // synchronizes before freeing them.
                    unsafe {
                        symcomm_device::emu::launch(
                            name,
                            entry,
                            grid,
                            block,
                            shared_bytes as usize,
                            &mut ptrs,
                        )
                    }?;
                    Ok(())
                }))
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

    /// Enqueues a host function that runs in stream order (after everything queued before it,
    /// before everything queued after it), on the emulator's worker thread. An `Err` (or a
    /// panic) fails the stream like a failed launch. Emulator only: the staging copies and
    /// bookkeeping of emulator collectives.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on a CUDA stream; the sticky error of a failed emulator stream.
    pub fn enqueue_host<F>(&self, f: F) -> Result<()>
    where
        F: FnOnce() -> Result<()> + Send + 'static,
    {
        match &self.inner {
            StreamInner::Emu(emu) => emu.queue.push(Box::new(f)),
            StreamInner::Cuda(_) => Err(Error::InvalidArgument(
                "host functions can only be enqueued on emulator streams".to_owned(),
            )),
        }
    }

    /// Blocks until all work enqueued on this stream so far has finished.
    ///
    /// # Errors
    /// The first failure of the stream's work: on CUDA [`Error::Cuda`] (a kernel fault); on the
    /// emulator the sticky error (a refused launch, a failed host function or wait).
    pub fn synchronize(&self) -> Result<()> {
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
    /// As [`Self::synchronize`].
    pub fn is_idle(&self) -> Result<bool> {
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
    /// [`Error::Cuda`]; on the emulator, the sticky error of a failed stream.
    pub fn record_event(&self) -> Result<Event> {
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
    /// [`Error::InvalidArgument`] when `event` comes from a stream of the other backend;
    /// [`Error::Cuda`]; the sticky error of a failed emulator stream.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        match (&self.inner, &event.inner) {
            (StreamInner::Cuda(s), EventInner::Cuda(e)) => s.wait_event(e),
            (StreamInner::Emu(emu), EventInner::Emu { queue, ticket }) => {
                if Arc::ptr_eq(&emu.queue, queue) {
                    // Recorded on this stream: in-order execution already waits for it.
                    return emu.queue.sticky();
                }
                let (other, ticket) = (Arc::clone(queue), *ticket);
                emu.queue.push(Box::new(move || other.wait_for(ticket)))
            }
            _ => Err(Error::InvalidArgument(
                "an event of one backend cannot order a stream of the other (CUDA / emulator)"
                    .to_owned(),
            )),
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
    use crate::backend::emu::LocalTeam;

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
        team: &mut LocalTeam,
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
        let mut team = LocalTeam::new(2, u64::from(words) * 4).unwrap();
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
        let mut team = LocalTeam::new(1, 64).unwrap();
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
        let mut team = LocalTeam::new(1, 64).unwrap();
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
        let mut team = LocalTeam::new(2, 64).unwrap();
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
                shared_bytes: 64
            }
        );
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
    fn streams_events_and_kernels_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Stream>();
        check::<Event>();
        check::<Kernel>();
        check::<KernelArgs>();
        fn send<T: Send>() {}
        send::<KernelArgs>();
    }
}

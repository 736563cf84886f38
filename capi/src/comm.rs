//! Communicator handles: what an `ncclComm_t` names (a symcomm [`Communicator`] and the streams
//! its calls run on), and the registry of live handles that every entry point looks its
//! argument up in — so a NULL, destroyed or made-up `ncclComm_t` is an error, not a crash, and a
//! handle destroyed on one thread while another uses it stays valid for that use.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use symcomm::{Backend, Buffer, Communicator, Stream};

use crate::error::Fail;
use crate::types::{CommPtr, NcclComm};

/// One rank's communicator as C sees it.
pub(crate) struct Comm {
    pub(crate) inner: Arc<Communicator>,
    /// The streams calls ran on: on CUDA the callers' `cudaStream_t`s, wrapped once each (a
    /// stream's first collective binds it to a lane, a round trip among the ranks); on the
    /// emulator one queue, under the key 0.
    streams: Mutex<Vec<(usize, Stream)>>,
    finalized: AtomicBool,
    /// `ncclCommRegister`'s registrations: handle → (address, bytes).
    registrations: Mutex<HashMap<usize, (u64, usize)>>,
    /// Device memory standing in for buffers NCCL ignores on some ranks (a scatter's send
    /// buffer off the root), the largest last. Kept until the communicator drops: work queued
    /// on a stream may still read an older one.
    scratch: Mutex<Vec<Buffer>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Comm {
    pub(crate) fn new(inner: Arc<Communicator>) -> Self {
        Comm {
            inner,
            streams: Mutex::new(Vec::new()),
            finalized: AtomicBool::new(false),
            registrations: Mutex::default(),
            scratch: Mutex::default(),
        }
    }

    /// The address of at least `bytes` bytes (> 0) of this communicator's device memory whose
    /// contents nothing relies on.
    pub(crate) fn scratch(&self, bytes: u64) -> Result<u64, Fail> {
        let mut scratch = lock(&self.scratch);
        if let Some(b) = scratch.last().filter(|b| b.len() as u64 >= bytes) {
            return Ok(b.addr());
        }
        let grown = scratch.last().map_or(0, |b| b.len() as u64 * 2).max(bytes);
        let size = usize::try_from(grown)
            .map_err(|_| Fail::invalid_argument(format!("{bytes} bytes is too large")))?;
        let buffer = Buffer::new(self.inner.backend(), size)?;
        let addr = buffer.addr();
        scratch.push(buffer);
        Ok(addr)
    }

    /// Records registration `handle` of `bytes` bytes at `addr`.
    pub(crate) fn register_buffer(&self, handle: usize, addr: u64, bytes: usize) {
        lock(&self.registrations).insert(handle, (addr, bytes));
    }

    /// Ends registration `handle`; `false` when this communicator has none of that handle.
    pub(crate) fn deregister_buffer(&self, handle: usize) -> bool {
        lock(&self.registrations).remove(&handle).is_some()
    }

    pub(crate) fn is_emu(&self) -> bool {
        matches!(self.inner.backend(), Backend::Emu)
    }

    /// Runs `work` on the stream `raw` names (a `cudaStream_t`; ignored on the emulator).
    ///
    /// On the emulator the call is synchronous: it returns once the stream has run the work,
    /// with the stream's error or the communicator's sticky one (a mismatch, a lost peer)
    /// if either happened. On CUDA the work is only enqueued, as NCCL does.
    pub(crate) fn on_stream(
        &self,
        raw: usize,
        work: impl FnOnce(&Stream) -> symcomm::Result<()>,
    ) -> Result<(), Fail> {
        let mut streams = lock(&self.streams);
        let key = if self.is_emu() { 0 } else { raw };
        let index = match streams.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                let stream = match self.inner.backend() {
                    Backend::Cuda(device) => {
                        // SAFETY: NCCL's contract: `raw` is 0 (the legacy default stream) or a
                        // live `cudaStream_t` of this GPU's primary context (the CUDA runtime's
                        // context), which the caller keeps alive while calls use it and until
                        // the communicator is destroyed.
                        unsafe { Stream::from_cuda_raw(device, raw as u64) }
                    }
                    _ => Stream::new(self.inner.backend())?,
                };
                streams.push((key, stream));
                streams.len() - 1
            }
        };
        let stream = &streams[index].1;
        work(stream)?;
        if self.is_emu() {
            stream.synchronize()?;
            self.inner.check_error()?;
        }
        Ok(())
    }

    /// Waits for every stream this communicator's calls used (`ncclCommFinalize`).
    pub(crate) fn synchronize(&self) -> Result<(), Fail> {
        for (_, stream) in lock(&self.streams).iter() {
            stream.synchronize()?;
        }
        Ok(())
    }

    pub(crate) fn finalize(&self) {
        self.finalized.store(true, Ordering::Release);
    }

    /// `ncclInvalidUsage` once finalized: only destroy and abort remain.
    pub(crate) fn check_usable(&self) -> Result<(), Fail> {
        if self.finalized.load(Ordering::Acquire) {
            return Err(Fail::invalid_usage(
                "the communicator is finalized (ncclCommFinalize): only ncclCommDestroy or \
                 ncclCommAbort may follow",
            ));
        }
        Ok(())
    }
}

fn registry() -> MutexGuard<'static, HashMap<usize, Arc<Comm>>> {
    static LIVE: LazyLock<Mutex<HashMap<usize, Arc<Comm>>>> = LazyLock::new(Mutex::default);
    lock(&LIVE)
}

/// Registers `comm`; its `ncclComm_t` is the address of its shared state (unique while it lives,
/// never dereferenced by C or by this library).
pub(crate) fn register(comm: Comm) -> CommPtr {
    let comm = Arc::new(comm);
    let ptr = Arc::as_ptr(&comm) as *mut NcclComm;
    registry().insert(ptr as usize, comm);
    ptr
}

/// The live communicator `ptr` names.
///
/// # Errors
/// `ncclInvalidArgument` for NULL or a handle that is not (or no longer) a live communicator.
pub(crate) fn lookup(ptr: CommPtr) -> Result<Arc<Comm>, Fail> {
    if ptr.is_null() {
        return Err(Fail::invalid_argument("comm is NULL"));
    }
    registry().get(&(ptr as usize)).cloned().ok_or_else(|| {
        Fail::invalid_argument(
            "comm is not a live communicator (destroyed, aborted, or not made by \
             ncclCommInitRank / ncclCommInitAll)",
        )
    })
}

/// Removes `ptr` from the registry (destroy, abort): later calls with it are refused. The
/// communicator itself goes when its last user (a call in progress, a pending group) drops it.
pub(crate) fn unregister(ptr: CommPtr) -> Result<Arc<Comm>, Fail> {
    let comm = lookup(ptr)?;
    registry().remove(&(ptr as usize));
    Ok(comm)
}

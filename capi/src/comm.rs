//! Communicator handles: what an `ncclComm_t` names (a symcomm [`Communicator`] and the streams
//! its calls run on), and the registry of live handles that every entry point looks its
//! argument up in — so a NULL, destroyed or made-up `ncclComm_t` is an error, not a crash, and a
//! handle destroyed on one thread while another uses it stays valid for that use. A handle of
//! a communicator being created in the background (non-blocking init) is registered at once
//! and names the creation's result when it ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use symcomm::{Backend, Buffer, Communicator, Stream};

use crate::error::Fail;
use crate::premul::PreMulState;
use crate::types::CommPtr;

/// One rank's communicator as C sees it.
pub(crate) struct Comm {
    pub(crate) inner: Arc<Communicator>,
    /// The streams calls ran on: on CUDA the callers' `cudaStream_t`s, wrapped once each (a
    /// stream's first collective binds it to a lane, a round trip among the ranks); on the
    /// emulator one queue, under the key 0.
    streams: Mutex<Vec<(usize, Stream)>>,
    finalized: AtomicBool,
    /// Made with `config.blocking` = 1 (or undefined): what its splits inherit without a config.
    blocking: bool,
    /// Its pre-multiplied-sum ops.
    pub(crate) premul: PreMulState,
    /// `ncclCommRegister`'s registrations: handle → (address, bytes).
    registrations: Mutex<HashMap<usize, (u64, usize)>>,
    /// Device memory whose contents nothing relies on between calls: per stream (`Some(key)`,
    /// written by a call's own work) or shared (`None`, stand-ins for buffers NCCL ignores,
    /// only read); the largest of each key last. Kept until the communicator drops: work
    /// queued on a stream may still use an older one.
    scratch: Mutex<Vec<(Option<usize>, Buffer)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Comm {
    pub(crate) fn new(inner: Arc<Communicator>, blocking: bool) -> Self {
        Comm {
            inner,
            streams: Mutex::new(Vec::new()),
            finalized: AtomicBool::new(false),
            blocking,
            premul: PreMulState::default(),
            registrations: Mutex::default(),
            scratch: Mutex::default(),
        }
    }

    /// Whether it was made blocking.
    pub(crate) fn blocking(&self) -> bool {
        self.blocking
    }

    /// The address of at least `bytes` bytes (> 0) of this communicator's scratch memory of
    /// `key` (a stream's key, or `None` for memory that is only read).
    pub(crate) fn scratch(&self, key: Option<usize>, bytes: u64) -> Result<u64, Fail> {
        let mut scratch = lock(&self.scratch);
        let last = scratch
            .iter()
            .rev()
            .find(|(k, _)| *k == key)
            .map(|(_, b)| b);
        if let Some(b) = last.filter(|b| b.len() as u64 >= bytes) {
            return Ok(b.addr());
        }
        let grown = last.map_or(0, |b| b.len() as u64 * 2).max(bytes);
        let size = usize::try_from(grown)
            .map_err(|_| Fail::invalid_argument(format!("{bytes} bytes is too large")))?;
        let buffer = Buffer::new(self.inner.backend(), size)?;
        let addr = buffer.addr();
        scratch.push((key, buffer));
        Ok(addr)
    }

    /// Records registration `handle` of `bytes` bytes at `addr`.
    pub(crate) fn register_buffer(&self, handle: usize, addr: u64, bytes: usize) {
        lock(&self.registrations).insert(handle, (addr, bytes));
    }

    /// Registration `handle`'s (address, bytes), if this communicator has it.
    pub(crate) fn registration(&self, handle: usize) -> Option<(u64, usize)> {
        lock(&self.registrations).get(&handle).copied()
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
        work: impl FnOnce(&Stream) -> Result<(), Fail>,
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

/// A communicator being created in the background (non-blocking init, `config.blocking = 0`):
/// its handle exists at once; the result arrives when the creation ends.
#[derive(Default)]
pub(crate) struct Slot {
    state: Mutex<SlotState>,
}

#[derive(Default)]
enum SlotState {
    #[default]
    Creating,
    Made(Result<Arc<Comm>, Fail>),
    /// Destroyed or aborted while being created: the communicator is freed when it arrives.
    Abandoned,
}

impl Slot {
    /// Delivers the creation's result.
    pub(crate) fn fill(&self, made: Result<Arc<Comm>, Fail>) {
        let mut state = lock(&self.state);
        match *state {
            SlotState::Abandoned => {
                if let Ok(comm) = made {
                    comm.inner.abort();
                }
            }
            _ => *state = SlotState::Made(made),
        }
    }
}

/// What a handle names: a communicator, or one being created.
enum Entry {
    Live(Arc<Comm>),
    Creating(Arc<Slot>),
}

/// Where `lookup` found a handle.
pub(crate) enum Found {
    Live(Arc<Comm>),
    /// Still being created (non-blocking init).
    Creating,
    /// Its creation failed: the failure (the handle remains until destroyed or aborted).
    Failed(Fail),
}

fn registry() -> MutexGuard<'static, HashMap<usize, Entry>> {
    static LIVE: LazyLock<Mutex<HashMap<usize, Entry>>> = LazyLock::new(Mutex::default);
    lock(&LIVE)
}

/// A new handle value: never dereferenced (by C or by this library), never reused, and
/// aligned like a pointer to a struct so that no C code is surprised by it.
fn new_handle() -> CommPtr {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    (NEXT.fetch_add(1, Ordering::Relaxed) << 4) as CommPtr
}

/// Registers `comm`; returns its `ncclComm_t`.
pub(crate) fn register(comm: Arc<Comm>) -> CommPtr {
    let ptr = new_handle();
    registry().insert(ptr as usize, Entry::Live(comm));
    ptr
}

/// Registers a communicator that `slot` will deliver; returns its `ncclComm_t`.
pub(crate) fn register_creating(slot: Arc<Slot>) -> CommPtr {
    let ptr = new_handle();
    registry().insert(ptr as usize, Entry::Creating(slot));
    ptr
}

/// What `ptr` names now (a finished creation becomes a live communicator here).
///
/// # Errors
/// `ncclInvalidArgument` for NULL or a handle that is not (or no longer) a communicator.
pub(crate) fn find(ptr: CommPtr) -> Result<Found, Fail> {
    if ptr.is_null() {
        return Err(Fail::invalid_argument("comm is NULL"));
    }
    let mut live = registry();
    let entry = live.get_mut(&(ptr as usize)).ok_or_else(|| {
        Fail::invalid_argument(
            "comm is not a live communicator (destroyed, aborted, or not made by \
             ncclCommInitRank / ncclCommInitAll / ncclCommSplit)",
        )
    })?;
    let found = match entry {
        Entry::Live(comm) => Found::Live(Arc::clone(comm)),
        Entry::Creating(slot) => match &*lock(&slot.state) {
            SlotState::Made(Ok(comm)) => Found::Live(Arc::clone(comm)),
            SlotState::Made(Err(fail)) => Found::Failed(fail.clone()),
            SlotState::Creating | SlotState::Abandoned => Found::Creating,
        },
    };
    if let Found::Live(comm) = &found {
        *entry = Entry::Live(Arc::clone(comm));
    }
    Ok(found)
}

/// The live communicator `ptr` names.
///
/// # Errors
/// As [`find`]; `ncclInvalidUsage` for a communicator still being created, and the creation's
/// own failure for one whose creation failed.
pub(crate) fn lookup(ptr: CommPtr) -> Result<Arc<Comm>, Fail> {
    match find(ptr)? {
        Found::Live(comm) => Ok(comm),
        Found::Creating => Err(Fail::invalid_usage(
            "the communicator is still being created (non-blocking init): poll \
             ncclCommGetAsyncError until it reports ncclSuccess",
        )),
        Found::Failed(fail) => Err(fail),
    }
}

/// Removes `ptr` from the registry (destroy, abort): later calls with it are refused. The
/// communicator itself goes when its last user (a call in progress, a pending group) drops it;
/// one still being created is freed when its creation ends (`None` here).
///
/// # Errors
/// As [`find`].
pub(crate) fn unregister(ptr: CommPtr) -> Result<Option<Arc<Comm>>, Fail> {
    find(ptr)?;
    let entry = registry().remove(&(ptr as usize));
    Ok(match entry {
        Some(Entry::Live(comm)) => Some(comm),
        Some(Entry::Creating(slot)) => {
            let mut state = lock(&slot.state);
            match std::mem::replace(&mut *state, SlotState::Abandoned) {
                SlotState::Made(Ok(comm)) => Some(comm),
                _ => None,
            }
        }
        None => None,
    })
}

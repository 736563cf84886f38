//! Frees that synchronize the GPU, run only while no symcomm stream of this process has work in
//! flight.
//!
//! `cuMemUnmap` (window, signal-area and staging memory) and `cuMemFreeHost` (a communicator's
//! control block) synchronize the whole CUDA context before they return. Ranks that are threads of
//! one process on one GPU share that context, so a rank freeing memory inline would wait for its
//! peers' queued kernels, which may wait for this rank's next launch — which it cannot make while
//! it waits: a hang until the device timeout breaks the communicator (issue 9 §1). So every such
//! free goes through [`release`]:
//!
//! - every kernel and graph launch on a [`Stream`](crate::stream::Stream) holds [`launching`]
//!   (shared) while it enqueues, and every stream is registered here while it lives;
//! - [`release`] runs the free at once when no registered stream has unfinished work (checked
//!   without blocking: `cuStreamQuery`, the emulator queue's counters) and no launch is being
//!   enqueued; otherwise it hands the free to a reaper thread, which runs it, holding off new
//!   launches, at the first moment every stream is idle. The free then waits only for work outside
//!   symcomm's streams, and no symcomm kernel can be waiting for a rank that is stuck in it.
//!
//! Memory handed to the reaper stays mapped until then (under work that never pauses, until it
//! does). Kernels that users launch on streams that are not symcomm [`Stream`]s are not seen:
//! their launches must not depend on a peer that is freeing memory.
//!
//! The emulator models the hazard: its frees of window and control memory first wait, like the
//! driver, for every item already queued on every emulator stream of the process
//! ([`emulated_context_sync`]), so that a free made outside this gate deadlocks there as on a GPU
//! and the tests see it.

use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

/// What the gate asks of a live stream.
pub(crate) trait StreamProbe: Send + Sync {
    /// Whether every item enqueued so far has finished (never blocks; a failed stream runs
    /// nothing more, so it counts as idle).
    fn idle(&self) -> bool;
    /// Emulator: blocks until the items enqueued before this call finished or `deadline`
    /// passed; whether they did. CUDA streams return `true` (the driver synchronizes itself).
    fn settle(&self, deadline: Instant) -> bool;
}

struct Registry {
    next: u64,
    streams: Vec<(u64, Arc<dyn StreamProbe>)>,
    /// Frees waiting for an idle moment, and whether the reaper thread runs.
    pending: Vec<Box<dyn FnOnce() + Send>>,
    reaper: bool,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next: 0,
    streams: Vec::new(),
    pending: Vec::new(),
    reaper: false,
});

/// Held shared by every enqueue of a launch, exclusively while frees run.
static LAUNCHES: RwLock<()> = RwLock::new(());

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A stream's entry in the registry; dropping it removes the entry (before the stream itself is
/// destroyed: the probe is only used while the registry lock is held).
pub(crate) struct Registration(u64);

impl Drop for Registration {
    fn drop(&mut self) {
        registry().streams.retain(|(id, _)| *id != self.0);
    }
}

/// Registers a live stream.
pub(crate) fn register(probe: Arc<dyn StreamProbe>) -> Registration {
    let mut reg = registry();
    reg.next += 1;
    let id = reg.next;
    reg.streams.push((id, probe));
    Registration(id)
}

/// Held (shared) while a launch is enqueued; frees wait for it.
pub(crate) fn launching() -> RwLockReadGuard<'static, ()> {
    LAUNCHES.read().unwrap_or_else(PoisonError::into_inner)
}

fn all_idle(reg: &Registry) -> bool {
    reg.streams.iter().all(|(_, p)| p.idle())
}

/// Runs `free` (which may synchronize the GPU) now if no symcomm stream of this process has work
/// in flight, else on the reaper thread at the first moment none has; never blocks on peers.
pub(crate) fn release(free: Box<dyn FnOnce() + Send>) {
    // try_write: this thread may itself be enqueueing (then it must not wait for itself).
    if let Ok(_frees) = LAUNCHES.try_write() {
        let idle = all_idle(&registry());
        if idle {
            free();
            return;
        }
    }
    let mut reg = registry();
    reg.pending.push(free);
    if !reg.reaper {
        reg.reaper = true;
        let spawned = std::thread::Builder::new()
            .name("symcomm-free".to_owned())
            .spawn(reap);
        if let Err(e) = spawned {
            // Memory then stays mapped until the process exits; nothing can wait on it.
            reg.reaper = false;
            tracing::warn!(target: "symcomm::alloc", "cannot start the thread that frees memory: {e}");
        }
    }
}

/// The reaper: runs pending frees whenever every stream is idle, and exits when none is left.
fn reap() {
    let mut nap = Duration::from_micros(200);
    let start = Instant::now();
    let mut warned = false;
    loop {
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(5));
        let _frees = LAUNCHES.write().unwrap_or_else(PoisonError::into_inner);
        let frees = {
            let mut reg = registry();
            if reg.pending.is_empty() {
                reg.reaper = false;
                return;
            }
            if !all_idle(&reg) {
                if !warned && start.elapsed() > Duration::from_secs(60) {
                    warned = true;
                    tracing::warn!(target: "symcomm::alloc", "{} memory frees have waited 60 s for symcomm's streams to be idle at once", reg.pending.len());
                }
                continue;
            }
            std::mem::take(&mut reg.pending)
        };
        for free in frees {
            free();
        }
    }
}

/// Emulator: what the driver does before a synchronizing free — waits until every item queued on
/// every emulator stream of the process before this call has finished. Bounded (10 minutes, far
/// past every device timeout, after which queued kernels have failed and finished).
pub(crate) fn emulated_context_sync() {
    let probes: Vec<Arc<dyn StreamProbe>> = registry()
        .streams
        .iter()
        .map(|(_, p)| Arc::clone(p))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(600);
    for p in probes {
        if !p.settle(deadline) {
            tracing::error!(target: "symcomm::alloc", "an emulated synchronizing free waited 10 minutes for queued work");
            return;
        }
    }
}

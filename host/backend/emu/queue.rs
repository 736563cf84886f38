//! The emulator's streams: one queue per stream, served in order by its own worker thread.
//!
//! [`crate::stream::Stream`] enqueues kernel launches, raw copies and sets, event waits and host
//! functions on an [`EmuStream`] as [`HostFn`] items; an [`EmuEvent`] is its queue and a ticket
//! (the item count at which it completes). The first failure is sticky: later items are skipped but
//! counted, so that every waiter finishes.
//!
//! **Hardware queues.** A GPU serves streams through a few hardware work queues
//! (`CUDA_DEVICE_MAX_CONNECTIONS`, 8 unless set, at most 32): streams share them round robin in
//! creation order (on the emulator only when the variable is set, see [`HwQueues`]), and a
//! queue starts its items in the order they were queued, across all its streams. An item at a queue's head waits there until its own stream's earlier work finished
//! (a queued event wait, until the event completed), and every item behind it waits too, whatever
//! its stream: a kernel that waits for a peer's kernel queued behind it on the same hardware
//! queue waits forever (until its timeout). The emulator models this ([`HwQueue`]), so that the
//! deadlock shows on the CPU as it would on the GPU.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;

use crate::{Error, Result};

/// Work queued on an emulator stream. `Fn` and shared, so that a graph can queue one recorded
/// item again on every launch.
pub(crate) type HostFn = Arc<dyn Fn() -> Result<()> + Send + Sync + 'static>;

/// Name of emulator stream worker threads (what `/proc/<pid>/task/*/comm` shows).
pub(crate) const WORKER_NAME: &str = "symcomm-stream";

/// How an item passes its hardware queue's head.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Started at the head (once the stream's earlier items finished), then run while the
    /// hardware queue goes on: kernels, copies, host functions.
    Start,
    /// Holds the head until it finished: a wait for an event of another stream.
    Wait,
}

/// One hardware work queue of the emulated GPU: the items of the streams it serves, as
/// (stream, ticket), in the order they were queued.
struct HwQueue {
    order: Mutex<VecDeque<(usize, u64)>>,
    /// Signalled when the head changes.
    turn: Condvar,
}

impl HwQueue {
    fn lock(&self) -> MutexGuard<'_, VecDeque<(usize, u64)>> {
        self.order.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Blocks until item `ticket` of `stream` is at the head.
    fn wait_turn(&self, stream: usize, ticket: u64) {
        let mut order = self.lock();
        while order.front() != Some(&(stream, ticket)) {
            order = self
                .turn
                .wait(order)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Removes the head (item `ticket` of `stream`, which [`Self::wait_turn`] saw there).
    fn pass(&self, stream: usize, ticket: u64) {
        let head = self.lock().pop_front();
        debug_assert_eq!(head, Some((stream, ticket)));
        self.turn.notify_all();
    }
}

/// Hardware queues of the emulated GPU (every emulator stream of the process is on GPU 0): as
/// many as `CUDA_DEVICE_MAX_CONNECTIONS` says when the first stream is made (1 to 32, as CUDA
/// takes it), and the next one to give a new stream. Unset, every stream has a queue of its own
/// (CUDA's default is 8 queues; the emulator does not share them by default because ranks on
/// different simulated hosts, which have GPUs of their own, are threads of one process here,
/// and so are the tests `cargo test` runs side by side).
struct HwQueues {
    queues: Vec<Arc<HwQueue>>,
    next: AtomicUsize,
}

/// The variable CUDA reads for the number of hardware queues, which the emulator follows.
pub(crate) const CONNECTIONS_VAR: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// Hardware queues per GPU as CUDA takes them from `value` of [`CONNECTIONS_VAR`]: 8 unless set
/// to a number, clamped to 1..=32.
pub(crate) fn connections(value: Option<&str>) -> usize {
    value
        .and_then(|v| v.trim().parse::<usize>().ok())
        .map_or(8, |n| n.clamp(1, 32))
}

/// The emulated GPU's shared hardware queues, or `None` when every stream has its own (the
/// variable is read once, at the first use).
fn shared_queues() -> Option<&'static HwQueues> {
    static QUEUES: OnceLock<Option<HwQueues>> = OnceLock::new();
    QUEUES
        .get_or_init(|| {
            let value = std::env::var(CONNECTIONS_VAR).ok()?;
            Some(HwQueues {
                queues: (0..connections(Some(&value)))
                    .map(|_| {
                        Arc::new(HwQueue {
                            order: Mutex::new(VecDeque::new()),
                            turn: Condvar::new(),
                        })
                    })
                    .collect(),
                next: AtomicUsize::new(0),
            })
        })
        .as_ref()
}

/// Whether the emulator's streams share hardware queues ([`CONNECTIONS_VAR`] set): only then
/// can a kernel wait behind another stream's work, and only then do ranks as threads need their
/// launches ordered (`crate::comm`'s launch order).
pub(crate) fn queues_shared() -> bool {
    shared_queues().is_some()
}

/// The hardware queue of a new stream, the queues taken round robin; `None` when
/// [`CONNECTIONS_VAR`] is unset (the stream shares no queue: its items need no gate).
fn hw_queue() -> Option<Arc<HwQueue>> {
    let hw = shared_queues()?;
    let i = hw.next.fetch_add(1, Ordering::Relaxed) % hw.queues.len();
    Some(Arc::clone(&hw.queues[i]))
}

/// State shared by an emulator stream, its worker thread, its events and the streams that wait
/// on those events.
struct Queue {
    state: Mutex<QueueState>,
    /// The hardware queue the stream's items pass through, when streams share them.
    hw: Option<Arc<HwQueue>>,
    /// Signalled when an item is queued or the stream closes (the worker waits on it).
    work: Condvar,
    /// Signalled when an item completed (synchronize, events and waiting streams wait on it).
    progress: Condvar,
}

struct QueueState {
    items: VecDeque<(HostFn, Step)>,
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

    /// This stream's name in its hardware queue.
    fn id(&self) -> usize {
        std::ptr::from_ref(self).expose_provenance()
    }

    /// Queues `item`, unless the stream has failed.
    fn push(&self, item: HostFn, step: Step) -> Result<()> {
        self.push_all(std::iter::once((item, step))).map(|_| ())
    }

    /// Queues `items` back to back (no other enqueue comes between them, in this stream or its
    /// hardware queue), unless the stream has failed; returns the ticket of the last one (the
    /// current ticket if there are none).
    fn push_all(&self, items: impl IntoIterator<Item = (HostFn, Step)>) -> Result<u64> {
        let mut st = self.lock();
        if let Some((_, e)) = &st.error {
            return Err(e.clone());
        }
        let mut order = self.hw.as_ref().map(|hw| hw.lock());
        for item in items {
            st.items.push_back(item);
            st.enqueued += 1;
            if let Some(order) = order.as_mut() {
                order.push_back((self.id(), st.enqueued));
            }
        }
        drop(order);
        let ticket = st.enqueued;
        drop(st);
        self.work.notify_one();
        Ok(ticket)
    }

    /// The stream's error, if it failed.
    fn sticky(&self) -> Result<()> {
        match &self.lock().error {
            Some((_, e)) => Err(e.clone()),
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
            Some((failed, e)) if *failed <= ticket => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// Whether items `1..=ticket` are done, failing as [`Self::wait_for`].
    fn reached(&self, ticket: u64) -> Result<bool> {
        let st = self.lock();
        match &st.error {
            Some((failed, e)) if *failed <= ticket => Err(e.clone()),
            _ => Ok(st.completed >= ticket),
        }
    }

    /// The worker: runs items in order until the stream closes and the queue is empty, each
    /// once it reached the head of the hardware queue.
    fn serve(&self) {
        loop {
            let ((item, step), ticket, failed) = {
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
            // At the hardware queue's head, a waiting item stays there until it finished; any
            // other leaves it as it starts (a skipped one at once).
            let holds = step == Step::Wait && !failed;
            if let Some(hw) = &self.hw {
                hw.wait_turn(self.id(), ticket);
                if !holds {
                    hw.pass(self.id(), ticket);
                }
            }
            // After a failure later work is skipped (it may depend on the failed item) but still
            // counted, so that waiters on this stream finish.
            let result = if failed { Ok(()) } else { run_item(&item) };
            if let Some(hw) = self.hw.as_ref().filter(|_| holds) {
                hw.pass(self.id(), ticket);
            }
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

/// A snapshot of an emulator stream's counters ([`EmuStream::progress`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueProgress {
    pub(crate) enqueued: u64,
    pub(crate) completed: u64,
    pub(crate) failed: bool,
}

/// An emulator stream: the shared queue and its worker thread.
pub(crate) struct EmuStream {
    queue: Arc<Queue>,
    worker: Option<JoinHandle<()>>,
}

impl EmuStream {
    /// A new queue with its worker thread, on the next hardware queue (when they are shared).
    ///
    /// # Errors
    /// [`Error::Io`] when the worker thread cannot be started.
    pub(crate) fn new() -> Result<Self> {
        let queue = Arc::new(Queue {
            state: Mutex::new(QueueState {
                items: VecDeque::new(),
                enqueued: 0,
                completed: 0,
                error: None,
                closing: false,
            }),
            hw: hw_queue(),
            work: Condvar::new(),
            progress: Condvar::new(),
        });
        let served = Arc::clone(&queue);
        let worker = std::thread::Builder::new()
            .name(WORKER_NAME.to_owned())
            .spawn(move || served.serve())
            .map_err(|source| Error::io("starting an emulator stream's worker thread", source))?;
        Ok(EmuStream {
            queue,
            worker: Some(worker),
        })
    }

    /// What the gate of synchronizing frees asks of the stream (`crate::sync_free`).
    pub(crate) fn probe(&self) -> Arc<dyn crate::sync_free::StreamProbe> {
        self.queue.clone()
    }

    /// The queue's identity: equal for two values exactly when they are the same stream.
    pub(crate) fn key(&self) -> usize {
        Arc::as_ptr(&self.queue).expose_provenance()
    }

    /// Items queued and done so far, and whether the stream failed (for `Debug`).
    pub(crate) fn progress(&self) -> QueueProgress {
        let st = self.queue.lock();
        QueueProgress {
            enqueued: st.enqueued,
            completed: st.completed,
            failed: st.error.is_some(),
        }
    }

    /// The stream's error, if it failed.
    pub(crate) fn sticky(&self) -> Result<()> {
        self.queue.sticky()
    }

    /// Queues `item` (a kernel launch, copy or host function: it leaves the hardware queue's
    /// head when it starts), unless the stream has failed.
    pub(crate) fn push(&self, item: HostFn) -> Result<()> {
        self.queue.push(item, Step::Start)
    }

    /// Blocks until every item queued so far is done; the stream's error if it failed.
    pub(crate) fn synchronize(&self) -> Result<()> {
        let target = self.queue.lock().enqueued;
        self.queue.wait_for(target)?;
        self.queue.sticky()
    }

    /// Whether every item queued so far is done, failing with the stream's error if it failed.
    pub(crate) fn is_idle(&self) -> Result<bool> {
        let st = self.queue.lock();
        match &st.error {
            Some((_, e)) => Err(e.clone()),
            None => Ok(st.completed >= st.enqueued),
        }
    }

    /// An event that completes when every item queued so far is done, unless the stream has
    /// failed.
    pub(crate) fn record_event(&self) -> Result<EmuEvent> {
        let st = self.queue.lock();
        if let Some((_, e)) = &st.error {
            return Err(e.clone());
        }
        Ok(EmuEvent {
            queue: Arc::clone(&self.queue),
            ticket: st.enqueued,
        })
    }

    /// Makes later items wait until `event` completed (a queued wait), and fail with its
    /// stream's error if that stream failed at or before it.
    pub(crate) fn wait_event(&self, event: &EmuEvent) -> Result<()> {
        if Arc::ptr_eq(&self.queue, &event.queue) {
            // Recorded on this stream: in-order execution already waits for it.
            return self.queue.sticky();
        }
        let (other, ticket) = (Arc::clone(&event.queue), event.ticket);
        self.queue
            .push(Arc::new(move || other.wait_for(ticket)), Step::Wait)
    }

    /// Queues one run of a graph's `items` back to back, after the previous run `last` of the
    /// same graph (on whichever stream it ran), and makes `last` this run.
    pub(crate) fn launch_graph(&self, items: &[HostFn], last: &mut Option<EmuEvent>) -> Result<()> {
        let wait: Option<(HostFn, Step)> = match &*last {
            Some(prev) if !Arc::ptr_eq(&prev.queue, &self.queue) => {
                let (queue, ticket) = (Arc::clone(&prev.queue), prev.ticket);
                let wait: HostFn = Arc::new(move || queue.wait_for(ticket));
                Some((wait, Step::Wait))
            }
            // Never launched, or last on this stream: in-order execution suffices.
            _ => None,
        };
        let ticket = self.queue.push_all(
            wait.into_iter()
                .chain(items.iter().map(|i| (Arc::clone(i), Step::Start))),
        )?;
        *last = Some(EmuEvent {
            queue: Arc::clone(&self.queue),
            ticket,
        });
        Ok(())
    }
}

/// A point in an emulator stream's work: complete when the queue's items `1..=ticket` are done.
pub(crate) struct EmuEvent {
    queue: Arc<Queue>,
    ticket: u64,
}

impl EmuEvent {
    /// Blocks until the recorded work is done; the error of its stream if that failed at or
    /// before the event.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.queue.wait_for(self.ticket)
    }

    /// Whether the recorded work is done, without blocking, failing as [`Self::synchronize`].
    pub(crate) fn is_complete(&self) -> Result<bool> {
        self.queue.reached(self.ticket)
    }

    /// Items of its stream the event waits for (for `Debug`).
    pub(crate) fn ticket(&self) -> u64 {
        self.ticket
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

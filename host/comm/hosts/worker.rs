//! Calls across hosts in stream order, off the calling thread.
//!
//! A call across hosts moves bytes between hosts from the host (UCX), between phases that run on
//! the device. It must start when the caller's stream reaches it, and the stream's later work
//! must wait for its end — without blocking the caller, and in CUDA graphs too. So a call
//! queues three things on the caller's stream ([`Hosts::submit`]):
//!
//! 1. a host function ([`Stream::call_host`]: `cuLaunchHostFunc`) that hands the call to this
//!    rank's *worker* thread and does nothing else (a host function must not call CUDA or wait
//!    for other work);
//! 2. a wait until the call's *gate*, a word of device-mapped host memory, reads [`RELEASED`]
//!    ([`Stream::wait_word`]: `cuStreamWaitValue32`);
//! 3. a store of [`PASSED`] into the gate ([`Stream::write_word`]): the stream is past it, the
//!    word may serve another call.
//!
//! The worker runs calls in the order they arrive, on a stream of its own, waits for that
//! stream, and releases the gate — also when the call failed: the error is kept, and
//! [`Communicator::check_error`] and every later call report it. Calls arrive in the order they
//! were made, the same on every rank: a call waits (an event) for the previous one, whatever its
//! stream. Every way out of a call and the worker's end release the gate: that is what bounds
//! the stream's wait on CUDA, whose wait has no timeout of its own (the emulator's has one
//! besides). A graph replays the three steps: the host function resets the gate to [`QUEUED`]
//! and hands the call over again.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use symcomm_device::abi::P2pOp;

use super::{Hosts, lock};
use crate::backend::{Backend, MappedHost};
use crate::comm::Communicator;
use crate::comm::coll::{BufferRef, Call};
use crate::stream::{Event, Retained, Stream};
use crate::{Error, Result};

/// A gate's value while its call is on its way to the worker or running.
pub(super) const QUEUED: u32 = 0;
/// Set by the worker (or, once the worker is gone, by whoever finds the call unrun): the stream
/// may go on.
pub(super) const RELEASED: u32 = 1;
/// Set by the stream once past its wait: the gate is free.
pub(super) const PASSED: u32 = 2;

/// Gate words per page of mapped host memory.
const GATES_PER_PAGE: usize = 1024;

/// What a call across hosts does on the worker.
pub(super) enum Work {
    /// A validated collective; its buffers as raw memory (the caller's contract keeps them
    /// valid until its stream passed the call).
    Collective(Call<'static>),
    /// A validated send/recv group.
    Group(Vec<P2pOp>),
}

/// One call on its way: its communicator, what to do and the gate its stream waits on. A job
/// keeps its communicator alive until the worker has run it (so a communicator dropped right
/// after its last call still makes it); it is dropped by the worker, never by a host function.
#[derive(Clone)]
pub(super) struct Job {
    comm: Arc<Communicator>,
    work: Arc<Work>,
    gate: Gate,
}

/// One gate word, as the host and the device see it.
#[derive(Clone, Copy)]
pub(super) struct Gate {
    /// Host address of the word (page memory, which outlives every use of the gate: see
    /// [`Gates`]' drop).
    host: usize,
    device: u64,
}

impl Gate {
    fn word(&self) -> &AtomicU32 {
        // SAFETY: a 4-aligned word of a page that is freed only once no stream can wait on it
        // and no job holds it (or never: see `Gates`' drop); every access is atomic.
        unsafe { AtomicU32::from_ptr(std::ptr::with_exposed_provenance_mut::<u32>(self.host)) }
    }

    fn set(&self, value: u32) {
        self.word().store(value, Ordering::Release);
        if value == RELEASED {
            crate::stream::words_written();
        }
    }

    fn get(&self) -> u32 {
        self.word().load(Ordering::Acquire)
    }
}

/// A page of gate words.
struct Page {
    memory: MappedHost,
}

/// The gate words of one rank's calls across hosts, in pages of mapped host memory. A gate is
/// free again once its stream has passed it (calls outside graphs) or once the graph that
/// captured it has dropped ([`KeptGate`]).
pub(super) struct Gates {
    backend: Backend,
    state: Mutex<GateState>,
}

#[derive(Default)]
struct GateState {
    pages: Vec<Page>,
    free: Vec<Gate>,
    /// Gates of calls outside graphs, free once they read [`PASSED`].
    in_flight: Vec<Gate>,
}

/// A gate a graph keeps: back to the free ones when the graph drops (its drop waits for its last
/// launch).
struct KeptGate {
    gates: Arc<Gates>,
    gate: Gate,
}

impl Drop for KeptGate {
    fn drop(&mut self) {
        lock(&self.gates.state).free.push(self.gate);
    }
}

impl Gates {
    /// The gates of one rank, with their first page: allocated now, at set-up, because a call
    /// captured into a CUDA graph must not allocate pinned memory (the driver would invalidate
    /// the capture); only a rank with more than [`GATES_PER_PAGE`] gates in use allocates later.
    pub(super) fn new(backend: &Backend) -> Result<Gates> {
        let gates = Gates {
            backend: backend.clone(),
            state: Mutex::new(GateState::default()),
        };
        gates.add_page(&mut lock(&gates.state))?;
        Ok(gates)
    }

    /// A page of free gates more.
    fn add_page(&self, st: &mut GateState) -> Result<()> {
        let bytes = GATES_PER_PAGE * 4;
        let memory = MappedHost::new(&self.backend, bytes)?;
        let (host, device) = (memory.host_ptr() as usize, memory.device_ptr());
        st.free.extend((0..GATES_PER_PAGE).rev().map(|i| Gate {
            host: host + 4 * i,
            device: device + 4 * i as u64,
        }));
        st.pages.push(Page { memory });
        Ok(())
    }

    /// A free gate, reading [`QUEUED`]; `in_flight`: for a call outside a graph (free again
    /// once passed), else the caller keeps it.
    fn take(&self, in_flight: bool) -> Result<Gate> {
        let mut st = lock(&self.state);
        let st = &mut *st;
        let (passed, waiting): (Vec<Gate>, Vec<Gate>) =
            st.in_flight.drain(..).partition(|g| g.get() == PASSED);
        st.in_flight = waiting;
        st.free.extend(passed);
        if st.free.is_empty() {
            self.add_page(st)?;
        }
        let gate = st
            .free
            .pop()
            .ok_or_else(|| Error::InvalidArgument("no gate word".to_owned()))?;
        gate.set(QUEUED);
        if in_flight {
            st.in_flight.push(gate);
        }
        Ok(gate)
    }
}

impl Drop for Gates {
    fn drop(&mut self) {
        let st = std::mem::take(self.state.get_mut().unwrap_or_else(|e| e.into_inner()));
        // A gate still QUEUED belongs to a call that never reached the worker (its stream did
        // not get there); RELEASED ones are about to be passed, which the free below waits for.
        let stuck: Vec<&Gate> = st.in_flight.iter().filter(|g| g.get() == QUEUED).collect();
        if stuck.is_empty() {
            // cuMemFreeHost synchronizes the GPU: only while symcomm's streams are idle (so
            // after they passed their gates: `MappedHost`'s drop).
            return;
        }
        // A stream may still reach (or wait on) these gates: release them, and keep the memory
        // for the life of the process.
        for g in &stuck {
            g.set(RELEASED);
        }
        tracing::debug!(
            target: "symcomm::hosts",
            "{} calls across hosts not yet passed by their streams when the communicator \
             went: their gates stay allocated",
            stuck.len()
        );
        for page in st.pages {
            page.memory.leak();
        }
    }
}

/// The calls handed to the worker, in arrival order.
#[derive(Default)]
pub(super) struct Queue {
    state: Mutex<QueueState>,
    arrived: Condvar,
}

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    closed: bool,
}

impl Queue {
    /// The host function's work: the call goes to the worker. Never blocks for long, never
    /// calls CUDA, drops nothing that does.
    fn arrive(&self, job: Job) {
        let mut st = lock(&self.state);
        if st.closed {
            // Cannot happen (the queue closes with the communicator, which the job keeps
            // alive); should it, the stream goes on, and the job is not dropped here: its
            // communicator must not go in a host function.
            job.gate.set(RELEASED);
            std::mem::forget(job);
            return;
        }
        job.gate.set(QUEUED);
        st.jobs.push_back(job);
        self.arrived.notify_one();
    }

    /// The next call, waiting for one; `None` once closed.
    fn next(&self) -> Option<Job> {
        let mut st = lock(&self.state);
        loop {
            if st.closed {
                return None;
            }
            if let Some(job) = st.jobs.pop_front() {
                return Some(job);
            }
            st = self
                .arrived
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// No more calls: the ones waiting are released unrun, later arrivals too.
    fn close(&self) {
        let mut st = lock(&self.state);
        st.closed = true;
        for job in st.jobs.drain(..) {
            job.gate.set(RELEASED);
        }
        self.arrived.notify_all();
    }
}

/// The worker thread of one rank's calls across hosts.
pub(super) struct Worker {
    queue: Arc<Queue>,
    thread: Option<JoinHandle<()>>,
    /// The last call's end on its caller's stream: the next call, on any stream, waits for it
    /// (calls reach the worker in the order they were made). Locked for a whole submission.
    last: Mutex<Option<Arc<Event>>>,
}

impl Worker {
    /// Starts the worker of `comm`.
    pub(super) fn start(comm: &Communicator) -> Result<Worker> {
        let stream = Stream::new(comm.backend())?;
        let queue = Arc::new(Queue::default());
        let q = Arc::clone(&queue);
        let thread = std::thread::Builder::new()
            .name(format!("symcomm-hosts-{}", comm.rank))
            .spawn(move || serve(&q, &stream))
            .map_err(|e| Error::io("starting the worker of calls across hosts".to_owned(), e))?;
        Ok(Worker {
            queue,
            thread: Some(thread),
            last: Mutex::new(None),
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.queue.close();
        if let Some(t) = self.thread.take() {
            // The worker itself may drop the communicator (its last job held the last
            // reference): it ends on its own then.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// The worker's loop: each call on `stream`, then its gate released.
fn serve(queue: &Queue, stream: &Stream) {
    while let Some(Job { comm, work, gate }) = queue.next() {
        comm.run_job(&work, stream);
        // The job's reference goes before the stream may go on: once the caller has seen the
        // call done, its own drop of the communicator is the last one, which says goodbye before
        // the process may exit. Should this one be the last (the caller dropped its handle right
        // after the call), the communicator goes here, on this thread: that closes the queue
        // (the loop ends), and its gates' drop releases this gate and keeps their memory.
        drop(work);
        drop(comm);
        gate.set(RELEASED);
    }
}

impl Communicator {
    /// Runs one call across hosts on the worker's `stream` and waits for it; a failure is kept
    /// (reported by `check_error` and every later call).
    fn run_job(&self, work: &Work, stream: &Stream) {
        let Ok(hosts) = self.hosts() else {
            return;
        };
        let done = match work {
            Work::Collective(call) => hosts.run(self, call, stream),
            Work::Group(ops) => hosts.group(self, ops, stream),
        };
        let settled = stream.synchronize();
        if let Err(e) = done.and(settled) {
            hosts.fail(e);
        }
    }
}

impl Hosts {
    /// Queues `work` on `stream` (see the module docs): returns once queued. `buffers`: the
    /// call's memory (their drops wait for the call; a graph keeps them); `what`: the
    /// operation; `pieces`: its chunks (the emulator's wait is bounded by that many exchanges).
    pub(super) fn submit(
        self: &Arc<Self>,
        comm: &Communicator,
        work: Work,
        stream: &Stream,
        buffers: &[&BufferRef<'_>],
        what: &str,
        pieces: u64,
    ) -> Result<()> {
        let capturing = stream.is_capturing();
        let mut last = lock(&self.worker.last);
        if !capturing {
            if let Some(e) = last.as_ref() {
                stream.wait_event(e)?;
            }
        }
        let gate = self.gates.take(!capturing)?;
        let kept = capturing.then(|| {
            Arc::new(KeptGate {
                gates: Arc::clone(&self.gates),
                gate,
            })
        });
        let job = Job {
            comm: comm.shared()?,
            work: Arc::new(work),
            gate,
        };
        let queue = Arc::clone(&self.worker.queue);
        // A graph's host function hands over a copy of the job at every launch; any other call's
        // hands over the job itself, so that the host function drops nothing that may hold the
        // communicator's last reference.
        let slot = Mutex::new(Some(job));
        stream.call_host(move || {
            let mut held = lock(&slot);
            let job = if capturing { held.clone() } else { held.take() };
            drop(held);
            if let Some(job) = job {
                queue.arrive(job);
            }
        })?;
        let options = comm.options();
        let per_piece = comm.op_timeout + options.device_timeout;
        let bound = per_piece.saturating_mul(u32::try_from(2 * pieces + 2).unwrap_or(u32::MAX));
        let timeout = Error::HostTimeout {
            rank: comm.rank,
            what: format!("{what} across hosts (its stream waited for the exchange)"),
            timeout_ms: u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
        };
        // SAFETY: the gate is a word of mapped host memory that stays allocated while a stream
        // may reach it: gates outside graphs until passed (or for good, see `Gates`' drop), a
        // graph's for the graph's life (`kept`, retained below).
        unsafe {
            stream.wait_word(
                gate.device,
                RELEASED,
                bound.max(Duration::from_secs(1)),
                timeout,
            )?;
            stream.write_word(gate.device, PASSED)?;
        }
        match kept {
            Some(kept) => {
                let mut keep: Vec<Retained> = buffers.iter().filter_map(|b| b.retained()).collect();
                if let Ok(c) = comm.shared() {
                    keep.push(c as Retained);
                }
                keep.push(kept as Retained);
                for r in keep {
                    if !stream.retain_for_graph(Arc::clone(&r)) {
                        // A capture begun outside symcomm: nothing to hold them for the graph's
                        // life but the process.
                        std::mem::forget(r);
                    }
                }
            }
            None => {
                let done = Arc::new(stream.record_event()?);
                for b in buffers.iter().filter_map(|b| b.buffer) {
                    b.used_by(&done);
                }
                *last = Some(done);
            }
        }
        Ok(())
    }
}

/// A collective call's buffers as raw memory, for the worker.
///
/// # Safety
/// The buffers stay valid until the caller's stream has passed the call (the collectives'
/// contract), or for the life of the graph that captures it (which retains them).
pub(super) unsafe fn detach(call: &Call<'_>) -> Call<'static> {
    // SAFETY: this function's contract.
    let (send, recv) = unsafe {
        (
            BufferRef::from_raw(call.send.addr, call.send.bytes),
            BufferRef::from_raw(call.recv.addr, call.recv.bytes),
        )
    };
    Call {
        coll: call.coll,
        send,
        recv,
        count: call.count,
        dtype: call.dtype,
        op: call.op,
        root: call.root,
    }
}

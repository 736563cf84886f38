//! The proxy: how kernels signal ranks on other hosts.
//!
//! Loads and stores reach only this host's ranks. A kernel's `signal_set`, `signal_add`,
//! `put_with_signal` (and so `barrier`) aimed at a rank on another host hands the operation to
//! this rank's proxy instead (the device side and the ring's protocol are in `abi.h`, at
//! `SYMCOMM_PROXY_SLOTS`): a host thread that takes operations from the ring in ticket order and
//! sends each, with a put's data, to the peer's proxy over UCX (its own worker and endpoints,
//! apart from the host collectives'). The peer's proxy writes the data into its copy of the
//! window and then release-stores (or adds) the signal word, so a kernel that waits for the
//! signal there sees the data, exactly as with a put on one host. Operations of one rank to one
//! peer are applied in the order they were issued (one tag sequence per pair of ranks).
//!
//! Windows are named by their allocation's number (the same on every rank): the sending proxy
//! turns the destination address in its own copy into (window, offset), the receiving one back
//! into an address in its own copy, after checking the range.
//!
//! The ring and the count of operations taken lie in host memory the device maps (pinned memory
//! on a GPU), the ticket counter in device memory. The proxy reaches device memory through
//! [`ProxyCopies`]: on a GPU, copies on a non-blocking stream of its own and
//! `cuStreamWriteValue64` for the signal word (ordered after the data); on the emulator, plain
//! copies and an atomic store. Every signal word a rank of another host writes here is written
//! by this proxy alone (words are never reset, and only their sender writes them), so the proxy
//! keeps each one's value and turns an add into a store of the new value: no atomic
//! read-modify-write on device memory from the host is needed.
//!
//! Failures (a peer's proxy lost, a message naming an unknown window) are recorded in this
//! rank's error record (op `SYMCOMM_OP_PROXY`) and raise its abort flag, so that every wait of
//! its kernels returns instead of running into its deadline.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use symcomm_device::abi::{
    ErrorRecord, ProxyOp, ProxyQueue, SYMCOMM_OP_PROXY, SYMCOMM_PROXY_PUT,
    SYMCOMM_PROXY_SIGNAL_ADD, SYMCOMM_PROXY_SIGNAL_SET, SYMCOMM_PROXY_SLOTS, SYMCOMM_SIGNAL_WORDS,
    SYMCOMM_STATUS_ABORTED, SYMCOMM_STATUS_INVALID_ARGUMENT,
};

use super::memory::{ControlBlock, FlatMapping};
use crate::backend::cuda::ProxyCopies as CudaCopies;
use crate::backend::emu::proxy::ProxyCopies as EmuCopies;
use crate::backend::{MappedHost, PerBackend, on_backend};
use crate::stream::Buffer;
use crate::ucx::{Outbox, Ucx};
use crate::{Error, Result};

/// Bytes of a message's header: op, word (u32 each), window, offset, value, bytes (u64 each).
const HEADER: usize = 40;
/// Where the count of taken operations lies in the host memory of the ring (its own cache line).
const TAKEN_OFFSET: usize = 0;
/// Where the ring starts in its host memory.
const RING_OFFSET: usize = 64;
/// How long the proxy keeps polling without pause after its last operation; then it sleeps
/// [`IDLE_SLEEP`] between polls (the latency of the first operation after a quiet spell).
const BUSY_SPELL: Duration = Duration::from_millis(2);
const IDLE_SLEEP: Duration = Duration::from_micros(50);

/// A window the proxy may write: this rank's copy of allocation `id`.
#[derive(Clone, Copy, Debug)]
struct Region {
    id: u64,
    base: u64,
    bytes: u64,
}

/// What the communicator and the proxy thread share.
struct Shared {
    stop: AtomicBool,
    regions: Mutex<Vec<Region>>,
}

impl Shared {
    fn regions(&self) -> std::sync::MutexGuard<'_, Vec<Region>> {
        self.regions.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// This rank's proxy: the queue kernels write and the thread that serves it.
pub(super) struct Proxy {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// The ProxyQueue (device memory); freed after the thread stopped.
    queue: Buffer,
    /// The taken count and the ring; freed after the thread stopped (a field drops after the
    /// `Drop` body), through `crate::sync_free` (cuMemFreeHost synchronizes the GPU).
    _ring: MappedHost,
}

/// Where the proxy thread finds its rank's memory.
struct Memory {
    /// Host address of the taken count and the ring.
    ring: u64,
    /// Device address of this rank's signal array.
    signals: u64,
}

impl Proxy {
    /// Starts the proxy of rank `rank` (of `nranks`) whose endpoints to the ranks of other hosts
    /// (`remote`) are in `ucx`; `signals` is the communicator's signal area.
    pub(super) fn start(
        ucx: Ucx,
        rank: u32,
        remote: Vec<u32>,
        signals: &FlatMapping,
        block: Arc<ControlBlock>,
        backend: &crate::backend::Backend,
    ) -> Result<Proxy> {
        let bytes = RING_OFFSET + SYMCOMM_PROXY_SLOTS as usize * size_of::<ProxyOp>();
        let ring = MappedHost::new(backend, bytes)?;
        let (host, device) = (ring.host_ptr() as u64, ring.device_ptr());
        let copies = backend.make(|d| d.proxy_copies(), || Ok(EmuCopies))?;
        let queue = Buffer::new(backend, size_of::<ProxyQueue>())?;
        let head = ProxyQueue {
            next: 0,
            ring: device + RING_OFFSET as u64,
            taken: device + TAKEN_OFFSET as u64,
        };
        queue.write(0, &[head.next, head.ring, head.taken])?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            regions: Mutex::new(Vec::new()),
        });
        let memory = Memory {
            ring: host,
            signals: signals.copy_addr(rank)?,
        };
        let mut worker = Worker {
            ucx,
            rank,
            sent: vec![0; remote.len()],
            received: vec![0; remote.len()],
            values: vec![0; remote.len() * SYMCOMM_SIGNAL_WORDS as usize],
            remote,
            memory,
            copies,
            block,
            shared: Arc::clone(&shared),
            outbox: Outbox::default(),
            taken: 0,
        };
        let thread = std::thread::Builder::new()
            .name(format!("symcomm-proxy-{rank}"))
            .spawn(move || worker.run())
            .map_err(|e| Error::io("starting the proxy thread", e))?;
        Ok(Proxy {
            shared,
            thread: Some(thread),
            queue,
            _ring: ring,
        })
    }

    /// Device address of the ProxyQueue (`DevComm::proxy`).
    pub(super) fn addr(&self) -> u64 {
        self.queue.addr()
    }

    /// Lets the proxy write this rank's copy of `mapping` (`bytes` per rank), whose allocation
    /// number names it in messages.
    pub(super) fn add_region(&self, mapping: &FlatMapping, rank: u32, bytes: u64) -> Result<()> {
        let region = Region {
            id: mapping.id(),
            base: mapping.copy_addr(rank)?,
            bytes,
        };
        self.shared.regions().push(region);
        Ok(())
    }

    /// Forgets allocation `id` (its window is gone).
    pub(super) fn remove_region(&self, id: u64) {
        self.shared.regions().retain(|r| r.id != id);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The proxy thread's state.
struct Worker {
    ucx: Ucx,
    rank: u32,
    /// The ranks of other hosts, and per rank the number of messages sent to it / received
    /// from it (each message's tag).
    remote: Vec<u32>,
    sent: Vec<u64>,
    received: Vec<u64>,
    /// Per rank of another host (in `remote`'s order), the value of each of its signal words
    /// here: only this proxy writes them.
    values: Vec<u64>,
    memory: Memory,
    copies: PerBackend<CudaCopies, EmuCopies>,
    block: Arc<ControlBlock>,
    shared: Arc<Shared>,
    outbox: Outbox,
    /// Operations taken from the ring so far.
    taken: u64,
}

impl Worker {
    fn run(&mut self) {
        let mut busy = Instant::now();
        while !self.shared.stop.load(Ordering::Acquire) {
            match self.step() {
                Ok(true) => busy = Instant::now(),
                Ok(false) if busy.elapsed() < BUSY_SPELL => std::thread::yield_now(),
                Ok(false) => std::thread::sleep(IDLE_SLEEP),
                Err(e) => {
                    self.fail(u32::MAX, &e);
                    break;
                }
            }
        }
        self.ucx.drain(&mut self.outbox, Duration::from_secs(1));
    }

    /// One round: the ring's new operations, then every peer's arrived messages. Returns
    /// whether anything happened.
    fn step(&mut self) -> Result<bool> {
        let mut active = self.ucx.progress(&mut self.outbox, "proxy")?;
        while let Some(op) = self.next_op() {
            self.send(&op)?;
            self.taken += 1;
            self.taken_word().store(self.taken, Ordering::Release);
            active = true;
        }
        for i in 0..self.remote.len() {
            let peer = self.remote[i];
            let deadline = Instant::now() + Duration::from_secs(10);
            while let Some(msg) = self
                .ucx
                .try_recv(peer, self.received[i], "proxy", deadline)?
            {
                self.received[i] += 1;
                self.apply(i, &msg)?;
                active = true;
            }
        }
        Ok(active || !self.outbox.is_empty())
    }

    fn taken_word(&self) -> &AtomicU64 {
        // SAFETY: the taken count is an 8-aligned word of the ring's host memory, which the
        // Proxy frees only after this thread stopped; kernels read it with atomic loads.
        unsafe { AtomicU64::from_ptr((self.memory.ring + TAKEN_OFFSET as u64) as *mut u64) }
    }

    /// The ring's next operation, once its kernel thread published it.
    fn next_op(&self) -> Option<ProxyOp> {
        let slot = (self.memory.ring + RING_OFFSET as u64)
            + (self.taken % u64::from(SYMCOMM_PROXY_SLOTS)) * size_of::<ProxyOp>() as u64;
        // SAFETY: `slot` is a ProxyOp of the ring (host memory, alive while this thread runs); its `ticket` is written by kernels with a release store, read here
        // with an acquire load, after which the other fields (written before it) are stable
        // until this thread advances `taken`.
        unsafe {
            let ticket = AtomicU64::from_ptr(slot as *mut u64);
            if ticket.load(Ordering::Acquire) != self.taken + 1 {
                return None;
            }
            Some(std::ptr::read_volatile(slot as *const ProxyOp))
        }
    }

    /// Sends operation `op` to its peer's proxy.
    fn send(&mut self, op: &ProxyOp) -> Result<()> {
        let Some(i) = self.remote.iter().position(|&r| r == op.peer) else {
            self.refuse(op.peer, op.ticket);
            return Ok(());
        };
        let (window, offset, len) = if op.op == SYMCOMM_PROXY_PUT {
            let found = self
                .shared
                .regions()
                .iter()
                .find(|r| {
                    op.dst >= r.base && op.bytes <= r.bytes && op.dst - r.base <= r.bytes - op.bytes
                })
                .copied();
            let Some(r) = found else {
                self.refuse(op.peer, op.ticket);
                return Ok(());
            };
            (r.id, op.dst - r.base, op.bytes as usize)
        } else {
            (0, 0, 0)
        };
        let mut msg = Vec::with_capacity(HEADER + len);
        msg.extend_from_slice(&op.op.to_le_bytes());
        msg.extend_from_slice(&op.word.to_le_bytes());
        msg.extend_from_slice(&window.to_le_bytes());
        msg.extend_from_slice(&offset.to_le_bytes());
        msg.extend_from_slice(&op.value.to_le_bytes());
        msg.extend_from_slice(&(len as u64).to_le_bytes());
        msg.resize(HEADER + len, 0);
        // SAFETY: the kernel handed over `bytes` bytes of device memory at `src` and waits
        // until `taken` passes this operation before it may reuse or free them.
        let read = on_backend!(&self.copies, c => unsafe { c.read(op.src, &mut msg[HEADER..]) });
        if let Err(e) = read {
            tracing::error!(
                target: "symcomm::proxy",
                "rank {}: the proxy could not read a put's source: {e}",
                self.rank
            );
            self.refuse(op.peer, op.ticket);
            return Ok(());
        }
        let tag = self.sent[i];
        self.sent[i] += 1;
        self.ucx
            .post_send(&mut self.outbox, op.peer, tag, msg, "proxy")
    }

    /// Applies a message from rank `self.remote[i]`'s proxy to this rank's memory. An error:
    /// the device memory could not be written (the proxy stops).
    fn apply(&mut self, i: usize, msg: &[u8]) -> Result<()> {
        let peer = self.remote[i];
        let word = |at: usize| u64::from_le_bytes(msg[at..at + 8].try_into().unwrap_or_default());
        let half = |at: usize| u32::from_le_bytes(msg[at..at + 4].try_into().unwrap_or_default());
        if msg.len() < HEADER || msg.len() - HEADER != word(32) as usize {
            self.refuse(peer, 0);
            return Ok(());
        }
        let (op, sig, window, offset, value) = (half(0), half(4), word(8), word(16), word(24));
        let data = &msg[HEADER..];
        if sig >= SYMCOMM_SIGNAL_WORDS {
            self.refuse(peer, u64::from(sig));
            return Ok(());
        }
        let dst = if op == SYMCOMM_PROXY_PUT {
            let region = self
                .shared
                .regions()
                .iter()
                .find(|r| r.id == window)
                .copied();
            let len = data.len() as u64;
            match region {
                Some(r) if len <= r.bytes && offset <= r.bytes - len => r.base + offset,
                _ => {
                    self.refuse(peer, window);
                    return Ok(());
                }
            }
        } else {
            0
        };
        let slot = i * SYMCOMM_SIGNAL_WORDS as usize + sig as usize;
        let new = match op {
            SYMCOMM_PROXY_SIGNAL_ADD => self.values[slot].wrapping_add(value),
            SYMCOMM_PROXY_SIGNAL_SET | SYMCOMM_PROXY_PUT => value,
            _ => {
                self.refuse(peer, u64::from(op));
                return Ok(());
            }
        };
        self.values[slot] = new;
        let signal = self.memory.signals
            + (u64::from(peer) * u64::from(SYMCOMM_SIGNAL_WORDS) + u64::from(sig)) * 8;
        let data = if op == SYMCOMM_PROXY_PUT {
            data
        } else {
            &[][..]
        };
        // SAFETY: [dst, dst + data.len()) lies inside this rank's copy of the window (checked
        // above), mapped while the region is registered; `signal` is the word `sig` that this
        // rank reserves for `peer` in its own signal array (peer < nranks: one of the connected
        // ranks; sig checked above), which kernels access with atomics only.
        on_backend!(&self.copies, c => unsafe { c.write_and_signal(dst, data, signal, new) })
    }

    /// Records an operation the proxy cannot carry out (InvalidArgument, op SYMCOMM_OP_PROXY).
    fn refuse(&self, peer: u32, detail: u64) {
        tracing::error!(
            target: "symcomm::proxy",
            "rank {}: the proxy refused an operation with rank {peer} (detail {detail:#x})",
            self.rank
        );
        self.record(SYMCOMM_STATUS_INVALID_ARGUMENT, peer, detail);
    }

    /// The proxy cannot go on (`e`): recorded as Aborted, and the abort flag raised so that
    /// the kernels' waits return.
    fn fail(&self, peer: u32, e: &Error) {
        tracing::error!(target: "symcomm::proxy", "rank {}: the proxy stopped: {e}", self.rank);
        let peer = match e {
            Error::PeerLost { rank, .. } => *rank,
            _ => peer,
        };
        self.record(SYMCOMM_STATUS_ABORTED, peer, 0);
        self.block.raise_abort();
    }

    fn record(&self, status: u32, peer: u32, detail: u64) {
        self.block.record(&ErrorRecord {
            status,
            rank: self.rank,
            peer,
            op: SYMCOMM_OP_PROXY,
            detail,
            time_ns: now_ns(),
        });
    }
}

/// The clock of error records on the emulator (the device's steady clock: CLOCK_MONOTONIC).
fn now_ns() -> u64 {
    let mut t = nix::libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

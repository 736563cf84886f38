//! Launch order among the ranks of a communicator that share a CUDA context (ranks as threads of
//! one process on one GPU).
//!
//! A GPU serves a context's streams through a few hardware queues (`CUDA_DEVICE_MAX_CONNECTIONS`,
//! 8 unless set; 1 where Megatron or Transformer Engine set it): streams beyond that share a queue,
//! which starts its items in the order they were queued, and an item waiting for its own
//! stream's previous kernel holds every item behind it. So if rank A queues two collectives on
//! its stream before rank B queued its first on a stream of the same hardware queue, A's second
//! kernel holds the queue until A's first finished, and A's first waits for B's, queued behind:
//! a deadlock until the device timeout. Nothing tells which streams share a queue.
//!
//! The cure: after a rank queued a kernel that waits for peers' kernels, it waits (on the host)
//! until those peers of its context queued theirs. Then whatever a rank queues later, on any
//! stream, comes after every kernel its queued work waits for, in every hardware queue: follow
//! the chain of what waits for what and each link was queued earlier than the one before, so
//! the chain ends at work that can run. Ranks as threads call in lockstep anyway (a collective
//! completes only once all of them queued it); this keeps a rank from queuing work past a
//! collective its peers have not queued yet. Ranks in other processes or on other GPUs have
//! other contexts, whose hardware queues are separate. On the emulator, whose streams share
//! hardware queues only when `CUDA_DEVICE_MAX_CONNECTIONS` is set (`backend/emu/queue.rs`), the
//! order is kept only then.
//!
//! A waiting rank on a GPU spins for a few microseconds first (the peers' threads usually queue
//! their kernels within that, and a sleep and wake-up would cost more than the kernel of a small
//! collective); on the emulator, whose CPUs run the kernels, it sleeps at once.
//!
//! The counts are per lane and per pair of ranks: a collective's kernel waits for every peer's,
//! a send/recv group's only for the peers it exchanges with. Co-resident launches of the users'
//! kernels through [`Communicator::launch`] count as collectives on a lane of their own
//! ([`USER_LANE`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::Communicator;
use super::coll::MAX_STREAMS;
use crate::stream::Stream;
use crate::{Error, Result};

/// The lane the co-resident launches of [`Communicator::launch`] are counted on (after the
/// collective lanes `0..MAX_STREAMS`).
pub(super) const USER_LANE: u32 = MAX_STREAMS as u32;

/// Lanes counted: the collective lanes and [`USER_LANE`].
const LANES: usize = MAX_STREAMS + 1;

/// One communicator's launch counts among its ranks that share this process's context on one
/// GPU ([`LaunchOrder`] is one rank's handle).
struct Shared {
    /// The communicator ([`super::Communicator::group`]) and GPU (its UUID; `None`: the
    /// emulated GPU).
    key: (u64, Option<[u8; 16]>),
    /// The ranks that share the context, in rank order.
    members: Vec<u32>,
    /// `launched[(lane * m + from) * m + to]`: kernels that rank `members[from]` queued on lane
    /// `lane` which wait for `members[to]`'s; `u64::MAX` from a rank that left.
    launched: Mutex<Vec<u64>>,
    /// Signalled when a count grows.
    grew: Condvar,
    /// Counts every growth (what spinning ranks watch without taking the lock).
    growths: AtomicU64,
}

/// Every [`Shared`] of the process (by `Weak`: it ends with its communicator's ranks).
static ORDERS: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// How long a waiting rank on a GPU spins before it sleeps.
const SPIN: Duration = Duration::from_micros(50);

/// How long a waiting rank sleeps between checks of its communicator's faults.
const CHECK_EVERY: Duration = Duration::from_millis(20);

/// One rank's part in the launch order of its communicator's ranks that share its context.
pub(crate) struct LaunchOrder {
    shared: Arc<Shared>,
    /// This rank's index in `shared.members`.
    me: usize,
    /// Spin for [`SPIN`] before sleeping (on a GPU).
    spin: bool,
}

impl LaunchOrder {
    /// Rank `rank`'s handle, with `members` (this rank among them, in rank order) the ranks of
    /// communicator `group` in this process on the same GPU (`gpu`), spinning briefly before
    /// sleeping when `spin`; `None` when it is alone there (nothing to order).
    pub(crate) fn join(
        group: u64,
        gpu: Option<[u8; 16]>,
        members: Vec<u32>,
        rank: u32,
        spin: bool,
    ) -> Option<LaunchOrder> {
        if members.len() < 2 {
            return None;
        }
        let me = members.iter().position(|&r| r == rank)?;
        let key = (group, gpu);
        let mut orders = ORDERS.lock().unwrap_or_else(PoisonError::into_inner);
        orders.retain(|w| w.strong_count() > 0);
        let found = orders
            .iter()
            .filter_map(Weak::upgrade)
            .find(|s| s.key == key && s.members == members);
        let shared = found.unwrap_or_else(|| {
            let m = members.len();
            let s = Arc::new(Shared {
                key,
                members,
                launched: Mutex::new(vec![0; LANES * m * m]),
                grew: Condvar::new(),
                growths: AtomicU64::new(0),
            });
            orders.push(Arc::downgrade(&s));
            s
        });
        Some(LaunchOrder { shared, me, spin })
    }

    fn counts(&self) -> MutexGuard<'_, Vec<u64>> {
        self.shared
            .launched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the ranks waiting for a count (called with the counts' lock held or just after).
    fn grown(&self) {
        self.shared.growths.fetch_add(1, Ordering::Release);
        self.shared.grew.notify_all();
    }

    fn at(&self, lane: usize, from: usize, to: usize) -> usize {
        let m = self.shared.members.len();
        (lane * m + from) * m + to
    }

    /// Records that this rank queued a kernel on lane `lane` that waits for the kernels of
    /// `peers` (ranks of the communicator; those outside this context do not count), and, when
    /// `queued` (the launch succeeded), waits until each of those peers queued its matching
    /// kernel. A failed launch is counted too, so that its peers do not wait for it.
    ///
    /// # Errors
    /// What `fault` returns while waiting (checked every few milliseconds); [`Error::HostTimeout`]
    /// when a peer has not queued its kernel within `timeout`.
    pub(crate) fn queued(
        &self,
        rank: u32,
        lane: u32,
        peers: impl IntoIterator<Item = u32>,
        queued: bool,
        timeout: Duration,
        fault: impl Fn() -> Option<Error>,
    ) -> Result<()> {
        let lane = lane as usize;
        let peers: Vec<usize> = peers
            .into_iter()
            .filter_map(|p| self.shared.members.iter().position(|&r| r == p))
            .filter(|&p| p != self.me)
            .collect();
        let mut counts = self.counts();
        let mut need = Vec::with_capacity(peers.len());
        for &p in &peers {
            let i = self.at(lane, self.me, p);
            counts[i] += 1;
            need.push((p, counts[i]));
        }
        self.grown();
        if !queued {
            return Ok(());
        }
        let start = Instant::now();
        let deadline = start + timeout;
        loop {
            let behind = need
                .iter()
                .find(|&&(p, n)| counts[self.at(lane, p, self.me)] < n);
            let Some(&(p, _)) = behind else {
                return Ok(());
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::HostTimeout {
                    rank,
                    what: format!(
                        "waiting for rank {} (a thread of this process on the same GPU) to queue \
                         its kernel of the collective this rank queued on lane {lane} (so that \
                         no later work of this rank sits ahead of it in a hardware queue)",
                        self.shared.members[p]
                    ),
                    timeout_ms: timeout.as_millis() as u64,
                });
            }
            if let Some(e) = fault() {
                return Err(e);
            }
            if self.spin && now < start + SPIN {
                let seen = self.shared.growths.load(Ordering::Acquire);
                drop(counts);
                while self.shared.growths.load(Ordering::Acquire) == seen && start.elapsed() < SPIN
                {
                    std::hint::spin_loop();
                }
                counts = self.counts();
                continue;
            }
            let slice = CHECK_EVERY.min(deadline - now);
            counts = self
                .shared
                .grew
                .wait_timeout(counts, slice)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

impl Drop for LaunchOrder {
    /// A rank that leaves releases every peer waiting for it: its kernels will not come, and the
    /// peers' own kernels report that (their waits are bounded).
    fn drop(&mut self) {
        let m = self.shared.members.len();
        let mut counts = self.counts();
        for lane in 0..LANES {
            for to in 0..m {
                let i = self.at(lane, self.me, to);
                counts[i] = u64::MAX;
            }
        }
        drop(counts);
        self.grown();
    }
}

impl Communicator {
    /// Called right after this rank queued a kernel on lane `lane` of `stream` that waits for
    /// the kernels of `peers` (`issued`: whether queuing it succeeded): with other ranks of this
    /// communicator in this CUDA context, counts it and waits until those peers queued theirs
    /// (the module's docs), bounded by the operation timeout and ended by a fault. Nothing for
    /// work recorded into a graph (it is queued when the graph is launched).
    ///
    /// # Errors
    /// `issued`'s error; else as [`LaunchOrder::queued`].
    pub(super) fn order_launch(
        &self,
        lane: u32,
        stream: &Stream,
        peers: impl IntoIterator<Item = u32>,
        issued: Result<()>,
    ) -> Result<()> {
        let Some(order) = &self.order else {
            return issued;
        };
        if stream.is_capturing() {
            return issued;
        }
        order.queued(
            self.rank,
            lane,
            peers,
            issued.is_ok(),
            self.op_timeout,
            || self.control.fault(),
        )?;
        issued
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    fn pair(group: u64) -> (LaunchOrder, LaunchOrder) {
        let a = LaunchOrder::join(group, None, vec![3, 5], 3, true).unwrap();
        let b = LaunchOrder::join(group, None, vec![3, 5], 5, false).unwrap();
        (a, b)
    }

    #[test]
    fn alone_has_nothing_to_order() {
        assert!(LaunchOrder::join(1, None, vec![7], 7, false).is_none());
    }

    #[test]
    fn a_rank_waits_until_its_peer_queued() {
        let (a, b) = pair(0x5157);
        let t = std::thread::spawn(move || {
            a.queued(3, 1, [5], true, Duration::from_secs(10), || None)
                .unwrap();
            a
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "rank 3 went on before rank 5 queued");
        b.queued(5, 1, [3], true, Duration::from_secs(10), || None)
            .unwrap();
        let a = t.join().unwrap();
        // Another lane and other ranks are counted apart: rank 3 on lane 0, with a peer outside
        // the context (rank 9), does not wait for rank 5's lane 1.
        b.queued(5, 0, [3, 9], false, Duration::from_secs(10), || None)
            .unwrap();
        a.queued(3, 0, [5, 9], true, Duration::from_secs(10), || None)
            .unwrap();
    }

    #[test]
    fn waits_are_bounded_and_see_faults() {
        let (a, b) = pair(0x7153);
        let start = Instant::now();
        let e = a
            .queued(3, 0, [5], true, Duration::from_millis(100), || None)
            .unwrap_err();
        assert!(matches!(e, Error::HostTimeout { rank: 3, .. }), "{e}");
        assert!(e.to_string().contains("rank 5"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(5));
        let e = a
            .queued(3, 0, [5], true, Duration::from_secs(60), || {
                Some(Error::InvalidArgument("fault".into()))
            })
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        // A rank that leaves releases its peers.
        drop(b);
        a.queued(3, 0, [5], true, Duration::from_secs(60), || None)
            .unwrap();
    }
}

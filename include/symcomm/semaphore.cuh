// symcomm device library: semaphores between ranks, with the expected count in device memory.
//
// A semaphore is a users' signal word (`word` in [0, SYMCOMM_USER_SIGNAL_END)) of the pair
// (waiting rank, signalling peer) used as a counter: the peer adds 1 per signal
// (`semaphore_signal`), the waiter counts the signals it consumed in a counter of its own
// (`semaphore_wait`) and waits until the word exceeds it. Neither side needs an epoch from the
// host: the word and the counter live in device memory and only grow, so the same kernel with
// the same arguments can be relaunched back to back or replayed in a CUDA graph (the MSCCL++
// semaphore pattern).
//
// Where the waiter's counter lives: in device memory the caller provides (`uint64_t* expected`,
// one per (peer, word) pair the rank waits on, e.g. an array indexed by peer). The rank's own row
// of the signal area (the words it reserves for itself) has only one word per index, not one per
// (peer, word), so it cannot hold them; and a counter in the caller's memory is private to the
// waiter, so a relaxed read-modify-write by the polling thread is enough.
//
// One signal per wait: a peer's k-th semaphore_signal on a word releases the waiter's k-th
// semaphore_wait on it (signals may run ahead of waits; they are counted, not lost).
#pragma once

#include <symcomm/group.cuh>
#include <symcomm/memory.cuh>
#include <symcomm/signal.cuh>

namespace symcomm {

/// Signals the semaphore `word` that `peer` waits on for this rank: release-adds 1 to the signal
/// word `word` that `peer` reserves for this rank (signal_add). Called by one thread. Ordering:
/// everything this thread wrote before (and, cumulatively, what it observed: its CTA's writes
/// after a `__syncthreads()`) is visible to the peer's group once the matching semaphore_wait
/// returns. Several threads, CTAs or kernels of this rank may signal the same word; every call
/// counts.
/// Returns Ok, or InvalidArgument (recorded: op SYMCOMM_OP_SIGNAL, detail `peer << 32 | word`,
/// nothing added) unless peer < comm.nranks and word < SYMCOMM_USER_SIGNAL_END.
template <Scope S = Scope::Sys>
SYMCOMM_DEVICE Status semaphore_signal(Thread t, const DevComm& comm, uint32_t peer, uint32_t word);

/// Waits for the next signal of `peer` on the semaphore `word`: increments this rank's expected
/// count `*expected` and waits until the signal word `word` that this rank reserves for `peer`
/// reaches it.
///
/// Who calls: every thread of `g` (Thread, Warp or Cta) with the same arguments; thread 0 of the
/// group reads and writes `*expected` and polls. At most one group of the rank waits on a given
/// (peer, word) pair at a time (the counter is not shared).
/// Pre: `expected` points to device memory of this rank that only this call touches, holding the
/// number of signals of `peer` on `word` consumed so far: zero for a fresh communicator (the
/// signal area starts zeroed), then left to this function. Allocate it once, next to the kernel's
/// other persistent state; never reset it while the communicator lives.
/// Ordering: as for the group signal_wait_until: after an Ok return every thread of the group sees
/// what the peer wrote before its semaphore_signal.
/// Post: on Ok, `*expected` grew by one. On any other status it is unchanged.
/// Returns, the same on every thread: Ok; Timeout / Aborted (recorded: op SYMCOMM_OP_SIGNAL_WAIT,
/// peer, detail the awaited count); at once an earlier recorded error's status; InvalidArgument
/// as signal_wait_until (nothing read, `*expected` unchanged).
template <Scope S = Scope::Sys, typename Group>
SYMCOMM_DEVICE Status semaphore_wait(Group g, const DevComm& comm, uint32_t peer, uint32_t word, uint64_t* expected);

}  // namespace symcomm

#include <symcomm/impl/semaphore.cuh>

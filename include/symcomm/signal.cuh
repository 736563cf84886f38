// symcomm device library: signals between ranks, bounded waits, error records.
//
// A signal is a 64-bit signal word in the communicator's signal area that only grows (an epoch).
// Rank p signals rank r by release-storing (or release-adding) into r's word reserved for p; r
// waits with acquire loads until the word reaches a value. Words are never reset in place, so
// back-to-back launches and CUDA-graph replay need no host intervention: callers derive the next
// epoch from state kept in device memory.
//
// Users' signals (signal_set, signal_add, signal_wait_until) take words in
// [0, SYMCOMM_USER_SIGNAL_END) only and refuse any other word (and a peer outside the team) with
// Status::InvalidArgument, touching nothing: the words above belong to barriers and send/recv
// (abi.h), and a stray user signal there would corrupt their epochs. The library's own code
// (barrier.cuh, the built-in kernels) reaches its words through the unchecked detail:: functions
// of impl/signal.cuh.
//
// Waits come for one thread (`signal_wait_until(Thread, ...)`) and for a Warp or a Cta: one
// thread polls and the group's vote hands the status and the acquired writes to every thread.
// Users' kernels report their own failures with `record_user_error` (op SYMCOMM_OP_USER).
//
// Every wait is bounded, in release builds too: it polls the communicator's abort flag and a
// deadline (`DevComm::timeout_ns`) and returns a Status instead of spinning forever. A failed wait
// records the first error of the rank in its ErrorRecord, where the host reads it after the kernel.
// Once that record holds an error, every later wait of the rank (in this kernel or a later one)
// returns that error's status at once instead of waiting for its deadline.
#pragma once

#include <symcomm/group.cuh>
#include <symcomm/memory.cuh>

namespace symcomm {

/// Result of a wait or a collective (the SYMCOMM_STATUS_* codes of abi.h).
enum class Status : uint32_t {
    Ok = SYMCOMM_STATUS_OK,
    Timeout = SYMCOMM_STATUS_TIMEOUT,
    Aborted = SYMCOMM_STATUS_ABORTED,
    Mismatch = SYMCOMM_STATUS_MISMATCH,
    AbiMismatch = SYMCOMM_STATUS_ABI_MISMATCH,
    InvalidArgument = SYMCOMM_STATUS_INVALID_ARGUMENT,
};

/// Records `status` as this rank's first error (later errors are dropped), with the peer, the
/// operation (SYMCOMM_OP_*) and a detail word. Any thread may call it; it never blocks.
SYMCOMM_DEVICE void record_error(Thread, const DevComm& comm, Status status, uint32_t peer, uint32_t op,
                                 uint64_t detail);

/// The status of this rank's first recorded error (Ok while none was recorded). A relaxed load:
/// the status is all a wait needs to give up, and the host reads the other fields only after
/// the kernel finished.
SYMCOMM_DEVICE Status recorded_error(const DevComm& comm);

/// True once the host (or a peer's failure handling) raised the communicator's abort flag.
SYMCOMM_DEVICE bool abort_requested(const DevComm& comm);

/// Polls the 64-bit word `p` with acquire loads until `done(value)` holds; the bounded wait
/// under every symcomm wait. Called by one thread. Returns Ok (with `seen` = the value that
/// satisfied `done`, acquire ordering), or Aborted / Timeout after recording the error with
/// `peer`, `op` and `detail` in the rank's ErrorRecord, or, when that record already holds an
/// error (this kernel's or an earlier one's), that error's status at once, recording nothing
/// (the record keeps the first error): a rank that failed is broken, and kernels queued behind
/// the failed one must not each wait out a full deadline.
template <Scope S, typename Done>
SYMCOMM_DEVICE Status poll_until(Thread t, const DevComm& comm, const uint64_t* p, Done done, uint32_t peer,
                                 uint32_t op, uint64_t detail, uint64_t& seen);

/// Signals `peer`: release-stores `value` into the signal word `word` that `peer` reserves for
/// this rank. Called by one thread. Everything this thread wrote before (and, cumulatively, what
/// it observed, e.g. its CTA's writes after a `__syncthreads()`) is visible to the peer once its
/// wait returns.
/// Pre: value is larger than any value stored in that word before (epochs only grow).
/// Returns Ok, or InvalidArgument (recorded: op SYMCOMM_OP_SIGNAL, detail `peer << 32 | word`,
/// nothing stored) unless peer < comm.nranks and word < SYMCOMM_USER_SIGNAL_END.
/// A peer on another host (communicators across hosts): the store goes through this rank's proxy
/// (DevComm::proxy, abi.h at SYMCOMM_PROXY_SLOTS), which applies it on the peer's host with the
/// same ordering, at network cost (tens of microseconds); the call returns once the proxy has
/// taken it (a bounded wait for a free ring slot). Without a proxy (DevComm::proxy 0) it returns
/// InvalidArgument, recorded (op SYMCOMM_OP_PROXY, detail `peer | SYMCOMM_REFUSED_REMOTE << 32`).
template <Scope S = Scope::Sys>
SYMCOMM_DEVICE Status signal_set(Thread t, const DevComm& comm, uint32_t peer, uint32_t word, uint64_t value);

/// Signals `peer` by adding: release-adds `delta` to the signal word `word` that `peer` reserves
/// for this rank (an atomic read-modify-write, so several threads or CTAs of this rank may add to
/// the same word; the peer waits for the sum). Called by one thread; ordering as for signal_set.
/// Stores the word's previous value into `*previous` when that is not null.
/// Returns Ok, or InvalidArgument as signal_set does (nothing added, `*previous` untouched).
/// A peer on another host: through the proxy as for signal_set, and only with `previous` null
/// (the proxy does not return values): otherwise InvalidArgument, recorded as there.
template <Scope S = Scope::Sys>
SYMCOMM_DEVICE Status signal_add(Thread t, const DevComm& comm, uint32_t peer, uint32_t word, uint64_t delta,
                                 uint64_t* previous = nullptr);

/// Waits until the signal word `word` that this rank reserves for `peer` holds a value >= `value`.
/// Called by one thread. Returns Status::Ok with acquire ordering (the peer's writes before its
/// signal are visible), or Timeout / Aborted after recording the error, or at once the status of
/// an error the rank recorded before; never spins forever. Returns InvalidArgument (recorded: op SYMCOMM_OP_SIGNAL_WAIT, detail `peer << 32 | word`,
/// nothing read) unless peer < comm.nranks and word < SYMCOMM_USER_SIGNAL_END.
template <Scope S = Scope::Sys>
SYMCOMM_DEVICE Status signal_wait_until(Thread t, const DevComm& comm, uint32_t peer, uint32_t word,
                                        uint64_t value);

/// Combines the statuses of a group's threads (a collective call of the group, which it also
/// synchronizes): Ok when every thread had Ok, else the most specific failure any thread saw
/// (Mismatch, then AbiMismatch, InvalidArgument, Aborted, Timeout). The fast path is one
/// group-wide vote.
template <typename Group>
SYMCOMM_DEVICE Status group_status(Group g, Status s);

/// Group form of signal_wait_until: waits until the signal word `word` that this rank reserves
/// for `peer` holds a value >= `value`.
///
/// Who calls: every thread of `g` (a Warp or a Cta), with the same arguments. Thread 0 of the
/// group polls (one poller per group, so a CTA does not multiply the memory traffic of the wait
/// by its size); the others wait at the group's vote.
/// Ordering: thread 0's acquire load, then the group barrier (`__syncthreads_or` for a Cta,
/// `__any_sync` plus `__syncwarp()` for a Warp) makes the peer's writes before its signal visible
/// to every thread of the group after return: acquire in one thread and a CTA or warp barrier
/// compose on the GPU (PTX causality order is transitive through bar.sync / bar.warp.sync), as
/// in the emulator (the barrier is a ThreadSanitizer happens-before edge).
/// Returns, the same on every thread: what signal_wait_until returned on thread 0 (Ok, Timeout,
/// Aborted, an earlier recorded error's status, or InvalidArgument for a word outside
/// [0, SYMCOMM_USER_SIGNAL_END) or a peer outside the team), recorded once.
template <Scope S = Scope::Sys, typename Group>
SYMCOMM_DEVICE Status signal_wait_until(Group g, const DevComm& comm, uint32_t peer, uint32_t word, uint64_t value);

/// Records a user kernel's own error in this rank's ErrorRecord (first error wins, as for the
/// library's): op SYMCOMM_OP_USER, detail `code << 32 | value`, with the given `status` and
/// `peer` (the peer involved, or this rank). The host turns it into the matching Error
/// (Mismatch, InvalidArgument, ...) whose message names "user code 0x<code>, value <value>".
/// Once recorded, every later wait of this rank returns `status` at once (as after the library's
/// own errors). Peers are not told: a peer waiting for this rank times out unless it detects the
/// inconsistency itself (a user_fingerprint() on a barrier makes both sides see a mismatch).
/// Who calls: any thread; it never blocks. Pre: status != Status::Ok (an Ok status records
/// nothing: it is not an error).
SYMCOMM_DEVICE void record_user_error(Thread t, const DevComm& comm, Status status, uint32_t peer, uint32_t code,
                                      uint32_t value = 0);

}  // namespace symcomm

#include <symcomm/impl/signal.cuh>

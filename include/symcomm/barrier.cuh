// symcomm device library: barriers across the ranks of a communicator.
//
// A barrier is a signal exchange on the signal word of one barrier index (word
// SYMCOMM_BARRIER_WORD_FIRST + index, abi.h): every rank release-stores
// `(epoch << 32) | fingerprint` into the word that each peer reserves for it, then acquire-polls
// its own words until every peer reached the same epoch. The epoch comes from the rank's own word
// (the one it reserves for itself), so it lives in device memory, only grows, and needs no host
// help across back-to-back launches or CUDA-graph replay.
//
// Barrier indices: [0, SYMCOMM_HOST_BARRIER_END) are the host collectives' (the built-in
// kernels), [SYMCOMM_USER_BARRIER_FIRST, SYMCOMM_USER_BARRIER_END) users' kernels'; an index at
// or above SYMCOMM_USER_BARRIER_END is refused, since its word would be one of send/recv's.
//
// The fingerprint (a hash of collective kind, dtype, op, count, root: `fingerprint()`) travels
// with the epoch. A rank that sees a peer arrive at the same epoch with a different fingerprint
// returns Status::Mismatch instead of exchanging data with a rank that called something else; the
// check is symmetric, so every rank of a mismatched pair reports it.
#pragma once

#include <symcomm/group.cuh>
#include <symcomm/memory.cuh>
#include <symcomm/signal.cuh>

namespace symcomm {

/// Hash of what a collective call is (kind, dtype, reduction op, element count, root), carried
/// by its barriers so that mismatched calls across ranks are detected. Any thread may call it.
SYMCOMM_DEVICE uint32_t fingerprint(uint32_t kind, uint32_t dtype, uint32_t op, uint64_t count, uint32_t root);

/// A fingerprint of a user kernel's own call: a hash of the user's `tag` (which step of the
/// kernel, or which kernel) and up to two values (sizes, a layer number, ...). Pass it to
/// barrier() so that ranks that reached different steps, or the same step with different sizes,
/// get Status::Mismatch on every rank of the pair instead of exchanging data. Hashes other input
/// than every collective's fingerprint(). Any thread may call it; equal arguments give equal
/// fingerprints on every rank and GPU.
SYMCOMM_DEVICE uint32_t user_fingerprint(uint32_t tag, uint64_t a = 0, uint64_t b = 0);

/// Barrier across every rank of `comm` on barrier index `index`.
///
/// Who calls: every thread of group `g`, on every rank, with the same `index` and (for the call
/// to succeed) the same `fingerprint`. At most one group per rank may use a given index at a
/// time (grid-scope code uses `blockIdx.x`; CTA-scope code a caller-chosen index).
/// Users' kernels use indices in [SYMCOMM_USER_BARRIER_FIRST, SYMCOMM_USER_BARRIER_END), which no
/// host collective touches; [0, SYMCOMM_HOST_BARRIER_END) belong to the host's collectives.
/// Ordering: every write made by the group's threads (on any rank, to any rank's memory) before
/// the barrier is visible to every thread of every rank's group after its barrier returned Ok
/// (release and acquire at system scope, or GPU scope when `comm.flags` has
/// SYMCOMM_COMM_SAME_GPU: every rank runs on this GPU in this process; the group is synchronized on entry and on
/// return).
/// Returns (the same on every thread of the group) Ok; Mismatch when a peer arrived with another
/// fingerprint; Timeout when a peer did not arrive within `comm.timeout_ns`; Aborted when the
/// abort flag was raised; InvalidArgument, touching no signal word, when index >=
/// SYMCOMM_USER_BARRIER_END; at once, the status of an error the rank recorded before (in this
/// kernel or an earlier one) when a peer has not arrived yet. Failures are recorded in the rank's ErrorRecord (op
/// SYMCOMM_OP_BARRIER; detail = the barrier index << 32 | the peer's fingerprint on mismatch, the
/// index << 32 on Timeout / Aborted, the index itself on InvalidArgument).
template <typename Group>
SYMCOMM_DEVICE_NOINLINE Status barrier(Group g, const DevComm& comm, uint32_t index, uint32_t fp = 0);

}  // namespace symcomm

#include <symcomm/impl/barrier.cuh>

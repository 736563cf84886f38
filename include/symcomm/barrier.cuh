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

namespace detail {

/// FNV-1a over the bytes of six 32-bit words, then a final avalanche (murmur3 fmix32): the hash
/// under fingerprint() and user_fingerprint().
SYMCOMM_DEVICE uint32_t fingerprint_words(const uint32_t (&words)[6]) {
    uint32_t h = 2166136261u;
    for (uint32_t i = 0; i < 6; ++i) {
        for (uint32_t b = 0; b < 4; ++b) {
            h ^= (words[i] >> (8 * b)) & 0xffu;
            h *= 16777619u;
        }
    }
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

/// First hashed word of user_fingerprint ("USER"): never a collective kind (those are <
/// SYMCOMM_COLL_COUNT), so a user fingerprint hashes different input from every collective's.
constexpr uint32_t kUserFingerprintDomain = 0x55534552u;

}  // namespace detail

/// Hash of what a collective call is (kind, dtype, reduction op, element count, root), carried
/// by its barriers so that mismatched calls across ranks are detected. Any thread may call it.
SYMCOMM_DEVICE uint32_t fingerprint(uint32_t kind, uint32_t dtype, uint32_t op, uint64_t count, uint32_t root) {
    const uint32_t words[6] = {kind, dtype, op, uint32_t(count), uint32_t(count >> 32), root};
    return detail::fingerprint_words(words);
}

/// A fingerprint of a user kernel's own call: a hash of the user's `tag` (which step of the
/// kernel, or which kernel) and up to two values (sizes, a layer number, ...). Pass it to
/// barrier() so that ranks that reached different steps, or the same step with different sizes,
/// get Status::Mismatch on every rank of the pair instead of exchanging data. Hashes other input
/// than every collective's fingerprint(). Any thread may call it; equal arguments give equal
/// fingerprints on every rank and GPU.
SYMCOMM_DEVICE uint32_t user_fingerprint(uint32_t tag, uint64_t a = 0, uint64_t b = 0) {
    const uint32_t words[6] = {detail::kUserFingerprintDomain, tag, uint32_t(a), uint32_t(a >> 32),
                               uint32_t(b),                    uint32_t(b >> 32)};
    return detail::fingerprint_words(words);
}

/// Barrier across every rank of `comm` on barrier index `index`.
///
/// Who calls: every thread of group `g`, on every rank, with the same `index` and (for the call
/// to succeed) the same `fingerprint`. At most one group per rank may use a given index at a
/// time (grid-scope code uses `blockIdx.x`; CTA-scope code a caller-chosen index).
/// Users' kernels use indices in [SYMCOMM_USER_BARRIER_FIRST, SYMCOMM_USER_BARRIER_END), which no
/// host collective touches; [0, SYMCOMM_HOST_BARRIER_END) belong to the host's collectives.
/// Ordering: every write made by the group's threads (on any rank, to any rank's memory) before
/// the barrier is visible to every thread of every rank's group after its barrier returned Ok
/// (release and acquire at system scope; the group is synchronized on entry and on return).
/// Returns (the same on every thread of the group) Ok; Mismatch when a peer arrived with another
/// fingerprint; Timeout when a peer did not arrive within `comm.timeout_ns`; Aborted when the
/// abort flag was raised; InvalidArgument, touching no signal word, when index >=
/// SYMCOMM_USER_BARRIER_END; at once, the status of an error the rank recorded before (in this
/// kernel or an earlier one) when a peer has not arrived yet. Failures are recorded in the rank's ErrorRecord (op
/// SYMCOMM_OP_BARRIER; detail = the barrier index << 32 | the peer's fingerprint on mismatch, the
/// index << 32 on Timeout / Aborted, the index itself on InvalidArgument).
template <typename Group>
SYMCOMM_DEVICE_NOINLINE Status barrier(Group g, const DevComm& comm, uint32_t index, uint32_t fp = 0) {
    if (index >= SYMCOMM_USER_BARRIER_END) {
        if (g.thread_rank() == 0) record_error(Thread{}, comm, Status::InvalidArgument, comm.rank, SYMCOMM_OP_BARRIER, index);
        return Status::InvalidArgument;
    }
    const uint32_t word = SYMCOMM_BARRIER_WORD_FIRST + index;
    const uint64_t* self = detail::signal_word(comm, comm.rank, comm.rank, word);
    // Every thread reads the previous epoch before the sync below; the thread that stores the new
    // one into `self` does so after it.
#if SYMCOMM_PLANTED_BUG == 6  // planted bug 6: a constant epoch instead of the one kept in device memory
    const uint32_t epoch = 1u;
    (void)self;
#else
    const uint32_t epoch = uint32_t(ld_relaxed<Scope::Sys>(self) >> 32) + 1u;
#endif
    const uint64_t mine = (uint64_t(epoch) << 32) | fp;
    // Orders the group's earlier writes before the release stores (bar.sync, then a cumulative
    // release by the storing thread).
#if SYMCOMM_PLANTED_BUG != 1  // planted bug 1: no group sync before the release stores
    g.sync();
#endif
    for (uint32_t p = g.thread_rank(); p < comm.nranks; p += g.size()) {
#if SYMCOMM_PLANTED_BUG == 2  // planted bug 2: arrive with a relaxed store instead of a release
        st_relaxed<Scope::Sys>(detail::signal_word(comm, p, comm.rank, word), mine);
#else
        st_release<Scope::Sys>(detail::signal_word(comm, p, comm.rank, word), mine);
#endif
    }
    Status s = Status::Ok;
    for (uint32_t p = g.thread_rank(); p < comm.nranks && s == Status::Ok; p += g.size()) {
        uint64_t seen = 0;
        // Reached: the peer's epoch is ours or later (wrap-safe); a later epoch means the peer
        // already passed this barrier, which it could only do after checking our fingerprint.
        s = poll_until<Scope::Sys>(
            Thread{}, comm, detail::signal_word(comm, comm.rank, p, word),
            [epoch](uint64_t v) { return int32_t(uint32_t(v >> 32) - epoch) >= 0; }, p, SYMCOMM_OP_BARRIER,
            uint64_t(index) << 32, seen);
        if (s == Status::Ok && uint32_t(seen >> 32) == epoch && uint32_t(seen) != fp) {
            record_error(Thread{}, comm, Status::Mismatch, p, SYMCOMM_OP_BARRIER, (uint64_t(index) << 32) | uint32_t(seen));
            s = Status::Mismatch;
        }
    }
    // The vote (plus __syncwarp for a Warp, whose vote orders no memory) synchronizes the group,
    // handing the acquired peers' writes on to every thread.
#if SYMCOMM_PLANTED_BUG == 4  // planted bug 4: no final group vote, each thread returns its own status
    return s;
#else
    return detail::group_status_ordered(g, s);
#endif
}

}  // namespace symcomm

// Inline definitions of <symcomm/barrier.cuh> (included at its end).
#pragma once

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

SYMCOMM_DEVICE uint32_t fingerprint(uint32_t kind, uint32_t dtype, uint32_t op, uint64_t count, uint32_t root) {
    const uint32_t words[6] = {kind, dtype, op, uint32_t(count), uint32_t(count >> 32), root};
    return detail::fingerprint_words(words);
}

SYMCOMM_DEVICE uint32_t user_fingerprint(uint32_t tag, uint64_t a, uint64_t b) {
    const uint32_t words[6] = {detail::kUserFingerprintDomain, tag, uint32_t(a), uint32_t(a >> 32),
                               uint32_t(b),                    uint32_t(b >> 32)};
    return detail::fingerprint_words(words);
}

namespace detail {

/// barrier() at memory scope S: Scope::Gpu when every rank runs on this GPU in this process
/// (SYMCOMM_COMM_SAME_GPU), Scope::Sys otherwise. Pre: index < SYMCOMM_USER_BARRIER_END.
template <Scope S, typename Group>
SYMCOMM_DEVICE Status barrier_at(Group g, const DevComm& comm, uint32_t index, uint32_t fp) {
    const uint32_t word = SYMCOMM_BARRIER_WORD_FIRST + index;
    const uint64_t* self = detail::signal_word(comm, comm.rank, comm.rank, word);
    // Every thread reads the previous epoch before the sync below; the thread that stores the new
    // one into `self` does so after it.
    const uint32_t epoch = uint32_t(ld_relaxed<S>(self) >> 32) + 1u;
    const uint64_t mine = (uint64_t(epoch) << 32) | fp;
    // Orders the group's earlier writes before the release stores (bar.sync, then a cumulative
    // release by the storing thread).
    g.sync();
    // A peer on another host gets its word through the proxy (a failure is recorded, and every
    // wait below then returns it).
    for (uint32_t p = g.thread_rank(); p < comm.nranks; p += g.size()) {
        (void)detail::signal_store<S>(comm, p, word, mine);
    }
    Status s = Status::Ok;
    for (uint32_t p = g.thread_rank(); p < comm.nranks && s == Status::Ok; p += g.size()) {
        uint64_t seen = 0;
        // Reached: the peer's epoch is ours or later (wrap-safe); a later epoch means the peer
        // already passed this barrier, which it could only do after checking our fingerprint.
        s = poll_until<S>(
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
    return detail::group_status_ordered(g, s);
}

}  // namespace detail

template <typename Group>
SYMCOMM_DEVICE_NOINLINE Status barrier(Group g, const DevComm& comm, uint32_t index, uint32_t fp) {
    if (index >= SYMCOMM_USER_BARRIER_END) {
        if (g.thread_rank() == 0) record_error(Thread{}, comm, Status::InvalidArgument, comm.rank, SYMCOMM_OP_BARRIER, index);
        return Status::InvalidArgument;
    }
    // Ranks that share this GPU synchronize at GPU scope (a MEMBAR.GPU per arrival instead of
    // MEMBAR.SYS); the flag is the same on every rank.
    if (comm.flags & SYMCOMM_COMM_SAME_GPU) return detail::barrier_at<Scope::Gpu>(g, comm, index, fp);
    return detail::barrier_at<Scope::Sys>(g, comm, index, fp);
}

}  // namespace symcomm

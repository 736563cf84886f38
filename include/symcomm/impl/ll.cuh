// The low-latency (LL) protocol under all_reduce_ll (included by impl/collectives.cuh): where a
// line of the LL area is (abi.h, SYMCOMM_LL_LINES), a line's flag for a round, 8 bytes of
// elements as the data of a line, and the bounded wait for one line.
//
// Why it needs no barrier: each 8-byte half of a line carries its data and its flag in one
// single-copy-atomic unit, so a reader that sees the round's flag in both halves holds the
// round's data; nothing else has to be ordered. Why it needs no reset: round e of a barrier index
// writes buffer e & 1 with a flag that differs from the previous round's of that buffer; see
// all_reduce_ll for why a buffer is free again when a writer reuses it.
#pragma once

namespace symcomm {

namespace detail {

/// 8 bytes of elements of T, the data of one LL line: `N` elements (`e`) or the line's two data
/// words (`w`). A plain union, as Pack16.
template <typename T>
union alignas(8) Word8 {
    static constexpr uint32_t N = 8 / sizeof(T);
    T e[8 / sizeof(T)];
    uint32_t w[2];
};

/// Start of rank `owner`'s LL area.
SYMCOMM_DEVICE uint64_t ll_area(const DevComm& comm, uint32_t owner) {
    return comm.signal_base + uint64_t(owner) * comm.signal_stride + comm.ll_offset;
}

/// This rank's epoch word of barrier index `slot` (the LL rounds run on it so far).
SYMCOMM_DEVICE uint64_t* ll_epoch_word(const DevComm& comm, uint32_t slot) {
    return reinterpret_cast<uint64_t*>(ll_area(comm, comm.rank) + uint64_t(slot) * sizeof(uint64_t));
}

/// First line of the region of rank `owner`'s LL area that rank `writer` writes in round `epoch`
/// of barrier index `slot` (buffer epoch & 1). Pre: slot < SYMCOMM_USER_BARRIER_END, owner and
/// writer < comm.nranks.
SYMCOMM_DEVICE LlLine* ll_region(const DevComm& comm, uint32_t owner, uint32_t slot, uint64_t epoch, uint32_t writer) {
    const uint64_t region = (uint64_t(slot) * 2u + (epoch & 1u)) * comm.nranks + writer;
    return reinterpret_cast<LlLine*>(ll_area(comm, owner) + SYMCOMM_LL_EPOCH_BYTES +
                                     region * comm.ll_lines * SYMCOMM_LL_LINE_BYTES);
}

/// The flag of round `epoch` (>= 1): ((epoch - 1) mod (2^32 - 1)) + 1, never 0 (untouched
/// memory), and different from the flag of round epoch - 2 (the buffer's previous round).
SYMCOMM_DEVICE uint32_t ll_flag(uint64_t epoch) { return uint32_t((epoch - 1u) % 0xffffffffull) + 1u; }

/// Stores data words `w0`, `w1` with `flag` into line `p` (one 16-byte store).
SYMCOMM_DEVICE void ll_put(LlLine* p, uint32_t w0, uint32_t w1, uint32_t flag) {
    const uint64_t f = uint64_t(flag) << 32;
    ll_store(p, f | w0, f | w1);
}

/// Waits (bounded, as every wait: poll_ready) until both halves of line `p` carry `flag`, then
/// gives their data words in `w`. Failures are recorded with op SYMCOMM_OP_LL_WAIT, `peer` and
/// `detail`.
SYMCOMM_DEVICE Status ll_wait(Thread t, const DevComm& comm, const LlLine* p, uint32_t flag, uint32_t peer,
                              uint64_t detail, uint32_t (&w)[2]) {
    uint64_t h0 = 0, h1 = 0;
    const Status s = poll_ready(
        t, comm,
        [&] {
            ll_load(p, h0, h1);
            return uint32_t(h0 >> 32) == flag && uint32_t(h1 >> 32) == flag;
        },
        peer, SYMCOMM_OP_LL_WAIT, detail);
    w[0] = uint32_t(h0);
    w[1] = uint32_t(h1);
    return s;
}

/// Loads the `m` (1..N) elements of T at `p` as one line's data; one 8-byte load when `whole`
/// (m == N and p 8-byte aligned).
template <typename T>
SYMCOMM_DEVICE Word8<T> ll_gather(const T* p, uint32_t m, bool whole) {
    Word8<T> v;
    v.w[0] = 0;
    v.w[1] = 0;
    if (whole) return *reinterpret_cast<const Word8<T>*>(p);
    for (uint32_t k = 0; k < m; ++k) v.e[k] = p[k];
    return v;
}

/// Stores the first `m` elements of `v` at `p` (one 8-byte store when `whole`, as ll_gather).
template <typename T>
SYMCOMM_DEVICE void ll_scatter(T* p, const Word8<T>& v, uint32_t m, bool whole) {
    if (whole) {
        *reinterpret_cast<Word8<T>*>(p) = v;
        return;
    }
    for (uint32_t k = 0; k < m; ++k) p[k] = v.e[k];
}

}  // namespace detail

}  // namespace symcomm

// symcomm device library: one-sided data movement between ranks (put / get / put-with-signal).
//
// These are plain copies through peer pointers, done by every thread of a group together:
// 16-byte vector loads and stores where the source and destination have the same address phase
// mod 16, scalar heads and tails around them, scalar everywhere otherwise (any count, any
// offset). They order nothing by themselves: a peer may read what a put wrote only after a
// signal or barrier that follows the put (put_with_signal does both).
//
// Bounds: each call checks, before touching memory, that the peer is a rank of the window, that
// the window holds T (element size sizeof(T), or a byte window) and that the window range
// [offset, offset + count) fits in each rank's copy (exact arithmetic: no wrap-around), and
// returns Status::InvalidArgument otherwise. The other buffer (`src` of put, `dst` of get) is
// ordinary memory the library cannot see the size of: keeping it in bounds is the caller's.
#pragma once

#include <symcomm/collectives.cuh>
#include <symcomm/group.cuh>
#include <symcomm/signal.cuh>
#include <symcomm/window.cuh>

namespace symcomm {

namespace detail {

/// Copies `count` elements from `from` to `to` on the threads of `g` (each thread its own items).
template <typename Group, typename T>
SYMCOMM_DEVICE void group_copy(Group g, const T* from, T* to, uint64_t count) {
    if (from == to || count == 0) return;
    const Items<T> it(0, count, phase(from) == phase(to), reinterpret_cast<uint64_t>(from));
    for (uint64_t k = g.thread_rank(); k < it.total(); k += g.size()) {
        bool is_pack;
        const uint64_t i = it.first(k, is_pack);
        store_item(to + i, load_item(from + i, is_pack), is_pack);
    }
}

/// Why a put or get of `count` elements at element `off` of rank `peer`'s copy of `win` may not
/// run (a SYMCOMM_REFUSED_* code; `range`, SRC_RANGE or DST_RANGE, for a range outside it), or 0.
template <typename T>
SYMCOMM_DEVICE uint32_t p2p_refusal(const WindowHandle<T>& win, uint32_t peer, uint64_t off, uint64_t count,
                                    uint32_t range) {
    if (peer >= win.nranks()) return SYMCOMM_REFUSED_PEER;
    if (!win.holds()) return SYMCOMM_REFUSED_ELEM_SIZE;
    if (!win.fits(off, count)) return range;
    return 0;
}

}  // namespace detail

/// Put: copies `count` elements from `src` (any memory this thread can read: a window, device
/// memory, shared memory) into rank `peer`'s copy of `dst` at element `doff`.
/// Who calls: every thread of `g`, with the same arguments. The group is synchronized before the
/// copy reads `src`, so what its threads wrote there just before is what is sent (the threads copy
/// other elements than they wrote). On return each thread's stores are issued but not ordered for
/// the peer: follow with a release (signal_set by one thread after `g.sync()`), a barrier, or use
/// put_with_signal.
/// Returns Ok, or InvalidArgument with nothing copied when peer >= dst.nranks(), `dst` does not
/// hold T (`WindowHandle::holds`) or [doff, doff + count) does not fit in the window (exact
/// arithmetic); every thread gets the same Status. `src` is the caller's to keep in bounds. (No
/// DevComm here, so nothing is recorded: put_with_signal records its refusals.)
template <typename Group, typename T>
SYMCOMM_DEVICE Status put(Group g, WindowHandle<T> dst, uint32_t peer, uint64_t doff, const T* src, uint64_t count) {
    if (detail::p2p_refusal(dst, peer, doff, count, SYMCOMM_REFUSED_DST_RANGE) != 0) return Status::InvalidArgument;
    g.sync();  // the group's writes of `src` before the copy reads them (the refusal is uniform)
    detail::group_copy(g, src, dst.peer_ptr(peer, doff), count);
    return Status::Ok;
}

/// Get: copies `count` elements of rank `peer`'s copy of `src`, from element `soff`, into `dst`
/// (any memory this thread can write). Who calls: every thread of `g`, same arguments. The caller
/// must have acquired the peer's data first (a signal wait or barrier after the peer wrote it);
/// the group is synchronized before reading, so an acquire made by one of its threads covers all.
/// Returns Ok, or InvalidArgument with nothing read under the conditions of put (for `src`,
/// [soff, soff + count)); `dst` is the caller's to keep in bounds.
template <typename Group, typename T>
SYMCOMM_DEVICE Status get(Group g, WindowHandle<T> src, uint32_t peer, uint64_t soff, T* dst, uint64_t count) {
    if (detail::p2p_refusal(src, peer, soff, count, SYMCOMM_REFUSED_SRC_RANGE) != 0) return Status::InvalidArgument;
    g.sync();  // one thread's acquire (signal wait) before any thread reads
    detail::group_copy(g, src.peer_ptr(peer, soff), dst, count);
    return Status::Ok;
}

/// Put with signal: put (the group synchronized first, as there), then the group synchronizes and
/// one thread release-stores `value` into
/// the signal word `word` that `peer` reserves for this rank. When the peer's
/// `signal_wait_until(..., rank, word, value)` returns Ok, every element of the put is visible to
/// it (bar.sync + a cumulative release at system scope).
/// Who calls: every thread of `g`, same arguments. Pre: value larger than any earlier value of
/// that word.
/// Returns (the same on every thread) Ok, or InvalidArgument with nothing copied or stored (the
/// peer's wait then fails at its deadline), recorded in the rank's ErrorRecord: unless
/// peer < comm.nranks and word < SYMCOMM_USER_SIGNAL_END (op SYMCOMM_OP_SIGNAL, detail
/// `peer << 32 | word`), or when put would refuse the range (op SYMCOMM_OP_PUT, detail
/// `peer | reason << 32`).
template <typename Group, typename T>
SYMCOMM_DEVICE Status put_with_signal(Group g, const DevComm& comm, WindowHandle<T> dst, uint32_t peer,
                                      uint64_t doff, const T* src, uint64_t count, uint32_t word, uint64_t value) {
    // Checked before the copy: a peer outside the team has no copy of `dst` to write.
    if (!detail::is_user_signal(comm, peer, word)) {
        if (g.thread_rank() == 0) detail::refuse_signal(Thread{}, comm, peer, word, SYMCOMM_OP_SIGNAL);
        return Status::InvalidArgument;
    }
    const uint32_t why = detail::p2p_refusal(dst, peer, doff, count, SYMCOMM_REFUSED_DST_RANGE);
    if (why != 0) {
        if (g.thread_rank() == 0) {
            record_error(Thread{}, comm, Status::InvalidArgument, comm.rank, SYMCOMM_OP_PUT, (uint64_t(why) << 32) | peer);
        }
        return Status::InvalidArgument;
    }
    g.sync();  // the group's writes of `src` before the copy reads them
    detail::group_copy(g, src, dst.peer_ptr(peer, doff), count);
    g.sync();
    if (g.thread_rank() == 0) detail::signal_store<Scope::Sys>(comm, peer, word, value);
    return Status::Ok;
}

}  // namespace symcomm

// symcomm device library: one-sided data movement between ranks (put / get / put-with-signal).
//
// These are plain copies through peer pointers, done by every thread of a group together:
// 16-byte vector loads and stores where the source and destination have the same address phase
// mod 16, scalar heads and tails around them, scalar everywhere otherwise (any count, any
// offset). They order nothing by themselves: a peer may read what a put wrote only after a
// signal or barrier that follows the put (put_with_signal does both).
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

}  // namespace detail

/// Put: copies `count` elements from `src` (any memory this thread can read: a window, device
/// memory, shared memory) into rank `peer`'s copy of `dst` at element `doff`.
/// Who calls: every thread of `g`, with the same arguments. On return each thread's stores are
/// issued but not ordered for the peer: follow with `put_signal`-style release (signal_set by one
/// thread after `g.sync()`), a barrier, or use put_with_signal.
/// Pre: peer < comm.nranks; doff + count <= dst.count().
template <typename Group, typename T>
SYMCOMM_DEVICE void put(Group g, WindowHandle<T> dst, uint32_t peer, uint64_t doff, const T* src, uint64_t count) {
    detail::group_copy(g, src, dst.peer_ptr(peer, doff), count);
}

/// Get: copies `count` elements of rank `peer`'s copy of `src`, from element `soff`, into `dst`
/// (any memory this thread can write). Who calls: every thread of `g`, same arguments. The caller
/// must have acquired the peer's data first (a signal wait or barrier after the peer wrote it).
/// Pre: peer < comm.nranks; soff + count <= src.count().
template <typename Group, typename T>
SYMCOMM_DEVICE void get(Group g, WindowHandle<T> src, uint32_t peer, uint64_t soff, T* dst, uint64_t count) {
    detail::group_copy(g, src.peer_ptr(peer, soff), dst, count);
}

/// Put with signal: put, then the group synchronizes and one thread release-stores `value` into
/// the signal word `word` that `peer` reserves for this rank. When the peer's
/// `signal_wait_until(..., rank, word, value)` returns Ok, every element of the put is visible to
/// it (bar.sync + a cumulative release at system scope).
/// Who calls: every thread of `g`, same arguments. Pre: as for put, value larger than any earlier
/// value of that word.
/// Returns (the same on every thread) Ok, or InvalidArgument unless peer < comm.nranks and
/// word < SYMCOMM_USER_SIGNAL_END: then nothing is copied or stored, and the error is recorded
/// (op SYMCOMM_OP_SIGNAL, detail `peer << 32 | word`).
template <typename Group, typename T>
SYMCOMM_DEVICE Status put_with_signal(Group g, const DevComm& comm, WindowHandle<T> dst, uint32_t peer,
                                      uint64_t doff, const T* src, uint64_t count, uint32_t word, uint64_t value) {
    // Checked before the copy: a peer outside the team has no copy of `dst` to write.
    if (!detail::is_user_signal(comm, peer, word)) {
        if (g.thread_rank() == 0) detail::refuse_signal(Thread{}, comm, peer, word, SYMCOMM_OP_SIGNAL);
        return Status::InvalidArgument;
    }
    put(g, dst, peer, doff, src, count);
    g.sync();
    if (g.thread_rank() == 0) detail::signal_store<Scope::Sys>(comm, peer, word, value);
    return Status::Ok;
}

}  // namespace symcomm

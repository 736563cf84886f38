// Inline definitions of <symcomm/p2p.cuh> (included at its end). The copies cut their range into
// the collectives' work items (a scalar head, 16-byte packs, a scalar tail).
#pragma once

#include <symcomm/collectives.cuh>

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

/// Why a put or get of the first `count` elements of slice `win` in rank `peer`'s copy may not
/// run (a SYMCOMM_REFUSED_* code; `range`, SRC_RANGE or DST_RANGE, for a range outside it), or 0.
/// A peer on another host is refused (SYMCOMM_REFUSED_REMOTE) unless `remote_ok`.
template <typename T>
SYMCOMM_DEVICE uint32_t p2p_refusal(const WindowSlice<T>& win, uint32_t peer, uint64_t count, uint32_t range,
                                    bool remote_ok = false) {
    if (peer >= win.nranks()) return SYMCOMM_REFUSED_PEER;
    if (!remote_ok && !win.window.on_this_host(peer)) return SYMCOMM_REFUSED_REMOTE;
    if (!win.holds()) return SYMCOMM_REFUSED_ELEM_SIZE;
    if (!win.fits(count)) return range;
    return 0;
}

}  // namespace detail

template <typename Group, typename T>
SYMCOMM_DEVICE Status put(Group g, const T* src, WindowSlice<T> dst, uint32_t peer, uint64_t count) {
    if (detail::p2p_refusal(dst, peer, count, SYMCOMM_REFUSED_DST_RANGE) != 0) return Status::InvalidArgument;
    g.sync();  // the group's writes of `src` before the copy reads them (the refusal is uniform)
    detail::group_copy(g, src, dst.peer_ptr(peer, 0), count);
    return Status::Ok;
}

template <typename Group, typename T>
SYMCOMM_DEVICE Status get(Group g, WindowSlice<T> src, uint32_t peer, T* dst, uint64_t count) {
    if (detail::p2p_refusal(src, peer, count, SYMCOMM_REFUSED_SRC_RANGE) != 0) return Status::InvalidArgument;
    g.sync();  // one thread's acquire (signal wait) before any thread reads
    detail::group_copy(g, src.peer_ptr(peer, 0), dst, count);
    return Status::Ok;
}

template <typename Group, typename T>
SYMCOMM_DEVICE Status put_with_signal(Group g, const DevComm& comm, const T* src, WindowSlice<T> dst, uint32_t peer,
                                      uint64_t count, uint32_t word, uint64_t value) {
    // Checked before the copy: a peer outside the team has no copy of `dst` to write.
    if (!detail::is_user_signal(comm, peer, word)) {
        if (g.thread_rank() == 0) detail::refuse_signal(Thread{}, comm, peer, word, SYMCOMM_OP_SIGNAL);
        return Status::InvalidArgument;
    }
    const uint32_t why = detail::p2p_refusal(dst, peer, count, SYMCOMM_REFUSED_DST_RANGE, true);
    if (why != 0) {
        if (g.thread_rank() == 0) {
            record_error(Thread{}, comm, Status::InvalidArgument, comm.rank, SYMCOMM_OP_PUT, (uint64_t(why) << 32) | peer);
        }
        return Status::InvalidArgument;
    }
    const bool remote = !dst.window.on_this_host(peer);
    // The proxy reads `src` with a copy (on a GPU from global memory only): the same refusal on
    // the emulator.
    if (remote && count > 0 && !__isGlobal(src)) {
        if (g.thread_rank() == 0) {
            record_error(Thread{}, comm, Status::InvalidArgument, comm.rank, SYMCOMM_OP_PUT,
                         (uint64_t(SYMCOMM_REFUSED_SOURCE) << 32) | peer);
        }
        return Status::InvalidArgument;
    }
    g.sync();  // the group's writes of `src` before the copy (or the proxy) reads them
    if (remote) {
        // Through the proxy: one thread hands over the source and the destination in this rank's
        // own copy; the peer's proxy writes its copy, then stores the signal.
        Status s = Status::Ok;
        if (g.thread_rank() == 0) {
            ProxyOp op = detail::proxy_signal(SYMCOMM_PROXY_PUT, peer, word, value);
            op.src = reinterpret_cast<uint64_t>(src);
            op.dst = reinterpret_cast<uint64_t>(dst.local_ptr(0));
            op.bytes = count * sizeof(T);
            s = detail::proxy_post(Thread{}, comm, SYMCOMM_OP_PUT, op);
        }
        return group_status(g, s);
    }
    detail::group_copy(g, src, dst.peer_ptr(peer, 0), count);
    g.sync();
    if (g.thread_rank() == 0) (void)detail::signal_store<Scope::Sys>(comm, peer, word, value);
    return Status::Ok;
}

}  // namespace symcomm

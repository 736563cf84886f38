// Inline definitions of <symcomm/signal.cuh> (included at its end), and the library's unchecked
// signal-word access (detail::), which barriers, send/recv and put_with_signal use.
#pragma once

namespace symcomm {

namespace detail {

/// Address of signal word `word` that rank `owner` reserves for writes from rank `from`; no range
/// check (the library's own words: barriers, send/recv). Pre: owner, from < comm.nranks; owner on
/// this host (`!is_remote`); word < comm.signal_words.
SYMCOMM_DEVICE uint64_t* signal_word(const DevComm& comm, uint32_t owner, uint32_t from, uint32_t word) {
    uint64_t addr = comm.signal_base + owner * comm.signal_stride +
                    (uint64_t(from) * comm.signal_words + word) * sizeof(uint64_t);
    return reinterpret_cast<uint64_t*>(addr);
}

}  // namespace detail

SYMCOMM_DEVICE void record_error(Thread, const DevComm& comm, Status status, uint32_t peer, uint32_t op,
                                 uint64_t detail) {
    ErrorRecord* rec = reinterpret_cast<ErrorRecord*>(comm.error);
    if (rec == nullptr) return;
    if (atomic_cas_acq_rel<Scope::Sys>(&rec->status, SYMCOMM_STATUS_OK, uint32_t(status)) == SYMCOMM_STATUS_OK) {
        // The host reads these fields only after the kernel finished (stream order), so plain
        // relaxed stores after winning the CAS are enough.
        st_relaxed<Scope::Sys>(&rec->rank, comm.rank);
        st_relaxed<Scope::Sys>(&rec->peer, peer);
        st_relaxed<Scope::Sys>(&rec->op, op);
        st_relaxed<Scope::Sys>(&rec->detail, detail);
        st_relaxed<Scope::Sys>(&rec->time_ns, globaltimer_ns());
    }
}

SYMCOMM_DEVICE Status recorded_error(const DevComm& comm) {
    const ErrorRecord* rec = reinterpret_cast<const ErrorRecord*>(comm.error);
    return rec == nullptr ? Status::Ok : Status(ld_relaxed<Scope::Sys>(&rec->status));
}

SYMCOMM_DEVICE bool abort_requested(const DevComm& comm) {
    const uint32_t* flag = reinterpret_cast<const uint32_t*>(comm.abort_flag);
    return flag != nullptr && ld_relaxed<Scope::Sys>(flag) != 0;
}

namespace detail {

/// The bounded wait under every wait of the library: calls `ready()` (which loads what it waits
/// for and says whether it is there) until it returns true, the deadline passes (Timeout,
/// recorded), the abort flag is raised (Aborted, recorded) or an error is already recorded on
/// this rank (returned). The abort flag and the error record are host-mapped: a read is a PCIe
/// round trip on a GPU, and LL waits poll with every thread of every CTA, so reading them per
/// miss or per few spins floods PCIe (seen on an H200: the host collectives' LL rounds 12 times
/// slower than with both in device memory). So they are read once kFlagNs of the timer have
/// passed since the wait began or since they were last read; the deadline is checked every
/// spin (the timer is local).
template <typename Ready>
SYMCOMM_DEVICE Status poll_ready(Thread t, const DevComm& comm, Ready ready, uint32_t peer, uint32_t op,
                                 uint64_t detail) {
    constexpr uint64_t kFlagNs = 20000;
    if (ready()) return Status::Ok;
    const uint64_t start = globaltimer_ns();
    uint64_t checked = start;
    for (uint32_t spins = 0;; ++spins) {
        if (ready()) return Status::Ok;
        const uint64_t now = globaltimer_ns();
        if (now - checked >= kFlagNs) {
            checked = now;
            if (abort_requested(comm)) {
                record_error(t, comm, Status::Aborted, peer, op, detail);
                return Status::Aborted;
            }
            const Status first = recorded_error(comm);
            if (first != Status::Ok) return first;
        }
        if (now - start > comm.timeout_ns) {
            record_error(t, comm, Status::Timeout, peer, op, detail);
            return Status::Timeout;
        }
        backoff(spins < 64 ? 32 : 256);
    }
}

}  // namespace detail

template <Scope S, typename Done>
SYMCOMM_DEVICE Status poll_until(Thread t, const DevComm& comm, const uint64_t* p, Done done, uint32_t peer,
                                 uint32_t op, uint64_t detail, uint64_t& seen) {
    return detail::poll_ready(
        t, comm,
        [&] {
            seen = ld_acquire<S>(p);
            return done(seen);
        },
        peer, op, detail);
}

namespace detail {

/// Whether rank `peer` runs on another host (its signal array is not mapped here).
SYMCOMM_DEVICE bool is_remote(const DevComm& comm, uint32_t peer) {
    return !on_this_host(comm.ranks, peer);
}

/// Hands one operation for rank `peer` on another host to this rank's proxy (the protocol at
/// SYMCOMM_PROXY_SLOTS in abi.h) and waits until the proxy took it: on Ok the source of a PUT
/// may be reused, and the peer's proxy will apply the operation after every earlier one of this
/// rank to it. Called by one thread. Without a proxy (`comm.proxy` 0) records InvalidArgument
/// (op `refused_op`: SYMCOMM_OP_PUT or SYMCOMM_OP_PROXY, detail SYMCOMM_REFUSED_REMOTE << 32 |
/// peer) and returns it; a wait that fails records Timeout / Aborted (op SYMCOMM_OP_PROXY,
/// detail the ticket).
/// (A template only so that, out of line, it has one definition across translation units.)
template <typename One>
SYMCOMM_DEVICE_NOINLINE Status proxy_post(One t, const DevComm& comm, uint32_t refused_op, const ProxyOp& op) {
    ProxyQueue* q = reinterpret_cast<ProxyQueue*>(comm.proxy);
    if (q == nullptr) {
        record_error(t, comm, Status::InvalidArgument, comm.rank, refused_op,
                     (uint64_t(SYMCOMM_REFUSED_REMOTE) << 32) | op.peer);
        return Status::InvalidArgument;
    }
    const uint64_t ticket = atomic_add_release<Scope::Gpu>(&q->next, 1);
    ProxyOp* slot = reinterpret_cast<ProxyOp*>(q->ring) + ticket % SYMCOMM_PROXY_SLOTS;
    const uint64_t* taken = reinterpret_cast<const uint64_t*>(q->taken);
    // The slot is free once the proxy took the operation SYMCOMM_PROXY_SLOTS tickets earlier.
    Status s = poll_ready(
        t, comm, [&] { return ld_acquire<Scope::Sys>(taken) + SYMCOMM_PROXY_SLOTS > ticket; }, op.peer,
        SYMCOMM_OP_PROXY, ticket);
    if (s != Status::Ok) return s;
    st_relaxed<Scope::Sys>(&slot->op, op.op);
    st_relaxed<Scope::Sys>(&slot->peer, op.peer);
    st_relaxed<Scope::Sys>(&slot->word, op.word);
    st_relaxed<Scope::Sys>(&slot->reserved, 0u);
    st_relaxed<Scope::Sys>(&slot->value, op.value);
    st_relaxed<Scope::Sys>(&slot->src, op.src);
    st_relaxed<Scope::Sys>(&slot->dst, op.dst);
    st_relaxed<Scope::Sys>(&slot->bytes, op.bytes);
    st_release<Scope::Sys>(&slot->ticket, ticket + 1);
    return poll_ready(
        t, comm, [&] { return ld_acquire<Scope::Sys>(taken) > ticket; }, op.peer, SYMCOMM_OP_PROXY, ticket);
}

/// A signal operation (SYMCOMM_PROXY_SIGNAL_SET or _ADD) for the proxy.
SYMCOMM_DEVICE ProxyOp proxy_signal(uint32_t code, uint32_t peer, uint32_t word, uint64_t value) {
    ProxyOp op{};
    op.op = code;
    op.peer = peer;
    op.word = word;
    op.value = value;
    return op;
}

/// Release-stores `value` into the signal word `word` that `peer` reserves for this rank, with no
/// range check (signal_set's store, also used for the library's own words): a store on this
/// host, through the proxy to a peer on another (proxy_post's statuses; a failure is recorded).
template <Scope S>
SYMCOMM_DEVICE Status signal_store(const DevComm& comm, uint32_t peer, uint32_t word, uint64_t value) {
    if (is_remote(comm, peer)) {
        return proxy_post(Thread{}, comm, SYMCOMM_OP_PROXY, proxy_signal(SYMCOMM_PROXY_SIGNAL_SET, peer, word, value));
    }
    st_release<S>(signal_word(comm, peer, comm.rank, word), value);
    return Status::Ok;
}

/// Waits until the signal word `word` that this rank reserves for `peer` holds >= `value`, with no
/// range check (signal_wait_until's wait, also used for the library's own words).
template <Scope S>
SYMCOMM_DEVICE Status signal_wait_word(Thread t, const DevComm& comm, uint32_t peer, uint32_t word,
                                       uint64_t value) {
    uint64_t seen;
    return poll_until<S>(t, comm, signal_word(comm, comm.rank, peer, word),
                         [value](uint64_t v) { return v >= value; }, peer, SYMCOMM_OP_SIGNAL_WAIT, value, seen);
}

/// Whether `peer` and `word` name a users' signal word: peer < comm.nranks and word <
/// SYMCOMM_USER_SIGNAL_END.
SYMCOMM_DEVICE bool is_user_signal(const DevComm& comm, uint32_t peer, uint32_t word) {
    return peer < comm.nranks && word < SYMCOMM_USER_SIGNAL_END;
}

/// Records the refusal of a users' signal call (`op`) on `peer` / `word` that is not
/// is_user_signal: InvalidArgument, detail `peer << 32 | word`. Returns InvalidArgument.
SYMCOMM_DEVICE Status refuse_signal(Thread t, const DevComm& comm, uint32_t peer, uint32_t word, uint32_t op) {
    record_error(t, comm, Status::InvalidArgument, comm.rank, op, (uint64_t(peer) << 32) | word);
    return Status::InvalidArgument;
}

}  // namespace detail

template <Scope S>
SYMCOMM_DEVICE Status signal_set(Thread t, const DevComm& comm, uint32_t peer, uint32_t word, uint64_t value) {
    if (!detail::is_user_signal(comm, peer, word)) return detail::refuse_signal(t, comm, peer, word, SYMCOMM_OP_SIGNAL);
    return detail::signal_store<S>(comm, peer, word, value);
}

template <Scope S>
SYMCOMM_DEVICE Status signal_add(Thread t, const DevComm& comm, uint32_t peer, uint32_t word, uint64_t delta,
                                 uint64_t* previous) {
    if (!detail::is_user_signal(comm, peer, word)) return detail::refuse_signal(t, comm, peer, word, SYMCOMM_OP_SIGNAL);
    if (detail::is_remote(comm, peer)) {
        // The peer's proxy adds; the previous value stays on the peer's host.
        if (previous != nullptr) {
            record_error(t, comm, Status::InvalidArgument, comm.rank, SYMCOMM_OP_PROXY,
                         (uint64_t(SYMCOMM_REFUSED_REMOTE) << 32) | peer);
            return Status::InvalidArgument;
        }
        return detail::proxy_post(t, comm, SYMCOMM_OP_PROXY,
                                  detail::proxy_signal(SYMCOMM_PROXY_SIGNAL_ADD, peer, word, delta));
    }
    const uint64_t old = atomic_add_release<S>(detail::signal_word(comm, peer, comm.rank, word), delta);
    if (previous != nullptr) *previous = old;
    return Status::Ok;
}

template <Scope S>
SYMCOMM_DEVICE Status signal_wait_until(Thread t, const DevComm& comm, uint32_t peer, uint32_t word,
                                        uint64_t value) {
    if (!detail::is_user_signal(comm, peer, word)) {
        return detail::refuse_signal(t, comm, peer, word, SYMCOMM_OP_SIGNAL_WAIT);
    }
    return detail::signal_wait_word<S>(t, comm, peer, word, value);
}

template <typename Group>
SYMCOMM_DEVICE Status group_status(Group g, Status s) {
    if (!g.any(s != Status::Ok)) return Status::Ok;
    if (g.any(s == Status::Mismatch)) return Status::Mismatch;
    if (g.any(s == Status::AbiMismatch)) return Status::AbiMismatch;
    if (g.any(s == Status::InvalidArgument)) return Status::InvalidArgument;
    if (g.any(s == Status::Aborted)) return Status::Aborted;
    return Status::Timeout;
}

namespace detail {

/// Orders memory after a group's vote where the vote itself does not: a warp vote
/// (`__any_sync`) exchanges predicates but is no memory barrier, so a Warp also runs `__syncwarp()`;
/// a CTA's vote is `__syncthreads_or`, which orders memory like `__syncthreads()`; a Thread has
/// nothing to order.
template <typename Group>
SYMCOMM_DEVICE void order_after_vote(Group) {}
SYMCOMM_DEVICE void order_after_vote(Warp w) { w.sync(); }

/// group_status followed by order_after_vote: on return every thread of the group sees what any
/// of its threads saw before the call (in particular what one thread acquired).
template <typename Group>
SYMCOMM_DEVICE Status group_status_ordered(Group g, Status s) {
    const Status all = group_status(g, s);
    order_after_vote(g);
    return all;
}

}  // namespace detail

template <Scope S, typename Group>
SYMCOMM_DEVICE Status signal_wait_until(Group g, const DevComm& comm, uint32_t peer, uint32_t word, uint64_t value) {
    Status s = Status::Ok;
    if (g.thread_rank() == 0) s = signal_wait_until<S>(Thread{}, comm, peer, word, value);
    return detail::group_status_ordered(g, s);
}

SYMCOMM_DEVICE void record_user_error(Thread t, const DevComm& comm, Status status, uint32_t peer, uint32_t code,
                                      uint32_t value) {
    if (status == Status::Ok) return;
    record_error(t, comm, status, peer, SYMCOMM_OP_USER, (uint64_t(code) << 32) | value);
}

}  // namespace symcomm

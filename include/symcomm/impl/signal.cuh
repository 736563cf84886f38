// Inline definitions of <symcomm/signal.cuh> (included at its end), and the library's unchecked
// signal-word access (detail::), which barriers, send/recv and put_with_signal use.
#pragma once

namespace symcomm {

namespace detail {

/// Address of signal word `word` that rank `owner` reserves for writes from rank `from`; no range
/// check (the library's own words: barriers, send/recv). Pre: owner, from < comm.nranks;
/// word < comm.signal_words.
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

/// Release-stores `value` into the signal word `word` that `peer` reserves for this rank, with no
/// range check (signal_set's store, also used for the library's own words).
template <Scope S>
SYMCOMM_DEVICE void signal_store(const DevComm& comm, uint32_t peer, uint32_t word, uint64_t value) {
    st_release<S>(signal_word(comm, peer, comm.rank, word), value);
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
    detail::signal_store<S>(comm, peer, word, value);
    return Status::Ok;
}

template <Scope S>
SYMCOMM_DEVICE Status signal_add(Thread t, const DevComm& comm, uint32_t peer, uint32_t word, uint64_t delta,
                                 uint64_t* previous) {
    if (!detail::is_user_signal(comm, peer, word)) return detail::refuse_signal(t, comm, peer, word, SYMCOMM_OP_SIGNAL);
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

// Inline definitions of <symcomm/semaphore.cuh> (included at its end).
#pragma once

namespace symcomm {

template <Scope S>
SYMCOMM_DEVICE Status semaphore_signal(Thread t, const DevComm& comm, uint32_t peer, uint32_t word) {
    return signal_add<S>(t, comm, peer, word, 1);
}

template <Scope S, typename Group>
SYMCOMM_DEVICE Status semaphore_wait(Group g, const DevComm& comm, uint32_t peer, uint32_t word, uint64_t* expected) {
    Status s = Status::Ok;
    if (g.thread_rank() == 0) {
        // Private to this thread while it runs (one waiter per counter) and ordered across
        // launches by the kernel boundary: relaxed accesses suffice.
        const uint64_t target = ld_relaxed<Scope::Gpu>(expected) + 1;
        s = signal_wait_until<S>(Thread{}, comm, peer, word, target);
        if (s == Status::Ok) st_relaxed<Scope::Gpu>(expected, target);
    }
    return detail::group_status_ordered(g, s);
}

}  // namespace symcomm

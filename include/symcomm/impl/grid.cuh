// Inline definitions of <symcomm/grid.cuh> (included at its end).
#pragma once

namespace symcomm {

template <Scope S>
SYMCOMM_DEVICE_NOINLINE Status grid_sync(Cta g, const DevComm& comm, uint64_t* state) {
    const uint64_t nctas = uint64_t(gridDim.x) * gridDim.y * gridDim.z;
    // The CTA's writes before thread 0's arrival (cumulative release of the add).
    g.sync();
    Status s = Status::Ok;
    if (g.thread_rank() == 0) {
        // Acquire too: the last arrival must see every earlier CTA's writes to release them on.
        const uint64_t old = atomic_add_acq_rel<S>(state, 1);
        const uint32_t generation = uint32_t(old >> 32);
        if (uint32_t(old) + 1 == nctas) {
            // Only the generation's CTAs add before it completes, so the count is exactly nctas.
            atomic_add_release<S>(state, (uint64_t(1) << 32) - nctas);
        } else {
            uint64_t seen = 0;
            s = poll_until<S>(
                Thread{}, comm, state, [generation](uint64_t v) { return uint32_t(v >> 32) != generation; },
                comm.rank, SYMCOMM_OP_GRID_SYNC, generation, seen);
        }
    }
    return detail::group_status_ordered(g, s);
}

}  // namespace symcomm

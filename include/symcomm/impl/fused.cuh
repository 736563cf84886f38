// Inline definitions of <symcomm/fused.cuh> (included at its end).
#pragma once

namespace symcomm {

template <RedOp Op, typename T>
SYMCOMM_DEVICE PackAccumulator<T, Op> reduce_pack_peers(WindowSlice<T> src) {
    return detail::peer_packs<T, Op>(src.window, src.offset, src.nranks());
}

template <RedOp Op, typename A>
SYMCOMM_DEVICE A group_reduce(Warp, A v) {
    static_assert(Op != RedOp::Avg, "group_reduce: reduce with Sum and divide instead of Avg");
    // Butterfly: after the step with distance `o`, lanes i and i^o hold combine(x, y) and
    // combine(y, x), which are the same bits (the operators are commutative), so every lane ends
    // with the same value.
    SYMCOMM_UNROLL
    for (int o = 16; o > 0; o >>= 1) v = detail::combine<Op>(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <RedOp Op, typename A>
SYMCOMM_DEVICE A group_reduce(Cta g, A v) {
    SYMCOMM_SHARED(A, symcomm_group_reduce_warps, 32);
    v = group_reduce<Op>(Warp{}, v);
    const uint32_t warps = g.size() / 32u;
    if (g.thread_rank() % 32u == 0) symcomm_group_reduce_warps[g.thread_rank() / 32u] = v;
    g.sync();
    // Every thread combines the warps' values in warp order (a broadcast read of shared memory).
    A r = symcomm_group_reduce_warps[0];
    for (uint32_t w = 1; w < warps; ++w) r = detail::combine<Op>(r, symcomm_group_reduce_warps[w]);
    // The next call overwrites the array: every thread must have read it first.
    g.sync();
    return r;
}

}  // namespace symcomm

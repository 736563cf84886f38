// symcomm device library: building blocks for fused communication + compute kernels.
//
// The collectives of collectives.cuh read windows and write windows. A fused kernel (all-reduce
// + residual add + RMSNorm, a GEMM epilogue that reduces its tile) wants the reduced values in
// registers, to keep computing on them before anything is stored. The pieces for that:
//
//   reduce_pack_peers<Op>(src)          the 16-byte pack at the start of slice `src` (win.at(i))
//                                       in every rank's copy, reduced element-wise in rank order
//                                       into accumulators (registers), not rounded: the caller
//                                       keeps computing in acc_t<T>
//   group_reduce<Op>(Warp{} | Cta{}, v) the reduction of one value per thread over a warp or a
//                                       CTA, returned to every thread (e.g. sum(y^2) of a row)
//   SYMCOMM_UNROLL                      `#pragma unroll` that the emulator build accepts
//
// The communication protocol around reduce_pack_peers is the one-shot all-reduce's, written out
// in the kernel (see device/kernels/fused_allreduce_rmsnorm.cu for a complete example):
//
//   barrier(g, comm, slot, fp)      every rank's input in `src` is written and visible
//   ... reduce_pack_peers(...) ...  read every rank's input, compute, store results anywhere
//   barrier(g, comm, slot, fp)      no rank reads this rank's input any more: it may be
//                                   overwritten (the next layer's GEMM) once the kernel returns
//
// `slot` is the CTA's barrier index (a caller-chosen base + blockIdx.x, < SYMCOMM_USER_BARRIER_END)
// and `fp` a fingerprint() of what the call is, so that ranks calling different things fail
// with Status::Mismatch instead of reading garbage.
#pragma once

#include <symcomm/collectives.cuh>
#include <symcomm/group.cuh>
#include <symcomm/reduce.cuh>
#include <symcomm/types.cuh>
#include <symcomm/window.cuh>

// SYMCOMM_UNROLL is defined in <symcomm/config.cuh>.

namespace symcomm {

/// Element-wise reduction with `Op` of the pack at the start of slice `src` (the 16 bytes from
/// element src.offset) in every rank's copy, peers in rank order 0..nranks-1, in the accumulation
/// type and not
/// rounded: element j is `result.a[j].acc` (`acc_t<T>`, float for f16/bf16/fp8/f32), or
/// `result.result(nranks)` rounds it to T as the collectives do. Every rank gets the same bits.
///
/// Who calls: any thread, for its own pack. Pre: `src.peer_ptr(p, 0)` is 16-byte aligned
/// (pack_aligned) and inside the window for every rank p; the inputs were made visible by a
/// barrier (or a signal wait) after every rank wrote them. Plain loads: they order nothing. With
/// 2, 4 or 8 ranks every rank's load is issued before the first combine (all in flight at once).
template <RedOp Op, typename T>
SYMCOMM_DEVICE PackAccumulator<T, Op> reduce_pack_peers(WindowSlice<T> src);

/// The reduction with `Op` (Sum, Prod, Min, Max; see Accumulator for the semantics) of `v` over
/// the 32 threads of the warp, returned to every thread, with the same bits on every thread.
/// `A`: float, double, int, unsigned, long long, unsigned long long (what shuffles carry).
/// Who calls: every thread of a complete warp. Exchanges values only: orders no memory.
template <RedOp Op, typename A>
SYMCOMM_DEVICE A group_reduce(Warp, A v);

/// The reduction with `Op` of `v` over every thread of the CTA, returned to every thread with the
/// same bits; the combination order is fixed by the CTA shape (deterministic from run to run).
/// Who calls: every thread of the CTA (a collective call). Pre: the CTA size is a multiple of 32
/// and at most 1024. Synchronizes the CTA twice (`__syncthreads`); uses 32 `A`s of static shared
/// memory per type `A` and operator. `A` as for the warp form.
template <RedOp Op, typename A>
SYMCOMM_DEVICE A group_reduce(Cta g, A v);

}  // namespace symcomm

#include <symcomm/impl/fused.cuh>

// The built-in collective kernel: one launch runs one collective of the device library
// (collectives.cuh) described by a CollArgs, at grid scope (every CTA on one buffer) or CTA
// scope (CTA b runs its own collective on the tile at offset + b * tile_stride, barrier index
// index + b). Host collectives launch it; the tests drive every dtype, op, kind and scope
// through it on the emulator and on GPUs.
//
// Launch: any grid, blocks of at most SYMCOMM_BUILTIN_THREADS threads (at least nranks for in-place all-to-all);
// every rank launches the same configuration with the same CollArgs except its own windows.
// Errors (Timeout, Aborted, Mismatch, InvalidArgument) land in the rank's ErrorRecord. Bounds:
// as every collective (collectives.cuh), each CTA refuses before any access a range outside its
// windows — at CTA scope, its own tile (offsets + b * tile_stride) — and windows whose element
// type is not args.dtype's.
//
// Staged calls (args.src_ptr / dst_ptr not 0: the host's collectives on buffers that are not
// windows) read this rank's input and write its output at those device addresses instead of its
// copies of the windows (detail::Local); the windows stage what peers read. The kernel cannot
// check those addresses: the host validated them.
//
// Private to the built-in kernels (collective_<type>.cu include it as "collective_kernel.cuh"), not
// part of the public device API in include/symcomm/. The root build.rs adds device/kernels as an
// include directory so that the header is embedded for NVRTC too.
#pragma once

#include <symcomm/symcomm.cuh>

namespace {

using namespace symcomm;

/// The arguments one CTA works with, after applying the scope.
struct Call {
    DevComm comm;
    CollArgs a;
    CollScope scope;
    uint64_t soff, doff;
    /// CTA scope: elements from the first tile to this CTA's (soff - a.src_offset); 0 otherwise.
    uint64_t tile;

    template <typename T>
    SYMCOMM_DEVICE WindowSlice<T> src() const {
        return WindowHandle<T>(a.src).at(soff);
    }
    template <typename T>
    SYMCOMM_DEVICE WindowSlice<T> dst() const {
        return WindowHandle<T>(a.dst).at(doff);
    }
    /// This rank's input and output: the windows' copies, or the user's buffers of a staged call
    /// (a.src_ptr, a.dst_ptr; blocks a.ptr_stride apart, this CTA's tile further on).
    template <typename T>
    SYMCOMM_DEVICE detail::Local<T> local(const WindowSlice<T>& s, const WindowSlice<T>& d) const {
        detail::Local<T> l = detail::windows(s, d, a.count);
        if (a.src_ptr != 0) {
            l.in = reinterpret_cast<const T*>(a.src_ptr) + tile;
            l.in_stride = a.ptr_stride;
            l.fill = true;
        }
        if (a.dst_ptr != 0) {
            l.out = reinterpret_cast<T*>(a.dst_ptr) + tile;
            l.out_stride = a.ptr_stride;
            l.direct = true;
        }
        return l;
    }
};

/// Whether collective kind `kind` takes a reduction operator (and runs through RunReduction).
SYMCOMM_DEVICE bool is_reduction_kind(uint32_t kind) {
    return kind == SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT || kind == SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT ||
           kind == SYMCOMM_COLL_ALL_REDUCE_LL || kind == SYMCOMM_COLL_REDUCE_SCATTER ||
           kind == SYMCOMM_COLL_REDUCE_SCATTER_LL || kind == SYMCOMM_COLL_REDUCE;
}

template <typename T, RedOp Op>
struct RunReduction {
    static SYMCOMM_DEVICE void run(Cta g, const Call& c, Status& st) {
        const WindowSlice<T> src = c.src<T>(), dst = c.dst<T>();
        const detail::Local<T> l = c.local(src, dst);
        switch (c.a.kind) {
            case SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT:
                st = detail::all_reduce_one_shot<Op>(g, c.comm, c.scope, src, dst, c.a.count, l);
                break;
            case SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT:
                st = detail::all_reduce_two_shot<Op>(g, c.comm, c.scope, src, dst, c.a.count, l);
                break;
            case SYMCOMM_COLL_ALL_REDUCE_LL:
                st = detail::all_reduce_ll<Op>(g, c.comm, c.scope, src, dst, c.a.count, l);
                break;
            case SYMCOMM_COLL_REDUCE_SCATTER:
                st = detail::reduce_scatter<Op>(g, c.comm, c.scope, src, dst, c.a.count, l);
                break;
            case SYMCOMM_COLL_REDUCE_SCATTER_LL:
                st = detail::reduce_scatter_ll<Op>(g, c.comm, c.scope, src, dst, c.a.count, l);
                break;
            default:
                st = detail::reduce<Op>(g, c.comm, c.scope, src, dst, c.a.count, c.a.root, l);
                break;
        }
    }
};

template <typename T>
SYMCOMM_DEVICE Status run_copy(Cta g, const Call& c) {
    const WindowSlice<T> src = c.src<T>(), dst = c.dst<T>();
    const detail::Local<T> l = c.local(src, dst);
    switch (c.a.kind) {
        case SYMCOMM_COLL_ALL_GATHER:
            return detail::all_gather(g, c.comm, c.scope, src, dst, c.a.count, l);
        case SYMCOMM_COLL_ALL_GATHER_LL:
            return detail::all_gather_ll(g, c.comm, c.scope, src, dst, c.a.count, l);
        case SYMCOMM_COLL_BROADCAST:
            return detail::broadcast(g, c.comm, c.scope, src, dst, c.a.count, c.a.root, l);
        case SYMCOMM_COLL_BROADCAST_LL:
            return detail::broadcast_ll(g, c.comm, c.scope, src, dst, c.a.count, c.a.root, l);
        case SYMCOMM_COLL_SCATTER:
            return detail::scatter(g, c.comm, c.scope, src, dst, c.a.count, c.a.root, l);
        default:
            return detail::all_to_all(g, c.comm, c.scope, src, dst, c.a.count, l);
    }
}


/// `off + b * stride` in `out`, or false when it does not fit in 64 bits.
SYMCOMM_DEVICE bool tile_offset(uint64_t off, uint32_t b, uint64_t stride, uint64_t& out) {
    const uint64_t max = ~uint64_t(0);
    if (b != 0 && stride > max / b) return false;
    const uint64_t t = uint64_t(b) * stride;
    if (t > max - off) return false;
    out = off + t;
    return true;
}

/// The kernel body for element type `T` (one kernel per dtype keeps each kernel small: ptxas time
/// grows faster than linearly with kernel size).
template <typename T>
SYMCOMM_DEVICE void collective(const DevComm& comm, const CollArgs& args) {
    const Cta g;
    if (comm.abi_version != SYMCOMM_ABI_VERSION) {
        if (g.thread_rank() == 0) record_error(Thread{}, comm, Status::AbiMismatch, comm.rank, SYMCOMM_OP_COLLECTIVE, args.kind);
        return;
    }
    const bool reduction = is_reduction_kind(args.kind);
    // args.dtype must be this kernel's; the collective then checks the windows' type codes
    // against T, i.e. against args.dtype (WindowHandle::holds_dtype).
    const bool valid = args.kind < SYMCOMM_COLL_COUNT && args.dtype == uint32_t(TypeTraits<T>::dtype) &&
                       (!reduction || redop_valid(args.redop)) && args.scope <= SYMCOMM_SCOPE_CTA;
    if (!valid) {
        (void)detail::refuse(g, comm, args.kind, SYMCOMM_REFUSED_CODE);
        return;
    }
    const uint32_t block = detail::linear_block_index();
    Call c{comm, args, grid_scope(args.index), args.src_offset, args.dst_offset, 0};
    if (args.scope == SYMCOMM_SCOPE_CTA) {
        c.scope = cta_scope(args.index + block);
        // This CTA's tile; one whose offset wraps around 2^64 is refused here (the collective
        // checks the rest of the range), like any other range outside the window.
        if (!tile_offset(args.src_offset, block, args.tile_stride, c.soff)) {
            (void)detail::refuse(g, comm, args.kind, SYMCOMM_REFUSED_SRC_RANGE);
            return;
        }
        if (!tile_offset(args.dst_offset, block, args.tile_stride, c.doff)) {
            (void)detail::refuse(g, comm, args.kind, SYMCOMM_REFUSED_DST_RANGE);
            return;
        }
        c.tile = c.soff - args.src_offset;
    }
    Status st = Status::Ok;  // failures are in the ErrorRecord
    if (reduction) {
        symcomm::detail::dispatch_op<RunReduction, T>(RedOp(args.redop), g, c, st);
    } else {
        st = run_copy<T>(g, c);
    }
    (void)st;
}

}  // namespace

/// `symcomm_collective_<dtype>(DevComm comm, CollArgs args)`: the collective `args` on elements
/// of `<dtype>` (args.dtype must match). At most SYMCOMM_BUILTIN_THREADS threads per CTA.
#define SYMCOMM_COLLECTIVE_KERNEL(suffix, T)                                                        \
    extern "C" __global__ void __launch_bounds__(SYMCOMM_BUILTIN_THREADS, 1)                       \
        symcomm_collective_##suffix(DevComm comm, CollArgs args) {                                 \
        collective<T>(comm, args);                                                                 \
    }

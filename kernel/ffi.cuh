// The device library's C ABI for Rust kernels (the `symcomm-kernel` crate, kernel/src/ffi.rs):
// what its source files share.
//
// Each function of the C ABI wraps one primitive of the CUDA C++ device library (include/symcomm/)
// so that Rust code calls the one implementation instead of a second one. The sources:
//   ffi.cu                     errors, signals and semaphores, barriers, put / get, partitions
//   ffi_collective_<type>.cu   symcomm_rs_collective_<type>: one file per element type, as the
//                              built-in kernels' collective_<type>.cu (builds compile them in
//                              parallel; together they are most of the C ABI's compile time)
// On a GPU each is compiled with `nvcc -rdc=true` to relocatable PTX and linked with the Rust
// kernels' PTX by nvlink (symcomm_device::build); on the emulator each is compiled by the host
// C++ compiler with the emulator shim (kernel/build.rs) into one archive linked into the Rust
// program. The list of sources is symcomm_device::build::rust::KERNEL_FFI_SOURCES.
#pragma once

#include <symcomm/symcomm.cuh>

#include "collective_kernel.cuh"

#if defined(SYMCOMM_EMU)
#define SYMCOMM_RS_FFI extern "C"
#else
#define SYMCOMM_RS_FFI extern "C" __device__ __noinline__
#endif

namespace symcomm_rs {

using namespace symcomm;

/// One collective of the device library on elements of T, as `args` describes it (kind, op,
/// root, scope: SYMCOMM_SCOPE_GRID with first barrier index `index`, or SYMCOMM_SCOPE_CTA on
/// barrier index `index`; `tile_stride` unused). Returns the collective's status, the same on
/// every thread of the CTA.
template <typename T>
SYMCOMM_DEVICE uint32_t rs_collective(const DevComm& comm, const CollArgs& args) {
    const Cta g;
    if (comm.abi_version != SYMCOMM_ABI_VERSION) {
        if (g.thread_rank() == 0) {
            record_error(Thread{}, comm, Status::AbiMismatch, comm.rank, SYMCOMM_OP_COLLECTIVE, args.kind);
        }
        return SYMCOMM_STATUS_ABI_MISMATCH;
    }
    const bool reduction = is_reduction_kind(args.kind);
    const bool valid = args.kind < SYMCOMM_COLL_COUNT && args.dtype == uint32_t(TypeTraits<T>::dtype) &&
                       (!reduction || redop_valid(args.redop)) && args.scope <= SYMCOMM_SCOPE_CTA;
    if (!valid) return uint32_t(detail::refuse(g, comm, args.kind, SYMCOMM_REFUSED_CODE));
    const CollScope scope = args.scope == SYMCOMM_SCOPE_CTA ? cta_scope(args.index) : grid_scope(args.index);
    const Call c{comm, args, scope, args.src_offset, args.dst_offset, 0};
    Status st = Status::Ok;
    if (reduction) {
        detail::dispatch_op<RunReduction, T>(RedOp(args.redop), g, c, st);
    } else {
        st = run_copy<T>(g, c);
    }
    return uint32_t(st);
}

}  // namespace symcomm_rs

/// `symcomm_rs_collective_<dtype>(comm, args)`: one collective on elements of `<dtype>` (see
/// rs_collective), defined by ffi_collective_<dtype>.cu. One function per type keeps each
/// function small for ptxas.
#define SYMCOMM_RS_COLLECTIVE(suffix, T)                                                                     \
    SYMCOMM_RS_FFI uint32_t symcomm_rs_collective_##suffix(const DevComm* comm,                              \
                                                           const CollArgs* args) {                           \
        return symcomm_rs::rs_collective<T>(*comm, *args);                                                   \
    }

// Compile check of the numeric layer (types.cuh, reduce.cuh) for the device: every dtype x op
// instantiated through the run-time dispatch (one kernel) and through SYMCOMM_FOR_EACH_DTYPE_OP
// (one small kernel per pair), the loop shapes of a collective for two pairs, the conversions. Compiled by
// device/tests/numerics.rs with the pinned nvcc (SASS sm_80 and sm_90, `-Xptxas -v`), with the
// pinned NVRTC (PTX for sm_80 / sm_90, then assembled with ptxas) and with the host compiler in
// emulator mode — so it uses no standard headers. Not run on a GPU by that test.
#include <symcomm/reduce.cuh>

namespace {

using namespace symcomm;

/// Two peers' 16-byte packs reduced into one, and one scalar element: the straight-line body that
/// `dispatch` instantiates 60 times (loops in all 60 would cost ptxas seconds; see dispatch's
/// docs — the loop shapes are compiled per pair below).
template <typename T, RedOp Op>
struct PackStep {
    static SYMCOMM_DEVICE void run(const T* a, const T* b, T* out, uint64_t pack) {
        constexpr uint32_t N = Pack16<T>::N;
        const uint64_t at = pack * (N + 1);
        const Pack16<T> in[2] = {load_pack(a + at), load_pack(b + at)};
        store_pack(out + at, reduce_packs<T, Op>(in, 2, 2));
        Accumulator<T, Op> acc;
        acc.first(a[at + N]);
        acc.add(b[at + N]);
        out[at + N] = acc.result(2);
    }
};

/// PackStep on untyped pointers (the kernel's arguments).
template <typename T, RedOp Op>
struct PackStepAny {
    static SYMCOMM_DEVICE void run(const void* a, const void* b, void* out, uint64_t pack) {
        PackStep<T, Op>::run(static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), pack);
    }
};

/// The shape of a collective's inner loop: a grid-stride loop over packs of `k` peers (run-time
/// count), then the scalar tail. Pre: every pointer 16-byte aligned.
template <typename T, RedOp Op>
SYMCOMM_DEVICE void reduce_loop(const void* const* srcs, uint32_t k, void* dst, uint64_t count) {
    const T* const* src = reinterpret_cast<const T* const*>(srcs);
    T* out = static_cast<T*>(dst);
    constexpr uint32_t N = Pack16<T>::N;
    const uint64_t packs = count / N;
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    const uint64_t tid = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (uint64_t p = tid; p < packs; p += stride) {
        store_pack(out + p * N, reduce_packs_from<T, Op>(k, k, [&](uint32_t j) { return load_pack(src[j] + p * N); }));
    }
    for (uint64_t i = packs * N + tid; i < count; i += stride) {
        Accumulator<T, Op> acc;
        acc.first(src[0][i]);
        for (uint32_t j = 1; j < k; ++j) acc.add(src[j][i]);
        out[i] = acc.result(k);
    }
}

/// Eight peers known at compile time: all loads issued before the reduction, packs in registers.
template <typename T, RedOp Op>
SYMCOMM_DEVICE void reduce8_loop(const void* const* srcs, void* dst, uint64_t packs) {
    constexpr uint32_t K = 8;
    const T* const* src = reinterpret_cast<const T* const*>(srcs);
    T* out = static_cast<T*>(dst);
    constexpr uint32_t N = Pack16<T>::N;
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    for (uint64_t p = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
        Pack16<T> in[K];
#if !defined(SYMCOMM_EMU)
#pragma unroll
#endif
        for (uint32_t j = 0; j < K; ++j) in[j] = load_pack(src[j] + p * N);
        store_pack(out + p * N, reduce_packs<T, Op>(in, K, K));
    }
}

}  // namespace

/// Every dtype x op through the run-time dispatch; `*status` = 1 when the codes are invalid.
/// `a`, `b`, `out` are arrays of the element type named by `dtype`.
extern "C" __global__ void symcomm_numerics_dispatch(const void* a, const void* b, void* out, uint32_t dtype,
                                                     uint32_t op, uint32_t* status) {
    using namespace symcomm;
    const uint64_t pack = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (!dispatch<PackStepAny>(DataType(dtype), RedOp(op), a, b, out, pack) && pack == 0) *status = 1;
}
SYMCOMM_EMU_KERNEL(symcomm_numerics_dispatch)

/// Every dtype x op as its own kernel (SYMCOMM_FOR_EACH_DTYPE_OP): `symcomm_numerics_pair_<d>_<o>`,
/// a scalar reduction of two arrays (kept small: 60 kernels).
#define NUMERICS_PAIR_KERNEL(T, Op, d, o)                                                                   \
    extern "C" __global__ void symcomm_numerics_pair_##d##_##o(const T* a, const T* b, T* out) {             \
        const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;                                           \
        symcomm::Accumulator<T, Op> acc;                                                                    \
        acc.first(a[i]);                                                                                    \
        acc.add(b[i]);                                                                                      \
        out[i] = acc.result(2);                                                                             \
    }                                                                                                       \
    SYMCOMM_EMU_KERNEL(symcomm_numerics_pair_##d##_##o)
SYMCOMM_FOR_EACH_DTYPE_OP(NUMERICS_PAIR_KERNEL)

/// The shape of a collective's inner loop (run-time peer count, grid-stride, scalar tail) for the
/// widest accumulator (fp8: 16 floats per pack) with the costliest operator, and for f16 sum.
extern "C" __global__ void symcomm_numerics_reduce_fp8_e4m3_avg(const void* const* srcs, uint32_t k, void* dst,
                                                                uint64_t count) {
    reduce_loop<symcomm::fp8_e4m3_t, symcomm::RedOp::Avg>(srcs, k, dst, count);
}
SYMCOMM_EMU_KERNEL(symcomm_numerics_reduce_fp8_e4m3_avg)
extern "C" __global__ void symcomm_numerics_reduce_f16_sum(const void* const* srcs, uint32_t k, void* dst,
                                                           uint64_t count) {
    reduce_loop<symcomm::half_t, symcomm::RedOp::Sum>(srcs, k, dst, count);
}
SYMCOMM_EMU_KERNEL(symcomm_numerics_reduce_f16_sum)

/// Eight peers known at compile time, packs in registers (the test checks that no kernel has a
/// stack frame), for the same two pairs.
extern "C" __global__ void symcomm_numerics_reduce8_fp8_e4m3_avg(const void* const* srcs, void* dst, uint64_t packs) {
    reduce8_loop<symcomm::fp8_e4m3_t, symcomm::RedOp::Avg>(srcs, dst, packs);
}
SYMCOMM_EMU_KERNEL(symcomm_numerics_reduce8_fp8_e4m3_avg)
extern "C" __global__ void symcomm_numerics_reduce8_f16_sum(const void* const* srcs, void* dst, uint64_t packs) {
    reduce8_loop<symcomm::half_t, symcomm::RedOp::Sum>(srcs, dst, packs);
}
SYMCOMM_EMU_KERNEL(symcomm_numerics_reduce8_f16_sum)

/// Every conversion: in[i] -> each format and back to float.
extern "C" __global__ void symcomm_numerics_convert(const float* in, uint64_t n, unsigned short* f16,
                                                    unsigned short* bf16, unsigned char* e4m3, unsigned char* e5m2,
                                                    float* back) {
    using namespace symcomm;
    for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
        const half_t h = float_to_half(in[i]);
        const bfloat16_t b = float_to_bfloat16(in[i]);
        const fp8_e4m3_t q4 = float_to_fp8_e4m3(in[i]);
        const fp8_e5m2_t q5 = float_to_fp8_e5m2(in[i]);
        f16[i] = h.bits;
        bf16[i] = b.bits;
        e4m3[i] = q4.bits;
        e5m2[i] = q5.bits;
        back[4 * i + 0] = to_float(h);
        back[4 * i + 1] = to_float(b);
        back[4 * i + 2] = to_float(q4);
        back[4 * i + 3] = to_float(q5);
    }
}
SYMCOMM_EMU_KERNEL(symcomm_numerics_convert)

// The pre-multiplication of a pre-multiplied sum (NCCL's ncclRedOpCreatePreMulSum): `dst[i] =
// src[i] * scalar` in the element type, before a sum collective of `dst`. Each rank scales its own
// contribution with its own scalar, so the collective itself is a plain sum.
//
// Launch: any 1-D grid and block (a grid-stride loop over `count` elements). `src` and `dst` may
// be the same buffer; otherwise they do not overlap. `scalar` points to one element of `dtype` in
// device memory (host memory on the emulator), read when the kernel runs. `dtype` is a
// SYMCOMM_DTYPE_* code; another code does nothing.
//
// Rounding: one rounding to the element type per product. For half, bfloat16 and the fp8 types
// the product of two values is exact in float (their significands have at most 11 bits), so
// rounding it to the element type equals an exact multiply rounded once, as a native multiply in
// that type does. Integers wrap modulo 2^bits.
#include <symcomm/symcomm.cuh>

namespace {

using namespace symcomm;

template <typename T>
SYMCOMM_DEVICE T premul(T v, T s) {
    if constexpr (TypeTraits<T>::is_float && sizeof(T) < 4) {
        return TypeTraits<T>::from_acc(TypeTraits<T>::to_acc(v) * TypeTraits<T>::to_acc(s));
    } else if constexpr (TypeTraits<T>::is_float) {
        return v * s;
    } else {
        // Unsigned arithmetic: wraps instead of overflowing.
        using U = unsigned long long;
        return T(U(v) * U(s));
    }
}

template <typename T>
SYMCOMM_DEVICE void premul_all(const void* src, void* dst, uint64_t count, const void* scalar) {
    const T s = *static_cast<const T*>(scalar);
    const T* in = static_cast<const T*>(src);
    T* out = static_cast<T*>(dst);
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
        out[i] = premul(in[i], s);
    }
}

}  // namespace

extern "C" __global__ void symcomm_premul(const void* src, void* dst, uint64_t count, uint32_t dtype,
                                          const void* scalar) {
    switch (dtype) {
        case SYMCOMM_DTYPE_F32: premul_all<float>(src, dst, count, scalar); break;
        case SYMCOMM_DTYPE_F64: premul_all<double>(src, dst, count, scalar); break;
        case SYMCOMM_DTYPE_F16: premul_all<half_t>(src, dst, count, scalar); break;
        case SYMCOMM_DTYPE_BF16: premul_all<bfloat16_t>(src, dst, count, scalar); break;
        case SYMCOMM_DTYPE_FP8_E4M3: premul_all<fp8_e4m3_t>(src, dst, count, scalar); break;
        case SYMCOMM_DTYPE_FP8_E5M2: premul_all<fp8_e5m2_t>(src, dst, count, scalar); break;
        case SYMCOMM_DTYPE_I8: premul_all<signed char>(src, dst, count, scalar); break;
        case SYMCOMM_DTYPE_U8: premul_all<unsigned char>(src, dst, count, scalar); break;
        case SYMCOMM_DTYPE_I32: premul_all<int>(src, dst, count, scalar); break;
        case SYMCOMM_DTYPE_U32: premul_all<unsigned int>(src, dst, count, scalar); break;
        case SYMCOMM_DTYPE_I64: premul_all<long long>(src, dst, count, scalar); break;
        case SYMCOMM_DTYPE_U64: premul_all<unsigned long long>(src, dst, count, scalar); break;
        default: break;
    }
}
SYMCOMM_EMU_KERNEL(symcomm_premul)

// nvcc / NVRTC definitions of the bit casts and f16/bf16 conversions of <symcomm/types.cuh>
// (chosen at the end of impl/types.cuh unless SYMCOMM_EMU): CUDA intrinsics and PTX `cvt`.
#pragma once

namespace symcomm {

SYMCOMM_DEVICE uint32_t float_as_bits(float f) { return __float_as_uint(f); }

SYMCOMM_DEVICE float bits_as_float(uint32_t u) { return __uint_as_float(u); }

SYMCOMM_DEVICE uint64_t double_as_bits(double d) { return static_cast<uint64_t>(__double_as_longlong(d)); }

SYMCOMM_DEVICE double bits_as_double(uint64_t u) { return __longlong_as_double(static_cast<long long>(u)); }

SYMCOMM_DEVICE float to_float(half_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
    return f;
}

SYMCOMM_DEVICE half_t float_to_half(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return half_t{h};
}

SYMCOMM_DEVICE bfloat16_t float_to_bfloat16(float f) {
    // `cvt.rn.bf16.f32` needs sm_80; nvcc's host pass and older targets take the software path.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 800
    return bfloat16_t{detail::float_to_bfloat16_bits_sw(f)};
#else
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return bfloat16_t{h};
#endif
}

}  // namespace symcomm

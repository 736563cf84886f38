// Emulator definitions of the bit casts and f16/bf16 conversions of <symcomm/types.cuh> (chosen
// at the end of impl/types.cuh under SYMCOMM_EMU): byte copies and the software paths, which are
// bit-identical to NVIDIA's host implementations.
#pragma once

namespace symcomm {

SYMCOMM_DEVICE uint32_t float_as_bits(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, sizeof u);
    return u;
}

SYMCOMM_DEVICE float bits_as_float(uint32_t u) {
    float f;
    __builtin_memcpy(&f, &u, sizeof f);
    return f;
}

SYMCOMM_DEVICE uint64_t double_as_bits(double d) {
    uint64_t u;
    __builtin_memcpy(&u, &d, sizeof u);
    return u;
}

SYMCOMM_DEVICE double bits_as_double(uint64_t u) {
    double d;
    __builtin_memcpy(&d, &u, sizeof d);
    return d;
}

SYMCOMM_DEVICE float to_float(half_t h) { return detail::half_bits_to_float_sw(h.bits); }

SYMCOMM_DEVICE half_t float_to_half(float f) { return half_t{detail::float_to_half_bits_sw(f)}; }

SYMCOMM_DEVICE bfloat16_t float_to_bfloat16(float f) { return bfloat16_t{detail::float_to_bfloat16_bits_sw(f)}; }

}  // namespace symcomm

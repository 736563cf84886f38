// Inline definitions of <symcomm/types.cuh> (included at its end): the codes, the software
// conversions (used on every architecture for FP8, and by the emulator for f16/bf16), the traits.
// The conversions with a PTX instruction on the device are in impl/types_ptx.cuh and
// impl/types_emu.cuh (chosen at the end of this file).
#pragma once

namespace symcomm {

SYMCOMM_DEVICE constexpr bool dtype_valid(uint32_t code) { return code < SYMCOMM_DTYPE_COUNT; }

SYMCOMM_DEVICE constexpr uint32_t dtype_size(DataType dt) {
    switch (dt) {
        case DataType::F64:
        case DataType::I64:
        case DataType::U64:
            return 8;
        case DataType::F32:
        case DataType::I32:
        case DataType::U32:
            return 4;
        case DataType::F16:
        case DataType::BF16:
            return 2;
        case DataType::Fp8E4M3:
        case DataType::Fp8E5M2:
        case DataType::I8:
        case DataType::U8:
            return 1;
    }
    return 0;
}

SYMCOMM_DEVICE constexpr const char* dtype_name(DataType dt) {
    switch (dt) {
        case DataType::F32: return "f32";
        case DataType::F64: return "f64";
        case DataType::F16: return "f16";
        case DataType::BF16: return "bf16";
        case DataType::Fp8E4M3: return "fp8_e4m3";
        case DataType::Fp8E5M2: return "fp8_e5m2";
        case DataType::I8: return "i8";
        case DataType::U8: return "u8";
        case DataType::I32: return "i32";
        case DataType::U32: return "u32";
        case DataType::I64: return "i64";
        case DataType::U64: return "u64";
    }
    return "invalid";
}

namespace detail {

/// `v >> s` rounded to nearest, ties to even. Pre: 1 <= s <= 31. Branch-free.
SYMCOMM_DEVICE uint32_t shift_right_rne(uint32_t v, uint32_t s) {
    const uint32_t q = v >> s;
    const uint32_t rem = v & ((1u << s) - 1u);
    const uint32_t half = 1u << (s - 1u);
    return q + (uint32_t(rem > half) | (uint32_t(rem == half) & q & 1u));
}

/// Magnitude encoding (exponent << M | mantissa) of the binary32 magnitude `u` (sign cleared, not
/// NaN) rounded to nearest even in a format with `M` mantissa bits, exponent bias `B` and
/// subnormals, without an upper bound: a result past the format's largest finite encoding means
/// overflow (binary32 infinity lands there too), which the caller clamps. Integer operations
/// and selects only (no branches, so no divergence; flush-to-zero modes cannot change it).
template <uint32_t M, uint32_t B>
SYMCOMM_DEVICE uint32_t round_magnitude(uint32_t u) {
    static_assert(M >= 1 && M < 23 && B >= 1 && B < 127, "small float format");
    const uint32_t e = u >> 23;  // biased binary32 exponent
    // Normal in the target: rebias the exponent in place; a mantissa carry rounds into it.
    const uint32_t normal = shift_right_rne(u - ((127u - B) << 23), 23u - M);
    // Subnormal (or zero) in the target: shift the 24-bit significand into place (a binary32
    // subnormal is far below half the target's minimum and gives 0). Rounding up from the largest
    // subnormal yields the smallest normal encoding, as it should. A shift of 25 or more leaves
    // less than half a unit: 0.
    const uint32_t sig = e != 0u ? ((u & 0x7fffffu) | 0x800000u) : 0u;
    const uint32_t below = 128u - B - e;  // binades below the target's smallest normal, if e + B < 128
    const uint32_t s = (23u - M) + (below < 25u ? below : 25u);
    const uint32_t subnormal = shift_right_rne(sig, s < 25u ? s : 25u);
    return e + B >= 128u ? normal : subnormal;
}

/// binary16 bits -> float, exact, integer operations only (NaN -> 0x7fffffff, as NVIDIA's host
/// `__half2float`).
SYMCOMM_DEVICE float half_bits_to_float_sw(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t mag = h & 0x7fffu;
    uint32_t u;
    if (mag >= 0x7c00u) {
        u = mag == 0x7c00u ? (sign | 0x7f800000u) : 0x7fffffffu;
    } else if (mag >= 0x0400u) {
        u = sign | ((mag << 13) + (112u << 23));
    } else {
        // Subnormal or zero: mag * 2^-24; int -> float and the power-of-two product are exact and
        // produce a normal float (no denormal operand), so FTZ modes do not matter.
        u = sign | float_as_bits(static_cast<float>(static_cast<int>(mag)) * 5.9604644775390625e-8f);
    }
    return bits_as_float(u);
}

/// float -> binary16 bits, round to nearest even, overflow to +-inf, NaN -> 0x7fff (the software
/// twin of `cvt.rn.f16.f32`, bit-identical to NVIDIA's host `__float2half_rn`).
SYMCOMM_DEVICE unsigned short float_to_half_bits_sw(float f) {
    const uint32_t x = float_as_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t u = x & 0x7fffffffu;
    uint32_t mag = round_magnitude<10, 15>(u);
    mag = mag < 0x7c00u ? mag : 0x7c00u;  // overflow and infinity
    return static_cast<unsigned short>(u > 0x7f800000u ? 0x7fffu : (sign | mag));
}

/// float -> bfloat16 bits, round to nearest even, overflow to +-inf, NaN -> 0x7fff (the software
/// twin of `cvt.rn.bf16.f32`, bit-identical to NVIDIA's host `__float2bfloat16_rn`).
SYMCOMM_DEVICE unsigned short float_to_bfloat16_bits_sw(float f) {
    const uint32_t x = float_as_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    // A carry out of the mantissa rounds into the exponent; +-max rounds to +-inf.
    return static_cast<unsigned short>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/// float -> FP8 bits with `M` mantissa bits, bias `B`, largest finite magnitude encoding `MAX`:
/// round to nearest even, saturate to +-max (also +-inf), NaN -> 0x7f.
template <uint32_t M, uint32_t B, uint32_t MAX>
SYMCOMM_DEVICE unsigned char float_to_fp8_bits(float f) {
    const uint32_t x = float_as_bits(f);
    const uint32_t sign = (x >> 24) & 0x80u;
    const uint32_t u = x & 0x7fffffffu;
    uint32_t mag = round_magnitude<M, B>(u);
    mag = mag < MAX ? mag : MAX;  // saturation, infinity included
    return static_cast<unsigned char>(u > 0x7f800000u ? 0x7fu : (sign | mag));
}

}  // namespace detail

SYMCOMM_DEVICE float to_float(bfloat16_t b) { return bits_as_float(uint32_t(b.bits) << 16); }

SYMCOMM_DEVICE float to_float(fp8_e4m3_t v) {
    const uint32_t sign = (uint32_t(v.bits) & 0x80u) << 24;
    const uint32_t mag = uint32_t(v.bits) & 0x7fu;
    uint32_t u;
    if (mag == 0x7fu) {
        u = 0x7fffffffu;
    } else if (mag >= 0x08u) {
        u = sign | ((mag << 20) + (120u << 23));
    } else {
        // Subnormal or zero: mag * 2^-9, exact (see half_bits_to_float_sw).
        u = sign | float_as_bits(static_cast<float>(static_cast<int>(mag)) * 0.001953125f);
    }
    return bits_as_float(u);
}

SYMCOMM_DEVICE float to_float(fp8_e5m2_t v) { return detail::half_bits_to_float_sw(uint32_t(v.bits) << 8); }

SYMCOMM_DEVICE fp8_e4m3_t float_to_fp8_e4m3(float f) { return fp8_e4m3_t{detail::float_to_fp8_bits<3, 7, 0x7eu>(f)}; }

SYMCOMM_DEVICE fp8_e5m2_t float_to_fp8_e5m2(float f) { return fp8_e5m2_t{detail::float_to_fp8_bits<2, 15, 0x7bu>(f)}; }

namespace detail {

template <typename T, typename A, DataType D, bool F>
struct TraitsBase {
    using Acc = A;
    static constexpr DataType dtype = D;
    static constexpr uint32_t size = sizeof(T);
    static constexpr bool is_float = F;
    static SYMCOMM_DEVICE constexpr const char* name() { return dtype_name(D); }
};

/// Traits of an integer or native floating-point type: accumulate in the type itself.
template <typename T, DataType D, bool F>
struct IdentityTraits : TraitsBase<T, T, D, F> {
    static SYMCOMM_DEVICE T to_acc(T v) { return v; }
    static SYMCOMM_DEVICE T from_acc(T v) { return v; }
};

}  // namespace detail

template <>
struct TypeTraits<float> : detail::IdentityTraits<float, DataType::F32, true> {};
template <>
struct TypeTraits<double> : detail::IdentityTraits<double, DataType::F64, true> {};
template <>
struct TypeTraits<signed char> : detail::IdentityTraits<signed char, DataType::I8, false> {};
template <>
struct TypeTraits<unsigned char> : detail::IdentityTraits<unsigned char, DataType::U8, false> {};
template <>
struct TypeTraits<int> : detail::IdentityTraits<int, DataType::I32, false> {};
template <>
struct TypeTraits<unsigned int> : detail::IdentityTraits<unsigned int, DataType::U32, false> {};
template <>
struct TypeTraits<long long> : detail::IdentityTraits<long long, DataType::I64, false> {};
template <>
struct TypeTraits<unsigned long long> : detail::IdentityTraits<unsigned long long, DataType::U64, false> {};
template <>
struct TypeTraits<long>
    : detail::IdentityTraits<long, sizeof(long) == 8 ? DataType::I64 : DataType::I32, false> {};
template <>
struct TypeTraits<unsigned long>
    : detail::IdentityTraits<unsigned long, sizeof(long) == 8 ? DataType::U64 : DataType::U32, false> {};

template <>
struct TypeTraits<half_t> : detail::TraitsBase<half_t, float, DataType::F16, true> {
    static SYMCOMM_DEVICE float to_acc(half_t v) { return to_float(v); }
    static SYMCOMM_DEVICE half_t from_acc(float a) { return float_to_half(a); }
};
template <>
struct TypeTraits<bfloat16_t> : detail::TraitsBase<bfloat16_t, float, DataType::BF16, true> {
    static SYMCOMM_DEVICE float to_acc(bfloat16_t v) { return to_float(v); }
    static SYMCOMM_DEVICE bfloat16_t from_acc(float a) { return float_to_bfloat16(a); }
};
template <>
struct TypeTraits<fp8_e4m3_t> : detail::TraitsBase<fp8_e4m3_t, float, DataType::Fp8E4M3, true> {
    static SYMCOMM_DEVICE float to_acc(fp8_e4m3_t v) { return to_float(v); }
    static SYMCOMM_DEVICE fp8_e4m3_t from_acc(float a) { return float_to_fp8_e4m3(a); }
};
template <>
struct TypeTraits<fp8_e5m2_t> : detail::TraitsBase<fp8_e5m2_t, float, DataType::Fp8E5M2, true> {
    static SYMCOMM_DEVICE float to_acc(fp8_e5m2_t v) { return to_float(v); }
    static SYMCOMM_DEVICE fp8_e5m2_t from_acc(float a) { return float_to_fp8_e5m2(a); }
};

template <> struct TypeOf<DataType::F32> { using type = float; };
template <> struct TypeOf<DataType::F64> { using type = double; };
template <> struct TypeOf<DataType::F16> { using type = half_t; };
template <> struct TypeOf<DataType::BF16> { using type = bfloat16_t; };
template <> struct TypeOf<DataType::Fp8E4M3> { using type = fp8_e4m3_t; };
template <> struct TypeOf<DataType::Fp8E5M2> { using type = fp8_e5m2_t; };
template <> struct TypeOf<DataType::I8> { using type = signed char; };
template <> struct TypeOf<DataType::U8> { using type = unsigned char; };
template <> struct TypeOf<DataType::I32> { using type = int; };
template <> struct TypeOf<DataType::U32> { using type = unsigned int; };
template <> struct TypeOf<DataType::I64> { using type = long long; };
template <> struct TypeOf<DataType::U64> { using type = unsigned long long; };

}  // namespace symcomm

#if defined(SYMCOMM_EMU)
#include <symcomm/impl/types_emu.cuh>
#else
#include <symcomm/impl/types_ptx.cuh>
#endif

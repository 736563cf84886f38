// symcomm device library: element types of collectives.
//
// - `DataType`: the run-time element-type code (SYMCOMM_DTYPE_* of abi.h, shared with Rust).
// - Portable 16- and 8-bit floating-point storage types — `half_t` (IEEE binary16), `bfloat16_t`,
//   `fp8_e4m3_t` and `fp8_e5m2_t` (OCP FP8) — each a struct holding its bits, with exact
//   conversions to float and round-to-nearest-even conversions from float that are bit-identical
//   to NVIDIA's:
//     f16   like `__float2half_rn`   (overflow to +-inf, NaN to 0x7fff)
//     bf16  like `__float2bfloat16_rn` (overflow to +-inf, NaN to 0x7fff)
//     fp8   like `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, kind)` (saturate to +-max finite, also
//           for +-inf; NaN to 0x7f)
//   Device: PTX `cvt.rn.f16.f32` / `cvt.rn.bf16.f32` (sm_80+) and `cvt.f32.f16`; the emulator
//   uses the software paths below, which are bit-identical to NVIDIA's host implementations
//   (device/tests/numerics.rs checks that). FP8 uses one software path everywhere (the
//   `cvt.*.e4m3x2` instructions need sm_89; sm_80 has none).
// - `TypeTraits<T>` / `dtype_of<T>` / `acc_t<T>` / `type_of_t<D>`: the compile-time mapping between
//   C++ element types and codes, element size, name and accumulation type (float for f16, bf16,
//   fp8 and f32; double for f64; the type itself for integers).
// - Bit casts (`float_as_bits` ...) that work under nvcc, NVRTC and the emulator.
//
// No standard headers: NVRTC has none. Integer element types are the built-in ones (`signed char`,
// `unsigned char`, `int`, `unsigned int`, `long long`, `unsigned long long`; `long` and
// `unsigned long` map to the 64-bit codes on LP64 targets, so `int64_t`/`uint64_t` work too).
#pragma once

#include <symcomm/config.cuh>

namespace symcomm {

// ---- Codes -----------------------------------------------------------------------------------

/// Element type of a collective (the SYMCOMM_DTYPE_* codes of abi.h).
enum class DataType : uint32_t {
    F32 = SYMCOMM_DTYPE_F32,
    F64 = SYMCOMM_DTYPE_F64,
    F16 = SYMCOMM_DTYPE_F16,
    BF16 = SYMCOMM_DTYPE_BF16,
    Fp8E4M3 = SYMCOMM_DTYPE_FP8_E4M3,
    Fp8E5M2 = SYMCOMM_DTYPE_FP8_E5M2,
    I8 = SYMCOMM_DTYPE_I8,
    U8 = SYMCOMM_DTYPE_U8,
    I32 = SYMCOMM_DTYPE_I32,
    U32 = SYMCOMM_DTYPE_U32,
    I64 = SYMCOMM_DTYPE_I64,
    U64 = SYMCOMM_DTYPE_U64,
};

/// True iff `code` is one of the SYMCOMM_DTYPE_* codes. Any thread may call it.
SYMCOMM_DEVICE constexpr bool dtype_valid(uint32_t code) { return code < SYMCOMM_DTYPE_COUNT; }

/// Size in bytes of one element of `dt`; 0 for a code outside the enum. Any thread may call it.
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

/// Short name of `dt` ("f32", "bf16", "fp8_e4m3", "u64", ...); "invalid" for a code outside the
/// enum. Any thread may call it (the string is a literal, valid for the whole program).
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

// ---- Bit casts -------------------------------------------------------------------------------

/// The IEEE binary32 encoding of `f` (every bit, NaN payloads included). Any thread may call it.
SYMCOMM_DEVICE uint32_t float_as_bits(float f) {
#if defined(SYMCOMM_EMU)
    uint32_t u;
    __builtin_memcpy(&u, &f, sizeof u);
    return u;
#else
    return __float_as_uint(f);
#endif
}

/// The float whose IEEE binary32 encoding is `u`. Any thread may call it.
SYMCOMM_DEVICE float bits_as_float(uint32_t u) {
#if defined(SYMCOMM_EMU)
    float f;
    __builtin_memcpy(&f, &u, sizeof f);
    return f;
#else
    return __uint_as_float(u);
#endif
}

/// The IEEE binary64 encoding of `d`. Any thread may call it.
SYMCOMM_DEVICE uint64_t double_as_bits(double d) {
#if defined(SYMCOMM_EMU)
    uint64_t u;
    __builtin_memcpy(&u, &d, sizeof u);
    return u;
#else
    return static_cast<uint64_t>(__double_as_longlong(d));
#endif
}

/// The double whose IEEE binary64 encoding is `u`. Any thread may call it.
SYMCOMM_DEVICE double bits_as_double(uint64_t u) {
#if defined(SYMCOMM_EMU)
    double d;
    __builtin_memcpy(&d, &u, sizeof d);
    return d;
#else
    return __longlong_as_double(static_cast<long long>(u));
#endif
}

// ---- Storage types ---------------------------------------------------------------------------
// Plain aggregates (trivially copyable, standard layout, size = alignment = the encoding's size):
// `half_t{0x3c00}` is 1.0. They have no arithmetic; reduce in the accumulation type (acc_t<T>).

/// IEEE 754 binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; max 65504.
struct half_t {
    unsigned short bits;
};

/// bfloat16: the upper half of a binary32 (1 sign, 8 exponent, 7 mantissa bits).
struct bfloat16_t {
    unsigned short bits;
};

/// OCP FP8 E4M3 ("fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, NaN is
/// S.1111.111 (0x7f / 0xff), max finite 448 (0x7e), min subnormal 2^-9.
struct fp8_e4m3_t {
    unsigned char bits;
};

/// OCP FP8 E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-like (infinities 0x7c/0xfc,
/// NaNs above them); max finite 57344 (0x7b), min subnormal 2^-16. It is the top byte of a binary16.
struct fp8_e5m2_t {
    unsigned char bits;
};

static_assert(sizeof(half_t) == 2 && alignof(half_t) == 2, "half_t layout");
static_assert(sizeof(bfloat16_t) == 2 && alignof(bfloat16_t) == 2, "bfloat16_t layout");
static_assert(sizeof(fp8_e4m3_t) == 1 && sizeof(fp8_e5m2_t) == 1, "fp8 layout");

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

// ---- Conversions -----------------------------------------------------------------------------

/// binary16 -> float, exact. NaN: the emulator returns 0x7fffffff (NVIDIA's host `__half2float`),
/// the device `cvt.f32.f16` (NVIDIA's device `__half2float`). Any thread may call it.
SYMCOMM_DEVICE float to_float(half_t h) {
#if defined(SYMCOMM_EMU)
    return detail::half_bits_to_float_sw(h.bits);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
    return f;
#endif
}

/// bfloat16 -> float, exact (the bits shifted up; NaN payloads kept). Any thread may call it.
SYMCOMM_DEVICE float to_float(bfloat16_t b) { return bits_as_float(uint32_t(b.bits) << 16); }

/// FP8 E4M3 -> float, exact; NaN (0x7f, 0xff) -> 0x7fffffff, as NVIDIA's host conversion. Same
/// code on device and emulator. Any thread may call it.
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

/// FP8 E5M2 -> float, exact (it is the top byte of a binary16); NaN -> 0x7fffffff, as NVIDIA's
/// host conversion. Same code on device and emulator. Any thread may call it.
SYMCOMM_DEVICE float to_float(fp8_e5m2_t v) { return detail::half_bits_to_float_sw(uint32_t(v.bits) << 8); }

/// float -> binary16, round to nearest even, overflow to +-inf, NaN -> 0x7fff; bit-identical to
/// `__float2half_rn`. Any thread may call it.
SYMCOMM_DEVICE half_t float_to_half(float f) {
#if defined(SYMCOMM_EMU)
    return half_t{detail::float_to_half_bits_sw(f)};
#else
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return half_t{h};
#endif
}

/// float -> bfloat16, round to nearest even, overflow to +-inf, NaN -> 0x7fff; bit-identical to
/// `__float2bfloat16_rn`. Any thread may call it.
SYMCOMM_DEVICE bfloat16_t float_to_bfloat16(float f) {
#if defined(SYMCOMM_EMU) || !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 800
    return bfloat16_t{detail::float_to_bfloat16_bits_sw(f)};
#else
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return bfloat16_t{h};
#endif
}

/// float -> FP8 E4M3, round to nearest even, saturating: |x| > 448 (and +-inf) -> +-448, NaN ->
/// 0x7f; bit-identical to `__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3)`. Software on every
/// architecture (no FTZ dependence). Any thread may call it.
SYMCOMM_DEVICE fp8_e4m3_t float_to_fp8_e4m3(float f) { return fp8_e4m3_t{detail::float_to_fp8_bits<3, 7, 0x7eu>(f)}; }

/// float -> FP8 E5M2, round to nearest even, saturating: |x| > 57344 (and +-inf) -> +-57344, NaN
/// -> 0x7f; bit-identical to `__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2)`. Software on
/// every architecture. Any thread may call it.
SYMCOMM_DEVICE fp8_e5m2_t float_to_fp8_e5m2(float f) { return fp8_e5m2_t{detail::float_to_fp8_bits<2, 15, 0x7bu>(f)}; }

// ---- Traits ----------------------------------------------------------------------------------

/// Compile-time description of an element type; defined for the types below only, so using an
/// unsupported type is a compile error. Members:
///   `Acc`                   accumulation type of reductions
///   `dtype`                 the DataType code
///   `size`                  bytes per element
///   `name()`                short name, as dtype_name(dtype)
///   `to_acc(T)`, `from_acc(Acc)`   conversions (from_acc rounds once, as the from-float conversions
///                           above; identity for f32, f64 and integers)
///   `is_float`              floating-point element type
template <typename T>
struct TypeTraits;

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

/// The DataType code of element type `T` (compile error for an unsupported type).
template <typename T>
constexpr DataType dtype_of = TypeTraits<T>::dtype;

/// The accumulation type of element type `T`.
template <typename T>
using acc_t = typename TypeTraits<T>::Acc;

/// The canonical C++ element type of a code (`dispatch` instantiates these): F32 float, F64
/// double, F16 half_t, BF16 bfloat16_t, Fp8E4M3 fp8_e4m3_t, Fp8E5M2 fp8_e5m2_t, I8 signed char, U8
/// unsigned char, I32 int, U32 unsigned int, I64 long long, U64 unsigned long long.
template <DataType D>
struct TypeOf;
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

/// `TypeOf<D>::type`.
template <DataType D>
using type_of_t = typename TypeOf<D>::type;

}  // namespace symcomm

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
//   uses the software paths of impl/types.cuh, which are bit-identical to NVIDIA's host implementations
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
SYMCOMM_DEVICE constexpr bool dtype_valid(uint32_t code);

/// Size in bytes of one element of `dt`; 0 for a code outside the enum. Any thread may call it.
SYMCOMM_DEVICE constexpr uint32_t dtype_size(DataType dt);

/// Short name of `dt` ("f32", "bf16", "fp8_e4m3", "u64", ...); "invalid" for a code outside the
/// enum. Any thread may call it (the string is a literal, valid for the whole program).
SYMCOMM_DEVICE constexpr const char* dtype_name(DataType dt);

// ---- Bit casts -------------------------------------------------------------------------------

/// The IEEE binary32 encoding of `f` (every bit, NaN payloads included). Any thread may call it.
SYMCOMM_DEVICE uint32_t float_as_bits(float f);

/// The float whose IEEE binary32 encoding is `u`. Any thread may call it.
SYMCOMM_DEVICE float bits_as_float(uint32_t u);

/// The IEEE binary64 encoding of `d`. Any thread may call it.
SYMCOMM_DEVICE uint64_t double_as_bits(double d);

/// The double whose IEEE binary64 encoding is `u`. Any thread may call it.
SYMCOMM_DEVICE double bits_as_double(uint64_t u);

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

// ---- Conversions -----------------------------------------------------------------------------

/// binary16 -> float, exact. NaN: the emulator returns 0x7fffffff (NVIDIA's host `__half2float`),
/// the device `cvt.f32.f16` (NVIDIA's device `__half2float`). Any thread may call it.
SYMCOMM_DEVICE float to_float(half_t h);

/// bfloat16 -> float, exact (the bits shifted up; NaN payloads kept). Any thread may call it.
SYMCOMM_DEVICE float to_float(bfloat16_t b);

/// FP8 E4M3 -> float, exact; NaN (0x7f, 0xff) -> 0x7fffffff, as NVIDIA's host conversion. Same
/// code on device and emulator. Any thread may call it.
SYMCOMM_DEVICE float to_float(fp8_e4m3_t v);

/// FP8 E5M2 -> float, exact (it is the top byte of a binary16); NaN -> 0x7fffffff, as NVIDIA's
/// host conversion. Same code on device and emulator. Any thread may call it.
SYMCOMM_DEVICE float to_float(fp8_e5m2_t v);

/// float -> binary16, round to nearest even, overflow to +-inf, NaN -> 0x7fff; bit-identical to
/// `__float2half_rn`. Any thread may call it.
SYMCOMM_DEVICE half_t float_to_half(float f);

/// float -> bfloat16, round to nearest even, overflow to +-inf, NaN -> 0x7fff; bit-identical to
/// `__float2bfloat16_rn`. Any thread may call it.
SYMCOMM_DEVICE bfloat16_t float_to_bfloat16(float f);

/// float -> FP8 E4M3, round to nearest even, saturating: |x| > 448 (and +-inf) -> +-448, NaN ->
/// 0x7f; bit-identical to `__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3)`. Software on every
/// architecture (no FTZ dependence). Any thread may call it.
SYMCOMM_DEVICE fp8_e4m3_t float_to_fp8_e4m3(float f);

/// float -> FP8 E5M2, round to nearest even, saturating: |x| > 57344 (and +-inf) -> +-57344, NaN
/// -> 0x7f; bit-identical to `__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2)`. Software on
/// every architecture. Any thread may call it.
SYMCOMM_DEVICE fp8_e5m2_t float_to_fp8_e5m2(float f);

// ---- Traits ----------------------------------------------------------------------------------

/// Compile-time description of an element type; defined (impl/types.cuh) for float, double, the
/// integer types of the file comment and the storage types above only, so using an unsupported
/// type is a compile error. Members:
///   `Acc`                   accumulation type of reductions
///   `dtype`                 the DataType code
///   `size`                  bytes per element
///   `name()`                short name, as dtype_name(dtype)
///   `to_acc(T)`, `from_acc(Acc)`   conversions (from_acc rounds once, as the from-float conversions
///                           above; identity for f32, f64 and integers)
///   `is_float`              floating-point element type
template <typename T>
struct TypeTraits;

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

/// `TypeOf<D>::type`.
template <DataType D>
using type_of_t = typename TypeOf<D>::type;

}  // namespace symcomm

#include <symcomm/impl/types.cuh>

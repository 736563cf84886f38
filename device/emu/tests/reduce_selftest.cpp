// Self-test of the numeric layer (include/symcomm/types.cuh, reduce.cuh) in emulator mode, run on
// the host thread directly (in the emulator the device functions are plain inline functions, so
// no kernel launch is needed). Built and run by scripts/emu-tsan with the others.
//
// Checks, with exact expectations:
//   - traits: codes, sizes, names, dtype_of / type_of_t, validity of codes;
//   - Accumulator for every dtype x op: floating point on inputs whose results are exactly
//     representable in every format (Avg with an inexact quotient within one rounding of T), NaN
//     and signed-zero behaviour of Min/Max, overflow (f16/bf16 to inf, fp8 saturating), one
//     rounding per element; integers wrapping (Sum, Prod, Avg of the wrapped sum, truncating
//     toward zero) against a 64-bit model and hand-computed cases;
//   - Pack16: load/store, alignment, reduce_packs and reduce_packs_from with 1..8 peers against
//     per-element Accumulators, for every dtype x op through the run-time dispatch;
//   - dispatch: every (dtype, op) pair reaches F<type_of_t<dt>, op>, invalid codes call nothing.
// Prints each failure and a summary; exits 1 on any failure.
#include <symcomm/reduce.cuh>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <initializer_list>
#include <type_traits>

namespace {

using namespace symcomm;

int failures = 0;
int checks = 0;

#define CHECK(cond, ...)                                      \
    do {                                                      \
        ++checks;                                             \
        if (!(cond)) {                                        \
            ++failures;                                       \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            printf(__VA_ARGS__);                              \
            printf("\n");                                     \
        }                                                     \
    } while (0)

// ---- Helpers over element types ----------------------------------------------------------------

/// The encoding of `v` as an integer (floats: their bits; integers: their value, zero-extended).
template <typename T>
uint64_t bits_of(T v) {
    if constexpr (sizeof(T) == 1) {
        unsigned char b;
        memcpy(&b, &v, 1);
        return b;
    } else if constexpr (sizeof(T) == 2) {
        unsigned short b;
        memcpy(&b, &v, 2);
        return b;
    } else if constexpr (sizeof(T) == 4) {
        uint32_t b;
        memcpy(&b, &v, 4);
        return b;
    } else {
        uint64_t b;
        memcpy(&b, &v, 8);
        return b;
    }
}

/// `x` converted to element type T (floating-point types: rounded by types.cuh's conversions).
template <typename T>
T make(double x) {
    if constexpr (TypeTraits<T>::is_float) {
        return TypeTraits<T>::from_acc(static_cast<acc_t<T>>(x));
    } else {
        return static_cast<T>(static_cast<long long>(x));
    }
}

/// `v` as a double (exact for every supported type but 64-bit integers beyond 2^53).
template <typename T>
double value(T v) {
    if constexpr (TypeTraits<T>::is_float) {
        return static_cast<double>(TypeTraits<T>::to_acc(v));
    } else {
        return static_cast<double>(v);
    }
}

/// One unit in the last place of T at `x` (floating point, |x| in a normal binade).
template <typename T>
double ulp_at(double x) {
    int mant = 0;
    switch (dtype_of<T>) {
        case DataType::F32: mant = 23; break;
        case DataType::F64: mant = 52; break;
        case DataType::F16: mant = 10; break;
        case DataType::BF16: mant = 7; break;
        case DataType::Fp8E4M3: mant = 3; break;
        case DataType::Fp8E5M2: mant = 2; break;
        default: mant = 0; break;
    }
    int e = 0;
    frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
    return ldexp(1.0, e - 1 - mant);
}

template <typename T, RedOp Op>
T reduce_list(std::initializer_list<T> xs, uint32_t nranks) {
    Accumulator<T, Op> acc;
    bool first = true;
    for (T x : xs) {
        if (first) {
            acc.first(x);
            first = false;
        } else {
            acc.add(x);
        }
    }
    return acc.result(nranks);
}

template <typename T, RedOp Op>
T reduce_vals(std::initializer_list<double> xs, uint32_t nranks) {
    Accumulator<T, Op> acc;
    bool first = true;
    for (double x : xs) {
        if (first) {
            acc.first(make<T>(x));
            first = false;
        } else {
            acc.add(make<T>(x));
        }
    }
    return acc.result(nranks);
}

// ---- Traits --------------------------------------------------------------------------------------

template <DataType D>
void test_traits_of(const char* name, uint32_t size) {
    using T = type_of_t<D>;
    CHECK(dtype_of<T> == D, "%s: dtype_of(type_of_t) round trip", name);
    CHECK(sizeof(T) == size && TypeTraits<T>::size == size && dtype_size(D) == size, "%s: size", name);
    CHECK(strcmp(dtype_name(D), name) == 0 && strcmp(TypeTraits<T>::name(), name) == 0, "%s: name", name);
    CHECK(sizeof(Pack16<T>) == 16 && alignof(Pack16<T>) == 16 && Pack16<T>::N * sizeof(T) == 16, "%s: Pack16",
          name);
}

void test_traits() {
    test_traits_of<DataType::F32>("f32", 4);
    test_traits_of<DataType::F64>("f64", 8);
    test_traits_of<DataType::F16>("f16", 2);
    test_traits_of<DataType::BF16>("bf16", 2);
    test_traits_of<DataType::Fp8E4M3>("fp8_e4m3", 1);
    test_traits_of<DataType::Fp8E5M2>("fp8_e5m2", 1);
    test_traits_of<DataType::I8>("i8", 1);
    test_traits_of<DataType::U8>("u8", 1);
    test_traits_of<DataType::I32>("i32", 4);
    test_traits_of<DataType::U32>("u32", 4);
    test_traits_of<DataType::I64>("i64", 8);
    test_traits_of<DataType::U64>("u64", 8);
    // The ABI codes are the documented numbers; the fixed-width aliases map as expected.
    CHECK(uint32_t(DataType::F32) == 0 && uint32_t(DataType::U64) == 11, "dtype codes");
    CHECK(uint32_t(RedOp::Sum) == 0 && uint32_t(RedOp::Avg) == 4, "redop codes");
    CHECK(dtype_of<int64_t> == DataType::I64 && dtype_of<uint64_t> == DataType::U64, "int64_t/uint64_t");
    CHECK(dtype_of<int8_t> == DataType::I8 && dtype_of<uint8_t> == DataType::U8, "int8_t/uint8_t");
    CHECK(dtype_of<int32_t> == DataType::I32 && dtype_of<uint32_t> == DataType::U32, "int32_t/uint32_t");
    for (uint32_t c = 0; c < 20; ++c) {
        CHECK(dtype_valid(c) == (c < 12), "dtype_valid(%u)", c);
        CHECK(redop_valid(c) == (c < 5), "redop_valid(%u)", c);
    }
    CHECK(strcmp(dtype_name(DataType(99)), "invalid") == 0 && dtype_size(DataType(99)) == 0, "invalid dtype");
    CHECK(strcmp(redop_name(RedOp::Avg), "avg") == 0 && strcmp(redop_name(RedOp(7)), "invalid") == 0,
          "redop names");
    static_assert(std::is_same<acc_t<half_t>, float>::value && std::is_same<acc_t<bfloat16_t>, float>::value &&
                      std::is_same<acc_t<fp8_e4m3_t>, float>::value && std::is_same<acc_t<fp8_e5m2_t>, float>::value &&
                      std::is_same<acc_t<float>, float>::value && std::is_same<acc_t<double>, double>::value &&
                      std::is_same<acc_t<signed char>, signed char>::value &&
                      std::is_same<acc_t<unsigned long long>, unsigned long long>::value,
                  "accumulation types");
}

// ---- Accumulator: floating point -----------------------------------------------------------------

template <typename T>
void test_float_accumulator() {
    const char* n = dtype_name(dtype_of<T>);
    // {2, -0.5, 1.5, 4}: every result is exact in every format (fp8 e5m2 included).
    CHECK(bits_of(reduce_vals<T, RedOp::Sum>({2, -0.5, 1.5, 4}, 4)) == bits_of(make<T>(7)), "%s sum", n);
    CHECK(bits_of(reduce_vals<T, RedOp::Prod>({2, -0.5, 1.5, 4}, 4)) == bits_of(make<T>(-6)), "%s prod", n);
    CHECK(bits_of(reduce_vals<T, RedOp::Min>({2, -0.5, 1.5, 4}, 4)) == bits_of(make<T>(-0.5)), "%s min", n);
    CHECK(bits_of(reduce_vals<T, RedOp::Max>({2, -0.5, 1.5, 4}, 4)) == bits_of(make<T>(4)), "%s max", n);
    CHECK(bits_of(reduce_vals<T, RedOp::Avg>({2, -0.5, 1.5, 4}, 4)) == bits_of(make<T>(1.75)), "%s avg", n);
    // A single input is returned unchanged (Avg over one rank too).
    CHECK(bits_of(reduce_vals<T, RedOp::Sum>({-3}, 1)) == bits_of(make<T>(-3)), "%s sum of one", n);
    CHECK(bits_of(reduce_vals<T, RedOp::Avg>({-3}, 1)) == bits_of(make<T>(-3)), "%s avg of one", n);
    // Avg with an inexact quotient: 4/3 within one rounding of T.
    const double avg = value(reduce_vals<T, RedOp::Avg>({1, 1, 2}, 3));
    CHECK(fabs(avg - 4.0 / 3.0) <= ulp_at<T>(4.0 / 3.0), "%s avg 4/3 = %.17g", n, avg);
    // Min/Max: a NaN is ignored unless every input is NaN (fminf/fmaxf), wherever it appears.
    const double nan = NAN;
    CHECK(value(reduce_vals<T, RedOp::Min>({nan, 1, -2}, 3)) == -2, "%s min ignores a leading NaN", n);
    CHECK(value(reduce_vals<T, RedOp::Min>({1, nan, -2}, 3)) == -2, "%s min ignores a NaN", n);
    CHECK(value(reduce_vals<T, RedOp::Max>({1, -2, nan}, 3)) == 1, "%s max ignores a trailing NaN", n);
    CHECK(value(reduce_vals<T, RedOp::Max>({nan, 1, -2}, 3)) == 1, "%s max ignores a leading NaN", n);
    CHECK(isnan(value(reduce_vals<T, RedOp::Min>({nan, nan}, 2))), "%s min of NaNs is NaN", n);
    CHECK(isnan(value(reduce_vals<T, RedOp::Max>({nan}, 1))), "%s max of NaN is NaN", n);
    // Sum/Prod propagate NaN (IEEE).
    CHECK(isnan(value(reduce_vals<T, RedOp::Sum>({1, nan, 2}, 3))), "%s sum propagates NaN", n);
    CHECK(isnan(value(reduce_vals<T, RedOp::Prod>({1, 2, nan}, 3))), "%s prod propagates NaN", n);
    // -0 < +0 in Min/Max, independent of the order.
    const T pz = make<T>(0.0), nz = make<T>(-0.0);
    CHECK(bits_of(nz) != bits_of(pz), "%s has a signed zero", n);
    CHECK(bits_of(reduce_list<T, RedOp::Min>({pz, nz}, 2)) == bits_of(nz), "%s min(+0,-0) = -0", n);
    CHECK(bits_of(reduce_list<T, RedOp::Min>({nz, pz}, 2)) == bits_of(nz), "%s min(-0,+0) = -0", n);
    CHECK(bits_of(reduce_list<T, RedOp::Max>({pz, nz}, 2)) == bits_of(pz), "%s max(+0,-0) = +0", n);
    CHECK(bits_of(reduce_list<T, RedOp::Max>({nz, pz}, 2)) == bits_of(pz), "%s max(-0,+0) = +0", n);
    // Min/Max return an input bit-exactly.
    const T a = make<T>(-1.5), b = make<T>(0.375);
    CHECK(bits_of(reduce_list<T, RedOp::Min>({b, a, b}, 3)) == bits_of(a), "%s min exact", n);
    CHECK(bits_of(reduce_list<T, RedOp::Max>({a, b, a}, 3)) == bits_of(b), "%s max exact", n);
}

void test_float_specials() {
    // Overflow on the final rounding: f16/bf16 to +-inf, fp8 saturating to +-max finite.
    CHECK((reduce_vals<half_t, RedOp::Sum>)({65504, 65504}, 2).bits == 0x7c00, "f16 sum overflows to inf");
    CHECK((reduce_vals<half_t, RedOp::Sum>)({-65504, -65504}, 2).bits == 0xfc00, "f16 sum overflows to -inf");
    CHECK((reduce_vals<bfloat16_t, RedOp::Prod>)({3e38, 3e38}, 2).bits == 0x7f80, "bf16 prod overflows to inf");
    CHECK((reduce_vals<fp8_e4m3_t, RedOp::Sum>)({448, 448}, 2).bits == 0x7e, "e4m3 sum saturates to 448");
    CHECK((reduce_vals<fp8_e4m3_t, RedOp::Sum>)({-448, -448}, 2).bits == 0xfe, "e4m3 sum saturates to -448");
    CHECK((reduce_vals<fp8_e5m2_t, RedOp::Sum>)({57344, 57344}, 2).bits == 0x7b, "e5m2 sum saturates to 57344");
    // The accumulation type absorbs intermediate overflow: (448 + 448 - 448) / ... = 448.
    CHECK((reduce_vals<fp8_e4m3_t, RedOp::Sum>)({448, 448, -448}, 3).bits == 0x7e, "e4m3 accumulates in float");
    CHECK((reduce_vals<half_t, RedOp::Avg>)({65504, 65504}, 2).bits == 0x7bff, "f16 avg of max is max");
    // One rounding per element: e4m3 16 + 1 + 1 = 18 (rounding after each add would give 16).
    CHECK((reduce_vals<fp8_e4m3_t, RedOp::Sum>)({16, 1, 1}, 3).bits == float_to_fp8_e4m3(18).bits, "e4m3 rounds once");
    CHECK((reduce_vals<half_t, RedOp::Sum>)({2048, 1, 1}, 3).bits == float_to_half(2050).bits, "f16 rounds once");
    CHECK((reduce_vals<bfloat16_t, RedOp::Sum>)({256, 1, 1}, 3).bits == float_to_bfloat16(258).bits, "bf16 rounds once");
    // Infinities: inf + -inf is NaN; fp8 e4m3 NaN stays 0x7f; e4m3 has no inf (saturates).
    CHECK(isnan(to_float(reduce_vals<half_t, RedOp::Sum>({INFINITY, -INFINITY}, 2))), "f16 inf - inf = NaN");
    CHECK((reduce_vals<fp8_e4m3_t, RedOp::Sum>)({NAN, 1}, 2).bits == 0x7f, "e4m3 NaN");
    CHECK((reduce_vals<fp8_e5m2_t, RedOp::Sum>)({INFINITY, 1}, 2).bits == 0x7b, "e5m2 inf saturates");
    CHECK((reduce_vals<float, RedOp::Max>)({-INFINITY, NAN}, 2) == -INFINITY, "f32 max(-inf, NaN)");
    // f32 / f64 arithmetic is IEEE in the type itself (no wider accumulation).
    CHECK((reduce_vals<float, RedOp::Sum>)({16777216.0, 1.0}, 2) == 16777216.0f, "f32 sums in f32");
    CHECK((reduce_vals<double, RedOp::Sum>)({9007199254740992.0, 1.0}, 2) == 9007199254740992.0, "f64 sums in f64");
    CHECK((reduce_vals<double, RedOp::Avg>)({1, 2}, 2) == 1.5 && (reduce_vals<float, RedOp::Avg>)({1, 2}, 2) == 1.5f,
          "avg exact");
}

// ---- Accumulator: integers -----------------------------------------------------------------------

/// Model: the reduction in 64-bit unsigned arithmetic, truncated to T (two's complement).
template <typename T, RedOp Op>
T model(const T* xs, uint32_t k, uint32_t nranks) {
    constexpr bool is_signed = T(-1) < T(0);
    uint64_t acc = uint64_t(xs[0]);
    T best = xs[0];
    for (uint32_t j = 1; j < k; ++j) {
        if (Op == RedOp::Sum || Op == RedOp::Avg) acc += uint64_t(xs[j]);
        if (Op == RedOp::Prod) acc *= uint64_t(xs[j]);
        if (Op == RedOp::Min && xs[j] < best) best = xs[j];
        if (Op == RedOp::Max && xs[j] > best) best = xs[j];
    }
    if (Op == RedOp::Min || Op == RedOp::Max) return best;
    const T wrapped = T(acc);
    if (Op != RedOp::Avg) return wrapped;
    if (is_signed) return T(static_cast<long long>(wrapped) / static_cast<long long>(nranks));
    return T(static_cast<unsigned long long>(wrapped) / nranks);
}

template <typename T, RedOp Op>
void check_int_against_model(const T* xs, uint32_t k) {
    Accumulator<T, Op> acc;
    acc.first(xs[0]);
    for (uint32_t j = 1; j < k; ++j) acc.add(xs[j]);
    const T got = acc.result(k), want = model<T, Op>(xs, k, k);
    CHECK(got == want, "%s %s over %u inputs: got %lld, want %lld", dtype_name(dtype_of<T>),
          redop_name(Op), k, (long long)got, (long long)want);
}

template <typename T>
void test_int_accumulator() {
    // Extremes and ordinary values, so that sums and products wrap.
    const T mx = T(~0ull >> (T(-1) < T(0) ? 65 - 8 * sizeof(T) : 64 - 8 * sizeof(T)));
    const T mn = T(-1) < T(0) ? T(-mx - 1) : T(0);
    const T xs[] = {mx, T(3), mn, T(-1), T(100), T(mx - 7), T(2), T(mn + 5)};
    for (uint32_t k = 1; k <= 8; ++k) {
        check_int_against_model<T, RedOp::Sum>(xs, k);
        check_int_against_model<T, RedOp::Prod>(xs, k);
        check_int_against_model<T, RedOp::Min>(xs, k);
        check_int_against_model<T, RedOp::Max>(xs, k);
        check_int_against_model<T, RedOp::Avg>(xs, k);
    }
    const char* n = dtype_name(dtype_of<T>);
    CHECK((reduce_list<T, RedOp::Sum>)({mx, T(1)}, 2) == mn, "%s max + 1 wraps to min", n);
    CHECK((reduce_list<T, RedOp::Avg>)({T(7), T(0)}, 2) == T(3), "%s avg 7/2 = 3", n);
    CHECK((reduce_list<T, RedOp::Min>)({T(5), mx, T(2)}, 3) == T(2), "%s min", n);
    CHECK((reduce_list<T, RedOp::Max>)({T(5), mx, T(2)}, 3) == mx, "%s max", n);
}

void test_int_cases() {
    // Hand-computed, independent of the model.
    CHECK((reduce_list<signed char, RedOp::Sum>)({100, 100, -7}, 3) == -63, "i8 100+100-7 wraps to -63");
    CHECK((reduce_list<signed char, RedOp::Prod>)({100, 3}, 2) == 44, "i8 100*3 wraps to 44");
    CHECK((reduce_list<signed char, RedOp::Avg>)({100, 100}, 2) == -28, "i8 avg of the wrapped sum (-56/2)");
    CHECK((reduce_list<signed char, RedOp::Avg>)({-7, 0}, 2) == -3, "i8 avg truncates toward zero");
    CHECK((reduce_list<signed char, RedOp::Prod>)({-128, -1}, 2) == -128, "i8 -128*-1 wraps");
    CHECK((reduce_list<unsigned char, RedOp::Sum>)({200, 100}, 2) == 44, "u8 200+100 wraps to 44");
    CHECK((reduce_list<unsigned char, RedOp::Prod>)({16, 17}, 2) == 16, "u8 16*17 wraps to 16");
    CHECK((reduce_list<unsigned char, RedOp::Avg>)({200, 100}, 2) == 22, "u8 avg of the wrapped sum (44/2)");
    CHECK((reduce_list<int, RedOp::Sum>)({2147483647, 1}, 2) == -2147483647 - 1, "i32 INT_MAX+1 wraps");
    CHECK((reduce_list<int, RedOp::Prod>)({65536, 65536}, 2) == 0, "i32 2^16*2^16 wraps to 0");
    CHECK((reduce_list<int, RedOp::Prod>)({-2147483647 - 1, -1}, 2) == -2147483647 - 1, "i32 INT_MIN*-1 wraps");
    CHECK((reduce_list<int, RedOp::Avg>)({-7, -7, -1}, 3) == -5, "i32 avg -15/3");
    CHECK((reduce_list<int, RedOp::Avg>)({-7, -7, 0}, 3) == -4, "i32 avg -14/3 truncates to -4");
    CHECK((reduce_list<unsigned, RedOp::Sum>)({0xffffffffu, 2u}, 2) == 1u, "u32 wraps");
    CHECK((reduce_list<unsigned, RedOp::Avg>)({0xffffffffu, 0xffffffffu}, 2) == 0x7fffffffu, "u32 avg of wrapped");
    CHECK((reduce_list<long long, RedOp::Prod>)({1ll << 62, 4}, 2) == 0, "i64 2^62*4 wraps to 0");
    CHECK((reduce_list<long long, RedOp::Sum>)({0x7fffffffffffffffll, 1}, 2) == (-0x7fffffffffffffffll - 1),
          "i64 wraps");
    CHECK((reduce_list<unsigned long long, RedOp::Prod>)({0xffffffffffffffffull, 0xffffffffffffffffull}, 2) == 1,
          "u64 (-1)*(-1) = 1");
    CHECK((reduce_list<unsigned long long, RedOp::Avg>)({10, 11, 12}, 3) == 11, "u64 avg");
    // 64-bit aliases of the platform (int64_t is `long` on LP64) work as well.
    CHECK((reduce_list<int64_t, RedOp::Sum>)({INT64_MAX, 1}, 2) == INT64_MIN, "int64_t wraps");
    CHECK((reduce_list<uint64_t, RedOp::Min>)({5, 3, 9}, 3) == 3, "uint64_t min");
}

// ---- Packs ---------------------------------------------------------------------------------------

/// Element `i` of peer `j`'s pack: small values, exactly representable in every type, distinct per
/// peer and element so that any mix-up shows.
template <typename T>
T pack_value(uint32_t j, uint32_t i) {
    const int v = int((i * 7 + j * 3 + 1) % 9) - 4;  // -4 .. 4
    if constexpr (TypeTraits<T>::is_float) {
        return make<T>(v * 0.5);
    } else {
        return static_cast<T>(v * 37 + int(j));
    }
}

/// Reduces `k` peers' packs through reduce_packs, reduce_packs_from and PackAccumulator, and checks
/// each element against a scalar Accumulator over the same values.
template <typename T, RedOp Op>
struct PackTest {
    static void run(int& fails) {
        constexpr uint32_t N = Pack16<T>::N;
        const int before = failures;
        for (uint32_t k : {1u, 2u, 3u, 5u, 8u}) {
            // Peers' buffers: 3 packs each (one aligned pack in the middle is reduced), unaligned
            // neighbours untouched.
            alignas(16) T mem[8][3 * N];
            memset(mem, 0xa5, sizeof mem);
            const T* src[8];
            for (uint32_t j = 0; j < k; ++j) {
                for (uint32_t i = 0; i < N; ++i) mem[j][N + i] = pack_value<T>(j, i);
                src[j] = &mem[j][N];
                CHECK(pack_aligned(src[j]) && !pack_aligned(reinterpret_cast<const char*>(src[j]) + sizeof(T)),
                      "pack_aligned");
            }
            Pack16<T> packs[8] = {};
            for (uint32_t j = 0; j < k; ++j) packs[j] = load_pack(src[j]);
            for (uint32_t j = 0; j < k; ++j)
                for (uint32_t i = 0; i < N; ++i)
                    CHECK(bits_of(packs[j].e[i]) == bits_of(pack_value<T>(j, i)), "load_pack element %u", i);

            const Pack16<T> r1 = reduce_packs<T, Op>(packs, k, k);
            const Pack16<T> r2 = reduce_packs_from<T, Op>(k, k, [&](uint32_t j) { return load_pack(src[j]); });
            PackAccumulator<T, Op> pa;
            pa.first(packs[0]);
            for (uint32_t j = 1; j < k; ++j) pa.add(packs[j]);
            const Pack16<T> r3 = pa.result(k);

            alignas(16) T out[3 * N];
            memset(out, 0x5a, sizeof out);
            store_pack(&out[N], r1);
            for (uint32_t i = 0; i < N; ++i) {
                Accumulator<T, Op> acc;
                acc.first(pack_value<T>(0, i));
                for (uint32_t j = 1; j < k; ++j) acc.add(pack_value<T>(j, i));
                const uint64_t want = bits_of(acc.result(k));
                CHECK(bits_of(r1.e[i]) == want && bits_of(r2.e[i]) == want && bits_of(r3.e[i]) == want &&
                          bits_of(out[N + i]) == want,
                      "%s %s, %u peers, element %u: want 0x%llx, got 0x%llx / 0x%llx / 0x%llx / stored 0x%llx",
                      dtype_name(dtype_of<T>), redop_name(Op), k, i, (unsigned long long)want,
                      (unsigned long long)bits_of(r1.e[i]), (unsigned long long)bits_of(r2.e[i]),
                      (unsigned long long)bits_of(r3.e[i]), (unsigned long long)bits_of(out[N + i]));
            }
            // store_pack wrote exactly 16 bytes.
            const unsigned char* ob = reinterpret_cast<const unsigned char*>(out);
            bool guard = true;
            for (size_t b = 0; b < sizeof out; ++b)
                if (b < N * sizeof(T) || b >= 2 * N * sizeof(T)) guard = guard && ob[b] == 0x5a;
            CHECK(guard, "store_pack stays inside its 16 bytes");
        }
        fails += failures - before;
    }
};

// ---- Dispatch ------------------------------------------------------------------------------------

template <typename T, RedOp Op>
struct Probe {
    static void run(uint32_t& dtype, uint32_t& op, uint32_t& size, uint32_t& calls) {
        dtype = uint32_t(dtype_of<T>);
        op = uint32_t(Op);
        size = uint32_t(sizeof(T));
        ++calls;
    }
};

void test_dispatch() {
    uint32_t calls = 0;
    for (uint32_t d = 0; d < 14; ++d) {
        for (uint32_t o = 0; o < 7; ++o) {
            uint32_t dt = 99, op = 99, size = 0;
            const uint32_t before = calls;
            const bool ok = dispatch<Probe>(DataType(d), RedOp(o), dt, op, size, calls);
            const bool valid = d < 12 && o < 5;
            CHECK(ok == valid, "dispatch(%u, %u) returned %d", d, o, ok);
            if (valid) {
                CHECK(dt == d && op == o && size == dtype_size(DataType(d)) && calls == before + 1,
                      "dispatch(%u, %u) reached F<%u, %u> (size %u)", d, o, dt, op, size);
            } else {
                CHECK(calls == before, "dispatch(%u, %u) called F for an invalid code", d, o);
            }
        }
    }
    CHECK(calls == 60, "60 instantiations reached, got %u", calls);

    // The pack reductions for every dtype x op, through the dispatch.
    int pack_fails = 0;
    for (uint32_t d = 0; d < 12; ++d)
        for (uint32_t o = 0; o < 5; ++o) CHECK(dispatch<PackTest>(DataType(d), RedOp(o), pack_fails), "pack dispatch");
    CHECK(pack_fails == 0, "pack tests: %d failures", pack_fails);
}

}  // namespace

int main() {
    test_traits();
    test_float_accumulator<float>();
    test_float_accumulator<double>();
    test_float_accumulator<half_t>();
    test_float_accumulator<bfloat16_t>();
    test_float_accumulator<fp8_e4m3_t>();
    test_float_accumulator<fp8_e5m2_t>();
    test_float_specials();
    test_int_accumulator<signed char>();
    test_int_accumulator<unsigned char>();
    test_int_accumulator<int>();
    test_int_accumulator<unsigned int>();
    test_int_accumulator<long long>();
    test_int_accumulator<unsigned long long>();
    test_int_accumulator<long>();
    test_int_accumulator<unsigned long>();
    test_int_cases();
    test_dispatch();
    printf("reduce_selftest: %d checks, %d failures\n", checks, failures);
    return failures == 0 ? 0 : 1;
}

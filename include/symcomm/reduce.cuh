// symcomm device library: reduction operators, accumulators, 16-byte packs, run-time dispatch.
//
// - `RedOp`: the run-time operator code (SYMCOMM_REDOP_* of abi.h, shared with Rust).
// - `Accumulator<T, Op>`: reduces values of element type T one at a time in the accumulation type
//   `acc_t<T>` (float for f16/bf16/fp8/f32, double for f64, T for integers) and rounds once at the
//   end. Semantics:
//     Sum, Prod  floating point: IEEE operations in the accumulation type, in call order (first,
//                then each add). Integers wrap modulo 2^bits (computed in unsigned arithmetic, no
//                undefined behaviour; converting back to a signed type is two's complement).
//     Min, Max   integers: the usual order. Floating point: the semantics of C's fminf/fmaxf
//                (IEEE 754-2008 minNum/maxNum), which is also what NCCL does for its float
//                types: a NaN input is ignored unless every input is NaN (then the result is a
//                NaN, payload unspecified); additionally -0 orders before +0, so the result
//                never depends on the order of the inputs.
//     Avg        Sum, then divided by `nranks` once: floating point divides in the accumulation
//                type (then rounds to T); integers use integer division of the wrapped sum,
//                truncating toward zero (as NCCL's ncclAvg on integers).
//   Floating-point sums and products depend on the order of the inputs; a collective that wants
//   the same bits on every rank must feed them in the same order (e.g. rank order) everywhere.
//   Results are rounded to T as the from-float conversions of types.cuh do: f16/bf16 overflow to
//   +-inf, FP8 saturates to +-max finite. Compiled with `-use_fast_math` (`--prec-div=false`,
//   `--ftz=true`), Avg's division is approximate and subnormal sums flush to zero; the
//   conversions themselves use integer operations and are unaffected.
// - `Pack16<T>`: 16 bytes viewed as `Pack16<T>::N` elements; `load_pack` / `store_pack` move one
//   with a single 16-byte access (a vector load / store on the device); `PackAccumulator` and
//   `reduce_packs` reduce K packs element-wise with one rounding per element.
// - `dispatch<F>(dtype, op, args...)`: calls `F<T, Op>::run(args...)` for run-time codes;
//   `SYMCOMM_FOR_EACH_DTYPE_OP(X)`: an X-macro over all 60 pairs (one kernel per pair).
#pragma once

#include <symcomm/types.cuh>

#if defined(SYMCOMM_EMU)
#define SYMCOMM_REDUCE_UNROLL_
#else
#define SYMCOMM_REDUCE_UNROLL_ _Pragma("unroll")
#endif

namespace symcomm {

/// Reduction operator of a collective (the SYMCOMM_REDOP_* codes of abi.h).
enum class RedOp : uint32_t {
    Sum = SYMCOMM_REDOP_SUM,
    Prod = SYMCOMM_REDOP_PROD,
    Min = SYMCOMM_REDOP_MIN,
    Max = SYMCOMM_REDOP_MAX,
    Avg = SYMCOMM_REDOP_AVG,
};

/// True iff `code` is one of the SYMCOMM_REDOP_* codes. Any thread may call it.
SYMCOMM_DEVICE constexpr bool redop_valid(uint32_t code) { return code < SYMCOMM_REDOP_COUNT; }

/// Short name of `op` ("sum", "prod", "min", "max", "avg"); "invalid" for a code outside the enum.
/// Any thread may call it.
SYMCOMM_DEVICE constexpr const char* redop_name(RedOp op) {
    switch (op) {
        case RedOp::Sum: return "sum";
        case RedOp::Prod: return "prod";
        case RedOp::Min: return "min";
        case RedOp::Max: return "max";
        case RedOp::Avg: return "avg";
    }
    return "invalid";
}

namespace detail {

template <bool C, typename A, typename B>
struct Conditional {
    using type = A;
};
template <typename A, typename B>
struct Conditional<false, A, B> {
    using type = B;
};

/// The unsigned type integer arithmetic of `T` wraps in (at least as wide as T, never promoted
/// to int for the multiplications that matter: 8-bit products fit in it exactly).
template <typename T>
using WrapUnsigned = typename Conditional<(sizeof(T) <= 4), unsigned int, unsigned long long>::type;

SYMCOMM_DEVICE bool sign_bit(float v) { return (float_as_bits(v) >> 31) != 0; }
SYMCOMM_DEVICE bool sign_bit(double v) { return (double_as_bits(v) >> 63) != 0; }

/// fminf semantics (NaN ignored unless both are NaN), with -0 < +0.
template <typename F>
SYMCOMM_DEVICE F float_min(F a, F b) {
    if (b != b) return a;
    if (a != a) return b;
    if (a == b) return sign_bit(a) ? a : b;
    return b < a ? b : a;
}

/// fmaxf semantics (NaN ignored unless both are NaN), with -0 < +0.
template <typename F>
SYMCOMM_DEVICE F float_max(F a, F b) {
    if (b != b) return a;
    if (a != a) return b;
    if (a == b) return sign_bit(a) ? b : a;
    return b > a ? b : a;
}

/// `a (op) b` in accumulation type `A` (Avg combines as Sum).
template <RedOp Op, typename A>
SYMCOMM_DEVICE A combine(A a, A b) {
    constexpr bool is_float = TypeTraits<A>::is_float;
    if constexpr (Op == RedOp::Sum || Op == RedOp::Avg) {
        if constexpr (is_float) {
            return a + b;
        } else {
            using U = WrapUnsigned<A>;
            return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
        }
    } else if constexpr (Op == RedOp::Prod) {
        if constexpr (is_float) {
            return a * b;
        } else {
            using U = WrapUnsigned<A>;
            return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
        }
    } else if constexpr (Op == RedOp::Min) {
        if constexpr (is_float) {
            return float_min(a, b);
        } else {
            return b < a ? b : a;
        }
    } else {
        static_assert(Op == RedOp::Max, "unknown RedOp");
        if constexpr (is_float) {
            return float_max(a, b);
        } else {
            return b > a ? b : a;
        }
    }
}

/// `sum / n` for Avg: floating point in the accumulation type; integers truncating toward zero.
template <typename A>
SYMCOMM_DEVICE A average(A sum, uint32_t n) {
    if constexpr (TypeTraits<A>::is_float) {
        return sum / static_cast<A>(n);
    } else if constexpr (static_cast<A>(-1) < static_cast<A>(0)) {
        return static_cast<A>(static_cast<long long>(sum) / static_cast<long long>(n));
    } else {
        return static_cast<A>(static_cast<unsigned long long>(sum) / static_cast<unsigned long long>(n));
    }
}

}  // namespace detail

/// Reduces values of element type `T` with `Op`: call `first` once, `add` for each further input,
/// then `result`. The running value is `acc` (type `acc_t<T>`), public so that partial results can
/// be combined (`acc = detail::combine<Op>(acc, other.acc)`); it starts at zero (so that a
/// compiler never sees an uninitialised read; `first` overwrites it, and the dead store costs
/// nothing). Per-thread, in registers; every function is called by the one thread that owns it.
template <typename T, RedOp Op>
struct Accumulator {
    using Acc = acc_t<T>;
    Acc acc{};

    /// Starts the reduction with the first input (converted to the accumulation type, exactly).
    SYMCOMM_DEVICE void first(T v) { acc = TypeTraits<T>::to_acc(v); }

    /// Folds in the next input. Pre: `first` was called.
    SYMCOMM_DEVICE void add(T v) { acc = detail::combine<Op>(acc, TypeTraits<T>::to_acc(v)); }

    /// The reduction of every input so far, rounded once to `T`. `nranks` is the divisor of Avg
    /// (the number of inputs, normally the team size) and is ignored by the other operators.
    /// Pre: `first` was called; for Avg, nranks >= 1.
    SYMCOMM_DEVICE T result(uint32_t nranks) const {
        if constexpr (Op == RedOp::Avg) {
            return TypeTraits<T>::from_acc(detail::average(acc, nranks));
        } else {
            (void)nranks;
            return TypeTraits<T>::from_acc(acc);
        }
    }
};

// ---- 16-byte packs ---------------------------------------------------------------------------

/// 16 bytes of memory viewed as `N = 16 / sizeof(T)` elements of `T` (`e`) or four 32-bit words
/// (`w`, what the vector loads move). 16-byte aligned; a plain union (elements are read after the
/// words are written, which nvcc, NVRTC and GCC all define).
template <typename T>
union alignas(16) Pack16 {
    /// Elements per pack.
    static constexpr uint32_t N = 16 / sizeof(T);
    T e[16 / sizeof(T)];
    uint32_t w[4];
};

/// True iff `p` is 16-byte aligned, i.e. a valid argument of load_pack / store_pack. Any thread.
SYMCOMM_DEVICE bool pack_aligned(const void* p) { return (reinterpret_cast<uint64_t>(p) & 15u) == 0; }

/// Loads the 16 bytes at `p` with one vector load (`ld.v4.u32`, generic addressing: global memory
/// of this or a peer GPU, or shared memory). A plain (weak) load: order it after the peer's
/// signal with the acquire of a wait/barrier. Pre: pack_aligned(p). Any thread, for its own pack.
template <typename T>
SYMCOMM_DEVICE Pack16<T> load_pack(const T* p) {
    Pack16<T> r;
#if defined(SYMCOMM_EMU)
    __builtin_memcpy(&r, p, sizeof r);
#else
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    r.w[0] = v.x;
    r.w[1] = v.y;
    r.w[2] = v.z;
    r.w[3] = v.w;
#endif
    return r;
}

/// Stores `v` to the 16 bytes at `p` with one 16-byte vector store; a plain (weak) store,
/// made visible to peers by a later release (signal/barrier). Pre: pack_aligned(p). Any thread.
template <typename T>
SYMCOMM_DEVICE void store_pack(T* p, const Pack16<T>& v) {
#if defined(SYMCOMM_EMU)
    __builtin_memcpy(p, &v, sizeof v);
#else
    *reinterpret_cast<uint4*>(p) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
#endif
}

/// Element-wise Accumulator over packs: `first(pack)`, `add(pack)` for each further pack,
/// `result(nranks)` rounds each element once. N accumulators in registers (fp8: 16 floats).
template <typename T, RedOp Op>
struct PackAccumulator {
    /// Elements per pack.
    static constexpr uint32_t N = Pack16<T>::N;
    Accumulator<T, Op> a[16 / sizeof(T)];

    /// Starts every element's reduction with `p`'s element.
    SYMCOMM_DEVICE void first(const Pack16<T>& p) {
        SYMCOMM_REDUCE_UNROLL_
        for (uint32_t i = 0; i < N; ++i) a[i].first(p.e[i]);
    }

    /// Folds in the next pack. Pre: `first` was called.
    SYMCOMM_DEVICE void add(const Pack16<T>& p) {
        SYMCOMM_REDUCE_UNROLL_
        for (uint32_t i = 0; i < N; ++i) a[i].add(p.e[i]);
    }

    /// Element-wise results (see Accumulator::result). Pre: `first` was called.
    SYMCOMM_DEVICE Pack16<T> result(uint32_t nranks) const {
        Pack16<T> r;
        SYMCOMM_REDUCE_UNROLL_
        for (uint32_t i = 0; i < N; ++i) r.e[i] = a[i].result(nranks);
        return r;
    }
};

/// Reduces `packs[0..k)` element-wise with `Op`, in index order, rounding each element once;
/// `nranks` is Avg's divisor. Meant for a `k` known at compile time after inlining (e.g. 8): the
/// loops unroll, `packs` stays in registers, and loading them all first issues the loads back to
/// back. With a run-time `k` the array goes to local memory; use reduce_packs_from instead.
/// Pre: k >= 1 (nranks >= 1 for Avg). Called by one thread for its own pack.
template <typename T, RedOp Op>
SYMCOMM_DEVICE Pack16<T> reduce_packs(const Pack16<T>* packs, uint32_t k, uint32_t nranks) {
    PackAccumulator<T, Op> acc;
    acc.first(packs[0]);
    SYMCOMM_REDUCE_UNROLL_
    for (uint32_t j = 1; j < k; ++j) acc.add(packs[j]);
    return acc.result(nranks);
}

/// Reduces the packs `load(0), load(1), ..., load(k - 1)` (called in that order, e.g.
/// `[&](uint32_t j) { return load_pack(src[j] + i); }`) element-wise with `Op`, rounding each element
/// once; nothing but the N accumulators stays live. Pre: k >= 1 (nranks >= 1 for Avg). Called by
/// one thread for its own pack.
template <typename T, RedOp Op, typename Load>
SYMCOMM_DEVICE Pack16<T> reduce_packs_from(uint32_t k, uint32_t nranks, Load&& load) {
    PackAccumulator<T, Op> acc;
    acc.first(load(0u));
    for (uint32_t j = 1; j < k; ++j) acc.add(load(j));
    return acc.result(nranks);
}

// ---- Run-time dispatch -----------------------------------------------------------------------

namespace detail {

template <template <typename, RedOp> class F, typename T, typename... Args>
SYMCOMM_DEVICE bool dispatch_op(RedOp op, Args&&... args) {
    switch (op) {
        case RedOp::Sum: F<T, RedOp::Sum>::run(static_cast<Args&&>(args)...); return true;
        case RedOp::Prod: F<T, RedOp::Prod>::run(static_cast<Args&&>(args)...); return true;
        case RedOp::Min: F<T, RedOp::Min>::run(static_cast<Args&&>(args)...); return true;
        case RedOp::Max: F<T, RedOp::Max>::run(static_cast<Args&&>(args)...); return true;
        case RedOp::Avg: F<T, RedOp::Avg>::run(static_cast<Args&&>(args)...); return true;
    }
    return false;
}

}  // namespace detail

/// Calls `F<T, Op>::run(args...)` for the element type `T = type_of_t<dt>` and operator `op`
/// given at run time (e.g. codes a kernel received from the host), forwarding `args` (results go
/// back through reference or pointer arguments; `run`'s return value is discarded). Returns false,
/// calling nothing, when `dt` or `op` is not a valid code. `F` is a class template with a static
/// `SYMCOMM_DEVICE` member `run`:
///
///     template <typename T, RedOp Op> struct MyReduce {
///         static SYMCOMM_DEVICE void run(const T* a, const T* b, T* out, uint32_t n, Status& st);
///     };
///     if (!dispatch<MyReduce>(DataType(dtype), RedOp(op), a, b, out, n, st)) st = ...;
///
/// Instantiation cost: all 12 x 5 = 60 specialisations of `F` are compiled into the calling
/// kernel, whose code size is up to 60 times that of one, whose register count is the maximum
/// over all of them, and whose compile time grows faster than 60 times: ptxas (CUDA 13.0, -O3)
/// needs about 7 s per architecture for one kernel whose `run` is a grid-stride loop over packs
/// (about 0.5 s for straight-line bodies), against about 1 s for the same 60 bodies as 60
/// separate kernels. NVRTC compiles at run time pay the same. So keep `run` small, or give each
/// pair its own kernel with SYMCOMM_FOR_EACH_DTYPE_OP and choose the kernel by name on the host.
/// Every thread that calls it takes the same branch when the codes are uniform (no divergence).
template <template <typename, RedOp> class F, typename... Args>
SYMCOMM_DEVICE bool dispatch(DataType dt, RedOp op, Args&&... args) {
    switch (dt) {
        case DataType::F32: return detail::dispatch_op<F, float>(op, static_cast<Args&&>(args)...);
        case DataType::F64: return detail::dispatch_op<F, double>(op, static_cast<Args&&>(args)...);
        case DataType::F16: return detail::dispatch_op<F, half_t>(op, static_cast<Args&&>(args)...);
        case DataType::BF16: return detail::dispatch_op<F, bfloat16_t>(op, static_cast<Args&&>(args)...);
        case DataType::Fp8E4M3: return detail::dispatch_op<F, fp8_e4m3_t>(op, static_cast<Args&&>(args)...);
        case DataType::Fp8E5M2: return detail::dispatch_op<F, fp8_e5m2_t>(op, static_cast<Args&&>(args)...);
        case DataType::I8: return detail::dispatch_op<F, signed char>(op, static_cast<Args&&>(args)...);
        case DataType::U8: return detail::dispatch_op<F, unsigned char>(op, static_cast<Args&&>(args)...);
        case DataType::I32: return detail::dispatch_op<F, int>(op, static_cast<Args&&>(args)...);
        case DataType::U32: return detail::dispatch_op<F, unsigned int>(op, static_cast<Args&&>(args)...);
        case DataType::I64: return detail::dispatch_op<F, long long>(op, static_cast<Args&&>(args)...);
        case DataType::U64: return detail::dispatch_op<F, unsigned long long>(op, static_cast<Args&&>(args)...);
    }
    return false;
}

}  // namespace symcomm

/// X-macro over every (element type, operator) pair: expands `X(T, Op, dtype, op)` 60 times, with
/// `T` the canonical C++ type of the code (type_of_t), `Op` the RedOp enumerator, and `dtype` /
/// `op` the names of dtype_name / redop_name as identifier tokens (`fp8_e4m3`, `sum`). The
/// compile-time-friendly alternative to `dispatch`: one kernel per pair, chosen by name:
///
///     #define MY_ALLREDUCE(T, Op, d, o)   (one macro: end each line but the last with a backslash)
///         extern "C" __global__ void my_allreduce_##d##_##o(Args args) { body<T, Op>(args); }
///         SYMCOMM_EMU_KERNEL(my_allreduce_##d##_##o)
///     SYMCOMM_FOR_EACH_DTYPE_OP(MY_ALLREDUCE)
///
/// (device/tests/cuda/numerics_instantiate.cu does this.)
#define SYMCOMM_FOR_EACH_OP_(X, T, d)                                                              \
    X(T, ::symcomm::RedOp::Sum, d, sum)                                                           \
    X(T, ::symcomm::RedOp::Prod, d, prod)                                                         \
    X(T, ::symcomm::RedOp::Min, d, min)                                                           \
    X(T, ::symcomm::RedOp::Max, d, max)                                                           \
    X(T, ::symcomm::RedOp::Avg, d, avg)
#define SYMCOMM_FOR_EACH_DTYPE_OP(X)                                                               \
    SYMCOMM_FOR_EACH_OP_(X, float, f32)                                                           \
    SYMCOMM_FOR_EACH_OP_(X, double, f64)                                                          \
    SYMCOMM_FOR_EACH_OP_(X, ::symcomm::half_t, f16)                                               \
    SYMCOMM_FOR_EACH_OP_(X, ::symcomm::bfloat16_t, bf16)                                          \
    SYMCOMM_FOR_EACH_OP_(X, ::symcomm::fp8_e4m3_t, fp8_e4m3)                                      \
    SYMCOMM_FOR_EACH_OP_(X, ::symcomm::fp8_e5m2_t, fp8_e5m2)                                      \
    SYMCOMM_FOR_EACH_OP_(X, signed char, i8)                                                      \
    SYMCOMM_FOR_EACH_OP_(X, unsigned char, u8)                                                    \
    SYMCOMM_FOR_EACH_OP_(X, int, i32)                                                             \
    SYMCOMM_FOR_EACH_OP_(X, unsigned int, u32)                                                    \
    SYMCOMM_FOR_EACH_OP_(X, long long, i64)                                                       \
    SYMCOMM_FOR_EACH_OP_(X, unsigned long long, u64)

#undef SYMCOMM_REDUCE_UNROLL_

// Inline definitions of <symcomm/reduce.cuh> (included at its end). load_pack / store_pack are
// in impl/reduce_ptx.cuh and impl/reduce_emu.cuh (chosen at the end of this file).
#pragma once

namespace symcomm {

SYMCOMM_DEVICE constexpr bool redop_valid(uint32_t code) { return code < SYMCOMM_REDOP_COUNT; }

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

template <typename T, RedOp Op>
SYMCOMM_DEVICE void Accumulator<T, Op>::first(T v) {
    acc = TypeTraits<T>::to_acc(v);
}

template <typename T, RedOp Op>
SYMCOMM_DEVICE void Accumulator<T, Op>::add(T v) {
    acc = detail::combine<Op>(acc, TypeTraits<T>::to_acc(v));
}

template <typename T, RedOp Op>
SYMCOMM_DEVICE T Accumulator<T, Op>::result(uint32_t nranks) const {
    if constexpr (Op == RedOp::Avg) {
        return TypeTraits<T>::from_acc(detail::average(acc, nranks));
    } else {
        (void)nranks;
        return TypeTraits<T>::from_acc(acc);
    }
}

SYMCOMM_DEVICE bool pack_aligned(const void* p) { return (reinterpret_cast<uint64_t>(p) & 15u) == 0; }

template <typename T, RedOp Op>
SYMCOMM_DEVICE void PackAccumulator<T, Op>::first(const Pack16<T>& p) {
    SYMCOMM_UNROLL
    for (uint32_t i = 0; i < N; ++i) a[i].first(p.e[i]);
}

template <typename T, RedOp Op>
SYMCOMM_DEVICE void PackAccumulator<T, Op>::add(const Pack16<T>& p) {
    SYMCOMM_UNROLL
    for (uint32_t i = 0; i < N; ++i) a[i].add(p.e[i]);
}

template <typename T, RedOp Op>
SYMCOMM_DEVICE Pack16<T> PackAccumulator<T, Op>::result(uint32_t nranks) const {
    Pack16<T> r;
    SYMCOMM_UNROLL
    for (uint32_t i = 0; i < N; ++i) r.e[i] = a[i].result(nranks);
    return r;
}

template <typename T, RedOp Op>
SYMCOMM_DEVICE Pack16<T> reduce_packs(const Pack16<T>* packs, uint32_t k, uint32_t nranks) {
    PackAccumulator<T, Op> acc;
    acc.first(packs[0]);
    SYMCOMM_UNROLL
    for (uint32_t j = 1; j < k; ++j) acc.add(packs[j]);
    return acc.result(nranks);
}

template <typename T, RedOp Op, typename Load>
SYMCOMM_DEVICE Pack16<T> reduce_packs_from(uint32_t k, uint32_t nranks, Load&& load) {
    PackAccumulator<T, Op> acc;
    acc.first(load(0u));
    for (uint32_t j = 1; j < k; ++j) acc.add(load(j));
    return acc.result(nranks);
}

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

#if defined(SYMCOMM_EMU)
#include <symcomm/impl/reduce_emu.cuh>
#else
#include <symcomm/impl/reduce_ptx.cuh>
#endif

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
SYMCOMM_DEVICE constexpr bool redop_valid(uint32_t code);

/// Short name of `op` ("sum", "prod", "min", "max", "avg"); "invalid" for a code outside the enum.
/// Any thread may call it.
SYMCOMM_DEVICE constexpr const char* redop_name(RedOp op);

/// Reduces values of element type `T` with `Op`: call `first` once, `add` for each further input,
/// then `result`. The running value is `acc` (type `acc_t<T>`), public so that partial results can
/// be combined (`acc = detail::combine<Op>(acc, other.acc)`, impl/reduce.cuh); it starts at zero
/// (so that a compiler never sees an uninitialised read; `first` overwrites it, and the dead store
/// costs nothing). Per-thread, in registers; every function is called by the one thread that owns
/// it.
template <typename T, RedOp Op>
struct Accumulator {
    using Acc = acc_t<T>;
    Acc acc{};

    /// Starts the reduction with the first input (converted to the accumulation type, exactly).
    SYMCOMM_DEVICE void first(T v);

    /// Folds in the next input. Pre: `first` was called.
    SYMCOMM_DEVICE void add(T v);

    /// The reduction of every input so far, rounded once to `T`. `nranks` is the divisor of Avg
    /// (the number of inputs, normally the team size) and is ignored by the other operators.
    /// Pre: `first` was called; for Avg, nranks >= 1.
    SYMCOMM_DEVICE T result(uint32_t nranks) const;
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
SYMCOMM_DEVICE bool pack_aligned(const void* p);

/// Loads the 16 bytes at `p` with one vector load (`ld.v4.u32`, generic addressing: global memory
/// of this or a peer GPU, or shared memory). A plain (weak) load: order it after the peer's
/// signal with the acquire of a wait/barrier. Pre: pack_aligned(p). Any thread, for its own pack.
template <typename T>
SYMCOMM_DEVICE Pack16<T> load_pack(const T* p);

/// Stores `v` to the 16 bytes at `p` with one 16-byte vector store; a plain (weak) store,
/// made visible to peers by a later release (signal/barrier). Pre: pack_aligned(p). Any thread.
template <typename T>
SYMCOMM_DEVICE void store_pack(T* p, const Pack16<T>& v);

/// Element-wise Accumulator over packs: `first(pack)`, `add(pack)` for each further pack,
/// `result(nranks)` rounds each element once. N accumulators in registers (fp8: 16 floats).
template <typename T, RedOp Op>
struct PackAccumulator {
    /// Elements per pack.
    static constexpr uint32_t N = Pack16<T>::N;
    Accumulator<T, Op> a[16 / sizeof(T)];

    /// Starts every element's reduction with `p`'s element.
    SYMCOMM_DEVICE void first(const Pack16<T>& p);

    /// Folds in the next pack. Pre: `first` was called.
    SYMCOMM_DEVICE void add(const Pack16<T>& p);

    /// Element-wise results (see Accumulator::result). Pre: `first` was called.
    SYMCOMM_DEVICE Pack16<T> result(uint32_t nranks) const;
};

/// Reduces `packs[0..k)` element-wise with `Op`, in index order, rounding each element once;
/// `nranks` is Avg's divisor. Meant for a `k` known at compile time after inlining (e.g. 8): the
/// loops unroll, `packs` stays in registers, and loading them all first issues the loads back to
/// back. With a run-time `k` the array goes to local memory; use reduce_packs_from instead.
/// Pre: k >= 1 (nranks >= 1 for Avg). Called by one thread for its own pack.
template <typename T, RedOp Op>
SYMCOMM_DEVICE Pack16<T> reduce_packs(const Pack16<T>* packs, uint32_t k, uint32_t nranks);

/// Reduces the packs `load(0), load(1), ..., load(k - 1)` (called in that order, e.g.
/// `[&](uint32_t j) { return load_pack(src[j] + i); }`) element-wise with `Op`, rounding each element
/// once; nothing but the N accumulators stays live. Pre: k >= 1 (nranks >= 1 for Avg). Called by
/// one thread for its own pack.
template <typename T, RedOp Op, typename Load>
SYMCOMM_DEVICE Pack16<T> reduce_packs_from(uint32_t k, uint32_t nranks, Load&& load);

// ---- Run-time dispatch -----------------------------------------------------------------------

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
SYMCOMM_DEVICE bool dispatch(DataType dt, RedOp op, Args&&... args);

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

#include <symcomm/impl/reduce.cuh>

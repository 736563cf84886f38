// symcomm CPU emulator: the CUDA shim, force-included (`-include symcomm_emu.h`) into every `.cu`
// file compiled for the emulator with the host C++ compiler and `-DSYMCOMM_EMU`.
//
// It maps the CUDA features the device library and its kernels use onto the emulator runtime
// (runtime.cpp): every CTA of a launch runs on its own OS thread, concurrently with all others, and
// the threads of a CTA run as fibers on it. What is supported is listed in device/emu/README.md;
// anything else must fail to compile, never misbehave silently.
#pragma once
#define SYMCOMM_EMU_SHIM_INCLUDED 1

#if !defined(SYMCOMM_EMU)
#error "symcomm_emu.h is for emulator builds (-DSYMCOMM_EMU)"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>
#include <utility>

// ---- Types ---------------------------------------------------------------------------------
namespace symcomm_emu {
/// True for the CUDA vector types below (what `__ldg` and friends take besides scalars).
template <typename T>
struct is_vector : std::false_type {};
}  // namespace symcomm_emu

// Vector types with CUDA's sizes and alignments (2 components: 2x the scalar's alignment, 4
// components: up to 16 bytes), so that 8- and 16-byte vectorized accesses keep their layout.
#define SYMCOMM_EMU_VEC(name, T)                                                                       \
    struct alignas(sizeof(T)) name##1 { T x; };                                                        \
    struct alignas(2 * sizeof(T)) name##2 { T x, y; };                                                 \
    struct alignas(sizeof(T)) name##3 { T x, y, z; };                                                  \
    struct alignas(4 * sizeof(T) < 16 ? 4 * sizeof(T) : 16) name##4 { T x, y, z, w; };                 \
    template <> struct symcomm_emu::is_vector<name##1> : std::true_type {};                           \
    template <> struct symcomm_emu::is_vector<name##2> : std::true_type {};                           \
    template <> struct symcomm_emu::is_vector<name##3> : std::true_type {};                           \
    template <> struct symcomm_emu::is_vector<name##4> : std::true_type {};                           \
    inline name##1 make_##name##1(T x) { return name##1{x}; }                                          \
    inline name##2 make_##name##2(T x, T y) { return name##2{x, y}; }                                  \
    inline name##3 make_##name##3(T x, T y, T z) { return name##3{x, y, z}; }                          \
    inline name##4 make_##name##4(T x, T y, T z, T w) { return name##4{x, y, z, w}; }
SYMCOMM_EMU_VEC(char, signed char)
SYMCOMM_EMU_VEC(uchar, unsigned char)
SYMCOMM_EMU_VEC(short, short)
SYMCOMM_EMU_VEC(ushort, unsigned short)
SYMCOMM_EMU_VEC(int, int)
SYMCOMM_EMU_VEC(uint, unsigned int)
SYMCOMM_EMU_VEC(longlong, long long)
SYMCOMM_EMU_VEC(ulonglong, unsigned long long)
SYMCOMM_EMU_VEC(float, float)
SYMCOMM_EMU_VEC(double, double)
#undef SYMCOMM_EMU_VEC
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};

// ---- Runtime interface (runtime.cpp) ---------------------------------------------------------
/// Launch coordinates of an emulated GPU thread.
struct SymcommEmuThread {
    uint3 thread_idx;
    uint3 block_idx;
    dim3 block_dim;
    dim3 grid_dim;
};

/// CTA-wide barrier flavours (`__syncthreads` and its reductions).
enum SymcommEmuCtaOp : unsigned {
    SYMCOMM_EMU_CTA_SYNC,
    SYMCOMM_EMU_CTA_COUNT,
    SYMCOMM_EMU_CTA_AND,
    SYMCOMM_EMU_CTA_OR,
};

/// Warp-collective operations: every lane of the warp makes the same call.
enum SymcommEmuWarpOp : unsigned {
    SYMCOMM_EMU_WARP_SYNC,
    SYMCOMM_EMU_WARP_SHFL_IDX,
    SYMCOMM_EMU_WARP_SHFL_UP,
    SYMCOMM_EMU_WARP_SHFL_DOWN,
    SYMCOMM_EMU_WARP_SHFL_XOR,
    SYMCOMM_EMU_WARP_BALLOT,
    SYMCOMM_EMU_WARP_ANY,
    SYMCOMM_EMU_WARP_ALL,
    SYMCOMM_EMU_WARP_REDUCE_ADD,
    SYMCOMM_EMU_WARP_REDUCE_MIN_U32,
    SYMCOMM_EMU_WARP_REDUCE_MAX_U32,
    SYMCOMM_EMU_WARP_REDUCE_MIN_I32,
    SYMCOMM_EMU_WARP_REDUCE_MAX_I32,
    SYMCOMM_EMU_WARP_REDUCE_AND,
    SYMCOMM_EMU_WARP_REDUCE_OR,
    SYMCOMM_EMU_WARP_REDUCE_XOR,
};

extern "C" {
/// The calling fiber's emulated GPU thread; null outside a kernel.
SymcommEmuThread* symcomm_emu_current(void);
/// `__syncthreads()` and its reductions: waits for every thread of the CTA; returns the
/// reduction of `predicate` over the CTA (0 for SYMCOMM_EMU_CTA_SYNC). Orders memory.
int symcomm_emu_syncthreads(unsigned op, int predicate);
/// Warp-collective `op` over the lanes of the calling warp (`mask` must be exactly the warp's
/// lanes): exchanges `value` and returns this lane's result. `arg` is the source lane, delta or
/// lane mask of a shuffle, `width` its segment width. Only SYMCOMM_EMU_WARP_SYNC orders memory.
uint64_t symcomm_emu_warp(unsigned op, unsigned mask, uint64_t value, int arg, int width);
/// `__activemask()`: the lanes of the calling warp that have not returned.
unsigned symcomm_emu_activemask(void);
/// Per-CTA static shared buffer of `bytes` for the declaration `site`, aligned to `align`
/// (at least 16) and zero-initialised, the same for every thread of the CTA.
void* symcomm_emu_shared_static(const void* site, size_t bytes, size_t align);
/// Per-CTA dynamic shared buffer (the launch's `shared_bytes`), 16-byte aligned.
void* symcomm_emu_shared_dynamic(void);
/// Whether `p` lies in the calling thread's CTA's shared memory (`__isShared`).
int symcomm_emu_is_shared(const void* p);
/// Whether `p` lies on the calling thread's own stack, CUDA's local memory (`__isLocal`).
int symcomm_emu_is_local(const void* p);
/// `%globaltimer`: nanoseconds of a steady clock.
uint64_t symcomm_emu_globaltimer_ns(void);
/// `__nanosleep` / spin-loop back-off: lets the other threads of the CTA run, and the other CTAs
/// once every thread of this CTA has yielded in a row.
void symcomm_emu_yield(void);
/// `__trap()`: reports and aborts the process.
[[noreturn]] void symcomm_emu_trap(const char* file, int line);
}

// ---- Qualifiers --------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __grid_constant__
#define __restrict__ __restrict
// Plain `__shared__` cannot be per-CTA in C++: declare shared memory with the portable macros.
// (_Pragma takes a single string literal: the message cannot be split.)
#define __shared__ _Pragma("GCC error \"__shared__ is not supported by the symcomm emulator: use SYMCOMM_SHARED(type, name, count) or SYMCOMM_DYNAMIC_SHARED(type, name) from <symcomm/config.cuh>\"")
#define __constant__ _Pragma("GCC error \"__constant__ is not supported by the symcomm emulator\"")
#define __managed__ _Pragma("GCC error \"__managed__ is not supported by the symcomm emulator\"")

// ---- Built-in variables ------------------------------------------------------------------------
#define threadIdx (symcomm_emu_current()->thread_idx)
#define blockIdx (symcomm_emu_current()->block_idx)
#define blockDim (symcomm_emu_current()->block_dim)
#define gridDim (symcomm_emu_current()->grid_dim)
#define warpSize 32

// ---- Synchronization ---------------------------------------------------------------------------
inline void __syncthreads() { symcomm_emu_syncthreads(SYMCOMM_EMU_CTA_SYNC, 0); }
inline int __syncthreads_count(int predicate) { return symcomm_emu_syncthreads(SYMCOMM_EMU_CTA_COUNT, predicate); }
inline int __syncthreads_and(int predicate) { return symcomm_emu_syncthreads(SYMCOMM_EMU_CTA_AND, predicate); }
inline int __syncthreads_or(int predicate) { return symcomm_emu_syncthreads(SYMCOMM_EMU_CTA_OR, predicate); }
inline void __syncwarp(unsigned int mask = 0xffffffffu) { symcomm_emu_warp(SYMCOMM_EMU_WARP_SYNC, mask, 0, 0, 32); }
inline void __nanosleep(unsigned int) { symcomm_emu_yield(); }
// Address-space queries. Global: everything that is neither this CTA's shared memory nor this
// thread's stack (the emulator's device memory is host memory).
inline unsigned int __isShared(const void* p) { return symcomm_emu_is_shared(p) != 0; }
inline unsigned int __isLocal(const void* p) { return symcomm_emu_is_local(p) != 0; }
inline unsigned int __isGlobal(const void* p) { return !__isShared(p) && !__isLocal(p); }
#define __trap() symcomm_emu_trap(__FILE__, __LINE__)
// Fences are sequentially consistent C++ fences. ThreadSanitizer does not model stand-alone
// fences, so the device library orders through acquire/release operations instead.
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_block() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_system() __atomic_thread_fence(__ATOMIC_SEQ_CST)

// ---- Timers ------------------------------------------------------------------------------------
/// Nanoseconds of a steady clock (a GPU counts SM cycles; only differences are meaningful).
inline long long int clock64() { return (long long int)symcomm_emu_globaltimer_ns(); }

// ---- Warp operations (full warp masks only; see README) ----------------------------------------
namespace symcomm_emu {
template <typename T>
inline T shuffle(SymcommEmuWarpOp op, unsigned mask, T var, int arg, int width) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "shuffles move 32- or 64-bit values");
    uint64_t bits = 0;
    memcpy(&bits, &var, sizeof(T));  // little-endian: a 32-bit value lands in the low half
    bits = symcomm_emu_warp(op, mask, bits, arg, width);
    memcpy(&var, &bits, sizeof(T));
    return var;
}
}  // namespace symcomm_emu

// CUDA's shuffle overloads (not a template, so that narrower integers promote as under nvcc).
#define SYMCOMM_EMU_SHUFFLES(T)                                                                   \
    inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {              \
        return symcomm_emu::shuffle(SYMCOMM_EMU_WARP_SHFL_IDX, mask, var, src_lane, width);       \
    }                                                                                             \
    inline T __shfl_up_sync(unsigned mask, T var, unsigned int delta, int width = warpSize) {     \
        return symcomm_emu::shuffle(SYMCOMM_EMU_WARP_SHFL_UP, mask, var, int(delta), width);      \
    }                                                                                             \
    inline T __shfl_down_sync(unsigned mask, T var, unsigned int delta, int width = warpSize) {   \
        return symcomm_emu::shuffle(SYMCOMM_EMU_WARP_SHFL_DOWN, mask, var, int(delta), width);    \
    }                                                                                             \
    inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {         \
        return symcomm_emu::shuffle(SYMCOMM_EMU_WARP_SHFL_XOR, mask, var, lane_mask, width);      \
    }
SYMCOMM_EMU_SHUFFLES(int)
SYMCOMM_EMU_SHUFFLES(unsigned int)
SYMCOMM_EMU_SHUFFLES(long)
SYMCOMM_EMU_SHUFFLES(unsigned long)
SYMCOMM_EMU_SHUFFLES(long long)
SYMCOMM_EMU_SHUFFLES(unsigned long long)
SYMCOMM_EMU_SHUFFLES(float)
SYMCOMM_EMU_SHUFFLES(double)
#undef SYMCOMM_EMU_SHUFFLES
inline unsigned __ballot_sync(unsigned mask, int predicate) {
    return unsigned(symcomm_emu_warp(SYMCOMM_EMU_WARP_BALLOT, mask, predicate != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int predicate) {
    return int(symcomm_emu_warp(SYMCOMM_EMU_WARP_ANY, mask, predicate != 0, 0, 32));
}
inline int __all_sync(unsigned mask, int predicate) {
    return int(symcomm_emu_warp(SYMCOMM_EMU_WARP_ALL, mask, predicate != 0, 0, 32));
}
inline unsigned __activemask() { return symcomm_emu_activemask(); }
inline unsigned __reduce_add_sync(unsigned mask, unsigned value) {
    return unsigned(symcomm_emu_warp(SYMCOMM_EMU_WARP_REDUCE_ADD, mask, value, 0, 32));
}
inline int __reduce_add_sync(unsigned mask, int value) {
    return int(symcomm_emu_warp(SYMCOMM_EMU_WARP_REDUCE_ADD, mask, uint32_t(value), 0, 32));
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned value) {
    return unsigned(symcomm_emu_warp(SYMCOMM_EMU_WARP_REDUCE_MIN_U32, mask, value, 0, 32));
}
inline int __reduce_min_sync(unsigned mask, int value) {
    return int(symcomm_emu_warp(SYMCOMM_EMU_WARP_REDUCE_MIN_I32, mask, uint32_t(value), 0, 32));
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned value) {
    return unsigned(symcomm_emu_warp(SYMCOMM_EMU_WARP_REDUCE_MAX_U32, mask, value, 0, 32));
}
inline int __reduce_max_sync(unsigned mask, int value) {
    return int(symcomm_emu_warp(SYMCOMM_EMU_WARP_REDUCE_MAX_I32, mask, uint32_t(value), 0, 32));
}
inline unsigned __reduce_and_sync(unsigned mask, unsigned value) {
    return unsigned(symcomm_emu_warp(SYMCOMM_EMU_WARP_REDUCE_AND, mask, value, 0, 32));
}
inline unsigned __reduce_or_sync(unsigned mask, unsigned value) {
    return unsigned(symcomm_emu_warp(SYMCOMM_EMU_WARP_REDUCE_OR, mask, value, 0, 32));
}
inline unsigned __reduce_xor_sync(unsigned mask, unsigned value) {
    return unsigned(symcomm_emu_warp(SYMCOMM_EMU_WARP_REDUCE_XOR, mask, value, 0, 32));
}

// ---- Atomics: CUDA's overload set, relaxed like CUDA's ----------------------------------------
namespace symcomm_emu {
template <typename T>
inline T atomic_add_float(T* p, T v) {
    T cur, next;
    __atomic_load(p, &cur, __ATOMIC_RELAXED);
    do {
        next = cur + v;
    } while (!__atomic_compare_exchange(p, &cur, &next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return cur;
}
template <typename T>
inline T atomic_max(T* p, T v) {
    T cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (cur < v && !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return cur;
}
template <typename T>
inline T atomic_min(T* p, T v) {
    T cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (cur > v && !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return cur;
}
}  // namespace symcomm_emu

#define SYMCOMM_EMU_ATOMIC(ret, name, T, body) \
    inline ret name(T* p, T v) { return body; }
#define SYMCOMM_EMU_ATOMIC_INT(T)                                                                   \
    SYMCOMM_EMU_ATOMIC(T, atomicAdd, T, __atomic_fetch_add(p, v, __ATOMIC_RELAXED))                 \
    SYMCOMM_EMU_ATOMIC(T, atomicExch, T, __atomic_exchange_n(p, v, __ATOMIC_RELAXED))               \
    SYMCOMM_EMU_ATOMIC(T, atomicMax, T, symcomm_emu::atomic_max(p, v))                              \
    SYMCOMM_EMU_ATOMIC(T, atomicMin, T, symcomm_emu::atomic_min(p, v))                              \
    SYMCOMM_EMU_ATOMIC(T, atomicAnd, T, __atomic_fetch_and(p, v, __ATOMIC_RELAXED))                 \
    SYMCOMM_EMU_ATOMIC(T, atomicOr, T, __atomic_fetch_or(p, v, __ATOMIC_RELAXED))                   \
    SYMCOMM_EMU_ATOMIC(T, atomicXor, T, __atomic_fetch_xor(p, v, __ATOMIC_RELAXED))                 \
    inline T atomicCAS(T* p, T expected, T desired) {                                               \
        __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED); \
        return expected;                                                                            \
    }
SYMCOMM_EMU_ATOMIC_INT(int)
SYMCOMM_EMU_ATOMIC_INT(unsigned int)
SYMCOMM_EMU_ATOMIC_INT(unsigned long long)
SYMCOMM_EMU_ATOMIC(long long, atomicMax, long long, symcomm_emu::atomic_max(p, v))
SYMCOMM_EMU_ATOMIC(long long, atomicMin, long long, symcomm_emu::atomic_min(p, v))
SYMCOMM_EMU_ATOMIC(int, atomicSub, int, __atomic_fetch_sub(p, v, __ATOMIC_RELAXED))
SYMCOMM_EMU_ATOMIC(unsigned int, atomicSub, unsigned int, __atomic_fetch_sub(p, v, __ATOMIC_RELAXED))
SYMCOMM_EMU_ATOMIC(float, atomicAdd, float, symcomm_emu::atomic_add_float(p, v))
SYMCOMM_EMU_ATOMIC(double, atomicAdd, double, symcomm_emu::atomic_add_float(p, v))
inline float atomicExch(float* p, float v) {
    float old;
    __atomic_exchange(p, &v, &old, __ATOMIC_RELAXED);
    return old;
}
#undef SYMCOMM_EMU_ATOMIC_INT
#undef SYMCOMM_EMU_ATOMIC
/// `((old >= limit) ? 0 : old + 1)`, atomically.
inline unsigned int atomicInc(unsigned int* p, unsigned int limit) {
    unsigned int cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(p, &cur, cur >= limit ? 0u : cur + 1u, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    return cur;
}
/// `((old == 0) || (old > limit)) ? limit : old - 1`, atomically.
inline unsigned int atomicDec(unsigned int* p, unsigned int limit) {
    unsigned int cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(p, &cur, (cur == 0u || cur > limit) ? limit : cur - 1u, true,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return cur;
}

// ---- Loads through the read-only / cache-hinted paths: plain loads and stores on a CPU ----------
namespace symcomm_emu {
template <typename T>
constexpr bool is_ldst_type = std::is_arithmetic<T>::value || is_vector<T>::value;
}  // namespace symcomm_emu
#define SYMCOMM_EMU_LOAD(name)                                                      \
    template <typename T>                                                           \
    inline T name(const T* p) {                                                     \
        static_assert(symcomm_emu::is_ldst_type<T>, #name " takes scalars or CUDA vector types"); \
        return *p;                                                                  \
    }
#define SYMCOMM_EMU_STORE(name)                                                     \
    template <typename T>                                                           \
    inline void name(T* p, T v) {                                                   \
        static_assert(symcomm_emu::is_ldst_type<T>, #name " takes scalars or CUDA vector types"); \
        *p = v;                                                                     \
    }
SYMCOMM_EMU_LOAD(__ldg)
SYMCOMM_EMU_LOAD(__ldca)
SYMCOMM_EMU_LOAD(__ldcg)
SYMCOMM_EMU_LOAD(__ldcs)
SYMCOMM_EMU_LOAD(__ldlu)
SYMCOMM_EMU_LOAD(__ldcv)
SYMCOMM_EMU_STORE(__stwb)
SYMCOMM_EMU_STORE(__stcg)
SYMCOMM_EMU_STORE(__stcs)
SYMCOMM_EMU_STORE(__stwt)
#undef SYMCOMM_EMU_LOAD
#undef SYMCOMM_EMU_STORE

// ---- Integer intrinsics ------------------------------------------------------------------------
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned int __brev(unsigned int x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    return __builtin_bswap32(x);
}
inline unsigned long long __brevll(unsigned long long x) {
    return ((unsigned long long)__brev(unsigned(x)) << 32) | __brev(unsigned(x >> 32));
}
inline unsigned int __umulhi(unsigned int a, unsigned int b) { return unsigned((uint64_t(a) * b) >> 32); }
inline int __mulhi(int a, int b) { return int((int64_t(a) * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * b) >> 64); }

// ---- Bit casts and math ------------------------------------------------------------------------
namespace symcomm_emu {
template <typename To, typename From>
inline To bit_cast(From v) {
    static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different sizes");
    To r;
    memcpy(&r, &v, sizeof r);
    return r;
}
}  // namespace symcomm_emu
inline unsigned int __float_as_uint(float x) { return symcomm_emu::bit_cast<unsigned int>(x); }
inline int __float_as_int(float x) { return symcomm_emu::bit_cast<int>(x); }
inline float __uint_as_float(unsigned int x) { return symcomm_emu::bit_cast<float>(x); }
inline float __int_as_float(int x) { return symcomm_emu::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return symcomm_emu::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return symcomm_emu::bit_cast<double>(x); }
inline int __double2hiint(double x) { return int(__double_as_longlong(x) >> 32); }
inline int __double2loint(double x) { return int(__double_as_longlong(x)); }
inline double __hiloint2double(int hi, int lo) {
    return __longlong_as_double((long long)(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo));
}

// CUDA's device `min` / `max` overloads, including its mixed signed/unsigned ones (which compare
// as unsigned), so that calls resolve as under nvcc.
#define SYMCOMM_EMU_MINMAX(R, A, B)                    \
    inline R min(A a, B b) { return static_cast<R>(a) < static_cast<R>(b) ? static_cast<R>(a) : static_cast<R>(b); } \
    inline R max(A a, B b) { return static_cast<R>(a) < static_cast<R>(b) ? static_cast<R>(b) : static_cast<R>(a); }
SYMCOMM_EMU_MINMAX(int, int, int)
SYMCOMM_EMU_MINMAX(unsigned int, unsigned int, unsigned int)
SYMCOMM_EMU_MINMAX(unsigned int, int, unsigned int)
SYMCOMM_EMU_MINMAX(unsigned int, unsigned int, int)
SYMCOMM_EMU_MINMAX(long, long, long)
SYMCOMM_EMU_MINMAX(unsigned long, unsigned long, unsigned long)
SYMCOMM_EMU_MINMAX(unsigned long, long, unsigned long)
SYMCOMM_EMU_MINMAX(unsigned long, unsigned long, long)
SYMCOMM_EMU_MINMAX(long long, long long, long long)
SYMCOMM_EMU_MINMAX(unsigned long long, unsigned long long, unsigned long long)
SYMCOMM_EMU_MINMAX(unsigned long long, long long, unsigned long long)
SYMCOMM_EMU_MINMAX(unsigned long long, unsigned long long, long long)
#undef SYMCOMM_EMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// ---- Kernel entry points -------------------------------------------------------------------------
namespace symcomm_emu {
template <typename... A, size_t... I>
inline void invoke_indexed(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<A*>(args[I])...);
}
template <typename... A>
inline void invoke(void (*kernel)(A...), void** args) {
    invoke_indexed(kernel, args, std::index_sequence_for<A...>{});
}
}  // namespace symcomm_emu

/// Defines `symcomm_emu_entry_<name>(void** args)`, which the runtime calls on every emulated
/// thread; `args[i]` points at the i-th kernel argument, as with cuLaunchKernel.
#define SYMCOMM_EMU_KERNEL(name) \
    extern "C" void symcomm_emu_entry_##name(void** args) { ::symcomm_emu::invoke(name, args); }

// Kernels of the emulator's self-test (emu_selftest.cpp includes this file; the expectations are
// computed there). They are plain CUDA as well (`nvcc -arch=sm_90 -c` compiles them), so that an
// expectation can be checked against a GPU; checks that hold only on the emulator (zeroed shared
// memory) are under SYMCOMM_EMU. The `st_die_*` kernels break CUDA's rules on purpose: the
// emulator must abort with a message, and on a GPU they are undefined.
#include <symcomm/symcomm.cuh>

namespace selftest {

/// Bounded spins give up after this long (the test then fails instead of hanging).
constexpr uint64_t kTimeoutNs = 20'000'000'000ull;

SYMCOMM_DEVICE uint32_t linear_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

SYMCOMM_DEVICE uint32_t block_threads() { return blockDim.x * blockDim.y * blockDim.z; }

SYMCOMM_DEVICE void fail(uint32_t* errors) { atomicAdd(errors, 1u); }

/// Spins with back-off until `*p >= v` (acquire); false after kTimeoutNs.
SYMCOMM_DEVICE bool wait_geq(const uint64_t* p, uint64_t v) {
    const uint64_t start = symcomm::globaltimer_ns();
    while (symcomm::ld_acquire<symcomm::Scope::Gpu>(p) < v) {
        if (symcomm::globaltimer_ns() - start > kTimeoutNs) return false;
        symcomm::backoff(64);
    }
    return true;
}

// ---- Shuffle cases: the same enumeration on the device and in the host's expectations ----------
constexpr int kShflWidths = 6;  // 32 >> i
constexpr int kShflOps = 4;     // idx, up, down, xor
constexpr int kShflArgs = 4;
constexpr int kShflCases = kShflWidths * kShflOps * kShflArgs;
constexpr int kShflTypes = 6;  // int, unsigned, long long, unsigned long long, float, double
constexpr uint32_t kShflThreads = 64;

/// The k-th argument of shuffle `op` for `lane` (source lane, delta or lane mask); idx includes
/// lanes beyond the width and a lane-dependent source.
SYMCOMM_DEVICE int shfl_arg(int op, int k, uint32_t lane) {
    switch (op) {
        case 0: return k == 0 ? 0 : k == 1 ? 3 : k == 2 ? 37 : int(lane * 7u + 3u) % 64;
        case 1: return k == 0 ? 1 : k == 1 ? 2 : k == 2 ? 5 : 16;
        case 2: return k == 0 ? 1 : k == 1 ? 4 : k == 2 ? 17 : 31;
        default: return k == 0 ? 1 : k == 1 ? 2 : k == 2 ? 8 : 16;
    }
}

template <typename T>
SYMCOMM_DEVICE T shfl_input(uint32_t t);
template <>
SYMCOMM_DEVICE int shfl_input<int>(uint32_t t) { return int(t * 3u) - 40; }
template <>
SYMCOMM_DEVICE unsigned shfl_input<unsigned>(uint32_t t) { return 0x80000000u + t * 5u; }
template <>
SYMCOMM_DEVICE long long shfl_input<long long>(uint32_t t) { return (long long)t * (1ll << 40) - 7; }
template <>
SYMCOMM_DEVICE unsigned long long shfl_input<unsigned long long>(uint32_t t) { return 0xf000000000000000ull + t; }
template <>
SYMCOMM_DEVICE float shfl_input<float>(uint32_t t) { return float(t) * 1.5f - 10.0f; }
template <>
SYMCOMM_DEVICE double shfl_input<double>(uint32_t t) { return double(t) * 0.25 - 3.0 + 1e-10 * t; }

template <typename T>
SYMCOMM_DEVICE uint64_t to_bits(T v) {
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}

template <typename T>
SYMCOMM_DEVICE void shuffle_cases(uint64_t* out, uint32_t t) {
    const uint32_t lane = t % 32u;
    const T v = shfl_input<T>(t);
    for (int wi = 0; wi < kShflWidths; ++wi) {
        const int width = 32 >> wi;
        for (int op = 0; op < kShflOps; ++op) {
            for (int k = 0; k < kShflArgs; ++k) {
                const int a = shfl_arg(op, k, lane);
                T r;
                switch (op) {
                    case 0: r = __shfl_sync(0xffffffffu, v, a, width); break;
                    case 1: r = __shfl_up_sync(0xffffffffu, v, unsigned(a), width); break;
                    case 2: r = __shfl_down_sync(0xffffffffu, v, unsigned(a), width); break;
                    default: r = __shfl_xor_sync(0xffffffffu, v, a, width); break;
                }
                out[((wi * kShflOps + op) * kShflArgs + k) * kShflThreads + t] = to_bits(r);
            }
        }
    }
}

// ---- Votes and reductions on a full and a partial warp -----------------------------------------
constexpr uint32_t kVoteThreads = 48;  // warp 0: 32 lanes, warp 1: 16 lanes
constexpr uint32_t kVoteWords = 24;

SYMCOMM_DEVICE int vote_predicate(int p, uint32_t lane) {
    return p == 0 ? lane % 3u == 0 : p == 1 ? 1 : p == 2 ? 0 : lane == 5u;
}

// ---- Shared memory -------------------------------------------------------------------------------
struct alignas(64) Wide {
    uint32_t v[16];
};

/// A device function's own static shared variable: one per CTA, whoever calls it.
SYMCOMM_DEVICE uint32_t* shared_counter() {
    SYMCOMM_SHARED(uint32_t, counter, 1);
    return counter;
}

// ---- Atomics and integer intrinsics --------------------------------------------------------------
struct AtomicsOut {
    float fsum;
    double dsum;
    unsigned umax, umin, inc, dec, and_bits, or_bits, xor_bits, exch, exch_returned, cas_count;
    int imax, imin, isub;
    unsigned long long ullmax, ulladd;
    long long llmin, llmax;
};
constexpr uint32_t kIntrinsicWords = 10;

/// Recursion with 1 KiB frames, for the stack-overflow check (plain __device__: not inlined).
__device__ uint32_t deep_recursion(uint32_t depth) {
    volatile unsigned char frame[1024];
    frame[depth % 1024u] = (unsigned char)depth;
    return depth == 0 ? 0u : deep_recursion(depth - 1) + frame[depth % 1024u];
}

}  // namespace selftest

/// `rounds` rounds of CTA-wide and warp-wide hand-offs through shared memory, ordered by
/// `__syncthreads()` / `__syncwarp()`, and the reductions of `__syncthreads_count/and/or`. Any
/// block of a multiple of 32 threads up to 1024, any 3D shape.
extern "C" __global__ void st_barrier(uint32_t rounds, uint32_t* errors) {
    using namespace selftest;
    SYMCOMM_SHARED(uint32_t, words, 1024);
    SYMCOMM_SHARED(uint32_t, lanes, 1024);
    const uint32_t n = block_threads(), t = linear_tid(), lane = t % 32u;
    const uint32_t salt = blockIdx.x * 0x9e3779b9u;
    for (uint32_t r = 0; r < rounds; ++r) {
        words[t] = r * 7919u + t + salt;
        __syncthreads();
        const uint32_t other = (t + r + 1) % n;
        if (words[other] != r * 7919u + other + salt) fail(errors);
        __syncthreads();  // every thread read words[] before anyone overwrites it
        lanes[t] = r + t;
        __syncwarp();
        const uint32_t peer = t - lane + (lane + r + 1) % 32u;
        if (lanes[peer] != r + peer) fail(errors);
        __syncwarp();
        if (r % 4 == 0) {
            if (uint32_t(__syncthreads_count(t % 3u == 0)) != (n + 2) / 3) fail(errors);
            if (__syncthreads_and(t < n) != 1 || __syncthreads_and(t != r % n) != 0) fail(errors);
            if (__syncthreads_or(t == r % n) != 1 || __syncthreads_or(0) != 0) fail(errors);
        }
    }
}
SYMCOMM_EMU_KERNEL(st_barrier)

/// Every shuffle variant, width and a few arguments for 6 value types: `out` gets
/// kShflTypes x kShflCases x kShflThreads results (bit patterns). Block: kShflThreads.
extern "C" __global__ void st_shuffle(uint64_t* out) {
    using namespace selftest;
    static_assert(kShflTypes == 6, "one shuffle_cases call per type below");
    const uint32_t t = linear_tid();
    const size_t per_type = size_t(kShflCases) * kShflThreads;
    shuffle_cases<int>(out + 0 * per_type, t);
    shuffle_cases<unsigned>(out + 1 * per_type, t);
    shuffle_cases<long long>(out + 2 * per_type, t);
    shuffle_cases<unsigned long long>(out + 3 * per_type, t);
    shuffle_cases<float>(out + 4 * per_type, t);
    shuffle_cases<double>(out + 5 * per_type, t);
}
SYMCOMM_EMU_KERNEL(st_shuffle)

/// Ballot/any/all, the warp reductions and segment shuffles on a full and a partial warp, with
/// the mask `__activemask()`: kVoteWords words per thread. Block: kVoteThreads.
extern "C" __global__ void st_vote(uint32_t* out) {
    using namespace selftest;
    static_assert(kVoteThreads > 32 && kVoteThreads < 64, "one full and one partial warp");
    const uint32_t t = linear_tid(), lane = t % 32u;
    const unsigned mask = __activemask();
    uint32_t* o = out + t * kVoteWords;
    o[0] = mask;
    for (int p = 0; p < 4; ++p) {
        const int pred = vote_predicate(p, lane);
        o[1 + 3 * p] = __ballot_sync(mask, pred);
        o[2 + 3 * p] = uint32_t(__any_sync(mask, pred));
        o[3 + 3 * p] = uint32_t(__all_sync(mask, pred));
    }
    const unsigned uv = lane * 2654435761u;
    const int iv = int(lane) - 7;
    o[13] = __reduce_add_sync(mask, uv);
    o[14] = __reduce_min_sync(mask, uv);
    o[15] = __reduce_max_sync(mask, uv);
    o[16] = uint32_t(__reduce_add_sync(mask, iv));
    o[17] = uint32_t(__reduce_min_sync(mask, iv));
    o[18] = uint32_t(__reduce_max_sync(mask, iv));
    o[19] = __reduce_and_sync(mask, ~(1u << lane));
    o[20] = __reduce_or_sync(mask, 1u << lane);
    o[21] = __reduce_xor_sync(mask, uv);
    o[22] = __shfl_xor_sync(mask, t, 8, 16);
    o[23] = __shfl_down_sync(mask, t, 3, 16);
}
SYMCOMM_EMU_KERNEL(st_vote)

/// Static and dynamic shared memory: alignment, aliasing of dynamic views, one copy per CTA
/// (every CTA fills its copies, lets the others run, and checks its own values survived), and a
/// device function's own shared variable. `addrs` gets each CTA's static and dynamic addresses.
/// Dynamic shared memory: `dyn_words` words. Block: up to 128 threads.
extern "C" __global__ void st_shared(uint32_t dyn_words, uint32_t* errors, uint64_t* addrs) {
    using namespace selftest;
    SYMCOMM_SHARED(Wide, wide, 3);
    SYMCOMM_SHARED(unsigned char, small, 5);
    SYMCOMM_SHARED(uint32_t, words, 128);
    SYMCOMM_DYNAMIC_SHARED(uint32_t, dyn);
    SYMCOMM_DYNAMIC_SHARED(unsigned char, dyn_bytes);
    const uint32_t n = block_threads(), t = linear_tid(), cta = blockIdx.x;
#if defined(SYMCOMM_EMU)
    if (words[t] != 0 || wide[t % 3u].v[t % 16u] != 0 || small[t % 5u] != 0) fail(errors);
#endif
    const uint64_t w = uint64_t(reinterpret_cast<uintptr_t>(wide));
    const uint64_t s = uint64_t(reinterpret_cast<uintptr_t>(small));
    const uint64_t ws = uint64_t(reinterpret_cast<uintptr_t>(words));
    const uint64_t d = uint64_t(reinterpret_cast<uintptr_t>(dyn));
    if (w % 64 != 0 || s % 16 != 0 || ws % 16 != 0 || d % 16 != 0) fail(errors);
    if (static_cast<void*>(dyn) != static_cast<void*>(dyn_bytes)) fail(errors);
    if ((s >= w && s < w + sizeof(Wide) * 3) || (ws >= s && ws < s + 5) || (w >= ws && w < ws + 4 * 128))
        fail(errors);
    __syncthreads();  // the checks above read before anyone writes below
    if (t == 0) {
        addrs[2 * cta] = ws;
        addrs[2 * cta + 1] = d;
    }
    words[t] = cta * 1000u + t;
    for (uint32_t i = t; i < dyn_words; i += n) dyn[i] = cta * 0x01000000u + i;
    atomicAdd(shared_counter(), 1u);
    for (int k = 0; k < 8; ++k) __nanosleep(100);
    __syncthreads();
    if (words[(t + 1) % n] != cta * 1000u + (t + 1) % n) fail(errors);
    for (uint32_t i = t; i < dyn_words; i += n) {
        const uint32_t j = (i + n / 2) % dyn_words;
        if (dyn[j] != cta * 0x01000000u + j) fail(errors);
    }
    atomicAdd(shared_counter(), 1u);
    __syncthreads();
    if (t == 0 && *shared_counter() != 2 * n) fail(errors);
}
SYMCOMM_EMU_KERNEL(st_shared)

/// A token ring between the CTAs, each waiting for the previous one by spinning on global
/// memory; inside a CTA, thread 0 hands every turn to the other threads and waits for them by
/// spinning on shared memory, with no barrier. `*token` ends at turns x gridDim.x.
extern "C" __global__ void st_ring(uint64_t* token, uint32_t turns, uint32_t* errors) {
    using namespace selftest;
    using symcomm::Scope;
    SYMCOMM_SHARED(uint64_t, go, 1);
    SYMCOMM_SHARED(uint64_t, done, 1);
    const uint32_t n = block_threads(), t = linear_tid();
    for (uint32_t k = 0; k < turns; ++k) {
        if (t == 0) {
            const uint64_t mine = uint64_t(k) * gridDim.x + blockIdx.x;
            if (!wait_geq(token, mine) || symcomm::ld_acquire<Scope::Gpu>(token) != mine) fail(errors);
            symcomm::st_release<Scope::Gpu>(go, k + 1);
            if (!wait_geq(done, uint64_t(k + 1) * (n - 1))) fail(errors);
            symcomm::st_release<Scope::Gpu>(token, mine + 1);
        } else {
            if (!wait_geq(go, k + 1)) fail(errors);
            symcomm::atomic_add_release<Scope::Gpu>(done, 1);
        }
    }
}
SYMCOMM_EMU_KERNEL(st_ring)

/// `rounds` tree reductions through shared memory per CTA (a power-of-two block up to 1024);
/// `*count` gets one per thread.
extern "C" __global__ void st_big(uint32_t rounds, unsigned long long* count, uint32_t* errors) {
    using namespace selftest;
    SYMCOMM_SHARED(uint32_t, part, 1024);
    const uint32_t n = block_threads(), t = linear_tid();
    for (uint32_t r = 0; r < rounds; ++r) {
        part[t] = t + r;
        __syncthreads();
        for (uint32_t s = n / 2; s > 0; s /= 2) {
            if (t < s) part[t] += part[t + s];
            __syncthreads();
        }
        if (t == 0 && part[0] != n * (n - 1) / 2 + n * r) fail(errors);
        __syncthreads();
    }
    atomicAdd(count, 1ull);
}
SYMCOMM_EMU_KERNEL(st_big)

/// Every atomic overload and the integer / bit-cast intrinsics: `o` accumulates the atomics of all
/// threads (the host sets identities first), `bits` gets kIntrinsicWords words per thread of
/// `inputs` and `bits64` 3 words per thread of `inputs64`.
extern "C" __global__ void st_intrinsics(selftest::AtomicsOut* o, const uint32_t* inputs, const uint64_t* inputs64,
                                         uint32_t* bits, uint64_t* bits64) {
    using namespace selftest;
    const uint32_t t = blockIdx.x * block_threads() + linear_tid();
    atomicAdd(&o->fsum, float(t) + 0.5f);
    atomicAdd(&o->dsum, double(t) * 0.25);
    atomicMax(&o->umax, t * 7u % 101u);
    atomicMin(&o->umin, t * 7u % 101u + 3u);
    atomicInc(&o->inc, 9u);
    atomicDec(&o->dec, 9u);
    atomicAnd(&o->and_bits, ~(1u << (t % 32u)));
    atomicOr(&o->or_bits, 1u << (t % 32u));
    atomicXor(&o->xor_bits, t * 2654435761u);
    atomicXor(&o->exch_returned, atomicExch(&o->exch, t + 1u));
    for (unsigned cur = 0;;) {  // an increment by compare-and-swap, from a guess
        const unsigned seen = atomicCAS(&o->cas_count, cur, cur + 1u);
        if (seen == cur) break;
        cur = seen;
    }
    atomicMax(&o->imax, int(t) - 50);
    atomicMin(&o->imin, int(t) - 50);
    atomicSub(&o->isub, int(t));
    atomicMax(&o->ullmax, 0xff00000000000000ull + t);
    atomicAdd(&o->ulladd, 1ull << 33);
    atomicMin(&o->llmin, -(long long)t * (1ll << 35));
    atomicMax(&o->llmax, (long long)t * (1ll << 35));

    const uint32_t x = __ldg(&inputs[t]);
    uint32_t* b = bits + t * kIntrinsicWords;
    b[0] = uint32_t(__popc(x));
    b[1] = uint32_t(__clz(int(x)));
    b[2] = uint32_t(__ffs(int(x)));
    b[3] = __brev(x);
    b[4] = __float_as_uint(__uint_as_float(x));
    b[5] = uint32_t(__float_as_int(__int_as_float(int(x))));
    b[6] = min(int(x), 1000u);  // CUDA's mixed overload compares as unsigned
    b[7] = uint32_t(max(int(x), -5));
    b[8] = __umulhi(x, 0x9e3779b9u);
    b[9] = uint32_t(__mulhi(int(x), -12345));
    const uint64_t y = inputs64[t];
    uint64_t* b64 = bits64 + t * 3;
    b64[0] = uint64_t(__popcll(y)) | uint64_t(__clzll((long long)y)) << 8 | uint64_t(__ffsll((long long)y)) << 16;
    b64[1] = __brevll(y);
    b64[2] = uint64_t(__double_as_longlong(__longlong_as_double((long long)y)));
}
SYMCOMM_EMU_KERNEL(st_intrinsics)

/// Sets `*ran`: the probe of refused launches (which must not run it).
extern "C" __global__ void st_flag(uint32_t* ran) { atomicExch(ran, 1u); }
SYMCOMM_EMU_KERNEL(st_flag)

// ---- Kernels with races that ThreadSanitizer must report -----------------------------------------

/// Thread 0 writes `*data` and publishes it with a relaxed store; thread 1 spins (yielding) on the
/// flag and reads `*data`: unordered on a GPU, whatever the emulator's fibers did in between.
extern "C" __global__ void st_race_yield(uint32_t* data, uint64_t* flag, uint32_t* out) {
    using namespace selftest;
    using symcomm::Scope;
    if (linear_tid() == 0) {
        for (int k = 0; k < 4; ++k) __nanosleep(100);
        *data = 42;
        symcomm::st_relaxed<Scope::Gpu>(flag, 1);
    } else if (linear_tid() == 1) {
        while (symcomm::ld_relaxed<Scope::Gpu>(flag) == 0) symcomm::backoff(32);
        *out = *data;
    }
}
SYMCOMM_EMU_KERNEL(st_race_yield)

/// Lane 0 writes `*data`, the warp shuffles, lane 1 reads `*data`: shuffles do not order memory.
extern "C" __global__ void st_race_shuffle(uint32_t* data, uint32_t* out) {
    const uint32_t lane = selftest::linear_tid() % 32u;
    if (lane == 0) *data = 7;
    const uint32_t v = __shfl_sync(0xffffffffu, lane, 0);
    if (lane == 1) *out = *data + v;
}
SYMCOMM_EMU_KERNEL(st_race_shuffle)

/// Thread 0 writes after a barrier and thread 1 reads before the next one: the barrier orders
/// neither access before the other, even when thread 0 reaches the next barrier first.
extern "C" __global__ void st_race_between_barriers(uint32_t* data, uint32_t* out) {
    const uint32_t t = selftest::linear_tid();
    __syncthreads();
    if (t == 0) *data = 1;
    if (t == 1) *out = *data;
    __syncthreads();
}
SYMCOMM_EMU_KERNEL(st_race_between_barriers)

/// Two CTAs write the same word.
extern "C" __global__ void st_race_ctas(uint32_t* data) {
    if (selftest::linear_tid() == 0) *data = blockIdx.x;
}
SYMCOMM_EMU_KERNEL(st_race_ctas)

// ---- Kernels that break the rules: the emulator must abort with a message -------------------------

/// Thread 5 returns while the others wait for it at __syncthreads().
extern "C" __global__ void st_die_early_return() {
    if (selftest::linear_tid() == 5) return;
    __syncthreads();
}
SYMCOMM_EMU_KERNEL(st_die_early_return)

/// Thread 0 returns before the others reach __syncthreads() (it runs first on the emulator).
extern "C" __global__ void st_die_return_before_barrier() {
    if (selftest::linear_tid() == 0) return;
    __syncthreads();
}
SYMCOMM_EMU_KERNEL(st_die_return_before_barrier)

/// Odd lanes call __syncwarp(), even lanes __shfl_sync().
extern "C" __global__ void st_die_warp_mismatch(uint32_t* out) {
    if (selftest::linear_tid() % 2u) {
        __syncwarp();
    } else {
        *out = __shfl_sync(0xffffffffu, 1u, 0);
    }
}
SYMCOMM_EMU_KERNEL(st_die_warp_mismatch)

/// A half-warp mask on a full warp.
extern "C" __global__ void st_die_bad_mask(uint32_t* out) { *out = __ballot_sync(0x0000ffffu, 1); }
SYMCOMM_EMU_KERNEL(st_die_bad_mask)

/// A partial warp (launch 20 threads) reads lane 16 + lane.
extern "C" __global__ void st_die_missing_lane(uint32_t* out) {
    const uint32_t t = selftest::linear_tid();
    out[t] = __shfl_xor_sync(__activemask(), t, 16);
}
SYMCOMM_EMU_KERNEL(st_die_missing_lane)

/// Lanes 0-15 wait at __syncwarp() for lanes that wait at __syncthreads() (launch 64 threads).
extern "C" __global__ void st_die_deadlock() {
    if (selftest::linear_tid() < 16) {
        __syncwarp();
    } else {
        __syncthreads();
    }
}
SYMCOMM_EMU_KERNEL(st_die_deadlock)

/// Recurses far beyond any fiber stack.
extern "C" __global__ void st_die_stack_overflow(uint32_t* out) { *out = selftest::deep_recursion(1u << 20); }
SYMCOMM_EMU_KERNEL(st_die_stack_overflow)

// symcomm device library: memory ordering primitives.
//
// Loads with acquire, stores with release, atomics, at `.gpu` scope (threads of one GPU) or `.sys`
// scope (every GPU and the host). Ranks sharing one GPU need only `Scope::Gpu`; ranks on different
// GPUs, or a flag the host writes, need `Scope::Sys`.
//
// Device: PTX `ld.acquire` / `st.release` / `atom.*` (sm_70+). Emulator: GCC `__atomic` builtins
// (seen by ThreadSanitizer); the scope is irrelevant on a CPU.
//
// Names carry the ordering: `ld_acquire`, `ld_relaxed`, `st_release`, `st_relaxed`, ... There is
// no default ordering.
#pragma once

#include <symcomm/config.cuh>

namespace symcomm {

/// Visibility scope of an ordered memory operation.
enum class Scope : int {
    /// Threads of the same GPU.
    Gpu,
    /// Every GPU of the system and the host.
    Sys,
};

/// Acquire load of a 64-bit word: memory operations after it (in this thread) cannot be reordered
/// before it, and it observes everything released before the store it reads from.
template <Scope S>
SYMCOMM_DEVICE uint64_t ld_acquire(const uint64_t* p) {
#if defined(SYMCOMM_EMU)
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#else
    uint64_t v;
    if constexpr (S == Scope::Gpu) {
        asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    } else {
        asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    }
    return v;
#endif
}

/// Acquire load of a 32-bit word (see the 64-bit form).
template <Scope S>
SYMCOMM_DEVICE uint32_t ld_acquire(const uint32_t* p) {
#if defined(SYMCOMM_EMU)
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#else
    uint32_t v;
    if constexpr (S == Scope::Gpu) {
        asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    } else {
        asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    }
    return v;
#endif
}

/// Relaxed (atomic, unordered) load of a 32-bit word: never torn, orders nothing.
template <Scope S>
SYMCOMM_DEVICE uint32_t ld_relaxed(const uint32_t* p) {
#if defined(SYMCOMM_EMU)
    return __atomic_load_n(p, __ATOMIC_RELAXED);
#else
    uint32_t v;
    if constexpr (S == Scope::Gpu) {
        asm volatile("ld.relaxed.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    } else {
        asm volatile("ld.relaxed.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    }
    return v;
#endif
}

/// Relaxed load of a 64-bit word.
template <Scope S>
SYMCOMM_DEVICE uint64_t ld_relaxed(const uint64_t* p) {
#if defined(SYMCOMM_EMU)
    return __atomic_load_n(p, __ATOMIC_RELAXED);
#else
    uint64_t v;
    if constexpr (S == Scope::Gpu) {
        asm volatile("ld.relaxed.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    } else {
        asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    }
    return v;
#endif
}

/// Release store of a 64-bit word: every memory operation this thread performed before it (and,
/// cumulatively, every write it observed, e.g. its CTA's writes ordered by `__syncthreads()`)
/// becomes visible to a thread that acquire-loads this value.
template <Scope S>
SYMCOMM_DEVICE void st_release(uint64_t* p, uint64_t v) {
#if defined(SYMCOMM_EMU)
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
#else
    if constexpr (S == Scope::Gpu) {
        asm volatile("st.release.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    } else {
        asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    }
#endif
}

/// Relaxed store of a 64-bit word: never torn, orders nothing.
template <Scope S>
SYMCOMM_DEVICE void st_relaxed(uint64_t* p, uint64_t v) {
#if defined(SYMCOMM_EMU)
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
#else
    if constexpr (S == Scope::Gpu) {
        asm volatile("st.relaxed.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    } else {
        asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    }
#endif
}

/// Relaxed store of a 32-bit word.
template <Scope S>
SYMCOMM_DEVICE void st_relaxed(uint32_t* p, uint32_t v) {
#if defined(SYMCOMM_EMU)
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
#else
    if constexpr (S == Scope::Gpu) {
        asm volatile("st.relaxed.gpu.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
    } else {
        asm volatile("st.relaxed.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
    }
#endif
}

/// Compare-and-swap of a 32-bit word with acquire-release ordering; returns the previous value
/// (the swap happened iff it equals `expected`).
template <Scope S>
SYMCOMM_DEVICE uint32_t atomic_cas_acq_rel(uint32_t* p, uint32_t expected, uint32_t desired) {
#if defined(SYMCOMM_EMU)
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return expected;
#else
    uint32_t old;
    if constexpr (S == Scope::Gpu) {
        asm volatile("atom.acq_rel.gpu.cas.b32 %0, [%1], %2, %3;"
                     : "=r"(old) : "l"(p), "r"(expected), "r"(desired) : "memory");
    } else {
        asm volatile("atom.acq_rel.sys.cas.b32 %0, [%1], %2, %3;"
                     : "=r"(old) : "l"(p), "r"(expected), "r"(desired) : "memory");
    }
    return old;
#endif
}

/// Atomic add of a 64-bit word with release ordering; returns the previous value.
template <Scope S>
SYMCOMM_DEVICE uint64_t atomic_add_release(uint64_t* p, uint64_t v) {
#if defined(SYMCOMM_EMU)
    return __atomic_fetch_add(p, v, __ATOMIC_RELEASE);
#else
    uint64_t old;
    if constexpr (S == Scope::Gpu) {
        asm volatile("atom.release.gpu.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    } else {
        asm volatile("atom.release.sys.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    }
    return old;
#endif
}

/// Atomic add of a 64-bit word with acquire-release ordering; returns the previous value. Use it
/// where the adding thread must also see what the earlier adders released (the last arrival of
/// `grid_sync` hands every CTA's writes on to the others).
template <Scope S>
SYMCOMM_DEVICE uint64_t atomic_add_acq_rel(uint64_t* p, uint64_t v) {
#if defined(SYMCOMM_EMU)
    return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
#else
    uint64_t old;
    if constexpr (S == Scope::Gpu) {
        asm volatile("atom.acq_rel.gpu.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    } else {
        asm volatile("atom.acq_rel.sys.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    }
    return old;
#endif
}

/// Nanoseconds of a clock shared by every SM of the GPU (`%globaltimer`; emulator: steady clock).
/// Its resolution is about a microsecond on current GPUs; use it for deadlines, not for timing.
SYMCOMM_DEVICE uint64_t globaltimer_ns() {
#if defined(SYMCOMM_EMU)
    return symcomm_emu_globaltimer_ns();
#else
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#endif
}

/// Back off for about `ns` nanoseconds inside a polling loop (emulator: yields the CPU).
SYMCOMM_DEVICE void backoff(unsigned ns) {
#if defined(SYMCOMM_EMU)
    (void)ns;
    symcomm_emu_yield();
#else
    __nanosleep(ns);
#endif
}

}  // namespace symcomm

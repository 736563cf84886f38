// nvcc / NVRTC definitions of <symcomm/memory.cuh> (chosen there unless SYMCOMM_EMU): PTX inline
// assembly, one instruction per operation, at the scope the template argument names.
#pragma once

namespace symcomm {

template <Scope S>
SYMCOMM_DEVICE uint64_t ld_acquire(const uint64_t* p) {
    uint64_t v;
    if constexpr (S == Scope::Gpu) {
        asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    } else {
        asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    }
    return v;
}

template <Scope S>
SYMCOMM_DEVICE uint32_t ld_acquire(const uint32_t* p) {
    uint32_t v;
    if constexpr (S == Scope::Gpu) {
        asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    } else {
        asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    }
    return v;
}

template <Scope S>
SYMCOMM_DEVICE uint32_t ld_relaxed(const uint32_t* p) {
    uint32_t v;
    if constexpr (S == Scope::Gpu) {
        asm volatile("ld.relaxed.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    } else {
        asm volatile("ld.relaxed.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    }
    return v;
}

template <Scope S>
SYMCOMM_DEVICE uint64_t ld_relaxed(const uint64_t* p) {
    uint64_t v;
    if constexpr (S == Scope::Gpu) {
        asm volatile("ld.relaxed.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    } else {
        asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    }
    return v;
}

template <Scope S>
SYMCOMM_DEVICE void st_release(uint64_t* p, uint64_t v) {
    if constexpr (S == Scope::Gpu) {
        asm volatile("st.release.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    } else {
        asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    }
}

template <Scope S>
SYMCOMM_DEVICE void st_relaxed(uint64_t* p, uint64_t v) {
    if constexpr (S == Scope::Gpu) {
        asm volatile("st.relaxed.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    } else {
        asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    }
}

template <Scope S>
SYMCOMM_DEVICE void st_relaxed(uint32_t* p, uint32_t v) {
    if constexpr (S == Scope::Gpu) {
        asm volatile("st.relaxed.gpu.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
    } else {
        asm volatile("st.relaxed.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
    }
}

template <Scope S>
SYMCOMM_DEVICE uint32_t atomic_cas_acq_rel(uint32_t* p, uint32_t expected, uint32_t desired) {
    uint32_t old;
    if constexpr (S == Scope::Gpu) {
        asm volatile("atom.acq_rel.gpu.cas.b32 %0, [%1], %2, %3;"
                     : "=r"(old) : "l"(p), "r"(expected), "r"(desired) : "memory");
    } else {
        asm volatile("atom.acq_rel.sys.cas.b32 %0, [%1], %2, %3;"
                     : "=r"(old) : "l"(p), "r"(expected), "r"(desired) : "memory");
    }
    return old;
}

template <Scope S>
SYMCOMM_DEVICE uint64_t atomic_add_release(uint64_t* p, uint64_t v) {
    uint64_t old;
    if constexpr (S == Scope::Gpu) {
        asm volatile("atom.release.gpu.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    } else {
        asm volatile("atom.release.sys.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    }
    return old;
}

template <Scope S>
SYMCOMM_DEVICE uint64_t atomic_add_acq_rel(uint64_t* p, uint64_t v) {
    uint64_t old;
    if constexpr (S == Scope::Gpu) {
        asm volatile("atom.acq_rel.gpu.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    } else {
        asm volatile("atom.acq_rel.sys.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    }
    return old;
}

SYMCOMM_DEVICE void ll_store(LlLine* p, uint64_t half0, uint64_t half1) {
    asm volatile("st.volatile.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(uint32_t(half0)),
                 "r"(uint32_t(half0 >> 32)), "r"(uint32_t(half1)), "r"(uint32_t(half1 >> 32))
                 : "memory");
}

SYMCOMM_DEVICE void ll_load(const LlLine* p, uint64_t& half0, uint64_t& half1) {
    uint32_t a, b, c, d;
    asm volatile("ld.volatile.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p) : "memory");
    half0 = (uint64_t(b) << 32) | a;
    half1 = (uint64_t(d) << 32) | c;
}

SYMCOMM_DEVICE uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

SYMCOMM_DEVICE void backoff(unsigned ns) { __nanosleep(ns); }

}  // namespace symcomm

// Emulator definitions of <symcomm/memory.cuh> (chosen there under SYMCOMM_EMU): GCC `__atomic`
// builtins, which ThreadSanitizer sees. Every scope is the same on a CPU.
#pragma once

namespace symcomm {

template <Scope S>
SYMCOMM_DEVICE uint64_t ld_acquire(const uint64_t* p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

template <Scope S>
SYMCOMM_DEVICE uint32_t ld_acquire(const uint32_t* p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

template <Scope S>
SYMCOMM_DEVICE uint32_t ld_relaxed(const uint32_t* p) {
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

template <Scope S>
SYMCOMM_DEVICE uint64_t ld_relaxed(const uint64_t* p) {
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

template <Scope S>
SYMCOMM_DEVICE void st_release(uint64_t* p, uint64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

template <Scope S>
SYMCOMM_DEVICE void st_relaxed(uint64_t* p, uint64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

template <Scope S>
SYMCOMM_DEVICE void st_relaxed(uint32_t* p, uint32_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

template <Scope S>
SYMCOMM_DEVICE uint32_t atomic_cas_acq_rel(uint32_t* p, uint32_t expected, uint32_t desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return expected;
}

template <Scope S>
SYMCOMM_DEVICE uint64_t atomic_add_release(uint64_t* p, uint64_t v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELEASE);
}

template <Scope S>
SYMCOMM_DEVICE uint64_t atomic_add_acq_rel(uint64_t* p, uint64_t v) {
    return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
}

SYMCOMM_DEVICE void ll_store(LlLine* p, uint64_t half0, uint64_t half1) {
    __atomic_store_n(&p->half[0], half0, __ATOMIC_RELAXED);
    __atomic_store_n(&p->half[1], half1, __ATOMIC_RELAXED);
}

SYMCOMM_DEVICE void ll_load(const LlLine* p, uint64_t& half0, uint64_t& half1) {
    half0 = __atomic_load_n(&p->half[0], __ATOMIC_RELAXED);
    half1 = __atomic_load_n(&p->half[1], __ATOMIC_RELAXED);
}

SYMCOMM_DEVICE uint64_t globaltimer_ns() { return symcomm_emu_globaltimer_ns(); }

SYMCOMM_DEVICE void backoff(unsigned ns) {
    (void)ns;
    symcomm_emu_yield();
}

}  // namespace symcomm

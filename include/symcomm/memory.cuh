// symcomm device library: memory ordering primitives.
//
// Loads with acquire, stores with release, atomics, at `.gpu` scope (threads of one GPU) or `.sys`
// scope (every GPU and the host). Ranks sharing one GPU need only `Scope::Gpu`; ranks on different
// GPUs, or a flag the host writes, need `Scope::Sys`.
//
// Device: PTX `ld.acquire` / `st.release` / `atom.*` (sm_70+; impl/memory_ptx.cuh). Emulator:
// GCC `__atomic` builtins (seen by ThreadSanitizer; impl/memory_emu.cuh); the scope is irrelevant
// on a CPU.
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
SYMCOMM_DEVICE uint64_t ld_acquire(const uint64_t* p);

/// Acquire load of a 32-bit word (see the 64-bit form).
template <Scope S>
SYMCOMM_DEVICE uint32_t ld_acquire(const uint32_t* p);

/// Relaxed (atomic, unordered) load of a 32-bit word: never torn, orders nothing.
template <Scope S>
SYMCOMM_DEVICE uint32_t ld_relaxed(const uint32_t* p);

/// Relaxed load of a 64-bit word.
template <Scope S>
SYMCOMM_DEVICE uint64_t ld_relaxed(const uint64_t* p);

/// Release store of a 64-bit word: every memory operation this thread performed before it (and,
/// cumulatively, every write it observed, e.g. its CTA's writes ordered by `__syncthreads()`)
/// becomes visible to a thread that acquire-loads this value.
template <Scope S>
SYMCOMM_DEVICE void st_release(uint64_t* p, uint64_t v);

/// Relaxed store of a 64-bit word: never torn, orders nothing.
template <Scope S>
SYMCOMM_DEVICE void st_relaxed(uint64_t* p, uint64_t v);

/// Relaxed store of a 32-bit word.
template <Scope S>
SYMCOMM_DEVICE void st_relaxed(uint32_t* p, uint32_t v);

/// Compare-and-swap of a 32-bit word with acquire-release ordering; returns the previous value
/// (the swap happened iff it equals `expected`).
template <Scope S>
SYMCOMM_DEVICE uint32_t atomic_cas_acq_rel(uint32_t* p, uint32_t expected, uint32_t desired);

/// Atomic add of a 64-bit word with release ordering; returns the previous value.
template <Scope S>
SYMCOMM_DEVICE uint64_t atomic_add_release(uint64_t* p, uint64_t v);

/// Atomic add of a 64-bit word with acquire-release ordering; returns the previous value. Use it
/// where the adding thread must also see what the earlier adders released (the last arrival of
/// `grid_sync` hands every CTA's writes on to the others).
template <Scope S>
SYMCOMM_DEVICE uint64_t atomic_add_acq_rel(uint64_t* p, uint64_t v);

/// One 16-byte line of the low-latency protocol (abi.h, SYMCOMM_LL_LINES): two 8-byte halves, each
/// 4 data bytes (bits 0..31) and a flag (bits 32..63). 16-byte aligned.
struct alignas(16) LlLine {
    uint64_t half[2];
};

/// Stores both halves of a line with one 16-byte store (`st.volatile.v4.u32`: relaxed, system
/// scope, never cached in L1; emulator: each half an 8-byte relaxed atomic store). Only each
/// 8-byte half is single-copy atomic (a reader may see one half new and the other old), which is
/// why every half carries its own flag. Orders nothing.
SYMCOMM_DEVICE void ll_store(LlLine* p, uint64_t half0, uint64_t half1);

/// Loads both halves of a line (`ld.volatile.v4.u32`; emulator: two 8-byte relaxed atomic loads).
/// Each half is read atomically; the two may come from different stores.
SYMCOMM_DEVICE void ll_load(const LlLine* p, uint64_t& half0, uint64_t& half1);

/// Nanoseconds of a clock shared by every SM of the GPU (`%globaltimer`; emulator: steady clock).
/// Its resolution is about a microsecond on current GPUs; use it for deadlines, not for timing.
SYMCOMM_DEVICE uint64_t globaltimer_ns();

/// Back off for about `ns` nanoseconds inside a polling loop (emulator: yields the CPU).
SYMCOMM_DEVICE void backoff(unsigned ns);

}  // namespace symcomm

#if defined(SYMCOMM_EMU)
#include <symcomm/impl/memory_emu.cuh>
#else
#include <symcomm/impl/memory_ptx.cuh>
#endif

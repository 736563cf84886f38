// symcomm CPU emulator: the CUDA shim, force-included (`-include symcomm_emu.h`) into every `.cu`
// file compiled for the emulator with the host C++ compiler and `-DSYMCOMM_EMU`.
//
// It maps the CUDA features the device library and its kernels use onto the emulator runtime
// (runtime.cpp), which runs every thread of every CTA of a launch as its own OS thread, so that
// spin-waits between CTAs and between ranks make progress as they do on a GPU (co-residency).
// What is supported is listed in device/emu/README.md; anything else must fail to compile here,
// never misbehave silently.
#pragma once
#define SYMCOMM_EMU_SHIM_INCLUDED 1

#if !defined(SYMCOMM_EMU)
#error "symcomm_emu.h is for emulator builds (-DSYMCOMM_EMU)"
#endif

#include <stddef.h>
#include <stdint.h>

#include <utility>

// ---- Types ---------------------------------------------------------------------------------
struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};

// ---- Runtime interface (runtime.cpp) ---------------------------------------------------------
/// Per-thread launch coordinates of the emulated GPU thread running on this OS thread.
struct SymcommEmuThread {
    uint3 thread_idx;
    uint3 block_idx;
    dim3 block_dim;
    dim3 grid_dim;
    void* cta;  // runtime-private CTA state (barriers)
};

extern "C" {
/// The calling OS thread's emulated GPU thread; null outside a kernel.
SymcommEmuThread* symcomm_emu_current(void);
/// `__syncthreads()`: waits for every thread of the calling CTA.
void symcomm_emu_syncthreads(void);
/// `__syncwarp(mask)`: waits for the threads of the calling warp. Only the full mask of the warp
/// is supported; another mask traps with a message.
void symcomm_emu_syncwarp(unsigned int mask);
/// `%globaltimer`: nanoseconds of a steady clock.
uint64_t symcomm_emu_globaltimer_ns(void);
/// `__nanosleep`: yields the CPU (spin loops must let other emulated threads run).
void symcomm_emu_yield(void);
/// `__trap()`: reports and aborts the process.
[[noreturn]] void symcomm_emu_trap(const char* file, int line);
}

// ---- Qualifiers --------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
// Not supported yet (device-API issue): static shared memory. A compile error, not a misbehaviour.
#define __shared__ _Pragma("GCC error \"__shared__ is not supported by the symcomm emulator yet\"")
#define __constant__ _Pragma("GCC error \"__constant__ is not supported by the symcomm emulator\"")

// ---- Built-in variables ------------------------------------------------------------------------
#define threadIdx (symcomm_emu_current()->thread_idx)
#define blockIdx (symcomm_emu_current()->block_idx)
#define blockDim (symcomm_emu_current()->block_dim)
#define gridDim (symcomm_emu_current()->grid_dim)
#define warpSize 32

// ---- Synchronization ---------------------------------------------------------------------------
inline void __syncthreads() { symcomm_emu_syncthreads(); }
inline void __syncwarp(unsigned int mask = 0xffffffffu) { symcomm_emu_syncwarp(mask); }
inline void __nanosleep(unsigned int) { symcomm_emu_yield(); }
#define __trap() symcomm_emu_trap(__FILE__, __LINE__)
// Fences are sequentially consistent C++ fences. ThreadSanitizer does not model stand-alone
// fences, so the device library orders through acquire/release operations instead.
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_block() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_system() __atomic_thread_fence(__ATOMIC_SEQ_CST)

// ---- Atomics (CUDA atomics are relaxed) ----------------------------------------------------------
template <typename T>
inline T atomicAdd(T* p, T v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
template <typename T>
inline T atomicSub(T* p, T v) {
    return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED);
}
template <typename T>
inline T atomicExch(T* p, T v) {
    return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
}
template <typename T>
inline T atomicMax(T* p, T v) {
    T cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (cur < v && !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return cur;
}
template <typename T>
inline T atomicMin(T* p, T v) {
    T cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (cur > v && !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return cur;
}
template <typename T>
inline T atomicCAS(T* p, T expected, T desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return expected;
}

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

// symcomm device library: compiler detection and common macros.
//
// Three compilers see these headers:
//   - nvcc (host and device passes) and NVRTC: `__CUDACC__` (NVRTC also `__CUDACC_RTC__`);
//     device code uses PTX inline assembly.
//   - the host C++ compiler for the CPU emulator: `SYMCOMM_EMU` defined and `symcomm_emu.h`
//     force-included (`-include symcomm_emu.h`); device code uses C++ atomics.
#pragma once

#include <symcomm/abi.h>

#if defined(SYMCOMM_EMU)
#if !defined(SYMCOMM_EMU_SHIM_INCLUDED)
#error "emulator builds must force-include symcomm_emu.h (the symcomm build helper does this)"
#endif
#elif !defined(__CUDACC__)
#error "symcomm device headers need nvcc, NVRTC, or an emulator build (SYMCOMM_EMU)"
#endif

/// Qualifier of every device-library function: inlined into the calling kernel.
#if defined(SYMCOMM_EMU)
#define SYMCOMM_DEVICE inline __attribute__((always_inline))
#else
#define SYMCOMM_DEVICE __device__ __forceinline__
#endif

/// Qualifier of device-library functions that are large and called from many places (barriers,
/// the bounded wait, per-item reductions): kept out of line so that kernels instantiating many
/// collectives stay small and fast to compile (ptxas time grows faster than linearly with size).
#if defined(SYMCOMM_EMU)
#define SYMCOMM_DEVICE_NOINLINE __attribute__((noinline))
#else
#define SYMCOMM_DEVICE_NOINLINE __device__ __noinline__
#endif

/// `SYMCOMM_UNROLL` before a loop with a trip count known at compile time: `#pragma unroll` under
/// nvcc / NVRTC (so that an array indexed by the loop variable stays in registers), nothing in
/// emulator builds (the host compiler would warn about an unknown pragma).
#if !defined(SYMCOMM_UNROLL)
#if defined(SYMCOMM_EMU)
#define SYMCOMM_UNROLL
#else
#define SYMCOMM_UNROLL _Pragma("unroll")
#endif
#endif

/// Marks a kernel for the emulator: generates the `symcomm_emu_entry_<name>` entry point through
/// which the emulator runtime calls it with cuLaunchKernel-style `void** args`. Expands to nothing
/// under nvcc / NVRTC. Write it once after each `extern "C" __global__` kernel definition.
#if !defined(SYMCOMM_EMU)
#define SYMCOMM_EMU_KERNEL(name)
#endif

/// `SYMCOMM_SHARED(type, name, count)` declares `name`, an array of `count` `type`s in shared
/// memory, one per CTA: `__shared__ type name[count]` under nvcc / NVRTC. Plain `__shared__` is a
/// compile error in emulator builds (C++ has no per-CTA storage); this is the portable spelling.
/// Function scope only (in a kernel or a device function it calls); `type` must be trivial. The
/// emulator zero-initialises the array and aligns it to max(alignof(type), 16); CUDA leaves it
/// uninitialised, so kernels must not rely on the zeros.
///
/// `SYMCOMM_DYNAMIC_SHARED(type, name)` declares `name`, a `type*` to the CTA's dynamic shared
/// memory (the launch's shared-memory bytes), 16-byte aligned; every use names the same bytes.
/// Under nvcc / NVRTC it is a `type*` into one `extern __shared__` byte array, so that kernels
/// of one file may view the dynamic shared memory as different types.
#if defined(SYMCOMM_EMU)
#define SYMCOMM_SHARED(type, name, count)                                                             \
    static_assert(std::is_trivially_default_constructible<type>::value &&                             \
                      std::is_trivially_destructible<type>::value,                                    \
                  "shared memory holds trivial types only");                                          \
    static const char symcomm_emu_shared_site_##name = 0;                                             \
    type(&name)[count] = *static_cast<type(*)[count]>(                                                \
        symcomm_emu_shared_static(&symcomm_emu_shared_site_##name, sizeof(type[count]), alignof(type)))
#define SYMCOMM_DYNAMIC_SHARED(type, name)                                                            \
    static_assert(alignof(type) <= 16, "dynamic shared memory is 16-byte aligned");                  \
    type* const name = static_cast<type*>(symcomm_emu_shared_dynamic())
#else
#define SYMCOMM_SHARED(type, name, count) __shared__ type name[count]
#define SYMCOMM_DYNAMIC_SHARED(type, name)                                                            \
    extern __shared__ __align__(16) unsigned char symcomm_dynamic_shared_[];                          \
    type* const name = reinterpret_cast<type*>(symcomm_dynamic_shared_)
#endif

namespace symcomm {
namespace detail {

/// Whether rank `rank` runs on this host, by the table `ranks` (the `ranks` field of DevComm and
/// WindowHandleRaw): always when the table is 0 (every rank on this host), else unless its entry
/// is SYMCOMM_RANK_REMOTE. Pre: rank < nranks.
SYMCOMM_DEVICE bool on_this_host(uint64_t ranks, uint32_t rank) {
    return ranks == 0 || reinterpret_cast<const uint32_t*>(ranks)[rank] != SYMCOMM_RANK_REMOTE;
}

}  // namespace detail
}  // namespace symcomm

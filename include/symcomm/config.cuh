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

/// Marks a kernel for the emulator: generates the `symcomm_emu_entry_<name>` entry point through
/// which the emulator runtime calls it with cuLaunchKernel-style `void** args`. Expands to nothing
/// under nvcc / NVRTC. Write it once after each `extern "C" __global__` kernel definition.
#if !defined(SYMCOMM_EMU)
#define SYMCOMM_EMU_KERNEL(name)
#endif

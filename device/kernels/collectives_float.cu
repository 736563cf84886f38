// Built-in collective kernels, one per element type (see collective_kernel.cuh).
#include "collective_kernel.cuh"

SYMCOMM_COLLECTIVE_KERNEL(f32, float)
SYMCOMM_EMU_KERNEL(symcomm_collective_f32)
SYMCOMM_COLLECTIVE_KERNEL(f64, double)
SYMCOMM_EMU_KERNEL(symcomm_collective_f64)
SYMCOMM_COLLECTIVE_KERNEL(f16, half_t)
SYMCOMM_EMU_KERNEL(symcomm_collective_f16)
SYMCOMM_COLLECTIVE_KERNEL(bf16, bfloat16_t)
SYMCOMM_EMU_KERNEL(symcomm_collective_bf16)

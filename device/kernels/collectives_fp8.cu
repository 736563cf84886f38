// Built-in collective kernels, one per element type (see collective_kernel.cuh).
#include "collective_kernel.cuh"

SYMCOMM_COLLECTIVE_KERNEL(fp8_e4m3, fp8_e4m3_t)
SYMCOMM_EMU_KERNEL(symcomm_collective_fp8_e4m3)
SYMCOMM_COLLECTIVE_KERNEL(fp8_e5m2, fp8_e5m2_t)
SYMCOMM_EMU_KERNEL(symcomm_collective_fp8_e5m2)

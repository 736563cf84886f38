// Built-in collective kernels, one per element type (see collective_kernel.cuh).
#include "collective_kernel.cuh"

SYMCOMM_COLLECTIVE_KERNEL(i8, signed char)
SYMCOMM_EMU_KERNEL(symcomm_collective_i8)
SYMCOMM_COLLECTIVE_KERNEL(u8, unsigned char)
SYMCOMM_EMU_KERNEL(symcomm_collective_u8)
SYMCOMM_COLLECTIVE_KERNEL(i32, int)
SYMCOMM_EMU_KERNEL(symcomm_collective_i32)
SYMCOMM_COLLECTIVE_KERNEL(u32, unsigned int)
SYMCOMM_EMU_KERNEL(symcomm_collective_u32)
SYMCOMM_COLLECTIVE_KERNEL(i64, long long)
SYMCOMM_EMU_KERNEL(symcomm_collective_i64)
SYMCOMM_COLLECTIVE_KERNEL(u64, unsigned long long)
SYMCOMM_EMU_KERNEL(symcomm_collective_u64)

// The built-in collective kernel for unsigned int (see collective_kernel.cuh). One file per element
// type: builds compile them in parallel, and a test build that calls one type (the
// ThreadSanitizer suite's planted bugs, say) compiles only that one.
#include "collective_kernel.cuh"

SYMCOMM_COLLECTIVE_KERNEL(u32, unsigned int)
SYMCOMM_EMU_KERNEL(symcomm_collective_u32)

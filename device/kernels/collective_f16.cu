// The built-in collective kernel for half_t (see collective_kernel.cuh). One file per element
// type: builds compile them in parallel, and a test build that calls one type (the
// ThreadSanitizer suite's planted bugs, say) compiles only that one.
#include "collective_kernel.cuh"

SYMCOMM_COLLECTIVE_KERNEL(f16, half_t)
SYMCOMM_EMU_KERNEL(symcomm_collective_f16)

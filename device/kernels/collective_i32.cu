// The built-in collective kernel for int (see collective_kernel.cuh). One file per element
// type: builds compile them in parallel, and a test build that calls one type (the
// ThreadSanitizer suite's planted bugs, say) compiles only that one.
#include "collective_kernel.cuh"

SYMCOMM_COLLECTIVE_KERNEL(i32, int)
SYMCOMM_EMU_KERNEL(symcomm_collective_i32)

// The built-in collective kernel for long long (see collective_kernel.cuh). One file per element
// type: builds compile them in parallel, and a test build that calls one type (the
// ThreadSanitizer suite's planted bugs, say) compiles only that one.
#include "collective_kernel.cuh"

SYMCOMM_COLLECTIVE_KERNEL(i64, long long)
SYMCOMM_EMU_KERNEL(symcomm_collective_i64)

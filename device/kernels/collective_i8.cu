// The built-in collective kernel for signed char (see collective_kernel.cuh). One file per element
// type: builds compile them in parallel, and a test build that calls one type (the
// ThreadSanitizer suite's planted bugs, say) compiles only that one.
#include "collective_kernel.cuh"

SYMCOMM_COLLECTIVE_KERNEL(i8, signed char)
SYMCOMM_EMU_KERNEL(symcomm_collective_i8)

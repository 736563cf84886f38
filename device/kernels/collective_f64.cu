// The built-in collective kernel for double (see collective_kernel.cuh). One file per element
// type: a build compiles each on its own, and a process that compiles at run time (NVRTC) or
// loads modules on first use takes only the types it calls.
#include "collective_kernel.cuh"

SYMCOMM_COLLECTIVE_KERNEL(f64, double)
SYMCOMM_EMU_KERNEL(symcomm_collective_f64)

// symcomm_rs_collective_u32: the C ABI's collective on unsigned int elements (see ffi.cuh).
#include "ffi.cuh"

SYMCOMM_RS_COLLECTIVE(u32, unsigned int)

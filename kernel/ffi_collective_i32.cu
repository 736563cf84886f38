// symcomm_rs_collective_i32: the C ABI's collective on int elements (see ffi.cuh).
#include "ffi.cuh"

SYMCOMM_RS_COLLECTIVE(i32, int)

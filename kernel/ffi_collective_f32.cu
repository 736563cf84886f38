// symcomm_rs_collective_f32: the C ABI's collective on float elements (see ffi.cuh).
#include "ffi.cuh"

SYMCOMM_RS_COLLECTIVE(f32, float)

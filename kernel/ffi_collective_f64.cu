// symcomm_rs_collective_f64: the C ABI's collective on double elements (see ffi.cuh).
#include "ffi.cuh"

SYMCOMM_RS_COLLECTIVE(f64, double)

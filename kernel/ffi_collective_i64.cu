// symcomm_rs_collective_i64: the C ABI's collective on long long elements (see ffi.cuh).
#include "ffi.cuh"

SYMCOMM_RS_COLLECTIVE(i64, long long)

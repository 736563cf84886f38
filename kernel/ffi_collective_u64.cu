// symcomm_rs_collective_u64: the C ABI's collective on unsigned long long elements (see ffi.cuh).
#include "ffi.cuh"

SYMCOMM_RS_COLLECTIVE(u64, unsigned long long)

// symcomm_rs_collective_f16: the C ABI's collective on half_t elements (see ffi.cuh).
#include "ffi.cuh"

SYMCOMM_RS_COLLECTIVE(f16, symcomm::half_t)

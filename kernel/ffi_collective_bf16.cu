// symcomm_rs_collective_bf16: the C ABI's collective on bfloat16_t elements (see ffi.cuh).
#include "ffi.cuh"

SYMCOMM_RS_COLLECTIVE(bf16, symcomm::bfloat16_t)

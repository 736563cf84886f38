// The reference side of the numerics oracle (device/tests/numerics.rs): NVIDIA's own conversions
// from the pinned toolkit's cuda_fp16.h / cuda_bf16.h / cuda_fp8.h, compiled as plain host C++
// (g++, no __CUDACC__), i.e. NVIDIA's host implementations. Built with `-Ihost_stub` for the
// missing <nv/target> (see host_stub/nv/target).
//
// Its own translation unit: NVIDIA's headers and the emulator shim both define `dim3`/`uint3`
// and the CUDA qualifiers, so they cannot meet in one file. oracle_symcomm.cpp calls these.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <stddef.h>
#include <stdint.h>

extern "C" {

/// x[i] -> f16 (`__float2half_rn`), bf16 (`__float2bfloat16_rn`), fp8 e4m3 / e5m2
/// (`__nv_cvt_float_to_fp8(x, __NV_SATFINITE, kind)`), as raw bits.
void nv_from_float(const float* x, size_t n, uint16_t* f16, uint16_t* bf16, uint8_t* e4m3, uint8_t* e5m2) {
    for (size_t i = 0; i < n; ++i) {
        f16[i] = __half_raw(__float2half_rn(x[i])).x;
        bf16[i] = __nv_bfloat16_raw(__float2bfloat16_rn(x[i])).x;
        e4m3[i] = __nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, __NV_E4M3);
        e5m2[i] = __nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, __NV_E5M2);
    }
}

/// binary16 bits -> float (`__half2float`).
float nv_half_to_float(uint16_t bits) {
    __half_raw r;
    r.x = bits;
    return __half2float(__half(r));
}

/// bfloat16 bits -> float (`__bfloat162float`).
float nv_bf16_to_float(uint16_t bits) {
    __nv_bfloat16_raw r;
    r.x = bits;
    return __bfloat162float(__nv_bfloat16(r));
}

/// FP8 E4M3 bits -> float (`__nv_fp8_e4m3::operator float`).
float nv_e4m3_to_float(uint8_t bits) {
    __nv_fp8_e4m3 v;
    v.__x = bits;
    return float(v);
}

/// FP8 E5M2 bits -> float (`__nv_fp8_e5m2::operator float`).
float nv_e5m2_to_float(uint8_t bits) {
    __nv_fp8_e5m2 v;
    v.__x = bits;
    return float(v);
}

}  // extern "C"

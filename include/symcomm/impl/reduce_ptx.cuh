// nvcc / NVRTC definitions of load_pack / store_pack of <symcomm/reduce.cuh> (chosen at the end
// of impl/reduce.cuh unless SYMCOMM_EMU): one `uint4` access each (`ld.v4.u32` / `st.v4.u32`).
#pragma once

namespace symcomm {

template <typename T>
SYMCOMM_DEVICE Pack16<T> load_pack(const T* p) {
    Pack16<T> r;
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    r.w[0] = v.x;
    r.w[1] = v.y;
    r.w[2] = v.z;
    r.w[3] = v.w;
    return r;
}

template <typename T>
SYMCOMM_DEVICE void store_pack(T* p, const Pack16<T>& v) {
    *reinterpret_cast<uint4*>(p) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
}

}  // namespace symcomm

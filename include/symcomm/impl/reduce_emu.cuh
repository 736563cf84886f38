// Emulator definitions of load_pack / store_pack of <symcomm/reduce.cuh> (chosen at the end of
// impl/reduce.cuh under SYMCOMM_EMU): 16-byte copies.
#pragma once

namespace symcomm {

template <typename T>
SYMCOMM_DEVICE Pack16<T> load_pack(const T* p) {
    Pack16<T> r;
    __builtin_memcpy(&r, p, sizeof r);
    return r;
}

template <typename T>
SYMCOMM_DEVICE void store_pack(T* p, const Pack16<T>& v) {
    __builtin_memcpy(p, &v, sizeof v);
}

}  // namespace symcomm

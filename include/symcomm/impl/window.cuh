// Inline definitions of <symcomm/window.cuh> (included at its end).
#pragma once

namespace symcomm {

SYMCOMM_DEVICE void* peer_ptr(const WindowHandleRaw& win, uint32_t peer, uint64_t offset) {
    return reinterpret_cast<void*>(win.base + peer * win.stride + offset);
}

template <typename T>
SYMCOMM_DEVICE WindowHandle<T>::WindowHandle(const WindowHandleRaw& r) : raw(r) {}

template <typename T>
SYMCOMM_DEVICE T* WindowHandle<T>::peer_ptr(uint32_t peer, uint64_t index) const {
    return reinterpret_cast<T*>(raw.base + peer * raw.stride + index * sizeof(T));
}

template <typename T>
SYMCOMM_DEVICE bool WindowHandle<T>::on_this_host(uint32_t peer) const {
    return detail::on_this_host(raw.ranks, peer);
}

template <typename T>
SYMCOMM_DEVICE T* WindowHandle<T>::local_ptr(uint64_t index) const {
    return peer_ptr(raw.rank, index);
}

template <typename T>
SYMCOMM_DEVICE uint64_t WindowHandle<T>::count() const {
    return raw.bytes / sizeof(T);
}

template <typename T>
SYMCOMM_DEVICE uint32_t WindowHandle<T>::nranks() const {
    return raw.nranks;
}

template <typename T>
SYMCOMM_DEVICE uint32_t WindowHandle<T>::rank() const {
    return raw.rank;
}

template <typename T>
SYMCOMM_DEVICE bool WindowHandle<T>::holds() const {
    return raw.elem_size == sizeof(T) || raw.elem_size == 1;
}

template <typename T>
SYMCOMM_DEVICE bool WindowHandle<T>::holds_dtype(uint32_t dtype) const {
    return raw.dtype == SYMCOMM_DTYPE_NONE || raw.dtype == dtype;
}

template <typename T>
SYMCOMM_DEVICE bool WindowHandle<T>::fits(uint64_t index, uint64_t n, uint64_t blocks) const {
    if (n == 0 || blocks == 0) return true;
    const uint64_t cap = count();
    if (n > cap / blocks) return false;
    return index <= cap && n * blocks <= cap - index;
}

template <typename T>
SYMCOMM_DEVICE WindowSlice<T> WindowHandle<T>::at(uint64_t offset) const {
    return WindowSlice<T>{*this, offset};
}

template <typename T>
SYMCOMM_DEVICE T* WindowSlice<T>::peer_ptr(uint32_t peer, uint64_t i) const {
    return window.peer_ptr(peer, offset + i);
}

template <typename T>
SYMCOMM_DEVICE T* WindowSlice<T>::local_ptr(uint64_t i) const {
    return window.local_ptr(offset + i);
}

template <typename T>
SYMCOMM_DEVICE WindowSlice<T> WindowSlice<T>::at(uint64_t i) const {
    return WindowSlice{window, offset + i};
}

template <typename T>
SYMCOMM_DEVICE uint32_t WindowSlice<T>::nranks() const {
    return window.nranks();
}

template <typename T>
SYMCOMM_DEVICE bool WindowSlice<T>::holds() const {
    return window.holds();
}

template <typename T>
SYMCOMM_DEVICE bool WindowSlice<T>::holds_dtype(uint32_t dtype) const {
    return window.holds_dtype(dtype);
}

template <typename T>
SYMCOMM_DEVICE bool WindowSlice<T>::fits(uint64_t n, uint64_t blocks) const {
    return window.fits(offset, n, blocks);
}

}  // namespace symcomm

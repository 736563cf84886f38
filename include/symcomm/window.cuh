// symcomm device library: addressing symmetric windows.
//
// A window is symmetric memory: every rank has a copy of the same size, and every rank can load
// and store every copy. Flat layout: rank r's copy starts at `base + r * stride`, so a peer
// address is one multiply-add.
#pragma once

#include <symcomm/config.cuh>

namespace symcomm {

/// Address of byte `offset` in rank `peer`'s copy of the window (flat layout: one multiply-add).
/// Pre: peer < win.nranks, offset <= win.bytes. Any thread may call it.
SYMCOMM_DEVICE void* peer_ptr(const WindowHandleRaw& win, uint32_t peer, uint64_t offset) {
    return reinterpret_cast<void*>(win.base + peer * win.stride + offset);
}

/// A window of elements of type `T` (the typed view of `WindowHandleRaw`, which is what kernels
/// receive from the host). Plain data; pass it by value.
template <typename T>
struct WindowHandle {
    WindowHandleRaw raw;

    SYMCOMM_DEVICE explicit WindowHandle(const WindowHandleRaw& r) : raw(r) {}

    /// Element `index` of rank `peer`'s copy. Pre: peer < nranks(), index <= count().
    SYMCOMM_DEVICE T* peer_ptr(uint32_t peer, uint64_t index) const {
        return reinterpret_cast<T*>(raw.base + peer * raw.stride + index * sizeof(T));
    }
    /// Element `index` of this rank's copy.
    SYMCOMM_DEVICE T* local_ptr(uint64_t index) const { return peer_ptr(raw.rank, index); }
    /// Elements per rank.
    SYMCOMM_DEVICE uint64_t count() const { return raw.bytes / sizeof(T); }
    /// Ranks sharing the window.
    SYMCOMM_DEVICE uint32_t nranks() const { return raw.nranks; }
    /// The rank this handle belongs to.
    SYMCOMM_DEVICE uint32_t rank() const { return raw.rank; }
};

}  // namespace symcomm

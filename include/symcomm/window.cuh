// symcomm device library: addressing symmetric windows.
#pragma once

#include <symcomm/config.cuh>

namespace symcomm {

/// Address of byte `offset` in rank `peer`'s copy of the window (flat layout: one multiply-add).
/// Pre: peer < win.nranks, offset <= win.bytes. Any thread may call it.
SYMCOMM_DEVICE void* peer_ptr(const WindowHandleRaw& win, uint32_t peer, uint64_t offset) {
    return reinterpret_cast<void*>(win.base + peer * win.stride + offset);
}


}  // namespace symcomm

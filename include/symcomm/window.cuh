// symcomm device library: addressing symmetric windows.
//
// A window is symmetric memory: every rank has a copy of the same size, and every rank can load
// and store every copy on its host. Flat layout: rank r's copy starts at `base + r * stride`, so
// a peer address is one multiply-add. Across hosts (a communicator whose ranks span several),
// only the copies of the ranks on this host are mapped (the others' places in the layout are
// holes, abi.h at SYMCOMM_RANK_REMOTE): the addressing functions below then need a peer on this
// host (`on_this_host`), put / get refuse others (SYMCOMM_REFUSED_REMOTE), and put_with_signal
// reaches them through the proxy (p2p.cuh).
//
// Bounds: a handle knows its size (`bytes` per rank) and its element type (`elem_size`, `dtype`).
// The addressing functions below do not check (they are one multiply-add in inner loops); the
// operations of the library do, once at entry: collectives (collectives.cuh) and put / get
// (p2p.cuh) refuse with Status::InvalidArgument, before touching any memory, a range that does
// not fit in the window — elements [offset, offset + n) of T fit when n is 0 or
// (offset + n) * sizeof(T) <= bytes, computed without overflow — a peer that is not a rank, and a
// `WindowHandle<T>` that does not hold T (see `holds`). Kernels that address windows themselves
// check with `fits` and `holds`.
//
// Slices: the library's operations take a window and an element offset as one value, a
// `WindowSlice<T>` (`win.at(offset)`): the elements of every rank's copy from `offset` on, like
// Rust's `&window[offset..]` — the length is the call's `count` argument, not part of the slice,
// because every operation says how many blocks of `count` it touches. The name is the one concept
// for "a window from an offset" in the device API; offsets inside a slice (`peer_ptr(peer, i)`,
// `at(i)`) are relative to its first element.
#pragma once

#include <symcomm/config.cuh>

namespace symcomm {

/// Address of byte `offset` in rank `peer`'s copy of the window (flat layout: one multiply-add).
/// Pre: peer < win.nranks, peer on this host, offset <= win.bytes (not checked). Any thread may
/// call it.
SYMCOMM_DEVICE void* peer_ptr(const WindowHandleRaw& win, uint32_t peer, uint64_t offset);

/// A window of elements of type `T` (the typed view of `WindowHandleRaw`, which is what kernels
/// receive from the host). Plain data; pass it by value.
///
/// Constructing one from a raw handle of another element type is allowed (it cannot fail, so that
/// it stays a plain conversion); what is refused is using it: the library's operations check
/// `holds()` at entry, and kernels that address the window themselves should too.
template <typename T>
struct WindowSlice;

template <typename T>
struct WindowHandle {
    WindowHandleRaw raw;

    SYMCOMM_DEVICE explicit WindowHandle(const WindowHandleRaw& r);

    /// Element `index` of rank `peer`'s copy. Pre: peer < nranks(), `on_this_host(peer)`,
    /// index <= count() (not checked; see `fits`).
    SYMCOMM_DEVICE T* peer_ptr(uint32_t peer, uint64_t index) const;
    /// Whether rank `peer`'s copy is mapped here (the peer runs on this host; always true on a
    /// communicator of one host). Pre: peer < nranks().
    SYMCOMM_DEVICE bool on_this_host(uint32_t peer) const;
    /// Element `index` of this rank's copy.
    SYMCOMM_DEVICE T* local_ptr(uint64_t index) const;
    /// Elements per rank.
    SYMCOMM_DEVICE uint64_t count() const;
    /// Ranks sharing the window.
    SYMCOMM_DEVICE uint32_t nranks() const;
    /// The rank this handle belongs to.
    SYMCOMM_DEVICE uint32_t rank() const;

    /// Whether elements of T may address the window: its element size is sizeof(T), or it is a
    /// byte window (`elem_size` 1: staging buffers, `Window<u8>`), which any T may view. An
    /// element size of 0 (a handle not built by the host library) holds nothing.
    SYMCOMM_DEVICE bool holds() const;
    /// Whether the window may hold elements of type code `dtype` (SYMCOMM_DTYPE_*): its own code,
    /// or SYMCOMM_DTYPE_NONE (elements of no collective type: the caller says what they are).
    SYMCOMM_DEVICE bool holds_dtype(uint32_t dtype) const;
    /// Whether `blocks` consecutive blocks of `n` elements from element `index`, i.e. elements
    /// [index, index + blocks * n), lie inside each rank's copy. Exact for every argument: a
    /// product or sum that would wrap around 2^64 does not fit. An empty range (nothing is
    /// accessed) fits at any index, as NCCL accepts any buffer for a count of 0.
    SYMCOMM_DEVICE bool fits(uint64_t index, uint64_t n, uint64_t blocks = 1) const;
    /// The slice of the window from element `offset` (what collectives and put / get take).
    /// Cannot fail: the operations check the range at entry (see `WindowSlice::fits`).
    SYMCOMM_DEVICE WindowSlice<T> at(uint64_t offset) const;
};

/// Elements of a window from element `offset` on, in every rank's copy (`window[offset..]`):
/// the (window, offset) pair that collectives (collectives.cuh), put / get (p2p.cuh) and
/// reduce_pack_peers (fused.cuh) take as one argument. Plain data; pass it by value. Build it
/// with `WindowHandle<T>::at`. Element indices below are relative to `offset`; like the handle's,
/// the addressing functions do not check (one multiply-add), `fits` and `holds` do.
template <typename T>
struct WindowSlice {
    WindowHandle<T> window;
    /// First element of the slice, in elements of T from the start of each rank's copy.
    uint64_t offset;

    /// Element `offset + i` of rank `peer`'s copy. Pre: peer < nranks(), peer on this host,
    /// offset + i <= the window's count() (not checked; see `fits`).
    SYMCOMM_DEVICE T* peer_ptr(uint32_t peer, uint64_t i) const;
    /// Element `offset + i` of this rank's copy.
    SYMCOMM_DEVICE T* local_ptr(uint64_t i) const;
    /// The slice from element `offset + i` of the same window. Pre: offset + i does not wrap
    /// around 2^64 (true for any i inside a range that `fits`).
    SYMCOMM_DEVICE WindowSlice at(uint64_t i) const;
    /// Ranks sharing the window.
    SYMCOMM_DEVICE uint32_t nranks() const;
    /// `window.holds()`: elements of T may address the window.
    SYMCOMM_DEVICE bool holds() const;
    /// `window.holds_dtype(dtype)`.
    SYMCOMM_DEVICE bool holds_dtype(uint32_t dtype) const;
    /// Whether `blocks` consecutive blocks of `n` elements from the slice's first element, i.e.
    /// elements [offset, offset + blocks * n) of the window, lie inside each rank's copy
    /// (`window.fits(offset, n, blocks)`: exact, an empty range fits anywhere).
    SYMCOMM_DEVICE bool fits(uint64_t n, uint64_t blocks = 1) const;
};

}  // namespace symcomm

#include <symcomm/impl/window.cuh>

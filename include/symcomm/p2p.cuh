// symcomm device library: one-sided data movement between ranks (put / get / put-with-signal).
//
// These are plain copies through peer pointers, done by every thread of a group together:
// 16-byte vector loads and stores where the source and destination have the same address phase
// mod 16, scalar heads and tails around them, scalar everywhere otherwise (any count, any
// offset). They order nothing by themselves: a peer may read what a put wrote only after a
// signal or barrier that follows the put (put_with_signal does both).
//
// Arguments: source before destination, as in the collectives (collectives.cuh) and NCCL; the
// remote side is a window slice (`win.at(offset)`, window.cuh) followed by the peer whose copy it
// names, the local side a plain pointer; then the count.
//
// Bounds: each call checks, before touching memory, that the peer is a rank of the window, that
// the window holds T (element size sizeof(T), or a byte window) and that the slice's first
// `count` elements fit in each rank's copy (exact arithmetic: no wrap-around), and returns
// Status::InvalidArgument otherwise. The other buffer (`src` of put, `dst` of get) is ordinary
// memory the library cannot see the size of: keeping it in bounds is the caller's.
//
// Ranks on other hosts (communicators across hosts): their copies are not mapped here, so put and
// get refuse them (InvalidArgument, reason SYMCOMM_REFUSED_REMOTE); put_with_signal reaches them
// through this rank's proxy (signal.cuh, signal_set), which sends the data and then the signal, so
// the peer's wait sees both as with a put on one host — at network cost (`src` must then be global
// memory: the proxy reads it with a copy, on a GPU over PCIe).
#pragma once

#include <symcomm/group.cuh>
#include <symcomm/signal.cuh>
#include <symcomm/window.cuh>

namespace symcomm {

/// Put: copies `count` elements from `src` (any memory this thread can read: a window, device
/// memory, shared memory) into the first `count` elements of slice `dst` in rank `peer`'s copy.
/// Who calls: every thread of `g`, with the same arguments. The group is synchronized before the
/// copy reads `src`, so what its threads wrote there just before is what is sent (the threads copy
/// other elements than they wrote). On return each thread's stores are issued but not ordered for
/// the peer: follow with a release (signal_set by one thread after `g.sync()`), a barrier, or use
/// put_with_signal.
/// Returns Ok, or InvalidArgument with nothing copied when peer >= dst.nranks(), `dst` does not
/// hold T (`WindowSlice::holds`) or `dst.fits(count)` is false (exact arithmetic); every thread
/// gets the same Status. `src` is the caller's to keep in bounds. (No
/// DevComm here, so nothing is recorded: put_with_signal records its refusals.)
template <typename Group, typename T>
SYMCOMM_DEVICE Status put(Group g, const T* src, WindowSlice<T> dst, uint32_t peer, uint64_t count);

/// Get: copies the first `count` elements of slice `src` in rank `peer`'s copy into `dst` (any
/// memory this thread can write). Who calls: every thread of `g`, same arguments. The caller
/// must have acquired the peer's data first (a signal wait or barrier after the peer wrote it);
/// the group is synchronized before reading, so an acquire made by one of its threads covers all.
/// Returns Ok, or InvalidArgument with nothing read under the conditions of put (for `src`:
/// `src.fits(count)`); `dst` is the caller's to keep in bounds.
template <typename Group, typename T>
SYMCOMM_DEVICE Status get(Group g, WindowSlice<T> src, uint32_t peer, T* dst, uint64_t count);

/// Put with signal: put (the group synchronized first, as there), then the group synchronizes and
/// one thread release-stores `value` into
/// the signal word `word` that `peer` reserves for this rank. When the peer's
/// `signal_wait_until(..., rank, word, value)` returns Ok, every element of the put is visible to
/// it (bar.sync + a cumulative release at system scope).
/// Who calls: every thread of `g`, same arguments. Pre: value larger than any earlier value of
/// that word.
/// Returns (the same on every thread) Ok, or InvalidArgument with nothing copied or stored (the
/// peer's wait then fails at its deadline), recorded in the rank's ErrorRecord: unless
/// peer < comm.nranks and word < SYMCOMM_USER_SIGNAL_END (op SYMCOMM_OP_SIGNAL, detail
/// `peer << 32 | word`), or when put would refuse the range (op SYMCOMM_OP_PUT, detail
/// `peer | reason << 32`).
template <typename Group, typename T>
SYMCOMM_DEVICE Status put_with_signal(Group g, const DevComm& comm, const T* src, WindowSlice<T> dst, uint32_t peer,
                                      uint64_t count, uint32_t word, uint64_t value);

}  // namespace symcomm

#include <symcomm/impl/p2p.cuh>

// symcomm device library: a grid-wide sync across the CTAs of one launch on one rank.
//
// `grid_sync` is a barrier of every CTA of the calling grid (not of the ranks: combine it with
// `barrier()` for that). Its state is one 64-bit word in device memory that the caller provides:
// the high half counts generations (completed syncs, wrapping), the low half the CTAs that arrived
// at the current one. Each CTA adds 1; the last one adds 2^32 - nctas, which completes the
// generation and empties the count in one atomic; the others wait for the generation to change.
// The word never needs resetting: it is back at count 0 after every completed sync, so
// back-to-back launches, launches of other grid sizes and CUDA-graph replay continue with it.
//
// Co-residency: every CTA of the grid must be resident at once, since early CTAs spin until the
// last one arrives. Launch the kernel with `LaunchConfig::co_resident()` through
// `Communicator::launch` (refused beyond the rank's share of the GPU; a cooperative launch on
// CUDA) — README "Co-residency". A grid beyond it waits until the bounded wait gives up (Timeout),
// on the GPU and on the emulator alike.
#pragma once

#include <symcomm/group.cuh>
#include <symcomm/memory.cuh>
#include <symcomm/signal.cuh>

namespace symcomm {

/// Synchronizes every CTA of the calling grid: returns once every CTA of the launch called it
/// (the same number of times).
///
/// Who calls: every thread of every CTA of the grid, each CTA as a `Cta`, with the same `state`.
/// Pre: `state` is a word of this rank's device memory used only by grid_sync of this one grid at
/// a time, zero when first used (then left to grid_sync); every CTA of the grid is co-resident
/// (see the file comment). `S` is the scope of the CTAs: Scope::Gpu (one launch runs on one GPU).
/// Ordering: every write made by any thread of the grid before its grid_sync is visible to every
/// thread of the grid after its grid_sync returned Ok (each CTA synchronizes, thread 0 arrives
/// with an acquire-release add, the last arrival's add releases the new generation, the waiters
/// acquire it, and the CTA synchronizes again).
/// Returns, the same on every thread of a CTA: Ok; Timeout when some CTA did not arrive within
/// `comm.timeout_ns` (e.g. not co-resident), Aborted when the communicator's abort flag was
/// raised (both recorded: op SYMCOMM_OP_GRID_SYNC, peer this rank, detail the generation waited
/// on); at once the status of an error the rank recorded before. After a failure the state word
/// counts the CTAs that arrived: zero it before it is used again (the rank is broken anyway).
template <Scope S = Scope::Gpu>
SYMCOMM_DEVICE_NOINLINE Status grid_sync(Cta g, const DevComm& comm, uint64_t* state);

}  // namespace symcomm

#include <symcomm/impl/grid.cuh>

// symcomm device library: collectives over symmetric windows, callable from any kernel.
//
// Every collective is a collective call of one CTA (`Cta` group) on every rank, at one of two
// scopes (`CollScope`):
//   - grid scope (`grid_scope(first_slot)`): every CTA of the launch calls it with the same
//     arguments; CTA b works on the b-th part of the elements and uses barrier index
//     first_slot + b. Every rank must launch the same grid.
//   - CTA scope (`cta_scope(slot)`): the calling CTA alone does the whole collective on its own
//     barrier index (a GEMM epilogue reducing its own tile). Other CTAs may run other CTA-scope
//     collectives on other slots at the same time.
//
// Arguments, in this order for every collective: the group, the communicator, the scope, the
// source slice, the destination slice, the count, and for rooted collectives (broadcast, reduce,
// scatter) the root last — NCCL's order (sendbuff, recvbuff, count, ..., root). Buffers are
// slices of symmetric windows (`WindowSlice<T>`, `win.at(offset)`, window.cuh); `src` and `dst`
// may be slices of the same window (window-to-window or in place). Below, `src[i]` is element
// src.offset + i of a copy of src's window. Counts are per-rank block sizes, as in NCCL:
//   all_reduce_*     src[0, count)              -> dst[0, count)
//   all_gather       src[0, count)              -> dst[r*count, +count) for every r
//   reduce_scatter   src[r*count, +count) of every rank, reduced -> rank r's dst[0, count)
//   broadcast        root's src[0, count)       -> dst[0, count)
//   reduce           src[0, count)              -> root's dst[0, count)
//   scatter          root's src[r*count, +count) -> rank r's dst[0, count)
//   all_to_all       src[p*count, +count) of rank r -> dst[r*count, +count) of rank p
// Offsets are the same on every rank (the windows are symmetric), except that an in-place
// all-gather passes src.offset = dst.offset + rank*count, NCCL's in-place convention, on each rank.
// In place means the same window with the offsets NCCL uses for in-place calls: all-reduce,
// broadcast, reduce, all-to-all: src.offset == dst.offset; all-gather: src.offset == dst.offset +
// rank*count; reduce-scatter and scatter: dst.offset == src.offset + rank*count. Any other overlap
// of an input and an output range is refused (Status::InvalidArgument).
//
// Bounds and types: at entry, before any memory access and before its first barrier, every
// collective checks that each range of the table above fits in its window (all_gather writes
// nranks*count elements of dst, reduce_scatter reads nranks*count of src, ...; a CTA-scope call
// passes its own tile's slices), in exact arithmetic (an offset + count that wraps around 2^64
// does not fit: `WindowSlice::fits`), that both windows hold T (`holds`: element size sizeof(T), or
// a byte window) and T's type (`holds_dtype`: the window's SYMCOMM_DTYPE_* code, or
// SYMCOMM_DTYPE_NONE), and that both span comm.nranks ranks. Otherwise it records
// InvalidArgument (op SYMCOMM_OP_COLLECTIVE, detail `kind | reason << 32` with a SYMCOMM_REFUSED_*
// reason) and returns Status::InvalidArgument without touching any window. These checks read only
// values that agree across ranks in a correct program (counts, offsets, the symmetric windows'
// sizes and types), so every rank refuses the same call and no rank is left waiting in a barrier.
//
// Ordering: on entry each collective waits (barrier) until every rank entered it — so inputs
// written before the call, by this CTA or in stream order before the kernel, are read — and it
// returns only when no peer will read this rank's buffers for it any more, so the caller may
// overwrite its input and read its output at once (this CTA's threads; other CTAs of the grid
// after a grid-wide sync of the caller's own). Counts and offsets may be anything inside the
// windows (0, odd, not divisible by the rank count); 16-byte vector loads and stores are used wherever the input and
// output phases agree, scalar heads and tails elsewhere.
//
// Every call returns the same Status on every thread of the CTA: Ok, or the failure of a barrier
// (Timeout, Aborted, Mismatch when ranks called different collectives or counts, or disagree on
// in place: the in-place forms run other barrier sequences and read other buffers) or
// InvalidArgument; failures are also recorded in the rank's ErrorRecord. After a failure the
// communicator's barrier epochs are out of step: the host must treat the communicator as broken.
//
// Results are bitwise identical on every rank: peers are reduced in rank order 0..n-1 with one
// rounding per element (accumulation in the type's accumulation type, see reduce.cuh).
#pragma once

#include <symcomm/barrier.cuh>
#include <symcomm/group.cuh>
#include <symcomm/reduce.cuh>
#include <symcomm/types.cuh>
#include <symcomm/window.cuh>

namespace symcomm {

/// Where a collective call runs: grid scope (all CTAs, slot `index + blockIdx`) or CTA scope
/// (this CTA, slot `index`). Build it with `grid_scope` / `cta_scope`.
struct CollScope {
    /// 1 for grid scope, 0 for CTA scope.
    uint32_t grid;
    /// Grid scope: first barrier index; CTA scope: the barrier index.
    uint32_t index;
};

/// Grid scope: every CTA of the launch cooperates; CTA b uses barrier index `first_slot + b`.
SYMCOMM_DEVICE CollScope grid_scope(uint32_t first_slot = 0);

/// CTA scope: the calling CTA alone, on barrier index `slot`.
SYMCOMM_DEVICE CollScope cta_scope(uint32_t slot);

/// Elements [lo, hi) of a block (relative to the block's first element).
struct Range {
    uint64_t lo, hi;
    SYMCOMM_DEVICE uint64_t size() const;
};

/// The calling CTA's part of a block of `count` elements of T in a collective at `scope`: grid
/// scope cuts [0, count) into one part per CTA of the grid in linear block order, at multiples of
/// a 16-byte pack, the last parts possibly empty; CTA scope gives all of [0, count).
///
/// This is exactly the work of each CTA in the collectives below (all but the two-shot
/// all-reduce, see two_shot_part), per block of `count` elements of each buffer: CTA b of every
/// rank reads only part P of each input block of every rank and writes only part P of this rank's
/// output blocks (indices relative to the slices, as in the table at the top):
///   all_reduce_one_shot  src[P] of every rank             -> dst[P]
///   all_reduce_ll        src[P] of every rank (via LL lines) -> dst[P]
///   all_gather           src[P] of every rank             -> dst[r*count + P] for every r
///   all_gather_ll        src[P] of every rank (via LL lines) -> dst[r*count + P] for every r
///   reduce_scatter       src[r*count + P] of every rank, reduced -> rank r's dst[P]
///   reduce_scatter_ll    the same, via LL lines
///   broadcast            root's src[P]                    -> dst[P]
///   broadcast_ll         the same, via LL lines
///   reduce               src[P] of every rank             -> root's dst[P]
///   scatter              root's src[r*count + P]          -> rank r's dst[P]
///   all_to_all           src[p*count + P] of rank r       -> dst[r*count + P] of rank p
/// So a grid-scope kernel may produce its input and consume its output per CTA, with no grid-wide
/// sync around the call: CTA b writes part P of its input blocks before the call (the call's entry
/// barrier publishes them to CTA b of every rank), and after the call returns Ok every thread of
/// CTA b may read part P of its output blocks (the call ends with the CTA synchronized). Other
/// CTAs' parts need a grid_sync (grid.cuh) first. Every rank must launch the same grid.
template <typename T>
SYMCOMM_DEVICE Range cta_part(CollScope scope, uint64_t count);

/// The calling CTA's part of rank q's share in a two-shot all-reduce of `count` elements of T at
/// `scope` (each rank reduces one share of [0, count), cut at 16-byte packs): CTA b of every rank
/// reads src[Q_q] of every rank and writes dst[Q_q], for every q in [0, nranks),
/// where Q_q = two_shot_part<T>(scope, nranks, count, q); as for cta_part, a CTA may write Q_q of
/// its input for every q before the call and read Q_q of its output for every q after it.
template <typename T>
SYMCOMM_DEVICE Range two_shot_part(CollScope scope, uint32_t nranks, uint64_t count, uint32_t q);

/// All-reduce, one-shot: each rank reads every peer's input and reduces it itself (one step of
/// latency; for small messages). `src[0, count)` of every rank, reduced with `Op`, lands in
/// every rank's `dst[0, count)`. In place (same window, src.offset == dst.offset) runs in rounds
/// of one item per thread with a barrier per round.
template <RedOp Op, typename T>
SYMCOMM_DEVICE Status all_reduce_one_shot(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                          WindowSlice<T> dst, uint64_t count);

/// All-reduce, two-shot: rank r reduces block r of the elements from every rank's `src` and
/// pushes the result into every rank's `dst` (a reduce-scatter whose stores are the all-gather):
/// each element is read once per rank in total and written once per rank — 2 S(n-1)/n bytes
/// over the peer links per rank for S bytes, the minimum — with two barriers (entry and exit).
/// For large messages. Same buffers and in-place rule as all_reduce_one_shot; in place needs no
/// extra rounds.
template <RedOp Op, typename T>
SYMCOMM_DEVICE Status all_reduce_two_shot(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                          WindowSlice<T> dst, uint64_t count);

/// All-reduce, low latency (LL): no barrier at all. Each CTA copies its part (cta_part) of
/// this rank's `src` into every peer's LL area as 16-byte lines that carry 8 data bytes and the
/// round's flag (abi.h, SYMCOMM_LL_LINES), then waits for every peer's lines in its own LL area
/// and reduces them in rank order into `dst` — one one-way trip of latency instead of two barrier
/// round trips, for twice the peer bytes (the flags): for small messages. Rounds of
/// `comm.ll_lines - 1` lines per CTA (2040 bytes with SYMCOMM_LL_LINES); each round begins with a
/// header line per peer holding the call's fingerprint, so ranks that disagree on the call get
/// Mismatch. Peers never touch this rank's `src` or `dst`: on return the caller may overwrite
/// its input and read its output at once, and in place needs nothing extra. Uses the LL state of
/// barrier index `part.slot` (the CTA's barrier index, as the other collectives), which it keeps
/// in device memory, so back-to-back calls and graph replay need no reset.
/// Same buffers, in-place rule and results as all_reduce_one_shot; refused (InvalidArgument,
/// SYMCOMM_REFUSED_LL) on a communicator without an LL area (`comm.ll_lines` < 2) or a barrier
/// index >= SYMCOMM_USER_BARRIER_END. Waits fail with op SYMCOMM_OP_LL_WAIT.
template <RedOp Op, typename T>
SYMCOMM_DEVICE Status all_reduce_ll(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                    WindowSlice<T> dst, uint64_t count);

/// All-gather: rank r's `src[0, count)` lands in every rank's `dst[r*count, +count)`.
/// In place: src.offset == dst.offset + rank*count in the same window.
template <typename T>
SYMCOMM_DEVICE Status all_gather(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                 WindowSlice<T> dst, uint64_t count);

/// All-gather, low latency (LL): all_gather's buffers, in-place rule and results with
/// all_reduce_ll's protocol — each CTA stores its part of this rank's `src` into every peer's LL
/// area as lines of 8 data bytes and the round's flag, then copies every peer's lines that arrive
/// in its own LL area into the peer's block of `dst`: no barrier, one one-way trip of latency per
/// round of `comm.ll_lines - 1` lines, a fingerprint header per round (Mismatch), state in device
/// memory (back-to-back calls and graph replay need no reset). Peers never touch this rank's
/// `src` or `dst`. For small messages. Refused and failing as all_reduce_ll (SYMCOMM_REFUSED_LL,
/// SYMCOMM_OP_LL_WAIT).
template <typename T>
SYMCOMM_DEVICE Status all_gather_ll(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                    WindowSlice<T> dst, uint64_t count);

/// Reduce-scatter: block r (`src[r*count, +count)`) of every rank, reduced with `Op`, lands in
/// rank r's `dst[0, count)`. In place: dst.offset == src.offset + rank*count, same window.
template <RedOp Op, typename T>
SYMCOMM_DEVICE Status reduce_scatter(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                     WindowSlice<T> dst, uint64_t count);

/// Reduce-scatter, low latency (LL): reduce_scatter's buffers, in-place rule and results with
/// all_reduce_ll's protocol — each CTA stores its part of block q of this rank's `src` into rank
/// q's LL area as LL lines, then reduces every peer's lines that arrive in its own LL area with its
/// own block into `dst`: no barrier, no reset, a fingerprint header per round, peers never touch
/// this rank's `src` or `dst`. For small messages. Refused and failing as all_reduce_ll.
template <RedOp Op, typename T>
SYMCOMM_DEVICE Status reduce_scatter_ll(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                        WindowSlice<T> dst, uint64_t count);

/// Broadcast: `root`'s `src[0, count)` lands in every rank's `dst[0, count)`. In place:
/// src.offset == dst.offset in the same window (the root then copies nothing).
template <typename T>
SYMCOMM_DEVICE Status broadcast(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                WindowSlice<T> dst, uint64_t count, uint32_t root);

/// Broadcast, low latency (LL): broadcast's buffers, in-place rule and results with
/// all_reduce_ll's protocol — the root's CTAs store their part of its `src` into every peer's LL
/// area as LL lines (and copy it into its own `dst` out of place); the others copy the root's
/// lines that arrive into their `dst`. Every rank sends and checks each round's headers. No
/// barrier, no reset; peers never touch this rank's `src` or `dst`. For small messages. Refused
/// and failing as all_reduce_ll.
template <typename T>
SYMCOMM_DEVICE Status broadcast_ll(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                   WindowSlice<T> dst, uint64_t count, uint32_t root);

/// Reduce: every rank's `src[0, count)`, reduced with `Op`, lands in `root`'s `dst[0, count)`
/// (other ranks' `dst` is untouched). In place: src.offset == dst.offset, same window.
template <RedOp Op, typename T>
SYMCOMM_DEVICE Status reduce(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                             WindowSlice<T> dst, uint64_t count, uint32_t root);

/// Scatter: block r of `root`'s `src` (`src[r*count, +count)`) lands in rank r's `dst[0, count)`.
/// In place: on every rank dst.offset == src.offset + rank*count in the same window.
template <typename T>
SYMCOMM_DEVICE Status scatter(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                              WindowSlice<T> dst, uint64_t count, uint32_t root);

/// All-to-all: block p of rank r's `src` (`src[p*count, +count)`) lands in block r of rank p's
/// `dst` (`dst[r*count, +count)`). In place (src.offset == dst.offset, same window) runs in
/// rounds with a barrier per round and needs a CTA of at least nranks threads.
template <typename T>
SYMCOMM_DEVICE Status all_to_all(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                 WindowSlice<T> dst, uint64_t count);

}  // namespace symcomm

#include <symcomm/impl/collectives.cuh>

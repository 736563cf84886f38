// Inline definitions of <symcomm/collectives.cuh> (included at its end): how CTAs split the
// elements (detail::part_of), work items (a scalar head, 16-byte packs, a scalar tail), the entry
// checks, and the collectives' barrier sequences.
#pragma once

#include <symcomm/impl/ll.cuh>

namespace symcomm {

namespace detail {

SYMCOMM_DEVICE uint32_t linear_block_index() { return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); }
SYMCOMM_DEVICE uint32_t grid_blocks() { return gridDim.x * gridDim.y * gridDim.z; }
SYMCOMM_DEVICE uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/// The elements [lo, hi) of [begin, end) this CTA handles, and its barrier index. Grid scope cuts
/// at multiples of `quantum` elements (a pack) so that parts stay vector-aligned.
struct Part {
    uint64_t lo, hi;
    uint32_t slot;
};

SYMCOMM_DEVICE Part part_of(CollScope s, uint64_t begin, uint64_t end, uint32_t quantum) {
    if (!s.grid) return Part{begin, end, s.index};
    const uint64_t n = end - begin;
    const uint64_t g = grid_blocks();
    const uint64_t per = ((n + quantum - 1) / quantum + g - 1) / g * quantum;
    const uint64_t lo = min_u64(uint64_t(linear_block_index()) * per, n);
    return Part{begin + lo, begin + min_u64(lo + per, n), s.index + linear_block_index()};
}

/// Two-shot all-reduce: the share [lo, hi) of [0, count) that rank q reduces.
template <typename T>
SYMCOMM_DEVICE Range two_shot_share(uint32_t nranks, uint64_t count, uint32_t q) {
    const uint32_t P = Pack16<T>::N;
    const uint64_t block = ((count + P - 1) / P + nranks - 1) / nranks * P;
    const uint64_t lo = min_u64(uint64_t(q) * block, count);
    return Range{lo, min_u64(lo + block, count)};
}

/// A range of elements cut into work items: a scalar head up to the first 16-byte boundary,
/// whole 16-byte packs, a scalar tail. Item k is one element or one pack.
template <typename T>
struct Items {
    static constexpr uint32_t P = Pack16<T>::N;
    uint64_t lo, head, packs, tail;

    /// `vec`: every buffer involved has the same address phase mod 16 (else all scalar);
    /// `ref_addr`: the address of element `lo` in one of them.
    SYMCOMM_DEVICE Items(uint64_t lo_, uint64_t hi, bool vec, uint64_t ref_addr) : lo(lo_) {
        const uint64_t n = hi - lo_;
        head = vec ? min_u64(n, ((16u - (ref_addr & 15u)) & 15u) / sizeof(T)) : n;
        packs = (n - head) / P;
        tail = n - head - packs * P;
    }
    SYMCOMM_DEVICE uint64_t total() const { return head + packs + tail; }
    /// First element of item k (< total()); `is_pack` tells whether it is a whole pack.
    SYMCOMM_DEVICE uint64_t first(uint64_t k, bool& is_pack) const {
        is_pack = k >= head && k < head + packs;
        if (k < head) return lo + k;
        if (is_pack) return lo + head + (k - head) * P;
        return lo + head + packs * P + (k - head - packs);
    }
};

template <typename T>
SYMCOMM_DEVICE uint32_t phase(const T* p) {
    return uint32_t(reinterpret_cast<uint64_t>(p) & 15u);
}

template <typename T>
SYMCOMM_DEVICE Pack16<T> load_item(const T* p, bool is_pack) {
    if (is_pack) return load_pack(p);
    Pack16<T> v;
    v.e[0] = *p;
    return v;
}

template <typename T>
SYMCOMM_DEVICE void store_item(T* p, const Pack16<T>& v, bool is_pack) {
    if (is_pack) {
        store_pack(p, v);
    } else {
        *p = v.e[0];
    }
}

/// The pack at `index` of ranks 0..K-1's copies of `src`: all K loads issued before the first
/// combine (K x 16 bytes in flight per thread; a compile-time K keeps them in registers), then
/// folded in rank order, so the bits are those of the one-at-a-time loop.
template <typename T, RedOp Op, uint32_t K>
SYMCOMM_DEVICE PackAccumulator<T, Op> fold_peer_packs(const WindowHandle<T>& src, uint64_t index) {
    Pack16<T> v[K];
    SYMCOMM_UNROLL
    for (uint32_t p = 0; p < K; ++p) v[p] = load_pack(src.peer_ptr(p, index));
    PackAccumulator<T, Op> acc;
    acc.first(v[0]);
    SYMCOMM_UNROLL
    for (uint32_t p = 1; p < K; ++p) acc.add(v[p]);
    return acc;
}

/// The pack at `index` of every one of the `n` ranks' copies of `src`, folded in rank order:
/// specialized for 2, 4 and 8 ranks (every load in flight at once), one load at a time otherwise.
template <typename T, RedOp Op>
SYMCOMM_DEVICE PackAccumulator<T, Op> peer_packs(const WindowHandle<T>& src, uint64_t index, uint32_t n) {
    switch (n) {
        case 2: return fold_peer_packs<T, Op, 2>(src, index);
        case 4: return fold_peer_packs<T, Op, 4>(src, index);
        case 8: return fold_peer_packs<T, Op, 8>(src, index);
        default: break;
    }
    PackAccumulator<T, Op> acc;
    acc.first(load_pack(src.peer_ptr(0, index)));
    for (uint32_t p = 1; p < n; ++p) acc.add(load_pack(src.peer_ptr(p, index)));
    return acc;
}

/// Reduces item `index` (element or pack) of every rank's copy of `src`, peers in rank order.
/// Takes the window and an absolute index rather than a slice: this is the collectives' per-item
/// out-of-line call, and a (handle, index) pair keeps its arguments in the registers the callers
/// already hold (a slice costs two more registers in some sm_80 kernels).
template <typename T, RedOp Op>
SYMCOMM_DEVICE_NOINLINE Pack16<T> reduce_item(const WindowHandle<T>& src, uint64_t index, uint32_t n, bool is_pack) {
    if (is_pack) return peer_packs<T, Op>(src, index, n).result(n);
    Accumulator<T, Op> acc;
    acc.first(*src.peer_ptr(0, index));
    for (uint32_t p = 1; p < n; ++p) acc.add(*src.peer_ptr(p, index));
    Pack16<T> v;
    v.e[0] = acc.result(n);
    return v;
}

/// Runs `compute(i, is_pack) -> Pack16<T>` and `write(i, value, is_pack)` for every item of `it`
/// on the CTA's threads. `chunked` (in place): each round computes one item per thread into
/// registers, then a barrier (every rank has read the round's inputs), then writes, so no rank
/// overwrites an input a peer has not read yet. Every rank runs the same rounds (the items depend
/// only on count, scope and address phases, which agree across ranks).
template <typename T, typename Compute, typename Write>
SYMCOMM_DEVICE Status run_items(Cta g, const DevComm& comm, const Items<T>& it, bool chunked, uint32_t slot, uint32_t fp,
                                Compute compute, Write write) {
    const uint64_t total = it.total();
    if (!chunked) {
        for (uint64_t k = g.thread_rank(); k < total; k += g.size()) {
            bool is_pack;
            const uint64_t i = it.first(k, is_pack);
            write(i, compute(i, is_pack), is_pack);
        }
        return Status::Ok;
    }
    for (uint64_t base = 0; base < total; base += g.size()) {
        const uint64_t k = base + g.thread_rank();
        bool is_pack = false;
        uint64_t i = 0;
        Pack16<T> v;
        if (k < total) {
            i = it.first(k, is_pack);
            v = compute(i, is_pack);
        }
        const Status s = barrier(g, comm, slot, fp);
        if (s != Status::Ok) return s;
        if (k < total) write(i, v, is_pack);
    }
    return Status::Ok;
}

/// Items a thread of copy_part loads before it stores the first of them.
constexpr uint32_t COPY_UNROLL = 4;

/// Copies elements [lo, hi) from `from` to `to` (same index), vectorized when phases agree. Each
/// thread loads COPY_UNROLL items (a CTA-size stride apart) before storing them, so that many
/// 16-byte loads are in flight per thread rather than one (on an H200 the one-at-a-time loop
/// copied at 65 % of cuMemcpyDtoD); the items and their values are those of the simple loop.
/// `from` and `to` do not overlap unless they are equal (callers' contract).
template <typename T>
SYMCOMM_DEVICE void copy_part(Cta g, const T* from, T* to, uint64_t lo, uint64_t hi) {
    if (from == to) return;
    const Items<T> it(lo, hi, phase(from) == phase(to), reinterpret_cast<uint64_t>(from + lo));
    const uint64_t total = it.total(), step = g.size();
    uint64_t k = g.thread_rank();
    for (; k + (COPY_UNROLL - 1u) * step < total; k += COPY_UNROLL * step) {
        bool is_pack[COPY_UNROLL];
        uint64_t i[COPY_UNROLL];
        Pack16<T> v[COPY_UNROLL];
        SYMCOMM_UNROLL
        for (uint32_t u = 0; u < COPY_UNROLL; ++u) {
            i[u] = it.first(k + u * step, is_pack[u]);
            v[u] = load_item(from + i[u], is_pack[u]);
        }
        SYMCOMM_UNROLL
        for (uint32_t u = 0; u < COPY_UNROLL; ++u) store_item(to + i[u], v[u], is_pack[u]);
    }
    for (; k < total; k += step) {
        bool is_pack;
        const uint64_t i = it.first(k, is_pack);
        store_item(to + i, load_item(from + i, is_pack), is_pack);
    }
}

/// Items of two-shot's reduce-and-push a thread takes at once with K ranks: K * U peer packs
/// (128 bytes) in flight per thread, as reduce_item's 8-rank case already holds.
/// Packs a thread of reduce_packs_k takes at once with K ranks: K * U peer packs (128 bytes) in
/// flight per thread, as reduce_item's 8-rank case already holds.
template <uint32_t K>
struct PackUnroll {
    static constexpr uint32_t U = K <= 8 ? 8 / K : 1;
};

/// The reduce loop of one-shot (out of place) and two-shot for K ranks: every item of `it` (packs
/// only) reduced over the ranks' `src` (element index + src_off) and stored into `out`; with
/// `Push` (two-shot: `it` is this rank's share) also into every other rank's `dst` (index +
/// dst_off), rank me + 1 first. Packs go U per thread: their K * U loads are all issued before
/// the first combine, then folded in rank order (the bits of the one-at-a-time loop). The ranks'
/// base pointers are computed once, outside the loop.
template <typename T, RedOp Op, uint32_t K, bool Push>
SYMCOMM_DEVICE void reduce_packs_k(Cta g, const WindowHandle<T>& src, uint64_t src_off, const WindowHandle<T>& dst,
                                   uint64_t dst_off, T* out, const Items<T>& it, uint32_t me) {
    constexpr uint32_t P = Pack16<T>::N;
    constexpr uint32_t U = PackUnroll<K>::U;
    const T* from[K];
    T* to[K];
    SYMCOMM_UNROLL
    for (uint32_t p = 0; p < K; ++p) {
        from[p] = src.peer_ptr(p, src_off);
        to[p] = Push ? dst.peer_ptr(p, dst_off) : nullptr;
    }
    const uint64_t step = g.size();
    // U packs at a time, a CTA-size stride apart. In a thread's last group, a pack past the end
    // loads its group's first pack again (it exists; the value is not stored), so that one
    // unrolled body serves every group.
    const uint64_t first = it.lo + it.head;
    for (uint64_t j = g.thread_rank(); j < it.packs; j += U * step) {
        Pack16<T> v[U][K];
        SYMCOMM_UNROLL
        for (uint32_t u = 0; u < U; ++u) {
            const uint64_t ju = j + u * step < it.packs ? j + u * step : j;
            SYMCOMM_UNROLL
            for (uint32_t p = 0; p < K; ++p) v[u][p] = load_pack(from[p] + first + ju * P);
        }
        SYMCOMM_UNROLL
        for (uint32_t u = 0; u < U; ++u) {
            if (j + u * step >= it.packs) break;
            const uint64_t i = first + (j + u * step) * P;
            PackAccumulator<T, Op> acc;
            acc.first(v[u][0]);
            SYMCOMM_UNROLL
            for (uint32_t p = 1; p < K; ++p) acc.add(v[u][p]);
            const Pack16<T> r = acc.result(K);
            store_pack(out + i, r);
            if (!Push) continue;
            SYMCOMM_UNROLL
            for (uint32_t d = 1; d < K; ++d) store_pack(to[me + d < K ? me + d : me + d - K] + i, r);
        }
    }
}

/// reduce_packs_k for 2 and 4 ranks, sums and averages (the large calls' operators; the others
/// keep fp8's compile time), parts of whole packs (aligned buffers: every CTA's part but the last
/// one's tail); false otherwise, and the caller runs the item loop. Out of line: the loop's
/// pointers and counts stay in registers (the collective's own values live in its local-memory
/// frame), and only this function holds the K * U loads' registers.
template <typename T, RedOp Op, bool Push>
SYMCOMM_DEVICE_NOINLINE bool reduce_packs(Cta g, WindowHandle<T> src, uint64_t src_off, WindowHandle<T> dst,
                                          uint64_t dst_off, T* out, Items<T> it, uint32_t n, uint32_t me) {
    if (it.head + it.tail != 0 || (Op != RedOp::Sum && Op != RedOp::Avg)) return false;
    switch (n) {
        case 2: reduce_packs_k<T, Op, 2, Push>(g, src, src_off, dst, dst_off, out, it, me); return true;
        case 4: reduce_packs_k<T, Op, 4, Push>(g, src, src_off, dst, dst_off, out, it, me); return true;
        default: return false;
    }
}

/// Where a collective reads this rank's own input and writes its output: input block q at
/// in + q * in_stride, output block p at out + p * out_stride. By default the rank's copies of the
/// windows (`windows`); the built-in kernel's staged calls (CollArgs::src_ptr / dst_ptr) name the
/// user's buffers instead. `fill`: `in` is not src's copy, so before its first barrier each CTA
/// copies into src's copy the part of its input that peers read (peers only reach the windows).
/// `direct`: `out` is not dst's copy (two-shot copies the shares peers pushed into dst there).
template <typename T>
struct Local {
    const T* in;
    T* out;
    uint64_t in_stride, out_stride;
    bool fill, direct;
};

/// The default Local: this rank's copies of `src` and `dst`, blocks `count` elements apart.
template <typename T>
SYMCOMM_DEVICE Local<T> windows(const WindowSlice<T>& src, const WindowSlice<T>& dst, uint64_t count) {
    return Local<T>{src.local_ptr(0), dst.local_ptr(0), count, count, false, false};
}

/// A staged call's input (`in`, blocks `in_stride` apart) copied into this rank's src (`staged`,
/// blocks `count` apart) where peers read it: elements [lo, hi) of blocks [0, nb), before the
/// collective's first barrier. Out of line: the copy's registers do not add to the collective's.
template <typename T>
SYMCOMM_DEVICE_NOINLINE void fill_blocks(Cta g, const T* in, uint64_t in_stride, T* staged, uint64_t count, uint32_t nb,
                                         uint64_t lo, uint64_t hi) {
    for (uint32_t q = 0; q < nb; ++q) copy_part(g, in + uint64_t(q) * in_stride, staged + uint64_t(q) * count, lo, hi);
}

/// fill_blocks when L says the input is staged (L.fill).
template <typename T>
SYMCOMM_DEVICE void fill(Cta g, const Local<T>& L, const WindowSlice<T>& src, uint64_t count, uint32_t nb, uint64_t lo,
                         uint64_t hi) {
    if (L.fill) fill_blocks(g, L.in, L.in_stride, src.local_ptr(0), count, nb, lo, hi);
}

/// Two-shot's staged input: the calling CTA's part of every rank's share, copied from `in` to this
/// rank's src (`staged`) before the first barrier. Out of line, as fill_blocks.
template <typename T>
SYMCOMM_DEVICE_NOINLINE void fill_shares(Cta g, uint32_t n, CollScope scope, const T* in, T* staged, uint64_t count) {
    for (uint32_t q = 0; q < n; ++q) {
        const Range share = two_shot_share<T>(n, count, q);
        const Part pq = part_of(scope, share.lo, share.hi, Pack16<T>::N);
        copy_part(g, in, staged, pq.lo, pq.hi);
    }
}

/// Two-shot's staged output: the calling CTA's parts of the shares of ranks other than `rank`,
/// which they pushed into this rank's dst (`pushed`), copied to `out`; then the CTA syncs. Out of
/// line, as fill_blocks.
template <typename T>
SYMCOMM_DEVICE_NOINLINE void copy_out_shares(Cta g, uint32_t n, uint32_t rank, CollScope scope, const T* pushed, T* out,
                                             uint64_t count) {
    for (uint32_t q = 0; q < n; ++q) {
        if (q == rank) continue;
        const Range share = two_shot_share<T>(n, count, q);
        const Part pq = part_of(scope, share.lo, share.hi, Pack16<T>::N);
        copy_part(g, pushed, out, pq.lo, pq.hi);
    }
    g.sync();
}

/// Whether `x` and `y` are slices of the same window.
template <typename T>
SYMCOMM_DEVICE bool same_window(const WindowSlice<T>& x, const WindowSlice<T>& y) {
    return x.window.raw.base == y.window.raw.base;
}

/// Same window, and do the first `na` elements of `x` and the first `nb` of `y` intersect?
template <typename T>
SYMCOMM_DEVICE bool overlaps(const WindowSlice<T>& x, uint64_t na, const WindowSlice<T>& y, uint64_t nb) {
    const uint64_t a = x.offset, b = y.offset;
    return same_window(x, y) && na > 0 && nb > 0 && a < b + nb && b < a + na;
}

/// Records InvalidArgument for collective `kind` with `reason` (SYMCOMM_REFUSED_*; one thread)
/// and returns it.
SYMCOMM_DEVICE Status refuse(Cta g, const DevComm& comm, uint32_t kind, uint32_t reason) {
    if (g.thread_rank() == 0) {
        record_error(Thread{}, comm, Status::InvalidArgument, comm.rank, SYMCOMM_OP_COLLECTIVE,
                     (uint64_t(reason) << 32) | kind);
    }
    return Status::InvalidArgument;
}

/// Why a collective on elements of `T` may not read `sblocks` blocks of `count` elements of `src`
/// and write `dblocks` blocks of `dst` (a SYMCOMM_REFUSED_* code), or 0.
/// Every input is the same on every rank of a correct program (the windows are symmetric; an
/// in-place all-gather's per-rank src.offset lies inside its output range), so every rank gives
/// the same answer and a refusal before the first barrier leaves no rank waiting.
template <typename T>
SYMCOMM_DEVICE uint32_t window_check(const DevComm& comm, const WindowSlice<T>& src, uint64_t sblocks,
                                     const WindowSlice<T>& dst, uint64_t dblocks, uint64_t count) {
    const uint32_t dt = uint32_t(TypeTraits<T>::dtype);
    // Every peer is addressed by loads and stores: all must be on this host.
    if (comm.ranks != 0 || src.window.raw.ranks != 0 || dst.window.raw.ranks != 0) return SYMCOMM_REFUSED_REMOTE;
    // Peers 0..comm.nranks-1 are addressed in both windows.
    if (src.nranks() != comm.nranks || dst.nranks() != comm.nranks) return SYMCOMM_REFUSED_PEER;
    if (!src.holds() || !dst.holds()) return SYMCOMM_REFUSED_ELEM_SIZE;
    if (!src.holds_dtype(dt) || !dst.holds_dtype(dt)) return SYMCOMM_REFUSED_DTYPE;
    if (!src.fits(count, sblocks)) return SYMCOMM_REFUSED_SRC_RANGE;
    if (!dst.fits(count, dblocks)) return SYMCOMM_REFUSED_DST_RANGE;
    return 0;
}

/// The fingerprint of a collective call; `in_place` is part of it (a rank calling in place and one
/// calling out of place would run different barrier sequences or read different buffers).
template <typename T>
SYMCOMM_DEVICE uint32_t coll_fingerprint(uint32_t kind, uint32_t redop, uint64_t count, uint32_t root, bool in_place) {
    return fingerprint(kind | (in_place ? 0x80000000u : 0u), uint32_t(TypeTraits<T>::dtype), redop, count, root);
}

}  // namespace detail

SYMCOMM_DEVICE CollScope grid_scope(uint32_t first_slot) { return CollScope{1u, first_slot}; }

SYMCOMM_DEVICE CollScope cta_scope(uint32_t slot) { return CollScope{0u, slot}; }

SYMCOMM_DEVICE uint64_t Range::size() const { return hi - lo; }

template <typename T>
SYMCOMM_DEVICE Range cta_part(CollScope scope, uint64_t count) {
    const detail::Part p = detail::part_of(scope, 0, count, Pack16<T>::N);
    return Range{p.lo, p.hi};
}

template <typename T>
SYMCOMM_DEVICE Range two_shot_part(CollScope scope, uint32_t nranks, uint64_t count, uint32_t q) {
    const Range share = detail::two_shot_share<T>(nranks, count, q);
    const detail::Part p = detail::part_of(scope, share.lo, share.hi, Pack16<T>::N);
    return Range{p.lo, p.hi};
}

namespace detail {

// The collectives, each with the Local it reads its own input from and writes its output to: the
// public functions below pass the windows' (`windows`), the built-in kernel a staged call's.

template <RedOp Op, typename T>
SYMCOMM_DEVICE Status all_reduce_one_shot(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                          WindowSlice<T> dst, uint64_t count, const Local<T>& L) {
    const uint32_t kind = SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT;
    if (const uint32_t why = window_check(comm, src, 1, dst, 1, count)) return refuse(g, comm, kind, why);
    const bool in_place = same_window(src, dst) && src.offset == dst.offset;
    if (!in_place && overlaps(src, count, dst, count)) return refuse(g, comm, kind, SYMCOMM_REFUSED_OVERLAP);
    const uint32_t fp = coll_fingerprint<T>(kind, uint32_t(Op), count, 0, in_place);
    const Part part = part_of(scope, 0, count, Pack16<T>::N);
    fill(g, L, src, count, 1, part.lo, part.hi);
    Status s = barrier(g, comm, part.slot, fp);
    if (s != Status::Ok) return s;
    const bool vec = phase(src.local_ptr(0)) == phase(L.out);
    const Items<T> it(part.lo, part.hi, vec, reinterpret_cast<uint64_t>(src.local_ptr(part.lo)));
    // Out of place, several packs per thread where reduce_packs takes the part; in place (rounds
    // with a barrier between the reads and the writes) and otherwise, one item at a time.
    if (in_place ||
        !reduce_packs<T, Op, false>(g, src.window, src.offset, src.window, src.offset, L.out, it, comm.nranks, 0)) {
        s = run_items<T>(
            g, comm, it, in_place, part.slot, fp,
            [&](uint64_t i, bool pk) { return reduce_item<T, Op>(src.window, src.offset + i, comm.nranks, pk); },
            [&](uint64_t i, const Pack16<T>& v, bool pk) { store_item(L.out + i, v, pk); });
        if (s != Status::Ok) return s;
    }
    if (in_place) {
        // The last round's stores, for every thread of the CTA (cta_part's promise).
        g.sync();
        return s;
    }
    return barrier(g, comm, part.slot, fp);
}

template <RedOp Op, typename T>
SYMCOMM_DEVICE Status all_reduce_two_shot(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                          WindowSlice<T> dst, uint64_t count, const Local<T>& L) {
    const uint32_t kind = SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT;
    if (const uint32_t why = window_check(comm, src, 1, dst, 1, count)) return refuse(g, comm, kind, why);
    const bool in_place = same_window(src, dst) && src.offset == dst.offset;
    if (!in_place && overlaps(src, count, dst, count)) return refuse(g, comm, kind, SYMCOMM_REFUSED_OVERLAP);
    const uint32_t fp = coll_fingerprint<T>(kind, uint32_t(Op), count, 0, in_place);
    const uint32_t P = Pack16<T>::N;
    const uint32_t n = comm.nranks;
    const Range mine = two_shot_share<T>(n, count, comm.rank);
    const Part part = part_of(scope, mine.lo, mine.hi, P);
    // Staged input: the part of every rank q's share that q's CTA of this index reduces.
    if (L.fill) fill_shares(g, n, scope, L.in, src.local_ptr(0), count);
    Status s = barrier(g, comm, part.slot, fp);
    if (s != Status::Ok) return s;
    const bool vec = phase(src.local_ptr(0)) == phase(dst.local_ptr(0)) && phase(src.local_ptr(0)) == phase(L.out);
    const Items<T> it(part.lo, part.hi, vec, reinterpret_cast<uint64_t>(src.local_ptr(part.lo)));
    // Push: the reduced share goes straight into every rank's dst (this rank's first), so the
    // gather needs no barrier of its own and no rank reads another's output. Only this rank reads
    // or writes the elements of its share, each by one thread that loads every rank's src[i]
    // before it stores any dst[i]: in place is safe without rounds. `me` is read once: `comm`
    // lives in local memory (reduce_item takes references), and reading comm.rank per store put
    // a local load before each of the n - 1 pushes (sm_90 SASS).
    const uint32_t me = comm.rank;
    if (!reduce_packs<T, Op, true>(g, src.window, src.offset, dst.window, dst.offset, L.out, it, n, me)) {
        run_items<T>(
            g, comm, it, false, part.slot, fp,
            [&](uint64_t i, bool pk) { return reduce_item<T, Op>(src.window, src.offset + i, n, pk); },
            [&](uint64_t i, const Pack16<T>& v, bool pk) {
                store_item(L.out + i, v, pk);  // this rank's dst, or its staged output
                for (uint32_t k = 1; k < n; ++k) {
                    const uint32_t q = me + k < n ? me + k : me + k - n;
                    store_item(dst.peer_ptr(q, i), v, pk);
                }
            });
    }
    // Every rank's pushes into this rank's dst, and this rank's into theirs, are complete and
    // visible on return (the barrier releases the CTA's stores and acquires the peers').
    s = barrier(g, comm, part.slot, fp);
    if (s != Status::Ok || !L.direct) return s;
    copy_out_shares(g, comm.nranks, comm.rank, scope, static_cast<const T*>(dst.local_ptr(0)), L.out, count);
    return s;
}

/// The LL rounds of the calling CTA on barrier index `slot`: returns the epoch of its last round
/// so far and advances the epoch word by `rounds`. The word is this CTA's alone: every thread
/// reads it before the sync, one thread stores the new value after it; the next call reads it
/// after this call's last vote.
SYMCOMM_DEVICE uint64_t ll_take_rounds(Cta g, const DevComm& comm, uint32_t slot, uint64_t rounds) {
    uint64_t* epoch_word = ll_epoch_word(comm, slot);
    const uint64_t e0 = ld_relaxed<Scope::Gpu>(epoch_word);
    g.sync();
    if (rounds > 0 && g.thread_rank() == 0) st_relaxed<Scope::Gpu>(epoch_word, e0 + rounds);
    return e0;
}

/// The sending half of LL round `epoch` for the calling CTA: lines [first, first + nl) of this
/// rank's `elems` elements for peer q at `in + q * stride` (Word8<T>::N per line; `aligned`: every
/// such address is 8-byte aligned; stride 0: the same elements to every peer) into every peer's
/// region for this rank, the regions' header lines (fingerprint `fp`), then the wait for every
/// peer's header of this round in this rank's area (Mismatch on another fingerprint). nl = 0 sends
/// the headers alone (a rank with nothing to send still takes part in the round). The CTA's common
/// status: on Ok every peer runs this round of the same call.
///
/// Reuse of a buffer: round e + 2 writes the buffer of round e. A rank writes it after its round
/// e + 1 ended (the CTA's last vote of the round, after its receiving half read every rank's lines
/// of round e + 1); each rank wrote those after its own round e ended, i.e. after it had read
/// every line of round e. So nobody still reads a line that a round overwrites.
template <typename T>
SYMCOMM_DEVICE Status ll_send_round(Cta g, const DevComm& comm, uint32_t slot, uint64_t epoch, uint32_t fp,
                                    const T* in, uint64_t stride, uint64_t elems, uint64_t first, uint64_t nl,
                                    bool aligned) {
    constexpr uint32_t E = Word8<T>::N;
    const uint32_t n = comm.nranks, r = comm.rank;
    const uint32_t flag = ll_flag(epoch);
    for (uint64_t j = g.thread_rank(); j < nl; j += g.size()) {
        const uint64_t at = (first + j) * E;
        const uint32_t m = uint32_t(min_u64(elems - at, E));
        const bool whole = aligned && m == E;
        // The first peer's line (the only one to load when stride is 0).
        const uint32_t q1 = r + 1u < n ? r + 1u : 0u;
        Word8<T> v = ll_gather(in + uint64_t(q1) * stride + at, m, whole);
        for (uint32_t d = 1; d < n; ++d) {
            const uint32_t q = r + d < n ? r + d : r + d - n;
            if (stride != 0 && d > 1) v = ll_gather(in + uint64_t(q) * stride + at, m, whole);
            ll_put(ll_region(comm, q, slot, epoch, r) + 1u + j, v.w[0], v.w[1], flag);
        }
    }
    for (uint32_t q = g.thread_rank(); q < n; q += g.size()) {
        if (q != r) ll_put(ll_region(comm, q, slot, epoch, r), fp, fp, flag);
    }
    Status s = Status::Ok;
    for (uint32_t p = g.thread_rank(); p < n && s == Status::Ok; p += g.size()) {
        if (p == r) continue;
        uint32_t w[2];
        s = ll_wait(Thread{}, comm, ll_region(comm, r, slot, epoch, p), flag, p, uint64_t(slot) << 32, w);
        if (s == Status::Ok && w[0] != fp) {
            record_error(Thread{}, comm, Status::Mismatch, p, SYMCOMM_OP_LL_WAIT, (uint64_t(slot) << 32) | w[0]);
            s = Status::Mismatch;
        }
    }
    return group_status(g, s);
}

/// Waits (bounded) for line `j` (0-based, after the header) of rank `p`'s region in this rank's LL
/// area in round `epoch` (whose flag is `flag`, ll_flag(epoch), computed once per round), and
/// gives its data.
template <typename T>
SYMCOMM_DEVICE Status ll_receive(const DevComm& comm, uint32_t slot, uint64_t epoch, uint32_t flag, uint32_t p,
                                 uint64_t j, Word8<T>& v) {
    return ll_wait(Thread{}, comm, ll_region(comm, comm.rank, slot, epoch, p) + 1u + j, flag, p,
                   (uint64_t(slot) << 32) | (1u + j), v.w);
}

template <RedOp Op, typename T>
SYMCOMM_DEVICE Status all_reduce_ll(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                    WindowSlice<T> dst, uint64_t count, const Local<T>& L) {
    const uint32_t kind = SYMCOMM_COLL_ALL_REDUCE_LL;
    if (const uint32_t why = window_check(comm, src, 1, dst, 1, count)) return refuse(g, comm, kind, why);
    const bool in_place = same_window(src, dst) && src.offset == dst.offset;
    if (!in_place && overlaps(src, count, dst, count)) return refuse(g, comm, kind, SYMCOMM_REFUSED_OVERLAP);
    const Part part = part_of(scope, 0, count, Pack16<T>::N);
    if (comm.ll_lines < 2 || part.slot >= SYMCOMM_USER_BARRIER_END) return refuse(g, comm, kind, SYMCOMM_REFUSED_LL);
    const uint32_t fp = coll_fingerprint<T>(kind, uint32_t(Op), count, 0, in_place);
    const uint32_t n = comm.nranks, r = comm.rank, slot = part.slot;
    constexpr uint32_t E = Word8<T>::N;
    const uint64_t per_round = comm.ll_lines - 1u;  // line 0 of a region: the round's header
    const uint64_t elems = part.hi - part.lo;
    const uint64_t lines = (elems + E - 1u) / E;
    const uint64_t rounds = (lines + per_round - 1u) / per_round;
    const T* in = L.in + part.lo;
    T* out = L.out + part.lo;
    const bool aligned = ((reinterpret_cast<uint64_t>(in) | reinterpret_cast<uint64_t>(out)) & 7u) == 0;
    const uint64_t e0 = ll_take_rounds(g, comm, slot, rounds);
    for (uint64_t k = 0; k < rounds; ++k) {
        const uint64_t epoch = e0 + 1u + k;
        const uint32_t flag = ll_flag(epoch);
        const uint64_t first = k * per_round;
        const uint64_t nl = min_u64(lines - first, per_round);
        Status s = ll_send_round(g, comm, slot, epoch, fp, in, 0, elems, first, nl, aligned);
        if (s != Status::Ok) return s;
        // Receive: every rank's line, in rank order (this rank's from its own input).
        for (uint64_t j = g.thread_rank(); j < nl && s == Status::Ok; j += g.size()) {
            const uint64_t at = (first + j) * E;
            const uint32_t m = uint32_t(min_u64(elems - at, E));
            const bool whole = aligned && m == E;
            Accumulator<T, Op> acc[E];
            for (uint32_t p = 0; p < n && s == Status::Ok; ++p) {
                Word8<T> v;
                if (p == r) {
                    v = ll_gather(in + at, m, whole);
                } else {
                    s = ll_receive(comm, slot, epoch, flag, p, j, v);
                }
                for (uint32_t x = 0; x < E; ++x) {
                    if (p == 0) {
                        acc[x].first(v.e[x]);
                    } else {
                        acc[x].add(v.e[x]);
                    }
                }
            }
            if (s != Status::Ok) break;
            Word8<T> res;
            for (uint32_t x = 0; x < E; ++x) res.e[x] = acc[x].result(n);
            ll_scatter(out + at, res, m, whole);
        }
        // Ends the round for the whole CTA (the vote synchronizes it; see ll_send_round).
        s = group_status(g, s);
        if (s != Status::Ok) return s;
    }
    return Status::Ok;
}

template <typename T>
SYMCOMM_DEVICE Status all_gather_ll(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                    WindowSlice<T> dst, uint64_t count, const Local<T>& L) {
    const uint32_t kind = SYMCOMM_COLL_ALL_GATHER_LL;
    const uint32_t n = comm.nranks, r = comm.rank;
    if (const uint32_t why = window_check(comm, src, 1, dst, n, count)) return refuse(g, comm, kind, why);
    const bool in_place = same_window(src, dst) && src.offset == dst.offset + uint64_t(r) * count;
    if (!in_place && overlaps(src, count, dst, count * n)) return refuse(g, comm, kind, SYMCOMM_REFUSED_OVERLAP);
    const Part part = part_of(scope, 0, count, Pack16<T>::N);
    if (comm.ll_lines < 2 || part.slot >= SYMCOMM_USER_BARRIER_END) return refuse(g, comm, kind, SYMCOMM_REFUSED_LL);
    const uint32_t fp = coll_fingerprint<T>(kind, 0, count, 0, in_place);
    const uint32_t slot = part.slot;
    constexpr uint32_t E = Word8<T>::N;
    const uint64_t per_round = comm.ll_lines - 1u;
    const uint64_t elems = part.hi - part.lo;
    const uint64_t lines = (elems + E - 1u) / E;
    const uint64_t rounds = (lines + per_round - 1u) / per_round;
    const T* in = L.in + part.lo;
    const bool in_aligned = (reinterpret_cast<uint64_t>(in) & 7u) == 0;
    const uint64_t e0 = ll_take_rounds(g, comm, slot, rounds);
    for (uint64_t k = 0; k < rounds; ++k) {
        const uint64_t epoch = e0 + 1u + k;
        const uint32_t flag = ll_flag(epoch);
        const uint64_t first = k * per_round;
        const uint64_t nl = min_u64(lines - first, per_round);
        Status s = ll_send_round(g, comm, slot, epoch, fp, in, 0, elems, first, nl, in_aligned);
        if (s != Status::Ok) return s;
        // Receive: every peer's line into its block (in place, this rank's block holds its input
        // already; out of place it is copied from the input).
        for (uint64_t j = g.thread_rank(); j < nl && s == Status::Ok; j += g.size()) {
            const uint64_t at = (first + j) * E;
            const uint32_t m = uint32_t(min_u64(elems - at, E));
            for (uint32_t p = 0; p < n && s == Status::Ok; ++p) {
                if (p == r && in_place) continue;
                T* out = L.out + uint64_t(p) * L.out_stride + part.lo;
                Word8<T> v;
                if (p == r) {
                    v = ll_gather(in + at, m, in_aligned && m == E);
                } else {
                    s = ll_receive(comm, slot, epoch, flag, p, j, v);
                    if (s != Status::Ok) break;
                }
                ll_scatter(out + at, v, m, m == E && (reinterpret_cast<uint64_t>(out) & 7u) == 0);
            }
        }
        s = group_status(g, s);
        if (s != Status::Ok) return s;
    }
    return Status::Ok;
}

template <RedOp Op, typename T>
SYMCOMM_DEVICE Status reduce_scatter_ll(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                        WindowSlice<T> dst, uint64_t count, const Local<T>& L) {
    const uint32_t kind = SYMCOMM_COLL_REDUCE_SCATTER_LL;
    const uint32_t n = comm.nranks, r = comm.rank;
    if (const uint32_t why = window_check(comm, src, n, dst, 1, count)) return refuse(g, comm, kind, why);
    const bool in_place = same_window(src, dst) && dst.offset == src.offset + uint64_t(r) * count;
    if (!in_place && overlaps(src, count * n, dst, count)) return refuse(g, comm, kind, SYMCOMM_REFUSED_OVERLAP);
    const Part part = part_of(scope, 0, count, Pack16<T>::N);
    if (comm.ll_lines < 2 || part.slot >= SYMCOMM_USER_BARRIER_END) return refuse(g, comm, kind, SYMCOMM_REFUSED_LL);
    const uint32_t fp = coll_fingerprint<T>(kind, uint32_t(Op), count, 0, in_place);
    const uint32_t slot = part.slot;
    constexpr uint32_t E = Word8<T>::N;
    const uint64_t per_round = comm.ll_lines - 1u;
    const uint64_t elems = part.hi - part.lo;
    const uint64_t lines = (elems + E - 1u) / E;
    const uint64_t rounds = (lines + per_round - 1u) / per_round;
    // Block q of this CTA's part at in + q * stride: sent to rank q; this rank's own at mine.
    const uint64_t stride = L.in_stride;
    const T* in = L.in + part.lo;
    const T* mine = in + uint64_t(r) * stride;
    T* out = L.out + part.lo;
    const bool aligned =
        ((reinterpret_cast<uint64_t>(in) | reinterpret_cast<uint64_t>(out) | (stride * sizeof(T))) & 7u) == 0;
    const uint64_t e0 = ll_take_rounds(g, comm, slot, rounds);
    for (uint64_t k = 0; k < rounds; ++k) {
        const uint64_t epoch = e0 + 1u + k;
        const uint32_t flag = ll_flag(epoch);
        const uint64_t first = k * per_round;
        const uint64_t nl = min_u64(lines - first, per_round);
        Status s = ll_send_round(g, comm, slot, epoch, fp, in, stride, elems, first, nl, aligned);
        if (s != Status::Ok) return s;
        // Receive: every rank's line of this rank's block, reduced in rank order (this rank's
        // from its own input), as all_reduce_ll.
        for (uint64_t j = g.thread_rank(); j < nl && s == Status::Ok; j += g.size()) {
            const uint64_t at = (first + j) * E;
            const uint32_t m = uint32_t(min_u64(elems - at, E));
            const bool whole = aligned && m == E;
            Accumulator<T, Op> acc[E];
            for (uint32_t p = 0; p < n && s == Status::Ok; ++p) {
                Word8<T> v;
                if (p == r) {
                    v = ll_gather(mine + at, m, whole);
                } else {
                    s = ll_receive(comm, slot, epoch, flag, p, j, v);
                }
                for (uint32_t x = 0; x < E; ++x) {
                    if (p == 0) {
                        acc[x].first(v.e[x]);
                    } else {
                        acc[x].add(v.e[x]);
                    }
                }
            }
            if (s != Status::Ok) break;
            Word8<T> res;
            for (uint32_t x = 0; x < E; ++x) res.e[x] = acc[x].result(n);
            ll_scatter(out + at, res, m, whole);
        }
        s = group_status(g, s);
        if (s != Status::Ok) return s;
    }
    return Status::Ok;
}

template <typename T>
SYMCOMM_DEVICE Status broadcast_ll(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                   WindowSlice<T> dst, uint64_t count, uint32_t root, const Local<T>& L) {
    const uint32_t kind = SYMCOMM_COLL_BROADCAST_LL;
    const uint32_t r = comm.rank;
    if (const uint32_t why = window_check(comm, src, 1, dst, 1, count)) return refuse(g, comm, kind, why);
    if (root >= comm.nranks) return refuse(g, comm, kind, SYMCOMM_REFUSED_ROOT);
    const bool in_place = same_window(src, dst) && src.offset == dst.offset;
    if (!in_place && overlaps(src, count, dst, count)) return refuse(g, comm, kind, SYMCOMM_REFUSED_OVERLAP);
    const Part part = part_of(scope, 0, count, Pack16<T>::N);
    if (comm.ll_lines < 2 || part.slot >= SYMCOMM_USER_BARRIER_END) return refuse(g, comm, kind, SYMCOMM_REFUSED_LL);
    const uint32_t fp = coll_fingerprint<T>(kind, 0, count, root, in_place);
    const uint32_t slot = part.slot;
    constexpr uint32_t E = Word8<T>::N;
    const uint64_t per_round = comm.ll_lines - 1u;
    const uint64_t elems = part.hi - part.lo;
    const uint64_t lines = (elems + E - 1u) / E;
    const uint64_t rounds = (lines + per_round - 1u) / per_round;
    const T* in = L.in + part.lo;
    T* out = L.out + part.lo;
    const bool aligned = ((reinterpret_cast<uint64_t>(in) | reinterpret_cast<uint64_t>(out)) & 7u) == 0;
    const uint64_t e0 = ll_take_rounds(g, comm, slot, rounds);
    for (uint64_t k = 0; k < rounds; ++k) {
        const uint64_t epoch = e0 + 1u + k;
        const uint32_t flag = ll_flag(epoch);
        const uint64_t first = k * per_round;
        const uint64_t nl = min_u64(lines - first, per_round);
        // Only the root sends lines; every rank sends and checks the round's headers (the
        // buffer reuse argument of ll_send_round needs every rank's).
        Status s = ll_send_round(g, comm, slot, epoch, fp, in, 0, elems, first, r == root ? nl : 0u, aligned);
        if (s != Status::Ok) return s;
        // Receive: the root's line (the root copies its input, out of place).
        if (r != root || !in_place) {
            for (uint64_t j = g.thread_rank(); j < nl && s == Status::Ok; j += g.size()) {
                const uint64_t at = (first + j) * E;
                const uint32_t m = uint32_t(min_u64(elems - at, E));
                const bool whole = aligned && m == E;
                Word8<T> v;
                if (r == root) {
                    v = ll_gather(in + at, m, whole);
                } else {
                    s = ll_receive(comm, slot, epoch, flag, root, j, v);
                    if (s != Status::Ok) break;
                }
                ll_scatter(out + at, v, m, whole);
            }
        }
        s = group_status(g, s);
        if (s != Status::Ok) return s;
    }
    return Status::Ok;
}

template <typename T>
SYMCOMM_DEVICE Status all_gather(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                 WindowSlice<T> dst, uint64_t count, const Local<T>& L) {
    const uint32_t kind = SYMCOMM_COLL_ALL_GATHER;
    const uint32_t n = comm.nranks;
    if (const uint32_t why = window_check(comm, src, 1, dst, n, count)) return refuse(g, comm, kind, why);
    const bool in_place = same_window(src, dst) && src.offset == dst.offset + uint64_t(comm.rank) * count;
    if (!in_place && overlaps(src, count, dst, count * n)) return refuse(g, comm, kind, SYMCOMM_REFUSED_OVERLAP);
    const uint32_t fp = coll_fingerprint<T>(kind, 0, count, 0, in_place);
    const Part part = part_of(scope, 0, count, Pack16<T>::N);
    fill(g, L, src, count, 1, part.lo, part.hi);
    Status s = barrier(g, comm, part.slot, fp);
    if (s != Status::Ok) return s;
    for (uint32_t p = 0; p < n; ++p) {
        // In place, rank p's input sits in its own block of the output.
        const WindowSlice<T> from = in_place ? dst.at(uint64_t(p) * count) : src;
        copy_part(g, from.peer_ptr(p, 0), L.out + uint64_t(p) * L.out_stride, part.lo, part.hi);
    }
    return barrier(g, comm, part.slot, fp);
}

template <RedOp Op, typename T>
SYMCOMM_DEVICE Status reduce_scatter(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                     WindowSlice<T> dst, uint64_t count, const Local<T>& L) {
    const uint32_t kind = SYMCOMM_COLL_REDUCE_SCATTER;
    const uint32_t n = comm.nranks;
    if (const uint32_t why = window_check(comm, src, n, dst, 1, count)) return refuse(g, comm, kind, why);
    const WindowSlice<T> sblock = src.at(uint64_t(comm.rank) * count);
    const bool in_place = same_window(src, dst) && dst.offset == sblock.offset;
    if (!in_place && overlaps(src, count * n, dst, count)) return refuse(g, comm, kind, SYMCOMM_REFUSED_OVERLAP);
    const uint32_t fp = coll_fingerprint<T>(kind, uint32_t(Op), count, 0, in_place);
    const Part part = part_of(scope, 0, count, Pack16<T>::N);
    fill(g, L, src, count, n, part.lo, part.hi);
    Status s = barrier(g, comm, part.slot, fp);
    if (s != Status::Ok) return s;
    const bool vec = phase(sblock.local_ptr(0)) == phase(L.out);
    const Items<T> it(part.lo, part.hi, vec, reinterpret_cast<uint64_t>(sblock.local_ptr(part.lo)));
    run_items<T>(
        g, comm, it, false, part.slot, fp,
        [&](uint64_t i, bool pk) { return reduce_item<T, Op>(sblock.window, sblock.offset + i, n, pk); },
        [&](uint64_t i, const Pack16<T>& v, bool pk) { store_item(L.out + i, v, pk); });
    return barrier(g, comm, part.slot, fp);
}

template <typename T>
SYMCOMM_DEVICE Status broadcast(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                WindowSlice<T> dst, uint64_t count, uint32_t root, const Local<T>& L) {
    const uint32_t kind = SYMCOMM_COLL_BROADCAST;
    if (const uint32_t why = window_check(comm, src, 1, dst, 1, count)) return refuse(g, comm, kind, why);
    if (root >= comm.nranks) return refuse(g, comm, kind, SYMCOMM_REFUSED_ROOT);
    const bool in_place = same_window(src, dst) && src.offset == dst.offset;
    if (!in_place && overlaps(src, count, dst, count)) return refuse(g, comm, kind, SYMCOMM_REFUSED_OVERLAP);
    const uint32_t fp = coll_fingerprint<T>(kind, 0, count, root, in_place);
    const Part part = part_of(scope, 0, count, Pack16<T>::N);
    if (comm.rank == root) fill(g, L, src, count, 1, part.lo, part.hi);
    Status s = barrier(g, comm, part.slot, fp);
    if (s != Status::Ok) return s;
    copy_part(g, static_cast<const T*>(src.peer_ptr(root, 0)), L.out, part.lo, part.hi);
    return barrier(g, comm, part.slot, fp);
}

template <RedOp Op, typename T>
SYMCOMM_DEVICE Status reduce(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                             WindowSlice<T> dst, uint64_t count, uint32_t root, const Local<T>& L) {
    const uint32_t kind = SYMCOMM_COLL_REDUCE;
    if (const uint32_t why = window_check(comm, src, 1, dst, 1, count)) return refuse(g, comm, kind, why);
    if (root >= comm.nranks) return refuse(g, comm, kind, SYMCOMM_REFUSED_ROOT);
    const bool in_place = same_window(src, dst) && src.offset == dst.offset;
    if (!in_place && overlaps(src, count, dst, count)) return refuse(g, comm, kind, SYMCOMM_REFUSED_OVERLAP);
    const uint32_t fp = coll_fingerprint<T>(kind, uint32_t(Op), count, root, in_place);
    const Part part = part_of(scope, 0, count, Pack16<T>::N);
    fill(g, L, src, count, 1, part.lo, part.hi);
    Status s = barrier(g, comm, part.slot, fp);
    if (s != Status::Ok) return s;
    if (comm.rank == root) {
        const bool vec = phase(src.local_ptr(0)) == phase(L.out);
        const Items<T> it(part.lo, part.hi, vec, reinterpret_cast<uint64_t>(src.local_ptr(part.lo)));
        run_items<T>(
            g, comm, it, false, part.slot, fp,
            [&](uint64_t i, bool pk) { return reduce_item<T, Op>(src.window, src.offset + i, comm.nranks, pk); },
            [&](uint64_t i, const Pack16<T>& v, bool pk) { store_item(L.out + i, v, pk); });
    }
    return barrier(g, comm, part.slot, fp);
}

template <typename T>
SYMCOMM_DEVICE Status scatter(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                              WindowSlice<T> dst, uint64_t count, uint32_t root, const Local<T>& L) {
    const uint32_t kind = SYMCOMM_COLL_SCATTER;
    if (const uint32_t why = window_check(comm, src, comm.nranks, dst, 1, count)) {
        return refuse(g, comm, kind, why);
    }
    if (root >= comm.nranks) return refuse(g, comm, kind, SYMCOMM_REFUSED_ROOT);
    const WindowSlice<T> sblock = src.at(uint64_t(comm.rank) * count);
    const bool in_place = same_window(src, dst) && dst.offset == sblock.offset;
    if (!in_place && overlaps(src, count * comm.nranks, dst, count)) {
        return refuse(g, comm, kind, SYMCOMM_REFUSED_OVERLAP);
    }
    const uint32_t fp = coll_fingerprint<T>(kind, 0, count, root, in_place);
    const Part part = part_of(scope, 0, count, Pack16<T>::N);
    if (comm.rank == root) fill(g, L, src, count, comm.nranks, part.lo, part.hi);
    Status s = barrier(g, comm, part.slot, fp);
    if (s != Status::Ok) return s;
    copy_part(g, static_cast<const T*>(sblock.peer_ptr(root, 0)), L.out, part.lo, part.hi);
    return barrier(g, comm, part.slot, fp);
}

template <typename T>
SYMCOMM_DEVICE Status all_to_all(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                 WindowSlice<T> dst, uint64_t count, const Local<T>& L) {
    const uint32_t kind = SYMCOMM_COLL_ALL_TO_ALL;
    const uint32_t n = comm.nranks;
    const uint32_t r = comm.rank;
    if (const uint32_t why = window_check(comm, src, n, dst, n, count)) return refuse(g, comm, kind, why);
    const bool in_place = same_window(src, dst) && src.offset == dst.offset;
    if (in_place && g.size() < n) return refuse(g, comm, kind, SYMCOMM_REFUSED_CTA_SIZE);
    if (!in_place && overlaps(src, count * n, dst, count * n)) return refuse(g, comm, kind, SYMCOMM_REFUSED_OVERLAP);
    const uint32_t fp = coll_fingerprint<T>(kind, 0, count, 0, in_place);
    const Part part = part_of(scope, 0, count, Pack16<T>::N);
    fill(g, L, src, count, n, part.lo, part.hi);
    Status s = barrier(g, comm, part.slot, fp);
    if (s != Status::Ok) return s;
    if (!in_place) {
        for (uint32_t p = 0; p < n; ++p) {
            copy_part(g, static_cast<const T*>(src.peer_ptr(p, uint64_t(r) * count)),
                      L.out + uint64_t(p) * L.out_stride, part.lo, part.hi);
        }
        return barrier(g, comm, part.slot, fp);
    }
    // In place: item (k, p) moves item k of block r of peer p's buffer into item k of block p of
    // ours, and peer p moves item k of our block p in the same round (items are numbered k-major
    // and rounds hold whole k), so nothing is overwritten before its reader read it.
    const bool vec = (count * sizeof(T)) % 16 == 0 && (L.out_stride * sizeof(T)) % 16 == 0 &&
                     phase(src.local_ptr(0)) == phase(L.out);
    const Items<T> it(part.lo, part.hi, vec, reinterpret_cast<uint64_t>(src.local_ptr(part.lo)));
    const uint64_t total = it.total() * n;
    const uint32_t round = g.size() / n * n;
    for (uint64_t base = 0; base < total; base += round) {
        const uint64_t c = base + g.thread_rank();
        const bool active = g.thread_rank() < round && c < total;
        bool is_pack = false;
        uint64_t i = 0;
        uint32_t p = 0;
        Pack16<T> v;
        if (active) {
            p = uint32_t(c % n);
            i = it.first(c / n, is_pack);
            v = load_item(src.peer_ptr(p, uint64_t(r) * count + i), is_pack);
        }
        s = barrier(g, comm, part.slot, fp);
        if (s != Status::Ok) return s;
        if (active) store_item(L.out + uint64_t(p) * L.out_stride + i, v, is_pack);
    }
    // The last round's stores, for every thread of the CTA (cta_part's promise).
    g.sync();
    return Status::Ok;
}

}  // namespace detail

template <RedOp Op, typename T>
SYMCOMM_DEVICE Status all_reduce_one_shot(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                          WindowSlice<T> dst, uint64_t count) {
    return detail::all_reduce_one_shot<Op>(g, comm, scope, src, dst, count, detail::windows(src, dst, count));
}

template <RedOp Op, typename T>
SYMCOMM_DEVICE Status all_reduce_two_shot(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                          WindowSlice<T> dst, uint64_t count) {
    return detail::all_reduce_two_shot<Op>(g, comm, scope, src, dst, count, detail::windows(src, dst, count));
}

template <RedOp Op, typename T>
SYMCOMM_DEVICE Status all_reduce_ll(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                    WindowSlice<T> dst, uint64_t count) {
    return detail::all_reduce_ll<Op>(g, comm, scope, src, dst, count, detail::windows(src, dst, count));
}

template <typename T>
SYMCOMM_DEVICE Status all_gather_ll(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                    WindowSlice<T> dst, uint64_t count) {
    return detail::all_gather_ll<T>(g, comm, scope, src, dst, count, detail::windows(src, dst, count));
}

template <RedOp Op, typename T>
SYMCOMM_DEVICE Status reduce_scatter_ll(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                        WindowSlice<T> dst, uint64_t count) {
    return detail::reduce_scatter_ll<Op>(g, comm, scope, src, dst, count, detail::windows(src, dst, count));
}

template <typename T>
SYMCOMM_DEVICE Status broadcast_ll(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                   WindowSlice<T> dst, uint64_t count, uint32_t root) {
    return detail::broadcast_ll<T>(g, comm, scope, src, dst, count, root, detail::windows(src, dst, count));
}

template <typename T>
SYMCOMM_DEVICE Status all_gather(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                 WindowSlice<T> dst, uint64_t count) {
    return detail::all_gather<T>(g, comm, scope, src, dst, count, detail::windows(src, dst, count));
}

template <RedOp Op, typename T>
SYMCOMM_DEVICE Status reduce_scatter(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                     WindowSlice<T> dst, uint64_t count) {
    return detail::reduce_scatter<Op>(g, comm, scope, src, dst, count, detail::windows(src, dst, count));
}

template <typename T>
SYMCOMM_DEVICE Status broadcast(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                WindowSlice<T> dst, uint64_t count, uint32_t root) {
    return detail::broadcast<T>(g, comm, scope, src, dst, count, root, detail::windows(src, dst, count));
}

template <RedOp Op, typename T>
SYMCOMM_DEVICE Status reduce(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                             WindowSlice<T> dst, uint64_t count, uint32_t root) {
    return detail::reduce<Op>(g, comm, scope, src, dst, count, root, detail::windows(src, dst, count));
}

template <typename T>
SYMCOMM_DEVICE Status scatter(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                              WindowSlice<T> dst, uint64_t count, uint32_t root) {
    return detail::scatter<T>(g, comm, scope, src, dst, count, root, detail::windows(src, dst, count));
}

template <typename T>
SYMCOMM_DEVICE Status all_to_all(Cta g, const DevComm& comm, CollScope scope, WindowSlice<T> src,
                                 WindowSlice<T> dst, uint64_t count) {
    return detail::all_to_all<T>(g, comm, scope, src, dst, count, detail::windows(src, dst, count));
}

}  // namespace symcomm

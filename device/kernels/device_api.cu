// Test kernels of the public device API (issue 9 §5): each instantiates public templates that no
// built-in kernel uses — barrier<Thread> / <Warp> / <Cta> with user fingerprints, the group
// signal_wait_until, semaphore_signal / semaphore_wait for every group, grid_sync, and
// record_user_error — and checks the data that those primitives order. They ship in the image
// next to the ping-pong kernel so that the same kernels run on the emulator (tests/emu_device_api.rs,
// device/emu/tests/tsan_device_api.cpp under ThreadSanitizer) and on a GPU.
//
// Groups are chosen at run time by `group` (GROUP_THREAD / _WARP / _CTA; each kernel says which
// block sizes go with which). Results are small arrays of device memory that the host zeroes
// before each launch: [status, wrong words, rounds or phases done].
#include <symcomm/symcomm.cuh>

namespace {

using namespace symcomm;

constexpr uint32_t GROUP_THREAD = 0;
constexpr uint32_t GROUP_WARP = 1;
constexpr uint32_t GROUP_CTA = 2;

/// `fn(G{}, args...)` with the group `group` names: Thread for GROUP_THREAD, Warp for GROUP_WARP,
/// else Cta. (A macro, not a template taking a lambda: NVRTC treats a lambda in a kernel as a
/// host function.)
#define WITH_GROUP(group, fn, ...)           \
    do {                                     \
        if ((group) == GROUP_THREAD) {       \
            fn(Thread{}, __VA_ARGS__);       \
        } else if ((group) == GROUP_WARP) {  \
            fn(Warp{}, __VA_ARGS__);         \
        } else {                             \
            fn(Cta{}, __VA_ARGS__);          \
        }                                    \
    } while (0)

/// Semaphore words of the ring: data ready (from the previous rank), data consumed (from the next).
constexpr uint32_t WORD_DATA = 0;
constexpr uint32_t WORD_ACK = 1;
/// Signal word of symcomm_test_group_wait.
constexpr uint32_t WORD_GROUP_WAIT = 2;

SYMCOMM_DEVICE uint32_t test_value(uint64_t round, uint32_t a, uint32_t i) {
    return uint32_t(round * 1000003u) ^ (a * 40503u) ^ (i * 2654435761u);
}

/// The semaphore ring on one group per rank (see symcomm_test_semaphore_ring).
template <typename Group>
SYMCOMM_DEVICE void semaphore_ring(Group g, const DevComm& comm, WindowHandleRaw win, uint32_t rounds, uint32_t words,
                                   uint64_t* state, uint32_t* result) {
    const uint32_t n = comm.nranks;
    const uint32_t rank = comm.rank;
    const uint32_t next = (rank + 1) % n;
    const uint32_t prev = (rank + n - 1) % n;
    uint32_t* inbox = static_cast<uint32_t*>(peer_ptr(win, rank, 0));
    uint32_t* outbox = static_cast<uint32_t*>(peer_ptr(win, next, 0));
    // Every thread reads the rounds sent so far before thread 0 advances it (a group sync lies
    // between this read and that write).
    const uint64_t base = ld_relaxed<Scope::Gpu>(&state[2]);
    Status s = Status::Ok;
    uint32_t wrong = 0;
    uint32_t done = 0;
    for (uint32_t k = 0; k < rounds; ++k) {
        const uint64_t round = base + k + 1;
        // The next rank consumed the previous round's data in its inbox (our outbox).
        if (round > 1) {
            s = semaphore_wait(g, comm, next, WORD_ACK, &state[1]);
            if (s != Status::Ok) break;
        }
        for (uint32_t i = g.thread_rank(); i < words; i += g.size()) outbox[i] = test_value(round, rank, i);
        g.sync();  // the group's writes before thread 0's release-add
        if (g.thread_rank() == 0) semaphore_signal(Thread{}, comm, next, WORD_DATA);
        s = semaphore_wait(g, comm, prev, WORD_DATA, &state[0]);
        if (s != Status::Ok) break;
        for (uint32_t i = g.thread_rank(); i < words; i += g.size()) wrong += inbox[i] != test_value(round, prev, i);
        g.sync();  // every read of the inbox before the acknowledgement lets the previous rank reuse it
        if (g.thread_rank() == 0) semaphore_signal(Thread{}, comm, prev, WORD_ACK);
        ++done;
    }
    atomicAdd(&result[1], wrong);
    g.sync();
    if (g.thread_rank() == 0) {
        st_relaxed<Scope::Gpu>(&state[2], base + done);
        result[0] = uint32_t(s);
        result[2] = done;
    }
}

/// The barrier exchange of symcomm_test_barrier on one group (`slot` of the CTA's groups).
template <typename Group>
SYMCOMM_DEVICE void barrier_exchange(Group g, uint32_t slot, const DevComm& comm, WindowHandleRaw win,
                                     uint32_t index, uint32_t tag, uint32_t rounds, uint32_t words, uint32_t* result) {
    const uint32_t rank = comm.rank;
    const uint32_t peer = (rank + 1) % comm.nranks;
    uint32_t* mine = static_cast<uint32_t*>(peer_ptr(win, rank, 0)) + slot * words;
    const uint32_t* theirs = static_cast<const uint32_t*>(peer_ptr(win, peer, 0)) + slot * words;
    const uint32_t fp = user_fingerprint(tag, words);
    Status s = Status::Ok;
    uint32_t wrong = 0;
    uint32_t done = 0;
    for (uint32_t k = 0; k < rounds; ++k) {
        for (uint32_t i = g.thread_rank(); i < words; i += g.size()) mine[i] = test_value(k, rank, i);
        s = barrier(g, comm, index + slot, fp);
        if (s != Status::Ok) break;
        for (uint32_t i = g.thread_rank(); i < words; i += g.size()) wrong += theirs[i] != test_value(k, peer, i);
        // No rank overwrites its copy (next round, next launch) while a peer still reads it.
        s = barrier(g, comm, index + slot, fp);
        if (s != Status::Ok) break;
        ++done;
    }
    atomicAdd(&result[1], wrong);
    if (g.thread_rank() == 0) {
        atomicMax(&result[0], uint32_t(s));
        atomicAdd(&result[2], done);
    }
}

/// symcomm_test_group_wait on one group.
template <typename Group>
SYMCOMM_DEVICE void group_wait(Group g, const DevComm& comm, WindowHandleRaw win, uint32_t words, uint64_t epoch,
                               uint32_t* result) {
    uint32_t wrong = 0;
    Status s = Status::Ok;
    if (comm.rank == 0) {
        uint32_t* out = static_cast<uint32_t*>(peer_ptr(win, 1, 0));
        for (uint32_t i = g.thread_rank(); i < words; i += g.size()) out[i] = test_value(epoch, 0, i);
        g.sync();
        if (g.thread_rank() == 0) s = signal_set(Thread{}, comm, 1, WORD_GROUP_WAIT, epoch);
    } else {
        s = signal_wait_until(g, comm, 0, WORD_GROUP_WAIT, epoch);
        const uint32_t* in = static_cast<const uint32_t*>(peer_ptr(win, 1, 0));
        if (s == Status::Ok) {
            for (uint32_t i = g.thread_rank(); i < words; i += g.size()) wrong += in[i] != test_value(epoch, 0, i);
        }
    }
    atomicAdd(&result[1], wrong);
    if (g.thread_rank() == 0) atomicMax(&result[0], uint32_t(s));
}

}  // namespace

/// Semaphore ring: round k, every rank writes `words` words into the next rank's copy of `win`,
/// semaphore_signal()s it, semaphore_wait()s for the previous rank's data, checks it and
/// acknowledges it through a second semaphore; a rank writes the next round only after the next
/// rank acknowledged the last. All state is in device memory (`state`, 3 words per rank, zeroed
/// once: expected data count, expected acknowledgement count, rounds sent), so the same launch
/// with identical arguments may be repeated any number of times (graph replay) without host help.
/// Launch: one CTA per rank; `group` GROUP_THREAD with 1 thread, GROUP_WARP with 32, GROUP_CTA
/// with any block. Result: [status, wrong words, rounds done].
extern "C" __global__ void symcomm_test_semaphore_ring(DevComm comm, WindowHandleRaw win, uint32_t rounds,
                                                       uint32_t words, uint32_t group, uint64_t* state,
                                                       uint32_t* result) {
    WITH_GROUP(group, semaphore_ring, comm, win, rounds, words, state, result);
}
SYMCOMM_EMU_KERNEL(symcomm_test_semaphore_ring)

/// Barrier exchange: `rounds` times, each group writes `words` words into its part of this rank's
/// copy of `win`, barrier()s (fingerprint user_fingerprint(tag, words)), checks the next rank's
/// part, and barrier()s again before the next write. GROUP_THREAD: 1 thread, barrier index
/// `index`; GROUP_WARP: every warp w of the CTA on index + w (part w); GROUP_CTA: the CTA on
/// `index`. Ranks that pass different tags get Mismatch. Result: [worst status, wrong words,
/// rounds done summed over the groups].
extern "C" __global__ void symcomm_test_barrier(DevComm comm, WindowHandleRaw win, uint32_t group, uint32_t index,
                                                uint32_t tag, uint32_t rounds, uint32_t words, uint32_t* result) {
    const uint32_t part = group == GROUP_WARP ? linear_thread_index() / 32 : 0;
    WITH_GROUP(group, barrier_exchange, part, comm, win, index, tag, rounds, words, result);
}
SYMCOMM_EMU_KERNEL(symcomm_test_barrier)

/// Group wait (2 ranks or more; ranks above 1 do nothing): rank 0 writes `words` words into rank
/// 1's copy of `win` and signal_set()s WORD_GROUP_WAIT to `epoch`; rank 1 waits with the group form
/// of signal_wait_until (GROUP_WARP: one warp, 32 threads; GROUP_CTA: any block) and checks the
/// words on every thread. `epoch` grows from launch to launch. Result: [status, wrong words].
extern "C" __global__ void symcomm_test_group_wait(DevComm comm, WindowHandleRaw win, uint32_t group, uint32_t words,
                                                   uint64_t epoch, uint32_t* result) {
    if (comm.rank > 1) return;
    if (group == GROUP_WARP) {
        group_wait(Warp{}, comm, win, words, epoch, result);
    } else {
        group_wait(Cta{}, comm, win, words, epoch, result);
    }
}
SYMCOMM_EMU_KERNEL(symcomm_test_group_wait)

/// Grid sync: `phases` times, every thread of every CTA writes its word of `data` (one per
/// thread of the grid), grid_sync()s, checks the word of the same thread in the next CTA, and
/// grid_sync()s again before the next write. `state` is the grid_sync word (zeroed once, reused by
/// every launch). CTA `skip_cta` returns at once (a CTA that never arrives; UINT32_MAX: none).
/// Result: 3 words per CTA: [status, wrong words, phases done].
extern "C" __global__ void symcomm_test_grid_sync(DevComm comm, uint64_t* state, uint32_t* data, uint32_t phases,
                                                  uint32_t skip_cta, uint32_t* result) {
    if (blockIdx.x == skip_cta) return;
    const Cta cta{};
    const uint32_t total = gridDim.x * blockDim.x;
    const uint32_t me = blockIdx.x * blockDim.x + threadIdx.x;
    const uint32_t other = (me + blockDim.x) % total;
    uint32_t* res = &result[3 * blockIdx.x];
    Status s = Status::Ok;
    uint32_t wrong = 0;
    uint32_t done = 0;
    for (uint32_t p = 0; p < phases; ++p) {
        data[me] = test_value(p, 0, me);
        s = grid_sync(cta, comm, state);
        if (s != Status::Ok) break;
        wrong += data[other] != test_value(p, 0, other);
        s = grid_sync(cta, comm, state);
        if (s != Status::Ok) break;
        ++done;
    }
    atomicAdd(&res[1], wrong);
    if (cta.thread_rank() == 0) {
        res[0] = uint32_t(s);
        res[2] = done;
    }
}
SYMCOMM_EMU_KERNEL(symcomm_test_grid_sync)

/// User error: thread 0 records record_user_error(InvalidArgument, peer = this rank, `code`,
/// `value`); then the CTA waits (group form, GROUP_WARP or GROUP_CTA) for a signal that never
/// comes, which must return the recorded status at once. Result: [the wait's status].
extern "C" __global__ void symcomm_test_user_error(DevComm comm, uint32_t group, uint32_t code, uint32_t value,
                                                   uint32_t* result) {
    if (threadIdx.x == 0) record_user_error(Thread{}, comm, Status::InvalidArgument, comm.rank, code, value);
    __syncthreads();
    const Status s = group == GROUP_WARP ? signal_wait_until(Warp{}, comm, comm.rank, WORD_GROUP_WAIT, ~0ull)
                                         : signal_wait_until(Cta{}, comm, comm.rank, WORD_GROUP_WAIT, ~0ull);
    if (threadIdx.x == 0) result[0] = uint32_t(s);
}
SYMCOMM_EMU_KERNEL(symcomm_test_user_error)

/// One semaphore_wait of the whole CTA (GROUP_WARP: 32 threads, GROUP_CTA: any block) on
/// (`peer`, `word`) with the expected count at `expected`: the failure paths (a word outside the
/// users' range, a signal that never comes). Result: [the wait's status].
extern "C" __global__ void symcomm_test_semaphore_wait(DevComm comm, uint32_t group, uint32_t peer, uint32_t word,
                                                       uint64_t* expected, uint32_t* result) {
    const Status s = group == GROUP_WARP ? semaphore_wait(Warp{}, comm, peer, word, expected)
                                         : semaphore_wait(Cta{}, comm, peer, word, expected);
    if (threadIdx.x == 0) result[0] = uint32_t(s);
}
SYMCOMM_EMU_KERNEL(symcomm_test_semaphore_wait)

namespace {

constexpr uint32_t PART_ONE_SHOT = 0;
constexpr uint32_t PART_TWO_SHOT = 1;
constexpr uint32_t PART_ALL_GATHER = 2;
constexpr uint32_t PART_REDUCE_SCATTER = 3;
constexpr uint32_t PART_ALL_TO_ALL = 4;

/// Element `i` of rank `rank`'s logical input of symcomm_test_cta_part (sums stay far from i32 overflow).
SYMCOMM_DEVICE int32_t part_input(uint32_t rank, uint64_t i) { return int32_t((rank + 1) * 7 + (i * 13) % 1009); }

/// Calls `f(base, range)` for each block of the calling CTA's work in collective `kind` of
/// `count` i32 per block: input blocks when `input`, output blocks otherwise. The elements are
/// base + [range.lo, range.hi) of the logical input / output (cta_part's table).
template <typename F>
SYMCOMM_DEVICE void for_my_parts(uint32_t kind, bool input, uint32_t nranks, uint64_t count, F f) {
    const CollScope scope = grid_scope();
    const Range part = cta_part<int32_t>(scope, count);
    switch (kind) {
        case PART_ONE_SHOT: f(0, part); break;
        case PART_TWO_SHOT:
            for (uint32_t q = 0; q < nranks; ++q) f(0, two_shot_part<int32_t>(scope, nranks, count, q));
            break;
        case PART_ALL_GATHER:
            if (input) {
                f(0, part);
            } else {
                for (uint32_t q = 0; q < nranks; ++q) f(uint64_t(q) * count, part);
            }
            break;
        case PART_REDUCE_SCATTER:
            if (input) {
                for (uint32_t q = 0; q < nranks; ++q) f(uint64_t(q) * count, part);
            } else {
                f(0, part);
            }
            break;
        default:
            for (uint32_t q = 0; q < nranks; ++q) f(uint64_t(q) * count, part);
            break;
    }
}

/// Output element j of rank `rank` in collective `kind` (i32 Sum).
SYMCOMM_DEVICE int32_t part_expected(uint32_t kind, uint32_t rank, uint32_t nranks, uint64_t count, uint64_t j) {
    int32_t sum = 0;
    switch (kind) {
        case PART_ONE_SHOT:
        case PART_TWO_SHOT:
            for (uint32_t p = 0; p < nranks; ++p) sum += part_input(p, j);
            return sum;
        case PART_ALL_GATHER: return part_input(uint32_t(j / count), j % count);
        case PART_REDUCE_SCATTER:
            for (uint32_t p = 0; p < nranks; ++p) sum += part_input(p, uint64_t(rank) * count + j);
            return sum;
        default: return part_input(uint32_t(j / count), uint64_t(rank) * count + j % count);
    }
}

}  // namespace

/// Per-CTA work of grid-scope collectives (cta_part / two_shot_part), with no grid-wide sync
/// anywhere: each CTA writes only its part of this rank's input, calls collective `kind`
/// (PART_*: one-shot or two-shot all-reduce, all-gather, reduce-scatter, all-to-all; i32 Sum;
/// barrier indices from `first_slot`) from `src` to `dst` — in place when `in_place` (then `dst`
/// is `src`, with NCCL's in-place offsets) — and then reads only its part of the output, checks
/// it and counts each element it read in `marks` (one word per output element, zeroed by the
/// host, which expects 1 everywhere: the parts cover the output exactly once). Launch: any grid
/// and block, the same on every rank. Result: [worst status, wrong elements].
extern "C" __global__ void symcomm_test_cta_part(DevComm comm, WindowHandleRaw src_raw, WindowHandleRaw dst_raw,
                                                 uint32_t kind, uint32_t in_place, uint64_t count, uint32_t first_slot,
                                                 uint32_t* marks, uint32_t* result) {
    const Cta g{};
    const uint32_t n = comm.nranks;
    const uint32_t rank = comm.rank;
    const WindowHandle<int32_t> src(src_raw);
    const WindowHandle<int32_t> dst(in_place ? src_raw : dst_raw);
    // NCCL's in-place offsets: all-gather's input is its own block of the output, reduce-scatter's
    // output its own block of the input.
    const uint64_t soff = in_place && kind == PART_ALL_GATHER ? uint64_t(rank) * count : 0;
    const uint64_t doff = in_place && kind == PART_REDUCE_SCATTER ? uint64_t(rank) * count : 0;
    for_my_parts(kind, true, n, count, [&](uint64_t base, Range r) {
        for (uint64_t i = r.lo + g.thread_rank(); i < r.hi; i += g.size()) {
            *src.local_ptr(soff + base + i) = part_input(rank, base + i);
        }
    });
    const CollScope scope = grid_scope(first_slot);
    const WindowSlice<int32_t> in = src.at(soff), out = dst.at(doff);
    Status s = Status::Ok;
    switch (kind) {
        case PART_ONE_SHOT: s = all_reduce_one_shot<RedOp::Sum>(g, comm, scope, in, out, count); break;
        case PART_TWO_SHOT: s = all_reduce_two_shot<RedOp::Sum>(g, comm, scope, in, out, count); break;
        case PART_ALL_GATHER: s = all_gather(g, comm, scope, in, out, count); break;
        case PART_REDUCE_SCATTER: s = reduce_scatter<RedOp::Sum>(g, comm, scope, in, out, count); break;
        default: s = all_to_all(g, comm, scope, in, out, count); break;
    }
    uint32_t wrong = 0;
    if (s == Status::Ok) {
        // Thread t reads elements that other threads of the CTA stored (another item order).
        for_my_parts(kind, false, n, count, [&](uint64_t base, Range r) {
            for (uint64_t i = r.lo + g.thread_rank(); i < r.hi; i += g.size()) {
                wrong += *dst.local_ptr(doff + base + i) != part_expected(kind, rank, n, count, base + i);
                atomicAdd(&marks[base + i], 1u);
            }
        });
    }
    atomicAdd(&result[1], wrong);
    if (g.thread_rank() == 0) atomicMax(&result[0], uint32_t(s));
}
SYMCOMM_EMU_KERNEL(symcomm_test_cta_part)

namespace {

/// Signal words of symcomm_test_put_ring: data ready (from the previous rank), and the tally every
/// rank adds to every other rank at the end of a launch.
constexpr uint32_t WORD_PUT_DATA = 3;
constexpr uint32_t WORD_PUT_TALLY = 4;

/// The put ring on one group per rank (see symcomm_test_put_ring).
template <typename Group>
SYMCOMM_DEVICE void put_ring(Group g, const DevComm& comm, WindowHandleRaw raw, uint32_t rounds, uint32_t words,
                             uint64_t* state, uint32_t* result) {
    const uint32_t n = comm.nranks;
    const uint32_t rank = comm.rank;
    const uint32_t next = (rank + 1) % n;
    const uint32_t prev = (rank + n - 1) % n;
    const WindowHandle<uint32_t> win(raw);
    // This rank's copy: the inbox [0, words), the staging area [words, 2 words) put reads from.
    const uint32_t* inbox = win.local_ptr(0);
    uint32_t* stage = win.local_ptr(words);
    // Rounds done by earlier launches (the same on every rank); read by every thread before
    // thread 0 advances it (group syncs lie between).
    const uint64_t base = ld_relaxed<Scope::Gpu>(&state[0]);
    Status s = Status::Ok;
    uint32_t wrong = 0;
    uint32_t done = 0;
    for (uint32_t k = 0; k < rounds && s == Status::Ok; ++k) {
        const uint64_t round = base + k + 1;
        // Rank 0 starts the round; the others pass on what they received. A rank's inbox is
        // written again only after it passed the token on (the ring closes through it).
        if (rank != 0) {
            s = signal_wait_until<Scope::Sys>(g, comm, prev, WORD_PUT_DATA, round);
            if (s != Status::Ok) break;
            for (uint32_t i = g.thread_rank(); i < words; i += g.size()) wrong += inbox[i] != test_value(round, prev, i);
        }
        for (uint32_t i = g.thread_rank(); i < words; i += g.size()) stage[i] = test_value(round, rank, i);
        s = put_with_signal(g, comm, stage, win.at(0), next, words, WORD_PUT_DATA, round);
        if (s != Status::Ok) break;
        if (rank == 0) {
            s = signal_wait_until<Scope::Sys>(g, comm, prev, WORD_PUT_DATA, round);
            if (s != Status::Ok) break;
            for (uint32_t i = g.thread_rank(); i < words; i += g.size()) wrong += inbox[i] != test_value(round, prev, i);
        }
        g.sync();  // every read of the inbox before the next round may overwrite it
        ++done;
    }
    // Tally: every rank adds `done` to its word at every other rank, then waits for every
    // other rank's total; then a barrier (every peer's word through a store or the proxy).
    if (s == Status::Ok) {
        for (uint32_t p = g.thread_rank(); p < n; p += g.size()) {
            if (p != rank && s == Status::Ok) s = signal_add<Scope::Sys>(Thread{}, comm, p, WORD_PUT_TALLY, done);
        }
        s = group_status(g, s);
    }
    for (uint32_t p = 0; p < n && s == Status::Ok; ++p) {
        if (p != rank) s = signal_wait_until<Scope::Sys>(g, comm, p, WORD_PUT_TALLY, base + done);
    }
    if (s == Status::Ok) s = barrier(g, comm, SYMCOMM_USER_BARRIER_FIRST, user_fingerprint(0x7075u, words, rounds));
    atomicAdd(&result[1], wrong);
    g.sync();
    if (g.thread_rank() == 0) {
        st_relaxed<Scope::Gpu>(&state[0], base + done);
        result[0] = uint32_t(s);
        result[2] = done;
    }
}

}  // namespace

/// Put ring across any ranks, on this host or others (the cross-host tests' kernel): round k,
/// each rank fills the staging half of its copy of `win` (u32, 2 * `words` elements per rank)
/// with test values and put_with_signal()s them into the next rank's inbox half (through the
/// proxy when that rank is on another host); rank 0 starts each round, the others wait for
/// their previous rank's signal, check the inbox and pass the token on. Then each rank
/// signal_add()s its rounds to every other rank (a tally word) and waits for theirs, and all
/// barrier() on the first users' index. `state` (1 word, zeroed once) counts rounds across
/// launches, so launches may follow each other. Launch: one CTA per rank; `group` GROUP_THREAD
/// with 1 thread, GROUP_WARP with 32, GROUP_CTA with any block. Result: [status, wrong words,
/// rounds done].
extern "C" __global__ void symcomm_test_put_ring(DevComm comm, WindowHandleRaw win, uint32_t rounds, uint32_t words,
                                                 uint32_t group, uint64_t* state, uint32_t* result) {
    WITH_GROUP(group, put_ring, comm, win, rounds, words, state, result);
}
SYMCOMM_EMU_KERNEL(symcomm_test_put_ring)

/// What a device operation answers on `peer` (one CTA, any block): `op` 0 put, 1 get, 2
/// put_with_signal, 3 signal_set, 4 signal_add asking for the previous value, 5 a one-shot
/// all-reduce of `win` (u32, at least `nranks` elements), 6 put_with_signal from shared memory,
/// 7 from the thread's own stack (local memory) — each of one element of `win` (signal word
/// WORD_PUT_DATA). Result: [status].
extern "C" __global__ void symcomm_test_peer_op(DevComm comm, WindowHandleRaw raw, uint32_t peer, uint32_t op,
                                                uint32_t* result) {
    const WindowHandle<uint32_t> win(raw);
    const Cta g;
    Status s = Status::Ok;
    uint64_t previous = 0;
    SYMCOMM_SHARED(uint32_t, staged, 1);
    const uint32_t on_stack = 7;
    switch (op) {
        case 0: s = put(g, win.local_ptr(0), win.at(0), peer, 1); break;
        case 1: s = get(g, win.at(0), peer, win.local_ptr(0), 1); break;
        case 2: s = put_with_signal(g, comm, win.local_ptr(0), win.at(0), peer, 1, WORD_PUT_DATA, 1); break;
        case 3:
            if (g.thread_rank() == 0) s = signal_set<Scope::Sys>(Thread{}, comm, peer, WORD_PUT_DATA, 1);
            break;
        case 4:
            if (g.thread_rank() == 0) s = signal_add<Scope::Sys>(Thread{}, comm, peer, WORD_PUT_TALLY, 1, &previous);
            break;
        case 6:
            if (g.thread_rank() == 0) staged[0] = 7;
            s = put_with_signal(g, comm, &staged[0], win.at(0), peer, 1, WORD_PUT_DATA, 1);
            break;
        case 7:
            if (g.thread_rank() == 0) s = put_with_signal(Thread{}, comm, &on_stack, win.at(0), peer, 1, WORD_PUT_DATA, 1);
            break;
        default: s = all_reduce_one_shot<RedOp::Sum>(g, comm, grid_scope(SYMCOMM_USER_BARRIER_FIRST), win.at(0), win.at(0), 1); break;
    }
    if (g.thread_rank() == 0) result[0] = uint32_t(s);
}
SYMCOMM_EMU_KERNEL(symcomm_test_peer_op)

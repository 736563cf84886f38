// ThreadSanitizer run of the built-in collective kernels (`symcomm_collective_<dtype>`,
// device/kernels/collective_kernel.cuh) on the emulator: every collective kind, out of place and
// in place (NCCL's conventions, see the top of collectives.cuh), grid scope and CTA scope with 2
// CTAs each, ranks {2, 3, 4}, f32 and u8, counts and offsets that give 16-byte vector bodies and
// scalar heads and tails, checked exactly (every byte of each output window: outputs equal the
// reference, everything else keeps what the rank wrote before the launch) along with the error
// records. A fourth pass runs every case staged (CollArgs::src_ptr / dst_ptr: the rank's input
// and output in arrays of its own, blocks PSTRIDE apart, in place there by NCCL's conventions;
// the windows only stage what peers read), the host collectives' path for buffers that are not
// windows: outputs checked in the arrays, and the output window unchanged but for two-shot's
// pushes.
//
// Each rank runs its own host thread that, like a stream, fills its buffers, launches, checks its
// results and goes on with the next case at once (harness.h, run_ranks): all cases of a rank count
// run back to back on one team, so barrier epochs continue from launch to launch and a rank may
// write its inputs for the next collective while slower peers are still in the previous one.
// Nothing but the kernels' barriers orders the ranks, which is what lets TSan see a missing one.
//
// Exit status 0 only when every element of every case is right and no error was recorded.
// Built with SYMCOMM_PLANTED_BUG (scripts/emu-tsan --planted), the program checks f32 only: a
// planted bug is independent of the element type, and only the f32 kernel is rebuilt with it.
#include <math.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "harness.h"
#include "symcomm_emu.h"

#if defined(SYMCOMM_PLANTED_BUG) && SYMCOMM_PLANTED_BUG != 0
#define TSAN_COLL_ALL_DTYPES 0
#else
#define TSAN_COLL_ALL_DTYPES 1
#endif

extern "C" void symcomm_emu_entry_symcomm_collective_f32(void** args);
#if TSAN_COLL_ALL_DTYPES
extern "C" void symcomm_emu_entry_symcomm_collective_u8(void** args);
#endif

namespace {

using symcomm_test::Team;

constexpr uint32_t kThreads[2] = {32, 40};  // per CTA: a full warp, and one and a quarter
constexpr uint32_t kCtas = 2;
constexpr uint64_t kTimeoutNs = 30'000'000'000ull;
constexpr unsigned char kCanary = 0xA5;

struct Args {
    DevComm comm;
    CollArgs coll;
    std::array<void*, 2> p;
    void** ptrs() {
        p = {&comm, &coll};
        return p.data();
    }
};

const char* kind_name(uint32_t kind) {
    static const char* const names[] = {"all_reduce_one_shot", "all_reduce_two_shot", "all_gather", "reduce_scatter",
                                        "broadcast",           "reduce",              "scatter",    "all_to_all",
                                        "all_reduce_ll",       "all_gather_ll",       "reduce_scatter_ll",
                                        "broadcast_ll"};
    return kind < SYMCOMM_COLL_COUNT ? names[kind] : "?";
}

const char* op_name(uint32_t op) {
    static const char* const names[] = {"sum", "prod", "min", "max", "avg"};
    return op < SYMCOMM_REDOP_COUNT ? names[op] : "?";
}

bool is_reduction(uint32_t kind) {
    return kind == SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT || kind == SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT ||
           kind == SYMCOMM_COLL_ALL_REDUCE_LL || kind == SYMCOMM_COLL_REDUCE_SCATTER ||
           kind == SYMCOMM_COLL_REDUCE_SCATTER_LL || kind == SYMCOMM_COLL_REDUCE;
}

/// Input and output sizes of a rank, in blocks of `count` elements.
void blocks(uint32_t kind, uint64_t n, uint64_t& in, uint64_t& out) {
    in = out = 1;
    if (kind == SYMCOMM_COLL_ALL_GATHER || kind == SYMCOMM_COLL_ALL_GATHER_LL) out = n;
    if (kind == SYMCOMM_COLL_REDUCE_SCATTER || kind == SYMCOMM_COLL_REDUCE_SCATTER_LL ||
        kind == SYMCOMM_COLL_SCATTER)
        in = n;
    if (kind == SYMCOMM_COLL_ALL_TO_ALL) in = out = n;
}

// ---- element types -----------------------------------------------------------------------------

enum class Dt { F32, U8 };

struct DType {
    Dt dt;
    uint32_t code;
    uint32_t size;
    const char* name;
    const char* kernel;
    symcomm_emu_entry entry;
};

const DType kDtypes[] = {
    {Dt::F32, SYMCOMM_DTYPE_F32, 4, "f32", "symcomm_collective_f32", symcomm_emu_entry_symcomm_collective_f32},
#if TSAN_COLL_ALL_DTYPES
    {Dt::U8, SYMCOMM_DTYPE_U8, 1, "u8", "symcomm_collective_u8", symcomm_emu_entry_symcomm_collective_u8},
#endif
};

uint64_t mix(uint64_t x) {
    x ^= x >> 31;
    x *= 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    return x ^ (x >> 32);
}

/// Input element `e` of rank `rank`, chosen so that every reduction is exact (f32: small integers
/// for sums, {1, 2, -1} for products; u8: any byte, sums and products wrap).
template <typename T>
T input(uint32_t op, uint32_t rank, uint64_t e, uint64_t salt) {
    const uint64_t h = mix(salt * 1000003u + uint64_t(rank) * 0x10001u + e);
    if constexpr (sizeof(T) == 1) {
        return T(h);
    } else {
        if (op == SYMCOMM_REDOP_PROD) return T(h % 3 == 0 ? 1.0f : h % 3 == 1 ? 2.0f : -1.0f);
        if (op == SYMCOMM_REDOP_MIN || op == SYMCOMM_REDOP_MAX) return T(float(h % 17) - 8.0f);
        return T(float(h % 4));
    }
}

/// The reduction of `v[0..n)` in rank order, as the device computes it (reduce.cuh: accumulate in
/// the type, one division for avg).
template <typename T>
T reduce_ref(uint32_t op, const T* v, uint32_t n) {
    T acc = v[0];
    for (uint32_t p = 1; p < n; ++p) {
        switch (op) {
            case SYMCOMM_REDOP_PROD: acc = T(acc * v[p]); break;
            case SYMCOMM_REDOP_MIN: acc = v[p] < acc ? v[p] : acc; break;
            case SYMCOMM_REDOP_MAX: acc = v[p] > acc ? v[p] : acc; break;
            default: acc = T(acc + v[p]); break;
        }
    }
    if (op == SYMCOMM_REDOP_AVG) acc = T(acc / T(n));
    return acc;
}

// ---- cases -------------------------------------------------------------------------------------

struct Case {
    uint32_t kind, op, root, index, threads;
    bool in_place, cta, staged;
    uint64_t count, sshift, dshift;  // elements
    const DType* dt;
    uint64_t salt;

    // Layout in elements (the same on every rank, apart from the in-place offsets of offs()).
    uint64_t in_blocks, out_blocks, span, tiles;

    uint64_t extent() const { return tiles * span; }
    /// Staged: elements between the blocks of the rank's own arrays (not `count`, so that a
    /// kernel mixing up the two strides is caught).
    uint64_t pstride() const { return count + 2; }
    /// (soff, doff) of rank r for tile 0, NCCL's in-place conventions included.
    /// `blk`: elements between blocks (count in windows; pstride() in a staged case's arrays).
    void offs(uint32_t r, uint64_t blk, uint64_t& s, uint64_t& d) const {
        s = sshift;
        d = in_place ? sshift : dshift;
        if (!in_place) return;
        if (kind == SYMCOMM_COLL_ALL_GATHER || kind == SYMCOMM_COLL_ALL_GATHER_LL) s = d + r * blk;
        if (kind == SYMCOMM_COLL_REDUCE_SCATTER || kind == SYMCOMM_COLL_REDUCE_SCATTER_LL ||
            kind == SYMCOMM_COLL_SCATTER)
            d = s + r * blk;
    }
    std::string label(uint32_t nranks) const {
        char b[256];
        snprintf(b, sizeof b, "%s %s %s nranks=%u count=%llu root=%u %s%s %s shift=%llu/%llu %ux%u slot=%u",
                 kind_name(kind), dt->name, is_reduction(kind) ? op_name(op) : "-", nranks, (unsigned long long)count,
                 root, staged ? "staged " : "", in_place ? "in-place" : "out-of-place", cta ? "cta" : "grid",
                 (unsigned long long)sshift, (unsigned long long)dshift, kCtas, threads, index);
        return b;
    }
};

/// Every kind x placement x scope x dtype, in kPasses passes, the other dimensions rotating so
/// that each kind sees every count, shift pattern, op, root and block size: counts give
/// scalar-only calls, and calls with a scalar head, 16-byte packs and a scalar tail (or all
/// scalar, when input and output phases differ), and several rounds of in-place chunking. The
/// last pass is staged.
constexpr uint32_t kPasses = 4;

std::vector<Case> cases(uint32_t nranks) {
    static const uint64_t f32_counts[] = {37, 1, 203};
    static const uint64_t u8_counts[] = {77, 5, 611};
    static const uint64_t shifts[][2] = {{0, 0}, {1, 1}, {1, 3}, {3, 0}};
    std::vector<Case> out;
    uint32_t i = 0;
    for (uint32_t pass = 0; pass < kPasses; ++pass) {
        for (uint32_t kind = 0; kind < SYMCOMM_COLL_COUNT; ++kind) {
            for (uint32_t in_place = 0; in_place < 2; ++in_place) {
                for (uint32_t cta = 0; cta < 2; ++cta) {
                    for (const DType& dt : kDtypes) {
                        Case c{};
                        c.kind = kind;
                        c.dt = &dt;
                        c.in_place = in_place != 0;
                        c.cta = cta != 0;
                        c.staged = pass == kPasses - 1;
                        const uint32_t rot = pass + in_place + 2 * cta;
                        c.count = (dt.dt == Dt::F32 ? f32_counts : u8_counts)[rot % 3];
                        c.sshift = shifts[(rot + kind) % 4][0];
                        c.dshift = shifts[(rot + kind) % 4][1];
                        c.op = is_reduction(kind) ? (i + pass) % SYMCOMM_REDOP_COUNT : 0;
                        const bool rooted = kind == SYMCOMM_COLL_BROADCAST || kind == SYMCOMM_COLL_BROADCAST_LL ||
                                            kind == SYMCOMM_COLL_REDUCE || kind == SYMCOMM_COLL_SCATTER;
                        c.root = rooted ? (i / 2 + pass) % nranks : 0;
                        c.index = (i % 3) * 2;
                        c.threads = kThreads[(i / 2 + pass) % 2];
                        c.salt = i;
                        blocks(kind, nranks, c.in_blocks, c.out_blocks);
                        const uint64_t shift = c.sshift > c.dshift ? c.sshift : c.dshift;
                        c.span = shift + c.pstride() * (c.in_blocks > c.out_blocks ? c.in_blocks : c.out_blocks) + 3;
                        c.tiles = c.cta ? kCtas : 1;
                        out.push_back(c);
                        ++i;
                    }
                }
            }
        }
    }
    return out;
}

std::atomic<int> failures{0};

[[noreturn]] void die(const std::string& msg) {
    fprintf(stderr, "FAIL %s\n", msg.c_str());
    fflush(stderr);
    _exit(1);
}

/// Rank r's part of one case: fill its buffers, launch, check its output (window, or the rank's
/// own array when staged) and error record.
template <typename T>
void run_case(Team& team, uint32_t r, const Case& c) {
    const uint32_t n = team.nranks;
    // Staged: the windows out of place at the plain shifts; the placement is the arrays'.
    const uint32_t src_w = 0, dst_w = c.in_place && !c.staged ? 0 : 1;
    const uint64_t blk = c.staged ? c.pstride() : c.count;  // elements between blocks
    uint64_t soff, doff;
    c.offs(r, blk, soff, doff);
    const uint64_t ext = c.extent();
    if (ext * sizeof(T) > team.window_stride) die(c.label(n) + ": window too small");
    // Element e = q * count + i of a multi-block range: where it lies from the range's start.
    auto at = [&](uint64_t e) { return e / c.count * blk + e % c.count; };

    // Inputs of every rank, per tile: in[(p * tiles + t) * in_elems + e].
    const uint64_t in_elems = c.count * c.in_blocks;
    std::vector<T> in(size_t(n) * c.tiles * in_elems);
    for (uint32_t p = 0; p < n; ++p)
        for (uint64_t t = 0; t < c.tiles; ++t)
            for (uint64_t e = 0; e < in_elems; ++e)
                in[(p * c.tiles + t) * in_elems + e] = input<T>(c.op, p, e + t * 100000, c.salt);
    auto in_of = [&](uint32_t p, uint64_t t, uint64_t e) { return in[(p * c.tiles + t) * in_elems + e]; };

    // Fill this rank's windows and arrays: canary, then its inputs. Element by element: every
    // store is one TSan sees (GCC expands a constant-size memset inline, uninstrumented).
    T* src = reinterpret_cast<T*>(team.bytes(r, src_w));
    T* dst = reinterpret_cast<T*>(team.bytes(r, dst_w));
    std::vector<T> arrays(c.staged ? 2 * ext : 0);
    T* in_base = c.staged ? arrays.data() : src;
    T* out_base = c.staged ? arrays.data() + (c.in_place ? 0 : ext) : dst;
    T canary;
    memset(&canary, kCanary, sizeof canary);
    for (uint64_t e = 0; e < ext; ++e) {
        src[e] = canary;
        dst[e] = canary;
    }
    for (uint64_t e = 0; e < arrays.size(); ++e) arrays[e] = canary;
    for (uint64_t t = 0; t < c.tiles; ++t)
        for (uint64_t e = 0; e < in_elems; ++e) in_base[t * c.span + soff + at(e)] = in_of(r, t, e);

    // Expected output: what was written above, with the outputs replaced; staged, the output
    // window also stays as it was (two-shot excepted: peers push their shares into it).
    std::vector<T> want(out_base, out_base + ext);
    const std::vector<T> dst_before(dst, dst + ext);
    auto put = [&](uint64_t t, uint64_t e, T v) { want[t * c.span + doff + at(e)] = v; };
    std::vector<T> vals(n);
    auto red = [&](uint64_t t, uint64_t e) {
        for (uint32_t p = 0; p < n; ++p) vals[p] = in_of(p, t, e);
        return reduce_ref<T>(c.op, vals.data(), n);
    };
    for (uint64_t t = 0; t < c.tiles; ++t) {
        for (uint64_t i = 0; i < c.count; ++i) {
            switch (c.kind) {
                case SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT:
                case SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT:
                case SYMCOMM_COLL_ALL_REDUCE_LL: put(t, i, red(t, i)); break;
                case SYMCOMM_COLL_REDUCE:
                    if (r == c.root) put(t, i, red(t, i));
                    break;
                case SYMCOMM_COLL_REDUCE_SCATTER:
                case SYMCOMM_COLL_REDUCE_SCATTER_LL: put(t, i, red(t, r * c.count + i)); break;
                case SYMCOMM_COLL_ALL_GATHER:
                case SYMCOMM_COLL_ALL_GATHER_LL:
                    for (uint32_t p = 0; p < n; ++p) put(t, p * c.count + i, in_of(p, t, i));
                    break;
                case SYMCOMM_COLL_BROADCAST:
                case SYMCOMM_COLL_BROADCAST_LL: put(t, i, in_of(c.root, t, i)); break;
                case SYMCOMM_COLL_SCATTER: put(t, i, in_of(c.root, t, r * c.count + i)); break;
                default:
                    for (uint32_t p = 0; p < n; ++p) put(t, p * c.count + i, in_of(p, t, r * c.count + i));
                    break;
            }
        }
    }

    Args a{};
    a.comm = team.comm(r, kTimeoutNs);
    a.coll.kind = c.kind;
    a.coll.dtype = c.dt->code;
    a.coll.redop = c.op;
    a.coll.root = c.root;
    a.coll.scope = c.cta ? SYMCOMM_SCOPE_CTA : SYMCOMM_SCOPE_GRID;
    a.coll.index = c.index;
    a.coll.count = c.count;
    a.coll.src_offset = c.staged ? c.sshift : soff;
    a.coll.dst_offset = c.staged ? c.dshift : doff;
    a.coll.tile_stride = c.span;
    a.coll.src = team.win(r, src_w);
    a.coll.dst = team.win(r, dst_w);
    if (c.staged) {
        a.coll.src_ptr = reinterpret_cast<uint64_t>(in_base + soff);
        a.coll.dst_ptr = reinterpret_cast<uint64_t>(out_base + doff);
        a.coll.ptr_stride = blk;
    }
    symcomm_test::launch(r, c.dt->kernel, c.dt->entry, dim3(kCtas), dim3(c.threads), a);

    const ErrorRecord& er = team.errors[r];
    if (er.status != SYMCOMM_STATUS_OK) {
        // The team's epochs are out of step now: stop everything.
        char b[160];
        snprintf(b, sizeof b, ": rank %u error record status=%u peer=%u op=%u detail=0x%llx", r, er.status, er.peer,
                 er.op, (unsigned long long)er.detail);
        die(c.label(n) + b);
    }
    uint64_t wrong = 0;
    for (uint64_t e = 0; e < ext; ++e) {
        const T got = out_base[e], exp = want[e];
        if (memcmp(&got, &exp, sizeof(T)) == 0) continue;  // bitwise
        if (wrong++ < 4) {
            fprintf(stderr, "FAIL %s: rank %u element %llu (tile %llu, +%lld from doff): got %g, want %g\n",
                    c.label(n).c_str(), r, (unsigned long long)e, (unsigned long long)(e / c.span),
                    (long long)(e % c.span) - (long long)doff, double(got), double(exp));
        }
    }
    if (c.staged && c.kind != SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT) {
        for (uint64_t e = 0; e < ext; ++e) {
            if (memcmp(&dst[e], &dst_before[e], sizeof(T)) == 0) continue;
            if (wrong++ < 4) {
                fprintf(stderr, "FAIL %s: rank %u: output window element %llu written\n", c.label(n).c_str(), r,
                        (unsigned long long)e);
            }
        }
    }
    if (wrong > 0) {
        fprintf(stderr, "FAIL %s: rank %u: %llu wrong elements\n", c.label(n).c_str(), r, (unsigned long long)wrong);
        ++failures;
    }
}

}  // namespace

int main() {
    const auto start = std::chrono::steady_clock::now();
    size_t launches = 0;
    for (uint32_t nranks : {2u, 3u, 4u}) {
        const auto t0 = std::chrono::steady_clock::now();
        const std::vector<Case> list = cases(nranks);
        uint64_t bytes = 0;
        for (const Case& c : list) bytes = std::max<uint64_t>(bytes, c.extent() * c.dt->size);
        Team team(nranks, bytes, 2);
        const int before = failures.load();
        symcomm_test::run_ranks(nranks, [&](uint32_t r) {
            for (const Case& c : list) {
                if (c.dt->dt == Dt::F32) {
                    run_case<float>(team, r, c);
                } else {
                    run_case<unsigned char>(team, r, c);
                }
            }
        });
        launches += list.size();
        const long ms = long(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
                                 .count());
        printf("collectives nranks=%u: %zu cases back to back, %u CTAs x {%u,%u} threads: %s (%ld ms)\n", nranks,
               list.size(), kCtas, kThreads[0], kThreads[1], failures.load() == before ? "ok" : "FAIL", ms);
    }
    const long ms =
        long(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count());
    printf("tsan_collectives: %zu cases, %s (%ld ms)\n", launches, failures.load() ? "FAIL" : "ok", ms);
    return failures.load() ? 1 : 0;
}

// put / get / put_with_signal (include/symcomm/p2p.cuh) and signal_add on the emulator, under ThreadSanitizer
// in scripts/emu-tsan: element sizes 1, 2, 4, 8; counts around the 16-byte pack; source and
// destination offsets in equal and different phases; Thread, Warp and Cta groups; ranks {2, 3, 5}.
// Then the users' signal calls (signal_set, signal_add, signal_wait_until, put_with_signal) with
// a signal word outside [0, SYMCOMM_USER_SIGNAL_END) or a peer outside the team: each returns
// InvalidArgument, records it, and touches no signal word and no window byte.
//
// Each launch: rank r put_with_signal()s its `count` elements (source region, offset `soff`) into
// rank r+1's destination region (offset `doff`), waits for rank r-1's signal and checks what
// arrived; then get()s rank r-1's source region into its own scratch region and checks that too.
// Every wrong element is counted per rank; the program exits non-zero on any. Then the refusals:
// calls outside the window, to a peer that is not a rank, or of another element size return
// InvalidArgument on every rank and touch nothing (put_with_signal also records the refusal).
#include <array>

#include "harness.h"
#include "symcomm/p2p.cuh"

namespace {

using namespace symcomm;

// Window layout (elements of T): [0, R) source, [R, 2R) destination, [2R, 3R) scratch.
constexpr uint64_t R = 1100;

template <typename T>
T value_of(uint32_t rank, uint64_t i) {
    T v;
    const uint64_t x = (uint64_t(rank) * 1000003u + i * 7919u) ^ 0x5a5a5a5a5a5a5a5aull;
    __builtin_memcpy(&v, &x, sizeof v);
    return v;
}

template <typename T>
bool same(const T& a, const T& b) {
    return __builtin_memcmp(&a, &b, sizeof a) == 0;
}

template <typename Group, typename T>
void body(Group g, DevComm comm, WindowHandleRaw raw, uint64_t count, uint64_t soff, uint64_t doff, uint32_t epoch,
          uint32_t* wrong) {
    const WindowHandle<T> win(raw);
    const uint32_t n = comm.nranks, r = comm.rank;
    const uint32_t next = (r + 1) % n, prev = (r + n - 1) % n;
    // The group writes its source right before the put (what a fused kernel does), in an order
    // unlike the copy's: a put that did not synchronize the group before reading would race.
    for (uint64_t k = g.thread_rank(); k < count; k += g.size()) {
        const uint64_t i = count - 1 - k;
        *win.local_ptr(soff + i) = value_of<T>(r, i);
    }
    if (put_with_signal(g, comm, win.local_ptr(soff), win.at(R + doff), next, count, 0, epoch) != Status::Ok) {
        if (g.thread_rank() == 0) atomicAdd(wrong, 1000000u);
    }
    if (g.thread_rank() == 0 && signal_wait_until(Thread{}, comm, prev, 0, epoch) != Status::Ok) atomicAdd(wrong, 1000000u);
    // signal_add: one increment per launch, so the word from `prev` counts launches (== epoch).
    if (g.thread_rank() == 0) {
        uint64_t before = 0;
        if (signal_add(Thread{}, comm, next, 1, 1, &before) != Status::Ok || before != epoch - 1) {
            atomicAdd(wrong, 1000000u);
        }
        if (signal_wait_until(Thread{}, comm, prev, 1, epoch) != Status::Ok) atomicAdd(wrong, 1000000u);
    }
    g.sync();
    uint32_t bad = 0;
    for (uint64_t i = g.thread_rank(); i < count; i += g.size()) {
        bad += !same(*win.local_ptr(R + doff + i), value_of<T>(prev, i));
    }
    get(g, win.at(soff), prev, win.local_ptr(2 * R + doff), count);
    g.sync();
    for (uint64_t i = g.thread_rank(); i < count; i += g.size()) {
        bad += !same(*win.local_ptr(2 * R + doff + i), value_of<T>(prev, i));
    }
    if (bad) atomicAdd(wrong, bad);
}

struct PutGetArgs {
    DevComm comm;
    WindowHandleRaw win;
    uint64_t count, soff, doff;
    uint32_t epoch, group;
    uint32_t* wrong;
};

template <typename T>
void p2p_kernel(PutGetArgs a) {
    switch (a.group) {
        case 0:
            if (threadIdx.x == 0) body<Thread, T>(Thread{}, a.comm, a.win, a.count, a.soff, a.doff, a.epoch, a.wrong);
            break;
        case 1:
            if (threadIdx.x < 32) body<Warp, T>(Warp{}, a.comm, a.win, a.count, a.soff, a.doff, a.epoch, a.wrong);
            break;
        default:
            body<Cta, T>(Cta{}, a.comm, a.win, a.count, a.soff, a.doff, a.epoch, a.wrong);
    }
}

// Refusals: calls outside the window, to a peer that is not a rank, through a handle of another
// element size. Window handles claim REFUSAL_BYTES of the team's larger copies, so a write past
// them lands in the canary (and a read past the mapping would fault).
constexpr uint64_t REFUSAL_BYTES = 128;
constexpr uint32_t REFUSAL_CASES = 9;
constexpr unsigned char CANARY = 0xA5;
float refusal_source[64];

struct RefusalArgs {
    DevComm comm;
    WindowHandleRaw win;
    uint32_t* status;  // REFUSAL_CASES per rank
};

void refusal_kernel(RefusalArgs a) {
    const Cta g;
    const WindowHandle<float> win(a.win);
    WindowHandleRaw wide_raw = a.win;
    wide_raw.elem_size = 8;
    const WindowHandle<float> wide(wide_raw);
    const uint32_t n = a.comm.nranks, next = (a.comm.rank + 1) % n;
    const uint64_t cap = REFUSAL_BYTES / sizeof(float);
    float scratch[64];
    Status s[REFUSAL_CASES];
    s[0] = put(g, refusal_source, win.at(0), n, 1);                    // peer == nranks
    s[1] = put(g, refusal_source, win.at(cap - 2), next, 3);           // one element past the end
    s[2] = put(g, refusal_source, win.at(~uint64_t(0) - 1), next, 4);  // offset + count wraps
    s[3] = get(g, win.at(0), n + 5, scratch, 1);                       // peer > nranks
    s[4] = get(g, win.at(0), next, scratch, cap + 1);                  // count past the end
    s[5] = get(g, win.at(1ull << 40), next, scratch, 1);               // far past the mapping
    s[6] = put(g, refusal_source, wide.at(0), next, 1);                // element size 8 viewed as float
    s[7] = put_with_signal(g, a.comm, refusal_source, win.at(cap - 2), next, 3, 0, 1);  // past the end: recorded
    s[8] = put(g, refusal_source, win.at(cap - 3), next, 3);           // the last 3 elements: Ok
    if (g.thread_rank() == 0) {
        for (uint32_t i = 0; i < REFUSAL_CASES; ++i) a.status[a.comm.rank * REFUSAL_CASES + i] = uint32_t(s[i]);
    }
}

}  // namespace

extern "C" __global__ void p2p_refusals(RefusalArgs a) { refusal_kernel(a); }
SYMCOMM_EMU_KERNEL(p2p_refusals)

extern "C" __global__ void p2p_u8(PutGetArgs a) { p2p_kernel<uint8_t>(a); }
extern "C" __global__ void p2p_f16(PutGetArgs a) { p2p_kernel<half_t>(a); }
extern "C" __global__ void p2p_f32(PutGetArgs a) { p2p_kernel<float>(a); }
extern "C" __global__ void p2p_f64(PutGetArgs a) { p2p_kernel<double>(a); }
SYMCOMM_EMU_KERNEL(p2p_u8)
SYMCOMM_EMU_KERNEL(p2p_f16)
SYMCOMM_EMU_KERNEL(p2p_f32)
SYMCOMM_EMU_KERNEL(p2p_f64)

namespace {

/// The launch arguments of a kernel taking one struct `Args` by value (harness.h's `ptrs()`).
template <typename Args>
struct OneArg {
    Args a;
    std::array<void*, 1> p;
    void** ptrs() {
        p = {&a};
        return p.data();
    }
};

template <typename T>
int run(const char* name, symcomm_emu_entry entry) {
    int failures = 0;
    uint32_t epoch_base = 0;
    for (uint32_t nranks : {2u, 3u, 5u}) {
        symcomm_test::Team team(nranks, 3 * R * sizeof(T));
        uint32_t epoch = 0;
        // Sources: every rank's [0, R).
        for (uint32_t r = 0; r < nranks; ++r) {
            T* src = reinterpret_cast<T*>(team.bytes(r));
            for (uint64_t i = 0; i < R; ++i) src[i] = value_of<T>(r, i);
        }
        for (uint64_t count : {0ull, 1ull, 17ull, 1023ull}) {
            for (uint64_t soff : {0ull, 7ull}) {
                for (uint64_t doff : {0ull, 3ull, 7ull}) {
                    for (uint32_t group = 0; group < 3; ++group) {
                        ++epoch;
                        std::vector<uint32_t> wrong(nranks, 0);
                        // Source values are rank-indexed from the region start; shift them by soff.
                        for (uint32_t r = 0; r < nranks; ++r) {
                            T* src = reinterpret_cast<T*>(team.bytes(r));
                            for (uint64_t i = 0; i < count; ++i) src[soff + i] = value_of<T>(r, i);
                        }
                        symcomm_test::launch_all(nranks, name, entry, dim3(1), dim3(64), [&](uint32_t r) {
                            return OneArg<PutGetArgs>{
                                {team.comm(r, 20'000'000'000ull), team.win(r), count, soff, doff, epoch, group, &wrong[r]},
                                {}};
                        });
                        for (uint32_t r = 0; r < nranks; ++r) {
                            if (wrong[r] != 0) {
                                fprintf(stderr, "FAIL %s nranks=%u count=%llu soff=%llu doff=%llu group=%u rank=%u: %u wrong\n",
                                        name, nranks, (unsigned long long)count, (unsigned long long)soff,
                                        (unsigned long long)doff, group, r, wrong[r]);
                                ++failures;
                            }
                        }
                    }
                }
            }
        }
        epoch_base += epoch;
    }
    printf("p2p %s: %s (%u launches)\n", name, failures ? "FAIL" : "ok", epoch_base);
    return failures;
}

/// Every refused call returns InvalidArgument on every rank with nothing written; put_with_signal
/// records its refusal; the valid call at the very end of the window writes only inside it.
int run_refusals() {
    int failures = 0;
    const uint32_t nranks = 3;
    symcomm_test::Team team(nranks, 4 * REFUSAL_BYTES);
    for (uint32_t r = 0; r < nranks; ++r) memset(team.bytes(r), CANARY, team.window_stride);
    for (uint32_t i = 0; i < 64; ++i) refusal_source[i] = float(i + 1);
    std::vector<uint32_t> status(nranks * REFUSAL_CASES, 99);
    symcomm_test::launch_all(nranks, "p2p_refusals", symcomm_emu_entry_p2p_refusals, dim3(1), dim3(32), [&](uint32_t r) {
        RefusalArgs a{team.comm(r, 20'000'000'000ull), team.win(r), status.data()};
        a.win.bytes = REFUSAL_BYTES;
        return OneArg<RefusalArgs>{a, {}};
    });
    const uint64_t cap = REFUSAL_BYTES / sizeof(float);
    for (uint32_t r = 0; r < nranks; ++r) {
        for (uint32_t i = 0; i < REFUSAL_CASES; ++i) {
            const uint32_t want = i == REFUSAL_CASES - 1 ? SYMCOMM_STATUS_OK : SYMCOMM_STATUS_INVALID_ARGUMENT;
            if (status[r * REFUSAL_CASES + i] != want) {
                fprintf(stderr, "FAIL p2p refusals rank=%u case=%u: status %u, expected %u\n", r, i,
                        status[r * REFUSAL_CASES + i], want);
                ++failures;
            }
        }
        const ErrorRecord& e = team.errors[r];
        // (A peer that is not a rank is refused by the signal check first: p2p_selftest's
        // signal refusals cover it.)
        const uint64_t detail = (uint64_t(SYMCOMM_REFUSED_DST_RANGE) << 32) | ((r + 1) % nranks);
        if (e.status != SYMCOMM_STATUS_INVALID_ARGUMENT || e.op != SYMCOMM_OP_PUT || e.detail != detail || e.rank != r) {
            fprintf(stderr, "FAIL p2p refusals rank=%u: record status=%u op=%u detail=%#llx\n", r, e.status, e.op,
                    (unsigned long long)e.detail);
            ++failures;
        }
        // Only the valid put's 3 floats before REFUSAL_BYTES may differ from the canary.
        const unsigned char* b = team.bytes(r);
        uint64_t bad = 0;
        for (uint64_t k = 0; k < team.window_stride; ++k) {
            const bool written = k >= (cap - 3) * sizeof(float) && k < REFUSAL_BYTES;
            if (!written && b[k] != CANARY) ++bad;
        }
        const float* f = reinterpret_cast<const float*>(b);
        for (uint64_t k = 0; k < 3; ++k) bad += f[cap - 3 + k] != refusal_source[k];
        if (bad) {
            fprintf(stderr, "FAIL p2p refusals rank=%u: %llu bytes wrong\n", r, (unsigned long long)bad);
            ++failures;
        }
    }
    printf("p2p refusals: %s\n", failures ? "FAIL" : "ok");
    return failures;
}

}  // namespace

// ---- Refused signal calls ------------------------------------------------------------------------

namespace {

// Which call signal_refusal makes.
enum Call : uint32_t { kSet, kAdd, kWait, kPut, kCalls };
const char* const kCallNames[kCalls] = {"signal_set", "signal_add", "signal_wait_until", "put_with_signal"};

struct SignalRefusalArgs {
    DevComm comm;
    WindowHandleRaw win;
    uint32_t call, peer, word;
    uint32_t* status;    // per thread of the CTA
    uint64_t* previous;  // signal_add's previous value (left alone when refused)
};

}  // namespace

/// One call of `a.call` on `a.peer` / `a.word` (thread 0 alone, or the whole CTA for
/// put_with_signal); every thread stores the status it got.
extern "C" __global__ void signal_refusal(SignalRefusalArgs a) {
    Status s = Status::Ok;
    if (a.call == kPut) {
        const WindowHandle<uint32_t> win(a.win);
        s = put_with_signal(Cta{}, a.comm, win.local_ptr(16), win.at(0), a.peer, 16, a.word, 1);
    } else if (threadIdx.x == 0) {
        if (a.call == kSet) s = signal_set(Thread{}, a.comm, a.peer, a.word, 1);
        if (a.call == kAdd) s = signal_add(Thread{}, a.comm, a.peer, a.word, 1, a.previous);
        if (a.call == kWait) s = signal_wait_until(Thread{}, a.comm, a.peer, a.word, 0);
    }
    a.status[threadIdx.x] = uint32_t(s);
}
SYMCOMM_EMU_KERNEL(signal_refusal)

namespace {

using RefusalLaunch = OneArg<SignalRefusalArgs>;

/// Every refused call: InvalidArgument on every thread that called, the record (op, detail
/// `peer << 32 | word`, peer = the rank itself), not one signal word or window byte written.
/// Then the last users' word, as a control: accepted.
int refusals() {
    const uint32_t nranks = 2, threads = 32;
    const uint32_t words[] = {SYMCOMM_USER_SIGNAL_END, SYMCOMM_BARRIER_WORD_FIRST + SYMCOMM_USER_BARRIER_FIRST,
                              SYMCOMM_P2P_FIRST_WORD + 1, 100000000u, 0xffffffffu};
    struct Case {
        uint32_t peer, word;
    };
    std::vector<Case> cases;
    for (uint32_t w : words) cases.push_back({1, w});
    cases.push_back({nranks, 0});
    cases.push_back({0xffffffffu, 3});
    int failures = 0;
    for (uint32_t call = 0; call < kCalls; ++call) {
        for (const Case& c : cases) {
            symcomm_test::Team team(nranks, 256);
            for (uint32_t i = 0; i < 16; ++i) reinterpret_cast<uint32_t*>(team.bytes(0))[16 + i] = 0xabc0u + i;
            std::vector<uint32_t> status(threads, 99);
            uint64_t previous = 12345;
            RefusalLaunch l{{team.comm(0, 20'000'000'000ull), team.win(0), call, c.peer, c.word, status.data(), &previous},
                            {}};
            symcomm_test::launch(0, "signal_refusal", symcomm_emu_entry_signal_refusal, dim3(1), dim3(threads), l);
            const ErrorRecord& e = team.errors[0];
            const uint32_t op = call == kWait ? SYMCOMM_OP_SIGNAL_WAIT : SYMCOMM_OP_SIGNAL;
            const uint64_t detail = (uint64_t(c.peer) << 32) | c.word;
            bool ok = e.status == SYMCOMM_STATUS_INVALID_ARGUMENT && e.rank == 0 && e.peer == 0 && e.op == op &&
                      e.detail == detail;
            for (uint32_t t = 0; t < (call == kPut ? threads : 1); ++t) ok &= status[t] == SYMCOMM_STATUS_INVALID_ARGUMENT;
            ok &= previous == 12345;
            for (uint64_t w : team.signals) ok &= w == 0;
            for (uint32_t r = 0; r < nranks; ++r) {
                for (uint32_t i = 0; i < 16; ++i) {
                    ok &= reinterpret_cast<const uint32_t*>(team.bytes(r))[i] == 0;  // put's destination
                }
            }
            if (!ok) {
                fprintf(stderr,
                        "FAIL %s(peer %u, word %u): status %u, record {status %u, rank %u, peer %u, op %u, detail "
                        "%#llx}, or words / bytes written\n",
                        kCallNames[call], c.peer, c.word, status[0], e.status, e.rank, e.peer, e.op,
                        (unsigned long long)e.detail);
                ++failures;
            }
        }
        // Control: the last users' word is accepted.
        symcomm_test::Team team(nranks, 256);
        std::vector<uint32_t> status(threads, 99);
        uint64_t previous = 12345;
        RefusalLaunch l{{team.comm(0, 20'000'000'000ull), team.win(0), call, 1, SYMCOMM_USER_SIGNAL_END - 1,
                         status.data(), &previous},
                        {}};
        symcomm_test::launch(0, "signal_refusal", symcomm_emu_entry_signal_refusal, dim3(1), dim3(threads), l);
        if (status[0] != SYMCOMM_STATUS_OK || team.errors[0].status != SYMCOMM_STATUS_OK ||
            (call == kAdd && previous != 0)) {
            fprintf(stderr, "FAIL %s(peer 1, word %u): status %u, record status %u\n", kCallNames[call],
                    SYMCOMM_USER_SIGNAL_END - 1, status[0], team.errors[0].status);
            ++failures;
        }
    }
    printf("signal refusals: %s (%zu cases)\n", failures ? "FAIL" : "ok", kCalls * cases.size());
    return failures;
}

}  // namespace

int main() {
    int failures = 0;
    failures += refusals();
    failures += run_refusals();
    failures += run<uint8_t>("p2p_u8", symcomm_emu_entry_p2p_u8);
    failures += run<half_t>("p2p_f16", symcomm_emu_entry_p2p_f16);
    failures += run<float>("p2p_f32", symcomm_emu_entry_p2p_f32);
    failures += run<double>("p2p_f64", symcomm_emu_entry_p2p_f64);
    return failures ? 1 : 0;
}

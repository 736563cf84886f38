// ThreadSanitizer run of the device API v2 test kernels (device/kernels/device_api.cu): the
// semaphore ring (Thread, Warp, Cta) on 2 and 3 ranks relaunched with identical arguments, each
// rank on a host thread of its own (run_ranks: only the semaphores order the ranks); barrier<Warp>
// with one index per warp; the group forms of signal_wait_until; grid_sync across the CTAs of one
// launch; per-CTA parts of grid-scope collectives (cta_part). Each kernel checks its data; exit status 0 only when every launch reports Ok, 0 wrong
// words and every round. Planted bugs 10 (the warp vote orders no memory) and 11 (grid_sync's
// arrival does not acquire) must be reported here.
#include <array>

#include "harness.h"
#include "symcomm_emu.h"

extern "C" void symcomm_emu_entry_symcomm_test_semaphore_ring(void** args);
extern "C" void symcomm_emu_entry_symcomm_test_barrier(void** args);
extern "C" void symcomm_emu_entry_symcomm_test_group_wait(void** args);
extern "C" void symcomm_emu_entry_symcomm_test_grid_sync(void** args);
extern "C" void symcomm_emu_entry_symcomm_test_cta_part(void** args);

namespace {

constexpr uint64_t kTimeout = 60'000'000'000ull;
constexpr uint32_t kThread = 0, kWarp = 1, kCta = 2;
int failures = 0;

void check(bool ok, const char* what, uint32_t a, uint32_t b, const uint32_t* res, uint32_t n) {
    if (ok) return;
    fprintf(stderr, "FAIL %s (%u, %u): result", what, a, b);
    for (uint32_t i = 0; i < n; ++i) fprintf(stderr, " %u", res[i]);
    fprintf(stderr, "\n");
    ++failures;
}

struct RingArgs {
    DevComm comm;
    WindowHandleRaw win;
    uint32_t rounds, words, group;
    uint64_t* state;
    uint32_t* result;
    std::array<void*, 7> p;
    void** ptrs() {
        p = {&comm, &win, &rounds, &words, &group, &state, &result};
        return p.data();
    }
};

struct BarrierArgs {
    DevComm comm;
    WindowHandleRaw win;
    uint32_t group, index, tag, rounds, words;
    uint32_t* result;
    std::array<void*, 8> p;
    void** ptrs() {
        p = {&comm, &win, &group, &index, &tag, &rounds, &words, &result};
        return p.data();
    }
};

struct WaitArgs {
    DevComm comm;
    WindowHandleRaw win;
    uint32_t group, words;
    uint64_t epoch;
    uint32_t* result;
    std::array<void*, 6> p;
    void** ptrs() {
        p = {&comm, &win, &group, &words, &epoch, &result};
        return p.data();
    }
};

struct GridArgs {
    DevComm comm;
    uint64_t* state;
    uint32_t* data;
    uint32_t phases, skip;
    uint32_t* result;
    std::array<void*, 6> p;
    void** ptrs() {
        p = {&comm, &state, &data, &phases, &skip, &result};
        return p.data();
    }
};

void semaphore_ring() {
    const uint32_t rounds = 3, words = 40, launches = 6;
    for (uint32_t nranks : {2u, 3u}) {
        for (auto [group, threads] : {std::pair{kThread, 1u}, std::pair{kWarp, 32u}, std::pair{kCta, 64u}}) {
            symcomm_test::Team team(nranks, words * sizeof(uint32_t));
            std::vector<uint64_t> states(size_t(nranks) * 3, 0);
            symcomm_test::run_ranks(nranks, [&](uint32_t r) {
                for (uint32_t l = 0; l < launches; ++l) {
                    uint32_t res[3] = {0, 0, 0};
                    RingArgs a{team.comm(r, kTimeout), team.win(r), rounds, words, group, &states[r * 3], res, {}};
                    symcomm_test::launch(r, "symcomm_test_semaphore_ring", symcomm_emu_entry_symcomm_test_semaphore_ring,
                                         dim3(1), dim3(threads), a);
                    check(res[0] == SYMCOMM_STATUS_OK && res[1] == 0 && res[2] == rounds, "semaphore ring nranks/group",
                          nranks, group, res, 3);
                }
            });
            printf("semaphore ring nranks=%u group=%u launches=%u: %s\n", nranks, group, launches,
                   failures ? "FAIL" : "ok");
        }
    }
}

void warp_barrier() {
    const uint32_t nranks = 2, rounds = 3, words = 33, warps = 2, launches = 3;
    symcomm_test::Team team(nranks, warps * words * sizeof(uint32_t));
    symcomm_test::run_ranks(nranks, [&](uint32_t r) {
        for (uint32_t l = 0; l < launches; ++l) {
            uint32_t res[3] = {0, 0, 0};
            BarrierArgs a{team.comm(r, kTimeout), team.win(r), kWarp, SYMCOMM_USER_BARRIER_FIRST, 5, rounds, words,
                          res, {}};
            symcomm_test::launch(r, "symcomm_test_barrier", symcomm_emu_entry_symcomm_test_barrier, dim3(1),
                                 dim3(32 * warps), a);
            check(res[0] == SYMCOMM_STATUS_OK && res[1] == 0 && res[2] == rounds * warps, "barrier<Warp> rank/launch",
                  r, l, res, 3);
        }
    });
    printf("barrier<Warp> nranks=%u warps=%u launches=%u: %s\n", nranks, warps, launches, failures ? "FAIL" : "ok");
}

void group_wait() {
    const uint32_t words = 96;
    for (auto [group, threads] : {std::pair{kWarp, 32u}, std::pair{kCta, 64u}}) {
        symcomm_test::Team team(2, words * sizeof(uint32_t));
        std::vector<uint32_t> results(4);
        for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
            std::fill(results.begin(), results.end(), 0u);
            symcomm_test::launch_all(2, "symcomm_test_group_wait", symcomm_emu_entry_symcomm_test_group_wait, dim3(1),
                                     dim3(threads), [&](uint32_t r) {
                                         return WaitArgs{team.comm(r, kTimeout), team.win(r), group, words, epoch,
                                                         &results[r * 2], {}};
                                     });
            for (uint32_t r = 0; r < 2; ++r) {
                check(results[r * 2] == SYMCOMM_STATUS_OK && results[r * 2 + 1] == 0, "group wait group/rank", group, r,
                      &results[r * 2], 2);
            }
        }
        printf("signal_wait_until group=%u: %s\n", group, failures ? "FAIL" : "ok");
    }
}

void grid_sync() {
    const uint32_t ctas = 8, threads = 32, phases = 3;
    symcomm_test::Team team(1, 64);
    uint64_t state = 0;
    std::vector<uint32_t> data(ctas * threads, 0);
    for (uint32_t l = 0; l < 2; ++l) {
        std::vector<uint32_t> res(ctas * 3, 0);
        GridArgs a{team.comm(0, kTimeout), &state, data.data(), phases, ~0u, res.data(), {}};
        symcomm_test::launch(0, "symcomm_test_grid_sync", symcomm_emu_entry_symcomm_test_grid_sync, dim3(ctas),
                             dim3(threads), a);
        for (uint32_t b = 0; b < ctas; ++b) {
            check(res[b * 3] == SYMCOMM_STATUS_OK && res[b * 3 + 1] == 0 && res[b * 3 + 2] == phases,
                  "grid_sync launch/CTA", l, b, &res[b * 3], 3);
        }
    }
    printf("grid_sync ctas=%u threads=%u phases=%u: %s\n", ctas, threads, phases, failures ? "FAIL" : "ok");
}

struct PartArgs {
    DevComm comm;
    WindowHandleRaw src, dst;
    uint32_t kind, in_place;
    uint64_t count;
    uint32_t first_slot;
    uint32_t* marks;
    uint32_t* result;
    std::array<void*, 9> p;
    void** ptrs() {
        p = {&comm, &src, &dst, &kind, &in_place, &count, &first_slot, &marks, &result};
        return p.data();
    }
};

/// cta_part / two_shot_part: each CTA writes its part of the input, runs a grid-scope collective
/// and reads its part of the output, with no grid-wide sync (one-shot and two-shot all-reduce,
/// all-gather, reduce-scatter, all-to-all, in and out of place).
void cta_part() {
    const uint32_t nranks = 2, ctas = 4, threads = 32;
    const uint64_t count = 301;
    symcomm_test::Team team(nranks, count * nranks * sizeof(int32_t), 2);
    for (uint32_t kind = 0; kind < 5; ++kind) {
        for (uint32_t in_place = 0; in_place < 2; ++in_place) {
            const uint64_t out_len = kind == 2 || kind == 4 ? count * nranks : count;
            std::vector<uint32_t> marks(out_len * nranks, 0), results(2 * nranks, 0);
            symcomm_test::launch_all(nranks, "symcomm_test_cta_part", symcomm_emu_entry_symcomm_test_cta_part,
                                     dim3(ctas), dim3(threads), [&](uint32_t r) {
                                         return PartArgs{team.comm(r, kTimeout), team.win(r, 0), team.win(r, 1), kind,
                                                         in_place, count, SYMCOMM_USER_BARRIER_FIRST,
                                                         &marks[r * out_len], &results[r * 2], {}};
                                     });
            for (uint32_t r = 0; r < nranks; ++r) {
                bool once = true;
                for (uint64_t i = 0; i < out_len; ++i) once = once && marks[r * out_len + i] == 1;
                check(results[r * 2] == SYMCOMM_STATUS_OK && results[r * 2 + 1] == 0 && once,
                      "cta_part kind/in_place (result; each output element read once)", kind, in_place,
                      &results[r * 2], 2);
            }
            printf("cta_part kind=%u in_place=%u: %s\n", kind, in_place, failures ? "FAIL" : "ok");
        }
    }
}

}  // namespace

int main() {
    semaphore_ring();
    warp_barrier();
    group_wait();
    grid_sync();
    cta_part();
    return failures ? 1 : 0;
}

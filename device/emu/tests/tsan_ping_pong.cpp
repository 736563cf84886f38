// ThreadSanitizer run of the ping-pong kernel on the emulator: ranks {1, 2, 3, 4, 5, 8}, several
// back-to-back launches (epochs continue in device memory), every word checked by the kernel.
// Exit status 0 only when every rank of every launch reports Ok, 0 wrong words and all rounds.
#include <array>

#include "harness.h"
#include "symcomm_emu.h"

extern "C" void symcomm_emu_entry_symcomm_ping_pong(void** args);

namespace {

struct Args {
    DevComm comm;
    WindowHandleRaw win;
    uint32_t rounds;
    uint32_t words;
    uint32_t* result;
    std::array<void*, 5> p;
    void** ptrs() {
        p = {&comm, &win, &rounds, &words, &result};
        return p.data();
    }
};

}  // namespace

int main() {
    int failures = 0;
    for (uint32_t nranks : {1u, 2u, 3u, 4u, 5u, 8u}) {
        const uint32_t words = 37, rounds = 5, launches = 3, threads = 8;
        symcomm_test::Team team(nranks, words * sizeof(uint32_t));
        std::vector<uint32_t> results(size_t(nranks) * 3);
        for (uint32_t l = 0; l < launches; ++l) {
            std::fill(results.begin(), results.end(), 0u);
            symcomm_test::launch_all(nranks, "symcomm_ping_pong", symcomm_emu_entry_symcomm_ping_pong, dim3(1),
                                     dim3(threads),
                                     [&](uint32_t r) {
                                         return Args{team.comm(r, 20'000'000'000ull), team.win(r), rounds, words,
                                                     &results[r * 3], {}};
                                     });
            for (uint32_t r = 0; r < nranks; ++r) {
                const uint32_t* res = &results[r * 3];
                if (res[0] != SYMCOMM_STATUS_OK || res[1] != 0 || res[2] != rounds) {
                    fprintf(stderr, "FAIL nranks=%u launch=%u rank=%u: status=%u wrong=%u rounds=%u\n", nranks, l,
                            r, res[0], res[1], res[2]);
                    ++failures;
                }
            }
        }
        printf("ping_pong nranks=%u launches=%u rounds=%u words=%u: %s\n", nranks, launches, rounds, words,
               failures ? "FAIL" : "ok");
    }
    return failures ? 1 : 0;
}

// TSan run of the fused all-reduce + residual + RMSNorm kernel: ranks as host threads launching
// back to back, each rewriting its partial outputs between launches (only the kernel's barriers
// order the ranks). Checks residual_out exactly (inputs are small halves).
#include <array>
#include <vector>
#include "harness.h"
#include "symcomm_emu.h"

extern "C" void symcomm_emu_entry_symcomm_allreduce_residual_rmsnorm_f32(void** args);

struct FArgs {
    WindowHandleRaw partial; uint64_t partial_offset; uint64_t residual, residual_out, out, gamma;
    uint32_t tokens, hidden; float eps; uint32_t first_slot;
};
struct Args {
    DevComm comm; FArgs a; std::array<void*, 2> p;
    void** ptrs() { p = {&comm, &a}; return p.data(); }
};

int main() {
    const uint32_t H = 256, T = 5, ITERS = 4;
    int bad = 0;
    for (uint32_t n : {2u, 3u}) {
        symcomm_test::Team team(n, uint64_t(H) * T * 4, 4);  // partial, residual, out, gamma
        std::vector<int> wrong(n, 0);
        symcomm_test::run_ranks(n, [&](uint32_t r) {
            float* part = reinterpret_cast<float*>(team.bytes(r, 0));
            float* res = reinterpret_cast<float*>(team.bytes(r, 1));
            float* gam = reinterpret_cast<float*>(team.bytes(r, 3));
            for (uint32_t e = 0; e < H * T; ++e) res[e] = 0.0f;
            for (uint32_t i = 0; i < H; ++i) gam[i] = 1.0f;
            for (uint32_t it = 0; it < ITERS; ++it) {
                for (uint32_t e = 0; e < H * T; ++e) part[e] = float((e + it + r) % 5) * 0.5f;
                Args args;
                args.comm = team.comm(r, 30'000'000'000ull);
                args.a = FArgs{team.win(r, 0), 0, uint64_t(uintptr_t(res)), uint64_t(uintptr_t(res)),
                               uint64_t(uintptr_t(team.bytes(r, 2))), uint64_t(uintptr_t(gam)), T, H, 1e-5f, 3};
                symcomm_test::launch(r, "symcomm_allreduce_residual_rmsnorm_f32",
                                     symcomm_emu_entry_symcomm_allreduce_residual_rmsnorm_f32, dim3(2), dim3(64), args);
            }
            for (uint32_t e = 0; e < H * T; ++e) {
                float want = 0.0f;
                for (uint32_t it = 0; it < ITERS; ++it) {
                    float x = 0.0f;
                    for (uint32_t p = 0; p < n; ++p) x += float((e + it + p) % 5) * 0.5f;
                    want = x + want;
                }
                wrong[r] += res[e] != want;
            }
        });
        for (uint32_t r = 0; r < n; ++r) {
            printf("n=%u rank %u: #wrong=%d status=%u\n", n, r, wrong[r], team.errors[r].status);
            bad += wrong[r] != 0 || team.errors[r].status != 0;
        }
    }
    return bad ? 1 : 0;
}

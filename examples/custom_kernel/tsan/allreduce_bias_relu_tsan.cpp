// ThreadSanitizer driver of this example's kernel (kernels/allreduce_bias_relu.cu): run it with
//
//     scripts/emu-tsan --user examples/custom_kernel/kernels examples/custom_kernel/tsan/allreduce_bias_relu_tsan.cpp
//
// (plain `scripts/emu-tsan` runs it too). 2 and 4 ranks as host threads, each a stream of its own
// (run_ranks): a rank writes its next partials as soon as its own launch returned, while slower
// peers may still be in theirs, so only the kernel's barriers order the ranks and TSan sees a
// missing one. Every output element is checked against the unfused reference (small integers:
// the float sums are exact). Exit status 0 only when every launch of every rank matched.
#include <math.h>

#include <array>

#include "harness.h"
#include "symcomm_emu.h"

extern "C" void symcomm_emu_entry_allreduce_bias_relu(void** args);

namespace {

struct Args {
    DevComm comm;
    WindowHandleRaw partial, bias, out;
    uint32_t rows, cols, first_slot;
    std::array<void*, 7> p;
    void** ptrs() {
        p = {&comm, &partial, &bias, &out, &rows, &cols, &first_slot};
        return p.data();
    }
};

float partial_value(uint32_t launch, uint32_t rank, uint64_t i) {
    return float(int((launch * 7 + rank * 3 + i) % 17) - 8);
}
float bias_value(uint32_t col) { return float(int(col % 5) - 2); }

}  // namespace

int main() {
    const uint32_t rows = 19, cols = 70, ctas = 4, threads = 64, launches = 3;
    int failures = 0;
    for (uint32_t nranks : {2u, 4u}) {
        symcomm_test::Team team(nranks, uint64_t(rows) * cols * sizeof(float), 3);
        for (uint32_t r = 0; r < nranks; ++r) {
            float* bias = reinterpret_cast<float*>(team.bytes(r, 1));
            for (uint32_t c = 0; c < cols; ++c) bias[c] = bias_value(c);
        }
        std::vector<int> wrong(nranks, 0);
        symcomm_test::run_ranks(nranks, [&](uint32_t r) {
            float* partial = reinterpret_cast<float*>(team.bytes(r, 0));
            const float* out = reinterpret_cast<const float*>(team.bytes(r, 2));
            for (uint32_t l = 0; l < launches; ++l) {
                for (uint64_t i = 0; i < uint64_t(rows) * cols; ++i) partial[i] = partial_value(l, r, i);
                Args a{team.comm(r, 60'000'000'000ull), team.win(r, 0), team.win(r, 1), team.win(r, 2),
                       rows, cols, SYMCOMM_USER_BARRIER_FIRST, {}};
                symcomm_test::launch(r, "allreduce_bias_relu", symcomm_emu_entry_allreduce_bias_relu, dim3(ctas),
                                     dim3(threads), a);
                for (uint64_t i = 0; i < uint64_t(rows) * cols; ++i) {
                    float sum = 0.0f;
                    for (uint32_t p = 0; p < nranks; ++p) sum += partial_value(l, p, i);
                    const float y = sum + bias_value(uint32_t(i % cols));
                    wrong[r] += out[i] != (y > 0.0f ? y : 0.0f);
                }
                if (team.errors[r].status != SYMCOMM_STATUS_OK) ++wrong[r];
            }
        });
        for (uint32_t r = 0; r < nranks; ++r) {
            if (wrong[r] != 0) {
                fprintf(stderr, "FAIL nranks=%u rank=%u: %d wrong values or errors\n", nranks, r, wrong[r]);
                ++failures;
            }
        }
        printf("allreduce_bias_relu nranks=%u launches=%u %ux%u: %s\n", nranks, launches, rows, cols,
               failures ? "FAIL" : "ok");
    }
    return failures ? 1 : 0;
}

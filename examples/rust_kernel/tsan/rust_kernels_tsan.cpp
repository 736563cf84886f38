// ThreadSanitizer driver of this example's Rust kernels (device/src/lib.rs, primitives.rs), run by
// `scripts/emu-tsan-rust` (and so by scripts/test): the kernels are built for the host as a static
// library with `-Zsanitizer=thread`, the device library's C ABI (kernel/ffi*.cu) and the emulator
// runtime with `-fsanitize=thread`, so TSan sees every access of the Rust code and of the C++
// primitives it calls.
//
// Ranks are host threads, each a stream of its own (run_ranks): a rank starts its next launch,
// and rewrites its inputs for it, as soon as its own launch returned, so only the kernels'
// barriers and signals order the ranks, and TSan sees a missing one.
//   allreduce_bias_gelu  2 and 4 ranks, 3 launches: every output element against the reference
//                        (the same GELU, in the same order: bit for bit)
//   rk_signal_ring       2 and 3 ranks, 4 launches, Cta group: the values stored into the next
//                        rank before the signal are the ones read after the wait
// Exit status 0 only when every launch of every rank matched; a race ends the run with TSan's
// exit code (66).
#include <array>

#include "harness.h"
#include "symcomm_emu.h"

extern "C" void symcomm_emu_entry_allreduce_bias_gelu(void** args);
extern "C" void symcomm_emu_entry_rk_signal_ring(void** args);

namespace {

constexpr uint64_t kTimeoutNs = 60'000'000'000ull;

struct GeluArgs {
    DevComm comm;
    WindowHandleRaw partial, bias, out;
    uint32_t rows, cols, first_slot;
    std::array<void*, 7> p;
    void** ptrs() {
        p = {&comm, &partial, &bias, &out, &rows, &cols, &first_slot};
        return p.data();
    }
};

struct RingArgs {
    DevComm comm;
    WindowHandleRaw data, out;
    uint32_t group, word;
    uint64_t epoch;
    uint32_t launch, n;
    std::array<void*, 8> p;
    void** ptrs() {
        p = {&comm, &data, &out, &group, &word, &epoch, &launch, &n};
        return p.data();
    }
};

float partial_value(uint32_t launch, uint32_t rank, uint64_t i) {
    return float(int((launch * 7 + rank * 3 + i) % 17) - 8);
}
float bias_value(uint32_t col) { return float(int(col % 5) - 2); }

// device/src/activation.rs, operation for operation (no contraction: -ffp-contract=off).
float tanh_rational(float x) {
    if (x > 4.97f) return 1.0f;
    if (x < -4.97f) return -1.0f;
    const float x2 = x * x;
    const float num = x * (135135.0f + x2 * (17325.0f + x2 * (378.0f + x2)));
    const float den = 135135.0f + x2 * (62370.0f + x2 * (3150.0f + x2 * 28.0f));
    return num / den;
}
float gelu(float x) {
    const float inner = 0.7978846f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanh_rational(inner));
}

uint32_t ring_value(uint32_t rank, uint64_t epoch, uint32_t i) {
    return rank * 1000000u + uint32_t(epoch) * 1000u + i;
}

int run_gelu(uint32_t nranks) {
    const uint32_t rows = 13, cols = 70, ctas = 3, threads = 64, launches = 3;
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
            GeluArgs a{team.comm(r, kTimeoutNs), team.win(r, 0), team.win(r, 1), team.win(r, 2),
                       rows, cols, SYMCOMM_USER_BARRIER_FIRST, {}};
            a.partial.elem_size = a.bias.elem_size = a.out.elem_size = sizeof(float);
            symcomm_test::launch(r, "allreduce_bias_gelu", symcomm_emu_entry_allreduce_bias_gelu, dim3(ctas),
                                 dim3(threads), a);
            for (uint64_t i = 0; i < uint64_t(rows) * cols; ++i) {
                float sum = 0.0f;
                for (uint32_t p = 0; p < nranks; ++p) sum += partial_value(l, p, i);
                wrong[r] += out[i] != gelu(sum + bias_value(uint32_t(i % cols)));
            }
            if (team.errors[r].status != SYMCOMM_STATUS_OK) ++wrong[r];
        }
    });
    int failures = 0;
    for (uint32_t r = 0; r < nranks; ++r) failures += wrong[r] != 0;
    printf("allreduce_bias_gelu nranks=%u launches=%u %ux%u: %s\n", nranks, launches, rows, cols,
           failures ? "FAIL" : "ok");
    return failures;
}

int run_ring(uint32_t nranks) {
    const uint32_t n = 96, threads = 64, launches = 4, word = 3;
    symcomm_test::Team team(nranks, uint64_t(launches) * (n + 2) * sizeof(uint64_t), 2);
    std::vector<int> wrong(nranks, 0);
    symcomm_test::run_ranks(nranks, [&](uint32_t r) {
        const uint64_t* out = reinterpret_cast<const uint64_t*>(team.bytes(r, 1));
        const uint32_t prev = (r + nranks - 1) % nranks;
        for (uint32_t l = 0; l < launches; ++l) {
            const uint64_t epoch = l + 1;
            RingArgs a{team.comm(r, kTimeoutNs), team.win(r, 0), team.win(r, 1), 2, word, epoch, l, n, {}};
            a.data.elem_size = sizeof(uint32_t);
            a.out.elem_size = sizeof(uint64_t);
            symcomm_test::launch(r, "rk_signal_ring", symcomm_emu_entry_rk_signal_ring, dim3(1), dim3(threads), a);
            const uint64_t* o = out + uint64_t(l) * (n + 2);
            wrong[r] += o[0] != SYMCOMM_STATUS_OK;
            wrong[r] += o[1] != SYMCOMM_STATUS_OK;
            for (uint32_t i = 0; i < n; ++i) wrong[r] += o[2 + i] != ring_value(prev, epoch, i);
        }
    });
    int failures = 0;
    for (uint32_t r = 0; r < nranks; ++r) failures += wrong[r] != 0;
    printf("rk_signal_ring nranks=%u launches=%u: %s\n", nranks, launches, failures ? "FAIL" : "ok");
    return failures;
}

}  // namespace

// rustc's ThreadSanitizer instrumentation (LLVM) calls __tsan_memcpy / __tsan_memset for the
// copies it emits; GCC 12's libtsan, which this program links, predates them. Its intercepted
// memcpy / memset do the same check.
extern "C" void* __tsan_memcpy(void* dst, const void* src, size_t n) { return memcpy(dst, src, n); }
extern "C" void* __tsan_memset(void* dst, int c, size_t n) { return memset(dst, c, n); }

int main() {
    int failures = 0;
    for (uint32_t nranks : {2u, 4u}) failures += run_gelu(nranks);
    for (uint32_t nranks : {2u, 3u}) failures += run_ring(nranks);
    return failures ? 1 : 0;
}

// ThreadSanitizer run of the point-to-point kernel `symcomm_sendrecv` on the emulator: ranks
// {1, 2, 3, 4}, each in its own host thread (a stream per rank), sending a ring (to the next
// rank, from the previous one) plus a self-send, alternating with an in-place ring (one exchange
// op: send and receive on the same bytes), several back-to-back launches, with a staging
// window small enough that every message takes many pieces on every channel (1 to 8 channels
// of two 16-byte slots, by rank count and launch: layouts change between launches). Each operation runs on 1 to 3 CTAs, a count that differs
// between the ranks and the launches (so a CTA runs one or several channels, and the two sides of
// a pair cut the work differently). Between launches each rank rewrites its send buffer and
// checks what it received, so a piece read before the sender's data was released, or a slot
// rewritten before the receiver finished reading it, is a data race (or a wrong byte). Exit
// status 0 only when every launch of every rank was Ok with every byte right.
#include <array>
#include <atomic>

#include "harness.h"
#include "symcomm_emu.h"

extern "C" void symcomm_emu_entry_symcomm_sendrecv(void** args);

namespace {

struct Args {
    DevComm comm;
    P2pArgs p2p;
    std::array<void*, 2> p;
    void** ptrs() {
        p = {&comm, &p2p};
        return p.data();
    }
};

unsigned char pattern(uint32_t from, uint32_t launch, uint32_t i) {
    return static_cast<unsigned char>((from * 37u + launch * 11u + i * 7u) ^ (i >> 5));
}

}  // namespace

int main() {
    std::atomic<int> failures{0};
    for (uint32_t nranks : {1u, 2u, 3u, 4u}) {
        const uint32_t bytes = 1000, launches = 6, threads = 32;
        // 256 bytes per rank of staging: regions of 256 / nranks (rounded down to 16) bytes.
        symcomm_test::Team team(nranks, 256);
        symcomm_test::run_ranks(nranks, [&](uint32_t r) {
            std::vector<unsigned char> out(bytes), in(bytes), self(bytes);
            const uint32_t next = (r + 1) % nranks, prev = (r + nranks - 1) % nranks;
            for (uint32_t l = 0; l < launches; ++l) {
                for (uint32_t i = 0; i < bytes; ++i) out[i] = pattern(r, l, i);
                Args a{team.comm(r, 20'000'000'000ull), {}, {}};
                a.p2p.stage = team.win(r);
                a.p2p.stage.bytes = 256;
                // The layout: up to 8 channels, or 3 (the same on every rank of a launch).
                a.p2p.channels = l % 3 == 2 ? 3 : 8;
                uint32_t k = 0, grid = 0;
                // CTAs of the next operation: 1..3, differing between ranks, launches and ops
                // (0 means 1: the first op of every other launch says so).
                auto ctas = [&] {
                    const uint32_t c = (r + l + k) % 3 + 1;
                    grid += c;
                    return c == 1 && l % 2 == 0 ? 0u : c;
                };
                const bool in_place = l % 2 == 1;
                if (in_place) {
                    // The ring in place: `in` starts as this rank's data and ends as prev's.
                    in = out;
                    a.p2p.ops[k] = P2pOp{uint64_t(uintptr_t(in.data())), bytes, next, SYMCOMM_P2P_EXCHANGE, prev, ctas()};
                    ++k;
                } else {
                    const auto op = [&](unsigned char* p, uint32_t peer, uint32_t kind) {
                        a.p2p.ops[k] = P2pOp{uint64_t(uintptr_t(p)), bytes, peer, kind, 0, ctas()};
                        ++k;
                    };
                    op(out.data(), next, SYMCOMM_P2P_SEND);
                    op(in.data(), prev, SYMCOMM_P2P_RECV);
                    if (nranks > 1) {
                        op(out.data(), r, SYMCOMM_P2P_SEND);
                        op(self.data(), r, SYMCOMM_P2P_RECV);
                    }
                }
                a.p2p.nops = k;
                symcomm_test::launch(r, "symcomm_sendrecv", symcomm_emu_entry_symcomm_sendrecv, dim3(grid),
                                     dim3(threads), a);
                uint32_t wrong = 0;
                for (uint32_t i = 0; i < bytes; ++i) {
                    wrong += in[i] != pattern(prev, l, i);
                    if (nranks > 1 && !in_place) wrong += self[i] != pattern(r, l, i);
                }
                if (team.errors[r].status != SYMCOMM_STATUS_OK || wrong != 0) {
                    fprintf(stderr, "FAIL nranks=%u rank=%u launch=%u: status=%u wrong=%u\n", nranks, r, l,
                            team.errors[r].status, wrong);
                    ++failures;
                    return;
                }
            }
        });
        printf("sendrecv nranks=%u launches=%u bytes=%u: %s\n", nranks, launches, bytes, failures ? "FAIL" : "ok");
    }
    return failures ? 1 : 0;
}

// In-process multi-rank harness for emulator tests driven from C++ (the ThreadSanitizer suite):
// lays out the signal area, abort flag, error records and windows of N ranks in the flat layout
// (DESIGN §3) in one host allocation, and launches a kernel on every rank concurrently, one host
// thread per rank. Keeping thread creation and synchronization in C++ keeps TSan's view complete.
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <thread>
#include <vector>

#include "symcomm/abi.h"
#include "symcomm_emu_runtime.h"

namespace symcomm_test {

struct Team {
    uint32_t nranks;
    uint64_t window_stride;
    std::vector<uint64_t> signals;     // nranks * nranks * SYMCOMM_SIGNAL_SLOTS
    std::vector<unsigned char> window;  // nranks * window_stride
    std::vector<ErrorRecord> errors;    // one per rank
    uint32_t abort_flag = 0;

    Team(uint32_t n, uint64_t window_bytes)
        : nranks(n),
          window_stride((window_bytes + 255) / 256 * 256),
          signals(size_t(n) * n * SYMCOMM_SIGNAL_SLOTS, 0),
          window(size_t(n) * ((window_bytes + 255) / 256 * 256) + 16, 0),
          errors(n) {
        memset(errors.data(), 0, sizeof(ErrorRecord) * n);
    }

    DevComm comm(uint32_t rank, uint64_t timeout_ns) {
        DevComm c;
        c.abi_version = SYMCOMM_ABI_VERSION;
        c.rank = rank;
        c.nranks = nranks;
        c.signal_slots = SYMCOMM_SIGNAL_SLOTS;
        c.signal_base = uint64_t(uintptr_t(signals.data()));
        c.signal_stride = uint64_t(nranks) * SYMCOMM_SIGNAL_SLOTS * sizeof(uint64_t);
        c.abort_flag = uint64_t(uintptr_t(&abort_flag));
        c.error = uint64_t(uintptr_t(&errors[rank]));
        c.timeout_ns = timeout_ns;
        return c;
    }

    WindowHandleRaw win(uint32_t rank) {
        WindowHandleRaw w;
        w.base = uint64_t(uintptr_t(window.data()));
        w.stride = window_stride;
        w.bytes = window_stride;
        w.rank = rank;
        w.nranks = nranks;
        return w;
    }
};

/// Launches kernel `name` (`entry`) on every rank concurrently with per-rank arguments from
/// `make_args(rank)`, exits the process on a launch error.
template <typename MakeArgs>
void launch_all(uint32_t nranks, const char* name, symcomm_emu_entry entry, dim3 grid, dim3 block,
                MakeArgs make_args) {
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < nranks; ++r) {
        threads.emplace_back([=] {
            auto args = make_args(r);
            const uint32_t g[3] = {grid.x, grid.y, grid.z};
            const uint32_t b[3] = {block.x, block.y, block.z};
            char err[256] = {0};
            int rc = symcomm_emu_launch(name, entry, g, b, 0, args.ptrs(), err, sizeof err);
            if (rc != SYMCOMM_EMU_OK) {
                fprintf(stderr, "launch failed on rank %u: %s\n", r, err);
                exit(2);
            }
        });
    }
    for (auto& t : threads) t.join();
}

}  // namespace symcomm_test

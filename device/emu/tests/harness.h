// In-process multi-rank harness for emulator tests driven from C++ (the ThreadSanitizer suite):
// lays out the signal area, abort flag, error records and windows of N ranks in the flat layout
// (DESIGN §3) in host allocations, and launches kernels on every rank concurrently, one host
// thread per rank. Keeping thread creation and synchronization in C++ keeps TSan's view complete.
//
// Two ways to drive ranks:
//   launch_all   one launch on every rank, joined: every launch of the program is ordered after
//                the previous one (the host synchronizes all ranks in between);
//   run_ranks    one host thread per rank running its own sequence of launches (`launch`), like
//                one stream per GPU: a rank may start its next launch, and write its buffers for
//                it, while peers are still in the previous one. Only the kernels' own barriers
//                order the ranks, so TSan sees a missing one.
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
    uint64_t signal_stride;                           // bytes per rank: signal words, then the LL area
    std::vector<uint64_t> signals;                    // nranks * signal_stride bytes
    std::vector<std::vector<unsigned char>> windows;  // each nranks * window_stride (+16)
    std::vector<ErrorRecord> errors;                  // one per rank
    uint32_t abort_flag = 0;

    /// `nwindows` symmetric windows of `window_bytes` per rank (rounded up to 256), zeroed.
    Team(uint32_t n, uint64_t window_bytes, uint32_t nwindows = 1)
        : nranks(n),
          window_stride((window_bytes + 255) / 256 * 256),
          signal_stride(ll_offset(n) + SYMCOMM_LL_EPOCH_BYTES +
                        uint64_t(SYMCOMM_USER_BARRIER_END) * 2 * n * SYMCOMM_LL_LINES * SYMCOMM_LL_LINE_BYTES),
          signals(size_t(n) * signal_stride / sizeof(uint64_t), 0),
          windows(nwindows, std::vector<unsigned char>(size_t(n) * ((window_bytes + 255) / 256 * 256) + 16, 0)),
          errors(n) {
        memset(errors.data(), 0, sizeof(ErrorRecord) * n);
    }

    /// Bytes from a rank's signal array to its LL area (symcomm_device::layout::SignalLayout).
    static uint64_t ll_offset(uint32_t n) { return uint64_t(n) * SYMCOMM_SIGNAL_WORDS * sizeof(uint64_t); }

    DevComm comm(uint32_t rank, uint64_t timeout_ns) {
        DevComm c;
        c.abi_version = SYMCOMM_ABI_VERSION;
        c.rank = rank;
        c.nranks = nranks;
        c.signal_words = SYMCOMM_SIGNAL_WORDS;
        c.signal_base = uint64_t(uintptr_t(signals.data()));
        c.signal_stride = signal_stride;
        c.abort_flag = uint64_t(uintptr_t(&abort_flag));
        c.error = uint64_t(uintptr_t(&errors[rank]));
        c.timeout_ns = timeout_ns;
        c.ll_offset = ll_offset(nranks);
        c.ll_lines = SYMCOMM_LL_LINES;
        c.flags = SYMCOMM_COMM_SAME_GPU;
        c.ranks = 0;  // every rank on this host
        c.proxy = 0;
        return c;
    }

    /// Rank `rank`'s handle of window `w`: a byte window (element size 1, SYMCOMM_DTYPE_NONE),
    /// which every element type may use.
    WindowHandleRaw win(uint32_t rank, uint32_t which = 0) {
        WindowHandleRaw w;
        w.base = uint64_t(uintptr_t(windows[which].data()));
        w.stride = window_stride;
        w.bytes = window_stride;
        w.rank = rank;
        w.nranks = nranks;
        w.elem_size = 1;
        w.dtype = SYMCOMM_DTYPE_NONE;
        w.ranks = 0;
        return w;
    }

    /// Rank `rank`'s copy of window `w` (window_stride bytes).
    unsigned char* bytes(uint32_t rank, uint32_t which = 0) { return windows[which].data() + rank * window_stride; }
};

/// Launches kernel `name` (`entry`) on the calling host thread with `args` (an object with
/// `void** ptrs()`) and returns when it finished; exits the process on a launch error.
template <typename Args>
void launch(uint32_t rank, const char* name, symcomm_emu_entry entry, dim3 grid, dim3 block, Args& args) {
    const uint32_t g[3] = {grid.x, grid.y, grid.z};
    const uint32_t b[3] = {block.x, block.y, block.z};
    char err[256] = {0};
    int rc = symcomm_emu_launch(name, entry, g, b, 0, args.ptrs(), err, sizeof err);
    if (rc != SYMCOMM_EMU_OK) {
        fprintf(stderr, "launch of %s failed on rank %u: %s\n", name, rank, err);
        exit(2);
    }
}

/// Runs `body(rank)` on one host thread per rank, all at once, and joins them: each rank's
/// sequence of launches is a stream of its own (see the top of this file).
template <typename Body>
void run_ranks(uint32_t nranks, Body body) {
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < nranks; ++r) threads.emplace_back([=, &body] { body(r); });
    for (auto& t : threads) t.join();
}

/// Launches kernel `name` (`entry`) on every rank concurrently with per-rank arguments from
/// `make_args(rank)`, exits the process on a launch error.
template <typename MakeArgs>
void launch_all(uint32_t nranks, const char* name, symcomm_emu_entry entry, dim3 grid, dim3 block,
                MakeArgs make_args) {
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < nranks; ++r) {
        threads.emplace_back([=] {
            auto args = make_args(r);
            launch(r, name, entry, grid, block, args);
        });
    }
    for (auto& t : threads) t.join();
}

}  // namespace symcomm_test

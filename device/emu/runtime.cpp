// symcomm CPU emulator runtime: runs a kernel launch on OS threads.
//
// Every emulated GPU thread of every CTA is its own OS thread, all started together, so that any
// thread may spin-wait for any other (a CTA for another CTA, a rank for another rank launched
// concurrently from another host thread): the co-residency a GPU gives to a grid that fits.
// All synchronization between emulated threads lives here, in C++ (mutexes, condition variables,
// atomics), where ThreadSanitizer sees it.
#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "symcomm_emu.h"
#include "symcomm_emu_runtime.h"

namespace {

/// Reusable barrier for a fixed number of threads (generation counting).
class Barrier {
public:
    explicit Barrier(unsigned count) : count_(count) {}
    void wait() {
        std::unique_lock<std::mutex> lock(mu_);
        const unsigned gen = generation_;
        if (++arrived_ == count_) {
            arrived_ = 0;
            ++generation_;
            cv_.notify_all();
            return;
        }
        cv_.wait(lock, [&] { return generation_ != gen; });
    }
    unsigned count() const { return count_; }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    unsigned count_;
    unsigned arrived_ = 0;
    unsigned generation_ = 0;
};

struct Cta {
    explicit Cta(unsigned threads) : barrier(threads) {
        for (unsigned first = 0; first < threads; first += 32) {
            unsigned n = threads - first < 32 ? threads - first : 32;
            warps.push_back(std::make_unique<Barrier>(n));
        }
    }
    Barrier barrier;
    std::vector<std::unique_ptr<Barrier>> warps;
};

/// Start gate: threads wait until every thread of the launch exists (or the launch is cancelled
/// because one could not be created), so no thread runs kernel code that might wait for a thread
/// that will never exist.
struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
    bool cancelled = false;
};

struct ThreadArgs {
    SymcommEmuThread self;
    symcomm_emu_entry entry;
    void** args;
    Gate* gate;
};

thread_local SymcommEmuThread* tls_current = nullptr;

void* thread_main(void* p) {
    ThreadArgs* a = static_cast<ThreadArgs*>(p);
    {
        std::unique_lock<std::mutex> lock(a->gate->mu);
        a->gate->cv.wait(lock, [&] { return a->gate->open; });
        if (a->gate->cancelled) return nullptr;
    }
    tls_current = &a->self;
    a->entry(a->args);
    tls_current = nullptr;
    return nullptr;
}

int fail(char* err, size_t err_len, int code, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
int fail(char* err, size_t err_len, int code, const char* fmt, ...) {
    if (err != nullptr && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return code;
}

Cta* current_cta() {
    SymcommEmuThread* t = tls_current;
    if (t == nullptr) {
        fprintf(stderr, "symcomm emulator: a device synchronization was called outside a kernel\n");
        abort();
    }
    return static_cast<Cta*>(t->cta);
}

}  // namespace

extern "C" {

SymcommEmuThread* symcomm_emu_current(void) { return tls_current; }

void symcomm_emu_syncthreads(void) { current_cta()->barrier.wait(); }

void symcomm_emu_syncwarp(unsigned int mask) {
    Cta* cta = current_cta();
    SymcommEmuThread* t = tls_current;
    unsigned linear = t->thread_idx.x + t->block_dim.x * (t->thread_idx.y + t->block_dim.y * t->thread_idx.z);
    Barrier& warp = *cta->warps[linear / 32];
    unsigned full = warp.count() == 32 ? 0xffffffffu : ((1u << warp.count()) - 1u);
    if (mask != full) {
        fprintf(stderr, "symcomm emulator: __syncwarp(0x%08x): only the full warp mask (0x%08x) is supported\n",
                mask, full);
        abort();
    }
    warp.wait();
}

uint64_t symcomm_emu_globaltimer_ns(void) {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
}

void symcomm_emu_yield(void) { sched_yield(); }

void symcomm_emu_trap(const char* file, int line) {
    fprintf(stderr, "symcomm emulator: __trap() at %s:%d\n", file, line);
    abort();
}

int symcomm_emu_launch(symcomm_emu_entry entry, const uint32_t grid[3], const uint32_t block[3], size_t shared_bytes,
                       void** args, char* err, size_t err_len) {
    if (entry == nullptr) return fail(err, err_len, SYMCOMM_EMU_EINVAL, "null kernel entry");
    const uint64_t ctas = uint64_t(grid[0]) * grid[1] * grid[2];
    const uint64_t per_cta = uint64_t(block[0]) * block[1] * block[2];
    if (ctas == 0 || per_cta == 0)
        return fail(err, err_len, SYMCOMM_EMU_EINVAL, "empty launch: grid %ux%ux%u, block %ux%ux%u", grid[0], grid[1],
                    grid[2], block[0], block[1], block[2]);
    if (per_cta > 1024)
        return fail(err, err_len, SYMCOMM_EMU_EINVAL, "block of %llu threads exceeds 1024",
                    (unsigned long long)per_cta);
    if (shared_bytes != 0)
        return fail(err, err_len, SYMCOMM_EMU_EUNSUPPORTED,
                    "dynamic shared memory (%zu bytes) is not supported by the emulator yet", shared_bytes);
    const uint64_t total = ctas * per_cta;
    if (total > SYMCOMM_EMU_MAX_THREADS)
        return fail(err, err_len, SYMCOMM_EMU_ELIMIT,
                    "launch of %llu threads exceeds the emulator's limit of %u concurrent threads",
                    (unsigned long long)total, SYMCOMM_EMU_MAX_THREADS);

    Gate gate;
    std::vector<std::unique_ptr<Cta>> ctas_state;
    ctas_state.reserve(ctas);
    std::vector<ThreadArgs> targs(total);
    std::vector<pthread_t> threads;
    threads.reserve(total);
    const dim3 gdim(grid[0], grid[1], grid[2]);
    const dim3 bdim(block[0], block[1], block[2]);
    uint64_t i = 0;
    for (uint32_t bz = 0; bz < grid[2]; ++bz)
        for (uint32_t by = 0; by < grid[1]; ++by)
            for (uint32_t bx = 0; bx < grid[0]; ++bx) {
                ctas_state.push_back(std::make_unique<Cta>(unsigned(per_cta)));
                Cta* cta = ctas_state.back().get();
                for (uint32_t tz = 0; tz < block[2]; ++tz)
                    for (uint32_t ty = 0; ty < block[1]; ++ty)
                        for (uint32_t tx = 0; tx < block[0]; ++tx) {
                            targs[i].self = SymcommEmuThread{{tx, ty, tz}, {bx, by, bz}, bdim, gdim, cta};
                            targs[i].entry = entry;
                            targs[i].args = args;
                            targs[i].gate = &gate;
                            ++i;
                        }
            }

    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, SYMCOMM_EMU_STACK_BYTES);
    int create_error = 0;
    for (uint64_t t = 0; t < total; ++t) {
        pthread_t th;
        create_error = pthread_create(&th, &attr, thread_main, &targs[t]);
        if (create_error != 0) break;
        threads.push_back(th);
    }
    pthread_attr_destroy(&attr);
    {
        std::lock_guard<std::mutex> lock(gate.mu);
        gate.open = true;
        gate.cancelled = create_error != 0;
    }
    gate.cv.notify_all();
    for (pthread_t th : threads) pthread_join(th, nullptr);
    if (create_error != 0)
        return fail(err, err_len, SYMCOMM_EMU_ELIMIT, "could not create emulator thread %zu of %llu: %s",
                    threads.size(), (unsigned long long)total, strerror(create_error));
    return SYMCOMM_EMU_OK;
}

}  // extern "C"

// symcomm CPU emulator runtime: runs a kernel launch on CPU threads.
//
// Scheduling. Every CTA of a launch runs on its own OS thread, started when the emulated GPU
// admits it: like a GPU, an emulated GPU holds only so many CTAs (SMs x room per SM, shared by
// every launch on it from any host thread), admits them strictly in launch order and frees their
// room only when they return (see "Residency" below and symcomm_emu_runtime.h). Resident CTAs run
// concurrently, so any CTA may spin-wait for any other resident CTA, of this launch or of a rank
// launching from another host thread; a CTA that waits for one that cannot be resident waits
// until its bounded wait gives up, as on the GPU. The threads of a CTA are
// fibers (context.h) on that OS thread, switched cooperatively: a fiber runs until it waits at a
// barrier (`__syncthreads`, `__syncwarp`, a shuffle or vote), yields (`__nanosleep`, the device
// library's back-off), or returns. A barrier hands over to the next runnable fiber and the last
// arrival releases everyone; a yield hands over too, and when every runnable fiber of the CTA has
// yielded in a row the OS thread yields, so that other CTAs and ranks progress. A barrier that
// can never complete (a thread returned, or threads wait at different barriers) aborts with a
// description of the CTA's state instead of hanging.
//
// ThreadSanitizer. Each fiber is a TSan fiber, and switches carry no happens-before of their own
// (`__tsan_switch_to_fiber_no_sync`): merely running one after the other on the same OS thread
// orders nothing on a GPU. Happens-before comes only from what orders memory on a GPU: a barrier
// (every arrival releases into the barrier's sync address, every departure acquires it), the
// start of the kernel (after the launch's setup) and its end (before the launch returns). Shuffles
// and votes exchange values without ordering memory, as in CUDA. The scheduler state that fibers
// of a CTA hand to one another is therefore touched only by functions TSan does not instrument
// (SYMCOMM_EMU_UNINSTRUMENTED), which is sound because those fibers share one OS thread.
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "context.h"
#include "symcomm_emu.h"
#include "symcomm_emu_runtime.h"

#if defined(__SANITIZE_THREAD__)
#define SYMCOMM_EMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SYMCOMM_EMU_TSAN 1
#endif
#endif
#if !defined(SYMCOMM_EMU_TSAN)
#define SYMCOMM_EMU_TSAN 0
#endif

#if SYMCOMM_EMU_TSAN
// ThreadSanitizer's fiber and annotation interface (sanitizer/tsan_interface.h, declared here so
// that the runtime builds without the sanitizer headers).
extern "C" {
void* __tsan_get_current_fiber(void);
void* __tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void* fiber);
void __tsan_switch_to_fiber(void* fiber, unsigned flags);
void __tsan_set_fiber_name(void* fiber, const char* name);
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
}
#endif

/// Marks functions whose memory accesses TSan must not see (see the file comment).
#define SYMCOMM_EMU_UNINSTRUMENTED __attribute__((no_sanitize("thread")))

namespace {

using symcomm_emu_context::Context;
using symcomm_emu_context::context_make;
using symcomm_emu_context::context_switch;

constexpr unsigned kWarpSize = 32;
constexpr unsigned kNone = ~0u;
constexpr size_t kMinStack = 16 * 1024;
constexpr size_t kMaxStack = 64 * 1024 * 1024;
/// SYMCOMM_SHARED declarations one CTA may use.
constexpr unsigned kMaxSharedSites = 256;
/// Written at the lowest bytes of every fiber stack and checked at each switch: catches overflows
/// of stacks that have no guard page (see StackBudget).
constexpr uint64_t kCanary = 0x5c0aa11ed57ac4edull;
constexpr unsigned kCanaryWords = 8;

#if SYMCOMM_EMU_TSAN
constexpr size_t kTsanStackFactor = 4;
inline void tsan_acquire(void* addr) { __tsan_acquire(addr); }
inline void tsan_release(void* addr) { __tsan_release(addr); }
inline void tsan_switch(void* fiber) { __tsan_switch_to_fiber(fiber, 1 /* __tsan_switch_to_fiber_no_sync */); }
#else
constexpr size_t kTsanStackFactor = 1;
inline void tsan_acquire(void*) {}
inline void tsan_release(void*) {}
inline void tsan_switch(void*) {}
#endif

enum FiberState : uint8_t { kRunnable, kBlocked, kDone };

struct Cta;

struct Fiber {
    SymcommEmuThread self;  // what symcomm_emu_current() returns
    Cta* cta;
    unsigned linear;   // x + y * bx + z * bx * by, as CUDA numbers lanes and warps
    uint64_t* canary;  // lowest words of the stack
    void* tsan;        // TSan fiber (null without TSan)
    Context ctx;       // not movable once made (ucontext: glibc points into it)
};

/// A barrier over a fixed group of a CTA's fibers (the whole CTA, or one warp). Operations of one
/// generation must agree (`op`, `width`): lanes that call different warp collectives, or threads
/// that mix `__syncthreads` flavours, are reported.
struct Barrier {
    unsigned expected = 0;
    unsigned arrived = 0;
    unsigned exited = 0;  // members that returned from the kernel: the barrier can never complete
    unsigned generation = 0;
    unsigned op = 0;
    int width = 0;
    unsigned* waiters = nullptr;  // fiber indices blocked in this generation (room for `expected`)
    uint64_t acc = 0;             // reduction of the CTA flavours
    uint64_t result[2] = {};      // by generation parity: read by waiters after they resume
    // Sync addresses by generation parity: a fast thread may arrive at generation g+1 before a
    // waiter of generation g has resumed, and must not release into what that waiter acquires.
    char tsan_sync[2] = {};
};

struct Warp {
    Barrier barrier;
    unsigned lanes = 0;        // threads of this warp (fewer than 32 only in a CTA's last warp)
    unsigned exited_mask = 0;  // lanes that returned
    uint64_t values[2][kWarpSize] = {};  // exchanged values by generation parity
};

struct SharedSite {
    const void* site;
    size_t offset;
};

struct Launch {
    const char* name;
    symcomm_emu_entry entry;
    void** args;
    size_t dynamic_shared;
};

/// One CTA's fiber stacks: a mapping of `nthreads` slots of `stack_bytes`, each with a guard page
/// below it when `guarded` (those count against the StackBudget while the mapping exists).
struct StackMap {
    unsigned char* base = nullptr;
    size_t map_bytes = 0;
    size_t stack_bytes = 0;
    unsigned nthreads = 0;
    bool guarded = false;
};

/// Everything one CTA needs, allocated by the launching thread before any kernel code runs.
struct Cta {
    const Launch* launch = nullptr;
    uint3 block_idx = {};
    unsigned nthreads = 0;
    std::vector<Fiber> fiber_storage;
    std::vector<uint8_t> state_storage;
    std::vector<Warp> warp_storage;
    std::vector<unsigned> waiter_storage;
    // Raw views of the storage above: the fiber-side code must not call (instrumented) library
    // functions on objects it shares with other fibers.
    Fiber* fibers = nullptr;
    uint8_t* state = nullptr;
    Warp* warps = nullptr;
    unsigned nwarps = 0;
    unsigned current = 0;   // running fiber
    unsigned runnable = 0;  // fibers in kRunnable
    unsigned live = 0;      // fibers not kDone
    unsigned yield_streak = 0;
    Barrier block;
    // Shared memory: [0, MAX_STATIC) for SYMCOMM_SHARED, then the dynamic shared memory.
    unsigned char* shared = nullptr;
    size_t shared_map_bytes = 0;
    size_t static_used = 0;
    SharedSite sites[kMaxSharedSites] = {};
    unsigned nsites = 0;
    // Fiber stacks: one mapping, a guard page below each stack when guarded.
    StackMap stacks;
    Context main_ctx;
    void* main_tsan = nullptr;
    char tsan_start = 0;  // released by the CTA thread before the first fiber runs
    char tsan_done = 0;   // released by every fiber as it returns
};

thread_local Fiber* tls_fiber = nullptr;

// ---- Diagnostics -------------------------------------------------------------------------------

const char* cta_op_name(unsigned op) {
    switch (op) {
        case SYMCOMM_EMU_CTA_SYNC: return "__syncthreads()";
        case SYMCOMM_EMU_CTA_COUNT: return "__syncthreads_count()";
        case SYMCOMM_EMU_CTA_AND: return "__syncthreads_and()";
        case SYMCOMM_EMU_CTA_OR: return "__syncthreads_or()";
        default: return "an unknown CTA barrier";
    }
}

const char* warp_op_name(unsigned op) {
    switch (op) {
        case SYMCOMM_EMU_WARP_SYNC: return "__syncwarp()";
        case SYMCOMM_EMU_WARP_SHFL_IDX: return "__shfl_sync()";
        case SYMCOMM_EMU_WARP_SHFL_UP: return "__shfl_up_sync()";
        case SYMCOMM_EMU_WARP_SHFL_DOWN: return "__shfl_down_sync()";
        case SYMCOMM_EMU_WARP_SHFL_XOR: return "__shfl_xor_sync()";
        case SYMCOMM_EMU_WARP_BALLOT: return "__ballot_sync()";
        case SYMCOMM_EMU_WARP_ANY: return "__any_sync()";
        case SYMCOMM_EMU_WARP_ALL: return "__all_sync()";
        case SYMCOMM_EMU_WARP_REDUCE_ADD: return "__reduce_add_sync()";
        case SYMCOMM_EMU_WARP_REDUCE_MIN_U32:
        case SYMCOMM_EMU_WARP_REDUCE_MIN_I32: return "__reduce_min_sync()";
        case SYMCOMM_EMU_WARP_REDUCE_MAX_U32:
        case SYMCOMM_EMU_WARP_REDUCE_MAX_I32: return "__reduce_max_sync()";
        case SYMCOMM_EMU_WARP_REDUCE_AND: return "__reduce_and_sync()";
        case SYMCOMM_EMU_WARP_REDUCE_OR: return "__reduce_or_sync()";
        case SYMCOMM_EMU_WARP_REDUCE_XOR: return "__reduce_xor_sync()";
        default: return "an unknown warp operation";
    }
}

/// Reports a broken rule of the emulator in kernel code and aborts: the message names the kernel,
/// the CTA, the calling thread, and where every thread of the CTA stands.
[[noreturn]] SYMCOMM_EMU_UNINSTRUMENTED void fatal(const Cta* c, const Fiber* f, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
[[noreturn]] SYMCOMM_EMU_UNINSTRUMENTED void fatal(const Cta* c, const Fiber* f, const char* fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char* name = c->launch->name != nullptr ? c->launch->name : "?";
    fprintf(stderr, "symcomm emulator: kernel `%s`, CTA (%u,%u,%u)", name, c->block_idx.x, c->block_idx.y,
            c->block_idx.z);
    if (f != nullptr)
        fprintf(stderr, ", thread (%u,%u,%u)", f->self.thread_idx.x, f->self.thread_idx.y, f->self.thread_idx.z);
    fprintf(stderr, ": %s\n", msg);
    unsigned blocked = 0, done = 0;
    for (unsigned i = 0; i < c->nthreads; ++i) {
        blocked += c->state[i] == kBlocked;
        done += c->state[i] == kDone;
    }
    fprintf(stderr, "  CTA of %u threads: %u runnable, %u waiting, %u returned\n", c->nthreads,
            c->nthreads - blocked - done, blocked, done);
    if (c->block.arrived > 0)
        fprintf(stderr, "  %s: %u of %u threads arrived\n", cta_op_name(c->block.op), c->block.arrived,
                c->block.expected);
    unsigned listed = 0;
    for (unsigned w = 0; w < c->nwarps; ++w) {
        const Warp& warp = c->warps[w];
        if (warp.barrier.arrived == 0 && warp.exited_mask == 0) continue;
        if (++listed > 16) {
            fprintf(stderr, "  ...\n");
            break;
        }
        fprintf(stderr, "  warp %u (%u lanes):", w, warp.lanes);
        if (warp.barrier.arrived > 0)
            fprintf(stderr, " %u lanes wait at %s;", warp.barrier.arrived, warp_op_name(warp.barrier.op));
        if (warp.exited_mask != 0) fprintf(stderr, " returned lanes 0x%08x", warp.exited_mask);
        fprintf(stderr, "\n");
    }
    abort();
}

// ---- Fiber switching ---------------------------------------------------------------------------

SYMCOMM_EMU_UNINSTRUMENTED void check_canary(const Cta* c, const Fiber* f) {
    for (unsigned i = 0; i < kCanaryWords; ++i) {
        if (f->canary[i] != kCanary)
            fatal(c, f, "stack overflow: the fiber stack of %zu bytes is too small (set SYMCOMM_EMU_STACK_BYTES)",
                  c->stacks.stack_bytes);
    }
}

/// Index of the next runnable fiber after the current one (the current one last), or kNone.
SYMCOMM_EMU_UNINSTRUMENTED unsigned next_runnable(const Cta* c) {
    for (unsigned i = c->current + 1; i < c->nthreads; ++i)
        if (c->state[i] == kRunnable) return i;
    for (unsigned i = 0; i <= c->current; ++i)
        if (c->state[i] == kRunnable) return i;
    return kNone;
}

/// Saves the running context into `save` and runs fiber `to` (or the CTA's main context when
/// `to` is null). Returns when something switches back to `save`.
SYMCOMM_EMU_UNINSTRUMENTED void switch_context(Cta* c, Context* save, Fiber* to) {
    tls_fiber = to;
    tsan_switch(to != nullptr ? to->tsan : c->main_tsan);
    context_switch(*save, to != nullptr ? to->ctx : c->main_ctx);
}

/// Called by the running fiber after it changed its own state: runs the next runnable fiber and
/// returns when this one is scheduled again (at once when it is the only runnable one). A CTA
/// whose live fibers all wait is deadlocked.
SYMCOMM_EMU_UNINSTRUMENTED void run_next(Cta* c) {
    Fiber* self = &c->fibers[c->current];
    check_canary(c, self);
    const unsigned next = next_runnable(c);
    if (next == kNone)
        fatal(c, self, "deadlock: every thread of the CTA that has not returned waits at a barrier that cannot "
                       "complete (threads wait at different barriers, or for threads that returned)");
    if (next == c->current) return;
    c->current = next;
    switch_context(c, &self->ctx, &c->fibers[next]);
}

// ---- Barriers ----------------------------------------------------------------------------------

/// First half of an arrival at `b` for operation `op`: checks that the barrier can complete and
/// that this thread's operation matches the generation's (the first arrival sets it, and the
/// reduction's `identity`); returns the generation's parity.
SYMCOMM_EMU_UNINSTRUMENTED unsigned begin_arrival(const Cta* c, const Fiber* f, Barrier& b, unsigned op, int width,
                                                  uint64_t identity, const char* (*op_name)(unsigned)) {
    if (b.exited > 0)
        fatal(c, f, "%s waits for %u threads, %u of which returned from the kernel: it can never complete",
              op_name(op), b.expected, b.exited);
    if (b.arrived == 0) {
        b.op = op;
        b.width = width;
        b.acc = identity;
    } else if (b.op != op || b.width != width) {
        fatal(c, f, "this thread called %s (width %d) while %u threads of its group wait at %s (width %d)",
              op_name(op), width, b.arrived, op_name(b.op), b.width);
    }
    return b.generation & 1u;
}

/// Second half of an arrival: the last arrival releases every waiter and continues, the others
/// wait (other fibers run). With `orders_memory`, TSan sees the barrier order memory: everything
/// any member did before arriving happens before anything any member does after leaving.
SYMCOMM_EMU_UNINSTRUMENTED void finish_arrival(Cta* c, Barrier& b, bool orders_memory) {
    const unsigned parity = b.generation & 1u;
    if (orders_memory) tsan_release(&b.tsan_sync[parity]);
    c->yield_streak = 0;
    if (++b.arrived == b.expected) {
        b.result[parity] = b.acc;
        b.arrived = 0;
        ++b.generation;
        for (unsigned i = 0; i < b.expected - 1; ++i) c->state[b.waiters[i]] = kRunnable;
        c->runnable += b.expected - 1;
    } else {
        b.waiters[b.arrived - 1] = c->current;
        c->state[c->current] = kBlocked;
        --c->runnable;
        run_next(c);
    }
    if (orders_memory) tsan_acquire(&b.tsan_sync[parity]);
}

SYMCOMM_EMU_UNINSTRUMENTED Fiber* current_fiber(const char* what) {
    Fiber* f = tls_fiber;
    if (f == nullptr) {
        fprintf(stderr, "symcomm emulator: %s called outside a kernel\n", what);
        abort();
    }
    return f;
}

/// The lane a shuffle reads, as PTX `shfl.sync` defines it for CUDA's `width` (segments of
/// `width` lanes; a source outside the segment's valid range reads the lane's own value).
unsigned shuffle_source(unsigned op, unsigned lane, int arg, int width) {
    const unsigned b = unsigned(arg) & 31u;
    const unsigned seg_start = lane & ~unsigned(width - 1);
    const unsigned seg_end = seg_start | unsigned(width - 1);
    switch (op) {
        case SYMCOMM_EMU_WARP_SHFL_IDX: return seg_start | (b & unsigned(width - 1));
        case SYMCOMM_EMU_WARP_SHFL_UP: return int(lane) - int(b) >= int(seg_start) ? lane - b : lane;
        case SYMCOMM_EMU_WARP_SHFL_DOWN: return lane + b <= seg_end ? lane + b : lane;
        default: return (lane ^ b) <= seg_end ? lane ^ b : lane;  // SHFL_XOR
    }
}

// ---- Fiber entry and exit ----------------------------------------------------------------------

[[noreturn]] SYMCOMM_EMU_UNINSTRUMENTED void fiber_exit(Cta* c, Fiber* f) {
    check_canary(c, f);
    Warp& warp = c->warps[f->linear / kWarpSize];
    if (c->block.arrived > 0)
        fatal(c, f, "returned from the kernel while %u threads wait for it at %s", c->block.arrived,
              cta_op_name(c->block.op));
    if (warp.barrier.arrived > 0)
        fatal(c, f, "returned from the kernel while %u lanes of its warp wait for it at %s", warp.barrier.arrived,
              warp_op_name(warp.barrier.op));
    ++c->block.exited;
    ++warp.barrier.exited;
    warp.exited_mask |= 1u << (f->linear % kWarpSize);
    c->state[c->current] = kDone;
    --c->runnable;
    --c->live;
    c->yield_streak = 0;
    tsan_release(&c->tsan_done);
    if (c->live == 0) switch_context(c, &f->ctx, nullptr);
    run_next(c);
    fatal(c, f, "a returned thread was scheduled again");
}

SYMCOMM_EMU_UNINSTRUMENTED void fiber_main() {
    Fiber* f = tls_fiber;
    Cta* c = f->cta;
    // A recycled TSan context did not start from this launch's setup: order it explicitly.
    tsan_acquire(&c->tsan_start);
    c->launch->entry(c->launch->args);
    fiber_exit(c, f);
}

/// Body of a CTA's OS thread: runs the CTA's fibers until all have returned.
SYMCOMM_EMU_UNINSTRUMENTED void run_cta(Cta* c) {
#if SYMCOMM_EMU_TSAN
    c->main_tsan = __tsan_get_current_fiber();
#endif
    tsan_release(&c->tsan_start);
    c->current = 0;
    switch_context(c, &c->main_ctx, &c->fibers[0]);
    tls_fiber = nullptr;
    tsan_acquire(&c->tsan_done);
}

// ---- Resources ---------------------------------------------------------------------------------

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

// Process-wide constants are initialized before main, not on first use: the thread-safe
// initialization of a function-local static is a lock that TSan sees, so the first launch to get
// there would be ordered before every other rank's launch, hiding the races of a process's first
// launches (a test's first collective).
const size_t kPageSize = size_t(sysconf(_SC_PAGESIZE));

size_t page_size() { return kPageSize; }

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

/// Guard pages cost two memory mappings per stack, and a process may hold vm.max_map_count
/// mappings (65530 by default). Stacks get guard pages while the guarded stacks of all live
/// launches use at most half of that; beyond, stacks rely on the canary check alone.
class StackBudget {
public:
    static bool reserve(size_t stacks) {
        size_t cur = used_.load(std::memory_order_relaxed);
        do {
            if (cur + stacks > limit()) return false;
        } while (!used_.compare_exchange_weak(cur, cur + stacks, std::memory_order_relaxed));
        return true;
    }
    static void release(size_t stacks) { used_.fetch_sub(stacks, std::memory_order_relaxed); }

private:
    static size_t limit() { return max_stacks_; }
    static size_t max_stacks() {
        size_t max_map_count = 65530;
        if (FILE* f = fopen("/proc/sys/vm/max_map_count", "r")) {
            unsigned long v = 0;
            if (fscanf(f, "%lu", &v) == 1 && v > 0) max_map_count = v;
            fclose(f);
        }
        return max_map_count / 4;
    }
    static std::atomic<size_t> used_;
    static const size_t max_stacks_;  // before main, like kPageSize
};
std::atomic<size_t> StackBudget::used_{0};
const size_t StackBudget::max_stacks_ = StackBudget::max_stacks();

void unmap_stacks(const StackMap& m) {
    munmap(m.base, m.map_bytes);
    if (m.guarded) StackBudget::release(m.nthreads);
}

#if !SYMCOMM_EMU_TSAN
/// The stacks of finished CTAs, kept for the next launch of the same shape: mapping them anew
/// (an mmap, an mprotect per guard page, the first touch of every stack, the munmap) costs more
/// than running a small kernel, and the tests launch thousands. Bounded (kMaxMaps mappings,
/// kMaxBytes of address space, least recently cached out first); a launch that finds the
/// StackBudget exhausted unmaps cached guarded mappings, oldest first, until its own fit.
/// Not under ThreadSanitizer: TSan forgets what it knew about memory only when it is unmapped,
/// so a reused stack would look like memory shared by unrelated emulated threads.
class StackCache {
public:
    /// A cached mapping for `nthreads` stacks of `stack_bytes` (guarded or not, as cached).
    bool take(unsigned nthreads, size_t stack_bytes, StackMap* out) {
        std::lock_guard<std::mutex> hold(lock_);
        for (size_t i = maps_.size(); i-- > 0;) {
            if (maps_[i].nthreads == nthreads && maps_[i].stack_bytes == stack_bytes) {
                *out = maps_[i];
                bytes_ -= out->map_bytes;
                maps_.erase(maps_.begin() + long(i));
                return true;
            }
        }
        return false;
    }
    /// Keeps `m` for a later launch, unmapping the least recently cached mappings to make room
    /// (or `m` itself, when it alone exceeds the cache).
    void give(const StackMap& m) {
        std::vector<StackMap> evicted;
        {
            std::lock_guard<std::mutex> hold(lock_);
            if (m.map_bytes > kMaxBytes) {
                evicted.push_back(m);
            } else {
                while (maps_.size() >= kMaxMaps || bytes_ + m.map_bytes > kMaxBytes) {
                    evicted.push_back(maps_.front());
                    bytes_ -= maps_.front().map_bytes;
                    maps_.erase(maps_.begin());
                }
                maps_.push_back(m);
                bytes_ += m.map_bytes;
            }
        }
        for (const StackMap& e : evicted) unmap_stacks(e);
    }
    /// Unmaps the least recently cached guarded mapping (giving its guard pages back to the
    /// StackBudget); false when none is cached.
    bool release_oldest_guarded() {
        StackMap m;
        {
            std::lock_guard<std::mutex> hold(lock_);
            size_t i = 0;
            while (i < maps_.size() && !maps_[i].guarded) ++i;
            if (i == maps_.size()) return false;
            m = maps_[i];
            bytes_ -= m.map_bytes;
            maps_.erase(maps_.begin() + long(i));
        }
        unmap_stacks(m);
        return true;
    }

private:
    static constexpr size_t kMaxMaps = 64;
    static constexpr size_t kMaxBytes = size_t(1) << 30;
    std::mutex lock_;
    std::vector<StackMap> maps_;
    size_t bytes_ = 0;
};
StackCache stack_cache;
#endif

/// Maps `nthreads` fiber stacks of `stack_bytes`, guarded while the StackBudget allows (a cached
/// mapping of that shape when there is one). Null on success, else what failed (with errno).
const char* map_stacks(unsigned nthreads, size_t stack_bytes, StackMap* out) {
#if !SYMCOMM_EMU_TSAN
    if (stack_cache.take(nthreads, stack_bytes, out)) return nullptr;
#endif
    const size_t page = page_size();
    StackMap m;
    m.nthreads = nthreads;
    m.stack_bytes = stack_bytes;
    m.guarded = StackBudget::reserve(nthreads);
#if !SYMCOMM_EMU_TSAN
    while (!m.guarded && stack_cache.release_oldest_guarded()) m.guarded = StackBudget::reserve(nthreads);
#endif
    const size_t slot = stack_bytes + (m.guarded ? page : 0);
    m.map_bytes = slot * nthreads;
    void* base = mmap(nullptr, m.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK,
                      -1, 0);
    if (base == MAP_FAILED) {
        if (m.guarded) StackBudget::release(nthreads);
        return "could not map fiber stacks";
    }
    m.base = static_cast<unsigned char*>(base);
    if (m.guarded) {
        for (unsigned i = 0; i < nthreads; ++i)
            if (mprotect(m.base + i * slot, page, PROT_NONE) != 0) {
                const int saved = errno;
                unmap_stacks(m);
                errno = saved;
                return "could not protect fiber stack guard pages (vm.max_map_count?)";
            }
    }
    *out = m;
    return nullptr;
}

/// Gives a CTA's stacks back (to the cache, or to the system).
void unmap_or_cache_stacks(const StackMap& m) {
#if !SYMCOMM_EMU_TSAN
    stack_cache.give(m);
#else
    unmap_stacks(m);
#endif
}

#if SYMCOMM_EMU_TSAN
/// TSan fiber contexts, recycled across launches: creating one costs about 0.3 ms and 1 MiB, and
/// TSan holds at most 8192 threads and fibers. A recycled context continues the program order of
/// its previous emulated thread, so TSan orders a kernel that ends before another starts (launches
/// from one host thread are ordered anyway); kernels that run at the same time are unaffected.
/// The pool's lock is invisible to TSan (uninstrumented atomics), so that it adds no ordering.
class TsanPool {
public:
    // Pooled contexts count as running threads, and at exit TSan sleeps for atexit_sleep_ms
    // (1 s) when threads run; static destructors run before TSan's own exit handler.
    SYMCOMM_EMU_UNINSTRUMENTED ~TsanPool() {
        for (size_t i = 0; i < free_count_; ++i) __tsan_destroy_fiber(free_[i]);
    }
    /// Takes `n` contexts (recycled or new) into `out`, counting `extra` OS threads against the
    /// budget too while the launch runs; false when over SYMCOMM_EMU_TSAN_MAX_THREADS.
    SYMCOMM_EMU_UNINSTRUMENTED bool take(size_t n, size_t extra, void** out) {
        lock();
        if (in_use_ + n + extra > SYMCOMM_EMU_TSAN_MAX_THREADS) {
            unlock();
            return false;
        }
        in_use_ += n + extra;
        size_t reused = n < free_count_ ? n : free_count_;
        free_count_ -= reused;
        for (size_t i = 0; i < reused; ++i) out[i] = free_[free_count_ + i];
        unlock();
        for (size_t i = reused; i < n; ++i) out[i] = __tsan_create_fiber(0);
        return true;
    }
    SYMCOMM_EMU_UNINSTRUMENTED void give(size_t n, size_t extra, void* const* in) {
        lock();
        for (size_t i = 0; i < n; ++i) free_[free_count_++] = in[i];
        in_use_ -= n + extra;
        unlock();
    }

private:
    SYMCOMM_EMU_UNINSTRUMENTED void lock() {
        while (__atomic_exchange_n(&locked_, 1, __ATOMIC_ACQUIRE) != 0) sched_yield();
    }
    SYMCOMM_EMU_UNINSTRUMENTED void unlock() { __atomic_store_n(&locked_, 0, __ATOMIC_RELEASE); }

    int locked_ = 0;
    size_t in_use_ = 0;
    size_t free_count_ = 0;
    void* free_[SYMCOMM_EMU_TSAN_MAX_THREADS] = {};
};
TsanPool tsan_pool;
#endif

/// Maps the CTA's stacks and shared memory and makes its fibers. Returns an error message, or
/// null on success; the caller releases whatever was allocated with `release_cta`.
const char* setup_cta(Cta& c, const Launch& launch, uint3 block_idx, dim3 grid, dim3 block, size_t stack_bytes,
                      [[maybe_unused]] void* const* tsan_fibers) {
    const size_t page = page_size();
    c.launch = &launch;
    c.block_idx = block_idx;
    c.nthreads = block.x * block.y * block.z;

    c.shared_map_bytes = SYMCOMM_EMU_MAX_STATIC_SHARED + round_up(launch.dynamic_shared, page);
    void* shared = mmap(nullptr, c.shared_map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                        -1, 0);
    if (shared == MAP_FAILED) return "could not map shared memory";
    c.shared = static_cast<unsigned char*>(shared);

    if (const char* e = map_stacks(c.nthreads, stack_bytes, &c.stacks)) return e;
    const size_t slot = stack_bytes + (c.stacks.guarded ? page : 0);

    c.nwarps = (c.nthreads + kWarpSize - 1) / kWarpSize;
    c.fiber_storage = std::vector<Fiber>(c.nthreads);
    c.state_storage.assign(c.nthreads, kRunnable);
    c.warp_storage = std::vector<Warp>(c.nwarps);
    c.waiter_storage.assign(c.nthreads + c.nwarps * kWarpSize, 0);
    c.fibers = c.fiber_storage.data();
    c.state = c.state_storage.data();
    c.warps = c.warp_storage.data();
    c.runnable = c.live = c.nthreads;
    c.block.expected = c.nthreads;
    c.block.waiters = c.waiter_storage.data();
    for (unsigned w = 0; w < c.nwarps; ++w) {
        Warp& warp = c.warps[w];
        warp.lanes = c.nthreads - w * kWarpSize < kWarpSize ? c.nthreads - w * kWarpSize : kWarpSize;
        warp.barrier.expected = warp.lanes;
        warp.barrier.waiters = c.waiter_storage.data() + c.nthreads + w * kWarpSize;
    }

    const dim3 bdim(block.x, block.y, block.z);
    unsigned i = 0;
    for (uint32_t tz = 0; tz < block.z; ++tz)
        for (uint32_t ty = 0; ty < block.y; ++ty)
            for (uint32_t tx = 0; tx < block.x; ++tx, ++i) {
                Fiber& f = c.fibers[i];
                f.self = SymcommEmuThread{{tx, ty, tz}, block_idx, bdim, grid};
                f.cta = &c;
                f.linear = i;
                unsigned char* lo = c.stacks.base + i * slot + (slot - stack_bytes);
                f.canary = reinterpret_cast<uint64_t*>(lo);
                for (unsigned k = 0; k < kCanaryWords; ++k) f.canary[k] = kCanary;
#if SYMCOMM_EMU_TSAN
                // Names the emulated thread in TSan's reports (TSan copies the name).
                f.tsan = tsan_fibers[i];
                char name[128];
                snprintf(name, sizeof name, "%s CTA (%u,%u,%u) thread (%u,%u,%u)",
                         launch.name != nullptr ? launch.name : "kernel", block_idx.x, block_idx.y, block_idx.z, tx,
                         ty, tz);
                __tsan_set_fiber_name(f.tsan, name);
#endif
                if (!context_make(f.ctx, lo, stack_bytes, fiber_main)) return "getcontext failed";
            }
    return nullptr;
}

void release_cta(Cta& c) {
    if (c.stacks.base != nullptr) unmap_or_cache_stacks(c.stacks);
    if (c.shared != nullptr) munmap(c.shared, c.shared_map_bytes);
}

// ---- Residency ---------------------------------------------------------------------------------
//
// Each emulated GPU admits CTAs against its SMs' room, strictly in launch order, and a CTA leaves
// only when it returns (see symcomm_emu_runtime.h). The scheduler's state is shared by the ranks
// of a process, so it must not order their memory for ThreadSanitizer: a CTA of rank A retiring
// and one of rank B being admitted are not synchronized on a GPU. Its lock is therefore an
// uninstrumented spin lock and waiters sleep on a futex (raw system calls TSan does not see).

constexpr unsigned kMaxCtasPerSm = 64;
/// Units of room per SM. A CTA of a kernel with occupancy k takes kSmUnits / k of them, so that
/// exactly k such CTAs fit (kSmUnits > k * (k + 1) for every k <= kMaxCtasPerSm).
constexpr unsigned kSmUnits = 1u << 20;

struct Gpu {
    int lock;                   // spin lock (uninstrumented atomics)
    uint32_t changes;           // futex word: bumped whenever room or the queue head changes
    unsigned sms;               // 0 until configured (explicitly, or from the environment on first use)
    unsigned per_sm;            // most CTAs per SM (of a kernel whose occupancy is at least that)
    unsigned free_units[SYMCOMM_EMU_MAX_SMS];
    uint64_t next_ticket;       // tickets handed out: one per CTA, launch by launch
    uint64_t serving;           // the ticket whose CTA is admitted next
    uint64_t resident;          // CTAs resident now
};

// Zero-initialized storage without constructors (no function-local statics: see kPageSize).
Gpu g_gpus[SYMCOMM_EMU_MAX_GPUS];

SYMCOMM_EMU_UNINSTRUMENTED void gpu_lock(Gpu& g) {
    while (__atomic_exchange_n(&g.lock, 1, __ATOMIC_ACQUIRE) != 0) sched_yield();
}
SYMCOMM_EMU_UNINSTRUMENTED void gpu_unlock(Gpu& g) { __atomic_store_n(&g.lock, 0, __ATOMIC_RELEASE); }

/// Wakes every waiter after a change (called with the lock held; the bump is what they compare).
SYMCOMM_EMU_UNINSTRUMENTED void gpu_changed(Gpu& g) {
    __atomic_add_fetch(&g.changes, 1, __ATOMIC_RELEASE);
    syscall(SYS_futex, &g.changes, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

/// Sleeps until `g.changes` differs from `seen` (or 10 ms passed: a safety net only).
SYMCOMM_EMU_UNINSTRUMENTED void gpu_wait(Gpu& g, uint32_t seen) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    syscall(SYS_futex, &g.changes, FUTEX_WAIT_PRIVATE, seen, &ts, nullptr, 0);
}

/// A positive integer from the environment variable `name` in [lo, hi], `dflt` when unset.
bool env_count(const char* name, unsigned dflt, unsigned lo, unsigned hi, unsigned* out, char* err, size_t err_len,
               int* code);

/// Gives `g` its configuration from the environment on first use (lock held).
SYMCOMM_EMU_UNINSTRUMENTED bool gpu_ensure(Gpu& g, char* err, size_t err_len, int* code) {
    if (g.sms != 0) return true;
    unsigned sms = 0, per_sm = 0;
    if (!env_count("SYMCOMM_EMU_SMS", SYMCOMM_EMU_DEFAULT_SMS, 1, SYMCOMM_EMU_MAX_SMS, &sms, err, err_len, code) ||
        !env_count("SYMCOMM_EMU_CTAS_PER_SM", SYMCOMM_EMU_DEFAULT_CTAS_PER_SM, 1, kMaxCtasPerSm, &per_sm, err, err_len,
                   code))
        return false;
    g.sms = sms;
    g.per_sm = per_sm;
    for (unsigned i = 0; i < sms; ++i) g.free_units[i] = kSmUnits;
    return true;
}

/// Units one CTA of a kernel with `occupancy` CTAs per SM takes on `g`.
SYMCOMM_EMU_UNINSTRUMENTED unsigned cta_cost(const Gpu& g, unsigned occupancy) {
    if (occupancy == 0 || occupancy > g.per_sm) occupancy = g.per_sm;
    return kSmUnits / occupancy;
}

/// Blocks until the CTA holding `ticket` is at the head of the queue and an SM has `cost` free
/// units; takes them and returns the SM. With `cancel`, only waits for its turn and passes it on
/// (a CTA of a failed launch: later launches must not wait for it forever).
SYMCOMM_EMU_UNINSTRUMENTED unsigned gpu_admit(Gpu& g, uint64_t ticket, unsigned cost, bool cancel) {
    for (;;) {
        gpu_lock(g);
        if (g.serving == ticket) {
            // Best fit: the fullest SM with room, so that small CTAs pack together and leave
            // whole SMs to large ones (the emulator does not model fragmentation).
            unsigned best = kNone;
            if (!cancel)
                for (unsigned i = 0; i < g.sms; ++i)
                    if (g.free_units[i] >= cost && (best == kNone || g.free_units[i] < g.free_units[best])) best = i;
            if (cancel || best != kNone) {
                if (!cancel) {
                    g.free_units[best] -= cost;
                    ++g.resident;
                }
                ++g.serving;
                gpu_changed(g);
                gpu_unlock(g);
                return best;
            }
        }
        const uint32_t seen = __atomic_load_n(&g.changes, __ATOMIC_ACQUIRE);
        gpu_unlock(g);
        gpu_wait(g, seen);
    }
}

SYMCOMM_EMU_UNINSTRUMENTED void gpu_retire(Gpu& g, unsigned sm, unsigned cost) {
    gpu_lock(g);
    g.free_units[sm] += cost;
    --g.resident;
    gpu_changed(g);
    gpu_unlock(g);
}

/// Takes `n` consecutive tickets of `g` (configuring it on first use) and the cost of each CTA
/// of a kernel with `occupancy`.
SYMCOMM_EMU_UNINSTRUMENTED bool gpu_take_tickets(Gpu& g, unsigned occupancy, uint64_t n, unsigned* cost,
                                                 uint64_t* first, char* err, size_t err_len, int* code) {
    gpu_lock(g);
    const bool ok = gpu_ensure(g, err, err_len, code);
    if (ok) {
        *cost = cta_cost(g, occupancy);
        *first = g.next_ticket;
        g.next_ticket += n;
    }
    gpu_unlock(g);
    return ok;
}

/// A CTA's OS thread: what it runs and the room it gives back when it returns.
struct CtaThread {
    Cta* cta;
    Gpu* gpu;
    unsigned sm;
    unsigned cost;
};

void* cta_thread_main(void* p) {
    const CtaThread* t = static_cast<const CtaThread*>(p);
    run_cta(t->cta);
    gpu_retire(*t->gpu, t->sm, t->cost);
    return nullptr;
}

/// The fiber stack size: SYMCOMM_EMU_STACK_BYTES from the environment, or the default.
bool stack_size(size_t* out, char* err, size_t err_len, int* code) {
    size_t bytes = size_t(SYMCOMM_EMU_STACK_BYTES) * kTsanStackFactor;
    if (const char* env = getenv("SYMCOMM_EMU_STACK_BYTES")) {
        char* end = nullptr;
        errno = 0;
        const unsigned long long v = strtoull(env, &end, 10);
        if (errno != 0 || end == env || *end != '\0' || v < kMinStack || v > kMaxStack) {
            *code = fail(err, err_len, SYMCOMM_EMU_EINVAL,
                         "SYMCOMM_EMU_STACK_BYTES=%s: expected a byte count in [%zu, %zu]", env, kMinStack,
                         kMaxStack);
            return false;
        }
        bytes = size_t(v);
    }
    *out = round_up(bytes, page_size());
    return true;
}

bool env_count(const char* name, unsigned dflt, unsigned lo, unsigned hi, unsigned* out, char* err, size_t err_len,
               int* code) {
    *out = dflt;
    const char* env = getenv(name);
    if (env == nullptr) return true;
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = strtoull(env, &end, 10);
    if (errno != 0 || end == env || *end != '\0' || v < lo || v > hi) {
        *code = fail(err, err_len, SYMCOMM_EMU_EINVAL, "%s=%s: expected a count in [%u, %u]", name, env, lo, hi);
        return false;
    }
    *out = unsigned(v);
    return true;
}

}  // namespace

extern "C" {

SYMCOMM_EMU_UNINSTRUMENTED SymcommEmuThread* symcomm_emu_current(void) {
    Fiber* f = tls_fiber;
    return f != nullptr ? &f->self : nullptr;
}

SYMCOMM_EMU_UNINSTRUMENTED int symcomm_emu_syncthreads(unsigned op, int predicate) {
    Fiber* f = current_fiber(cta_op_name(op));
    Cta* c = f->cta;
    Barrier& b = c->block;
    const unsigned parity = begin_arrival(c, f, b, op, 0, op == SYMCOMM_EMU_CTA_AND ? 1 : 0, cta_op_name);
    const uint64_t p = predicate != 0;
    switch (op) {
        case SYMCOMM_EMU_CTA_SYNC: break;
        case SYMCOMM_EMU_CTA_COUNT: b.acc += p; break;
        case SYMCOMM_EMU_CTA_AND: b.acc &= p; break;
        case SYMCOMM_EMU_CTA_OR: b.acc |= p; break;
        default: fatal(c, f, "unknown CTA barrier operation %u", op);
    }
    finish_arrival(c, b, true);
    return int(b.result[parity]);
}

SYMCOMM_EMU_UNINSTRUMENTED uint64_t symcomm_emu_warp(unsigned op, unsigned mask, uint64_t value, int arg, int width) {
    Fiber* f = current_fiber(warp_op_name(op));
    Cta* c = f->cta;
    Warp& warp = c->warps[f->linear / kWarpSize];
    const unsigned lane = f->linear % kWarpSize;
    const unsigned full = warp.lanes == kWarpSize ? ~0u : (1u << warp.lanes) - 1u;
    if (mask != full)
        fatal(c, f, "%s with mask 0x%08x: the emulator supports only the mask of every lane of the warp (0x%08x)",
              warp_op_name(op), mask, full);
    const bool shuffle = op >= SYMCOMM_EMU_WARP_SHFL_IDX && op <= SYMCOMM_EMU_WARP_SHFL_XOR;
    if (shuffle && (width < 1 || width > int(kWarpSize) || (width & (width - 1)) != 0))
        fatal(c, f, "%s with width %d: the width must be a power of two in [1, 32]", warp_op_name(op), width);
    const unsigned parity = begin_arrival(c, f, warp.barrier, op, width, 0, warp_op_name);
    warp.values[parity][lane] = value;
    finish_arrival(c, warp.barrier, op == SYMCOMM_EMU_WARP_SYNC);

    const uint64_t* v = warp.values[parity];
    if (shuffle) {
        const unsigned src = shuffle_source(op, lane, arg, width);
        if (src >= warp.lanes)
            fatal(c, f, "%s reads lane %u, which does not exist in this warp of %u lanes (undefined in CUDA)",
                  warp_op_name(op), src, warp.lanes);
        return v[src];
    }
    uint64_t r = 0;
    switch (op) {
        case SYMCOMM_EMU_WARP_SYNC: return 0;
        case SYMCOMM_EMU_WARP_BALLOT:
        case SYMCOMM_EMU_WARP_ANY:
        case SYMCOMM_EMU_WARP_ALL:
            for (unsigned l = 0; l < warp.lanes; ++l) r |= uint64_t(v[l] != 0) << l;
            if (op == SYMCOMM_EMU_WARP_ANY) return r != 0;
            if (op == SYMCOMM_EMU_WARP_ALL) return r == full;
            return r;
        case SYMCOMM_EMU_WARP_REDUCE_ADD:
            for (unsigned l = 0; l < warp.lanes; ++l) r += v[l];
            return uint32_t(r);
        case SYMCOMM_EMU_WARP_REDUCE_AND:
            r = ~0u;
            for (unsigned l = 0; l < warp.lanes; ++l) r &= v[l];
            return r;
        case SYMCOMM_EMU_WARP_REDUCE_OR:
            for (unsigned l = 0; l < warp.lanes; ++l) r |= v[l];
            return r;
        case SYMCOMM_EMU_WARP_REDUCE_XOR:
            for (unsigned l = 0; l < warp.lanes; ++l) r ^= v[l];
            return r;
        case SYMCOMM_EMU_WARP_REDUCE_MIN_U32:
        case SYMCOMM_EMU_WARP_REDUCE_MAX_U32: {
            uint32_t m = uint32_t(v[0]);
            for (unsigned l = 1; l < warp.lanes; ++l) {
                const uint32_t x = uint32_t(v[l]);
                m = (op == SYMCOMM_EMU_WARP_REDUCE_MIN_U32) == (x < m) ? x : m;
            }
            return m;
        }
        case SYMCOMM_EMU_WARP_REDUCE_MIN_I32:
        case SYMCOMM_EMU_WARP_REDUCE_MAX_I32: {
            int32_t m = int32_t(uint32_t(v[0]));
            for (unsigned l = 1; l < warp.lanes; ++l) {
                const int32_t x = int32_t(uint32_t(v[l]));
                m = (op == SYMCOMM_EMU_WARP_REDUCE_MIN_I32) == (x < m) ? x : m;
            }
            return uint32_t(m);
        }
        default: fatal(c, f, "unknown warp operation %u", op);
    }
}

SYMCOMM_EMU_UNINSTRUMENTED unsigned symcomm_emu_activemask(void) {
    const Fiber* f = current_fiber("__activemask()");
    const Warp& warp = f->cta->warps[f->linear / kWarpSize];
    const unsigned all = warp.lanes == kWarpSize ? ~0u : (1u << warp.lanes) - 1u;
    return all & ~warp.exited_mask;
}

SYMCOMM_EMU_UNINSTRUMENTED void* symcomm_emu_shared_static(const void* site, size_t bytes, size_t align) {
    Fiber* f = current_fiber("SYMCOMM_SHARED");
    Cta* c = f->cta;
    for (unsigned i = 0; i < c->nsites; ++i)
        if (c->sites[i].site == site) return c->shared + c->sites[i].offset;
    if (c->nsites == kMaxSharedSites) fatal(c, f, "more than %u SYMCOMM_SHARED declarations", kMaxSharedSites);
    if (align < 16) align = 16;
    if (align > page_size()) fatal(c, f, "SYMCOMM_SHARED of a type aligned to %zu bytes (at most a page)", align);
    const size_t offset = round_up(c->static_used, align);
    if (offset + bytes > SYMCOMM_EMU_MAX_STATIC_SHARED)
        fatal(c, f, "SYMCOMM_SHARED of %zu bytes: the CTA's static shared memory would exceed %u bytes", bytes,
              SYMCOMM_EMU_MAX_STATIC_SHARED);
    if (offset + bytes + c->launch->dynamic_shared > SYMCOMM_EMU_MAX_DYNAMIC_SHARED)
        fatal(c, f, "SYMCOMM_SHARED of %zu bytes: static (%zu) plus dynamic (%zu) shared memory would exceed %u bytes",
              bytes, offset + bytes, c->launch->dynamic_shared, SYMCOMM_EMU_MAX_DYNAMIC_SHARED);
    c->sites[c->nsites++] = SharedSite{site, offset};
    c->static_used = offset + bytes;
    return c->shared + offset;
}

SYMCOMM_EMU_UNINSTRUMENTED void* symcomm_emu_shared_dynamic(void) {
    const Fiber* f = current_fiber("SYMCOMM_DYNAMIC_SHARED");
    return f->cta->shared + SYMCOMM_EMU_MAX_STATIC_SHARED;
}

SYMCOMM_EMU_UNINSTRUMENTED int symcomm_emu_is_shared(const void* p) {
    const Fiber* f = tls_fiber;
    if (f == nullptr) return 0;
    const Cta* c = f->cta;
    const unsigned char* a = static_cast<const unsigned char*>(p);
    return c->shared != nullptr && a >= c->shared && a < c->shared + c->shared_map_bytes;
}

SYMCOMM_EMU_UNINSTRUMENTED int symcomm_emu_is_local(const void* p) {
    const Fiber* f = tls_fiber;
    if (f == nullptr) return 0;
    const unsigned char* a = static_cast<const unsigned char*>(p);
    const unsigned char* lo = reinterpret_cast<const unsigned char*>(f->canary);
    return a >= lo && a < lo + f->cta->stacks.stack_bytes;
}

uint64_t symcomm_emu_globaltimer_ns(void) {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
}

SYMCOMM_EMU_UNINSTRUMENTED void symcomm_emu_yield(void) {
    Fiber* f = tls_fiber;
    if (f == nullptr) {
        sched_yield();
        return;
    }
    Cta* c = f->cta;
    if (++c->yield_streak >= c->runnable) {
        c->yield_streak = 0;
        sched_yield();
    }
    run_next(c);
}

void symcomm_emu_trap(const char* file, int line) {
    fprintf(stderr, "symcomm emulator: __trap() at %s:%d\n", file, line);
    abort();
}

SYMCOMM_EMU_UNINSTRUMENTED int symcomm_emu_gpu_configure(uint32_t gpu, uint32_t sms, uint32_t ctas_per_sm, char* err,
                                                     size_t err_len) {
    if (gpu >= SYMCOMM_EMU_MAX_GPUS)
        return fail(err, err_len, SYMCOMM_EMU_EINVAL, "emulated GPU %u: at most %u GPUs", gpu, SYMCOMM_EMU_MAX_GPUS);
    if (sms < 1 || sms > SYMCOMM_EMU_MAX_SMS || ctas_per_sm < 1 || ctas_per_sm > kMaxCtasPerSm)
        return fail(err, err_len, SYMCOMM_EMU_EINVAL,
                    "emulated GPU %u: %u SMs of %u CTAs each (expected 1 to %u SMs, 1 to %u CTAs per SM)", gpu, sms,
                    ctas_per_sm, SYMCOMM_EMU_MAX_SMS, kMaxCtasPerSm);
    Gpu& g = g_gpus[gpu];
    gpu_lock(g);
    if (g.resident != 0 || g.next_ticket != g.serving) {
        const uint64_t resident = g.resident, queued = g.next_ticket - g.serving;
        gpu_unlock(g);
        return fail(err, err_len, SYMCOMM_EMU_EBUSY,
                    "emulated GPU %u is in use (%llu CTAs resident, %llu queued): configure it before launching", gpu,
                    (unsigned long long)resident, (unsigned long long)queued);
    }
    g.sms = sms;
    g.per_sm = ctas_per_sm;
    for (unsigned i = 0; i < sms; ++i) g.free_units[i] = kSmUnits;
    gpu_unlock(g);
    return SYMCOMM_EMU_OK;
}

SYMCOMM_EMU_UNINSTRUMENTED int symcomm_emu_gpu_query(uint32_t gpu, uint32_t* sms, uint32_t* ctas_per_sm,
                                                 uint32_t* resident, char* err, size_t err_len) {
    if (gpu >= SYMCOMM_EMU_MAX_GPUS)
        return fail(err, err_len, SYMCOMM_EMU_EINVAL, "emulated GPU %u: at most %u GPUs", gpu, SYMCOMM_EMU_MAX_GPUS);
    Gpu& g = g_gpus[gpu];
    int code = SYMCOMM_EMU_OK;
    gpu_lock(g);
    const bool ok = gpu_ensure(g, err, err_len, &code);
    if (ok) {
        if (sms != nullptr) *sms = g.sms;
        if (ctas_per_sm != nullptr) *ctas_per_sm = g.per_sm;
        if (resident != nullptr) *resident = uint32_t(g.resident);
    }
    gpu_unlock(g);
    return code;
}

int symcomm_emu_launch(const char* name, symcomm_emu_entry entry, const uint32_t grid[3], const uint32_t block[3],
                       size_t shared_bytes, void** args, char* err, size_t err_len) {
    return symcomm_emu_launch_on(0, 0, name, entry, grid, block, shared_bytes, args, err, err_len);
}

int symcomm_emu_launch_on(uint32_t gpu, uint32_t occupancy, const char* name, symcomm_emu_entry entry,
                          const uint32_t grid[3], const uint32_t block[3], size_t shared_bytes, void** args, char* err,
                          size_t err_len) {
    if (entry == nullptr) return fail(err, err_len, SYMCOMM_EMU_EINVAL, "null kernel entry");
    if (gpu >= SYMCOMM_EMU_MAX_GPUS)
        return fail(err, err_len, SYMCOMM_EMU_EINVAL, "emulated GPU %u: at most %u GPUs", gpu, SYMCOMM_EMU_MAX_GPUS);
    const uint64_t ctas = uint64_t(grid[0]) * grid[1] * grid[2];
    const uint64_t per_cta = uint64_t(block[0]) * block[1] * block[2];
    if (ctas == 0 || per_cta == 0)
        return fail(err, err_len, SYMCOMM_EMU_EINVAL, "empty launch: grid %ux%ux%u, block %ux%ux%u", grid[0], grid[1],
                    grid[2], block[0], block[1], block[2]);
    if (per_cta > 1024 || block[0] > 1024 || block[1] > 1024 || block[2] > 64)
        return fail(err, err_len, SYMCOMM_EMU_EINVAL,
                    "block %ux%ux%u exceeds CUDA's limits (1024 threads, 1024x1024x64)", block[0], block[1],
                    block[2]);
    if (grid[0] > 0x7fffffffu || grid[1] > 65535 || grid[2] > 65535)
        return fail(err, err_len, SYMCOMM_EMU_EINVAL, "grid %ux%ux%u exceeds CUDA's limits (2^31-1 x 65535 x 65535)",
                    grid[0], grid[1], grid[2]);
    if (ctas > SYMCOMM_EMU_MAX_CTAS)
        return fail(err, err_len, SYMCOMM_EMU_ELIMIT,
                    "launch of %llu CTAs exceeds the emulator's limit of %u CTAs per launch (one OS thread each)",
                    (unsigned long long)ctas, SYMCOMM_EMU_MAX_CTAS);
    const uint64_t total = ctas * per_cta;
    if (total > SYMCOMM_EMU_MAX_THREADS)
        return fail(err, err_len, SYMCOMM_EMU_ELIMIT,
                    "launch of %llu threads exceeds the emulator's limit of %u concurrent threads",
                    (unsigned long long)total, SYMCOMM_EMU_MAX_THREADS);
    if (shared_bytes > SYMCOMM_EMU_MAX_DYNAMIC_SHARED)
        return fail(err, err_len, SYMCOMM_EMU_ELIMIT,
                    "%zu bytes of dynamic shared memory exceed the emulator's limit of %u bytes per CTA (as sm_90)",
                    shared_bytes, SYMCOMM_EMU_MAX_DYNAMIC_SHARED);
    size_t stack_bytes = 0;
    int code = SYMCOMM_EMU_OK;
    if (!stack_size(&stack_bytes, err, err_len, &code)) return code;

    // The launch's place in the GPU's queue: one ticket per CTA, taken together.
    Gpu& g = g_gpus[gpu];
    unsigned cost = 0;
    uint64_t first_ticket = 0;
    if (!gpu_take_tickets(g, occupancy, ctas, &cost, &first_ticket, err, err_len, &code)) return code;

    std::vector<void*> tsan_fibers;
#if SYMCOMM_EMU_TSAN
    tsan_fibers.resize(total);
    if (!tsan_pool.take(total, ctas, tsan_fibers.data())) {
        for (uint64_t t = 0; t < ctas; ++t) gpu_admit(g, first_ticket + t, 0, true);
        return fail(err, err_len, SYMCOMM_EMU_ELIMIT,
                    "launch of %llu threads in %llu CTAs: under ThreadSanitizer at most %u emulated threads and CTAs "
                    "may be live in the process",
                    (unsigned long long)total, (unsigned long long)ctas, SYMCOMM_EMU_TSAN_MAX_THREADS);
    }
#endif

    const Launch launch{name, entry, args, shared_bytes};
    std::vector<std::unique_ptr<Cta>> state(ctas);
    std::vector<CtaThread> cta_threads(ctas);
    std::vector<pthread_t> threads;
    threads.reserve(ctas);
    const dim3 gdim(grid[0], grid[1], grid[2]);
    const dim3 bdim(block[0], block[1], block[2]);
    const char* setup_error = nullptr;
    int setup_errno = 0;
    int create_error = 0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    // The CTA thread itself only runs the scheduler; kernel code runs on fiber stacks.
    pthread_attr_setstacksize(&attr, 256 * 1024);
    // CTAs in blockIdx order (x fastest), each started as soon as the GPU admits it. A CTA that
    // cannot be set up or started fails the launch; CTAs already running may then wait for it
    // until their bounded waits give up, as on a GPU whose launch failed midway.
    uint64_t i = 0;
    for (uint32_t bz = 0; bz < grid[2]; ++bz)
        for (uint32_t by = 0; by < grid[1]; ++by)
            for (uint32_t bx = 0; bx < grid[0]; ++bx, ++i) {
                const bool failed = setup_error != nullptr || create_error != 0;
                const unsigned sm = gpu_admit(g, first_ticket + i, cost, failed);
                if (failed) continue;
                state[i] = std::make_unique<Cta>();
                setup_error = setup_cta(*state[i], launch, uint3{bx, by, bz}, gdim, bdim, stack_bytes,
                                        tsan_fibers.empty() ? nullptr : tsan_fibers.data() + i * per_cta);
                setup_errno = errno;
                cta_threads[i] = CtaThread{state[i].get(), &g, sm, cost};
                if (setup_error == nullptr) {
                    pthread_t th;
                    create_error = pthread_create(&th, &attr, cta_thread_main, &cta_threads[i]);
                    if (create_error == 0) {
                        threads.push_back(th);
                        continue;
                    }
                }
                gpu_retire(g, sm, cost);
            }
    pthread_attr_destroy(&attr);
    for (pthread_t th : threads) pthread_join(th, nullptr);
    for (auto& c : state)
        if (c) release_cta(*c);
#if SYMCOMM_EMU_TSAN
    tsan_pool.give(total, ctas, tsan_fibers.data());
#endif
    if (setup_error != nullptr)
        return fail(err, err_len, SYMCOMM_EMU_ELIMIT, "launch of %llu threads in %llu CTAs: %s: %s",
                    (unsigned long long)total, (unsigned long long)ctas, setup_error, strerror(setup_errno));
    if (create_error != 0)
        return fail(err, err_len, SYMCOMM_EMU_ELIMIT, "could not create the OS thread of CTA %zu of %llu: %s",
                    threads.size(), (unsigned long long)ctas, strerror(create_error));
    return SYMCOMM_EMU_OK;
}

}  // extern "C"

// The emulator's self-test: every supported CUDA feature against expectations computed here, the
// scheduler's guarantees (barriers across many rounds and warps, CTAs spin-waiting on each other,
// a large launch), refused launches, the rules whose breach aborts (each in a child process),
// and, in ThreadSanitizer builds, races that TSan must report (each in a child process; the rest
// of the run must stay free of reports). Exit status 0 only when everything passed; every failure
// is printed. Kernels: emu_selftest_kernels.cu.
//
//   emu_selftest                 run every check
//   emu_selftest --child NAME    run one aborting or racy kernel (the checks spawn this)
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "emu_selftest_kernels.cu"
#include "symcomm_emu_runtime.h"

extern char** environ;

namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool kTsan = true;
#else
constexpr bool kTsan = false;
#endif

int failures = 0;
const char* current_check = "";

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "FAIL %s: %s: ", current_check, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                 \
            fprintf(stderr, "\n");                                        \
            ++failures;                                                   \
        }                                                                 \
    } while (0)

/// Launches `entry` and returns the runtime's code; its message goes to `*message`.
int launch(const char* name, symcomm_emu_entry entry, dim3 grid, dim3 block, size_t shared, std::vector<void*> args,
           std::string* message = nullptr) {
    const uint32_t g[3] = {grid.x, grid.y, grid.z};
    const uint32_t b[3] = {block.x, block.y, block.z};
    char err[512] = {0};
    const int rc = symcomm_emu_launch(name, entry, g, b, shared, args.data(), err, sizeof err);
    if (message != nullptr) *message = err;
    return rc;
}

/// Launches `entry` and counts a failure when the launch is refused.
void run(const char* name, symcomm_emu_entry entry, dim3 grid, dim3 block, size_t shared, std::vector<void*> args) {
    std::string message;
    const int rc = launch(name, entry, grid, block, shared, std::move(args), &message);
    CHECK(rc == SYMCOMM_EMU_OK, "launch of %s refused (%d): %s", name, rc, message.c_str());
}

double ms_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// ---- Checks ------------------------------------------------------------------------------------

void check_barrier() {
    uint32_t errors = 0;
    uint32_t rounds = kTsan ? 24 : 64;
    uint32_t* errors_ptr = &errors;
    // 8 warps in a 3D block, several CTAs; then a 2D block, the largest (32 warps) in plain builds
    // (under TSan every emulated thread costs about 1 MiB: see README).
    run("st_barrier", symcomm_emu_entry_st_barrier, dim3(kTsan ? 2 : 4), dim3(8, 8, 4), 0, {&rounds, &errors_ptr});
    CHECK(errors == 0, "%u mismatches in 256-thread CTAs", errors);
    errors = 0;
    rounds = kTsan ? 8 : 16;
    const dim3 block2d = kTsan ? dim3(16, 16) : dim3(32, 32);
    run("st_barrier", symcomm_emu_entry_st_barrier, dim3(kTsan ? 1 : 3), block2d, 0, {&rounds, &errors_ptr});
    CHECK(errors == 0, "%u mismatches in %ux%u CTAs", errors, block2d.x, block2d.y);
}

/// The value a shuffle returns, as the CUDA programming guide describes it (independent of the
/// runtime's PTX-style computation): lanes form segments of `width`; __shfl_sync reads lane
/// `arg % width` of the segment; up/down read `lane -/+ arg` unless that leaves the segment; xor
/// reads `lane ^ arg` unless that is in a later segment. Out of range: the lane's own value.
template <typename T>
uint64_t expected_shuffle(int op, int width, int arg, uint32_t t) {
    using namespace selftest;
    const int lane = int(t % 32u);
    const int seg = lane / width * width;
    int src = lane;
    switch (op) {
        case 0: src = seg + arg % width; break;
        case 1: src = lane - arg >= seg ? lane - arg : lane; break;
        case 2: src = lane + arg < seg + width ? lane + arg : lane; break;
        default: src = (lane ^ arg) < seg + width ? lane ^ arg : lane; break;
    }
    return to_bits(shfl_input<T>(t - uint32_t(lane) + uint32_t(src)));
}

template <typename T>
void check_shuffle_type(const char* type, const uint64_t* got) {
    using namespace selftest;
    int wrong = 0;
    for (int wi = 0; wi < kShflWidths; ++wi)
        for (int op = 0; op < kShflOps; ++op)
            for (int k = 0; k < kShflArgs; ++k)
                for (uint32_t t = 0; t < kShflThreads; ++t) {
                    const int c = (wi * kShflOps + op) * kShflArgs + k;
                    const uint64_t want = expected_shuffle<T>(op, 32 >> wi, shfl_arg(op, k, t % 32u), t);
                    const uint64_t have = got[size_t(c) * kShflThreads + t];
                    if (have != want && ++wrong <= 5)
                        CHECK(have == want, "%s shuffle op %d width %d arg %d thread %u: got 0x%llx, want 0x%llx", type,
                              op, 32 >> wi, shfl_arg(op, k, t % 32u), t, (unsigned long long)have,
                              (unsigned long long)want);
                }
}

void check_shuffle() {
    using namespace selftest;
    const size_t per_type = size_t(kShflCases) * kShflThreads;
    std::vector<uint64_t> out(kShflTypes * per_type, 0xdeadbeefull);
    uint64_t* out_ptr = out.data();
    run("st_shuffle", symcomm_emu_entry_st_shuffle, dim3(1), dim3(kShflThreads), 0, {&out_ptr});
    check_shuffle_type<int>("int", out.data() + 0 * per_type);
    check_shuffle_type<unsigned>("unsigned", out.data() + 1 * per_type);
    check_shuffle_type<long long>("long long", out.data() + 2 * per_type);
    check_shuffle_type<unsigned long long>("unsigned long long", out.data() + 3 * per_type);
    check_shuffle_type<float>("float", out.data() + 4 * per_type);
    check_shuffle_type<double>("double", out.data() + 5 * per_type);
}

void check_vote() {
    using namespace selftest;
    std::vector<uint32_t> out(kVoteThreads * kVoteWords, 0xdeadbeefu);
    uint32_t* out_ptr = out.data();
    run("st_vote", symcomm_emu_entry_st_vote, dim3(1), dim3(kVoteThreads), 0, {&out_ptr});
    for (uint32_t t = 0; t < kVoteThreads; ++t) {
        const uint32_t lane = t % 32u, base = t - lane;
        const uint32_t lanes = kVoteThreads - base < 32 ? kVoteThreads - base : 32;
        const uint32_t mask = lanes == 32 ? ~0u : (1u << lanes) - 1u;
        std::vector<uint32_t> want(kVoteWords);
        want[0] = mask;
        for (int p = 0; p < 4; ++p) {
            uint32_t ballot = 0;
            for (uint32_t l = 0; l < lanes; ++l) ballot |= uint32_t(vote_predicate(p, l) != 0) << l;
            want[1 + 3 * p] = ballot;
            want[2 + 3 * p] = ballot != 0;
            want[3 + 3 * p] = ballot == mask;
        }
        uint32_t sum = 0, umin = ~0u, umax = 0, iand = ~0u, ior = 0, ixor = 0;
        int32_t isum = 0, imin = INT32_MAX, imax = INT32_MIN;
        for (uint32_t l = 0; l < lanes; ++l) {
            const uint32_t uv = l * 2654435761u;
            const int32_t iv = int32_t(l) - 7;
            sum += uv;
            umin = uv < umin ? uv : umin;
            umax = uv > umax ? uv : umax;
            isum += iv;
            imin = iv < imin ? iv : imin;
            imax = iv > imax ? iv : imax;
            iand &= ~(1u << l);
            ior |= 1u << l;
            ixor ^= uv;
        }
        want[13] = sum;
        want[14] = umin;
        want[15] = umax;
        want[16] = uint32_t(isum);
        want[17] = uint32_t(imin);
        want[18] = uint32_t(imax);
        want[19] = lanes == 32 ? 0u : iand;
        want[20] = ior;
        want[21] = ixor;
        want[22] = base + (lane ^ 8u);
        want[23] = lane % 16u + 3u < 16u ? t + 3u : t;
        for (uint32_t w = 0; w < kVoteWords; ++w)
            CHECK(out[t * kVoteWords + w] == want[w], "thread %u word %u: got 0x%x, want 0x%x", t, w,
                  out[t * kVoteWords + w], want[w]);
    }
}

void check_shared() {
    const uint32_t ctas = 6;
    for (const uint32_t dyn_bytes : {0u, kTsan ? 32u * 1024u : 200u * 1024u}) {
        uint32_t errors = 0, dyn_words = dyn_bytes / 4;
        std::vector<uint64_t> addrs(2 * ctas, 0);
        uint32_t* errors_ptr = &errors;
        uint64_t* addrs_ptr = addrs.data();
        run("st_shared", symcomm_emu_entry_st_shared, dim3(ctas), dim3(96), dyn_bytes,
            {&dyn_words, &errors_ptr, &addrs_ptr});
        CHECK(errors == 0, "%u errors with %u bytes of dynamic shared memory", errors, dyn_bytes);
        for (uint32_t a = 0; a < ctas; ++a)
            for (uint32_t b = a + 1; b < ctas; ++b)
                CHECK(addrs[2 * a] != addrs[2 * b] && addrs[2 * a + 1] != addrs[2 * b + 1],
                      "CTAs %u and %u share shared memory", a, b);
    }
}

void check_ring() {
    uint64_t token = 0;
    uint32_t errors = 0, turns = kTsan ? 16 : 64;
    const uint32_t ctas = kTsan ? 4 : 8;
    uint64_t* token_ptr = &token;
    uint32_t* errors_ptr = &errors;
    run("st_ring", symcomm_emu_entry_st_ring, dim3(ctas), dim3(64), 0, {&token_ptr, &turns, &errors_ptr});
    CHECK(errors == 0 && token == uint64_t(turns) * ctas, "errors %u, token %llu, want %llu", errors,
          (unsigned long long)token, (unsigned long long)turns * ctas);
}

void check_big() {
    const dim3 grid(kTsan ? 8 : 64), block(kTsan ? 64 : 256);
    unsigned long long count = 0;
    uint32_t errors = 0, rounds = 4;
    unsigned long long* count_ptr = &count;
    uint32_t* errors_ptr = &errors;
    const auto start = std::chrono::steady_clock::now();
    run("st_big", symcomm_emu_entry_st_big, grid, block, 0, {&rounds, &count_ptr, &errors_ptr});
    const double ms = ms_since(start);
    CHECK(errors == 0 && count == 1ull * grid.x * block.x, "errors %u, count %llu", errors, count);
    CHECK(ms < 10000, "%u CTAs x %u threads took %.0f ms", grid.x, block.x, ms);
    uint32_t barriers = 2;  // per round: the tree's levels and two more
    for (uint32_t s = block.x / 2; s > 0; s /= 2) ++barriers;
    printf("     %u CTAs x %u threads, %u rounds of %u barriers: %.0f ms\n", grid.x, block.x, rounds, barriers, ms);
}

uint32_t popcount_ref(uint64_t x) {
    uint32_t n = 0;
    for (; x != 0; x >>= 1) n += uint32_t(x & 1);
    return n;
}
uint32_t clz_ref(uint64_t x, uint32_t bits) {
    uint32_t n = 0;
    for (uint32_t b = bits; b-- > 0 && !((x >> b) & 1);) ++n;
    return n;
}
uint32_t ffs_ref(uint64_t x, uint32_t bits) {
    for (uint32_t b = 0; b < bits; ++b)
        if ((x >> b) & 1) return b + 1;
    return 0;
}
uint64_t brev_ref(uint64_t x, uint32_t bits) {
    uint64_t r = 0;
    for (uint32_t b = 0; b < bits; ++b) r |= ((x >> b) & 1) << (bits - 1 - b);
    return r;
}

void check_intrinsics() {
    using namespace selftest;
    const uint32_t ctas = 2, per_cta = 64, n = ctas * per_cta;
    AtomicsOut o{};
    o.umin = o.and_bits = ~0u;
    o.imax = INT32_MIN;
    o.imin = INT32_MAX;
    o.llmin = INT64_MAX;
    o.llmax = INT64_MIN;
    std::vector<uint32_t> in(n), bits(n * kIntrinsicWords);
    std::vector<uint64_t> in64(n), bits64(n * 3);
    uint64_t seed = 0x243f6a8885a308d3ull;
    for (uint32_t t = 0; t < n; ++t) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        in64[t] = seed >> (t % 7 == 0 ? 40 : 0);
        in[t] = uint32_t(seed >> 32) >> (t % 5 == 0 ? 20 : 0);
    }
    in[0] = 0;
    in[1] = ~0u;
    in[2] = 1u << 31;
    in64[0] = 0;
    in64[1] = ~0ull;
    AtomicsOut* o_ptr = &o;
    const uint32_t* in_ptr = in.data();
    const uint64_t* in64_ptr = in64.data();
    uint32_t* bits_ptr = bits.data();
    uint64_t* bits64_ptr = bits64.data();
    run("st_intrinsics", symcomm_emu_entry_st_intrinsics, dim3(ctas), dim3(per_cta), 0,
        {&o_ptr, &in_ptr, &in64_ptr, &bits_ptr, &bits64_ptr});

    unsigned umax = 0, umin = ~0u, inc = 0, dec = 0, xor_bits = 0, xor_all = 0;
    for (uint32_t t = 0; t < n; ++t) {
        umax = t * 7u % 101u > umax ? t * 7u % 101u : umax;
        umin = t * 7u % 101u + 3u < umin ? t * 7u % 101u + 3u : umin;
        inc = inc >= 9u ? 0u : inc + 1u;
        dec = (dec == 0u || dec > 9u) ? 9u : dec - 1u;
        xor_bits ^= t * 2654435761u;
        xor_all ^= t + 1u;
    }
    CHECK(o.fsum == float(n) * float(n - 1) / 2.0f + 0.5f * float(n), "atomicAdd(float): %f", o.fsum);
    CHECK(o.dsum == 0.25 * n * (n - 1) / 2.0, "atomicAdd(double): %f", o.dsum);
    CHECK(o.umax == umax && o.umin == umin, "atomicMax/Min(unsigned): %u %u", o.umax, o.umin);
    CHECK(o.inc == inc && o.dec == dec, "atomicInc/Dec: %u %u, want %u %u", o.inc, o.dec, inc, dec);
    CHECK(o.and_bits == 0 && o.or_bits == ~0u && o.xor_bits == xor_bits, "atomicAnd/Or/Xor: %x %x %x",
          o.and_bits, o.or_bits, o.xor_bits);
    CHECK((o.exch_returned ^ o.exch) == xor_all, "atomicExch returned every value once: %x %x", o.exch_returned,
          o.exch);
    CHECK(o.cas_count == n, "atomicCAS increments: %u", o.cas_count);
    CHECK(o.imax == int(n) - 51 && o.imin == -50 && o.isub == -int(n * (n - 1) / 2), "int atomics: %d %d %d",
          o.imax, o.imin, o.isub);
    CHECK(o.ullmax == 0xff00000000000000ull + n - 1 && o.ulladd == (1ull << 33) * n, "unsigned long long atomics");
    CHECK(o.llmin == -(long long)(n - 1) * (1ll << 35) && o.llmax == (long long)(n - 1) * (1ll << 35),
          "long long atomics");

    for (uint32_t t = 0; t < n; ++t) {
        const uint32_t x = in[t];
        const uint32_t* b = &bits[t * kIntrinsicWords];
        const uint32_t want[kIntrinsicWords] = {
            popcount_ref(x),
            clz_ref(x, 32),
            ffs_ref(x, 32),
            uint32_t(brev_ref(x, 32)),
            x,
            x,
            x < 1000u ? x : 1000u,
            int32_t(x) > -5 ? x : uint32_t(-5),
            uint32_t((uint64_t(x) * 0x9e3779b9u) >> 32),
            uint32_t((int64_t(int32_t(x)) * -12345) >> 32),
        };
        for (uint32_t w = 0; w < kIntrinsicWords; ++w)
            CHECK(b[w] == want[w], "intrinsic %u of 0x%08x: got 0x%x, want 0x%x", w, x, b[w], want[w]);
        const uint64_t y = in64[t];
        const uint64_t want64[3] = {
            popcount_ref(y) | uint64_t(clz_ref(y, 64)) << 8 | uint64_t(ffs_ref(y, 64)) << 16,
            brev_ref(y, 64),
            y,
        };
        for (uint32_t w = 0; w < 3; ++w)
            CHECK(bits64[t * 3 + w] == want64[w], "64-bit intrinsic %u of 0x%llx: got 0x%llx", w,
                  (unsigned long long)y, (unsigned long long)bits64[t * 3 + w]);
    }
}

void check_refused() {
    uint32_t ran = 0;
    uint32_t* ran_ptr = &ran;
    struct Case {
        const char* what;
        dim3 grid, block;
        size_t shared;
        int code;
    };
    const Case cases[] = {
        {"empty grid", dim3(0), dim3(1), 0, SYMCOMM_EMU_EINVAL},
        {"1025 threads per block", dim3(1), dim3(1025), 0, SYMCOMM_EMU_EINVAL},
        {"block z of 65", dim3(1), dim3(1, 1, 65), 0, SYMCOMM_EMU_EINVAL},
        {"grid y of 65536", dim3(1, 65536), dim3(1), 0, SYMCOMM_EMU_EINVAL},
        {"4097 CTAs", dim3(4097), dim3(1), 0, SYMCOMM_EMU_ELIMIT},
        {"2^21 threads", dim3(2048), dim3(1024), 0, SYMCOMM_EMU_ELIMIT},
        {"227 KiB + 1 of dynamic shared memory", dim3(1), dim3(1), SYMCOMM_EMU_MAX_DYNAMIC_SHARED + 1,
         SYMCOMM_EMU_ELIMIT},
    };
    for (const Case& c : cases) {
        std::string message;
        const int rc = launch("st_flag", symcomm_emu_entry_st_flag, c.grid, c.block, c.shared, {&ran_ptr}, &message);
        CHECK(rc == c.code && !message.empty(), "%s: code %d (%s), want %d", c.what, rc, message.c_str(), c.code);
    }
    std::string message;
    CHECK(launch("st_flag", nullptr, dim3(1), dim3(1), 0, {&ran_ptr}, &message) == SYMCOMM_EMU_EINVAL,
          "null entry: %s", message.c_str());
    for (const char* bad : {"abc", "1000", "99999999999"}) {
        setenv("SYMCOMM_EMU_STACK_BYTES", bad, 1);
        const int rc = launch("st_flag", symcomm_emu_entry_st_flag, dim3(1), dim3(1), 0, {&ran_ptr}, &message);
        CHECK(rc == SYMCOMM_EMU_EINVAL, "SYMCOMM_EMU_STACK_BYTES=%s: code %d (%s)", bad, rc, message.c_str());
    }
    CHECK(ran == 0, "a refused launch ran the kernel");

    setenv("SYMCOMM_EMU_STACK_BYTES", "32768", 1);
    run("st_flag", symcomm_emu_entry_st_flag, dim3(2), dim3(33), SYMCOMM_EMU_MAX_DYNAMIC_SHARED, {&ran_ptr});
    unsetenv("SYMCOMM_EMU_STACK_BYTES");
    CHECK(ran == 1, "the launch with 227 KiB of dynamic shared memory and 32 KiB stacks did not run");

    // ThreadSanitizer's budget of live emulated threads (plain builds run this launch).
    ran = 0;
    const int rc = launch("st_flag", symcomm_emu_entry_st_flag, dim3(7), dim3(1024), 0, {&ran_ptr}, &message);
    if (kTsan)
        CHECK(rc == SYMCOMM_EMU_ELIMIT && ran == 0, "7168 threads under TSan: code %d (%s)", rc, message.c_str());
    else
        CHECK(rc == SYMCOMM_EMU_OK && ran == 1, "7168 threads: code %d (%s)", rc, message.c_str());
}

// ---- Child processes: kernels that must abort, races TSan must report ---------------------------

struct ChildKernel {
    const char* name;
    symcomm_emu_entry entry;
    uint32_t ctas, threads;
    const char* expect;  // in the child's stderr
    bool race;           // a ThreadSanitizer report, not an abort
};

const ChildKernel kChildren[] = {
    {"st_die_early_return", symcomm_emu_entry_st_die_early_return, 1, 64, "returned from the kernel", false},
    {"st_die_return_before_barrier", symcomm_emu_entry_st_die_return_before_barrier, 1, 64, "can never complete",
     false},
    {"st_die_warp_mismatch", symcomm_emu_entry_st_die_warp_mismatch, 1, 32, "while 1 threads of its group wait",
     false},
    {"st_die_bad_mask", symcomm_emu_entry_st_die_bad_mask, 1, 32, "mask 0x0000ffff", false},
    {"st_die_missing_lane", symcomm_emu_entry_st_die_missing_lane, 1, 20, "does not exist", false},
    {"st_die_deadlock", symcomm_emu_entry_st_die_deadlock, 1, 64, "deadlock", false},
    {"st_die_stack_overflow", symcomm_emu_entry_st_die_stack_overflow, 1, 4, nullptr, false},
    {"st_race_yield", symcomm_emu_entry_st_race_yield, 1, 2, "ThreadSanitizer: data race", true},
    {"st_race_shuffle", symcomm_emu_entry_st_race_shuffle, 1, 32, "ThreadSanitizer: data race", true},
    {"st_race_between_barriers", symcomm_emu_entry_st_race_between_barriers, 1, 4, "ThreadSanitizer: data race",
     true},
    {"st_race_ctas", symcomm_emu_entry_st_race_ctas, 2, 1, "ThreadSanitizer: data race", true},
};

/// Body of `--child NAME`: runs the kernel with scratch buffers; returns only when the emulator
/// (or TSan) let it finish.
int child_main(const char* name) {
    for (const ChildKernel& k : kChildren) {
        if (strcmp(k.name, name) != 0) continue;
        std::vector<uint64_t> scratch(4096, 0);
        void* a = scratch.data();
        void* b = scratch.data() + 1024;
        void* c = scratch.data() + 2048;
        std::vector<void*> args = {&a, &b, &c};
        std::string message;
        const int rc = launch(k.name, k.entry, dim3(k.ctas), dim3(k.threads), 0, args, &message);
        fprintf(stderr, "child %s: the launch returned %d %s\n", name, rc, message.c_str());
        return 0;
    }
    fprintf(stderr, "unknown child kernel %s\n", name);
    return 2;
}

/// Runs `--child NAME` in a fresh process (so that aborts and TSan's exit stay there) and returns
/// its wait status and stderr.
int spawn_child(const char* name, std::string* err) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    posix_spawn_file_actions_addclose(&actions, fds[1]);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e)
        if (strncmp(*e, "TSAN_OPTIONS=", 13) != 0) env.emplace_back(*e);
    env.emplace_back("TSAN_OPTIONS=halt_on_error=1 exitcode=66");
    std::vector<char*> envp;
    for (std::string& s : env) envp.push_back(&s[0]);
    envp.push_back(nullptr);
    char arg0[] = "emu_selftest", arg1[] = "--child";
    std::string arg2 = name;
    char* argv[] = {arg0, arg1, &arg2[0], nullptr};
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        return -1;
    }
    char buf[4096];
    for (ssize_t got; (got = read(fds[0], buf, sizeof buf)) > 0;) err->append(buf, size_t(got));
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

void check_children() {
    for (const ChildKernel& k : kChildren) {
        if (k.race && !kTsan) continue;
        std::string err;
        const int status = spawn_child(k.name, &err);
        bool ok;
        if (k.race) {
            ok = WIFEXITED(status) && WEXITSTATUS(status) == 66 && err.find(k.expect) != std::string::npos;
        } else if (k.expect == nullptr) {
            // Stack overflow: the guard page faults (a signal, or TSan's report of it and exit 66).
            ok = (WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) ||
                 (WIFEXITED(status) && WEXITSTATUS(status) != 0 && err.find("SEGV") != std::string::npos);
        } else {
            ok = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && err.find(k.expect) != std::string::npos &&
                 err.find("symcomm emulator: kernel `") != std::string::npos;
        }
        CHECK(ok, "child %s: wait status 0x%x, expected %s; its stderr:\n%s", k.name, unsigned(status),
              k.expect != nullptr ? k.expect : "SIGSEGV", err.c_str());
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 3 && strcmp(argv[1], "--child") == 0) return child_main(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--child NAME]\n", argv[0]);
        return 2;
    }
    struct Check {
        const char* name;
        void (*fn)();
    };
    const Check checks[] = {
        {"barriers (__syncthreads, __syncwarp, reductions)", check_barrier},
        {"shuffles (every variant, width and type)", check_shuffle},
        {"votes and warp reductions (full and partial warp)", check_vote},
        {"shared memory (static and dynamic, per CTA)", check_shared},
        {"CTAs spin-waiting on each other", check_ring},
        {"large launch", check_big},
        {"atomics and intrinsics", check_intrinsics},
        {"refused launches", check_refused},
        {kTsan ? "aborting kernels and races TSan must report" : "aborting kernels", check_children},
    };
    const auto start = std::chrono::steady_clock::now();
    for (const Check& c : checks) {
        current_check = c.name;
        const int before = failures;
        const auto t0 = std::chrono::steady_clock::now();
        c.fn();
        printf("%s %s (%.0f ms)\n", failures == before ? "ok  " : "FAIL", c.name, ms_since(t0));
        fflush(stdout);
    }
    printf("emu_selftest%s: %s, %d failures (%.0f ms)\n", kTsan ? " (ThreadSanitizer)" : "",
           failures == 0 ? "ok" : "FAILED", failures, ms_since(start));
    return failures == 0 ? 0 : 1;
}

// The numerics oracle (run by device/tests/numerics.rs): symcomm's conversions (types.cuh, in
// emulator mode: the software paths) against NVIDIA's host implementations (oracle_nvidia.cpp),
// bit for bit:
//   - every f16 / bf16 / fp8 e4m3 / fp8 e5m2 bit pattern -> float;
//   - float -> each format for a deterministic set: every finite value of each format and every
//     midpoint between neighbours (and the overflow boundary), each +-0, 1, 2 ulps of float, both
//     signs; every power of two of float +-2 ulps; zeros, infinities, NaNs, float subnormals; and
//     pseudo-random floats (uniform bit patterns and a band around the formats' ranges) from a
//     printed seed (`oracle [seed] [count]`).
// Prints one line per check and `TOTAL checked <n> mismatches <m>`; exits 1 on any mismatch.
#include <symcomm/types.cuh>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <vector>

extern "C" {
void nv_from_float(const float* x, size_t n, uint16_t* f16, uint16_t* bf16, uint8_t* e4m3, uint8_t* e5m2);
float nv_half_to_float(uint16_t bits);
float nv_bf16_to_float(uint16_t bits);
float nv_e4m3_to_float(uint8_t bits);
float nv_e5m2_to_float(uint8_t bits);
}

namespace {

using namespace symcomm;

uint64_t total_checked = 0;
uint64_t total_mismatches = 0;

uint32_t bits_of(float f) { return float_as_bits(f); }
float float_of(uint32_t u) { return bits_as_float(u); }

struct Check {
    const char* what;
    uint64_t checked = 0;
    uint64_t mismatches = 0;
    explicit Check(const char* w) : what(w) {}
    void compare(uint32_t input, uint32_t ours, uint32_t theirs) {
        ++checked;
        if (ours == theirs) return;
        if (++mismatches <= 8) {
            printf("  MISMATCH %s: input 0x%08x (%.9g): symcomm 0x%x, nvidia 0x%x\n", what, input,
                   double(float_of(input)), ours, theirs);
        }
    }
    ~Check() {
        printf("%-32s checked %10llu mismatches %llu\n", what, (unsigned long long)checked,
               (unsigned long long)mismatches);
        total_checked += checked;
        total_mismatches += mismatches;
    }
};

uint64_t splitmix64(uint64_t& s) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/// Adds `f` and its neighbours within `ulps` float ulps (same sign, finite), and their negations.
void add_around(std::vector<float>& out, float f, int ulps) {
    const uint32_t u = bits_of(f) & 0x7fffffffu;
    for (int d = -ulps; d <= ulps; ++d) {
        const int64_t v = int64_t(u) + d;
        if (v < 0 || v > 0x7f800000) continue;
        out.push_back(float_of(uint32_t(v)));
        out.push_back(float_of(uint32_t(v) | 0x80000000u));
    }
}

/// Every finite non-negative value of a format (in increasing order), the midpoints between
/// neighbours, and the midpoint between the largest value and `beyond` (the value the next
/// encoding would have without overflow), each with +-2 float ulps and both signs.
void add_format(std::vector<float>& out, const std::vector<double>& values, double beyond) {
    for (size_t i = 0; i < values.size(); ++i) {
        add_around(out, float(values[i]), 2);
        const double next = i + 1 < values.size() ? values[i + 1] : beyond;
        add_around(out, float((values[i] + next) / 2), 2);  // exact: one more bit than the format
    }
}

}  // namespace

int main(int argc, char** argv) {
    const uint64_t seed = argc > 1 ? strtoull(argv[1], nullptr, 0) : 0x5eed5eed2025ull;
    const uint64_t random_count = argc > 2 ? strtoull(argv[2], nullptr, 0) : 4000000ull;
    printf("numerics oracle: seed 0x%llx, %llu random floats\n", (unsigned long long)seed,
           (unsigned long long)random_count);

    // ---- bits -> float, exhaustive ----
    {
        Check c("to_float f16 (all 2^16)");
        for (uint32_t b = 0; b < 0x10000u; ++b)
            c.compare(b, bits_of(to_float(half_t{uint16_t(b)})), bits_of(nv_half_to_float(uint16_t(b))));
    }
    {
        Check c("to_float bf16 (all 2^16)");
        for (uint32_t b = 0; b < 0x10000u; ++b)
            c.compare(b, bits_of(to_float(bfloat16_t{uint16_t(b)})), bits_of(nv_bf16_to_float(uint16_t(b))));
    }
    {
        Check c("to_float fp8_e4m3 (all 2^8)");
        for (uint32_t b = 0; b < 0x100u; ++b)
            c.compare(b, bits_of(to_float(fp8_e4m3_t{uint8_t(b)})), bits_of(nv_e4m3_to_float(uint8_t(b))));
    }
    {
        Check c("to_float fp8_e5m2 (all 2^8)");
        for (uint32_t b = 0; b < 0x100u; ++b)
            c.compare(b, bits_of(to_float(fp8_e5m2_t{uint8_t(b)})), bits_of(nv_e5m2_to_float(uint8_t(b))));
    }

    // ---- float -> formats: the deterministic set ----
    std::vector<float> det;
    {
        std::vector<double> v;
        for (uint32_t b = 0; b < 0x7c00u; ++b) v.push_back(nv_half_to_float(uint16_t(b)));
        add_format(det, v, 65536.0);
        v.clear();
        for (uint32_t b = 0; b < 0x7f80u; ++b) v.push_back(nv_bf16_to_float(uint16_t(b)));
        add_format(det, v, ldexp(1.0, 128));
        v.clear();
        for (uint32_t b = 0; b < 0x7fu; ++b) v.push_back(nv_e4m3_to_float(uint8_t(b)));
        add_format(det, v, 480.0);
        v.clear();
        for (uint32_t b = 0; b < 0x7cu; ++b) v.push_back(nv_e5m2_to_float(uint8_t(b)));
        add_format(det, v, 65536.0);
        for (int e = -149; e <= 127; ++e) add_around(det, float(ldexp(1.0, e)), 2);
        // Float subnormals, the largest finite float, infinities, NaNs of both signs and payloads.
        for (uint32_t u = 1; u < 64; ++u) add_around(det, float_of(u), 0);
        add_around(det, float_of(0x007fffffu), 2);
        add_around(det, float_of(0x7f7fffffu), 2);
        for (uint32_t u : {0x7f800000u, 0x7f800001u, 0x7fc00000u, 0x7fbfffffu, 0x7fffffffu, 0x7fe00000u,
                           0x7f800100u, 0x7f801000u, 0x7f810000u})
            add_around(det, float_of(u), 0);
    }
    // ---- pseudo-random floats ----
    std::vector<float> rnd;
    {
        uint64_t s = seed;
        rnd.reserve(random_count);
        for (uint64_t i = 0; i < random_count; ++i) {
            const uint64_t r = splitmix64(s);
            uint32_t u = uint32_t(r);
            if (i & 1) {
                // A band of binary32 exponents around the formats: 2^-30 .. 2^20, random mantissa.
                const uint32_t exp = 97u + uint32_t((r >> 32) % 51u);
                u = (u & 0x807fffffu) | (exp << 23);
            }
            rnd.push_back(float_of(u));
        }
    }

    for (int pass = 0; pass < 2; ++pass) {
        const std::vector<float>& in = pass == 0 ? det : rnd;
        const char* tag = pass == 0 ? "deterministic" : "random";
        const size_t n = in.size();
        std::vector<uint16_t> f16(n), bf16(n);
        std::vector<uint8_t> e4(n), e5(n);
        nv_from_float(in.data(), n, f16.data(), bf16.data(), e4.data(), e5.data());
        char name[4][64];
        snprintf(name[0], sizeof name[0], "from_float f16 (%s)", tag);
        snprintf(name[1], sizeof name[1], "from_float bf16 (%s)", tag);
        snprintf(name[2], sizeof name[2], "from_float e4m3 (%s)", tag);
        snprintf(name[3], sizeof name[3], "from_float e5m2 (%s)", tag);
        {
            Check c(name[0]);
            for (size_t i = 0; i < n; ++i) c.compare(bits_of(in[i]), float_to_half(in[i]).bits, f16[i]);
        }
        {
            Check c(name[1]);
            for (size_t i = 0; i < n; ++i) c.compare(bits_of(in[i]), float_to_bfloat16(in[i]).bits, bf16[i]);
        }
        {
            Check c(name[2]);
            for (size_t i = 0; i < n; ++i) c.compare(bits_of(in[i]), float_to_fp8_e4m3(in[i]).bits, e4[i]);
        }
        {
            Check c(name[3]);
            for (size_t i = 0; i < n; ++i) c.compare(bits_of(in[i]), float_to_fp8_e5m2(in[i]).bits, e5[i]);
        }
    }

    printf("TOTAL checked %llu mismatches %llu\n", (unsigned long long)total_checked,
           (unsigned long long)total_mismatches);
    return total_mismatches == 0 ? 0 : 1;
}

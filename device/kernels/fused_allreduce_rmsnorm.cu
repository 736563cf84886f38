// Writing a fused kernel: all-reduce + residual add + RMSNorm, with the public device API only.
//
// In a tensor-parallel transformer layer every rank ends the attention (or MLP) block with a
// partial output: the full activation is the sum over ranks. The next steps are elementwise or
// per-row: add the residual, then RMSNorm. Done separately that is an all-reduce kernel that
// writes the sum to memory, then a norm kernel that reads it back. Fused, each CTA reads its
// token row from every rank, and the sum never leaves registers. Per token row t (H = hidden):
//
//     x            = sum over ranks r of partial_r[t]     (f32, ranks in order 0..n-1)
//     y            = x + residual[t]                      (f32)
//     residual_out = y                                    (rounded to T once: the next residual)
//     out          = y * rsqrt(mean(y^2) + eps) * gamma   (f32, rounded to T once)
//
// Kernels: `symcomm_allreduce_residual_rmsnorm_bf16` (T = bfloat16_t) and `..._f32` (T = float),
// each `(DevComm comm, AllReduceRmsNormArgs<T> args)`, arguments by value:
//
//     WindowHandleRaw partial      symmetric window with every rank's partial outputs
//     uint64_t partial_offset      element offset of token 0's row in `partial` (same on all ranks)
//     const T* residual            this rank's residual, [tokens][hidden]
//     T* residual_out              [tokens][hidden]; may be `residual` (updated in place)
//     T* out                       [tokens][hidden]; must not overlap `partial`
//     const T* gamma               [hidden], the RMSNorm weight
//     uint32_t tokens, hidden      rows and row length (elements)
//     float eps
//     uint32_t first_slot          CTA b uses barrier index first_slot + b (users' kernels: from
//                                  SYMCOMM_USER_BARRIER_FIRST, clear of the host collectives')
//
// 96 bytes, no padding (a Rust mirror: the same fields in order, pointers as u64, #[repr(C)];
// tests/emu_fused.rs has one). Preconditions, refused with Status::InvalidArgument in the rank's
// ErrorRecord (op SYMCOMM_OP_COLLECTIVE, detail RMSNORM_KIND) before any communication:
// hidden > 0 and a multiple of 16 / sizeof(T) (8 for bf16, 4 for f32); every pointer and the
// local copy of `partial` at partial_offset 16-byte aligned; partial_offset + tokens * hidden
// within the window, which holds T (element size sizeof(T) or 1, type T's or
// SYMCOMM_DTYPE_NONE); a 1-D grid and block; first_slot + gridDim.x <= SYMCOMM_USER_BARRIER_END;
// blockDim.x a multiple of 32 with hidden <= 16 * blockDim.x (each thread keeps 16 floats of its
// row in registers).
//
// Launch: block = hidden / 16 threads rounded up to a multiple of 32 at least (256 for H = 4096,
// 512 for H = 8192), up to 1024. A thread loads its packs of a row one after the other (one
// memory round trip per pack: their loads sit behind a branch on the rank count), so one 16-byte
// pack per thread (hidden / 8 threads for bf16: 1024 for H = 8192) reads a row in one round trip
// where hidden / 16 takes two, at half the CTAs resident per SM (scripts/gpu-check times both);
// grid = min(tokens, SYMCOMM_USER_BARRIER_END -
// first_slot) CTAs or fewer (CTA b handles rows b, b + grid, b + 2 * grid, ...); every rank
// launches concurrently with the same grid, tokens, hidden and eps (a different grid, token
// count or row length is a Status::Mismatch; the block size may differ). No dynamic shared
// memory. Inputs written before the launch in stream order (the GEMM that produced `partial`)
// are read; once the kernel has finished on a rank, no peer reads that rank's `partial` any
// more, so the next work in its stream may overwrite it. Back-to-back launches and CUDA-graph replay need nothing from the
// host (barrier epochs live in device memory). Failures (Timeout, Aborted, Mismatch) land in the
// ErrorRecord; the outputs of the rows not done are then undefined.
//
// How it is built (read along in the code below):
//   1. barrier(slot): every rank's partial outputs are written and visible (system-scope release
//      and acquire); the fingerprint makes ranks that launched something else fail loudly.
//   2. per row: each thread reduces its 16-byte packs of the row over all ranks with
//      reduce_pack_peers (vector loads from every peer's copy, f32 accumulators), adds the
//      residual, stores residual_out, and sums y^2; group_reduce(Cta) sums that over the CTA
//      (warp shuffles + 32 floats of shared memory; for 16-bit types the gamma loads are issued
//      before it, so that their round trip overlaps it); every thread scales its registers by
//      the same rsqrt and gamma and stores `out`.
//   3. barrier(slot) again: CTA b of every peer has read its rows of our `partial` (CTA b of
//      every rank handles the same rows, hence the same grid everywhere).
// The unfused pair, for comparison (the GPU check times one against the other) and for callers
// that already hold the sum: `symcomm_residual_rmsnorm_bf16` / `..._f32` take the same arguments
// and do step 2 on this rank's own copy of `partial` alone (x = partial[t], already summed, e.g.
// by a host all-reduce into that window): no barrier, no peer access, `first_slot` unused (the
// same preconditions otherwise). With inputs whose sums are exact in T, the all-reduce followed by
// this kernel gives the fused kernel's results bit for bit (tests/emu_fused.rs checks it).
//
// Every rank reads every rank's rows: the one-shot algorithm, for the few-token batches of
// decoding. For thousands of tokens a two-shot variant (each rank normalizes 1/n of the rows and
// writes its results into every peer's outputs, which then must be windows) reads n times less.
//
// On the emulator this same file runs on CPU threads (SYMCOMM_SHARED and shuffles are emulated;
// rsqrtf is not in the host's <math.h>, hence reciprocal_sqrt below).
#include <symcomm/symcomm.cuh>

namespace {

using namespace symcomm;

/// Arguments of the fused kernels (see the top of the file).
template <typename T>
struct AllReduceRmsNormArgs {
    WindowHandleRaw partial;
    uint64_t partial_offset;
    const T* residual;
    T* residual_out;
    T* out;
    const T* gamma;
    uint32_t tokens;
    uint32_t hidden;
    float eps;
    uint32_t first_slot;
};
static_assert(sizeof(AllReduceRmsNormArgs<float>) == 104 && alignof(AllReduceRmsNormArgs<float>) == 8,
              "AllReduceRmsNormArgs layout (mirrored in Rust)");

/// The `kind` of this kernel's fingerprint: outside the SYMCOMM_COLL_* codes, so it can never
/// match a built-in collective running on the same slots by mistake.
constexpr uint32_t RMSNORM_KIND = 0x524d534eu;  // "RMSN"

/// Floats of its row each thread keeps in registers: hidden <= FLOATS_PER_THREAD * blockDim.x.
constexpr uint32_t FLOATS_PER_THREAD = 16;

SYMCOMM_DEVICE float reciprocal_sqrt(float x) {
#if defined(SYMCOMM_EMU)
    return 1.0f / sqrtf(x);
#else
    return rsqrtf(x);  // hardware approximation, within 2 ulp
#endif
}

template <typename T>
SYMCOMM_DEVICE bool args_valid(const AllReduceRmsNormArgs<T>& a, const DevComm& comm) {
    constexpr uint32_t P = Pack16<T>::N;
    const WindowHandle<T> partial(a.partial);
    const uint64_t elems = uint64_t(a.tokens) * a.hidden;
    return a.first_slot <= SYMCOMM_USER_BARRIER_END && gridDim.x <= SYMCOMM_USER_BARRIER_END - a.first_slot &&
           a.hidden > 0 && a.hidden % P == 0 && blockDim.y == 1 && blockDim.z == 1 && gridDim.y == 1 &&
           gridDim.z == 1 && blockDim.x % 32 == 0 && a.hidden <= FLOATS_PER_THREAD * blockDim.x &&
           a.partial.nranks == comm.nranks && a.partial.rank == comm.rank && partial.holds() &&
           partial.holds_dtype(uint32_t(TypeTraits<T>::dtype)) && partial.fits(a.partial_offset, elems) &&
           pack_aligned(partial.local_ptr(a.partial_offset)) &&
           pack_aligned(a.residual) && pack_aligned(a.residual_out) && pack_aligned(a.out) && pack_aligned(a.gamma);
}

/// `Fused`: the all-reduce + residual + RMSNorm kernel; else the norm half alone on the local copy.
template <typename T, bool Fused>
SYMCOMM_DEVICE void residual_rmsnorm(const DevComm& comm, const AllReduceRmsNormArgs<T>& a) {
    constexpr uint32_t P = Pack16<T>::N;                 // elements per 16-byte pack
    constexpr uint32_t K = FLOATS_PER_THREAD / P;        // packs per thread and row
    using Traits = TypeTraits<T>;
    const Cta g;
    if (comm.abi_version != SYMCOMM_ABI_VERSION || !args_valid(a, comm)) {
        if (g.thread_rank() == 0) {
            const Status s = comm.abi_version != SYMCOMM_ABI_VERSION ? Status::AbiMismatch : Status::InvalidArgument;
            record_error(Thread{}, comm, s, comm.rank, SYMCOMM_OP_COLLECTIVE, RMSNORM_KIND);
        }
        return;
    }
    const WindowHandle<T> partial(a.partial);
    const uint32_t slot = a.first_slot + blockIdx.x;
    // Everything the ranks must agree on: shape and grid (the grid decides which CTA reads which
    // rows, and the closing barrier only covers a peer's rows if the grids match).
    const uint32_t fp = fingerprint(RMSNORM_KIND, uint32_t(Traits::dtype), uint32_t(RedOp::Sum),
                                    (uint64_t(a.tokens) << 32) | a.hidden, gridDim.x);

    // 1. Every rank's partial outputs are written (the barrier returns the same status to every
    //    thread, so the CTA leaves together).
    if (Fused && barrier(g, comm, slot, fp) != Status::Ok) return;

    const uint32_t packs = a.hidden / P;
    for (uint32_t row = blockIdx.x; row < a.tokens; row += gridDim.x) {
        const uint64_t base = uint64_t(row) * a.hidden;
        // 2. This thread's packs k * blockDim.x + threadIdx.x of the row: y in registers (the loops
        //    over k and j unroll, so y[k][j] are plain registers; zeros where the row ended).
        float y[K][P];
        float sum_sq = 0.0f;
        SYMCOMM_UNROLL
        for (uint32_t k = 0; k < K; ++k) {
            const uint32_t c = k * blockDim.x + threadIdx.x;
            SYMCOMM_UNROLL
            for (uint32_t j = 0; j < P; ++j) y[k][j] = 0.0f;
            if (c >= packs) continue;
            const uint64_t e = base + uint64_t(c) * P;
            PackAccumulator<T, RedOp::Sum> x;
            if (Fused) {
                x = reduce_pack_peers<RedOp::Sum>(partial.at(a.partial_offset + e));
            } else {
                x.first(load_pack(partial.local_ptr(a.partial_offset + e)));
            }
            const Pack16<T> res = load_pack(a.residual + e);
            Pack16<T> res_out;
            SYMCOMM_UNROLL
            for (uint32_t j = 0; j < P; ++j) {
                y[k][j] = x.a[j].acc + Traits::to_acc(res.e[j]);
                res_out.e[j] = Traits::from_acc(y[k][j]);
                sum_sq += y[k][j] * y[k][j];
            }
            // In place (residual_out == residual) is safe: this thread alone reads and writes it.
            store_pack(a.residual_out + e, res_out);
        }
        // 16-bit types: this thread's gamma packs are loaded before the CTA-wide sum of y^2, so
        // that their round trip overlaps it (f32's K = 4 packs would take 16 registers across it
        // and spill under the 64 of a 1024-thread CTA: loaded where used instead).
        constexpr bool EARLY_GAMMA = P >= 8;
        Pack16<T> gamma[K];
        SYMCOMM_UNROLL
        for (uint32_t k = 0; k < K; ++k) {
            const uint32_t c = k * blockDim.x + threadIdx.x;
            if (EARLY_GAMMA && c < packs) gamma[k] = load_pack(a.gamma + uint64_t(c) * P);
        }
        const float total = group_reduce<RedOp::Sum>(g, sum_sq);
        const float inv_rms = reciprocal_sqrt(total / float(a.hidden) + a.eps);
        SYMCOMM_UNROLL
        for (uint32_t k = 0; k < K; ++k) {
            const uint32_t c = k * blockDim.x + threadIdx.x;
            if (c >= packs) continue;
            const Pack16<T> gm = EARLY_GAMMA ? gamma[k] : load_pack(a.gamma + uint64_t(c) * P);
            Pack16<T> o;
            SYMCOMM_UNROLL
            for (uint32_t j = 0; j < P; ++j) o.e[j] = Traits::from_acc(y[k][j] * inv_rms * Traits::to_acc(gm.e[j]));
            store_pack(a.out + base + uint64_t(c) * P, o);
        }
    }

    // 3. CTA b of every peer has read its rows of our `partial`: once every CTA of this launch is
    //    past this barrier, the next work in our stream may overwrite `partial`.
    if (Fused) (void)barrier(g, comm, slot, fp);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(1024)
    symcomm_allreduce_residual_rmsnorm_bf16(DevComm comm, AllReduceRmsNormArgs<bfloat16_t> args) {
    residual_rmsnorm<bfloat16_t, true>(comm, args);
}
SYMCOMM_EMU_KERNEL(symcomm_allreduce_residual_rmsnorm_bf16)

extern "C" __global__ void __launch_bounds__(1024)
    symcomm_allreduce_residual_rmsnorm_f32(DevComm comm, AllReduceRmsNormArgs<float> args) {
    residual_rmsnorm<float, true>(comm, args);
}
SYMCOMM_EMU_KERNEL(symcomm_allreduce_residual_rmsnorm_f32)

extern "C" __global__ void __launch_bounds__(1024)
    symcomm_residual_rmsnorm_bf16(DevComm comm, AllReduceRmsNormArgs<bfloat16_t> args) {
    residual_rmsnorm<bfloat16_t, false>(comm, args);
}
SYMCOMM_EMU_KERNEL(symcomm_residual_rmsnorm_bf16)

extern "C" __global__ void __launch_bounds__(1024)
    symcomm_residual_rmsnorm_f32(DevComm comm, AllReduceRmsNormArgs<float> args) {
    residual_rmsnorm<float, false>(comm, args);
}
SYMCOMM_EMU_KERNEL(symcomm_residual_rmsnorm_f32)

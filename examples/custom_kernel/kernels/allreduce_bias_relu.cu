// A user-written fused kernel: the epilogue of a row-parallel linear layer in tensor parallelism.
//
// Every rank holds a partial product `partial` [rows][cols] (f32) in a symmetric window; the
// layer's output is the sum over ranks, plus a bias, through ReLU:
//
//     out[i][j] = max(0, sum over ranks r of partial_r[i][j] + bias[j])
//
// Unfused that is an all-reduce kernel writing the sum to memory and an elementwise kernel
// reading it back. Here each CTA reads its rows from every rank's copy through peer pointers and
// the sum stays in registers. Written with the public device API only:
//
//   1. barrier(Cta, comm, slot, fingerprint): every rank's partials are written and visible; a
//      rank that launched something else (another shape) gets Status::Mismatch, not garbage.
//   2. per element: sum the peers' values in rank order (the same bits on every rank), add the
//      bias, clamp, store into this rank's `out` copy.
//   3. barrier again on the same slot: no peer still reads this rank's `partial` once the kernel
//      has returned here, so the next GEMM may overwrite it. Epochs only grow (device memory), so
//      back-to-back launches and CUDA-graph replay need nothing from the host.
//
// Launch: 1-D grid of at most SYMCOMM_USER_BARRIER_END - first_slot CTAs (CTA b handles rows b,
// b + grid, ...; CTA b uses barrier index first_slot + b), any 1-D block; every rank launches
// with the same grid, rows, cols and first_slot. A user kernel takes its barrier indices from
// [SYMCOMM_USER_BARRIER_FIRST, SYMCOMM_USER_BARRIER_END), which the host's collectives never
// use, so it may run concurrently with them. A failed wait (Timeout, Aborted, Mismatch) is
// recorded in the rank's ErrorRecord (Communicator::check_error) and the CTA returns.
#include <symcomm/symcomm.cuh>

using namespace symcomm;

namespace {

/// The fingerprint of this kernel's barriers: its own kind code (above the built-in ones), the
/// dtype and the shape, so that mismatched launches across ranks are detected.
SYMCOMM_DEVICE uint32_t epilogue_fingerprint(uint32_t rows, uint32_t cols) {
    return fingerprint(0x100u, SYMCOMM_DTYPE_F32, SYMCOMM_REDOP_SUM, (uint64_t(rows) << 32) | cols, 0);
}

}  // namespace

extern "C" __global__ void allreduce_bias_relu(DevComm comm, WindowHandleRaw partial_raw, WindowHandleRaw bias_raw,
                                               WindowHandleRaw out_raw, uint32_t rows, uint32_t cols,
                                               uint32_t first_slot) {
    const WindowHandle<float> partial(partial_raw);
    const WindowHandle<float> bias(bias_raw);
    const WindowHandle<float> out(out_raw);
    const uint32_t slot = first_slot + blockIdx.x;
    const uint32_t fp = epilogue_fingerprint(rows, cols);

    if (barrier(Cta{}, comm, slot, fp) != Status::Ok) return;
    for (uint32_t row = blockIdx.x; row < rows; row += gridDim.x) {
        for (uint32_t col = threadIdx.x; col < cols; col += blockDim.x) {
            const uint64_t i = uint64_t(row) * cols + col;
            float sum = 0.0f;
            for (uint32_t peer = 0; peer < comm.nranks; ++peer) sum += *partial.peer_ptr(peer, i);
            const float y = sum + *bias.local_ptr(col);
            *out.local_ptr(i) = y > 0.0f ? y : 0.0f;
        }
    }
    barrier(Cta{}, comm, slot, fp);
}
SYMCOMM_EMU_KERNEL(allreduce_bias_relu)

// Inline definitions of <symcomm/group.cuh> (included at its end).
#pragma once

namespace symcomm {

SYMCOMM_DEVICE uint32_t linear_thread_index() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

SYMCOMM_DEVICE uint32_t Thread::thread_rank() const { return 0; }
SYMCOMM_DEVICE uint32_t Thread::size() const { return 1; }
SYMCOMM_DEVICE void Thread::sync() const {}
SYMCOMM_DEVICE bool Thread::any(bool pred) const { return pred; }

SYMCOMM_DEVICE uint32_t Warp::thread_rank() const { return linear_thread_index() % 32u; }
SYMCOMM_DEVICE uint32_t Warp::size() const { return 32; }
SYMCOMM_DEVICE void Warp::sync() const { __syncwarp(); }
SYMCOMM_DEVICE bool Warp::any(bool pred) const { return __any_sync(0xffffffffu, pred) != 0; }

SYMCOMM_DEVICE uint32_t Cta::thread_rank() const { return linear_thread_index(); }
SYMCOMM_DEVICE uint32_t Cta::size() const { return blockDim.x * blockDim.y * blockDim.z; }
SYMCOMM_DEVICE void Cta::sync() const { __syncthreads(); }
SYMCOMM_DEVICE bool Cta::any(bool pred) const { return __syncthreads_or(pred) != 0; }

}  // namespace symcomm

// symcomm device library: cooperating groups, the first argument of every primitive.
//
// A group names which threads call a primitive together. Every thread of the group must make the
// same call with the same arguments (a collective call of the group); the primitive's contract
// says which threads do the work and what holds on return. Groups:
//
//   Thread   one thread acting alone                       sync(): nothing
//   Warp     the 32 threads of a full warp                  sync(): __syncwarp()
//   Cta      every thread of the thread block (CTA)         sync(): __syncthreads()
//
// `any(pred)` synchronizes the group like `sync()` and returns whether `pred` held on any thread.
//
// The size of a Cta is blockDim.x * blockDim.y * blockDim.z; thread_rank() is the linear thread
// index. A Warp must be complete (blockDim a multiple of 32 along the linear index).
#pragma once

#include <symcomm/config.cuh>

namespace symcomm {

/// Linear index of the calling thread in its CTA.
SYMCOMM_DEVICE uint32_t linear_thread_index();

/// One thread acting alone.
struct Thread {
    SYMCOMM_DEVICE uint32_t thread_rank() const;
    SYMCOMM_DEVICE uint32_t size() const;
    SYMCOMM_DEVICE void sync() const;
    SYMCOMM_DEVICE bool any(bool pred) const;
};

/// The 32 threads of the calling warp.
struct Warp {
    SYMCOMM_DEVICE uint32_t thread_rank() const;
    SYMCOMM_DEVICE uint32_t size() const;
    SYMCOMM_DEVICE void sync() const;
    SYMCOMM_DEVICE bool any(bool pred) const;
};

/// Every thread of the calling CTA (thread block).
struct Cta {
    SYMCOMM_DEVICE uint32_t thread_rank() const;
    SYMCOMM_DEVICE uint32_t size() const;
    SYMCOMM_DEVICE void sync() const;
    SYMCOMM_DEVICE bool any(bool pred) const;
};

}  // namespace symcomm

#include <symcomm/impl/group.cuh>

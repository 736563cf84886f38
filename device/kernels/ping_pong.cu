// Token ring between the ranks of a communicator — the first built-in kernel, and the smoke test
// of the ordering primitives on both paths (nvcc fatbin / NVRTC, and the CPU emulator).
//
// Launch: one CTA per rank, any block size; all ranks launch with the same `rounds` and `words`,
// concurrently (ranks as streams on one GPU, as GPUs, or as emulator threads).
//
// Round k: rank 0 writes `words` words `value(k, i)` into rank 1's inbox (its window copy) and
// signals it; rank j > 0 waits for the signal from rank j-1, checks that its inbox holds
// `value(k, i) + j - 1`, writes `value(k, i) + j` into rank j+1's inbox (rank 0's after the last
// rank) and signals. Rank 0 checks `value(k, i) + nranks - 1`. With two ranks it is a ping-pong.
//
// Each CTA's threads write the data, `__syncthreads()` orders those writes before thread 0's
// release signal; the receiver's thread 0 acquires and `__syncthreads()` hands that on to its CTA.
//
// Epochs: signal values only grow. Signal word WORD_DATA of rank j counts tokens received from
// the previous rank over every launch; each rank keeps its own completed-round count in its
// private word WORD_ROUNDS (the one it reserves for itself; both are users' signal words), so
// back-to-back launches continue where the last one ended without host help.
//
// Result (`result`, 3 words in device memory, zeroed by the host before the launch): [0] Status,
// [1] words that did not match (#wrong), [2] rounds completed in this launch.
#include <symcomm/symcomm.cuh>

namespace {

constexpr uint32_t WORD_DATA = 0;
constexpr uint32_t WORD_ROUNDS = 1;

SYMCOMM_DEVICE uint32_t ring_value(uint64_t round, uint32_t i) {
    return uint32_t(round * 1000003u) ^ (i * 2654435761u);
}

}  // namespace

extern "C" __global__ void symcomm_ping_pong(DevComm comm, WindowHandleRaw win, uint32_t rounds, uint32_t words,
                                             uint32_t* result) {
    using namespace symcomm;
    const uint32_t rank = comm.rank;
    const uint32_t n = comm.nranks;
    const uint32_t next = (rank + 1) % n;
    const uint32_t prev = (rank + n - 1) % n;
    uint32_t* inbox = static_cast<uint32_t*>(peer_ptr(win, rank, 0));
    uint32_t* outbox = static_cast<uint32_t*>(peer_ptr(win, next, 0));
    uint64_t* rounds_word = detail::signal_word(comm, rank, rank, WORD_ROUNDS);

    // Every thread reads the base epoch before thread 0 may advance it below (the __syncthreads at
    // the end of round 0 separates this read from that write).
    const uint64_t base = ld_relaxed<Scope::Sys>(rounds_word);
    uint32_t wrong = 0;
    Status status = Status::Ok;
    if (comm.abi_version != SYMCOMM_ABI_VERSION) {
        status = Status::AbiMismatch;
        rounds = 0;
    }
    // Shared across the CTA through the emulator-safe route: a status word in the result buffer.
    volatile uint32_t* cta_status = &result[0];

    uint32_t done = 0;
    for (uint32_t k = 0; k < rounds; ++k) {
        const uint64_t epoch = base + k + 1;
        if (rank != 0) {
            if (threadIdx.x == 0) {
                status = signal_wait_until(Thread{}, comm, prev, WORD_DATA, epoch);
                *cta_status = uint32_t(status);
            }
            __syncthreads();
            if (*cta_status != SYMCOMM_STATUS_OK) break;
            for (uint32_t i = threadIdx.x; i < words; i += blockDim.x) {
                wrong += inbox[i] != ring_value(epoch, i) + rank - 1;
            }
        }
        for (uint32_t i = threadIdx.x; i < words; i += blockDim.x) {
            outbox[i] = ring_value(epoch, i) + rank;
        }
        __syncthreads();
        if (threadIdx.x == 0) signal_set(Thread{}, comm, next, WORD_DATA, epoch);
        if (rank == 0) {
            if (threadIdx.x == 0) {
                status = signal_wait_until(Thread{}, comm, prev, WORD_DATA, epoch);
                *cta_status = uint32_t(status);
            }
            __syncthreads();
            if (*cta_status != SYMCOMM_STATUS_OK) break;
            for (uint32_t i = threadIdx.x; i < words; i += blockDim.x) {
                wrong += inbox[i] != ring_value(epoch, i) + n - 1;
            }
        }
        ++done;
        __syncthreads();
    }
    // Sum the per-thread mismatch counts.
    atomicAdd(&result[1], wrong);
    __syncthreads();
    if (threadIdx.x == 0) {
        st_relaxed<Scope::Sys>(rounds_word, base + done);
        result[0] = uint32_t(status);
        result[2] = done;
    }
}
SYMCOMM_EMU_KERNEL(symcomm_ping_pong)

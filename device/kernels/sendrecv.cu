// Point-to-point: the built-in kernel behind the host's `send`, `recv` and send/recv groups.
//
// `symcomm_sendrecv(DevComm comm, P2pArgs args)`: CTA i runs args.ops[i], a send of `bytes` bytes
// from device memory `addr` to rank `peer`, or a receive of `bytes` bytes from `peer` into
// `addr`. All operations of one launch run concurrently, so a rank can post sends and receives
// in any order without deadlock (pipeline parallelism). Every launch needs a matching launch on
// each peer involved (the same byte counts, at most one send and one receive per peer).
//
// Data moves in chunks through the staging window `args.stage` (region per peer: rank s's copy
// at offset d * region holds what s sends to d): per chunk k the sender copies the chunk from its
// buffer into its region for d, then signals READY = base + k + 1 to d; the receiver waits for
// READY, copies the chunk from the sender's region (peer loads) into its buffer, and signals
// DONE = base + k + 1 back; the sender waits for DONE before reusing the region (and before
// finishing, so a later launch finds the region free). `base` is the count of chunks moved
// between the pair so far, kept by each side in its own signal array (slots only it writes), so
// back-to-back launches and graph replay continue without host help. The sender also stores the
// message length next to READY; a receiver expecting another length records Mismatch.
//
// Failures (Timeout, Aborted, Mismatch) land in the rank's ErrorRecord; the pair's counters are
// then out of step and the communicator must be treated as broken.
#include <symcomm/symcomm.cuh>

namespace {

using namespace symcomm;

// Signal slots of each (owner, peer) pair, from SYMCOMM_P2P_FIRST_SLOT.
constexpr uint32_t SLOT_LEN = SYMCOMM_P2P_FIRST_SLOT + 0;    // written by the peer: message length
constexpr uint32_t SLOT_READY = SYMCOMM_P2P_FIRST_SLOT + 1;  // written by the peer (sender)
constexpr uint32_t SLOT_DONE = SYMCOMM_P2P_FIRST_SLOT + 2;   // written by the peer (receiver)
constexpr uint32_t SLOT_SENT = SYMCOMM_P2P_FIRST_SLOT + 3;   // own: chunks sent to the peer
constexpr uint32_t SLOT_RECVD = SYMCOMM_P2P_FIRST_SLOT + 4;  // own: chunks received from it

}  // namespace

extern "C" __global__ void symcomm_sendrecv(DevComm comm, P2pArgs args) {
    const Cta g;
    if (blockIdx.x >= args.nops || blockIdx.x >= SYMCOMM_P2P_MAX_OPS) return;
    const P2pOp op = args.ops[blockIdx.x];
    SYMCOMM_SHARED(uint32_t, p2p_status, 1);
    if (comm.abi_version != SYMCOMM_ABI_VERSION || op.peer >= comm.nranks) {
        if (g.thread_rank() == 0) {
            const Status s = comm.abi_version != SYMCOMM_ABI_VERSION ? Status::AbiMismatch : Status::InvalidArgument;
            record_error(Thread{}, comm, s, comm.rank, SYMCOMM_OP_SIGNAL_WAIT, op.peer);
        }
        return;
    }
    const uint64_t region = (args.stage.bytes / comm.nranks) & ~uint64_t(15);
    const uint64_t rounds = region == 0 ? 0 : (op.bytes + region - 1) / region;
    uint64_t* own = signal_slot(comm, comm.rank, op.peer, op.is_send ? SLOT_SENT : SLOT_RECVD);
    // Every thread reads the pair's count before thread 0 advances it at the end (the
    // __syncthreads of the rounds, or the one below, separates the two).
    const uint64_t base = ld_relaxed<Scope::Sys>(own);
    __syncthreads();
    if (region == 0 && op.bytes > 0) {
        if (g.thread_rank() == 0) record_error(Thread{}, comm, Status::InvalidArgument, comm.rank, SYMCOMM_OP_SIGNAL_WAIT, 0);
        return;
    }
    uint64_t done = 0;
    for (uint64_t k = 0; k < rounds; ++k) {
        const uint64_t off = k * region;
        const uint64_t n = op.bytes - off < region ? op.bytes - off : region;
        const uint64_t epoch = base + k + 1;
        if (op.is_send) {
            unsigned char* mine = static_cast<unsigned char*>(peer_ptr(args.stage, comm.rank, uint64_t(op.peer) * region));
            detail::group_copy(g, reinterpret_cast<const unsigned char*>(op.addr) + off, mine, n);
#if SYMCOMM_PLANTED_BUG != 9  // planted bug 9: READY released before the CTA's copies are ordered
            __syncthreads();
#endif
            if (g.thread_rank() == 0) {
                if (k == 0) st_relaxed<Scope::Sys>(signal_slot(comm, op.peer, comm.rank, SLOT_LEN), op.bytes);
                signal_set(Thread{}, comm, op.peer, SLOT_READY, epoch);
                p2p_status[0] = uint32_t(signal_wait_until(Thread{}, comm, op.peer, SLOT_DONE, epoch));
            }
            __syncthreads();
            // Read after the barrier above; thread 0 writes it again only after the next
            // round's copy and barrier.
            if (p2p_status[0] != SYMCOMM_STATUS_OK) break;
        } else {
            if (g.thread_rank() == 0) {
                Status s = signal_wait_until(Thread{}, comm, op.peer, SLOT_READY, epoch);
                if (s == Status::Ok && k == 0 &&
                    ld_relaxed<Scope::Sys>(signal_slot(comm, comm.rank, op.peer, SLOT_LEN)) != op.bytes) {
                    s = Status::Mismatch;
                    record_error(Thread{}, comm, s, op.peer, SYMCOMM_OP_SIGNAL_WAIT, op.bytes);
                }
                p2p_status[0] = uint32_t(s);
            }
            __syncthreads();
            if (p2p_status[0] != SYMCOMM_STATUS_OK) break;
            const unsigned char* theirs =
                static_cast<const unsigned char*>(peer_ptr(args.stage, op.peer, uint64_t(comm.rank) * region));
            detail::group_copy(g, theirs, reinterpret_cast<unsigned char*>(op.addr) + off, n);
            __syncthreads();
            if (g.thread_rank() == 0) signal_set(Thread{}, comm, op.peer, SLOT_DONE, epoch);
            // (No read of p2p_status here: thread 0 rewrites it at the top of the next round
            // with no barrier in between.)
        }
        ++done;
    }
    __syncthreads();
    if (g.thread_rank() == 0) st_relaxed<Scope::Sys>(own, base + done);
}
SYMCOMM_EMU_KERNEL(symcomm_sendrecv)

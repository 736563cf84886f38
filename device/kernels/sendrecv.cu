// Point-to-point: the built-in kernel behind the host's `send`, `recv` and send/recv groups.
//
// `symcomm_sendrecv(DevComm comm, P2pArgs args)`: CTA i runs args.ops[i], a send of `bytes` bytes
// from device memory `addr` to rank `peer`, a receive of `bytes` bytes from `peer` into `addr`,
// or an exchange (in place: send `addr` to `peer` and receive from `recv_peer` into the same
// bytes, one chunk after the other, so every chunk leaves before its replacement arrives). All
// operations of one launch run concurrently, so a rank can post sends and receives in any order
// without deadlock (pipeline parallelism). Every launch needs a matching launch on each peer
// involved (the same byte counts, at most one send and one receive per peer).
//
// Data moves in chunks through the staging window `args.stage` (region per peer: rank s's copy
// at offset d * region holds what s sends to d): per chunk k the sender copies the chunk from its
// buffer into its region for d, then signals READY = base + k + 1 to d; the receiver waits for
// READY, copies the chunk from the sender's region (peer loads) into its buffer, and signals
// DONE = base + k + 1 back; the sender waits for DONE before reusing the region (and before
// finishing, so a later launch finds the region free). `base` is the count of chunks moved
// between the pair so far, kept by each side in its own signal array (words only it writes), so
// back-to-back launches and graph replay continue without host help. The sender also stores the
// message length next to READY; a receiver expecting another length records Mismatch.
//
// Failures (Timeout, Aborted, Mismatch) land in the rank's ErrorRecord; the pair's counters are
// then out of step and the communicator must be treated as broken.
#include <symcomm/symcomm.cuh>

namespace {

using namespace symcomm;

// Signal words of each (owner, peer) pair, SYMCOMM_P2P_WORDS of them from SYMCOMM_P2P_FIRST_WORD
// (reached through the unchecked detail:: functions: they are above the users' words).
constexpr uint32_t WORD_LEN = SYMCOMM_P2P_FIRST_WORD + 0;    // written by the peer: message length
constexpr uint32_t WORD_READY = SYMCOMM_P2P_FIRST_WORD + 1;  // written by the peer (sender)
constexpr uint32_t WORD_DONE = SYMCOMM_P2P_FIRST_WORD + 2;   // written by the peer (receiver)
constexpr uint32_t WORD_SENT = SYMCOMM_P2P_FIRST_WORD + 3;   // own: chunks sent to the peer
constexpr uint32_t WORD_RECVD = SYMCOMM_P2P_FIRST_WORD + 4;  // own: chunks received from it
static_assert(WORD_RECVD + 1 == SYMCOMM_P2P_FIRST_WORD + SYMCOMM_P2P_WORDS, "send/recv uses exactly its words");

}  // namespace

namespace {

/// Sends chunk k (bytes [off, off + n) of `op.addr`) to `to`: copy into this rank's region for
/// `to`, then READY = epoch (and the message length with the first chunk).
SYMCOMM_DEVICE void send_chunk(Cta g, const DevComm& comm, const P2pArgs& args, const P2pOp& op, uint32_t to,
                               uint64_t region, uint64_t off, uint64_t n, uint64_t epoch, bool first) {
    unsigned char* mine = static_cast<unsigned char*>(peer_ptr(args.stage, comm.rank, uint64_t(to) * region));
    detail::group_copy(g, reinterpret_cast<const unsigned char*>(op.addr) + off, mine, n);
    __syncthreads();
    if (g.thread_rank() == 0) {
        if (first) st_relaxed<Scope::Sys>(detail::signal_word(comm, to, comm.rank, WORD_LEN), op.bytes);
        detail::signal_store<Scope::Sys>(comm, to, WORD_READY, epoch);
    }
}

/// Thread 0: waits for READY = epoch from `from` and, with the first chunk, checks the length.
SYMCOMM_DEVICE Status await_chunk(const DevComm& comm, const P2pOp& op, uint32_t from, uint64_t epoch, bool first) {
    Status s = detail::signal_wait_word<Scope::Sys>(Thread{}, comm, from, WORD_READY, epoch);
    if (s == Status::Ok && first && ld_relaxed<Scope::Sys>(detail::signal_word(comm, comm.rank, from, WORD_LEN)) != op.bytes) {
        s = Status::Mismatch;
        record_error(Thread{}, comm, s, from, SYMCOMM_OP_SIGNAL_WAIT, op.bytes);
    }
    return s;
}

/// Copies chunk [off, off + n) from `from`'s region for this rank into `op.addr`, then DONE.
SYMCOMM_DEVICE void take_chunk(Cta g, const DevComm& comm, const P2pArgs& args, const P2pOp& op, uint32_t from,
                               uint64_t region, uint64_t off, uint64_t n, uint64_t epoch) {
    const unsigned char* theirs =
        static_cast<const unsigned char*>(peer_ptr(args.stage, from, uint64_t(comm.rank) * region));
    detail::group_copy(g, theirs, reinterpret_cast<unsigned char*>(op.addr) + off, n);
    __syncthreads();
    if (g.thread_rank() == 0) detail::signal_store<Scope::Sys>(comm, from, WORD_DONE, epoch);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(SYMCOMM_BUILTIN_THREADS) symcomm_sendrecv(DevComm comm, P2pArgs args) {
    const Cta g;
    if (blockIdx.x >= args.nops || blockIdx.x >= SYMCOMM_P2P_MAX_OPS) return;
    const P2pOp op = args.ops[blockIdx.x];
    SYMCOMM_SHARED(uint32_t, p2p_status, 1);
    const bool sends = op.kind == SYMCOMM_P2P_SEND || op.kind == SYMCOMM_P2P_EXCHANGE;
    const bool receives = op.kind == SYMCOMM_P2P_RECV || op.kind == SYMCOMM_P2P_EXCHANGE;
    const uint32_t to = op.peer;
    const uint32_t from = op.kind == SYMCOMM_P2P_EXCHANGE ? op.recv_peer : op.peer;
    if (comm.abi_version != SYMCOMM_ABI_VERSION || op.kind > SYMCOMM_P2P_EXCHANGE || to >= comm.nranks ||
        from >= comm.nranks) {
        if (g.thread_rank() == 0) {
            const Status s = comm.abi_version != SYMCOMM_ABI_VERSION ? Status::AbiMismatch : Status::InvalidArgument;
            record_error(Thread{}, comm, s, comm.rank, SYMCOMM_OP_SIGNAL_WAIT, op.peer);
        }
        return;
    }
    const uint64_t region = (args.stage.bytes / comm.nranks) & ~uint64_t(15);
    if (region == 0) {
        if (g.thread_rank() == 0 && op.bytes > 0) {
            record_error(Thread{}, comm, Status::InvalidArgument, comm.rank, SYMCOMM_OP_SIGNAL_WAIT, 0);
        }
        return;
    }
    const uint64_t rounds = (op.bytes + region - 1) / region;
    uint64_t* sent = detail::signal_word(comm, comm.rank, to, WORD_SENT);
    uint64_t* recvd = detail::signal_word(comm, comm.rank, from, WORD_RECVD);
    // Every thread reads the pair counters before thread 0 advances them at the end (the
    // __syncthreads of the rounds, or the one below, separates the two).
    const uint64_t send_base = sends ? ld_relaxed<Scope::Sys>(sent) : 0;
    const uint64_t recv_base = receives ? ld_relaxed<Scope::Sys>(recvd) : 0;
    __syncthreads();
    uint64_t done = 0;
    for (uint64_t k = 0; k < rounds; ++k) {
        const uint64_t off = k * region;
        const uint64_t n = op.bytes - off < region ? op.bytes - off : region;
        if (sends) send_chunk(g, comm, args, op, to, region, off, n, send_base + k + 1, k == 0);
        if (receives) {
            if (g.thread_rank() == 0) p2p_status[0] = uint32_t(await_chunk(comm, op, from, recv_base + k + 1, k == 0));
            __syncthreads();
            if (p2p_status[0] != SYMCOMM_STATUS_OK) break;
            take_chunk(g, comm, args, op, from, region, off, n, recv_base + k + 1);
        }
        if (sends) {
            // The peer has read the chunk: the region may take the next one.
            if (g.thread_rank() == 0) {
                p2p_status[0] =
                    uint32_t(detail::signal_wait_word<Scope::Sys>(Thread{}, comm, to, WORD_DONE, send_base + k + 1));
            }
            __syncthreads();
            // Read after the barrier above; thread 0 writes it again only after the next
            // round's copy and barrier.
            if (p2p_status[0] != SYMCOMM_STATUS_OK) break;
        }
        ++done;
    }
    __syncthreads();
    if (g.thread_rank() == 0) {
        if (sends) st_relaxed<Scope::Sys>(sent, send_base + done);
        if (receives) st_relaxed<Scope::Sys>(recvd, recv_base + done);
    }
}
SYMCOMM_EMU_KERNEL(symcomm_sendrecv)

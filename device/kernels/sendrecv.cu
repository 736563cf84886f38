// Point-to-point: the built-in kernel behind the host's `send`, `recv` and send/recv groups.
//
// `symcomm_sendrecv(DevComm comm, P2pArgs args)`: each operation (args.ops[k], run by
// max(ops[k].ctas, 1) consecutive CTAs) is a send of `bytes` bytes from device memory `addr` to
// rank `peer`, a receive of `bytes` bytes from `peer` into `addr`, or an exchange (in place: send
// `addr` to `peer` and receive from `recv_peer` into the same bytes, one piece after the other, so
// every piece leaves before its replacement arrives). All operations of one launch run
// concurrently, so a rank can post sends and receives in any order without deadlock (pipeline
// parallelism). Every launch needs a matching launch on each peer involved (the same byte counts,
// at most one send and one receive per peer).
//
// Data moves through the staging window `args.stage`: rank s's copy at offset d * region holds
// what s sends to d, cut into `channels` channels of two slots of `piece` bytes (layout_of, from
// the window's size, the rank count and args.channels, which the host sets alike on every rank). A
// message is cut into pieces of one slot; piece j travels through channel c = j % C (C: the
// message's channels, min(channels, pieces)) as that channel's i-th piece (i = j / C), in slot
// i % 2. Per piece the sender waits until the receiver consumed the piece that used the slot two
// pieces earlier, copies the piece into the slot and signals READY_c = base + i + 1; the receiver
// waits for READY_c, copies the piece out of the sender's slot (peer loads) and signals DONE_c =
// base + i + 1 back. So every channel has two pieces in flight (one being written while the other
// is read), and the channels move at once, one or several per CTA. READY_c and DONE_c count the
// channel's pieces since the communicator began (they only grow); each side reads its base from
// the word it writes (only it writes that word), so back-to-back launches and graph replay
// continue without host help. The sender finishes only when the receiver consumed every piece
// (so a later launch, or a staged collective on the same lane, finds the region free), and
// stores the message length (and its layout's channel count) next to the channels with its first
// piece: a receiver expecting another length, or cutting the region otherwise, records Mismatch
// before it reads any byte.
//
// Channels pair up, not CTAs: the peer may run an operation with another CTA count, and a CTA
// that runs several channels takes their pieces in increasing j (which keeps every wait's
// dependency on a smaller piece: no deadlock while all CTAs are resident).
//
// Scope: .gpu when every rank runs on this GPU in this process (SYMCOMM_COMM_SAME_GPU), .sys
// otherwise.
// Failures (Timeout, Aborted, Mismatch) land in the rank's ErrorRecord; the pair's counters are
// then out of step and the communicator must be treated as broken.
#include <symcomm/symcomm.cuh>

namespace {

using namespace symcomm;

constexpr uint32_t kChannels = SYMCOMM_P2P_CHANNELS;

// Signal words of each (owner, peer) pair, SYMCOMM_P2P_WORDS of them from SYMCOMM_P2P_FIRST_WORD
// (reached through the unchecked detail:: functions: they are above the users' words).
constexpr uint32_t WORD_LEN = SYMCOMM_P2P_FIRST_WORD;  // written by the sender: message_word
/// Channel c's pieces ready: written by the sender, in the receiver's array.
SYMCOMM_DEVICE constexpr uint32_t word_ready(uint32_t c) { return SYMCOMM_P2P_FIRST_WORD + 1 + 2 * c; }
/// Channel c's pieces consumed: written by the receiver, in the sender's array.
SYMCOMM_DEVICE constexpr uint32_t word_done(uint32_t c) { return SYMCOMM_P2P_FIRST_WORD + 2 + 2 * c; }
static_assert(word_done(kChannels - 1) + 1 == SYMCOMM_P2P_FIRST_WORD + SYMCOMM_P2P_WORDS,
              "send/recv uses exactly its words");

/// How a pair's region of the staging window is cut (the same on every rank: it depends only on
/// the window's size and the rank count).
struct Layout {
    uint64_t region;    // bytes per (sender, receiver) pair, a multiple of 16
    uint32_t channels;  // 1..kChannels
    uint64_t piece;     // bytes of one slot, a multiple of 16; 0: the region is too small (< 32)
};

SYMCOMM_DEVICE Layout layout_of(uint64_t stage_bytes, uint32_t nranks, uint32_t channels) {
    Layout l;
    l.region = (stage_bytes / nranks) & ~uint64_t(15);
    const uint64_t want = channels == 0 ? 1 : (channels > kChannels ? kChannels : channels);
    const uint64_t fit = l.region / 32;
    l.channels = fit >= want ? uint32_t(want) : (fit == 0 ? 1 : uint32_t(fit));
    l.piece = (l.region / (2 * l.channels)) & ~uint64_t(15);
    return l;
}

/// What the sender stores in WORD_LEN: the message's bytes with the layout's channel count in
/// the top byte (equal on both sides exactly when the lengths and layouts are, for messages
/// under 2^56 bytes).
SYMCOMM_DEVICE uint64_t message_word(uint64_t bytes, const Layout& l) { return bytes ^ (uint64_t(l.channels) << 56); }

/// Thread 0 runs `wait` (returning a Status); every thread of the CTA gets its result. Pre: a
/// __syncthreads separates two calls (every thread read the previous result before thread 0
/// writes the next).
template <typename Wait>
SYMCOMM_DEVICE Status cta_wait(Cta g, uint32_t* shared_status, Wait wait) {
    if (g.thread_rank() == 0) shared_status[0] = uint32_t(wait());
    __syncthreads();
    return Status(shared_status[0]);
}

/// One operation on CTA `cta` of the `ctas` that run it.
template <Scope S>
SYMCOMM_DEVICE void run_op(Cta g, const DevComm& comm, const P2pArgs& args, const P2pOp& op, uint32_t cta,
                           uint32_t ctas, uint32_t* shared_status, uint64_t* bases) {
    const bool sends = op.kind == SYMCOMM_P2P_SEND || op.kind == SYMCOMM_P2P_EXCHANGE;
    const bool receives = op.kind == SYMCOMM_P2P_RECV || op.kind == SYMCOMM_P2P_EXCHANGE;
    const uint32_t to = op.peer;
    const uint32_t from = op.kind == SYMCOMM_P2P_EXCHANGE ? op.recv_peer : op.peer;
    const Layout l = layout_of(args.stage.bytes, comm.nranks, args.channels);
    if (l.piece == 0) {
        if (g.thread_rank() == 0 && cta == 0 && op.bytes > 0) {
            record_error(Thread{}, comm, Status::InvalidArgument, comm.rank, SYMCOMM_OP_SIGNAL_WAIT, 0);
        }
        return;
    }
    const uint64_t pieces = (op.bytes + l.piece - 1) / l.piece;
    const uint32_t nch = pieces < l.channels ? uint32_t(pieces) : l.channels;
    if (cta >= nch) return;  // more CTAs than the message has channels (or nothing to move)
    // Every thread reads the bases before thread 0 advances the words (the barrier below).
    uint64_t* send_base = bases;
    uint64_t* recv_base = bases + kChannels;
    if (g.thread_rank() < nch) {
        const uint32_t c = g.thread_rank();
        send_base[c] = sends ? ld_relaxed<S>(detail::signal_word(comm, to, comm.rank, word_ready(c))) : 0;
        recv_base[c] = receives ? ld_relaxed<S>(detail::signal_word(comm, from, comm.rank, word_done(c))) : 0;
    }
    __syncthreads();
    unsigned char* const data = reinterpret_cast<unsigned char*>(op.addr);
    unsigned char* const mine = static_cast<unsigned char*>(peer_ptr(args.stage, comm.rank, uint64_t(to) * l.region));
    const unsigned char* const theirs =
        static_cast<const unsigned char*>(peer_ptr(args.stage, from, uint64_t(comm.rank) * l.region));
    Status s = Status::Ok;
    for (uint64_t i = 0; s == Status::Ok; ++i) {
        bool any = false;
        for (uint32_t c = cta; c < nch && s == Status::Ok; c += ctas) {
            const uint64_t j = i * nch + c;
            if (j >= pieces) break;  // and every later channel of this round
            any = true;
            const uint64_t off = j * l.piece;
            const uint64_t n = op.bytes - off < l.piece ? op.bytes - off : l.piece;
            const uint64_t slot = (uint64_t(c) * 2 + i % 2) * l.piece;
            if (sends) {
                // The slot's previous piece (two pieces back on this channel) was consumed.
                if (i >= 2) {
                    s = cta_wait(g, shared_status, [&] {
                        return detail::signal_wait_word<S>(Thread{}, comm, to, word_done(c), send_base[c] + i - 1);
                    });
                    if (s != Status::Ok) break;
                }
                detail::group_copy(g, data + off, mine + slot, n);
                __syncthreads();
                if (g.thread_rank() == 0) {
                    if (j == 0) {
                        st_relaxed<S>(detail::signal_word(comm, to, comm.rank, WORD_LEN), message_word(op.bytes, l));
                    }
                    detail::signal_store<S>(comm, to, word_ready(c), send_base[c] + i + 1);
                }
            }
            if (receives) {
                s = cta_wait(g, shared_status, [&] {
                    Status w = detail::signal_wait_word<S>(Thread{}, comm, from, word_ready(c), recv_base[c] + i + 1);
                    if (w == Status::Ok && j == 0 &&
                        ld_relaxed<S>(detail::signal_word(comm, comm.rank, from, WORD_LEN)) !=
                            message_word(op.bytes, l)) {
                        w = Status::Mismatch;
                        record_error(Thread{}, comm, w, from, SYMCOMM_OP_SIGNAL_WAIT, op.bytes);
                    }
                    return w;
                });
                if (s != Status::Ok) break;
                detail::group_copy(g, theirs + slot, data + off, n);
                __syncthreads();
                if (g.thread_rank() == 0) detail::signal_store<S>(comm, from, word_done(c), recv_base[c] + i + 1);
            }
        }
        if (!any) break;
    }
    // The receiver consumed every piece: the region is free for whatever runs next.
    if (sends && s == Status::Ok && g.thread_rank() == 0) {
        for (uint32_t c = cta; c < nch; c += ctas) {
            const uint64_t count = (pieces - c + nch - 1) / nch;
            if (detail::signal_wait_word<S>(Thread{}, comm, to, word_done(c), send_base[c] + count) != Status::Ok) break;
        }
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(SYMCOMM_BUILTIN_THREADS, 1) symcomm_sendrecv(DevComm comm, P2pArgs args) {
    const Cta g;
    // The operation this CTA runs, and its place among the operation's CTAs.
    uint32_t k = 0, first = 0, ctas = 1;
    for (; k < args.nops && k < SYMCOMM_P2P_MAX_OPS; ++k) {
        ctas = args.ops[k].ctas == 0 ? 1 : args.ops[k].ctas;
        if (blockIdx.x - first < ctas) break;
        first += ctas;
    }
    if (k >= args.nops || k >= SYMCOMM_P2P_MAX_OPS) return;
    const P2pOp op = args.ops[k];
    SYMCOMM_SHARED(uint32_t, p2p_status, 1);
    SYMCOMM_SHARED(uint64_t, p2p_bases, 2 * kChannels);
    const uint32_t from = op.kind == SYMCOMM_P2P_EXCHANGE ? op.recv_peer : op.peer;
    if (comm.abi_version != SYMCOMM_ABI_VERSION || op.kind > SYMCOMM_P2P_EXCHANGE || op.peer >= comm.nranks ||
        from >= comm.nranks) {
        if (g.thread_rank() == 0) {
            const Status s = comm.abi_version != SYMCOMM_ABI_VERSION ? Status::AbiMismatch : Status::InvalidArgument;
            record_error(Thread{}, comm, s, comm.rank, SYMCOMM_OP_SIGNAL_WAIT, op.peer);
        }
        return;
    }
    const uint32_t cta = blockIdx.x - first;
    if (comm.flags & SYMCOMM_COMM_SAME_GPU) {
        run_op<Scope::Gpu>(g, comm, args, op, cta, ctas, p2p_status, p2p_bases);
    } else {
        run_op<Scope::Sys>(g, comm, args, op, cta, ctas, p2p_status, p2p_bases);
    }
}
SYMCOMM_EMU_KERNEL(symcomm_sendrecv)

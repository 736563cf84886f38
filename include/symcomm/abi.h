/*
 * symcomm shared ABI: the plain-data structs that the host (Rust) passes to device code by value.
 *
 * This header is C and C++, and compiles under nvcc, NVRTC (no C library headers there) and the
 * host compilers (the CPU emulator). The Rust mirror is `device/src/abi.rs`, generated from this
 * file with bindgen (`scripts/bindgen-abi`); `cargo test -p symcomm-device --test abi` regenerates
 * it and fails on any difference, and compares field offsets printed by the C compiler with Rust's.
 *
 * Rules: fixed-width integer fields only (device addresses are `uint64_t`, never pointers to host
 * state), natural alignment, no padding holes, every layout pinned by a static assertion below.
 * Changing a layout means bumping SYMCOMM_ABI_VERSION.
 */
#ifndef SYMCOMM_ABI_H
#define SYMCOMM_ABI_H

#if defined(__CUDACC_RTC__)
/* NVRTC has no C library headers; these are the LP64 definitions. */
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

/** Version of the layouts below; `DevComm::abi_version` carries it so a kernel can refuse a host
 *  built against different headers. */
#define SYMCOMM_ABI_VERSION 6u

/* The signal area. Every (owner rank, writing peer) pair has SYMCOMM_SIGNAL_WORDS signal words:
 * 64-bit words in the owner's signal array that only the peer writes (epochs: values only grow).
 * They are split once, here, into ranges that tile the words without overlap (static assertions
 * at the end of this file):
 *
 *   [0, SYMCOMM_USER_SIGNAL_END)                          users' signals (signal_set,
 *                                                         signal_add, signal_wait_until,
 *                                                         put_with_signal)
 *   [SYMCOMM_BARRIER_WORD_FIRST, SYMCOMM_P2P_FIRST_WORD)  barriers: barrier index i is word
 *                                                         SYMCOMM_BARRIER_WORD_FIRST + i
 *   [SYMCOMM_P2P_FIRST_WORD, SYMCOMM_SIGNAL_WORDS)        send/recv (the built-in sendrecv)
 *
 * Barrier indices are split in turn: [0, SYMCOMM_HOST_BARRIER_END) belong to the host's
 * collectives (SYMCOMM_HOST_LANE_BARRIERS per stream lane), [SYMCOMM_USER_BARRIER_FIRST,
 * SYMCOMM_USER_BARRIER_END) to users' kernels, which may run concurrently with host collectives.
 * `barrier()` refuses an index >= SYMCOMM_USER_BARRIER_END and the signal functions a word >=
 * SYMCOMM_USER_SIGNAL_END, so no user call can reach the send/recv words. */
/** Signal words per (owner rank, writing peer) pair (`DevComm::signal_words`). */
#define SYMCOMM_SIGNAL_WORDS 256u
/** Users' signal words: [0, SYMCOMM_USER_SIGNAL_END). */
#define SYMCOMM_USER_SIGNAL_END 64u
/** Barrier index i uses signal word SYMCOMM_BARRIER_WORD_FIRST + i (right after the users'). */
#define SYMCOMM_BARRIER_WORD_FIRST SYMCOMM_USER_SIGNAL_END
/** Barrier indices of one stream lane of the host's collectives (also the most CTAs of one host
 *  collective launch): lane k uses [k * SYMCOMM_HOST_LANE_BARRIERS, (k + 1) * ...). */
#define SYMCOMM_HOST_LANE_BARRIERS 64u
/** Barrier indices of the host's collectives: [0, SYMCOMM_HOST_BARRIER_END), two lanes. */
#define SYMCOMM_HOST_BARRIER_END (2u * SYMCOMM_HOST_LANE_BARRIERS)
/** First barrier index of users' kernels (host collectives never use it or any above). */
#define SYMCOMM_USER_BARRIER_FIRST SYMCOMM_HOST_BARRIER_END
/** Channels of one send/recv pair (P2pOp::ctas): each has its own two staging slots and its own
 *  "data ready" and "data consumed" words, so up to this many CTAs move one message at once. */
#define SYMCOMM_P2P_CHANNELS 8u
/** Signal words of send/recv per (owner, peer) pair: the message length, then per channel the
 *  pieces ready (written by the sender) and the pieces consumed (written by the receiver). */
#define SYMCOMM_P2P_WORDS (1u + 2u * SYMCOMM_P2P_CHANNELS)
/** First signal word of send/recv: [SYMCOMM_P2P_FIRST_WORD, SYMCOMM_SIGNAL_WORDS). */
#define SYMCOMM_P2P_FIRST_WORD (SYMCOMM_SIGNAL_WORDS - SYMCOMM_P2P_WORDS)
/** End (exclusive) of the barrier indices, and of users' barrier indices
 *  [SYMCOMM_USER_BARRIER_FIRST, SYMCOMM_USER_BARRIER_END): the last barrier word is the one
 *  before the send/recv words. */
#define SYMCOMM_USER_BARRIER_END (SYMCOMM_P2P_FIRST_WORD - SYMCOMM_BARRIER_WORD_FIRST)

/* The low-latency (LL) area. Each rank's signal array is followed, at `DevComm::ll_offset` bytes
 * from its start, by the LL area the LL collectives use (SYMCOMM_COLL_ALL_REDUCE_LL,
 * SYMCOMM_COLL_ALL_GATHER_LL, SYMCOMM_COLL_REDUCE_SCATTER_LL, SYMCOMM_COLL_BROADCAST_LL): data
 * travels in 16-byte
 * lines, each two 8-byte halves of (4 data bytes, 4 flag bytes) stored at once, so a reader that
 * sees the flag it waits for in a half has that half's data too, with no barrier. The area holds,
 * for every barrier index s in [0, SYMCOMM_USER_BARRIER_END):
 *
 *   - one 64-bit epoch word, only ever touched by this rank's CTA that owns index s: the LL
 *     rounds it has run on s (words [0, SYMCOMM_USER_BARRIER_END) of the area);
 *   - two buffers (parity 0 and 1), each with one region of `DevComm::ll_lines` lines per writing
 *     rank: region (s, parity, writer) starts SYMCOMM_LL_EPOCH_BYTES + ((s * 2 + parity) * nranks
 *     + writer) * ll_lines * SYMCOMM_LL_LINE_BYTES bytes into the area.
 *
 * Round e of index s writes buffer e & 1 with flag ((e - 1) mod (2^32 - 1)) + 1 (never 0, the
 * value of untouched memory); a writer reuses a buffer two rounds later only after it has read
 * every rank's lines of the round between, which each rank writes only after reading the older
 * round: so no reset, and back-to-back launches and graph replay need nothing else. */
/** Lines per (index, parity, writer) region of the LL area (8 data bytes each; line 0 of a
 *  region is the round's header: the collective's fingerprint). */
#define SYMCOMM_LL_LINES 256u
/** Bytes of one LL line. */
#define SYMCOMM_LL_LINE_BYTES 16u
/** Bytes of the epoch words at the start of the LL area (one per barrier index, rounded up to a
 *  whole line so that the regions after them are 16-byte aligned). */
#define SYMCOMM_LL_EPOCH_BYTES ((SYMCOMM_USER_BARRIER_END * 8u + 15u) / 16u * 16u)

/* Bits of DevComm::flags. */
/** Every rank of the communicator runs on this rank's GPU, in this rank's process (one CUDA
 *  context): the library's own signal words (barriers) need only `.gpu` scope, which covers the
 *  threads of one program on one GPU. Ranks in other processes on the same GPU use `.sys`. */
#define SYMCOMM_COMM_SAME_GPU 1u

/* Status of a device-side wait or operation (also the `status` of an ErrorRecord). */
/** Completed. */
#define SYMCOMM_STATUS_OK 0u
/** A bounded wait passed its deadline (`DevComm::timeout_ns`). */
#define SYMCOMM_STATUS_TIMEOUT 1u
/** The communicator's abort flag was raised while waiting. */
#define SYMCOMM_STATUS_ABORTED 2u
/** A peer called a different collective (fingerprint differs). */
#define SYMCOMM_STATUS_MISMATCH 3u
/** The kernel was built against a different SYMCOMM_ABI_VERSION than the host. */
#define SYMCOMM_STATUS_ABI_MISMATCH 4u
/** A device-side precondition failed (a bad code, an out-of-range index, overlapping buffers). */
#define SYMCOMM_STATUS_INVALID_ARGUMENT 5u

/* Element types of collectives (`symcomm::DataType` in types.cuh). Part of a collective's
 * fingerprint; the storage formats are described there. */
/** IEEE 754 binary32 (accumulates in binary32). */
#define SYMCOMM_DTYPE_F32 0u
/** IEEE 754 binary64 (accumulates in binary64). */
#define SYMCOMM_DTYPE_F64 1u
/** IEEE 754 binary16 (accumulates in binary32). */
#define SYMCOMM_DTYPE_F16 2u
/** bfloat16: the upper half of a binary32 (accumulates in binary32). */
#define SYMCOMM_DTYPE_BF16 3u
/** OCP FP8 E4M3 (no infinities, max 448; accumulates in binary32, saturates on conversion). */
#define SYMCOMM_DTYPE_FP8_E4M3 4u
/** OCP FP8 E5M2 (IEEE-like, max 57344; accumulates in binary32, saturates on conversion). */
#define SYMCOMM_DTYPE_FP8_E5M2 5u
/** Signed 8-bit integer (two's complement; sums and products wrap). */
#define SYMCOMM_DTYPE_I8 6u
/** Unsigned 8-bit integer (sums and products wrap). */
#define SYMCOMM_DTYPE_U8 7u
/** Signed 32-bit integer (two's complement; sums and products wrap). */
#define SYMCOMM_DTYPE_I32 8u
/** Unsigned 32-bit integer (sums and products wrap). */
#define SYMCOMM_DTYPE_U32 9u
/** Signed 64-bit integer (two's complement; sums and products wrap). */
#define SYMCOMM_DTYPE_I64 10u
/** Unsigned 64-bit integer (sums and products wrap). */
#define SYMCOMM_DTYPE_U64 11u
/** Number of element-type codes: valid codes are [0, SYMCOMM_DTYPE_COUNT). */
#define SYMCOMM_DTYPE_COUNT 12u
/** `WindowHandleRaw::dtype` of a window whose elements are not one of the types above (user
 *  structs, raw bytes): collectives of any type of the window's element size may use it. */
#define SYMCOMM_DTYPE_NONE 255u

/* Reduction operators of collectives (`symcomm::RedOp` in reduce.cuh). Part of a collective's
 * fingerprint. */
/** Sum. */
#define SYMCOMM_REDOP_SUM 0u
/** Product. */
#define SYMCOMM_REDOP_PROD 1u
/** Minimum (floating point: a NaN input is ignored unless every input is NaN; -0 < +0). */
#define SYMCOMM_REDOP_MIN 2u
/** Maximum (floating point: a NaN input is ignored unless every input is NaN; -0 < +0). */
#define SYMCOMM_REDOP_MAX 3u
/** Average: the sum divided by the number of ranks (integers: truncating integer division). */
#define SYMCOMM_REDOP_AVG 4u
/** Number of reduction-operator codes: valid codes are [0, SYMCOMM_REDOP_COUNT). */
#define SYMCOMM_REDOP_COUNT 5u

/* Operation codes recorded in ErrorRecord::op. */
/** A signal wait (`signal_wait_until`). */
#define SYMCOMM_OP_SIGNAL_WAIT 1u
/** A barrier (`barrier`, and the barriers inside collectives). */
#define SYMCOMM_OP_BARRIER 2u
/** A collective refused its arguments (status InvalidArgument; detail: the collective kind in
 *  bits 0..31, the SYMCOMM_REFUSED_* reason in bits 32..39), or was built against another ABI
 *  (status AbiMismatch; detail: the kind). */
#define SYMCOMM_OP_COLLECTIVE 3u
/** A signal (`signal_set`, `signal_add`, `put_with_signal`) refused its arguments. */
#define SYMCOMM_OP_SIGNAL 4u
/** A put_with_signal refused its arguments (detail: the peer in bits 0..31, the
 *  SYMCOMM_REFUSED_* reason in bits 32..39). */
#define SYMCOMM_OP_PUT 5u
/** A user kernel's own error (`record_user_error`; detail: the user's code << 32 | a user value). */
#define SYMCOMM_OP_USER 6u
/** A grid-wide sync across the CTAs of one launch (`grid_sync`; detail: the generation waited on). */
#define SYMCOMM_OP_GRID_SYNC 7u
/** A wait for a line of the LL area (`all_reduce_ll`, `all_gather_ll`; detail: the barrier index << 32 | the line
 *  in its region, 0 for the header line). */
#define SYMCOMM_OP_LL_WAIT 8u
/** A wait for the proxy to take an operation for a rank on another host (a signal or
 *  put_with_signal; detail: the operation's ticket). */
#define SYMCOMM_OP_PROXY 9u

/* Why a device operation refused its arguments (bits 32..39 of ErrorRecord::detail). Every check
 * is made at entry, before any memory access and any barrier, from values that agree across ranks
 * in a correct program (codes, counts, offsets, the symmetric windows' sizes), so every rank
 * refuses the same call. */
/** A kind, dtype, redop or scope code out of range, or not the kernel's dtype. */
#define SYMCOMM_REFUSED_CODE 1u
/** The root is not a rank. */
#define SYMCOMM_REFUSED_ROOT 2u
/** An input range overlaps an output range without being in place. */
#define SYMCOMM_REFUSED_OVERLAP 3u
/** In-place all-to-all on a CTA of fewer threads than ranks. */
#define SYMCOMM_REFUSED_CTA_SIZE 4u
/** The input range does not fit in the source window (count, offset, tile; overflow included). */
#define SYMCOMM_REFUSED_SRC_RANGE 5u
/** The output range does not fit in the destination window (count, offset, tile). */
#define SYMCOMM_REFUSED_DST_RANGE 6u
/** The element size of the access is not the window's (`WindowHandleRaw::elem_size`). */
#define SYMCOMM_REFUSED_ELEM_SIZE 7u
/** The element type of the collective is not the window's (`WindowHandleRaw::dtype`). */
#define SYMCOMM_REFUSED_DTYPE 8u
/** The peer is not a rank of the window. */
#define SYMCOMM_REFUSED_PEER 9u
/** An LL collective on a communicator without an LL area (`DevComm::ll_lines` < 2), or on a
 *  barrier index past it (>= SYMCOMM_USER_BARRIER_END). */
#define SYMCOMM_REFUSED_LL 10u
/** The peer is on another host, which loads and stores cannot reach: put / get, and every
 *  collective of the device library, on a communicator whose ranks span several hosts; or a
 *  signal / put_with_signal to such a peer where no proxy runs (`DevComm::proxy` 0). */
#define SYMCOMM_REFUSED_REMOTE 11u
/** The source of a put_with_signal to a rank on another host is not global memory (the proxy
 *  reads it with a copy: shared and local memory are out of its reach). */
#define SYMCOMM_REFUSED_SOURCE 12u

/* Collective kinds (CollArgs::kind; part of the fingerprint, so ranks must agree on the
 * algorithm too). */
/** All-reduce, one-shot: every rank reads every peer's input (small messages). */
#define SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT 0u
/** All-reduce, two-shot: reduce-scatter then all-gather over peer pointers (large messages). */
#define SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT 1u
/** All-gather: rank r's `count` elements land at r * count in every rank's output. */
#define SYMCOMM_COLL_ALL_GATHER 2u
/** Reduce-scatter: rank r gets the reduction of every rank's block r. */
#define SYMCOMM_COLL_REDUCE_SCATTER 3u
/** Broadcast from `root`. */
#define SYMCOMM_COLL_BROADCAST 4u
/** Reduce to `root`. */
#define SYMCOMM_COLL_REDUCE 5u
/** Scatter from `root`: rank r gets the root's block r. */
#define SYMCOMM_COLL_SCATTER 6u
/** All-to-all: rank r's block p goes to rank p's block r. */
#define SYMCOMM_COLL_ALL_TO_ALL 7u
/** All-reduce, low latency: every rank stores its input as LL lines into every peer's LL area
 *  and reduces what arrives in its own, with no barrier (small messages). */
#define SYMCOMM_COLL_ALL_REDUCE_LL 8u
/** All-gather, low latency: every rank stores its input as LL lines into every peer's LL area
 *  and copies what arrives in its own into its output blocks, with no barrier (small messages). */
#define SYMCOMM_COLL_ALL_GATHER_LL 9u
/** Reduce-scatter, low latency: every rank stores its block q as LL lines into rank q's LL area
 *  and reduces what arrives in its own, with no barrier (small messages). */
#define SYMCOMM_COLL_REDUCE_SCATTER_LL 10u
/** Broadcast, low latency: the root stores its input as LL lines into every peer's LL area, the
 *  others copy what arrives into their output, with no barrier (small messages). */
#define SYMCOMM_COLL_BROADCAST_LL 11u
/** Number of collective kinds. */
#define SYMCOMM_COLL_COUNT 12u

/** Grid scope: every CTA of the launch works on one buffer; CTA b uses barrier index index + b. */
#define SYMCOMM_SCOPE_GRID 0u
/** CTA scope: each CTA b runs its own collective on the tile at offset + b * tile_stride, with
 *  barrier index index + b. */
#define SYMCOMM_SCOPE_CTA 1u

/* Ranks on other hosts. A communicator or window whose ranks span several hosts keeps the flat
 * layout over all its ranks, but maps only the copies (signal arrays, window copies) of the ranks
 * on this host: the others' places are holes. `ranks`, in DevComm and WindowHandleRaw, is then
 * the device address of a uint32_t per rank, SYMCOMM_RANK_REMOTE for a rank on another host and
 * the rank itself for one on this host; 0 when every rank is on this host.
 *
 * Signals and put_with_signal to a rank on another host go through this rank's proxy: a host
 * thread that takes operations from a ring and carries them over the network, where the peer's
 * proxy writes the data into its copy and then release-stores (or adds) the signal word. The
 * device side (one thread): takes a ticket t (atomic add on ProxyQueue::next, device memory),
 * waits until slot t % SYMCOMM_PROXY_SLOTS of the ring is free (`*taken + SLOTS > t`), writes
 * the ProxyOp there and release-stores its `ticket` field to t + 1 last; then waits until the
 * proxy took it (`*taken > t`: the data was read, so the source may be reused). The proxy takes
 * operations in ticket order and release-stores the count it took into `*taken`. Both waits
 * are bounded (SYMCOMM_OP_PROXY). */
/** ProxyOp::op: release-store `value` into the peer's signal word `word` for this rank. */
#define SYMCOMM_PROXY_SIGNAL_SET 1u
/** ProxyOp::op: release-add `value` to the peer's signal word `word` for this rank. */
#define SYMCOMM_PROXY_SIGNAL_ADD 2u
/** ProxyOp::op: copy `bytes` bytes from `src` into the peer's copy of the window at the
 *  address `dst` names in this rank's own copy, then as SYMCOMM_PROXY_SIGNAL_SET. */
#define SYMCOMM_PROXY_PUT 3u
/** Operations in a proxy's ring. */
#define SYMCOMM_PROXY_SLOTS 64u
/** The `ranks` table's entry of a rank on another host. */
#define SYMCOMM_RANK_REMOTE 0xFFFFFFFFu

/** One operation for the proxy (a slot of its ring). */
typedef struct ProxyOp {
    /** The operation's ticket + 1 once every other field is written (release-stored last);
     *  the proxy reads the slot when it holds the ticket it expects + 1. */
    uint64_t ticket;
    /** SYMCOMM_PROXY_*. */
    uint32_t op;
    /** The rank on another host. */
    uint32_t peer;
    /** The signal word (a users' word). */
    uint32_t word;
    /** Zero. */
    uint32_t reserved;
    /** The signal's value (SET, PUT) or increment (ADD). */
    uint64_t value;
    /** PUT: device address of the data. */
    uint64_t src;
    /** PUT: device address of the destination in this rank's own copy of the window. */
    uint64_t dst;
    /** PUT: bytes. */
    uint64_t bytes;
} ProxyOp;

/** The device's side of a proxy (`DevComm::proxy` points to it, in device memory). */
typedef struct ProxyQueue {
    /** The next ticket (device atomics). */
    uint64_t next;
    /** Device address of the ring: SYMCOMM_PROXY_SLOTS ProxyOps (host memory the device maps). */
    uint64_t ring;
    /** Device address of the uint64_t count of operations the proxy took (host memory). */
    uint64_t taken;
} ProxyQueue;

/**
 * Device handle of a communicator (one per rank), passed to kernels by value.
 *
 * Signal area: rank r's signal array lives at `signal_base + r * signal_stride` (flat layout, every
 * rank's array is addressable by every rank). Inside a rank's array, the signal words written by
 * peer p are `[p * signal_words, (p + 1) * signal_words)`, each a `uint64_t` that only grows
 * (epochs are never reset in place, so back-to-back launches and graph replay stay correct); the
 * ranges of those words are at SYMCOMM_SIGNAL_WORDS.
 */
typedef struct DevComm {
    /** SYMCOMM_ABI_VERSION of the host that built this handle. */
    uint32_t abi_version;
    /** This rank, in [0, nranks). */
    uint32_t rank;
    /** Ranks in the team. */
    uint32_t nranks;
    /** Signal words per peer (SYMCOMM_SIGNAL_WORDS). */
    uint32_t signal_words;
    /** Device address of rank 0's signal array. */
    uint64_t signal_base;
    /** Bytes between consecutive ranks' signal arrays. */
    uint64_t signal_stride;
    /** Device address of a `uint32_t` the host sets non-zero to abort every wait. */
    uint64_t abort_flag;
    /** Device address of this rank's ErrorRecord (first error wins). */
    uint64_t error;
    /** Deadline of every bounded wait, in nanoseconds. */
    uint64_t timeout_ns;
    /** Bytes from the start of a rank's signal array to its LL area (see SYMCOMM_LL_LINES). */
    uint64_t ll_offset;
    /** Lines per region of the LL area (SYMCOMM_LL_LINES); 0: no LL area (LL collectives refuse). */
    uint32_t ll_lines;
    /** SYMCOMM_COMM_* bits. */
    uint32_t flags;
    /** Device address of the table of ranks on other hosts (see SYMCOMM_RANK_REMOTE); 0: every
     *  rank is on this host. */
    uint64_t ranks;
    /** Device address of this rank's ProxyQueue; 0: no proxy (operations on ranks of other
     *  hosts are refused, SYMCOMM_REFUSED_REMOTE). */
    uint64_t proxy;
} DevComm;

/**
 * Device handle of a symmetric window (C++ wraps it as `WindowHandle<T>`).
 *
 * Flat layout: rank r's copy starts at `base + r * stride`; each copy holds `bytes` bytes.
 * The element type travels with it so that device code can refuse a typed access of another
 * type: `elem_size` bytes per element (1 for byte windows, which any element type may view) and
 * `dtype`, the SYMCOMM_DTYPE_* code of the element, or SYMCOMM_DTYPE_NONE when the element is
 * not one of those types.
 */
typedef struct WindowHandleRaw {
    /** Device address of rank 0's copy. */
    uint64_t base;
    /** Bytes between consecutive ranks' copies (>= bytes). */
    uint64_t stride;
    /** Usable bytes per rank. */
    uint64_t bytes;
    /** The owning rank of this handle. */
    uint32_t rank;
    /** Ranks sharing the window. */
    uint32_t nranks;
    /** Bytes per element (sizeof the host's element type; 1 for untyped byte windows). */
    uint32_t elem_size;
    /** SYMCOMM_DTYPE_* of the element, or SYMCOMM_DTYPE_NONE. */
    uint32_t dtype;
    /** Device address of the table of ranks on other hosts (see SYMCOMM_RANK_REMOTE); 0: every
     *  rank is on this host. */
    uint64_t ranks;
} WindowHandleRaw;

/**
 * First error a kernel hit on this rank, written once (status goes from OK to non-zero with an
 * atomic compare-and-swap) and read by the host.
 */
typedef struct ErrorRecord {
    /** SYMCOMM_STATUS_* (OK while no error was recorded). */
    uint32_t status;
    /** Rank that recorded the error. */
    uint32_t rank;
    /** Peer involved (the one waited for); this rank itself for argument and ABI errors. */
    uint32_t peer;
    /** SYMCOMM_OP_* that failed. */
    uint32_t op;
    /** Operation-specific detail (a barrier index, an awaited value, a signal word). */
    uint64_t detail;
    /** Time of the error (%globaltimer or the emulator's steady clock), nanoseconds. */
    uint64_t time_ns;
} ErrorRecord;

/** Most threads per CTA of the built-in kernels `symcomm_collective_<dtype>` and
 *  `symcomm_sendrecv` (their `__launch_bounds__`, so ptxas keeps their registers within what one
 *  CTA of this size may use on every SM); the host launches CTAs of this size on GPUs. */
#define SYMCOMM_BUILTIN_THREADS 512u

/**
 * Arguments of the built-in collective kernel `symcomm_collective` (one launch = one collective
 * per scope unit). Counts and offsets are in elements. Buffers are symmetric windows: `src`
 * (input) and `dst` (output) may be the same window; in place means the same window and the
 * offsets of the collective's in-place convention (see collectives.cuh).
 */
typedef struct CollArgs {
    /** SYMCOMM_COLL_* */
    uint32_t kind;
    /** SYMCOMM_DTYPE_* */
    uint32_t dtype;
    /** SYMCOMM_REDOP_* (reductions only; 0 otherwise) */
    uint32_t redop;
    /** Root rank (broadcast, reduce, scatter; 0 otherwise) */
    uint32_t root;
    /** SYMCOMM_SCOPE_* */
    uint32_t scope;
    /** First barrier index (CTA b of the launch uses index + b) */
    uint32_t index;
    /** Elements per rank block (see each collective) */
    uint64_t count;
    /** Input offset in `src` */
    uint64_t src_offset;
    /** Output offset in `dst` */
    uint64_t dst_offset;
    /** CTA scope: elements between consecutive CTAs' tiles (in both windows) */
    uint64_t tile_stride;
    /** Input window */
    WindowHandleRaw src;
    /** Output window */
    WindowHandleRaw dst;
    /** 0, or this rank's input as a device address (any device memory of this rank; the kernel
     *  cannot check it: the host validated it). The collective then reads this rank's own input
     *  there, and first copies into its copy of `src` the elements its peers read (each CTA the
     *  part it synchronizes on), before its first barrier: the host's staged calls (buffers that
     *  are not windows) in one launch, without copies of their own. Block q at
     *  src_ptr + q * ptr_stride elements. */
    uint64_t src_ptr;
    /** 0, or this rank's output as a device address (as src_ptr): the collective writes this
     *  rank's output there instead of into its copy of `dst` (two-shot all-reduce: the shares
     *  peers push still arrive in `dst` and are copied here after the last barrier). Block p at
     *  dst_ptr + p * ptr_stride elements. */
    uint64_t dst_ptr;
    /** Elements between consecutive blocks at src_ptr and dst_ptr (a staged call moved in
     *  chunks: the whole call's count; at least `count`). CTA scope: CTA b's tile starts
     *  b * tile_stride elements further, as in the windows. */
    uint64_t ptr_stride;
} CollArgs;

/* Point-to-point (the built-in kernel `symcomm_sendrecv`, host `send` / `recv` / groups). */
/** Most send and receive operations in one launch (each 1 to SYMCOMM_P2P_CHANNELS CTAs). */
#define SYMCOMM_P2P_MAX_OPS 32u
/** Kinds of P2pOp. */
/** Receive `bytes` bytes from `peer` into `addr`. */
#define SYMCOMM_P2P_RECV 0u
/** Send `bytes` bytes at `addr` to `peer`. */
#define SYMCOMM_P2P_SEND 1u
/** In place: send `bytes` bytes at `addr` to `peer` and receive as many from `recv_peer` into
 *  the same bytes, piece by piece (each piece is sent before the received one overwrites it). */
#define SYMCOMM_P2P_EXCHANGE 2u

/** One operation of `symcomm_sendrecv` on `bytes` bytes at device address `addr` (the user's
 *  buffer, any device memory). */
typedef struct P2pOp {
    /** Device address of the data (send: read; receive: written; exchange: both). */
    uint64_t addr;
    /** Bytes; the matching operation on the peer must have the same count. */
    uint64_t bytes;
    /** The rank sent to (send, exchange) or received from (receive). */
    uint32_t peer;
    /** SYMCOMM_P2P_RECV, _SEND or _EXCHANGE. */
    uint32_t kind;
    /** Exchange: the rank received from. */
    uint32_t recv_peer;
    /** CTAs that run this operation (0 counts as 1; more than the message's channels idle). The
     *  peer may use another count: the channels, not the CTAs, pair up. */
    uint32_t ctas;
} P2pOp;

/** Arguments of `symcomm_sendrecv`: the first max(ops[0].ctas, 1) CTAs run ops[0], the next
 *  ones ops[1], and so on (i < nops; the grid is the sum). Data moves through `stage`, a window
 *  whose per-rank copy is split into one region per peer (`stage.bytes / nranks` bytes, rounded
 *  down to 16), each region into min(channels, region / 32) channels (at least 1) of two
 *  16-byte-aligned slots: a message is cut into pieces of one slot, piece j going through channel
 *  j % (the message's channels); the sender copies a piece into its slot, the receiver reads it
 *  from there, double-buffered. At most one send and one receive per peer per launch (an
 *  exchange counts as both). */
typedef struct P2pArgs {
    /** Staging window. */
    WindowHandleRaw stage;
    /** Operations in use. */
    uint32_t nops;
    /** Channels of the staging layout, 1..SYMCOMM_P2P_CHANNELS (0 counts as 1, more as
     *  SYMCOMM_P2P_CHANNELS): the same on both sides of a pair (a receiver whose layout differs
     *  from its sender's records Mismatch, as for another length). */
    uint32_t channels;
    /** The operations. */
    P2pOp ops[SYMCOMM_P2P_MAX_OPS];
} P2pArgs;

/* Layout pins; the Rust mirror asserts the same numbers. */
#if defined(__cplusplus)
#define SYMCOMM_ABI_ASSERT(cond, msg) static_assert(cond, msg)
#define SYMCOMM_ABI_ALIGNOF(t) alignof(t)
#else
#define SYMCOMM_ABI_ASSERT(cond, msg) _Static_assert(cond, msg)
#define SYMCOMM_ABI_ALIGNOF(t) _Alignof(t)
#endif
SYMCOMM_ABI_ASSERT(sizeof(DevComm) == 88 && SYMCOMM_ABI_ALIGNOF(DevComm) == 8, "DevComm layout");
SYMCOMM_ABI_ASSERT(sizeof(WindowHandleRaw) == 48 && SYMCOMM_ABI_ALIGNOF(WindowHandleRaw) == 8, "WindowHandleRaw layout");
SYMCOMM_ABI_ASSERT(sizeof(ErrorRecord) == 32 && SYMCOMM_ABI_ALIGNOF(ErrorRecord) == 8, "ErrorRecord layout");
/* NVRTC has neither offsetof nor __builtin_offsetof; nvcc and the host compilers check offsets. */
#if !defined(__CUDACC_RTC__)
SYMCOMM_ABI_ASSERT(__builtin_offsetof(DevComm, signal_base) == 16, "DevComm.signal_base");
SYMCOMM_ABI_ASSERT(__builtin_offsetof(DevComm, timeout_ns) == 48, "DevComm.timeout_ns");
SYMCOMM_ABI_ASSERT(__builtin_offsetof(DevComm, flags) == 68, "DevComm.flags");
SYMCOMM_ABI_ASSERT(__builtin_offsetof(WindowHandleRaw, rank) == 24, "WindowHandleRaw.rank");
SYMCOMM_ABI_ASSERT(__builtin_offsetof(WindowHandleRaw, elem_size) == 32, "WindowHandleRaw.elem_size");
SYMCOMM_ABI_ASSERT(__builtin_offsetof(WindowHandleRaw, dtype) == 36, "WindowHandleRaw.dtype");
SYMCOMM_ABI_ASSERT(__builtin_offsetof(WindowHandleRaw, ranks) == 40, "WindowHandleRaw.ranks");
SYMCOMM_ABI_ASSERT(__builtin_offsetof(DevComm, ranks) == 72, "DevComm.ranks");
SYMCOMM_ABI_ASSERT(__builtin_offsetof(DevComm, proxy) == 80, "DevComm.proxy");
SYMCOMM_ABI_ASSERT(sizeof(ProxyOp) == 56 && SYMCOMM_ABI_ALIGNOF(ProxyOp) == 8, "ProxyOp layout");
SYMCOMM_ABI_ASSERT(sizeof(ProxyQueue) == 24 && SYMCOMM_ABI_ALIGNOF(ProxyQueue) == 8, "ProxyQueue layout");
SYMCOMM_ABI_ASSERT(__builtin_offsetof(ErrorRecord, detail) == 16, "ErrorRecord.detail");
#endif
SYMCOMM_ABI_ASSERT(sizeof(CollArgs) == 176 && SYMCOMM_ABI_ALIGNOF(CollArgs) == 8, "CollArgs layout");
SYMCOMM_ABI_ASSERT(sizeof(P2pOp) == 32 && SYMCOMM_ABI_ALIGNOF(P2pOp) == 8, "P2pOp layout");
SYMCOMM_ABI_ASSERT(sizeof(P2pArgs) == 56 + 32 * SYMCOMM_P2P_MAX_OPS && SYMCOMM_ABI_ALIGNOF(P2pArgs) == 8, "P2pArgs layout");
/* The signal-word ranges tile [0, SYMCOMM_SIGNAL_WORDS) in order, without overlap or gap, and the
 * barrier indices split into the host's lanes and the users' range. */
SYMCOMM_ABI_ASSERT(SYMCOMM_USER_SIGNAL_END > 0 && SYMCOMM_BARRIER_WORD_FIRST == SYMCOMM_USER_SIGNAL_END,
                   "barrier words start where the users' signal words end");
SYMCOMM_ABI_ASSERT(SYMCOMM_BARRIER_WORD_FIRST + SYMCOMM_USER_BARRIER_END == SYMCOMM_P2P_FIRST_WORD,
                   "the last barrier word is right before the send/recv words");
SYMCOMM_ABI_ASSERT(SYMCOMM_P2P_FIRST_WORD + SYMCOMM_P2P_WORDS == SYMCOMM_SIGNAL_WORDS,
                   "the send/recv words end the signal words");
SYMCOMM_ABI_ASSERT(SYMCOMM_HOST_BARRIER_END % SYMCOMM_HOST_LANE_BARRIERS == 0,
                   "host barrier indices are whole lanes");
SYMCOMM_ABI_ASSERT(SYMCOMM_USER_BARRIER_FIRST == SYMCOMM_HOST_BARRIER_END &&
                       SYMCOMM_USER_BARRIER_FIRST < SYMCOMM_USER_BARRIER_END,
                   "users' barrier indices follow the host's and are not empty");
#undef SYMCOMM_ABI_ASSERT
#undef SYMCOMM_ABI_ALIGNOF

#endif /* SYMCOMM_ABI_H */

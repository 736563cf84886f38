"""symcomm's Triton device library: signals, bounded waits and collective tiles for Triton
kernels over symmetric windows in the flat layout (rank r's copy at ``base + r * stride``).

Built only from Triton's own atomics with ``sem=`` / ``scope=`` (on sm_90 they lower to
``atom.global.sys.release.add`` and ``ld.global.sys.acquire``), so the same source compiles for
a GPU and runs in Triton's interpreter (``TRITON_INTERPRET=1``) on emulator windows — Triton
kernels are testable on a laptop. Kernel arguments are plain integers (addresses, strides,
ranks) that the helpers cast to pointers.

The signal area is the communicator's (``comm.device_handle()``): rank ``owner``'s word ``word``
written by rank ``writer`` is the ``uint64`` at
``signal_base + owner * signal_stride + (writer * signal_words + word) * 8``, the same words the
C++ API's ``signal_set`` / ``signal_wait_until`` use. Users' words are ``[0, 64)``; the host
collectives never touch them. Words only grow: a wait is for a value, e.g. an epoch.

Waits are bounded, like the C++ API's: by a deadline ``timeout_ns`` after the wait began (the
communicator's device timeout, ``comm_args``; read from ``%globaltimer`` on a GPU — in the
interpreter, which has no clock, a poll counts as :data:`INTERPRETER_POLL_NS`) and by the abort
flag (``comm.abort()`` on any rank); they return a status (:data:`STATUS_OK`, :data:`STATUS_TIMEOUT`,
:data:`STATUS_ABORTED`, :data:`STATUS_MISMATCH`, :data:`STATUS_INVALID_ARGUMENT`: the C++ API's
codes) instead of hanging. Failures are returned, not recorded in the rank's error record.

:func:`barrier` is the C++ API's barrier, word for word (the same signal words, epochs and
fingerprints), so a Triton kernel and a C++ kernel may even meet in one.
"""

import os

import triton
import triton.language as tl

from . import _symcomm

#: Whether kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` when this module was
#: imported), which cannot read the GPU's clock.
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"))
#: What one poll counts for against a deadline in the interpreter (nanoseconds).
INTERPRETER_POLL_NS = tl.constexpr(100_000)

#: Statuses (``SYMCOMM_STATUS_*``).
STATUS_OK = tl.constexpr(0)
STATUS_TIMEOUT = tl.constexpr(1)
STATUS_ABORTED = tl.constexpr(2)
STATUS_MISMATCH = tl.constexpr(3)
STATUS_INVALID_ARGUMENT = tl.constexpr(5)

#: Users' signal words are ``[0, USER_SIGNAL_END)``.
USER_SIGNAL_END = tl.constexpr(_symcomm.USER_SIGNAL_END)
#: Barrier index i is signal word ``BARRIER_WORD_FIRST + i``.
BARRIER_WORD_FIRST = tl.constexpr(_symcomm.BARRIER_WORD_FIRST)
#: Users' barrier indices are ``[USER_BARRIER_FIRST, USER_BARRIER_END)`` (the host collectives
#: use the ones below).
USER_BARRIER_FIRST = tl.constexpr(_symcomm.USER_BARRIER_FIRST)
USER_BARRIER_END = tl.constexpr(_symcomm.USER_BARRIER_END)


def comm_args(comm):
    """``(signal_base, signal_stride, signal_words, abort_flag, timeout_ns, rank, nranks)`` of
    ``comm``: the integers the helpers take, to splat into a kernel call.

    Raises ``symcomm.errors.Unsupported`` when the communicator's ranks span several hosts: these
    helpers address every peer with loads and stores, which reach only the ranks of this host
    (CUDA C++ and Rust kernels signal other hosts' ranks through the proxy)."""
    h = comm.device_handle()
    if h["ranks"] != 0:
        from .errors import Unsupported

        raise Unsupported(
            "the Triton helpers need every rank of the communicator on one host (they load and "
            "store every peer's words); across hosts use the host collectives, or CUDA C++ / Rust "
            "kernels, whose signals reach other hosts through the proxy"
        )
    return (
        h["signal_base"], h["signal_stride"], h["signal_words"], h["abort_flag"], h["timeout_ns"],
        h["rank"], h["nranks"],
    )


@triton.jit
def globaltimer():
    """The GPU's nanosecond clock (``%globaltimer``); compiled kernels only."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.uint64, is_pure=False, pack=1)


@triton.jit
def wait_start():
    """The start of a bounded wait, for :func:`expired`."""
    if INTERPRETED:
        return tl.zeros((), tl.uint64)
    else:
        return globaltimer()


@triton.jit
def expired(start, polls, timeout_ns):
    """Whether a wait begun at ``start`` (:func:`wait_start`) that polled ``polls`` times has
    passed its deadline ``timeout_ns``."""
    if INTERPRETED:
        return tl.cast(polls, tl.uint64) * INTERPRETER_POLL_NS >= tl.cast(timeout_ns, tl.uint64)
    else:
        return globaltimer() - start >= tl.cast(timeout_ns, tl.uint64)


@triton.jit
def peer_ptr(base, stride, peer, dtype: tl.constexpr):
    """Pointer to element 0 of rank ``peer``'s copy of the window (``base``, ``stride``)."""
    return (base + peer * stride).to(tl.pointer_type(dtype))


@triton.jit
def signal_ptr(signal_base, signal_stride, signal_words, owner, writer, word):
    """Pointer to rank ``owner``'s signal word ``word`` written by rank ``writer``."""
    return (signal_base + owner * signal_stride + (writer * signal_words + word) * 8).to(
        tl.pointer_type(tl.uint64)
    )


@triton.jit
def signal_add(signal_base, signal_stride, signal_words, rank, peer, word, delta):
    """Adds ``delta`` to ``peer``'s word ``word`` of this rank, with release at system scope:
    what this program stored before is visible to the peer once its wait sees the sum."""
    p = signal_ptr(signal_base, signal_stride, signal_words, peer, rank, word)
    tl.atomic_add(p, tl.cast(delta, tl.uint64), sem="release", scope="sys")


@triton.jit
def signal_set(signal_base, signal_stride, signal_words, rank, peer, word, value):
    """Stores ``value`` (larger than the word's earlier values) into ``peer``'s word ``word`` of
    this rank, with release at system scope."""
    p = signal_ptr(signal_base, signal_stride, signal_words, peer, rank, word)
    tl.atomic_xchg(p, tl.cast(value, tl.uint64), sem="release", scope="sys")


@triton.jit
def poll(p, abort_flag, start, polls, timeout_ns):
    """One acquire read (system scope) of the ``uint64`` at ``p`` in a wait begun at ``start``
    that polled ``polls`` times before: ``(value, status)``, the status :data:`STATUS_ABORTED`
    once the abort flag is set, :data:`STATUS_TIMEOUT` past the deadline, else OK (the caller
    loops while its condition is not met)."""
    abort = abort_flag.to(tl.pointer_type(tl.uint32))
    v = tl.atomic_add(p, tl.zeros((), tl.uint64), sem="acquire", scope="sys")
    status = 0
    if tl.atomic_add(abort, tl.zeros((), tl.uint32), sem="relaxed", scope="sys") != 0:
        status = 2
    elif expired(start, polls, timeout_ns):
        status = 1
    return v, status


@triton.jit
def wait_until(signal_base, signal_stride, signal_words, rank, peer, word, value, abort_flag, timeout_ns):
    """Waits until this rank's word ``word`` written by ``peer`` is at least ``value``, reading
    it with acquire at system scope (what the peer stored before its release is visible after).
    Returns :data:`STATUS_OK`, :data:`STATUS_TIMEOUT` past ``timeout_ns``, or
    :data:`STATUS_ABORTED` once the abort flag is set."""
    p = signal_ptr(signal_base, signal_stride, signal_words, rank, peer, word)
    want = tl.cast(value, tl.uint64)
    start = wait_start()
    polls = 0
    cur = tl.atomic_add(p, tl.zeros((), tl.uint64), sem="acquire", scope="sys")
    status = 0
    while (cur < want) & (status == 0):
        polls += 1
        cur, status = poll(p, abort_flag, start, polls, timeout_ns)
    if cur >= want:
        status = 0
    return status


@triton.jit
def barrier(signal_base, signal_stride, signal_words, rank, nranks: tl.constexpr, index, fingerprint, abort_flag, timeout_ns):
    """Barrier of this program with the same program of every rank on barrier ``index`` (users:
    ``[USER_BARRIER_FIRST, USER_BARRIER_END)``), the C++ API's protocol: this rank's next epoch
    (from its own word) and ``fingerprint`` (a ``uint32`` naming the call: sizes, a step) are
    release-stored to every rank; then each rank's word is acquire-polled until it reached the
    epoch. A peer at the same epoch with another fingerprint is :data:`STATUS_MISMATCH` (on both
    sides); :data:`STATUS_INVALID_ARGUMENT`, touching nothing, for an index at or above
    ``USER_BARRIER_END``. Writes of every rank's program before it are visible after it returns
    :data:`STATUS_OK`. Returns the worst status."""
    status = 0
    if index >= USER_BARRIER_END:
        status = 5
    else:
        word = BARRIER_WORD_FIRST + index
        self_word = signal_ptr(signal_base, signal_stride, signal_words, rank, rank, word)
        prev = tl.atomic_add(self_word, tl.zeros((), tl.uint64), sem="relaxed", scope="sys")
        low = tl.full((), 0xFFFFFFFF, tl.uint64)
        fp = tl.cast(fingerprint, tl.uint64) & low
        epoch = ((prev >> 32) + 1) & low
        mine = (epoch << 32) | fp
        for p in range(nranks):
            tl.atomic_xchg(signal_ptr(signal_base, signal_stride, signal_words, p, rank, word), mine, sem="release", scope="sys")
        for p in range(nranks):
            w = signal_ptr(signal_base, signal_stride, signal_words, rank, p, word)
            start = wait_start()
            polls = 0
            seen, s = poll(w, abort_flag, start, polls, timeout_ns)
            # Reached: the peer's epoch is ours or later (wrap-safe, as in C++).
            ahead = tl.cast(((seen >> 32) - epoch) & low, tl.uint32).to(tl.int32, bitcast=True)
            while (ahead < 0) & (s == 0):
                polls += 1
                seen, s = poll(w, abort_flag, start, polls, timeout_ns)
                ahead = tl.cast(((seen >> 32) - epoch) & low, tl.uint32).to(tl.int32, bitcast=True)
            if ahead >= 0:
                s = 0  # reached on the last read, even if the deadline passed meanwhile
            if (s == 0) & (ahead == 0) & ((seen & low) != fp):
                s = 3
            status = tl.maximum(status, s)
    return status


@triton.jit
def all_reduce_tile(src_base, src_stride, offs, mask, nranks: tl.constexpr, dtype: tl.constexpr):
    """The sum over every rank of elements ``offs`` of the window (``src_base``, ``src_stride``),
    accumulated in float32, peers in rank order (bitwise the same on every rank). The caller
    makes sure every rank wrote them first (a :func:`barrier`)."""
    acc = tl.zeros(offs.shape, tl.float32)
    for p in range(nranks):
        acc += tl.load(peer_ptr(src_base, src_stride, p, dtype) + offs, mask=mask).to(tl.float32)
    return acc


@triton.jit
def all_reduce_one_shot_kernel(
    src_base, src_stride, dst_base, dst_stride, n,
    signal_base, signal_stride, signal_words, abort_flag, rank,
    first_index, timeout_ns, status_ptr,
    nranks: tl.constexpr, BLOCK: tl.constexpr,
):
    """One-shot sum all-reduce of ``n`` float32 from window ``src`` into window ``dst`` (peers in
    rank order, accumulated in float32: bitwise the same on every rank). Program ``pid`` handles
    elements ``[pid * BLOCK, (pid + 1) * BLOCK)`` between an entry and an exit barrier on index
    ``first_index + pid`` (fingerprint: ``n``), so ``src`` may be rewritten and ``dst`` read once
    the kernel finished; it stores its status at ``status_ptr[pid]`` (``int32``)."""
    pid = tl.program_id(0)
    index = first_index + pid
    fp = n
    status = barrier(signal_base, signal_stride, signal_words, rank, nranks, index, fp, abort_flag, timeout_ns)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = (offs < n) & (status == 0)
    acc = all_reduce_tile(src_base, src_stride, offs, mask, nranks, tl.float32)
    tl.store(peer_ptr(dst_base, dst_stride, rank, tl.float32) + offs, acc, mask=mask)
    if status == 0:
        status = barrier(signal_base, signal_stride, signal_words, rank, nranks, index, fp, abort_flag, timeout_ns)
    tl.store(status_ptr.to(tl.pointer_type(tl.int32)) + pid, status)

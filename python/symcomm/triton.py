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

Waits are bounded: by ``max_spins`` polls (the interpreter has no clock) and by the abort flag
(``comm.abort()`` on any rank); they return a status (:data:`STATUS_OK`, :data:`STATUS_TIMEOUT`,
:data:`STATUS_ABORTED`, the C++ API's codes) instead of hanging.

Not yet: the barrier's call fingerprints and the fused kernels of issue 14.
"""

import triton
import triton.language as tl

#: Statuses of :func:`wait_until` (``SYMCOMM_STATUS_*``).
STATUS_OK = tl.constexpr(0)
STATUS_TIMEOUT = tl.constexpr(1)
STATUS_ABORTED = tl.constexpr(2)

#: Users' signal words are ``[0, USER_SIGNAL_END)``.
USER_SIGNAL_END = 64


def comm_args(comm):
    """``(signal_base, signal_stride, signal_words, abort_flag, rank, nranks)`` of ``comm``: the
    integers the helpers take, to splat into a kernel call."""
    h = comm.device_handle()
    return (h["signal_base"], h["signal_stride"], h["signal_words"], h["abort_flag"], h["rank"], h["nranks"])


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
def wait_until(signal_base, signal_stride, signal_words, rank, peer, word, value, abort_flag, max_spins):
    """Waits until this rank's word ``word`` written by ``peer`` is at least ``value``, reading
    it with acquire at system scope (what the peer stored before its release is visible after).
    Returns :data:`STATUS_OK`, :data:`STATUS_TIMEOUT` after ``max_spins`` polls, or
    :data:`STATUS_ABORTED` once the abort flag is set."""
    p = signal_ptr(signal_base, signal_stride, signal_words, rank, peer, word)
    abort = abort_flag.to(tl.pointer_type(tl.uint32))
    want = tl.cast(value, tl.uint64)
    cur = tl.atomic_add(p, tl.zeros((), tl.uint64), sem="acquire", scope="sys")
    status = 0
    spins = 0
    while (cur < want) & (status == 0):
        spins += 1
        if tl.atomic_add(abort, tl.zeros((), tl.uint32), sem="relaxed", scope="sys") != 0:
            status = 2
        elif spins >= max_spins:
            status = 1
        cur = tl.atomic_add(p, tl.zeros((), tl.uint64), sem="acquire", scope="sys")
    return status


@triton.jit
def barrier(signal_base, signal_stride, signal_words, rank, nranks: tl.constexpr, word, epoch, abort_flag, max_spins):
    """Program-scope barrier on users' word ``word``: this program of every rank arrives
    (``signal_add`` 1 to every rank) and waits until every rank's arrivals reach ``epoch`` (the
    number of barriers on this word so far, this one included). Returns the worst status."""
    for p in range(nranks):
        signal_add(signal_base, signal_stride, signal_words, rank, p, word, 1)
    status = 0
    for p in range(nranks):
        s = wait_until(signal_base, signal_stride, signal_words, rank, p, word, epoch, abort_flag, max_spins)
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
    epoch, max_spins, status_ptr,
    nranks: tl.constexpr, BLOCK: tl.constexpr,
):
    """One-shot sum all-reduce of ``n`` float32 from window ``src`` into window ``dst``: program
    ``pid`` handles elements ``[pid * BLOCK, (pid + 1) * BLOCK)`` behind a barrier on word
    ``pid`` (so at most 64 programs), and stores its wait status at ``status_ptr[pid]``. The
    caller orders calls: every rank's ``epoch`` is the call's number (1, 2, ...), and nothing
    overwrites ``src`` before every rank finished reading it (e.g. ``comm.barrier()``)."""
    pid = tl.program_id(0)
    status = barrier(signal_base, signal_stride, signal_words, rank, nranks, pid, epoch, abort_flag, max_spins)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = (offs < n) & (status == 0)
    acc = all_reduce_tile(src_base, src_stride, offs, mask, nranks, tl.float32)
    tl.store(peer_ptr(dst_base, dst_stride, rank, tl.float32) + offs, acc, mask=mask)
    tl.store(status_ptr.to(tl.pointer_type(tl.int32)) + pid, status)

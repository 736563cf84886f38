"""Fused communication + compute kernels in Triton over symmetric windows, built from
:mod:`symcomm.triton`'s helpers; each has an unfused reference in the tests
(``python/tests/test_triton_fused.py``).

- :func:`all_reduce_add_rmsnorm_kernel`: all-reduce of a block of rows, plus a residual, then
  RMSNorm (the decoder layer's epilogue; vLLM's ``fused_add_rms_norm`` after a tensor-parallel
  all-reduce).
- :func:`all_gather_matmul_kernel`: ``C = all_gather(A) @ B`` with ``A`` sharded by rows; each
  output tile waits only for the rank that owns its rows and reads that rank's shard in place
  (Triton-distributed's all-gather + GEMM, pull style).
- :func:`matmul_reduce_scatter_kernel`: ``C_r = block r of sum_p(A_p @ B_p)``; every rank writes
  its partial tiles into a window, and the owner of a block sums the peers' tiles once they
  arrived.

Arguments are plain integers (window handles, ``comm_args``, addresses of ordinary arrays);
statuses (:data:`symcomm.triton.STATUS_OK`, ...) go to ``status_ptr[pid]`` (``int32``), one per
program. Windows hold ``float32``.
"""

import triton
import triton.language as tl

from .triton import barrier, peer_ptr, signal_add, signal_set, wait_until


@triton.jit
def all_reduce_add_rmsnorm_kernel(
    x_base, x_stride, residual_ptr, weight_ptr, out_ptr, rows, eps,
    signal_base, signal_stride, signal_words, abort_flag, rank,
    first_index, timeout_ns, status_ptr,
    nranks: tl.constexpr, H: tl.constexpr,
):
    """For each row i of ``rows`` rows of ``H`` float32: ``r = sum over ranks of x[i] +
    residual[i]`` (peers in rank order, then the residual: bitwise the same on every rank),
    stored back into ``residual[i]``; ``out[i] = r * rsqrt(mean(r * r) + eps) * weight``.
    ``x`` is a window (this rank's input rows); ``residual``, ``weight`` and ``out`` are this
    rank's ordinary memory. Program ``pid`` takes rows ``pid, pid + grid, ...`` between an entry
    and an exit barrier on index ``first_index + pid`` (fingerprint: ``rows``)."""
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    index = first_index + pid
    status = barrier(signal_base, signal_stride, signal_words, rank, nranks, index, rows, abort_flag, timeout_ns)
    cols = tl.arange(0, H)
    res = residual_ptr.to(tl.pointer_type(tl.float32))
    out = out_ptr.to(tl.pointer_type(tl.float32))
    w = tl.load(weight_ptr.to(tl.pointer_type(tl.float32)) + cols)
    if status == 0:
        for row in range(pid, rows, progs):
            acc = tl.zeros((H,), tl.float32)
            for p in range(nranks):
                acc += tl.load(peer_ptr(x_base, x_stride, p, tl.float32) + row * H + cols)
            r = acc + tl.load(res + row * H + cols)
            tl.store(res + row * H + cols, r)
            ms = tl.sum(r * r, axis=0) / H
            tl.store(out + row * H + cols, r * tl.rsqrt(ms + eps) * w)
        status = barrier(signal_base, signal_stride, signal_words, rank, nranks, index, rows, abort_flag, timeout_ns)
    tl.store(status_ptr.to(tl.pointer_type(tl.int32)) + pid, status)


@triton.jit
def all_gather_matmul_kernel(
    a_base, a_stride, b_ptr, c_ptr, m_local,
    signal_base, signal_stride, signal_words, abort_flag, rank,
    word, call, timeout_ns, status_ptr,
    nranks: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    """``C (M x N) = A (M x K) @ B (K x N)`` where ``M = nranks * m_local`` and rank p's rows
    ``[p * m_local, (p + 1) * m_local)`` of ``A`` are its window ``a`` (its shard, written
    before the call). ``B`` and ``C`` are this rank's ordinary row-major memory. Every program
    first publishes this rank's shard (``signal_set`` of ``call`` on users' signal word ``word``
    to every rank: calls are numbered 1, 2, ...), then waits only for the rank owning its rows
    and reads its tile of that rank's shard in place. ``m_local`` is a multiple of ``BM``. The
    caller keeps the shard unchanged until every rank's call finished (e.g. ``comm.barrier()``)."""
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    for p in range(nranks):
        signal_set(signal_base, signal_stride, signal_words, rank, p, word, call)
    owner = (pm * BM) // m_local
    status = wait_until(signal_base, signal_stride, signal_words, rank, owner, word, call, abort_flag, timeout_ns)
    rows = (pm * BM - owner * m_local) + tl.arange(0, BM)
    cols = pn * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    a = peer_ptr(a_base, a_stride, owner, tl.float32)
    b = b_ptr.to(tl.pointer_type(tl.float32))
    acc = tl.zeros((BM, BN), tl.float32)
    if status == 0:
        for k in range(0, K, BK):
            ta = tl.load(a + rows[:, None] * K + (k + ks)[None, :])
            tb = tl.load(b + (k + ks)[:, None] * N + cols[None, :])
            acc += tl.dot(ta, tb)
        c = c_ptr.to(tl.pointer_type(tl.float32))
        tl.store(c + (pm * BM + tl.arange(0, BM))[:, None] * N + cols[None, :], acc)
    tl.store(status_ptr.to(tl.pointer_type(tl.int32)) + pm * tl.num_programs(1) + pn, status)


@triton.jit
def matmul_reduce_scatter_kernel(
    a_ptr, b_ptr, partial_base, partial_stride, out_base, out_stride, m_local,
    signal_base, signal_stride, signal_words, abort_flag, rank,
    word, call, timeout_ns, status_ptr,
    nranks: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    """``out`` (this rank's ``m_local x N`` window) = rows ``[rank * m_local, (rank + 1) *
    m_local)`` of ``sum over ranks p of A_p @ B_p`` (``A_p``: ``M x K``, ``B_p``: ``K x N``, each
    rank's ordinary memory; ``M = nranks * m_local``). Program (pm, pn) computes its partial
    tile into this rank's ``partial`` window (``M x N``) and counts it to the rank owning its rows
    (``signal_add`` 1 on users' signal word ``word``); the owner's program then waits until every
    other rank counted all of the block's tiles for this call (calls are numbered 1, 2, ...) and
    sums tile (pm, pn) over the ranks in rank order. Programs of a block's owner wait only for
    other ranks' programs, which wait for nothing. The caller keeps ``partial`` unchanged until
    every rank's call finished (e.g. ``comm.barrier()``)."""
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rows = pm * BM + tl.arange(0, BM)
    cols = pn * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    a = a_ptr.to(tl.pointer_type(tl.float32))
    b = b_ptr.to(tl.pointer_type(tl.float32))
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        ta = tl.load(a + rows[:, None] * K + (k + ks)[None, :])
        tb = tl.load(b + (k + ks)[:, None] * N + cols[None, :])
        acc += tl.dot(ta, tb)
    tile = rows[:, None] * N + cols[None, :]
    tl.store(peer_ptr(partial_base, partial_stride, rank, tl.float32) + tile, acc)
    owner = (pm * BM) // m_local
    signal_add(signal_base, signal_stride, signal_words, rank, owner, word, 1)
    status = 0
    if owner == rank:
        per_call = (m_local // BM) * tl.num_programs(1)
        for p in range(nranks):
            if p != rank:
                s = wait_until(signal_base, signal_stride, signal_words, rank, p, word, call * per_call, abort_flag, timeout_ns)
                status = tl.maximum(status, s)
        if status == 0:
            total = tl.zeros((BM, BN), tl.float32)
            for p in range(nranks):
                total += tl.load(peer_ptr(partial_base, partial_stride, p, tl.float32) + tile)
            local = (rows - rank * m_local)[:, None] * N + cols[None, :]
            tl.store(peer_ptr(out_base, out_stride, rank, tl.float32) + local, total)
    tl.store(status_ptr.to(tl.pointer_type(tl.int32)) + pm * tl.num_programs(1) + pn, status)

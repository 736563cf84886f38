"""Rank programs of the fused Triton kernels' tests, in Triton's interpreter on emulator windows:
``python fused_workers.py SCENARIO ...``. Each compares the fused kernel with its unfused
reference (the host collective, then numpy) and prints ``OK ... #wrong=0`` on success."""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402

import symcomm  # noqa: E402
from symcomm import triton as st  # noqa: E402
from symcomm import triton_fused as fused  # noqa: E402



def ints(shape, seed):
    """Small integer values as float32: every product and sum below is exact."""
    return (np.random.default_rng(seed).integers(0, 4, size=shape)).astype(np.float32)


def rmsnorm(rows, h):
    comm = symcomm.Communicator.from_env()
    n, r = comm.nranks, comm.rank
    x = comm.alloc_window((rows, h), "float32")
    np.from_dlpack(x)[:] = ints((rows, h), 10 + r)
    residual = ints((rows, h), 99)
    weight = np.linspace(0.5, 1.5, h, dtype=np.float32)
    # Unfused reference: the host all-reduce into a second window, then numpy.
    reduced = comm.alloc_window((rows, h), "float32")
    comm.all_reduce(x, reduced)
    ref_res = np.from_dlpack(reduced) + residual
    ref_out = ref_res / np.sqrt((ref_res * ref_res).mean(axis=1, keepdims=True) + np.float32(1e-6)) * weight
    out = np.zeros((rows, h), dtype=np.float32)
    grid = min(rows, 8)
    status = np.full(grid, -1, dtype=np.int32)
    sb, ss, sw, ab, timeout, _, _ = st.comm_args(comm)
    fused.all_reduce_add_rmsnorm_kernel[(grid,)](
        x.handle[0], x.handle[1], residual.ctypes.data, weight.ctypes.data, out.ctypes.data, rows, 1e-6,
        sb, ss, sw, ab, r, st.USER_BARRIER_FIRST.value, timeout, status.ctypes.data, nranks=n, H=h,
    )
    wrong = int((residual != ref_res).sum())  # the residual stream: bit for bit
    rel = float(np.max(np.abs(out - ref_out) / np.maximum(np.abs(ref_out), 1e-30)))
    wrong += int(rel > 4e-7 * h ** 0.5)
    bad = [s for s in status.tolist() if s != 0]
    print(f"OK rank {r} #wrong={wrong} max rel err {rel:.2e} statuses={bad}")
    return 0 if wrong == 0 and not bad else 7


def all_gather_matmul(m_local, k, nn):
    comm = symcomm.Communicator.from_env()
    n, r = comm.nranks, comm.rank
    a = comm.alloc_window((m_local, k), "float32")
    np.from_dlpack(a)[:] = ints((m_local, k), 20 + r)
    b = ints((k, nn), 7)
    c = np.zeros((n * m_local, nn), dtype=np.float32)
    # Unfused reference: the host all-gather, then numpy's matmul.
    gathered = np.zeros((n * m_local, k), dtype=np.float32)
    comm.all_gather(np.from_dlpack(a).copy(), gathered)
    ref = gathered @ b
    bm = bn = bk = 16
    grid = (n * m_local // bm, nn // bn)
    status = np.full(grid[0] * grid[1], -1, dtype=np.int32)
    sb, ss, sw, ab, timeout, _, _ = st.comm_args(comm)
    fused.all_gather_matmul_kernel[grid](
        a.handle[0], a.handle[1], b.ctypes.data, c.ctypes.data, m_local,
        sb, ss, sw, ab, r, 0, 1, timeout, status.ctypes.data,
        nranks=n, K=k, N=nn, BM=bm, BN=bn, BK=bk,
    )
    comm.barrier()  # the shards stay until every rank read them
    wrong = int((c != ref).sum())
    bad = [s for s in status.tolist() if s != 0]
    print(f"OK rank {r} #wrong={wrong} statuses={bad}")
    return 0 if wrong == 0 and not bad else 7


def matmul_reduce_scatter(m_local, k, nn):
    comm = symcomm.Communicator.from_env()
    n, r = comm.nranks, comm.rank
    m = n * m_local
    a, b = ints((m, k), 30 + r), ints((k, nn), 40 + r)
    partial = comm.alloc_window((m, nn), "float32")
    out = comm.alloc_window((m_local, nn), "float32")
    # Unfused reference: numpy's matmul, then the host reduce-scatter.
    ref = np.zeros((m_local, nn), dtype=np.float32)
    comm.reduce_scatter(a @ b, ref)
    bm = bn = bk = 16
    grid = (m // bm, nn // bn)
    status = np.full(grid[0] * grid[1], -1, dtype=np.int32)
    sb, ss, sw, ab, timeout, _, _ = st.comm_args(comm)
    fused.matmul_reduce_scatter_kernel[grid](
        a.ctypes.data, b.ctypes.data, partial.handle[0], partial.handle[1], out.handle[0], out.handle[1], m_local,
        sb, ss, sw, ab, r, 1, 1, timeout, status.ctypes.data,
        nranks=n, K=k, N=nn, BM=bm, BN=bn, BK=bk,
    )
    comm.barrier()  # the partial tiles stay until every owner summed them
    wrong = int((np.from_dlpack(out) != ref).sum())
    bad = [s for s in status.tolist() if s != 0]
    print(f"OK rank {r} #wrong={wrong} statuses={bad}")
    return 0 if wrong == 0 and not bad else 7


if __name__ == "__main__":
    scenario, args = sys.argv[1], [int(x) for x in sys.argv[2:]]
    scenarios = {"rmsnorm": rmsnorm, "all_gather_matmul": all_gather_matmul, "matmul_reduce_scatter": matmul_reduce_scatter}
    sys.exit(scenarios[scenario](*args))

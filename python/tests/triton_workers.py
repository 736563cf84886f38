"""Rank programs of the Triton tests, run in Triton's interpreter on emulator windows:
``python triton_workers.py SCENARIO ...`` (ranks as processes: the interpreter is not
thread-safe, and runs a rank's programs one after another). Prints ``OK ...`` on success."""

import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402

import symcomm  # noqa: E402
from symcomm import triton as st  # noqa: E402

BLOCK = 128


def run_kernel(comm, src, dst, count, timeout_ns=None):
    """One call of the one-shot kernel on windows ``src`` -> ``dst``; the programs' statuses."""
    signal_base, signal_stride, signal_words, abort_flag, timeout, r, n = st.comm_args(comm)
    grid = (count + BLOCK - 1) // BLOCK
    status = np.full(grid, -1, dtype=np.int32)
    st.all_reduce_one_shot_kernel[(grid,)](
        src.handle[0], src.handle[1], dst.handle[0], dst.handle[1], count,
        signal_base, signal_stride, signal_words, abort_flag, r,
        st.USER_BARRIER_FIRST.value, timeout if timeout_ns is None else timeout_ns, status.ctypes.data, nranks=n, BLOCK=BLOCK,
    )
    return status.tolist()


def all_reduce(count, calls):
    comm = symcomm.Communicator.from_env()
    n, r = comm.nranks, comm.rank
    src = comm.alloc_window(count, "float32")
    dst = comm.alloc_window(count, "float32")
    wrong, bad = 0, []
    for call in range(1, calls + 1):
        # Integer-valued inputs: the float32 sums are exact. The kernel's exit barrier lets each
        # rank rewrite its input right after its own call returned.
        np.from_dlpack(src)[:] = (np.arange(count) % 97 + call) * (r + 1)
        bad += [s for s in run_kernel(comm, src, dst, count) if s != 0]
        want = ((np.arange(count) % 97 + call) * sum(range(1, n + 1))).astype(np.float32)
        wrong += int((np.from_dlpack(dst) != want).sum())
    print(f"OK rank {r} #wrong={wrong} statuses={bad}")
    return 0 if wrong == 0 and not bad else 7


def missing_peer(timeout_ns):
    """Rank 1 never calls: rank 0's waits end with STATUS_TIMEOUT at the deadline (in the
    interpreter: a poll counts as INTERPRETER_POLL_NS)."""
    comm = symcomm.Communicator.from_env()
    src = comm.alloc_window(BLOCK, "float32")
    status = [0]
    if comm.rank == 0:
        start = time.monotonic()
        status = run_kernel(comm, src, src, BLOCK, timeout_ns)
        print(f"OK rank 0 status={status[0]} after {time.monotonic() - start:.2f} s")
    comm.barrier()
    return 0 if comm.rank != 0 or status == [1] else 1


def mismatch():
    """Ranks pass different counts (one program each): the barrier's fingerprints differ, and
    every rank gets STATUS_MISMATCH instead of a wrong result."""
    comm = symcomm.Communicator.from_env()
    src = comm.alloc_window(BLOCK, "float32")
    status = run_kernel(comm, src, src, BLOCK - comm.rank)
    print(f"OK rank {comm.rank} status={status[0]}")
    return 0 if status == [3] else 1


if __name__ == "__main__":
    scenario, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
    sys.exit({"all_reduce": all_reduce, "missing_peer": missing_peer, "mismatch": mismatch}[scenario](*args))

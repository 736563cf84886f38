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


def all_reduce(count, calls):
    comm = symcomm.Communicator.from_env()
    n, r = comm.nranks, comm.rank
    src = comm.alloc_window(count, "float32")
    dst = comm.alloc_window(count, "float32")
    sb, ss = src.handle[:2]
    db, ds = dst.handle[:2]
    signal_base, signal_stride, signal_words, abort_flag, _, _ = st.comm_args(comm)
    grid = (count + BLOCK - 1) // BLOCK
    status = np.zeros(grid, dtype=np.int32)
    wrong = 0
    for epoch in range(1, calls + 1):
        # Integer-valued inputs: the float32 sums are exact.
        np.from_dlpack(src)[:] = (np.arange(count) % 97 + epoch) * (r + 1)
        comm.barrier()
        st.all_reduce_one_shot_kernel[(grid,)](
            sb, ss, db, ds, count, signal_base, signal_stride, signal_words, abort_flag, r,
            epoch, 1 << 24, status.ctypes.data, nranks=n, BLOCK=BLOCK,
        )
        comm.barrier()  # nobody rewrites its input while a peer reads it
        want = ((np.arange(count) % 97 + epoch) * sum(range(1, n + 1))).astype(np.float32)
        wrong += int((np.from_dlpack(dst) != want).sum())
    bad = [s for s in status.tolist() if s != 0]
    print(f"OK rank {r} #wrong={wrong} statuses={bad}")
    return 0 if wrong == 0 and not bad else 7


def missing_peer(max_spins):
    """Rank 1 never calls: rank 0's waits end with STATUS_TIMEOUT, bounded."""
    comm = symcomm.Communicator.from_env()
    src = comm.alloc_window(BLOCK, "float32")
    signal_base, signal_stride, signal_words, abort_flag, r, n = st.comm_args(comm)
    status = np.zeros(1, dtype=np.int32)
    if r == 0:
        start = time.monotonic()
        st.all_reduce_one_shot_kernel[(1,)](
            src.handle[0], src.handle[1], src.handle[0], src.handle[1], BLOCK,
            signal_base, signal_stride, signal_words, abort_flag, r,
            1, max_spins, status.ctypes.data, nranks=n, BLOCK=BLOCK,
        )
        print(f"OK rank 0 status={status[0]} after {time.monotonic() - start:.2f} s")
    comm.barrier()
    return 0 if r != 0 or status[0] == 1 else 1


if __name__ == "__main__":
    scenario, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
    sys.exit({"all_reduce": all_reduce, "missing_peer": missing_peer}[scenario](*args))

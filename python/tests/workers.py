"""Rank programs of the process tests (``conftest.launch``): ``python workers.py SCENARIO ...``.

Each joins with ``Communicator.from_env()`` and prints one line ``OK ...`` on success.
"""

import os
import signal
import sys
import time

import numpy as np

import symcomm


def collectives(count):
    comm = symcomm.Communicator.from_env()
    n, r = comm.nranks, comm.rank
    w = comm.alloc_window(count, "int32")
    a = np.from_dlpack(w)
    a[:] = np.arange(count, dtype=np.int32) * (r + 1)
    comm.all_reduce(w)
    want = np.arange(count, dtype=np.int32) * sum(range(1, n + 1))
    wrong = int((a != want).sum())
    x = np.full(count, r, dtype=np.float64)
    y = np.zeros(count * n, dtype=np.float64)
    comm.all_gather(x, y)
    wrong += int((y != np.repeat(np.arange(n, dtype=np.float64), count)).sum())
    comm.barrier()
    # The device handle's table of ranks on other hosts: 0 when every rank is on this host.
    span = "hosts" if comm.device_handle()["ranks"] else "one host"
    print(f"OK rank {r} #wrong={wrong} across {span}")
    return 0 if wrong == 0 else 7


def peer_killed(victim):
    comm = symcomm.Communicator.from_env()
    w = comm.alloc_window(64, "float32")
    comm.all_reduce(w)
    if comm.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        for _ in range(10_000):
            comm.all_reduce(w)
            comm.barrier()
    except symcomm.PeerLost as e:
        print(f"OK rank {comm.rank} PeerLost after {time.monotonic() - start:.2f} s: {e}")
        return 0
    except symcomm.Error as e:
        print(f"rank {comm.rank}: {type(e).__name__}, not PeerLost: {e}")
        return 1
    print(f"rank {comm.rank}: no error although rank {victim} was killed")
    return 1


if __name__ == "__main__":
    scenario, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
    sys.exit({"collectives": collectives, "peer_killed": peer_killed}[scenario](*args))

"""Fixtures: ranks as threads of this process, and ranks as processes (workers.py)."""

import os
import subprocess
import sys
import threading

import pytest

import symcomm

HERE = os.path.dirname(os.path.abspath(__file__))
#: Bounds every run: a hang fails the test instead of CI.
TIMEOUT = 120


def run_threads(nranks, body):
    """Runs ``body(comm)`` on ``nranks`` ranks as threads (emulator); their results in order.

    Raises the first rank's exception, naming the rank.
    """
    uid = symcomm.UniqueId()
    results = [None] * nranks
    failures = [None] * nranks

    def rank(r):
        try:
            comm = symcomm.Communicator(symcomm.UniqueId.parse(str(uid)), r, nranks, device="emu")
            results[r] = body(comm)
        except BaseException as e:  # noqa: BLE001 - reported below, with the rank
            failures[r] = e

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(nranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
        if t.is_alive():
            raise AssertionError(f"a rank did not finish within {TIMEOUT} s")
    for r, e in enumerate(failures):
        if e is not None:
            raise AssertionError(f"rank {r}: {type(e).__name__}: {e}") from e
    return results


def launch(nranks, scenario, *args, env=None, script="workers.py", hosts=None):
    """Runs ``script scenario args...`` (``workers.py`` by default) as ``nranks`` processes (the
    torchrun variables and a fresh SYMCOMM_ID, on the emulator); returns the
    ``CompletedProcess`` of each rank. ``hosts``: rank r's simulated host (its SYMCOMM_HOST_ID,
    and LOCAL_RANK / LOCAL_WORLD_SIZE within it); one host by default."""
    uid = str(symcomm.UniqueId())
    hosts = hosts or ["py-host"] * nranks
    procs = []
    for r in range(nranks):
        e = dict(os.environ)
        e.update(
            SYMCOMM_ID=uid,
            SYMCOMM_DEVICE="emu",
            SYMCOMM_HOST_ID=hosts[r],
            RANK=str(r),
            WORLD_SIZE=str(nranks),
            LOCAL_RANK=str(hosts[:r].count(hosts[r])),
            LOCAL_WORLD_SIZE=str(hosts.count(hosts[r])),
        )
        e.update(env or {})
        procs.append(
            subprocess.Popen(
                [sys.executable, os.path.join(HERE, script), scenario, *map(str, args)],
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    done = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"{scenario}: a rank did not finish within {TIMEOUT} s")
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


@pytest.fixture
def threads():
    return run_threads

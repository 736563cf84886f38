"""symcomm.triton: compiled for sm_90 without a GPU (the PTX must hold the ordering forms), and
run for real in Triton's interpreter on emulator windows with ranks as processes."""

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from conftest import launch
from symcomm import triton as st

SIGNATURE = {
    "src_base": "i64", "src_stride": "i64", "dst_base": "i64", "dst_stride": "i64", "n": "i32",
    "signal_base": "i64", "signal_stride": "i64", "signal_words": "i32", "abort_flag": "i64",
    "rank": "i32", "epoch": "i64", "max_spins": "i32", "status_ptr": "i64",
    "nranks": "constexpr", "BLOCK": "constexpr",
}


def ptx_of(kernel, nranks=4):
    src = ASTSource(fn=kernel, signature=SIGNATURE, constexprs={"nranks": nranks, "BLOCK": 256})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


def ordering_problems(ptx, nranks):
    """What the PTX of a one-shot all-reduce lacks: one release arrival per peer at system
    scope, acquire polls at system scope, nothing relaxed but the abort flag's poll."""
    problems = []
    arrivals = ptx.count("atom.global.sys.release.add.u64")
    if arrivals != nranks:
        problems.append(f"{arrivals} release arrivals, want {nranks}")
    if "ld.global.sys.acquire.b64" not in ptx:
        problems.append("no acquire poll of the signal words")
    relaxed = [line.strip() for line in ptx.splitlines() if ".relaxed." in line]
    if any(".b32" not in line for line in relaxed):
        problems.append(f"relaxed accesses besides the abort flag's: {relaxed}")
    return problems


def test_compiles_for_sm90_with_release_arrivals_and_acquire_polls():
    ptx = ptx_of(st.all_reduce_one_shot_kernel)
    assert ".target sm_90" in ptx
    assert ordering_problems(ptx, 4) == []


# A planted ordering bug: arrivals without release (what the check above must catch).
@triton.jit
def _relaxed_signal_add(signal_base, signal_stride, signal_words, rank, peer, word, delta):
    p = st.signal_ptr(signal_base, signal_stride, signal_words, peer, rank, word)
    tl.atomic_add(p, tl.cast(delta, tl.uint64), sem="relaxed", scope="sys")


@triton.jit
def _planted_kernel(
    src_base, src_stride, dst_base, dst_stride, n,
    signal_base, signal_stride, signal_words, abort_flag, rank,
    epoch, max_spins, status_ptr,
    nranks: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    for p in range(nranks):
        _relaxed_signal_add(signal_base, signal_stride, signal_words, rank, p, pid, 1)
    status = 0
    for p in range(nranks):
        s = st.wait_until(signal_base, signal_stride, signal_words, rank, p, pid, epoch, abort_flag, max_spins)
        status = tl.maximum(status, s)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = (offs < n) & (status == 0)
    acc = st.all_reduce_tile(src_base, src_stride, offs, mask, nranks, tl.float32)
    tl.store(st.peer_ptr(dst_base, dst_stride, rank, tl.float32) + offs, acc, mask=mask)
    tl.store(status_ptr.to(tl.pointer_type(tl.int32)) + pid, status)


def test_a_planted_relaxed_arrival_is_caught():
    problems = ordering_problems(ptx_of(_planted_kernel), 4)
    assert problems and "release arrivals" in problems[0], problems


@pytest.mark.parametrize("nranks,count", [(2, 1000), (3, 257), (4, 1)])
def test_one_shot_all_reduce_in_the_interpreter(nranks, count):
    for r, p in enumerate(launch(nranks, "all_reduce", count, 2, script="triton_workers.py")):
        assert p.returncode == 0 and "#wrong=0 statuses=[]" in p.stdout, f"rank {r}: {p.stdout}{p.stderr[-2000:]}"


def test_a_missing_peer_times_out_instead_of_hanging():
    runs = launch(2, "missing_peer", 300, script="triton_workers.py")
    assert runs[0].returncode == 0 and "status=1" in runs[0].stdout, runs[0].stdout + runs[0].stderr[-2000:]
    assert runs[1].returncode == 0, runs[1].stderr[-2000:]


def test_the_gpu_check_script_on_the_emulator():
    """python/tests/gpu_check.py is what scripts/gpu-check runs on a GPU; here on the emulator
    (numpy views, the Triton kernel in the interpreter) so that it cannot rot."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run(
        [sys.executable, os.path.join(here, "gpu_check.py"), "--device", "emu", "--count", "3000"],
        capture_output=True, text=True, timeout=240,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("PASS python_") == 2 and "#wrong=0" in p.stdout, p.stdout

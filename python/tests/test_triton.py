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
    "rank": "i32", "first_index": "i32", "timeout_ns": "i64", "status_ptr": "i64",
    "nranks": "constexpr", "BLOCK": "constexpr",
}


def ptx_of(kernel, nranks=4):
    src = ASTSource(fn=kernel, signature=SIGNATURE, constexprs={"nranks": nranks, "BLOCK": 256})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


def ordering_problems(ptx, nranks):
    """What the PTX of the one-shot all-reduce lacks: per barrier (entry and exit) one release
    arrival per rank at system scope, acquire polls of the signal words at system scope, and
    nothing relaxed but reads (the abort flag's poll, the barrier's own epoch)."""
    problems = []
    arrivals = ptx.count("atom.global.sys.release.exch.b64")
    if arrivals != 2 * nranks:
        problems.append(f"{arrivals} release arrivals, want {2 * nranks}")
    if "ld.global.sys.acquire.b64" not in ptx:
        problems.append("no acquire poll of the signal words")
    writes = [line.strip() for line in ptx.splitlines() if ".relaxed." in line and "ld." not in line]
    if writes:
        problems.append(f"relaxed writes: {writes[:3]}")
    return problems


def test_compiles_for_sm90_with_release_arrivals_and_acquire_polls():
    ptx = ptx_of(st.all_reduce_one_shot_kernel)
    assert ".target sm_90" in ptx
    assert "%globaltimer" in ptx, "the waits' deadline reads no clock"
    assert ordering_problems(ptx, 4) == []


def test_a_planted_relaxed_arrival_is_caught(tmp_path):
    """The planted ordering bug (arrivals without release), applied to a copy of the module as
    the C++ suite's planted bugs are: the PTX check must catch it."""
    import importlib.util
    import sys

    source = open(st.__file__).read()
    arrival = 'word), mine, sem="release", scope="sys")'
    assert source.count(arrival) == 1, "the planted bug no longer applies: update it"
    planted = tmp_path / "symcomm_planted_triton.py"
    planted.write_text(source.replace(arrival, 'word), mine, sem="relaxed", scope="sys")').replace("from . import _symcomm", "from symcomm import _symcomm"))
    spec = importlib.util.spec_from_file_location("symcomm_planted_triton", planted)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    problems = ordering_problems(ptx_of(module.all_reduce_one_shot_kernel), 4)
    assert problems and "release arrivals" in problems[0], problems


@pytest.mark.parametrize("nranks,count", [(2, 1000), (3, 257), (4, 1)])
def test_one_shot_all_reduce_in_the_interpreter(nranks, count):
    for r, p in enumerate(launch(nranks, "all_reduce", count, 2, script="triton_workers.py")):
        assert p.returncode == 0 and "#wrong=0 statuses=[]" in p.stdout, f"rank {r}: {p.stdout}{p.stderr[-2000:]}"


def test_mismatched_calls_fail_on_every_rank():
    for r, p in enumerate(launch(2, "mismatch", script="triton_workers.py")):
        assert p.returncode == 0 and "status=3" in p.stdout, f"rank {r}: {p.stdout}{p.stderr[-2000:]}"


def test_a_missing_peer_times_out_instead_of_hanging():
    runs = launch(2, "missing_peer", 30_000_000, script="triton_workers.py")
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

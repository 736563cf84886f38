"""symcomm.triton_fused: each fused kernel against its unfused reference (the host collective,
then numpy) in Triton's interpreter on emulator windows, ranks as processes; and compiled for
sm_90 without a GPU."""

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from conftest import launch
from symcomm import triton_fused as fused


def run(nranks, scenario, *args):
    for r, p in enumerate(launch(nranks, scenario, *args, script="fused_workers.py")):
        assert p.returncode == 0 and "#wrong=0" in p.stdout and "statuses=[]" in p.stdout, (
            f"rank {r}: {p.stdout}{p.stderr[-3000:]}"
        )


@pytest.mark.parametrize("nranks", [2, 3])
def test_all_reduce_add_rmsnorm(nranks):
    run(nranks, "rmsnorm", 5, 64)


@pytest.mark.parametrize("nranks", [2, 4])
def test_all_gather_matmul(nranks):
    run(nranks, "all_gather_matmul", 32, 32, 32)


@pytest.mark.parametrize("nranks", [2, 3])
def test_matmul_reduce_scatter(nranks):
    run(nranks, "matmul_reduce_scatter", 32, 32, 32)


COMM = {"signal_base": "i64", "signal_stride": "i64", "signal_words": "i32", "abort_flag": "i64", "rank": "i32"}


def compile_ptx(kernel, signature, constexprs):
    src = ASTSource(fn=kernel, signature={**signature, **{k: "constexpr" for k in constexprs}}, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


def test_fused_kernels_compile_for_sm90_with_their_ordering():
    tiles = {"nranks": 4, "K": 64, "N": 64, "BM": 64, "BN": 64, "BK": 32}
    cases = [
        (fused.all_reduce_add_rmsnorm_kernel,
         {"x_base": "i64", "x_stride": "i64", "residual_ptr": "i64", "weight_ptr": "i64", "out_ptr": "i64",
          "rows": "i32", "eps": "fp32", **COMM, "first_index": "i32", "timeout_ns": "i64", "status_ptr": "i64"},
         {"nranks": 4, "H": 1024}, "atom.global.sys.release.exch.b64"),
        (fused.all_gather_matmul_kernel,
         {"a_base": "i64", "a_stride": "i64", "b_ptr": "i64", "c_ptr": "i64", "m_local": "i32", **COMM,
          "word": "i32", "call": "i64", "timeout_ns": "i64", "status_ptr": "i64"},
         tiles, "atom.global.sys.release.exch.b64"),
        (fused.matmul_reduce_scatter_kernel,
         {"a_ptr": "i64", "b_ptr": "i64", "partial_base": "i64", "partial_stride": "i64", "out_base": "i64",
          "out_stride": "i64", "m_local": "i32", **COMM, "word": "i32", "call": "i64", "timeout_ns": "i64",
          "status_ptr": "i64"},
         tiles, "atom.global.sys.release.add.u64"),
    ]
    for kernel, signature, constexprs, arrival in cases:
        ptx = compile_ptx(kernel, signature, constexprs)
        assert arrival in ptx, f"{kernel.__name__}: no {arrival}"
        assert "ld.global.sys.acquire.b64" in ptx, f"{kernel.__name__}: no acquire poll"

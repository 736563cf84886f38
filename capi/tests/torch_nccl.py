"""PyTorch's ``nccl`` backend on symcomm-nccl (the GPU step of ``scripts/gpu-check``).

Run by torchrun with ``LD_PRELOAD=<libsymcomm_nccl.so>`` (SONAME ``libnccl.so.2``), every rank on
the same GPU (``--device``, default cuda:0), which NCCL itself refuses::

    LD_PRELOAD=.gpu/libnccl.so.2 python3 -m torch.distributed.run --standalone \\
        --nproc-per-node 4 capi/tests/torch_nccl.py

Each rank checks, bit for bit, on values whose results are exact: ``all_reduce`` (float32 sum,
int64 max, bfloat16 sum), ``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``broadcast``,
``all_to_all_single``, ``send``/``recv`` in a ring (``batch_isend_irecv``: a group) and a
``new_group`` of the even ranks (``ncclCommSplit``); then times all-reduce at a few sizes
(CUDA events, nccl-tests' algbw / busbw). It first checks that the NCCL torch calls is ours: the
runtime version (``ncclGetVersion`` of the library torch's NCCL symbols bound to) is
symcomm-nccl's 2.21.5, not the wheel's (``torch.cuda.nccl.version()`` is the version torch was
built against, a constant: it cannot tell). Exit status 0 when every check passed on every rank.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

SYMCOMM_NCCL_VERSION = (2, 21, 5)


def runtime_nccl_version():
    """The version of the NCCL library torch's calls go to (``ncclGetVersion`` now), unlike
    ``torch.cuda.nccl.version()``, which is the version torch was compiled against."""
    try:
        return tuple(dist.ProcessGroupNCCL.get_runtime_nccl_version())
    except AttributeError:  # an older torch: ask the libnccl.so.2 the process has bound
        import ctypes

        v = ctypes.c_int()
        ctypes.CDLL("libnccl.so.2").ncclGetVersion(ctypes.byref(v))
        return (v.value // 10000, v.value // 100 % 100, v.value % 100)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--count", type=int, default=(1 << 20) + 3, help="elements per rank")
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device(args.device)
    torch.cuda.set_device(dev)
    wrong = {}

    version = runtime_nccl_version()
    if tuple(version)[:3] != SYMCOMM_NCCL_VERSION:
        print(f"rank {rank}: torch calls NCCL {version} at run time, not symcomm-nccl "
              f"{SYMCOMM_NCCL_VERSION}: LD_PRELOAD did not take", flush=True)
        return 1

    t0 = time.perf_counter()
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    init_s = time.perf_counter() - t0

    def check(name, got, want):
        wrong[name] = int((got != want).sum().item())

    n = args.count
    i = torch.arange(n, device=dev)
    w = world

    # all_reduce, float32 sum (in place): (rank + 1) * (i % 7) summed.
    x = ((rank + 1) * (i % 7)).float()
    dist.all_reduce(x)
    check("all_reduce f32 sum", x, ((i % 7) * (w * (w + 1) // 2)).float())
    # int64 max
    y = (rank * 3 + i % 5).long()
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    check("all_reduce i64 max", y, ((w - 1) * 3 + i % 5).long())
    # bfloat16 sum of small integers (exact)
    z = ((rank + 1) * (i % 3)).to(torch.bfloat16)
    dist.all_reduce(z)
    check("all_reduce bf16 sum", z, ((i % 3) * (w * (w + 1) // 2)).to(torch.bfloat16))

    # all_gather_into_tensor: block r holds rank r's r * 1000 + i % 1000.
    inp = (rank * 1000 + i % 1000).float()
    out = torch.full((w * n,), -1.0, device=dev)
    dist.all_gather_into_tensor(out, inp)
    j = torch.arange(w * n, device=dev)
    check("all_gather_into_tensor", out, ((j // n) * 1000 + (j % n) % 1000).float())

    # reduce_scatter_tensor: block b of rank r is (r + 1) * (b + 1) + i % 3; rank r gets block r.
    inp = ((rank + 1) * (j // n + 1) + (j % n) % 3).float()
    out = torch.full((n,), -1.0, device=dev)
    dist.reduce_scatter_tensor(out, inp)
    check("reduce_scatter_tensor", out, ((rank + 1) * (w * (w + 1) // 2) + w * (i % 3)).float())

    # broadcast from the last rank
    root = w - 1
    b = (i * 2 + 1).float() if rank == root else torch.full((n,), -1.0, device=dev)
    dist.broadcast(b, src=root)
    check("broadcast", b, (i * 2 + 1).float())

    # all_to_all_single: block k of rank r is r * 100 + k; rank r receives k * 100 + r from k.
    per = n // w
    k = torch.arange(w * per, device=dev) // per
    inp = (rank * 100 + k).int()
    out = torch.full((w * per,), -1, dtype=torch.int32, device=dev)
    dist.all_to_all_single(out, inp)
    check("all_to_all_single", out, (k * 100 + rank).int())

    # send / recv ring as one group (batch_isend_irecv)
    nxt, prv = (rank + 1) % w, (rank + w - 1) % w
    s = (rank * 10 + i).float()
    r = torch.full((n,), -1.0, device=dev)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, s, nxt), dist.P2POp(dist.irecv, r, prv)])
    for q in reqs:
        q.wait()
    check("send/recv ring", r, (prv * 10 + i).float())
    # plain send / recv between ranks 0 and 1
    if w > 1 and rank < 2:
        t = (i + 7 * rank).float()
        if rank == 0:
            dist.send(t, dst=1)
        else:
            got = torch.empty(n, device=dev)
            dist.recv(got, src=0)
            check("send/recv", got, i.float())

    # a subgroup of the even ranks (ncclCommSplit of the default communicator)
    evens = list(range(0, w, 2))
    g = dist.new_group(evens)
    if rank in evens:
        e = torch.full((n,), float(rank), device=dev)
        dist.all_reduce(e, group=g)
        check("new_group all_reduce", e, torch.full((n,), float(sum(evens)), device=dev))
    torch.cuda.synchronize()

    # all-reduce timings (float32 sum, in place), as nccl-tests reports them
    lines = []
    for nbytes in (8 << 10, 1 << 20, 64 << 20):
        buf = torch.ones(nbytes // 4, device=dev)
        for _ in range(3):
            dist.all_reduce(buf)
        iters = 20
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        start.record()
        for _ in range(iters):
            dist.all_reduce(buf)
        end.record()
        end.synchronize()
        us = start.elapsed_time(end) * 1e3 / iters
        algbw = nbytes / us / 1e3
        lines.append(f"{nbytes:>10} B  {us:10.1f} us  algbw {algbw:7.2f} GB/s  "
                     f"busbw {algbw * 2 * (w - 1) / w:7.2f} GB/s")

    total = sum(wrong.values())
    flags = torch.tensor([total], device=dev, dtype=torch.int64)
    dist.all_reduce(flags)
    if rank == 0:
        print(f"torch {torch.__version__}, NCCL {version} (symcomm-nccl), {w} ranks on {dev}, "
              f"init {init_s:.2f} s", flush=True)
        for name, count in wrong.items():
            print(f"  {name:28} #wrong {count}", flush=True)
        print("  all_reduce timings (rank 0):", flush=True)
        for line in lines:
            print("   ", line, flush=True)
        print(f"torch_nccl: {'PASS' if flags.item() == 0 else 'FAIL'} "
              f"(#wrong over every rank {flags.item()})", flush=True)
    elif total:
        print(f"rank {rank}: {wrong}", flush=True)
    dist.destroy_process_group()
    return 0 if flags.item() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

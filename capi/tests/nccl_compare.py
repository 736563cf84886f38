"""NCCL's own all-reduce against symcomm's, two ranks on one GPU (a ``scripts/gpu-check`` step).

Two modes::

    # NCCL (the one PyTorch ships), 2 ranks on GPU 0: NCCL >= 2.30 allows that with
    # NCCL_MULTI_RANK_GPU_ENABLE=1 (set here); older ones refuse ("Duplicate GPU detected")
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 nccl_compare.py sweep \\
        --out nccl.json
    # the same sweep through symcomm, then the ratios row by row
    symcomm perf all_reduce -t 2 -b 8 -e 256M -f 2 -n 20 -w 5 --json > symcomm.json
    python3 nccl_compare.py ratios nccl.json symcomm.json

``sweep`` writes what ``symcomm perf --json`` writes (``{"rows": [{"size", "count", "in_place":
{"time_us", "algbw", "busbw", "wrong"}}], ...}``) for float32 sum, in place (torch's all_reduce
is in place): sizes 8 B .. 256 MB doubling, 5 warm-up and 20 timed calls per size between CUDA
events, the ranks' times averaged (nccl-tests' default); then one call on fresh inputs whose sum
is exact, compared element for element (``wrong``). With an NCCL older than 2.30 it writes
``{"unavailable": reason}`` and exits 0: there is nothing to compare with on one GPU.

``ratios`` prints, per size both files have, both times and symcomm's speed relative to the
reference (reference time / symcomm time: above 1, symcomm is faster), then the geometric mean
over the sizes up to 64 KB and from 1 MB. It reads any two documents of that format (the CPU
tests run it on two ``symcomm perf --json`` sweeps of the emulator). Exit status 0 when both
have rows without wrong elements, or the reference is unavailable; 1 otherwise.
"""

import argparse
import json
import math
import os
import sys

MIN_NCCL = (2, 30)


def sweep(args):
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # The library torch's NCCL calls go to (a newer libnccl.so.2 may be preloaded), not the
    # version torch was built against (torch.cuda.nccl.version(), a constant).
    try:
        version = tuple(dist.ProcessGroupNCCL.get_runtime_nccl_version())[:3]
    except AttributeError:
        version = tuple(torch.cuda.nccl.version())[:3]
    vtext = ".".join(map(str, version))
    if version[:2] < MIN_NCCL:
        if rank == 0:
            reason = (f"NCCL {vtext} (torch {torch.__version__}) is older than 2.30: it refuses "
                      f"several ranks on one GPU, so there is no NCCL figure to compare with")
            with open(args.out, "w") as f:
                json.dump({"unavailable": reason, "nccl_version": vtext}, f)
            print(f"nccl_compare: {reason}", flush=True)
        return 0
    os.environ.setdefault("NCCL_MULTI_RANK_GPU_ENABLE", "1")
    dev = torch.device(args.device)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)

    max_bytes = args.max_bytes
    buf = torch.ones(max_bytes // 4, device=dev)
    rows = []
    size = 8
    while size <= max_bytes:
        count = size // 4
        x = buf[:count]
        for _ in range(args.warmup):
            dist.all_reduce(x)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        start.record()
        for _ in range(args.iters):
            dist.all_reduce(x)
        end.record()
        end.synchronize()
        us = torch.tensor([start.elapsed_time(end) * 1e3 / args.iters], device=dev)
        dist.all_reduce(us)
        us = us.item() / world
        # Exact check: (rank + 1) * (i % 7) summed over the ranks.
        i = torch.arange(count, device=dev)
        y = ((rank + 1) * (i % 7)).float()
        dist.all_reduce(y)
        wrong = torch.tensor([int((y != ((i % 7) * (world * (world + 1) // 2)).float()).sum())],
                             device=dev, dtype=torch.int64)
        dist.all_reduce(wrong)
        algbw = size / us / 1e3
        rows.append({"size": size, "count": count, "type": "float", "redop": "sum",
                     "in_place": {"time_us": us, "algbw": algbw,
                                  "busbw": algbw * 2 * (world - 1) / world,
                                  "wrong": int(wrong.item())}})
        size *= 2
    if rank == 0:
        doc = {"collective": "all_reduce", "nranks": world, "backend": f"NCCL {vtext}",
               "nccl_version": vtext, "torch": torch.__version__, "rows": rows}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"nccl_compare: NCCL {vtext}, {world} ranks on {dev}: {len(rows)} sizes written "
              f"to {args.out}", flush=True)
    dist.destroy_process_group()
    return 0


def in_place_times(doc, name):
    """{size: (time_us, wrong)} of a document's in-place column."""
    rows = doc.get("rows")
    if not isinstance(rows, list) or not rows:
        raise SystemExit(f"nccl_compare: {name} has no rows")
    out = {}
    for row in rows:
        t = row.get("in_place") or {}
        if "time_us" not in t:
            raise SystemExit(f"nccl_compare: {name}: a row without in_place.time_us: {row}")
        out[int(row["size"])] = (float(t["time_us"]), t.get("wrong"))
    return out


def ratios(args):
    with open(args.reference) as f:
        ref_doc = json.load(f)
    if "unavailable" in ref_doc:
        print(f"nccl_compare: no comparison: {ref_doc['unavailable']}")
        return 0
    with open(args.symcomm) as f:
        sym_doc = json.load(f)
    ref, sym = in_place_times(ref_doc, args.reference), in_place_times(sym_doc, args.symcomm)
    sizes = sorted(set(ref) & set(sym))
    if not sizes:
        raise SystemExit("nccl_compare: the two sweeps have no size in common")
    ref_name = ref_doc.get("backend", args.reference)
    print(f"# all_reduce float sum in place, {sym_doc.get('nranks')} ranks: symcomm "
          f"({sym_doc.get('backend', '?')}) against {ref_name}")
    print(f"# {'size':>12} {'reference':>12} {'symcomm':>12} {'speed':>8} {'#wrong':>12}")
    print(f"# {'(B)':>12} {'(us)':>12} {'(us)':>12} {'(x)':>8} {'(ref/sym)':>12}")
    small, large, bad = [], [], 0
    for s in sizes:
        (rt, rw), (st, sw) = ref[s], sym[s]
        speed = rt / st if st > 0 else float("inf")
        bad += int(rw or 0) + int(sw or 0)
        if s <= 64 << 10:
            small.append(speed)
        if s >= 1 << 20:
            large.append(speed)
        print(f"  {s:>12} {rt:>12.2f} {st:>12.2f} {speed:>8.3f} {f'{rw}/{sw}':>12}")

    def gmean(v):
        return math.exp(sum(math.log(x) for x in v) / len(v)) if v else float("nan")

    print(f"# speed symcomm / reference (reference time / symcomm time), geometric mean: "
          f"{gmean(small):.3f} up to 64 KB, {gmean(large):.3f} from 1 MB")
    if bad:
        print(f"nccl_compare: {bad} wrong elements")
        return 1
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("sweep", help="NCCL's all-reduce sweep (run under torchrun)")
    s.add_argument("--out", required=True)
    s.add_argument("--device", default="cuda:0")
    s.add_argument("--max-bytes", type=int, default=256 << 20)
    s.add_argument("--warmup", type=int, default=5)
    s.add_argument("--iters", type=int, default=20)
    r = sub.add_parser("ratios", help="symcomm's times against the reference's")
    r.add_argument("reference")
    r.add_argument("symcomm")
    args = p.parse_args()
    return sweep(args) if args.mode == "sweep" else ratios(args)


if __name__ == "__main__":
    sys.exit(main())

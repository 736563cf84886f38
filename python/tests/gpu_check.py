"""The Python package's GPU check (run by ``scripts/gpu-check run`` on the GPU machine, with
``--device cuda:0``; pytest runs it with ``--device emu`` so that it cannot rot).

For 2 and 4 ranks as processes on one device: windows viewed through DLPack (``torch.from_dlpack``
on the GPU, ``numpy.from_dlpack`` on the emulator), the host all-reduce on a window and an
all-gather of ordinary tensors / arrays, and ``symcomm.triton``'s one-shot all-reduce kernel
(compiled for the GPU; on the emulator in Triton's interpreter), all checked bit for bit, with
the time per call of the Triton kernel and of the host all-reduce on the same window. Prints one
``PASS`` / ``FAIL`` line per rank count and exits non-zero on any failure.

    python gpu_check.py [--device cuda:0|emu]
"""

import argparse
import os
import subprocess
import sys
import time

LIMIT_S = 240


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--rank-of", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=1 << 20)
    args = ap.parse_args()
    if args.rank_of is not None:
        return rank_main(args.device, args.count)
    import symcomm

    failed = 0
    for nranks in (2, 4):
        uid = str(symcomm.UniqueId())
        procs = []
        for r in range(nranks):
            env = dict(os.environ, SYMCOMM_ID=uid, SYMCOMM_DEVICE=args.device, RANK=str(r),
                       WORLD_SIZE=str(nranks), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(nranks))
            if args.device == "emu":
                env["TRITON_INTERPRET"] = "1"
            cmd = [sys.executable, os.path.abspath(__file__), "--device", args.device,
                   "--rank-of", str(nranks), "--count", str(args.count)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = []
        for p in procs:
            try:
                outs.append((p.wait(LIMIT_S), p.stdout.read()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                outs.append((124, f"no result within {LIMIT_S} s"))
        ok = all(rc == 0 for rc, _ in outs)
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} python_{nranks}_ranks {args.device}: " + " | ".join(o.strip().replace("\n", " / ") for _, o in outs))
    return 1 if failed else 0


def rank_main(device, count):
    import numpy as np

    import symcomm
    from symcomm import triton as st

    gpu = device != "emu"
    if gpu:
        import torch

        torch.cuda.set_device(0)
        view = torch.from_dlpack

        def host(t):
            return t.cpu().numpy()

        def sync():
            torch.cuda.synchronize()

        def zeros(n, dtype):
            return torch.zeros(n, dtype=getattr(torch, dtype), device="cuda")
    else:
        view = np.from_dlpack

        def host(t):
            return np.asarray(t)

        def sync():
            pass

        def zeros(n, dtype):
            return np.zeros(n, dtype=dtype)

    comm = symcomm.Communicator.from_env()
    n, r = comm.nranks, comm.rank
    inputs = (np.arange(count) % 251 + 1).astype(np.float32)
    want = inputs * sum(range(1, n + 1))
    src, dst = comm.alloc_window(count, "float32"), comm.alloc_window(count, "float32")
    s, d = view(src), view(dst)

    def fill():
        s[:] = (torch.from_numpy(inputs).cuda() if gpu else inputs) * (r + 1)
        sync()

    # Host all-reduce, out of place on windows, and its time per call.
    fill()
    comm.all_reduce(src, dst)
    wrong = int((host(d) != want).sum())
    iters = 10 if gpu else 1
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        comm.all_reduce(src, dst)
    host_us = (time.perf_counter() - t0) / iters * 1e6
    # All-gather of ordinary tensors (staged through the windows).
    x = zeros(1000, "int32")
    x[:] = r
    y = zeros(1000 * n, "int32")
    comm.all_gather(x, y)
    wrong += int((host(y) != np.repeat(np.arange(n, dtype=np.int32), 1000)).sum())
    # The Triton one-shot all-reduce on the same windows.
    signal_base, signal_stride, signal_words, abort_flag, timeout, _, _ = st.comm_args(comm)
    block = 4096 if gpu else 256
    # One users' barrier index per program (59 of them).
    tcount = min(count, 32 * block)
    grid = (tcount + block - 1) // block
    status = zeros(grid, "int32")
    status_ptr = status.data_ptr() if gpu else status.ctypes.data
    d[:] = 0
    sync()
    t_us = 0.0
    # Call 0 warms up (compiles the kernel); the others are timed.
    for call in range(iters + 1):
        comm.barrier()
        if call == 1:
            t_us = 0.0
        t0 = time.perf_counter()
        st.all_reduce_one_shot_kernel[(grid,)](
            src.handle[0], src.handle[1], dst.handle[0], dst.handle[1], tcount,
            signal_base, signal_stride, signal_words, abort_flag, r,
            st.USER_BARRIER_FIRST.value, timeout, status_ptr, nranks=n, BLOCK=block,
        )
        sync()
        t_us += (time.perf_counter() - t0) * 1e6
    comm.barrier()
    got = host(d)[:tcount]
    twrong = int((got != want[:tcount]).sum())
    bad = [v for v in host(status).tolist() if v != 0]
    print(f"rank {r}: host all_reduce {count} f32 {host_us:.1f} us, #wrong={wrong}; "
          f"triton one-shot {tcount} f32 {t_us / iters:.1f} us, #wrong={twrong}, statuses={bad}")
    return 0 if wrong == 0 and twrong == 0 and not bad else 7


if __name__ == "__main__":
    sys.exit(main())

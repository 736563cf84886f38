"""The Python package's GPU check (run by ``scripts/gpu-check run`` on the GPU machine, with
``--device cuda:0``; pytest runs it with ``--device emu`` so that it cannot rot).

For 2 and 4 ranks as processes on one device: windows viewed through DLPack (``torch.from_dlpack``
on the GPU, ``numpy.from_dlpack`` on the emulator), the host all-reduce on a window and an
all-gather of ordinary tensors / arrays, ``symcomm.triton``'s one-shot all-reduce kernel and
``symcomm.triton_fused``'s three fused kernels against their unfused references (compiled for
the GPU; on the emulator in Triton's interpreter), all checked bit for bit (the RMSNorm output
within a few ulps), with the time per call of each kernel and of the host collective. Prints one
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

        def dev(a):
            return torch.from_numpy(np.ascontiguousarray(a)).cuda()

        def addr(t):
            return t.data_ptr()
    else:
        view = np.from_dlpack

        def host(t):
            return np.asarray(t)

        def sync():
            pass

        def zeros(n, dtype):
            return np.zeros(n, dtype=dtype)

        def dev(a):
            return np.array(a, dtype=a.dtype, order="C", copy=True)  # a copy, as on the GPU

        def addr(t):
            return t.ctypes.data

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
    wrong, where = mismatches("host all_reduce", host(d), want)
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
    w, at = mismatches("all_gather", host(y), np.repeat(np.arange(n, dtype=np.int32), 1000))
    wrong, where = wrong + w, where + at
    # The Triton one-shot all-reduce on the same windows.
    signal_base, signal_stride, signal_words, abort_flag, timeout, _, _ = st.comm_args(comm)
    block = 4096 if gpu else 256
    # One users' barrier index per program (47 of them).
    tcount = min(count, 32 * block)
    grid = (tcount + block - 1) // block
    status = zeros(grid, "int32")
    status[:] = -1  # a program that never stores its status shows as -1, not as OK (0)
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
    twrong, at = mismatches("triton one-shot", host(d)[:tcount], want[:tcount], block)
    where += at
    bad = [v for v in host(status).tolist() if v != 0]
    fwrong, fused_text = fused_checks(comm, gpu, view, host, sync, dev, addr, timeout)
    print(f"rank {r}: host all_reduce {count} f32 {host_us:.1f} us, #wrong={wrong}; "
          f"triton one-shot {tcount} f32 {t_us / iters:.1f} us, #wrong={twrong}, statuses={bad}; {fused_text}"
          + "".join(f"; {line}" for line in where))
    return 0 if wrong == 0 and twrong == 0 and not bad and fwrong == 0 else 7


def mismatches(what, got, want, block=None):
    """The number of elements of ``got`` that differ from ``want``, and, when some do, a line
    that says where (the first few indices with their values, and with ``block`` the programs
    that hold them) so that a failure on the GPU tells more than a count."""
    import numpy as np

    bad = np.flatnonzero(got != want)
    if bad.size == 0:
        return 0, []
    first = ", ".join(f"[{i}] {got[i]} (want {want[i]})" for i in bad[:4])
    text = f"{what}: {bad.size} wrong of {got.size}, first {first}, last [{bad[-1]}]"
    if block is not None:
        programs = np.unique(bad // block)
        text += f", in {programs.size} programs: {programs[:16].tolist()}"
    return int(bad.size), [text]


def fused_checks(comm, gpu, view, host, sync, dev, addr, timeout):
    """``symcomm.triton_fused``'s kernels against their unfused references (the host collective,
    then the computation), bit for bit where the values are exact (integer-valued inputs; the
    RMSNorm output within a few ulps), each timed against its reference."""
    import numpy as np

    from symcomm import triton as st
    from symcomm import triton_fused as fused

    n, r = comm.nranks, comm.rank
    sb, ss, sw, ab, _, _, _ = st.comm_args(comm)
    rng = np.random.default_rng(5 + r)

    def ints(shape, seed=None):
        g = rng if seed is None else np.random.default_rng(seed)
        return g.integers(0, 4, size=shape).astype(np.float32)

    def timed(f):
        comm.barrier()
        sync()
        t0 = time.perf_counter()
        out = f()
        sync()
        return out, (time.perf_counter() - t0) * 1e6

    def warm_then_timed(launch, reset=lambda: None):
        """Call 1 compiles the kernel (untimed), call 2 is timed; `reset` restores inputs."""
        timed(lambda: launch(1))
        comm.barrier()
        reset()
        return timed(lambda: launch(2))[1]

    wrong, parts = 0, []
    # All-reduce + residual + RMSNorm.
    rows, h = (64, 1024) if gpu else (5, 64)
    x = comm.alloc_window((rows, h), "float32")
    view(x)[:] = dev(ints((rows, h)))
    residual0, weight = ints((rows, h), 99), np.linspace(0.5, 1.5, h, dtype=np.float32)
    reduced = comm.alloc_window((rows, h), "float32")
    _, ref_us = timed(lambda: comm.all_reduce(x, reduced))
    ref_res = host(view(reduced)) + residual0
    ref_out = ref_res / np.sqrt((ref_res * ref_res).mean(axis=1, keepdims=True) + np.float32(1e-6)) * weight
    res, w, out = dev(residual0), dev(weight), dev(np.zeros((rows, h), np.float32))
    grid = min(rows, 32)
    status = dev(np.full(grid, -1, np.int32))
    def reset_residual():
        res[:] = dev(residual0)
        sync()

    us = warm_then_timed(lambda call: fused.all_reduce_add_rmsnorm_kernel[(grid,)](
        x.handle[0], x.handle[1], addr(res), addr(w), addr(out), rows, 1e-6,
        sb, ss, sw, ab, r, st.USER_BARRIER_FIRST.value, timeout, addr(status), nranks=n, H=h), reset_residual)
    rel = float(np.max(np.abs(host(out) - ref_out) / np.maximum(np.abs(ref_out), 1e-30)))
    bad = int((host(res) != ref_res).sum()) + int(rel > 4e-7 * h ** 0.5) + int((host(status) != 0).sum())
    wrong += bad
    parts.append(f"allreduce+rmsnorm {rows}x{h} {us:.0f} us (host all_reduce alone {ref_us:.0f} us) #wrong={bad}")
    # All-gather + GEMM.
    # On a GPU every rank's grid stays small enough to be resident at once with the others'
    # (4 ranks x 64 programs): a waiting program must never keep its owner's from running.
    m_local, k, nn = (128, 512, 512) if gpu else (32, 32, 32)
    a = comm.alloc_window((m_local, k), "float32")
    view(a)[:] = dev(ints((m_local, k)))
    b = ints((k, nn), 7)
    gathered_d = dev(np.zeros((n * m_local, k), np.float32))
    _, ref_us = timed(lambda: comm.all_gather(dev(host(view(a))), gathered_d))
    gathered = host(gathered_d)
    c = dev(np.zeros((n * m_local, nn), np.float32))
    bm, bn, bk = (64, 64, 32) if gpu else (16, 16, 16)
    g2 = (n * m_local // bm, nn // bn)
    status = dev(np.full(g2[0] * g2[1], -1, np.int32))
    bdev = dev(b)
    us = warm_then_timed(lambda call: fused.all_gather_matmul_kernel[g2](
        a.handle[0], a.handle[1], addr(bdev), addr(c), m_local, sb, ss, sw, ab, r, 0, call, timeout,
        addr(status), nranks=n, K=k, N=nn, BM=bm, BN=bn, BK=bk))
    comm.barrier()
    bad = int((host(c) != gathered @ b).sum()) + int((host(status) != 0).sum())
    wrong += bad
    parts.append(f"allgather+gemm {n * m_local}x{nn}x{k} {us:.0f} us #wrong={bad}")
    # GEMM + reduce-scatter.
    m = n * m_local
    a2, b2 = ints((m, k)), ints((k, nn))
    partial = comm.alloc_window((m, nn), "float32")
    rs_out = comm.alloc_window((m_local, nn), "float32")
    ref_d = dev(np.zeros((m_local, nn), np.float32))
    comm.reduce_scatter(dev(a2 @ b2), ref_d)
    ref = host(ref_d)
    a2d, b2d = dev(a2), dev(b2)
    g3 = (m // bm, nn // bn)
    status = dev(np.full(g3[0] * g3[1], -1, np.int32))
    us = warm_then_timed(lambda call: fused.matmul_reduce_scatter_kernel[g3](
        addr(a2d), addr(b2d), partial.handle[0], partial.handle[1], rs_out.handle[0], rs_out.handle[1], m_local,
        sb, ss, sw, ab, r, 1, call, timeout, addr(status), nranks=n, K=k, N=nn, BM=bm, BN=bn, BK=bk))
    comm.barrier()
    bad = int((host(view(rs_out)) != ref).sum()) + int((host(status) != 0).sum())
    wrong += bad
    parts.append(f"gemm+reducescatter {m}x{nn}x{k} {us:.0f} us #wrong={bad}")
    return wrong, "; ".join(parts)


if __name__ == "__main__":
    sys.exit(main())

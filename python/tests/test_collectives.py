"""Every host collective on windows and on numpy arrays, in and out of place, on ranks as
threads (emulator), checked bit for bit with inputs whose results are exact (nccl-tests style:
the number of wrong elements is counted and must be 0)."""

import numpy as np
import pytest

import symcomm

DTYPES = ["float32", "float64", "int32", "uint8", "int64"]
COUNTS = [1, 7, 1000]


def value(dtype, rank, i):
    """Rank `rank`'s input element `i`: small integers, so every reduction is exact."""
    return np.asarray((np.arange(i) % 7 + 1 + rank) % 5 + 1, dtype=dtype)


def reduce(op, vals):
    stack = np.stack(vals).astype(np.float64)
    out = {"sum": stack.sum(0), "prod": stack.prod(0), "min": stack.min(0), "max": stack.max(0)}[op]
    return out


def buffers(comm, kind, count, dtype, window):
    n = comm.nranks
    sblocks = n if kind in ("reduce_scatter", "scatter", "all_to_all") else 1
    rblocks = n if kind in ("all_gather", "all_to_all") else 1
    if window:
        send = comm.alloc_window(count * sblocks, dtype)
        recv = comm.alloc_window(count * rblocks, dtype)
        return send, recv, np.from_dlpack(send), np.from_dlpack(recv)
    send = np.zeros(count * sblocks, dtype=dtype)
    recv = np.zeros(count * rblocks, dtype=dtype)
    return send, recv, send, recv


def expected(kind, op, dtype, count, n, r, root, ins):
    """What rank r's receive buffer holds after the call, given every rank's input `ins`."""
    block = lambda p, b: ins[p][b * count:(b + 1) * count]  # noqa: E731
    if kind == "all_reduce":
        return reduce(op, ins).astype(dtype)
    if kind == "reduce":
        return reduce(op, ins).astype(dtype) if r == root else None
    if kind == "broadcast":
        return ins[root]
    if kind == "all_gather":
        return np.concatenate(ins)
    if kind == "reduce_scatter":
        return reduce(op, [block(p, r) for p in range(n)]).astype(dtype)
    if kind == "scatter":
        return block(root, r)
    return np.concatenate([block(p, r) for p in range(n)])  # all_to_all


KINDS = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "scatter", "all_to_all"]


def call(comm, kind, send, recv, op, root):
    f = getattr(comm, kind)
    if kind in ("all_reduce", "reduce_scatter"):
        return f(send, recv, op)
    if kind == "reduce":
        return f(send, recv, op, root)
    if kind in ("broadcast", "scatter"):
        return f(send, recv, root)
    return f(send, recv)


@pytest.mark.parametrize("window", [True, False], ids=["window", "array"])
@pytest.mark.parametrize("kind", KINDS)
def test_out_of_place(threads, kind, window):
    n = 3

    def body(comm):
        bad = 0
        for dtype in DTYPES:
            for count in COUNTS:
                for op in (["sum", "max", "min", "prod"] if kind in ("all_reduce", "reduce", "reduce_scatter") else ["sum"]):
                    root = count % n
                    send, recv, sview, rview = buffers(comm, kind, count, dtype, window)
                    blocks = len(sview) // count
                    ins = [value(dtype, p, count * blocks) for p in range(n)]
                    sview[:] = ins[comm.rank]
                    rview[:] = 0
                    call(comm, kind, send, recv, op, root)
                    want = expected(kind, op, dtype, count, n, comm.rank, root, ins)
                    got = rview.copy()
                    if want is None:
                        bad += int((got != 0).sum())  # reduce: non-roots' output untouched
                    else:
                        bad += int((got != want).sum())
                    # Out of place: the input is left alone.
                    bad += int((sview != ins[comm.rank]).sum())
        return bad

    wrong = threads(n, body)
    assert wrong == [0] * n, f"#wrong per rank: {wrong}"


@pytest.mark.parametrize("kind", KINDS)
def test_in_place_windows(threads, kind):
    """NCCL's in-place forms (``recv=None``): all-gather's send is its own block of the output,
    reduce-scatter's and scatter's output its own block of the input."""
    n, count, dtype = 4, 33, "float32"

    def body(comm):
        r = comm.rank
        blocks = n if kind in ("all_gather", "reduce_scatter", "scatter", "all_to_all") else 1
        w = comm.alloc_window(count * blocks, dtype)
        a = np.from_dlpack(w)
        ins = [value(dtype, p, count * blocks) for p in range(n)]
        if kind == "all_gather":
            # Only this rank's own block is its input.
            ins = [np.tile(value(dtype, p, count), n) for p in range(n)]
        a[:] = ins[r]
        root = 1
        out = getattr(comm, kind)
        if kind in ("all_reduce", "reduce_scatter"):
            out(w, op="sum")
        elif kind == "reduce":
            out(w, op="sum", root=root)
        elif kind in ("broadcast", "scatter"):
            out(w, root=root)
        else:
            out(w)
        got = a.copy()
        if kind == "all_gather":
            want = np.concatenate([value(dtype, p, count) for p in range(n)])
            return int((got != want).sum())
        want = expected(kind, "sum", dtype, count, n, r, root, ins)
        if kind in ("reduce_scatter", "scatter"):
            got = got[r * count:(r + 1) * count]
        if want is None:
            return int((got != ins[r]).sum())  # a non-root's in-place buffer is untouched
        return int((got != want).sum())

    assert threads(n, body) == [0] * n


def test_avg_is_within_one_rounding(threads):
    n = 3

    def body(comm):
        x = np.arange(1, 101, dtype=np.float32) * (comm.rank + 1)
        y = np.zeros_like(x)
        comm.all_reduce(x, y, op="avg")
        want = np.arange(1, 101, dtype=np.float64) * 2.0  # (1 + 2 + 3) / 3
        return float(np.max(np.abs(y - want) / want))

    assert max(threads(n, body)) <= 2.0 ** -23


class _DeviceArray:
    """Device memory as CUDA array libraries describe it (never dereferenced here)."""

    __cuda_array_interface__ = {"shape": (16,), "typestr": "<f4", "data": (0x7F0000000000, False), "version": 3}
    dtype = np.float32


def test_bad_arguments_raise_and_the_communicator_stays_usable(threads):
    def body(comm):
        w = comm.alloc_window(16, "float32")
        ints = np.zeros(16, dtype=np.int32)
        seen = []
        for bad in (
            # Device memory on the emulator (and host memory on a GPU): refused, never copied.
            lambda: comm.all_reduce(_DeviceArray()),
            lambda: comm.all_reduce(w, op="bogus"),
            lambda: comm.all_reduce(w, ints),  # dtype mismatch
            lambda: comm.all_reduce(np.zeros((4, 4), dtype=np.float32)[:, ::2]),  # not contiguous
            lambda: comm.all_reduce("not a buffer"),
            lambda: comm.broadcast(w, root=99),  # root out of range
            lambda: comm.alloc_window(-1, "float32"),
            lambda: comm.alloc_window(4, "complex64"),
            lambda: comm.all_reduce(w, count=17),  # larger than the window
        ):
            with pytest.raises(symcomm.InvalidArgument) as e:
                bad()
            assert isinstance(e.value, ValueError) and isinstance(e.value, symcomm.Error)
            seen.append(str(e.value))
        # The next call works.
        a = np.from_dlpack(w)
        a[:] = 1
        comm.all_reduce(w)
        assert (a == comm.nranks).all()
        return seen

    results = threads(2, body)
    assert all(m for m in results[0]), results[0]


def test_split_by_color_and_key(threads):
    def body(comm):
        r = comm.rank
        # Colors 0 (ranks 0, 2) and 1 (rank 1, 3); keys reverse the order; rank 4 joins none.
        part = comm.split(r % 2 if r < 4 else None, key=-r)
        got = None
        if part is not None:
            a = np.full(33, r + 1, dtype=np.int32)
            part.all_reduce(a)
            got = (part.rank, part.nranks, int(a[0]), bool((a == a[0]).all()))
        b = np.ones(8, dtype=np.float32)
        comm.all_reduce(b)  # the parent still works
        return got, float(b[0])

    results = threads(5, body)
    assert results == [
        ((1, 2, 4, True), 5.0),
        ((1, 2, 6, True), 5.0),
        ((0, 2, 4, True), 5.0),
        ((0, 2, 6, True), 5.0),
        (None, 5.0),
    ]


def test_unique_id_text_repr_and_pickle():
    import pickle

    uid = symcomm.UniqueId()
    text = str(uid)
    assert text.startswith("symcomm1:")
    secret = text.rsplit(":", 1)[1]
    assert secret not in repr(uid)
    assert symcomm.UniqueId.parse(text) == uid
    assert pickle.loads(pickle.dumps(uid)) == uid
    with pytest.raises(symcomm.InvalidArgument):
        symcomm.UniqueId.parse("symcomm1:nonsense")


def test_window_exports_and_streams(threads):
    def body(comm):
        w = comm.alloc_window((2, 3), "int64")
        assert w.shape == (2, 3) and w.dtype == "int64" and w.size == 6 and w.nbytes >= 48
        base, stride, nbytes, rank, nranks, elem, _ = w.handle
        assert (rank, nranks, elem) == (comm.rank, comm.nranks, 8)
        assert w.__dlpack_device__() == (1, 0)  # kDLCPU on the emulator
        a = np.from_dlpack(w)
        assert a.shape == (2, 3) and a.dtype == np.int64 and a.flags.writeable
        a[:] = comm.rank
        s = comm.create_stream()
        assert s.cuda_handle is None
        comm.all_reduce(w, stream=s)  # windows only: returns once enqueued
        s.synchronize()
        return int(a.sum())

    assert threads(3, body) == [6 * 3] * 3


def test_device_handle_and_foreign_streams(threads):
    def body(comm):
        h = comm.device_handle()
        assert (h["rank"], h["nranks"]) == (comm.rank, comm.nranks)
        assert h["signal_base"] and h["abort_flag"] and h["timeout_ns"] > 0
        # The LL area follows the signal words; the emulator's ranks share one GPU.
        assert h["ll_offset"] == h["nranks"] * h["signal_words"] * 8 and h["ll_lines"] == 256
        assert h["flags"] & 1 == 1
        w = comm.alloc_window(4, "float32")
        # A raw CUDA stream (or a torch stream) needs a GPU: refused on the emulator, and usable after.
        with pytest.raises(symcomm.InvalidArgument, match="GPU"):
            comm.all_reduce(w, stream=0)

        class TorchLike:
            cuda_stream = 0

        with pytest.raises(symcomm.InvalidArgument, match="GPU"):
            comm.all_reduce(w, stream=TorchLike())
        with pytest.raises(symcomm.InvalidArgument, match="stream"):
            comm.all_reduce(w, stream="fast")
        np.from_dlpack(w)[:] = 1
        comm.all_reduce(w)
        return float(np.from_dlpack(w).sum())

    assert threads(2, body) == [8.0, 8.0]

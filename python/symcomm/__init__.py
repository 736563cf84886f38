"""symcomm: device-initiated GPU communication, from Python.

Communicators over an authenticated rendezvous, symmetric memory windows (every rank's copy
reachable from every rank; exported through DLPack to numpy or PyTorch without copying) and
the host collectives (NCCL's seven) on windows, arrays and tensors. Everything also runs on the
CPU emulator (``device="emu"``): windows are host memory there, numpy arrays are the buffers.

Quick start (ranks started by ``symcomm launch -n 4 -- python prog.py`` or torchrun)::

    import numpy as np, symcomm
    comm = symcomm.Communicator.from_env()
    w = comm.alloc_window(1024, "float32")
    a = np.from_dlpack(w)          # this rank's copy, no copy made (torch.from_dlpack on a GPU)
    a[:] = comm.rank + 1
    comm.all_reduce(w)             # in place; returns when the result is in `a`
    assert (a == sum(range(1, comm.nranks + 1))).all()

No PyTorch is needed to import the package; numpy is needed only to pass numpy arrays.
"""

from . import errors
from ._symcomm import Communicator, Stream, UniqueId, Window, __version__
from ._symcomm import dtypes as _library_dtypes
from .errors import (
    Aborted,
    BootstrapError,
    CudaError,
    Error,
    InvalidArgument,
    Mismatch,
    NoDriver,
    PeerFailed,
    PeerLost,
    Timeout,
    Unsupported,
)

__all__ = [
    "Communicator",
    "Stream",
    "UniqueId",
    "Window",
    "DTYPES",
    "REDUCTIONS",
    "__version__",
    *errors.__all__,
]

# Element types: the Python names (numpy / torch spellings) -> the library's names.
_ALIASES = {
    "float32": "float",
    "float64": "double",
    "float16": "half",
    "bfloat16": "bfloat16",
    "float8_e4m3fn": "f8e4m3",
    "float8_e5m2": "f8e5m2",
    "int8": "int8",
    "uint8": "uint8",
    "int32": "int32",
    "uint32": "uint32",
    "int64": "int64",
    "uint64": "uint64",
}
_ITEMSIZE = dict(_library_dtypes())
_PY_NAME = {lib: py for py, lib in _ALIASES.items()}

#: Element types windows and collectives take, in the numpy / torch spelling.
DTYPES = tuple(_ALIASES)
#: Reductions, as NCCL names them.
REDUCTIONS = ("sum", "prod", "min", "max", "avg")


def _dtype(dtype) -> str:
    """The library's name of a dtype given as a string, numpy dtype or torch dtype."""
    name = str(getattr(dtype, "name", dtype))
    name = name.removeprefix("torch.")
    lib = _ALIASES.get(name, name if name in _ITEMSIZE else None)
    if lib is None:
        raise InvalidArgument(f"unsupported element type {dtype!r} (one of {', '.join(DTYPES)})")
    return lib


def _shape(shape):
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if not all(isinstance(d, int) and d >= 0 for d in dims):
        raise InvalidArgument(f"a shape is non-negative integers, not {shape!r}")
    count = 1
    for d in dims:
        count *= d
    return dims, count


def _alloc_window(self, shape, dtype="float32"):
    """A symmetric window of ``shape`` elements of ``dtype`` on every rank, zeroed.

    Collective: every rank calls it with the same shape and dtype, in the same order as its
    other collective calls. ``numpy.from_dlpack(window)`` / ``torch.from_dlpack(window)`` view
    this rank's copy; ``window.handle`` is what a kernel needs to reach every rank's copy.
    """
    dims, count = _shape(shape)
    return self._alloc_window(count, _dtype(dtype), list(dims))


def _buffer(obj, what, on_gpu):
    """(library buffer, library dtype, elements) of a Window, array or tensor. A GPU
    communicator takes device memory only (CUDA tensors, ``__cuda_array_interface__`` arrays),
    the emulator host memory only (numpy arrays, CPU tensors): anything else is refused here
    rather than handed to the device as an address it cannot use."""
    if isinstance(obj, Window):
        return obj, obj._dtype, obj.size
    cai = getattr(obj, "__cuda_array_interface__", None)
    if on_gpu and cai is None:
        raise InvalidArgument(
            f"{what}: a communicator on a GPU takes Windows, CUDA tensors or "
            f"__cuda_array_interface__ arrays, not host memory ({type(obj).__name__})"
        )
    if not on_gpu and cai is not None:
        raise InvalidArgument(
            f"{what}: a communicator on the emulator takes Windows, numpy arrays or CPU tensors, "
            f"not device memory ({type(obj).__name__})"
        )
    ai = cai if cai is not None else getattr(obj, "__array_interface__", None)
    if ai is None and hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous"):
        # A torch tensor on the CPU (the emulator's memory).
        if not obj.is_contiguous():
            raise InvalidArgument(f"{what}: the tensor is not contiguous")
        return (obj.data_ptr(), obj.numel() * obj.element_size()), _dtype(obj.dtype), obj.numel()
    if ai is None:
        raise InvalidArgument(
            f"{what}: a Window, a numpy array or a tensor, not {type(obj).__name__}"
        )
    dtype = getattr(obj, "dtype", None)
    if dtype is None:
        raise InvalidArgument(f"{what}: the array has no dtype")
    if ai.get("strides") is not None and not _contiguous(obj):
        raise InvalidArgument(f"{what}: the array is not C-contiguous")
    addr, readonly = ai["data"]
    if readonly and what == "recv":
        raise InvalidArgument("recv: the array is read-only")
    lib = _dtype(dtype)
    _, count = _shape(ai["shape"])
    return (int(addr), count * _ITEMSIZE[lib]), lib, count


def _contiguous(obj):
    flags = getattr(obj, "flags", None)
    if flags is not None:
        return bool(flags["C_CONTIGUOUS"])
    is_contiguous = getattr(obj, "is_contiguous", None)
    return bool(is_contiguous()) if is_contiguous is not None else False


def _collective(self, kind, send, recv, op="sum", root=0, count=None, stream=None):
    in_place = recv is None or recv is send
    recv = send if in_place else recv
    on_gpu = self.backend != "emu"
    sbuf, sdt, selems = _buffer(send, "send", on_gpu)
    rbuf, rdt, relems = _buffer(recv, "recv", on_gpu)
    if sdt != rdt:
        raise InvalidArgument(
            f"{kind}: send holds {_PY_NAME.get(sdt, sdt)}, recv {_PY_NAME.get(rdt, rdt)}"
        )
    if op not in REDUCTIONS:
        raise InvalidArgument(f"{kind}: unknown reduction {op!r} (one of {', '.join(REDUCTIONS)})")
    n, size = self.nranks, _ITEMSIZE[sdt]
    if count is None:
        # The per-rank block, as NCCL counts it: all of send for the one-block collectives
        # (and an out-of-place all-gather), one rank's share of it for the others.
        whole = kind in ("all_reduce", "broadcast", "reduce") or (kind == "all_gather" and not in_place)
        count = selems if whole else selems // n
    # NCCL's in-place forms: an all-gather sends its own block of the output; a reduce-scatter or
    # scatter receives into its own block of the input.
    soff = self.rank * count * size if in_place and kind == "all_gather" else 0
    roff = self.rank * count * size if in_place and kind in ("reduce_scatter", "scatter") else 0
    self._collective(kind, sbuf, rbuf, count, sdt, op, root, _stream(self, stream), soff, roff)
    return recv


def _stream(comm, stream):
    """A symcomm Stream for ``stream``: itself, or a CUDA stream (a ``torch.cuda.Stream`` or
    anything with ``cuda_stream``, or a raw ``CUstream`` integer) wrapped (GPU only)."""
    if stream is None or isinstance(stream, Stream):
        return stream
    handle = getattr(stream, "cuda_stream", stream)
    if not isinstance(handle, int):
        raise InvalidArgument(
            f"stream: a symcomm.Stream, a torch.cuda.Stream or a CUstream handle, not {type(stream).__name__}"
        )
    return comm.wrap_cuda_stream(handle)


def _method(kind, has_op, has_root, doc):
    if has_op and has_root:
        def call(self, send, recv=None, op="sum", root=0, *, count=None, stream=None):
            return _collective(self, kind, send, recv, op, root, count, stream)
    elif has_op:
        def call(self, send, recv=None, op="sum", *, count=None, stream=None):
            return _collective(self, kind, send, recv, op, 0, count, stream)
    elif has_root:
        def call(self, send, recv=None, root=0, *, count=None, stream=None):
            return _collective(self, kind, send, recv, "sum", root, count, stream)
    else:
        def call(self, send, recv=None, *, count=None, stream=None):
            return _collective(self, kind, send, recv, "sum", 0, count, stream)
    call.__name__ = kind
    call.__qualname__ = f"Communicator.{kind}"
    call.__doc__ = doc + _COMMON_DOC
    return call


_COMMON_DOC = """

``send`` and ``recv`` are Windows (zero-copy), numpy arrays (emulator) or tensors /
``__cuda_array_interface__`` arrays (GPU), C-contiguous, of one dtype; ``recv=None`` means in
place (``recv`` is ``send``). ``count`` is the per-rank block in elements (default: deduced
from the buffers as NCCL counts). Without ``stream`` the call returns when the result is in
place; with a ``Stream`` (``comm.create_stream()``, or a ``torch.cuda.Stream`` / raw CUstream on
a GPU) and only Windows it returns once enqueued, in that stream's order.
Returns ``recv``. Raises ``InvalidArgument`` for bad input (nothing runs; the communicator
stays usable), ``Mismatch`` when ranks disagree, ``PeerLost`` / ``Timeout`` / ``Aborted``.
"""

Communicator.alloc_window = _alloc_window
Communicator.all_reduce = _method(
    "all_reduce", True, False, "All-reduce: every rank's ``send`` reduced with ``op`` into every rank's ``recv``."
)
Communicator.broadcast = _method(
    "broadcast", False, True, "Broadcast: rank ``root``'s ``send`` into every rank's ``recv``."
)
Communicator.reduce = _method(
    "reduce", True, True, "Reduce: every rank's ``send`` reduced with ``op`` into rank ``root``'s ``recv``."
)
Communicator.all_gather = _method(
    "all_gather", False, False, "All-gather: rank r's ``send`` into block r of every rank's ``recv``."
)
Communicator.reduce_scatter = _method(
    "reduce_scatter", True, False, "Reduce-scatter: block r of every rank's ``send``, reduced, into rank r's ``recv``."
)
Communicator.scatter = _method(
    "scatter", False, True, "Scatter: block r of rank ``root``'s ``send`` into rank r's ``recv``."
)
Communicator.all_to_all = _method(
    "all_to_all", False, False, "All-to-all: block p of rank r's ``send`` into block r of rank p's ``recv``."
)


def _window_dtype(self):
    """The element type, numpy / torch spelling (``float32``, ``bfloat16``, ...)."""
    return _PY_NAME.get(self._dtype, self._dtype)


Window.dtype = property(_window_dtype)

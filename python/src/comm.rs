//! The Python classes: `UniqueId`, `Communicator`, `Window`, `Stream`.
//!
//! Windows are byte windows of the library (`Window<u8>`) that remember their element type and
//! shape: the collectives' type comes from the call, and each window argument is checked
//! against it here. Collective buffers are windows (zero-copy) or `(address, bytes)` pairs of
//! ordinary memory (staged), which the Python layer takes from arrays and tensors.

use std::sync::{Arc, OnceLock};

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use symcomm::{Backend, BufferRef, DataType, Device, RedOp};

use crate::dlpack::{self, Export};
use crate::errors::{OrRaise, invalid};

/// The element types, as `(name, itemsize)` pairs in the library's names (`float32` is
/// `float`, ...): the Python layer maps numpy / torch names onto them.
#[pyfunction]
pub(crate) fn dtypes() -> Vec<(&'static str, usize)> {
    DataType::ALL.iter().map(|d| (d.name(), d.size())).collect()
}

fn data_type(name: &str) -> PyResult<DataType> {
    DataType::parse(name).ok_or_else(|| invalid(format!("unknown element type {name:?}")))
}

/// The rendezvous credential of a communicator: `symcomm1:<ip>:<port>:<secret>`.
///
/// Rank 0 makes one (`UniqueId()`) and hands `str(id)` to the other ranks, which rebuild it
/// with `UniqueId.parse`. `str()` is the secret itself; `repr()` shows only its fingerprint.
#[pyclass(module = "symcomm", frozen)]
pub(crate) struct UniqueId(symcomm::UniqueId);

#[pymethods]
impl UniqueId {
    /// A new id listening on this host's address (`SYMCOMM_BOOTSTRAP_*` apply).
    #[new]
    fn new() -> PyResult<Self> {
        symcomm::UniqueId::new().or_raise().map(UniqueId)
    }

    /// The id whose text form is `text`.
    #[staticmethod]
    fn parse(text: &str) -> PyResult<Self> {
        text.parse().or_raise().map(UniqueId)
    }

    fn __str__(&self) -> String {
        self.0.to_string()
    }

    fn __repr__(&self) -> String {
        format!("UniqueId(fingerprint={})", self.0.fingerprint())
    }

    fn __eq__(&self, other: &Self) -> bool {
        self.0 == other.0
    }

    /// Pickles as its text form (for `multiprocessing`).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let parse = slf.get_type().getattr("parse")?;
        (parse, (slf.get().0.to_string(),)).into_pyobject(slf.py())
    }
}

/// One rank's handle of a communicator.
#[pyclass(module = "symcomm", frozen)]
pub(crate) struct Communicator {
    comm: Arc<symcomm::Communicator>,
    /// The stream of calls made without one, made on first use.
    default_stream: OnceLock<Arc<symcomm::Stream>>,
}

fn device(name: Option<&str>) -> PyResult<Device> {
    match name {
        Some(n) => Device::parse(n).or_raise(),
        None => Device::from_env().or_raise(),
    }
}

#[pymethods]
impl Communicator {
    /// Joins rank `rank` of `nranks` of the communicator of `unique_id` on `device` (`"auto"`,
    /// `"emu"`, `"cuda"`, `"cuda:N"`; default: `SYMCOMM_DEVICE`, else auto). Blocks until every
    /// rank joined (bounded by the bootstrap timeout).
    #[new]
    #[pyo3(signature = (unique_id, rank, nranks, device=None))]
    fn new(
        py: Python<'_>,
        unique_id: &UniqueId,
        rank: u32,
        nranks: u32,
        device: Option<&str>,
    ) -> PyResult<Self> {
        let dev = self::device(device)?;
        let id = unique_id.0.clone();
        let comm = py
            .detach(|| symcomm::Communicator::init(&id, rank, nranks, dev))
            .or_raise()?;
        Ok(Self::wrap(comm))
    }

    /// Joins the communicator the launcher describes (torchrun, `symcomm launch`, mpirun, srun
    /// variables), on `device` (default: `SYMCOMM_DEVICE`, else auto).
    #[staticmethod]
    #[pyo3(signature = (device=None))]
    fn from_env(py: Python<'_>, device: Option<&str>) -> PyResult<Self> {
        let comm = match device {
            None => py.detach(symcomm::Communicator::from_env).or_raise()?,
            Some(_) => {
                let dev = self::device(device)?;
                let config = symcomm::BootstrapConfig::from_env().or_raise()?;
                let options = symcomm::CommOptions::from_env().or_raise()?;
                py.detach(|| symcomm::Communicator::init_with(&config, dev, &options))
                    .or_raise()?
            }
        };
        Ok(Self::wrap(comm))
    }

    #[getter]
    fn rank(&self) -> u32 {
        self.comm.rank()
    }

    #[getter]
    fn nranks(&self) -> u32 {
        self.comm.nranks()
    }

    /// `"emu"` or `"cuda:N"`.
    #[getter]
    fn backend(&self) -> String {
        self.comm.backend().name()
    }

    /// A collective allocation of a symmetric window of `count` elements of `dtype` (library
    /// name) per rank, zeroed; every rank must call it with the same arguments.
    fn _alloc_window(
        &self,
        py: Python<'_>,
        count: usize,
        dtype: &str,
        shape: Vec<usize>,
    ) -> PyResult<Window> {
        let dt = data_type(dtype)?;
        if shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) != Some(count) {
            return Err(invalid(format!(
                "shape {shape:?} does not hold {count} elements"
            )));
        }
        let bytes = count
            .checked_mul(dt.size())
            .ok_or_else(|| invalid(format!("{count} elements of {} overflow", dt.name())))?;
        let comm = Arc::clone(&self.comm);
        let win = py.detach(|| comm.alloc_window::<u8>(bytes)).or_raise()?;
        Ok(Window {
            win: Arc::new(win),
            dtype: dt,
            shape,
        })
    }

    /// A new stream of this communicator's backend.
    fn create_stream(&self) -> PyResult<Stream> {
        let s = self.comm.create_stream().or_raise()?;
        Ok(Stream(Arc::new(s)))
    }

    /// An existing `CUstream` of this communicator's GPU (e.g. `torch.cuda.current_stream()
    /// .cuda_stream`; 0 is the legacy default stream), wrapped without owning it: the caller keeps
    /// it alive while the returned stream is in use. GPU only.
    fn wrap_cuda_stream(&self, handle: u64) -> PyResult<Stream> {
        match self.comm.backend() {
            Backend::Cuda(device) => {
                // SAFETY: the handle is a stream of `device`'s primary context (the one PyTorch
                // and the CUDA runtime use) that its owner keeps alive while the wrapper is in
                // use — this method's documented contract.
                let s = unsafe { symcomm::Stream::from_cuda_raw(device, handle) };
                Ok(Stream(Arc::new(s)))
            }
            _ => Err(invalid(
                "a CUDA stream handle needs a communicator on a GPU (this one is on the emulator)"
                    .to_owned(),
            )),
        }
    }

    /// The device handle a kernel takes (`DevComm`), as a dict of its fields: `rank`, `nranks`,
    /// `signal_base` / `signal_stride` (rank r's signal words at `signal_base + r *
    /// signal_stride`), `signal_words`, `abort_flag`, `error`, `timeout_ns`, `abi_version`,
    /// `ll_offset` / `ll_lines` (the LL area in each rank's signal array), `flags`
    /// (`SYMCOMM_COMM_*`: 1 when every rank is on this GPU), `ranks` (0 when every rank is on
    /// this host, else the device address of the table of ranks on other hosts) and `proxy`
    /// (the device address of this rank's proxy queue, 0 without one).
    fn device_handle<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let h = self.comm.device_handle().or_raise()?;
        let d = pyo3::types::PyDict::new(py);
        d.set_item("abi_version", h.abi_version)?;
        d.set_item("rank", h.rank)?;
        d.set_item("nranks", h.nranks)?;
        d.set_item("signal_words", h.signal_words)?;
        d.set_item("signal_base", h.signal_base)?;
        d.set_item("signal_stride", h.signal_stride)?;
        d.set_item("abort_flag", h.abort_flag)?;
        d.set_item("error", h.error)?;
        d.set_item("timeout_ns", h.timeout_ns)?;
        d.set_item("ll_offset", h.ll_offset)?;
        d.set_item("ll_lines", h.ll_lines)?;
        d.set_item("flags", h.flags)?;
        d.set_item("ranks", h.ranks)?;
        d.set_item("proxy", h.proxy)?;
        Ok(d)
    }

    /// Blocks until every rank called it (bounded).
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.comm.barrier()).or_raise()
    }

    /// Splits the communicator (collective): the ranks passing the same `color` form a new
    /// one, ranked by `key` (ties by rank here); `color=None` joins none and returns `None`.
    /// This communicator stays usable.
    #[pyo3(signature = (color, key=0))]
    fn split(&self, py: Python<'_>, color: Option<u32>, key: i32) -> PyResult<Option<Self>> {
        let made = py.detach(|| self.comm.split(color, key)).or_raise()?;
        Ok(made.map(Self::wrap))
    }

    /// Aborts the communicator: every rank's waits end with `Aborted`; returns at once.
    fn abort(&self) {
        self.comm.abort();
    }

    /// Raises the communicator's first asynchronous failure (a lost peer, a device error), if
    /// any.
    fn check_error(&self) -> PyResult<()> {
        self.comm.check_error().or_raise()
    }

    /// One host collective (`kind`: all_reduce, broadcast, reduce, all_gather, reduce_scatter,
    /// scatter, all_to_all). `send` and `recv` are `Window`s or `(address, bytes)` pairs of
    /// ordinary device memory (host memory on the emulator). Without `stream`, or with any
    /// ordinary memory, the call returns once the result is in place; with a stream and only
    /// windows it returns once enqueued. `send_offset` / `recv_offset`: bytes skipped at the
    /// start of each buffer (NCCL's in-place forms address one block of the other buffer).
    #[pyo3(signature = (kind, send, recv, count, dtype, op="sum", root=0, stream=None, send_offset=0, recv_offset=0))]
    #[allow(clippy::too_many_arguments)]
    fn _collective(
        &self,
        py: Python<'_>,
        kind: &str,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        count: usize,
        dtype: &str,
        op: &str,
        root: u32,
        stream: Option<&Stream>,
        send_offset: u64,
        recv_offset: u64,
    ) -> PyResult<()> {
        let dt = data_type(dtype)?;
        let op = RedOp::parse(op).ok_or_else(|| invalid(format!("unknown reduction {op:?}")))?;
        let send = Buf::extract(send, dt)?.skip(send_offset)?;
        let recv = Buf::extract(recv, dt)?.skip(recv_offset)?;
        let blocking = stream.is_none() || send.is_raw() || recv.is_raw();
        let stream = match stream {
            Some(s) => Arc::clone(&s.0),
            None => self.default_stream()?,
        };
        let comm = Arc::clone(&self.comm);
        let kind = kind.to_owned();
        py.detach(move || -> symcomm::Result<()> {
            let (s, r) = (send.buffer()?, recv.buffer()?);
            let st = &*stream;
            match kind.as_str() {
                "all_reduce" => comm.all_reduce(s, r, count, dt, op, st),
                "broadcast" => comm.broadcast(s, r, count, dt, root, st),
                "reduce" => comm.reduce(s, r, count, dt, op, root, st),
                "all_gather" => comm.all_gather(s, r, count, dt, st),
                "reduce_scatter" => comm.reduce_scatter(s, r, count, dt, op, st),
                "scatter" => comm.scatter(s, r, count, dt, root, st),
                "all_to_all" => comm.all_to_all(s, r, count, dt, st),
                other => Err(symcomm::Error::InvalidArgument(format!(
                    "unknown collective {other:?}"
                ))),
            }?;
            if blocking { st.synchronize() } else { Ok(()) }
        })
        .or_raise()
    }

    fn __repr__(&self) -> String {
        format!(
            "Communicator(rank={}, nranks={}, backend={})",
            self.comm.rank(),
            self.comm.nranks(),
            self.comm.backend().name()
        )
    }
}

impl Communicator {
    fn wrap(comm: Arc<symcomm::Communicator>) -> Self {
        Communicator {
            comm,
            default_stream: OnceLock::new(),
        }
    }

    fn default_stream(&self) -> PyResult<Arc<symcomm::Stream>> {
        if let Some(s) = self.default_stream.get() {
            return Ok(Arc::clone(s));
        }
        let s = Arc::new(self.comm.create_stream().or_raise()?);
        Ok(Arc::clone(self.default_stream.get_or_init(|| s)))
    }
}

/// A collective's buffer: a window from a byte offset, or ordinary memory the caller keeps
/// alive for the call.
enum Buf {
    Window(Arc<symcomm::Window<u8>>, u64),
    Raw { addr: u64, bytes: u64 },
}

impl Buf {
    fn extract(obj: &Bound<'_, PyAny>, dt: DataType) -> PyResult<Buf> {
        if let Ok(w) = obj.cast::<Window>() {
            let w = w.get();
            if w.dtype != dt {
                return Err(invalid(format!(
                    "a window of {} used as a {} buffer",
                    w.dtype.name(),
                    dt.name()
                )));
            }
            return Ok(Buf::Window(Arc::clone(&w.win), 0));
        }
        let (addr, bytes): (u64, u64) = obj.extract().map_err(|_| {
            invalid("a collective buffer is a Window or an (address, bytes) pair".to_owned())
        })?;
        Ok(Buf::Raw { addr, bytes })
    }

    /// The same buffer without its first `bytes` bytes.
    fn skip(self, bytes: u64) -> PyResult<Buf> {
        let too_far =
            |len: u64| invalid(format!("offset {bytes} is past the buffer's {len} bytes"));
        match self {
            Buf::Window(w, at) => {
                let off = at + bytes;
                if off > w.bytes() {
                    return Err(too_far(w.bytes()));
                }
                Ok(Buf::Window(w, off))
            }
            Buf::Raw { addr, bytes: len } => match len.checked_sub(bytes) {
                Some(rest) => Ok(Buf::Raw {
                    addr: addr + bytes,
                    bytes: rest,
                }),
                None => Err(too_far(len)),
            },
        }
    }

    fn is_raw(&self) -> bool {
        matches!(self, Buf::Raw { .. })
    }

    fn buffer(&self) -> symcomm::Result<BufferRef<'_>> {
        match self {
            // In bounds: `skip` checked the offset.
            Buf::Window(w, at) => w.range(*at as usize, w.len() - *at as usize),
            // SAFETY: the Python layer passes the address and size of a live, contiguous array
            // or tensor that it holds for the whole call, and a call with ordinary memory
            // returns only after its stream ran it (`_collective`), so the memory outlives its
            // use; a null or foreign address is refused or faults like NCCL's would.
            Buf::Raw { addr, bytes } => Ok(unsafe { BufferRef::from_raw(*addr, *bytes) }),
        }
    }
}

/// A symmetric window: every rank's copy of the same `shape` of `dtype`, each rank able to
/// reach its peers' copies. `numpy.from_dlpack(w)` (emulator) or `torch.from_dlpack(w)` (GPU)
/// views this rank's copy without copying.
#[pyclass(module = "symcomm", frozen)]
pub(crate) struct Window {
    win: Arc<symcomm::Window<u8>>,
    dtype: DataType,
    shape: Vec<usize>,
}

#[pymethods]
impl Window {
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// The element type's library name (`float`, `bfloat16`, `int32`, ...).
    #[getter]
    fn _dtype(&self) -> &'static str {
        self.dtype.name()
    }

    /// Elements per rank.
    #[getter]
    fn size(&self) -> usize {
        self.win.len() / self.dtype.size()
    }

    /// Bytes per rank.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.win.bytes()
    }

    /// The device handle a kernel takes (`WindowHandleRaw`) as
    /// `(base, stride, bytes, rank, nranks, elem_size, dtype)`: rank r's copy starts at
    /// `base + r * stride`.
    #[getter]
    fn handle(&self) -> (u64, u64, u64, u32, u32, u32, u32) {
        let h = self.win.device_handle().raw();
        (
            h.base,
            h.stride,
            h.bytes,
            h.rank,
            h.nranks,
            self.dtype.size() as u32,
            self.dtype.code(),
        )
    }

    /// DLPack: this rank's copy (stream ordering: the caller synchronizes first).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Py<PyAny>>,
        max_version: Option<Py<PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = stream;
        // DLPack 1.0 for consumers that take it (numpy 2: writable arrays), legacy otherwise.
        let versioned = match max_version {
            Some(v) => v
                .bind(py)
                .extract::<(u32, u32)>()
                .is_ok_and(|(major, _)| major >= 1),
            None => false,
        };
        let device = self.__dlpack_device__();
        if dl_device.is_some_and(|d| d != device) {
            return Err(invalid(
                "a window is exported on its own device only".to_owned(),
            ));
        }
        if copy == Some(true) {
            return Err(invalid(
                "a window is exported without copying (copy=True refused)".to_owned(),
            ));
        }
        let h = self.win.device_handle().raw();
        let shape = self
            .shape
            .iter()
            .map(|&d| i64::try_from(d).map_err(|_| invalid("dimension too large".to_owned())))
            .collect::<PyResult<Vec<_>>>()?;
        dlpack::capsule(
            py,
            Export {
                addr: h.base + u64::from(h.rank) * h.stride,
                device,
                dtype: dl_dtype(self.dtype),
                shape,
                keep: Arc::clone(&self.win) as Arc<dyn Send + Sync>,
            },
            versioned,
        )
    }

    /// `(kDLCPU, 0)` on the emulator, `(kDLCUDA, ordinal)` on a GPU.
    fn __dlpack_device__(&self) -> (i32, i32) {
        match self.win.communicator().backend() {
            Backend::Cuda(d) => (dlpack::DEVICE_CUDA, d.ordinal() as i32),
            _ => (dlpack::DEVICE_CPU, 0),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Window(shape={:?}, dtype={}, rank={})",
            self.shape,
            self.dtype.name(),
            self.win.device_handle().raw().rank
        )
    }
}

/// DLPack's (code, bits) of `dt`; the FP8 types go out as `uint8` (their bytes), which every
/// consumer reads.
fn dl_dtype(dt: DataType) -> (u8, u8) {
    let bits = (dt.size() * 8) as u8;
    match dt {
        DataType::Bf16 => (dlpack::CODE_BFLOAT, bits),
        DataType::Fp8E4m3 | DataType::Fp8E5m2 => (dlpack::CODE_UINT, 8),
        d if d.is_float() => (dlpack::CODE_FLOAT, bits),
        DataType::I8 | DataType::I32 | DataType::I64 => (dlpack::CODE_INT, bits),
        _ => (dlpack::CODE_UINT, bits),
    }
}

/// An in-order queue of work on the communicator's backend (a CUDA stream, or an emulator
/// queue).
#[pyclass(module = "symcomm", frozen)]
pub(crate) struct Stream(Arc<symcomm::Stream>);

#[pymethods]
impl Stream {
    /// Blocks until everything enqueued so far has run; raises its failure.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let s = Arc::clone(&self.0);
        py.detach(move || s.synchronize()).or_raise()
    }

    /// The `CUstream` handle as an integer (`None` on the emulator).
    #[getter]
    fn cuda_handle(&self) -> Option<u64> {
        self.0.cuda_raw()
    }
}

//! Pre-multiplied sums: `ncclRedOpCreatePreMulSum` / `ncclRedOpDestroy`, and how a reduction
//! with such an op runs.
//!
//! An op made here is a value `ncclNumOps + i` of one communicator: its element type and its
//! scalar, a value copied at creation (`ncclScalarHostImmediate`) or device memory read when
//! each call runs (`ncclScalarDevice`). A reduction with it first multiplies this rank's input
//! by this rank's scalar, into a scratch buffer of the communicator, in stream order (the
//! built-in kernel `symcomm_premul`, one rounding per product), and then runs the collective as
//! a sum of that buffer — so each rank's scalar may differ, as NCCL allows.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use symcomm::{Buffer, DEVICE_IMAGE, DataType, Kernel, KernelArgs, LaunchConfig, Stream};

use crate::comm::{self, Comm};
use crate::error::{Fail, guard};
use crate::init::put;
use crate::types::{CommPtr, NcclResult, data_type};

/// `ncclNumOps`: the first value of a communicator's own ops.
pub(crate) const FIRST_OP: c_int = 5;
/// `ncclScalarDevice`.
const SCALAR_DEVICE: c_int = 0;
/// `ncclScalarHostImmediate`.
const SCALAR_HOST_IMMEDIATE: c_int = 1;
/// Threads per CTA of the pre-multiplication, and the most CTAs it uses.
const THREADS: u32 = 256;
const MAX_CTAS: u64 = 1024;

/// One pre-multiplied-sum op.
pub(crate) struct PreMul {
    pub(crate) dtype: DataType,
    /// Where the kernel reads the scalar: `value`'s memory, or the caller's device memory.
    scalar: u64,
    /// The copied value (`ncclScalarHostImmediate`), in device memory.
    _value: Option<Buffer>,
}

/// A communicator's ops and the kernel they use.
#[derive(Default)]
pub(crate) struct PreMulState {
    ops: Mutex<Vec<Option<Arc<PreMul>>>>,
    kernel: OnceLock<Kernel>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PreMulState {
    /// The op `value` names, if it is one of this communicator's.
    ///
    /// # Errors
    /// `ncclInvalidArgument` for a value at or past `ncclNumOps` that names no live op here.
    pub(crate) fn find(&self, value: c_int) -> Result<Arc<PreMul>, Fail> {
        let index = usize::try_from(value - FIRST_OP).ok();
        index
            .and_then(|i| lock(&self.ops).get(i).cloned().flatten())
            .ok_or_else(|| {
                Fail::invalid_argument(format!(
                    "reduction op {value} is neither an ncclRedOp_t (0 ncclSum .. 4 ncclAvg) nor \
                     a live op of this communicator (ncclRedOpCreatePreMulSum)"
                ))
            })
    }

    /// Enqueues `dst = src * op's scalar` (`count` elements) on `stream`, `dst` this stream's
    /// scratch memory of the communicator; returns `dst`'s address.
    ///
    /// # Safety
    /// `src` holds `count` elements of `op.dtype` and stays valid until the stream ran the call.
    pub(crate) unsafe fn scale(
        &self,
        comm: &Comm,
        op: &PreMul,
        src: u64,
        count: u64,
        stream: &Stream,
    ) -> Result<u64, Fail> {
        let bytes = count * op.dtype.size() as u64;
        let dst = comm.scratch(Some(stream.key()), bytes.max(1))?;
        if count == 0 {
            return Ok(dst);
        }
        let kernel = match self.kernel.get() {
            Some(k) => k,
            None => {
                let k = comm.inner.load_kernel(&DEVICE_IMAGE, "symcomm_premul")?;
                self.kernel.get_or_init(|| k)
            }
        };
        let ctas = count.div_ceil(u64::from(THREADS)).min(MAX_CTAS) as u32;
        let args = KernelArgs::new()
            .arg(&src)
            .arg(&dst)
            .arg(&count)
            .arg(&op.dtype.code())
            .arg(&op.scalar);
        // SAFETY: the arguments are symcomm_premul's, in order and with their types; `src` is
        // valid until the stream ran the call (this function's contract), `dst` is this
        // stream's scratch memory (kept until the communicator goes; no other stream writes it), `op.scalar` the op's value (the op is kept alive by the call
        // that uses it) or the caller's device memory (NCCL's contract for ncclScalarDevice).
        unsafe { stream.launch(kernel, LaunchConfig::linear(ctas, THREADS), &args) }?;
        Ok(dst)
    }
}

/// `ncclRedOpCreatePreMulSum`: an op of `comm` that sums each rank's input multiplied by that
/// rank's `scalar` (one element of `datatype`: copied now for `ncclScalarHostImmediate`, read
/// from device memory by every call for `ncclScalarDevice`). `*op` is written on success only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut c_int,
    scalar: *mut c_void,
    datatype: c_int,
    residence: c_int,
    comm: CommPtr,
) -> NcclResult {
    guard("ncclRedOpCreatePreMulSum", || {
        if op.is_null() {
            return Err(Fail::invalid_argument("op is NULL"));
        }
        let c = comm::lookup(comm)?;
        c.check_usable()?;
        let dtype = data_type(datatype)?;
        if scalar.is_null() {
            return Err(Fail::invalid_argument("scalar is NULL"));
        }
        let (addr, value) = match residence {
            SCALAR_DEVICE => (scalar as u64, None),
            SCALAR_HOST_IMMEDIATE => {
                // SAFETY: NCCL's contract: `scalar` points to one element of `datatype` in host
                // memory, read now.
                let bytes = unsafe {
                    std::slice::from_raw_parts(scalar.cast::<u8>().cast_const(), dtype.size())
                };
                let buffer = Buffer::new(c.inner.backend(), dtype.size())?;
                buffer.write(0, bytes)?;
                (buffer.addr(), Some(buffer))
            }
            other => {
                return Err(Fail::invalid_argument(format!(
                    "residence {other} is neither ncclScalarDevice (0) nor \
                     ncclScalarHostImmediate (1)"
                )));
            }
        };
        let made = Arc::new(PreMul {
            dtype,
            scalar: addr,
            _value: value,
        });
        let mut ops = lock(&c.premul.ops);
        let index = match ops.iter().position(Option::is_none) {
            Some(i) => {
                ops[i] = Some(made);
                i
            }
            None => {
                ops.push(Some(made));
                ops.len() - 1
            }
        };
        let value = c_int::try_from(index)
            .ok()
            .and_then(|i| i.checked_add(FIRST_OP))
            .ok_or_else(|| Fail::invalid_usage("too many reduction ops on this communicator"))?;
        put(op, "op", value)
    })
}

/// `ncclRedOpDestroy`: frees an op made by `ncclRedOpCreatePreMulSum` on `comm` (calls already
/// made with it keep it until they ran).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclRedOpDestroy(op: c_int, comm: CommPtr) -> NcclResult {
    guard("ncclRedOpDestroy", || {
        let c = comm::lookup(comm)?;
        if (0..FIRST_OP).contains(&op) {
            return Err(Fail::invalid_argument(format!(
                "op {op} is a built-in ncclRedOp_t; only ops of ncclRedOpCreatePreMulSum are \
                 destroyed"
            )));
        }
        c.premul.find(op)?;
        lock(&c.premul.ops)[(op - FIRST_OP) as usize] = None;
        Ok(())
    })
}

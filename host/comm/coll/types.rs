//! The argument types of the collectives: element types, reduction operations, and buffer
//! references (a window's range or ordinary device memory).

use std::marker::PhantomData;
use std::sync::Arc;

use symcomm_device::abi::WindowHandleRaw;

use crate::DevicePlain;
use crate::comm::Window;
use crate::comm::memory::FlatMapping;
use crate::stream::{Buffer, Retained};
use crate::{Error, Result};

/// Element type of a collective. Names as in nccl-tests (`float`, `bfloat16`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DataType {
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// FP8 E4M3 (OCP).
    Fp8E4m3,
    /// FP8 E5M2 (OCP).
    Fp8E5m2,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

/// Prefix of every built-in collective kernel's name.
const KERNEL_PREFIX: &str = "symcomm_collective_";

impl DataType {
    /// Every type, in `SYMCOMM_DTYPE_*` code order.
    pub const ALL: [DataType; 12] = [
        DataType::F32,
        DataType::F64,
        DataType::F16,
        DataType::Bf16,
        DataType::Fp8E4m3,
        DataType::Fp8E5m2,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
    ];

    /// The `SYMCOMM_DTYPE_*` code.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F16 | DataType::Bf16 => 2,
            _ => 1,
        }
    }

    /// The nccl-tests name (`float`, `double`, `half`, `bfloat16`, `f8e4m3`, `f8e5m2`, `int8`,
    /// `uint8`, `int32`, `uint32`, `int64`, `uint64`).
    pub fn name(self) -> &'static str {
        [
            "float", "double", "half", "bfloat16", "f8e4m3", "f8e5m2", "int8", "uint8", "int32",
            "uint32", "int64", "uint64",
        ][self as usize]
    }

    /// Parses a nccl-tests name or a Rust-style one (`f32`, `bf16`, `fp8_e4m3`, `u8`, ...).
    pub fn parse(s: &str) -> Option<Self> {
        DataType::ALL
            .into_iter()
            .find(|d| d.name() == s || d.rust_name() == s)
    }

    /// Whether the type is a floating-point one.
    pub fn is_float(self) -> bool {
        (self as u32) < 6
    }

    /// The Rust-style name (`f32`, `bf16`, `fp8_e4m3`, `u8`, ...): the suffix of
    /// [`kernel_name`](Self::kernel_name).
    fn rust_name(self) -> &'static str {
        let kernel = self.kernel_name();
        kernel.strip_prefix(KERNEL_PREFIX).unwrap_or(kernel)
    }

    /// The name of the built-in collective kernel for this type in
    /// [`DEVICE_IMAGE`](crate::DEVICE_IMAGE): `symcomm_collective_` followed by the
    /// Rust-style name that [`parse`](Self::parse) accepts (`f32`, `bf16`, `fp8_e4m3`, ...).
    pub fn kernel_name(self) -> &'static str {
        [
            "symcomm_collective_f32",
            "symcomm_collective_f64",
            "symcomm_collective_f16",
            "symcomm_collective_bf16",
            "symcomm_collective_fp8_e4m3",
            "symcomm_collective_fp8_e5m2",
            "symcomm_collective_i8",
            "symcomm_collective_u8",
            "symcomm_collective_i32",
            "symcomm_collective_u32",
            "symcomm_collective_i64",
            "symcomm_collective_u64",
        ][self as usize]
    }
}

/// Reduction operation. Every type supports every op; sums of small floating-point types
/// accumulate in f32 and round once; `Avg` divides the sum by the rank count (integer division
/// for integers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RedOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Average (sum / ranks).
    Avg,
}

impl RedOp {
    /// Every op, in `SYMCOMM_REDOP_*` code order.
    pub const ALL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::Avg];

    /// The `SYMCOMM_REDOP_*` code.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// `sum`, `prod`, `min`, `max`, `avg` (nccl-tests names).
    pub fn name(self) -> &'static str {
        ["sum", "prod", "min", "max", "avg"][self as usize]
    }

    /// Parses [`RedOp::name`].
    pub fn parse(s: &str) -> Option<Self> {
        RedOp::ALL.into_iter().find(|o| o.name() == s)
    }
}

/// A buffer argument of a collective: (part of) a symmetric window of this communicator —
/// used in place, zero-copy — or ordinary device memory, copied through the staging windows.
///
/// Lifetime: collectives are asynchronous. Dropping a window, a [`Buffer`] or the communicator
/// waits for the calls already issued through the collectives; a graph that captured calls
/// keeps their windows, buffers and communicator alive until it drops (see
/// [`Graph`](crate::Graph)). Raw memory ([`Self::from_raw`]) must stay allocated until the
/// stream has run the call (or the last launch of a graph that captured it), as with NCCL and
/// CUDA: synchronize the stream (or an event recorded after the call) first.
#[derive(Debug, Clone, Copy)]
pub struct BufferRef<'a> {
    /// Device address of this rank's first byte.
    pub(in crate::comm) addr: u64,
    pub(in crate::comm) bytes: u64,
    /// The whole window and the byte offset into it, with its communicator's identity.
    pub(super) window: Option<(WindowHandleRaw, u64, usize)>,
    /// The [`Buffer`] the memory belongs to: calls record their last use of it, which its drop
    /// waits for.
    pub(in crate::comm) buffer: Option<&'a Buffer>,
    /// The window's mapping, which a graph that captures the call keeps alive.
    mapping: Option<&'a Arc<FlatMapping>>,
    _borrow: PhantomData<&'a ()>,
}

impl<'a> BufferRef<'a> {
    /// Ordinary device memory at `addr` (on the emulator: host memory) of `bytes` bytes — for
    /// example a cudarc `CudaSlice`'s device pointer.
    ///
    /// # Safety
    /// `addr..addr + bytes` is device memory of the communicator's GPU (emulator: host memory)
    /// that stays allocated, and is not used by other work, until the collectives using it have
    /// finished in stream order.
    pub unsafe fn from_raw(addr: u64, bytes: u64) -> BufferRef<'static> {
        BufferRef {
            addr,
            bytes,
            window: None,
            buffer: None,
            mapping: None,
            _borrow: PhantomData,
        }
    }

    /// No memory (a placeholder the validation refuses).
    pub(in crate::comm) fn empty() -> BufferRef<'a> {
        BufferRef {
            addr: 0,
            bytes: 0,
            window: None,
            buffer: None,
            mapping: None,
            _borrow: PhantomData,
        }
    }

    /// Bytes `offset..offset + bytes` of this buffer (within it: the caller checked), for the
    /// phases of a collective across hosts.
    pub(in crate::comm) fn part(&self, offset: u64, bytes: u64) -> BufferRef<'a> {
        debug_assert!(offset + bytes <= self.bytes);
        BufferRef {
            addr: self.addr + offset,
            bytes,
            window: self.window.map(|(w, off, owner)| (w, off + offset, owner)),
            ..*self
        }
    }

    /// Bytes in the buffer.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether it is (part of) a symmetric window.
    pub fn is_window(&self) -> bool {
        self.window.is_some()
    }

    /// What a graph that records a call on this buffer keeps alive: the window's mapping or the
    /// buffer's memory (raw memory: nothing).
    pub(in crate::comm) fn retained(&self) -> Option<Retained> {
        match (self.mapping, self.buffer) {
            (Some(m), _) => Some(Arc::clone(m) as Retained),
            (None, Some(b)) => Some(b.retained()),
            (None, None) => None,
        }
    }
}

impl<'a, T: DevicePlain> From<&'a Window<T>> for BufferRef<'a> {
    fn from(w: &'a Window<T>) -> Self {
        w.range(0, w.len()).unwrap_or_else(|_| BufferRef::empty())
    }
}

impl<'a> From<&'a Buffer> for BufferRef<'a> {
    fn from(b: &'a Buffer) -> Self {
        BufferRef {
            addr: b.addr(),
            bytes: b.len() as u64,
            window: None,
            buffer: Some(b),
            mapping: None,
            _borrow: PhantomData,
        }
    }
}

impl<T: DevicePlain> Window<T> {
    /// Elements `offset..offset + len` of this window as a collective buffer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] out of bounds.
    pub fn range(&self, offset: usize, len: usize) -> Result<BufferRef<'_>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => {}
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "elements {offset}..{offset}+{len} are outside a window of {}",
                    self.len()
                )));
            }
        }
        let raw = self.device_handle().raw();
        let off = (offset * size_of::<T>()) as u64;
        Ok(BufferRef {
            addr: self.mapping().copy_addr(raw.rank)? + off,
            bytes: (len * size_of::<T>()) as u64,
            window: Some((raw, off, Arc::as_ptr(self.communicator()) as usize)),
            buffer: None,
            mapping: Some(self.mapping()),
            _borrow: PhantomData,
        })
    }
}

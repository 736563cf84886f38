//! Plain data ([`DevicePlain`]): what moves byte for byte between the host and device code —
//! window and buffer elements, and kernel parameters.

use symcomm_device::abi::{
    CollArgs, DevComm, ErrorRecord, P2pArgs, P2pOp, SYMCOMM_DTYPE_F32, SYMCOMM_DTYPE_F64,
    SYMCOMM_DTYPE_I8, SYMCOMM_DTYPE_I32, SYMCOMM_DTYPE_I64, SYMCOMM_DTYPE_NONE, SYMCOMM_DTYPE_U32,
    SYMCOMM_DTYPE_U64, WindowHandleRaw,
};

#[cfg(doc)]
use crate::{Buffer, KernelArgs, Window};

/// Plain data that moves between host and device code byte for byte: the elements of
/// [`Window`]s and [`Buffer`]s (written and read as bytes), and kernel parameters passed by
/// value ([`KernelArgs::arg`], where an alignment above 8 is refused at compile time).
///
/// Implement it for your own `#[repr(C)]` structs (the twins of your kernels' parameter or
/// element structs); symcomm implements it for the primitive integers and floats and the ABI
/// structs.
///
/// # Safety
/// Implementors are `Copy`, have no padding bytes (every byte of a value is initialized), accept
/// every bit pattern of their size as a valid value, and hold no pointers to host state that a
/// copy or a launch could outlive (device addresses are `u64`). As kernel parameters, their
/// layout is the one the kernel expects.
pub unsafe trait DevicePlain: Copy + 'static {
    /// The `SYMCOMM_DTYPE_*` code a window of this type carries to the device
    /// (`WindowHandleRaw::dtype`), where collectives of another type refuse it. The default,
    /// `SYMCOMM_DTYPE_NONE`, lets collectives of any type of the same size (or, for a 1-byte
    /// type, any type at all) use the window: right for user structs, and for `u8`, `u16` and
    /// `i16`, which Rust programs use to hold fp8, f16 and bf16 values and raw bytes.
    const DTYPE: u32 = SYMCOMM_DTYPE_NONE;
}

macro_rules! device_plain {
    ($($t:ty $(= $code:expr)?),*) => {$(
        // SAFETY: primitive integers and floats, and the ABI structs (all-integer `repr(C)` with
        // no padding, alignment 8, device addresses as `u64`, pinned by the layout assertions in
        // abi.h and abi.rs), accept every bit pattern.
        unsafe impl DevicePlain for $t {
            $(const DTYPE: u32 = $code;)?
        }
    )*};
}
device_plain!(
    u8,
    u16,
    u32 = SYMCOMM_DTYPE_U32,
    u64 = SYMCOMM_DTYPE_U64,
    i8 = SYMCOMM_DTYPE_I8,
    i16,
    i32 = SYMCOMM_DTYPE_I32,
    i64 = SYMCOMM_DTYPE_I64,
    f32 = SYMCOMM_DTYPE_F32,
    f64 = SYMCOMM_DTYPE_F64,
    DevComm,
    WindowHandleRaw,
    CollArgs,
    P2pArgs,
    P2pOp,
    ErrorRecord
);

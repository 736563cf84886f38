//! The C types of the API (`include/nccl.h`): result codes, the opaque communicator, the
//! unique id, the config header, and the mapping of `ncclDataType_t` / `ncclRedOp_t` onto
//! symcomm's [`DataType`] / [`RedOp`].

use std::ffi::{c_char, c_int, c_uint};

use symcomm::{DataType, RedOp};

use crate::error::Fail;

/// `ncclResult_t` (a C enum: `int`).
pub(crate) type NcclResult = c_int;

pub(crate) const NCCL_SUCCESS: NcclResult = 0;
pub(crate) const NCCL_UNHANDLED_CUDA_ERROR: NcclResult = 1;
pub(crate) const NCCL_SYSTEM_ERROR: NcclResult = 2;
pub(crate) const NCCL_INTERNAL_ERROR: NcclResult = 3;
pub(crate) const NCCL_INVALID_ARGUMENT: NcclResult = 4;
pub(crate) const NCCL_INVALID_USAGE: NcclResult = 5;
pub(crate) const NCCL_REMOTE_ERROR: NcclResult = 6;
pub(crate) const NCCL_IN_PROGRESS: NcclResult = 7;

/// `struct ncclComm`: what an `ncclComm_t` points to, opaque to C. The pointer is a key into the
/// live-communicator registry (`comm.rs`), never dereferenced.
#[repr(C)]
pub(crate) struct NcclComm {
    _opaque: [u8; 0],
}

/// `ncclComm_t`.
pub(crate) type CommPtr = *mut NcclComm;

/// `ncclUniqueId`: 128 bytes. This library stores the symcomm [`symcomm::UniqueId`] string
/// (`symcomm1:<ip>:<port>:<secret>`, at most 100 characters) NUL-terminated, the rest zero.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct NcclUniqueId {
    pub(crate) internal: [c_char; 128],
}

/// The `ncclConfig_t` header that every NCCL version shares (`size`, `magic`, `version`),
/// followed by `blocking`, the one field this library reads. Callers built against other
/// NCCL headers pass longer structs; `size` says how much of it there is.
#[repr(C)]
pub(crate) struct ConfigHead {
    pub(crate) size: usize,
    pub(crate) magic: c_uint,
    pub(crate) version: c_uint,
    pub(crate) blocking: c_int,
}

/// `NCCL_CONFIG_INITIALIZER`'s magic.
pub(crate) const CONFIG_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`.
pub(crate) const CONFIG_UNDEF_INT: c_int = c_int::MIN;

/// `ncclDataType_t` → [`DataType`].
///
/// # Errors
/// `ncclInvalidArgument` for a value that is no `ncclDataType_t`.
pub(crate) fn data_type(value: c_int) -> Result<DataType, Fail> {
    Ok(match value {
        0 => DataType::I8,
        1 => DataType::U8,
        2 => DataType::I32,
        3 => DataType::U32,
        4 => DataType::I64,
        5 => DataType::U64,
        6 => DataType::F16,
        7 => DataType::F32,
        8 => DataType::F64,
        9 => DataType::Bf16,
        10 => DataType::Fp8E4m3,
        11 => DataType::Fp8E5m2,
        _ => {
            return Err(Fail::invalid_argument(format!(
                "datatype {value} is not an ncclDataType_t (0 ncclInt8 .. 11 ncclFloat8e5m2)"
            )));
        }
    })
}

/// `ncclRedOp_t` → [`RedOp`].
///
/// # Errors
/// `ncclInvalidArgument` for another value (the ops of `ncclRedOpCreatePreMulSum` are looked
/// up by the communicator that made them, `premul.rs`).
pub(crate) fn red_op(value: c_int) -> Result<RedOp, Fail> {
    Ok(match value {
        0 => RedOp::Sum,
        1 => RedOp::Prod,
        2 => RedOp::Max,
        3 => RedOp::Min,
        4 => RedOp::Avg,
        _ => {
            return Err(Fail::invalid_argument(format!(
                "reduction op {value} is not an ncclRedOp_t (0 ncclSum, 1 ncclProd, 2 ncclMax, \
                 3 ncclMin, 4 ncclAvg)"
            )));
        }
    })
}

/// A rank, root or peer given as a C `int`: `0..nranks`.
///
/// # Errors
/// `ncclInvalidArgument` naming `what` when out of range.
pub(crate) fn rank_arg(what: &str, value: c_int, nranks: u32) -> Result<u32, Fail> {
    match u32::try_from(value) {
        Ok(r) if r < nranks => Ok(r),
        _ => Err(Fail::invalid_argument(format!(
            "{what} {value} is not a rank of this communicator (0..{nranks})"
        ))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn every_nccl_type_maps_to_a_distinct_symcomm_type_of_its_size() {
        let sizes = [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1];
        let mut seen = Vec::new();
        for (code, size) in sizes.into_iter().enumerate() {
            let t = data_type(code as c_int).unwrap();
            assert_eq!(t.size(), size, "ncclDataType_t {code}");
            assert!(!seen.contains(&t));
            seen.push(t);
        }
        assert_eq!(data_type(12).unwrap_err().code, NCCL_INVALID_ARGUMENT);
        assert_eq!(data_type(-1).unwrap_err().code, NCCL_INVALID_ARGUMENT);
    }

    #[test]
    fn ops_map_as_nccl_numbers_them() {
        let want = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];
        for (code, op) in want.into_iter().enumerate() {
            assert_eq!(red_op(code as c_int).unwrap(), op);
        }
        assert_eq!(red_op(5).unwrap_err().code, NCCL_INVALID_ARGUMENT);
    }

    #[test]
    fn the_id_and_config_header_have_nccls_layout() {
        assert_eq!(size_of::<NcclUniqueId>(), 128);
        assert_eq!(std::mem::offset_of!(ConfigHead, magic), 8);
        assert_eq!(std::mem::offset_of!(ConfigHead, version), 12);
        assert_eq!(std::mem::offset_of!(ConfigHead, blocking), 16);
    }
}

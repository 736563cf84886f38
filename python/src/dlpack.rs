//! DLPack export of a window's local copy (`Window.__dlpack__`): a capsule holding a
//! `DLManagedTensorVersioned` (`dltensor_versioned`, DLPack 1.0: consumers that ask for it, e.g.
//! numpy 2, get a writable array) or the legacy `DLManagedTensor` (`dltensor`, for consumers
//! that do not) — DLPack's C ABI, written out here — whose manager keeps the window alive.
//!
//! Consumers (`numpy.from_dlpack` on the emulator, `torch.from_dlpack` on a GPU) take the
//! capsule, rename it `used_dltensor[_versioned]` and call the deleter when their array dies; a
//! capsule never consumed is deleted by its own destructor. The deleter only drops Rust values (an `Arc` of
//! the window and the shape), so it needs no GIL and may run on any thread.

use std::ffi::{CStr, c_void};
use std::sync::Arc;

use pyo3::ffi;
use pyo3::prelude::*;

/// `DLDevice`.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// `DLManagedTensor`.
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
struct DlPackVersion {
    major: u32,
    minor: u32,
}

/// `DLManagedTensorVersioned` (DLPack 1.0).
#[repr(C)]
struct DlManagedTensorVersioned {
    version: DlPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*`: 0, a writable view that is not a copy.
    flags: u64,
    dl_tensor: DlTensor,
}

/// `kDLCPU` / `kDLCUDA`.
pub(crate) const DEVICE_CPU: i32 = 1;
pub(crate) const DEVICE_CUDA: i32 = 2;

/// `kDLInt`, `kDLUInt`, `kDLFloat`, `kDLBfloat`.
pub(crate) const CODE_INT: u8 = 0;
pub(crate) const CODE_UINT: u8 = 1;
pub(crate) const CODE_FLOAT: u8 = 2;
pub(crate) const CODE_BFLOAT: u8 = 4;

/// The capsules' names until a consumer takes them (and renames them `used_...`).
const NAME: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";

/// What a tensor describes: `bytes` of memory at `addr` on `device` (type, ordinal), as a
/// C-contiguous array of `shape` elements of `(code, bits)`; `keep` stays alive as long as the
/// tensor.
pub(crate) struct Export {
    pub(crate) addr: u64,
    pub(crate) device: (i32, i32),
    pub(crate) dtype: (u8, u8),
    pub(crate) shape: Vec<i64>,
    pub(crate) keep: Arc<dyn Send + Sync>,
}

/// What the manager owns: the shape the tensor points into, and what keeps the memory alive.
struct Manager {
    shape: Vec<i64>,
    _keep: Arc<dyn Send + Sync>,
}

unsafe extern "C" fn delete(t: *mut DlManagedTensor) {
    if t.is_null() {
        return;
    }
    // SAFETY: `t` and its manager were made by `Box::into_raw` in `capsule` and are deleted
    // exactly once (by the consumer, or by the capsule's destructor when never consumed).
    unsafe {
        let t = Box::from_raw(t);
        drop(Box::from_raw(t.manager_ctx.cast::<Manager>()));
    }
}

unsafe extern "C" fn delete_versioned(t: *mut DlManagedTensorVersioned) {
    if t.is_null() {
        return;
    }
    // SAFETY: as for `delete`, for the versioned struct.
    unsafe {
        let t = Box::from_raw(t);
        drop(Box::from_raw(t.manager_ctx.cast::<Manager>()));
    }
}

unsafe extern "C" fn destroy_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: as for `destroy_capsule`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME_VERSIONED.as_ptr()) == 1 {
            let t = ffi::PyCapsule_GetPointer(capsule, NAME_VERSIONED.as_ptr())
                .cast::<DlManagedTensorVersioned>();
            delete_versioned(t);
        }
    }
}

unsafe extern "C" fn destroy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the capsule; a consumed capsule was renamed (its tensor is
    // the consumer's to delete), an unconsumed one still holds ours.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let t = ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()).cast::<DlManagedTensor>();
            delete(t);
        }
    }
}

/// A capsule for `e`: `dltensor_versioned` when `versioned`, else the legacy `dltensor`.
pub(crate) fn capsule(py: Python<'_>, e: Export, versioned: bool) -> PyResult<Py<PyAny>> {
    let ndim = i32::try_from(e.shape.len())
        .map_err(|_| crate::errors::invalid("too many dimensions for DLPack"))?;
    let mut manager = Box::new(Manager {
        shape: e.shape,
        _keep: e.keep,
    });
    let dl_tensor = DlTensor {
        // The device address as a pointer: DLPack's `data` is an address on `device`.
        data: e.addr as *mut c_void,
        device: DlDevice {
            device_type: e.device.0,
            device_id: e.device.1,
        },
        ndim,
        dtype: DlDataType {
            code: e.dtype.0,
            bits: e.dtype.1,
            lanes: 1,
        },
        shape: manager.shape.as_mut_ptr(),
        // NULL strides: C-contiguous.
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    let manager_ctx = Box::into_raw(manager).cast::<c_void>();
    if versioned {
        let raw = Box::into_raw(Box::new(DlManagedTensorVersioned {
            version: DlPackVersion { major: 1, minor: 0 },
            manager_ctx,
            deleter: Some(delete_versioned),
            flags: 0,
            dl_tensor,
        }));
        new_capsule(py, raw.cast(), NAME_VERSIONED, destroy_versioned).inspect_err(|_| {
            // SAFETY: the capsule was not made, so the tensor is still ours alone.
            unsafe { delete_versioned(raw) }
        })
    } else {
        let raw = Box::into_raw(Box::new(DlManagedTensor {
            dl_tensor,
            manager_ctx,
            deleter: Some(delete),
        }));
        new_capsule(py, raw.cast(), NAME, destroy_capsule).inspect_err(|_| {
            // SAFETY: as above.
            unsafe { delete(raw) }
        })
    }
}

/// A capsule named `name` owning `ptr`, which `destructor` deletes unless a consumer took it.
fn new_capsule(
    py: Python<'_>,
    ptr: *mut c_void,
    name: &'static CStr,
    destructor: ffi::PyCapsule_Destructor,
) -> PyResult<Py<PyAny>> {
    // SAFETY: `ptr` is a valid managed tensor that the capsule owns until consumed or
    // destroyed; `name` is a static C string, as PyCapsule_New requires.
    let obj = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(destructor)) };
    if obj.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `obj` is a new reference returned by PyCapsule_New.
    Ok(unsafe { Py::from_owned_ptr(py, obj) })
}

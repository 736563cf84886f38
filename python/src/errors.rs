//! The library's errors as Python exceptions. The classes are defined in Python
//! (`symcomm/errors.py`: one per kind of failure, all under `symcomm.Error`, invalid arguments
//! also `ValueError`s); this maps each [`symcomm::Error`] onto its class by name.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// The name of the `symcomm.errors` class for `e`.
fn class_name(e: &symcomm::Error) -> &'static str {
    use symcomm::Error as E;
    if e.is_timeout() {
        return "Timeout";
    }
    match e {
        E::InvalidArgument(_) | E::UnknownKernel(_) => "InvalidArgument",
        E::Aborted { .. } => "Aborted",
        E::PeerLost { .. } => "PeerLost",
        E::Mismatch { .. } => "Mismatch",
        E::PeerFailed { .. } => "PeerFailed",
        E::Unsupported(_) => "Unsupported",
        E::NoDriver(_) | E::Nvrtc { .. } => "NoDriver",
        E::Cuda { .. } => "CudaError",
        E::AuthFailed(_) | E::VersionMismatch { .. } | E::Bootstrap { .. } => "BootstrapError",
        _ => "Error",
    }
}

/// The Python exception for `e`, with the library's message (which never holds a secret).
pub(crate) fn to_py(e: symcomm::Error) -> PyErr {
    raise(class_name(&e), e.to_string())
}

/// An exception of class `name` of `symcomm.errors` with `msg`.
pub(crate) fn raise(name: &str, msg: String) -> PyErr {
    Python::attach(|py| {
        let made = py
            .import("symcomm.errors")
            .and_then(|m| m.getattr(name))
            .and_then(|cls| cls.call1((msg.clone(),)));
        match made {
            Ok(value) => PyErr::from_value(value),
            // The package is not importable (the extension loaded on its own): still an error.
            Err(_) => PyRuntimeError::new_err(format!("symcomm.{name}: {msg}")),
        }
    })
}

/// `InvalidArgument` with `msg`.
pub(crate) fn invalid(msg: impl Into<String>) -> PyErr {
    raise("InvalidArgument", msg.into())
}

/// The library's `Result` as a `PyResult`.
pub(crate) trait OrRaise<T> {
    fn or_raise(self) -> PyResult<T>;
}

impl<T> OrRaise<T> for symcomm::Result<T> {
    fn or_raise(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

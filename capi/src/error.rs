//! Result codes and messages: how symcomm's errors become `ncclResult_t`, the calling thread's
//! last message (`ncclGetLastError`), and the guard every entry point runs in.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use symcomm::Error;

use crate::types::{
    NCCL_INTERNAL_ERROR, NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE, NCCL_REMOTE_ERROR,
    NCCL_SUCCESS, NCCL_SYSTEM_ERROR, NCCL_UNHANDLED_CUDA_ERROR, NcclResult,
};

/// A failed call: its result code and what went wrong.
#[derive(Debug, Clone)]
pub(crate) struct Fail {
    pub(crate) code: NcclResult,
    pub(crate) message: String,
}

impl Fail {
    pub(crate) fn new(code: NcclResult, message: impl Into<String>) -> Self {
        Fail {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn invalid_argument(message: impl Into<String>) -> Self {
        Fail::new(NCCL_INVALID_ARGUMENT, message)
    }

    pub(crate) fn invalid_usage(message: impl Into<String>) -> Self {
        Fail::new(NCCL_INVALID_USAGE, message)
    }
}

/// The result code of a symcomm error:
/// - bad arguments → `ncclInvalidArgument`; valid requests this build or topology cannot serve,
///   and calls that differ across ranks (a mismatch: the program's error) → `ncclInvalidUsage`;
/// - a lost or failed peer → `ncclRemoteError`;
/// - CUDA driver, NVRTC and kernel-loading failures → `ncclUnhandledCudaError`;
/// - expired deadlines, aborts, the rendezvous, I/O and the emulator → `ncclSystemError`
///   (NCCL 2.21 has no timeout code).
pub(crate) fn code_of(e: &Error) -> NcclResult {
    match e {
        Error::InvalidArgument(_) => NCCL_INVALID_ARGUMENT,
        Error::Unsupported(_) | Error::Mismatch { .. } => NCCL_INVALID_USAGE,
        Error::PeerLost { .. } | Error::PeerFailed { .. } => NCCL_REMOTE_ERROR,
        Error::NoDriver(_) | Error::Cuda { .. } | Error::Nvrtc { .. } | Error::UnknownKernel(_) => {
            NCCL_UNHANDLED_CUDA_ERROR
        }
        _ => NCCL_SYSTEM_ERROR,
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail::new(code_of(&e), e.to_string())
    }
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error.
pub(crate) fn set_last(message: &str) {
    // Interior NULs cannot be in a C string: cut there.
    let text = message.split('\0').next().unwrap_or_default();
    let c = CString::new(text).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

/// This thread's last error message, valid until its next call into the library that fails.
pub(crate) fn last() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// Runs entry point `name`'s body: its error becomes the result code and this thread's last
/// message (`name: message`); a panic (a bug) becomes `ncclInternalError` instead of unwinding
/// into C. The first call installs the logging (`NCCL_DEBUG`, `log.rs`).
pub(crate) fn guard(name: &str, body: impl FnOnce() -> Result<(), Fail>) -> NcclResult {
    guard_code(name, || body().map(|()| NCCL_SUCCESS))
}

/// [`guard`] for a body that chooses its success code (`ncclInProgress`).
pub(crate) fn guard_code(
    name: &str,
    body: impl FnOnce() -> Result<NcclResult, Fail>,
) -> NcclResult {
    crate::log::ensure_installed();
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(Fail::new(
            NCCL_INTERNAL_ERROR,
            format!("internal error (a panic in symcomm-nccl: {what})"),
        ))
    });
    match outcome {
        Ok(code) => code,
        Err(f) => {
            set_last(&format!("{name}: {}", f.message));
            f.code
        }
    }
}

/// `ncclGetErrorString`'s texts.
pub(crate) fn describe(code: NcclResult) -> &'static [u8] {
    match code {
        0 => b"no error\0",
        1 => b"unhandled cuda error (ncclGetLastError says which)\0",
        2 => b"unhandled system error (ncclGetLastError says which)\0",
        3 => b"internal error - please report this issue to the symcomm developers\0",
        4 => b"invalid argument (ncclGetLastError says which)\0",
        5 => b"invalid usage (ncclGetLastError says which)\0",
        6 => b"remote process exited or there was a network error\0",
        7 => b"NCCL operation in progress\0",
        _ => b"unknown result code\0",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use std::ffi::CStr;

    use super::*;

    #[test]
    fn errors_map_to_their_documented_codes() {
        let arg = Error::InvalidArgument("x".into());
        assert_eq!(code_of(&arg), NCCL_INVALID_ARGUMENT);
        let lost = Error::PeerLost {
            rank: 1,
            reason: "gone".into(),
        };
        assert_eq!(code_of(&lost), NCCL_REMOTE_ERROR);
        let cuda = Error::Cuda {
            call: "cuInit",
            error: "CUDA_ERROR_NO_DEVICE".into(),
        };
        assert_eq!(code_of(&cuda), NCCL_UNHANDLED_CUDA_ERROR);
        let timeout = Error::Timeout {
            rank: 0,
            peer: 1,
            op: "barrier",
            detail: String::new(),
        };
        assert_eq!(code_of(&timeout), NCCL_SYSTEM_ERROR);
        let mismatch = Error::Mismatch {
            rank: 0,
            peer: 1,
            what: "count".into(),
        };
        assert_eq!(code_of(&mismatch), NCCL_INVALID_USAGE);
    }

    #[test]
    fn the_guard_names_the_call_and_keeps_the_message() {
        let code = guard("ncclTest", || Err(Fail::invalid_usage("not\0here")));
        assert_eq!(code, NCCL_INVALID_USAGE);
        // SAFETY: `last` points at this thread's live CString.
        let text = unsafe { CStr::from_ptr(last()) }.to_str().unwrap();
        assert_eq!(text, "ncclTest: not");
        assert_eq!(guard("ncclTest", || Ok(())), NCCL_SUCCESS);
        let panicked = guard("ncclTest", || panic!("boom"));
        assert_eq!(panicked, NCCL_INTERNAL_ERROR);
    }

    #[test]
    fn every_code_has_a_nul_terminated_text() {
        for code in -1..10 {
            assert!(CStr::from_bytes_with_nul(describe(code)).is_ok());
        }
    }
}

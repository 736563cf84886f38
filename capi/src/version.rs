//! The NCCL version this library reports, and why.
//!
//! 2.21.5: callers gate features on `ncclGetVersion` (PyTorch refuses `ncclCommShrink` below
//! 2.27, uses `ncclCommInitRankScalable` from 2.23, symmetric windows from 2.27; nccl-tests
//! compiles `CTAPolicy` and window registration only for newer headers), so a version below
//! those keeps such callers on the calls this library implements. 2.21's `ncclConfig_t` is the
//! layout `include/nccl.h` declares (the 2.17 one: header, `blocking`, CTAs, `netName`,
//! `splitShare`). Raise it with the functions that later versions' callers expect.

/// `NCCL_MAJOR`.
pub(crate) const MAJOR: i32 = 2;
/// `NCCL_MINOR`.
pub(crate) const MINOR: i32 = 21;
/// `NCCL_PATCH`.
pub(crate) const PATCH: i32 = 5;
/// `NCCL_VERSION_CODE`: `MAJOR * 10000 + MINOR * 100 + PATCH` (NCCL's coding from 2.9 on).
pub(crate) const CODE: i32 = MAJOR * 10000 + MINOR * 100 + PATCH;

/// The version as `2.21.5`, for messages.
pub(crate) fn text() -> String {
    format!("{MAJOR}.{MINOR}.{PATCH}")
}

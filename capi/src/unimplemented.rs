//! The exported names this library does not implement yet. Each exists (a loader that resolves
//! every NCCL symbol at load time, as Python does for PyTorch, finds it) and returns
//! `ncclInvalidUsage` with `ncclGetLastError` naming it; none touches its arguments.
//!
//! They are defined without parameters: under the C calling conventions of the supported
//! targets (System V x86-64, AAPCS64) the caller passes and cleans up the arguments, so a callee
//! that reads none of them and returns an `int` is sound for any argument list.

use crate::error::{Fail, guard};
use crate::types::NcclResult;

macro_rules! not_implemented {
    ($($name:ident),* $(,)?) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: not implemented yet (`ncclInvalidUsage`).")]
            #[unsafe(no_mangle)]
            pub extern "C" fn $name() -> NcclResult {
                refuse(stringify!($name))
            }
        )*
        /// Every name defined here.
        #[cfg(test)]
        pub(crate) const NAMES: &[&str] = &[$(stringify!($name)),*];
    };
}

fn refuse(name: &str) -> NcclResult {
    guard(name, || {
        Err(Fail::invalid_usage(format!(
            "{name} is not implemented by symcomm-nccl (reporting NCCL {}); nothing was done",
            crate::version::text()
        )))
    })
}

not_implemented!(
    ncclCommGetUniqueId,
    ncclCommGrow,
    ncclCommInitRankScalable,
    ncclCommMemStats,
    ncclCommResume,
    ncclCommRevoke,
    ncclCommShrink,
    ncclCommSuspend,
    ncclDevCommCreate,
    ncclDevCommDestroy,
    ncclGetLsaMultimemDevicePointer,
    ncclGetPeerDevicePointer,
    ncclGroupSimulateEnd,
    ncclPutSignal,
    ncclSignal,
    ncclWaitSignal,
);

#[cfg(test)]
mod tests {
    use super::NAMES;

    #[test]
    fn names_are_distinct() {
        let mut sorted = NAMES.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), NAMES.len());
    }
}

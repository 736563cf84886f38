//! Put / get / put with signal between ranks (`include/symcomm/p2p.cuh`; the contracts there
//! hold here). Element types of 1, 2, 4 or 8 bytes; any other size is refused with
//! `InvalidArgument` before anything is touched.

use core::mem::size_of;

use crate::abi::DevComm;
use crate::ffi;
use crate::group::Group;
use crate::signal::Status;
use crate::window::WindowSlice;

/// Copies `count` elements from `src` into the first `count` elements of slice `dst` in rank
/// `peer`'s copy. Who calls: every thread of `g`, same arguments; the group is synchronized
/// before the copy reads `src`. On return the stores are issued but not ordered for the peer:
/// follow with a release (a signal after `g.sync()`), a barrier, or use [`put_with_signal`].
/// Returns `Ok`, or `InvalidArgument` with nothing copied when `peer >= dst.nranks()`, `dst` does
/// not hold `T`, or `dst.fits(count, 1)` is false.
///
/// # Safety
/// `src` is valid for reads of `count` elements of `T` on every thread of the group.
#[inline(always)]
pub unsafe fn put<G: Group, T: Copy>(
    g: G,
    src: *const T,
    dst: WindowSlice<T>,
    peer: u32,
    count: u64,
) -> Status {
    let _ = g;
    // SAFETY: the caller's contract for `src`; `dst` is checked by the callee before any access.
    Status::from_code(unsafe {
        ffi::symcomm_rs_put(
            G::CODE,
            src.cast(),
            &dst.window.raw,
            dst.offset,
            peer,
            count,
            size_of::<T>() as u32,
        )
    })
}

/// Copies the first `count` elements of slice `src` in rank `peer`'s copy into `dst`. The caller
/// must have acquired the peer's data first (a signal wait or barrier). Refusals as [`put`].
///
/// # Safety
/// `dst` is valid for writes of `count` elements of `T` on every thread of the group.
#[inline(always)]
pub unsafe fn get<G: Group, T: Copy>(
    g: G,
    src: WindowSlice<T>,
    peer: u32,
    dst: *mut T,
    count: u64,
) -> Status {
    let _ = g;
    // SAFETY: the caller's contract for `dst`; `src` is checked by the callee.
    Status::from_code(unsafe {
        ffi::symcomm_rs_get(
            G::CODE,
            &src.window.raw,
            src.offset,
            peer,
            dst.cast(),
            count,
            size_of::<T>() as u32,
        )
    })
}

/// [`put`], then the group synchronizes and one thread release-stores `value` into the signal
/// word `word` that `peer` reserves for this rank: when the peer's
/// `signal_wait_until(.., rank, word, value)` returns `Ok`, every element is visible to it.
/// Pre: `value` larger than any earlier value of that word. Refusals are recorded in the rank's
/// ErrorRecord (see p2p.cuh).
///
/// # Safety
/// As [`put`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn put_with_signal<G: Group, T: Copy>(
    g: G,
    comm: &DevComm,
    src: *const T,
    dst: WindowSlice<T>,
    peer: u32,
    count: u64,
    word: u32,
    value: u64,
) -> Status {
    let _ = g;
    // SAFETY: as put.
    Status::from_code(unsafe {
        ffi::symcomm_rs_put_with_signal(
            comm,
            G::CODE,
            src.cast(),
            &dst.window.raw,
            dst.offset,
            peer,
            count,
            size_of::<T>() as u32,
            word,
            value,
        )
    })
}

//! Barriers across ranks with fingerprints, and the grid-wide sync (`include/symcomm/barrier.cuh`,
//! `grid.cuh`; the contracts there hold here).

use crate::abi::DevComm;
use crate::ffi;
use crate::group::{Cta, Group};
use crate::memory::Scope;
use crate::signal::Status;

/// Hash of what a collective call is (kind, dtype, reduction op, element count, root), carried by
/// its barriers so that mismatched calls across ranks are detected. Any thread may call it.
#[inline(always)]
pub fn fingerprint(kind: u32, dtype: u32, op: u32, count: u64, root: u32) -> u32 {
    // SAFETY: a pure function of its arguments.
    unsafe { ffi::symcomm_rs_fingerprint(kind, dtype, op, count, root) }
}

/// A fingerprint of a user kernel's own call: a hash of the user's `tag` (which step, which
/// kernel) and two values (sizes, a layer number, ...). Pass it to [`barrier`] so that ranks that
/// reached different steps, or the same step with different sizes, get `Mismatch` on both sides
/// instead of exchanging data. Equal arguments give equal fingerprints on every rank and GPU, and
/// the same as C++'s `user_fingerprint`.
#[inline(always)]
pub fn user_fingerprint(tag: u32, a: u64, b: u64) -> u32 {
    // SAFETY: a pure function of its arguments.
    unsafe { ffi::symcomm_rs_user_fingerprint(tag, a, b) }
}

/// Barrier across every rank of `comm` on barrier index `index`.
///
/// Who calls: every thread of group `g`, on every rank, with the same `index` and (to succeed) the
/// same `fp`. At most one group per rank uses a given index at a time. Users' kernels use indices
/// in `[SYMCOMM_USER_BARRIER_FIRST, SYMCOMM_USER_BARRIER_END)`, which no host collective touches.
/// Ordering: every write of the group's threads (on any rank, to any rank's memory) before the
/// barrier is visible to every thread of every rank's group after its barrier returned `Ok`.
/// Returns (the same on every thread of the group) `Ok`, `Mismatch`, `Timeout`, `Aborted`,
/// `InvalidArgument` for an index `>= SYMCOMM_USER_BARRIER_END` (nothing touched), or at once an
/// earlier recorded error's status; failures are recorded in the rank's ErrorRecord.
#[inline(always)]
pub fn barrier<G: Group>(g: G, comm: &DevComm, index: u32, fp: u32) -> Status {
    let _ = g;
    // SAFETY: `comm` is a live handle; a collective call of `g` (the caller's contract).
    Status::from_code(unsafe { ffi::symcomm_rs_barrier(comm, G::CODE, index, fp) })
}

/// Synchronizes every CTA of the calling grid (see grid.cuh): returns once every CTA of the
/// launch called it the same number of times. `scope` is the CTAs' scope: [`Scope::Gpu`] (one
/// launch runs on one GPU). Returns `Ok`, `Timeout` (a CTA did not arrive: e.g. not co-resident),
/// `Aborted`, or at once an earlier recorded error's status.
///
/// # Safety
/// `state` points to a word of this rank's device memory, zero when first used, used only by
/// `grid_sync` of this one grid at a time; every thread of every CTA calls with the same
/// `state`, and every CTA of the grid is co-resident.
#[inline(always)]
pub unsafe fn grid_sync(g: Cta, comm: &DevComm, scope: Scope, state: *mut u64) -> Status {
    let _ = g;
    // SAFETY: the caller's contract.
    Status::from_code(unsafe { ffi::symcomm_rs_grid_sync(comm, scope as u32, state) })
}

//! Signals between ranks, bounded waits, error records and semaphores
//! (`include/symcomm/signal.cuh`, `semaphore.cuh`; the contracts there hold here word for word).
//!
//! A signal is a 64-bit word in the communicator's signal area that only grows (an epoch). Rank
//! p signals rank r by release-storing (or release-adding) into r's word reserved for p; r waits
//! with acquire loads until the word reaches a value. Users' signals take words in
//! `[0, SYMCOMM_USER_SIGNAL_END)` only and refuse any other word (and a peer outside the team)
//! with [`Status::InvalidArgument`], touching nothing.
//!
//! Every wait is bounded: it polls the communicator's abort flag and a deadline
//! (`DevComm::timeout_ns`) and returns a [`Status`] instead of spinning forever. A failed wait
//! records the rank's first error in its ErrorRecord, which the host reads after the kernel
//! (`Communicator::check_error`); once it holds an error every later wait returns that status at
//! once.

use crate::abi::DevComm;
use crate::ffi;
use crate::group::{Group, Thread};
use crate::memory::Scope;

/// Result of a wait, a barrier or a collective (the `SYMCOMM_STATUS_*` codes of abi.h).
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    /// Completed.
    Ok = 0,
    /// A bounded wait passed its deadline (`DevComm::timeout_ns`).
    Timeout = 1,
    /// The communicator's abort flag was raised while waiting.
    Aborted = 2,
    /// A peer called a different collective or barrier (the fingerprint differs).
    Mismatch = 3,
    /// The kernel was built against a different ABI version than the host.
    AbiMismatch = 4,
    /// A precondition failed (a bad code, an out-of-range index, overlapping buffers).
    InvalidArgument = 5,
}

impl Status {
    /// The status of a `SYMCOMM_STATUS_*` code; an unknown code is `InvalidArgument`.
    #[inline(always)]
    pub fn from_code(code: u32) -> Status {
        match code {
            0 => Status::Ok,
            1 => Status::Timeout,
            2 => Status::Aborted,
            3 => Status::Mismatch,
            4 => Status::AbiMismatch,
            _ => Status::InvalidArgument,
        }
    }

    /// The `SYMCOMM_STATUS_*` code.
    #[inline(always)]
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Whether this is [`Status::Ok`].
    #[inline(always)]
    pub fn is_ok(self) -> bool {
        self == Status::Ok
    }

    /// `Ok(())` for [`Status::Ok`], else `Err(self)`: for `?` in kernel helpers.
    #[inline(always)]
    pub fn ok(self) -> Result<(), Status> {
        if self.is_ok() { Ok(()) } else { Err(self) }
    }
}

/// Records a user kernel's own error in this rank's ErrorRecord (first error wins): op
/// `SYMCOMM_OP_USER`, detail `code << 32 | value`. The host turns it into the matching error,
/// whose message names "user code 0x<code>, value <value>"; every later wait of the rank returns
/// `status` at once. Any thread may call it; it never blocks; an `Ok` status records nothing.
#[inline(always)]
pub fn record_user_error(
    _: Thread,
    comm: &DevComm,
    status: Status,
    peer: u32,
    code: u32,
    value: u32,
) {
    // SAFETY: `comm` is a live handle; the function only reads it and the error record it names.
    unsafe { ffi::symcomm_rs_record_user_error(comm, status.code(), peer, code, value) }
}

/// The status of this rank's first recorded error (`Ok` while none was recorded).
#[inline(always)]
pub fn recorded_error(comm: &DevComm) -> Status {
    // SAFETY: as record_user_error.
    Status::from_code(unsafe { ffi::symcomm_rs_recorded_error(comm) })
}

/// Whether the host (or a peer's failure handling) raised the communicator's abort flag.
#[inline(always)]
pub fn abort_requested(comm: &DevComm) -> bool {
    // SAFETY: as record_user_error.
    unsafe { ffi::symcomm_rs_abort_requested(comm) != 0 }
}

/// Signals `peer`: release-stores `value` into the signal word `word` that `peer` reserves for
/// this rank. Called by one thread. Pre: `value` is larger than any value stored in that word
/// before. Returns `Ok`, or `InvalidArgument` (recorded, nothing stored) unless
/// `peer < comm.nranks` and `word < SYMCOMM_USER_SIGNAL_END`.
#[inline(always)]
pub fn signal_set(
    _: Thread,
    comm: &DevComm,
    scope: Scope,
    peer: u32,
    word: u32,
    value: u64,
) -> Status {
    // SAFETY: `comm` is a live handle; the callee checks peer and word before any access.
    Status::from_code(unsafe { ffi::symcomm_rs_signal_set(comm, scope as u32, peer, word, value) })
}

/// Signals `peer` by adding `delta` to the word `word` it reserves for this rank (atomic, so
/// several threads may add to one word). Returns the status and the word's previous value (0
/// when refused). Refusals as [`signal_set`].
#[inline(always)]
pub fn signal_add(
    _: Thread,
    comm: &DevComm,
    scope: Scope,
    peer: u32,
    word: u32,
    delta: u64,
) -> (Status, u64) {
    let mut previous = 0u64;
    // SAFETY: as signal_set; `previous` is a live local.
    let s = unsafe {
        ffi::symcomm_rs_signal_add(comm, scope as u32, peer, word, delta, &raw mut previous)
    };
    (Status::from_code(s), previous)
}

/// Waits until the signal word `word` that this rank reserves for `peer` holds a value
/// `>= value`. Who calls: every thread of `g`, same arguments; thread 0 of the group polls and
/// the group's vote hands the status and the acquired writes to every thread. Returns (the same
/// on every thread) `Ok` with acquire ordering, `Timeout` / `Aborted` (recorded), at once the
/// status of an error recorded before, or `InvalidArgument` as [`signal_set`].
#[inline(always)]
pub fn signal_wait_until<G: Group>(
    g: G,
    comm: &DevComm,
    scope: Scope,
    peer: u32,
    word: u32,
    value: u64,
) -> Status {
    let _ = g;
    // SAFETY: as signal_set; a collective call of `g` (the caller's contract).
    Status::from_code(unsafe {
        ffi::symcomm_rs_signal_wait_until(comm, G::CODE, scope as u32, peer, word, value)
    })
}

/// Signals the semaphore `word` that `peer` waits on for this rank (release-adds 1). Called by
/// one thread. Refusals as [`signal_set`].
#[inline(always)]
pub fn semaphore_signal(_: Thread, comm: &DevComm, scope: Scope, peer: u32, word: u32) -> Status {
    // SAFETY: as signal_set.
    Status::from_code(unsafe { ffi::symcomm_rs_semaphore_signal(comm, scope as u32, peer, word) })
}

/// Waits for the next signal of `peer` on the semaphore `word`: increments `*expected` (this
/// rank's count of signals consumed, in device memory only this call touches, zero for a fresh
/// communicator) and waits until the word reaches it. Who calls: every thread of `g`, same
/// arguments. On `Ok` `*expected` grew by one; otherwise it is unchanged.
///
/// # Safety
/// `expected` points to device memory of this rank, valid for reads and writes, that no other
/// thread touches during the call.
#[inline(always)]
pub unsafe fn semaphore_wait<G: Group>(
    g: G,
    comm: &DevComm,
    scope: Scope,
    peer: u32,
    word: u32,
    expected: *mut u64,
) -> Status {
    let _ = g;
    // SAFETY: the caller's contract for `expected`; a collective call of `g`.
    Status::from_code(unsafe {
        ffi::symcomm_rs_semaphore_wait(comm, G::CODE, scope as u32, peer, word, expected)
    })
}

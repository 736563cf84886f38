//! Memory ordering primitives (`include/symcomm/memory.cuh`): loads with acquire, stores with
//! release, atomics, at `.gpu` scope (threads of one GPU) or `.sys` scope (every GPU and the
//! host). Ranks sharing one GPU need only [`Scope::Gpu`]; ranks on different GPUs, or a flag the
//! host writes, need [`Scope::Sys`].
//!
//! On a GPU each is one PTX instruction (`ld.acquire.gpu.u64`, `st.release.sys.u64`,
//! `atom.acq_rel.gpu.add.u64`, ...), the same instructions as the C++ headers emit; on the
//! emulator, the matching `core::sync::atomic` operation (the scope is irrelevant on a CPU).
//! Names carry the ordering; there is no default ordering.
//!
//! Every function takes a raw pointer: the word must be valid, aligned to its size, and shared
//! only through atomic accesses while other threads may touch it (the safety contract of each).

/// Visibility scope of an ordered memory operation (`symcomm::Scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Scope {
    /// Threads of the same GPU.
    Gpu = 0,
    /// Every GPU of the system and the host.
    Sys = 1,
}

/// A word the ordered operations apply to: `u32` or `u64`.
pub trait Word: Copy + sealed::Sealed {
    /// Acquire load (see [`ld_acquire`]).
    ///
    /// # Safety
    /// As [`ld_acquire`].
    #[doc(hidden)]
    unsafe fn ld_acquire(scope: Scope, p: *const Self) -> Self;
    /// Relaxed load (see [`ld_relaxed`]).
    ///
    /// # Safety
    /// As [`ld_relaxed`].
    #[doc(hidden)]
    unsafe fn ld_relaxed(scope: Scope, p: *const Self) -> Self;
    /// Release store (see [`st_release`]).
    ///
    /// # Safety
    /// As [`st_release`].
    #[doc(hidden)]
    unsafe fn st_release(scope: Scope, p: *mut Self, v: Self);
    /// Relaxed store (see [`st_relaxed`]).
    ///
    /// # Safety
    /// As [`st_relaxed`].
    #[doc(hidden)]
    unsafe fn st_relaxed(scope: Scope, p: *mut Self, v: Self);
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
}

/// Acquire load: memory operations after it (in this thread) cannot move before it, and it
/// observes everything released before the store it reads from.
///
/// # Safety
/// `p` is valid for reads, aligned, and accessed only atomically by other threads meanwhile.
#[inline(always)]
pub unsafe fn ld_acquire<W: Word>(scope: Scope, p: *const W) -> W {
    // SAFETY: the caller's contract.
    unsafe { W::ld_acquire(scope, p) }
}

/// Relaxed (atomic, unordered) load: never torn, orders nothing.
///
/// # Safety
/// As [`ld_acquire`].
#[inline(always)]
pub unsafe fn ld_relaxed<W: Word>(scope: Scope, p: *const W) -> W {
    // SAFETY: the caller's contract.
    unsafe { W::ld_relaxed(scope, p) }
}

/// Release store: every memory operation this thread performed before it (and, cumulatively,
/// every write it observed, e.g. its CTA's writes ordered by a `Cta` sync) becomes visible to a
/// thread that acquire-loads this value.
///
/// # Safety
/// `p` is valid for writes, aligned, and accessed only atomically by other threads meanwhile.
#[inline(always)]
pub unsafe fn st_release<W: Word>(scope: Scope, p: *mut W, v: W) {
    // SAFETY: the caller's contract.
    unsafe { W::st_release(scope, p, v) }
}

/// Relaxed store: never torn, orders nothing.
///
/// # Safety
/// As [`st_release`].
#[inline(always)]
pub unsafe fn st_relaxed<W: Word>(scope: Scope, p: *mut W, v: W) {
    // SAFETY: the caller's contract.
    unsafe { W::st_relaxed(scope, p, v) }
}

/// Nanoseconds of the GPU's global timer (`%globaltimer`; a steady clock on the emulator). Only
/// differences are meaningful.
#[inline(always)]
pub fn globaltimer_ns() -> u64 {
    crate::arch::globaltimer_ns()
}

/// Spin-loop back-off: `nanosleep` on a GPU, a yield to the other emulated threads on the
/// emulator (which a spinning thread must do for the others to make progress).
#[inline(always)]
pub fn backoff(ns: u32) {
    crate::arch::backoff(ns);
}

#[cfg(target_arch = "nvptx64")]
mod imp {
    use super::{Scope, Word};
    use core::arch::asm;

    /// One PTX instruction per (operation, scope), as impl/memory_ptx.cuh.
    macro_rules! word {
        ($t:ty, $class:ident, $bits:literal) => {
            impl Word for $t {
                #[inline(always)]
                unsafe fn ld_acquire(scope: Scope, p: *const $t) -> $t {
                    let v: $t;
                    // SAFETY: the caller's contract (a valid, aligned word).
                    unsafe {
                        match scope {
                            Scope::Gpu => asm!(concat!("ld.acquire.gpu.u", $bits, " {v}, [{p}];"), v = out($class) v, p = in(reg64) p),
                            Scope::Sys => asm!(concat!("ld.acquire.sys.u", $bits, " {v}, [{p}];"), v = out($class) v, p = in(reg64) p),
                        }
                    }
                    v
                }
                #[inline(always)]
                unsafe fn ld_relaxed(scope: Scope, p: *const $t) -> $t {
                    let v: $t;
                    // SAFETY: as above.
                    unsafe {
                        match scope {
                            Scope::Gpu => asm!(concat!("ld.relaxed.gpu.u", $bits, " {v}, [{p}];"), v = out($class) v, p = in(reg64) p),
                            Scope::Sys => asm!(concat!("ld.relaxed.sys.u", $bits, " {v}, [{p}];"), v = out($class) v, p = in(reg64) p),
                        }
                    }
                    v
                }
                #[inline(always)]
                unsafe fn st_release(scope: Scope, p: *mut $t, v: $t) {
                    // SAFETY: as above.
                    unsafe {
                        match scope {
                            Scope::Gpu => asm!(concat!("st.release.gpu.u", $bits, " [{p}], {v};"), p = in(reg64) p, v = in($class) v),
                            Scope::Sys => asm!(concat!("st.release.sys.u", $bits, " [{p}], {v};"), p = in(reg64) p, v = in($class) v),
                        }
                    }
                }
                #[inline(always)]
                unsafe fn st_relaxed(scope: Scope, p: *mut $t, v: $t) {
                    // SAFETY: as above.
                    unsafe {
                        match scope {
                            Scope::Gpu => asm!(concat!("st.relaxed.gpu.u", $bits, " [{p}], {v};"), p = in(reg64) p, v = in($class) v),
                            Scope::Sys => asm!(concat!("st.relaxed.sys.u", $bits, " [{p}], {v};"), p = in(reg64) p, v = in($class) v),
                        }
                    }
                }
            }
        };
    }
    word!(u32, reg32, "32");
    word!(u64, reg64, "64");

    #[inline(always)]
    pub(super) unsafe fn add_release(scope: Scope, p: *mut u64, v: u64) -> u64 {
        let old: u64;
        // SAFETY: the caller's contract.
        unsafe {
            match scope {
                Scope::Gpu => {
                    asm!("atom.release.gpu.add.u64 {o}, [{p}], {v};", o = out(reg64) old, p = in(reg64) p, v = in(reg64) v)
                }
                Scope::Sys => {
                    asm!("atom.release.sys.add.u64 {o}, [{p}], {v};", o = out(reg64) old, p = in(reg64) p, v = in(reg64) v)
                }
            }
        }
        old
    }
    #[inline(always)]
    pub(super) unsafe fn add_acq_rel(scope: Scope, p: *mut u64, v: u64) -> u64 {
        let old: u64;
        // SAFETY: the caller's contract.
        unsafe {
            match scope {
                Scope::Gpu => {
                    asm!("atom.acq_rel.gpu.add.u64 {o}, [{p}], {v};", o = out(reg64) old, p = in(reg64) p, v = in(reg64) v)
                }
                Scope::Sys => {
                    asm!("atom.acq_rel.sys.add.u64 {o}, [{p}], {v};", o = out(reg64) old, p = in(reg64) p, v = in(reg64) v)
                }
            }
        }
        old
    }
    #[inline(always)]
    pub(super) unsafe fn cas_acq_rel(
        scope: Scope,
        p: *mut u32,
        expected: u32,
        desired: u32,
    ) -> u32 {
        let old: u32;
        // SAFETY: the caller's contract.
        unsafe {
            match scope {
                Scope::Gpu => {
                    asm!("atom.acq_rel.gpu.cas.b32 {o}, [{p}], {e}, {d};", o = out(reg32) old, p = in(reg64) p, e = in(reg32) expected, d = in(reg32) desired)
                }
                Scope::Sys => {
                    asm!("atom.acq_rel.sys.cas.b32 {o}, [{p}], {e}, {d};", o = out(reg32) old, p = in(reg64) p, e = in(reg32) expected, d = in(reg32) desired)
                }
            }
        }
        old
    }
}

#[cfg(not(target_arch = "nvptx64"))]
mod imp {
    use super::{Scope, Word};
    use core::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
    use core::sync::atomic::{AtomicU32, AtomicU64};

    macro_rules! word {
        ($t:ty, $atomic:ty) => {
            impl Word for $t {
                #[inline(always)]
                unsafe fn ld_acquire(_: Scope, p: *const $t) -> $t {
                    // SAFETY: the caller's contract (valid, aligned, accessed atomically).
                    unsafe { <$atomic>::from_ptr(p.cast_mut()) }.load(Acquire)
                }
                #[inline(always)]
                unsafe fn ld_relaxed(_: Scope, p: *const $t) -> $t {
                    // SAFETY: as above.
                    unsafe { <$atomic>::from_ptr(p.cast_mut()) }.load(Relaxed)
                }
                #[inline(always)]
                unsafe fn st_release(_: Scope, p: *mut $t, v: $t) {
                    // SAFETY: as above.
                    unsafe { <$atomic>::from_ptr(p) }.store(v, Release)
                }
                #[inline(always)]
                unsafe fn st_relaxed(_: Scope, p: *mut $t, v: $t) {
                    // SAFETY: as above.
                    unsafe { <$atomic>::from_ptr(p) }.store(v, Relaxed)
                }
            }
        };
    }
    word!(u32, AtomicU32);
    word!(u64, AtomicU64);

    #[inline(always)]
    pub(super) unsafe fn add_release(_: Scope, p: *mut u64, v: u64) -> u64 {
        // SAFETY: the caller's contract.
        unsafe { AtomicU64::from_ptr(p) }.fetch_add(v, Release)
    }
    #[inline(always)]
    pub(super) unsafe fn add_acq_rel(_: Scope, p: *mut u64, v: u64) -> u64 {
        // SAFETY: the caller's contract.
        unsafe { AtomicU64::from_ptr(p) }.fetch_add(v, AcqRel)
    }
    #[inline(always)]
    pub(super) unsafe fn cas_acq_rel(_: Scope, p: *mut u32, expected: u32, desired: u32) -> u32 {
        // SAFETY: the caller's contract.
        match unsafe { AtomicU32::from_ptr(p) }.compare_exchange(expected, desired, AcqRel, Acquire)
        {
            Ok(v) | Err(v) => v,
        }
    }
}

/// Atomic add with release ordering; returns the previous value.
///
/// # Safety
/// As [`st_release`].
#[inline(always)]
pub unsafe fn atomic_add_release(scope: Scope, p: *mut u64, v: u64) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { imp::add_release(scope, p, v) }
}

/// Atomic add with acquire-release ordering; returns the previous value.
///
/// # Safety
/// As [`st_release`].
#[inline(always)]
pub unsafe fn atomic_add_acq_rel(scope: Scope, p: *mut u64, v: u64) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { imp::add_acq_rel(scope, p, v) }
}

/// Compare-and-swap with acquire-release ordering: stores `desired` when the word holds
/// `expected`; returns the previous value either way.
///
/// # Safety
/// As [`st_release`].
#[inline(always)]
pub unsafe fn atomic_cas_acq_rel(scope: Scope, p: *mut u32, expected: u32, desired: u32) -> u32 {
    // SAFETY: the caller's contract.
    unsafe { imp::cas_acq_rel(scope, p, expected, desired) }
}

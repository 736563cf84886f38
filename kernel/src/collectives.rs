//! Collectives over symmetric windows, callable from any kernel (`include/symcomm/collectives.cuh`;
//! its contracts — buffers, counts, in-place conventions, bounds, ordering, statuses — hold here
//! word for word, because these functions call that implementation).
//!
//! Every collective is a collective call of one CTA ([`Cta`]) on every rank, at grid scope
//! ([`grid_scope`]: every CTA of the launch, CTA b on barrier index `first_slot + b`, each on its
//! [`cta_part`]) or CTA scope ([`cta_scope`]: the calling CTA alone on its own barrier index).
//! Arguments in NCCL's order: group, communicator, scope, source slice, destination slice, count
//! (per-rank block), then the reduction operator or the root.
//!
//! | collective              | moves                                                        |
//! |-------------------------|--------------------------------------------------------------|
//! | `all_reduce_one_shot`   | `src[0, count)` of every rank, reduced → every `dst[0, count)` |
//! | `all_reduce_two_shot`   | the same, each rank reducing one share                        |
//! | `all_gather`            | `src[0, count)` → `dst[r*count, +count)` for every r           |
//! | `reduce_scatter`        | `src[r*count, +count)` of every rank, reduced → rank r's `dst` |
//! | `broadcast`             | root's `src[0, count)` → `dst[0, count)`                       |
//! | `reduce`                | `src[0, count)` of every rank, reduced → root's `dst`          |
//! | `scatter`               | root's `src[r*count, +count)` → rank r's `dst[0, count)`       |
//! | `all_to_all`            | `src[p*count, +count)` of rank r → `dst[r*count, +count)` of p |
//!
//! Element types: `f32`, `f64`, [`F16`], [`Bf16`], `i32`, `u32`, `i64`, `u64` ([`Element`]).
//! Results are bitwise identical on every rank (peers reduced in rank order).

use core::mem::size_of;

use crate::abi::{self, CollArgs, DevComm};
use crate::ffi;
use crate::group::Cta;
use crate::signal::Status;
use crate::window::WindowSlice;

/// Where a collective call runs (`symcomm::CollScope`): build it with [`grid_scope`] or
/// [`cta_scope`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollScope {
    /// 1 for grid scope, 0 for CTA scope.
    pub grid: u32,
    /// Grid scope: first barrier index; CTA scope: the barrier index.
    pub index: u32,
}

/// Grid scope: every CTA of the launch cooperates; CTA b uses barrier index `first_slot + b`.
#[inline(always)]
pub fn grid_scope(first_slot: u32) -> CollScope {
    CollScope {
        grid: 1,
        index: first_slot,
    }
}

/// CTA scope: the calling CTA alone, on barrier index `slot`.
#[inline(always)]
pub fn cta_scope(slot: u32) -> CollScope {
    CollScope {
        grid: 0,
        index: slot,
    }
}

/// Elements `[lo, hi)` of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// First element.
    pub lo: u64,
    /// One past the last element.
    pub hi: u64,
}

impl Range {
    /// Elements in the range.
    #[inline(always)]
    pub fn size(&self) -> u64 {
        self.hi - self.lo
    }
}

/// The calling CTA's part of a block of `count` elements of `T` at `scope` (collectives.cuh's
/// `cta_part`): what CTA b reads and writes in every collective but the two-shot all-reduce, so a
/// grid-scope kernel may produce its input and consume its output per CTA without a grid sync.
#[inline(always)]
pub fn cta_part<T: Element>(scope: CollScope, count: u64) -> Range {
    let (mut lo, mut hi) = (0u64, 0u64);
    // SAFETY: writes the two live locals only.
    unsafe {
        ffi::symcomm_rs_cta_part(
            scope.grid,
            scope.index,
            count,
            size_of::<T>() as u32,
            &raw mut lo,
            &raw mut hi,
        )
    };
    Range { lo, hi }
}

/// The calling CTA's part of rank `q`'s share in a two-shot all-reduce of `count` elements
/// (collectives.cuh's `two_shot_part`).
#[inline(always)]
pub fn two_shot_part<T: Element>(scope: CollScope, nranks: u32, count: u64, q: u32) -> Range {
    let (mut lo, mut hi) = (0u64, 0u64);
    // SAFETY: writes the two live locals only.
    unsafe {
        ffi::symcomm_rs_two_shot_part(
            scope.grid,
            scope.index,
            nranks,
            count,
            q,
            size_of::<T>() as u32,
            &raw mut lo,
            &raw mut hi,
        )
    };
    Range { lo, hi }
}

/// Reduction operators (`SYMCOMM_REDOP_*`, `symcomm::RedOp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum RedOp {
    /// Sum.
    Sum = abi::SYMCOMM_REDOP_SUM,
    /// Product.
    Prod = abi::SYMCOMM_REDOP_PROD,
    /// Minimum.
    Min = abi::SYMCOMM_REDOP_MIN,
    /// Maximum.
    Max = abi::SYMCOMM_REDOP_MAX,
    /// Mean (sum, then divided by the rank count).
    Avg = abi::SYMCOMM_REDOP_AVG,
}

/// IEEE binary16 storage (`half_t`): the bits; no arithmetic.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct F16(pub u16);

/// bfloat16 storage (`bfloat16_t`, the upper half of a binary32): the bits; no arithmetic.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bf16(pub u16);

/// An element type of the collectives: its `SYMCOMM_DTYPE_*` code and the device library's
/// entry for it. Sealed.
pub trait Element: Copy + sealed::Sealed {
    /// `SYMCOMM_DTYPE_*`.
    const DTYPE: u32;
    /// Runs the collective `args` (the C ABI's `symcomm_rs_collective_<dtype>`).
    ///
    /// # Safety
    /// A collective call of the CTA with handles the host built.
    #[doc(hidden)]
    unsafe fn run(comm: &DevComm, args: &CollArgs) -> u32;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($t:ty, $code:expr, $f:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: u32 = $code;
            #[inline(always)]
            unsafe fn run(comm: &DevComm, args: &CollArgs) -> u32 {
                // SAFETY: the caller's contract; the callee checks the windows and codes.
                unsafe { ffi::$f(comm, args) }
            }
        }
    };
}
element!(f32, abi::SYMCOMM_DTYPE_F32, symcomm_rs_collective_f32);
element!(f64, abi::SYMCOMM_DTYPE_F64, symcomm_rs_collective_f64);
element!(F16, abi::SYMCOMM_DTYPE_F16, symcomm_rs_collective_f16);
element!(Bf16, abi::SYMCOMM_DTYPE_BF16, symcomm_rs_collective_bf16);
element!(i32, abi::SYMCOMM_DTYPE_I32, symcomm_rs_collective_i32);
element!(u32, abi::SYMCOMM_DTYPE_U32, symcomm_rs_collective_u32);
element!(i64, abi::SYMCOMM_DTYPE_I64, symcomm_rs_collective_i64);
element!(u64, abi::SYMCOMM_DTYPE_U64, symcomm_rs_collective_u64);

/// One collective of `kind` through the device library.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn run<T: Element>(
    comm: &DevComm,
    kind: u32,
    scope: CollScope,
    src: WindowSlice<T>,
    dst: WindowSlice<T>,
    count: u64,
    redop: u32,
    root: u32,
) -> Status {
    let args = CollArgs {
        kind,
        dtype: T::DTYPE,
        redop,
        root,
        scope: if scope.grid != 0 {
            abi::SYMCOMM_SCOPE_GRID
        } else {
            abi::SYMCOMM_SCOPE_CTA
        },
        index: scope.index,
        count,
        src_offset: src.offset,
        dst_offset: dst.offset,
        tile_stride: 0,
        src: src.window.raw,
        dst: dst.window.raw,
        ..Default::default()
    };
    // SAFETY: a collective call of the CTA (the callers' contract, as in C++); `args` is live.
    Status::from_code(unsafe { T::run(comm, &args) })
}

/// All-reduce, one-shot: each rank reads every peer's input and reduces it itself.
#[inline(always)]
pub fn all_reduce_one_shot<T: Element>(
    _: Cta,
    comm: &DevComm,
    scope: CollScope,
    src: WindowSlice<T>,
    dst: WindowSlice<T>,
    count: u64,
    op: RedOp,
) -> Status {
    run(
        comm,
        abi::SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
        scope,
        src,
        dst,
        count,
        op as u32,
        0,
    )
}

/// All-reduce, two-shot: rank r reduces share r of the elements, then every rank gathers.
#[inline(always)]
pub fn all_reduce_two_shot<T: Element>(
    _: Cta,
    comm: &DevComm,
    scope: CollScope,
    src: WindowSlice<T>,
    dst: WindowSlice<T>,
    count: u64,
    op: RedOp,
) -> Status {
    run(
        comm,
        abi::SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT,
        scope,
        src,
        dst,
        count,
        op as u32,
        0,
    )
}

/// All-reduce, low latency: every rank's input travels as LL lines (8 data bytes and a flag per
/// 16-byte store) into every peer's LL area, with no barrier; for small messages
/// (`all_reduce_ll` in `collectives.cuh`).
#[inline(always)]
pub fn all_reduce_ll<T: Element>(
    _: Cta,
    comm: &DevComm,
    scope: CollScope,
    src: WindowSlice<T>,
    dst: WindowSlice<T>,
    count: u64,
    op: RedOp,
) -> Status {
    run(
        comm,
        abi::SYMCOMM_COLL_ALL_REDUCE_LL,
        scope,
        src,
        dst,
        count,
        op as u32,
        0,
    )
}

/// All-gather: `src[0, count)` of rank r lands in every rank's `dst[r*count, +count)`.
#[inline(always)]
pub fn all_gather<T: Element>(
    _: Cta,
    comm: &DevComm,
    scope: CollScope,
    src: WindowSlice<T>,
    dst: WindowSlice<T>,
    count: u64,
) -> Status {
    run(
        comm,
        abi::SYMCOMM_COLL_ALL_GATHER,
        scope,
        src,
        dst,
        count,
        0,
        0,
    )
}

/// All-gather, low latency: [`all_gather`]'s buffers and results, with [`all_reduce_ll`]'s
/// protocol (LL lines into every peer's LL area, no barrier); for small messages
/// (`all_gather_ll` in `collectives.cuh`).
#[inline(always)]
pub fn all_gather_ll<T: Element>(
    _: Cta,
    comm: &DevComm,
    scope: CollScope,
    src: WindowSlice<T>,
    dst: WindowSlice<T>,
    count: u64,
) -> Status {
    run(
        comm,
        abi::SYMCOMM_COLL_ALL_GATHER_LL,
        scope,
        src,
        dst,
        count,
        0,
        0,
    )
}

/// Reduce-scatter: block r of every rank's `src`, reduced, lands in rank r's `dst[0, count)`.
#[inline(always)]
pub fn reduce_scatter<T: Element>(
    _: Cta,
    comm: &DevComm,
    scope: CollScope,
    src: WindowSlice<T>,
    dst: WindowSlice<T>,
    count: u64,
    op: RedOp,
) -> Status {
    run(
        comm,
        abi::SYMCOMM_COLL_REDUCE_SCATTER,
        scope,
        src,
        dst,
        count,
        op as u32,
        0,
    )
}

/// Reduce-scatter, low latency: [`reduce_scatter`]'s buffers and results, with
/// [`all_reduce_ll`]'s protocol (block q as LL lines into rank q's LL area, no barrier); for small
/// messages (`reduce_scatter_ll` in `collectives.cuh`).
#[inline(always)]
pub fn reduce_scatter_ll<T: Element>(
    _: Cta,
    comm: &DevComm,
    scope: CollScope,
    src: WindowSlice<T>,
    dst: WindowSlice<T>,
    count: u64,
    op: RedOp,
) -> Status {
    run(
        comm,
        abi::SYMCOMM_COLL_REDUCE_SCATTER_LL,
        scope,
        src,
        dst,
        count,
        op as u32,
        0,
    )
}

/// Broadcast: root's `src[0, count)` lands in every rank's `dst[0, count)`.
#[inline(always)]
pub fn broadcast<T: Element>(
    _: Cta,
    comm: &DevComm,
    scope: CollScope,
    src: WindowSlice<T>,
    dst: WindowSlice<T>,
    count: u64,
    root: u32,
) -> Status {
    run(
        comm,
        abi::SYMCOMM_COLL_BROADCAST,
        scope,
        src,
        dst,
        count,
        0,
        root,
    )
}

/// Broadcast, low latency: [`broadcast`]'s buffers and results, with [`all_reduce_ll`]'s protocol
/// (the root's LL lines into every peer's LL area, no barrier); for small messages
/// (`broadcast_ll` in `collectives.cuh`).
#[inline(always)]
pub fn broadcast_ll<T: Element>(
    _: Cta,
    comm: &DevComm,
    scope: CollScope,
    src: WindowSlice<T>,
    dst: WindowSlice<T>,
    count: u64,
    root: u32,
) -> Status {
    run(
        comm,
        abi::SYMCOMM_COLL_BROADCAST_LL,
        scope,
        src,
        dst,
        count,
        0,
        root,
    )
}

/// Reduce: every rank's `src[0, count)`, reduced, lands in root's `dst[0, count)`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn reduce<T: Element>(
    _: Cta,
    comm: &DevComm,
    scope: CollScope,
    src: WindowSlice<T>,
    dst: WindowSlice<T>,
    count: u64,
    op: RedOp,
    root: u32,
) -> Status {
    run(
        comm,
        abi::SYMCOMM_COLL_REDUCE,
        scope,
        src,
        dst,
        count,
        op as u32,
        root,
    )
}

/// Scatter: root's `src[r*count, +count)` lands in rank r's `dst[0, count)`.
#[inline(always)]
pub fn scatter<T: Element>(
    _: Cta,
    comm: &DevComm,
    scope: CollScope,
    src: WindowSlice<T>,
    dst: WindowSlice<T>,
    count: u64,
    root: u32,
) -> Status {
    run(
        comm,
        abi::SYMCOMM_COLL_SCATTER,
        scope,
        src,
        dst,
        count,
        0,
        root,
    )
}

/// All-to-all: `src[p*count, +count)` of rank r lands in `dst[r*count, +count)` of rank p.
#[inline(always)]
pub fn all_to_all<T: Element>(
    _: Cta,
    comm: &DevComm,
    scope: CollScope,
    src: WindowSlice<T>,
    dst: WindowSlice<T>,
    count: u64,
) -> Status {
    run(
        comm,
        abi::SYMCOMM_COLL_ALL_TO_ALL,
        scope,
        src,
        dst,
        count,
        0,
        0,
    )
}

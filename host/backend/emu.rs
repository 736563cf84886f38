//! The CPU emulator backend: kernels run on CPU threads (the embedded kernels' emulator builds),
//! device memory is host memory.
//!
//! - [`kernel`]: a kernel's entry point and residency on the emulated GPU.
//! - [`queue`]: an emulator stream's queue and the worker thread that serves it in order, under
//!   [`crate::stream::Stream`], its events and graphs.
//! - [`memory`]: window copies (`memfd`s mapped in the flat layout), a communicator's control
//!   words and ordinary buffers, under `crate::comm::memory` and [`crate::Buffer`].
//! - [`proxy`]: the proxy's copies (`crate::comm::proxy`).
//! - `team` (tests and the `testing` feature only): [`EmuTeam`], N ranks of one process without
//!   a communicator, and [`launch`], the raw blocking launch of an embedded kernel.

pub(crate) mod kernel;
pub(crate) mod memory;
pub(crate) mod proxy;
pub(crate) mod queue;
// Test fixtures: the `testing` feature exports them (`crate::testing::emu`); without it only
// this crate's unit tests use them.
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub, dead_code))]
mod team;

#[cfg(any(test, feature = "testing"))]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub, unused_imports))]
pub use team::{EmuTeam, launch};

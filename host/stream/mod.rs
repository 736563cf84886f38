//! Streams, events, graphs, kernels and buffers for both backends (the contract users see is on
//! [`Stream`]).
//!
//! One concept a file: [`args`] (kernel parameters), [`kernel`] (launch geometry, loaded
//! kernels), [`streams`] (streams and events), [`graph`] (captured work), [`buffer`] (ordinary
//! device memory). Each type wraps the CUDA layer (`crate::backend::cuda`) or the emulator's
//! (`crate::backend::emu`: the worker queue behind every emulator stream, host memory).

mod args;
mod buffer;
mod graph;
mod kernel;
mod streams;
#[cfg(test)]
mod test_support;

use std::any::Any;
use std::sync::Arc;

pub use args::KernelArgs;
pub use buffer::Buffer;
pub use graph::Graph;
pub(crate) use kernel::check_co_resident;
pub use kernel::{Kernel, LaunchConfig};
pub use streams::{Event, Stream};
pub(crate) use streams::{StreamToken, words_written};

/// Something recorded work uses (a communicator, a window's mapping, a buffer's memory) that a
/// [`Graph`] keeps alive for as long as it can be launched, and past its last launch.
pub(crate) type Retained = Arc<dyn Any + Send + Sync>;

/// What a piece of work uses, produced only when the work is recorded into a capture.
pub(crate) type RetainFn<'k> = &'k dyn Fn() -> Vec<Retained>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_events_and_kernels_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Stream>();
        check::<Event>();
        check::<Kernel>();
        check::<KernelArgs>();
        check::<Buffer>();
        check::<Graph>();
        fn send<T: Send>() {}
        send::<KernelArgs>();
    }
}

//! Backends that run device code: CUDA GPUs and the CPU emulator.
//!
//! Every backend-dependent value (a stream, an event, a graph, a kernel's code, a buffer, a
//! window's mapping, the control block's memory) is a [`PerBackend`]: the CUDA value or the
//! emulator value, of two types with the same methods. What both backends do alike is one
//! [`on_backend!`] call (the one `match` there is); what differs is an explicit `match` on the
//! two variants, and values of two backends meet through [`PerBackend::pair`], which refuses a
//! mix with one message. New values are made with [`Backend::make`].

// The CUDA layer's `pub` items beyond what `crate::cuda` and `Backend` make public are the raw
// layer that the `testing` feature exports (tests/gpu/ builds on it): without that feature
// they are crate-internal, and what only those tests call is unused.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub, dead_code))]
pub(crate) mod cuda;
// The emulator: its streams' queues and its memory, and (tests and the `testing` feature only)
// the in-process team harness.
pub(crate) mod emu;
mod mapped;

pub(crate) use mapped::MappedHost;

use std::fmt;

use crate::tune::BackendKind;
use crate::{Error, Result};

/// Where a communicator's device code runs: one GPU, or the CPU emulator.
///
/// Cheap to clone (a CUDA device is a shared handle to its primary context).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Backend {
    /// A CUDA GPU (its primary context).
    Cuda(cuda::CudaDevice),
    /// The CPU emulator: kernels run on CPU threads, device memory is host memory.
    Emu,
}

impl Backend {
    /// `cuda:<ordinal>` or `emu`, for messages.
    pub fn name(&self) -> String {
        match self {
            Backend::Cuda(d) => format!("cuda:{}", d.ordinal()),
            Backend::Emu => "emu".to_owned(),
        }
    }

    /// Whether this is the emulator.
    pub fn is_emu(&self) -> bool {
        matches!(self, Backend::Emu)
    }

    /// Which backend this is, without its device.
    pub(crate) fn kind(&self) -> BackendKind {
        match self {
            Backend::Cuda(_) => BackendKind::Cuda,
            Backend::Emu => BackendKind::Emu,
        }
    }

    /// A new value of this backend: `cuda` makes it on a GPU, `emu` on the emulator.
    pub(crate) fn make<C, E>(
        &self,
        cuda: impl FnOnce(&cuda::CudaDevice) -> Result<C>,
        emu: impl FnOnce() -> Result<E>,
    ) -> Result<PerBackend<C, E>> {
        Ok(match self {
            Backend::Cuda(d) => PerBackend::Cuda(cuda(d)?),
            Backend::Emu => PerBackend::Emu(emu()?),
        })
    }
}

/// A value of one backend: `C` on CUDA, `E` on the emulator (see the module docs).
#[derive(Clone)]
pub(crate) enum PerBackend<C, E> {
    Cuda(C),
    Emu(E),
}

/// Two values of one backend, from [`PerBackend::pair`].
pub(crate) type Paired<'a, C, E, C2, E2> = PerBackend<(&'a C, &'a C2), (&'a E, &'a E2)>;

/// Runs `$body` with `$value`'s CUDA or emulator value bound to `$x`: the one dispatch of what
/// both backends do alike (both arms are the same code, type-checked against each type).
macro_rules! on_backend {
    ($value:expr, $x:pat => $body:expr) => {
        match $value {
            $crate::backend::PerBackend::Cuda($x) => $body,
            $crate::backend::PerBackend::Emu($x) => $body,
        }
    };
}
pub(crate) use on_backend;

impl<C, E> PerBackend<C, E> {
    /// Which backend the value belongs to.
    pub(crate) fn kind(&self) -> BackendKind {
        match self {
            PerBackend::Cuda(_) => BackendKind::Cuda,
            PerBackend::Emu(_) => BackendKind::Emu,
        }
    }

    /// Whether this is an emulator value.
    pub(crate) fn is_emu(&self) -> bool {
        matches!(self, PerBackend::Emu(_))
    }

    /// The CUDA value; `None` on the emulator.
    pub(crate) fn cuda(&self) -> Option<&C> {
        match self {
            PerBackend::Cuda(c) => Some(c),
            PerBackend::Emu(_) => None,
        }
    }

    /// This value and `other` when both belong to the same backend. Otherwise
    /// [`Error::InvalidArgument`]: "`what` belongs to the emulator, `to` to CUDA" (or the other
    /// way round), e.g. `pair(&kernel.code, "kernel x", "the stream")`.
    pub(crate) fn pair<'a, C2, E2>(
        &'a self,
        other: &'a PerBackend<C2, E2>,
        what: impl fmt::Display,
        to: &str,
    ) -> Result<Paired<'a, C, E, C2, E2>> {
        match (self, other) {
            (PerBackend::Cuda(a), PerBackend::Cuda(b)) => Ok(PerBackend::Cuda((a, b))),
            (PerBackend::Emu(a), PerBackend::Emu(b)) => Ok(PerBackend::Emu((a, b))),
            _ => Err(Error::InvalidArgument(format!(
                "{what} belongs to {}, {to} to {}: values of the two backends do not mix",
                self.kind().describe(),
                other.kind().describe()
            ))),
        }
    }
}

impl<C: fmt::Debug, E: fmt::Debug> fmt::Debug for PerBackend<C, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PerBackend::Cuda(c) => f.debug_tuple("Cuda").field(c).finish(),
            PerBackend::Emu(e) => f.debug_tuple("Emu").field(e).finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn values_of_two_backends_do_not_pair() {
        let cuda: PerBackend<u8, u16> = PerBackend::Cuda(1);
        let emu: PerBackend<u32, u64> = PerBackend::Emu(2);
        let e = cuda.pair(&emu, "kernel k", "the stream").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid argument: kernel k belongs to a CUDA GPU, the stream to the emulator: \
             values of the two backends do not mix"
        );
        assert!(matches!(
            emu.pair(&PerBackend::<(), u8>::Emu(3), "x", "y").unwrap(),
            PerBackend::Emu((2, 3))
        ));
        // Both arms run the same code on values of different types.
        assert_eq!(on_backend!(&emu, v => v.to_string()), "2");
        assert_eq!(on_backend!(&cuda, v => v.to_string()), "1");
    }
}

//! The collective allocation behind windows and the signal area: the ranks agree on the size,
//! each creates its copy, the handles travel within the host, and every rank maps every copy
//! (the flat layout of `memory.rs`).

use std::time::Instant;

use super::memory::{self, FlatMapping, Segment};
use super::payload::{self, AllocRequest, Tag};
use super::{Communicator, Window};
use crate::backend::Backend;
use crate::{DevicePlain, Error, Result};

impl Communicator {
    /// Allocates a symmetric window of `count` elements of `T` on every rank. Collective; every
    /// rank passes the same `count` (and `T`'s size). The memory is zeroed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `count` 0 or a size that overflows (on the bad rank; the
    /// others get [`Error::PeerFailed`]); [`Error::Mismatch`] on every rank when sizes differ;
    /// backend errors (out of memory). After any of these the communicator stays usable.
    ///
    /// Across hosts, only the copies of this host's ranks are mapped here: kernels load and
    /// store those, and reach the others with signals and `put_with_signal` through the proxy
    /// (see [`Communicator::device_handle`]).
    pub fn alloc_window<T: DevicePlain>(&self, count: usize) -> Result<Window<T>> {
        let elem = size_of::<T>() as u64;
        let bytes = (count as u64)
            .checked_mul(elem)
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "a window needs at least one element and fewer than 2^64 bytes (count {count} of {elem} bytes)"
                ))
            });
        let comm = self.shared()?;
        let mapping = self.alloc_flat(bytes, elem as u32, std::any::type_name::<T>())?;
        Ok(Window::new(comm, mapping, count))
    }

    /// The collective allocation behind windows and the signal area: agree on the size, create
    /// this rank's copy, exchange handles within the host, map every copy. A rank whose request
    /// is already invalid (`bytes` is an error) still takes part in the agreement, so that every
    /// rank fails together instead of waiting.
    pub(super) fn alloc_flat(
        &self,
        bytes: Result<u64>,
        elem: u32,
        label: &str,
    ) -> Result<FlatMapping> {
        // This rank's request: its size and allocation granularity, or why it cannot allocate.
        let request = bytes.and_then(|b| {
            if self.links.is_none() {
                return Err(Error::InvalidArgument(
                    "the local team is not connected".to_owned(),
                ));
            }
            Ok(AllocRequest {
                bytes: b,
                elem,
                granularity: memory::granularity(&self.backend)?,
            })
        });
        let all = self.gather(
            Tag::Alloc,
            "alloc_window",
            &payload::encode_alloc_request(&request),
            payload::decode_alloc_request,
        )?;
        let AllocRequest {
            bytes,
            mut granularity,
            ..
        } = request?;
        let links = self
            .links
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("the local team is not connected".to_owned()))?;
        for (r, req) in all.into_iter().enumerate() {
            let AllocRequest {
                bytes: their_bytes,
                elem: their_elem,
                granularity: their_gran,
            } = req.map_err(|message| Error::PeerFailed {
                rank: r as u32,
                what: "alloc_window".into(),
                message,
            })?;
            if (their_bytes, their_elem) != (bytes, elem) {
                return Err(Error::Mismatch {
                    rank: self.rank,
                    peer: r as u32,
                    what: format!(
                        "alloc_window: rank {} asks for {bytes} bytes ({elem}-byte elements), rank {r} for {their_bytes} bytes ({their_elem}-byte elements)",
                        self.rank
                    ),
                });
            }
            granularity = granularity.max(their_gran.max(1));
        }
        let stride = bytes.div_ceil(granularity) * granularity;
        let segment = self.agree(
            Tag::Segment,
            "allocating window memory",
            Segment::create(&self.backend, stride, label),
        )?;
        let seq = {
            let mut s = self
                .exchange_seq
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *s += 1;
            *s
        };
        let deadline = Instant::now() + self.op_timeout;
        let mapped = links
            .exchange(seq, segment.fd(), deadline)
            .and_then(|fds| FlatMapping::map(&self.backend, stride, fds, self.slots.clone(), seq))
            .and_then(|m| {
                // Known to the proxy before any rank can use it.
                self.proxy_region(&m, bytes)?;
                Ok(m)
            });
        let mapping = self.agree(Tag::Mapped, "mapping window memory", mapped)?;
        if let Backend::Cuda(_) = self.backend {
            // VMM memory is not zeroed by the driver.
            mapping.zero(self.rank)?;
            self.control.barrier(Tag::Mapped, "zeroing window memory")?;
        }
        tracing::debug!(target: "symcomm::alloc", "rank {}: {label}: {bytes} bytes per rank, stride {stride}, base {:#x}", self.rank, mapping.base());
        Ok(mapping)
    }
}

//! Ordinary (not symmetric) device memory of one backend ([`Buffer`]).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use super::{Event, Retained};
use crate::backend::cuda::{CudaDevice, DeviceBuffer};
use crate::backend::emu::memory::HostBuffer;
use crate::backend::{Backend, PerBackend, on_backend};
use crate::{DevicePlain, Error, Result};

#[cfg(doc)]
use super::{Graph, Stream};

/// Ordinary (not symmetric) device memory of one backend, zeroed at allocation and freed on
/// drop: a GPU allocation (`cuMemAlloc`) on CUDA, 256-byte-aligned host memory on the emulator.
/// Kernels, [`Stream::copy_raw`] and [`Stream::memset_raw`] reach it through [`Self::addr`].
///
/// [`Self::write`] and [`Self::read`] are synchronous host copies that do not wait for any
/// stream: the caller orders them against device work that uses the buffer (synchronize those
/// streams first). On CUDA they must not be called on a thread that is capturing a stream
/// ([`Stream::begin_capture`]).
///
/// Lifetime: dropping a buffer waits for the last host collective or send/recv that used it (an
/// event each such call records), so `comm.all_reduce(&buf, &buf, ..)` followed by `drop(buf)`
/// is sound. A [`Graph`] that captured such calls keeps the memory allocated until it drops
/// (after its last launch), so replays after the buffer dropped are sound too. Kernels launched
/// by the caller ([`Stream::launch`], `unsafe`) are not tracked: their contract is that the
/// memory outlives them. On CUDA the memory comes from
/// the stream-ordered allocator and is freed in stream order (`cuMemFreeAsync`), so a drop never
/// synchronizes the whole context — which, with ranks sharing a GPU, would wait for another
/// rank's kernel that waits for this rank.
///
/// `Send + Sync`.
pub struct Buffer {
    /// Shared with graphs that captured collectives on the buffer (see [`Self::retained`]).
    inner: Arc<BufferInner>,
    /// Recorded after the latest host collective or send/recv that used the buffer.
    last_use: Mutex<Option<Arc<Event>>>,
}

type BufferInner = PerBackend<DeviceBuffer, HostBuffer>;

impl Drop for Buffer {
    fn drop(&mut self) {
        // Bounded: the work waited for is symcomm's collectives, whose waits are bounded.
        let last = self
            .last_use
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(ev) = last {
            if let Err(e) = ev.synchronize() {
                tracing::warn!(target: "symcomm::stream", "waiting for a buffer's last use: {e}");
            }
        }
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.is_emu() {
            "Buffer::Emu"
        } else {
            "Buffer::Cuda"
        };
        f.debug_struct(kind)
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .finish()
    }
}

impl Buffer {
    /// Allocates `bytes` bytes of zeroed device memory for `backend`
    /// (`cuMemAlloc` and a memset on CUDA; aligned host memory on the emulator). The address
    /// is at least 256-byte aligned.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 bytes (or a size the platform cannot describe);
    /// [`Error::Cuda`] (`CUDA_ERROR_OUT_OF_MEMORY`); [`Error::Io`] when host memory is exhausted.
    pub fn new(backend: &Backend, bytes: usize) -> Result<Buffer> {
        if bytes == 0 {
            return Err(Error::InvalidArgument(
                "a buffer needs at least one byte".to_owned(),
            ));
        }
        let inner = backend.make(
            |d: &CudaDevice| d.alloc_zeroed(bytes),
            || HostBuffer::new(bytes),
        )?;
        Ok(Buffer {
            inner: Arc::new(inner),
            last_use: Mutex::new(None),
        })
    }

    /// Remembers that work enqueued before `done` (an event of its stream, outside captures) uses
    /// the buffer, so that the drop waits for it.
    pub(crate) fn used_by(&self, done: &Arc<Event>) {
        *self.last_use.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(done));
    }

    /// The memory, for a graph that records work on it to keep alive.
    pub(crate) fn retained(&self) -> Retained {
        Arc::clone(&self.inner) as Retained
    }

    /// The device address of the first byte (on the emulator a host address), for kernel
    /// arguments and raw copies. Valid while `self` lives.
    pub fn addr(&self) -> u64 {
        on_backend!(&*self.inner, m => m.addr())
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        on_backend!(&*self.inner, m => m.len())
    }

    /// Always `false`: buffers hold at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether this is emulator (host) memory.
    pub fn is_emu(&self) -> bool {
        self.inner.is_emu()
    }

    /// The CUDA allocation underneath; `None` on the emulator.
    #[cfg(test)]
    pub(crate) fn as_cuda(&self) -> Option<&DeviceBuffer> {
        self.inner.cuda()
    }

    /// Byte offset and length of elements `offset_elems..offset_elems + count` of type `T`.
    fn byte_range<T>(&self, offset_elems: usize, count: usize) -> Result<(usize, usize)> {
        let size = std::mem::size_of::<T>();
        offset_elems
            .checked_mul(size)
            .zip(count.checked_mul(size))
            .filter(|&(offset, len)| offset.checked_add(len).is_some_and(|end| end <= self.len()))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{count} elements of {size} bytes at element {offset_elems} exceed a \
                     {}-byte buffer",
                    self.len()
                ))
            })
    }

    /// Copies `data` into the buffer starting at element `offset_elems` (in units of `T`) and
    /// waits for the copy. See the type's docs for ordering against device work.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range exceeds the buffer; [`Error::Cuda`].
    pub fn write<T: DevicePlain>(&self, offset_elems: usize, data: &[T]) -> Result<()> {
        let (offset, _) = self.byte_range::<T>(offset_elems, data.len())?;
        on_backend!(&*self.inner, m => m.write(offset, data))
    }

    /// Copies elements `offset_elems..offset_elems + out.len()` (in units of `T`) into `out`
    /// and waits for the copy. See the type's docs for ordering against device work.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range exceeds the buffer; [`Error::Cuda`].
    pub fn read<T: DevicePlain>(&self, offset_elems: usize, out: &mut [T]) -> Result<()> {
        let (offset, _) = self.byte_range::<T>(offset_elems, out.len())?;
        on_backend!(&*self.inner, m => m.read(offset, out))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::super::test_support::{is_invalid, words};
    use super::*;

    #[test]
    fn buffers_round_trip_and_check_bounds() {
        is_invalid(Buffer::new(&Backend::Emu, 0), "at least one byte");
        let buf = Buffer::new(&Backend::Emu, 100).unwrap();
        assert!(buf.is_emu() && buf.as_cuda().is_none());
        assert_eq!((buf.len(), buf.is_empty()), (100, false));
        assert_eq!(buf.addr() % 256, 0, "{buf:?}");
        let mut bytes = [1u8; 100];
        buf.read(0, &mut bytes).unwrap();
        assert_eq!(bytes, [0; 100], "zeroed at allocation");

        buf.write(3, &[7u32, 8, 9]).unwrap();
        assert_eq!(words::<5>(&buf, 2), [0, 7, 8, 9, 0]);
        let mut b = [0u8; 4];
        buf.read(16, &mut b).unwrap();
        assert_eq!(b, 8u32.to_ne_bytes(), "element offsets are in units of T");
        // u64 element 5: bytes 40..48.
        buf.write(5, &[u64::MAX - 1]).unwrap();
        let mut w = [0u64; 1];
        buf.read(5, &mut w).unwrap();
        assert_eq!(w, [u64::MAX - 1]);
        let ne = (u64::MAX - 1).to_ne_bytes();
        let halves = [0, 4].map(|i| u32::from_ne_bytes(ne[i..i + 4].try_into().unwrap()));
        assert_eq!(words::<3>(&buf, 9), [0, halves[0], halves[1]]);

        // The last element fits; one more does not; nothing is written by a refused call.
        buf.write(24, &[5u32]).unwrap();
        is_invalid(buf.write(24, &[5u32, 6]), "exceed a 100-byte buffer");
        is_invalid(buf.read(25, &mut [0u32; 1]), "exceed");
        is_invalid(buf.write(usize::MAX, &[1u16]), "exceed");
        is_invalid(buf.read(usize::MAX / 2, &mut [0u64; 1]), "exceed");
        buf.write::<u32>(25, &[]).unwrap();
        assert_eq!(words::<2>(&buf, 23), [0, 5]);
    }
}

//! Buffers: a window or device memory, as bytes.

use symcomm::{Buffer, BufferRef, Communicator, Window};

use super::BufferKind;

pub(super) enum Mem {
    Window(Window<u8>),
    Device(Buffer),
}

impl Mem {
    pub(super) fn alloc(
        comm: &Communicator,
        kind: BufferKind,
        bytes: u64,
    ) -> symcomm::Result<Self> {
        let bytes = bytes.max(8) as usize;
        Ok(match kind {
            BufferKind::Window => Mem::Window(comm.alloc_window::<u8>(bytes)?),
            BufferKind::Device => Mem::Device(comm.alloc_buffer(bytes)?),
        })
    }

    fn len(&self) -> u64 {
        match self {
            Mem::Window(w) => w.len() as u64,
            Mem::Device(b) => b.len() as u64,
        }
    }

    fn bounds(&self, off: u64, len: u64) -> symcomm::Result<()> {
        if off.checked_add(len).is_some_and(|end| end <= self.len()) {
            Ok(())
        } else {
            Err(symcomm::Error::InvalidArgument(format!(
                "bytes {off}..{off}+{len} are outside a buffer of {}",
                self.len()
            )))
        }
    }

    /// Bytes `off..off + len` as a collective argument.
    pub(super) fn part(&self, off: u64, len: u64) -> symcomm::Result<BufferRef<'_>> {
        self.bounds(off, len)?;
        match self {
            Mem::Window(w) => w.range(off as usize, len as usize),
            // SAFETY: the range lies inside the buffer (checked above), which outlives every
            // call made with it: calls are synchronized before `self` drops.
            Mem::Device(b) => Ok(unsafe { BufferRef::from_raw(b.addr() + off, len) }),
        }
    }

    pub(super) fn write(&self, off: u64, data: &[u8]) -> symcomm::Result<()> {
        self.bounds(off, data.len() as u64)?;
        match self {
            Mem::Window(w) => w.write(off as usize, data),
            Mem::Device(b) => b.write(off as usize, data),
        }
    }

    pub(super) fn read(&self, off: u64, out: &mut [u8]) -> symcomm::Result<()> {
        self.bounds(off, out.len() as u64)?;
        match self {
            Mem::Window(w) => w.read(off as usize, out),
            Mem::Device(b) => b.read(off as usize, out),
        }
    }
}

//! Kernel parameters: the [`KernelArgs`] builder that holds a launch's values (each a
//! [`DevicePlain`], passed by value).

use std::ffi::c_void;

use crate::DevicePlain;

#[cfg(doc)]
use super::Stream;

/// Kernel parameters, by value, in order: `KernelArgs::new().arg(&comm).arg(&win).arg(&n)`.
///
/// Owns copies of the values (each stored at an 8-byte-aligned offset), so a builder may be
/// dropped or reused right after [`Stream::launch`] returns: the stream keeps what it needs
/// until the launch ran. The types must match the kernel's parameters one for one; nothing
/// checks that on the emulator (CUDA checks the count when the driver reports it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelArgs {
    /// The values' bytes; u64 words give every value 8-byte alignment.
    words: Vec<u64>,
    /// Index in `words` where each value starts.
    starts: Vec<usize>,
}

impl KernelArgs {
    /// No parameters yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `value` as the next parameter (builder style).
    #[must_use]
    pub fn arg<T: DevicePlain>(mut self, value: &T) -> Self {
        self.push(value);
        self
    }

    /// Appends `value` as the next parameter.
    pub fn push<T: DevicePlain>(&mut self, value: &T) -> &mut Self {
        const {
            assert!(
                std::mem::align_of::<T>() <= 8,
                "kernel arguments are at most 8-aligned"
            )
        };
        let size = std::mem::size_of::<T>();
        let start = self.words.len();
        self.words.resize(start + size.div_ceil(8).max(1), 0);
        // SAFETY: the destination is the `size.div_ceil(8)` words just added (at least `size`
        // bytes, owned by `self.words`); the source is `size` initialized bytes (DevicePlain: no
        // padding); the two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                std::ptr::from_ref(value).cast::<u8>(),
                self.words.as_mut_ptr().add(start).cast::<u8>(),
                size,
            );
        }
        self.starts.push(start);
        self
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// Whether there are no parameters.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// One pointer per parameter, as `cuLaunchKernel` and the emulator take them; valid while
    /// `self` is neither moved nor changed.
    ///
    /// The pointers are `*mut` only because that is the C signature: the CUDA driver copies the
    /// values and the emulator's entry points read them, so nothing writes through them.
    pub(super) fn pointers(&self) -> Vec<*mut c_void> {
        let base = self.words.as_ptr();
        self.starts
            .iter()
            .map(|&start| base.wrapping_add(start).cast_mut().cast::<c_void>())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use symcomm_device::abi::{DevComm, WindowHandleRaw};

    use super::*;

    #[test]
    fn kernel_args_are_aligned_and_round_trip() {
        let comm = DevComm {
            rank: 3,
            nranks: 4,
            timeout_ns: 77,
            ..DevComm::default()
        };
        let win = WindowHandleRaw {
            base: 0x1000,
            stride: 256,
            bytes: 100,
            rank: 3,
            nranks: 4,
            elem_size: 4,
            dtype: symcomm_device::abi::SYMCOMM_DTYPE_F32,
            ranks: 0,
        };
        let args = KernelArgs::new()
            .arg(&7u8)
            .arg(&comm)
            .arg(&-2i16)
            .arg(&win)
            .arg(&1.5f32)
            .arg(&u64::MAX)
            .arg(&0.25f64);
        assert_eq!(args.len(), 7);
        assert!(!args.is_empty() && KernelArgs::new().is_empty());
        let p = args.pointers();
        assert_eq!(p.len(), 7);
        for ptr in &p {
            assert_eq!(
                *ptr as usize % 8,
                0,
                "parameter at {ptr:?} is not 8-aligned"
            );
        }
        // SAFETY: each pointer addresses the value pushed at that index, of that type, aligned
        // (checked above), inside `args`, which is alive and unchanged.
        unsafe {
            assert_eq!(*p[0].cast::<u8>(), 7);
            assert_eq!(*p[1].cast::<DevComm>(), comm);
            assert_eq!(*p[2].cast::<i16>(), -2);
            assert_eq!(*p[3].cast::<WindowHandleRaw>(), win);
            assert_eq!(*p[4].cast::<f32>(), 1.5);
            assert_eq!(*p[5].cast::<u64>(), u64::MAX);
            assert_eq!(*p[6].cast::<f64>(), 0.25);
        }
        // A clone owns its own copy.
        let copy = args.clone();
        drop(args);
        // SAFETY: as above, for the clone's storage.
        unsafe { assert_eq!(*copy.pointers()[3].cast::<WindowHandleRaw>(), win) };
        let mut built = KernelArgs::new();
        built.push(&1u32).push(&2u32);
        assert_eq!(built, KernelArgs::new().arg(&1u32).arg(&2u32));
    }
}

//! The layout of a communicator's signal area (`include/symcomm/abi.h`): one array per rank,
//! `stride` bytes apart (flat layout), each holding the signal words of every writing peer and
//! then the rank's LL area at `ll_offset`. Every allocator of a signal area (the communicator, the
//! emulator's test teams, the GPU test harness) sizes it with [`SignalLayout::new`].

use crate::abi::{
    SYMCOMM_LL_EPOCH_BYTES, SYMCOMM_LL_LINE_BYTES, SYMCOMM_LL_LINES, SYMCOMM_SIGNAL_WORDS,
    SYMCOMM_USER_BARRIER_END,
};

/// Where the parts of one rank's signal array are, for `nranks` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalLayout {
    /// Ranks of the communicator.
    pub nranks: u32,
    /// Bytes from the start of a rank's array to its LL area (`DevComm::ll_offset`): the signal
    /// words, `nranks * SYMCOMM_SIGNAL_WORDS` 64-bit words.
    pub ll_offset: u64,
    /// Bytes of one rank's array, LL area included (`DevComm::signal_stride`).
    pub stride: u64,
}

impl SignalLayout {
    /// The layout for `nranks` ranks (0 counts as 1).
    pub fn new(nranks: u32) -> SignalLayout {
        let n = u64::from(nranks.max(1));
        let ll_offset = n * u64::from(SYMCOMM_SIGNAL_WORDS) * 8;
        SignalLayout {
            nranks: nranks.max(1),
            ll_offset,
            stride: ll_offset + ll_area_bytes(nranks),
        }
    }

    /// Bytes of the whole area (every rank's array).
    pub fn total_bytes(&self) -> u64 {
        self.stride * u64::from(self.nranks)
    }
}

/// Bytes of one rank's LL area for `nranks` ranks (0 counts as 1): the epoch words, then two
/// buffers of one region of `SYMCOMM_LL_LINES` lines per writer for every barrier index.
pub fn ll_area_bytes(nranks: u32) -> u64 {
    let n = u64::from(nranks.max(1));
    u64::from(SYMCOMM_LL_EPOCH_BYTES)
        + u64::from(SYMCOMM_USER_BARRIER_END)
            * 2
            * n
            * u64::from(SYMCOMM_LL_LINES)
            * u64::from(SYMCOMM_LL_LINE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_aligned_and_inside_the_stride() {
        for n in [1u32, 2, 3, 8] {
            let l = SignalLayout::new(n);
            assert_eq!(l.ll_offset % 16, 0);
            assert_eq!(u64::from(SYMCOMM_LL_EPOCH_BYTES) % 16, 0);
            assert!(u64::from(SYMCOMM_LL_EPOCH_BYTES) >= u64::from(SYMCOMM_USER_BARRIER_END) * 8);
            // The last line of the last region (index END-1, parity 1, writer n-1) ends at the stride.
            let last_region =
                (u64::from(SYMCOMM_USER_BARRIER_END - 1) * 2 + 1) * u64::from(n) + u64::from(n - 1);
            let end = l.ll_offset
                + u64::from(SYMCOMM_LL_EPOCH_BYTES)
                + (last_region + 1)
                    * u64::from(SYMCOMM_LL_LINES)
                    * u64::from(SYMCOMM_LL_LINE_BYTES);
            assert_eq!(end, l.stride);
        }
    }
}

//! Co-residency: how many CTAs of a kernel a GPU holds at once, and each rank's share of them.
//!
//! A symcomm kernel's CTA b waits for CTA b of every peer (barriers, signals), so every CTA of a
//! collective, on every rank, must be resident on the GPU at the same time — a GPU holds only SMs
//! x occupancy CTAs, for every kernel on it together, and does not preempt a spinning CTA. When
//! several ranks share one GPU (ranks as threads or processes) a launch that takes more than its
//! share can leave no CTA index resident on every rank: every CTA then spins until its timeout.
//! So the host divides the GPU's resident CTAs among the ranks on that GPU and their lanes
//! (streams with collectives in flight at once), caps every built-in launch to that share, and
//! refuses users' co-resident launches beyond it ([`LaunchConfig::co_resident`]).
//!
//! The occupancy comes from `cuOccupancyMaxActiveBlocksPerMultiprocessor` on a GPU. The emulator
//! has no hardware to ask, so [`sm90_occupancy`] computes what the sm_90 rules give for the
//! kernel's ptxas report (registers, static shared memory), and its residency scheduler admits
//! CTAs against the same figure (`symcomm_device::emu::launch_on`): a launch beyond the budget
//! deadlocks there exactly as it would on the GPU, and the bounded waits report it.
//!
//! [`LaunchConfig::co_resident`]: crate::LaunchConfig::co_resident

use symcomm_device::image::KernelReport;

/// The sm_90 (Hopper) per-SM limits that bound occupancy (CUDA occupancy calculator figures).
mod sm90 {
    /// Most resident CTAs per SM.
    pub(super) const MAX_CTAS: u32 = 32;
    /// Most resident warps per SM (2048 threads).
    pub(super) const MAX_WARPS: u32 = 64;
    /// 32-bit registers per SM sub-partition (4 per SM, a warp scheduler each): a warp's
    /// registers come from one of them, so an SM holds 4 x (16384 / per-warp) warps.
    pub(super) const PARTITION_REGISTERS: u32 = 16384;
    /// Sub-partitions per SM.
    pub(super) const PARTITIONS: u32 = 4;
    /// Registers are allocated per warp in units of this many.
    pub(super) const REGISTER_UNIT: u32 = 256;
    /// Shared memory per SM usable by CTAs, bytes (228 KiB).
    pub(super) const SHARED: u32 = 228 * 1024;
    /// Shared memory the system reserves per resident CTA, bytes.
    pub(super) const SHARED_RESERVED: u32 = 1024;
    /// Shared memory is allocated in units of this many bytes.
    pub(super) const SHARED_UNIT: u32 = 128;
}

/// CTAs of `threads` threads per SM on sm_90 for a kernel using `registers` registers per thread
/// and `shared_bytes` of shared memory per CTA (static plus dynamic): what
/// `cuOccupancyMaxActiveBlocksPerMultiprocessor` returns for it on an H100/H200. 0 when one CTA
/// does not fit (too many threads, registers or bytes).
pub(crate) fn sm90_occupancy(registers: u32, threads: u32, shared_bytes: u32) -> u32 {
    if threads == 0 || threads > crate::tune::MAX_CTA_THREADS {
        return 0;
    }
    let warps = threads.div_ceil(32);
    let by_warps = sm90::MAX_WARPS / warps;
    let per_warp = (registers.max(1) * 32).next_multiple_of(sm90::REGISTER_UNIT);
    let by_registers = sm90::PARTITIONS * (sm90::PARTITION_REGISTERS / per_warp) / warps;
    let per_cta_shared = shared_bytes.next_multiple_of(sm90::SHARED_UNIT) + sm90::SHARED_RESERVED;
    let by_shared = sm90::SHARED / per_cta_shared;
    sm90::MAX_CTAS
        .min(by_warps)
        .min(by_registers)
        .min(by_shared)
}

/// The emulator's occupancy for a kernel with ptxas report `report` (sm_90; `None` when the
/// image was built without nvcc): [`sm90_occupancy`], or 1 CTA per SM when there is no report —
/// the most conservative figure, so that code tested on the emulator never relies on more
/// co-residency than a GPU gives.
pub(crate) fn emu_occupancy(
    report: Option<&KernelReport>,
    threads: u32,
    dynamic_shared: u32,
) -> u32 {
    match report {
        Some(r) => sm90_occupancy(
            r.registers,
            threads,
            r.shared_bytes.saturating_add(dynamic_shared),
        ),
        None => 1,
    }
}

/// CTAs each (rank, lane) may keep resident: the GPU's `resident` CTAs divided among
/// `ranks_on_gpu` ranks with `lanes` lanes each (0 when there are fewer CTAs than lanes).
pub(crate) fn share(resident: u32, ranks_on_gpu: u32, lanes: u32) -> u32 {
    resident / ranks_on_gpu.max(1).saturating_mul(lanes.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sm90_figures() {
        // 512 threads: 16 warps; 72 registers -> 2304 per warp -> 28 warps by registers -> 1 CTA.
        assert_eq!(sm90_occupancy(72, 512, 0), 1);
        assert_eq!(sm90_occupancy(92, 512, 0), 1);
        // 64 registers: 2048 per warp -> 32 warps -> 2 CTAs of 16 warps.
        assert_eq!(sm90_occupancy(64, 512, 0), 2);
        // 32 registers, 256 threads: 8 warps, 64 by registers -> warps bound: 8.
        assert_eq!(sm90_occupancy(32, 256, 0), 8);
        // Tiny CTAs stop at 32 per SM.
        assert_eq!(sm90_occupancy(16, 32, 0), 32);
        // 64 threads at 72 registers: 2 warps, 28 warps by registers -> 14.
        assert_eq!(sm90_occupancy(72, 64, 0), 14);
        // 88 registers (2816 per warp): 5 warps per sub-partition, 20 per SM -> 10 CTAs of 2
        // warps (the H200's occupancy API for symcomm_collective_bf16 at 64 threads; a
        // whole-SM register count would give 23 warps -> 11).
        assert_eq!(sm90_occupancy(88, 64, 0), 10);
        // Shared memory: 100 KiB per CTA -> 2.
        assert_eq!(sm90_occupancy(32, 128, 100 * 1024), 2);
        // Does not fit.
        assert_eq!(sm90_occupancy(255, 1024, 0), 0);
        assert_eq!(sm90_occupancy(32, 128, 229 * 1024), 0);
        assert_eq!(sm90_occupancy(32, 0, 0), 0);
        assert_eq!(sm90_occupancy(32, 2048, 0), 0);
    }

    #[test]
    fn shares() {
        // An H200 with 1 CTA per SM: 4 ranks x 2 lanes -> 16 each; 8 ranks -> 8.
        assert_eq!(share(132, 4, 2), 16);
        assert_eq!(share(132, 8, 2), 8);
        assert_eq!(share(132, 1, 2), 66);
        assert_eq!(share(3, 2, 2), 0);
        assert_eq!(share(10, 0, 0), 10);
    }

    #[test]
    fn no_report_is_conservative() {
        assert_eq!(emu_occupancy(None, 32, 0), 1);
    }
}

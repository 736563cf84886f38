//! What differs between the GPU and the emulator: launch coordinates, CTA and warp barriers and
//! votes, the clock, back-off and trap. On `nvptx64` these are PTX special registers and
//! instructions; on every other target they are calls into the emulator runtime
//! (`device/emu/symcomm_emu.h`), which runs each emulated GPU thread as a fiber.

/// Three launch coordinates (CUDA's `uint3` / `dim3`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dim3 {
    /// The x coordinate.
    pub x: u32,
    /// The y coordinate.
    pub y: u32,
    /// The z coordinate.
    pub z: u32,
}

#[cfg(target_arch = "nvptx64")]
mod imp {
    use super::Dim3;
    use core::arch::asm;
    use core::arch::nvptx;

    #[inline(always)]
    pub(crate) fn thread_idx() -> Dim3 {
        // SAFETY: reads special registers; valid in any kernel.
        unsafe {
            Dim3 {
                x: nvptx::_thread_idx_x() as u32,
                y: nvptx::_thread_idx_y() as u32,
                z: nvptx::_thread_idx_z() as u32,
            }
        }
    }
    #[inline(always)]
    pub(crate) fn block_idx() -> Dim3 {
        // SAFETY: as above.
        unsafe {
            Dim3 {
                x: nvptx::_block_idx_x() as u32,
                y: nvptx::_block_idx_y() as u32,
                z: nvptx::_block_idx_z() as u32,
            }
        }
    }
    #[inline(always)]
    pub(crate) fn block_dim() -> Dim3 {
        // SAFETY: as above.
        unsafe {
            Dim3 {
                x: nvptx::_block_dim_x() as u32,
                y: nvptx::_block_dim_y() as u32,
                z: nvptx::_block_dim_z() as u32,
            }
        }
    }
    #[inline(always)]
    pub(crate) fn grid_dim() -> Dim3 {
        // SAFETY: as above.
        unsafe {
            Dim3 {
                x: nvptx::_grid_dim_x() as u32,
                y: nvptx::_grid_dim_y() as u32,
                z: nvptx::_grid_dim_z() as u32,
            }
        }
    }
    #[inline(always)]
    pub(crate) fn sync_threads() {
        // SAFETY: bar.sync 0, a collective call of the CTA (the caller's contract).
        unsafe { nvptx::_syncthreads() }
    }
    #[inline(always)]
    pub(crate) fn sync_threads_or(pred: bool) -> bool {
        let out: u32;
        // SAFETY: bar.red.or on barrier 0, a collective call of the CTA (caller's contract).
        unsafe {
            asm!(
                "{{ .reg .pred p, q; setp.ne.u32 p, {i}, 0; bar.red.or.pred q, 0, p; selp.u32 {o}, 1, 0, q; }}",
                i = in(reg32) pred as u32,
                o = out(reg32) out,
            );
        }
        out != 0
    }
    #[inline(always)]
    pub(crate) fn sync_warp() {
        // SAFETY: bar.warp.sync over the full warp (the caller's contract: every lane calls).
        unsafe { asm!("bar.warp.sync -1;") }
    }
    #[inline(always)]
    pub(crate) fn warp_any(pred: bool) -> bool {
        let out: u32;
        // SAFETY: vote.sync.any over the full warp (every lane calls).
        unsafe {
            asm!(
                "{{ .reg .pred p, q; setp.ne.u32 p, {i}, 0; vote.sync.any.pred q, p, -1; selp.u32 {o}, 1, 0, q; }}",
                i = in(reg32) pred as u32,
                o = out(reg32) out,
            );
        }
        out != 0
    }
    #[inline(always)]
    pub(crate) fn globaltimer_ns() -> u64 {
        let t: u64;
        // SAFETY: reads the %globaltimer special register.
        unsafe { asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t) };
        t
    }
    #[inline(always)]
    pub(crate) fn backoff(ns: u32) {
        // SAFETY: nanosleep (sm_70+) only suspends the thread.
        unsafe { asm!("nanosleep.u32 {n};", n = in(reg32) ns) }
    }
    #[inline(always)]
    pub(crate) fn trap() -> ! {
        // SAFETY: ends the kernel with an error; never returns.
        unsafe { nvptx::trap() }
    }
}

#[cfg(not(target_arch = "nvptx64"))]
mod imp {
    use super::Dim3;

    /// `SymcommEmuThread` of symcomm_emu.h.
    #[repr(C)]
    struct EmuThread {
        thread_idx: Dim3,
        block_idx: Dim3,
        block_dim: Dim3,
        grid_dim: Dim3,
    }

    const CTA_SYNC: u32 = 0;
    const CTA_OR: u32 = 3;
    const WARP_SYNC: u32 = 0;
    const WARP_ANY: u32 = 6;
    const FULL_WARP: u32 = 0xffff_ffff;

    unsafe extern "C" {
        fn symcomm_emu_current() -> *mut EmuThread;
        fn symcomm_emu_syncthreads(op: u32, predicate: i32) -> i32;
        fn symcomm_emu_warp(op: u32, mask: u32, value: u64, arg: i32, width: i32) -> u64;
        fn symcomm_emu_globaltimer_ns() -> u64;
        fn symcomm_emu_yield();
        fn symcomm_emu_trap(file: *const core::ffi::c_char, line: i32) -> !;
    }

    /// The calling emulated thread's coordinates; a trap outside a kernel.
    #[inline(always)]
    fn current() -> &'static EmuThread {
        // SAFETY: the runtime returns the calling fiber's record (alive while the kernel runs on
        // it) or null outside a kernel.
        match unsafe { symcomm_emu_current().as_ref() } {
            Some(t) => t,
            None => trap(),
        }
    }

    #[inline(always)]
    pub(crate) fn thread_idx() -> Dim3 {
        current().thread_idx
    }
    #[inline(always)]
    pub(crate) fn block_idx() -> Dim3 {
        current().block_idx
    }
    #[inline(always)]
    pub(crate) fn block_dim() -> Dim3 {
        current().block_dim
    }
    #[inline(always)]
    pub(crate) fn grid_dim() -> Dim3 {
        current().grid_dim
    }
    #[inline(always)]
    pub(crate) fn sync_threads() {
        // SAFETY: a collective call of the CTA (the caller's contract); the runtime checks it.
        unsafe { symcomm_emu_syncthreads(CTA_SYNC, 0) };
    }
    #[inline(always)]
    pub(crate) fn sync_threads_or(pred: bool) -> bool {
        // SAFETY: as sync_threads.
        unsafe { symcomm_emu_syncthreads(CTA_OR, i32::from(pred)) != 0 }
    }
    #[inline(always)]
    pub(crate) fn sync_warp() {
        // SAFETY: a collective call of the full warp (the caller's contract).
        unsafe { symcomm_emu_warp(WARP_SYNC, FULL_WARP, 0, 0, 32) };
    }
    #[inline(always)]
    pub(crate) fn warp_any(pred: bool) -> bool {
        // SAFETY: as sync_warp.
        unsafe { symcomm_emu_warp(WARP_ANY, FULL_WARP, u64::from(pred), 0, 32) != 0 }
    }
    #[inline(always)]
    pub(crate) fn globaltimer_ns() -> u64 {
        // SAFETY: reads a steady clock.
        unsafe { symcomm_emu_globaltimer_ns() }
    }
    #[inline(always)]
    pub(crate) fn backoff(_ns: u32) {
        // SAFETY: lets the other fibers of the CTA run.
        unsafe { symcomm_emu_yield() }
    }
    #[inline(always)]
    pub(crate) fn trap() -> ! {
        // SAFETY: reports and aborts the process.
        unsafe { symcomm_emu_trap(c"symcomm-kernel (Rust)".as_ptr(), 0) }
    }
}

pub(crate) use imp::*;

//! The kernels of `examples/rust_kernel`, in Rust: compiled to PTX (nightly, `nvptx64-nvidia-cuda`)
//! by the example's `build.rs` through `symcomm_device::build`, and for the host as an ordinary
//! dependency, where each `kernel!` is the emulator entry of the same name.
//!
//! - `allreduce_bias_gelu`: the fused epilogue of a row-parallel linear layer,
//!   `out = gelu(sum over ranks of partial + bias)`, summing peers' values in registers.
//! - `rust_all_reduce`: the device library's grid-scope all-reduce called from Rust (one-shot or
//!   two-shot), the Rust twin of the built-in collective kernel.
//! - `rk_*`: one kernel per primitive family, driven by the example's tests on the emulator (and
//!   on a GPU by `scripts/gpu-check`).
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]

use symcomm_kernel::prelude::*;

mod activation;
mod primitives;

pub use activation::{gelu, tanh_rational};

/// The fingerprint tag of `allreduce_bias_gelu`'s barriers (any value of the user's choosing).
pub const EPILOGUE_TAG: u32 = 0x6e1;

symcomm_kernel::kernel! {
    /// `out[i][j] = gelu(sum over ranks r of partial_r[i][j] + bias[j])` on this rank's `out` copy.
    ///
    /// Launch: 1-D grid of at most `SYMCOMM_USER_BARRIER_END - first_slot` CTAs (CTA b handles rows
    /// b, b + grid, ... on barrier index `first_slot + b`), any 1-D block; every rank the same grid,
    /// rows, cols and first_slot. The first barrier publishes every rank's partials; the second
    /// keeps them alive until no peer reads them. A failed barrier (Timeout, Aborted, Mismatch)
    /// is in the rank's ErrorRecord and the CTA returns.
    pub fn allreduce_bias_gelu(
        comm: DevComm,
        partial: WindowHandle<f32>,
        bias: WindowHandle<f32>,
        out: WindowHandle<f32>,
        rows: u32,
        cols: u32,
        first_slot: u32,
    ) {
        let n = u64::from(rows) * u64::from(cols);
        let valid = partial.holds()
            && out.holds()
            && bias.holds()
            && partial.fits(0, n, 1)
            && out.fits(0, n, 1)
            && bias.fits(0, u64::from(cols), 1);
        if !valid {
            if Cta.thread_rank() == 0 {
                record_user_error(Thread, &comm, Status::InvalidArgument, comm.rank, EPILOGUE_TAG, rows);
            }
            return;
        }
        let slot = first_slot + block_idx().x;
        let fp = user_fingerprint(EPILOGUE_TAG, n, u64::from(cols));
        if barrier(Cta, &comm, slot, fp) != Status::Ok {
            return;
        }
        let mut row = block_idx().x;
        while row < rows {
            let mut col = thread_idx().x;
            while col < cols {
                let i = u64::from(row) * u64::from(cols) + u64::from(col);
                let mut sum = 0.0f32;
                for peer in 0..comm.nranks {
                    // SAFETY: `i` < n, which fits in every rank's copy (checked above).
                    sum += unsafe { *partial.peer_ptr(peer, i) };
                }
                // SAFETY: col < cols fits in bias, i < n in out (checked above); this thread
                // alone writes element i.
                unsafe { *out.local_ptr(i) = gelu(sum + *bias.local_ptr(u64::from(col))) };
                col += block_dim().x;
            }
            row += grid_dim().x;
        }
        let _ = barrier(Cta, &comm, slot, fp);
    }
}

symcomm_kernel::kernel! {
    /// The device library's grid-scope all-reduce of `count` elements of f32 from `src` to `dst`
    /// (in place when they are the same window), one-shot (`algo` 0) or two-shot (1), with
    /// `op` a `SYMCOMM_REDOP_*` code. CTA b uses barrier index `first_slot + b`.
    pub fn rust_all_reduce(
        comm: DevComm,
        src: WindowHandle<f32>,
        dst: WindowHandle<f32>,
        count: u64,
        op: u32,
        algo: u32,
        first_slot: u32,
    ) {
        let op = match op {
            0 => RedOp::Sum,
            1 => RedOp::Prod,
            2 => RedOp::Min,
            3 => RedOp::Max,
            _ => RedOp::Avg,
        };
        let scope = grid_scope(first_slot);
        let _ = if algo == 0 {
            all_reduce_one_shot(Cta, &comm, scope, src.at(0), dst.at(0), count, op)
        } else {
            all_reduce_two_shot(Cta, &comm, scope, src.at(0), dst.at(0), count, op)
        };
    }
}

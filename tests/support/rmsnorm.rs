//! The Rust mirror of `AllReduceRmsNormArgs<T>` (device/kernels/fused_allreduce_rmsnorm.cu), the
//! parameter of the fused all-reduce + residual + RMSNorm kernels and of their unfused half.

use symcomm::abi::WindowHandleRaw;

/// Mirror of `AllReduceRmsNormArgs<T>` (the same layout for every T; pointers as addresses).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct AllReduceRmsNormArgs {
    pub(crate) partial: WindowHandleRaw,
    pub(crate) partial_offset: u64,
    pub(crate) residual: u64,
    pub(crate) residual_out: u64,
    pub(crate) out: u64,
    pub(crate) gamma: u64,
    pub(crate) tokens: u32,
    pub(crate) hidden: u32,
    pub(crate) eps: f32,
    pub(crate) first_slot: u32,
}
const _: () = assert!(size_of::<AllReduceRmsNormArgs>() == 104);

// SAFETY: `repr(C)`, integers and floats only (the window handle is DevicePlain itself), no
// padding (96 bytes: 40 + 5 * 8 + 4 * 4, asserted above), every bit pattern valid; the layout is
// the kernel's (the static_assert in the .cu file pins 96 bytes, alignment 8).
unsafe impl symcomm::DevicePlain for AllReduceRmsNormArgs {}

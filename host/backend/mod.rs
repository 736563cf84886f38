//! Backends that run device code: CUDA GPUs and the CPU emulator.

pub mod cuda;
pub mod emu;

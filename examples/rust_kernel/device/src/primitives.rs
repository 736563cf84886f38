//! Test kernels: one per primitive family of symcomm-kernel (filled in below).

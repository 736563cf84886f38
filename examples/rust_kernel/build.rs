//! Builds the GPU image of this example's Rust kernels (`device/`, a `#![no_std]` crate of
//! `symcomm_kernel::kernel!`s): PTX with the nightly toolchain, linked with symcomm's device
//! library by nvlink into a fatbin. The emulator entries come from the same crate, a normal
//! dependency. `src/main.rs` includes the generated `rust_kernel_device_image.rs`.
fn main() {
    let built = symcomm_device::build::DeviceBuild::new("rust_kernel")
        .rust_kernels("device")
        .compile();
    if let Err(e) = built {
        eprintln!("rust_kernel device build failed: {e}");
        std::process::exit(1);
    }
}

//! Compiles this example's kernels (`kernels/*.cu`) for both backends with symcomm's build
//! helper: a fatbin when nvcc is available (else the sources are embedded for NVRTC), and an
//! emulator library always. `src/main.rs` includes the generated `custom_kernel_device_image.rs`.
fn main() {
    let built = symcomm_device::build::DeviceBuild::new("custom_kernel")
        .sources_in("kernels")
        .and_then(|b| b.compile());
    if let Err(e) = built {
        eprintln!("custom_kernel device build failed: {e}");
        std::process::exit(1);
    }
}

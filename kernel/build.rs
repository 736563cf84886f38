//! Host targets (the emulator): compiles `ffi*.cu`, the device library's C ABI for Rust kernels,
//! into the emulator archive linked with this crate, through the build helper of
//! `symcomm-device` (the same flags as built-in kernels' emulator objects, plus `-Wextra
//! -Werror`; kept in its build cache, so `cargo clippy`, `cargo test` and `cargo build` compile
//! it once between them). On `nvptx64` nothing is built here: `symcomm_device::build` compiles
//! `ffi*.cu` with nvcc and links them with the kernels' PTX.
//!
//! `--cfg symcomm_kernel_staticlib` (the ThreadSanitizer route, `scripts/emu-tsan-rust`) builds
//! the C ABI with `-fsanitize=thread`.
fn main() {
    println!("cargo:rustc-check-cfg=cfg(symcomm_kernel_staticlib)");
    if std::env::var("CARGO_CFG_TARGET_ARCH").is_ok_and(|a| a == "nvptx64") {
        return;
    }
    let mut build = symcomm_device::build::DeviceBuild::new("symcomm_kernel_ffi").emulator_only();
    // One source per group of functions (ffi.cuh): the host compiler runs on them concurrently.
    for src in symcomm_device::build::rust::KERNEL_FFI_SOURCES {
        build = build.source(src);
    }
    build = build
        // This directory (ffi.cuh, the sources' shared header: watched, part of the cache key)
        // and the built-in kernels' private header (collective_kernel.cuh), which the C ABI uses.
        .include(".")
        .include("../device/kernels")
        .emulator_flag("-Wextra")
        .emulator_flag("-Werror");
    // The ThreadSanitizer route (kernels as a static library built with `-Zsanitizer=thread
    // --cfg symcomm_kernel_staticlib`): the C ABI is instrumented too, so TSan sees every access
    // of the Rust kernels and of the C++ primitives they call.
    if std::env::var_os("CARGO_CFG_SYMCOMM_KERNEL_STATICLIB").is_some() {
        build = build
            .emulator_flag("-fsanitize=thread")
            .emulator_flag("-fno-omit-frame-pointer");
    }
    if let Err(e) = build.compile() {
        eprintln!("symcomm-kernel: emulator build of the C ABI (ffi*.cu) failed: {e}");
        std::process::exit(1);
    }
}

//! Host targets (the emulator): compiles `ffi.cu`, the device library's C ABI for Rust kernels,
//! with the host C++ compiler and the emulator shim, into a static library linked with this
//! crate. On `nvptx64` nothing is built here: `symcomm_device::build` compiles `ffi.cu` with nvcc
//! and links it with the kernels' PTX.
//!
//! `--cfg symcomm_kernel_staticlib` (the ThreadSanitizer route, `scripts/emu-tsan-rust`) builds
//! the C ABI with `-fsanitize=thread`.
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()));
    let repo = dir.join("..");
    println!("cargo:rustc-check-cfg=cfg(symcomm_kernel_staticlib)");
    println!("cargo:rerun-if-changed=ffi.cu");
    println!("cargo:rerun-if-changed={}", repo.join("include").display());
    println!(
        "cargo:rerun-if-changed={}",
        repo.join("device/kernels").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        repo.join("device/emu").display()
    );
    if std::env::var("CARGO_CFG_TARGET_ARCH").is_ok_and(|a| a == "nvptx64") {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    // The host compiler sees C++ through a one-line wrapper (the file is CUDA C++).
    let wrapper = out.join("ffi.emu.cpp");
    let source = std::fs::canonicalize(dir.join("ffi.cu")).unwrap_or_else(|_| dir.join("ffi.cu"));
    if let Err(e) = std::fs::write(&wrapper, format!("#include \"{}\"\n", source.display())) {
        eprintln!("symcomm-kernel: cannot write {}: {e}", wrapper.display());
        std::process::exit(1);
    }
    let emu = repo.join("device/emu");
    let mut build = cc::Build::new();
    // The ThreadSanitizer route (`scripts/emu-tsan-rust`: kernels as a static library built with
    // `-Zsanitizer=thread --cfg symcomm_kernel_staticlib`): the C ABI is instrumented too, so
    // TSan sees every access of the Rust kernels and of the C++ primitives they call.
    if std::env::var_os("CARGO_CFG_SYMCOMM_KERNEL_STATICLIB").is_some() {
        build
            .flag("-fsanitize=thread")
            .flag("-g1")
            .flag("-fno-omit-frame-pointer");
    }
    build
        .cpp(true)
        .std("c++17")
        // Emulated kernels run many element operations in tests: optimize even in debug builds.
        .opt_level(2)
        .define("SYMCOMM_EMU", None)
        .include(&emu)
        .include(repo.join("include"))
        .include(repo.join("device/kernels"))
        .flag("-include")
        .flag(emu.join("symcomm_emu.h").display().to_string())
        .warnings(true)
        .extra_warnings(true)
        .flag("-Werror")
        .file(&wrapper)
        .compile("symcomm_kernel_ffi");
}

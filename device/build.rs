//! Compiles the emulator runtime (`emu/runtime.cpp`) into a static library linked into every
//! crate that depends on symcomm-device.
fn main() {
    println!("cargo:rerun-if-changed=emu");
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("emu/runtime.cpp")
        .include("emu")
        // Every emulated thread switch, barrier and yield runs through here: optimized in every
        // profile, as the emulated kernels are (a debug build's -O0 doubled a busy kernel's time).
        .opt_level(2)
        .define("SYMCOMM_EMU", None)
        .flag("-include")
        .flag(format!("{dir}/emu/symcomm_emu.h"))
        .warnings(true)
        .extra_warnings(true)
        .flag("-Werror")
        .compile("symcomm_emu_rt");
    println!("cargo:rustc-link-lib=pthread");
}

//! Builds symcomm's built-in kernels (`device/kernels/*.cu`) for both backends through the build
//! helper of `symcomm-device`: one fatbin per source (SASS sm_80 + sm_90, PTX compute_90) when
//! nvcc is available, emulator objects always. See `symcomm_device::build`.
//!
//! Under `cargo fuzz` (`--cfg fuzzing`) the image is built without kernels: the fuzz targets
//! (`fuzz/`) exercise the host's parsers only, and leaving the kernels out spares their
//! instrumented build minutes of compiling (CI runs them on every run).
fn main() {
    if std::env::var_os("CARGO_CFG_FUZZING").is_some() {
        if let Err(e) = symcomm_device::build::DeviceBuild::new("symcomm").compile() {
            eprintln!("symcomm device build (no kernels, fuzzing) failed: {e}");
            std::process::exit(1);
        }
        return;
    }
    let build = symcomm_device::build::DeviceBuild::new("symcomm")
        .deny_spills(true)
        // The built-in kernels' private header (collective_kernel.cuh), embedded for NVRTC.
        .include("device/kernels")
        .sources_in("device/kernels");
    match build.and_then(|b| b.compile()) {
        Ok(out) => {
            if let Some(nvcc) = out.nvcc {
                println!("cargo:rustc-env=SYMCOMM_BUILD_NVCC={}", nvcc.path.display());
            }
        }
        Err(e) => {
            // A build script reports failure by exiting non-zero with the reason on stderr.
            eprintln!("symcomm device build failed: {e}");
            std::process::exit(1);
        }
    }
}

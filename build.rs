//! Builds symcomm's built-in kernels (`device/kernels/*.cu`) for both backends through the build
//! helper of `symcomm-device`: one fatbin per source (SASS sm_80 + sm_90, PTX compute_90) when
//! nvcc is available, emulator objects always. See `symcomm_device::build`.
fn main() {
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

//! The GPU image of the Rust kernels, as `build.rs` made it (the pinned CUDA toolchain in CI):
//!
//! - a fatbin with SASS for sm_80 and sm_90, linked by nvlink from the kernels' PTX and the
//!   device library's C ABI (`kernel/ffi*.cu`);
//! - the embedded PTX (`rust_kernel_device.ptx`) defines exactly the image's kernels, calls
//!   nothing but the C ABI (`symcomm_rs_*`: no `core` function left unresolved), and carries the
//!   memory-ordering forms of symcomm-kernel's native primitives — the same instructions as the
//!   C++ headers (`ld.acquire.sys.u64`, `st.release.gpu.u64`, `atom.acq_rel.gpu.add.u64`, ...) —
//!   with no `ld.volatile` polling and no fused multiply-add (the GELU epilogue is bit-identical
//!   to the host reference only without contraction).
//!
//! Needs an image built with nvcc and the nightly toolchain: without them these tests fail,
//! saying so — they never skip.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use symcomm_device::image::{FatbinEntry, Module, fatbin_entries};

include!(concat!(env!("OUT_DIR"), "/rust_kernel_device_image.rs"));

fn rust_module() -> &'static Module {
    assert!(
        DEVICE_IMAGE.compiler.is_some(),
        "the image was built without nvcc ({}): run scripts/install-cuda (the pinned toolchain) and rebuild",
        DEVICE_IMAGE.no_compiler_reason
    );
    let [m] = DEVICE_IMAGE.modules else {
        panic!(
            "expected one module (the Rust crate), got {}",
            DEVICE_IMAGE.modules.len()
        )
    };
    assert_eq!(m.source_name, "rust_kernel_device.ptx");
    m
}

fn ptx() -> &'static str {
    let m = rust_module();
    DEVICE_IMAGE
        .source(m.source_name)
        .unwrap_or_else(|| panic!("{} is not embedded", m.source_name))
        .contents
}

#[test]
fn the_fatbin_has_sass_for_every_architecture() {
    let m = rust_module();
    let bin = m.fatbin.expect("no fatbin although nvcc built the image");
    let entries = fatbin_entries(bin).expect("not a fatbin");
    for arch in DEVICE_IMAGE.sass_archs {
        let num: u32 = arch.trim_start_matches("sm_").parse().unwrap();
        assert!(
            entries.contains(&FatbinEntry {
                kind: FatbinEntry::ELF,
                arch: num
            }),
            "no {arch} SASS in the Rust kernels' fatbin: {entries:?}"
        );
    }
}

#[test]
fn the_ptx_defines_the_kernels_and_calls_only_the_device_library() {
    let ptx = ptx();
    assert!(
        ptx.contains(".target sm_80"),
        "PTX target: {}",
        &ptx[..ptx.len().min(300)]
    );
    let mut entries = symcomm_device::ptx::ptx_entries(ptx);
    entries.sort();
    let mut kernels: Vec<&str> = rust_module().kernels.iter().map(|k| k.name).collect();
    kernels.sort();
    assert_eq!(entries, kernels);
    for want in ["allreduce_bias_gelu", "rust_all_reduce"] {
        assert!(kernels.contains(&want), "{want} missing from {kernels:?}");
    }
    let externs = symcomm_device::ptx::ptx_extern_functions(ptx);
    assert!(
        externs.iter().any(|f| f == "symcomm_rs_barrier"),
        "{externs:?}"
    );
    let foreign: Vec<_> = externs
        .iter()
        .filter(|f| !f.starts_with("symcomm_rs_"))
        .collect();
    assert!(
        foreign.is_empty(),
        "the PTX calls functions nothing links: {foreign:?}"
    );
}

#[test]
fn the_ptx_uses_the_intended_memory_ordering_forms() {
    let ptx = ptx();
    for form in [
        "ld.acquire.gpu.u64",
        "ld.acquire.sys.u64",
        "ld.relaxed.sys.u32",
        "st.release.gpu.u64",
        "st.release.sys.u64",
        "st.relaxed.gpu.u64",
        "atom.release.sys.add.u64",
        "atom.acq_rel.gpu.add.u64",
        "atom.acq_rel.sys.cas.b32",
    ] {
        assert!(ptx.contains(form), "no `{form}` in the Rust kernels' PTX");
    }
    assert!(
        !ptx.contains("ld.volatile"),
        "volatile polling in the Rust kernels' PTX"
    );
    assert!(
        !ptx.contains("fma.rn"),
        "a fused multiply-add in the Rust kernels' PTX"
    );
}

//! Run-time compilation of the embedded kernels with NVRTC, checked without a GPU: every module of
//! the device image compiles to PTX for sm_90 and the pinned ptxas assembles that PTX; a broken
//! source yields `Error::Nvrtc` carrying the compile log.
//!
//! Needs the pinned CUDA toolchain (`scripts/install-cuda`); without it these tests fail with a
//! message saying so — they never skip.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Command;

use symcomm::testing::cuda::{nvrtc_compile, nvrtc_compile_with, nvrtc_version};
use symcomm::{DEVICE_IMAGE, Error};
use symcomm_device::image::{DeviceImage, Module, SourceFile};
use symcomm_device::toolchain;

const INSTALL_HINT: &str = "the pinned CUDA toolchain is missing: run scripts/install-cuda";

fn ptxas() -> PathBuf {
    toolchain::find_ptxas().unwrap_or_else(|| {
        panic!(
            "{INSTALL_HINT} (no ptxas next to nvcc or in {:?})",
            toolchain::pinned_cuda_root()
        )
    })
}

fn require_nvrtc() -> (i32, i32) {
    nvrtc_version().unwrap_or_else(|e| {
        panic!(
            "{INSTALL_HINT} ({e}; candidates outside the loader path: {:?})",
            toolchain::nvrtc_library_candidates()
        )
    })
}

/// A fresh scratch directory under the system temp dir.
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("symcomm-nvrtc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

#[test]
fn nvrtc_is_the_pinned_major_version() {
    let (major, minor) = require_nvrtc();
    let pinned_major: i32 = toolchain::PINNED_CUDA_VERSION
        .split('.')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        major,
        pinned_major,
        "NVRTC {major}.{minor} is loaded, the pinned toolchain is CUDA {}",
        toolchain::PINNED_CUDA_VERSION
    );
}

/// The NVRTC and ptxas options of `module` in
/// [`every_embedded_module_compiles_to_ptx_that_ptxas_assembles`]: the production ones (none
/// beyond the tools' defaults) for every module but the collective kernel's other element types.
/// Those are one template (`collective_kernel.cuh`) instantiated once per file: f32 goes through
/// NVRTC's optimizer and ptxas's as a GPU run would, the other eleven at `--Ofast-compile=max`
/// (both tools have the option), which still parses, instantiates and lowers every line of them
/// to PTX, and ptxas still checks and assembles all of it (their optimized code is what the nvcc
/// build compiles, from the same front end, for sm_80 and sm_90). Per type: about 15 s of NVRTC
/// and 11 s of ptxas, against 3 s and 3 s.
fn check_options(module: &Module) -> &'static [&'static str] {
    let collective = module
        .kernels
        .iter()
        .any(|k| k.name.starts_with("symcomm_collective_"));
    let representative = module
        .kernels
        .iter()
        .any(|k| k.name == "symcomm_collective_f32");
    if collective && !representative {
        &["--Ofast-compile=max"]
    } else {
        &[]
    }
}

#[test]
fn every_embedded_module_compiles_to_ptx_that_ptxas_assembles() {
    require_nvrtc();
    let ptxas = ptxas();
    let dir = scratch("modules");
    assert!(
        !DEVICE_IMAGE.modules.is_empty(),
        "the device image has no modules"
    );
    assert!(
        DEVICE_IMAGE
            .modules
            .iter()
            .any(|m| check_options(m).is_empty()
                && m.kernels.iter().any(|k| k.name == "symcomm_collective_f32")),
        "no module with symcomm_collective_f32: the collective kernel would never be compiled with the production options"
    );
    // NVRTC and ptxas are single-threaded: one worker per CPU takes the next module (more
    // threads than CPUs only make each compile slower).
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let (dir, ptxas, next) = (&dir, &ptxas, &next);
            scope.spawn(move || {
                while let Some(module) = DEVICE_IMAGE
                    .modules
                    .get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    check_module(module, dir, ptxas);
                }
            });
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// NVRTC compiles `module` for sm_90 ([`check_options`]) to PTX that ptxas assembles.
fn check_module(module: &Module, dir: &std::path::Path, ptxas: &std::path::Path) {
    let ptx = nvrtc_compile_with(&DEVICE_IMAGE, module, "sm_90", check_options(module))
        .unwrap_or_else(|e| panic!("NVRTC failed on {}: {e}", module.source));
    assert!(
        ptx.lines().any(|l| l.starts_with(".version ")),
        "{}: no .version in the PTX",
        module.source
    );
    assert!(
        ptx.lines().any(|l| l.trim() == ".target sm_90"),
        "{}: PTX is not for sm_90",
        module.source
    );
    if let Some(isa) = DEVICE_IMAGE.ptx_isa {
        // nvcc and NVRTC of the same pinned release emit the same PTX ISA.
        assert!(
            ptx.lines().any(|l| l.trim() == format!(".version {isa}")),
            "{}: NVRTC's PTX ISA differs from nvcc's {isa}",
            module.source
        );
    }
    for kernel in module.kernels {
        assert!(
            ptx.lines()
                .any(|l| l.contains(".entry") && l.contains(kernel.name)),
            "{}: no .entry {} in the PTX",
            module.source,
            kernel.name
        );
    }
    let stem = module.source_name.trim_end_matches(".cu");
    let ptx_path = dir.join(format!("{stem}.ptx"));
    let cubin_path = dir.join(format!("{stem}.cubin"));
    std::fs::write(&ptx_path, &ptx).expect("write PTX");
    let out = Command::new(ptxas)
        .arg("-arch=sm_90")
        .args(check_options(module))
        .arg(&ptx_path)
        .arg("-o")
        .arg(&cubin_path)
        .output()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", ptxas.display()));
    assert!(
        out.status.success(),
        "ptxas rejected NVRTC's PTX for {} ({}):\n{}",
        module.source,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let cubin = std::fs::read(&cubin_path).expect("read cubin");
    assert!(
        cubin.starts_with(b"\x7fELF"),
        "{}: ptxas output is not an ELF cubin",
        module.source
    );
}

const fn test_image(
    name: &'static str,
    modules: &'static [Module],
    sources: &'static [SourceFile],
) -> DeviceImage {
    DeviceImage {
        name,
        modules,
        sources,
        compiler: None,
        no_compiler_reason: "test image",
        sass_archs: &[],
        ptx_arch: "compute_90",
        ptx_isa: None,
        report: &[],
    }
}

/// A module of `source` (named `source_name` among the image's sources) with no fatbin.
const fn test_module(source: &'static str, source_name: &'static str) -> Module {
    Module {
        source,
        source_name,
        fatbin: None,
        kernels: &[],
    }
}

/// The header that the broken and the fixed programs include.
const HELPER: SourceFile = SourceFile {
    name: "helper/util.cuh",
    contents: "#pragma once\n__device__ inline unsigned helper_value() { return 7u; }\n",
};

static BROKEN_IMAGE: DeviceImage = test_image(
    "broken",
    &[test_module("tests/broken.cu", "broken.cu")],
    &[
        SourceFile {
            name: "broken.cu",
            contents: "#include <helper/util.cuh>\n\
                       extern \"C\" __global__ void broken_kernel(unsigned* out) {\n\
                       \x20   out[0] = helper_value() + undeclared_identifier_xyz;\n\
                       }\n",
        },
        HELPER,
    ],
);

#[test]
fn broken_source_reports_the_compile_log() {
    require_nvrtc();
    let err = nvrtc_compile(&BROKEN_IMAGE, &BROKEN_IMAGE.modules[0], "sm_90").unwrap_err();
    let Error::Nvrtc { call, error } = &err else {
        panic!("expected Error::Nvrtc, got {err:?}");
    };
    assert_eq!(*call, "nvrtcCompileProgram");
    assert!(error.contains("NVRTC_ERROR_COMPILATION"), "{error}");
    // The log names the offending identifier: the in-memory header was found (no "cannot open
    // source file" error) and the real error reached the message.
    assert!(error.contains("undeclared_identifier_xyz"), "{error}");
    assert!(!error.contains("cannot open source file"), "{error}");
    assert!(
        err.to_string()
            .starts_with("NVRTC nvrtcCompileProgram failed")
    );
}

#[test]
fn the_same_program_compiles_once_the_error_is_fixed() {
    // The in-memory header mechanism on its own: the fixed version of BROKEN_IMAGE compiles.
    require_nvrtc();
    static FIXED: DeviceImage = test_image(
        "fixed",
        &[test_module("tests/fixed.cu", "fixed.cu")],
        &[
            SourceFile {
                name: "fixed.cu",
                contents: "#include <helper/util.cuh>\n\
                           extern \"C\" __global__ void fixed_kernel(unsigned* out) {\n\
                           \x20   out[0] = helper_value();\n\
                           }\n",
            },
            HELPER,
        ],
    );
    let ptx = nvrtc_compile(&FIXED, &FIXED.modules[0], "sm_80").expect("compiles");
    assert!(ptx.contains(".entry fixed_kernel"), "{ptx}");
}

#[test]
fn unknown_architecture_is_an_nvrtc_error() {
    require_nvrtc();
    let module = &DEVICE_IMAGE.modules[0];
    let err = nvrtc_compile(&DEVICE_IMAGE, module, "sm_1").unwrap_err();
    assert!(matches!(err, Error::Nvrtc { .. }), "{err:?}");
}

#[test]
fn module_without_embedded_source_is_refused() {
    static NO_SOURCE: DeviceImage = test_image(
        "nosource",
        &[test_module("tests/missing.cu", "missing.cu")],
        &[],
    );
    require_nvrtc();
    let err = nvrtc_compile(&NO_SOURCE, &NO_SOURCE.modules[0], "sm_90").unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("missing.cu")),
        "{err:?}"
    );
}

/// The device library's numeric layer (types.cuh, reduce.cuh) through the production NVRTC path
/// (in-memory headers from the device image): `device/tests/cuda/numerics_instantiate.cu`
/// instantiates every dtype x op through `dispatch` and as one kernel per pair, and every kernel
/// must reach the PTX (sm_90; sm_80 with ptxas, and nvcc, are covered by symcomm-device's
/// `tests/numerics.rs`).
#[test]
fn numeric_layer_compiles_through_nvrtc_compile() {
    require_nvrtc();
    let mut sources: Vec<SourceFile> = DEVICE_IMAGE
        .sources
        .iter()
        .map(|s| SourceFile {
            name: s.name,
            contents: s.contents,
        })
        .collect();
    sources.push(SourceFile {
        name: "numerics_instantiate.cu",
        contents: include_str!("../device/tests/cuda/numerics_instantiate.cu"),
    });
    static MODULES: [Module; 1] = [test_module(
        "device/tests/cuda/numerics_instantiate.cu",
        "numerics_instantiate.cu",
    )];
    let image = test_image("numerics", &MODULES, Box::leak(sources.into_boxed_slice()));
    let ptx = nvrtc_compile(&image, &image.modules[0], "sm_90")
        .unwrap_or_else(|e| panic!("NVRTC failed on numerics_instantiate.cu: {e}"));
    let entries: Vec<&str> = ptx
        .lines()
        .filter_map(|l| l.split(".entry ").nth(1))
        .map(|l| l.trim_end_matches('(').trim())
        .collect();
    let mut want = vec!["symcomm_numerics_dispatch".to_owned()];
    for d in [
        "f32", "f64", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "i8", "u8", "i32", "u32", "i64", "u64",
    ] {
        for o in ["sum", "prod", "min", "max", "avg"] {
            want.push(format!("symcomm_numerics_pair_{d}_{o}"));
        }
    }
    for w in &want {
        assert!(
            entries.contains(&w.as_str()),
            "no .entry {w} in NVRTC's PTX (entries: {entries:?})"
        );
    }
}

//! The numeric layer of the device library (`include/symcomm/types.cuh`, `reduce.cuh`), checked
//! without a GPU:
//!
//! - `conversions_match_nvidia_bit_for_bit`: the oracle (`tests/cuda/oracle_*.cpp`) compares
//!   symcomm's f16 / bf16 / fp8 conversions (emulator build, i.e. the software paths) with NVIDIA's
//!   host implementations from the pinned toolkit's `cuda_fp16.h` / `cuda_bf16.h` / `cuda_fp8.h`:
//!   every bit pattern to float, and float to each format for ~21 million inputs (every value and
//!   midpoint of each format +-2 ulps, specials, pseudo-random floats from a printed seed; set
//!   `SYMCOMM_NUMERICS_SEED` to try another). Any mismatch fails.
//! - `every_dtype_op_compiles_with_nvcc`: `tests/cuda/numerics_instantiate.cu` (every dtype x op
//!   through `dispatch`, and as one kernel per pair with `SYMCOMM_FOR_EACH_DTYPE_OP`; a
//!   collective's loop shapes for two pairs) with the pinned nvcc for sm_80 and sm_90,
//!   `-Xptxas -v`: every kernel on both architectures, none with a stack frame or spills.
//! - `every_dtype_op_compiles_with_nvrtc`: the same file with the pinned NVRTC (no standard
//!   headers) to PTX for compute_80, assembled by the pinned ptxas for sm_80 (the root crate's
//!   tests/nvrtc.rs compiles it for sm_90 through symcomm's own `nvrtc_compile`).
//! - `instantiation_file_compiles_for_the_emulator`: the same file with the host C++ compiler in
//!   emulator mode (`-Wall -Wextra -Werror`), every kernel's emulator entry point present.
//!
//! The emulator-side semantics (Accumulator, packs, dispatch) are checked by
//! `emu/tests/reduce_selftest.cpp` (scripts/emu-tsan).
//!
//! Needs the pinned CUDA toolchain (`scripts/install-cuda`); without it these tests fail with a
//! message saying so — they never skip. The host C++ compiler is `$CXX`, else `g++`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use symcomm_device::toolchain;

const INSTALL_HINT: &str = "the pinned CUDA toolchain is missing: run scripts/install-cuda";

const DTYPES: [&str; 12] = [
    "f32", "f64", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "i8", "u8", "i32", "u32", "i64", "u64",
];
const OPS: [&str; 5] = ["sum", "prod", "min", "max", "avg"];

/// The pinned CUDA root, with everything these tests use; panics with the install hint otherwise.
fn cuda_root() -> PathBuf {
    let root = toolchain::pinned_cuda_root().unwrap_or_else(|| {
        panic!("{INSTALL_HINT} (neither SYMCOMM_CUDA_CACHE, XDG_CACHE_HOME nor HOME is set)")
    });
    for need in [
        "bin/nvcc",
        "bin/ptxas",
        "include/cuda_fp16.h",
        "include/cuda_bf16.h",
        "include/cuda_fp8.h",
        "include/nvrtc.h",
        "lib/libnvrtc.so.13",
    ] {
        let p = root.join(need);
        assert!(p.is_file(), "{INSTALL_HINT} ({} not found)", p.display());
    }
    root
}

fn cuda_tests() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cuda")
}

fn cxx() -> String {
    std::env::var("CXX")
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "g++".to_owned())
}

/// A fresh scratch directory under cargo's per-target temp dir.
fn scratch(tag: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("numerics-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Runs `cmd`; panics with its output unless it succeeds.
fn run(what: &str, cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{what} failed ({}): {cmd:?}\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// Emulator-mode flags of the host C++ compiler (as the build helper and scripts/emu-tsan use).
fn emu_flags(cmd: &mut Command) -> &mut Command {
    cmd.args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-DSYMCOMM_EMU"])
        .arg("-I")
        .arg(symcomm_device::EMU_DIR)
        .arg("-I")
        .arg(symcomm_device::INCLUDE_DIR)
        .args(["-include", "symcomm_emu.h"])
}

/// Every kernel `numerics_instantiate.cu` defines.
fn expected_kernels() -> Vec<String> {
    let mut k: Vec<String> = [
        "symcomm_numerics_dispatch",
        "symcomm_numerics_convert",
        "symcomm_numerics_reduce_fp8_e4m3_avg",
        "symcomm_numerics_reduce_f16_sum",
        "symcomm_numerics_reduce8_fp8_e4m3_avg",
        "symcomm_numerics_reduce8_f16_sum",
    ]
    .map(String::from)
    .to_vec();
    for d in DTYPES {
        for o in OPS {
            k.push(format!("symcomm_numerics_pair_{d}_{o}"));
        }
    }
    k.sort();
    k
}

/// One kernel's ptxas report.
#[derive(Debug, Default, Clone, Copy)]
struct Report {
    registers: u32,
    stack: u32,
    spill_stores: u32,
    spill_loads: u32,
}

/// Parses `ptxas -v` output into (kernel, arch) -> report.
fn parse_ptxas(text: &str) -> BTreeMap<(String, String), Report> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    let number_before = |line: &str, word: &str| -> Option<u32> {
        let i = line.find(word)?;
        line[..i].split_whitespace().last()?.parse().ok()
    };
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let mut parts = rest.split('\'');
            let kernel = parts.next().unwrap_or_default().to_owned();
            let arch = parts.nth(1).unwrap_or_default().to_owned();
            out.insert((kernel.clone(), arch.clone()), Report::default());
            current = Some((kernel, arch));
        } else if let Some(key) = &current {
            let r: &mut Report = out.get_mut(key).expect("current kernel");
            if line.contains("bytes stack frame") {
                r.stack = number_before(line, "bytes stack frame").unwrap_or(u32::MAX);
                r.spill_stores = number_before(line, "bytes spill stores").unwrap_or(u32::MAX);
                r.spill_loads = number_before(line, "bytes spill loads").unwrap_or(u32::MAX);
            } else if line.contains("Used ") && line.contains(" registers") {
                r.registers = number_before(line, "registers").unwrap_or(u32::MAX);
            }
        }
    }
    out
}

/// Checks that every expected kernel was compiled for each of `archs`, with no stack frame and no
/// spills; prints a summary.
fn check_ptxas(tool: &str, text: &str, archs: &[&str]) {
    let reports = parse_ptxas(text);
    let kernels = expected_kernels();
    let mut problems = Vec::new();
    for arch in archs {
        let mut max_regs = (0, String::new());
        for k in &kernels {
            match reports.get(&(k.clone(), (*arch).to_owned())) {
                None => problems.push(format!("{k}: not compiled for {arch}")),
                Some(r) => {
                    if r.stack != 0 || r.spill_stores != 0 || r.spill_loads != 0 {
                        problems.push(format!(
                            "{k} ({arch}): {} bytes stack frame, {} / {} bytes spill stores / loads",
                            r.stack, r.spill_stores, r.spill_loads
                        ));
                    }
                    if r.registers > max_regs.0 {
                        max_regs = (r.registers, k.clone());
                    }
                }
            }
        }
        let dispatch = reports
            .get(&("symcomm_numerics_dispatch".to_owned(), (*arch).to_owned()))
            .map(|r| r.registers)
            .unwrap_or_default();
        println!(
            "{tool} {arch}: {} kernels, dispatch kernel {dispatch} registers, most registers {} ({})",
            kernels.len(),
            max_regs.0,
            max_regs.1
        );
    }
    assert!(
        problems.is_empty(),
        "{tool}: {} problems:\n  {}\n--- ptxas output\n{text}",
        problems.len(),
        problems.join("\n  ")
    );
}

#[test]
fn conversions_match_nvidia_bit_for_bit() {
    let root = cuda_root();
    let dir = scratch("oracle");
    let cuda = cuda_tests();
    let nv_obj = dir.join("oracle_nvidia.o");
    run(
        "compiling NVIDIA's conversions (host C++)",
        Command::new(cxx())
            .args(["-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-c"])
            .arg("-I")
            .arg(cuda.join("host_stub"))
            .arg("-I")
            .arg(root.join("include"))
            .arg(cuda.join("oracle_nvidia.cpp"))
            .arg("-o")
            .arg(&nv_obj),
    );
    let sc_obj = dir.join("oracle_symcomm.o");
    run(
        "compiling symcomm's conversions (emulator mode)",
        emu_flags(&mut Command::new(cxx()))
            .args(["-O2", "-c"])
            .arg(cuda.join("oracle_symcomm.cpp"))
            .arg("-o")
            .arg(&sc_obj),
    );
    let exe = dir.join("oracle");
    run(
        "linking the oracle",
        Command::new(cxx())
            .arg(&nv_obj)
            .arg(&sc_obj)
            .arg("-o")
            .arg(&exe),
    );
    let mut cmd = Command::new(&exe);
    if let Some(seed) = std::env::var_os("SYMCOMM_NUMERICS_SEED") {
        cmd.arg(seed);
    }
    let out = cmd.output().expect("run the oracle");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    let total = stdout
        .lines()
        .find_map(|l| l.strip_prefix("TOTAL checked "))
        .unwrap_or_else(|| panic!("the oracle printed no TOTAL line ({})", out.status));
    let mut words = total.split_whitespace();
    let checked: u64 = words
        .next()
        .and_then(|w| w.parse().ok())
        .expect("checked count");
    let mismatches: u64 = words
        .nth(1)
        .and_then(|w| w.parse().ok())
        .expect("mismatch count");
    assert!(
        out.status.success() && mismatches == 0,
        "symcomm's conversions differ from NVIDIA's in {mismatches} of {checked} cases ({}):\n{stdout}",
        out.status
    );
    assert!(
        checked >= 20_000_000,
        "the oracle checked only {checked} cases"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_dtype_op_compiles_with_nvcc() {
    let root = cuda_root();
    let dir = scratch("nvcc");
    let out = run(
        "nvcc (sm_80, sm_90)",
        Command::new(root.join("bin/nvcc"))
            .args(["-fatbin", "-std=c++17", "-O3", "-Xptxas", "-v"])
            .args([
                "-gencode=arch=compute_80,code=sm_80",
                "-gencode=arch=compute_90,code=sm_90",
            ])
            .arg("-I")
            .arg(symcomm_device::INCLUDE_DIR)
            .arg(cuda_tests().join("numerics_instantiate.cu"))
            .arg("-o")
            .arg(dir.join("numerics.fatbin")),
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    check_ptxas("nvcc", &text, &["sm_80", "sm_90"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_dtype_op_compiles_with_nvrtc() {
    let root = cuda_root();
    let dir = scratch("nvrtc");
    let driver = dir.join("nvrtc_compile");
    let lib = root.join("lib");
    run(
        "building the NVRTC driver",
        Command::new(cxx())
            .args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror"])
            .arg("-I")
            .arg(root.join("include"))
            .arg(cuda_tests().join("nvrtc_compile.cpp"))
            .arg("-o")
            .arg(&driver)
            .arg("-L")
            .arg(&lib)
            .arg("-l:libnvrtc.so.13")
            .arg(format!("-Wl,-rpath,{}", lib.display())),
    );
    // libnvrtc opens its builtins library by bare name: it must be on the loader's path.
    let ld_path = match std::env::var_os("LD_LIBRARY_PATH") {
        Some(p) if !p.is_empty() => {
            let mut v = lib.clone().into_os_string();
            v.push(":");
            v.push(p);
            v
        }
        _ => lib.clone().into_os_string(),
    };
    // compute_80 only: sm_90 SASS comes from the nvcc test, sm_90 NVRTC through symcomm's own
    // `nvrtc_compile` from the root crate's tests/nvrtc.rs.
    let (virt, sass) = ("compute_80", "sm_80");
    let ptx = dir.join(format!("numerics_{virt}.ptx"));
    run(
        &format!("NVRTC ({virt})"),
        Command::new(&driver)
            .env("LD_LIBRARY_PATH", &ld_path)
            .arg(cuda_tests().join("numerics_instantiate.cu"))
            .arg(virt)
            .arg(&ptx)
            .arg(format!("-I{}", symcomm_device::INCLUDE_DIR)),
    );
    let text = std::fs::read_to_string(&ptx).expect("read PTX");
    assert!(
        text.lines().any(|l| l.trim() == format!(".target {sass}")),
        "NVRTC {virt}: no `.target {sass}` in the PTX"
    );
    let out = run(
        &format!("ptxas ({sass}) on NVRTC's PTX"),
        Command::new(root.join("bin/ptxas"))
            .args(["-O3", "-v"])
            .arg(format!("-arch={sass}"))
            .arg(&ptx)
            .arg("-o")
            .arg(dir.join(format!("numerics_{sass}.cubin"))),
    );
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    check_ptxas("nvrtc+ptxas", &report, &[sass]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn instantiation_file_compiles_for_the_emulator() {
    let dir = scratch("emu");
    let obj = dir.join("numerics_instantiate.o");
    run(
        "host C++ compiler (emulator mode)",
        emu_flags(&mut Command::new(cxx()))
            .args(["-O1", "-c", "-x", "c++"])
            .arg(cuda_tests().join("numerics_instantiate.cu"))
            .arg("-o")
            .arg(&obj),
    );
    let out = run("nm", Command::new("nm").arg(&obj));
    let symbols = String::from_utf8_lossy(&out.stdout);
    for k in expected_kernels() {
        let entry = format!("symcomm_emu_entry_{k}");
        assert!(
            symbols
                .lines()
                .any(|l| l.split_whitespace().last() == Some(entry.as_str())),
            "no emulator entry point {entry}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

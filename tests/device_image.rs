//! The embedded device image (`symcomm::DEVICE_IMAGE`) as built by nvcc — the pinned one in CI:
//!
//! - every kernel of every module has a ptxas report for each SASS architecture (sm_80, sm_90),
//!   and no kernel spills;
//! - every module has a fatbin holding SASS for each of those architectures and PTX for
//!   compute_90;
//! - the PTX uses the intended memory-ordering forms: the signal and barrier code of the device
//!   library (compiled here into small probe kernels) release-stores with `st.release.sys`,
//!   acquire-polls with `ld.acquire.sys` (never `ld.volatile`), records errors with
//!   `atom.acq_rel.sys.cas`; every built-in kernel contains those forms; and the collective
//!   kernels move data with 16-byte vector loads and stores. The device API test kernels
//!   (`symcomm_test_*`, device/kernels/device_api.cu) each exercise one primitive, and carry that
//!   primitive's forms instead: semaphores `atom.release.sys.add`, grid_sync (one GPU)
//!   `atom.acq_rel.gpu.add` and `ld.acquire.gpu`, every one `atom.acq_rel.sys.cas`.
//!
//! The fatbins hold their PTX compressed: the modules' PTX is the copy the build helper keeps
//! (`<OUT_DIR>/<stem>.ptx`, what nvcc embedded), the probes' is compiled here with the nvcc that
//! built the image and the build's flags (`-ptx -O3 -arch=compute_90`).
//!
//! Needs an image built with nvcc: without one (no `scripts/install-cuda` run, or
//! `SYMCOMM_NVCC=none`) these tests fail, saying so — they never skip.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use symcomm::DEVICE_IMAGE;
use symcomm_device::image::{CompilerInfo, Module};
use symcomm_device::toolchain::{self, NvccSearch};

fn compiler() -> CompilerInfo {
    DEVICE_IMAGE.compiler.unwrap_or_else(|| {
        panic!(
            "symcomm::DEVICE_IMAGE was built without nvcc ({}), so it has no fatbins, ptxas \
             report or PTX to check. Run scripts/install-cuda first (it installs the pinned CUDA \
             {} toolchain where the build finds it), then rebuild.",
            DEVICE_IMAGE.no_compiler_reason,
            toolchain::PINNED_CUDA_VERSION
        )
    })
}

/// The nvcc that built the image (or, if it moved since, the one the build would find now).
fn nvcc() -> PathBuf {
    let built = PathBuf::from(compiler().nvcc);
    if built.is_file() {
        return built;
    }
    match toolchain::find_nvcc() {
        NvccSearch::Found(n) => n.path,
        other => panic!(
            "the nvcc that built the image ({}) is gone and none is found now ({other:?}): run \
             scripts/install-cuda",
            built.display()
        ),
    }
}

#[test]
fn the_image_was_built_by_nvcc_for_the_intended_targets() {
    let c = compiler();
    println!("nvcc: {} ({}, via {})", c.nvcc, c.version, c.found_via);
    assert_eq!(DEVICE_IMAGE.sass_archs, ["sm_80", "sm_90"]);
    assert_eq!(DEVICE_IMAGE.ptx_arch, "compute_90");
    assert!(
        DEVICE_IMAGE.ptx_isa.is_some(),
        "no PTX ISA version recorded"
    );
    assert!(!DEVICE_IMAGE.modules.is_empty(), "no modules");
    let kernels: Vec<&str> = DEVICE_IMAGE
        .modules
        .iter()
        .flat_map(|m| m.kernels.iter().map(|k| k.name))
        .collect();
    for want in [
        "symcomm_ping_pong",
        "symcomm_collective_f32",
        "symcomm_collective_u64",
    ] {
        assert!(kernels.contains(&want), "no kernel {want} in {kernels:?}");
    }
}

#[test]
fn every_kernel_has_a_spill_free_ptxas_report_per_architecture() {
    compiler();
    let mut known = BTreeSet::new();
    for m in DEVICE_IMAGE.modules {
        for k in m.kernels {
            known.insert(k.name);
            for arch in DEVICE_IMAGE.sass_archs {
                let entries: Vec<_> = DEVICE_IMAGE
                    .report
                    .iter()
                    .filter(|e| e.kernel == k.name && e.arch == *arch)
                    .collect();
                assert_eq!(
                    entries.len(),
                    1,
                    "{}: kernel {} has {} ptxas report entries for {arch}",
                    m.source,
                    k.name,
                    entries.len()
                );
                assert!(
                    entries[0].registers > 0,
                    "{}: {arch} report of {} says 0 registers: {:?}",
                    m.source,
                    k.name,
                    entries[0]
                );
            }
        }
    }
    for e in DEVICE_IMAGE.report {
        assert!(
            known.contains(e.kernel),
            "ptxas report entry for unknown kernel {}",
            e.kernel
        );
        assert_eq!(
            (e.spill_stores, e.spill_loads),
            (0, 0),
            "{} on {} spills: {e:?}",
            e.kernel,
            e.arch
        );
    }
}

/// The entries of a fatbin: (kind, arch) with kind 1 = PTX, 2 = ELF (SASS).
fn fatbin_entries(bin: &[u8]) -> Vec<(u16, u32)> {
    symcomm_device::image::fatbin_entries(bin)
        .expect("not a fatbin")
        .into_iter()
        .map(|e| (e.kind, e.arch))
        .collect()
}

#[test]
fn every_module_has_a_fatbin_with_sass_and_ptx() {
    compiler();
    for m in DEVICE_IMAGE.modules {
        let bin = m
            .fatbin
            .unwrap_or_else(|| panic!("{}: no fatbin although nvcc built the image", m.source));
        let entries = fatbin_entries(bin);
        for arch in DEVICE_IMAGE.sass_archs {
            let num: u32 = arch.trim_start_matches("sm_").parse().unwrap();
            assert!(
                entries.contains(&(2, num)),
                "{}: no {arch} SASS in the fatbin (entries {entries:?})",
                m.source
            );
        }
        let ptx: u32 = DEVICE_IMAGE
            .ptx_arch
            .trim_start_matches("compute_")
            .parse()
            .unwrap();
        assert!(
            entries.contains(&(1, ptx)),
            "{}: no {} PTX in the fatbin (entries {entries:?})",
            m.source,
            DEVICE_IMAGE.ptx_arch
        );
    }
}

// ---------------------------------------------------------------------------------------------
// PTX.

/// A fresh scratch directory holding every embedded source under its include name.
fn scratch_sources() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("symcomm-device-image-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for s in DEVICE_IMAGE.sources {
        let path = dir.join(s.name);
        std::fs::create_dir_all(path.parent().unwrap()).expect("scratch dir");
        std::fs::write(&path, s.contents).expect("write source");
    }
    dir
}

/// PTX for compute_90 of `source` (in `dir`, which is also the include directory), with the
/// build's flags.
fn compile_ptx(nvcc: &Path, dir: &Path, source: &str) -> String {
    let out_path = dir.join(format!("{source}.ptx"));
    let out = Command::new(nvcc)
        .args(["-ptx", "-std=c++17", "-O3"])
        .arg(format!("-arch={}", DEVICE_IMAGE.ptx_arch))
        .arg("-I")
        .arg(dir)
        .arg("-o")
        .arg(&out_path)
        .arg(dir.join(source))
        .output()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", nvcc.display()));
    assert!(
        out.status.success(),
        "nvcc -ptx {source} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(&out_path).expect("read PTX")
}

/// The compute_90 PTX that the build's nvcc put in `m`'s fatbin: the build helper keeps it as
/// `<OUT_DIR>/<stem>.ptx` (`symcomm_device::build`).
fn built_ptx(m: &Module) -> String {
    let stem = m.source_name.trim_end_matches(".cu");
    let path = Path::new(env!("OUT_DIR")).join(format!("{stem}.ptx"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: no PTX kept by the build at {} ({e})",
            m.source,
            path.display()
        )
    })
}

/// The functions of a PTX file (`.entry` and `.func` definitions): name -> body lines.
fn ptx_functions(ptx: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let mut lines = ptx.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim();
        let Some(pos) = t.find(".entry ").or_else(|| t.find(".func ")) else {
            continue;
        };
        if t.starts_with("//") {
            continue;
        }
        // `.func (.param .b32 func_retval0) name(` or `.entry name(`.
        let mut rest = t[pos..]
            .split_once(' ')
            .map(|x| x.1)
            .unwrap_or("")
            .trim_start();
        if rest.starts_with('(') {
            rest = rest.split_once(')').map(|x| x.1).unwrap_or("").trim_start();
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
            .collect();
        // Skip to the body, or to the `;` of a declaration.
        let mut body = Vec::new();
        let mut depth = 0i32;
        let mut started = false;
        for l in lines.by_ref() {
            let lt = l.trim();
            if !started {
                if lt == ";" || lt.ends_with(");") {
                    break;
                }
                if lt.starts_with('{') {
                    started = true;
                } else {
                    continue;
                }
            }
            depth += lt.matches('{').count() as i32 - lt.matches('}').count() as i32;
            body.push(lt.to_owned());
            if depth == 0 {
                break;
            }
        }
        if started && !name.is_empty() {
            out.insert(name, body);
        }
    }
    out
}

/// Whether `name` occurs in `text` as a whole identifier.
fn mentions(text: &str, name: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_' || c == '$';
    text.match_indices(name).any(|(i, _)| {
        !text[..i].chars().next_back().is_some_and(ident)
            && !text[i + name.len()..].chars().next().is_some_and(ident)
    })
}

/// The opcodes (`ld.acquire.sys.u64`) of an entry and of every function it calls, transitively
/// (a call names its callee, often on a line of its own).
fn opcodes_reachable(funcs: &BTreeMap<String, Vec<String>>, entry: &str) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![entry.to_owned()];
    let mut ops = Vec::new();
    while let Some(f) = todo.pop() {
        if !seen.insert(f.clone()) {
            continue;
        }
        let body = funcs
            .get(&f)
            .unwrap_or_else(|| panic!("no PTX function {f}"));
        for l in body {
            // Drop a guard predicate (`@%p1 bra ...`).
            let l = match l.strip_prefix('@') {
                Some(p) => p.split_once(char::is_whitespace).map_or("", |x| x.1),
                None => l.as_str(),
            };
            let Some(op) = l.split_whitespace().next() else {
                continue;
            };
            if !(op.starts_with("//") || op.ends_with(':') || op == "{" || op == "}") {
                ops.push(op.to_owned());
            }
        }
        let text = body.join("\n");
        todo.extend(
            funcs
                .keys()
                .filter(|g| **g != f && mentions(&text, g))
                .cloned(),
        );
    }
    ops
}

/// A 16-byte vector access to global or generic memory (`ld.v4.u32`, `st.global.v2.u64`, ...).
fn is_vec16(op: &str, prefix: &str) -> bool {
    let parts: Vec<&str> = op.split('.').collect();
    if parts.first() != Some(&prefix) {
        return false;
    }
    if parts
        .iter()
        .any(|p| matches!(*p, "param" | "local" | "shared" | "const"))
    {
        return false;
    }
    parts.windows(2).any(|w| {
        matches!(
            (w[0], w[1]),
            ("v4", "u32" | "b32" | "s32" | "f32") | ("v2", "u64" | "b64" | "s64" | "f64")
        )
    })
}

struct Forms {
    release_store: bool,
    acquire_load: bool,
    cas: bool,
    volatile_load: bool,
    vec_load: bool,
    vec_store: bool,
    /// The `.gpu`-scope forms (ranks on one GPU, SYMCOMM_COMM_SAME_GPU).
    release_store_gpu: bool,
    acquire_load_gpu: bool,
    /// Every `ld.volatile` is an LL line load (`ld.volatile.v4.u32`), and there is one.
    ll_loads_only: bool,
    /// An LL line store (`st.volatile.v4.u32`).
    ll_store: bool,
}

fn forms(ops: &[String]) -> Forms {
    let any = |p: &str| ops.iter().any(|o| o.starts_with(p));
    Forms {
        release_store: any("st.release.sys"),
        acquire_load: any("ld.acquire.sys"),
        cas: any("atom.acq_rel.sys.cas"),
        volatile_load: ops
            .iter()
            .any(|o| o.split('.').any(|p| p == "volatile") && o.starts_with("ld.")),
        vec_load: ops.iter().any(|o| is_vec16(o, "ld")),
        vec_store: ops.iter().any(|o| is_vec16(o, "st")),
        release_store_gpu: any("st.release.gpu"),
        acquire_load_gpu: any("ld.acquire.gpu"),
        ll_loads_only: any("ld.volatile.v4.u32")
            && ops
                .iter()
                .filter(|o| o.starts_with("ld.") && o.split('.').any(|p| p == "volatile"))
                .all(|o| o.starts_with("ld.volatile.v4.u32")),
        ll_store: any("st.volatile.v4.u32"),
    }
}

/// Probe kernels: the device library's signal and barrier code, one entry point each.
const PROBE: &str = r#"
#include <symcomm/symcomm.cuh>
using namespace symcomm;
extern "C" __global__ void probe_signal_set(DevComm c) { signal_set(Thread{}, c, 1, 0, 5); }
extern "C" __global__ void probe_signal_wait(DevComm c, unsigned* out) {
    out[0] = unsigned(signal_wait_until(Thread{}, c, 1, 0, 5));
}
extern "C" __global__ void probe_record_error(DevComm c) {
    record_error(Thread{}, c, Status::Timeout, 1, SYMCOMM_OP_SIGNAL_WAIT, 3);
}
extern "C" __global__ void probe_barrier(DevComm c, unsigned* out) {
    out[threadIdx.x] = unsigned(barrier(Cta{}, c, 3, 42));
}
"#;

#[test]
fn the_ptx_uses_the_intended_memory_ordering_and_vector_forms() {
    compiler();
    let nvcc = nvcc();
    let dir = scratch_sources();
    std::fs::write(dir.join("symcomm_probe.cu"), PROBE).expect("write probe");
    let probe_ptx = compile_ptx(&nvcc, &dir, "symcomm_probe.cu");

    // The library's signal and barrier code.
    let probe = ptx_functions(&probe_ptx);
    let f = |e: &str| forms(&opcodes_reachable(&probe, e));
    let set = f("probe_signal_set");
    assert!(set.release_store, "signal_set: no st.release.sys");
    let wait = f("probe_signal_wait");
    assert!(wait.acquire_load, "signal_wait_until: no ld.acquire.sys");
    assert!(
        wait.cas,
        "signal_wait_until: its error record has no atom.acq_rel.sys.cas"
    );
    assert!(
        !wait.volatile_load,
        "signal_wait_until polls with ld.volatile"
    );
    let rec = f("probe_record_error");
    assert!(rec.cas, "record_error: no atom.acq_rel.sys.cas");
    let bar = f("probe_barrier");
    assert!(bar.release_store, "barrier: no st.release.sys");
    assert!(bar.acquire_load, "barrier: no ld.acquire.sys");
    assert!(
        bar.cas,
        "barrier: its error record has no atom.acq_rel.sys.cas"
    );
    assert!(!bar.volatile_load, "barrier polls with ld.volatile");
    // Ranks on one GPU (SYMCOMM_COMM_SAME_GPU) take the .gpu-scope path.
    assert!(bar.release_store_gpu, "barrier: no st.release.gpu");
    assert!(bar.acquire_load_gpu, "barrier: no ld.acquire.gpu");

    // Every built-in kernel communicates through those forms; the collective kernels also
    // use ld.volatile only for LL lines and move data in 16-byte vectors.
    for m in DEVICE_IMAGE.modules {
        check_module(m, &built_ptx(m));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Built-in kernels that work on this rank's memory only (the pre-multiplication of a
/// pre-multiplied sum; the combining step of multi-host collectives; the unfused half of the
/// fused RMSNorm kernel): they communicate with no one. With `true`, the kernel records refused arguments in the rank's error record (its one
/// system-scope CAS).
const LOCAL_KERNELS: &[(&str, bool)] = &[
    ("symcomm_combine", false),
    ("symcomm_premul", false),
    ("symcomm_residual_rmsnorm_bf16", true),
    ("symcomm_residual_rmsnorm_f32", true),
];

fn check_module(m: &Module, ptx: &str) {
    let funcs = ptx_functions(ptx);
    for k in m.kernels {
        let ops = opcodes_reachable(&funcs, k.name);
        let fm = forms(&ops);
        let what = format!("{} ({})", k.name, m.source);
        let count = |p: fn(&str) -> bool| ops.iter().filter(|o| p(o)).count();
        println!(
            "{what}: {} instructions; st.release.sys {}, ld.acquire.sys {}, atom.acq_rel.sys.cas {}, ld.volatile {}, 16-byte ld {}, 16-byte st {}",
            ops.len(),
            count(|o| o.starts_with("st.release.sys")),
            count(|o| o.starts_with("ld.acquire.sys")),
            count(|o| o.starts_with("atom.acq_rel.sys.cas")),
            count(|o| o.starts_with("ld.") && o.split('.').any(|p| p == "volatile")),
            count(|o| is_vec16(o, "ld")),
            count(|o| is_vec16(o, "st")),
        );
        if let Some(&(_, records)) = LOCAL_KERNELS.iter().find(|(n, _)| *n == k.name) {
            // Rank-local work: no ordering with other ranks at all (but the error record's).
            assert!(
                !fm.release_store && !fm.acquire_load && !fm.volatile_load,
                "{what}: a rank-local kernel uses system-scope ordering"
            );
            assert_eq!(
                fm.cas, records,
                "{what}: atom.acq_rel.sys.cas (the error record) expected: {records}"
            );
            continue;
        }
        assert!(fm.cas, "{what}: no atom.acq_rel.sys.cas");
        if k.name.starts_with("symcomm_test_") {
            let has = |prefix: &str| ops.iter().any(|o| o.starts_with(prefix));
            let want: &[&str] = match k.name {
                "symcomm_test_semaphore_ring" => &["atom.release.sys.add", "ld.acquire.sys"],
                "symcomm_test_semaphore_wait" => &["ld.acquire.sys"],
                "symcomm_test_grid_sync" => &["atom.acq_rel.gpu.add", "ld.acquire.gpu"],
                _ => &["ld.acquire.sys"],
            };
            for form in want {
                assert!(has(form), "{what}: no {form}");
            }
            continue;
        }
        assert!(fm.release_store, "{what}: no st.release.sys");
        assert!(fm.acquire_load, "{what}: no ld.acquire.sys");
        if k.name.starts_with("symcomm_collective_") {
            // The LL all-reduce's lines are the only volatile accesses.
            assert!(
                fm.ll_loads_only,
                "{what}: ld.volatile other than LL line loads, or none"
            );
            assert!(fm.ll_store, "{what}: no LL line store (st.volatile.v4.u32)");
            assert!(
                fm.release_store_gpu,
                "{what}: no st.release.gpu (same-GPU barriers)"
            );
            assert!(fm.vec_load, "{what}: no 16-byte vector load");
            assert!(fm.vec_store, "{what}: no 16-byte vector store");
        }
    }
}

/// The PTX reading above on a hand-written file: declarations are skipped, calls are followed
/// across lines (and through a second level), predicates are dropped, and the forms are told
/// apart (a `.param` vector is not a data access; `ld.volatile` is seen).
#[test]
fn the_ptx_reader_follows_calls_and_classifies_forms() {
    let ptx = r#"
.func  (.param .b32 func_retval0) _Z4pollPy(
	.param .b64 _Z4pollPy_param_0
)
;
.visible .entry k(
	.param .align 8 .b8 k_param_0[56]
)
{
	.reg .b64 %rd<4>;
	ld.param.v2.u64 {%rd1, %rd2}, [k_param_0];
	{ // callseq 0, 0
	call.uni (retval0),
	_Z4pollPy,
	(
	param0
	);
	} // callseq 0
	@%p1 st.release.sys.u64 [%rd1], %rd2;
	ret;
}
.func  (.param .b32 func_retval0) _Z4pollPy(
	.param .b64 _Z4pollPy_param_0
)
{
$L__BB1_1:
	ld.volatile.global.u32 %r1, [%rd1];
	call.uni _Z5inner;
	ret;
}
.func _Z5inner()
{
	ld.v4.u32 {%r1, %r2, %r3, %r4}, [%rd1];
	st.local.v2.u64 [%rd2], {%rd3, %rd4};
	ret;
}
.visible .entry lonely()
{
	st.global.v2.f64 [%rd1], {%fd1, %fd2};
	ret;
}
"#;
    let funcs = ptx_functions(ptx);
    assert_eq!(
        funcs.keys().map(String::as_str).collect::<Vec<_>>(),
        ["_Z4pollPy", "_Z5inner", "k", "lonely"]
    );
    let k = forms(&opcodes_reachable(&funcs, "k"));
    assert!(k.release_store && k.volatile_load && k.vec_load);
    assert!(!k.acquire_load && !k.cas && !k.vec_store);
    let lonely = forms(&opcodes_reachable(&funcs, "lonely"));
    assert!(lonely.vec_store && !lonely.vec_load && !lonely.volatile_load);
}

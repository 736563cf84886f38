//! The C API from C: programs in `tests/c/` compiled with the system C compiler (`cc`, or `CC`)
//! against `include/nccl.h`, linked to the library this package builds (see [`library`]), and
//! run on the emulator with ranks as processes and as threads. Each program checks bit-exact
//! values and exits non-zero on any failed check; every run is bounded.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The built library. The package's lib target is also an rlib, so cargo builds it (both crate
/// types) before this test, into this test's own `deps/` directory; `cargo build` copies it up to
/// `target/<profile>/`.
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let lib = deps.join("libsymcomm_nccl.so");
    assert!(
        lib.is_file(),
        "{} is missing: cargo builds it before this package's tests (cargo test -p \
         symcomm-nccl); build it with `cargo build -p symcomm-nccl`",
        lib.display()
    );
    lib
}

/// A directory where the library is `libnccl.so.2` (its SONAME) and `libnccl.so` (for `-lnccl`).
fn nccl_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("capi-lib");
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["libnccl.so.2", "libnccl.so"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(library(), &link).unwrap();
    }
    dir
}

/// A directory holding `libnccl.so.2` built from `tests/c/standin.c` (SONAME `libnccl.so.2`).
fn standin() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("capi-standin");
    std::fs::create_dir_all(&dir).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o"])
        .arg(dir.join("libnccl.so.2"))
        .arg(here.join("tests/c/standin.c"))
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler `{cc}`: {e}"));
    assert!(status.success(), "compiling tests/c/standin.c failed");
    dir
}

/// Compiles `tests/c/<name>.c` (once per test process) and returns the executable.
fn program(name: &'static str) -> PathBuf {
    static BUILT: OnceLock<std::sync::Mutex<Vec<(&'static str, PathBuf)>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    let mut built = built.lock().unwrap();
    if let Some((_, p)) = built.iter().find(|(n, _)| *n == name) {
        return p.clone();
    }
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = nccl_dir();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("capi-{name}"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut cmd = Command::new(&cc);
    cmd.args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread"])
        .arg("-I")
        .arg(here.join("include"))
        .arg(here.join("tests/c").join(format!("{name}.c")))
        .arg("-o")
        .arg(&out);
    if name == "dlopen" {
        cmd.arg("-ldl");
    } else if name == "preload" {
        // Linked against this library, but at run time its RPATH finds the stand-in first.
        cmd.arg(format!("-L{}", lib.display()))
            .arg("-lnccl")
            .arg(format!("-Wl,-rpath,{}", standin().display()));
    } else {
        cmd.arg(format!("-L{}", lib.display()))
            .arg("-lnccl")
            .arg(format!("-Wl,-rpath,{}", lib.display()));
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler `{cc}`: {e}"));
    assert!(status.success(), "compiling tests/c/{name}.c failed");
    built.push((name, out.clone()));
    out
}

/// Runs `program args` on the emulator, bounded; panics with its output unless it passes.
fn run(name: &'static str, args: &[&str]) {
    assert_runs(name, args, &[], true);
}

/// Runs `program args` on the emulator with `env` added, bounded; panics with its output unless
/// it passes (`pass`) or unless it fails (`!pass`).
fn assert_runs(name: &'static str, args: &[&str], env: &[(&str, &str)], pass: bool) {
    let exe = program(name);
    let start = Instant::now();
    let mut child = Command::new(&exe)
        .args(args)
        .env("SYMCOMM_DEVICE", "emu")
        .env("SYMCOMM_INIT_TIMEOUT", "30s")
        .env("SYMCOMM_TIMEOUT", "30s")
        .env_remove("NCCL_COMM_ID")
        .env_remove("SYMCOMM_SECRET")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let limit = Duration::from_secs(90);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "{name} {}: {:.2} s, {}",
        args.join(" "),
        start.elapsed().as_secs_f64(),
        stdout.trim()
    );
    let passed = out.status.success() && stdout.contains("PASS");
    assert!(
        passed == pass,
        "{name} {args:?} {} ({:?}, {:.1} s)\nstdout:\n{stdout}\nstderr:\n{stderr}",
        if pass {
            "failed"
        } else {
            "passed where it must fail"
        },
        out.status,
        start.elapsed().as_secs_f64()
    );
}

#[test]
fn collectives_with_ranks_as_processes() {
    run("collectives", &["procs", "3"]);
}

#[test]
fn collectives_with_ranks_as_threads() {
    run("collectives", &["threads", "4"]);
}

/// With `NCCL_COMM_ID` and `SYMCOMM_SECRET` every process makes the same id itself (nothing is
/// handed from rank 0 to the others).
#[test]
fn nccl_comm_id_gives_every_process_the_same_id() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let secret = "5ca1ab1e".repeat(4);
    assert_runs(
        "collectives",
        &["commid", "3"],
        &[("NCCL_COMM_ID", &addr), ("SYMCOMM_SECRET", &secret)],
        true,
    );
}

#[test]
fn one_thread_drives_every_rank_through_groups() {
    run("collectives", &["single", "3"]);
}

#[test]
fn split_by_color_and_key_on_threads() {
    run("create", &["split", "2"]);
    run("create", &["split", "5"]);
}

#[test]
fn split_inside_a_group_from_one_thread() {
    run("create", &["split-group", "4"]);
}

#[test]
fn non_blocking_init_reports_progress_and_then_works() {
    run("create", &["nonblocking", "3"]);
}

#[test]
fn a_non_blocking_init_that_cannot_finish_is_aborted_at_once() {
    run("create", &["abandon", "1"]);
}

#[test]
fn a_killed_peer_fails_the_others_within_a_bound_and_abort_returns_at_once() {
    run("create", &["deadpeer", "3"]);
}

#[test]
fn pre_multiplied_sums_scale_each_rank_by_its_own_scalar() {
    run("premul", &["threads", "3"]);
}

#[test]
fn bad_arguments_return_their_codes_and_the_communicator_goes_on() {
    run("collectives", &["errors", "2"]);
}

/// The header compiles as C++ too (its declarations in `extern "C"`), with every warning an error.
#[test]
fn the_header_compiles_as_cpp() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let source = Path::new(env!("CARGO_TARGET_TMPDIR")).join("capi-header.cpp");
    std::fs::write(
        &source,
        "#include <nccl.h>\nstatic_assert(sizeof(ncclUniqueId) == 128, \"id\");\n\
         int main() { ncclComm_t c = nullptr; int n = 0; return ncclCommCount(c, &n) == ncclSuccess; }\n",
    )
    .unwrap();
    let status = Command::new(&cxx)
        .args([
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsyntax-only",
            "-I",
        ])
        .arg(here.join("include"))
        .arg(&source)
        .status()
        .unwrap_or_else(|e| panic!("running the C++ compiler `{cxx}`: {e}"));
    assert!(status.success(), "include/nccl.h does not compile as C++");
}

#[test]
fn dlopen_resolves_every_name_pytorch_links() {
    let lib = library();
    run("dlopen", &[lib.to_str().unwrap()]);
}

/// `LD_PRELOAD` of the library replaces another `libnccl.so.2` entirely (its SONAME is
/// NCCL's), where without it the program runs on the stand-in and fails.
#[test]
fn ld_preload_replaces_another_libnccl() {
    assert_runs("preload", &[], &[], false);
    let lib = library();
    assert_runs(
        "preload",
        &[],
        &[("LD_PRELOAD", lib.to_str().unwrap())],
        true,
    );
}

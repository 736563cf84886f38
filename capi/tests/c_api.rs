//! The C API from C: programs in `tests/c/` compiled with the system C compiler (`cc`, or `CC`)
//! against `include/nccl.h`, linked to the library this package builds (see [`library`]), and
//! run on the emulator with ranks as processes and as threads. Each program checks bit-exact
//! values and exits non-zero on any failed check; every run is bounded. Some are compiled
//! against NVIDIA's `nccl.h` too (the pinned `nvidia-nccl-cu13` wheel, which
//! `scripts/nccl-header` fetches: required, never skipped), and `abi.c`'s layout listing is
//! compared between the two headers.

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

/// Which `nccl.h` a C program is compiled against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Header {
    /// `include/nccl.h`.
    Ours,
    /// NVIDIA's, from the pinned `nvidia-nccl-cu13` wheel (see [`nvidia_includes`]).
    Nvidia,
}

/// Runs `scripts/<script>` (which installs what is missing) and returns the directory it prints;
/// panics when it fails: these fixtures are required, never skipped.
fn installed_dir(script: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts")
        .join(script);
    let out = Command::new(&path)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", path.display()));
    assert!(
        out.status.success(),
        "{} failed ({:?}): the test needs what it installs (network access to PyPI on the first \
         run)",
        path.display(),
        out.status
    );
    let dir = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert!(
        dir.is_dir(),
        "{script} printed {}, not a directory",
        dir.display()
    );
    dir
}

/// The include directories for NVIDIA's `nccl.h`: its own (`scripts/nccl-header`: the pinned
/// `nvidia-nccl-cu13` wheel's headers and CCCL's `nv/target`), and the CUDA runtime headers it
/// includes (the pinned CUDA 13.0 toolchain of `scripts/install-cuda`).
fn nvidia_includes() -> Vec<PathBuf> {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let nccl = installed_dir("nccl-header");
        let cuda = installed_dir("install-cuda").join("nvidia/cu13/include");
        let dirs = vec![nccl.join("nccl"), nccl.join("cccl"), cuda];
        for (dir, file) in dirs.iter().zip(["nccl.h", "nv/target", "cuda_runtime.h"]) {
            assert!(dir.join(file).is_file(), "{} lacks {file}", dir.display());
        }
        dirs
    })
    .clone()
}

/// Compiles `tests/c/<name>.c` against `header` (once per test process) and returns the
/// executable.
fn program_against(name: &'static str, header: Header) -> PathBuf {
    type Built = Vec<(&'static str, Header, PathBuf)>;
    static BUILT: OnceLock<std::sync::Mutex<Built>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    let mut built = built.lock().unwrap();
    if let Some((_, _, p)) = built.iter().find(|(n, h, _)| *n == name && *h == header) {
        return p.clone();
    }
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = nccl_dir();
    let suffix = match header {
        Header::Ours => "",
        Header::Nvidia => "-nvidia",
    };
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("capi-{name}{suffix}"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut cmd = Command::new(&cc);
    cmd.args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread"]);
    match header {
        Header::Ours => {
            cmd.arg("-I").arg(here.join("include"));
        }
        Header::Nvidia => {
            // -isystem: NVIDIA's headers are not held to this project's warning flags.
            for dir in nvidia_includes() {
                cmd.arg("-isystem").arg(dir);
            }
        }
    }
    cmd.arg(here.join("tests/c").join(format!("{name}.c")))
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
    assert!(
        status.success(),
        "compiling tests/c/{name}.c against {header:?}'s nccl.h failed"
    );
    built.push((name, header, out.clone()));
    out
}

/// Runs `program args` on the emulator, bounded; panics with its output unless it passes.
fn run(name: &'static str, args: &[&str]) {
    assert_runs(name, args, &[], true);
}

/// Runs `program args` on the emulator with `env` added, bounded; panics with its output unless
/// it passes (`pass`) or unless it fails (`!pass`).
fn assert_runs(name: &'static str, args: &[&str], env: &[(&str, &str)], pass: bool) {
    assert_runs_built(name, Header::Ours, args, env, pass);
}

/// [`assert_runs`] of the program compiled against `header`; returns its stdout and stderr.
fn assert_runs_built(
    name: &'static str,
    header: Header,
    args: &[&str],
    env: &[(&str, &str)],
    pass: bool,
) -> (String, String) {
    let exe = program_against(name, header);
    let start = Instant::now();
    let mut child = Command::new(&exe)
        .args(args)
        .env("SYMCOMM_DEVICE", "emu")
        .env("SYMCOMM_INIT_TIMEOUT", "30s")
        .env("SYMCOMM_TIMEOUT", "30s")
        .env_remove("NCCL_COMM_ID")
        .env_remove("SYMCOMM_SECRET")
        .env_remove("SYMCOMM_LOG")
        .env_remove("SYMCOMM_LOG_SUBSYS")
        .env_remove("SYMCOMM_LOG_FILE")
        .env_remove("NCCL_DEBUG")
        .env_remove("NCCL_DEBUG_SUBSYS")
        .env_remove("NCCL_DEBUG_FILE")
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
        stdout.trim().lines().last().unwrap_or_default()
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
    (stdout.into_owned(), stderr.into_owned())
}

#[test]
fn collectives_with_ranks_as_processes() {
    run("collectives", &["procs", "3"]);
}

/// NCCL's API on a communicator across two (simulated) hosts: ranks 0 and 2 on one, 1 on the
/// other (their own `SYMCOMM_HOST_ID`s), UCX between them; every check of the program bit-exact.
#[test]
fn collectives_across_two_hosts() {
    run("collectives", &["hosts", "3"]);
}

#[test]
fn collectives_with_ranks_as_threads() {
    run("collectives", &["threads", "4"]);
}

/// With `NCCL_COMM_ID` and `SYMCOMM_SECRET` every process makes the same id itself (nothing is
/// handed from rank 0 to the others).
#[test]
fn nccl_comm_id_gives_every_process_the_same_id() {
    let port = symcomm::bootstrap::free_port(std::net::Ipv4Addr::LOCALHOST.into()).unwrap();
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

/// The layout facts `tests/c/abi.c` prints against one header: `(kind, name) -> value`.
fn abi_listing(header: Header) -> std::collections::BTreeMap<(String, String), String> {
    let (stdout, _) = assert_runs_built("abi", header, &[], &[], true);
    stdout
        .lines()
        .filter(|l| !l.starts_with("abi:"))
        .map(|l| {
            let mut parts = l.splitn(3, ' ');
            let (kind, name, value) = (parts.next(), parts.next(), parts.next());
            match (kind, name, value) {
                (Some(k), Some(n), Some(v)) => ((k.to_owned(), n.to_owned()), v.to_owned()),
                _ => panic!("abi ({header:?}): unexpected line {l:?}"),
            }
        })
        .collect()
}

/// Our header against NVIDIA's (the pinned `nvidia-nccl-cu13` wheel, fetched by
/// `scripts/nccl-header`): every size, field offset, enum value and initializer value ours
/// declares is NVIDIA's too, and our `ncclConfig_t` is a layout prefix of theirs (theirs may be
/// longer: newer NCCL appends fields). Both builds also run against our library, NVIDIA's with
/// its longer config.
#[test]
fn our_header_matches_nvidias_layouts() {
    let ours = abi_listing(Header::Ours);
    let theirs = abi_listing(Header::Nvidia);
    assert!(ours.len() > 60, "abi printed only {} facts", ours.len());
    let mut differ = Vec::new();
    for ((kind, name), value) in &ours {
        let key = (kind.clone(), name.clone());
        let Some(other) = theirs.get(&key) else {
            differ.push(format!("{kind} {name}: ours {value}, NVIDIA's has none"));
            continue;
        };
        let ok = match kind.as_str() {
            // Newer NCCL appends to ncclConfig_t and raises its version.
            "config-size" | "version" => {
                value.parse::<u64>().unwrap() <= other.parse::<u64>().unwrap()
            }
            _ => value == other,
        };
        if !ok {
            differ.push(format!("{kind} {name}: ours {value}, NVIDIA's {other}"));
        }
    }
    assert!(
        differ.is_empty(),
        "our nccl.h differs from NVIDIA's:\n{}",
        differ.join("\n")
    );
    let size = |m: &std::collections::BTreeMap<(String, String), String>| {
        m[&("config-size".to_owned(), "ncclConfig_t".to_owned())]
            .parse::<u64>()
            .unwrap()
    };
    eprintln!(
        "ncclConfig_t: ours {} bytes, NVIDIA's {} bytes (NCCL {})",
        size(&ours),
        size(&theirs),
        theirs[&("version".to_owned(), "NCCL_VERSION_CODE".to_owned())]
    );
}

/// `tests/c/collectives.c`, `memory.c` and `gather.c` compiled against NVIDIA's header (its
/// types, its enum values, its longer `ncclConfig_t`, its gather and scatter) and linked to our
/// library: every collective, memory, groups and bad arguments, ranks as threads and processes.
#[test]
fn programs_built_against_nvidias_header_run_on_ours() {
    for (mode, n) in [
        ("threads", "3"),
        ("procs", "2"),
        ("single", "3"),
        ("errors", "2"),
    ] {
        assert_runs_built("collectives", Header::Nvidia, &[mode, n], &[], true);
    }
    assert_runs_built("memory", Header::Nvidia, &["threads", "3"], &[], true);
    assert_runs_built("gather", Header::Nvidia, &["threads", "3"], &[], true);
    // Splits and non-blocking creation with NVIDIA's longer ncclConfig_t, pre-multiplied sums.
    assert_runs_built("create", Header::Nvidia, &["split", "3"], &[], true);
    assert_runs_built("create", Header::Nvidia, &["nonblocking", "2"], &[], true);
    assert_runs_built("premul", Header::Nvidia, &["threads", "2"], &[], true);
}

/// What `tests/c/logging.c` writes on stderr with `env`.
fn logged(env: &[(&str, &str)]) -> String {
    assert_runs_built("logging", Header::Ours, &[], env, true).1
}

/// The line symcomm's init logs at info level, and the version line of `NCCL_DEBUG=VERSION`+.
const READY: &str = "communicator ready";
const VERSION_LINE: &str = "NCCL version 2.21.5";

/// `NCCL_DEBUG` sets symcomm's log level: `INFO` shows the init lines and the version line,
/// `WARN` neither's info lines, `VERSION` the version line only; `SYMCOMM_LOG` takes precedence.
#[test]
fn nccl_debug_sets_the_log_level() {
    let info = logged(&[("NCCL_DEBUG", "INFO")]);
    assert!(
        info.contains(READY) && info.contains("symcomm::init"),
        "{info}"
    );
    assert!(info.contains(VERSION_LINE), "{info}");
    let warn = logged(&[("NCCL_DEBUG", "WARN")]);
    assert!(!warn.contains(READY) && !warn.contains("INFO"), "{warn}");
    let version = logged(&[("NCCL_DEBUG", "VERSION")]);
    assert!(
        version.contains(VERSION_LINE) && !version.contains(READY),
        "{version}"
    );
    let unset = logged(&[]);
    assert!(
        !unset.contains(READY) && !unset.contains(VERSION_LINE),
        "{unset}"
    );
    let overridden = logged(&[("NCCL_DEBUG", "INFO"), ("SYMCOMM_LOG", "warn")]);
    assert!(!overridden.contains(READY), "{overridden}");
}

/// `NCCL_DEBUG_SUBSYS` selects symcomm's subsystems (`^` inverts).
#[test]
fn nccl_debug_subsys_selects_subsystems() {
    let not_init = logged(&[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "^INIT")]);
    assert!(!not_init.contains(READY), "{not_init}");
    let init = logged(&[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT,COLL")]);
    assert!(init.contains(READY), "{init}");
    let coll = logged(&[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "COLL")]);
    assert!(!coll.contains(READY), "{coll}");
}

/// `NCCL_DEBUG_FILE` (with `%h` and `%p`) receives the log instead of stderr.
#[test]
fn nccl_debug_file_receives_the_log() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("capi-nccl-debug-file");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pattern = dir.join("nccl.%h.%p.log");
    let stderr = logged(&[
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_FILE", pattern.to_str().unwrap()),
    ]);
    assert!(!stderr.contains(READY), "{stderr}");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_str().unwrap().to_owned();
    assert!(
        name.starts_with("nccl.") && name.ends_with(".log") && !name.contains('%'),
        "{name}"
    );
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(
        text.contains(READY) && text.contains(VERSION_LINE),
        "{text}"
    );
}

/// `ncclMemAlloc` buffers (4 KiB aligned) under every collective, in and out of place, plain and
/// registered (`ncclCommRegister`), and the four calls' bad arguments; 2 to 4 ranks as threads.
#[test]
fn collectives_on_nccl_mem_alloc_and_registered_buffers() {
    for n in ["2", "3", "4"] {
        run("memory", &["threads", n]);
    }
}

/// `ncclGather` / `ncclScatter`: 2 to 5 ranks as threads, every root, five types, in and out of
/// place, in a group with send/recv, bad arguments; and one thread driving 3 ranks.
#[test]
fn gather_and_scatter_with_every_root() {
    for n in ["2", "3", "4", "5"] {
        run("gather", &["threads", n]);
    }
    run("gather", &["single", "3"]);
}

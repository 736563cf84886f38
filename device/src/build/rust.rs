//! Rust kernel crates (`symcomm-kernel`, issue "Rust kernels"): the GPU image of a crate of
//! `kernel!`s.
//!
//! 1. PTX: `rustup run <nightly> cargo rustc --target nvptx64-nvidia-cuda -Zbuild-std=core` on the
//!    crate, one codegen unit, `-Cpanic=immediate-abort` (a panic traps in place instead of
//!    calling into `core`), `--emit=asm` to one file. The toolchain is `SYMCOMM_RUST_NIGHTLY`
//!    (default `nightly`); it needs the `rust-src` component.
//! 2. The PTX is checked: every `.extern .func` must be a `symcomm_rs_*` function of the device
//!    library's C ABI (`kernel/ffi*.cu`); anything else (a `core` function the optimizer did not
//!    inline) would fail at link time with a worse message.
//! 3. The C ABI ([`KERNEL_FFI_SOURCES`]) to relocatable PTX for the same `sm_80` (`nvcc
//!    -rdc=true -ptx`, once per source, the sources concurrently); per SASS architecture: `ptxas
//!    -c` every PTX file, `nvlink` the objects into one cubin; `fatbinary` packs the cubins. Calls
//!    across the boundary are real calls.
//!
//! On the emulator the same crate, built for the host by cargo as an ordinary dependency, provides
//! the `symcomm_emu_entry_<name>` functions; `symcomm-kernel`'s own build script compiles the C
//! ABI for the emulator.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{SASS_ARCHS, io_error, joined, read};
use crate::Error;
use crate::ptx::{ptx_entries, ptx_extern_functions};
use crate::toolchain::Nvcc;

/// A file of the `symcomm-kernel` crate's directory.
macro_rules! kernel_file {
    ($name:literal) => {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../kernel/", $name)
    };
}

/// The sources of the device library's C ABI for Rust kernels (`kernel/ffi.cuh` says what each
/// holds): compiled one by one, concurrently, and linked together.
pub const KERNEL_FFI_SOURCES: [&str; 9] = [
    kernel_file!("ffi.cu"),
    kernel_file!("ffi_collective_f32.cu"),
    kernel_file!("ffi_collective_f64.cu"),
    kernel_file!("ffi_collective_f16.cu"),
    kernel_file!("ffi_collective_bf16.cu"),
    kernel_file!("ffi_collective_i32.cu"),
    kernel_file!("ffi_collective_u32.cu"),
    kernel_file!("ffi_collective_i64.cu"),
    kernel_file!("ffi_collective_u64.cu"),
];
/// The header the C ABI's sources share.
const KERNEL_FFI_HEADER: &str = kernel_file!("ffi.cuh");
/// The directory of the device library's private kernel headers (`collective_kernel.cuh`), which
/// the C ABI includes.
pub(super) const KERNELS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
/// The `symcomm-kernel` crate's sources (rebuilds when they change).
pub(super) const KERNEL_CRATE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../kernel");

/// The nvptx target of Rust kernels.
pub const RUST_TARGET: &str = "nvptx64-nvidia-cuda";
/// The PTX target of Rust kernels: the oldest SASS target, so that one PTX serves every SASS.
pub const RUST_PTX_CPU: &str = "sm_80";

/// One Rust kernel crate, built.
#[derive(Debug, Clone)]
pub(super) struct RustModule {
    /// The crate's directory, as given.
    pub dir: PathBuf,
    /// The crate's name as Rust code names it (`my_kernels`).
    pub crate_ident: String,
    /// The kernels (`.entry` names of the PTX).
    pub kernels: Vec<String>,
    /// The linked fatbin; `None` when the GPU image was not built (`SYMCOMM_RUST_PTX=none`).
    pub fatbin: Option<PathBuf>,
    /// The crate's PTX (embedded as the source `<crate>.ptx`), when built.
    pub ptx: Option<PathBuf>,
}

/// The package name in a `Cargo.toml` (the `name` of its `[package]` table), as a Rust
/// identifier (`-` becomes `_`), or the `[lib]` name when it has one.
pub(super) fn crate_ident(manifest: &str) -> Option<String> {
    let mut table = "";
    let (mut package, mut lib) = (None, None);
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            table = line;
            continue;
        }
        let Some(rest) = line.strip_prefix("name") else {
            continue;
        };
        let Some(value) = rest.trim_start().strip_prefix('=') else {
            continue;
        };
        let value = value.trim().trim_matches('"').replace('-', "_");
        match table {
            "[package]" => package = Some(value),
            "[lib]" => lib = Some(value),
            _ => {}
        }
    }
    lib.or(package)
}

/// Names of the kernels a Rust kernel crate defines: the `fn` of every `kernel!` invocation in
/// its sources (`src/**/*.rs`), sorted. The PTX's `.entry` list must agree.
pub fn source_kernels(dir: &Path) -> Result<Vec<String>, Error> {
    let re = regex::Regex::new(
        r"(?s)kernel!\s*[\{\(]\s*(?:(?:#\[[^\]]*\]|//[^\n]*\n)\s*)*(?:pub(?:\([^)]*\))?\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)",
    )
    .map_err(|e| Error::CompileFailed {
        tool: "symcomm build",
        what: "the kernel! pattern".into(),
        status: e.to_string(),
        stderr: String::new(),
    })?;
    let mut files = Vec::new();
    rust_files(&dir.join("src"), &mut files)?;
    let mut names = Vec::new();
    for f in files {
        let text = read(&f)?;
        names.extend(re.captures_iter(&text).map(|c| c[1].to_owned()));
    }
    names.sort();
    names.dedup();
    Ok(names)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), Error> {
    for entry in std::fs::read_dir(dir).map_err(|e| io_error(dir, e))? {
        let path = entry.map_err(|e| io_error(dir, e))?.path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// Where the nested nvptx build and the C ABI objects live: `<target dir>/symcomm-rust-kernels`
/// when `out_dir` is a cargo `OUT_DIR` (`<target>/<profile>/build/<pkg>-<hash>/out`), so every
/// profile's build reuses them (core for nvptx, the C ABI per architecture); else `out_dir`.
fn shared_dir(out_dir: &Path) -> PathBuf {
    let target = out_dir.ancestors().nth(4).filter(|_| {
        out_dir
            .ancestors()
            .nth(2)
            .and_then(Path::file_name)
            .is_some_and(|n| n == "build")
    });
    match target {
        Some(t) => t.join("symcomm-rust-kernels"),
        None => out_dir.join("rust-kernels"),
    }
}

/// The flags of the C ABI's PTX (`nvcc -ptx`): relocatable, for [`RUST_PTX_CPU`] like the
/// kernels' PTX, so that one PTX serves every SASS target.
const FFI_PTX_FLAGS: [&str; 4] = ["-std=c++17", "-O3", "-rdc=true", "-ptx"];

/// The cache key of the C ABI's PTX and objects: its source and every header it may include
/// (contents), the compiler and its flags.
fn ffi_key(nvcc: &Nvcc, includes: &[PathBuf]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        nvcc.path.as_os_str(),
        RUST_PTX_CPU,
        FFI_PTX_FLAGS,
        "ptxas -O3 -c",
    )
        .hash(&mut h);
    let mut files: Vec<PathBuf> = KERNEL_FFI_SOURCES
        .iter()
        .chain([&KERNEL_FFI_HEADER])
        .map(PathBuf::from)
        .collect();
    let mut headers = Vec::new();
    for dir in includes
        .iter()
        .chain(std::iter::once(&PathBuf::from(KERNELS_DIR)))
    {
        let _ = super::walk(dir, dir, &mut headers);
    }
    files.extend(headers.into_iter().map(|(p, _)| p));
    files.sort();
    for f in files {
        f.hash(&mut h);
        std::fs::read(&f).unwrap_or_default().hash(&mut h);
    }
    h.finish()
}

/// How the nightly toolchain is reached: `rustup run <toolchain>`.
fn rustup() -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    if let Some(p) = home.map(|h| h.join("bin/rustup")).filter(|p| p.is_file()) {
        return p;
    }
    PathBuf::from("rustup")
}

/// Builds the PTX of the crate at `dir` into `out` (step 1 of the module docs).
fn build_ptx(dir: &Path, work: &Path, out: &Path) -> Result<(), Error> {
    let toolchain = std::env::var("SYMCOMM_RUST_NIGHTLY").unwrap_or_else(|_| "nightly".into());
    let rustup = rustup();
    let mut cmd = Command::new(&rustup);
    // A clean environment: the outer cargo's variables (RUSTC, RUSTFLAGS, CARGO_TARGET_DIR,
    // RUSTUP_TOOLCHAIN, the build script's own) must not leak into the nested build.
    cmd.env_clear();
    for var in [
        "PATH",
        "HOME",
        "CARGO_HOME",
        "RUSTUP_HOME",
        "TMPDIR",
        "USER",
        "LANG",
    ] {
        if let Some(v) = std::env::var_os(var) {
            cmd.env(var, v);
        }
    }
    cmd.env(
        "CARGO_ENCODED_RUSTFLAGS",
        "-Zunstable-options\x1f-Cpanic=immediate-abort",
    )
    .arg("run")
    .arg(&toolchain)
    .arg("cargo")
    .arg("rustc")
    .arg("--quiet")
    .arg("--manifest-path")
    .arg(dir.join("Cargo.toml"))
    .arg("--lib")
    .arg("--release")
    .arg("--target")
    .arg(RUST_TARGET)
    .arg("-Zbuild-std=core")
    .arg("--target-dir")
    .arg(work)
    .arg("--")
    .arg(format!("--emit=asm={}", out.display()))
    .arg(format!("-Ctarget-cpu={RUST_PTX_CPU}"))
    .arg("-Ccodegen-units=1")
    .arg("-Cdebuginfo=0");
    let output = cmd.output().map_err(|source| Error::ToolStart {
        tool: "rustup",
        path: rustup.clone(),
        source: source.into(),
    })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        let hint = if stderr.contains("rust-src") || stderr.contains("build-std") {
            format!(
                "\nhint: Rust kernels need the nightly toolchain `{toolchain}` with rust-src: rustup toolchain install {toolchain} && rustup component add rust-src --toolchain {toolchain} (or SYMCOMM_RUST_PTX=none for an emulator-only build)"
            )
        } else {
            String::new()
        };
        return Err(Error::CompileFailed {
            tool: "rustc (nvptx64)",
            what: dir.display().to_string(),
            status: output.status.to_string(),
            stderr: stderr + &hint,
        });
    }
    Ok(())
}

/// Runs one toolchain command; its stderr in the error.
fn run(tool: &'static str, cmd: &mut Command, what: &str) -> Result<(), Error> {
    let path = PathBuf::from(cmd.get_program());
    let out = cmd.output().map_err(|source| Error::ToolStart {
        tool,
        path,
        source: source.into(),
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::CompileFailed {
            tool,
            what: what.to_owned(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// Assembles relocatable PTX into an object for `arch` (`ptxas -c`, optimized), for nvlink.
fn ptxas_object(ptxas: &Path, arch: &str, ptx: &Path, out: &Path) -> Result<(), Error> {
    run(
        "ptxas",
        Command::new(ptxas)
            .arg(format!("-arch={arch}"))
            .arg("-O3")
            .arg("-c")
            .arg(ptx)
            .arg("-o")
            .arg(out),
        &ptx.display().to_string(),
    )
}

/// One source of the C ABI built in `dir`: its relocatable PTX (`<stem>.ptx`), then an object per
/// SASS target (`<stem>.<arch>.o`, in [`SASS_ARCHS`] order). What `dir` already holds is kept: its
/// name is the key of everything in it ([`ffi_key`]).
fn ffi_objects(
    nvcc: &Nvcc,
    ptxas: &Path,
    includes: &[PathBuf],
    dir: &Path,
    src: &Path,
) -> Result<Vec<PathBuf>, Error> {
    let stem = src
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ptx = dir.join(format!("{stem}.ptx"));
    build_once(&ptx, |partial| {
        let mut cc = Command::new(&nvcc.path);
        cc.args(FFI_PTX_FLAGS)
            .arg(format!("-arch={}", RUST_PTX_CPU.replace("sm_", "compute_")));
        for inc in includes {
            cc.arg("-I").arg(inc);
        }
        cc.arg("-I")
            .arg(KERNELS_DIR)
            .arg(src)
            .arg("-o")
            .arg(partial);
        run("nvcc", &mut cc, &src.display().to_string())
    })?;
    SASS_ARCHS
        .iter()
        .map(|arch| {
            let obj = dir.join(format!("{stem}.{arch}.o"));
            build_once(&obj, |partial| ptxas_object(ptxas, arch, &ptx, partial))?;
            Ok(obj)
        })
        .collect()
}

/// Makes `path` with `make` unless it exists. `make` writes a unique name, renamed to `path` on
/// success: concurrent builds (debug and release at once) never see a partial file.
fn build_once(path: &Path, make: impl FnOnce(&Path) -> Result<(), Error>) -> Result<(), Error> {
    if path.is_file() {
        return Ok(());
    }
    let mut partial = path.as_os_str().to_owned();
    partial.push(format!(".{}", std::process::id()));
    let partial = PathBuf::from(partial);
    make(&partial)?;
    std::fs::rename(&partial, path).map_err(|e| io_error(path, e))
}

/// The tool `name` next to `nvcc` (the pinned toolchain keeps ptxas, nvlink and fatbinary there).
fn sibling(nvcc: &Nvcc, name: &str) -> PathBuf {
    nvcc.path
        .parent()
        .map(|d| d.join(name))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Builds the GPU image of the Rust kernel crate at `dir` (steps 1-3 of the module docs) into
/// `out_dir`. Without nvcc, or with `SYMCOMM_RUST_PTX=none`, it builds no GPU image (a cargo
/// warning says so) and the kernels run on the emulator only.
pub(super) fn build(
    dir: &Path,
    includes: &[PathBuf],
    nvcc: Option<&Nvcc>,
    out_dir: &Path,
) -> Result<RustModule, Error> {
    let manifest = read(&dir.join("Cargo.toml"))?;
    let crate_ident = crate_ident(&manifest).ok_or_else(|| Error::CompileFailed {
        tool: "symcomm build",
        what: dir.join("Cargo.toml").display().to_string(),
        status: "no [package] name".into(),
        stderr: String::new(),
    })?;
    let work = out_dir.join("rust-kernels").join(&crate_ident);
    std::fs::create_dir_all(&work).map_err(|e| io_error(&work, e))?;
    let ptx_path = work.join(format!("{crate_ident}.ptx"));
    let kernels = source_kernels(dir)?;
    let emulator_only = |why: &str| {
        println!(
            "cargo:warning=symcomm: Rust kernels of `{crate_ident}` get no GPU image ({why}); the emulator works as usual"
        );
        RustModule {
            dir: dir.to_owned(),
            crate_ident: crate_ident.clone(),
            kernels: kernels.clone(),
            fatbin: None,
            ptx: None,
        }
    };
    if std::env::var("SYMCOMM_RUST_PTX").is_ok_and(|v| v == "none") {
        return Ok(emulator_only("SYMCOMM_RUST_PTX=none"));
    }
    let shared = shared_dir(out_dir);
    build_ptx(dir, &shared.join("target"), &ptx_path)?;
    let ptx = read(&ptx_path)?;
    let mut entries = ptx_entries(&ptx);
    entries.sort();
    if entries != kernels {
        return Err(Error::CompileFailed {
            tool: "rustc (nvptx64)",
            what: dir.display().to_string(),
            status: format!(
                "the PTX defines the kernels {entries:?}, the sources' kernel! invocations {kernels:?}"
            ),
            stderr: "write each kernel as `kernel! { [docs] [pub] fn name(..) { .. } }`".into(),
        });
    }
    if let Some(bad) = ptx_extern_functions(&ptx)
        .into_iter()
        .find(|f| !f.starts_with("symcomm_rs_"))
    {
        return Err(Error::CompileFailed {
            tool: "rustc (nvptx64)",
            what: dir.display().to_string(),
            status: format!("the PTX calls `{bad}`, which nothing defines"),
            stderr: "Rust kernels may call only the device library (symcomm_rs_*) and #[inline] code; \
                     a call into `core` left in the PTX usually comes from formatting or a panic path"
                .into(),
        });
    }
    let Some(nvcc) = nvcc else {
        return Ok(RustModule {
            ptx: Some(ptx_path),
            ..emulator_only("no nvcc, ptxas and nvlink")
        });
    };
    let (ptxas, nvlink, fatbinary) = (
        sibling(nvcc, "ptxas"),
        sibling(nvcc, "nvlink"),
        sibling(nvcc, "fatbinary"),
    );
    // The C ABI depends only on its sources and the compiler: its PTX and objects are built once
    // per content, shared by every profile's build. Per source one PTX (front end once) and one
    // object per SASS target; the sources concurrently, beside the kernels' own objects.
    let ffi_dir = shared.join(format!("ffi-{:016x}", ffi_key(nvcc, includes)));
    std::fs::create_dir_all(&ffi_dir).map_err(|e| io_error(&ffi_dir, e))?;
    let (ffi, rust): (Vec<_>, Vec<_>) = std::thread::scope(|scope| {
        let ffi: Vec<_> = KERNEL_FFI_SOURCES
            .iter()
            .map(|src| {
                let (ptxas, ffi_dir) = (&ptxas, &ffi_dir);
                scope.spawn(move || ffi_objects(nvcc, ptxas, includes, ffi_dir, Path::new(src)))
            })
            .collect();
        let rust: Vec<_> = SASS_ARCHS
            .iter()
            .map(|arch| {
                let (ptxas, work, ptx_path) = (&ptxas, &work, &ptx_path);
                scope.spawn(move || {
                    let obj = work.join(format!("rust.{arch}.o"));
                    ptxas_object(ptxas, arch, ptx_path, &obj).map(|()| obj)
                })
            })
            .collect();
        (
            ffi.into_iter().map(|j| joined(j, "the C ABI")).collect(),
            rust.into_iter().map(|j| joined(j, &crate_ident)).collect(),
        )
    });
    let ffi = ffi
        .into_iter()
        .collect::<Result<Vec<Vec<PathBuf>>, Error>>()?;
    let rust = rust.into_iter().collect::<Result<Vec<PathBuf>, Error>>()?;
    let fatbin = work.join(format!("{crate_ident}.fatbin"));
    let mut pack = Command::new(&fatbinary);
    pack.arg(format!("--create={}", fatbin.display()))
        .arg("-64");
    for (i, (arch, rust_o)) in SASS_ARCHS.iter().zip(&rust).enumerate() {
        let cubin = work.join(format!("{arch}.cubin"));
        let mut link = Command::new(&nvlink);
        link.arg(format!("-arch={arch}")).arg(rust_o);
        for objects in &ffi {
            link.arg(&objects[i]);
        }
        link.arg("-o").arg(&cubin);
        run("nvlink", &mut link, &format!("{crate_ident} for {arch}"))?;
        let sm = arch.trim_start_matches("sm_");
        pack.arg(format!(
            "--image3=kind=elf,sm={sm},file={}",
            cubin.display()
        ));
    }
    run("fatbinary", &mut pack, &crate_ident)?;
    Ok(RustModule {
        dir: dir.to_owned(),
        crate_ident,
        kernels,
        fatbin: Some(fatbin),
        ptx: Some(ptx_path),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn reads_the_crate_name() {
        let m =
            "[package]\nname = \"my-kernels\"\nversion = \"0.1.0\"\n[dependencies]\nname = \"x\"\n";
        assert_eq!(crate_ident(m).as_deref(), Some("my_kernels"));
        let m = "[package]\nname = \"a\"\n[lib]\nname = \"b_lib\"\n";
        assert_eq!(crate_ident(m).as_deref(), Some("b_lib"));
        assert_eq!(crate_ident("[dependencies]\nname = \"x\"\n"), None);
    }

    #[test]
    fn finds_the_kernels_of_the_sources() {
        let dir = std::env::temp_dir().join(format!("symcomm-rust-kernels-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("src/nested")).unwrap();
        std::fs::write(
            dir.join("src/lib.rs"),
            "symcomm_kernel::kernel! {\n    /// Docs with { braces }.\n    #[allow(unused)]\n    pub fn first(a: u32) {}\n}\n// kernel! in a comment has no fn\nkernel!{ fn second() { } }\nfn not_a_kernel() {}\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("src/nested/more.rs"),
            "crate::kernel! {\n pub(crate) fn third(x: u64) {}\n}\n",
        )
        .unwrap();
        assert_eq!(source_kernels(&dir).unwrap(), ["first", "second", "third"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

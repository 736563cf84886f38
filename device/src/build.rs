//! The build helper: compiles CUDA C++ kernel files for both backends from a build script.
//!
//! ```no_run
//! // build.rs of a crate with kernels in `kernels/*.cu`:
//! let built = symcomm_device::build::DeviceBuild::new("my_kernels")
//!     .sources_in("kernels")
//!     .and_then(|b| b.compile());
//! if let Err(e) = built {
//!     eprintln!("{e}");
//!     std::process::exit(1);
//! }
//! // lib.rs: include!(concat!(env!("OUT_DIR"), "/my_kernels_device_image.rs"));
//! // defines `pub static DEVICE_IMAGE: symcomm_device::image::DeviceImage`.
//! ```
//!
//! For every `.cu` file:
//! - **nvcc** (found by [`crate::toolchain::find_nvcc`]): one fatbin with SASS for `sm_80`,
//!   `sm_90` and PTX for `compute_90`; the `-Xptxas -v` report is parsed per kernel and
//!   architecture, and with [`DeviceBuild::deny_spills`] a spilling kernel fails the build.
//!   The `compute_90` PTX is kept as `<OUT_DIR>/<stem>.ptx`. Without nvcc the build still succeeds with a cargo warning; the sources (and every header in
//!   the include directories) are embedded so that the host can compile them with NVRTC at run
//!   time.
//! - **emulator**: the host C++ compiler (`cc` crate) with `-DSYMCOMM_EMU` and the shim
//!   `symcomm_emu.h` force-included, into a static library linked into the crate
//!   ([`DeviceBuild::emulator_only`]: this part alone).
//!
//! Kernels are `extern "C" __global__` functions followed by `SYMCOMM_EMU_KERNEL(name)`; the
//! helper finds them by that marker.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::toolchain::{self, Nvcc, NvccSearch};
use crate::{EMU_DIR, Error, INCLUDE_DIR};

mod cache;
pub mod rust;

pub use cache::CACHE_ENV;

/// SASS targets of every fatbin.
pub const SASS_ARCHS: &[&str] = &["sm_80", "sm_90"];
/// PTX target of every fatbin (JIT-compiled by the driver on newer GPUs).
pub const PTX_ARCH: &str = "compute_90";

/// Configuration of one device build (see the module docs).
#[derive(Debug, Clone)]
pub struct DeviceBuild {
    name: String,
    sources: Vec<PathBuf>,
    /// Directories given to [`DeviceBuild::sources_in`], watched as a whole.
    source_dirs: Vec<PathBuf>,
    includes: Vec<PathBuf>,
    deny_spills: bool,
    /// Rust kernel crates given to [`DeviceBuild::rust_kernels`].
    rust_crates: Vec<PathBuf>,
    /// [`DeviceBuild::emulator_only`].
    emulator_only: bool,
    /// Flags given to [`DeviceBuild::emulator_flag`].
    emulator_flags: Vec<String>,
}

/// A ptxas report entry with owned strings (the build-time form of [`crate::image::KernelReport`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PtxasEntry {
    /// Kernel entry name.
    pub kernel: String,
    /// Target architecture.
    pub arch: String,
    /// Registers per thread.
    pub registers: u32,
    /// Stack frame bytes.
    pub stack_bytes: u32,
    /// Spill store bytes.
    pub spill_stores: u32,
    /// Spill load bytes.
    pub spill_loads: u32,
    /// Static shared memory bytes.
    pub shared_bytes: u32,
    /// Constant bank 0 bytes.
    pub const_bytes: u32,
}

/// What [`DeviceBuild::compile`] produced.
#[derive(Debug)]
pub struct BuildOutput {
    /// The generated Rust file defining `DEVICE_IMAGE` (to `include!`).
    pub image_rs: PathBuf,
    /// The nvcc used, if any.
    pub nvcc: Option<Nvcc>,
    /// ptxas report of every kernel on every SASS architecture (empty without nvcc).
    pub report: Vec<PtxasEntry>,
}

impl DeviceBuild {
    /// A build named `name` (used for the library and the generated file's names), with the
    /// symcomm headers on the include path.
    pub fn new(name: &str) -> Self {
        DeviceBuild {
            name: name.to_owned(),
            sources: Vec::new(),
            source_dirs: Vec::new(),
            includes: vec![PathBuf::from(INCLUDE_DIR)],
            deny_spills: false,
            rust_crates: Vec::new(),
            emulator_only: false,
            emulator_flags: Vec::new(),
        }
    }

    /// Adds one `.cu` file.
    pub fn source(mut self, path: impl Into<PathBuf>) -> Self {
        self.sources.push(path.into());
        self
    }

    /// Adds every `.cu` file of `dir` (not recursive), in name order, and watches `dir` itself:
    /// a `.cu` file added to it later (or removed) reruns the build script, so a crate's
    /// `build.rs` need not name its kernel files.
    ///
    /// # Errors
    /// [`Error::Io`] when the directory cannot be read.
    pub fn sources_in(mut self, dir: impl AsRef<Path>) -> Result<Self, Error> {
        let dir = dir.as_ref();
        let io = |source: std::io::Error| Error::Io {
            path: dir.to_owned(),
            source: source.into(),
        };
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            if path.extension().is_some_and(|e| e == "cu") {
                found.push(path);
            }
        }
        found.sort();
        self.sources.extend(found);
        self.source_dirs.push(dir.to_owned());
        Ok(self)
    }

    /// Adds a crate of Rust kernels (`symcomm_kernel::kernel!`s in a `#![no_std]` crate at
    /// `crate_dir`; see [`rust`]): its PTX is built with the nightly toolchain and linked with the
    /// device library into one module of the image; its emulator entries come from the crate
    /// itself, which the calling crate must also have as a dependency (the generated file names
    /// it with `extern crate`).
    pub fn rust_kernels(mut self, crate_dir: impl Into<PathBuf>) -> Self {
        self.rust_crates.push(crate_dir.into());
        self
    }

    /// Adds an include directory (for nvcc, the emulator, and the embedded NVRTC headers).
    pub fn include(mut self, dir: impl Into<PathBuf>) -> Self {
        self.includes.push(dir.into());
        self
    }

    /// Fails the build when ptxas reports spills in any kernel (symcomm's own kernels use this).
    pub fn deny_spills(mut self, deny: bool) -> Self {
        self.deny_spills = deny;
        self
    }

    /// Builds the emulator archive only: no nvcc, no fatbins (the generated image has no GPU
    /// code), and no warning about it. For C++ that GPU builds compile another way:
    /// `symcomm-kernel`'s C ABI, which [`rust`] links with Rust kernels' PTX.
    pub fn emulator_only(mut self) -> Self {
        self.emulator_only = true;
        self
    }

    /// Adds a flag of the host C++ compiler for the emulator archive (`-Werror`,
    /// `-fsanitize=thread`, ...): after the helper's own, and part of the cache key like them.
    pub fn emulator_flag(mut self, flag: impl Into<String>) -> Self {
        self.emulator_flags.push(flag.into());
        self
    }

    /// Compiles everything (see the module docs) and writes `<OUT_DIR>/<name>_device_image.rs`.
    ///
    /// # Errors
    /// A failing compiler ([`Error::CompileFailed`]), spills with `deny_spills`
    /// ([`Error::Spills`]), unreadable sources ([`Error::Io`]), or a missing `OUT_DIR`.
    pub fn compile(&self) -> Result<BuildOutput, Error> {
        let out_dir =
            PathBuf::from(std::env::var_os("OUT_DIR").ok_or(Error::MissingEnv("OUT_DIR"))?);
        for var in [
            "SYMCOMM_NVCC",
            "CUDA_HOME",
            "PATH",
            "SYMCOMM_CUDA_CACHE",
            "XDG_CACHE_HOME",
            "HOME",
            "SYMCOMM_RUST_PTX",
            "SYMCOMM_RUST_NIGHTLY",
        ] {
            println!("cargo:rerun-if-env-changed={var}");
        }
        let headers = self.headers()?;
        for line in self.rerun_lines(&headers) {
            println!("{line}");
        }

        let mut kernels = Vec::new();
        for src in &self.sources {
            let text = read(src)?;
            kernels.push(kernel_names(&text));
        }

        // Every compiler run below is keyed by its inputs: the watched headers' names and
        // contents are part of every key.
        let cache = cache::Cache::locate(&out_dir);
        let mut watched = cache::Key::new("headers");
        for (path, name) in &headers {
            watched.part(name.as_bytes()).part(read(path)?.as_bytes());
        }

        // No sources, no emulator objects (an empty archive is not a valid `ar` input).
        if !self.sources.is_empty() {
            self.compile_emulator(&out_dir, &cache, &watched)?;
        }

        let search = if self.emulator_only {
            NvccSearch::Disabled
        } else {
            toolchain::find_nvcc()
        };
        let (nvcc, reason) = match search {
            NvccSearch::Found(n) => (Some(n), String::new()),
            NvccSearch::Disabled => (None, "SYMCOMM_NVCC=none".to_owned()),
            NvccSearch::NotFound => (
                None,
                "no nvcc in SYMCOMM_NVCC, CUDA_HOME, PATH or the pinned cache (scripts/install-cuda)".to_owned(),
            ),
        };
        let mut fatbins = Vec::new();
        let mut report = Vec::new();
        let mut ptx_isa = None;
        let mut version = String::new();
        if let Some(nvcc) = &nvcc {
            version = nvcc_version(nvcc)?;
            // One nvcc per source, run concurrently: each is single-threaded and ptxas dominates.
            let results: Vec<_> = std::thread::scope(|scope| {
                let jobs: Vec<_> = self
                    .sources
                    .iter()
                    .map(|src| {
                        scope.spawn(|| {
                            self.compile_fatbin(nvcc, &version, src, &out_dir, &cache, &watched)
                        })
                    })
                    .collect();
                jobs.into_iter()
                    .map(|j| joined(j, "a source file"))
                    .collect()
            });
            for result in results {
                let (fatbin, entries, isa) = result?;
                fatbins.push(Some(fatbin));
                report.extend(entries);
                ptx_isa = ptx_isa.or(isa);
            }
            if self.deny_spills {
                if let Some(e) = report
                    .iter()
                    .find(|e| e.spill_stores > 0 || e.spill_loads > 0)
                {
                    return Err(Error::Spills {
                        kernel: e.kernel.clone(),
                        arch: e.arch.clone(),
                        stores: e.spill_stores,
                        loads: e.spill_loads,
                    });
                }
            }
        } else {
            if !self.emulator_only {
                println!(
                    "cargo:warning=symcomm: building `{}` without nvcc ({reason}); kernels will be compiled with NVRTC at run time on a GPU, the emulator works as usual",
                    self.name
                );
            }
            fatbins.resize(self.sources.len(), None);
        }

        let rust: Vec<rust::RustModule> = self
            .rust_crates
            .iter()
            .map(|dir| rust::build(dir, &self.includes, nvcc.as_ref(), &out_dir))
            .collect::<Result<_, _>>()?;

        let image_rs = out_dir.join(format!("{}_device_image.rs", self.name));
        let code = self.render(
            &rust,
            &kernels,
            &fatbins,
            &headers,
            nvcc.as_ref(),
            &version,
            &reason,
            ptx_isa,
            &report,
        );
        std::fs::write(&image_rs, code).map_err(|source| Error::Io {
            path: image_rs.clone(),
            source: source.into(),
        })?;
        Ok(BuildOutput {
            image_rs,
            nvcc,
            report,
        })
    }

    /// The `cargo:rerun-if-changed` lines of the build: every source and header file, every
    /// source directory (cargo then reruns when a file in it is added, removed or changed) and
    /// the emulator's directory.
    fn rerun_lines(&self, headers: &[(PathBuf, String)]) -> Vec<String> {
        let rust_inputs: Vec<PathBuf> = if self.rust_crates.is_empty() {
            Vec::new()
        } else {
            // The C ABI's sources and header are in KERNEL_CRATE_DIR (a directory: cargo looks
            // at every file in it).
            [rust::KERNEL_CRATE_DIR, rust::KERNELS_DIR]
                .iter()
                .map(PathBuf::from)
                .collect()
        };
        self.sources
            .iter()
            .chain(headers.iter().map(|(p, _)| p))
            .chain(self.source_dirs.iter())
            .chain(self.rust_crates.iter())
            .chain(rust_inputs.iter())
            .map(|p| format!("cargo:rerun-if-changed={}", p.display()))
            .chain(std::iter::once(format!("cargo:rerun-if-changed={EMU_DIR}")))
            .collect()
    }

    /// Every header under the include directories: (path, include name).
    fn headers(&self) -> Result<Vec<(PathBuf, String)>, Error> {
        let mut out = Vec::new();
        for dir in &self.includes {
            walk(dir, dir, &mut out)?;
        }
        out.sort_by(|a, b| a.1.cmp(&b.1));
        out.dedup_by(|a, b| a.1 == b.1);
        Ok(out)
    }

    /// The emulator archive `lib<name>_emu.a` of every source, from the cache when its key (the
    /// compiler, its version and exact command line, the sources, the watched headers and the
    /// emulator's own headers) is there.
    fn compile_emulator(
        &self,
        out_dir: &Path,
        cache: &cache::Cache,
        watched: &cache::Key,
    ) -> Result<(), Error> {
        // Each .cu is compiled through a one-line C++ wrapper so the host compiler sees C++.
        let wrap_dir = out_dir.join("emu");
        std::fs::create_dir_all(&wrap_dir).map_err(|source| Error::Io {
            path: wrap_dir.clone(),
            source: source.into(),
        })?;
        let mut build = cc::Build::new();
        build
            .cpp(true)
            .std("c++17")
            // Emulated kernels run millions of element operations in the tests: optimize them
            // even in debug builds.
            .opt_level(2)
            // Line tables in every profile (not cargo's debug level): one archive then serves
            // the debug, release and clippy builds from the cache.
            .debug(false)
            .flag("-g1")
            // What the crate links beyond the archive, named here so that a cache hit can say
            // it too (cc's choice for these targets).
            .cpp_link_stdlib(cpp_link_stdlib())
            .define("SYMCOMM_EMU", None)
            .include(EMU_DIR)
            .flag("-include")
            .flag(format!("{EMU_DIR}/symcomm_emu.h"))
            .warnings(true)
            .cargo_warnings(true);
        for dir in &self.includes {
            build.include(dir);
        }
        for flag in &self.emulator_flags {
            build.flag(flag);
        }
        for src in &self.sources {
            let abs = std::fs::canonicalize(src).map_err(|source| Error::Io {
                path: src.clone(),
                source: source.into(),
            })?;
            let stem = src
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let wrapper = wrap_dir.join(format!("{stem}.emu.cpp"));
            let text = format!("#include \"{}\"\n", abs.display());
            std::fs::write(&wrapper, text).map_err(|source| Error::Io {
                path: wrapper.clone(),
                source: source.into(),
            })?;
            build.file(&wrapper);
        }
        let lib = format!("{}_emu", self.name);
        let archive = out_dir.join(format!("lib{lib}.a"));
        let compiler = build.get_compiler();
        let mut key = watched.clone();
        key.part(b"emulator")
            .part(compiler.path().as_os_str().as_encoded_bytes())
            .part(&tool_version(compiler.path()));
        for arg in compiler.args() {
            key.part(arg.as_encoded_bytes());
        }
        for src in &self.sources {
            key.part(src.as_os_str().as_encoded_bytes())
                .part(read(src)?.as_bytes());
        }
        let mut emu_files = Vec::new();
        walk(Path::new(EMU_DIR), Path::new(EMU_DIR), &mut emu_files)?;
        emu_files.sort_by(|a, b| a.1.cmp(&b.1));
        for (path, name) in &emu_files {
            key.part(name.as_bytes()).part(read(path)?.as_bytes());
        }
        let key = key.finish();
        if cache.fetch(&key, &[("archive", &archive)]) {
            // What cc prints after compiling, for the crate to link the archive.
            println!("cargo:rustc-link-lib=static={lib}");
            println!("cargo:rustc-link-search=native={}", out_dir.display());
            if let Some(stdlib) = cpp_link_stdlib() {
                println!("cargo:rustc-link-lib={stdlib}");
            }
            return Ok(());
        }
        build.try_compile(&lib).map_err(|e| Error::CompileFailed {
            tool: "host C++ compiler",
            what: format!("emulator build of {}", self.name),
            status: "failed".into(),
            stderr: e.to_string(),
        })?;
        cache.store(&key, &[("archive", &archive)]);
        Ok(())
    }

    /// One source's fatbin, its ptxas report and its PTX ISA version, from the cache when its
    /// key (nvcc, its version and command line, the source, the watched headers) is there.
    fn compile_fatbin(
        &self,
        nvcc: &Nvcc,
        version: &str,
        src: &Path,
        out_dir: &Path,
        cache: &cache::Cache,
        watched: &cache::Key,
    ) -> Result<(PathBuf, Vec<PtxasEntry>, Option<String>), Error> {
        let stem = src
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let fatbin = out_dir.join(format!("{stem}.fatbin"));
        let keep = out_dir.join(format!("nvcc-{stem}"));
        std::fs::create_dir_all(&keep).map_err(|source| Error::Io {
            path: keep.clone(),
            source: source.into(),
        })?;
        let mut cmd = Command::new(&nvcc.path);
        cmd.arg("-fatbin")
            .arg("-std=c++17")
            .arg("-O3")
            .arg("-Xptxas")
            .arg("-v");
        for arch in SASS_ARCHS {
            let num = arch.trim_start_matches("sm_");
            cmd.arg(format!("-gencode=arch=compute_{num},code={arch}"));
        }
        cmd.arg(format!("-gencode=arch={PTX_ARCH},code={PTX_ARCH}"));
        for dir in &self.includes {
            cmd.arg("-I").arg(dir);
        }
        let report_path = out_dir.join(format!("{stem}.ptxas.txt"));
        let isa_path = out_dir.join(format!("{stem}.ptx-isa"));
        let ptx_path = out_dir.join(format!("{stem}.ptx"));
        let mut key = watched.clone();
        // The entry's outputs are part of its key: an entry of another layout is never fetched.
        key.part(b"fatbin,ptxas,isa,ptx")
            .part(nvcc.path.as_os_str().as_encoded_bytes())
            .part(version.as_bytes());
        for arg in cmd.get_args() {
            key.part(arg.as_encoded_bytes());
        }
        key.part(src.as_os_str().as_encoded_bytes())
            .part(read(src)?.as_bytes());
        let key = key.finish();
        let outputs = [
            ("fatbin", fatbin.as_path()),
            ("ptxas", report_path.as_path()),
            ("isa", isa_path.as_path()),
            ("ptx", ptx_path.as_path()),
        ];
        if cache.fetch(&key, &outputs) {
            let stderr = read(&report_path)?;
            let isa = read(&isa_path)?;
            let isa = (!isa.is_empty()).then_some(isa);
            return Ok((fatbin, parse_ptxas_report(&stderr), isa));
        }
        cmd.arg("--keep").arg("--keep-dir").arg(&keep);
        cmd.arg("-o").arg(&fatbin).arg(src);
        let out = cmd.output().map_err(|source| Error::ToolStart {
            tool: "nvcc",
            path: nvcc.path.clone(),
            source: source.into(),
        })?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            return Err(Error::CompileFailed {
                tool: "nvcc",
                what: src.display().to_string(),
                status: out.status.to_string(),
                stderr,
            });
        }
        std::fs::write(&report_path, &stderr).map_err(|source| Error::Io {
            path: report_path.clone(),
            source: source.into(),
        })?;
        // The PTX that nvcc embedded (kept as `<stem>.ptx` for inspection: tests/device_image.rs
        // reads the built PTX of symcomm's kernels).
        let kept = keep.join(format!("{stem}.{PTX_ARCH}.ptx"));
        std::fs::copy(&kept, &ptx_path).map_err(|source| Error::Io {
            path: kept.clone(),
            source: source.into(),
        })?;
        let ptx_isa = ptx_version(&read(&ptx_path)?);
        std::fs::write(&isa_path, ptx_isa.as_deref().unwrap_or("")).map_err(|source| {
            Error::Io {
                path: isa_path.clone(),
                source: source.into(),
            }
        })?;
        cache.store(&key, &outputs);
        Ok((fatbin, parse_ptxas_report(&stderr), ptx_isa))
    }

    #[allow(clippy::too_many_arguments)]
    fn render(
        &self,
        rust: &[rust::RustModule],
        kernels: &[Vec<String>],
        fatbins: &[Option<PathBuf>],
        headers: &[(PathBuf, String)],
        nvcc: Option<&Nvcc>,
        version: &str,
        reason: &str,
        ptx_isa: Option<String>,
        report: &[PtxasEntry],
    ) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "// Generated by symcomm_device::build for `{}`. Do not edit.",
            self.name
        );
        for r in rust {
            // The crate that defines the Rust kernels' emulator entries, linked in.
            let _ = writeln!(s, "extern crate {} as _;", r.crate_ident);
        }
        let all: BTreeSet<&String> = kernels
            .iter()
            .flatten()
            .chain(rust.iter().flat_map(|r| &r.kernels))
            .collect();
        let _ = writeln!(s, "unsafe extern \"C\" {{");
        for k in &all {
            let _ = writeln!(
                s,
                "    fn symcomm_emu_entry_{k}(args: *mut *mut ::core::ffi::c_void);"
            );
        }
        let _ = writeln!(s, "}}");
        let _ = writeln!(
            s,
            "/// Device code of `{}` (see `symcomm_device::image`).",
            self.name
        );
        let _ = writeln!(
            s,
            "pub static DEVICE_IMAGE: ::symcomm_device::image::DeviceImage = ::symcomm_device::image::DeviceImage {{"
        );
        let _ = writeln!(s, "    name: {:?},", self.name);
        let _ = writeln!(s, "    modules: &[");
        for ((src, ks), fatbin) in self.sources.iter().zip(kernels).zip(fatbins) {
            render_module(
                &mut s,
                &relative(src),
                &file_name(src),
                fatbin.as_deref(),
                ks,
            );
        }
        for r in rust {
            let ptx_name = format!("{}.ptx", r.crate_ident);
            render_module(
                &mut s,
                &relative(&r.dir),
                &ptx_name,
                r.fatbin.as_deref(),
                &r.kernels,
            );
        }
        let _ = writeln!(s, "    ],");
        let _ = writeln!(s, "    sources: &[");
        for src in &self.sources {
            let abs = std::fs::canonicalize(src).unwrap_or_else(|_| src.clone());
            let _ = writeln!(
                s,
                "        ::symcomm_device::image::SourceFile {{ name: {:?}, contents: include_str!({:?}) }},",
                file_name(src),
                abs.display().to_string()
            );
        }
        for r in rust {
            if let Some(ptx) = &r.ptx {
                let _ = writeln!(
                    s,
                    "        ::symcomm_device::image::SourceFile {{ name: {:?}, contents: include_str!({:?}) }},",
                    format!("{}.ptx", r.crate_ident),
                    ptx.display().to_string()
                );
            }
        }
        for (path, name) in headers {
            let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
            let _ = writeln!(
                s,
                "        ::symcomm_device::image::SourceFile {{ name: {name:?}, contents: include_str!({:?}) }},",
                abs.display().to_string()
            );
        }
        let _ = writeln!(s, "    ],");
        match nvcc {
            Some(n) => {
                let _ = writeln!(
                    s,
                    "    compiler: Some(::symcomm_device::image::CompilerInfo {{ nvcc: {:?}, version: {version:?}, found_via: {:?} }}),",
                    n.path.display().to_string(),
                    n.source.as_str()
                );
            }
            None => {
                let _ = writeln!(s, "    compiler: None,");
            }
        }
        let _ = writeln!(s, "    no_compiler_reason: {reason:?},");
        let _ = writeln!(s, "    sass_archs: &{SASS_ARCHS:?},");
        let _ = writeln!(s, "    ptx_arch: {PTX_ARCH:?},");
        let _ = writeln!(s, "    ptx_isa: {ptx_isa:?},");
        let _ = writeln!(s, "    report: &[");
        for e in report {
            let _ = writeln!(
                s,
                "        ::symcomm_device::image::KernelReport {{ kernel: {:?}, arch: {:?}, registers: {}, stack_bytes: {}, spill_stores: {}, spill_loads: {}, shared_bytes: {}, const_bytes: {} }},",
                e.kernel,
                e.arch,
                e.registers,
                e.stack_bytes,
                e.spill_stores,
                e.spill_loads,
                e.shared_bytes,
                e.const_bytes
            );
        }
        let _ = writeln!(s, "    ],");
        let _ = writeln!(s, "}};");
        s
    }
}

/// One `Module { .. }` entry of the generated image.
fn render_module(
    s: &mut String,
    source: &str,
    source_name: &str,
    fatbin: Option<&Path>,
    kernels: &[String],
) {
    let _ = writeln!(s, "        ::symcomm_device::image::Module {{");
    let _ = writeln!(s, "            source: {source:?},");
    let _ = writeln!(s, "            source_name: {source_name:?},");
    match fatbin {
        Some(f) => {
            let _ = writeln!(
                s,
                "            fatbin: Some(include_bytes!({:?})),",
                f.display().to_string()
            );
        }
        None => {
            let _ = writeln!(s, "            fatbin: None,");
        }
    }
    let _ = writeln!(s, "            kernels: &[");
    for k in kernels {
        let _ = writeln!(
            s,
            "                ::symcomm_device::image::Kernel {{ name: {k:?}, emu_entry: symcomm_emu_entry_{k} }},"
        );
    }
    let _ = writeln!(s, "            ],");
    let _ = writeln!(s, "        }},");
}

fn io_error(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_owned(),
        source: source.into(),
    }
}

fn read(p: &Path) -> Result<String, Error> {
    std::fs::read_to_string(p).map_err(|source| Error::Io {
        path: p.to_owned(),
        source: source.into(),
    })
}

/// The result of a build thread; a panic is an error naming `what`.
fn joined<T>(
    job: std::thread::ScopedJoinHandle<'_, Result<T, Error>>,
    what: &str,
) -> Result<T, Error> {
    job.join().unwrap_or_else(|_| {
        Err(Error::CompileFailed {
            tool: "symcomm build",
            what: what.to_owned(),
            status: "the building thread panicked".into(),
            stderr: String::new(),
        })
    })
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, String)>) -> Result<(), Error> {
    let io = |source: std::io::Error| Error::Io {
        path: dir.to_owned(),
        source: source.into(),
    };
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.is_dir() {
            walk(root, &path, out)?;
        } else if path
            .extension()
            .is_some_and(|e| e == "h" || e == "cuh" || e == "hpp")
        {
            let name = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .replace('\\', "/");
            out.push((path, name));
        }
    }
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn relative(p: &Path) -> String {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    match manifest.as_deref().and_then(|m| p.strip_prefix(m).ok()) {
        Some(r) => r.display().to_string(),
        None => p.display().to_string(),
    }
}

/// Kernel names marked with `SYMCOMM_EMU_KERNEL(name)` in a source.
pub fn kernel_names(text: &str) -> Vec<String> {
    let re = regex::Regex::new(r"(?m)^\s*SYMCOMM_EMU_KERNEL\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)");
    match re {
        Ok(re) => re.captures_iter(text).map(|c| c[1].to_owned()).collect(),
        Err(_) => Vec::new(),
    }
}

/// The `.version` of a PTX file (`9.0`).
pub fn ptx_version(ptx: &str) -> Option<String> {
    ptx.lines()
        .find_map(|l| l.trim().strip_prefix(".version "))
        .map(|v| v.trim().to_owned())
}

fn nvcc_version(nvcc: &Nvcc) -> Result<String, Error> {
    let out = Command::new(&nvcc.path)
        .arg("--version")
        .output()
        .map_err(|source| Error::ToolStart {
            tool: "nvcc",
            path: nvcc.path.clone(),
            source: source.into(),
        })?;
    if !out.status.success() {
        return Err(Error::CompileFailed {
            tool: "nvcc",
            what: "--version".into(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .find(|l| l.contains("release"))
        .unwrap_or_else(|| text.lines().last().unwrap_or(""))
        .trim()
        .to_owned())
}

/// `<tool> --version`'s output (part of a cache key; empty when it cannot run, which the
/// compile that follows then reports).
fn tool_version(tool: &Path) -> Vec<u8> {
    Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default()
}

/// The C++ standard library the emulator archive needs, as the `cc` crate picks it: none for
/// MSVC, libc++ on Apple and the BSDs, libstdc++ elsewhere.
fn cpp_link_stdlib() -> Option<&'static str> {
    let target = std::env::var("TARGET").unwrap_or_default();
    if target.contains("msvc") {
        None
    } else if target.contains("apple") || target.contains("freebsd") || target.contains("openbsd") {
        Some("c++")
    } else if target.contains("android") {
        Some("c++_shared")
    } else {
        Some("stdc++")
    }
}

fn number_before(text: &str, unit: &str) -> Option<u32> {
    let idx = text.find(unit)?;
    text[..idx].split_whitespace().last()?.parse().ok()
}

/// Parses nvcc's `-Xptxas -v` output into one entry per (kernel, architecture).
pub fn parse_ptxas_report(text: &str) -> Vec<PtxasEntry> {
    let mut out = Vec::new();
    let mut cur: Option<PtxasEntry> = None;
    let mut props_for_cur = false;
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("ptxas info    : Compiling entry function '") {
            if let Some(e) = cur.take() {
                out.push(e);
            }
            let mut parts = rest.split('\'');
            let kernel = parts.next().unwrap_or("").to_owned();
            let arch = parts.nth(1).unwrap_or("").to_owned();
            cur = Some(PtxasEntry {
                kernel,
                arch,
                ..Default::default()
            });
            props_for_cur = false;
        } else if let Some(name) = line.strip_prefix("ptxas info    : Function properties for ") {
            props_for_cur = cur.as_ref().is_some_and(|c| c.kernel == name.trim());
        } else if line.contains("bytes stack frame") {
            if let (true, Some(c)) = (props_for_cur, cur.as_mut()) {
                c.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                c.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                c.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            }
        } else if let Some(rest) = line.strip_prefix("ptxas info    : Used ") {
            if let Some(mut c) = cur.take() {
                c.registers = number_before(rest, "registers").unwrap_or(0);
                c.shared_bytes = number_before(rest, "bytes smem").unwrap_or(0);
                c.const_bytes = number_before(rest, "bytes cmem[0]").unwrap_or(0);
                out.push(c);
            }
        }
    }
    if let Some(e) = cur {
        out.push(e);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn sources_in_finds_new_kernel_files_and_watches_the_directory() {
        let dir = std::env::temp_dir().join(format!("symcomm-build-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["b.cu", "a.cu", "notes.txt", "c.cuh"] {
            std::fs::write(dir.join(f), "").unwrap();
        }
        let build = DeviceBuild::new("t").sources_in(&dir).unwrap();
        assert_eq!(build.sources, [dir.join("a.cu"), dir.join("b.cu")]);
        let lines = build.rerun_lines(&[]);
        for want in [dir.join("a.cu"), dir.join("b.cu"), dir.clone()] {
            let line = format!("cargo:rerun-if-changed={}", want.display());
            assert!(lines.contains(&line), "{lines:?} lacks {line}");
        }
        assert!(lines.contains(&format!("cargo:rerun-if-changed={EMU_DIR}")));
        // A file added later is found by the next run (the one the directory line triggers).
        std::fs::write(dir.join("new_kernel.cu"), "").unwrap();
        let again = DeviceBuild::new("t").sources_in(&dir).unwrap();
        assert!(again.sources.contains(&dir.join("new_kernel.cu")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn parses_ptxas_verbose_output() {
        let text = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k' for 'sm_80'
ptxas info    : Function properties for k
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 392 bytes cmem[0]
ptxas info    : Compile time = 1.261 ms
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for helper
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Function properties for k
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
";
        let r = parse_ptxas_report(text);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            PtxasEntry {
                kernel: "k".into(),
                arch: "sm_80".into(),
                registers: 40,
                stack_bytes: 8,
                spill_stores: 4,
                spill_loads: 12,
                shared_bytes: 1024,
                const_bytes: 392
            }
        );
        assert_eq!(
            (r[1].arch.as_str(), r[1].registers, r[1].stack_bytes),
            ("sm_90", 8, 0)
        );
    }

    #[test]
    fn finds_marked_kernels_only() {
        let src = "extern \"C\" __global__ void a(int);\nSYMCOMM_EMU_KERNEL(a)\n// SYMCOMM_EMU_KERNEL(b)\n  SYMCOMM_EMU_KERNEL( c )\n";
        assert_eq!(kernel_names(src), vec!["a".to_owned(), "c".to_owned()]);
    }

    #[test]
    fn reads_ptx_version() {
        assert_eq!(
            ptx_version("//\n.version 9.0\n.target sm_90\n").as_deref(),
            Some("9.0")
        );
        assert_eq!(ptx_version(".target sm_90\n"), None);
    }
}

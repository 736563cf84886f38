//! Finding the CUDA compiler and NVRTC.
//!
//! nvcc is looked up in this order (DESIGN §4):
//! 1. `SYMCOMM_NVCC`: the nvcc to use; `none` (or empty) means "build without nvcc".
//! 2. `$CUDA_HOME/bin/nvcc`.
//! 3. `nvcc` on `PATH`.
//! 4. The pinned toolchain that `scripts/install-cuda` installs (CUDA [`PINNED_CUDA_VERSION`]
//!    compiler wheels from PyPI) in [`pinned_cache_dir`].

use std::env;
use std::path::{Path, PathBuf};

/// The CUDA release of the pinned compiler wheels (keep in step with `scripts/install-cuda`).
pub const PINNED_CUDA_VERSION: &str = "13.0.88";

/// How an nvcc was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvccSource {
    /// `SYMCOMM_NVCC`.
    Env,
    /// `$CUDA_HOME/bin/nvcc`.
    CudaHome,
    /// `nvcc` on `PATH`.
    Path,
    /// The pinned cache of `scripts/install-cuda`.
    PinnedCache,
}

impl NvccSource {
    /// Name as shown to users.
    pub fn as_str(self) -> &'static str {
        match self {
            NvccSource::Env => "SYMCOMM_NVCC",
            NvccSource::CudaHome => "CUDA_HOME",
            NvccSource::Path => "PATH",
            NvccSource::PinnedCache => "pinned cache",
        }
    }
}

/// An nvcc executable and how it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nvcc {
    /// Path of the executable.
    pub path: PathBuf,
    /// Where the search found it.
    pub source: NvccSource,
}

/// Outcome of the nvcc search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvccSearch {
    /// An nvcc was found.
    Found(Nvcc),
    /// `SYMCOMM_NVCC=none`: the user asked for no nvcc.
    Disabled,
    /// None of the places had one.
    NotFound,
}

/// Directory of the pinned CUDA toolchain: `$SYMCOMM_CUDA_CACHE`, else
/// `${XDG_CACHE_HOME:-$HOME/.cache}/symcomm/cuda-<PINNED_CUDA_VERSION>`. It need not exist.
pub fn pinned_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = env::var_os("SYMCOMM_CUDA_CACHE").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let cache = env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(
        cache
            .join("symcomm")
            .join(format!("cuda-{PINNED_CUDA_VERSION}")),
    )
}

/// The CUDA root inside the pinned cache (`<cache>/nvidia/cu13`, laid out like a toolkit:
/// `bin/`, `include/`, `lib/`).
pub fn pinned_cuda_root() -> Option<PathBuf> {
    pinned_cache_dir().map(|d| d.join("nvidia").join("cu13"))
}

fn executable(p: &Path) -> bool {
    p.is_file()
}

/// Searches for nvcc in the documented order.
pub fn find_nvcc() -> NvccSearch {
    if let Some(v) = env::var_os("SYMCOMM_NVCC") {
        if v.is_empty() || v == "none" {
            return NvccSearch::Disabled;
        }
        // An explicit choice is returned even if it does not exist, so that the build reports it
        // instead of silently using another compiler.
        return NvccSearch::Found(Nvcc {
            path: PathBuf::from(v),
            source: NvccSource::Env,
        });
    }
    if let Some(home) = env::var_os("CUDA_HOME").filter(|h| !h.is_empty()) {
        let p = PathBuf::from(home).join("bin").join("nvcc");
        if executable(&p) {
            return NvccSearch::Found(Nvcc {
                path: p,
                source: NvccSource::CudaHome,
            });
        }
    }
    if let Some(path) = env::var_os("PATH") {
        for dir in env::split_paths(&path) {
            let p = dir.join("nvcc");
            if executable(&p) {
                return NvccSearch::Found(Nvcc {
                    path: p,
                    source: NvccSource::Path,
                });
            }
        }
    }
    if let Some(root) = pinned_cuda_root() {
        let p = root.join("bin").join("nvcc");
        if executable(&p) {
            return NvccSearch::Found(Nvcc {
                path: p,
                source: NvccSource::PinnedCache,
            });
        }
    }
    NvccSearch::NotFound
}

/// Candidate paths of the NVRTC shared library outside the loader's default search, in order:
/// `$CUDA_HOME/lib64`, `$CUDA_HOME/lib`, then the pinned cache. Only existing files are returned.
pub fn nvrtc_library_candidates() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(home) = env::var_os("CUDA_HOME").filter(|h| !h.is_empty()) {
        let home = PathBuf::from(home);
        dirs.push(home.join("lib64"));
        dirs.push(home.join("lib"));
    }
    if let Some(root) = pinned_cuda_root() {
        dirs.push(root.join("lib"));
    }
    dirs.into_iter()
        .map(|d| d.join("libnvrtc.so.13"))
        .filter(|p| p.is_file())
        .collect()
}

/// ptxas next to a given nvcc, or in the pinned cache.
pub fn find_ptxas() -> Option<PathBuf> {
    if let NvccSearch::Found(n) = find_nvcc() {
        if let Some(dir) = n.path.parent() {
            let p = dir.join("ptxas");
            if executable(&p) {
                return Some(p);
            }
        }
    }
    pinned_cuda_root()
        .map(|r| r.join("bin").join("ptxas"))
        .filter(|p| executable(p))
}

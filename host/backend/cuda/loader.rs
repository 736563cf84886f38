//! Loading libcuda and libnvrtc without panicking, and the mapping of their results to [`Error`].
//!
//! cudarc resolves each symbol on its first call and panics when it is missing, so the libraries
//! are opened once per process and every symbol this backend calls is checked up front
//! ([`DRIVER_SYMBOLS`], [`NVRTC_SYMBOLS`], and `vmm::VMM_SYMBOLS` before the first VMM call).

use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::OnceLock;

use cudarc::driver::sys as dsys;
use cudarc::nvrtc::sys as nsys;

use crate::{Error, Result};

/// Every libcuda entry point this module calls through cudarc. cudarc resolves each symbol on its
/// first call and panics when it is missing, so all of them are checked up front; keep this list
/// in step with the `dsys::` calls below.
pub(super) const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetAttribute",
    "cuDeviceCanAccessPeer",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuModuleLoadDataEx",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuFuncGetAttribute",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemsetD8_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuStreamWriteValue64_v2",
    "cuStreamWriteValue32_v2",
    "cuStreamWaitValue32_v2",
    "cuLaunchHostFunc",
    "cuMemsetD8Async",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventQuery",
    "cuEventDestroy_v2",
    "cuLaunchKernel",
    "cuLaunchCooperativeKernel",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuStreamIsCapturing",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuGraphGetNodes",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
];

/// Optional libcuda entry point (driver 12.4+): the kernel's parameter layout, used to check the
/// argument count of launches when present.
pub(super) const PARAM_INFO_SYMBOL: &str = "cuFuncGetParamInfo";

/// Optional libcuda entry point (driver 12.4+): loads a kernel now rather than at its first
/// launch (without it, `cuFuncGetAttribute` does the same).
pub(super) const FUNC_LOAD_SYMBOL: &str = "cuFuncLoad";

/// Every libnvrtc entry point this module calls through cudarc (see [`DRIVER_SYMBOLS`]).
pub(super) const NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcDestroyProgram",
];

/// What was found when libcuda was loaded.
#[derive(Debug, Clone, Copy)]
pub(super) struct DriverLib {
    /// `cuFuncGetParamInfo` is exported.
    pub(super) has_param_info: bool,
    /// `cuFuncLoad` is exported.
    pub(super) has_func_load: bool,
}

/// Loads libcuda (once per process) and checks its symbols.
pub(super) fn driver() -> Result<DriverLib> {
    static STATE: OnceLock<Result<DriverLib>> = OnceLock::new();
    STATE
        .get_or_init(|| load_driver().map_err(Error::NoDriver))
        .clone()
}

fn load_driver() -> std::result::Result<DriverLib, String> {
    // SAFETY: is_culib_present only tries to dlopen cudarc's candidate names for libcuda and drops
    // the handles; loading the NVIDIA driver library runs its initialisers, which have no
    // preconditions.
    if !unsafe { dsys::is_culib_present() } {
        let names = candidates("cuda");
        return Err(format!(
            "libcuda could not be loaded (tried {}); install the NVIDIA driver or add its \
             directory to LD_LIBRARY_PATH",
            names.join(", ")
        ));
    }
    // SAFETY: is_culib_present just loaded one of the candidates, and culib tries the same names
    // in the same order, so it finds that library instead of panicking.
    let lib = unsafe { dsys::culib() };
    let has = |name: &str| {
        // SAFETY: looking a symbol up only reads the library's symbol table; the returned pointer
        // is dropped unused.
        unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_ok()
    };
    let missing: Vec<&str> = DRIVER_SYMBOLS.iter().copied().filter(|s| !has(s)).collect();
    if !missing.is_empty() {
        return Err(format!(
            "the CUDA driver library lacks {} (driver too old for this build?)",
            missing.join(", ")
        ));
    }
    Ok(DriverLib {
        has_param_info: has(PARAM_INFO_SYMBOL),
        has_func_load: has(FUNC_LOAD_SYMBOL),
    })
}

/// cudarc's file names for library `name`, without repeats (for messages).
fn candidates(name: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for n in cudarc::get_lib_name_candidates(name) {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    names
}

/// Loads libnvrtc (once per process) and checks its symbols.
pub(super) fn nvrtc() -> Result<()> {
    static STATE: OnceLock<Result<()>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            load_nvrtc().map_err(|error| Error::Nvrtc {
                call: "load libnvrtc",
                error,
            })
        })
        .clone()
}

/// libnvrtc (and its libnvrtc-builtins) opened by path from outside the loader's search path,
/// kept loaded for the life of the process: glibc then satisfies cudarc's later
/// `dlopen("libnvrtc.so.13")` and libnvrtc's own `dlopen("libnvrtc-builtins.so.13.0")` by soname
/// with these already-loaded libraries.
static NVRTC_PRELOADED: OnceLock<Vec<libloading::Library>> = OnceLock::new();

/// Opens NVRTC's builtins library (`libnvrtc-builtins.so.<major>.<minor>`, found in the same
/// directory — libnvrtc looks for it by bare name only) and then `nvrtc` itself.
fn preload_nvrtc(nvrtc: &std::path::Path) -> std::result::Result<Vec<libloading::Library>, String> {
    let mut libs = Vec::new();
    let dir = nvrtc.parent().unwrap_or(std::path::Path::new("."));
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut builtins: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so."))
        })
        .collect();
    builtins.sort();
    for path in builtins.iter().chain(std::iter::once(&nvrtc.to_path_buf())) {
        // SAFETY: loading NVIDIA's NVRTC libraries runs their initialisers, which have no
        // preconditions.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("{}: {e}", path.display()))?;
        libs.push(lib);
    }
    Ok(libs)
}

fn load_nvrtc() -> std::result::Result<(), String> {
    // SAFETY: as for libcuda in `load_driver`: only dlopen/dlclose of cudarc's candidate names.
    let mut present = unsafe { nsys::is_culib_present() };
    let mut tried = Vec::new();
    if !present {
        // Not on the loader path: open it by path (CUDA_HOME, the pinned cache).
        for path in symcomm_device::toolchain::nvrtc_library_candidates() {
            match preload_nvrtc(&path) {
                Ok(libs) => {
                    tracing::debug!(target: "symcomm::cuda", path = %path.display(), "preloaded libnvrtc");
                    let _ = NVRTC_PRELOADED.set(libs);
                    break;
                }
                Err(e) => tried.push(format!("{}: {e}", path.display())),
            }
        }
        // SAFETY: as above.
        present = unsafe { nsys::is_culib_present() };
    }
    if !present {
        let mut names = candidates("nvrtc");
        names.extend(tried);
        return Err(format!(
            "libnvrtc could not be loaded (tried {}); run scripts/install-cuda, set CUDA_HOME, or \
             add NVRTC's directory to LD_LIBRARY_PATH",
            names.join(", ")
        ));
    }
    // SAFETY: is_culib_present just succeeded (see `load_driver`).
    let lib = unsafe { nsys::culib() };
    let missing: Vec<&str> = NVRTC_SYMBOLS
        .iter()
        .copied()
        // SAFETY: symbol lookup only, as in `load_driver`.
        .filter(|s| unsafe { lib.get::<*const c_void>(s.as_bytes()) }.is_err())
        .collect();
    if !missing.is_empty() {
        return Err(format!("libnvrtc lacks {}", missing.join(", ")));
    }
    Ok(())
}

/// Turns a driver result into `Ok` or [`Error::Cuda`] naming `call`.
pub(super) fn check(call: &'static str, result: dsys::CUresult) -> Result<()> {
    if result == dsys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(cuda_error(call, result))
    }
}

pub(super) fn cuda_error(call: &'static str, result: dsys::CUresult) -> Error {
    // The enum's Debug output is the CUDA error name (`CUDA_ERROR_NO_DEVICE`).
    Error::Cuda {
        call,
        error: format!("{result:?}"),
    }
}

pub(super) fn nvrtc_check(call: &'static str, result: nsys::nvrtcResult) -> Result<()> {
    if result == nsys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::Nvrtc {
            call,
            error: format!("{result:?}"),
        })
    }
}

/// Loads libcuda and calls `cuInit` (idempotent in the driver).
pub(super) fn init() -> Result<DriverLib> {
    let lib = driver()?;
    // SAFETY: the driver library is loaded and exports cuInit (checked by `driver`); flags must
    // be 0.
    check("cuInit", unsafe { dsys::cuInit(0) })?;
    Ok(lib)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use std::collections::BTreeSet;

    /// The entry points `prefix<api><Upper...>` named in `src` (code only: `//` comments are
    /// skipped), e.g. `dsys::cuMemMap` for prefix `dsys::` and api `cu` (not helpers such as
    /// `dsys::culib()`): with `calls`, only those called (`(` follows); else every mention (also
    /// a function passed by name, and type names).
    fn named(src: &str, prefix: &str, api: &str, calls: bool) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for line in src.lines() {
            let code = line.split("//").next().unwrap_or("");
            let mut rest = code;
            while let Some(at) = rest.find(prefix) {
                let after = &rest[at + prefix.len()..];
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                let name = &after[..end];
                let entry = name
                    .strip_prefix(api)
                    .is_some_and(|t| t.starts_with(|c: char| c.is_ascii_uppercase()));
                if entry && (!calls || after[end..].trim_start().starts_with('(')) {
                    out.insert(name.to_owned());
                }
                rest = &after[end..];
            }
        }
        out
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Every source file of the CUDA backend, by its path under `host/backend/`.
    const SOURCES: &[(&str, &str)] = &[
        ("cuda.rs", include_str!("../cuda.rs")),
        ("cuda/device.rs", include_str!("device.rs")),
        ("cuda/loader.rs", include_str!("loader.rs")),
        ("cuda/memory.rs", include_str!("memory.rs")),
        ("cuda/module.rs", include_str!("module.rs")),
        ("cuda/nvrtc.rs", include_str!("nvrtc.rs")),
        ("cuda/probe.rs", include_str!("probe.rs")),
        ("cuda/proxy.rs", include_str!("proxy.rs")),
        ("cuda/stream.rs", include_str!("stream.rs")),
        ("cuda/vmm.rs", include_str!("vmm.rs")),
    ];

    /// The VMM entry points are checked on their own, before the first VMM call.
    const VMM_FILE: &str = "cuda/vmm.rs";

    /// The entry points `prefix<api><Upper...>` named in `files` (see [`named`]).
    fn named_in<'a>(
        files: impl Iterator<Item = &'a str>,
        prefix: &str,
        api: &str,
        calls: bool,
    ) -> BTreeSet<String> {
        files
            .flat_map(|src| named(src, prefix, api, calls))
            .collect()
    }

    /// A file added to `cuda/` is scanned too.
    #[test]
    fn every_backend_file_is_scanned() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("host/backend/cuda");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".rs"))
            .map(|n| format!("cuda/{n}"))
            .collect();
        on_disk.push("cuda.rs".to_owned());
        on_disk.sort();
        let mut listed: Vec<String> = SOURCES.iter().map(|(p, _)| (*p).to_owned()).collect();
        listed.sort();
        assert_eq!(
            on_disk, listed,
            "SOURCES must list every file of the CUDA backend"
        );
    }

    /// cudarc panics on the first call of a symbol the library lacks, so the lists checked at
    /// load time must name exactly the entry points called (a call missing from them would be a
    /// panic on an old driver; a listed symbol never called would refuse drivers for nothing).
    #[test]
    fn symbols_checked_at_load_are_the_ones_called() {
        // The VMM entry points are checked on their own, so vmm.rs's calls are scanned apart.
        let files = |vmm: bool| {
            SOURCES
                .iter()
                .filter(move |(p, _)| (*p == VMM_FILE) == vmm)
                .map(|(_, s)| *s)
        };
        let all = || SOURCES.iter().map(|(_, s)| *s);
        let mut driver = set(DRIVER_SYMBOLS);
        driver.insert(PARAM_INFO_SYMBOL.to_owned());
        driver.insert(FUNC_LOAD_SYMBOL.to_owned());
        let vmm_listed = set(super::super::vmm::VMM_SYMBOLS);
        let cuda_calls = named_in(files(false), "dsys::", "cu", true);
        let vmm_calls = named_in(files(true), "dsys::", "cu", true);
        let unlisted: Vec<_> = cuda_calls.difference(&driver).collect();
        assert!(
            unlisted.is_empty(),
            "called in cuda.rs or cuda/ (except vmm.rs), not in DRIVER_SYMBOLS: {unlisted:?}"
        );
        let both: BTreeSet<String> = driver.union(&vmm_listed).cloned().collect();
        let unlisted: Vec<_> = vmm_calls.difference(&both).collect();
        assert!(
            unlisted.is_empty(),
            "called in cuda/vmm.rs, not in VMM_SYMBOLS: {unlisted:?}"
        );
        let mentioned = named_in(all(), "dsys::", "cu", false);
        let unused: Vec<_> = both.difference(&mentioned).collect();
        assert!(
            unused.is_empty(),
            "checked at load but never used: {unused:?}"
        );
        let nvrtc = set(NVRTC_SYMBOLS);
        let nvrtc_calls = named_in(all(), "nsys::", "nvrtc", true);
        let unlisted: Vec<_> = nvrtc_calls.difference(&nvrtc).collect();
        assert!(
            unlisted.is_empty(),
            "called in the CUDA backend, not in NVRTC_SYMBOLS: {unlisted:?}"
        );
        let mentioned = named_in(all(), "nsys::", "nvrtc", false);
        let unused: Vec<_> = nvrtc.difference(&mentioned).collect();
        assert!(
            unused.is_empty(),
            "in NVRTC_SYMBOLS but never used: {unused:?}"
        );
    }
}

//! The CUDA backend (driver API through cudarc, loaded dynamically).
//!
//! Nothing here links against CUDA: libcuda and libnvrtc are opened at run time, on first use.
//! cudarc panics when a library or one of its symbols is missing, so every entry point first
//! checks — without panicking — that the library loads and exports every symbol this module calls
//! ([`driver_present`], and the NVRTC equivalent inside [`nvrtc_version`] / [`nvrtc_compile`]). A
//! machine without a driver gets [`Error::NoDriver`]; a machine without NVRTC gets
//! [`Error::Nvrtc`].
//!
//! - Probing: [`probe`] lists the GPUs, their properties and the peer-access matrix.
//! - Run-time compilation: [`nvrtc_compile`] compiles a module's embedded source to PTX (the
//!   fallback when the build had no nvcc, or the fatbin has no code for the GPU).
//! - Running kernels: [`CudaDevice`] (one GPU's primary context) loads [`CudaModule`]s, allocates
//!   [`DeviceBuffer`]s and creates [`Stream`]s; [`Stream::launch`] takes `void**` arguments like
//!   `cuLaunchKernel` (and like the emulator's raw launch of the test fixtures); [`Event`]s order
//!   streams; a stream's work can be captured into a [`Graph`] and replayed. The
//!   backend-independent `crate::stream::Stream` builds on these; of this layer only
//!   [`CudaDevice`] (opaque), the probes and the plain-data infos are public (`crate::cuda`), the
//!   rest is exported by the `testing` feature for symcomm's own GPU checks.
//!
//! Every CUDA failure becomes [`Error::Cuda`] with the call and the CUDA error name
//! (`cuModuleLoadDataEx failed: CUDA_ERROR_INVALID_IMAGE`). The driver API is thread-safe; every
//! method makes its device's context current on the calling thread before calling into it.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::path::PathBuf;
use std::ptr;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys as dsys;
use cudarc::nvrtc::sys as nsys;
use symcomm_device::abi::{DevComm, ErrorRecord, SYMCOMM_DTYPE_NONE, WindowHandleRaw};
use symcomm_device::image::{DeviceImage, Module};

use crate::{Error, Result};

mod vmm;
pub use vmm::{HostMapped, VmmRange, VmmSegment, gpu_uuid};

// ---------------------------------------------------------------------------------------------
// Loading the libraries without panicking
// ---------------------------------------------------------------------------------------------

/// Every libcuda entry point this module calls through cudarc. cudarc resolves each symbol on its
/// first call and panics when it is missing, so all of them are checked up front; keep this list
/// in step with the `dsys::` calls below.
const DRIVER_SYMBOLS: &[&str] = &[
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
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemsetD8_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoDAsync_v2",
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
const PARAM_INFO_SYMBOL: &str = "cuFuncGetParamInfo";

/// Every libnvrtc entry point this module calls through cudarc (see [`DRIVER_SYMBOLS`]).
const NVRTC_SYMBOLS: &[&str] = &[
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
struct DriverLib {
    /// `cuFuncGetParamInfo` is exported.
    has_param_info: bool,
}

/// Loads libcuda (once per process) and checks its symbols.
fn driver() -> Result<DriverLib> {
    static STATE: OnceLock<std::result::Result<DriverLib, String>> = OnceLock::new();
    STATE
        .get_or_init(load_driver)
        .clone()
        .map_err(Error::NoDriver)
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
fn nvrtc() -> Result<()> {
    static STATE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    STATE
        .get_or_init(load_nvrtc)
        .clone()
        .map_err(|error| Error::Nvrtc {
            call: "load libnvrtc",
            error,
        })
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
fn check(call: &'static str, result: dsys::CUresult) -> Result<()> {
    if result == dsys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(cuda_error(call, result))
    }
}

fn cuda_error(call: &'static str, result: dsys::CUresult) -> Error {
    // The enum's Debug output is the CUDA error name (`CUDA_ERROR_NO_DEVICE`).
    Error::Cuda {
        call,
        error: format!("{result:?}"),
    }
}

fn nvrtc_check(call: &'static str, result: nsys::nvrtcResult) -> Result<()> {
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
fn init() -> Result<DriverLib> {
    let lib = driver()?;
    // SAFETY: the driver library is loaded and exports cuInit (checked by `driver`); flags must
    // be 0.
    check("cuInit", unsafe { dsys::cuInit(0) })?;
    Ok(lib)
}

// ---------------------------------------------------------------------------------------------
// Probing
// ---------------------------------------------------------------------------------------------

/// One GPU as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Driver ordinal (`CUDA_VISIBLE_DEVICES` applies).
    pub ordinal: usize,
    /// Marketing name (`NVIDIA H200`).
    pub name: String,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Total device memory, in bytes.
    pub memory_bytes: u64,
    /// Compute capability (major, minor): `(9, 0)` is `sm_90`.
    pub compute_capability: (u32, u32),
}

impl GpuInfo {
    /// The real architecture name for NVRTC and ptxas (`sm_90`).
    pub fn arch(&self) -> String {
        let (major, minor) = self.compute_capability;
        format!("sm_{major}{minor}")
    }
}

/// The CUDA driver and the GPUs it sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaInfo {
    /// Driver API version, `1000 * major + 10 * minor` (`13000` is CUDA 13.0).
    pub driver_version: i32,
    /// Every visible GPU, by ordinal.
    pub devices: Vec<GpuInfo>,
    /// `peer_access[i][j]`: GPU `i` can access GPU `j`'s memory (`cuDeviceCanAccessPeer`); the
    /// diagonal is `true`.
    pub peer_access: Vec<Vec<bool>>,
}

/// Whether the CUDA driver library (libcuda) can be loaded and exports every entry point this
/// backend uses. Says nothing about GPUs: [`probe`] does. Never panics; the answer is computed
/// once per process.
pub fn driver_present() -> bool {
    driver().is_ok()
}

/// Initialises the driver and describes it and every visible GPU.
///
/// # Errors
/// [`Error::NoDriver`] when libcuda cannot be loaded (or lacks an entry point);
/// [`Error::Cuda`] when a driver call fails — `cuInit` with `CUDA_ERROR_NO_DEVICE` on a machine
/// with a driver but no usable GPU.
pub fn probe() -> Result<CudaInfo> {
    init()?;
    let mut version: c_int = 0;
    // SAFETY: libcuda is loaded and initialised; the out-pointer is a live local.
    check("cuDriverGetVersion", unsafe {
        dsys::cuDriverGetVersion(&mut version)
    })?;
    let count = device_count()?;
    let mut handles = Vec::with_capacity(count);
    let mut devices = Vec::with_capacity(count);
    for ordinal in 0..count {
        let dev = device_handle(ordinal)?;
        devices.push(gpu_info(ordinal, dev)?);
        handles.push(dev);
    }
    let mut peer_access = vec![vec![false; count]; count];
    for (i, &di) in handles.iter().enumerate() {
        for (j, &dj) in handles.iter().enumerate() {
            peer_access[i][j] = if i == j {
                true
            } else {
                let mut can: c_int = 0;
                // SAFETY: both handles came from cuDeviceGet; the out-pointer is a live local.
                check("cuDeviceCanAccessPeer", unsafe {
                    dsys::cuDeviceCanAccessPeer(&mut can, di, dj)
                })?;
                can != 0
            };
        }
    }
    Ok(CudaInfo {
        driver_version: version,
        devices,
        peer_access,
    })
}

fn device_count() -> Result<usize> {
    let mut count: c_int = 0;
    // SAFETY: the driver is initialised (callers run `init` first); the out-pointer is a local.
    check("cuDeviceGetCount", unsafe {
        dsys::cuDeviceGetCount(&mut count)
    })?;
    Ok(usize::try_from(count).unwrap_or(0))
}

fn device_handle(ordinal: usize) -> Result<dsys::CUdevice> {
    let index = c_int::try_from(ordinal)
        .map_err(|_| Error::InvalidArgument(format!("GPU ordinal {ordinal} is out of range")))?;
    let mut dev: dsys::CUdevice = 0;
    // SAFETY: the driver is initialised; the out-pointer is a live local; a bad ordinal is
    // reported as CUDA_ERROR_INVALID_DEVICE.
    check("cuDeviceGet", unsafe { dsys::cuDeviceGet(&mut dev, index) })?;
    Ok(dev)
}

fn attribute(dev: dsys::CUdevice, attr: dsys::CUdevice_attribute) -> Result<u32> {
    let mut value: c_int = 0;
    // SAFETY: `dev` came from cuDeviceGet; the out-pointer is a live local.
    check("cuDeviceGetAttribute", unsafe {
        dsys::cuDeviceGetAttribute(&mut value, attr, dev)
    })?;
    Ok(u32::try_from(value).unwrap_or(0))
}

/// Whether contexts on GPU `ordinal` are shared through MPS (`CU_DEVICE_ATTRIBUTE_MPS_ENABLED`),
/// so that kernels of different processes run concurrently.
///
/// # Errors
/// [`Error::Cuda`] when the driver refuses the query (drivers before CUDA 12.2 lack it).
pub fn mps_enabled(ordinal: usize) -> Result<bool> {
    let dev = device_handle(ordinal)?;
    Ok(attribute(
        dev,
        dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED,
    )? != 0)
}

fn gpu_info(ordinal: usize, dev: dsys::CUdevice) -> Result<GpuInfo> {
    let mut name = [0 as c_char; 256];
    // SAFETY: the buffer holds `len` bytes and the driver NUL-terminates within them.
    check("cuDeviceGetName", unsafe {
        dsys::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, dev)
    })?;
    let bytes: Vec<u8> = name.iter().map(|&c| c as u8).collect();
    let name = CStr::from_bytes_until_nul(&bytes)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
    let mut memory: usize = 0;
    // SAFETY: `dev` came from cuDeviceGet; the out-pointer is a live local.
    check("cuDeviceTotalMem_v2", unsafe {
        dsys::cuDeviceTotalMem_v2(&mut memory, dev)
    })?;
    use dsys::CUdevice_attribute as A;
    Ok(GpuInfo {
        ordinal,
        name,
        sms: attribute(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        memory_bytes: memory as u64,
        compute_capability: (
            attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
    })
}

// ---------------------------------------------------------------------------------------------
// NVRTC
// ---------------------------------------------------------------------------------------------

/// Version of the NVRTC library that compiles the embedded sources at run time (when a build had
/// no nvcc), as (major, minor).
///
/// NVRTC is looked for on the loader path first (`libnvrtc.so.13`, ...), then by path in
/// [`symcomm_device::toolchain::nvrtc_library_candidates`] (`$CUDA_HOME`, the pinned toolchain
/// of `scripts/install-cuda`).
///
/// # Errors
/// [`Error::Nvrtc`] when libnvrtc cannot be loaded or lacks an entry point.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    nvrtc()?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: libnvrtc is loaded with every symbol used here; out-pointers are live locals.
    nvrtc_check("nvrtcVersion", unsafe {
        nsys::nvrtcVersion(&mut major, &mut minor)
    })?;
    Ok((major, minor))
}

/// An NVRTC program, destroyed on drop.
struct Program(nsys::nvrtcProgram);

impl Program {
    /// Reads a NUL-terminated output of `size_fn`/`get_fn` (log or PTX).
    fn read(
        &self,
        call: &'static str,
        size_fn: unsafe fn(nsys::nvrtcProgram, *mut usize) -> nsys::nvrtcResult,
        get_fn: unsafe fn(nsys::nvrtcProgram, *mut c_char) -> nsys::nvrtcResult,
    ) -> Result<String> {
        let mut size: usize = 0;
        // SAFETY: `self.0` is a live program; the out-pointer is a live local.
        nvrtc_check(call, unsafe { size_fn(self.0, &mut size) })?;
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: the buffer holds the `size` bytes (NUL included) that NVRTC just reported.
        nvrtc_check(call, unsafe { get_fn(self.0, buf.as_mut_ptr().cast()) })?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        buf.truncate(end);
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    fn log(&self) -> Result<String> {
        self.read(
            "nvrtcGetProgramLog",
            nsys::nvrtcGetProgramLogSize,
            nsys::nvrtcGetProgramLog,
        )
    }

    fn ptx(&self) -> Result<String> {
        self.read("nvrtcGetPTX", nsys::nvrtcGetPTXSize, nsys::nvrtcGetPTX)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from nvrtcCreateProgram and is destroyed exactly once, here.
        let r = unsafe { nsys::nvrtcDestroyProgram(&mut self.0) };
        if r != nsys::nvrtcResult::NVRTC_SUCCESS {
            tracing::warn!(target: "symcomm::cuda", error = ?r, "nvrtcDestroyProgram failed");
        }
    }
}

fn c_string(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::InvalidArgument(format!("{what} contains a NUL byte")))
}

/// Compiles `module`'s embedded source to PTX for `arch` (`sm_90`, or a virtual `compute_90`)
/// with NVRTC.
///
/// The source is `image.source(module.source_name)`; every other entry of `image.sources` is
/// given to NVRTC as an in-memory header under its include name (`<symcomm/abi.h>`), so no file
/// system access is needed. Options: `--gpu-architecture=<arch> -std=c++17`. Warnings in the
/// compile log are traced at `debug` level. Thread-safe (NVRTC programs are independent).
///
/// # Errors
/// [`Error::Nvrtc`] when libnvrtc cannot be loaded, or when compilation fails (the message carries
/// NVRTC's error and the program log); [`Error::InvalidArgument`] when the image lacks the
/// module's source or a source contains a NUL byte.
pub fn nvrtc_compile(image: &DeviceImage, module: &Module, arch: &str) -> Result<String> {
    nvrtc()?;
    let src = image.source(module.source_name).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "device image `{}` has no embedded source `{}` for module {}",
            image.name, module.source_name, module.source
        ))
    })?;
    let source = c_string(src.name, src.contents)?;
    let name = c_string("source name", src.name)?;
    let mut header_names = Vec::new();
    let mut header_contents = Vec::new();
    for h in image.sources.iter().filter(|h| h.name != src.name) {
        header_names.push(c_string("header name", h.name)?);
        header_contents.push(c_string(h.name, h.contents)?);
    }
    let name_ptrs: Vec<*const c_char> = header_names.iter().map(|s| s.as_ptr()).collect();
    let content_ptrs: Vec<*const c_char> = header_contents.iter().map(|s| s.as_ptr()).collect();
    let count = c_int::try_from(name_ptrs.len())
        .map_err(|_| Error::InvalidArgument("too many headers".into()))?;
    let mut raw: nsys::nvrtcProgram = ptr::null_mut();
    // SAFETY: every pointer is a NUL-terminated string owned by a local that outlives the call;
    // both header arrays hold `count` entries; NVRTC copies what it keeps.
    nvrtc_check("nvrtcCreateProgram", unsafe {
        nsys::nvrtcCreateProgram(
            &mut raw,
            source.as_ptr(),
            name.as_ptr(),
            count,
            content_ptrs.as_ptr(),
            name_ptrs.as_ptr(),
        )
    })?;
    let program = Program(raw);
    let options = [
        c_string("arch", &format!("--gpu-architecture={arch}"))?,
        c_string("option", "-std=c++17")?,
    ];
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: `program` is live; the option array holds `len` NUL-terminated strings that
    // outlive the call.
    let result = unsafe {
        nsys::nvrtcCompileProgram(program.0, option_ptrs.len() as c_int, option_ptrs.as_ptr())
    };
    let log = program.log().unwrap_or_default();
    if result != nsys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Nvrtc {
            call: "nvrtcCompileProgram",
            error: format!(
                "{result:?} compiling {} for {arch}:\n{}",
                src.name,
                log.trim_end()
            ),
        });
    }
    if !log.trim().is_empty() {
        tracing::debug!(target: "symcomm::cuda", source = src.name, arch, log = %log.trim_end(), "NVRTC log");
    }
    program.ptx()
}

// ---------------------------------------------------------------------------------------------
// Devices, modules, memory, streams
// ---------------------------------------------------------------------------------------------

/// A GPU's retained primary context; released when the last user is dropped.
#[derive(Debug)]
struct Context {
    ordinal: usize,
    device: dsys::CUdevice,
    ctx: dsys::CUcontext,
    lib: DriverLib,
}

// SAFETY: a CUcontext handle may be used from any thread (the driver API is thread-safe); it is
// made current on the calling thread before each use.
unsafe impl Send for Context {}
// SAFETY: as for Send; `Context` has no interior mutability on the Rust side.
unsafe impl Sync for Context {}

impl Context {
    /// Makes the context current on the calling thread.
    fn bind(&self) -> Result<()> {
        // SAFETY: `self.ctx` is a primary context retained until `self` drops.
        check("cuCtxSetCurrent", unsafe {
            dsys::cuCtxSetCurrent(self.ctx)
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the primary context was retained once in `CudaDevice::open`; this is the
        // matching release, after every module, buffer and stream (which hold an `Arc<Context>`)
        // is gone.
        let r = unsafe { dsys::cuDevicePrimaryCtxRelease_v2(self.device) };
        if r != dsys::CUresult::CUDA_SUCCESS {
            tracing::warn!(target: "symcomm::cuda", ordinal = self.ordinal, error = ?r, "cuDevicePrimaryCtxRelease failed");
        }
    }
}

/// One GPU, through its primary context (the one the CUDA runtime and other libraries share).
///
/// Cheap to clone; modules, buffers and streams keep the context alive. All methods may be called
/// from any thread.
#[derive(Debug, Clone)]
pub struct CudaDevice {
    ctx: Arc<Context>,
}

/// Where a [`CudaModule`]'s code came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleOrigin {
    /// The fatbin built by nvcc and embedded in the crate.
    Fatbin,
    /// PTX compiled at run time by NVRTC for `arch`, then JIT-compiled by the driver.
    Nvrtc {
        /// The architecture NVRTC compiled for (`sm_90`).
        arch: String,
    },
    /// PTX or a cubin given by the caller ([`CudaDevice::load_image`]).
    Image,
}

impl CudaDevice {
    /// Opens GPU `ordinal`: initialises the driver and retains the GPU's primary context.
    ///
    /// # Errors
    /// [`Error::NoDriver`] without libcuda; [`Error::InvalidArgument`] when there is no GPU
    /// `ordinal`; [`Error::Cuda`] when a driver call fails (`cuInit`: `CUDA_ERROR_NO_DEVICE`).
    pub fn open(ordinal: usize) -> Result<Self> {
        let lib = init()?;
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::InvalidArgument(format!(
                "no GPU {ordinal}: the driver sees {count}"
            )));
        }
        let device = device_handle(ordinal)?;
        let mut ctx: dsys::CUcontext = ptr::null_mut();
        // SAFETY: `device` came from cuDeviceGet; the out-pointer is a live local. Released in
        // `Context::drop`.
        check("cuDevicePrimaryCtxRetain", unsafe {
            dsys::cuDevicePrimaryCtxRetain(&mut ctx, device)
        })?;
        let ctx = Arc::new(Context {
            ordinal,
            device,
            ctx,
            lib,
        });
        ctx.bind()?;
        Ok(CudaDevice { ctx })
    }

    /// The driver ordinal of this GPU.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal
    }

    /// Name, SMs, memory and compute capability of this GPU.
    ///
    /// # Errors
    /// [`Error::Cuda`] when a driver query fails.
    pub fn info(&self) -> Result<GpuInfo> {
        gpu_info(self.ctx.ordinal, self.ctx.device)
    }

    /// Waits until all work on this GPU's context has finished (`cuCtxSynchronize`).
    ///
    /// # Errors
    /// [`Error::Cuda`]; a kernel fault of earlier work surfaces here (and makes the context
    /// unusable).
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current on this thread.
        check("cuCtxSynchronize", unsafe { dsys::cuCtxSynchronize() })
    }

    /// Loads `module` of `image`: its fatbin when the build embedded one and it has code for
    /// this GPU, else its source compiled at run time with NVRTC for this GPU's architecture
    /// ([`Self::load_module_nvrtc`]). [`CudaModule::origin`] says which.
    ///
    /// # Errors
    /// [`Error::Cuda`] when the driver rejects the code (the JIT log is in the message);
    /// [`Error::Nvrtc`] when the fallback cannot load NVRTC or compile.
    pub(crate) fn load_module(&self, image: &DeviceImage, module: &Module) -> Result<CudaModule> {
        let Some(fatbin) = module.fatbin else {
            tracing::info!(target: "symcomm::cuda", module = module.source, reason = image.no_compiler_reason, "no fatbin embedded; compiling with NVRTC");
            return self.load_module_nvrtc(image, module);
        };
        match self.load_bytes(fatbin)? {
            Ok(handle) => Ok(CudaModule {
                ctx: Arc::clone(&self.ctx),
                module: handle,
                origin: ModuleOrigin::Fatbin,
            }),
            Err((dsys::CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU, _)) => {
                tracing::info!(target: "symcomm::cuda", module = module.source, "fatbin has no code for this GPU; compiling with NVRTC");
                self.load_module_nvrtc(image, module)
            }
            Err((r, log)) => Err(load_error(r, &log)),
        }
    }

    /// Loads `module` of `image` from its embedded source, compiled at run time with NVRTC for
    /// this GPU's architecture (`sm_<major><minor>`), ignoring any fatbin: the path taken on
    /// machines whose build had no nvcc.
    ///
    /// # Errors
    /// As [`nvrtc_compile`], and [`Error::Cuda`] when the driver cannot JIT the PTX (for example
    /// `CUDA_ERROR_UNSUPPORTED_PTX_VERSION` with a driver older than NVRTC).
    pub(crate) fn load_module_nvrtc(
        &self,
        image: &DeviceImage,
        module: &Module,
    ) -> Result<CudaModule> {
        let arch = self.info()?.arch();
        let ptx = nvrtc_compile(image, module, &arch)?;
        let mut m = self.load_image(ptx.as_bytes())?;
        m.origin = ModuleOrigin::Nvrtc { arch };
        Ok(m)
    }

    /// Loads a module from PTX text, a cubin or a fatbin (`cuModuleLoadDataEx`). PTX need not
    /// be NUL-terminated.
    ///
    /// # Errors
    /// [`Error::Cuda`] when the driver rejects the image (the JIT error log is in the message).
    pub(crate) fn load_image(&self, image: &[u8]) -> Result<CudaModule> {
        let module = self
            .load_bytes(image)?
            .map_err(|(r, log)| load_error(r, &log))?;
        Ok(CudaModule {
            ctx: Arc::clone(&self.ctx),
            module,
            origin: ModuleOrigin::Image,
        })
    }

    /// Loads `bytes` (PTX, cubin or fatbin) from a copy that is NUL-terminated (as PTX must be)
    /// and 8-byte aligned (cubins and fatbins are read through their header structs; embedded
    /// bytes are only byte-aligned). The inner error is the driver's, with its JIT log.
    fn load_bytes(
        &self,
        bytes: &[u8],
    ) -> Result<std::result::Result<dsys::CUmodule, (dsys::CUresult, String)>> {
        let mut aligned = vec![0u64; bytes.len() / 8 + 1];
        for (word, chunk) in aligned.iter_mut().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_ne_bytes(b);
        }
        self.ctx.bind()?;
        Ok(self.load_raw(aligned.as_ptr().cast()))
    }

    /// `cuModuleLoadDataEx` with an error-log buffer; returns the CUDA error and the log. The
    /// caller has made the context current.
    fn load_raw(
        &self,
        data: *const c_void,
    ) -> std::result::Result<dsys::CUmodule, (dsys::CUresult, String)> {
        let mut log = vec![0u8; 16 * 1024];
        let mut options = [
            dsys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            dsys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        // JIT option values are passed as pointer-sized words: the buffer, then its size.
        let mut values: [*mut c_void; 2] = [
            log.as_mut_ptr().cast(),
            ptr::without_provenance_mut(log.len()),
        ];
        let mut module: dsys::CUmodule = ptr::null_mut();
        // SAFETY: the context is current (caller); `data` points at a complete PTX (NUL-terminated),
        // cubin or fatbin image (callers' contract); the option arrays have 2 entries each and
        // the log buffer outlives the call.
        let r = unsafe {
            dsys::cuModuleLoadDataEx(
                &mut module,
                data,
                options.len() as c_uint,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        if r == dsys::CUresult::CUDA_SUCCESS {
            Ok(module)
        } else {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            Err((
                r,
                String::from_utf8_lossy(&log[..end]).trim_end().to_owned(),
            ))
        }
    }

    /// Allocates `bytes` bytes of device memory, zeroed (`cuMemAlloc` + `cuMemsetD8`, both
    /// finished on return). Device addresses are at least 256-byte aligned.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 bytes; [`Error::Cuda`] (`CUDA_ERROR_OUT_OF_MEMORY`).
    pub(crate) fn alloc_zeroed(&self, bytes: usize) -> Result<DeviceBuffer> {
        if bytes == 0 {
            return Err(Error::InvalidArgument(
                "a device buffer needs at least one byte".into(),
            ));
        }
        // A stream of the buffer's own: allocation, zeroing and the free are ordered on it
        // (stream-ordered allocator), so none of them synchronizes the context — with ranks
        // sharing the GPU, a context-wide synchronize (what cuMemFree does) would wait for a
        // peer's kernel that waits for this rank.
        let stream = self.create_stream()?;
        let mut ptr: dsys::CUdeviceptr = 0;
        // SAFETY: the context is current (create_stream bound it); the out-pointer is a live
        // local; `stream.stream` is a live stream of this context.
        check("cuMemAllocAsync", unsafe {
            dsys::cuMemAllocAsync(&mut ptr, bytes, stream.stream)
        })?;
        let buf = DeviceBuffer {
            ctx: Arc::clone(&self.ctx),
            ptr,
            bytes,
            stream,
        };
        // SAFETY: the whole allocation is written, in order after the allocation on its stream.
        check("cuMemsetD8Async", unsafe {
            dsys::cuMemsetD8Async(buf.ptr, 0, bytes, buf.stream.stream)
        })?;
        buf.stream.synchronize()?;
        Ok(buf)
    }

    /// Creates a stream that does not synchronize with the legacy default stream
    /// (`CU_STREAM_NON_BLOCKING`), so that [`DeviceBuffer`] copies and other streams' work do not
    /// wait for its kernels — kernels that wait for each other (ranks as streams) must not be
    /// serialized behind one another.
    ///
    /// # Errors
    /// [`Error::Cuda`].
    pub(crate) fn create_stream(&self) -> Result<Stream> {
        self.ctx.bind()?;
        let mut stream: dsys::CUstream = ptr::null_mut();
        // SAFETY: the context is current; the out-pointer is a live local.
        check("cuStreamCreate", unsafe {
            dsys::cuStreamCreate(
                &mut stream,
                dsys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint,
            )
        })?;
        Ok(Stream {
            ctx: Arc::clone(&self.ctx),
            stream,
            owned: true,
        })
    }

    /// Wraps an existing stream of this GPU's primary context — one made by another library
    /// (cudarc's `CudaStream::cu_stream()`, PyTorch's `torch.cuda.Stream.cuda_stream`) — without
    /// taking ownership: dropping the returned [`Stream`] leaves the stream alive. `handle` is
    /// the `CUstream` as an integer; 0 is the legacy default stream.
    ///
    /// # Safety
    /// `handle` is 0 or a live `CUstream` created in this GPU's primary context, and it stays
    /// alive (not destroyed by its owner) for as long as the returned [`Stream`], and every
    /// [`Event`] recorded on it, is in use.
    pub(crate) unsafe fn wrap_stream(&self, handle: u64) -> Stream {
        Stream {
            ctx: Arc::clone(&self.ctx),
            // A CUstream is an opaque driver handle, never dereferenced on the Rust side.
            stream: ptr::with_exposed_provenance_mut(handle as usize),
            owned: false,
        }
    }
}

fn load_error(r: dsys::CUresult, log: &str) -> Error {
    Error::Cuda {
        call: "cuModuleLoadDataEx",
        error: if log.is_empty() {
            format!("{r:?}")
        } else {
            format!("{r:?}: {log}")
        },
    }
}

/// A loaded CUDA module; unloaded on drop (kernels launched from it must have finished).
#[derive(Debug)]
pub struct CudaModule {
    ctx: Arc<Context>,
    module: dsys::CUmodule,
    origin: ModuleOrigin,
}

// SAFETY: module handles may be used from any thread of the process (thread-safe driver API);
// the owning context is made current before each use.
unsafe impl Send for CudaModule {}
// SAFETY: as for Send; no Rust-side mutation through `&self`.
unsafe impl Sync for CudaModule {}

impl CudaModule {
    /// SMs of the module's GPU.
    ///
    /// # Errors
    /// [`Error::Cuda`] when the driver refuses the query.
    pub fn sm_count(&self) -> Result<u32> {
        attribute(
            self.ctx.device,
            dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
    }

    /// Where the code came from (fatbin, NVRTC, caller's image).
    pub fn origin(&self) -> &ModuleOrigin {
        &self.origin
    }

    /// The kernel with entry name `name` (`extern "C"`, unmangled).
    ///
    /// # Errors
    /// [`Error::UnknownKernel`] when the module has no such entry; [`Error::Cuda`] otherwise.
    pub fn function(&self, name: &str) -> Result<CudaFunction<'_>> {
        let cname = c_string("kernel name", name)?;
        self.ctx.bind()?;
        let mut func: dsys::CUfunction = ptr::null_mut();
        // SAFETY: the context is current, `self.module` is loaded, `cname` is NUL-terminated.
        let r = unsafe { dsys::cuModuleGetFunction(&mut func, self.module, cname.as_ptr()) };
        match r {
            dsys::CUresult::CUDA_SUCCESS => {}
            dsys::CUresult::CUDA_ERROR_NOT_FOUND => {
                return Err(Error::UnknownKernel(name.to_owned()));
            }
            r => return Err(cuda_error("cuModuleGetFunction", r)),
        }
        let param_sizes = if self.ctx.lib.has_param_info {
            Some(param_sizes(func))
        } else {
            None
        };
        Ok(CudaFunction {
            module: self,
            func,
            name: name.to_owned(),
            param_sizes,
        })
    }
}

/// Byte sizes of a kernel's parameters (`cuFuncGetParamInfo` until it reports no more).
fn param_sizes(func: dsys::CUfunction) -> Vec<usize> {
    let mut sizes = Vec::new();
    // Kernel parameters are limited to 32 KiB, so there cannot be more than this many.
    for index in 0..32 * 1024 {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `func` is a live kernel handle; the symbol was found when libcuda was loaded
        // (`has_param_info`); out-pointers are live locals. Past the last parameter the driver
        // returns CUDA_ERROR_INVALID_VALUE.
        let r = unsafe { dsys::cuFuncGetParamInfo(func, index, &mut offset, &mut size) };
        if r != dsys::CUresult::CUDA_SUCCESS {
            break;
        }
        sizes.push(size);
    }
    sizes
}

impl Drop for CudaModule {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind() {
            tracing::warn!(target: "symcomm::cuda", error = %e, "module not unloaded");
            return;
        }
        // SAFETY: the module was loaded in this context and is unloaded exactly once; the
        // functions borrowed from it (`CudaFunction<'_>`) are gone.
        let r = unsafe { dsys::cuModuleUnload(self.module) };
        if r != dsys::CUresult::CUDA_SUCCESS {
            tracing::warn!(target: "symcomm::cuda", error = ?r, "cuModuleUnload failed");
        }
    }
}

/// A kernel of a loaded [`CudaModule`].
#[derive(Debug)]
pub struct CudaFunction<'m> {
    module: &'m CudaModule,
    func: dsys::CUfunction,
    name: String,
    param_sizes: Option<Vec<usize>>,
}

// SAFETY: function handles may be used from any thread (thread-safe driver API).
unsafe impl Send for CudaFunction<'_> {}
// SAFETY: as for Send; immutable on the Rust side.
unsafe impl Sync for CudaFunction<'_> {}

impl CudaFunction<'_> {
    /// The kernel's entry name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Byte size of each kernel parameter, when the driver can tell (`cuFuncGetParamInfo`,
    /// driver 12.4+); launches then check the argument count.
    pub fn param_sizes(&self) -> Option<&[usize]> {
        self.param_sizes.as_deref()
    }

    /// CTAs of `threads` threads with `shared_bytes` of dynamic shared memory that one SM holds
    /// at once (`cuOccupancyMaxActiveBlocksPerMultiprocessor`).
    ///
    /// # Errors
    /// [`Error::Cuda`] when the driver refuses the query (e.g. more threads than the kernel's
    /// launch bounds allow).
    pub fn occupancy(&self, threads: u32, shared_bytes: u32) -> Result<u32> {
        let block = c_int::try_from(threads)
            .map_err(|_| Error::InvalidArgument(format!("{threads} threads per CTA")))?;
        self.module.ctx.bind()?;
        let mut n: c_int = 0;
        // SAFETY: the context is current and `self.func` is a live function of it; the
        // out-pointer is a live local.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            dsys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut n,
                self.func,
                block,
                shared_bytes as usize,
            )
        })?;
        Ok(u32::try_from(n).unwrap_or(0))
    }
}

/// A CUDA stream of one GPU: created by [`CudaDevice::create_stream`] (`CU_STREAM_NON_BLOCKING`,
/// destroyed on drop; work already queued still completes), or an external stream wrapped by
/// [`CudaDevice::wrap_stream`] (never destroyed here).
#[derive(Debug)]
pub struct Stream {
    ctx: Arc<Context>,
    stream: dsys::CUstream,
    /// Whether this value created the stream and so destroys it on drop.
    owned: bool,
}

/// A stream's idleness, asked by the registry of synchronizing frees while the stream lives
/// (`crate::sync_free` removes it before the stream is destroyed).
pub(crate) struct StreamProbe {
    ctx: Arc<Context>,
    stream: usize,
}

impl crate::sync_free::StreamProbe for StreamProbe {
    fn idle(&self) -> bool {
        if self.ctx.bind().is_err() {
            return true;
        }
        let stream: dsys::CUstream = std::ptr::with_exposed_provenance_mut(self.stream);
        // SAFETY: the context is current; the registry asks only while the stream lives.
        // Anything but "not ready" (done, or a failed stream that runs nothing more) is idle.
        !matches!(
            unsafe { dsys::cuStreamQuery(stream) },
            dsys::CUresult::CUDA_ERROR_NOT_READY
        )
    }

    fn settle(&self, _deadline: std::time::Instant) -> bool {
        true
    }
}

// SAFETY: stream handles may be used from any thread (thread-safe driver API); the context is
// made current before each use.
unsafe impl Send for Stream {}
// SAFETY: as for Send; enqueueing from several threads is allowed by the driver.
unsafe impl Sync for Stream {}

impl Stream {
    /// Enqueues kernel `func` on this stream with `grid` x `block` threads and `shared_bytes` of
    /// dynamic shared memory, and returns without waiting.
    ///
    /// `args` holds one pointer per kernel parameter, as for `cuLaunchKernel`; the values are
    /// copied at enqueue time, so the pointed-to locals may die after this returns.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty grid or block, a kernel of another GPU, or an
    /// argument count that differs from the kernel's (when the driver reports it); [`Error::Cuda`] when the launch is refused
    /// (`CUDA_ERROR_INVALID_VALUE` for a block too large, ...). A fault while the kernel runs
    /// surfaces at the next synchronization.
    ///
    /// With `cooperative`, a cooperative launch (`cuLaunchCooperativeKernel`): the driver
    /// guarantees every CTA is resident at once, or refuses the launch
    /// (`CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`).
    ///
    /// # Safety
    /// Each `args[i]` points at a live value of exactly kernel parameter `i`'s type, and every
    /// device address the kernel reaches through them (buffers, handles) stays allocated until the
    /// kernel has finished ([`Stream::synchronize`]).
    pub unsafe fn launch(
        &self,
        func: &CudaFunction<'_>,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        cooperative: bool,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        if grid.contains(&0) || block.contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "empty launch of {}: grid {grid:?}, block {block:?}",
                func.name
            )));
        }
        if func.module.ctx.ctx != self.ctx.ctx {
            return Err(Error::InvalidArgument(format!(
                "kernel {} belongs to GPU {}, the stream to GPU {}",
                func.name, func.module.ctx.ordinal, self.ctx.ordinal
            )));
        }
        if let Some(sizes) = &func.param_sizes {
            if sizes.len() != args.len() {
                return Err(Error::InvalidArgument(format!(
                    "kernel {} takes {} parameters, {} given",
                    func.name,
                    sizes.len(),
                    args.len()
                )));
            }
        }
        self.ctx.bind()?;
        tracing::debug!(target: "symcomm::cuda", kernel = %func.name, ?grid, ?block, shared_bytes, "launch");
        let params = if args.is_empty() {
            ptr::null_mut()
        } else {
            args.as_mut_ptr()
        };
        if cooperative {
            // SAFETY: as for cuLaunchKernel below (cooperative launches take no `extra`).
            return check("cuLaunchCooperativeKernel", unsafe {
                dsys::cuLaunchCooperativeKernel(
                    func.func,
                    grid[0],
                    grid[1],
                    grid[2],
                    block[0],
                    block[1],
                    block[2],
                    shared_bytes,
                    self.stream,
                    params,
                )
            });
        }
        // SAFETY: the context is current; `func` and `self.stream` are live handles of it;
        // `params` holds one pointer per parameter (this function's contract); no `extra`.
        check("cuLaunchKernel", unsafe {
            dsys::cuLaunchKernel(
                func.func,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_bytes,
                self.stream,
                params,
                ptr::null_mut(),
            )
        })
    }

    /// Whether the driver says the stream is being captured into a graph (by anyone: symcomm,
    /// PyTorch, the user), `cuStreamIsCapturing`. A failed query counts as capturing, so that
    /// callers refuse what a capture cannot hold rather than invalidate it.
    pub fn is_capturing(&self) -> bool {
        if self.ctx.bind().is_err() {
            return true;
        }
        let mut status = dsys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the context is current, `self.stream` is a live stream of it, the
        // out-pointer is a live local.
        let r = unsafe { dsys::cuStreamIsCapturing(self.stream, &mut status) };
        r != dsys::CUresult::CUDA_SUCCESS
            || status != dsys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    }

    /// Enqueues a copy of `bytes` bytes from `src` at byte `src_offset` to `dst` at byte
    /// `dst_offset` (`cuMemcpyDtoDAsync`) and returns without waiting; the copy runs in stream
    /// order with this stream's kernels (a reference for memory bandwidth, a staging copy).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a range exceeds its buffer or a buffer belongs to another
    /// GPU; [`Error::Cuda`].
    ///
    /// # Safety
    /// Both buffers stay allocated until the copy has finished ([`Stream::synchronize`]), and no
    /// other work writes the destination range, or writes the source range, while it runs.
    pub unsafe fn copy_device(
        &self,
        dst: &DeviceBuffer,
        dst_offset: usize,
        src: &DeviceBuffer,
        src_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        dst.range::<u8>(dst_offset, bytes)?;
        src.range::<u8>(src_offset, bytes)?;
        if dst.ctx.ctx != self.ctx.ctx || src.ctx.ctx != self.ctx.ctx {
            return Err(Error::InvalidArgument(format!(
                "a device copy on GPU {} between buffers of GPUs {} and {}",
                self.ctx.ordinal, src.ctx.ordinal, dst.ctx.ordinal
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the context is current and the stream live; both ranges lie inside their
        // allocations (checked above), which stay allocated until the copy finished (this
        // function's contract).
        check("cuMemcpyDtoDAsync_v2", unsafe {
            dsys::cuMemcpyDtoDAsync_v2(
                dst.ptr + dst_offset as u64,
                src.ptr + src_offset as u64,
                bytes,
                self.stream,
            )
        })
    }

    /// Enqueues a copy of `bytes` bytes from device address `src` to device address `dst`
    /// (`cuMemcpyDtoDAsync`) and returns without waiting. 0 bytes enqueue nothing.
    ///
    /// # Errors
    /// [`Error::Cuda`] (`CUDA_ERROR_INVALID_VALUE` for an address the driver does not know).
    ///
    /// # Safety
    /// `[dst, dst + bytes)` and `[src, src + bytes)` are device memory of this GPU (or memory it
    /// can reach), do not overlap, and stay allocated until the copy has finished (while
    /// capturing: until the last launch of the captured graph has finished); no other work
    /// writes either range, or reads the destination, while the copy runs.
    pub unsafe fn copy_raw(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the context is current and the stream live; the ranges are valid device memory
        // until the copy finished (this function's contract).
        check("cuMemcpyDtoDAsync_v2", unsafe {
            dsys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream)
        })
    }

    /// Enqueues setting `bytes` bytes at device address `dst` to `byte` (`cuMemsetD8Async`) and
    /// returns without waiting. 0 bytes enqueue nothing.
    ///
    /// # Errors
    /// [`Error::Cuda`].
    ///
    /// # Safety
    /// As for [`Self::copy_raw`], for the one range `[dst, dst + bytes)`.
    pub unsafe fn memset_raw(&self, dst: u64, byte: u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the context is current and the stream live; the range is valid device memory
        // until the set finished (this function's contract).
        check("cuMemsetD8Async", unsafe {
            dsys::cuMemsetD8Async(dst, byte, bytes, self.stream)
        })
    }

    /// Starts capturing this stream (`cuStreamBeginCapture`, `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`):
    /// work enqueued from now on is recorded into a graph instead of running, until
    /// [`Self::end_capture`] — which must be called on the same thread. While the capture lasts,
    /// this thread must not make calls the driver considers unsafe during a capture
    /// (synchronous copies such as [`DeviceBuffer::write`], `cuCtxSynchronize`, synchronizing or
    /// querying this stream); the driver refuses them and invalidates the capture.
    ///
    /// # Errors
    /// [`Error::Cuda`]: `CUDA_ERROR_ILLEGAL_STATE` when the stream is already capturing,
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` for the legacy default stream.
    pub fn begin_capture(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current and the stream live.
        check("cuStreamBeginCapture_v2", unsafe {
            dsys::cuStreamBeginCapture_v2(
                self.stream,
                dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })
    }

    /// Ends the capture begun with [`Self::begin_capture`] (`cuStreamEndCapture`) and
    /// instantiates what was recorded (`cuGraphInstantiateWithFlags`, no flags). The capture
    /// ends even when this fails.
    ///
    /// # Errors
    /// [`Error::Cuda`]: `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when an operation during the
    /// capture was refused, `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD` from another thread than
    /// the one that began it (the capture goes on then), `CUDA_ERROR_ILLEGAL_STATE` when the
    /// stream is not capturing; a failed instantiation.
    pub fn end_capture(&self) -> Result<Graph> {
        self.ctx.bind()?;
        let mut graph = Graph {
            ctx: Arc::clone(&self.ctx),
            graph: ptr::null_mut(),
            exec: ptr::null_mut(),
            nodes: 0,
        };
        // SAFETY: the context is current and the stream live; the out-pointer is a field of a
        // live local, which owns (and destroys) the graph from now on.
        check("cuStreamEndCapture", unsafe {
            dsys::cuStreamEndCapture(self.stream, &mut graph.graph)
        })?;
        if graph.graph.is_null() {
            return Err(cuda_error(
                "cuStreamEndCapture",
                dsys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            ));
        }
        // SAFETY: `graph.graph` is a live graph; a null node array asks for the count only,
        // written to a live field.
        check("cuGraphGetNodes", unsafe {
            dsys::cuGraphGetNodes(graph.graph, ptr::null_mut(), &mut graph.nodes)
        })?;
        // SAFETY: the context is current; `graph.graph` is a live graph; the out-pointer is a
        // live field, destroyed by `Graph::drop`.
        check("cuGraphInstantiateWithFlags", unsafe {
            dsys::cuGraphInstantiateWithFlags(&mut graph.exec, graph.graph, 0)
        })?;
        Ok(graph)
    }

    /// Enqueues one run of `graph` (`cuGraphLaunch`) and returns without waiting. Runs of one
    /// graph never overlap: each is ordered after the previous work of this stream and after
    /// the previous run of `graph`, on whichever stream. On a capturing stream the run is
    /// recorded (as a child graph).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a graph of another GPU; [`Error::Cuda`].
    pub fn launch_graph(&self, graph: &Graph) -> Result<()> {
        if graph.ctx.ctx != self.ctx.ctx {
            return Err(Error::InvalidArgument(format!(
                "a graph of GPU {} launched on a stream of GPU {}",
                graph.ctx.ordinal, self.ctx.ordinal
            )));
        }
        self.ctx.bind()?;
        // SAFETY: the context is current; the executable graph and the stream are live handles
        // of it.
        check("cuGraphLaunch", unsafe {
            dsys::cuGraphLaunch(graph.exec, self.stream)
        })
    }

    /// Blocks until all work enqueued on this stream has finished.
    ///
    /// # Errors
    /// [`Error::Cuda`]: a kernel fault of this or earlier work (`CUDA_ERROR_ILLEGAL_ADDRESS`).
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current and the stream is live.
        check("cuStreamSynchronize", unsafe {
            dsys::cuStreamSynchronize(self.stream)
        })
    }

    /// Whether all work enqueued on this stream has finished, without blocking (`cuStreamQuery`);
    /// lets a host watchdog bound its wait and raise the communicator's abort flag.
    ///
    /// # Errors
    /// [`Error::Cuda`]: a kernel fault, as for [`Self::synchronize`].
    pub fn is_idle(&self) -> Result<bool> {
        self.ctx.bind()?;
        // SAFETY: the context is current and the stream is live.
        match unsafe { dsys::cuStreamQuery(self.stream) } {
            dsys::CUresult::CUDA_SUCCESS => Ok(true),
            dsys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => Err(cuda_error("cuStreamQuery", r)),
        }
    }

    /// What the registry of synchronizing frees (`crate::sync_free`) asks this stream: whether
    /// it is idle. Used only while the stream lives.
    pub(crate) fn probe(&self) -> StreamProbe {
        StreamProbe {
            ctx: Arc::clone(&self.ctx),
            stream: self.stream.expose_provenance(),
        }
    }

    /// The `CUstream` handle as an integer (0 for the legacy default stream), for passing to
    /// other CUDA libraries. Valid while `self` lives (for a wrapped stream: while its owner
    /// keeps it).
    pub fn raw(&self) -> u64 {
        self.stream.expose_provenance() as u64
    }

    /// Records an event (`cuEventCreate` without timing, then `cuEventRecord`) that completes when
    /// all work enqueued on this stream so far has finished.
    ///
    /// # Errors
    /// [`Error::Cuda`] (a sticky error of earlier work surfaces here).
    pub fn record_event(&self) -> Result<Event> {
        self.ctx.bind()?;
        let mut event: dsys::CUevent = ptr::null_mut();
        // SAFETY: the context is current; the out-pointer is a live local. Destroyed in
        // `Event::drop`.
        check("cuEventCreate", unsafe {
            dsys::cuEventCreate(
                &mut event,
                dsys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint,
            )
        })?;
        let event = Event {
            ctx: Arc::clone(&self.ctx),
            event,
        };
        // SAFETY: the context is current; the event and the stream are live handles of it.
        check("cuEventRecord", unsafe {
            dsys::cuEventRecord(event.event, self.stream)
        })?;
        Ok(event)
    }

    /// Makes work enqueued on this stream after this call wait until `event` has completed
    /// (`cuStreamWaitEvent`); returns without blocking the host. `event` may come from another
    /// stream or GPU, and may be dropped right after this returns.
    ///
    /// # Errors
    /// [`Error::Cuda`].
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current; the stream and the event are live handles; flags must
        // be 0 (CU_EVENT_WAIT_DEFAULT).
        check("cuStreamWaitEvent", unsafe {
            dsys::cuStreamWaitEvent(self.stream, event.event, 0)
        })
    }
}

/// A CUDA event recorded on a [`Stream`] ([`Stream::record_event`]); destroyed on drop (the
/// driver defers that until the recorded work completed).
#[derive(Debug)]
pub struct Event {
    ctx: Arc<Context>,
    event: dsys::CUevent,
}

// SAFETY: event handles may be used from any thread (thread-safe driver API); the context is made
// current before each use.
unsafe impl Send for Event {}
// SAFETY: as for Send; `&self` methods only query or wait.
unsafe impl Sync for Event {}

impl Event {
    /// Blocks until the work recorded by the event has finished (`cuEventSynchronize`).
    ///
    /// # Errors
    /// [`Error::Cuda`]: a kernel fault of the recorded work.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current and the event is live.
        check("cuEventSynchronize", unsafe {
            dsys::cuEventSynchronize(self.event)
        })
    }

    /// Whether the recorded work has finished, without blocking (`cuEventQuery`).
    ///
    /// # Errors
    /// [`Error::Cuda`]: a kernel fault, as for [`Self::synchronize`].
    pub fn is_complete(&self) -> Result<bool> {
        self.ctx.bind()?;
        // SAFETY: the context is current and the event is live.
        match unsafe { dsys::cuEventQuery(self.event) } {
            dsys::CUresult::CUDA_SUCCESS => Ok(true),
            dsys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => Err(cuda_error("cuEventQuery", r)),
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind() {
            tracing::warn!(target: "symcomm::cuda", error = %e, "event not destroyed");
            return;
        }
        // SAFETY: the event was created in this context and is destroyed exactly once; the driver
        // releases it once the recorded work completed.
        let r = unsafe { dsys::cuEventDestroy_v2(self.event) };
        if r != dsys::CUresult::CUDA_SUCCESS {
            tracing::warn!(target: "symcomm::cuda", error = ?r, "cuEventDestroy failed");
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.owned {
            // Wrapped external stream: its owner destroys it.
            return;
        }
        if let Err(e) = self.ctx.bind() {
            tracing::warn!(target: "symcomm::cuda", error = %e, "stream not destroyed");
            return;
        }
        // SAFETY: the stream was created in this context and is destroyed exactly once; queued
        // work still completes (driver semantics).
        let r = unsafe { dsys::cuStreamDestroy_v2(self.stream) };
        if r != dsys::CUresult::CUDA_SUCCESS {
            tracing::warn!(target: "symcomm::cuda", error = ?r, "cuStreamDestroy failed");
        }
    }
}

/// An executable CUDA graph: the work captured on a [`Stream`] ([`Stream::end_capture`]),
/// instantiated; launched with [`Stream::launch_graph`]. Dropping it destroys the executable
/// graph (`cuGraphExecDestroy`; the driver defers that until a running launch completed) and
/// the graph (`cuGraphDestroy`).
#[derive(Debug)]
pub struct Graph {
    ctx: Arc<Context>,
    /// Null until the capture ended.
    graph: dsys::CUgraph,
    /// Null until the graph was instantiated.
    exec: dsys::CUgraphExec,
    /// Nodes of the graph (`cuGraphGetNodes`).
    nodes: usize,
}

// SAFETY: graph handles may be used from any thread (thread-safe driver API); the context is made
// current before each use.
unsafe impl Send for Graph {}
// SAFETY: as for Send; `&self` methods only launch (the driver orders launches of one graph).
unsafe impl Sync for Graph {}

impl Graph {
    /// Nodes of the graph (kernel launches, copies, sets; a graph launched during the capture
    /// counts as one child-graph node).
    pub fn node_count(&self) -> usize {
        self.nodes
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind() {
            tracing::warn!(target: "symcomm::cuda", error = %e, "graph not destroyed");
            return;
        }
        if !self.exec.is_null() {
            // SAFETY: the executable graph was instantiated in this context and is destroyed
            // exactly once; a running launch of it completes first (driver semantics).
            let r = unsafe { dsys::cuGraphExecDestroy(self.exec) };
            if r != dsys::CUresult::CUDA_SUCCESS {
                tracing::warn!(target: "symcomm::cuda", error = ?r, "cuGraphExecDestroy failed");
            }
        }
        if !self.graph.is_null() {
            // SAFETY: the graph came from cuStreamEndCapture and is destroyed exactly once; the
            // executable graph made from it no longer depends on it.
            let r = unsafe { dsys::cuGraphDestroy(self.graph) };
            if r != dsys::CUresult::CUDA_SUCCESS {
                tracing::warn!(target: "symcomm::cuda", error = ?r, "cuGraphDestroy failed");
            }
        }
    }
}

/// Plain data that can be copied between host and device memory byte for byte.
///
/// # Safety
/// Implementors are `Copy`, contain no pointers to host state that a copy could invalidate, have
/// no padding bytes, and every bit pattern of their size is a valid value.
pub unsafe trait DevicePlain: Copy + 'static {
    /// The `SYMCOMM_DTYPE_*` code a window of this type carries to the device
    /// (`WindowHandleRaw::dtype`), where collectives of another type refuse it. The default,
    /// `SYMCOMM_DTYPE_NONE`, lets collectives of any type of the same size (or, for a 1-byte
    /// type, any type at all) use the window: right for user structs, and for `u8`, `u16` and
    /// `i16`, which Rust programs use to hold fp8, f16 and bf16 values and raw bytes.
    const DTYPE: u32 = SYMCOMM_DTYPE_NONE;
}

macro_rules! device_plain {
    ($($t:ty $(= $code:expr)?),*) => {$(
        // SAFETY: primitive integers and floats, and the ABI structs (all-integer `repr(C)` with
        // no padding, pinned by the layout assertions in abi.h and abi.rs), accept every bit
        // pattern.
        unsafe impl DevicePlain for $t {
            $(const DTYPE: u32 = $code;)?
        }
    )*};
}
device_plain!(
    u8,
    u16,
    u32 = symcomm_device::abi::SYMCOMM_DTYPE_U32,
    u64 = symcomm_device::abi::SYMCOMM_DTYPE_U64,
    i8 = symcomm_device::abi::SYMCOMM_DTYPE_I8,
    i16,
    i32 = symcomm_device::abi::SYMCOMM_DTYPE_I32,
    i64 = symcomm_device::abi::SYMCOMM_DTYPE_I64,
    f32 = symcomm_device::abi::SYMCOMM_DTYPE_F32,
    f64 = symcomm_device::abi::SYMCOMM_DTYPE_F64,
    DevComm,
    WindowHandleRaw,
    ErrorRecord
);

/// Device memory of one GPU, freed on drop.
///
/// Host copies ([`Self::write`], [`Self::read`], [`Self::zero`]) are synchronous and run on the
/// legacy default stream, which does not wait for [`Stream`]s: the caller orders them against
/// kernels that use the buffer (synchronize those streams first). A copy may run while an
/// unrelated kernel is still executing — that is how a host raises an abort flag.
#[derive(Debug)]
pub struct DeviceBuffer {
    ctx: Arc<Context>,
    ptr: dsys::CUdeviceptr,
    bytes: usize,
    /// The stream the allocation and its free are ordered on (see [`CudaDevice::alloc_zeroed`]).
    stream: Stream,
}

// SAFETY: a device address is valid from any thread of the process; the context is made current
// before each use.
unsafe impl Send for DeviceBuffer {}
// SAFETY: as for Send; `&self` methods only issue driver copies (the driver serializes them).
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// Device address of the first byte (what kernels receive, e.g. in `DevComm::signal_base`).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Always `false`: buffers hold at least one byte.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    fn range<T>(&self, offset: usize, count: usize) -> Result<usize> {
        let len = count
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&len| offset.checked_add(len).is_some_and(|end| end <= self.bytes));
        len.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{count} x {} bytes at offset {offset} exceed a {}-byte device buffer",
                std::mem::size_of::<T>(),
                self.bytes
            ))
        })
    }

    /// Copies `data` to the buffer at byte `offset` and waits for the copy.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range exceeds the buffer; [`Error::Cuda`].
    pub fn write<T: DevicePlain>(&self, offset: usize, data: &[T]) -> Result<()> {
        let len = self.range::<T>(offset, data.len())?;
        if len == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the destination range is inside this allocation (checked above) and the source
        // slice holds `len` initialised bytes (DevicePlain: no padding).
        check("cuMemcpyHtoD_v2", unsafe {
            dsys::cuMemcpyHtoD_v2(self.ptr + offset as u64, data.as_ptr().cast(), len)
        })?;
        // From pageable memory the call may return once the data is staged, before it reached
        // the device; kernels on non-blocking streams would not wait for it.
        sync_legacy_stream()
    }

    /// Copies from the buffer at byte `offset` into `out` and waits for the copy.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range exceeds the buffer; [`Error::Cuda`].
    pub fn read<T: DevicePlain>(&self, offset: usize, out: &mut [T]) -> Result<()> {
        let len = self.range::<T>(offset, out.len())?;
        if len == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the source range is inside this allocation (checked above); `out` has room for
        // `len` bytes, and any bytes are a valid `T` (DevicePlain).
        check("cuMemcpyDtoH_v2", unsafe {
            dsys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr + offset as u64, len)
        })
    }

    /// Sets every byte to zero and waits.
    ///
    /// # Errors
    /// [`Error::Cuda`].
    pub fn zero(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the whole allocation is written; the context is current.
        check("cuMemsetD8_v2", unsafe {
            dsys::cuMemsetD8_v2(self.ptr, 0, self.bytes)
        })?;
        // cuMemsetD8 is asynchronous to the host: wait, so that "zeroed on return" holds for
        // kernels launched afterwards on non-blocking streams.
        sync_legacy_stream()
    }
}

/// Waits for the legacy default stream of the current context, where the synchronous copy and
/// set calls run; unlike `cuCtxSynchronize` this does not wait for kernels on [`Stream`]s.
fn sync_legacy_stream() -> Result<()> {
    // SAFETY: a context is current (callers bind first); the null handle is the legacy default
    // stream.
    check("cuStreamSynchronize", unsafe {
        dsys::cuStreamSynchronize(ptr::null_mut())
    })
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind() {
            tracing::warn!(target: "symcomm::cuda", error = %e, "device memory not freed");
            return;
        }
        // SAFETY: the allocation came from cuMemAllocAsync on `self.stream` in this context and
        // is freed exactly once, in order on that stream (no context-wide synchronize); the
        // owner waited for the work that used it (Buffer's last use).
        let r = unsafe { dsys::cuMemFreeAsync(self.ptr, self.stream.stream) };
        if r != dsys::CUresult::CUDA_SUCCESS {
            tracing::warn!(target: "symcomm::cuda", error = ?r, "cuMemFreeAsync failed");
        }
    }
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

    /// cudarc panics on the first call of a symbol the library lacks, so the lists checked at
    /// load time must name exactly the entry points called (a call missing from them would be a
    /// panic on an old driver; a listed symbol never called would refuse drivers for nothing).
    #[test]
    fn symbols_checked_at_load_are_the_ones_called() {
        let cuda = include_str!("cuda.rs");
        let vmm = include_str!("cuda/vmm.rs");
        let mut driver = set(DRIVER_SYMBOLS);
        driver.insert(PARAM_INFO_SYMBOL.to_owned());
        let vmm_listed = set(vmm::VMM_SYMBOLS);
        let cuda_calls = named(cuda, "dsys::", "cu", true);
        let vmm_calls = named(vmm, "dsys::", "cu", true);
        let unlisted: Vec<_> = cuda_calls.difference(&driver).collect();
        assert!(
            unlisted.is_empty(),
            "called in cuda.rs, not in DRIVER_SYMBOLS: {unlisted:?}"
        );
        let both: BTreeSet<String> = driver.union(&vmm_listed).cloned().collect();
        let unlisted: Vec<_> = vmm_calls.difference(&both).collect();
        assert!(
            unlisted.is_empty(),
            "called in cuda/vmm.rs, not in VMM_SYMBOLS: {unlisted:?}"
        );
        let mentioned: BTreeSet<String> = named(cuda, "dsys::", "cu", false)
            .union(&named(vmm, "dsys::", "cu", false))
            .cloned()
            .collect();
        let unused: Vec<_> = both.difference(&mentioned).collect();
        assert!(
            unused.is_empty(),
            "checked at load but never used: {unused:?}"
        );
        let nvrtc = set(NVRTC_SYMBOLS);
        let unlisted: Vec<_> = named(cuda, "nsys::", "nvrtc", true)
            .into_iter()
            .filter(|n| !nvrtc.contains(n))
            .collect();
        assert!(
            unlisted.is_empty(),
            "called in cuda.rs, not in NVRTC_SYMBOLS: {unlisted:?}"
        );
        let mentioned = named(cuda, "nsys::", "nvrtc", false);
        let unused: Vec<_> = nvrtc.difference(&mentioned).collect();
        assert!(
            unused.is_empty(),
            "in NVRTC_SYMBOLS but never used: {unused:?}"
        );
    }

    #[test]
    fn missing_driver_is_an_error_not_a_panic() {
        if driver_present() {
            // A machine with a driver: probing either works or names the failing call.
            match probe() {
                Ok(info) => assert_eq!(info.peer_access.len(), info.devices.len()),
                Err(Error::Cuda { call, .. }) => assert!(call.starts_with("cu"), "{call}"),
                Err(e) => panic!("unexpected error {e}"),
            }
        } else {
            assert!(matches!(probe(), Err(Error::NoDriver(_))));
            let e = CudaDevice::open(0).unwrap_err();
            assert!(matches!(e, Error::NoDriver(_)), "{e}");
            assert!(e.to_string().starts_with("no CUDA driver: libcuda"), "{e}");
        }
    }

    #[test]
    fn arch_names_follow_the_compute_capability() {
        let gpu = GpuInfo {
            ordinal: 0,
            name: "x".into(),
            sms: 1,
            memory_bytes: 1,
            compute_capability: (9, 0),
        };
        assert_eq!(gpu.arch(), "sm_90");
    }
}

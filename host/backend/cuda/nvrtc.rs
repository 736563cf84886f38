//! Run-time compilation of a module's embedded source to PTX with NVRTC.

use std::ffi::{CString, c_char, c_int};
use std::ptr;

use cudarc::nvrtc::sys as nsys;
use symcomm_device::image::{DeviceImage, Module};

use super::loader::{nvrtc, nvrtc_check};
use crate::{Error, Result};

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

pub(super) fn c_string(what: &str, s: &str) -> Result<CString> {
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
    nvrtc_compile_with(image, module, arch, &[])
}

/// [`nvrtc_compile`] with `extra` NVRTC options after the two it always passes (the NVRTC check
/// compiles some modules with `--Ofast-compile=max`).
///
/// # Errors
/// As [`nvrtc_compile`]; an option NVRTC does not know fails the compilation.
pub fn nvrtc_compile_with(
    image: &DeviceImage,
    module: &Module,
    arch: &str,
    extra: &[&str],
) -> Result<String> {
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
    let mut options = vec![
        c_string("arch", &format!("--gpu-architecture={arch}"))?,
        c_string("option", "-std=c++17")?,
    ];
    for o in extra {
        options.push(c_string("option", o)?);
    }
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

//! Modules and kernels: loading a fatbin, PTX or cubin (with the NVRTC fallback), and the
//! kernels of a loaded module.

use std::ffi::{c_int, c_uint, c_void};
use std::ptr;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use cudarc::driver::sys as dsys;
use symcomm_device::image::{DeviceImage, Module};

use super::CudaDevice;
use super::device::Context;
use super::loader::{check, cuda_error};
use super::nvrtc::{c_string, nvrtc_compile};
use super::probe::attribute;
use crate::{Error, Result};

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

/// A module loaded in a context, shared by every rank of the process that uses that context.
struct Shared {
    /// The `CUcontext` (as an address).
    ctx: usize,
    /// The embedded module (the address of its `'static` description).
    module: usize,
    loaded: Weak<CudaModule>,
}

/// Every module loaded through [`CudaDevice::shared_module`], while some kernel uses it.
///
/// Loading code is not free to happen at any time on a GPU that several ranks share: with lazy
/// loading (`CUDA_MODULE_LOADING=LAZY`, the default since CUDA 12.2) a kernel is loaded when it
/// is first needed, and loading may wait for the whole context to go idle. Ranks that are threads
/// of one process share the primary context, so a rank loading a kernel while a peer's kernel
/// waits for this rank's next launch hangs both until the device timeout (seen on an H200: each
/// rank loading its own copy of the collectives and launching at once). So a module is loaded
/// once per context and process, all its kernels forced in at that moment (`cuFuncLoad`), and
/// every later load is a lookup here with no driver call; communicators load the built-in
/// modules during init, before any rank can launch.
static SHARED: Mutex<Vec<Shared>> = Mutex::new(Vec::new());

impl CudaDevice {
    /// `module` of `image` loaded in this device's context with every kernel of it loaded too
    /// (`cuFuncLoad`): the process's one copy, loaded on first use ([`Self::load_module`]) and
    /// unloaded when the last user drops it (see [`SHARED`] for why).
    ///
    /// # Errors
    /// As [`Self::load_module`]; [`Error::UnknownKernel`] / [`Error::Cuda`] when a kernel the
    /// image lists cannot be found or loaded.
    pub(crate) fn shared_module(
        &self,
        image: &DeviceImage,
        module: &'static Module,
    ) -> Result<Arc<CudaModule>> {
        let key = (self.ctx.ctx as usize, ptr::from_ref(module) as usize);
        let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        shared.retain(|s| s.loaded.strong_count() > 0);
        if let Some(m) = shared
            .iter()
            .filter(|s| (s.ctx, s.module) == key)
            .find_map(|s| s.loaded.upgrade())
        {
            return Ok(m);
        }
        let mut loaded = self.load_module(image, module)?;
        loaded.resolve(module.kernels.iter().map(|k| k.name))?;
        let loaded = Arc::new(loaded);
        shared.push(Shared {
            ctx: key.0,
            module: key.1,
            loaded: Arc::downgrade(&loaded),
        });
        Ok(loaded)
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
                resolved: Vec::new(),
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
        if module.source_name.ends_with(".ptx") {
            // A Rust kernel crate (symcomm_device::build::DeviceBuild::rust_kernels): its PTX
            // calls the device library, which only the build links in (nvlink).
            return Err(Error::Unsupported(format!(
                "the Rust kernels of {} have no code for this GPU ({arch}): their image is linked at build time with nvlink for {:?}; build with the CUDA toolchain (scripts/install-cuda) and without SYMCOMM_RUST_PTX=none",
                module.source, image.sass_archs
            )));
        }
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
            resolved: Vec::new(),
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
    pub(super) ctx: Arc<Context>,
    module: dsys::CUmodule,
    origin: ModuleOrigin,
    /// Kernels looked up and loaded once ([`Self::resolve`]): launches find them here, with no
    /// driver call.
    resolved: Vec<Resolved>,
}

/// A kernel of a module, loaded, with what launches check.
#[derive(Debug)]
struct Resolved {
    name: &'static str,
    func: dsys::CUfunction,
    param_sizes: Option<Vec<usize>>,
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
        if let Some(r) = self.resolved.iter().find(|r| r.name == name) {
            return Ok(CudaFunction {
                module: self,
                func: r.func,
                name: name.to_owned(),
                param_sizes: r.param_sizes.clone(),
            });
        }
        let (func, param_sizes) = self.lookup(name)?;
        Ok(CudaFunction {
            module: self,
            func,
            name: name.to_owned(),
            param_sizes,
        })
    }

    /// Looks up and loads every kernel of `names` now (`cuFuncLoad`; without it, on drivers
    /// before 12.4, `cuFuncGetAttribute`, which needs the loaded code), so that no launch of
    /// them loads code later (see [`SHARED`]).
    fn resolve(&mut self, names: impl Iterator<Item = &'static str>) -> Result<()> {
        for name in names {
            let (func, param_sizes) = self.lookup(name)?;
            if self.ctx.lib.has_func_load {
                // SAFETY: the context is current (lookup bound it); `func` is a live function
                // of this module.
                check("cuFuncLoad", unsafe { dsys::cuFuncLoad(func) })?;
            } else {
                let mut regs: c_int = 0;
                // SAFETY: as above; the out-pointer is a live local.
                check("cuFuncGetAttribute", unsafe {
                    dsys::cuFuncGetAttribute(
                        &mut regs,
                        dsys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS,
                        func,
                    )
                })?;
            }
            self.resolved.push(Resolved {
                name,
                func,
                param_sizes,
            });
        }
        Ok(())
    }

    /// `cuModuleGetFunction` for `name`, and the parameter sizes when the driver tells them.
    fn lookup(&self, name: &str) -> Result<(dsys::CUfunction, Option<Vec<usize>>)> {
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
        Ok((func, param_sizes))
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

/// A module handle on its way to `cuModuleUnload` (a `CUmodule` as an integer: the unload may
/// run on the reaper thread).
struct Unload {
    ctx: Arc<Context>,
    module: usize,
}

impl Unload {
    fn run(self) {
        if let Err(e) = self.ctx.bind() {
            tracing::warn!(target: "symcomm::cuda", error = %e, "module not unloaded");
            return;
        }
        // SAFETY: the module was loaded in this context and is unloaded exactly once (its
        // CudaModule is gone, and with it every CudaFunction<'_> borrowed from it).
        let r = unsafe { dsys::cuModuleUnload(self.module as dsys::CUmodule) };
        if r != dsys::CUresult::CUDA_SUCCESS && r != dsys::CUresult::CUDA_ERROR_DEINITIALIZED {
            tracing::warn!(target: "symcomm::cuda", error = ?r, "cuModuleUnload failed");
        }
    }
}

impl Drop for CudaModule {
    fn drop(&mut self) {
        // Unloading may wait for the context to go idle, like the frees of crate::sync_free: it
        // runs at a moment when no symcomm stream has work in flight.
        let unload = Unload {
            ctx: Arc::clone(&self.ctx),
            module: self.module as usize,
        };
        crate::sync_free::release(Box::new(move || unload.run()));
    }
}

/// A kernel of a loaded [`CudaModule`].
#[derive(Debug)]
pub struct CudaFunction<'m> {
    pub(super) module: &'m CudaModule,
    pub(super) func: dsys::CUfunction,
    pub(super) name: String,
    pub(super) param_sizes: Option<Vec<usize>>,
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

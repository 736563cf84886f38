//! Descriptions of compiled device code, embedded in a crate by its build script.
//!
//! The build helper (`symcomm_device::build`, feature `build`) writes a Rust file that defines one
//! [`DeviceImage`] static; the crate `include!`s it. Everything here is `'static` data.

use crate::emu::EmuEntry;

/// The device code of one crate: per-source modules, the sources themselves, and what the
/// compiler said about them.
#[derive(Debug)]
pub struct DeviceImage {
    /// Name given to the build helper (`symcomm` for the built-in kernels).
    pub name: &'static str,
    /// One module per `.cu` source file.
    pub modules: &'static [Module],
    /// Every kernel source and header, as NVRTC needs them when no fatbin was built.
    pub sources: &'static [SourceFile],
    /// The nvcc that built the fatbins; `None` when the build found none.
    pub compiler: Option<CompilerInfo>,
    /// Why no fatbin was built (empty when one was).
    pub no_compiler_reason: &'static str,
    /// Architectures with SASS in each fatbin (`sm_80`, `sm_90`).
    pub sass_archs: &'static [&'static str],
    /// Virtual architecture of the embedded PTX (`compute_90`).
    pub ptx_arch: &'static str,
    /// PTX ISA version of the embedded PTX (`9.0`), when built.
    pub ptx_isa: Option<&'static str>,
    /// ptxas resource usage per kernel and architecture (`-Xptxas -v`), when built.
    pub report: &'static [KernelReport],
}

/// Which nvcc produced a [`DeviceImage`].
#[derive(Debug, Clone, Copy)]
pub struct CompilerInfo {
    /// Path of the nvcc executable.
    pub nvcc: &'static str,
    /// Its release line (`Cuda compilation tools, release 13.0, V13.0.88`).
    pub version: &'static str,
    /// How it was found (`SYMCOMM_NVCC`, `CUDA_HOME`, `PATH`, `pinned cache`).
    pub found_via: &'static str,
}

/// The compiled form of one `.cu` file: a CUDA module.
#[derive(Debug)]
pub struct Module {
    /// Source path relative to the crate (`device/kernels/ping_pong.cu`).
    pub source: &'static str,
    /// Name under which NVRTC sees the source (an entry of [`DeviceImage::sources`]).
    pub source_name: &'static str,
    /// The fatbin (SASS for each of `sass_archs`, PTX for `ptx_arch`); `None` without nvcc.
    pub fatbin: Option<&'static [u8]>,
    /// The kernels it defines.
    pub kernels: &'static [Kernel],
}

/// One kernel: its entry name (`extern "C"`, the same in the fatbin and for NVRTC) and its
/// emulator entry point.
#[derive(Debug)]
pub struct Kernel {
    /// Unmangled entry name.
    pub name: &'static str,
    /// Emulator entry (`symcomm_emu_entry_<name>`, from `SYMCOMM_EMU_KERNEL(name)`).
    pub emu_entry: EmuEntry,
}

/// A source file embedded for run-time compilation.
#[derive(Debug, Clone, Copy)]
pub struct SourceFile {
    /// Include name (`symcomm/abi.h`) or kernel source name (`ping_pong.cu`).
    pub name: &'static str,
    /// Contents.
    pub contents: &'static str,
}

/// ptxas resource usage of one kernel on one architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelReport {
    /// Kernel entry name.
    pub kernel: &'static str,
    /// Target architecture (`sm_90`).
    pub arch: &'static str,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of stack frame per thread.
    pub stack_bytes: u32,
    /// Bytes of spill stores.
    pub spill_stores: u32,
    /// Bytes of spill loads.
    pub spill_loads: u32,
    /// Bytes of static shared memory per CTA.
    pub shared_bytes: u32,
    /// Bytes of constant bank 0 (kernel parameters and constants).
    pub const_bytes: u32,
}

impl DeviceImage {
    /// The module defining kernel `name`, if any.
    pub fn module_of(&self, name: &str) -> Option<(&'static Module, &'static Kernel)> {
        self.modules
            .iter()
            .find_map(|m| m.kernels.iter().find(|k| k.name == name).map(|k| (m, k)))
    }

    /// The embedded source named `name` (kernel file or header).
    pub fn source(&self, name: &str) -> Option<&'static SourceFile> {
        self.sources.iter().find(|s| s.name == name)
    }
}

/// One image inside a fatbin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FatbinEntry {
    /// 1: PTX, 2: ELF (SASS).
    pub kind: u16,
    /// Architecture number (`90` for `sm_90` / `compute_90`).
    pub arch: u32,
}

impl FatbinEntry {
    /// The kind of a PTX entry.
    pub const PTX: u16 = 1;
    /// The kind of an ELF (SASS) entry.
    pub const ELF: u16 = 2;
}

/// The entries of a fatbin (as `fatbinary` and nvcc write them), or `None` when `bin` is not one
/// (wrong magic, a size past the end).
pub fn fatbin_entries(bin: &[u8]) -> Option<Vec<FatbinEntry>> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(bin.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(bin.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(bin.get(o..o + 8)?.try_into().ok()?));
    if u32_at(0)? != 0xBA55_ED50 {
        return None;
    }
    let header = usize::from(u16_at(6)?);
    let end = header.checked_add(usize::try_from(u64_at(8)?).ok()?)?;
    if end > bin.len() {
        return None;
    }
    let mut out = Vec::new();
    let mut at = header;
    while at < end {
        let (kind, entry_header, payload) = (u16_at(at)?, u32_at(at + 4)?, u64_at(at + 8)?);
        out.push(FatbinEntry {
            kind,
            arch: u32_at(at + 28)?,
        });
        let step = usize::try_from(u64::from(entry_header) + payload).ok()?;
        if step == 0 {
            return None;
        }
        at = at.checked_add(step)?;
    }
    Some(out)
}

//! Tunables: every environment variable symcomm reads, with its default and meaning, in one
//! place (printed by `symcomm info`).

/// One environment variable symcomm reads.
#[derive(Debug, Clone, Copy)]
pub struct Tunable {
    /// Variable name.
    pub name: &'static str,
    /// Value used when unset, as shown to users.
    pub default: &'static str,
    /// What it controls.
    pub help: &'static str,
}

/// Every tunable, in display order.
pub const TUNABLES: &[Tunable] = &[
    Tunable {
        name: "SYMCOMM_LOG",
        default: "warn",
        help: "log level: off, error, warn, info, debug, trace",
    },
    Tunable {
        name: "SYMCOMM_LOG_SUBSYS",
        default: "all",
        help: "subsystems logged below warn: init,bootstrap,alloc,coll,tune,emu (^ inverts)",
    },
    Tunable {
        name: "SYMCOMM_LOG_FILE",
        default: "(stderr)",
        help: "log file; %h = host name, %p = pid",
    },
    Tunable {
        name: "SYMCOMM_NVCC",
        default: "(search)",
        help: "nvcc used by builds; `none` builds without nvcc (NVRTC at run time)",
    },
    Tunable {
        name: "CUDA_HOME",
        default: "(unset)",
        help: "CUDA toolkit searched for nvcc and NVRTC",
    },
    Tunable {
        name: "SYMCOMM_CUDA_CACHE",
        default: "~/.cache/symcomm/cuda-13.0.88",
        help: "pinned CUDA 13.0 toolchain installed by scripts/install-cuda",
    },
];

/// The current value of a tunable, `None` when unset or empty.
pub fn value(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

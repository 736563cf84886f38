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
    /// A credential: [`Tunable::value`] shows `(set)` instead of its value.
    pub secret: bool,
}

/// Every tunable, in display order.
pub const TUNABLES: &[Tunable] = &[
    Tunable {
        name: "SYMCOMM_LOG",
        default: "warn",
        help: "log level: off, error, warn, info, debug, trace",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_LOG_SUBSYS",
        default: "all",
        help: "subsystems logged below warn: init,bootstrap,alloc,coll,tune,emu (^ inverts)",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_LOG_FILE",
        default: "(stderr)",
        help: "log file; %h = host name, %p = pid",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_NVCC",
        default: "(search)",
        help: "nvcc used by builds; `none` builds without nvcc (NVRTC at run time)",
        secret: false,
    },
    Tunable {
        name: "CUDA_HOME",
        default: "(unset)",
        help: "CUDA toolkit searched for nvcc and NVRTC",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_CUDA_CACHE",
        default: "~/.cache/symcomm/cuda-13.0.88",
        help: "pinned CUDA 13.0 toolchain installed by scripts/install-cuda",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_ID",
        default: "(unset)",
        help: "bootstrap UniqueId symcomm1:<ip>:<port>:<secret> for from_env() (a credential)",
        secret: true,
    },
    Tunable {
        name: "SYMCOMM_SECRET",
        default: "(unset: unauthenticated)",
        help: "bootstrap secret, 32 hex digits, same on every rank (from_env)",
        secret: true,
    },
    Tunable {
        name: "SYMCOMM_PORT",
        default: "MASTER_PORT+1",
        help: "root's bootstrap port with MASTER_ADDR (from_env)",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_INIT_TIMEOUT",
        default: "30s",
        help: "bootstrap deadline, also of host-side collective calls: 30 / 500ms / 2m",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_DEVICE",
        default: "auto",
        help: "from_env() device: auto (GPU if any, else emu), emu, cuda, cuda:<n>",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_TIMEOUT",
        default: "60s",
        help: "deadline of every device-side wait (signals, barriers, collectives)",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_HEARTBEAT",
        default: "1s",
        help: "interval of control-link heartbeats",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_PEER_TIMEOUT",
        default: "15s",
        help: "silence after which a rank is lost (a dead process is seen at once)",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_EMU_GEOMETRY",
        default: "emu",
        help: "emulator launch geometry of built-in kernels: emu (small), cuda (as on a GPU)",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_EMU_SMS",
        default: "132",
        help: "SMs of each emulated GPU (residency: CTAs beyond what fits wait, as on a GPU)",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_EMU_CTAS_PER_SM",
        default: "32",
        help: "room per SM of each emulated GPU, in CTAs of the smallest kind",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_ALGO",
        default: "auto",
        help: "force a collective algorithm: one_shot, two_shot (all-reduce) or auto",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_STAGING_BYTES",
        default: "4194304",
        help: "bytes of each staging window (2 per stream) for non-window buffers and send/recv",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_HOSTS_CHUNK_BYTES",
        default: "4194304",
        help: "bytes per pipelined chunk of an all-reduce across hosts (the same on every rank)",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_HOSTS_STAGING",
        default: "direct (where UCX reaches the memory)",
        help: "pinned: data between hosts goes through mapped host memory; direct: UCX moves device memory",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_SOCKET_IFNAME",
        default: "(route to root)",
        help: "interface (name or prefix) for bootstrap sockets",
        secret: false,
    },
    Tunable {
        name: "SYMCOMM_HOST_ID",
        default: "hostname/boot_id",
        help: "host identity; equal ids form a local team",
        secret: false,
    },
];

impl Tunable {
    /// The current value as shown to users, `None` when unset or empty; a secret tunable shows
    /// `(set)`, never its value.
    pub fn value(&self) -> Option<String> {
        let v = raw_value(self.name)?;
        Some(if self.secret { "(set)".to_owned() } else { v })
    }
}

/// The current value of an environment variable, `None` when unset or empty (secrets included:
/// for reading settings, not for display).
pub(crate) fn raw_value(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_and_names_unique() {
        for t in TUNABLES {
            assert_eq!(
                TUNABLES.iter().filter(|u| u.name == t.name).count(),
                1,
                "{}",
                t.name
            );
        }
        assert!(
            TUNABLES
                .iter()
                .any(|t| t.name == "SYMCOMM_SECRET" && t.secret)
        );
        assert!(TUNABLES.iter().any(|t| t.name == "SYMCOMM_ID" && t.secret));
        // Masking depends only on the table, not on what the variable holds.
        let var = TUNABLES.iter().find(|t| t.secret).map(|t| t.name);
        assert!(var.is_some());
    }
}

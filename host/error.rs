use std::sync::Arc;

/// Result of every fallible symcomm call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the symcomm host crate.
///
/// CUDA failures name the call and the CUDA error (`cuModuleLoadData failed:
/// CUDA_ERROR_INVALID_IMAGE`); device-side failures carry the rank, peer and operation recorded by
/// the kernel.
///
/// `Clone` (the I/O errors inside are shared, [`Arc`]): a sticky error — a failed stream's, a
/// failed driver load's — is returned again as the same variant with the same source.
/// [`Error::is_timeout`] tells the deadlines that passed apart from the other failures.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No CUDA driver library (libcuda) could be loaded on this machine.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// A CUDA driver API call failed.
    #[error("{call} failed: {error}")]
    Cuda {
        /// The driver call (`cuInit`, `cuModuleLoadData`, ...).
        call: &'static str,
        /// The CUDA error name (`CUDA_ERROR_NO_DEVICE`).
        error: String,
    },
    /// NVRTC (run-time compilation) could not be loaded or failed.
    #[error("NVRTC {call} failed: {error}")]
    Nvrtc {
        /// The NVRTC call or step.
        call: &'static str,
        /// The NVRTC error and, for compilation, its log.
        error: String,
    },
    /// The kernel is not part of the embedded device code.
    #[error("unknown kernel `{0}`")]
    UnknownKernel(String),
    /// An argument is invalid; nothing was launched.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A bounded device-side wait passed its deadline.
    #[error("timeout on rank {rank} waiting for peer {peer} in {op} ({detail})")]
    Timeout {
        /// Rank that timed out.
        rank: u32,
        /// Peer it waited for.
        peer: u32,
        /// Operation that waited.
        op: &'static str,
        /// What it waited on, decoded from the error record (e.g. "barrier index 130").
        detail: String,
    },
    /// The communicator's abort flag stopped a device-side wait.
    #[error("aborted on rank {rank} while waiting for peer {peer} in {op} ({detail})")]
    Aborted {
        /// Rank that saw the abort.
        rank: u32,
        /// Peer it waited for.
        peer: u32,
        /// Operation that waited.
        op: &'static str,
        /// What it waited on, decoded from the error record, or who aborted.
        detail: String,
    },
    /// A rank of the communicator is gone: its process died (its control connection closed
    /// without a goodbye), it stopped sending heartbeats, it aborted its communicator, or it
    /// destroyed its communicator — the last is a fault only for a rank that made more
    /// collective calls than the departed one (they wait for it), and otherwise the error of
    /// the later calls that need the departed rank. On a fault the communicator's abort flag was
    /// raised, so kernels waiting for that rank returned; destroy the communicator.
    #[error("rank {rank} is lost: {reason}")]
    PeerLost {
        /// The rank that is gone.
        rank: u32,
        /// Why it is considered gone.
        reason: String,
    },
    /// Ranks made mismatched calls: a collective with a different kind, count, type, operation,
    /// root or algorithm (seen by the device through the call fingerprint), or a host-side call
    /// such as `alloc_window` with different sizes. Every rank involved gets this error.
    #[error("mismatch on rank {rank} (peer {peer}): {what}")]
    Mismatch {
        /// Rank reporting the mismatch.
        rank: u32,
        /// A peer whose call differs.
        peer: u32,
        /// What differs.
        what: String,
    },
    /// Another rank failed a step of a collective host operation (init, window allocation)
    /// that this rank completed; every rank returns an error for the step.
    #[error("rank {rank} failed during {what}: {message}")]
    PeerFailed {
        /// The rank that failed.
        rank: u32,
        /// The step.
        what: String,
        /// Its error.
        message: String,
    },
    /// The request is valid but this build, backend or topology cannot serve it (for example a
    /// window spanning several hosts before an inter-node transport exists).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A host-side collective operation of the communicator (window allocation, barrier) did not
    /// complete in time: some rank did not make the same call.
    #[error(
        "rank {rank}: {what} did not complete within {timeout_ms} ms (did every rank make the same call?)"
    )]
    HostTimeout {
        /// Rank that timed out.
        rank: u32,
        /// The operation.
        what: String,
        /// The timeout, in milliseconds.
        timeout_ms: u64,
    },
    /// Device code or the emulator failed in another way.
    #[error(transparent)]
    Device(#[from] symcomm_device::Error),
    /// Rendezvous authentication failed: this rank's secret does not match the root's (the root
    /// rejected our proof), or the root could not prove it knows the secret. The rank did not
    /// join.
    #[error("bootstrap authentication failed: {0}")]
    AuthFailed(String),
    /// The bootstrap rendezvous did not complete within the init timeout. `missing` lists the
    /// ranks that never joined, as reported by the root (rank 0 when the root itself could not
    /// be reached); it is empty when the root gave no verdict in time. On the root,
    /// `auth_failed` lists the ranks that connections which failed authentication claimed to
    /// be: a missing rank listed there was most likely started with a different secret.
    #[error(
        "bootstrap init timed out on rank {rank} after {timeout_ms} ms; {}{}",
        missing_ranks(missing),
        auth_failures(auth_failed)
    )]
    InitTimeout {
        /// Rank that timed out.
        rank: u32,
        /// Ranks that never joined (empty: unknown).
        missing: Vec<u32>,
        /// The init timeout, in milliseconds.
        timeout_ms: u64,
        /// Root only: the ranks claimed by connections that failed authentication during the
        /// rendezvous (unverified claims; ascending, each once, at most 64), empty when none
        /// did and on the other ranks.
        auth_failed: Vec<u32>,
    },
    /// A peer speaks another bootstrap protocol version (a different symcomm release).
    #[error(
        "bootstrap protocol version mismatch: this rank speaks version {local}, {peer} speaks version {remote}"
    )]
    VersionMismatch {
        /// Our protocol version.
        local: u32,
        /// The peer's protocol version.
        remote: u32,
        /// Who the peer is (`the root at 10.0.0.1:29500`, `a client at ...`).
        peer: String,
    },
    /// The rendezvous was refused or broke off; `kind` says why, `detail` names the ranks and
    /// addresses involved.
    #[error("bootstrap failed ({kind}): {detail}")]
    Bootstrap {
        /// What went wrong.
        kind: BootstrapErrorKind,
        /// Human-readable specifics.
        detail: String,
    },
    /// An I/O error, with what was being done ([`Error::io`] makes one).
    #[error("{what}: {source}")]
    Io {
        /// What failed.
        what: String,
        /// The I/O error (shared, so that the error can be cloned).
        source: Arc<std::io::Error>,
    },
}

impl Error {
    /// [`Error::Io`]: `source` happened while doing `what`.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source: Arc::new(source),
        }
    }

    /// Whether a deadline passed: a device-side wait ([`Error::Timeout`]), a host-side
    /// collective operation ([`Error::HostTimeout`]), the bootstrap rendezvous
    /// ([`Error::InitTimeout`]), or a bounded wait on a socket ([`Error::Io`] of kind
    /// [`TimedOut`](std::io::ErrorKind::TimedOut), e.g. the local ranks' handle exchange).
    pub fn is_timeout(&self) -> bool {
        match self {
            Error::Timeout { .. } | Error::HostTimeout { .. } | Error::InitTimeout { .. } => true,
            Error::Io { source, .. } => source.kind() == std::io::ErrorKind::TimedOut,
            _ => false,
        }
    }

    /// The error a kernel recorded in a rank's `ErrorRecord` (`record_error` and the device
    /// library's waits), as the host reports it after a launch: Timeout / Aborted / Mismatch /
    /// InvalidArgument / Unsupported (ABI), with the record's operation and detail decoded into
    /// words ("barrier index 130", "signal word 3 from peer 1", "user code 0x2a, value 7",
    /// "grid_sync generation 4"). For users who read records themselves (symcomm's own emulator
    /// tests read them from their team harness). Pre: `rec.status` is not
    /// SYMCOMM_STATUS_OK (an Ok record holds no error; it maps to InvalidArgument).
    pub fn from_record(rec: &symcomm_device::abi::ErrorRecord) -> Error {
        crate::comm::error_from_record(rec)
    }
}

/// Why a bootstrap rendezvous was refused or broke off ([`Error::Bootstrap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BootstrapErrorKind {
    /// Two authenticated processes claimed the same rank; the root stopped the rendezvous.
    DuplicateRank,
    /// A rank outside `0..nranks` reached the root.
    RankOutOfRange,
    /// Ranks disagree on the number of ranks; the root stopped the rendezvous.
    NranksMismatch,
    /// The peer sent something that is not a valid bootstrap frame (not a symcomm root?).
    Protocol,
    /// The connection to a peer closed or failed during the rendezvous.
    Disconnected,
}

impl std::fmt::Display for BootstrapErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BootstrapErrorKind::DuplicateRank => "duplicate rank",
            BootstrapErrorKind::RankOutOfRange => "rank out of range",
            BootstrapErrorKind::NranksMismatch => "nranks mismatch",
            BootstrapErrorKind::Protocol => "protocol error",
            BootstrapErrorKind::Disconnected => "disconnected",
        })
    }
}

/// `ranks that never joined: [2, 5]`, shortened past 32 ranks.
fn missing_ranks(missing: &[u32]) -> String {
    if missing.is_empty() {
        return "the root gave no verdict, so the missing ranks are unknown".to_owned();
    }
    format!("ranks that never joined: {}", rank_list(missing))
}

/// `; a connection claiming rank 1 failed authentication (…)`, or nothing.
fn auth_failures(claimed: &[u32]) -> String {
    match claimed {
        [] => String::new(),
        [rank] => format!(
            "; a connection claiming rank {rank} failed authentication (a rank started with a \
             different secret? check SYMCOMM_SECRET / SYMCOMM_ID on every rank)"
        ),
        _ => format!(
            "; connections claiming ranks {} failed authentication (ranks started with a \
             different secret? check SYMCOMM_SECRET / SYMCOMM_ID on every rank)",
            rank_list(claimed)
        ),
    }
}

/// `[2, 5]`, shortened past 32 ranks.
fn rank_list(ranks: &[u32]) -> String {
    const SHOWN: usize = 32;
    let list: Vec<String> = ranks.iter().take(SHOWN).map(u32::to_string).collect();
    let more = ranks.len().saturating_sub(SHOWN);
    if more > 0 {
        format!("[{}, ... and {more} more]", list.join(", "))
    } else {
        format!("[{}]", list.join(", "))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn timeouts_are_told_apart_from_other_failures() {
        let timeouts = [
            Error::Timeout {
                rank: 0,
                peer: 1,
                op: "barrier",
                detail: "barrier index 3".into(),
            },
            Error::HostTimeout {
                rank: 0,
                what: "barrier".into(),
                timeout_ms: 10,
            },
            Error::InitTimeout {
                rank: 1,
                missing: vec![0],
                timeout_ms: 10,
                auth_failed: Vec::new(),
            },
            Error::io("waiting", std::io::ErrorKind::TimedOut.into()),
        ];
        for e in &timeouts {
            assert!(e.is_timeout(), "{e}");
            assert!(e.clone().is_timeout(), "{e}");
        }
        let others = [
            Error::Aborted {
                rank: 0,
                peer: 1,
                op: "barrier",
                detail: String::new(),
            },
            Error::PeerLost {
                rank: 1,
                reason: "it sent no heartbeat within the peer timeout".into(),
            },
            Error::io("reading", std::io::ErrorKind::UnexpectedEof.into()),
            Error::InvalidArgument("timeout".into()),
        ];
        for e in &others {
            assert!(!e.is_timeout(), "{e}");
        }
    }

    #[test]
    fn clones_share_the_io_source_and_show_the_same() {
        let e = Error::io("binding", std::io::Error::other("address in use"));
        let c = e.clone();
        assert_eq!(c.to_string(), e.to_string());
        assert_eq!(c.to_string(), "binding: address in use");
        let (Error::Io { source: a, .. }, Error::Io { source: b, .. }) = (&e, &c) else {
            panic!("not I/O errors");
        };
        assert!(Arc::ptr_eq(a, b));
        // The source chain is kept: the I/O error is the clone's source.
        let source = std::error::Error::source(&c).unwrap();
        assert_eq!(source.to_string(), "address in use");
    }
}

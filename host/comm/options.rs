//! Where a communicator's kernels run ([`Device`]) and its timing ([`CommOptions`]), from the
//! environment or set in code.

use std::time::Duration;

use crate::backend::{Backend, cuda};
use crate::bootstrap;
use crate::config::raw_value;
use crate::{Error, Result};

/// Default deadline of every device-side wait (`SYMCOMM_TIMEOUT`).
pub const DEFAULT_DEVICE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default interval between control-plane heartbeats (`SYMCOMM_HEARTBEAT`).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
/// Default silence after which a rank is declared lost (`SYMCOMM_PEER_TIMEOUT`).
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(15);
/// Default bytes per pipelined chunk of an all-reduce across hosts (`SYMCOMM_HOSTS_CHUNK_BYTES`).
pub const DEFAULT_HOSTS_CHUNK_BYTES: u64 = 4 << 20;

/// Where a communicator's kernels run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Device {
    /// CUDA when a driver and at least one GPU are present (GPU `local rank % GPU count`),
    /// else the emulator.
    Auto,
    /// CUDA GPU `ordinal`. Several ranks may share one GPU.
    Cuda(usize),
    /// A CUDA GPU chosen by local rank (`local rank % GPU count`); an error without a GPU.
    CudaLocal,
    /// The CPU emulator.
    Emu,
}

impl Device {
    /// `SYMCOMM_DEVICE`: `auto` (default), `emu`, `cuda` (= auto among GPUs: local rank modulo
    /// the GPU count) or `cuda:<ordinal>`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another value.
    pub fn from_env() -> Result<Self> {
        match raw_value("SYMCOMM_DEVICE") {
            None => Ok(Device::Auto),
            Some(v) => Device::parse(&v),
        }
    }

    /// Parses `auto`, `emu`, `cuda` or `cuda:<ordinal>`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another value.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || {
            Error::InvalidArgument(format!(
                "SYMCOMM_DEVICE={text}: expected auto, emu, cuda or cuda:<ordinal>"
            ))
        };
        match text.trim() {
            "auto" => Ok(Device::Auto),
            "emu" => Ok(Device::Emu),
            "cuda" => Ok(Device::CudaLocal),
            t => t
                .strip_prefix("cuda:")
                .and_then(|o| o.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(bad),
        }
    }

    /// The backend for the rank with local index `local_rank`.
    pub(super) fn open(self, local_rank: u32) -> Result<Backend> {
        let gpus = || -> Result<usize> { Ok(cuda::probe()?.devices.len()) };
        match self {
            Device::Emu => Ok(Backend::Emu),
            Device::CudaLocal => {
                let n = gpus()?;
                if n == 0 {
                    return Err(Error::InvalidArgument(
                        "SYMCOMM_DEVICE=cuda but no GPU".into(),
                    ));
                }
                Ok(Backend::Cuda(cuda::CudaDevice::open(
                    local_rank as usize % n,
                )?))
            }
            Device::Cuda(ordinal) => Ok(Backend::Cuda(cuda::CudaDevice::open(ordinal)?)),
            Device::Auto => match gpus() {
                Ok(n) if n > 0 => Ok(Backend::Cuda(cuda::CudaDevice::open(
                    local_rank as usize % n,
                )?)),
                _ => Ok(Backend::Emu),
            },
        }
    }
}

/// Timing of a communicator beyond the bootstrap's (whose init timeout also bounds host-side
/// collective calls).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CommOptions {
    /// Deadline of every device-side wait (`DevComm::timeout_ns`; `SYMCOMM_TIMEOUT`).
    pub device_timeout: Duration,
    /// Interval between heartbeats on the control links (`SYMCOMM_HEARTBEAT`).
    pub heartbeat: Duration,
    /// Silence after which a rank is lost (`SYMCOMM_PEER_TIMEOUT`). A rank whose process dies is
    /// detected at once (its connection closes); this bounds hangs and partitions.
    pub peer_timeout: Duration,
    /// On the emulator, launch the built-in kernels with the CUDA launch geometry (CTAs of 512
    /// threads, as many as the co-residency budget allows) instead of the emulator's small one,
    /// so the partitioning, barrier-index and vector paths of GPU-sized grids run on the CPU
    /// under the emulator's residency scheduler (`SYMCOMM_EMU_GEOMETRY=cuda`; slower). No effect
    /// on CUDA.
    pub emu_cuda_geometry: bool,
    /// Bytes of the vector per chunk of an all-reduce across hosts (`SYMCOMM_HOSTS_CHUNK_BYTES`,
    /// at least 1): larger calls are cut into chunks whose phases on this host overlap the
    /// previous chunk's exchange between hosts. Must be the same on every rank (the first
    /// collective across hosts refuses ranks that differ).
    pub hosts_chunk_bytes: u64,
    /// Move data between hosts through mapped host memory in pieces, copied on streams of
    /// their own while the previous piece crosses (`SYMCOMM_HOSTS_STAGING=pinned`), instead of
    /// handing UCX the device memory itself (`direct`, the default). Direct needs a UCX that
    /// can reach the memory: the emulator's is host memory, and a GPU's needs a UCX built with
    /// CUDA (GPUDirect RDMA where the NIC and driver allow it); a GPU whose UCX lacks CUDA
    /// stages whatever this says. On the emulator, `pinned` tests and measures that path on a
    /// CPU. Each rank chooses alone: the bytes between hosts are the same either way.
    pub hosts_staging: bool,
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            device_timeout: DEFAULT_DEVICE_TIMEOUT,
            heartbeat: DEFAULT_HEARTBEAT,
            peer_timeout: DEFAULT_PEER_TIMEOUT,
            emu_cuda_geometry: false,
            hosts_chunk_bytes: DEFAULT_HOSTS_CHUNK_BYTES,
            hosts_staging: false,
        }
    }
}

/// A setting of two words: `Some(true)` for `yes`, `Some(false)` for `no`, `None` when unset.
fn either(name: &str, yes: &str, no: &str) -> Result<Option<bool>> {
    match raw_value(name) {
        None => Ok(None),
        Some(v) if v == yes => Ok(Some(true)),
        Some(v) if v == no => Ok(Some(false)),
        Some(v) => Err(Error::InvalidArgument(format!(
            "{name}={v}: expected `{yes}` or `{no}`"
        ))),
    }
}

impl CommOptions {
    /// Defaults overridden by `SYMCOMM_TIMEOUT`, `SYMCOMM_HEARTBEAT`, `SYMCOMM_PEER_TIMEOUT`
    /// (`30`, `2.5s`, `500ms`, `2m`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a value that does not parse, or a peer timeout not above
    /// the heartbeat interval.
    pub fn from_env() -> Result<Self> {
        let mut o = CommOptions::default();
        let get = |name: &str, into: &mut Duration| -> Result<()> {
            if let Some(v) = raw_value(name) {
                *into = bootstrap::parse_timeout(&v)
                    .map_err(|why| Error::InvalidArgument(format!("{name}={v}: {why}")))?;
            }
            Ok(())
        };
        get("SYMCOMM_TIMEOUT", &mut o.device_timeout)?;
        get("SYMCOMM_HEARTBEAT", &mut o.heartbeat)?;
        get("SYMCOMM_PEER_TIMEOUT", &mut o.peer_timeout)?;
        if let Some(on) = either("SYMCOMM_EMU_GEOMETRY", "cuda", "emu")? {
            o.emu_cuda_geometry = on;
        }
        if let Some(v) = raw_value("SYMCOMM_HOSTS_CHUNK_BYTES") {
            o.hosts_chunk_bytes = v.trim().parse().map_err(|_| {
                Error::InvalidArgument(format!(
                    "SYMCOMM_HOSTS_CHUNK_BYTES={v}: expected a number of bytes"
                ))
            })?;
        }
        if let Some(on) = either("SYMCOMM_HOSTS_STAGING", "pinned", "direct")? {
            o.hosts_staging = on;
        }
        o.validate()?;
        Ok(o)
    }

    /// Sets the device-side wait deadline.
    pub fn with_device_timeout(mut self, t: Duration) -> Self {
        self.device_timeout = t;
        self
    }

    /// Sets [`CommOptions::emu_cuda_geometry`].
    #[must_use]
    pub fn with_emu_cuda_geometry(mut self, on: bool) -> Self {
        self.emu_cuda_geometry = on;
        self
    }

    /// Sets [`CommOptions::hosts_chunk_bytes`].
    #[must_use]
    pub fn with_hosts_chunk_bytes(mut self, bytes: u64) -> Self {
        self.hosts_chunk_bytes = bytes;
        self
    }

    /// Sets [`CommOptions::hosts_staging`].
    #[must_use]
    pub fn with_hosts_staging(mut self, on: bool) -> Self {
        self.hosts_staging = on;
        self
    }

    /// Sets the heartbeat interval and the peer timeout.
    pub fn with_liveness(mut self, heartbeat: Duration, peer_timeout: Duration) -> Self {
        self.heartbeat = heartbeat;
        self.peer_timeout = peer_timeout;
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.heartbeat.is_zero() || self.peer_timeout <= self.heartbeat {
            return Err(Error::InvalidArgument(format!(
                "the peer timeout ({:?}) must exceed the heartbeat interval ({:?}), which must \
                 not be zero",
                self.peer_timeout, self.heartbeat
            )));
        }
        if self.device_timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "the device timeout must not be zero".into(),
            ));
        }
        if self.hosts_chunk_bytes == 0 {
            return Err(Error::InvalidArgument(
                "the chunk size across hosts (SYMCOMM_HOSTS_CHUNK_BYTES) must not be zero".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn documented_defaults_match_the_constants() {
        let default = |name: &str| {
            let t = crate::config::TUNABLES
                .iter()
                .find(|t| t.name == name)
                .unwrap();
            bootstrap::parse_timeout(t.default).unwrap()
        };
        assert_eq!(default("SYMCOMM_TIMEOUT"), DEFAULT_DEVICE_TIMEOUT);
        assert_eq!(default("SYMCOMM_HEARTBEAT"), DEFAULT_HEARTBEAT);
        assert_eq!(default("SYMCOMM_PEER_TIMEOUT"), DEFAULT_PEER_TIMEOUT);
        assert_eq!(
            default("SYMCOMM_INIT_TIMEOUT"),
            bootstrap::DEFAULT_INIT_TIMEOUT
        );
    }
}

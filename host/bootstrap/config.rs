//! [`BootstrapConfig`]: everything a rank needs to rendezvous, built by hand or from launcher
//! variables (torchrun, Open MPI, MPICH/Hydra, Slurm).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use super::id::{Secret, UniqueId};
use super::{MAX_RANKS, auth, wire};
use crate::{Error, Result};

/// Default init timeout (`SYMCOMM_INIT_TIMEOUT`).
pub const DEFAULT_INIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest handshake an unauthenticated connection may take by default (capped by the init
/// timeout). Its hello is due sooner, within 1 s; see the admission guarantee in the
/// [`bootstrap`](super) module docs.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest accepted `SYMCOMM_INIT_TIMEOUT`.
const MAX_INIT_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Where a configuration's rank and rank count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Launcher {
    /// Given by the program ([`BootstrapConfig::new`]).
    Explicit,
    /// torchrun / torch.distributed.run: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`.
    Torchrun,
    /// Open MPI's mpirun: `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`.
    OpenMpi,
    /// MPICH / Intel MPI (Hydra): `PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`, `MPI_LOCALNRANKS`.
    Mpich,
    /// Slurm's srun: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`.
    Slurm,
}

/// What the launcher says about this rank's host, cross-checked against the local team the
/// rendezvous finds (a disagreement is logged, not fatal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalHint {
    /// This rank's index on its host (`LOCAL_RANK`).
    pub local_rank: u32,
    /// Ranks on this host (`LOCAL_WORLD_SIZE`), when the launcher says.
    pub local_size: Option<u32>,
}

/// A rank's rendezvous settings.
///
/// Build one with [`BootstrapConfig::new`] (then adjust the public fields) or
/// [`BootstrapConfig::from_env`] / [`BootstrapConfig::from_vars`], and pass it to
/// [`init_with`](super::init_with).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BootstrapConfig {
    /// Root address and secret.
    pub id: UniqueId,
    /// This rank, `0..nranks`; rank 0 is the root.
    pub rank: u32,
    /// Number of ranks.
    pub nranks: u32,
    /// Deadline of the whole init, from the call (`SYMCOMM_INIT_TIMEOUT`).
    pub timeout: Duration,
    /// Root only: deadline of each connection's handshake, from its accept to its proof
    /// (default: the smaller of [`DEFAULT_HANDSHAKE_TIMEOUT`] and `timeout`). Its hello is due
    /// within 1 s (or this, when shorter). Neither deadline is what keeps legitimate ranks in
    /// under a flood: the root holds up to
    /// [`MAX_PENDING_HANDSHAKES`](super::MAX_PENDING_HANDSHAKES) connections and, when full,
    /// drops the ones that have owed their hello the longest first, so silent or slow
    /// connections never keep out a rank that sends its hello promptly (the admission guarantee
    /// in the [`bootstrap`](super) module docs).
    pub handshake_timeout: Option<Duration>,
    /// This rank's host identity (`SYMCOMM_HOST_ID`); `None` = [`host_identity`](super::host_identity).
    /// Ranks with equal host identities form a local team.
    pub host_id: Option<String>,
    /// Interface to bind (`SYMCOMM_SOCKET_IFNAME`); `None` = the one that routes to the root.
    pub ifname: Option<String>,
    /// Where `rank` / `nranks` came from.
    pub launcher: Launcher,
    /// The launcher's view of this rank's host, checked against the local team.
    pub local_hint: Option<LocalHint>,
    /// Whether the secret was configured (`SYMCOMM_SECRET`, `SYMCOMM_ID`, or an id made with
    /// [`UniqueId::new`]) rather than derived from public facts.
    pub authenticated: bool,
}

impl BootstrapConfig {
    /// A configuration with defaults: timeout [`DEFAULT_INIT_TIMEOUT`], detected host identity,
    /// the interface that routes to the root. Reads no environment variable.
    pub fn new(id: UniqueId, rank: u32, nranks: u32) -> Self {
        BootstrapConfig {
            id,
            rank,
            nranks,
            timeout: DEFAULT_INIT_TIMEOUT,
            handshake_timeout: None,
            host_id: None,
            ifname: None,
            launcher: Launcher::Explicit,
            local_hint: None,
            authenticated: true,
        }
    }

    /// Sets the init timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the host identity (what `SYMCOMM_HOST_ID` does), e.g. to simulate several hosts
    /// in one process.
    pub fn with_host_id(mut self, host_id: impl Into<String>) -> Self {
        self.host_id = Some(host_id.into());
        self
    }

    /// Sets the root's per-connection handshake deadline.
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = Some(timeout);
        self
    }

    /// Reads the rank, rank count, root address and secret from the process environment; see
    /// [`BootstrapConfig::from_vars`].
    ///
    /// # Errors
    /// As [`BootstrapConfig::from_vars`].
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Builds a configuration from launcher variables, read through `get` (so it can be tested
    /// without touching the process environment).
    ///
    /// - Rank and count, first match wins: torchrun (`RANK`, `WORLD_SIZE`; `LOCAL_RANK`,
    ///   `LOCAL_WORLD_SIZE`), Open MPI (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`;
    ///   `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE`), MPICH/Hydra (`PMI_RANK`,
    ///   `PMI_SIZE`; `MPI_LOCALRANKID`, `MPI_LOCALNRANKS`), Slurm (`SLURM_PROCID`,
    ///   `SLURM_NTASKS` or `SLURM_NPROCS`; `SLURM_LOCALID`, `SLURM_NTASKS_PER_NODE` when a plain
    ///   number).
    /// - Root: `SYMCOMM_ID` (a whole [`UniqueId`], secret included), else `MASTER_ADDR` with port
    ///   `SYMCOMM_PORT`, or `MASTER_PORT + 1` (torch's own store listens on `MASTER_PORT`).
    /// - Secret: from `SYMCOMM_ID`, else `SYMCOMM_SECRET` (32 hex digits). Without one, a secret
    ///   derived from the root address and the job id (`TORCHELASTIC_RUN_ID`, `SLURM_JOB_ID`) is
    ///   used and a warning is logged: anyone who reaches the root's port could join.
    /// - `SYMCOMM_INIT_TIMEOUT` (`30`, `2.5s`, `500ms`, `2m`), `SYMCOMM_HOST_ID`,
    ///   `SYMCOMM_SOCKET_IFNAME`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the variable for a missing or malformed value, a rank
    /// out of range, or a `MASTER_ADDR` that does not resolve.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let get = |name: &str| {
            get(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let (launcher, rank, nranks, local_hint) = rank_and_size(&get)?;

        let (id, authenticated) = match get("SYMCOMM_ID") {
            Some(s) => {
                if get("SYMCOMM_SECRET").is_some() {
                    return Err(Error::InvalidArgument(
                        "both SYMCOMM_ID and SYMCOMM_SECRET are set; SYMCOMM_ID carries its own \
                         secret, so set only one"
                            .into(),
                    ));
                }
                let id: UniqueId = s.parse().map_err(|e| match e {
                    // One "invalid argument:" prefix, not two.
                    Error::InvalidArgument(m) => Error::InvalidArgument(format!("SYMCOMM_ID: {m}")),
                    e => e,
                })?;
                (id, true)
            }
            None => {
                let root = root_from_master(&get)?;
                match get("SYMCOMM_SECRET") {
                    Some(hex) => {
                        let secret = Secret::from_hex(&hex).ok_or_else(|| {
                            Error::InvalidArgument(format!(
                                "SYMCOMM_SECRET must be 32 hex digits (128 bits), got {} characters",
                                hex.chars().count()
                            ))
                        })?;
                        (UniqueId::with_secret(root, secret), true)
                    }
                    None => {
                        let job = get("TORCHELASTIC_RUN_ID")
                            .or_else(|| get("SLURM_JOB_ID"))
                            .unwrap_or_default();
                        let secret = Secret::from_bytes(auth::derive_public_secret(&[
                            &root.to_string(),
                            &job,
                        ]));
                        tracing::warn!(
                            target: "symcomm::bootstrap",
                            "SYMCOMM_SECRET is not set: the rendezvous at {root} is NOT \
                             authenticated, anyone who can reach that port could join as a rank. \
                             Set SYMCOMM_SECRET to the same 32 hex digits on every rank \
                             (e.g. `openssl rand -hex 16`)."
                        );
                        (UniqueId::with_secret(root, secret), false)
                    }
                }
            }
        };

        let mut config = BootstrapConfig::new(id, rank, nranks);
        config.launcher = launcher;
        config.local_hint = local_hint;
        config.authenticated = authenticated;
        config.apply_overrides(&get)?;
        config.validate()?;
        Ok(config)
    }

    /// `SYMCOMM_INIT_TIMEOUT`, `SYMCOMM_HOST_ID`, `SYMCOMM_SOCKET_IFNAME`.
    pub(crate) fn apply_overrides(&mut self, get: &dyn Fn(&str) -> Option<String>) -> Result<()> {
        if let Some(t) = get("SYMCOMM_INIT_TIMEOUT") {
            self.timeout = parse_timeout(&t).map_err(|why| {
                Error::InvalidArgument(format!("SYMCOMM_INIT_TIMEOUT={t}: {why}"))
            })?;
        }
        if let Some(h) = get("SYMCOMM_HOST_ID") {
            self.host_id = Some(h);
        }
        if let Some(i) = get("SYMCOMM_SOCKET_IFNAME") {
            self.ifname = Some(i);
        }
        Ok(())
    }

    /// Local checks done before any I/O.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.nranks == 0 || self.nranks > MAX_RANKS {
            return Err(Error::InvalidArgument(format!(
                "nranks {} is out of range (1..={MAX_RANKS})",
                self.nranks
            )));
        }
        if self.rank >= self.nranks {
            return Err(Error::InvalidArgument(format!(
                "rank {} is out of range for {} ranks (0..{})",
                self.rank, self.nranks, self.nranks
            )));
        }
        if self.timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "the init timeout must be positive".into(),
            ));
        }
        if self.handshake_timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::InvalidArgument(
                "the handshake timeout must be positive".into(),
            ));
        }
        if let Some(h) = &self.host_id {
            check_host_id(h)?;
        }
        Ok(())
    }
}

/// A host identity must be 1..=255 bytes without control characters.
pub(crate) fn check_host_id(h: &str) -> Result<()> {
    if h.is_empty() || h.len() > wire::MAX_HOST_ID || h.chars().any(char::is_control) {
        return Err(Error::InvalidArgument(format!(
            "host id `{}` must be 1 to {} bytes without control characters",
            h.escape_debug(),
            wire::MAX_HOST_ID
        )));
    }
    Ok(())
}

type Get<'a> = dyn Fn(&str) -> Option<String> + 'a;

fn parse_u32(get: &Get<'_>, name: &str) -> Result<Option<u32>> {
    match get(name) {
        None => Ok(None),
        Some(v) => v.parse::<u32>().map(Some).map_err(|_| {
            Error::InvalidArgument(format!("{name}={v} is not a non-negative integer"))
        }),
    }
}

fn rank_and_size(get: &Get<'_>) -> Result<(Launcher, u32, u32, Option<LocalHint>)> {
    // (launcher, rank var, size vars, local rank var, local size var)
    let sources: [(Launcher, &str, &[&str], &str, &str); 4] = [
        (
            Launcher::Torchrun,
            "RANK",
            &["WORLD_SIZE"],
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
        ),
        (
            Launcher::OpenMpi,
            "OMPI_COMM_WORLD_RANK",
            &["OMPI_COMM_WORLD_SIZE"],
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
        (
            Launcher::Mpich,
            "PMI_RANK",
            &["PMI_SIZE"],
            "MPI_LOCALRANKID",
            "MPI_LOCALNRANKS",
        ),
        (
            Launcher::Slurm,
            "SLURM_PROCID",
            &["SLURM_NTASKS", "SLURM_NPROCS"],
            "SLURM_LOCALID",
            "SLURM_NTASKS_PER_NODE",
        ),
    ];
    for (launcher, rank_var, size_vars, local_var, local_size_var) in sources {
        let rank = parse_u32(get, rank_var)?;
        let size_var = size_vars.iter().find(|v| get(v).is_some()).copied();
        let size = match size_var {
            Some(v) => parse_u32(get, v)?,
            None => None,
        };
        let (rank, nranks) = match (rank, size) {
            (None, None) => continue,
            (Some(r), Some(n)) => (r, n),
            (Some(_), None) => {
                return Err(Error::InvalidArgument(format!(
                    "{rank_var} is set but {} is not",
                    size_vars.join(" / ")
                )));
            }
            (None, Some(_)) => {
                return Err(Error::InvalidArgument(format!(
                    "{} is set but {rank_var} is not",
                    size_var.unwrap_or(size_vars[0])
                )));
            }
        };
        if nranks == 0 {
            return Err(Error::InvalidArgument(format!(
                "{} is 0",
                size_var.unwrap_or(size_vars[0])
            )));
        }
        if rank >= nranks {
            return Err(Error::InvalidArgument(format!(
                "{rank_var}={rank} is out of range for {}={nranks}",
                size_var.unwrap_or(size_vars[0])
            )));
        }
        let local_rank = parse_u32(get, local_var)?;
        // Slurm writes per-node task counts like `2(x3),1` when they differ: only a plain
        // number is a usable hint.
        let local_size = get(local_size_var).and_then(|v| v.parse::<u32>().ok());
        let hint = local_rank.map(|local_rank| LocalHint {
            local_rank,
            local_size,
        });
        return Ok((launcher, rank, nranks, hint));
    }
    Err(Error::InvalidArgument(
        "no launcher variables: set RANK and WORLD_SIZE (torchrun), or start the program with \
         mpirun, mpiexec or srun"
            .into(),
    ))
}

fn root_from_master(get: &Get<'_>) -> Result<SocketAddr> {
    let Some(host) = get("MASTER_ADDR") else {
        return Err(Error::InvalidArgument(
            "no root address: set SYMCOMM_ID (from `UniqueId`), or MASTER_ADDR with MASTER_PORT \
             or SYMCOMM_PORT"
                .into(),
        ));
    };
    let port = match parse_u32(get, "SYMCOMM_PORT")? {
        Some(p) => u16::try_from(p)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| Error::InvalidArgument(format!("SYMCOMM_PORT={p} is not a port")))?,
        None => {
            let master = parse_u32(get, "MASTER_PORT")?.ok_or_else(|| {
                Error::InvalidArgument(
                    "MASTER_ADDR is set but neither SYMCOMM_PORT nor MASTER_PORT is".into(),
                )
            })?;
            // torch's TCPStore owns MASTER_PORT; the root takes the next one.
            u16::try_from(master)
                .ok()
                .and_then(|p| p.checked_add(1))
                .filter(|p| *p > 1)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "MASTER_PORT={master}: the root would listen on MASTER_PORT + 1, which is \
                         not a port; set SYMCOMM_PORT"
                    ))
                })?
        }
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::InvalidArgument(format!("MASTER_ADDR={host} does not resolve: {e}")))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| Error::InvalidArgument(format!("MASTER_ADDR={host} resolves to nothing")))
}

/// Parses `30`, `2.5`, `2.5s`, `500ms`, `2m`: a positive duration of at most a day.
pub(crate) fn parse_timeout(text: &str) -> std::result::Result<Duration, String> {
    let t = text.trim().to_ascii_lowercase();
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix("min") {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        (t.as_str(), 1.0)
    };
    let value: f64 = number.trim().parse().map_err(|_| {
        "expected seconds (`30`, `2.5`) or a unit (`500ms`, `10s`, `2m`)".to_owned()
    })?;
    let secs = value * scale;
    if !secs.is_finite() || secs <= 0.0 {
        return Err("the timeout must be positive".into());
    }
    if secs > MAX_INIT_TIMEOUT.as_secs_f64() {
        return Err("the timeout must be at most a day".into());
    }
    Ok(Duration::from_secs_f64(secs).max(Duration::from_millis(1)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn timeouts_parse_with_and_without_units() {
        assert_eq!(parse_timeout("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_timeout("2.5").unwrap(), Duration::from_millis(2500));
        assert_eq!(parse_timeout("2.5s").unwrap(), Duration::from_millis(2500));
        assert_eq!(
            parse_timeout(" 500ms ").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_timeout("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_timeout("1min").unwrap(), Duration::from_secs(60));
        for bad in ["", "abc", "-1", "0", "0ms", "nan", "inf", "1e9", "10h"] {
            assert!(parse_timeout(bad).is_err(), "{bad}");
        }
    }
}

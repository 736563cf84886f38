//! Bootstrap: the authenticated TCP rendezvous that turns N processes or threads into ranks
//! `0..N` that know each other.
//!
//! One rank creates a [`UniqueId`] (root address + 128-bit secret + protocol version) and hands
//! it to the others, or every rank reads launcher variables with
//! [`BootstrapConfig::from_env`]. Every rank then calls [`init`] / [`init_with`]: rank 0 becomes
//! the root and listens; the others connect to it, prove they know the secret, and learn the
//! rank table and their *local team* (the ranks on the same host). Each rank keeps its connection
//! to the root open ([`RootLink`]) for later liveness checks.
//!
//! # Protocol (version 1)
//!
//! Frames are `[type: u8][length: u32 BE][payload]`; the length is checked against a per-type
//! maximum before anything is allocated (see `wire.rs`). A connection goes:
//!
//! 1. client → root `Hello { "SYMC", version, client nonce (32 B) }`. A different version gets
//!    `Abort(VersionMismatch, root version)`.
//! 2. root → client `Challenge { version, root nonce (32 B) }`.
//! 3. client → root `Auth { rank, nranks, pid, address, host id, mac }` with
//!    `mac = HMAC-SHA256(secret, "symcomm/1/client" ‖ client nonce ‖ root nonce ‖ claims)`.
//!    The root checks it in constant time; a wrong MAC gets `Abort(AuthFailed)`.
//! 4. root → client `Welcome { HMAC(secret, "symcomm/1/root" ‖ nonces ‖ claims) }` — the client
//!    authenticates the root in turn — or an `Abort` for a rank that is out of range, claimed
//!    twice, or disagrees on `nranks` (the last two stop the whole rendezvous: every rank gets
//!    the error at once).
//! 5. Once every rank has joined: root → each client `Table { entries, HMAC(secret,
//!    "symcomm/1/table" ‖ nonces ‖ entries) }`. At the root's deadline instead:
//!    `Abort(Timeout, missing ranks)`.
//!
//! The secret never travels, the nonces make every proof single-use, and the labels keep the
//! three MACs apart. Nothing is encrypted: the rank table is public information.
//!
//! # Robustness and the admission guarantee
//!
//! Every connect, read and write has a deadline. The root's clock decides the rendezvous: at its
//! deadline it tells every waiting rank which ranks are missing (and, in its own error, which
//! ranks connections that failed authentication claimed to be). A non-root rank that hears
//! nothing waits at most half its timeout (5 s at most) longer for that verdict before reporting
//! a timeout on its own, so its call is bounded by 1.5 × the timeout.
//!
//! Anyone who can reach the root's port can connect to it, so the root treats every connection
//! as a stray until it has proved it knows the secret. It handshakes them all on one thread with
//! non-blocking sockets: an unauthenticated connection holds no thread or slot, only its socket
//! and the frame it is sending, and garbage, HTTP probes, port scans, huge length prefixes, wrong
//! secrets and other versions are dropped as soon as their bytes arrive and counted
//! ([`StrayStats`], with the first few drops logged one by one and the rest as one warning a
//! second). A connection has to deliver its hello within **1 s** of being accepted (a real rank
//! sends it at once) and its proof within the handshake timeout
//! ([`BootstrapConfig::handshake_timeout`], default [`DEFAULT_HANDSHAKE_TIMEOUT`]). The root
//! never turns a new connection away: it holds up to [`MAX_PENDING_HANDSHAKES`] unauthenticated
//! connections (at most a quarter of the process's file-descriptor limit), and when one more
//! arrives it makes room ([`StrayStats::overflow`]) in whichever half is over its share: while at
//! least half of the connections held still owe their hello, it drops the one that has owed its
//! hello the longest; otherwise the one that has owed its proof the longest.
//!
//! **Guarantee:** with the root full — holding `C` connections, `C` = [`MAX_PENDING_HANDSHAKES`]
//! (1024), or a quarter of the file-descriptor limit when that is smaller (256 under the common
//! soft limit of 1024) — a connection is dropped to make room only after at least `C / 2 - 1`
//! newer connections arrived while it owed its hello, or after `C / 2` other connections sent a
//! valid hello after it while it owes its proof. So connections that never send a valid hello —
//! silent, slow, garbage; any number of them, reopened as fast as the root drops them — never
//! push out a rank that has sent its hello (while fewer than `C / 2` ranks are between hello and
//! proof at once), and a rank's hello, sent microseconds after it connects, has the time that
//! `C / 2 - 1` new connections take to arrive; to push out a rank, an attacker must complete
//! `C / 2` valid hellos within one proof round trip of that rank. A rank dropped anyway (or that
//! finds the listener's queue full) reconnects until its init timeout. The guarantee is about
//! admission: it does not protect against an attacker who knows the secret, nor against a flood
//! that saturates the CPU or the network. There is no per-source-address limit: the ranks of a
//! job often all connect from one address (`127.0.0.1` under `symcomm launch`), and the eviction
//! order above protects them without one.

pub(crate) mod auth;
mod client;
mod config;
pub(crate) mod id;
mod net;
mod root;
pub(crate) mod wire;

use std::net::{IpAddr, TcpStream};
use std::time::{Duration, Instant};

pub(crate) use config::parse_timeout;
pub use config::{
    BootstrapConfig, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_INIT_TIMEOUT, Launcher, LocalHint,
};
pub use id::UniqueId;
pub(crate) use id::hex as hex_string;
pub use net::{free_port, host_identity};

use crate::{Error, Result};

/// Version of the bootstrap wire protocol. Ranks of different versions refuse each other with
/// [`Error::VersionMismatch`].
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest number of ranks a rendezvous accepts (bounds the rank-table frame).
pub const MAX_RANKS: u32 = 65536;

/// Most unauthenticated connections the root holds at once (fewer when a quarter of the
/// process's file-descriptor limit is smaller). A connection arriving when that many are held
/// makes room: the root drops the one that has owed its hello the longest while at least half
/// owe their hello, else the one that has owed its proof the longest, and counts it as
/// [`StrayStats::overflow`]; see the admission guarantee in the [module docs](self).
pub const MAX_PENDING_HANDSHAKES: usize = 1024;

/// One rank as the rendezvous saw it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RankInfo {
    /// The rank.
    pub rank: u32,
    /// Its host identity (equal identities = same host = same local team).
    pub host_id: String,
    /// The address its bootstrap traffic uses: for rank 0 the root's listening address, for the
    /// others the source address of their connection to the root (the interface of
    /// `SYMCOMM_SOCKET_IFNAME`, or the one that routes to the root).
    pub addr: IpAddr,
    /// Its process id.
    pub pid: u32,
}

/// The ranks that share this rank's host, in rank order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalTeam {
    ranks: Vec<u32>,
    index: u32,
}

impl LocalTeam {
    /// Builds the team of `rank` from a rank table: every rank with the same host identity.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `rank` is not in the table.
    pub fn from_table(table: &[RankInfo], rank: u32) -> Result<Self> {
        let me = table
            .iter()
            .find(|e| e.rank == rank)
            .ok_or_else(|| Error::InvalidArgument(format!("rank {rank} is not in the table")))?;
        let mut ranks: Vec<u32> = table
            .iter()
            .filter(|e| e.host_id == me.host_id)
            .map(|e| e.rank)
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        let index = ranks.iter().position(|&r| r == rank).unwrap_or(0) as u32;
        Ok(LocalTeam { ranks, index })
    }

    /// Global ranks on this host, ascending.
    pub fn ranks(&self) -> &[u32] {
        &self.ranks
    }

    /// This rank's index in [`LocalTeam::ranks`] (its local rank).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Number of ranks on this host.
    pub fn size(&self) -> u32 {
        self.ranks.len() as u32
    }

    /// Whether `rank` is on this host.
    pub fn contains(&self, rank: u32) -> bool {
        self.ranks.binary_search(&rank).is_ok()
    }
}

/// Connections the root dropped during a rendezvous, by reason (all zero on non-root ranks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StrayStats {
    /// Closed before sending a byte (port scans, health checks).
    pub closed_early: u32,
    /// Not a symcomm frame: unknown type, bad magic, oversized length, truncated or undecodable
    /// payload (HTTP requests, random bytes, 4 GiB length prefixes).
    pub malformed: u32,
    /// Did not send its hello within 1 s, or its proof within the handshake timeout, or was
    /// still handshaking when the rendezvous ended (slow writers, silent connections).
    pub timed_out: u32,
    /// Spoke the protocol but failed authentication (wrong secret).
    pub auth_failed: u32,
    /// Spoke another protocol version.
    pub version_mismatch: u32,
    /// Authenticated but claimed a rank outside `0..nranks`.
    pub bad_rank: u32,
    /// Dropped to make room for a newer connection while [`MAX_PENDING_HANDSHAKES`]
    /// unauthenticated connections were held, or when the root ran out of file descriptors
    /// (see the admission guarantee in the [module docs](self)).
    pub overflow: u32,
}

impl StrayStats {
    /// All dropped connections.
    pub fn total(&self) -> u32 {
        self.closed_early
            + self.malformed
            + self.timed_out
            + self.auth_failed
            + self.version_mismatch
            + self.bad_rank
            + self.overflow
    }
}

/// The live connections a rank keeps after the rendezvous: every non-root rank to the root, the
/// root to every other rank. A closed connection (EOF) means the peer is gone; later versions
/// run heartbeats over these links.
#[derive(Debug)]
#[non_exhaustive]
pub enum RootLink {
    /// Rank 0: one stream per rank (`peers[r]`; `None` at index 0).
    Root {
        /// Streams indexed by rank.
        peers: Vec<Option<TcpStream>>,
    },
    /// Ranks 1..N: the stream to the root.
    Rank {
        /// The stream to rank 0.
        root: TcpStream,
    },
}

impl RootLink {
    /// The stream to the root (non-root ranks).
    pub fn root_stream(&self) -> Option<&TcpStream> {
        match self {
            RootLink::Rank { root } => Some(root),
            RootLink::Root { .. } => None,
        }
    }

    /// The root's stream to `rank` (root only).
    pub fn peer_stream(&self, rank: u32) -> Option<&TcpStream> {
        match self {
            RootLink::Root { peers } => peers.get(rank as usize).and_then(Option::as_ref),
            RootLink::Rank { .. } => None,
        }
    }
}

/// The outcome of a successful rendezvous.
#[derive(Debug)]
pub struct Bootstrap {
    rank: u32,
    nranks: u32,
    table: Vec<RankInfo>,
    local: LocalTeam,
    link: RootLink,
    strays: StrayStats,
    id: UniqueId,
}

impl Bootstrap {
    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> u32 {
        self.nranks
    }

    /// Every rank's host identity and address, indexed by rank (identical on every rank).
    pub fn table(&self) -> &[RankInfo] {
        &self.table
    }

    /// The ranks on this rank's host.
    pub fn local_team(&self) -> &LocalTeam {
        &self.local
    }

    /// The live link(s) to the root or, on the root, to every rank.
    pub fn link(&self) -> &RootLink {
        &self.link
    }

    /// Connections the root dropped during the rendezvous (zero on other ranks).
    pub fn strays(&self) -> StrayStats {
        self.strays
    }

    /// The id this rendezvous used.
    pub fn id(&self) -> &UniqueId {
        &self.id
    }

    /// Gives up the link (to hand it to a longer-lived owner).
    pub fn into_link(self) -> RootLink {
        self.link
    }

    fn new(
        config: &BootstrapConfig,
        table: Vec<RankInfo>,
        link: RootLink,
        strays: StrayStats,
    ) -> Result<Self> {
        let local = LocalTeam::from_table(&table, config.rank)?;
        if let Some(hint) = config.local_hint {
            let size_differs = hint.local_size.is_some_and(|s| s != local.size());
            if hint.local_rank != local.index() || size_differs {
                tracing::warn!(
                    target: "symcomm::bootstrap",
                    "rank {}: the launcher ({:?}) says local rank {}{}, but host identities give \
                     local rank {} of {} (ranks {:?}); the host identities win (set \
                     SYMCOMM_HOST_ID to override them)",
                    config.rank,
                    config.launcher,
                    hint.local_rank,
                    hint.local_size.map(|s| format!(" of {s}")).unwrap_or_default(),
                    local.index(),
                    local.size(),
                    local.ranks()
                );
            }
        }
        Ok(Bootstrap {
            rank: config.rank,
            nranks: config.nranks,
            table,
            local,
            link,
            strays,
            id: config.id.clone(),
        })
    }
}

/// Joins the rendezvous of `id` as `rank` of `nranks`; rank 0 is the root.
///
/// `timeout` bounds the whole call (`None`: `SYMCOMM_INIT_TIMEOUT`, else
/// [`DEFAULT_INIT_TIMEOUT`]). `SYMCOMM_HOST_ID` and `SYMCOMM_SOCKET_IFNAME` are read from the
/// environment; use [`init_with`] to set everything explicitly. Every rank must call this
/// concurrently (threads or processes) with the same `id` and `nranks`.
///
/// # Errors
/// - [`Error::InvalidArgument`]: rank out of range, `nranks` 0, a bad environment value — nothing
///   was sent.
/// - [`Error::AuthFailed`]: this rank's secret differs from the root's (or the root's from ours).
/// - [`Error::InitTimeout`]: not every rank joined in time; names the missing ranks (and, on the
///   root, the ranks claimed by connections that failed authentication).
/// - [`Error::VersionMismatch`], [`Error::Bootstrap`] (duplicate rank, nranks disagreement,
///   protocol error, lost connection), [`Error::Io`] (bind / connect failures).
pub fn init(id: &UniqueId, rank: u32, nranks: u32, timeout: Option<Duration>) -> Result<Bootstrap> {
    let mut config = BootstrapConfig::new(id.clone(), rank, nranks);
    let env = |name: &str| crate::config::raw_value(name);
    config.apply_overrides(&env)?;
    if let Some(t) = timeout {
        config.timeout = t;
    }
    init_with(&config)
}

/// Joins the rendezvous described by `config`; see [`init`].
///
/// # Errors
/// As [`init`].
pub fn init_with(config: &BootstrapConfig) -> Result<Bootstrap> {
    let start = Instant::now();
    config.validate()?;
    let host_id = match &config.host_id {
        Some(h) => h.clone(),
        None => host_identity(),
    };
    tracing::debug!(
        target: "symcomm::bootstrap",
        "rank {}/{}: rendezvous with root {} (secret fingerprint {}, timeout {:?}, host {host_id})",
        config.rank,
        config.nranks,
        config.id.addr(),
        config.id.fingerprint(),
        config.timeout
    );
    let result = if config.rank == 0 {
        root::run(config, host_id, start)
    } else {
        client::run(config, host_id, start)
    };
    match &result {
        Ok(b) => tracing::info!(
            target: "symcomm::init",
            "rank {}/{}: bootstrap done in {:.1} ms; local team {:?} (local rank {})",
            config.rank,
            config.nranks,
            start.elapsed().as_secs_f64() * 1e3,
            b.local_team().ranks(),
            b.local_team().index()
        ),
        Err(e) => tracing::warn!(
            target: "symcomm::bootstrap",
            "rank {}/{}: bootstrap failed after {:.1} ms: {e}",
            config.rank,
            config.nranks,
            start.elapsed().as_secs_f64() * 1e3
        ),
    }
    result
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn entry(rank: u32, host: &str) -> RankInfo {
        RankInfo {
            rank,
            host_id: host.into(),
            addr: "127.0.0.1".parse().unwrap(),
            pid: 1,
        }
    }

    #[test]
    fn local_teams_group_ranks_by_host() {
        let table: Vec<RankInfo> = (0..6)
            .map(|r| entry(r, if r % 2 == 0 { "a" } else { "b" }))
            .collect();
        let t = LocalTeam::from_table(&table, 3).unwrap();
        assert_eq!(t.ranks(), &[1, 3, 5]);
        assert_eq!((t.index(), t.size()), (1, 3));
        assert!(t.contains(5) && !t.contains(4));
        assert!(LocalTeam::from_table(&table, 9).is_err());
    }

    #[test]
    fn public_types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<UniqueId>();
        check::<BootstrapConfig>();
        check::<Bootstrap>();
        check::<RootLink>();
        check::<crate::Error>();
    }
}

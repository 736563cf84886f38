//! Splitting a communicator ([`Communicator::split`], NCCL's `ncclCommSplit`): the ranks that
//! pass the same color form a new communicator, ranked by key.
//!
//! One host-side all-gather on the parent's control plane carries every rank's color, key and a
//! port its id reserved; then each color's first member (lowest key, then lowest parent rank)
//! is the new root, listening on the port it reserved, and the members join it as an ordinary
//! [`Communicator::init_with`]. The new secret is derived from the parent's
//! ([`Lineage`]) so it never travels: only the members of the parent can compute it, and
//! each split (counted per communicator, the same on every rank because splits are collective)
//! and color gets its own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::payload::{self, SplitRequest, Tag};
use super::{Communicator, Device, peers_succeeded};
use crate::Result;
use crate::backend::Backend;
use crate::bootstrap::id::Secret;
use crate::bootstrap::{BootstrapConfig, UniqueId, auth};

/// What a communicator made from this one inherits: key material for its secret and the
/// bootstrap settings this one was made with.
pub(crate) struct Lineage {
    /// Derived from the parent's secret (never the secret itself).
    key: Secret,
    host_id: Option<String>,
    ifname: Option<String>,
    timeout: Duration,
    handshake_timeout: Option<Duration>,
    authenticated: bool,
    /// Splits so far (the same count on every rank: splits are collective).
    splits: AtomicU64,
}

impl Lineage {
    pub(crate) fn new(config: &BootstrapConfig) -> Self {
        Lineage {
            key: auth::derive_secret(config.id.secret(), b"split key"),
            host_id: config.host_id.clone(),
            ifname: config.ifname.clone(),
            timeout: config.timeout,
            handshake_timeout: config.handshake_timeout,
            authenticated: config.authenticated,
            splits: AtomicU64::new(0),
        }
    }

    /// The secret of split number `split`'s communicator of `color`.
    fn secret(&self, split: u64, color: u32) -> Secret {
        let mut purpose = Vec::with_capacity(20);
        purpose.extend_from_slice(b"split");
        purpose.extend_from_slice(&split.to_be_bytes());
        purpose.extend_from_slice(&color.to_be_bytes());
        auth::derive_secret(&self.key, &purpose)
    }

    fn config(&self, id: UniqueId, rank: u32, nranks: u32) -> BootstrapConfig {
        let mut config = BootstrapConfig::new(id, rank, nranks);
        config.host_id.clone_from(&self.host_id);
        config.ifname.clone_from(&self.ifname);
        config.timeout = self.timeout;
        config.handshake_timeout = self.handshake_timeout;
        config.authenticated = self.authenticated;
        config
    }
}

impl Communicator {
    /// Splits this communicator: the ranks passing the same `color` form a new communicator,
    /// ranked by `key` (ties by their rank here), on the same kind of device with the same
    /// options. A rank passing `None` joins none and gets `Ok(None)`. Collective: every rank of
    /// this communicator calls it, in the same order relative to its other collective calls.
    /// This communicator is unchanged and stays usable.
    ///
    /// # Errors
    /// [`Error::PeerFailed`](crate::Error::PeerFailed) when another rank could not take part (e.g. no port to listen
    /// on); the errors of [`Communicator::init_with`] for the new communicator (every member
    /// gets one: a member that fails makes the others time out within the init timeout, or
    /// fail at once when the failure is reported).
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Arc<Communicator>>> {
        let split = self.lineage.splits.fetch_add(1, Ordering::Relaxed);
        let me = self.rank;
        // Every member reserves a port on its bootstrap address: the one that comes first in
        // its color becomes the root (one round instead of two).
        let reserved = color
            .map(|c| {
                let ip = self.table[me as usize].addr;
                UniqueId::reserve(ip, self.lineage.secret(split, c))
            })
            .transpose();
        let request = reserved.as_ref().map(|id| SplitRequest {
            color,
            key,
            port: id.as_ref().map_or(0, |id| id.addr().port()),
        });
        let all = self.gather(
            Tag::Split,
            "split",
            &payload::encode_split_request(&request),
            payload::decode_split_request,
        )?;
        let reserved = reserved?;
        let all = peers_succeeded("split", all)?;
        let Some(color) = color else {
            return Ok(None);
        };
        let mut members: Vec<(i32, u32)> = all
            .iter()
            .zip(0u32..)
            .filter(|(r, _)| r.color == Some(color))
            .map(|(r, rank)| (r.key, rank))
            .collect();
        members.sort_unstable();
        // This rank is a member (its own request has this color): its place is the number of
        // members before it.
        let new_rank = members.iter().filter(|&&m| m < (key, me)).count() as u32;
        let root = members[0].1;
        let id = match reserved {
            // The root listens where it reserved; the others connect there.
            Some(id) if root == me => id,
            _ => {
                let addr = SocketAddr::new(self.table[root as usize].addr, all[root as usize].port);
                UniqueId::with_secret(addr, self.lineage.secret(split, color))
            }
        };
        let device = match &self.backend {
            Backend::Cuda(d) => Device::Cuda(d.ordinal()),
            Backend::Emu => Device::Emu,
        };
        let config = self.lineage.config(id, new_rank, members.len() as u32);
        tracing::info!(
            target: "symcomm::init",
            "rank {me}/{}: split {split}, color {color}: rank {new_rank}/{} of the new communicator",
            self.nranks,
            members.len()
        );
        Communicator::init_with(&config, device, &self.options).map(Some)
    }
}

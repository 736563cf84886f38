//! Joining a communicator: the bootstrap rendezvous, the control plane, the backend (agreed on
//! by every rank), the device checks (same kind of device everywhere, peer access between the
//! GPUs, ranks sharing a GPU), the local team's fd-passing links and the signal area.

use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use symcomm_device::layout::SignalLayout;

use super::control::{Control, ControlTiming};
use super::fdpass::{self, Listener, LocalLinks};
use super::launch_order::LaunchOrder;
use super::memory::{ControlBlock, RankSlots};
use super::payload::{self, DeviceDesc, Tag};
use super::split::Lineage;
use super::{CommOptions, Communicator, Device, coll, peers_succeeded};
use crate::backend::{Backend, cuda};
use crate::bootstrap::{self, BootstrapConfig, UniqueId};
use crate::config::raw_value;
use crate::stream::Kernel;
use crate::{Error, Result};

impl Communicator {
    /// Joins communicator `id` as `rank` of `nranks` on `device`. Collective: every rank calls
    /// it concurrently (threads or processes). Settings not given here come from the
    /// environment: `SYMCOMM_INIT_TIMEOUT`, `SYMCOMM_HOST_ID`, `SYMCOMM_SOCKET_IFNAME`,
    /// `SYMCOMM_TIMEOUT`, `SYMCOMM_HEARTBEAT`, `SYMCOMM_PEER_TIMEOUT`.
    ///
    /// # Errors
    /// The bootstrap's ([`crate::bootstrap::init`]: [`Error::AuthFailed`],
    /// [`Error::InitTimeout`] naming the missing ranks, ...), [`Error::NoDriver`] /
    /// [`Error::Cuda`] for a CUDA device, [`Error::PeerFailed`] when another rank failed its
    /// part of init.
    pub fn init(id: &UniqueId, rank: u32, nranks: u32, device: Device) -> Result<Arc<Self>> {
        let mut config = BootstrapConfig::new(id.clone(), rank, nranks);
        config.apply_overrides(&|name: &str| raw_value(name))?;
        Self::init_with(&config, device, &CommOptions::from_env()?)
    }

    /// Joins the communicator the launcher describes: [`BootstrapConfig::from_env`] (torchrun,
    /// `symcomm launch`, Open MPI, MPICH, Slurm variables, `SYMCOMM_ID` / `SYMCOMM_SECRET`),
    /// [`Device::from_env`] (`SYMCOMM_DEVICE`) and [`CommOptions::from_env`].
    ///
    /// # Errors
    /// As [`Self::init`], and [`Error::InvalidArgument`] for missing or malformed variables.
    pub fn from_env() -> Result<Arc<Self>> {
        let config = BootstrapConfig::from_env()?;
        Self::init_with(&config, Device::from_env()?, &CommOptions::from_env()?)
    }

    /// Joins the communicator described by `config` on `device` with `options`.
    ///
    /// # Errors
    /// As [`Self::init`].
    pub fn init_with(
        config: &BootstrapConfig,
        device: Device,
        options: &CommOptions,
    ) -> Result<Arc<Self>> {
        options.validate()?;
        // Tunables read later by the collectives: a bad value is refused now, before the
        // rendezvous, not at the first collective.
        crate::tune::algo_from_env()?;
        coll::staging_bytes_from_env()?;
        let start = Instant::now();
        let boot = bootstrap::init_with(config)?;
        let rank = boot.rank();
        let nranks = boot.nranks();
        let table = boot.table().to_vec();
        let local = boot.local_team().clone();
        let timing = ControlTiming {
            heartbeat: options.heartbeat,
            peer_timeout: options.peer_timeout,
            op_timeout: config.timeout,
        };
        // The backend opens after the rendezvous (Auto needs the local rank); its result is
        // agreed on below, so a rank that cannot open its GPU fails every rank's init.
        let backend = device.open(local.index());
        let block = match &backend {
            Ok(b) => ControlBlock::new(b).map(Arc::new),
            Err(_) => ControlBlock::new(&Backend::Emu).map(Arc::new),
        }?;
        let on_fault = {
            let block = Arc::clone(&block);
            Box::new(move |_lost: u32| block.raise_abort())
        };
        let control = Control::start(rank, nranks, boot.into_link(), timing, on_fault)?;
        let backend_name = backend.as_ref().map(Backend::name).unwrap_or_default();
        // symcomm's own kernels, loaded before the agreement below: no rank launches before
        // every rank of the process has them (loading code while a peer's kernel waits for this
        // rank can hang on a shared GPU: see `Kernel`).
        let builtins = match &backend {
            Ok(b) => Kernel::preload(b, &crate::DEVICE_IMAGE),
            Err(_) => Ok(Vec::new()),
        };
        let (backend, builtins, status) = match (backend, builtins) {
            (Ok(b), Ok(k)) => (b, k, Ok(())),
            (Ok(b), Err(e)) => (b, Vec::new(), Err(e)),
            (Err(e), _) => (Backend::Emu, Vec::new(), Err(e)),
        };
        let mut comm = Communicator {
            rank,
            nranks,
            backend,
            table,
            local,
            options: options.clone(),
            op_timeout: config.timeout,
            gpu_ranks: 1,
            gpu_ranks_in_process: 1,
            order: None,
            group: {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                config.id.to_string().hash(&mut h);
                h.finish()
            },
            coll: coll::CollState::default(),
            signals: None,
            slots: RankSlots::one_host(nranks),
            links: None,
            exchange_seq: Mutex::new(0),
            lineage: Lineage::new(config),
            _builtins: builtins,
            hosts: std::sync::OnceLock::new(),
            control,
            block,
            me: Weak::new(),
        };
        comm.agree(Tag::Init, "opening the device", status)?;
        comm.check_devices()?;
        comm.connect_local_team()?;
        if !comm.spans_one_host() {
            // Only this host's ranks' copies are mapped (windows, signal area).
            let slots = RankSlots::across_hosts(&comm.backend, nranks, comm.local.ranks());
            comm.slots = comm.agree(Tag::Init, "placing this host's ranks", slots)?;
        }
        // Signal words (for every rank of the communicator) and the LL area
        // (symcomm_device::layout).
        let bytes = SignalLayout::new(nranks).stride;
        comm.signals = Some(comm.alloc_flat(Ok(bytes), 16, "signal area")?);
        tracing::info!(
            target: "symcomm::init",
            "rank {rank}/{nranks}: communicator ready on {backend_name} in {:.1} ms (local team {:?})",
            start.elapsed().as_secs_f64() * 1e3,
            comm.local.ranks()
        );
        let comm = Arc::new_cyclic(|me| {
            comm.me = Weak::clone(me);
            comm
        });
        if !comm.spans_one_host() {
            comm.set_up_hosts();
        }
        Ok(comm)
    }

    /// Every rank of the team uses the same kind of device, and on CUDA every GPU can reach
    /// every other rank's GPU (peer access); both checked on every rank, failing them all.
    fn check_devices(&mut self) -> Result<()> {
        let uuid = match &self.backend {
            Backend::Emu => None,
            Backend::Cuda(d) => Some(cuda::gpu_uuid(d.ordinal()).unwrap_or([0; 16])),
        };
        let mine = uuid.map_or(DeviceDesc::Emu, DeviceDesc::Cuda);
        let all = self.gather(
            Tag::Devices,
            "comparing devices",
            &payload::encode_device(&mine),
            payload::decode_device,
        )?;
        // Ranks of the local team on the same device as this one (all the same kind here, or
        // the check below fails).
        let sharing: Vec<u32> = self
            .local
            .ranks()
            .iter()
            .copied()
            .filter(|&r| all.get(r as usize) == Some(&mine))
            .collect();
        self.gpu_ranks = sharing.len().max(1) as u32;
        let pid = |r: u32| self.table.get(r as usize).map(|t| t.pid);
        let in_process: Vec<u32> = sharing
            .iter()
            .copied()
            .filter(|&r| pid(r) == pid(self.rank))
            .collect();
        self.gpu_ranks_in_process = in_process.len().max(1) as u32;
        // A GPU's streams may share hardware queues (nothing tells which); the emulator's share
        // them only when CUDA_DEVICE_MAX_CONNECTIONS is set.
        let (ordered, spin) = match &self.backend {
            Backend::Cuda(_) => (true, true),
            Backend::Emu => (crate::backend::emu::queue::queues_shared(), false),
        };
        if ordered {
            self.order = LaunchOrder::join(self.group, uuid, in_process, self.rank, spin);
        }
        if let Backend::Cuda(d) = &self.backend {
            self.warn_sharing(d.ordinal(), &sharing);
        }
        let kind = |d: &DeviceDesc| match d {
            DeviceDesc::Cuda(_) => "a CUDA GPU",
            DeviceDesc::Emu => "the emulator",
        };
        if let Some((peer, theirs)) = all
            .iter()
            .enumerate()
            .find(|(_, d)| std::mem::discriminant(*d) != std::mem::discriminant(&mine))
        {
            return Err(Error::Mismatch {
                rank: self.rank,
                peer: peer as u32,
                what: format!(
                    "rank {} runs on {}, rank {peer} on {}: every rank of a communicator needs the same kind of device",
                    self.rank,
                    kind(&mine),
                    kind(theirs)
                ),
            });
        }
        let reachable = match (&self.backend, &uuid) {
            (Backend::Cuda(d), Some(uuid)) => Self::peer_access(d.ordinal(), uuid, &all),
            _ => Ok(()),
        };
        self.agree(Tag::P2p, "checking peer access between the GPUs", reachable)
    }

    /// Warnings for ranks that share GPU `ordinal` (`sharing`, this rank included) where the
    /// hardware would serialize them: fewer hardware queues (`CUDA_DEVICE_MAX_CONNECTIONS`,
    /// default 8) than the streams of this process's ranks on it (symcomm orders its own
    /// launches among them, `launch_order.rs`, but not graph replays), or ranks in other
    /// processes without MPS (contexts of different processes are time-sliced, never
    /// concurrent: each barrier costs a context switch, and a kernel waiting for a peer's runs
    /// out its time slice).
    fn warn_sharing(&self, ordinal: usize, sharing: &[u32]) {
        if sharing.len() < 2 {
            return;
        }
        let streams = self.gpu_ranks_in_process as usize * coll::MAX_STREAMS;
        let connections = crate::backend::emu::queue::connections(
            std::env::var(crate::backend::emu::queue::CONNECTIONS_VAR)
                .ok()
                .as_deref(),
        );
        if self.gpu_ranks_in_process > 1 && connections < streams {
            tracing::warn!(
                target: "symcomm::init",
                "rank {}: {} ranks of this process share GPU {ordinal} with up to {streams} \
                 collective streams through {connections} hardware queues \
                 (CUDA_DEVICE_MAX_CONNECTIONS): symcomm orders its own launches among them, but \
                 graphs replayed on several ranks at once and kernels that wait for peers \
                 launched outside symcomm (Stream::launch, Triton, CUDA) are not ordered, and \
                 may wait for each other in a shared queue until their timeout; set \
                 CUDA_DEVICE_MAX_CONNECTIONS={streams} or more for those",
                self.rank,
                self.gpu_ranks_in_process
            );
        }
        let me = self.table.get(self.rank as usize).map(|r| r.pid);
        let other_processes = sharing
            .iter()
            .filter(|&&r| self.table.get(r as usize).map(|i| i.pid) != me)
            .count();
        if other_processes > 0 && !cuda::mps_enabled(ordinal).unwrap_or(false) {
            tracing::warn!(
                target: "symcomm::init",
                "rank {}: GPU {ordinal} is shared with {other_processes} rank(s) in other \
                 processes without MPS: their kernels are time-sliced, not concurrent, so every \
                 barrier waits for a context switch; start the MPS daemon \
                 (nvidia-cuda-mps-control -d) or run the ranks as threads of one process",
                self.rank
            );
        }
    }

    /// Whether GPU `ordinal` (uuid `mine`) can access the GPU of every rank in `all` that is
    /// visible to this process (ranks on GPUs it cannot see are left to the driver's checks).
    fn peer_access(ordinal: usize, mine: &[u8; 16], all: &[DeviceDesc]) -> Result<()> {
        let info = cuda::probe()?;
        let uuids: Vec<Option<[u8; 16]>> = (0..info.devices.len())
            .map(|o| cuda::gpu_uuid(o).ok())
            .collect();
        for (r, desc) in all.iter().enumerate() {
            let DeviceDesc::Cuda(theirs) = desc else {
                continue;
            };
            if theirs == mine || theirs.iter().all(|&b| b == 0) {
                continue;
            }
            let Some(o) = uuids.iter().position(|u| u.as_ref() == Some(theirs)) else {
                continue;
            };
            let ok = info
                .peer_access
                .get(ordinal)
                .and_then(|row| row.get(o))
                .copied()
                .unwrap_or(false);
            if !ok {
                return Err(Error::Unsupported(format!(
                    "GPU {ordinal} cannot access GPU {o} of rank {r} (no peer-to-peer access): \
                     windows need NVLink or PCIe P2P between the GPUs of a host"
                )));
            }
        }
        Ok(())
    }

    /// Connects the local team's fd-passing sockets (leader listens, the others connect).
    fn connect_local_team(&mut self) -> Result<()> {
        let team = self.local.ranks().to_vec();
        if team.len() > fdpass::MAX_LOCAL {
            return Err(Error::Unsupported(format!(
                "{} ranks on one host (at most {})",
                team.len(),
                fdpass::MAX_LOCAL
            )));
        }
        let alone = team.len() == 1;
        if alone && self.spans_one_host() {
            self.links = Some(LocalLinks::Alone);
            return Ok(());
        }
        // Across hosts every rank takes part in the steps below (they are collective over the
        // whole communicator), also one alone on its host.
        let leader = team[0];
        let listener = if self.rank == leader && !alone {
            Some(Listener::open(team.len()))
        } else {
            None
        };
        // The leader's socket name (or why it has none); the others send an empty one.
        let name = match &listener {
            Some(l) => l.as_ref().map(|l| l.name().to_vec()),
            None => Ok(Vec::new()),
        };
        let all = self.gather(
            Tag::Links,
            "connecting the local team",
            &payload::encode_socket_name(&name),
            payload::decode_socket_name,
        )?;
        let opening = "opening the local socket";
        let theirs = peers_succeeded(opening, all)?
            .into_iter()
            .nth(leader as usize)
            .ok_or_else(|| Error::PeerFailed {
                rank: leader,
                what: opening.into(),
                message: "no socket name from the local leader".into(),
            })?;
        let deadline = Instant::now() + self.op_timeout;
        let links = match listener {
            _ if alone => Ok(LocalLinks::Alone),
            Some(l) => LocalLinks::accept(l?, &team, &self.table, deadline),
            None => LocalLinks::connect(&theirs, self.rank, &self.table[leader as usize], deadline),
        };
        self.links = Some(self.agree(Tag::LinksDone, "connecting the local team", links)?);
        Ok(())
    }
}

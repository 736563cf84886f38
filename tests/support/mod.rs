//! Shared by the integration tests that include it (`#[path = "support/mod.rs"] mod support;`,
//! and from `cli/tests/comm_procs.rs` and `cli/tests/reliability.rs`): team fixtures here,
//! `values` (the collectives' value model), `cases` (one built-in collective call on a team of
//! ranks, GPU or emulator, and its bit-exact check), `procs` (ranks as processes, fault runs), `flood`
//! (the bootstrap port flood), `leaks` (init/destroy cycles and the counts they must keep),
//! `rmsnorm` (the fused RMSNorm kernels' parameter), `ring` (the put ring across hosts).

// Each test crate that includes this module uses only part of it (comm.rs and comm_procs.rs the
// blocking all-reduce, emu_collectives.rs and coll.rs the value model, emu_faults.rs the kinds,
// bootstrap.rs the flood), so the rest would be dead code there.
#![allow(dead_code, clippy::unwrap_used, clippy::panic)]

pub(crate) mod cases;
pub(crate) mod flood;
pub(crate) mod leaks;
pub(crate) mod netns;
pub(crate) mod procs;
pub(crate) mod ring;
pub(crate) mod rmsnorm;
pub(crate) mod values;

use std::ffi::c_void;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use symcomm::abi::*;
use symcomm::bootstrap::BootstrapConfig;
use symcomm::{CommOptions, Communicator, DEVICE_IMAGE, Device, Result, UniqueId, Window};

/// The options of the team fixtures: a 30 s device timeout (a hang fails the test, not CI).
pub(crate) fn test_options() -> CommOptions {
    CommOptions::default().with_device_timeout(Duration::from_secs(30))
}

/// Runs `body(comm)` on `nranks` ranks as threads of one emulator communicator (loopback
/// rendezvous, one simulated host, [`test_options`]); returns each rank's result in rank order.
/// `body` owns its rank's handle: dropping it (and every window) destroys that communicator.
pub(crate) fn with_ranks<T: Send>(
    nranks: u32,
    body: impl Fn(Arc<Communicator>) -> T + Sync,
) -> Vec<T> {
    with_ranks_using(nranks, &test_options(), body)
}

/// [`with_ranks`] with communicator options `options`.
pub(crate) fn with_ranks_using<T: Send>(
    nranks: u32,
    options: &CommOptions,
    body: impl Fn(Arc<Communicator>) -> T + Sync,
) -> Vec<T> {
    try_with_ranks_on(Device::Emu, nranks, options, |comm| Ok(body(comm)))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `body(comm)` on `nranks` ranks as threads of one process, each with its own
/// communicator on `device` (loopback rendezvous, one simulated host, `options`): each rank's
/// result in rank order, or the first failure as `rank r: ...` (init, `body`, or a panic).
/// The GPU checks run it on a GPU, the tests on the emulator.
pub(crate) fn try_with_ranks_on<T: Send>(
    device: Device,
    nranks: u32,
    options: &CommOptions,
    body: impl Fn(Arc<Communicator>) -> std::result::Result<T, String> + Sync,
) -> std::result::Result<Vec<T>, String> {
    try_with_ranks_on_hosts(device, &vec!["test-host"; nranks as usize], options, body)
}

/// [`try_with_ranks_on`] with rank `r` on simulated host `hosts[r]` (its `SYMCOMM_HOST_ID`):
/// ranks with different ids are on different hosts (UCX between them).
pub(crate) fn try_with_ranks_on_hosts<T: Send>(
    device: Device,
    hosts: &[&str],
    options: &CommOptions,
    body: impl Fn(Arc<Communicator>) -> std::result::Result<T, String> + Sync,
) -> std::result::Result<Vec<T>, String> {
    let options = vec![options.clone(); hosts.len()];
    try_with_ranks_on_hosts_using(device, hosts, &options, body)
}

/// [`try_with_ranks_on_hosts`] with rank `r`'s options `options[r]`.
pub(crate) fn try_with_ranks_on_hosts_using<T: Send>(
    device: Device,
    hosts: &[&str],
    options: &[CommOptions],
    body: impl Fn(Arc<Communicator>) -> std::result::Result<T, String> + Sync,
) -> std::result::Result<Vec<T>, String> {
    let nranks = hosts.len() as u32;
    let id = UniqueId::new_on(IpAddr::V4(Ipv4Addr::LOCALHOST)).map_err(|e| e.to_string())?;
    thread::scope(|s| {
        let handles: Vec<_> = (0..nranks)
            .map(|r| {
                let (id, body) = (&id, &body);
                s.spawn(move || {
                    let c = BootstrapConfig::new(id.clone(), r, nranks)
                        .with_timeout(Duration::from_secs(60))
                        .with_host_id(hosts[r as usize]);
                    let comm = Communicator::init_with(&c, device, &options[r as usize])
                        .map_err(|e| format!("init: {e}"))?;
                    body(comm)
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                h.join()
                    .unwrap_or_else(|_| Err("the rank's thread panicked".into()))
                    .map_err(|e| format!("rank {r}: {e}"))
            })
            .collect()
    })
}

/// Every collective kind, in code order.
pub(crate) const KINDS: [u32; 12] = [
    SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
    SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT,
    SYMCOMM_COLL_ALL_GATHER,
    SYMCOMM_COLL_REDUCE_SCATTER,
    SYMCOMM_COLL_BROADCAST,
    SYMCOMM_COLL_REDUCE,
    SYMCOMM_COLL_SCATTER,
    SYMCOMM_COLL_ALL_TO_ALL,
    SYMCOMM_COLL_ALL_REDUCE_LL,
    SYMCOMM_COLL_ALL_GATHER_LL,
    SYMCOMM_COLL_REDUCE_SCATTER_LL,
    SYMCOMM_COLL_BROADCAST_LL,
];

/// Elements of input and output per rank of collective `kind` on `n` ranks, in units of
/// `count` (the per-rank block size).
pub(crate) fn blocks(kind: u32, n: u64) -> (u64, u64) {
    match kind {
        SYMCOMM_COLL_ALL_GATHER | SYMCOMM_COLL_ALL_GATHER_LL => (1, n),
        SYMCOMM_COLL_REDUCE_SCATTER | SYMCOMM_COLL_REDUCE_SCATTER_LL | SYMCOMM_COLL_SCATTER => {
            (n, 1)
        }
        SYMCOMM_COLL_ALL_TO_ALL => (n, n),
        _ => (1, 1),
    }
}

/// Arguments of the built-in `symcomm_collective_f32` kernel for a grid-scope one-shot sum
/// all-reduce of `count` elements from `src` into `dst` (both at offset 0, barrier index 0).
pub(crate) fn one_shot_sum_f32(src: WindowHandleRaw, dst: WindowHandleRaw, count: u64) -> CollArgs {
    CollArgs {
        kind: SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT,
        dtype: SYMCOMM_DTYPE_F32,
        redop: SYMCOMM_REDOP_SUM,
        root: 0,
        scope: SYMCOMM_SCOPE_GRID,
        index: 0,
        count,
        src_offset: 0,
        dst_offset: 0,
        tile_stride: 0,
        src,
        dst,
        ..Default::default()
    }
}

/// One-shot all-reduce (sum, f32) of `count` elements from `src` into `dst` with the built-in
/// kernel on the emulator, blocking; then the communicator's error state.
pub(crate) fn all_reduce(
    comm: &Communicator,
    src: &Window<f32>,
    dst: &Window<f32>,
    count: u64,
) -> Result<()> {
    let mut dev = comm.device_handle()?;
    let mut args = one_shot_sum_f32(src.device_handle().raw(), dst.device_handle().raw(), count);
    let mut ptrs = [
        (&raw mut dev).cast::<c_void>(),
        (&raw mut args).cast::<c_void>(),
    ];
    // SAFETY: the kernel takes (DevComm, CollArgs) by value; the windows and the communicator
    // outlive this blocking launch.
    unsafe {
        symcomm::testing::emu::launch(
            &DEVICE_IMAGE,
            "symcomm_collective_f32",
            [2, 1, 1],
            [64, 1, 1],
            &mut ptrs,
        )
    }?;
    comm.check_error()
}

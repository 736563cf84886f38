//! Algorithm selection for the host collectives: an alpha–beta cost model per (collective,
//! algorithm, message size, rank count, backend), overridable with `SYMCOMM_ALGO`, and the launch
//! geometry of one call.
//!
//! # The model
//!
//! NCCL's form (`ncclTopoGetAlgoTime`): a latency term plus bytes over bandwidth. Here, per rank:
//!
//! ```text
//! time_us = launch_us + barriers × barrier_us
//!         + peer_bytes  / (1000 × peer_read_gbps)     (bytes read from other ranks' memory)
//!         + local_bytes / (1000 × local_gbps)         (bytes read or written in own memory)
//! ```
//!
//! (1 GB/s = 1000 bytes/µs.) The two bandwidth terms are added, not overlapped: a conservative
//! choice that keeps every prediction monotone in the message size. `S` is the nccl-tests message
//! size (the `size` column: `count × typesize` for all-reduce, broadcast, reduce and sendrecv;
//! `count × typesize × n` — the gathered output / the scattered input — for all-gather,
//! reduce-scatter, scatter and all-to-all), `n` the rank count and `b = S / n` one rank's block.
//! Counts are those of the device code in `include/symcomm/collectives.cuh`, out of place (the
//! in-place forms of one-shot all-reduce and all-to-all add a barrier per round and are not
//! modelled):
//!
//! | collective / algorithm | barriers | peer bytes        | local bytes   | why |
//! |---|---|---|---|---|
//! | all_reduce one_shot    | 2 | (n−1)·S           | 2·S           | every rank reads all n inputs, writes S |
//! | all_reduce two_shot    | 3 | 2·(n−1)·S/n       | (n+1)·S/n     | reduce own block (reads n blocks), barrier, gather n−1 blocks (²) |
//! | all_reduce ll          | 0 (+ hops) | 2·(n−1)·S | 2·S + 2·(n−1)·S | store S as lines (twice the bytes) into n−1 peers, read n−1 peers' lines locally, read S, write S (³) |
//! | all_gather direct      | 2 | (n−1)·b           | b + S         | read n−1 peer blocks, copy own, write S |
//! | reduce_scatter direct  | 2 | (n−1)·b           | 2·b           | read block r of every peer, write b |
//! | broadcast direct       | 2 | (n−1)·S           | 2·S           | n−1 ranks read S from the root: the root's egress is the bottleneck |
//! | reduce direct          | 2 | (n−1)·S           | 2·S           | the root reads every peer's S |
//! | scatter direct         | 2 | (n−1)·b           | 2·b           | n−1 ranks read b from the root (root egress) |
//! | all_to_all direct      | 2 | (n−1)·b           | b + S         | read one block from every peer and the own one, write S |
//! | sendrecv direct        | 2 | S (0 when n = 1)  | S (2·S, n = 1)| read S from the previous rank, write it |
//!
//! (²) The pull form's counts. The device code now pushes (reduce own block, store it into every
//! rank's output, barrier): 2 barriers, the same peer bytes, 2·b local bytes. With those counts
//! two-shot never costs more than one-shot in this model, at any size; the selection keeps the
//! pull form's (conservative) costs until GPU measurements of both say where the crossover
//! really is (`scripts/gpu-check` prints them per algorithm).
//!
//! (³) LL needs no barrier: its latency is one one-way trip (`ll_hop_us`) per round, and a round
//! moves at most `ll_round_bytes` of the message (each CTA 2040 bytes, [`LL_CTA_BYTES`]); so
//! `hops = max(1, ⌈S / ll_round_bytes⌉)`. It is offered up to [`LL_MAX_BYTES`].
//!
//! Every call is one kernel launch (one `launch_us`). `peer_read_gbps` is a rank's aggregate
//! bandwidth reading peers (NVLink ingress/egress on CUDA, shared across peers), so n−1 peers'
//! worth of bytes cost n−1 times one peer's.
//!
//! For all-reduce, two-shot minus one-shot is `barrier_us − S·(n−1)·((n−2)/(n·peer) + 1/(n·local))`
//! (bandwidths in bytes/µs): decreasing in S, so there is one crossover size, found by
//! [`all_reduce_crossover`]. With two ranks both read the same peer bytes and two-shot only saves
//! local traffic, so its crossover is far larger than with four or eight.
//!
//! The parameters ([`CUDA_PARAMS`], [`EMU_PARAMS`]): CUDA's from the figures of an H200
//! (`scripts/gpu-check`, ranks as threads on one GPU), the emulator's from `symcomm perf` on the
//! CPU; [`ModelParams`] is the one place to put measured figures.

use crate::{Error, Result, abi};

/// A collective operation of the host API (nccl-tests' names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank's input reduced, result on every rank.
    AllReduce,
    /// The root's input copied to every rank.
    Broadcast,
    /// Every rank's input reduced, result on the root.
    Reduce,
    /// Every rank's block gathered on every rank.
    AllGather,
    /// Block r of every rank's input reduced onto rank r.
    ReduceScatter,
    /// Block r of the root's input copied to rank r.
    Scatter,
    /// Block p of rank r's input copied to block r of rank p's output.
    AllToAll,
    /// Point to point (nccl-tests' ring: send to r+1, receive from r−1).
    SendRecv,
}

impl Collective {
    /// Every collective, in declaration order.
    pub const ALL: [Collective; 8] = [
        Collective::AllReduce,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Scatter,
        Collective::AllToAll,
        Collective::SendRecv,
    ];

    /// The name: `all_reduce`, `broadcast`, `reduce`, `all_gather`, `reduce_scatter`,
    /// `scatter`, `all_to_all`, `sendrecv`.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Scatter => "scatter",
            Collective::AllToAll => "all_to_all",
            Collective::SendRecv => "sendrecv",
        }
    }

    /// Parses a name as [`name`](Self::name) gives it, case-insensitively, also without `_` or
    /// with `-` (`allreduce`, `all-reduce`, nccl-tests' `alltoall`), and nccl-tests binary names
    /// (`all_reduce_perf`, `all_reduce_perf_mpi`, with or without a directory). `None` otherwise.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        let s = s.rsplit('/').next().unwrap_or(s).to_ascii_lowercase();
        let s = s.strip_suffix("_mpi").unwrap_or(&s);
        let s = s.strip_suffix("_perf").unwrap_or(s);
        let key = squash(s);
        Collective::ALL
            .into_iter()
            .find(|c| squash(c.name()) == key)
    }

    /// nccl-tests' busbw / algbw factor for `nranks` ranks (`reference/nccl.md` §3.2):
    /// all_reduce 2(n−1)/n; all_gather, reduce_scatter, scatter, all_to_all (n−1)/n;
    /// broadcast, reduce, sendrecv 1. One rank gives 0 for the (n−1) factors, as nccl-tests does;
    /// `nranks` 0 counts as 1.
    pub fn bus_factor(self, nranks: u32) -> f64 {
        let n = f64::from(nranks.max(1));
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather
            | Collective::ReduceScatter
            | Collective::Scatter
            | Collective::AllToAll => (n - 1.0) / n,
            Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1.0,
        }
    }

    /// Whether it takes a reduction operator: all_reduce, reduce, reduce_scatter.
    pub fn has_op(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
        )
    }

    /// Whether it takes a root rank: broadcast, reduce, scatter.
    pub fn has_root(self) -> bool {
        matches!(
            self,
            Collective::Broadcast | Collective::Reduce | Collective::Scatter
        )
    }
}

/// A device algorithm (named by mechanism, as in `include/symcomm/collectives.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// All-reduce: each rank reads every peer's input and reduces it itself (one step).
    OneShot,
    /// All-reduce: reduce-scatter then all-gather via peer loads (two steps).
    TwoShot,
    /// The one peer-pointer algorithm of the other collectives.
    Direct,
    /// All-reduce, all-gather, reduce-scatter and broadcast, low latency: data and flags in one
    /// store per 8 bytes, no barrier (small messages).
    Ll,
}

impl Algorithm {
    /// Every algorithm, in declaration order.
    pub const ALL: [Algorithm; 4] = [
        Algorithm::OneShot,
        Algorithm::TwoShot,
        Algorithm::Direct,
        Algorithm::Ll,
    ];

    /// The name: `one_shot`, `two_shot`, `direct`, `ll`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::OneShot => "one_shot",
            Algorithm::TwoShot => "two_shot",
            Algorithm::Direct => "direct",
            Algorithm::Ll => "ll",
        }
    }

    /// Parses a name as [`name`](Self::name) gives it, case-insensitively, also without `_` or
    /// with `-` (`oneshot`, `two-shot`). `None` otherwise (`auto` included: see [`parse_algo`]).
    pub fn parse(s: &str) -> Option<Self> {
        let key = squash(&s.trim().to_ascii_lowercase());
        Algorithm::ALL.into_iter().find(|a| squash(a.name()) == key)
    }

    /// The device kind code (`SYMCOMM_COLL_*`) running `coll` with this algorithm; `None` when
    /// the pair does not exist (two-shot all-gather, one-shot broadcast, direct all-reduce,
    /// anything for sendrecv, which is not a device collective).
    pub fn kind_code(self, coll: Collective) -> Option<u32> {
        match (coll, self) {
            (Collective::AllReduce, Algorithm::OneShot) => {
                Some(abi::SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT)
            }
            (Collective::AllReduce, Algorithm::TwoShot) => {
                Some(abi::SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT)
            }
            (Collective::AllReduce, Algorithm::Ll) => Some(abi::SYMCOMM_COLL_ALL_REDUCE_LL),
            (Collective::AllGather, Algorithm::Direct) => Some(abi::SYMCOMM_COLL_ALL_GATHER),
            (Collective::AllGather, Algorithm::Ll) => Some(abi::SYMCOMM_COLL_ALL_GATHER_LL),
            (Collective::ReduceScatter, Algorithm::Direct) => {
                Some(abi::SYMCOMM_COLL_REDUCE_SCATTER)
            }
            (Collective::ReduceScatter, Algorithm::Ll) => Some(abi::SYMCOMM_COLL_REDUCE_SCATTER_LL),
            (Collective::Broadcast, Algorithm::Direct) => Some(abi::SYMCOMM_COLL_BROADCAST),
            (Collective::Broadcast, Algorithm::Ll) => Some(abi::SYMCOMM_COLL_BROADCAST_LL),
            (Collective::Reduce, Algorithm::Direct) => Some(abi::SYMCOMM_COLL_REDUCE),
            (Collective::Scatter, Algorithm::Direct) => Some(abi::SYMCOMM_COLL_SCATTER),
            (Collective::AllToAll, Algorithm::Direct) => Some(abi::SYMCOMM_COLL_ALL_TO_ALL),
            _ => None,
        }
    }

    /// The algorithms available for `coll`, never empty: all-reduce `[OneShot, TwoShot, Ll]`
    /// (one-shot first: it wins ties and is the one-rank choice), all-gather, reduce-scatter and
    /// broadcast `[Direct, Ll]`, every other collective `[Direct]`.
    pub fn available(coll: Collective) -> &'static [Algorithm] {
        match coll {
            Collective::AllReduce => &[Algorithm::OneShot, Algorithm::TwoShot, Algorithm::Ll],
            Collective::AllGather | Collective::ReduceScatter | Collective::Broadcast => {
                &[Algorithm::Direct, Algorithm::Ll]
            }
            _ => &[Algorithm::Direct],
        }
    }
}

/// Lower case with `_` and `-` removed: the key names are compared by.
fn squash(s: &str) -> String {
    s.chars().filter(|&c| c != '_' && c != '-').collect()
}

/// The kind of device a communicator runs on, as far as tuning is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// CUDA GPUs.
    Cuda,
    /// The CPU emulator.
    Emu,
}

impl BackendKind {
    /// Both backends.
    pub const ALL: [BackendKind; 2] = [BackendKind::Cuda, BackendKind::Emu];

    /// `cuda` or `emu`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Emu => "emu",
        }
    }

    /// `a CUDA GPU` or `the emulator`, for messages.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            BackendKind::Cuda => "a CUDA GPU",
            BackendKind::Emu => "the emulator",
        }
    }
}

/// Parameters of the alpha–beta model for one backend (see the [module docs](self)): the one
/// place to put measured figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelParams {
    /// Kernel launch plus the host path of one call, µs.
    pub launch_us: f64,
    /// One cross-rank barrier (a signal round trip), µs.
    pub barrier_us: f64,
    /// One rank's aggregate bandwidth reading peers' memory (NVLink on CUDA), GB/s (1e9 B/s).
    pub peer_read_gbps: f64,
    /// One rank's local memory bandwidth (reads plus writes), GB/s (1e9 B/s).
    pub local_gbps: f64,
    /// One LL round's latency: a line's one-way trip to a peer (a store, then the peer's poll
    /// sees it), µs.
    pub ll_hop_us: f64,
    /// Bytes of a message one LL round moves across the grid ([`LL_CTA_BYTES`] per CTA times
    /// the CTAs an LL call typically runs on).
    pub ll_round_bytes: f64,
}

/// Data bytes one CTA moves per LL round: `SYMCOMM_LL_LINES − 1` lines (line 0 of a region is
/// the header) of 8 data bytes.
pub const LL_CTA_BYTES: u64 = (abi::SYMCOMM_LL_LINES as u64 - 1) * 8;

/// Largest all-reduce message the model offers to LL (beyond it LL costs a round per
/// [`ModelParams::ll_round_bytes`] and twice the bytes; one-shot and two-shot win there anyway).
pub const LL_MAX_BYTES: u64 = 1 << 20;

/// H200 figures (one H200, ranks as threads on it, `scripts/gpu-check` of 2026-12-04):
/// - `launch_us` 4.0: one rank's share of the measured floor (an empty collective launched by 4
///   ranks and waited for: 13.3 µs from the host); the same for every algorithm, so it moves no
///   crossover.
/// - `barrier_us` 2.0: a one-shot 8 KB all-reduce (two barriers) costs the floor + 4.1 µs.
/// - `peer_read_gbps` 360, `local_gbps` 4000: with every peer on the same GPU both are HBM, but
///   the measured crossover of one-shot and two-shot (4 ranks: equal up to 2 MB, two-shot 27 %
///   faster at 4 MB and 1.5x at 256 MB) is where these place it; NVLink peers are 360 GB/s.
/// - `ll_hop_us` 3.0 per round of 16 CTAs of [`LL_CTA_BYTES`] (`ll_round_bytes`; 4 ranks on an
///   H200 share the GPU's CTAs so that a call gets 16): the host collectives' LL all-reduce
///   (4 ranks) costs about 10 µs up to 32 KB (one round; one-shot 12–15 µs), then about 3 µs
///   per further round (512 KB: 56 µs, 2 MB: 198 µs).
pub const CUDA_PARAMS: ModelParams = ModelParams {
    launch_us: 4.0,
    barrier_us: 2.0,
    peer_read_gbps: 360.0,
    local_gbps: 4000.0,
    ll_hop_us: 3.0,
    ll_round_bytes: (16 * LL_CTA_BYTES) as f64,
};

/// Emulator defaults — rough placeholders: a launch starts an OS thread per CTA (~300 µs), a
/// barrier is a futex-style wait among threads of different processes (~50 µs), and emulated
/// threads move a few GB/s (peer memory is ordinary shared memory, slower than private data
/// because of cross-core cache traffic).
/// An LL round costs three barriers: every thread of every CTA polls its own lines, and on a
/// CPU those are OS threads that yield in turn (measured with `symcomm perf`, 4 ranks: LL slower
/// than one-shot from 512 bytes up), so the model never picks LL on the emulator (tests force it
/// with `SYMCOMM_ALGO=ll`). A round is [`EMU_MAX_CTAS`] CTAs of [`LL_CTA_BYTES`].
pub const EMU_PARAMS: ModelParams = ModelParams {
    launch_us: 300.0,
    barrier_us: 50.0,
    peer_read_gbps: 2.0,
    local_gbps: 4.0,
    ll_hop_us: 150.0,
    ll_round_bytes: (EMU_MAX_CTAS as u64 * LL_CTA_BYTES) as f64,
};

/// A copy on a stream, as the model sees it: its fixed cost (µs) and bandwidth (reads plus
/// writes, GB/s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StreamCopy {
    /// One copy's cost besides its bytes (enqueued and started), µs.
    pub us: f64,
    /// Bytes read plus written per second, GB/s (1e9 B/s).
    pub gbps: f64,
}

/// CUDA: `cuMemcpyDtoDAsync` moved 2084–2090 GB/s on an H200 (`scripts/gpu-check`; twice that
/// read plus written) and costs about a launch.
pub const CUDA_STREAM_COPY: StreamCopy = StreamCopy {
    us: 2.0,
    gbps: 4000.0,
};

/// Emulator: a copy is a `memcpy` on the stream's worker thread (queued, woken), far faster than
/// emulated threads copying 16 bytes at a time (`symcomm perf --buffers device`, 4 ranks: a
/// 256 KB staged all-reduce took 3.6–3.8 ms with two stream copies, 5.8–6.5 ms with the copies in
/// the kernel; equal up to 32 KB).
pub const EMU_STREAM_COPY: StreamCopy = StreamCopy {
    us: 20.0,
    gbps: 20.0,
};

/// Whether a staged chunk (buffers that are not windows) of `chunk_bytes` per rank (the larger
/// of its input and output) has the collective kernel read the send buffer and write the
/// receive buffer itself (`CollArgs::src_ptr` / `dst_ptr`), or copies them into and out of the
/// staging windows on the stream around the launch. In the kernel the chunk costs the input's
/// copy into the staging window (2·b bytes at `local_gbps`; one element at a time when the
/// buffers are not `aligned` to 16 bytes like the windows, `elem_size` bytes instead of 16 per
/// load, and so is the kernel's own output then); on the stream, two copies ([`StreamCopy`]
/// each, 4·b bytes). Aligned: always the kernel on CUDA, on the emulator up to about 128 KB. A
/// rank's own choice: peers read the same staging window either way.
pub fn stages_in_kernel(
    chunk_bytes: u64,
    elem_size: u64,
    aligned: bool,
    backend: BackendKind,
) -> bool {
    let (rate, c) = staging_rates(elem_size, aligned, backend);
    let b = chunk_bytes as f64;
    2.0 * b / (rate * 1e3) <= 2.0 * c.us + 4.0 * b / (c.gbps * 1e3)
}

/// The largest staged chunk (bytes per rank) whose copies [`stages_in_kernel`] puts in the
/// kernel; `None` when it does at every size (the kernel's copies are never the slower).
/// `symcomm info` prints it.
pub fn staged_in_kernel_up_to(elem_size: u64, aligned: bool, backend: BackendKind) -> Option<u64> {
    let (rate, c) = staging_rates(elem_size, aligned, backend);
    // 2·b / rate <= 2·us + 4·b / gbps  <=>  b · (2 / rate − 4 / gbps) <= 2·us (b in bytes, rates
    // in bytes/µs).
    let slope = 2.0 / (rate * 1e3) - 4.0 / (c.gbps * 1e3);
    if slope <= 0.0 {
        return None;
    }
    // The closed form, then agreement with the rule itself where rounding decides.
    let in_kernel = |b| stages_in_kernel(b, elem_size, aligned, backend);
    let mut b = (2.0 * c.us / slope).floor() as u64;
    while b > 0 && !in_kernel(b) {
        b -= 1;
    }
    while in_kernel(b + 1) {
        b += 1;
    }
    Some(b)
}

/// The kernel's staging copy rate (GB/s; one element at a time when the buffers are not aligned
/// like the windows) and the backend's stream copy.
fn staging_rates(
    elem_size: u64,
    aligned: bool,
    backend: BackendKind,
) -> (f64, &'static StreamCopy) {
    let p = params(backend);
    let c = match backend {
        BackendKind::Cuda => &CUDA_STREAM_COPY,
        BackendKind::Emu => &EMU_STREAM_COPY,
    };
    let rate = if aligned {
        p.local_gbps
    } else {
        p.local_gbps * elem_size.clamp(1, 16) as f64 / 16.0
    };
    (rate, c)
}

/// The link between hosts as the model sees it, per rank: what one exchange round costs besides
/// its bytes (the message latency plus the host side: the stream synchronized, UCX progressed),
/// and the bandwidth. Measured across two network namespaces joined by veth, UCX over TCP
/// (`cargo bench -p symcomm-cli --bench hosts`: 20 µs per small send/recv, 1.1 GB/s at 1 MiB);
/// a faster network lowers both, which moves the crossovers but not their order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostLink {
    /// One exchange round among ranks on different hosts, µs.
    pub round_us: f64,
    /// One rank's bandwidth to other hosts, GB/s (1e9 B/s).
    pub gbps: f64,
}

/// The [`HostLink`] the model uses.
pub const HOST_LINK: HostLink = HostLink {
    round_us: 20.0,
    gbps: 1.1,
};

/// How the ranks of a rail (one per host, see `comm/hosts.rs`) all-reduce their shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RailAllReduce {
    /// Every rank sends its whole partial shard to every other host's rail rank and combines
    /// what it gets: one round, `(H-1) B` bytes sent per rank for a shard of `B` bytes.
    OneShot,
    /// A reduce-scatter then an all-gather among the rail's ranks, each direct: two rounds,
    /// `2 (H-1) B / H` bytes.
    TwoShot,
}

/// The rail all-reduce of a shard of `shard_bytes` across `hosts` hosts, by the model: two-shot
/// once its saved bytes outweigh its extra round (never on two hosts, where both send `B`).
pub fn rail_all_reduce(hosts: u32, shard_bytes: u64) -> RailAllReduce {
    match rail_two_shot_from(hosts) {
        Some(from) if shard_bytes >= from => RailAllReduce::TwoShot,
        _ => RailAllReduce::OneShot,
    }
}

/// The smallest shard (bytes) whose rail all-reduce is two-shot on `hosts` hosts: where
/// `round + (H-1) B / bw = 2 round + 2 (H-1) B / (H bw)`, i.e. `B = round bw H / ((H-1)(H-2))`;
/// `None` for fewer than three hosts.
pub fn rail_two_shot_from(hosts: u32) -> Option<u64> {
    if hosts < 3 {
        return None;
    }
    let h = f64::from(hosts);
    let bytes_per_us = HOST_LINK.gbps * 1e3;
    Some((HOST_LINK.round_us * bytes_per_us * h / ((h - 1.0) * (h - 2.0))).ceil() as u64)
}

/// The model parameters of `backend`.
pub fn params(backend: BackendKind) -> &'static ModelParams {
    match backend {
        BackendKind::Cuda => &CUDA_PARAMS,
        BackendKind::Emu => &EMU_PARAMS,
    }
}

/// What one call costs before bandwidths are applied.
struct Cost {
    barriers: f64,
    /// LL rounds (one `ll_hop_us` each).
    hops: f64,
    peer_bytes: f64,
    local_bytes: f64,
}

/// The counts of the module docs' table; `None` for a pair that does not exist (and LL above
/// [`LL_MAX_BYTES`]).
fn cost(coll: Collective, algo: Algorithm, s: f64, nranks: u32, p: &ModelParams) -> Option<Cost> {
    let n = f64::from(nranks.max(1));
    let b = s / n;
    let c = |barriers: f64, peer_bytes: f64, local_bytes: f64| Cost {
        barriers,
        hops: 0.0,
        peer_bytes,
        local_bytes,
    };
    Some(match (coll, algo) {
        // No barrier; a hop per round; lines carry 8 data bytes in 16.
        (Collective::AllReduce, Algorithm::Ll) if s <= LL_MAX_BYTES as f64 => Cost {
            hops: (s / p.ll_round_bytes).ceil().max(1.0),
            ..c(0.0, 2.0 * (n - 1.0) * s, 2.0 * s + 2.0 * (n - 1.0) * s)
        },
        // Barrier, read all n inputs (n−1 remote), write S, barrier.
        (Collective::AllReduce, Algorithm::OneShot) => c(2.0, (n - 1.0) * s, 2.0 * s),
        // The pull form (see (²) in the module docs): barrier, reduce own block b (n−1 remote
        // reads, 1 local read, 1 write), barrier, copy the n−1 other reduced blocks, barrier.
        (Collective::AllReduce, Algorithm::TwoShot) => {
            c(3.0, 2.0 * (n - 1.0) * b, b + b + (n - 1.0) * b)
        }
        // Barrier, copy n−1 peers' blocks and the own one into S of output, barrier.
        (Collective::AllGather, Algorithm::Direct) => c(2.0, (n - 1.0) * b, b + s),
        // No barrier; a hop per round of the rank's own block b; its lines (16 bytes per 8) to
        // n−1 peers, read back from the own LL area and copied into S of output.
        (Collective::AllGather, Algorithm::Ll) if s <= LL_MAX_BYTES as f64 => Cost {
            hops: (b / p.ll_round_bytes).ceil().max(1.0),
            ..c(0.0, 2.0 * (n - 1.0) * b, b + s + 2.0 * (n - 1.0) * b)
        },
        // Barrier, reduce block r of all n inputs, write b, barrier.
        (Collective::ReduceScatter, Algorithm::Direct) => c(2.0, (n - 1.0) * b, 2.0 * b),
        // No barrier; a hop per round of a block b; block q's lines (16 bytes per 8) to rank q,
        // the own input S read, the n−1 arrived blocks read back, b written.
        (Collective::ReduceScatter, Algorithm::Ll) if s <= LL_MAX_BYTES as f64 => Cost {
            hops: (b / p.ll_round_bytes).ceil().max(1.0),
            ..c(0.0, 2.0 * (n - 1.0) * b, s + b + 2.0 * (n - 1.0) * b)
        },
        // Barrier, every rank copies S from the root (root egress: n−1 readers), barrier.
        (Collective::Broadcast, Algorithm::Direct) => c(2.0, (n - 1.0) * s, 2.0 * s),
        // No barrier; a hop per round of S; the root's lines to n−1 peers (its egress), each
        // rank reads 2S of lines back and writes S, the root reads S.
        (Collective::Broadcast, Algorithm::Ll) if s <= LL_MAX_BYTES as f64 => Cost {
            hops: (s / p.ll_round_bytes).ceil().max(1.0),
            ..c(0.0, 2.0 * (n - 1.0) * s, 4.0 * s)
        },
        // Barrier, the root reads n−1 peers' S and its own, writes S, barrier.
        (Collective::Reduce, Algorithm::Direct) => c(2.0, (n - 1.0) * s, 2.0 * s),
        // Barrier, every rank copies its block from the root (root egress: n−1 blocks), barrier.
        (Collective::Scatter, Algorithm::Direct) => c(2.0, (n - 1.0) * b, 2.0 * b),
        // Barrier, copy one block from each of n−1 peers and the own block into S of output,
        // barrier.
        (Collective::AllToAll, Algorithm::Direct) => c(2.0, (n - 1.0) * b, b + s),
        // Signal, read S from the previous rank and write it, signal; one rank copies locally.
        (Collective::SendRecv, Algorithm::Direct) => {
            if nranks > 1 {
                c(2.0, s, s)
            } else {
                c(2.0, 0.0, 2.0 * s)
            }
        }
        _ => return None,
    })
}

/// Predicted time in µs of `coll` with `algo` moving `bytes` (the nccl-tests message size `S`,
/// see the [module docs](self)) among `nranks` ranks (0 counts as 1), with the parameters `p`.
/// `f64::INFINITY` for a pair that does not exist ([`Algorithm::kind_code`] is `None`, except
/// sendrecv which is modelled). Non-decreasing in `bytes`.
pub fn predict_us(
    coll: Collective,
    algo: Algorithm,
    bytes: u64,
    nranks: u32,
    p: &ModelParams,
) -> f64 {
    match cost(coll, algo, bytes as f64, nranks, p) {
        Some(c) => {
            p.launch_us
                + c.barriers * p.barrier_us
                + c.hops * p.ll_hop_us
                + c.peer_bytes / (1000.0 * p.peer_read_gbps)
                + c.local_bytes / (1000.0 * p.local_gbps)
        }
        None => f64::INFINITY,
    }
}

/// The algorithm to use for `coll` on `bytes` bytes (nccl-tests size) among `nranks` ranks:
/// `forced` when it is available for `coll` (otherwise ignored), else the first of
/// [`Algorithm::available`] for one rank, else the cheapest by [`predict_us`] with
/// [`params`]`(backend)` (ties: the first in `available`). A pure function of its arguments, so
/// ranks that agree on them agree on the choice.
pub fn choose(
    coll: Collective,
    bytes: u64,
    nranks: u32,
    backend: BackendKind,
    forced: Option<Algorithm>,
) -> Algorithm {
    choose_with(coll, bytes, nranks, params(backend), forced)
}

fn choose_with(
    coll: Collective,
    bytes: u64,
    nranks: u32,
    p: &ModelParams,
    forced: Option<Algorithm>,
) -> Algorithm {
    let avail = Algorithm::available(coll);
    if let Some(f) = forced.filter(|f| avail.contains(f)) {
        return f;
    }
    let first = avail.first().copied().unwrap_or(Algorithm::Direct);
    if nranks <= 1 {
        return first;
    }
    let mut best = (first, predict_us(coll, first, bytes, nranks, p));
    for &a in avail.iter().skip(1) {
        let t = predict_us(coll, a, bytes, nranks, p);
        if t < best.1 {
            best = (a, t);
        }
    }
    best.0
}

/// Largest all-reduce message size in bytes for which [`choose`] picks LL with no forced
/// algorithm: LL for every size up to it (from 8 B), another algorithm above. `None` when LL does
/// not win even at 8 bytes (one rank: never). Exact by bisection, because LL's cost minus every
/// other's grows with the size (more bytes per byte, and more rounds), so LL wins on a prefix.
pub fn all_reduce_ll_limit(nranks: u32, backend: BackendKind) -> Option<u64> {
    ll_limit_with(Collective::AllReduce, nranks, params(backend))
}

/// [`all_reduce_ll_limit`] for all-gather (sizes are nccl-tests': the gathered output).
pub fn all_gather_ll_limit(nranks: u32, backend: BackendKind) -> Option<u64> {
    ll_limit_with(Collective::AllGather, nranks, params(backend))
}

/// [`all_reduce_ll_limit`] for any collective with an LL algorithm ([`Algorithm::available`]);
/// `None` for the others.
pub fn ll_limit(coll: Collective, nranks: u32, backend: BackendKind) -> Option<u64> {
    ll_limit_with(coll, nranks, params(backend))
}

fn ll_limit_with(coll: Collective, nranks: u32, p: &ModelParams) -> Option<u64> {
    if nranks <= 1 || !Algorithm::available(coll).contains(&Algorithm::Ll) {
        return None;
    }
    let ll = |s: u64| choose_with(coll, s, nranks, p, None) == Algorithm::Ll;
    if !ll(8) {
        return None;
    }
    // Invariant: LL at lo, not at hi.
    let (mut lo, mut hi) = (8u64, LL_MAX_BYTES + 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ll(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo)
}

/// Largest size [`all_reduce_crossover`] searches: 16 GiB.
pub const CROSSOVER_MAX_BYTES: u64 = 16 << 30;

/// Smallest all-reduce message size in bytes at which [`choose`] picks two-shot with no forced
/// algorithm: one-shot or LL (see [`all_reduce_ll_limit`]) for every smaller size, two-shot for
/// it and every larger one. `None` if never up to [`CROSSOVER_MAX_BYTES`] (one rank: never); `Some(8)` when two-shot
/// already wins at 8 bytes.
///
/// Search: powers of two from 8 B up to 16 GiB for the first that picks two-shot, then bisection
/// between it and the power below down to the byte. Exact because the choice is monotone in the
/// size (two-shot's advantage grows linearly with it, see the module docs).
pub fn all_reduce_crossover(nranks: u32, backend: BackendKind) -> Option<u64> {
    crossover_with(nranks, params(backend))
}

fn crossover_with(nranks: u32, p: &ModelParams) -> Option<u64> {
    if nranks <= 1 {
        return None;
    }
    let two = |s: u64| choose_with(Collective::AllReduce, s, nranks, p, None) == Algorithm::TwoShot;
    let mut hi = 8u64;
    while !two(hi) {
        if hi >= CROSSOVER_MAX_BYTES {
            return None;
        }
        hi *= 2;
    }
    if hi == 8 {
        return Some(8);
    }
    // Invariant: one-shot at lo, two-shot at hi.
    let mut lo = hi / 2;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if two(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// Parses a `SYMCOMM_ALGO` value: unset, empty or `auto` → `Ok(None)` (the model chooses);
/// `one_shot`, `two_shot`, `direct` (as [`Algorithm::parse`] accepts them) → `Ok(Some(..))`.
///
/// # Errors
/// [`Error::InvalidArgument`] listing the valid values for anything else.
pub fn parse_algo(value: Option<&str>) -> Result<Option<Algorithm>> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    if v.eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    match Algorithm::parse(v) {
        Some(a) => Ok(Some(a)),
        None => Err(Error::InvalidArgument(format!(
            "SYMCOMM_ALGO={v:?}: expected one of auto, {}",
            Algorithm::ALL.map(Algorithm::name).join(", ")
        ))),
    }
}

/// [`parse_algo`] of the `SYMCOMM_ALGO` environment variable (read now, each call).
///
/// # Errors
/// [`Error::InvalidArgument`] for a value [`parse_algo`] refuses.
pub fn algo_from_env() -> Result<Option<Algorithm>> {
    parse_algo(crate::config::raw_value("SYMCOMM_ALGO").as_deref())
}

/// Bytes per CTA [`geometry`] aims at.
pub const PIECE_BYTES: u64 = 64 << 10;
/// Threads per CTA on CUDA: the built-in kernels' launch bounds.
pub const CUDA_THREADS: u32 = symcomm_device::abi::SYMCOMM_BUILTIN_THREADS;
/// Threads per CTA on the emulator.
pub const EMU_THREADS: u32 = 64;
/// Most threads per CTA (CUDA's limit, which the emulator keeps too).
pub const MAX_CTA_THREADS: u32 = 1024;
/// Most CTAs per call on the emulator (each CTA is an OS thread; small machines).
pub const EMU_MAX_CTAS: u32 = 4;

/// Launch geometry of one call: (CTAs, threads per CTA), both ≥ 1; a pure function of its
/// arguments, so ranks that agree on them launch the same grid (grid-scope collectives need it).
///
/// CTAs: one per [`PIECE_BYTES`] of the bytes a rank moves (`bytes`, the nccl-tests size; for
/// scatter one block, `bytes / nranks`), or per [`LL_CTA_BYTES`] for `algo` LL (one round per
/// CTA while the grid allows), at least 1, at most `max_ctas` (what the caller may keep
/// resident: its share of the GPU's co-resident CTAs, within its barrier indices; 0 counts as 1)
/// and on the emulator at most [`EMU_MAX_CTAS`] — so messages under 64 KiB run on one CTA (LL:
/// under 2040 bytes). Threads: [`threads`].
pub fn geometry(
    coll: Collective,
    algo: Algorithm,
    bytes: u64,
    nranks: u32,
    backend: BackendKind,
    max_ctas: u32,
) -> (u32, u32) {
    let n = u64::from(nranks.max(1));
    // LL all-gather and reduce-scatter: each CTA sends its part of a block (a round per CTA).
    let work = match (coll, algo) {
        (Collective::Scatter, _)
        | (Collective::AllGather | Collective::ReduceScatter, Algorithm::Ll) => bytes / n,
        _ => bytes,
    };
    let cap = match backend {
        BackendKind::Cuda => max_ctas,
        BackendKind::Emu => max_ctas.min(EMU_MAX_CTAS),
    };
    let cap = cap.max(1);
    let piece = if algo == Algorithm::Ll {
        LL_CTA_BYTES
    } else {
        PIECE_BYTES
    };
    let ctas = work.div_ceil(piece).clamp(1, u64::from(cap));
    let ctas = u32::try_from(ctas).unwrap_or(cap);
    (ctas, threads(nranks, backend))
}

/// Threads per CTA of the built-in kernels on `backend`: [`CUDA_THREADS`] or [`EMU_THREADS`]
/// (what send/recv launches; the collectives raise it, see [`threads`]).
pub fn base_threads(backend: BackendKind) -> u32 {
    match backend {
        BackendKind::Cuda => CUDA_THREADS,
        BackendKind::Emu => EMU_THREADS,
    }
}

/// Channels of send/recv's staging layout on `backend` (`P2pArgs::channels`): every one of
/// SYMCOMM_P2P_CHANNELS on CUDA (up to that many CTAs per message, each with two pieces in
/// flight), one on the emulator, where each CTA is an OS thread and more channels only mean more
/// handshakes (`symcomm perf sendrecv -t 4`, 512 KiB: 50 ms a call with 8 channels, 6–9 ms with
/// one, as with the single unpipelined chunk before channels came).
pub fn p2p_channels(backend: BackendKind) -> u32 {
    match backend {
        BackendKind::Cuda => symcomm_device::abi::SYMCOMM_P2P_CHANNELS,
        BackendKind::Emu => 1,
    }
}

/// Threads per CTA of the built-in collective kernel: [`base_threads`], raised to `nranks`
/// rounded up to a warp (in-place all-to-all needs a thread per rank), at most
/// [`MAX_CTA_THREADS`].
pub fn threads(nranks: u32, backend: BackendKind) -> u32 {
    base_threads(backend)
        .max(nranks.min(MAX_CTA_THREADS).next_multiple_of(32))
        .min(MAX_CTA_THREADS)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    /// The rail all-reduce's crossover, pinned: never two-shot on two hosts (both send the
    /// shard once); on three hosts from 33 KB of shard, on four from 14.7 KB, and lower as
    /// hosts are added; one byte below it one-shot.
    #[test]
    fn rail_all_reduce_crossovers() {
        assert_eq!(rail_two_shot_from(2), None);
        assert_eq!(rail_all_reduce(2, u64::MAX), RailAllReduce::OneShot);
        assert_eq!(rail_two_shot_from(3), Some(33_000));
        assert_eq!(rail_two_shot_from(4), Some(14_667));
        let mut last = u64::MAX;
        for h in 3..64 {
            let from = rail_two_shot_from(h).unwrap();
            assert!(from < last, "{h} hosts: {from}");
            last = from;
            assert_eq!(rail_all_reduce(h, from), RailAllReduce::TwoShot);
            assert_eq!(rail_all_reduce(h, from - 1), RailAllReduce::OneShot);
        }
    }

    use super::*;

    #[test]
    fn staged_chunks_copy_in_the_kernel_on_cuda_and_small_ones_on_the_emulator() {
        let cuda = |b, size, aligned| stages_in_kernel(b, size, aligned, BackendKind::Cuda);
        let emu = |b, size, aligned| stages_in_kernel(b, size, aligned, BackendKind::Emu);
        for b in [8u64, 4096, 1 << 20, 4 << 20, 1 << 34] {
            assert!(cuda(b, 4, true), "{b}");
        }
        // Misaligned buffers: the kernel's copies go one element at a time, so the largest
        // chunks (the bytes count, not the launch) go through the stream's copies.
        assert!(cuda(4096, 4, false));
        assert!(cuda(1 << 20, 4, false));
        assert!(!cuda(4 << 20, 4, false));
        assert!(cuda(64 << 10, 1, false));
        assert!(!cuda(1 << 20, 1, false));
        assert!(emu(8, 4, true));
        assert!(emu(64 << 10, 4, true));
        assert!(!emu(256 << 10, 4, true));
        assert!(!emu(4 << 20, 4, true));
        assert!(!emu(64 << 10, 4, false));
    }

    #[test]
    fn staged_in_kernel_up_to_is_where_the_rule_switches() {
        for backend in BackendKind::ALL {
            for (size, aligned) in [(4, true), (1, true), (4, false), (1, false), (8, false)] {
                let in_kernel = |b| stages_in_kernel(b, size, aligned, backend);
                match staged_in_kernel_up_to(size, aligned, backend) {
                    Some(x) => {
                        assert!(in_kernel(x), "{backend:?} {size} {aligned}: {x}");
                        assert!(!in_kernel(x + 1), "{backend:?} {size} {aligned}: {x}");
                        assert!(!in_kernel(x * 4), "{backend:?} {size} {aligned}: {x}");
                    }
                    None => {
                        for b in [1u64, 1 << 20, 1 << 30, 1 << 40] {
                            assert!(in_kernel(b), "{backend:?} {size} {aligned}: {b}");
                        }
                    }
                }
            }
        }
        // As the rule's own test pins: aligned chunks always in the kernel on CUDA, misaligned
        // large ones not; the emulator's from about 128 KB.
        assert_eq!(staged_in_kernel_up_to(4, true, BackendKind::Cuda), None);
        let f32_mis = staged_in_kernel_up_to(4, false, BackendKind::Cuda).unwrap();
        assert!((1 << 20..4 << 20).contains(&f32_mis), "{f32_mis}");
        let emu = staged_in_kernel_up_to(4, true, BackendKind::Emu).unwrap();
        assert!((64 << 10..256 << 10).contains(&emu), "{emu}");
    }

    const RANKS: [u32; 3] = [2, 4, 8];

    #[test]
    fn crossover_pins_the_choice() {
        for backend in BackendKind::ALL {
            for n in RANKS {
                let x = all_reduce_crossover(n, backend)
                    .unwrap_or_else(|| panic!("{backend:?} n={n}: no crossover"));
                assert!(x > 8, "{backend:?} n={n}: {x}");
                let pick = |s| choose(Collective::AllReduce, s, n, backend, None);
                assert_eq!(pick(x - 8), Algorithm::OneShot, "{backend:?} n={n} {x}-8");
                assert_eq!(pick(x - 1), Algorithm::OneShot, "{backend:?} n={n} {x}-1");
                assert_ne!(pick(x / 2), Algorithm::TwoShot, "{backend:?} n={n} {x}/2");
                assert_eq!(pick(x), Algorithm::TwoShot, "{backend:?} n={n} at {x}");
                assert_eq!(pick(x + 1), Algorithm::TwoShot, "{backend:?} n={n} {x}+1");
                // Every power of two from 8 B to 16 GiB is on the right side.
                let mut s = 8u64;
                while s <= CROSSOVER_MAX_BYTES {
                    assert_eq!(
                        pick(s) == Algorithm::TwoShot,
                        s >= x,
                        "{backend:?} n={n} s={s} crossover {x}"
                    );
                    s *= 2;
                }
                // The calibrated model: LL for tiny messages on GPUs, one-shot on the emulator.
                let tiny = match backend {
                    BackendKind::Cuda => Algorithm::Ll,
                    BackendKind::Emu => Algorithm::OneShot,
                };
                assert_eq!(pick(8), tiny, "{backend:?} n={n}");
            }
        }
        for n in RANKS {
            assert_eq!(
                choose(Collective::AllReduce, 1 << 30, n, BackendKind::Cuda, None),
                Algorithm::TwoShot
            );
        }
        // More ranks: one-shot reads more, so two-shot wins earlier.
        for backend in BackendKind::ALL {
            let x: Vec<u64> = RANKS
                .iter()
                .map(|&n| all_reduce_crossover(n, backend).unwrap())
                .collect();
            assert!(x[0] > x[1] && x[1] > x[2], "{backend:?}: {x:?}");
        }
    }

    #[test]
    fn ll_limit_pins_the_choice() {
        for n in RANKS {
            // The emulator's LL rounds cost more than its barriers: never LL there.
            assert_eq!(all_reduce_ll_limit(n, BackendKind::Emu), None);
        }
        for backend in BackendKind::ALL {
            for n in RANKS {
                let Some(l) = all_reduce_ll_limit(n, backend) else {
                    assert_eq!(backend, BackendKind::Emu, "n={n}: LL never wins");
                    continue;
                };
                let x = all_reduce_crossover(n, backend).unwrap();
                assert!(l < x && l <= LL_MAX_BYTES, "{backend:?} n={n}: {l} vs {x}");
                let pick = |s| choose(Collective::AllReduce, s, n, backend, None);
                for s in [8, 9, l / 2, l - 1, l] {
                    assert_eq!(pick(s), Algorithm::Ll, "{backend:?} n={n} s={s} limit {l}");
                }
                // Just above: one-shot (the limit is below the two-shot crossover).
                assert_eq!(pick(l + 1), Algorithm::OneShot, "{backend:?} n={n} {l}+1");
                let mut s = 8u64;
                while s <= CROSSOVER_MAX_BYTES {
                    assert_eq!(pick(s) == Algorithm::Ll, s <= l, "{backend:?} n={n} s={s}");
                    s *= 2;
                }
            }
            assert_eq!(all_reduce_ll_limit(1, backend), None);
            assert_eq!(all_reduce_ll_limit(0, backend), None);
        }
        // The H200-calibrated limits, pinned (they move when the parameters do).
        assert_eq!(all_reduce_ll_limit(4, BackendKind::Cuda), Some(32_640));
        // A cheaper hop makes LL win on the emulator too (the search itself, off the defaults).
        let p = ModelParams {
            ll_hop_us: 25.0,
            ..EMU_PARAMS
        };
        assert_eq!(ll_limit_with(Collective::AllReduce, 2, &p), Some(24_480));
        // Nothing above LL_MAX_BYTES, however cheap LL is.
        let p = ModelParams {
            ll_hop_us: 0.0,
            ..CUDA_PARAMS
        };
        assert!(predict_us(Collective::AllReduce, Algorithm::Ll, LL_MAX_BYTES, 4, &p).is_finite());
        assert_eq!(
            predict_us(
                Collective::AllReduce,
                Algorithm::Ll,
                LL_MAX_BYTES + 1,
                4,
                &p
            ),
            f64::INFINITY
        );
    }

    #[test]
    fn all_gather_ll_limit_pins_the_choice() {
        for n in RANKS {
            assert_eq!(all_gather_ll_limit(n, BackendKind::Emu), None);
            let l = all_gather_ll_limit(n, BackendKind::Cuda)
                .unwrap_or_else(|| panic!("n={n}: LL all-gather never wins on CUDA"));
            assert!(l <= LL_MAX_BYTES, "n={n}: {l}");
            let pick = |s| choose(Collective::AllGather, s, n, BackendKind::Cuda, None);
            for s in [8, l / 2, l] {
                assert_eq!(pick(s), Algorithm::Ll, "n={n} s={s} limit {l}");
            }
            assert_eq!(pick(l + 1), Algorithm::Direct, "n={n} {l}+1");
            let mut s = 8u64;
            while s <= CROSSOVER_MAX_BYTES {
                assert_eq!(pick(s) == Algorithm::Ll, s <= l, "n={n} s={s}");
                s *= 2;
            }
        }
        assert_eq!(all_gather_ll_limit(1, BackendKind::Cuda), None);
        // The H200-calibrated limit, pinned (it moves when the parameters do).
        assert_eq!(all_gather_ll_limit(4, BackendKind::Cuda), Some(130_560));
    }

    #[test]
    fn ll_limits_of_every_collective_pin_the_choice() {
        for coll in Collective::ALL {
            let has_ll = Algorithm::available(coll).contains(&Algorithm::Ll);
            for n in RANKS {
                assert_eq!(ll_limit(coll, n, BackendKind::Emu), None, "{coll:?}");
                let Some(l) = ll_limit(coll, n, BackendKind::Cuda) else {
                    assert!(!has_ll, "{coll:?} n={n}: LL never wins on CUDA");
                    continue;
                };
                assert!(has_ll && l <= LL_MAX_BYTES, "{coll:?} n={n}: {l}");
                let pick = |s| choose(coll, s, n, BackendKind::Cuda, None);
                for s in [8, l / 2, l] {
                    assert_eq!(pick(s), Algorithm::Ll, "{coll:?} n={n} s={s} limit {l}");
                }
                assert_ne!(pick(l + 1), Algorithm::Ll, "{coll:?} n={n} {l}+1");
            }
            assert_eq!(ll_limit(coll, 1, BackendKind::Cuda), None);
        }
        assert_eq!(
            ll_limit(Collective::AllReduce, 4, BackendKind::Cuda),
            all_reduce_ll_limit(4, BackendKind::Cuda)
        );
        // The H200-calibrated limits, pinned (they move when the parameters do).
        let at4 = |c| ll_limit(c, 4, BackendKind::Cuda);
        assert_eq!(at4(Collective::ReduceScatter), Some(130_560));
        assert_eq!(at4(Collective::Broadcast), Some(32_640));
    }

    #[test]
    fn crossover_matches_the_closed_form() {
        // Two ranks: two-shot − one-shot = barrier − S / (2 · local), so the crossover is
        // 2 · barrier_us · local (bytes/µs), within a byte.
        for backend in BackendKind::ALL {
            let p = params(backend);
            let exact = 2.0 * p.barrier_us * p.local_gbps * 1000.0;
            let x = all_reduce_crossover(2, backend).unwrap() as f64;
            assert!(
                x >= exact - 1e-6 * exact && x - exact <= 1.0 + 1e-6 * exact,
                "{backend:?}: {x} vs {exact}"
            );
        }
        // n ranks: barrier / ((n−1)(n−2)/(n·peer) + (n−1)/(n·local)).
        for backend in BackendKind::ALL {
            let p = params(backend);
            for n in [4u32, 8] {
                let nf = f64::from(n);
                let per_byte = (nf - 1.0) * (nf - 2.0) / (nf * p.peer_read_gbps * 1000.0)
                    + (nf - 1.0) / (nf * p.local_gbps * 1000.0);
                let exact = p.barrier_us / per_byte;
                let x = all_reduce_crossover(n, backend).unwrap() as f64;
                assert!(
                    x >= exact - 1e-6 * exact && x - exact <= 1.0 + 1e-6 * exact,
                    "{backend:?} n={n}: {x} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn crossover_none_when_two_shot_never_wins() {
        // Free bandwidth: only barriers count, one-shot has fewer, so two-shot never wins.
        let p = ModelParams {
            launch_us: 1.0,
            barrier_us: 1.0,
            peer_read_gbps: f64::INFINITY,
            local_gbps: f64::INFINITY,
            ll_hop_us: 1.0,
            ll_round_bytes: 1e9,
        };
        assert_eq!(crossover_with(8, &p), None);
        // Free barriers, hops and bandwidth: every algorithm costs one launch; ties go to the
        // first.
        let p = ModelParams {
            barrier_us: 0.0,
            ll_hop_us: 0.0,
            ..p
        };
        assert_eq!(
            predict_us(Collective::AllReduce, Algorithm::OneShot, 1 << 20, 4, &p),
            predict_us(Collective::AllReduce, Algorithm::TwoShot, 1 << 20, 4, &p)
        );
        assert_eq!(
            choose_with(Collective::AllReduce, 1 << 20, 4, &p, None),
            Algorithm::OneShot
        );
        // Free barriers: two-shot at once.
        let p = ModelParams {
            barrier_us: 0.0,
            ..CUDA_PARAMS
        };
        assert_eq!(crossover_with(8, &p), Some(8));
    }

    #[test]
    fn one_rank_is_one_shot() {
        for backend in BackendKind::ALL {
            assert_eq!(all_reduce_crossover(1, backend), None);
            assert_eq!(all_reduce_crossover(0, backend), None);
            for s in [0u64, 8, 1 << 20, 1 << 30, 16 << 30] {
                assert_eq!(
                    choose(Collective::AllReduce, s, 1, backend, None),
                    Algorithm::OneShot
                );
            }
        }
    }

    #[test]
    fn predict_is_monotone_in_bytes() {
        let mut sizes = vec![0u64, 1, 7, 8, 9, 100, 1000, 4095, 4096];
        sizes.extend((3..=34).map(|k| 1u64 << k));
        sizes.extend((3..=34).map(|k| (1u64 << k) + 8));
        sizes.sort_unstable();
        for p in [CUDA_PARAMS, EMU_PARAMS] {
            for coll in Collective::ALL {
                for &algo in Algorithm::available(coll) {
                    for n in [1u32, 2, 3, 4, 8, 16] {
                        let t: Vec<f64> = sizes
                            .iter()
                            .map(|&s| predict_us(coll, algo, s, n, &p))
                            .collect();
                        for (&s, x) in sizes.iter().zip(&t) {
                            let offered = algo != Algorithm::Ll || s <= LL_MAX_BYTES;
                            assert!(
                                x.is_finite() == offered && *x > 0.0,
                                "{coll:?} {algo:?} {s}: {x}"
                            );
                        }
                        for w in t.windows(2) {
                            assert!(w[0] <= w[1], "{coll:?} {algo:?} n={n}: {t:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn predict_pins_formulas() {
        let p = ModelParams {
            launch_us: 10.0,
            barrier_us: 1.0,
            peer_read_gbps: 1.0, // 1000 B/us
            local_gbps: 2.0,     // 2000 B/us
            ll_hop_us: 0.5,
            ll_round_bytes: 4000.0,
        };
        let s = 8000u64;
        let at = |c, a, n| predict_us(c, a, s, n, &p);
        // One-shot, n = 4: 10 + 2 + 3·8000/1000 + 2·8000/2000 = 44.
        assert!((at(Collective::AllReduce, Algorithm::OneShot, 4) - 44.0).abs() < 1e-9);
        // Two-shot, n = 4: 10 + 3 + 2·3·2000/1000 + 5·2000/2000 = 30.
        assert!((at(Collective::AllReduce, Algorithm::TwoShot, 4) - 30.0).abs() < 1e-9);
        // LL, n = 4: 10 + 2 rounds · 0.5 + 2·3·8000/1000 + (2·8000 + 2·3·8000)/2000 = 91.
        assert!((at(Collective::AllReduce, Algorithm::Ll, 4) - 91.0).abs() < 1e-9);
        // All-gather, n = 4 (b = 2000): 10 + 2 + 3·2000/1000 + (2000 + 8000)/2000 = 23.
        assert!((at(Collective::AllGather, Algorithm::Direct, 4) - 23.0).abs() < 1e-9);
        // Broadcast, n = 4: the root serves 3·S: 10 + 2 + 24 + 8 = 44.
        assert!((at(Collective::Broadcast, Algorithm::Direct, 4) - 44.0).abs() < 1e-9);
        // LL broadcast, n = 4: 10 + 2 rounds · 0.5 + 2·3·8000/1000 + 4·8000/2000 = 75.
        assert!((at(Collective::Broadcast, Algorithm::Ll, 4) - 75.0).abs() < 1e-9);
        // LL reduce-scatter, n = 4 (b = 2000): 10 + 1 round · 0.5 + 2·3·2000/1000
        //   + (8000 + 2000 + 2·3·2000)/2000 = 33.5.
        assert!((at(Collective::ReduceScatter, Algorithm::Ll, 4) - 33.5).abs() < 1e-9);
        // Pairs that do not exist cost infinity, so the model never picks them.
        assert_eq!(
            at(Collective::AllGather, Algorithm::TwoShot, 4),
            f64::INFINITY
        );
        assert_eq!(
            at(Collective::AllReduce, Algorithm::Direct, 4),
            f64::INFINITY
        );
    }

    #[test]
    fn forced_algorithm() {
        for backend in BackendKind::ALL {
            for s in [8u64, 1 << 30] {
                for n in [1u32, 2, 8] {
                    for forced in [Algorithm::OneShot, Algorithm::TwoShot, Algorithm::Ll] {
                        assert_eq!(
                            choose(Collective::AllReduce, s, n, backend, Some(forced)),
                            forced
                        );
                    }
                    let model = choose(Collective::AllReduce, s, n, backend, None);
                    assert_eq!(
                        choose(
                            Collective::AllReduce,
                            s,
                            n,
                            backend,
                            Some(Algorithm::Direct)
                        ),
                        model
                    );
                    for coll in Collective::ALL.into_iter().skip(1) {
                        for forced in [
                            None,
                            Some(Algorithm::OneShot),
                            Some(Algorithm::TwoShot),
                            Some(Algorithm::Ll),
                        ] {
                            // All-gather, reduce-scatter and broadcast have LL too: forced, or
                            // the model's choice.
                            let has_ll = Algorithm::available(coll).contains(&Algorithm::Ll);
                            let want = match forced {
                                Some(Algorithm::Ll) if has_ll => Algorithm::Ll,
                                _ if has_ll => choose(coll, s, n, backend, None),
                                _ => Algorithm::Direct,
                            };
                            assert_eq!(
                                choose(coll, s, n, backend, forced),
                                want,
                                "{coll:?} {forced:?}"
                            );
                        }
                    }
                }
            }
        }
        // Forcing the model's loser really overrides it.
        assert_eq!(
            choose(Collective::AllReduce, 8, 8, BackendKind::Cuda, None),
            Algorithm::Ll
        );
        assert_eq!(
            choose(
                Collective::AllReduce,
                8,
                8,
                BackendKind::Cuda,
                Some(Algorithm::TwoShot)
            ),
            Algorithm::TwoShot
        );
    }

    #[test]
    fn kind_codes_match_abi() {
        use Algorithm::*;
        use Collective::*;
        let want = |c: Collective, a: Algorithm| -> Option<u32> {
            match (c, a) {
                (AllReduce, OneShot) => Some(abi::SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT),
                (AllReduce, TwoShot) => Some(abi::SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT),
                (AllReduce, Ll) => Some(abi::SYMCOMM_COLL_ALL_REDUCE_LL),
                (AllGather, Direct) => Some(abi::SYMCOMM_COLL_ALL_GATHER),
                (AllGather, Ll) => Some(abi::SYMCOMM_COLL_ALL_GATHER_LL),
                (ReduceScatter, Direct) => Some(abi::SYMCOMM_COLL_REDUCE_SCATTER),
                (ReduceScatter, Ll) => Some(abi::SYMCOMM_COLL_REDUCE_SCATTER_LL),
                (Broadcast, Direct) => Some(abi::SYMCOMM_COLL_BROADCAST),
                (Broadcast, Ll) => Some(abi::SYMCOMM_COLL_BROADCAST_LL),
                (Reduce, Direct) => Some(abi::SYMCOMM_COLL_REDUCE),
                (Scatter, Direct) => Some(abi::SYMCOMM_COLL_SCATTER),
                (AllToAll, Direct) => Some(abi::SYMCOMM_COLL_ALL_TO_ALL),
                _ => None,
            }
        };
        let mut codes = Vec::new();
        for c in Collective::ALL {
            for a in Algorithm::ALL {
                assert_eq!(a.kind_code(c), want(c, a), "{c:?} {a:?}");
                // Exactly the available pairs have a device kind (sendrecv has none).
                if c != SendRecv {
                    assert_eq!(
                        a.kind_code(c).is_some(),
                        Algorithm::available(c).contains(&a),
                        "{c:?} {a:?}"
                    );
                }
                codes.extend(a.kind_code(c));
            }
        }
        codes.sort_unstable();
        assert_eq!(codes, (0..abi::SYMCOMM_COLL_COUNT).collect::<Vec<_>>());
        assert_eq!(Algorithm::available(SendRecv), &[Direct]);
        assert_eq!(Algorithm::available(AllReduce), &[OneShot, TwoShot, Ll]);
    }

    #[test]
    fn bus_factors() {
        use Collective::*;
        let at4 = [
            (AllReduce, 1.5),
            (Broadcast, 1.0),
            (Reduce, 1.0),
            (AllGather, 0.75),
            (ReduceScatter, 0.75),
            (Scatter, 0.75),
            (AllToAll, 0.75),
            (SendRecv, 1.0),
        ];
        let at1 = [
            (AllReduce, 0.0),
            (Broadcast, 1.0),
            (Reduce, 1.0),
            (AllGather, 0.0),
            (ReduceScatter, 0.0),
            (Scatter, 0.0),
            (AllToAll, 0.0),
            (SendRecv, 1.0),
        ];
        assert_eq!(at4.len(), Collective::ALL.len());
        for ((c, f4), (c1, f1)) in at4.into_iter().zip(at1) {
            assert_eq!(c, c1);
            assert_eq!(c.bus_factor(4), f4, "{c:?} n=4");
            assert_eq!(c.bus_factor(1), f1, "{c:?} n=1");
        }
        assert_eq!(AllReduce.bus_factor(8), 1.75);
        assert_eq!(AllGather.bus_factor(8), 0.875);
    }

    #[test]
    fn op_and_root() {
        use Collective::*;
        let ops: Vec<_> = Collective::ALL.into_iter().filter(|c| c.has_op()).collect();
        assert_eq!(ops, [AllReduce, Reduce, ReduceScatter]);
        let roots: Vec<_> = Collective::ALL
            .into_iter()
            .filter(|c| c.has_root())
            .collect();
        assert_eq!(roots, [Broadcast, Reduce, Scatter]);
    }

    #[test]
    fn names_round_trip() {
        for c in Collective::ALL {
            assert_eq!(Collective::parse(c.name()), Some(c));
            assert_eq!(Collective::parse(&c.name().replace('_', "")), Some(c));
            assert_eq!(Collective::parse(&format!("{}_perf", c.name())), Some(c));
            assert_eq!(Collective::parse(&c.name().to_uppercase()), Some(c));
        }
        let names: Vec<_> = Collective::ALL.map(Collective::name).to_vec();
        assert_eq!(
            names,
            [
                "all_reduce",
                "broadcast",
                "reduce",
                "all_gather",
                "reduce_scatter",
                "scatter",
                "all_to_all",
                "sendrecv"
            ]
        );
        // nccl-tests binary names.
        for (bin, c) in [
            ("all_reduce_perf", Collective::AllReduce),
            ("alltoall_perf", Collective::AllToAll),
            ("sendrecv_perf", Collective::SendRecv),
            ("./build/reduce_scatter_perf", Collective::ReduceScatter),
            ("all_gather_perf_mpi", Collective::AllGather),
            ("allreduce", Collective::AllReduce),
            ("all-gather", Collective::AllGather),
        ] {
            assert_eq!(Collective::parse(bin), Some(c), "{bin}");
        }
        for bad in [
            "",
            "all",
            "gather",
            "gather_perf",
            "hypercube_perf",
            "reduce_perf_x",
        ] {
            assert_eq!(Collective::parse(bad), None, "{bad}");
        }
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::parse(a.name()), Some(a));
            assert_eq!(Algorithm::parse(&a.name().replace('_', "-")), Some(a));
            assert_eq!(Algorithm::parse(&a.name().to_uppercase()), Some(a));
        }
        assert_eq!(
            Algorithm::ALL.map(Algorithm::name),
            ["one_shot", "two_shot", "direct", "ll"]
        );
        assert_eq!(Algorithm::parse("auto"), None);
        assert_eq!(Algorithm::parse("ring"), None);
    }

    #[test]
    fn parse_algo_values() {
        assert_eq!(parse_algo(None).unwrap(), None);
        assert_eq!(parse_algo(Some("")).unwrap(), None);
        assert_eq!(parse_algo(Some("auto")).unwrap(), None);
        assert_eq!(parse_algo(Some("AUTO")).unwrap(), None);
        assert_eq!(
            parse_algo(Some("one_shot")).unwrap(),
            Some(Algorithm::OneShot)
        );
        assert_eq!(
            parse_algo(Some(" two_shot ")).unwrap(),
            Some(Algorithm::TwoShot)
        );
        assert_eq!(parse_algo(Some("direct")).unwrap(), Some(Algorithm::Direct));
        for bad in ["ring", "tree", "one shot", "0"] {
            match parse_algo(Some(bad)) {
                Err(Error::InvalidArgument(m)) => {
                    for v in ["auto", "one_shot", "two_shot", "direct", "SYMCOMM_ALGO"] {
                        assert!(m.contains(v), "{m}");
                    }
                    assert!(m.contains(bad), "{m}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn geometry_bounds() {
        for backend in BackendKind::ALL {
            for coll in Collective::ALL {
                for n in [1u32, 2, 4, 8, 100] {
                    for (max_ctas, &algo) in [1u32, 2, 4, 16, 64]
                        .into_iter()
                        .flat_map(|m| Algorithm::available(coll).iter().map(move |a| (m, a)))
                    {
                        let piece = if algo == Algorithm::Ll {
                            LL_CTA_BYTES
                        } else {
                            64 << 10
                        };
                        let mut s = 0u64;
                        loop {
                            let (ctas, threads) = geometry(coll, algo, s, n, backend, max_ctas);
                            assert!((1..=max_ctas).contains(&ctas), "{coll:?} {s} {ctas}");
                            assert!((32..=MAX_CTA_THREADS).contains(&threads) && threads % 32 == 0);
                            assert!(threads >= n, "{coll:?} n={n}: {threads}");
                            if backend == BackendKind::Emu {
                                assert!(ctas <= EMU_MAX_CTAS);
                                if s < piece {
                                    assert_eq!(ctas, 1, "{coll:?} {algo:?} {s}");
                                }
                            }
                            if s >= 1 << 40 {
                                break;
                            }
                            s = s * 2 + 1;
                        }
                    }
                }
            }
            // max_ctas 0 still gives one CTA.
            assert_eq!(
                geometry(
                    Collective::AllReduce,
                    Algorithm::OneShot,
                    1 << 30,
                    2,
                    backend,
                    0
                )
                .0,
                1
            );
        }
        // CUDA uses the barrier indices it has for large messages, one CTA for tiny ones.
        assert_eq!(
            geometry(
                Collective::AllReduce,
                Algorithm::TwoShot,
                1 << 30,
                8,
                BackendKind::Cuda,
                64
            ),
            (64, CUDA_THREADS)
        );
        assert_eq!(
            geometry(
                Collective::AllReduce,
                Algorithm::OneShot,
                1024,
                8,
                BackendKind::Cuda,
                64
            ),
            (1, CUDA_THREADS)
        );
        assert_eq!(
            geometry(
                Collective::AllReduce,
                Algorithm::TwoShot,
                1 << 30,
                8,
                BackendKind::Emu,
                64
            ),
            (4, EMU_THREADS)
        );
        // LL: a CTA per 2040 bytes, so an 8 KB message runs on 5 CTAs where the grid allows.
        assert_eq!(
            geometry(
                Collective::AllReduce,
                Algorithm::Ll,
                8192,
                4,
                BackendKind::Cuda,
                64
            ),
            (5, CUDA_THREADS)
        );
    }
}

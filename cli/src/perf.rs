//! `symcomm perf [COLLECTIVE] [OPTIONS]`: an nccl-tests compatible benchmark of the host
//! collectives (`reference/nccl.md` §3): the same options, the same table, the same busbw
//! factors, every result checked.
//!
//! - **Collectives.** `all_reduce` (default), `all_gather`, `reduce_scatter`, `broadcast`,
//!   `reduce`, `scatter`, `all_to_all`, `sendrecv` (nccl-tests' ring: one group per call with a
//!   send to rank r + 1 and a receive from rank r − 1; in place, both on the same memory, as
//!   nccl-tests does). nccl-tests spellings such as `alltoall` or `all_reduce_perf` work too.
//! - **Ranks.** `-t N` ranks as threads of this process (default 4). Started by `symcomm launch`,
//!   torchrun or mpirun (`RANK`, `OMPI_COMM_WORLD_RANK` or `PMI_RANK` set), the process is one
//!   rank of that job (`-t` is ignored) and only rank 0 prints. `--device emu|cuda|cuda:N|auto`
//!   (default `SYMCOMM_DEVICE`, else `auto`: a GPU when there is one, else the emulator).
//! - **Sizes.** `-b` to `-e` bytes (K, M, G suffixes = powers of 1024), times `-f` per step, or
//!   plus `-i` bytes when `-f` is 1 or absent and `-i` is given (nccl-tests' rule). The size `S`
//!   of a row is nccl-tests': the larger of the send and receive buffers (all-gather: the
//!   gathered output; reduce-scatter, scatter: the scattered input; all-to-all: one rank's
//!   whole buffer), `count` the per-rank parameter passed to the call (`S / typesize / nranks`
//!   for those four), so sizes that do not divide evenly are rounded down as nccl-tests does.
//!   Defaults: CUDA `-b 8 -e 256M -f 2 -n 20 -w 5`; emulator `-b 8 -e 1M -f 4 -n 3 -w 1` (the
//!   emulator runs kernels on CPU threads; this sweep takes about a second with 4 ranks on 2
//!   cores). A default `-e` below an explicit `-b` is raised to it (and a default `-b` above an
//!   explicit `-e` lowered); an explicit `-b` above an explicit `-e` is an error.
//! - **Buffers.** `--buffers window` (default): symmetric windows, the zero-copy path;
//!   `--buffers device`: ordinary device memory, through the communicator's staging windows.
//!   Both are allocated once for the largest size; in place uses the receive buffer with NCCL's
//!   offsets (all-gather: send = recv + rank·count; reduce-scatter, scatter: recv = send +
//!   rank·count; the others: the same memory).
//! - **Timing** (nccl-tests' `BenchTime`). Per `-d`/`-o` combination, `-w` warm-up calls at the
//!   largest and at the smallest size. Per size, out of place then in place: one untimed call,
//!   a host barrier, then `-n` calls back to back and a stream synchronize; time = elapsed / n,
//!   averaged over the ranks (nccl-tests' default `-a 1`). algbw = S / time (GB = 1e9 B),
//!   busbw = algbw × nccl-tests' factor ([`Collective::bus_factor`]).
//! - **Checks** (`-c N`, default 1; 0 turns them off and `#wrong` shows `N/A`). After timing,
//!   N times: fresh inputs (a new seed each time), the output poisoned, one call, every output
//!   element compared bit for bit with the value computed here; the first check with errors
//!   ends the loop, as in nccl-tests. Inputs are small integers, so every reduction is exact
//!   whatever the order: sums and avg use values in `0..=k` with `k·nranks` exactly
//!   representable (fp8 e5m2: sums up to 8; when even `nranks` is too many, exactly one rank
//!   contributes a 1); prod uses ±1 and, on one rank per element, 2; min/max use `-8..=8`
//!   (unsigned: `0..=16`); data movement uses hashed values (full-width bit patterns for
//!   integers). Float avg is the one inexact result: it must be within 2 ulp of `sum / nranks`
//!   (nccl-tests' tolerance); integer avg is the sum divided by nranks, truncated. Every type
//!   of `-d all` is encodable this way, so `-d all` runs all twelve (`-o all` all five ops).
//!   Only the root's output of reduce is checked. `#wrong` sums the mismatching elements over
//!   the ranks.
//! - **Aggregation.** Each rank's time and `#wrong` are summed over the ranks with an
//!   all-reduce (u64 sum) on a small window — with threads too, so a failing rank aborts its
//!   communicator and the others stop with an error instead of waiting forever. Rank 0 checks
//!   that the sums are not below its own figures.
//! - **Output.** `#` lines (run parameters, ranks, backend, buffers), the nccl-tests header,
//!   one row per size with one extra trailing column `algo` (the algorithm symcomm's model, or
//!   `SYMCOMM_ALGO`, chose for that size), then `# Out of bounds values : N OK|FAILED` (N = the
//!   number of out-of-place / in-place results with errors) and `# Avg bus bandwidth    : X`
//!   (the mean busbw over every row, both columns). `--json` prints one JSON document on stdout
//!   instead: `{"collective", "nranks", "mode", "backend", "buffers", "dtype", "op", "root",
//!   "rows": [{"size", "count", "type", "redop", "root", "out_of_place": {"time_us", "algbw",
//!   "busbw", "wrong"}, "in_place": {..}, "algorithm"}], "avg_busbw", "out_of_bounds",
//!   "wrong"}` (`wrong` null when checks are off; `root` -1 and `redop` "none" where they do not
//!   apply, as in the table).
//! - **Exit status.** 0; 1 when any element is wrong or any call fails (the error is printed,
//!   prefixed with the rank); 2 for bad arguments (unknown collective, type or op, `-b` above
//!   `-e`, a root out of range).

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::process::ExitCode;
use std::time::Instant;

use serde::Serialize;
use symcomm::bootstrap::BootstrapConfig;
use symcomm::{
    Buffer, BufferRef, Collective, CommOptions, Communicator, DataType, Device, RedOp, Stream,
    UniqueId, Window,
};

/// Exit status for bad arguments.
const USAGE_ERROR: u8 = 2;
/// Most ranks `-t` starts.
const MAX_THREAD_RANKS: u32 = 1024;
/// nccl-tests' default additive step (`-i`).
const DEFAULT_STEP_BYTES: u64 = 1 << 20;
/// Byte the outputs are poisoned with before a check.
const POISON: u8 = 0xA5;
/// Largest absolute value the inputs use (a bound on the ranges below).
const VALUE_CAP: i64 = 100;

/// How the buffers of the benchmark are allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BufferKind {
    /// Symmetric windows (`alloc_window`): the zero-copy path.
    Window,
    /// Ordinary device memory (`alloc_buffer`): copied through the staging windows.
    Device,
}

impl BufferKind {
    fn name(self) -> &'static str {
        match self {
            BufferKind::Window => "window",
            BufferKind::Device => "device",
        }
    }
}

/// `symcomm perf` options (nccl-tests' letters and meanings).
#[derive(Debug, clap::Args)]
pub(crate) struct PerfArgs {
    /// all_reduce, all_gather, reduce_scatter, broadcast, reduce, scatter, all_to_all or
    /// sendrecv (nccl-tests names such as `alltoall` and `all_reduce_perf` work too).
    #[arg(value_name = "COLLECTIVE", default_value = "all_reduce")]
    collective: String,

    /// Smallest size in bytes; K, M, G suffixes (powers of 1024) [default: 8].
    #[arg(short = 'b', long = "minbytes", value_name = "BYTES", value_parser = parse_size)]
    minbytes: Option<u64>,

    /// Largest size in bytes; K, M, G suffixes [default: 256M on CUDA, 1M on the emulator].
    #[arg(short = 'e', long = "maxbytes", value_name = "BYTES", value_parser = parse_size)]
    maxbytes: Option<u64>,

    /// Multiply the size by F per step; 0 or 1 steps by -i bytes instead [default: 2 on CUDA,
    /// 4 on the emulator, unless -i is given].
    #[arg(short = 'f', long = "stepfactor", value_name = "F")]
    stepfactor: Option<u64>,

    /// Add BYTES per step when -f is 1 or absent [default: 1M].
    #[arg(short = 'i', long = "stepbytes", value_name = "BYTES", value_parser = parse_size)]
    stepbytes: Option<u64>,

    /// Timed calls per size [default: 20 on CUDA, 3 on the emulator].
    #[arg(
        short = 'n',
        long = "iters",
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    iters: Option<u32>,

    /// Warm-up calls at the largest and at the smallest size [default: 5 on CUDA, 1 on the
    /// emulator].
    #[arg(short = 'w', long = "warmup_iters", value_name = "N")]
    warmup: Option<u32>,

    /// Correctness checks per size and placement; 0 turns checking off (#wrong shows N/A).
    #[arg(short = 'c', long = "check", value_name = "N", default_value_t = 1)]
    check: u32,

    /// Reduction: sum, prod, min, max, avg, or all (ignored by collectives without one).
    #[arg(short = 'o', long = "op", value_name = "OP", default_value = "sum")]
    op: String,

    /// Element type: float, double, half, bfloat16, f8e4m3, f8e5m2, int8, uint8, int32,
    /// uint32, int64, uint64 (or f32, bf16, u8, ...), or all.
    #[arg(
        short = 'd',
        long = "datatype",
        value_name = "TYPE",
        default_value = "float"
    )]
    dtype: String,

    /// Root rank of broadcast, reduce and scatter.
    #[arg(short = 'r', long = "root", value_name = "RANK", default_value_t = 0)]
    root: u32,

    /// Ranks as threads of this process (ignored when a launcher started it).
    #[arg(
        short = 't',
        long = "nthreads",
        value_name = "N",
        default_value_t = 4,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_THREAD_RANKS))
    )]
    nthreads: u32,

    /// Symmetric windows (zero-copy) or ordinary device buffers (staged copies).
    #[arg(long, value_enum, value_name = "KIND", default_value = "window")]
    buffers: BufferKind,

    /// Print one JSON document on stdout instead of the table.
    #[arg(long)]
    json: bool,

    /// emu, cuda, cuda:N or auto [default: SYMCOMM_DEVICE, else auto].
    #[arg(long, value_name = "DEVICE")]
    device: Option<String>,

    /// Also measure a stream-ordered device-to-device copy of the largest size on each rank
    /// (the memory-bandwidth reference for busbw), printed after the table (JSON:
    /// `copy_bandwidth_gbps`, rank 0's).
    #[arg(long)]
    copy_bandwidth: bool,
}

/// Parses `8`, `64K`, `1M`, `2G` (powers of 1024; `k`, `m`, `g` too).
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        _ => (t, 0),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(1u64 << shift))
        .ok_or_else(|| format!("`{text}` is not a size in bytes (such as 8, 64K, 1M, 2G)"))
}

// ---------------------------------------------------------------------------------------------
// What the collectives do: the description table.

/// Blocks of `count` elements in a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blocks {
    One,
    PerRank,
}

/// Where the in-place form puts the send and receive buffers inside the one buffer (NCCL's
/// conventions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InPlace {
    /// The same memory.
    Same,
    /// send = recv + rank·count (all-gather).
    SendAtOwnBlock,
    /// recv = send + rank·count (reduce-scatter, scatter).
    RecvAtOwnBlock,
}

/// What rank r's output holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    /// Element j: the reduction of every rank's element j (all-reduce).
    Reduced,
    /// As [`Output::Reduced`] on the root only (reduce).
    ReducedOnRoot,
    /// Element j: the root's element j (broadcast).
    RootsCopy,
    /// Block p: rank p's input (all-gather).
    Gathered,
    /// The reduction of every rank's block r (reduce-scatter).
    ReducedOwnBlock,
    /// The root's block r (scatter).
    RootsOwnBlock,
    /// Block p: rank p's block r (all-to-all).
    Transposed,
    /// The input of rank r − 1 (sendrecv: nccl-tests' ring, send to r + 1, receive from r − 1).
    FromPrevious,
}

/// One collective's layout and result.
#[derive(Debug, Clone, Copy)]
struct Desc {
    coll: Collective,
    send: Blocks,
    recv: Blocks,
    in_place: InPlace,
    output: Output,
}

const DESCS: [Desc; 8] = [
    Desc {
        coll: Collective::AllReduce,
        send: Blocks::One,
        recv: Blocks::One,
        in_place: InPlace::Same,
        output: Output::Reduced,
    },
    Desc {
        coll: Collective::AllGather,
        send: Blocks::One,
        recv: Blocks::PerRank,
        in_place: InPlace::SendAtOwnBlock,
        output: Output::Gathered,
    },
    Desc {
        coll: Collective::ReduceScatter,
        send: Blocks::PerRank,
        recv: Blocks::One,
        in_place: InPlace::RecvAtOwnBlock,
        output: Output::ReducedOwnBlock,
    },
    Desc {
        coll: Collective::Broadcast,
        send: Blocks::One,
        recv: Blocks::One,
        in_place: InPlace::Same,
        output: Output::RootsCopy,
    },
    Desc {
        coll: Collective::Reduce,
        send: Blocks::One,
        recv: Blocks::One,
        in_place: InPlace::Same,
        output: Output::ReducedOnRoot,
    },
    Desc {
        coll: Collective::Scatter,
        send: Blocks::PerRank,
        recv: Blocks::One,
        in_place: InPlace::RecvAtOwnBlock,
        output: Output::RootsOwnBlock,
    },
    Desc {
        coll: Collective::AllToAll,
        send: Blocks::PerRank,
        recv: Blocks::PerRank,
        in_place: InPlace::Same,
        output: Output::Transposed,
    },
    Desc {
        coll: Collective::SendRecv,
        send: Blocks::One,
        recv: Blocks::One,
        in_place: InPlace::Same,
        output: Output::FromPrevious,
    },
];

/// Where the expected value of one output element comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The reduction over every rank of input element `index`.
    Reduce { index: u64 },
    /// Rank `rank`'s input element `index`.
    Copy { rank: u32, index: u64 },
    /// Not specified (reduce's output on other ranks than the root).
    Unchecked,
}

impl Desc {
    fn find(coll: Collective) -> Option<&'static Desc> {
        DESCS.iter().find(|d| d.coll == coll)
    }

    fn blocks(b: Blocks, n: u64) -> u64 {
        match b {
            Blocks::One => 1,
            Blocks::PerRank => n,
        }
    }

    /// The shape of one row: nccl-tests' `getCollByteCount` for a size of `bytes`.
    fn shape(&self, bytes: u64, dsize: u64, nranks: u32) -> Shape {
        let n = u64::from(nranks);
        let (sb, rb) = (Self::blocks(self.send, n), Self::blocks(self.recv, n));
        let count = bytes / dsize / sb.max(rb);
        Shape {
            count,
            send_elems: count * sb,
            recv_elems: count * rb,
            bytes: count * sb.max(rb) * dsize,
        }
    }

    /// (send, recv) element offsets inside the one in-place buffer of `rank`.
    fn in_place_offsets(&self, rank: u32, count: u64) -> (u64, u64) {
        let own = u64::from(rank) * count;
        match self.in_place {
            InPlace::Same => (0, 0),
            InPlace::SendAtOwnBlock => (own, 0),
            InPlace::RecvAtOwnBlock => (0, own),
        }
    }

    /// What output element `j` of `rank` (of `nranks`) must hold (`count` per block).
    fn source(&self, rank: u32, nranks: u32, root: u32, count: u64, j: u64) -> Source {
        let own = u64::from(rank) * count;
        let (block, at) = (j / count.max(1), j % count.max(1));
        match self.output {
            Output::Reduced => Source::Reduce { index: j },
            Output::ReducedOnRoot if rank == root => Source::Reduce { index: j },
            Output::ReducedOnRoot => Source::Unchecked,
            Output::RootsCopy => Source::Copy {
                rank: root,
                index: j,
            },
            Output::Gathered => Source::Copy {
                rank: block as u32,
                index: at,
            },
            Output::ReducedOwnBlock => Source::Reduce { index: own + j },
            Output::RootsOwnBlock => Source::Copy {
                rank: root,
                index: own + j,
            },
            Output::Transposed => Source::Copy {
                rank: block as u32,
                index: own + at,
            },
            Output::FromPrevious => Source::Copy {
                rank: (rank + nranks - 1) % nranks,
                index: j,
            },
        }
    }
}

/// One row's element counts (nccl-tests' `setupArgs`).
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// The per-rank count passed to the call (the `count` column).
    count: u64,
    send_elems: u64,
    recv_elems: u64,
    /// The `size` column: max(send, recv) bytes.
    bytes: u64,
}

// ---------------------------------------------------------------------------------------------
// Element encodings and the values the checks use.

/// How a type stores numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fmt {
    /// IEEE-style binary floating point (f64, f32, f16, bf16, OCP fp8), no NaN/inf produced.
    Float { ebits: u32, mbits: u32 },
    /// Two's complement or unsigned integer.
    Int { signed: bool, bits: u32 },
}

impl Fmt {
    fn of(dt: DataType) -> Option<Fmt> {
        let float = |ebits, mbits| Some(Fmt::Float { ebits, mbits });
        let int = |signed, bits| Some(Fmt::Int { signed, bits });
        match dt {
            DataType::F64 => float(11, 52),
            DataType::F32 => float(8, 23),
            DataType::F16 => float(5, 10),
            DataType::Bf16 => float(8, 7),
            DataType::Fp8E4m3 => float(4, 3),
            DataType::Fp8E5m2 => float(5, 2),
            DataType::I8 => int(true, 8),
            DataType::U8 => int(false, 8),
            DataType::I32 => int(true, 32),
            DataType::U32 => int(false, 32),
            DataType::I64 => int(true, 64),
            DataType::U64 => int(false, 64),
            _ => None,
        }
    }

    fn signed(self) -> bool {
        match self {
            Fmt::Float { .. } => true,
            Fmt::Int { signed, .. } => signed,
        }
    }

    /// Largest m such that every integer in 0..=m is exact.
    fn exact_max(self) -> i64 {
        match self {
            Fmt::Float { mbits, .. } => 1i64 << (mbits + 1).min(62),
            Fmt::Int { signed, bits } => {
                let b = if signed { bits - 1 } else { bits };
                if b >= 63 { i64::MAX } else { (1i64 << b) - 1 }
            }
        }
    }

    fn bias(ebits: u32) -> i32 {
        (1 << (ebits - 1)) - 1
    }

    /// The bits of integer `v` (exact for the values of [`Data::input`]; integers wrap).
    fn encode(self, v: i64) -> u64 {
        match self {
            Fmt::Int { bits, .. } => {
                if bits >= 64 {
                    v as u64
                } else {
                    (v as u64) & ((1u64 << bits) - 1)
                }
            }
            Fmt::Float { ebits, mbits } => {
                if v == 0 {
                    return 0;
                }
                let sign = u64::from(v < 0) << (ebits + mbits);
                let a = v.unsigned_abs();
                let e = 63 - a.leading_zeros();
                let man = if e >= mbits {
                    a >> (e - mbits)
                } else {
                    a << (mbits - e)
                } & ((1u64 << mbits) - 1);
                let field = (e as i32 + Self::bias(ebits)) as u64;
                sign | (field << mbits) | man
            }
        }
    }

    /// The value of float bits (finite encodings).
    fn decode(self, b: u64) -> f64 {
        match self {
            Fmt::Int { .. } => b as f64,
            Fmt::Float { ebits, mbits } => {
                let neg = (b >> (ebits + mbits)) & 1 == 1;
                let field = ((b >> mbits) & ((1u64 << ebits) - 1)) as i32;
                let man = (b & ((1u64 << mbits) - 1)) as f64 / 2f64.powi(mbits as i32);
                let bias = Self::bias(ebits);
                let mag = if field == 0 {
                    man * 2f64.powi(1 - bias)
                } else {
                    (1.0 + man) * 2f64.powi(field - bias)
                };
                if neg { -mag } else { mag }
            }
        }
    }

    /// One unit in the last place at `x` (floats).
    fn ulp(self, x: f64) -> f64 {
        match self {
            Fmt::Int { .. } => 0.0,
            Fmt::Float { ebits, mbits } => {
                let min_exp = 1 - Self::bias(ebits);
                let e = if x == 0.0 {
                    min_exp
                } else {
                    (x.abs().log2().floor() as i32).max(min_exp)
                };
                2f64.powi(e - mbits as i32)
            }
        }
    }
}

/// What a checked element must be.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Bits(u64),
    /// Float avg: within 2 ulp of this value.
    Near(f64),
    Any,
}

/// The inputs of one check: type, op, rank count, seed.
#[derive(Debug, Clone, Copy)]
struct Data {
    fmt: Fmt,
    dsize: usize,
    op: Option<RedOp>,
    nranks: u32,
    seed: u64,
}

fn mix(mut z: u64) -> u64 {
    // splitmix64's finalizer.
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Data {
    /// Rank `rank`'s input element `j` (an integer; see the module docs for the ranges).
    fn input(&self, rank: u32, j: u64) -> i64 {
        let h = mix(self.seed ^ mix(u64::from(rank).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ j));
        let n = i64::from(self.nranks);
        let m = self.fmt.exact_max();
        let pick = |lo: i64, hi: i64| lo + (h % (hi - lo + 1) as u64) as i64;
        match self.op {
            None => match self.fmt {
                Fmt::Int { .. } => h as i64,
                Fmt::Float { .. } => {
                    let r = (m / 2).min(1000);
                    pick(-r, r)
                }
            },
            Some(RedOp::Prod) => {
                let twos = (j + u64::from(rank)) % u64::from(self.nranks)
                    == self.seed % 7 % u64::from(self.nranks);
                if twos && h & 1 == 1 {
                    2
                } else if self.fmt.signed() && h % 4 == 0 {
                    -1
                } else {
                    1
                }
            }
            Some(RedOp::Min | RedOp::Max) => {
                if self.fmt.signed() {
                    pick(-8, 8)
                } else {
                    pick(0, 16)
                }
            }
            // Sum, avg: the total stays exact.
            Some(_) => {
                let k = (m / n).min(VALUE_CAP);
                if k == 0 {
                    i64::from((j + u64::from(rank)) % u64::from(self.nranks) == 0)
                } else {
                    pick(0, k)
                }
            }
        }
    }

    fn expect(&self, src: Source) -> Expect {
        match src {
            Source::Unchecked => Expect::Any,
            Source::Copy { rank, index } => Expect::Bits(self.fmt.encode(self.input(rank, index))),
            Source::Reduce { index } => {
                let vals = (0..self.nranks).map(|r| self.input(r, index));
                let enc = |v: i64| Expect::Bits(self.fmt.encode(v));
                match self.op {
                    Some(RedOp::Sum) => enc(vals.sum()),
                    Some(RedOp::Prod) => enc(vals.product()),
                    Some(RedOp::Min) => enc(vals.min().unwrap_or(0)),
                    Some(RedOp::Max) => enc(vals.max().unwrap_or(0)),
                    Some(RedOp::Avg) => {
                        let sum: i64 = vals.sum();
                        match self.fmt {
                            Fmt::Int { .. } => enc(sum / i64::from(self.nranks)),
                            Fmt::Float { .. } => Expect::Near(sum as f64 / f64::from(self.nranks)),
                        }
                    }
                    _ => Expect::Any,
                }
            }
        }
    }

    fn matches(&self, got: u64, want: Expect) -> bool {
        match want {
            Expect::Any => true,
            Expect::Bits(b) => got == b,
            Expect::Near(x) => (self.fmt.decode(got) - x).abs() <= 2.0 * self.fmt.ulp(x),
        }
    }

    /// `count` elements from input index `first` of `rank`, as bytes.
    fn input_bytes(&self, rank: u32, first: u64, count: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(count as usize * self.dsize);
        for j in first..first + count {
            let bits = self.fmt.encode(self.input(rank, j));
            out.extend_from_slice(&bits.to_le_bytes()[..self.dsize]);
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// Buffers: a window or device memory, as bytes.

enum Mem {
    Window(Window<u8>),
    Device(Buffer),
}

impl Mem {
    fn alloc(comm: &Communicator, kind: BufferKind, bytes: u64) -> symcomm::Result<Self> {
        let bytes = bytes.max(8) as usize;
        Ok(match kind {
            BufferKind::Window => Mem::Window(comm.alloc_window::<u8>(bytes)?),
            BufferKind::Device => Mem::Device(comm.alloc_buffer(bytes)?),
        })
    }

    fn len(&self) -> u64 {
        match self {
            Mem::Window(w) => w.len() as u64,
            Mem::Device(b) => b.len() as u64,
        }
    }

    fn bounds(&self, off: u64, len: u64) -> symcomm::Result<()> {
        if off.checked_add(len).is_some_and(|end| end <= self.len()) {
            Ok(())
        } else {
            Err(symcomm::Error::InvalidArgument(format!(
                "bytes {off}..{off}+{len} are outside a buffer of {}",
                self.len()
            )))
        }
    }

    /// Bytes `off..off + len` as a collective argument.
    fn part(&self, off: u64, len: u64) -> symcomm::Result<BufferRef<'_>> {
        self.bounds(off, len)?;
        match self {
            Mem::Window(w) => w.range(off as usize, len as usize),
            // SAFETY: the range lies inside the buffer (checked above), which outlives every
            // call made with it: calls are synchronized before `self` drops.
            Mem::Device(b) => Ok(unsafe { BufferRef::from_raw(b.addr() + off, len) }),
        }
    }

    fn write(&self, off: u64, data: &[u8]) -> symcomm::Result<()> {
        self.bounds(off, data.len() as u64)?;
        match self {
            Mem::Window(w) => w.write(off as usize, data),
            Mem::Device(b) => b.write(off as usize, data),
        }
    }

    fn read(&self, off: u64, out: &mut [u8]) -> symcomm::Result<()> {
        self.bounds(off, out.len() as u64)?;
        match self {
            Mem::Window(w) => w.read(off as usize, out),
            Mem::Device(b) => b.read(off as usize, out),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The plan: what to run, with the backend's defaults filled in.

/// How sizes grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Factor(u64),
    Bytes(u64),
}

/// The sizes of a run (`-b`, `-e`, `-f` / `-i`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sweep {
    min: u64,
    max: u64,
    step: Step,
}

impl Sweep {
    fn sizes(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut s = self.min;
        while s <= self.max {
            out.push(s);
            let next = match self.step {
                Step::Factor(f) => s.checked_mul(f),
                Step::Bytes(b) => s.checked_add(b),
            };
            match next {
                Some(n) if n > s => s = n,
                _ => break,
            }
        }
        out
    }

    fn step_text(&self) -> String {
        match self.step {
            Step::Factor(f) => format!("{f}(factor)"),
            Step::Bytes(b) => format!("{b}(bytes)"),
        }
    }
}

/// A usage error (exit status 2) or a failure (exit status 1).
#[derive(Debug)]
enum Failure {
    Usage(String),
    Run(String),
}

impl From<symcomm::Error> for Failure {
    fn from(e: symcomm::Error) -> Self {
        Failure::Run(e.to_string())
    }
}

/// The arguments checked, before the backend is known.
#[derive(Debug, Clone)]
struct Request {
    desc: &'static Desc,
    dtypes: Vec<DataType>,
    /// `[None]` for collectives without an op.
    ops: Vec<Option<RedOp>>,
    dtype_text: String,
    op_text: String,
    root: u32,
    minbytes: Option<u64>,
    maxbytes: Option<u64>,
    stepfactor: Option<u64>,
    stepbytes: Option<u64>,
    iters: Option<u32>,
    warmup: Option<u32>,
    check: u32,
    buffers: BufferKind,
    json: bool,
    copy_bandwidth: bool,
}

/// The defaults of one backend.
struct Defaults {
    maxbytes: u64,
    factor: u64,
    iters: u32,
    warmup: u32,
}

const CUDA_DEFAULTS: Defaults = Defaults {
    maxbytes: 256 << 20,
    factor: 2,
    iters: 20,
    warmup: 5,
};
const EMU_DEFAULTS: Defaults = Defaults {
    maxbytes: 1 << 20,
    factor: 4,
    iters: 3,
    warmup: 1,
};
const DEFAULT_MINBYTES: u64 = 8;

/// Everything a rank runs.
#[derive(Debug, Clone)]
struct Plan {
    req: Request,
    sweep: Sweep,
    iters: u32,
    warmup: u32,
}

impl Request {
    fn from_args(a: &PerfArgs) -> Result<Request, String> {
        let coll = Collective::parse(&a.collective).ok_or_else(|| {
            format!(
                "unknown collective `{}`; expected one of {}",
                a.collective,
                DESCS.map(|d| d.coll.name()).join(", ")
            )
        })?;
        let desc = Desc::find(coll)
            .ok_or_else(|| format!("{} is not available yet in symcomm perf", coll.name()))?;
        let dtypes = if a.dtype == "all" {
            DataType::ALL
                .into_iter()
                .filter(|d| Fmt::of(*d).is_some())
                .collect()
        } else {
            let d = DataType::parse(&a.dtype)
                .filter(|d| Fmt::of(*d).is_some())
                .ok_or_else(|| {
                    format!(
                        "unknown datatype `{}`; expected all or one of {}",
                        a.dtype,
                        DataType::ALL.map(DataType::name).join(", ")
                    )
                })?;
            vec![d]
        };
        let known = [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::Avg];
        let ops: Vec<RedOp> = if a.op == "all" {
            known.to_vec()
        } else {
            let o = RedOp::parse(&a.op)
                .filter(|o| known.contains(o))
                .ok_or_else(|| {
                    format!(
                        "unknown op `{}`; expected all or one of {}",
                        a.op,
                        known.map(RedOp::name).join(", ")
                    )
                })?;
            vec![o]
        };
        let ops = if coll.has_op() {
            ops.into_iter().map(Some).collect()
        } else {
            vec![None]
        };
        if let (Some(b), Some(e)) = (a.minbytes, a.maxbytes) {
            if b > e {
                return Err(format!(
                    "minbytes ({b}) is larger than maxbytes ({e}): -b must not exceed -e"
                ));
            }
        }
        Ok(Request {
            desc,
            dtypes,
            ops,
            dtype_text: a.dtype.clone(),
            op_text: if coll.has_op() {
                a.op.clone()
            } else {
                "none".into()
            },
            root: a.root,
            minbytes: a.minbytes,
            maxbytes: a.maxbytes,
            stepfactor: a.stepfactor,
            stepbytes: a.stepbytes,
            iters: a.iters,
            warmup: a.warmup,
            check: a.check,
            buffers: a.buffers,
            json: a.json,
            copy_bandwidth: a.copy_bandwidth,
        })
    }

    /// Fills in the defaults of the backend (`emu`) and checks what needs the rank count.
    fn plan(&self, emu: bool, nranks: u32) -> Result<Plan, Failure> {
        let d = if emu { &EMU_DEFAULTS } else { &CUDA_DEFAULTS };
        let (min, max) = match (self.minbytes, self.maxbytes) {
            (Some(b), Some(e)) => (b, e),
            (Some(b), None) => (b, d.maxbytes.max(b)),
            (None, Some(e)) => (DEFAULT_MINBYTES.min(e), e),
            (None, None) => (DEFAULT_MINBYTES, d.maxbytes),
        };
        let factor = match (self.stepfactor, self.stepbytes) {
            (Some(f), _) => f,
            (None, Some(_)) => 1,
            (None, None) => d.factor,
        };
        let step = if factor > 1 {
            if min == 0 {
                return Err(Failure::Usage(
                    "-b 0 with a step factor never grows; give -b above 0 or a step in bytes (-f 1 -i BYTES)"
                        .into(),
                ));
            }
            Step::Factor(factor)
        } else {
            match self.stepbytes.unwrap_or(DEFAULT_STEP_BYTES) {
                0 => return Err(Failure::Usage("-i must be above 0".into())),
                b => Step::Bytes(b),
            }
        };
        if self.desc.coll.has_root() && self.root >= nranks {
            return Err(Failure::Usage(format!(
                "root {} is out of range for {nranks} ranks",
                self.root
            )));
        }
        Ok(Plan {
            req: self.clone(),
            sweep: Sweep { min, max, step },
            iters: self.iters.unwrap_or(d.iters),
            warmup: self.warmup.unwrap_or(d.warmup),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Results and their printing.

/// One placement's figures, aggregated over the ranks.
#[derive(Debug, Clone, Copy, Serialize)]
struct Timing {
    time_us: f64,
    algbw: f64,
    busbw: f64,
    /// `None` when checks are off.
    wrong: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    size: u64,
    count: u64,
    #[serde(rename = "type")]
    dtype: &'static str,
    redop: &'static str,
    root: i64,
    out_of_place: Timing,
    in_place: Timing,
    algorithm: &'static str,
}

#[derive(Debug, Serialize)]
struct JsonReport<'a> {
    collective: &'static str,
    nranks: u32,
    mode: &'static str,
    backend: String,
    buffers: &'static str,
    dtype: &'a str,
    op: &'a str,
    root: i64,
    rows: &'a [Row],
    avg_busbw: f64,
    out_of_bounds: u32,
    wrong: Option<u64>,
    copy_bandwidth_gbps: Option<f64>,
}

/// What every rank learns from a run (from the aggregated figures, so the same on every rank).
#[derive(Debug, Default)]
struct Summary {
    rows: Vec<Row>,
    /// This rank's device-to-device copy bandwidth at the largest size, GB/s (`--copy-bandwidth`).
    copy_gbps: Option<f64>,
}

impl Summary {
    fn avg_busbw(&self) -> f64 {
        let bws: Vec<f64> = self
            .rows
            .iter()
            .flat_map(|r| [r.out_of_place.busbw, r.in_place.busbw])
            .collect();
        if bws.is_empty() {
            0.0
        } else {
            bws.iter().sum::<f64>() / bws.len() as f64
        }
    }

    /// Results (row × placement) with wrong elements.
    fn out_of_bounds(&self) -> u32 {
        self.rows
            .iter()
            .flat_map(|r| [r.out_of_place.wrong, r.in_place.wrong])
            .filter(|w| w.is_some_and(|w| w > 0))
            .count() as u32
    }

    fn wrong(&self, checked: bool) -> Option<u64> {
        checked.then(|| {
            self.rows
                .iter()
                .flat_map(|r| [r.out_of_place.wrong, r.in_place.wrong])
                .map(|w| w.unwrap_or(0))
                .sum()
        })
    }
}

/// C's `%g` (6 significant digits, trailing zeros dropped).
fn fmt_g(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    if !x.is_finite() {
        return format!("{x}");
    }
    let sci = format!("{x:.5e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s.to_owned()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mant), exp.abs())
    } else {
        let decimals = (5 - exp).max(0) as usize;
        trim(&format!("{x:.decimals$}"))
    }
}

/// nccl-tests' time column: 2 decimals below 100 µs, 1 below 10 ms, none above.
fn fmt_time(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

fn header_lines() -> [String; 3] {
    let e = "";
    [
        format!(
            "# {e:>10}  {e:>12}  {e:>8}  {e:>6}  {e:>6}           out-of-place                       in-place"
        ),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  {:>6} {:>6}  algo",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong"
        ),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  {:>6}",
            "(B)", "(elements)", e, e, e, "(us)", "(GB/s)", "(GB/s)", e, "(us)", "(GB/s)", "(GB/s)"
        ),
    ]
}

fn row_line(r: &Row) -> String {
    let group = |t: &Timing| {
        let wrong = t.wrong.map_or_else(|| "N/A".to_owned(), |w| w.to_string());
        format!(
            "  {}  {:6.2}  {:6.2}  {wrong:>5}",
            fmt_time(t.time_us),
            t.algbw,
            t.busbw
        )
    };
    format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}{}{}  {}",
        r.size,
        r.count,
        r.dtype,
        r.redop,
        r.root,
        group(&r.out_of_place),
        group(&r.in_place),
        r.algorithm
    )
}

/// Rank 0's output: the table as it goes, or the JSON document at the end.
struct Printer {
    json: bool,
}

impl Printer {
    fn line(&self, s: &str) {
        if !self.json {
            println!("{s}");
        }
    }

    fn header(&self, comm: &Communicator, plan: &Plan, mode: &str) {
        let r = &plan.req;
        let threads = if mode == "threads" { comm.nranks() } else { 1 };
        self.line(&format!(
            "# symcomm perf {} (nccl-tests columns), symcomm {}",
            r.desc.coll.name(),
            env!("CARGO_PKG_VERSION")
        ));
        self.line(&format!(
            "# nThread {threads} nGpus 1 minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} agg iters: 1 validation: {} graph: 0",
            plan.sweep.min,
            plan.sweep.max,
            plan.sweep.step_text(),
            plan.warmup,
            plan.iters,
            r.check
        ));
        self.line("#");
        self.line("# Using devices");
        for info in comm.table() {
            let host = info.host_id.split('/').next().unwrap_or(&info.host_id);
            self.line(&format!(
                "#  Rank {:2} Group  0 Pid {:6} on {host:>10}",
                info.rank, info.pid
            ));
        }
        let how = if mode == "threads" {
            "threads of one process"
        } else {
            "processes"
        };
        self.line(&format!(
            "# Ranks: {} as {how}; backend: {}; buffers: {}",
            comm.nranks(),
            comm.backend().name(),
            match r.buffers {
                BufferKind::Window => "window (symmetric windows, zero-copy)",
                BufferKind::Device => "device (ordinary device memory, staged copies)",
            }
        ));
        self.line(
            "# algo: the algorithm symcomm's model (or SYMCOMM_ALGO) chose for each size; time: mean over ranks",
        );
        self.line("#");
        for h in header_lines() {
            self.line(h.trim_end());
        }
    }

    fn row(&self, r: &Row) {
        self.line(&row_line(r));
    }

    fn footer(&self, comm: &Communicator, plan: &Plan, mode: &'static str, s: &Summary) {
        let checked = plan.req.check > 0;
        if self.json {
            let report = JsonReport {
                collective: plan.req.desc.coll.name(),
                nranks: comm.nranks(),
                mode,
                backend: comm.backend().name(),
                buffers: plan.req.buffers.name(),
                dtype: &plan.req.dtype_text,
                op: &plan.req.op_text,
                root: root_column(plan),
                rows: &s.rows,
                avg_busbw: s.avg_busbw(),
                out_of_bounds: s.out_of_bounds(),
                wrong: s.wrong(checked),
                copy_bandwidth_gbps: s.copy_gbps,
            };
            match serde_json::to_string_pretty(&report) {
                Ok(text) => println!("{text}"),
                Err(e) => eprintln!("symcomm perf: JSON output: {e}"),
            }
        } else {
            let oob = s.out_of_bounds();
            self.line(&format!(
                "# Out of bounds values : {oob} {}",
                if oob > 0 { "FAILED" } else { "OK" }
            ));
            self.line(&format!(
                "# Avg bus bandwidth    : {}",
                fmt_g(s.avg_busbw())
            ));
            if let Some(gbps) = s.copy_gbps {
                self.line(&format!(
                    "# Device copy bandwidth: {} GB/s (rank 0, stream-ordered copy of {} bytes)",
                    fmt_g(gbps),
                    plan.sweep.max
                ));
            }
            self.line("#");
        }
        let _ = std::io::stdout().flush();
    }
}

fn root_column(plan: &Plan) -> i64 {
    if plan.req.desc.coll.has_root() {
        i64::from(plan.req.root)
    } else {
        -1
    }
}

// ---------------------------------------------------------------------------------------------
// One rank's run.

/// One rank's buffers, stream and statistics windows.
struct Bench<'c> {
    comm: &'c Communicator,
    plan: &'c Plan,
    stream: Stream,
    send: Mem,
    recv: Mem,
    stats_in: Window<u64>,
    stats_out: Window<u64>,
}

impl<'c> Bench<'c> {
    fn new(comm: &'c Communicator, plan: &'c Plan) -> symcomm::Result<Self> {
        // Every size's send and receive bytes are at most its S, and S at most -e.
        let cap = plan.sweep.max;
        Ok(Bench {
            comm,
            plan,
            stream: comm.create_stream()?,
            send: Mem::alloc(comm, plan.req.buffers, cap)?,
            recv: Mem::alloc(comm, plan.req.buffers, cap)?,
            stats_in: comm.alloc_window::<u64>(4)?,
            stats_out: comm.alloc_window::<u64>(4)?,
        })
    }

    /// Enqueues one call of the collective for `shape`.
    fn call(
        &self,
        shape: &Shape,
        dt: DataType,
        op: Option<RedOp>,
        in_place: bool,
    ) -> symcomm::Result<()> {
        let desc = self.plan.req.desc;
        let sz = dt.size() as u64;
        let (send, recv) = if in_place {
            let (so, ro) = desc.in_place_offsets(self.comm.rank(), shape.count);
            (
                self.recv.part(so * sz, shape.send_elems * sz)?,
                self.recv.part(ro * sz, shape.recv_elems * sz)?,
            )
        } else {
            (
                self.send.part(0, shape.send_elems * sz)?,
                self.recv.part(0, shape.recv_elems * sz)?,
            )
        };
        let (c, s, root) = (shape.count as usize, &self.stream, self.plan.req.root);
        let op = op.unwrap_or(RedOp::Sum);
        let comm = self.comm;
        match desc.coll {
            Collective::AllReduce => comm.all_reduce(send, recv, c, dt, op, s),
            Collective::AllGather => comm.all_gather(send, recv, c, dt, s),
            Collective::ReduceScatter => comm.reduce_scatter(send, recv, c, dt, op, s),
            Collective::Broadcast => comm.broadcast(send, recv, c, dt, root, s),
            Collective::Reduce => comm.reduce(send, recv, c, dt, op, root, s),
            Collective::Scatter => comm.scatter(send, recv, c, dt, root, s),
            Collective::AllToAll => comm.all_to_all(send, recv, c, dt, s),
            Collective::SendRecv => {
                let n = comm.nranks();
                let (next, prev) = ((comm.rank() + 1) % n, (comm.rank() + n - 1) % n);
                comm.group(s, |g| {
                    g.send(send, c, dt, next)?;
                    g.recv(recv, c, dt, prev)
                })
            }
        }
    }

    fn synchronize(&self) -> symcomm::Result<()> {
        self.stream.synchronize()?;
        self.comm.check_error()
    }

    fn warm_up(&self, dt: DataType, op: Option<RedOp>, size: u64) -> symcomm::Result<()> {
        let shape = self
            .plan
            .req
            .desc
            .shape(size, dt.size() as u64, self.comm.nranks());
        for _ in 0..self.plan.warmup {
            self.call(&shape, dt, op, false)?;
        }
        self.synchronize()
    }

    /// Nanoseconds of `iters` timed calls.
    fn time(
        &self,
        shape: &Shape,
        dt: DataType,
        op: Option<RedOp>,
        in_place: bool,
    ) -> symcomm::Result<u64> {
        self.call(shape, dt, op, in_place)?;
        self.synchronize()?;
        self.comm.barrier()?;
        let start = Instant::now();
        for _ in 0..self.plan.iters {
            self.call(shape, dt, op, in_place)?;
        }
        self.stream.synchronize()?;
        let ns = start.elapsed().as_nanos();
        self.comm.check_error()?;
        Ok(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// Up to `-c` checks; this rank's wrong elements (0 when checks are off).
    fn check(
        &self,
        shape: &Shape,
        dt: DataType,
        op: Option<RedOp>,
        in_place: bool,
        seed: u64,
    ) -> symcomm::Result<u64> {
        let (rank, n) = (self.comm.rank(), self.comm.nranks());
        let desc = self.plan.req.desc;
        let sz = dt.size() as u64;
        let Some(fmt) = Fmt::of(dt) else {
            return Ok(0);
        };
        for c in 0..self.plan.req.check {
            let data = Data {
                fmt,
                dsize: dt.size(),
                op,
                nranks: n,
                seed: mix(seed ^ mix(u64::from(c) + 1)),
            };
            let input = data.input_bytes(rank, 0, shape.send_elems);
            // In place, the whole buffer is poisoned first, then the input written into it.
            let recv_off = if in_place {
                let (so, ro) = desc.in_place_offsets(rank, shape.count);
                let span = shape.send_elems.max(shape.recv_elems) * sz;
                self.recv.write(0, &vec![POISON; span as usize])?;
                self.recv.write(so * sz, &input)?;
                ro
            } else {
                self.send.write(0, &input)?;
                self.recv
                    .write(0, &vec![POISON; (shape.recv_elems * sz) as usize])?;
                0
            };
            // Every rank's inputs are in place before any kernel reads a peer's.
            self.comm.barrier()?;
            self.call(shape, dt, op, in_place)?;
            self.synchronize()?;
            let mut out = vec![0u8; (shape.recv_elems * sz) as usize];
            self.recv.read(recv_off * sz, &mut out)?;
            let root = self.plan.req.root;
            let mut wrong = 0u64;
            for (j, bytes) in out.chunks_exact(dt.size()).enumerate() {
                let mut word = [0u8; 8];
                word[..bytes.len()].copy_from_slice(bytes);
                let got = u64::from_le_bytes(word);
                let want = data.expect(desc.source(rank, n, root, shape.count, j as u64));
                if !data.matches(got, want) {
                    wrong += 1;
                }
            }
            // Nobody's next call writes into a buffer another rank is still reading.
            self.comm.barrier()?;
            if wrong > 0 {
                return Ok(wrong);
            }
        }
        Ok(0)
    }

    /// Element-wise u64 sums over the ranks.
    fn sum_over_ranks(&self, mine: [u64; 4]) -> symcomm::Result<[u64; 4]> {
        self.stats_in.write(0, &mine)?;
        self.comm.all_reduce(
            &self.stats_in,
            &self.stats_out,
            4,
            DataType::U64,
            RedOp::Sum,
            &self.stream,
        )?;
        self.synchronize()?;
        let mut total = [0u64; 4];
        self.stats_out.read(0, &mut total)?;
        if total.iter().zip(&mine).any(|(t, m)| t < m) {
            return Err(symcomm::Error::InvalidArgument(format!(
                "the statistics all-reduce returned {total:?}, less than this rank's own {mine:?}"
            )));
        }
        Ok(total)
    }

    /// GB/s of a stream-ordered copy of `bytes` between two ordinary buffers of this rank
    /// (mean of `iters` copies after one warm-up), every rank at once.
    fn copy_bandwidth(&self, bytes: u64, iters: u32) -> Result<f64, Failure> {
        let len = usize::try_from(bytes.max(1)).unwrap_or(usize::MAX);
        let src = self.comm.alloc_buffer(len)?;
        let dst = self.comm.alloc_buffer(len)?;
        self.comm.barrier()?;
        let copy = || {
            // SAFETY: both buffers hold `len` bytes, do not overlap, and outlive the copies
            // (synchronized below before they drop).
            unsafe { self.stream.copy_raw(dst.addr(), src.addr(), len as u64) }
        };
        copy()?;
        self.synchronize()?;
        let t = std::time::Instant::now();
        for _ in 0..iters.max(1) {
            copy()?;
        }
        self.synchronize()?;
        let secs = t.elapsed().as_secs_f64() / f64::from(iters.max(1));
        Ok(if secs > 0.0 {
            len as f64 / secs / 1e9
        } else {
            0.0
        })
    }

    fn run(&self, printer: Option<&Printer>, mode: &'static str) -> Result<Summary, Failure> {
        let plan = self.plan;
        let n = self.comm.nranks();
        let desc = plan.req.desc;
        let sizes = plan.sweep.sizes();
        if let Some(p) = printer {
            p.header(self.comm, plan, mode);
        }
        let mut summary = Summary::default();
        for (ti, &dt) in plan.req.dtypes.iter().enumerate() {
            for (oi, &op) in plan.req.ops.iter().enumerate() {
                self.comm.barrier()?;
                self.warm_up(dt, op, plan.sweep.max)?;
                self.warm_up(dt, op, plan.sweep.min)?;
                for (si, &size) in sizes.iter().enumerate() {
                    let shape = desc.shape(size, dt.size() as u64, n);
                    let algo = self.comm.algorithm_for(desc.coll, shape.bytes)?;
                    let mut mine = [0u64; 4];
                    for (k, in_place) in [false, true].into_iter().enumerate() {
                        mine[2 * k] = self.time(&shape, dt, op, in_place)?;
                        let seed = mix(((ti as u64) << 48)
                            ^ ((oi as u64) << 40)
                            ^ ((si as u64) << 8)
                            ^ k as u64);
                        mine[2 * k + 1] = self.check(&shape, dt, op, in_place, seed)?;
                    }
                    let total = self.sum_over_ranks(mine)?;
                    let timing = |ns: u64, wrong: u64| {
                        let time_us = ns as f64 / f64::from(n) / f64::from(plan.iters) / 1e3;
                        let algbw = if time_us > 0.0 {
                            shape.bytes as f64 / time_us / 1e3
                        } else {
                            0.0
                        };
                        Timing {
                            time_us,
                            algbw,
                            busbw: algbw * desc.coll.bus_factor(n),
                            wrong: (plan.req.check > 0).then_some(wrong),
                        }
                    };
                    let row = Row {
                        size: shape.bytes,
                        count: shape.count,
                        dtype: dt.name(),
                        redop: op.map_or("none", RedOp::name),
                        root: root_column(plan),
                        out_of_place: timing(total[0], total[1]),
                        in_place: timing(total[2], total[3]),
                        algorithm: algo.name(),
                    };
                    if let Some(p) = printer {
                        p.row(&row);
                    }
                    summary.rows.push(row);
                }
            }
        }
        if plan.req.copy_bandwidth {
            summary.copy_gbps = Some(self.copy_bandwidth(plan.sweep.max, plan.iters)?);
        }
        if let Some(p) = printer {
            p.footer(self.comm, plan, mode, &summary);
        }
        Ok(summary)
    }
}

/// One rank: the plan for its backend, the run; aborts the communicator on failure so that
/// the other ranks stop too.
fn run_rank(comm: &Communicator, req: &Request, mode: &'static str) -> Result<Summary, Failure> {
    let plan = req.plan(comm.backend().is_emu(), comm.nranks())?;
    let printer = (comm.rank() == 0).then_some(Printer { json: req.json });
    let result = Bench::new(comm, &plan)
        .map_err(Failure::from)
        .and_then(|b| b.run(printer.as_ref(), mode));
    if let Err(Failure::Run(_)) = &result {
        comm.abort();
    }
    result
}

/// Whether a launcher started this process as one rank of a job.
fn launched() -> bool {
    ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// Runs `symcomm perf`; the exit status is described in the module docs.
pub(crate) fn run(args: &PerfArgs) -> ExitCode {
    let req = match Request::from_args(args) {
        Ok(r) => r,
        Err(msg) => {
            eprintln!("symcomm perf: {msg}");
            return ExitCode::from(USAGE_ERROR);
        }
    };
    let device = match args.device.as_deref() {
        Some(d) => Device::parse(d),
        None => Device::from_env(),
    };
    let device = match device {
        Ok(d) => d,
        Err(e) => {
            eprintln!("symcomm perf: {e}");
            return ExitCode::from(USAGE_ERROR);
        }
    };
    let results: Vec<(u32, Result<Summary, Failure>)> = if launched() {
        let result = BootstrapConfig::from_env()
            .and_then(|config| Communicator::init_with(&config, device, &CommOptions::from_env()?))
            .map_err(Failure::from)
            .and_then(|comm| run_rank(&comm, &req, "processes").map(|s| (comm.rank(), s)));
        let rank = std::env::var("RANK")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        vec![match result {
            Ok((r, s)) => (r, Ok(s)),
            Err(e) => (rank, Err(e)),
        }]
    } else {
        run_threads(&req, args.nthreads, device)
    };
    finish(&req, results)
}

/// `nranks` ranks as threads of this process.
fn run_threads(req: &Request, nranks: u32, device: Device) -> Vec<(u32, Result<Summary, Failure>)> {
    let id = match UniqueId::new_on(IpAddr::V4(Ipv4Addr::LOCALHOST)) {
        Ok(id) => id,
        Err(e) => return vec![(0, Err(Failure::from(e)))],
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..nranks)
            .map(|r| {
                let id = &id;
                std::thread::Builder::new()
                    .name(format!("perf-rank-{r}"))
                    .spawn_scoped(s, move || {
                        Communicator::init(id, r, nranks, device)
                            .map_err(Failure::from)
                            .and_then(|comm| run_rank(&comm, req, "threads"))
                    })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                let result = match h {
                    Ok(h) => h
                        .join()
                        .unwrap_or_else(|_| Err(Failure::Run("rank thread panicked".into()))),
                    Err(e) => Err(Failure::Run(format!("cannot start a rank thread: {e}"))),
                };
                (r as u32, result)
            })
            .collect()
    })
}

/// The exit status from every (local) rank's outcome; prints the errors.
fn finish(req: &Request, results: Vec<(u32, Result<Summary, Failure>)>) -> ExitCode {
    let mut usage = None;
    let mut failed = false;
    let mut wrong = false;
    for (rank, r) in &results {
        match r {
            Ok(s) => {
                if s.out_of_bounds() > 0 {
                    wrong = true;
                }
            }
            Err(Failure::Usage(msg)) => usage = Some(msg.clone()),
            Err(Failure::Run(msg)) => {
                eprintln!("symcomm perf: rank {rank}: {msg}");
                failed = true;
            }
        }
    }
    if let Some(msg) = usage {
        eprintln!("symcomm perf: {msg}");
        return ExitCode::from(USAGE_ERROR);
    }
    if failed {
        return ExitCode::FAILURE;
    }
    if wrong {
        if !req.json {
            eprintln!("symcomm perf: wrong results (see #wrong)");
        }
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert!(parse_size("x").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn g_format() {
        assert_eq!(fmt_g(0.0), "0");
        assert_eq!(fmt_g(1.5), "1.5");
        assert_eq!(fmt_g(0.00123456789), "0.00123457");
        assert_eq!(fmt_g(123456.0), "123456");
        assert_eq!(fmt_g(1234567.0), "1.23457e+06");
        assert_eq!(fmt_g(0.00001), "1e-05");
    }

    #[test]
    fn encodings_round_trip() {
        for dt in DataType::ALL {
            let fmt = Fmt::of(dt).unwrap();
            if let Fmt::Float { .. } = fmt {
                let m = fmt.exact_max().min(4096);
                for v in -m..=m {
                    assert_eq!(fmt.decode(fmt.encode(v)), v as f64, "{} {v}", dt.name());
                }
            }
        }
        let f32f = Fmt::of(DataType::F32).unwrap();
        assert_eq!(f32f.encode(3), u64::from(3.0f32.to_bits()));
        assert_eq!(f32f.encode(-7), u64::from((-7.0f32).to_bits()));
        let bf = Fmt::of(DataType::Bf16).unwrap();
        assert_eq!(bf.encode(5), u64::from(5.0f32.to_bits() >> 16));
    }

    #[test]
    fn sweep_sizes() {
        let s = Sweep {
            min: 8,
            max: 1 << 20,
            step: Step::Factor(4),
        };
        assert_eq!(s.sizes().len(), 9);
        let s = Sweep {
            min: 0,
            max: 10,
            step: Step::Bytes(4),
        };
        assert_eq!(s.sizes(), vec![0, 4, 8]);
    }
}

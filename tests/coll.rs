//! Host collectives on the emulator, checked like nccl-tests: every collective (`all_reduce`,
//! `broadcast`, `reduce`, `all_gather`, `reduce_scatter`, `scatter`, `all_to_all`) x dtype x op
//! x rank count (1, 2, 3, 4, 5, 8; ranks as threads) x count x in/out of place x buffers (both
//! windows, both `Buffer`s, mixed) x root x offsets. Inputs of reductions are exact in every type
//! (the value model of `support/values.rs`; floating-point avg included, so no tolerance); the
//! collectives that only move data get arbitrary bits (NaNs, infinities, subnormals included).
//! Outputs are compared bit for bit and `#wrong` counted, plus canaries: every byte of both buffers outside
//! the output (guard elements before and after it, the input of an out-of-place call, the other
//! blocks of an in-place reduce-scatter or scatter, a non-root's buffers of reduce) unchanged.
//!
//! One communicator per rank count runs its cases back to back on one stream per rank; the cases
//! are a seeded selection (every collective x dtype x op for the reductions, every collective x
//! dtype for the others, the other dimensions drawn), printed with `SYMCOMM_TEST_SEED`, which
//! replays it. Also: one large f32 all-reduce and all-gather through `Buffer`s (the staging path
//! in several chunks), and the all-reduce algorithm choice (`algorithm_for`) against the model
//! around its crossover (`SYMCOMM_ALGO`, when set, forces it); every group also runs all-reduces
//! at counts the model runs two-shot, so the results do not depend on `SYMCOMM_ALGO`.
//! `scripts/test` runs this file once more with `SYMCOMM_ALGO=ll`: the emulator's model never
//! picks LL, so that run is what puts every host collective case through the LL all-reduce.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mod.rs"]
mod support;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{
    try_with_ranks_on_hosts, try_with_ranks_on_hosts_using, with_ranks, with_ranks_using,
};

use support::values::{
    DTYPES, DType, OPS, Rng, input_exact, op_name, raw_bits, red_op, reduce_vals, seed,
};
use symcomm::tune::{self, Algorithm, BackendKind, Collective};
use symcomm::{
    Buffer, BufferRef, CommOptions, Communicator, DataType, Device, RedOp, Stream, Window,
};

// ---------------------------------------------------------------------------------------------
// Cases.

const COLLS: [Collective; 7] = [
    Collective::AllReduce,
    Collective::Broadcast,
    Collective::Reduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::Scatter,
    Collective::AllToAll,
];

/// Per-rank block counts (elements per rank block, `count`) of most cases: 0, 1, small odd,
/// primes, around 1024, a few thousand.
const COUNTS: [usize; 9] = [0, 1, 3, 61, 127, 1023, 1025, 2999, 4099];

/// Element offsets of the send and receive ranges (misaligned against 16-byte vectors).
const OFFSETS: [usize; 4] = [0, 1, 3, 16];

/// Elements after every range that must stay untouched.
const GUARD: usize = 13;

/// The byte every buffer holds outside the inputs before a call.
const CANARY: u8 = 0xA5;

fn is_reduction(c: Collective) -> bool {
    matches!(
        c,
        Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
    )
}

/// (blocks of `count` elements in the send buffer, in the receive buffer).
fn layout(c: Collective, n: usize) -> (usize, usize) {
    match c {
        Collective::AllGather => (1, n),
        Collective::ReduceScatter | Collective::Scatter => (n, 1),
        Collective::AllToAll => (n, n),
        _ => (1, 1),
    }
}

/// Where send and receive data live: windows `A`, `B` and buffers `C`, `D` of every rank.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Place {
    /// Window to window (in place: window `A`).
    Windows,
    /// `Buffer` to `Buffer` (in place: buffer `C`).
    Buffers,
    /// Window to `Buffer`.
    WindowToBuffer,
    /// `Buffer` to window.
    BufferToWindow,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum MemId {
    A,
    B,
    C,
    D,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    coll: Collective,
    dt: DType,
    /// `SYMCOMM_REDOP_*` (reductions only).
    op: u32,
    count: usize,
    in_place: bool,
    place: Place,
    root: u32,
    /// Element offsets of the send and receive ranges (in place: `soff` for both).
    soff: usize,
    doff: usize,
    /// Pass the window / buffer from the offset to its end rather than exactly the range.
    whole: bool,
    salt: u64,
}

impl Case {
    fn label(&self, n: u32) -> String {
        format!(
            "{} {} {} nranks={n} count={} root={} {} {:?} soff={} doff={} {} salt={:#x}",
            self.coll.name(),
            self.dt.name,
            if is_reduction(self.coll) {
                op_name(self.op)
            } else {
                "-"
            },
            self.count,
            self.root,
            if self.in_place {
                "in-place"
            } else {
                "out-of-place"
            },
            self.place,
            self.soff,
            if self.in_place { self.soff } else { self.doff },
            if self.whole { "whole" } else { "exact" },
            self.salt
        )
    }

    /// (send memory, recv memory); the same one in place.
    fn mems(&self) -> (MemId, MemId) {
        match (self.place, self.in_place) {
            (Place::Windows, true) => (MemId::A, MemId::A),
            (Place::Buffers, true) => (MemId::C, MemId::C),
            (Place::Windows, false) => (MemId::A, MemId::B),
            (Place::Buffers, false) => (MemId::C, MemId::D),
            (Place::WindowToBuffer, _) => (MemId::A, MemId::D),
            (Place::BufferToWindow, _) => (MemId::C, MemId::B),
        }
    }

    /// Element offsets of this rank's send and receive ranges (NCCL's in-place conventions).
    fn offsets(&self, rank: usize) -> (usize, usize) {
        if !self.in_place {
            return (self.soff, self.doff);
        }
        let (off, r) = (self.soff, rank * self.count);
        match self.coll {
            Collective::AllGather => (off + r, off),
            Collective::ReduceScatter | Collective::Scatter => (off, off + r),
            _ => (off, off),
        }
    }

    /// Elements of each memory the case uses (up to the end of the guard).
    fn spans(&self, n: usize) -> Vec<(MemId, usize)> {
        let (sb, rb) = layout(self.coll, n);
        let (s, r) = self.mems();
        if s == r {
            vec![(s, self.soff + sb.max(rb) * self.count + GUARD)]
        } else {
            vec![
                (s, self.soff + sb * self.count + GUARD),
                (r, self.doff + rb * self.count + GUARD),
            ]
        }
    }

    /// Bits of element `e` of `rank`'s send range.
    fn input_bits(&self, n: u32, rank: u32, e: usize) -> u64 {
        if is_reduction(self.coll) {
            self.dt
                .encode(input_exact(&self.dt, self.op, rank, n, e as u64, self.salt))
        } else {
            raw_bits(&self.dt, rank, e as u64, self.salt)
        }
    }

    /// Bits of the reduction of element `e` of every rank's send range.
    fn reduced_bits(&self, n: u32, e: usize) -> u64 {
        let vals: Vec<_> = (0..n)
            .map(|p| input_exact(&self.dt, self.op, p, n, e as u64, self.salt))
            .collect();
        self.dt.encode(reduce_vals(&self.dt, self.op, &vals))
    }

    /// Expected output of `rank`: (element index in its receive range, bits).
    fn expected(&self, n: u32, rank: u32) -> Vec<(usize, u64)> {
        let c = self.count;
        let r = rank as usize;
        let mut out = Vec::new();
        for i in 0..c {
            match self.coll {
                Collective::AllReduce => out.push((i, self.reduced_bits(n, i))),
                Collective::Reduce => {
                    if rank == self.root {
                        out.push((i, self.reduced_bits(n, i)));
                    }
                }
                Collective::ReduceScatter => out.push((i, self.reduced_bits(n, r * c + i))),
                Collective::Broadcast => out.push((i, self.input_bits(n, self.root, i))),
                Collective::Scatter => out.push((i, self.input_bits(n, self.root, r * c + i))),
                Collective::AllGather => {
                    for p in 0..n {
                        out.push((p as usize * c + i, self.input_bits(n, p, i)));
                    }
                }
                _ => {
                    for p in 0..n {
                        out.push((p as usize * c + i, self.input_bits(n, p, r * c + i)));
                    }
                }
            }
        }
        out
    }
}

/// Smallest count of `dt` whose all-reduce the emulator model runs two-shot with `n` ranks.
fn two_shot_count(n: u32, dt: &DType) -> Option<usize> {
    let bytes = tune::all_reduce_crossover(n, BackendKind::Emu)?;
    Some((bytes as usize).div_ceil(dt.size))
}

/// Rounds of the selection per group.
const ROUNDS: usize = 2;

/// The seeded selection of one group, [`ROUNDS`] times: every collective x dtype (x op for
/// reductions), the count rotating through [`COUNTS`] per collective (so every collective meets
/// every count), the other dimensions drawn; per round and dtype, one all-reduce (op rotating)
/// at a count that selects two-shot.
fn select_cases(n: u32, rng: &mut Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    for round in 0..ROUNDS {
        for coll in COLLS {
            let first = rng.next() as usize;
            let mut j = 0;
            for (di, dt) in DTYPES.iter().enumerate() {
                let ops: Vec<u32> = if is_reduction(coll) {
                    OPS.iter().map(|o| o.0).collect()
                } else {
                    vec![0]
                };
                for op in ops {
                    let mut count = COUNTS[(first + j) % COUNTS.len()];
                    j += 1;
                    if coll == Collective::AllReduce && op as usize == (di + 2 * round) % OPS.len()
                    {
                        if let Some(c) = two_shot_count(n, dt) {
                            count = c + rng.pick(&[0, 1, 37]);
                        }
                    }
                    let in_place = rng.next() % 2 == 0;
                    let place = if in_place {
                        rng.pick(&[Place::Windows, Place::Buffers])
                    } else {
                        rng.pick(&[
                            Place::Windows,
                            Place::Buffers,
                            Place::WindowToBuffer,
                            Place::BufferToWindow,
                        ])
                    };
                    cases.push(Case {
                        coll,
                        dt: *dt,
                        op,
                        count,
                        in_place,
                        place,
                        root: rng.pick(&[0, n - 1, n / 2]),
                        soff: rng.pick(&OFFSETS),
                        doff: rng.pick(&OFFSETS),
                        whole: rng.next() % 2 == 0,
                        salt: rng.next(),
                    });
                }
            }
        }
    }
    cases
}

// ---------------------------------------------------------------------------------------------
// Running a case on one rank.

/// One rank's windows and buffers, each `cap` bytes.
struct Mem {
    a: Window<u8>,
    b: Window<u8>,
    c: Buffer,
    d: Buffer,
    cap: usize,
}

impl Mem {
    fn new(comm: &Communicator, cap: usize) -> Mem {
        Mem {
            a: comm.alloc_window(cap).unwrap(),
            b: comm.alloc_window(cap).unwrap(),
            c: comm.alloc_buffer(cap).unwrap(),
            d: comm.alloc_buffer(cap).unwrap(),
            cap,
        }
    }

    fn window(&self, m: MemId) -> &Window<u8> {
        if m == MemId::A { &self.a } else { &self.b }
    }

    fn write(&self, m: MemId, bytes: &[u8]) -> symcomm::Result<()> {
        match m {
            MemId::A => self.window(m).write(0, bytes),
            MemId::B => self.window(m).write(0, bytes),
            MemId::C => self.c.write(0, bytes),
            MemId::D => self.d.write(0, bytes),
        }
    }

    fn read(&self, m: MemId, len: usize) -> symcomm::Result<Vec<u8>> {
        let mut out = vec![0u8; len];
        match m {
            MemId::A => self.window(m).read(0, &mut out),
            MemId::B => self.window(m).read(0, &mut out),
            MemId::C => self.c.read(0, &mut out),
            MemId::D => self.d.read(0, &mut out),
        }?;
        Ok(out)
    }

    /// Bytes `off..off + len` of `m` as a collective buffer; `whole`: from `off` to the end
    /// (`&Window` / `&Buffer` themselves at offset 0).
    fn buffer_ref(&self, m: MemId, off: usize, len: usize, whole: bool) -> BufferRef<'_> {
        let len = if whole { self.cap - off } else { len };
        match m {
            MemId::A | MemId::B => {
                let w = self.window(m);
                if whole && off == 0 {
                    w.into()
                } else {
                    w.range(off, len).unwrap()
                }
            }
            MemId::C | MemId::D => {
                let b = if m == MemId::C { &self.c } else { &self.d };
                if whole && off == 0 {
                    b.into()
                } else {
                    assert!(off + len <= b.len());
                    // SAFETY: `off..off + len` lies inside the buffer (checked), which outlives
                    // the call and its synchronization in `run_case`; no other work uses it.
                    unsafe { BufferRef::from_raw(b.addr() + off as u64, len as u64) }
                }
            }
        }
    }
}

/// What one rank saw of one case.
#[derive(Default)]
struct Outcome {
    /// Output elements with other bits than expected.
    wrong: u64,
    /// Elements outside the output that changed.
    clobbered: u64,
    /// The first difference, or the error.
    first: Option<String>,
    /// The call or the communicator failed (the communicator may be broken).
    error: bool,
}

/// Runs case `c` on this rank: inputs and canaries written, barrier, call, synchronize,
/// check_error, read back and compare.
fn run_case(comm: &Communicator, stream: &Stream, mem: &Mem, c: &Case) -> Outcome {
    let n = comm.nranks();
    let rank = comm.rank();
    let size = c.dt.size;
    let (sb, rb) = layout(c.coll, n as usize);
    let (sm, rm) = c.mems();
    let (so, ro) = c.offsets(rank as usize);
    let spans = c.spans(n as usize);

    // Canaries everywhere, then this rank's input.
    let mut before: Vec<(MemId, Vec<u8>)> = spans
        .iter()
        .map(|&(m, len)| (m, vec![CANARY; len * size]))
        .collect();
    {
        let sbytes = &mut before.iter_mut().find(|b| b.0 == sm).unwrap().1;
        for e in 0..sb * c.count {
            let bits = c.input_bits(n, rank, e).to_le_bytes();
            let at = (so + e) * size;
            sbytes[at..at + size].copy_from_slice(&bits[..size]);
        }
    }
    // The expected contents: unchanged but for the output.
    let mut after = before.clone();
    let mut is_out: Vec<Vec<bool>> = spans.iter().map(|&(_, len)| vec![false; len]).collect();
    let ri = after.iter().position(|b| b.0 == rm).unwrap();
    for (e, bits) in c.expected(n, rank) {
        let at = ro + e;
        after[ri].1[at * size..(at + 1) * size].copy_from_slice(&bits.to_le_bytes()[..size]);
        is_out[ri][at] = true;
    }
    let fail = |what: String| Outcome {
        first: Some(what),
        error: true,
        ..Outcome::default()
    };
    for (m, bytes) in &before {
        if let Err(e) = mem.write(*m, bytes) {
            return fail(format!("writing the inputs: {e}"));
        }
    }
    if let Err(e) = comm.barrier() {
        return fail(format!("barrier: {e}"));
    }

    let send = mem.buffer_ref(sm, so * size, sb * c.count * size, c.whole);
    let recv = mem.buffer_ref(rm, ro * size, rb * c.count * size, c.whole);
    let (dt, op) = (c.dt.data_type(), red_op(c.op));
    let called = match c.coll {
        Collective::AllReduce => comm.all_reduce(send, recv, c.count, dt, op, stream),
        Collective::Broadcast => comm.broadcast(send, recv, c.count, dt, c.root, stream),
        Collective::Reduce => comm.reduce(send, recv, c.count, dt, op, c.root, stream),
        Collective::AllGather => comm.all_gather(send, recv, c.count, dt, stream),
        Collective::ReduceScatter => comm.reduce_scatter(send, recv, c.count, dt, op, stream),
        Collective::Scatter => comm.scatter(send, recv, c.count, dt, c.root, stream),
        _ => comm.all_to_all(send, recv, c.count, dt, stream),
    };
    if let Err(e) = called {
        return fail(format!("the call failed: {e}"));
    }
    if let Err(e) = stream.synchronize().and_then(|()| comm.check_error()) {
        return fail(format!("after the call: {e}"));
    }

    let mut o = Outcome::default();
    for (k, (m, want)) in after.iter().enumerate() {
        let got = match mem.read(*m, want.len()) {
            Ok(g) => g,
            Err(e) => return fail(format!("reading back: {e}")),
        };
        for e in 0..want.len() / size {
            let (g, w) = (
                &got[e * size..(e + 1) * size],
                &want[e * size..(e + 1) * size],
            );
            if g == w {
                continue;
            }
            let what = if is_out[k][e] {
                &mut o.wrong
            } else {
                &mut o.clobbered
            };
            *what += 1;
            if o.first.is_none() {
                let hex = |b: &[u8]| {
                    b.iter().rev().fold(String::new(), |mut s, x| {
                        let _ = write!(s, "{x:02x}");
                        s
                    })
                };
                o.first = Some(format!(
                    "rank {rank}: {:?} element {e} ({}) is 0x{}, expected 0x{}",
                    m,
                    if is_out[k][e] {
                        "output"
                    } else {
                        "outside the output"
                    },
                    hex(g),
                    hex(w)
                ));
            }
        }
    }
    o
}

/// The algorithm checks of one rank: `algorithm_for(AllReduce, ..)` against the model
/// (`SYMCOMM_ALGO`, when set, forces its choice); problems as text.
fn check_algorithms(comm: &Communicator) -> Vec<String> {
    let n = comm.nranks();
    let forced = tune::algo_from_env().unwrap();
    let forced_ar = forced.filter(|a| Algorithm::available(Collective::AllReduce).contains(a));
    let mut bad = Vec::new();
    let mut expect = |bytes: u64, model: Algorithm| {
        let want = forced_ar.unwrap_or(model);
        let got = comm.algorithm_for(Collective::AllReduce, bytes).unwrap();
        let choose = tune::choose(Collective::AllReduce, bytes, n, BackendKind::Emu, forced);
        if got != want || choose != want {
            bad.push(format!(
                "nranks={n}: all_reduce of {bytes} bytes: algorithm_for {}, tune::choose {}, \
                 expected {}",
                got.name(),
                choose.name(),
                want.name()
            ));
        }
    };
    match tune::all_reduce_crossover(n, BackendKind::Emu) {
        None => {
            // One rank: one-shot for every size.
            assert_eq!(n, 1, "no crossover for {n} ranks");
            expect(8, Algorithm::OneShot);
            expect(tune::CROSSOVER_MAX_BYTES, Algorithm::OneShot);
        }
        Some(x) => {
            // The emulator's model never picks LL (EMU_PARAMS); SYMCOMM_ALGO=ll forces it.
            assert_eq!(tune::all_reduce_ll_limit(n, BackendKind::Emu), None);
            expect(8, Algorithm::OneShot);
            expect(x - 1, Algorithm::OneShot);
            expect(x, Algorithm::TwoShot);
            expect(tune::CROSSOVER_MAX_BYTES, Algorithm::TwoShot);
        }
    }
    bad
}

/// One group: a communicator of `n` ranks runs the seeded selection back to back on one stream
/// per rank; prints the group's line and panics with the failing cases.
fn group(n: u32) {
    let seed = seed();
    let mut rng = Rng(seed ^ (u64::from(n) << 32));
    let mut cases = select_cases(n, &mut rng);
    only_collectives_with_the_forced_algorithm(&mut cases);
    let options = CommOptions::default().with_device_timeout(Duration::from_secs(30));
    run_group(n, "", &cases, &options, true);
}

/// With `SYMCOMM_ALGO` forcing an algorithm (scripts/test runs this file a second time with
/// `ll`), leaves out the cases of collectives that lack it: the model chooses for those as in the
/// run without it, so they would repeat the same calls. The staging test's children keep every
/// collective (they force each algorithm themselves).
fn only_collectives_with_the_forced_algorithm(cases: &mut Vec<Case>) {
    if let Some(forced) = tune::algo_from_env().expect("SYMCOMM_ALGO") {
        cases.retain(|c| Algorithm::available(c.coll).contains(&forced));
        assert!(!cases.is_empty(), "SYMCOMM_ALGO={forced:?}: no case left");
    }
}

/// A group with rank `r` on simulated host `hosts[r]` (UCX over TCP between hosts): the
/// seeded selection (windows and buffers, as on one host), all-reduces pipelined in chunks of
/// `chunk_bytes` (small, odd sizes: most all-reduces take several chunks, the last one short),
/// messages in pieces of an eighth of a chunk (`staged`: through staging memory, in waves, as on a
/// GPU).
fn across_hosts(hosts: &[&str], chunk_bytes: u64, staged: bool) {
    let n = hosts.len() as u32;
    let seed = seed();
    let mut rng = Rng(seed ^ (u64::from(n) << 32) ^ 0x4057);
    let mut cases = select_cases(n, &mut rng);
    only_collectives_with_the_forced_algorithm(&mut cases);
    // The all-reduces of two-shot size also reach the rails' two-shot (shards of at least
    // tune::rail_two_shot_from(hosts) bytes) when the hosts have rails and three or more.
    let mut names = hosts.to_vec();
    names.sort_unstable();
    names.dedup();
    let per_host = hosts.len() / names.len();
    let even = names
        .iter()
        .all(|h| hosts.iter().filter(|x| *x == h).count() == per_host);
    let rail_two_shot = tune::rail_two_shot_from(names.len() as u32).filter(|_| even);
    for c in &mut cases {
        if let (Some(from), Some(big)) = (rail_two_shot, two_shot_count(n, &c.dt)) {
            if c.coll == Collective::AllReduce && c.count >= big {
                let shard_elems = (from as usize).div_ceil(c.dt.size);
                c.count = c.count.max(shard_elems * per_host + c.count - big);
            }
        }
    }
    let options = CommOptions::default()
        .with_device_timeout(Duration::from_secs(30))
        .with_hosts_chunk_bytes(chunk_bytes)
        .with_hosts_staging(staged);
    let how = if staged { "staged" } else { "direct" };
    run_group_on(
        hosts,
        &format!(" (hosts {hosts:?}, chunks of {chunk_bytes} bytes, {how})"),
        &cases,
        &options,
        false,
    );
}

/// Runs `cases` on a communicator of `n` ranks made with `options` (`what` labels the group's
/// line), checking the algorithm choice too when `algorithms`.
fn run_group(n: u32, what: &str, cases: &[Case], options: &CommOptions, algorithms: bool) {
    let hosts = vec!["test-host"; n as usize];
    run_group_on(&hosts, what, cases, options, algorithms);
}

/// [`run_group`] with rank `r` on simulated host `hosts[r]`.
fn run_group_on(
    hosts: &[&str],
    what: &str,
    cases: &[Case],
    options: &CommOptions,
    algorithms: bool,
) {
    let n = hosts.len() as u32;
    let cap = cases
        .iter()
        .flat_map(|c| {
            c.spans(n as usize)
                .into_iter()
                .map(|(_, len)| len * c.dt.size)
        })
        .max()
        .unwrap()
        .next_multiple_of(4096);
    let forced = tune::algo_from_env().unwrap();
    let of_algo = |a: Algorithm| {
        cases
            .iter()
            .filter(|c| {
                c.coll == Collective::AllReduce
                    && n > 1
                    && tune::choose(
                        Collective::AllReduce,
                        (c.count * c.dt.size) as u64,
                        n,
                        BackendKind::Emu,
                        forced,
                    ) == a
            })
            .count()
    };
    let (two_shot, ll) = (of_algo(Algorithm::TwoShot), of_algo(Algorithm::Ll));
    let t = Instant::now();
    let per_rank = try_with_ranks_on_hosts(Device::Emu, hosts, options, |comm| {
        let algo = if algorithms {
            check_algorithms(&comm)
        } else {
            Vec::new()
        };
        let stream = comm.create_stream().unwrap();
        let mem = Mem::new(&comm, cap);
        let mut outs = Vec::with_capacity(cases.len());
        for c in cases {
            let o = run_case(&comm, &stream, &mem, c);
            let stop = o.error;
            outs.push(o);
            if stop {
                break;
            }
        }
        Ok((algo, outs))
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let secs = t.elapsed().as_secs_f64();

    let mut failures: Vec<String> = Vec::new();
    let (mut wrong, mut clobbered, mut run) = (0u64, 0u64, usize::MAX);
    for (r, (algo, outs)) in per_rank.iter().enumerate() {
        failures.extend(algo.iter().map(|a| format!("rank {r}: {a}")));
        run = run.min(outs.len());
        for (c, o) in cases.iter().zip(outs) {
            wrong += o.wrong;
            clobbered += o.clobbered;
            if o.wrong > 0 || o.clobbered > 0 || o.error {
                failures.push(format!(
                    "{}: #wrong {}, #clobbered {}: {}",
                    c.label(n),
                    o.wrong,
                    o.clobbered,
                    o.first.as_deref().unwrap_or("")
                ));
            }
        }
    }
    println!(
        "nranks={n}{what}: {run} of {} cases ({ll} all-reduces of LL size, {two_shot} of two-shot \
         size), #wrong \
         {wrong}, #clobbered {clobbered}, {secs:.1} s (buffers of {cap} bytes)",
        cases.len()
    );
    for f in failures.iter().take(40) {
        println!("FAIL {f}");
    }
    assert!(
        failures.is_empty() && run == cases.len(),
        "nranks={n}{what}: {} failures (first: {}), {run} of {} cases run",
        failures.len(),
        failures.first().map_or("", String::as_str),
        cases.len()
    );
}

/// The bytes each rank sends between hosts in one call of `coll` (`count` f32 per rank; for
/// all-reduce the whole vector) on ranks placed on `hosts`.
fn bytes_between_hosts(hosts: &[&str], coll: Collective, count: usize) -> Vec<u64> {
    let n = hosts.len();
    try_with_ranks_on_hosts(Device::Emu, hosts, &CommOptions::default(), |comm| {
        let stream = comm.create_stream().map_err(|e| e.to_string())?;
        let whole = count * n * 4;
        let send = Buffer::new(comm.backend(), whole).map_err(|e| e.to_string())?;
        let recv = Buffer::new(comm.backend(), whole).map_err(|e| e.to_string())?;
        let f = DataType::F32;
        // The first call sets up UCX (its addresses go over the control plane, not UCX).
        let before = symcomm::testing::bytes_to_other_hosts(&comm);
        match coll {
            Collective::AllReduce => comm.all_reduce(&send, &recv, count, f, RedOp::Sum, &stream),
            Collective::ReduceScatter => {
                comm.reduce_scatter(&send, &recv, count, f, RedOp::Sum, &stream)
            }
            Collective::AllGather => comm.all_gather(&send, &recv, count, f, &stream),
            Collective::Broadcast => comm.broadcast(&send, &recv, count, f, 0, &stream),
            Collective::Reduce => comm.reduce(&send, &recv, count, f, RedOp::Sum, 0, &stream),
            Collective::Scatter => comm.scatter(&send, &recv, count, f, 0, &stream),
            _ => unreachable!(),
        }
        .map_err(|e| e.to_string())?;
        stream.synchronize().map_err(|e| e.to_string())?;
        Ok(symcomm::testing::bytes_to_other_hosts(&comm) - before)
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

/// With the same number of ranks on every host, each rank moves its own share between hosts
/// (rails: the ranks with the same index on every host), not one leader per host everything;
/// uneven hosts go through their leaders.
#[test]
fn ranks_share_the_traffic_between_hosts() {
    let (ar, rs, ag) = (
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
    );
    let two_by_two = ["a", "b", "a", "b"];
    // All-reduce of 1024 f32 (4 KiB): each rank's shard (2 KiB) to the other host once.
    assert_eq!(bytes_between_hosts(&two_by_two, ar, 1024), [2048; 4]);
    // 1023 elements: shards of 512 (the last one padded).
    assert_eq!(bytes_between_hosts(&two_by_two, ar, 1023), [2048; 4]);
    // Reduce-scatter / all-gather of 256 f32 per rank: the other host's rail rank's block.
    assert_eq!(bytes_between_hosts(&two_by_two, rs, 256), [1024; 4]);
    assert_eq!(bytes_between_hosts(&two_by_two, ag, 256), [1024; 4]);
    // Broadcast of 1024 f32 from rank 0: each rank of the root's host sends its half.
    let bc = Collective::Broadcast;
    assert_eq!(
        bytes_between_hosts(&two_by_two, bc, 1024),
        [2048, 0, 2048, 0]
    );
    // Reduce of 1024 f32 to rank 0: each rank of the other host sends its partial half.
    let re = Collective::Reduce;
    assert_eq!(
        bytes_between_hosts(&two_by_two, re, 1024),
        [0, 2048, 0, 2048]
    );
    // Scatter of 256 f32 per rank from rank 0: each rank of the root's host sends the block of
    // its rail's rank on the other host.
    let sc = Collective::Scatter;
    assert_eq!(
        bytes_between_hosts(&two_by_two, sc, 256),
        [1024, 0, 1024, 0]
    );
    // Three hosts of one rank: a small vector to each other host, once (one-shot)...
    assert_eq!(bytes_between_hosts(&["a", "b", "c"], ar, 1024), [8192; 3]);
    // ...a large one (48 KiB, beyond tune::rail_two_shot_from(3)) as a third to each in two
    // rounds (two-shot): 4 x 16 KiB instead of 2 x 48 KiB.
    assert_eq!(bytes_between_hosts(&["a", "b", "c"], ar, 12288), [65536; 3]);
    // Uneven: host a's leader (rank 0) exchanges the whole vector with host b's only rank.
    assert_eq!(
        bytes_between_hosts(&["a", "b", "a"], ar, 1024),
        [4096, 4096, 0]
    );
}

/// All-reduce, reduce and broadcast across hosts larger than a chunk go in chunks (one call
/// number each), all-reduce moves the same bytes between hosts as in one piece, and every result
/// is bit-exact, in place and out of place, on rails (a short last chunk padded into shards) and
/// through leaders.
#[test]
fn vectors_across_hosts_go_in_chunks() {
    // 10_001 i32 in chunks of 1024 (4099 bytes, rounded down to a multiple of the 2 ranks per
    // host): 10 chunks, the last of 785 elements (shards of 393, one padded).
    const COUNT: usize = 10_001;
    let options = CommOptions::default().with_hosts_chunk_bytes(4099);
    let colls = [
        Collective::AllReduce,
        Collective::Reduce,
        Collective::Broadcast,
    ];
    for hosts in [&["a", "b", "a", "b"][..], &["a", "b", "a"][..]] {
        let n = hosts.len();
        let per_rank = try_with_ranks_on_hosts(Device::Emu, hosts, &options, |comm| {
            let s = comm.create_stream().map_err(|e| e.to_string())?;
            let me = comm.rank();
            let value = |r: u32, i: usize| (i as i32).wrapping_mul(7919) ^ ((r as i32) << 20);
            let mine: Vec<i32> = (0..COUNT).map(|i| value(me, i)).collect();
            let sum: Vec<i32> = (0..COUNT)
                .map(|i| {
                    (0..n as u32)
                        .map(|r| value(r, i))
                        .fold(0, i32::wrapping_add)
                })
                .collect();
            // Rooted calls: the root on the second host.
            let root = 1;
            let from_root: Vec<i32> = (0..COUNT).map(|i| value(root, i)).collect();
            let send = comm.alloc_buffer(COUNT * 4).map_err(|e| e.to_string())?;
            let recv = comm.alloc_buffer(COUNT * 4).map_err(|e| e.to_string())?;
            let mut out = Vec::new();
            for coll in colls {
                for in_place in [false, true] {
                    send.write(0, &mine).map_err(|e| e.to_string())?;
                    recv.write(0, &vec![-1i32; COUNT])
                        .map_err(|e| e.to_string())?;
                    let to = if in_place { &send } else { &recv };
                    let (calls, bytes) = (
                        symcomm::testing::exchanges_across_hosts(&comm),
                        symcomm::testing::bytes_to_other_hosts(&comm),
                    );
                    let (i32_, sum_) = (DataType::I32, RedOp::Sum);
                    match coll {
                        Collective::AllReduce => comm.all_reduce(&send, to, COUNT, i32_, sum_, &s),
                        Collective::Reduce => comm.reduce(&send, to, COUNT, i32_, sum_, root, &s),
                        _ => comm.broadcast(&send, to, COUNT, i32_, root, &s),
                    }
                    .map_err(|e| e.to_string())?;
                    s.synchronize().map_err(|e| e.to_string())?;
                    let mut got = vec![0i32; COUNT];
                    to.read(0, &mut got).map_err(|e| e.to_string())?;
                    let want = match coll {
                        Collective::AllReduce => &sum,
                        Collective::Reduce if me == root => &sum,
                        // Off the root, reduce leaves the receive buffer as it was.
                        Collective::Reduce if in_place => &mine,
                        Collective::Reduce => &vec![-1; COUNT],
                        _ => &from_root,
                    };
                    let wrong = (0..COUNT).filter(|&i| got[i] != want[i]).count();
                    out.push((
                        coll,
                        wrong,
                        symcomm::testing::exchanges_across_hosts(&comm) - calls,
                        symcomm::testing::bytes_to_other_hosts(&comm) - bytes,
                    ));
                }
            }
            Ok(out)
        })
        .unwrap_or_else(|e| panic!("{e}"));
        for (r, out) in per_rank.iter().enumerate() {
            for &(coll, wrong, calls, bytes) in out {
                let what = format!("hosts {hosts:?}, rank {r}, {}", coll.name());
                assert_eq!(wrong, 0, "{what}: #wrong");
                assert_eq!(calls, 10, "{what}: chunks");
                if coll != Collective::AllReduce {
                    continue;
                }
                let want_bytes = if n == 4 {
                    // Rails: each rank's shards, 9 x 512 + 393 elements.
                    (9 * 512 + 393) * 4
                } else if r == 2 {
                    0
                } else {
                    // Leaders: the whole vector.
                    COUNT as u64 * 4
                };
                assert_eq!(bytes, want_bytes, "{what}: bytes sent");
            }
        }
    }
}

/// A rank may destroy its communicator right after a collective that only sent from it: its
/// bytes still reach a peer that had not read them yet (a send across hosts completes once the
/// peer took it). The broadcast goes in eight chunks, and the receiver's stream holds its first
/// phase back until the root's communicator is gone (or 1 s passed: the root cannot finish
/// first when its sends wait for the receiver), so the receiver sees the root's endpoint close
/// while chunks are still to be received — that used to fail with `PeerLost` ("Endpoint
/// timeout").
#[test]
fn a_rank_leaving_right_after_sending_loses_nothing() {
    const COUNT: usize = 8000;
    let hosts = ["a", "b"];
    let options = CommOptions::default().with_hosts_chunk_bytes(4000);
    let root_gone = Arc::new(AtomicBool::new(false));
    let got = try_with_ranks_on_hosts(Device::Emu, &hosts, &options, |comm| {
        let s = comm.create_stream().map_err(|e| e.to_string())?;
        let b = comm.alloc_buffer(COUNT * 4).map_err(|e| e.to_string())?;
        let values: Vec<u32> = (0..COUNT as u32).map(|i| i * 3 + 1).collect();
        let root = comm.rank() == 0;
        if root {
            b.write(0, &values).map_err(|e| e.to_string())?;
        } else {
            let gone = Arc::clone(&root_gone);
            s.enqueue_host(move || {
                let t = Instant::now();
                while !gone.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(1) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                // Time for the closed connection to reach this rank.
                std::thread::sleep(Duration::from_millis(200));
                Ok(())
            })
            .map_err(|e| e.to_string())?;
        }
        comm.broadcast(&b, &b, COUNT, DataType::U32, 0, &s)
            .map_err(|e| e.to_string())?;
        s.synchronize().map_err(|e| e.to_string())?;
        let mut out = vec![0u32; COUNT];
        b.read(0, &mut out).map_err(|e| e.to_string())?;
        let wrong = (0..COUNT).filter(|&i| out[i] != values[i]).count();
        if root {
            drop((b, s, comm));
            root_gone.store(true, Ordering::Release);
        }
        Ok(wrong)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, [0, 0], "#wrong per rank");
}

/// Ranks whose chunk sizes differ would cut a call differently: the first collective across
/// hosts refuses them on every rank with a message naming the setting, and the next call says
/// so again (nothing hangs).
#[test]
fn ranks_with_different_chunk_sizes_are_refused() {
    let hosts = ["a", "b", "a", "b"];
    let options: Vec<CommOptions> = (0..4u64)
        .map(|r| CommOptions::default().with_hosts_chunk_bytes(if r == 3 { 8192 } else { 4096 }))
        .collect();
    let errors = try_with_ranks_on_hosts_using(Device::Emu, &hosts, &options, |comm| {
        let s = comm.create_stream().map_err(|e| e.to_string())?;
        let b = comm.alloc_buffer(4096).map_err(|e| e.to_string())?;
        let mut errors = Vec::new();
        for _ in 0..2 {
            let r = comm.all_reduce(&b, &b, 1024, DataType::F32, RedOp::Sum, &s);
            errors.push(r.map_err(|e| e.to_string()).err());
        }
        // No rank leaves before every rank made its calls (a rank that left would be lost).
        comm.barrier().map_err(|e| e.to_string())?;
        Ok(errors)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    for (r, errs) in errors.iter().enumerate() {
        for e in errs {
            let e = e.as_deref().unwrap_or("no error");
            assert!(
                e.contains("SYMCOMM_HOSTS_CHUNK_BYTES differs"),
                "rank {r}: {e}"
            );
        }
    }
}

/// Send/recv rings across hosts (every neighbour on the other host), out of place and in place
/// (a send and a receive of the same bytes: messages cross from and into the caller's memory
/// except there), every message bit-exact; rank `r` stages its messages when `staged(r)`
/// (pieces of 512 B: chunks of 4 KiB), so ranks that move them differently meet too.
fn send_recv_rings_across_hosts(staged: impl Fn(u32) -> bool) {
    let hosts = ["a", "b", "a", "b"];
    let options: Vec<CommOptions> = (0..4)
        .map(|r| {
            CommOptions::default()
                .with_hosts_chunk_bytes(4096)
                .with_hosts_staging(staged(r))
        })
        .collect();
    let wrong = try_with_ranks_on_hosts_using(Device::Emu, &hosts, &options, |comm| {
        let s = comm.create_stream().map_err(|e| e.to_string())?;
        let (me, n) = (comm.rank(), comm.nranks());
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let value = |r: u32, i: usize| (r << 24) ^ (i as u32).wrapping_mul(40_503);
        let mut wrong = 0;
        for count in [1usize, 999, 300_001] {
            for in_place in [false, true] {
                let send = comm.alloc_buffer(count * 4).map_err(|e| e.to_string())?;
                let other = comm.alloc_buffer(count * 4).map_err(|e| e.to_string())?;
                let recv = if in_place { &send } else { &other };
                let mine: Vec<u32> = (0..count).map(|i| value(me, i)).collect();
                send.write(0, &mine).map_err(|e| e.to_string())?;
                comm.group(&s, |g| {
                    g.send(&send, count, DataType::U32, next)?;
                    g.recv(recv, count, DataType::U32, prev)
                })
                .map_err(|e| e.to_string())?;
                s.synchronize().map_err(|e| e.to_string())?;
                let mut got = vec![0u32; count];
                recv.read(0, &mut got).map_err(|e| e.to_string())?;
                wrong += (0..count).filter(|&i| got[i] != value(prev, i)).count();
                if !in_place {
                    // The send buffer is untouched.
                    send.read(0, &mut got).map_err(|e| e.to_string())?;
                    wrong += (0..count).filter(|&i| got[i] != mine[i]).count();
                }
            }
        }
        Ok(wrong)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(wrong, [0; 4], "#wrong per rank");
}

#[test]
fn send_recv_rings_across_hosts_direct() {
    send_recv_rings_across_hosts(|_| false);
}

#[test]
fn send_recv_rings_across_hosts_staged() {
    send_recv_rings_across_hosts(|_| true);
}

/// Ranks 0 and 3 stage, 1 and 2 hand UCX their memory: the same pieces cross either way.
#[test]
fn send_recv_rings_across_hosts_staged_and_direct() {
    send_recv_rings_across_hosts(|r| r == 0 || r == 3);
}

#[test]
fn two_hosts_of_two_ranks() {
    across_hosts(&["host-a", "host-a", "host-b", "host-b"], 4099, false);
}

#[test]
fn two_hosts_of_two_ranks_staged() {
    across_hosts(&["host-a", "host-a", "host-b", "host-b"], 4099, true);
}

#[test]
fn three_hosts_of_one_rank() {
    // Chunks above tune::rail_two_shot_from(3): the large all-reduces' chunks are two-shot.
    across_hosts(&["host-a", "host-b", "host-c"], 40_001, false);
}

#[test]
fn three_hosts_of_two_ranks() {
    // Rails of three ranks: the large all-reduces take the two-shot rail path with shards of
    // half the vector (chunks of two shards above tune::rail_two_shot_from(3)).
    across_hosts(
        &["host-a", "host-a", "host-b", "host-b", "host-c", "host-c"],
        70_001,
        false,
    );
}

#[test]
fn two_hosts_uneven_and_interleaved() {
    // Host a holds ranks 0 and 2, host b rank 1: the hosts' ranks are not contiguous.
    across_hosts(&["host-a", "host-b", "host-a"], 4099, false);
}

/// Uneven hosts through leaders, staged: every collective's exchanges in waves.
#[test]
fn two_hosts_uneven_and_interleaved_staged() {
    across_hosts(&["host-a", "host-b", "host-a"], 4099, true);
}

#[test]
fn ranks_1() {
    group(1);
}

#[test]
fn ranks_2() {
    group(2);
}

#[test]
fn ranks_3() {
    group(3);
}

#[test]
fn ranks_4() {
    group(4);
}

#[test]
fn ranks_5() {
    group(5);
}

#[test]
fn ranks_8() {
    group(8);
}

/// Set in the environment of the child processes of
/// `every_collective_through_staging_in_small_chunks`.
const SMALL_STAGING_CHILD: &str = "SYMCOMM_TEST_SMALL_STAGING_CHILD";

/// The staged path (buffers that are not windows: the kernel reads the send buffer and writes
/// the receive buffer itself, blocks `count` apart, and stages in a window only what peers
/// read) in chunks of the smallest staging area (`SYMCOMM_STAGING_BYTES=4096`: a few hundred
/// elements per block and chunk, so most cases take several chunks, the last one short), for
/// every collective x dtype with 3 ranks and each all-reduce algorithm forced (`SYMCOMM_ALGO`):
/// the seeded selection with every case moved to buffers (buffers both sides, or one side a
/// window), in place and not, at misaligned offsets. Each algorithm runs in a child process of
/// this test binary (environment variables are process-wide).
#[test]
fn every_collective_through_staging_in_small_chunks() {
    if std::env::var_os(SMALL_STAGING_CHILD).is_some() {
        let n = 3;
        let mut rng = Rng(seed() ^ 0x57A6);
        let mut cases = select_cases(n, &mut rng);
        for c in &mut cases {
            c.place = match c.place {
                Place::Windows if c.in_place => Place::Buffers,
                Place::Windows => Place::WindowToBuffer,
                p => p,
            };
        }
        let options = CommOptions::default().with_device_timeout(Duration::from_secs(30));
        run_group(
            n,
            " (staging in chunks of 4096 bytes)",
            &cases,
            &options,
            false,
        );
        return;
    }
    run_in_children(
        "every_collective_through_staging_in_small_chunks",
        &[
            (SMALL_STAGING_CHILD, "1"),
            ("SYMCOMM_STAGING_BYTES", "4096"),
        ],
        &["ll", "one_shot", "two_shot"],
        1,
    );
}

/// Runs test `name` of this binary again in a child process per `SYMCOMM_ALGO` value of
/// `algos` (environment variables are process-wide), with `env` set besides (the test's own
/// branch for children); prints the children's group lines and requires each child to pass
/// with `groups` groups, all without a wrong or clobbered element.
fn run_in_children(name: &str, env: &[(&str, &str)], algos: &[&str], groups: usize) {
    let exe = std::env::current_exe().unwrap();
    for algo in algos {
        let out = std::process::Command::new(&exe)
            .args(["--exact", name, "--nocapture"])
            .envs(env.iter().copied())
            .env("SYMCOMM_ALGO", algo)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        for line in text.lines().filter(|l| l.starts_with("nranks=")) {
            println!("SYMCOMM_ALGO={algo}: {line}");
        }
        assert!(out.status.success(), "SYMCOMM_ALGO={algo}: {text}");
        assert_eq!(
            text.matches("#wrong 0, #clobbered 0").count(),
            groups,
            "SYMCOMM_ALGO={algo}: {text}"
        );
    }
}

/// Set in the environment of the child processes of `all_reduce_algorithms_at_large_counts`.
const LARGE_COUNTS_CHILD: &str = "SYMCOMM_TEST_LARGE_COUNTS_CHILD";

/// One-shot and two-shot all-reduces (each forced with `SYMCOMM_ALGO`, in a child process) at
/// counts where every thread of a CTA reduces many packs, so the loops that take several packs
/// per thread at once (2 and 4 ranks) run full groups and a short last one: every dtype x op, in
/// place and not, windows and buffers, aligned and misaligned offsets, counts that end on a
/// whole pack and counts that do not; 2, 3 and 4 ranks. (The seeded selection's one-shot
/// counts are small on the emulator: a thread there has one pack.)
#[test]
fn all_reduce_algorithms_at_large_counts() {
    if std::env::var_os(LARGE_COUNTS_CHILD).is_some() {
        for n in [2u32, 3, 4] {
            let mut rng = Rng(seed() ^ 0x1A26 ^ u64::from(n));
            let mut cases = Vec::new();
            for dt in DTYPES {
                for op in OPS.iter().map(|o| o.0) {
                    for (k, place) in [Place::Windows, Place::Buffers, Place::WindowToBuffer]
                        .into_iter()
                        .enumerate()
                    {
                        let in_place = place != Place::WindowToBuffer && rng.next() % 2 == 0;
                        let aligned = k != 2 || rng.next() % 2 == 0;
                        cases.push(Case {
                            coll: Collective::AllReduce,
                            dt,
                            op,
                            count: 24_000 + rng.pick(&[0, 16, 1, 37]),
                            in_place,
                            place,
                            root: 0,
                            soff: if aligned { 0 } else { rng.pick(&[1, 3]) },
                            doff: if aligned { 16 } else { rng.pick(&[0, 3]) },
                            whole: rng.next() % 2 == 0,
                            salt: rng.next(),
                        });
                    }
                }
            }
            let options = CommOptions::default().with_device_timeout(Duration::from_secs(30));
            run_group(n, " (large counts)", &cases, &options, false);
        }
        return;
    }
    run_in_children(
        "all_reduce_algorithms_at_large_counts",
        &[(LARGE_COUNTS_CHILD, "1")],
        &["one_shot", "two_shot"],
        3,
    );
}

// ---------------------------------------------------------------------------------------------
// The CUDA launch geometry under the emulator's residency scheduler.

/// Held by the tests that fill the emulated GPU with CUDA-sized grids: each communicator counts
/// on its ranks' share of the GPU, so two of them at once could overcommit it (the small grids
/// of the other tests take a few SMs only).
static FILLS_GPU: Mutex<()> = Mutex::new(());

/// Every collective with the launch geometry of a GPU (CTAs of 512 threads, as many as the
/// co-residency budget gives each rank: 132 SMs x 1 CTA / (n ranks x 2 lanes)) on an H200-like
/// emulated GPU: counts of one element and counts that want more CTAs than the budget, so every
/// launch is capped, through windows and the staging path. Before launches were capped to the
/// budget, 4 and 8 ranks needed more resident CTAs than the GPU holds and timed out.
fn cuda_geometry(n: u32) {
    let _serial = FILLS_GPU
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let options = CommOptions::default()
        .with_device_timeout(Duration::from_secs(60))
        .with_emu_cuda_geometry(true);
    let share = with_ranks_using(n, &options, |comm| {
        let k = comm
            .load_kernel(&symcomm::DEVICE_IMAGE, "symcomm_collective_f32")
            .unwrap();
        comm.co_resident_share(&k, tune::CUDA_THREADS, 0).unwrap()
    })[0];
    let cap = share.min(symcomm::LANE_BARRIERS);
    let mut rng = Rng(seed() ^ (u64::from(n) << 40));
    let f32t = DTYPES[0];
    let bf16 = *DTYPES.iter().find(|d| d.name == "bf16").unwrap();
    let mut cases = Vec::new();
    for coll in COLLS {
        let (sb, rb) = layout(coll, n as usize);
        for (dt, op, big) in [
            (f32t, 0, false),
            (f32t, 0, true),
            (bf16, 3, is_reduction(coll)),
        ] {
            if dt.name == "bf16" && !is_reduction(coll) {
                continue;
            }
            // Elements whose bytes ask for 3 x cap + 2 CTAs of tune::PIECE_BYTES each (at most a
            // lane's barrier indices): uncapped, n - 1 ranks' grids would fill the GPU (cap is
            // about 132 / 2n) and leave the last rank's CTAs no room, so that no CTA index
            // would be resident on every rank.
            let per_elem = (dt.size * sb.max(rb)) as u64
                / if coll == Collective::Scatter {
                    u64::from(n)
                } else {
                    1
                };
            let pieces = (3 * u64::from(cap) + 2).min(u64::from(symcomm::LANE_BARRIERS));
            let count = if big {
                (pieces * tune::PIECE_BYTES).div_ceil(per_elem) as usize + 3
            } else {
                1
            };
            if big {
                let bytes = (count * dt.size * sb.max(rb)) as u64;
                let algo = tune::choose(coll, bytes, n, BackendKind::Cuda, None);
                let (ctas, threads) = tune::geometry(coll, algo, bytes, n, BackendKind::Cuda, cap);
                assert_eq!((ctas, threads), (cap, tune::CUDA_THREADS), "{coll:?}");
            }
            let in_place = rng.next() % 2 == 0;
            cases.push(Case {
                coll,
                dt,
                op,
                count,
                in_place,
                place: if big && rng.next() % 3 == 0 {
                    Place::Buffers
                } else {
                    Place::Windows
                },
                root: rng.pick(&[0, n - 1]),
                soff: rng.pick(&OFFSETS),
                doff: rng.pick(&OFFSETS),
                whole: false,
                salt: rng.next(),
            });
        }
    }
    only_collectives_with_the_forced_algorithm(&mut cases);
    run_group(
        n,
        &format!(" (CUDA geometry, {cap} CTAs per launch)"),
        &cases,
        &options,
        false,
    );
}

#[test]
fn cuda_geometry_ranks_2() {
    cuda_geometry(2);
}

#[test]
fn cuda_geometry_ranks_4() {
    cuda_geometry(4);
}

#[test]
fn cuda_geometry_ranks_8() {
    cuda_geometry(8);
}

// ---------------------------------------------------------------------------------------------
// Large messages through the staging path.

/// f32 input element `i` of `rank` of the large cases: small integers, so sums are exact.
fn large_input(rank: u32, i: usize) -> f32 {
    ((i * 7 + rank as usize * 13) % 5) as f32
}

/// A few million f32 elements of all-reduce (out of place and in place) and all-gather through
/// `Buffer`s: the staging path in several chunks of `SYMCOMM_STAGING_BYTES` (4 MiB by default),
/// with counts that are no multiple of a chunk, and the guard after every output unchanged.
#[test]
fn large_buffers_through_staging() {
    const N: u32 = 3;
    const AR: usize = 3_000_017;
    const AG: usize = 1_000_003;
    let staging = std::env::var("SYMCOMM_STAGING_BYTES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(symcomm::DEFAULT_STAGING_BYTES as usize);
    assert!(
        AR * 4 > 2 * staging && AG * 4 * N as usize > 2 * staging,
        "not several chunks"
    );
    let t = Instant::now();
    let results = with_ranks(N, |comm| {
        let rank = comm.rank();
        let stream = comm.create_stream().unwrap();
        let mut bad: Vec<String> = Vec::new();
        let canary = f32::from_bits(0xA5A5_A5A5);
        let check = |what: &str, got: &[f32], want: &dyn Fn(usize) -> f32, len: usize| {
            let wrong = (0..len)
                .filter(|&i| got[i].to_bits() != want(i).to_bits())
                .count();
            let clobbered = got[len..]
                .iter()
                .filter(|x| x.to_bits() != canary.to_bits())
                .count();
            (wrong > 0 || clobbered > 0)
                .then(|| format!("rank {rank}: {what}: #wrong {wrong}, #clobbered {clobbered}"))
        };
        let sum = |i: usize| (0..N).map(|p| large_input(p, i)).sum::<f32>();

        // All-reduce, out of place: send buffer, recv buffer with a guard.
        let send = comm.alloc_buffer(AR * 4).unwrap();
        let recv = comm.alloc_buffer((AR + GUARD) * 4).unwrap();
        let input: Vec<f32> = (0..AR).map(|i| large_input(rank, i)).collect();
        send.write(0, &input).unwrap();
        recv.write(0, &vec![canary; AR + GUARD]).unwrap();
        comm.barrier().unwrap();
        comm.all_reduce(
            &send,
            &recv,
            AR,
            symcomm::DataType::F32,
            symcomm::RedOp::Sum,
            &stream,
        )
        .unwrap();
        stream.synchronize().unwrap();
        comm.check_error().unwrap();
        let mut got = vec![0f32; AR + GUARD];
        recv.read(0, &mut got).unwrap();
        bad.extend(check(
            "all_reduce f32 sum out of place (Buffers)",
            &got,
            &sum,
            AR,
        ));
        let mut sent = vec![0f32; AR];
        send.read(0, &mut sent).unwrap();
        if sent != input {
            bad.push(format!("rank {rank}: all_reduce changed its send buffer"));
        }

        // All-reduce in place, in the recv buffer (guard after it).
        recv.write(0, &input).unwrap();
        recv.write(AR, &[canary; GUARD]).unwrap();
        comm.barrier().unwrap();
        comm.all_reduce(
            &recv,
            &recv,
            AR,
            symcomm::DataType::F32,
            symcomm::RedOp::Sum,
            &stream,
        )
        .unwrap();
        stream.synchronize().unwrap();
        comm.check_error().unwrap();
        recv.read(0, &mut got).unwrap();
        bad.extend(check(
            "all_reduce f32 sum in place (Buffer)",
            &got,
            &sum,
            AR,
        ));
        drop((send, recv));

        // All-gather, out of place.
        let send = comm.alloc_buffer(AG * 4).unwrap();
        let total = AG * N as usize;
        let recv = comm.alloc_buffer((total + GUARD) * 4).unwrap();
        let input: Vec<f32> = (0..AG).map(|i| large_input(rank, i)).collect();
        send.write(0, &input).unwrap();
        recv.write(0, &vec![canary; total + GUARD]).unwrap();
        comm.barrier().unwrap();
        comm.all_gather(&send, &recv, AG, symcomm::DataType::F32, &stream)
            .unwrap();
        stream.synchronize().unwrap();
        comm.check_error().unwrap();
        let mut got = vec![0f32; total + GUARD];
        recv.read(0, &mut got).unwrap();
        let gathered = |i: usize| large_input((i / AG) as u32, i % AG);
        bad.extend(check(
            "all_gather f32 out of place (Buffers)",
            &got,
            &gathered,
            total,
        ));
        bad
    });
    println!(
        "large: all_reduce {AR} and all_gather {AG} per rank of f32 on {N} ranks through \
         Buffers: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let bad: Vec<String> = results.into_iter().flatten().collect();
    assert!(bad.is_empty(), "{bad:#?}");
}

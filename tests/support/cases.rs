//! One collective call of the built-in kernels on every rank of a team ([`Ranks`]: GPU streams
//! or emulator threads), and its bit-exact check: inputs and expected results from
//! [`super::values`], every output element compared (`#wrong`), every other byte of both windows
//! compared with what was there before (`#clobbered`), every rank's error record read. The GPU
//! checks (`tests/gpu/`) and the emulator tests (`tests/emu_collectives.rs`) run these same
//! cases.

use std::ffi::c_void;
use std::time::Duration;

use symcomm::DEVICE_IMAGE;
use symcomm::abi::*;
use symcomm::testing::emu::EmuTeam;

use super::blocks;
use super::values::{DType, Val, input, op_name, raw_bits, reduce_vals};

/// A failure as text (the fixtures report failures as strings).
pub(crate) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The collective's name (`bad-kind` for a code that is none).
pub(crate) fn kind_name(kind: u32) -> &'static str {
    match kind {
        SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT => "all_reduce_one_shot",
        SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT => "all_reduce_two_shot",
        SYMCOMM_COLL_ALL_REDUCE_LL => "all_reduce_ll",
        SYMCOMM_COLL_ALL_GATHER => "all_gather",
        SYMCOMM_COLL_ALL_GATHER_LL => "all_gather_ll",
        SYMCOMM_COLL_REDUCE_SCATTER => "reduce_scatter",
        SYMCOMM_COLL_REDUCE_SCATTER_LL => "reduce_scatter_ll",
        SYMCOMM_COLL_BROADCAST => "broadcast",
        SYMCOMM_COLL_BROADCAST_LL => "broadcast_ll",
        SYMCOMM_COLL_REDUCE => "reduce",
        SYMCOMM_COLL_SCATTER => "scatter",
        SYMCOMM_COLL_ALL_TO_ALL => "all_to_all",
        _ => "bad-kind",
    }
}

pub(crate) fn is_reduction(kind: u32) -> bool {
    matches!(
        kind,
        SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT
            | SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT
            | SYMCOMM_COLL_ALL_REDUCE_LL
            | SYMCOMM_COLL_REDUCE_SCATTER
            | SYMCOMM_COLL_REDUCE_SCATTER_LL
            | SYMCOMM_COLL_REDUCE
    )
}

pub(crate) fn status_name(s: u32) -> &'static str {
    match s {
        SYMCOMM_STATUS_OK => "OK",
        SYMCOMM_STATUS_TIMEOUT => "TIMEOUT",
        SYMCOMM_STATUS_ABORTED => "ABORTED",
        SYMCOMM_STATUS_MISMATCH => "MISMATCH",
        SYMCOMM_STATUS_ABI_MISMATCH => "ABI_MISMATCH",
        SYMCOMM_STATUS_INVALID_ARGUMENT => "INVALID_ARGUMENT",
        _ => "?",
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Case {
    pub(crate) kind: u32,
    pub(crate) dt: DType,
    /// Reduction operator (reductions only).
    pub(crate) op: u32,
    pub(crate) nranks: u32,
    pub(crate) count: u64,
    pub(crate) root: u32,
    pub(crate) in_place: bool,
    pub(crate) cta_scope: bool,
    /// Extra element offset of the input and the output (misalignment).
    pub(crate) src_shift: u64,
    pub(crate) dst_shift: u64,
    pub(crate) ctas: u32,
    pub(crate) threads: u32,
}

/// Where a case's buffers lie, in elements of each rank's window copy.
pub(crate) struct Layout {
    /// Tiles: CTAs at CTA scope (one collective each), else 1.
    pub(crate) tiles: u64,
    pub(crate) tile_stride: u64,
    /// Elements of each window copy the case uses.
    pub(crate) window_elems: u64,
    /// Input elements per rank and tile.
    pub(crate) in_elems: u64,
    pub(crate) soff: u64,
    pub(crate) doff: u64,
}

impl Case {
    pub(crate) fn reduction(&self) -> Option<u32> {
        is_reduction(self.kind).then_some(self.op)
    }

    pub(crate) fn label(&self) -> String {
        format!(
            "{} {}{} nranks={} count={} root={} {} {} shift={}/{} grid={}x{}",
            kind_name(self.kind),
            self.dt.name,
            match self.reduction() {
                Some(op) => format!(" {}", op_name(op)),
                None => String::new(),
            },
            self.nranks,
            self.count,
            self.root,
            if self.in_place {
                "in-place"
            } else {
                "out-of-place"
            },
            if self.cta_scope { "cta" } else { "grid" },
            self.src_shift,
            self.dst_shift,
            self.ctas,
            self.threads
        )
    }

    pub(crate) fn layout(&self) -> Layout {
        let (in_blocks, out_blocks) = blocks(self.kind, u64::from(self.nranks));
        let tiles = if self.cta_scope {
            u64::from(self.ctas)
        } else {
            1
        };
        let body = self.count * in_blocks.max(out_blocks) + 3;
        let (soff, doff, span) = if self.in_place {
            (self.src_shift, self.src_shift, self.src_shift + body)
        } else {
            (
                self.src_shift,
                self.dst_shift,
                self.src_shift.max(self.dst_shift) + body,
            )
        };
        Layout {
            tiles,
            tile_stride: span,
            window_elems: tiles * span + span,
            in_elems: self.count * in_blocks,
            soff,
            doff,
        }
    }

    /// Whether this is an average, whose result is the one compared with a tolerance (its
    /// division rounds once more than the exact model).
    pub(crate) fn is_avg(&self) -> bool {
        self.reduction() == Some(SYMCOMM_REDOP_AVG)
    }

    /// Whether output element bits `got` are within the type's epsilon of the exact average
    /// `want` (floats; an integer average is exact, compared bit for bit).
    pub(crate) fn avg_close(&self, got: &[u8], want: Val) -> bool {
        let mut raw = [0u8; 8];
        raw[..got.len()].copy_from_slice(got);
        match (self.dt.decode(u64::from_le_bytes(raw)), want) {
            (Val::F(g), Val::F(w)) => {
                (g - w).abs() <= w.abs() * self.dt.epsilon() + f64::MIN_POSITIVE
            }
            _ => false,
        }
    }

    pub(crate) fn window_bytes(&self) -> u64 {
        self.layout().window_elems * self.dt.size as u64
    }

    /// Rank `rank`'s input and output offsets (tile 0), after NCCL's in-place conventions:
    /// all-gather reads its input from its own block of the output, reduce-scatter and scatter
    /// write their output into their own block of the input.
    pub(crate) fn offsets(&self, lay: &Layout, rank: u64) -> (u64, u64) {
        if !self.in_place {
            return (lay.soff, lay.doff);
        }
        match self.kind {
            SYMCOMM_COLL_ALL_GATHER | SYMCOMM_COLL_ALL_GATHER_LL => {
                (lay.doff + rank * self.count, lay.doff)
            }
            SYMCOMM_COLL_REDUCE_SCATTER | SYMCOMM_COLL_REDUCE_SCATTER_LL | SYMCOMM_COLL_SCATTER => {
                (lay.soff, lay.soff + rank * self.count)
            }
            _ => (lay.soff, lay.doff),
        }
    }
}

pub(crate) const CANARY: u8 = 0xA5;

/// What one case found.
#[derive(Default)]
pub(crate) struct CaseResult {
    /// Output elements that differ from the expected bits.
    pub(crate) wrong: u64,
    /// Other elements of either window that changed (canaries, inputs of out-of-place calls).
    pub(crate) clobbered: u64,
    /// Non-OK error records, by rank.
    pub(crate) errors: Vec<(u32, ErrorRecord)>,
    /// The launch or the wait failed (the watchdog stopped a hang, a launch was refused).
    pub(crate) failure: Option<String>,
}

impl CaseResult {
    pub(crate) fn ok(&self) -> bool {
        self.wrong == 0 && self.clobbered == 0 && self.errors.is_empty() && self.failure.is_none()
    }

    /// The case used up its deadline (a timeout, an abort, a hang): systematic ones must not eat
    /// the whole time limit.
    pub(crate) fn stalled(&self) -> bool {
        self.failure.is_some()
            || self.errors.iter().any(|(_, e)| {
                e.status == SYMCOMM_STATUS_TIMEOUT || e.status == SYMCOMM_STATUS_ABORTED
            })
    }

    pub(crate) fn describe(&self) -> String {
        let mut s = format!("#wrong={} #clobbered={}", self.wrong, self.clobbered);
        for (r, e) in self.errors.iter().take(4) {
            s += &format!(
                " rank {r}: {} op {} peer {} detail {:#x}",
                status_name(e.status),
                e.op,
                e.peer,
                e.detail
            );
        }
        if let Some(f) = &self.failure {
            s += &format!(" {f}");
        }
        s
    }
}

/// Writes the `dt.size`-byte little-endian form of `bits` as element `e` of `img`.
pub(crate) fn put(img: &mut [u8], size: usize, e: u64, bits: u64) {
    let at = e as usize * size;
    img[at..at + size].copy_from_slice(&bits.to_le_bytes()[..size]);
}

/// Runs `c` on every rank of `team` at once (CTA scope: one independent collective per CTA on its
/// own tile) and checks every byte of the windows it uses.
pub(crate) fn run_case<R: Ranks>(
    team: &mut R,
    c: &Case,
    salt: u64,
    timeout: Duration,
) -> CaseResult {
    let mut res = CaseResult::default();
    if let Err(e) = exec_case(team, c, salt, timeout, &mut res) {
        res.failure = Some(e);
    }
    if !res.errors.is_empty() || res.failure.is_some() {
        // The barrier epochs are out of step now: a fresh communicator for the next case.
        if let Err(e) = team.reset() {
            res.failure = Some(format!(
                "{}; reset failed: {e}",
                res.failure.take().unwrap_or_default()
            ));
        }
    }
    res
}

pub(crate) fn exec_case<R: Ranks>(
    team: &mut R,
    c: &Case,
    salt: u64,
    timeout: Duration,
    res: &mut CaseResult,
) -> Result<(), String> {
    let n = c.nranks;
    let sz = c.dt.size;
    let lay = c.layout();
    let elems = lay.window_elems as usize;
    let wbytes = elems * sz;
    if wbytes as u64 > team.capacity() || team.nranks() != n {
        return Err(format!(
            "case needs {wbytes} bytes x {n} ranks, the team has {} x {}",
            team.capacity(),
            team.nranks()
        ));
    }
    let op = c.reduction();
    // The value model of the emulator tests (support::values): reductions get inputs whose
    // reductions are exact in the type, the data-movement collectives arbitrary bits. Element
    // `e` of tile `t` is index `e + (t << 32)`.
    let val = |p: u32, t: u64, e: u64| {
        input(
            &c.dt,
            op.unwrap_or(SYMCOMM_REDOP_SUM),
            p,
            e + (t << 32),
            salt,
        )
    };
    let bits = |p: u32, t: u64, e: u64| match op {
        Some(_) => c.dt.encode(val(p, t, e)),
        None => raw_bits(&c.dt, p, e + (t << 32), salt),
    };

    // Inputs, on a canary background.
    let src: Vec<Vec<u8>> = (0..n)
        .map(|r| {
            let mut img = vec![CANARY; wbytes];
            let (s, _) = c.offsets(&lay, u64::from(r));
            for t in 0..lay.tiles {
                for e in 0..lay.in_elems {
                    put(&mut img, sz, t * lay.tile_stride + s + e, bits(r, t, e));
                }
            }
            img
        })
        .collect();
    // Reductions of every input element across the ranks, per tile.
    let red: Vec<Vec<Val>> = match op {
        Some(op) => (0..lay.tiles)
            .map(|t| {
                (0..lay.in_elems)
                    .map(|e| {
                        let vals: Vec<Val> = (0..n).map(|p| val(p, t, e)).collect();
                        reduce_vals(&c.dt, op, &vals)
                    })
                    .collect()
            })
            .collect(),
        None => Vec::new(),
    };
    // Expected output windows (in place: the input window) and which elements are outputs.
    let count = c.count;
    let mut expect = Vec::with_capacity(n as usize);
    for r in 0..n {
        let mut img = if c.in_place {
            src[r as usize].clone()
        } else {
            vec![CANARY; wbytes]
        };
        let mut out = vec![false; elems];
        // Float averages: the exact value, compared with a tolerance (its bits stay 0 in `img`).
        let mut avg: Vec<Option<Val>> = vec![None; if c.is_avg() { elems } else { 0 }];
        let (_, d) = c.offsets(&lay, u64::from(r));
        let ru = u64::from(r);
        for t in 0..lay.tiles {
            // An output element: its bits, or for a float average its exact value.
            let mut set = |e: u64, want: Result<u64, Val>| {
                let at = t * lay.tile_stride + d + e;
                out[at as usize] = true;
                match want {
                    Ok(bits) => put(&mut img, sz, at, bits),
                    Err(exact) => avg[at as usize] = Some(exact),
                }
            };
            let reduced = |v: Val| match v {
                Val::F(_) if c.is_avg() => Err(v),
                _ => Ok(c.dt.encode(v)),
            };
            for i in 0..count {
                match c.kind {
                    SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT
                    | SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT
                    | SYMCOMM_COLL_ALL_REDUCE_LL => {
                        set(i, reduced(red[t as usize][i as usize]));
                    }
                    SYMCOMM_COLL_REDUCE => {
                        if r == c.root {
                            set(i, reduced(red[t as usize][i as usize]));
                        }
                    }
                    SYMCOMM_COLL_REDUCE_SCATTER | SYMCOMM_COLL_REDUCE_SCATTER_LL => {
                        set(i, reduced(red[t as usize][(ru * count + i) as usize]));
                    }
                    SYMCOMM_COLL_ALL_GATHER | SYMCOMM_COLL_ALL_GATHER_LL => {
                        for p in 0..n {
                            set(u64::from(p) * count + i, Ok(bits(p, t, i)));
                        }
                    }
                    SYMCOMM_COLL_BROADCAST | SYMCOMM_COLL_BROADCAST_LL => {
                        set(i, Ok(bits(c.root, t, i)))
                    }
                    SYMCOMM_COLL_SCATTER => set(i, Ok(bits(c.root, t, ru * count + i))),
                    _ => {
                        for p in 0..n {
                            set(u64::from(p) * count + i, Ok(bits(p, t, ru * count + i)));
                        }
                    }
                }
            }
        }
        expect.push((img, out, avg));
    }

    let dst_w = if c.in_place { 0 } else { 1 };
    let canvas = vec![CANARY; wbytes];
    for r in 0..n {
        team.write(0, r, &src[r as usize])?;
        if !c.in_place {
            team.write(1, r, &canvas)?;
        }
    }

    // Every rank at once.
    let calls: Vec<(DevComm, CollArgs)> = (0..n)
        .map(|r| {
            let (s, d) = c.offsets(&lay, u64::from(r));
            let comm = team.comm(r, timeout.as_nanos() as u64);
            let args = CollArgs {
                kind: c.kind,
                dtype: c.dt.code,
                redop: op.unwrap_or(0),
                root: c.root,
                scope: if c.cta_scope {
                    SYMCOMM_SCOPE_CTA
                } else {
                    SYMCOMM_SCOPE_GRID
                },
                index: 0,
                count: c.count,
                src_offset: s,
                dst_offset: d,
                tile_stride: lay.tile_stride,
                src: team.window(0, r),
                dst: team.window(dst_w, r),
                ..Default::default()
            };
            (comm, args)
        })
        .collect();
    let kernel = format!("symcomm_collective_{}", c.dt.name);
    team.launch(&kernel, c.ctas, c.threads, &calls, 1, false)?;

    for (r, e) in team.errors()?.into_iter().enumerate() {
        if e.status != SYMCOMM_STATUS_OK {
            res.errors.push((r as u32, e));
        }
    }
    let mut got = vec![0u8; wbytes];
    for r in 0..n {
        let (want, out, avg) = &expect[r as usize];
        team.read(dst_w, r, &mut got)?;
        // Whole images first (the common case: all equal); averages always element by element.
        if got != *want || !avg.is_empty() {
            for (e, &is_out) in out.iter().enumerate() {
                let g = &got[e * sz..(e + 1) * sz];
                let good = match avg.get(e).copied().flatten() {
                    Some(exact) => c.avg_close(g, exact),
                    None => g == &want[e * sz..(e + 1) * sz],
                };
                match (good, is_out) {
                    (true, _) => {}
                    (false, true) => res.wrong += 1,
                    (false, false) => res.clobbered += 1,
                }
            }
        }
        if !c.in_place {
            // An out-of-place call leaves its input window alone.
            team.read(0, r, &mut got)?;
            let want = &src[r as usize];
            if got != *want {
                res.clobbered += got
                    .chunks(sz)
                    .zip(want.chunks(sz))
                    .filter(|(a, b)| a != b)
                    .count() as u64;
            }
        }
    }
    Ok(())
}

/// The ranks of one team with two windows (0: input, 1: output of out-of-place calls), each
/// `capacity()` bytes per rank, on the GPU (ranks as streams) or on the emulator (ranks as
/// threads). Calls use a prefix of each rank's copy.
pub(crate) trait Ranks {
    fn nranks(&self) -> u32;
    /// Bytes per rank of each window.
    fn capacity(&self) -> u64;
    /// Writes `data` at the start of rank `rank`'s copy of window `w`. No kernel may run.
    fn write(&mut self, w: usize, rank: u32, data: &[u8]) -> Result<(), String>;
    /// Reads the start of rank `rank`'s copy of window `w` into `out`. No kernel may run.
    fn read(&mut self, w: usize, rank: u32, out: &mut [u8]) -> Result<(), String>;
    /// Zeroes window `w` on every rank. No kernel may run.
    fn zero(&mut self, w: usize) -> Result<(), String>;
    fn comm(&mut self, rank: u32, timeout_ns: u64) -> DevComm;
    fn window(&mut self, w: usize, rank: u32) -> WindowHandleRaw;
    /// Launches `iters` rounds of `kernel(calls[r].0, calls[r].1)` on every rank r, back to back
    /// (`ctas` x `threads` per rank), and waits for all of them; bounded by the calls' own
    /// deadline plus a watchdog on the GPU. `spin`: poll without sleeping (timing).
    fn launch(
        &mut self,
        kernel: &str,
        ctas: u32,
        threads: u32,
        calls: &[(DevComm, CollArgs)],
        iters: u32,
        spin: bool,
    ) -> Result<(), String>;
    /// Every rank's error record.
    fn errors(&mut self) -> Result<Vec<ErrorRecord>, String>;
    /// Zeroes signals, error records and the abort flag (after a failure). Windows are kept.
    fn reset(&mut self) -> Result<(), String>;
}

/// Ranks as threads on the CPU emulator (a `EmuTeam`).
pub(crate) struct EmuRanks {
    pub(crate) nranks: u32,
    pub(crate) capacity: u64,
    pub(crate) team: EmuTeam,
}

impl EmuRanks {
    pub(crate) fn new(nranks: u32, window_bytes: u64) -> Result<Self, String> {
        Ok(EmuRanks {
            nranks,
            capacity: window_bytes,
            team: EmuTeam::with_windows(nranks, &[window_bytes, window_bytes]).map_err(err)?,
        })
    }
}

impl Ranks for EmuRanks {
    fn nranks(&self) -> u32 {
        self.nranks
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn write(&mut self, w: usize, rank: u32, data: &[u8]) -> Result<(), String> {
        let copy = self.team.bytes_mut(w, rank);
        copy.get_mut(..data.len())
            .ok_or_else(|| format!("{} bytes exceed the window", data.len()))?
            .copy_from_slice(data);
        Ok(())
    }

    fn read(&mut self, w: usize, rank: u32, out: &mut [u8]) -> Result<(), String> {
        let copy = self.team.bytes(w, rank);
        out.copy_from_slice(
            copy.get(..out.len())
                .ok_or_else(|| format!("{} bytes exceed the window", out.len()))?,
        );
        Ok(())
    }

    fn zero(&mut self, w: usize) -> Result<(), String> {
        for r in 0..self.nranks {
            self.team.bytes_mut(w, r).fill(0);
        }
        Ok(())
    }

    fn comm(&mut self, rank: u32, timeout_ns: u64) -> DevComm {
        self.team.dev_comm(rank, timeout_ns)
    }

    fn window(&mut self, w: usize, rank: u32) -> WindowHandleRaw {
        self.team.window_of(w, rank)
    }

    fn launch(
        &mut self,
        kernel: &str,
        ctas: u32,
        threads: u32,
        calls: &[(DevComm, CollArgs)],
        iters: u32,
        _spin: bool,
    ) -> Result<(), String> {
        for _ in 0..iters {
            let outcomes: Vec<Result<(), String>> = std::thread::scope(|s| {
                let handles: Vec<_> = calls
                    .iter()
                    .map(|&(comm, args)| {
                        s.spawn(move || {
                            let (mut comm, mut args) = (comm, args);
                            let mut ptrs: [*mut c_void; 2] =
                                [(&raw mut comm).cast(), (&raw mut args).cast()];
                            // SAFETY: the kernel takes (DevComm, CollArgs) by value; the team's
                            // memory, which the handles address, outlives the scope.
                            unsafe {
                                symcomm::testing::emu::launch(
                                    &DEVICE_IMAGE,
                                    kernel,
                                    [ctas, 1, 1],
                                    [threads, 1, 1],
                                    &mut ptrs,
                                )
                            }
                            .map_err(err)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err("an emulated rank panicked".into()))
                    })
                    .collect()
            });
            for o in outcomes {
                o?;
            }
        }
        Ok(())
    }

    fn errors(&mut self) -> Result<Vec<ErrorRecord>, String> {
        Ok((0..self.nranks).map(|r| self.team.error(r)).collect())
    }

    fn reset(&mut self) -> Result<(), String> {
        // A EmuTeam cannot zero its signal area: start over with fresh (zeroed) memory.
        self.team =
            EmuTeam::with_windows(self.nranks, &[self.capacity, self.capacity]).map_err(err)?;
        Ok(())
    }
}

//! One collective call on every rank of a team, and its bit-exact check (inputs and expected
//! results from `support::values`, the emulator tests' value model).

use super::*;

/// Element types of the reductions, and of the copy collectives.
pub(crate) fn reduction_dtypes() -> [DType; 4] {
    ["f32", "bf16", "u8", "fp8_e4m3"].map(dtype)
}

pub(crate) fn copy_dtypes() -> [DType; 3] {
    ["f32", "bf16", "u8"].map(dtype)
}

pub(crate) fn kind_name(kind: u32) -> &'static str {
    match kind {
        SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT => "all_reduce_one_shot",
        SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT => "all_reduce_two_shot",
        SYMCOMM_COLL_ALL_GATHER => "all_gather",
        SYMCOMM_COLL_REDUCE_SCATTER => "reduce_scatter",
        SYMCOMM_COLL_BROADCAST => "broadcast",
        SYMCOMM_COLL_REDUCE => "reduce",
        SYMCOMM_COLL_SCATTER => "scatter",
        _ => "all_to_all",
    }
}

pub(crate) fn is_reduction(kind: u32) -> bool {
    matches!(
        kind,
        SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT
            | SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT
            | SYMCOMM_COLL_REDUCE_SCATTER
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
            SYMCOMM_COLL_ALL_GATHER => (lay.doff + rank * self.count, lay.doff),
            SYMCOMM_COLL_REDUCE_SCATTER | SYMCOMM_COLL_SCATTER => {
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
    let red: Vec<Vec<u64>> = match op {
        Some(op) => (0..lay.tiles)
            .map(|t| {
                (0..lay.in_elems)
                    .map(|e| {
                        let vals: Vec<Val> = (0..n).map(|p| val(p, t, e)).collect();
                        c.dt.encode(reduce_vals(&c.dt, op, &vals))
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
        let (_, d) = c.offsets(&lay, u64::from(r));
        let ru = u64::from(r);
        for t in 0..lay.tiles {
            let mut set = |e: u64, bits: u64| {
                let at = t * lay.tile_stride + d + e;
                put(&mut img, sz, at, bits);
                out[at as usize] = true;
            };
            for i in 0..count {
                match c.kind {
                    SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT | SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT => {
                        set(i, red[t as usize][i as usize]);
                    }
                    SYMCOMM_COLL_REDUCE => {
                        if r == c.root {
                            set(i, red[t as usize][i as usize]);
                        }
                    }
                    SYMCOMM_COLL_REDUCE_SCATTER => {
                        set(i, red[t as usize][(ru * count + i) as usize]);
                    }
                    SYMCOMM_COLL_ALL_GATHER => {
                        for p in 0..n {
                            set(u64::from(p) * count + i, bits(p, t, i));
                        }
                    }
                    SYMCOMM_COLL_BROADCAST => set(i, bits(c.root, t, i)),
                    SYMCOMM_COLL_SCATTER => set(i, bits(c.root, t, ru * count + i)),
                    _ => {
                        for p in 0..n {
                            set(u64::from(p) * count + i, bits(p, t, ru * count + i));
                        }
                    }
                }
            }
        }
        expect.push((img, out));
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
        let (want, out) = &expect[r as usize];
        team.read(dst_w, r, &mut got)?;
        if got != *want {
            for (e, &is_out) in out.iter().enumerate() {
                if got[e * sz..(e + 1) * sz] != want[e * sz..(e + 1) * sz] {
                    if is_out {
                        res.wrong += 1;
                    } else {
                        res.clobbered += 1;
                    }
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

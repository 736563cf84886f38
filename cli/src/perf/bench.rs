//! One rank's run: its buffers and stream, the warm-up, timed calls and checks of every size,
//! and the sums over the ranks.

use std::time::Instant;

use symcomm::{Collective, Communicator, DataType, RedOp, Stream, Window};

use super::desc::Shape;
use super::mem::Mem;
use super::plan::{Failure, Plan, Request};
use super::report::{Printer, Row, Summary, Timing, root_column};
use super::values::{Data, Fmt, mix};

/// Byte the outputs are poisoned with before a check.
const POISON: u8 = 0xA5;

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
pub(super) fn run_rank(
    comm: &Communicator,
    req: &Request,
    mode: &'static str,
) -> Result<Summary, Failure> {
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

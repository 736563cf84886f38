//! One rank's run: its buffers and stream, the warm-up, timed calls and checks of every size,
//! and the figures combined over the ranks.

use std::time::{Duration, Instant};

use symcomm::{Buffer, BufferRef, Collective, Communicator, DataType, Graph, RedOp, Stream};

use super::desc::{Shape, Source};
use super::mem::Mem;
use super::plan::{Average, Failure, Plan, Request};
use super::report::{Printer, Row, Summary, Timing};
use super::values::{Data, Fmt, mix};

/// Byte the outputs are poisoned with before a check.
const POISON: u8 = 0xA5;

/// Figures per size combined with the `-a` rule: out-of-place time, CPU time, then in place.
const TIMES: usize = 4;
/// Figures per size summed over the ranks: out-of-place and in-place wrong elements.
const WRONGS: usize = 2;

/// One rank's buffers, stream and statistics buffers (ordinary ones: they work across hosts).
struct Bench<'c> {
    comm: &'c Communicator,
    plan: &'c Plan,
    stream: Stream,
    send: Mem,
    recv: Mem,
    stats_in: Buffer,
    stats_out: Buffer,
}

/// One call: its shape, type, op, root and placement.
#[derive(Debug, Clone, Copy)]
struct Call {
    shape: Shape,
    dt: DataType,
    op: Option<RedOp>,
    root: u32,
    in_place: bool,
}

/// nccl-tests' rotation (`startColl`): call `iter` uses the buffers from byte
/// `total · (iter mod ⌊cap / total⌋)` on, `total` being the larger of its send and receive
/// bytes and `cap` the buffers' size (`-e`), so that back-to-back calls touch different memory.
pub(super) fn rotation(iter: u64, total: u64, cap: u64) -> u64 {
    if total == 0 {
        return 0;
    }
    let steps = (cap / total).max(1);
    total * (iter % steps)
}

impl<'c> Bench<'c> {
    fn new(comm: &'c Communicator, plan: &'c Plan) -> symcomm::Result<Self> {
        // Every size's send and receive bytes are at most its S, and S at most -e.
        let cap = plan.sweep.max;
        Ok(Bench {
            comm,
            plan,
            stream: comm.create_stream()?,
            send: Mem::alloc(comm, plan.buffers, cap)?,
            recv: Mem::alloc(comm, plan.buffers, cap)?,
            stats_in: comm.alloc_buffer(TIMES * 8)?,
            stats_out: comm.alloc_buffer(TIMES * 8)?,
        })
    }

    fn req(&self) -> &Request {
        &self.plan.req
    }

    /// Enqueues call number `iter` (its rotation) of `c`.
    fn enqueue(&self, c: &Call, iter: u64) -> symcomm::Result<()> {
        let desc = self.req().desc;
        let sz = c.dt.size() as u64;
        let total = c.shape.send_elems.max(c.shape.recv_elems) * sz;
        let shift = rotation(iter, total, self.plan.sweep.max);
        let (send, recv) = if c.in_place {
            let (so, ro) = desc.in_place_offsets(self.comm.rank(), c.shape.count);
            (
                self.recv.part(shift + so * sz, c.shape.send_elems * sz)?,
                self.recv.part(shift + ro * sz, c.shape.recv_elems * sz)?,
            )
        } else {
            (
                self.send.part(shift, c.shape.send_elems * sz)?,
                self.recv.part(shift, c.shape.recv_elems * sz)?,
            )
        };
        let (n, dt, s, root) = (c.shape.count as usize, c.dt, &self.stream, c.root);
        let op = c.op.unwrap_or(RedOp::Sum);
        let comm = self.comm;
        match desc.coll {
            Collective::AllReduce => comm.all_reduce(send, recv, n, dt, op, s),
            Collective::AllGather => comm.all_gather(send, recv, n, dt, s),
            Collective::ReduceScatter => comm.reduce_scatter(send, recv, n, dt, op, s),
            Collective::Broadcast => comm.broadcast(send, recv, n, dt, root, s),
            Collective::Reduce => comm.reduce(send, recv, n, dt, op, root, s),
            Collective::Scatter => comm.scatter(send, recv, n, dt, root, s),
            Collective::AllToAll => comm.all_to_all(send, recv, n, dt, s),
            Collective::SendRecv => {
                let nr = comm.nranks();
                let (next, prev) = ((comm.rank() + 1) % nr, (comm.rank() + nr - 1) % nr);
                comm.group(s, |g| {
                    g.send(send, n, dt, next)?;
                    g.recv(recv, n, dt, prev)
                })
            }
        }
    }

    /// nccl-tests' `startColl`: the call, then with any `-z` a wait for it (and with `-z 1` a
    /// barrier).
    fn start(&self, c: &Call, iter: u64) -> symcomm::Result<()> {
        self.enqueue(c, iter)?;
        match self.req().blocking {
            0 => Ok(()),
            1 => {
                self.synchronize()?;
                self.comm.barrier()
            }
            _ => self.synchronize(),
        }
    }

    /// nccl-tests' `completeColl`: waits for the enqueued calls (blocking modes have waited
    /// already unless -m aggregates calls).
    fn complete(&self) -> symcomm::Result<()> {
        if self.req().blocking > 0 && self.req().agg_iters <= 1 {
            return self.comm.check_error();
        }
        self.synchronize()
    }

    fn synchronize(&self) -> symcomm::Result<()> {
        self.stream.synchronize()?;
        self.comm.check_error()
    }

    /// `-w` calls at every warm-up size (nccl-tests: -b, doubling up to -e).
    fn warm_up(&self, dt: DataType, op: Option<RedOp>, root: u32) -> symcomm::Result<()> {
        let n = self.comm.nranks();
        for size in self.plan.sweep.warmup_sizes() {
            let call = Call {
                shape: self.req().desc.shape(size, dt.size() as u64, n),
                dt,
                op,
                root,
                in_place: false,
            };
            for iter in 0..self.plan.warmup {
                self.start(&call, u64::from(iter))?;
            }
            self.complete()?;
        }
        Ok(())
    }

    /// Enqueues the graph launches of `-G` (or nothing without it) for the calls `record` makes
    /// while the stream captures.
    fn record(
        &self,
        record: impl FnOnce() -> symcomm::Result<()>,
    ) -> symcomm::Result<Option<Graph>> {
        if self.req().graph_launches == 0 {
            record()?;
            return Ok(None);
        }
        self.stream.begin_capture()?;
        let recorded = record();
        let graph = self.stream.end_capture()?;
        recorded?;
        Ok(Some(graph))
    }

    /// nccl-tests' `BenchTime` timing: (elapsed, CPU time) of the timed calls in nanoseconds,
    /// before the division by the number of calls.
    fn time(&self, c: &Call) -> symcomm::Result<(u64, u64)> {
        let req = self.req();
        let (iters, agg) = (u64::from(self.plan.iters), u64::from(req.agg_iters));
        self.start(c, 0)?;
        self.complete()?;
        self.comm.barrier()?;
        let mut timer = Instant::now();
        let mut coll_only = Duration::ZERO;
        let graph = self.record(|| {
            for iter in 0..iters {
                let t0 = timer.elapsed();
                for a in 0..agg {
                    self.start(c, iter * agg + a)?;
                }
                if req.blocking == 3 {
                    self.synchronize()?;
                    coll_only += timer.elapsed() - t0;
                    self.comm.barrier()?;
                }
            }
            Ok(())
        })?;
        if let Some(g) = &graph {
            self.comm.barrier()?;
            timer = Instant::now();
            for _ in 0..req.graph_launches {
                g.launch(&self.stream)?;
            }
        }
        let measured = |t: &Instant| {
            if req.blocking == 3 {
                coll_only
            } else {
                t.elapsed()
            }
        };
        let cpu = measured(&timer);
        self.complete()?;
        let elapsed = measured(&timer);
        drop(graph);
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Ok((ns(elapsed), ns(cpu)))
    }

    /// Up to `-c` checks; this rank's wrong elements (0 when checks are off).
    fn check(&self, c: &Call, seed: u64) -> symcomm::Result<u64> {
        let (rank, n) = (self.comm.rank(), self.comm.nranks());
        let desc = self.req().desc;
        let shape = &c.shape;
        let sz = c.dt.size() as u64;
        let Some(fmt) = Fmt::of(c.dt) else {
            return Ok(0);
        };
        for k in 0..self.req().check {
            let data = Data {
                fmt,
                dsize: c.dt.size(),
                op: c.op,
                nranks: n,
                seed: mix(seed ^ mix(u64::from(k) + 1)),
            };
            let input = data.input_bytes(rank, 0, shape.send_elems);
            let recv_bytes = (shape.recv_elems * sz) as usize;
            // In place, the whole buffer is poisoned first, then the input written into it.
            let (recv_off, before) = if c.in_place {
                let (so, ro) = desc.in_place_offsets(rank, shape.count);
                let span = shape.send_elems.max(shape.recv_elems) * sz;
                let mut buf = vec![POISON; span as usize];
                buf[(so * sz) as usize..][..input.len()].copy_from_slice(&input);
                self.recv.write(0, &buf)?;
                let start = (ro * sz) as usize;
                (ro, buf[start..start + recv_bytes].to_vec())
            } else {
                self.send.write(0, &input)?;
                let poison = vec![POISON; recv_bytes];
                self.recv.write(0, &poison)?;
                (0, poison)
            };
            // Every rank's inputs are in place before any kernel reads a peer's.
            self.comm.barrier()?;
            let graph = self.record(|| self.start(c, 0))?;
            if let Some(g) = &graph {
                g.launch(&self.stream)?;
            }
            self.complete()?;
            drop(graph);
            let mut out = vec![0u8; recv_bytes];
            self.recv.read(recv_off * sz, &mut out)?;
            let mut wrong = 0u64;
            let word = |bytes: &[u8]| {
                let mut w = [0u8; 8];
                w[..bytes.len()].copy_from_slice(bytes);
                u64::from_le_bytes(w)
            };
            let size = c.dt.size();
            for (j, (got, was)) in out
                .chunks_exact(size)
                .zip(before.chunks_exact(size))
                .enumerate()
            {
                let src: Source = desc.source(rank, n, c.root, shape.count, j as u64);
                if !data.matches(word(got), data.expect(src, word(was))) {
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

    /// Element-wise all-reduce of `mine` over the ranks with `op`.
    fn over_ranks<const N: usize>(&self, mine: [u64; N], op: RedOp) -> symcomm::Result<[u64; N]> {
        self.stats_in.write(0, &mine)?;
        self.comm.all_reduce(
            BufferRef::from(&self.stats_in),
            BufferRef::from(&self.stats_out),
            N,
            DataType::U64,
            op,
            &self.stream,
        )?;
        self.synchronize()?;
        let mut total = [0u64; N];
        self.stats_out.read(0, &mut total)?;
        let sane = total.iter().zip(&mine).all(|(t, m)| match op {
            RedOp::Min => t <= m,
            RedOp::Max => t >= m,
            _ => t >= m,
        });
        if !sane {
            return Err(symcomm::Error::InvalidArgument(format!(
                "the statistics all-reduce ({}) returned {total:?} for this rank's {mine:?}",
                op.name()
            )));
        }
        Ok(total)
    }

    /// The times combined over the ranks by `-a`, as seconds per call (out of place, its CPU
    /// time, in place, its CPU time).
    fn combine(&self, times: [u64; TIMES]) -> symcomm::Result<[f64; TIMES]> {
        let n = self.comm.nranks();
        let (op, mine) = match self.req().average {
            // Only rank 0 contributes: every rank learns rank 0's figures.
            Average::Rank0 if self.comm.rank() != 0 => (RedOp::Sum, [0; TIMES]),
            Average::Rank0 | Average::Mean => (RedOp::Sum, times),
            Average::Min => (RedOp::Min, times),
            Average::Max => (RedOp::Max, times),
        };
        let t = self.over_ranks(mine, op)?;
        let ranks = if self.req().average == Average::Mean {
            f64::from(n)
        } else {
            1.0
        };
        let calls = f64::from(self.plan.iters) * f64::from(self.req().agg_iters);
        // The elapsed time covers every graph launch; the CPU time the capture.
        let graphs = f64::from(self.req().graph_launches.max(1));
        let secs = |ns: u64| ns as f64 / ranks / calls / 1e9;
        Ok([
            secs(t[0]) / graphs,
            secs(t[1]),
            secs(t[2]) / graphs,
            secs(t[3]),
        ])
    }

    /// GB/s of a stream-ordered copy of `bytes` between two ordinary buffers of rank 0 (mean
    /// of `iters` copies after one warm-up), made while the other ranks wait: ranks sharing a GPU
    /// would otherwise split its bandwidth (on an H200 with 4 ranks each saw a quarter). 0 on the
    /// other ranks (only rank 0's figure is reported).
    fn copy_bandwidth(&self, bytes: u64, iters: u32) -> Result<f64, Failure> {
        self.comm.barrier()?;
        let gbps = if self.comm.rank() == 0 {
            self.timed_copies(bytes, iters)?
        } else {
            0.0
        };
        self.comm.barrier()?;
        Ok(gbps)
    }

    /// [`Self::copy_bandwidth`]'s copies on this rank.
    fn timed_copies(&self, bytes: u64, iters: u32) -> Result<f64, Failure> {
        let len = usize::try_from(bytes.max(1)).unwrap_or(usize::MAX);
        let src = self.comm.alloc_buffer(len)?;
        let dst = self.comm.alloc_buffer(len)?;
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

    /// One row: both placements timed and checked, the figures combined over the ranks.
    fn row(
        &self,
        dt: DataType,
        op: Option<RedOp>,
        root: u32,
        size: u64,
        seed: u64,
    ) -> Result<Row, Failure> {
        let req = self.req();
        let n = self.comm.nranks();
        let shape = req.desc.shape(size, dt.size() as u64, n);
        let algo = self.comm.algorithm_for(req.desc.coll, shape.bytes)?;
        let mut times = [0u64; TIMES];
        let mut wrongs = [0u64; WRONGS];
        for (k, in_place) in [false, true].into_iter().enumerate() {
            let call = Call {
                shape,
                dt,
                op,
                root,
                in_place,
            };
            let (elapsed, cpu) = self.time(&call)?;
            times[2 * k] = elapsed;
            times[2 * k + 1] = cpu;
            wrongs[k] = self.check(&call, mix(seed ^ k as u64))?;
        }
        let [oop, oop_cpu, ip, ip_cpu] = self.combine(times)?;
        let wrong = self.over_ranks(wrongs, RedOp::Sum)?;
        let timing = |secs: f64, cpu: f64, wrong: u64| {
            let algbw = if secs > 0.0 {
                shape.bytes as f64 / secs / 1e9
            } else {
                0.0
            };
            let shown = if req.report_cputime { cpu } else { secs };
            Timing {
                time_us: shown * 1e6,
                algbw,
                busbw: algbw * req.desc.coll.bus_factor(n),
                wrong: (req.check > 0).then_some(wrong),
            }
        };
        Ok(Row {
            size: shape.bytes,
            count: shape.count,
            dtype: dt.name(),
            redop: op.map_or("none", RedOp::name),
            root: if req.desc.coll.has_root() {
                i64::from(root)
            } else {
                -1
            },
            out_of_place: timing(oop, oop_cpu, wrong[0]),
            in_place: timing(ip, ip_cpu, wrong[1]),
            algorithm: algo.name(),
        })
    }

    fn run(&self, printer: Option<&mut Printer>, mode: &'static str) -> Result<Summary, Failure> {
        let plan = self.plan;
        let req = &plan.req;
        let sizes = plan.sweep.sizes();
        let mut printer = printer;
        if let Some(p) = printer.as_deref_mut() {
            p.header(self.comm, plan, mode);
        }
        let mut summary = Summary::new(req.run_cycles != 0);
        for (ti, &dt) in req.dtypes.iter().enumerate() {
            for (oi, &op) in req.ops.iter().enumerate() {
                for &root in &plan.roots {
                    self.comm.barrier()?;
                    self.warm_up(dt, op, root)?;
                    let mut cycle = 0u64;
                    while req.run_cycles == 0 || cycle < u64::from(req.run_cycles) {
                        for (si, &size) in sizes.iter().enumerate() {
                            let seed = mix(((ti as u64) << 48)
                                ^ ((oi as u64) << 40)
                                ^ (u64::from(root) << 24)
                                ^ (cycle << 16)
                                ^ ((si as u64) << 2));
                            let row = self.row(dt, op, root, size, seed)?;
                            if let Some(p) = printer.as_deref_mut() {
                                p.row(&row);
                            }
                            summary.push(row);
                        }
                        cycle += 1;
                    }
                }
            }
        }
        if req.copy_bandwidth {
            summary.copy_gbps = Some(self.copy_bandwidth(plan.sweep.max, plan.iters)?);
        }
        if let Some(p) = printer {
            p.footer(self.comm, plan, mode, &summary)?;
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
    let plan = req.plan(
        comm.backend().is_emu(),
        comm.nranks(),
        comm.spans_one_host(),
    )?;
    let result = Printer::new(&plan, comm.rank() == 0).and_then(|mut printer| {
        Bench::new(comm, &plan)
            .map_err(Failure::from)
            .and_then(|b| b.run(printer.as_mut(), mode))
    });
    // A failure on one rank (rank 0's -J file, a call) stops the others' waits for it.
    if result.is_err() {
        comm.abort();
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_steps_through_the_buffer() {
        // 1 KiB calls in a 4 KiB buffer: offsets 0, 1K, 2K, 3K, then 0 again.
        let shifts: Vec<u64> = (0..6).map(|i| rotation(i, 1024, 4096)).collect();
        assert_eq!(shifts, [0, 1024, 2048, 3072, 0, 1024]);
        // Calls that do not divide the buffer stay inside it.
        for i in 0..20 {
            assert!(rotation(i, 1500, 4096) + 1500 <= 4096);
        }
        // The largest size and empty calls do not move.
        assert_eq!(rotation(3, 4096, 4096), 0);
        assert_eq!(rotation(3, 0, 4096), 0);
    }
}

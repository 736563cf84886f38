//! Graphs: work recorded on a capturing [`Stream`], replayed with one call ([`Graph`]).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use super::{Retained, Stream};
use crate::Result;
use crate::backend::cuda::{self, CudaModule};
use crate::backend::emu::queue::{EmuEvent, HostFn};
use crate::backend::{PerBackend, on_backend};

#[cfg(doc)]
use super::{Buffer, Kernel};

/// Work recorded on a [`Stream`] between [`Stream::begin_capture`] and [`Stream::end_capture`],
/// replayed with [`Graph::launch`] on any stream of the same backend (and, on CUDA, GPU).
///
/// Each launch runs the recorded items once more, in the recorded order, as one unit in the
/// target stream's order: after the work enqueued before it, before the work enqueued after it.
/// Runs of one graph never overlap: a launch also waits for the previous launch of the same graph
/// on another stream (as CUDA orders launches of one executable graph). Kernel arguments, copy
/// and set addresses are the recorded ones; state that must change from run to run lives in
/// device memory (as the built-in kernels' epochs do) or behind the host functions' own locks.
///
/// - **CUDA**: an instantiated CUDA graph (`cuGraphLaunch`); it keeps the recorded kernels'
///   modules loaded. Dropping it destroys the executable graph (the driver defers that until
///   a running launch completed) and the graph; drop it only after its launches have finished if
///   no [`Kernel`] keeps their modules loaded.
/// - **Emulator**: the recorded items, queued again on each launch; a running launch keeps them
///   alive, so the graph may drop at any time. A recorded item that fails fails the stream it
///   runs on (its sticky error), as queued work does.
///
/// **What recorded collectives use stays alive.** A graph that captured host collectives or
/// send/recv ([`Communicator`](crate::Communicator)'s) holds what they use: the communicator
/// (its signal area, control block and staging windows), the windows' mappings and the
/// [`Buffer`]s' memory. So a [`Window`](crate::Window) or [`Buffer`] dropped while such a graph
/// exists stays mapped (allocated) until the graph drops, and every launch of the graph finds
/// it. Dropping such a graph waits for its last launch first (bounded: symcomm's kernels wait
/// at most the device timeout), then releases what it holds, which the last holder frees. A
/// graph launched into another capture passes what it holds on to the outer graph. Work
/// recorded by captures symcomm did not begin (another library's `cuStreamBeginCapture` on a
/// wrapped stream, see [`Stream::from_cuda_raw`]) is outside this: its owner keeps the memory
/// alive.
/// It also keeps their stream's lane (see [streams and lanes](crate::Communicator#streams-and-lanes)) in use while it
/// exists, so that the lane's next stream never runs beside a replay.
///
/// `Send + Sync`: it may be launched from any thread.
pub struct Graph {
    pub(super) inner: GraphInner,
    /// What the recorded work uses (see the type's docs); after `inner` in drop order.
    pub(super) retained: Vec<Retained>,
}

pub(super) type GraphInner = PerBackend<CudaGraph, EmuGraph>;

/// A CUDA graph and what its nodes need.
pub(super) struct CudaGraph {
    /// Declared first: destroyed before the modules its kernel nodes use are unloaded.
    pub(super) exec: cuda::Graph,
    pub(super) modules: Vec<Arc<CudaModule>>,
    /// Recorded after the latest launch while the graph retains something: its drop waits
    /// for it (launches of one executable graph run one after the other).
    pub(super) last: Mutex<Option<cuda::Event>>,
}

/// An emulator graph: the recorded items.
pub(super) struct EmuGraph {
    pub(super) items: Vec<HostFn>,
    /// Completes with the previous launch.
    pub(super) last: Mutex<Option<EmuEvent>>,
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            PerBackend::Cuda(g) => f.debug_tuple("Graph::Cuda").field(&g.exec).finish(),
            PerBackend::Emu(g) => f
                .debug_struct("Graph::Emu")
                .field("items", &g.items.len())
                .finish(),
        }
    }
}

impl Graph {
    /// Enqueues one run of the recorded work on `stream` and returns without waiting; on a
    /// capturing stream the run is recorded (on CUDA as a child graph). What recorded host
    /// collectives and send/recv use, the graph keeps alive (see the type's docs); for work
    /// recorded through the `unsafe` [`Stream::launch`] and [`Stream::copy_raw`], their
    /// contracts extend to every launch of the graph.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `stream` belongs to the other backend (or, on CUDA,
    /// another GPU); [`Error::Cuda`]; the sticky error of a failed emulator stream.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        // No synchronizing free runs while a launch is being enqueued (`crate::sync_free`).
        let _launching = crate::sync_free::launching();
        match self.inner.pair(&stream.inner, "the graph", "the stream")? {
            PerBackend::Cuda((
                CudaGraph {
                    exec,
                    modules,
                    last,
                },
                s,
            )) => {
                let mut capture = stream.capture();
                // Held across the launch and its event, so that `last` follows the launch order.
                let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
                s.launch_graph(exec)?;
                if let Some(c) = capture.as_mut() {
                    for m in modules {
                        c.keep(m);
                    }
                    c.retain(self.retained.iter().cloned());
                } else if s.is_capturing() {
                    // Recorded into a capture begun outside symcomm, whose graph it cannot
                    // reach: what this graph retains stays alive for good.
                    for k in &self.retained {
                        std::mem::forget(Arc::clone(k));
                    }
                } else if !self.retained.is_empty() {
                    match s.record_event() {
                        Ok(ev) => *last = Some(ev),
                        Err(e) => {
                            // Without an event the drop could not wait for this launch: wait now.
                            tracing::warn!(target: "symcomm::stream", error = %e, "no event after a graph launch; synchronizing");
                            let _ = s.synchronize();
                        }
                    }
                }
                Ok(())
            }
            PerBackend::Emu((EmuGraph { items, last }, emu)) => {
                let mut capture = stream.capture();
                if let Some(c) = capture.as_mut() {
                    emu.sticky()?;
                    c.items.extend(items.iter().cloned());
                    c.retain(self.retained.iter().cloned());
                    return Ok(());
                }
                let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
                emu.launch_graph(items, &mut last)
            }
        }
    }

    /// Recorded items: on the emulator every recorded launch, copy, set and host function (a
    /// graph launched during the capture adds its items); on CUDA the graph's node count (a
    /// graph launched during the capture is one child-graph node).
    pub fn len(&self) -> usize {
        match &self.inner {
            PerBackend::Cuda(g) => g.exec.node_count(),
            PerBackend::Emu(g) => g.items.len(),
        }
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if self.retained.is_empty() {
            return;
        }
        // What the graph retains outlives its last launch (launches of one graph never overlap,
        // so the last one finishing means all did); bounded like every symcomm kernel.
        let waited = on_backend!(&mut self.inner, g => g
            .last
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .map(|ev| ev.synchronize()));
        if let Some(Err(e)) = waited {
            // A failed launch: nothing of it runs any more (CUDA's context error; the emulator
            // skipped the rest).
            tracing::debug!(target: "symcomm::stream", error = %e, "a dropped graph's last launch failed");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{Duration, Instant};

    use symcomm_device::abi::SYMCOMM_STATUS_OK;

    use super::super::test_support::{PING_PONG, enqueued, gate, is_invalid, serial, words};
    use super::*;
    use crate::backend::Backend;
    use crate::backend::emu::EmuTeam;
    use crate::stream::{Buffer, Kernel, KernelArgs, LaunchConfig};
    use crate::{DEVICE_IMAGE, Error};

    /// Appends `tag` to `log` when run.
    fn log_item(
        log: &Arc<Mutex<Vec<&'static str>>>,
        tag: &'static str,
    ) -> impl Fn() -> Result<()> + Send + Sync + 'static {
        let log = Arc::clone(log);
        move || {
            log.lock().unwrap().push(tag);
            Ok(())
        }
    }

    #[test]
    fn graphs_replay_recorded_work_and_kernel_epochs_continue() {
        let _g = serial();
        let (rounds, words_per_round, replays) = (3u32, 32u32, 20usize);
        let mut team = EmuTeam::new(2, u64::from(words_per_round) * 4).unwrap();
        let kernel = Kernel::load(&Backend::Emu, &DEVICE_IMAGE, PING_PONG).unwrap();
        let streams = [
            Stream::new(&Backend::Emu).unwrap(),
            Stream::new(&Backend::Emu).unwrap(),
        ];
        // Per rank: the kernel's result words, a snapshot of them, and what each run of the
        // host item saw: (result, snapshot).
        let results: Vec<Arc<Buffer>> = (0..2)
            .map(|_| Arc::new(Buffer::new(&Backend::Emu, 12).unwrap()))
            .collect();
        let snapshots: Vec<Arc<Buffer>> = (0..2)
            .map(|_| Arc::new(Buffer::new(&Backend::Emu, 12).unwrap()))
            .collect();
        type Seen = Arc<Mutex<Vec<([u32; 3], [u32; 3])>>>;
        let seen: Vec<Seen> = (0..2).map(|_| Seen::default()).collect();
        let config = LaunchConfig::linear(1, 32);
        let mut graphs = Vec::new();
        for (rank, stream) in streams.iter().enumerate() {
            let (result, snapshot) = (&results[rank], &snapshots[rank]);
            assert!(!stream.is_capturing());
            stream.begin_capture().unwrap();
            assert!(stream.is_capturing());
            {
                let (seen, result, snapshot) = (
                    Arc::clone(&seen[rank]),
                    Arc::clone(result),
                    Arc::clone(snapshot),
                );
                stream
                    .enqueue_host(move || {
                        let r = words::<3>(&result, 0);
                        let s = words::<3>(&snapshot, 0);
                        seen.lock().unwrap().push((r, s));
                        Ok(())
                    })
                    .unwrap();
            }
            let args = ping_pong_args_at(&mut team, rank as u32, rounds, words_per_round, result);
            // SAFETY: the ranges lie in this rank's result and snapshot buffers, and the
            // arguments match symcomm_ping_pong; buffers and team outlive every launch of the
            // graph (the streams are synchronized before anything drops).
            unsafe {
                stream.copy_raw(snapshot.addr(), result.addr(), 12).unwrap();
                stream.memset_raw(result.addr(), 0, 12).unwrap();
                stream.launch(&kernel, config, &args).unwrap();
            }
            let graph = stream.end_capture().unwrap();
            assert!(!stream.is_capturing());
            assert_eq!(graph.len(), 4);
            assert!(!graph.is_empty());
            assert!(format!("{graph:?}").contains("items: 4"), "{graph:?}");
            graphs.push(graph);
        }
        // Recording ran nothing.
        std::thread::sleep(Duration::from_millis(20));
        for (rank, stream) in streams.iter().enumerate() {
            assert!(stream.is_idle().unwrap());
            assert_eq!(enqueued(stream), 0);
            assert!(seen[rank].lock().unwrap().is_empty());
        }

        for _ in 0..replays {
            for (graph, stream) in graphs.iter().zip(&streams) {
                graph.launch(stream).unwrap();
            }
        }
        for s in &streams {
            s.synchronize().unwrap();
        }
        let ok = [SYMCOMM_STATUS_OK, 0, rounds];
        for rank in 0..2 {
            let seen = seen[rank].lock().unwrap();
            assert_eq!(seen.len(), replays, "rank {rank}: host item runs");
            // Run k's host item sees run k-1's kernel result (the set before each kernel and the
            // kernel's own bounded waits ran in order) and run k-2's result in the snapshot
            // (copied before the set).
            for (k, &(r, s)) in seen.iter().enumerate() {
                let want_r = if k >= 1 { ok } else { [0; 3] };
                let want_s = if k >= 2 { ok } else { [0; 3] };
                assert_eq!(
                    (r, s),
                    (want_r, want_s),
                    "rank {rank} run {k}: (result, snapshot)"
                );
            }
            assert_eq!(words::<3>(&results[rank], 0), ok, "rank {rank}: last run");
            assert_eq!(words::<3>(&snapshots[rank], 0), ok);
        }
        // 20 runs of 3 rounds each continued the epochs: one more plain launch per rank, after
        // the replays, still pairs up.
        for (rank, stream) in streams.iter().enumerate() {
            // SAFETY: as above.
            unsafe { stream.memset_raw(results[rank].addr(), 0, 12) }.unwrap();
            let args = ping_pong_args_at(
                &mut team,
                rank as u32,
                rounds,
                words_per_round,
                &results[rank],
            );
            // SAFETY: as above.
            unsafe { stream.launch(&kernel, config, &args) }.unwrap();
        }
        for (rank, stream) in streams.iter().enumerate() {
            stream.synchronize().unwrap();
            assert_eq!(words::<3>(&results[rank], 0), ok);
        }
    }

    fn ping_pong_args_at(
        team: &mut EmuTeam,
        rank: u32,
        rounds: u32,
        words: u32,
        result: &Buffer,
    ) -> KernelArgs {
        KernelArgs::new()
            .arg(&team.dev_comm(rank, 20_000_000_000))
            .arg(&team.window(rank))
            .arg(&rounds)
            .arg(&words)
            .arg(&result.addr())
    }

    #[test]
    fn capture_misuse_is_refused_and_the_stream_works_after() {
        let _g = serial();
        let stream = Stream::new(&Backend::Emu).unwrap();
        let other = Stream::new(&Backend::Emu).unwrap();
        let kernel = Kernel::load(&Backend::Emu, &DEVICE_IMAGE, PING_PONG).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        is_invalid(stream.end_capture(), "not capturing");

        stream.enqueue_host(log_item(&log, "before")).unwrap();
        stream.begin_capture().unwrap();
        is_invalid(stream.begin_capture(), "already capturing");
        is_invalid(stream.synchronize(), "synchronize is not allowed while");
        is_invalid(stream.is_idle(), "is_idle");
        is_invalid(stream.record_event(), "record_event");
        let event = other.record_event().unwrap();
        is_invalid(stream.wait_event(&event), "wait_event");
        // SAFETY: refused before queueing or recording.
        is_invalid(
            unsafe { stream.launch(&kernel, LaunchConfig::linear(0, 1), &KernelArgs::new()) },
            "empty launch",
        );
        // Only the thread that began the capture may end it.
        std::thread::scope(|s| {
            s.spawn(|| is_invalid(stream.end_capture(), "the thread that called begin_capture"))
                .join()
                .unwrap();
        });
        assert!(stream.is_capturing(), "refusals do not end the capture");
        stream.enqueue_host(log_item(&log, "recorded")).unwrap();
        let graph = stream.end_capture().unwrap();
        assert_eq!(graph.len(), 1);
        is_invalid(stream.end_capture(), "not capturing");

        // The stream works as before; the recorded item ran only when the graph was launched.
        stream.enqueue_host(log_item(&log, "after")).unwrap();
        stream.synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), ["before", "after"]);
        graph.launch(&stream).unwrap();
        stream.record_event().unwrap().synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), ["before", "after", "recorded"]);

        // An empty capture gives an empty graph.
        stream.begin_capture().unwrap();
        let empty = stream.end_capture().unwrap();
        assert!(empty.is_empty());
        empty.launch(&stream).unwrap();
        stream.synchronize().unwrap();

        // A stream dropped while capturing discards the record.
        let dropped = Stream::new(&Backend::Emu).unwrap();
        dropped.begin_capture().unwrap();
        dropped.enqueue_host(log_item(&log, "never")).unwrap();
        drop(dropped);
        assert_eq!(log.lock().unwrap().len(), 3);
    }

    #[test]
    fn graph_launches_are_ordered_across_streams_and_nest() {
        let _g = serial();
        let a = Stream::new(&Backend::Emu).unwrap();
        let b = Stream::new(&Backend::Emu).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        a.begin_capture().unwrap();
        {
            let item = log_item(&log, "g");
            a.enqueue_host(move || {
                std::thread::sleep(Duration::from_millis(60));
                item()
            })
            .unwrap();
        }
        let graph = a.end_capture().unwrap();

        // The launch on `b` waits for the one on `a`: the two runs do not overlap.
        let start = Instant::now();
        graph.launch(&a).unwrap();
        graph.launch(&b).unwrap();
        b.enqueue_host(log_item(&log, "b")).unwrap();
        b.synchronize().unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(120),
            "runs of one graph overlapped: {:?}",
            start.elapsed()
        );
        assert_eq!(*log.lock().unwrap(), ["g", "g", "b"]);
        a.synchronize().unwrap();

        // A graph launched during a capture is recorded into the new graph, in order.
        b.begin_capture().unwrap();
        b.enqueue_host(log_item(&log, "x")).unwrap();
        graph.launch(&b).unwrap();
        b.enqueue_host(log_item(&log, "y")).unwrap();
        let outer = b.end_capture().unwrap();
        assert_eq!(outer.len(), 3);
        log.lock().unwrap().clear();
        outer.launch(&a).unwrap();
        outer.launch(&a).unwrap();
        a.synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), ["x", "g", "y", "x", "g", "y"]);
    }

    #[test]
    fn a_failed_replay_fails_the_stream() {
        let _g = serial();
        let stream = Stream::new(&Backend::Emu).unwrap();
        let runs = Arc::new(AtomicU32::new(0));
        stream.begin_capture().unwrap();
        {
            let runs = Arc::clone(&runs);
            stream
                .enqueue_host(move || {
                    if runs.fetch_add(1, Ordering::SeqCst) == 2 {
                        return Err(Error::InvalidArgument("third run".into()));
                    }
                    Ok(())
                })
                .unwrap();
        }
        let graph = stream.end_capture().unwrap();
        // Hold the stream until every launch is queued: launches after the failure is known are
        // refused (checked below).
        let (release, gate) = gate();
        stream
            .enqueue_host(move || {
                gate();
                Ok(())
            })
            .unwrap();
        for _ in 0..5 {
            graph.launch(&stream).unwrap();
        }
        drop(release);
        let e = stream.synchronize().unwrap_err();
        assert_eq!(e.to_string(), "invalid argument: third run");
        assert_eq!(runs.load(Ordering::SeqCst), 3, "later runs are skipped");
        // Sticky: further launches and captures are refused with the same error.
        assert_eq!(
            graph.launch(&stream).unwrap_err().to_string(),
            e.to_string()
        );
        assert_eq!(
            stream.begin_capture().unwrap_err().to_string(),
            e.to_string()
        );
        assert!(!stream.is_capturing());
    }
}

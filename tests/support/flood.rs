//! A flood of the root's bootstrap port (issue 11 §2) and a rendezvous timed under it, for
//! `tests/bootstrap.rs` and `cli/tests/reliability.rs`. Ranks are threads of this process on
//! loopback.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use symcomm::Result;
use symcomm::bootstrap::{self, Bootstrap, BootstrapConfig, UniqueId};

/// The flood of issue 11 §2: silent connections held open, and more reopened as soon as the
/// root drops them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Flood {
    /// Connections opened once and kept open.
    pub(crate) held: usize,
    /// Connections each reopened as soon as the root drops it.
    pub(crate) churn: usize,
}

/// The flood issue 11 §2 found blocking the rendezvous: 200 held, 128 reopened.
pub(crate) const ISSUE_11: Flood = Flood {
    held: 200,
    churn: 128,
};

/// Floods `addr` the way anyone who can reach the port can: `held` silent connections opened
/// once and kept open, plus `churn` more, each reopened as soon as the root drops it. Says on
/// `ready` once all are open; runs until `stop`; returns how many connections it opened.
pub(crate) fn flood(
    addr: SocketAddr,
    held: usize,
    churn: usize,
    stop: Arc<AtomicBool>,
    ready: mpsc::Sender<()>,
) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let connect = || TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok();
        let mut opened = 0u64;
        let mut kept = Vec::with_capacity(held);
        while kept.len() < held && !stop.load(Ordering::SeqCst) {
            if let Some(s) = connect() {
                kept.push(s);
                opened += 1;
            }
        }
        let mut slots: Vec<Option<TcpStream>> = (0..churn).map(|_| None).collect();
        let mut told = false;
        while !stop.load(Ordering::SeqCst) {
            for slot in &mut slots {
                let open = slot.as_mut().is_some_and(|s| {
                    let mut b = [0u8; 64];
                    matches!(s.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
                });
                if !open {
                    *slot = connect().filter(|s| s.set_nonblocking(true).is_ok());
                    opened += u64::from(slot.is_some());
                }
            }
            if !told && slots.iter().all(Option::is_some) {
                let _ = ready.send(());
                told = true;
            }
            thread::sleep(Duration::from_micros(200));
        }
        drop(kept);
        opened
    })
}

/// A rendezvous of `n` ranks timed from the start of ranks 1.. (the root already listening,
/// and flooded first when `flood` is given).
pub(crate) struct TimedJoin {
    /// Ranks 1.. in order: each one's result and how long its init took.
    pub(crate) ranks: Vec<(Result<Bootstrap>, Duration)>,
    /// The root's result.
    pub(crate) root: Result<Bootstrap>,
    /// From the start of ranks 1.. until every one of them returned.
    pub(crate) joined_in: Duration,
    /// Connections the flood opened (0 without one).
    pub(crate) opened: u64,
}

/// Runs a rendezvous of `n` ranks (threads, loopback, init timeout `timeout`) with the root's
/// port under `flood` (fully open before ranks 1.. start) or quiet.
///
/// # Panics
/// When the flood cannot open its connections within 10 s.
pub(crate) fn timed_join(n: u32, timeout: Duration, flood: Option<Flood>) -> TimedJoin {
    let id = UniqueId::new_on(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
    let rank = |r: u32| {
        let c = BootstrapConfig::new(id.clone(), r, n)
            .with_timeout(timeout)
            .with_host_id("test-host");
        thread::spawn(move || {
            let t = Instant::now();
            let r = bootstrap::init_with(&c);
            (r, t.elapsed())
        })
    };
    let root = rank(0);
    let stop = Arc::new(AtomicBool::new(false));
    let flooder = flood.map(|f| {
        let (ready_tx, ready) = mpsc::channel();
        let h = self::flood(id.addr(), f.held, f.churn, Arc::clone(&stop), ready_tx);
        ready
            .recv_timeout(Duration::from_secs(10))
            .expect("the flood never got its connections open");
        h
    });
    let t = Instant::now();
    let others: Vec<_> = (1..n).map(rank).collect();
    let ranks: Vec<_> = others.into_iter().map(|h| h.join().unwrap()).collect();
    let joined_in = t.elapsed();
    let (root, _) = root.join().unwrap();
    stop.store(true, Ordering::SeqCst);
    let opened = flooder.map_or(0, |h| h.join().unwrap());
    TimedJoin {
        ranks,
        root,
        joined_in,
        opened,
    }
}

//! Init/destroy cycles and the process counts they must leave as they found them, for
//! `tests/comm_leaks.rs` and `cli/tests/reliability.rs`. Each must run alone in its process:
//! any other test's threads, fds or mappings would change the counts.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr};
use std::thread;
use std::time::{Duration, Instant};

use symcomm::bootstrap::BootstrapConfig;
use symcomm::{CommOptions, Communicator, Device, UniqueId};

/// What an init/destroy cycle must not grow, and the resident set it should not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Open file descriptors.
    pub(crate) fds: usize,
    /// Threads of this process.
    pub(crate) threads: usize,
    /// Mappings of memfds (every window is one per rank).
    pub(crate) memfds: usize,
    /// Resident set size, KiB (`VmRSS`).
    pub(crate) rss_kib: u64,
}

impl Counts {
    /// The counts that must return exactly: fds, threads, memfd mappings.
    pub(crate) fn exact(&self) -> (usize, usize, usize) {
        (self.fds, self.threads, self.memfds)
    }
}

fn count_dir(path: &str) -> usize {
    std::fs::read_dir(path).unwrap().count()
}

/// Mappings of memfds in this process.
pub(crate) fn memfd_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("memfd:"))
        .count()
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// This process's counts now.
pub(crate) fn counts() -> Counts {
    Counts {
        fds: count_dir("/proc/self/fd"),
        threads: count_dir("/proc/self/task"),
        memfds: memfd_mappings(),
        rss_kib: rss_kib(),
    }
}

/// The counts once the exact ones are back to `before`'s, or after 2 s (threads of the last
/// cycle may still be exiting).
pub(crate) fn settled(before: Counts) -> Counts {
    let start = Instant::now();
    let mut now = counts();
    while now.exact() != before.exact() && start.elapsed() < Duration::from_secs(2) {
        thread::sleep(Duration::from_millis(20));
        now = counts();
    }
    now
}

/// One init/destroy cycle: a communicator of `nranks` ranks as threads (emulator, loopback), a
/// window allocated, written and freed on each, a barrier.
pub(crate) fn cycle(nranks: u32) {
    let id = UniqueId::new_on(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
    thread::scope(|s| {
        for r in 0..nranks {
            let id = &id;
            s.spawn(move || {
                let c = BootstrapConfig::new(id.clone(), r, nranks)
                    .with_timeout(Duration::from_secs(20))
                    .with_host_id("leak-host");
                let comm =
                    Communicator::init_with(&c, Device::Emu, &CommOptions::default()).unwrap();
                let w = comm.alloc_window::<u64>(1000).unwrap();
                w.write(0, &[comm.rank() as u64]).unwrap();
                comm.barrier().unwrap();
                assert!(
                    memfd_mappings() >= 2 * nranks as usize,
                    "windows are memfd mappings"
                );
            });
        }
    });
}

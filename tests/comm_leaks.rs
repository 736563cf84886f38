//! 200 init/destroy cycles of a 2-rank communicator (ranks as threads, emulator), each with a
//! window allocated and freed: open fds, threads and memfd mappings must return to their
//! baseline. Alone in its test binary so that no other test changes the counts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr};
use std::thread;
use std::time::{Duration, Instant};

use symcomm::bootstrap::BootstrapConfig;
use symcomm::{CommOptions, Communicator, Device, UniqueId};

fn count_dir(path: &str) -> usize {
    std::fs::read_dir(path).unwrap().count()
}

fn memfd_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("memfd:"))
        .count()
}

fn counts() -> (usize, usize, usize) {
    (
        count_dir("/proc/self/fd"),
        count_dir("/proc/self/task"),
        memfd_mappings(),
    )
}

fn cycle(nranks: u32) {
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

#[test]
fn two_hundred_init_destroy_cycles_leak_nothing() {
    // Warm up lazily initialized process state (logging, the emulator, the DNS-free host id).
    cycle(2);
    // Threads of the scope above may still be exiting; wait for the count to settle.
    thread::sleep(Duration::from_millis(100));
    let before = counts();
    let t = Instant::now();
    for i in 0..200 {
        cycle(if i % 10 == 9 { 3 } else { 2 });
    }
    let elapsed = t.elapsed();
    let mut after = counts();
    let settle = Instant::now();
    while after != before && settle.elapsed() < Duration::from_secs(2) {
        thread::sleep(Duration::from_millis(20));
        after = counts();
    }
    eprintln!(
        "200 cycles in {elapsed:?}; (fds, threads, memfd maps) before {before:?}, after {after:?}"
    );
    assert_eq!(
        after, before,
        "(fds, threads, memfd mappings) after 200 init/destroy cycles"
    );
}

//! 200 init/destroy cycles of a 2-rank communicator (ranks as threads, emulator), each with a
//! window allocated and freed: open fds, threads and memfd mappings must return to their
//! baseline. Alone in its test binary so that no other test changes the counts. (The
//! reliability scoreboard, `cli/tests/reliability.rs`, runs 1000 cycles and reports RSS too.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mod.rs"]
mod support;

use std::thread;
use std::time::{Duration, Instant};

use support::leaks::{counts, cycle, settled};

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
    let after = settled(before);
    eprintln!(
        "200 cycles in {elapsed:?}; (fds, threads, memfd maps) before {:?}, after {:?}",
        before.exact(),
        after.exact()
    );
    assert_eq!(
        after.exact(),
        before.exact(),
        "(fds, threads, memfd mappings) after 200 init/destroy cycles"
    );
}

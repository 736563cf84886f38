//! Destroying every rank of a communicator at once is no fault: no rank may report another as
//! lost while the ranks say goodbye. Alone in its process: it installs a global `tracing`
//! subscriber that keeps every error event, and counts them over many teardowns.
//!
//! The race it guards against: a rank that has sent its goodbye (its communicator is being
//! destroyed) reads the root's connection closing (the root got the goodbye and was destroyed
//! too, so it owes this rank none) before its monitor thread stops, and reported the root lost.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mod.rs"]
mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

/// Error events, one line each.
#[derive(Clone, Default)]
struct Errors(Arc<Mutex<Vec<u8>>>);

impl Write for Errors {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn ranks_destroyed_together_report_no_one_lost() {
    let errors = Errors::default();
    let writer = errors.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::ERROR)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    let cycles = 300;
    for _ in 0..cycles {
        // Every rank runs one collective and drops its communicator as soon as it returns.
        let results = support::with_ranks(3, |comm| {
            let w = comm.alloc_window::<f32>(64).unwrap();
            support::all_reduce(&comm, &w, &w, 64).unwrap();
        });
        assert_eq!(results.len(), 3);
    }
    let text = String::from_utf8(errors.0.lock().unwrap().clone()).unwrap();
    let lost = text.lines().filter(|l| l.contains("is lost")).count();
    assert_eq!(
        lost, 0,
        "{lost} ranks reported lost over {cycles} teardowns:\n{text}"
    );
}

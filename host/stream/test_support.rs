//! Helpers of the stream modules' unit tests.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::streams::StreamInner;
use super::{Buffer, Stream};
use crate::{Error, Result};

pub(super) const PING_PONG: &str = "symcomm_ping_pong";

/// Serializes the stream modules' tests: the thread-count check must not see other tests'
/// streams.
static SERIAL: Mutex<()> = Mutex::new(());

pub(super) fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A gate for a host item: the returned function blocks until the sender is dropped (also
/// when a failing test unwinds, so a held stream never hangs the test).
pub(super) fn gate() -> (
    std::sync::mpsc::Sender<()>,
    impl Fn() + Send + Sync + 'static,
) {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = Mutex::new(rx);
    (tx, move || {
        let _ = rx.lock().unwrap().recv();
    })
}

/// A buffer's u32 words `offset..offset + N`.
pub(super) fn words<const N: usize>(buf: &Buffer, offset: usize) -> [u32; N] {
    let mut out = [0u32; N];
    buf.read(offset, &mut out).unwrap();
    out
}

/// Items ever queued on an emulator stream.
pub(super) fn enqueued(stream: &Stream) -> u64 {
    match &stream.inner {
        StreamInner::Emu(e) => e.progress().enqueued,
        StreamInner::Cuda(_) => panic!("not an emulator stream"),
    }
}

pub(super) fn is_invalid(r: Result<impl fmt::Debug>, needle: &str) {
    match r {
        Err(Error::InvalidArgument(m)) => assert!(m.contains(needle), "{m:?} lacks {needle:?}"),
        other => panic!("expected InvalidArgument({needle:?}), got {other:?}"),
    }
}

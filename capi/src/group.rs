//! Groups (`ncclGroupStart` / `ncclGroupEnd`), per thread: inside one, calls are checked and
//! recorded; the outermost `ncclGroupEnd` runs them. Communicator inits first, concurrently
//! (one thread may create every rank of a communicator that way); then each communicator's
//! work (`coll::run`: its collectives in call order, then its sends and receives as one
//! group), the communicators concurrently, each on its own thread — so one thread may drive
//! several ranks, as with NCCL, without a rank waiting on one not yet started.

use std::cell::RefCell;
use std::sync::Arc;

use crate::coll::{self, Work};
use crate::comm::Comm;
use crate::create::{self, PendingInit};
use crate::error::{Fail, guard, guard_code};
use crate::types::{NCCL_INTERNAL_ERROR, NCCL_SUCCESS, NcclResult};

#[derive(Default)]
struct State {
    depth: u32,
    inits: Vec<PendingInit>,
    work: Vec<(Arc<Comm>, Work)>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Runs `pending` now with `run`, or records it for the end of this thread's group; whether
/// it ran now.
pub(crate) fn defer_init_or(
    pending: PendingInit,
    run: impl FnOnce(PendingInit) -> Result<(), Fail>,
) -> Result<bool, Fail> {
    let left = STATE.with(|s| {
        let mut s = s.borrow_mut();
        if s.depth > 0 {
            s.inits.push(pending);
            None
        } else {
            Some(pending)
        }
    });
    left.map_or(Ok(false), |p| run(p).map(|()| true))
}

/// Runs `work` on `comm` now, or records it for the end of this thread's group.
pub(crate) fn submit(comm: Arc<Comm>, work: Work) -> Result<(), Fail> {
    let left = STATE.with(|s| {
        let mut s = s.borrow_mut();
        if s.depth > 0 {
            s.work.push((comm, work));
            None
        } else {
            Some((comm, work))
        }
    });
    match left {
        Some((comm, work)) => coll::run(&comm, vec![work]),
        None => Ok(()),
    }
}

/// Each communicator's work, in the order the communicators first appear.
fn by_comm(work: Vec<(Arc<Comm>, Work)>) -> Vec<(Arc<Comm>, Vec<Work>)> {
    let mut out: Vec<(Arc<Comm>, Vec<Work>)> = Vec::new();
    for (comm, w) in work {
        match out.iter_mut().find(|(c, _)| Arc::ptr_eq(c, &comm)) {
            Some((_, list)) => list.push(w),
            None => out.push((comm, vec![w])),
        }
    }
    out
}

/// Runs `f` on every item concurrently, each on its own thread (one item: on this one), every
/// run to its end.
///
/// # Errors
/// The first failure, in item order (`ncclInternalError` for a panic, naming `what`).
pub(crate) fn concurrently<T: Send>(
    items: Vec<T>,
    what: &str,
    f: impl Fn(T) -> Result<(), Fail> + Sync,
) -> Result<(), Fail> {
    if items.len() == 1 {
        return items.into_iter().try_for_each(f);
    }
    let f = &f;
    let results: Vec<Result<(), Fail>> = std::thread::scope(|s| {
        let handles: Vec<_> = items.into_iter().map(|i| s.spawn(move || f(i))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Fail::new(
                        NCCL_INTERNAL_ERROR,
                        format!("{what} thread panicked"),
                    ))
                })
            })
            .collect()
    });
    results.into_iter().collect()
}

fn run_work(work: Vec<(Arc<Comm>, Vec<Work>)>) -> Result<(), Fail> {
    concurrently(work, "a group", |(comm, list)| coll::run(&comm, list))
}

/// `ncclGroupStart`: opens a (nested) group on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupStart() -> NcclResult {
    guard("ncclGroupStart", || {
        STATE.with(|s| s.borrow_mut().depth += 1);
        Ok(())
    })
}

/// `ncclGroupEnd`: closes this thread's group; the outermost runs what the group recorded and
/// returns the first error of that work, else `ncclInProgress` when it started non-blocking
/// communicator creations.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    guard_code("ncclGroupEnd", || {
        let taken = STATE.with(|s| {
            let mut s = s.borrow_mut();
            match s.depth {
                0 => Err(Fail::invalid_usage("ncclGroupEnd without ncclGroupStart")),
                1 => {
                    s.depth = 0;
                    Ok(Some((
                        std::mem::take(&mut s.inits),
                        std::mem::take(&mut s.work),
                    )))
                }
                _ => {
                    s.depth -= 1;
                    Ok(None)
                }
            }
        })?;
        let Some((inits, work)) = taken else {
            return Ok(NCCL_SUCCESS);
        };
        let made = if inits.is_empty() {
            Ok(NCCL_SUCCESS)
        } else {
            create::run_all(inits)
        };
        let ran = run_work(by_comm(work));
        ran.and(made)
    })
}

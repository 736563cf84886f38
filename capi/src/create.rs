//! Making communicators: from an id (`ncclCommInitRank[Config]`, `ncclCommInitAll`) or by
//! splitting one (`ncclCommSplit`), blocking or not (`config.blocking`), at once or at the end
//! of the caller's group.
//!
//! Blocking: the call (or `ncclGroupEnd`) returns when the communicator exists, and writes its
//! handle then. Non-blocking (`blocking = 0`): the handle is written at once and names a
//! communicator being created on a thread of its own; the call (or `ncclGroupEnd`) returns
//! `ncclInProgress`, and `ncclCommGetAsyncError` reports `ncclInProgress` until the creation
//! ends, then `ncclSuccess` or its failure. Until then every other call with the handle is
//! `ncclInvalidUsage`, except `ncclCommDestroy` / `ncclCommAbort` (the communicator is freed
//! when its creation ends).

use std::ffi::c_int;
use std::sync::Arc;

use symcomm::{Communicator, Device, UniqueId};

use crate::comm::{self, Comm, Slot};
use crate::error::{Fail, guard_code};
use crate::group;
use crate::init::put;
use crate::types::{
    CONFIG_MAGIC, CONFIG_UNDEF_INT, CommPtr, ConfigHead, NCCL_IN_PROGRESS, NCCL_INTERNAL_ERROR,
    NCCL_SUCCESS, NCCL_SYSTEM_ERROR, NcclResult,
};

/// `NCCL_SPLIT_NOCOLOR`.
const SPLIT_NOCOLOR: c_int = -1;

/// Whether `config` (NULL: `default`) asks for blocking creation.
///
/// # Errors
/// `ncclInvalidArgument` for a config not made with `NCCL_CONFIG_INITIALIZER` or a `blocking`
/// that is neither 0 nor 1 (nor undefined).
pub(crate) fn blocking(config: *const ConfigHead, default: bool) -> Result<bool, Fail> {
    if config.is_null() {
        return Ok(default);
    }
    // SAFETY: non-null: the caller's config, at least its header (checked by `size` before
    // `blocking` is read).
    let (size, magic) = unsafe { ((*config).size, (*config).magic) };
    if magic != CONFIG_MAGIC {
        return Err(Fail::invalid_argument(
            "config was not initialized with NCCL_CONFIG_INITIALIZER (bad magic)",
        ));
    }
    if size < size_of::<ConfigHead>() {
        return Err(Fail::invalid_argument(format!(
            "config.size {size} is smaller than any ncclConfig_t"
        )));
    }
    // SAFETY: `size` covers `blocking`.
    match unsafe { (*config).blocking } {
        0 => Ok(false),
        1 => Ok(true),
        CONFIG_UNDEF_INT => Ok(default),
        other => Err(Fail::invalid_argument(format!(
            "config.blocking {other} is neither 0 nor 1"
        ))),
    }
}

/// Where a new communicator comes from.
pub(crate) enum Source {
    /// An id (rank 0 of an id made here releases its reservation when its init returns).
    Id {
        id: UniqueId,
        rank: u32,
        nranks: u32,
        device: Device,
    },
    /// A split of `parent` (`color` `None`: this rank joins no new communicator).
    Split {
        parent: Arc<Comm>,
        color: Option<u32>,
        key: i32,
    },
}

/// A communicator to create: at once, or at the end of the caller's group.
pub(crate) struct PendingInit {
    /// Where the `ncclComm_t` goes (the caller's `ncclComm_t*`, as an address: it must stay
    /// valid until the group ends, NCCL's rule). Written when the creation ends (blocking) or
    /// already written with the handle of `slot` (non-blocking).
    out: usize,
    source: Source,
    /// Non-blocking: what the background creation fills.
    slot: Option<Arc<Slot>>,
}

impl PendingInit {
    /// A creation whose handle goes to `out` (non-null), blocking or not. A non-blocking one
    /// writes its handle now.
    pub(crate) fn new(out: *mut CommPtr, source: Source, blocking: bool) -> Self {
        let slot = (!blocking).then(|| {
            let slot = Arc::new(Slot::default());
            // SAFETY: the caller checked `out` is non-null; NCCL's contract: it points to a
            // writable `ncclComm_t`.
            unsafe { out.write(comm::register_creating(Arc::clone(&slot))) };
            slot
        });
        PendingInit {
            out: out as usize,
            source,
            slot,
        }
    }

    fn is_blocking(&self) -> bool {
        self.slot.is_none()
    }

    /// Creates the communicator (`None`: a split this rank joins with no color).
    fn make(source: Source, blocking: bool) -> Result<Option<Arc<Comm>>, Fail> {
        let made = match source {
            Source::Id {
                id,
                rank,
                nranks,
                device,
            } => {
                let joined = Communicator::init(&id, rank, nranks, device);
                if rank == 0 {
                    crate::init::forget_id(&id);
                }
                Some(joined?)
            }
            Source::Split { parent, color, key } => parent.inner.split(color, key)?,
        };
        Ok(made.map(|c| Arc::new(Comm::new(c, blocking))))
    }

    /// Runs the creation: to its end (blocking), or started on a thread of its own.
    fn run(self) -> Result<(), Fail> {
        let PendingInit { out, source, slot } = self;
        let Some(slot) = slot else {
            let ptr = Self::make(source, true)?.map_or(std::ptr::null_mut(), comm::register);
            // SAFETY: `out` is the caller's non-null `ncclComm_t*`, valid until this init ends.
            unsafe { (out as *mut CommPtr).write(ptr) };
            return Ok(());
        };
        let filled = Arc::clone(&slot);
        std::thread::Builder::new()
            .name("nccl-comm-init".into())
            .spawn(move || {
                let made = Self::make(source, false).and_then(|c| {
                    c.ok_or_else(|| {
                        Fail::new(NCCL_INTERNAL_ERROR, "a non-blocking split made nothing")
                    })
                });
                filled.fill(made);
            })
            .map(drop)
            .map_err(|e| {
                let fail = Fail::new(
                    NCCL_SYSTEM_ERROR,
                    format!("starting the communicator's creation thread: {e}"),
                );
                slot.fill(Err(fail.clone()));
                fail
            })
    }
}

/// Runs `inits`: the blocking ones concurrently to their ends (they may be ranks of one
/// communicator, each on its own thread), the non-blocking ones started.
///
/// # Errors
/// The first failure (every init runs to its end either way).
pub(crate) fn run_all(inits: Vec<PendingInit>) -> Result<NcclResult, Fail> {
    let code = if inits.iter().all(PendingInit::is_blocking) {
        NCCL_SUCCESS
    } else {
        NCCL_IN_PROGRESS
    };
    group::concurrently(inits, "an init", PendingInit::run)?;
    Ok(code)
}

/// Creates `pending` now, or at the end of the caller's group: `ncclInProgress` for a
/// non-blocking creation started now, else `ncclSuccess` (made, or deferred: `ncclGroupEnd`
/// says `ncclInProgress` then).
pub(crate) fn start(pending: PendingInit) -> Result<NcclResult, Fail> {
    let blocking = pending.is_blocking();
    let ran = group::defer_init_or(pending, PendingInit::run)?;
    Ok(if ran && !blocking {
        NCCL_IN_PROGRESS
    } else {
        NCCL_SUCCESS
    })
}

/// `ncclCommSplit`: the ranks of `comm` passing the same `color` form a new communicator,
/// ranked by `key` (ties by their rank in `comm`); `NCCL_SPLIT_NOCOLOR` (-1) joins none
/// (`*newcomm` = NULL). Collective over `comm`. `config` NULL: `comm`'s blocking mode.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommSplit(
    comm: CommPtr,
    color: c_int,
    key: c_int,
    newcomm: *mut CommPtr,
    config: *mut ConfigHead,
) -> NcclResult {
    guard_code("ncclCommSplit", || {
        put(newcomm, "newcomm", std::ptr::null_mut())?;
        let parent = comm::lookup(comm)?;
        parent.check_usable()?;
        let color = match color {
            SPLIT_NOCOLOR => None,
            c => Some(u32::try_from(c).map_err(|_| {
                Fail::invalid_argument(format!(
                    "color {c} is neither non-negative nor NCCL_SPLIT_NOCOLOR"
                ))
            })?),
        };
        // A rank that joins nothing still takes part in the split: blocking (it gets no handle
        // whose progress it could poll).
        let blocking = blocking(config, parent.blocking())? || color.is_none();
        let source = Source::Split { parent, color, key };
        start(PendingInit::new(newcomm, source, blocking))
    })
}

//! `ncclMemAlloc` / `ncclMemFree` (device memory for collectives, in a process-wide registry)
//! and `ncclCommRegister` / `ncclCommDeregister` (buffers registered with one communicator).
//!
//! Allocations are symcomm [`Buffer`]s of the device [`device::for_alloc`] picks (on the
//! emulator, host memory the emulator uses as device memory), aligned to [`ALIGN`] with their
//! size rounded up to it, as NCCL's granularity-aligned allocations are. Registration checks the
//! range and returns a handle recorded on the communicator; it does not change how collectives
//! run (they take the same path as on any other buffer: no zero-copy registration yet).

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};

use symcomm::Buffer;

use crate::comm;
use crate::device;
use crate::error::{Fail, guard};
use crate::init::put;
use crate::types::{CommPtr, NcclResult};

/// Alignment of `ncclMemAlloc`'s pointers and granularity of its sizes: 4 KiB, NCCL's minimum
/// (`NCCL_WIN_REQUIRED_ALIGNMENT`).
pub(crate) const ALIGN: usize = 4096;

/// One `ncclMemAlloc`: the memory and the usable range inside it.
struct Allocation {
    /// Owns the memory (freed when the allocation leaves the registry).
    _buffer: Buffer,
    /// The usable bytes from the returned pointer (the request rounded up to [`ALIGN`]).
    size: usize,
}

/// Live allocations by the pointer `ncclMemAlloc` returned.
fn allocations() -> MutexGuard<'static, BTreeMap<usize, Allocation>> {
    static LIVE: LazyLock<Mutex<BTreeMap<usize, Allocation>>> = LazyLock::new(Mutex::default);
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn round_up(n: usize) -> Option<usize> {
    n.checked_add(ALIGN - 1).map(|v| v / ALIGN * ALIGN)
}

/// `ncclMemAlloc`: `*ptr` = `size` bytes (rounded up to 4 KiB) of device memory, 4 KiB aligned.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> NcclResult {
    guard("ncclMemAlloc", || {
        if ptr.is_null() {
            return Err(Fail::invalid_argument("ptr is NULL"));
        }
        if size == 0 {
            return Err(Fail::invalid_argument("size is 0"));
        }
        let usable = round_up(size)
            .filter(|&u| u.checked_add(ALIGN).is_some())
            .ok_or_else(|| Fail::invalid_argument(format!("size {size} is too large")))?;
        let backend = device::for_alloc()?;
        // One alignment unit more than needed, so that an aligned start fits whatever
        // alignment the allocator gives.
        let buffer = Buffer::new(&backend, usable + ALIGN)?;
        let start = round_up(buffer.addr() as usize)
            .ok_or_else(|| Fail::invalid_argument("the allocation's address overflows"))?;
        allocations().insert(
            start,
            Allocation {
                _buffer: buffer,
                size: usable,
            },
        );
        put(ptr, "ptr", start as *mut c_void)
    })
}

/// `ncclMemFree`: frees what `ncclMemAlloc` returned.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclMemFree(ptr: *mut c_void) -> NcclResult {
    guard("ncclMemFree", || {
        if ptr.is_null() {
            return Err(Fail::invalid_argument("ptr is NULL"));
        }
        let freed = allocations().remove(&(ptr as usize));
        freed.map(drop).ok_or_else(|| {
            Fail::invalid_argument(format!(
                "{ptr:p} is not a live allocation of ncclMemAlloc (freed already, or from \
                 elsewhere)"
            ))
        })
    })
}

/// Checks `buff..buff + size` for registration: when it starts inside an `ncclMemAlloc`
/// allocation it must end inside it too (other memory is taken as the caller's device memory,
/// which the library cannot see the bounds of).
fn check_range(buff: usize, size: usize) -> Result<(), Fail> {
    let end = buff
        .checked_add(size)
        .ok_or_else(|| Fail::invalid_argument(format!("buff + size {size} overflows")))?;
    let live = allocations();
    if let Some((&start, a)) = live.range(..=buff).next_back() {
        let alloc_end = start + a.size;
        if buff < alloc_end && end > alloc_end {
            return Err(Fail::invalid_argument(format!(
                "{size} bytes at offset {} exceed the {}-byte ncclMemAlloc allocation they \
                 start in",
                buff - start,
                a.size
            )));
        }
    }
    Ok(())
}

/// Handles of registrations, unique in the process (never 0).
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);

/// The checks of a buffer to register: `out` (where its handle goes, named `what`) and `buff`
/// non-null, `size` > 0, and a range that starts in an `ncclMemAlloc` allocation ends in it.
fn check_registration(
    out: *mut *mut c_void,
    what: &str,
    buff: *mut c_void,
    size: usize,
) -> Result<(), Fail> {
    if out.is_null() {
        return Err(Fail::invalid_argument(format!("{what} is NULL")));
    }
    if buff.is_null() {
        return Err(Fail::invalid_argument("buff is NULL"));
    }
    if size == 0 {
        return Err(Fail::invalid_argument("size is 0"));
    }
    check_range(buff as usize, size)
}

/// Records `size` bytes at `buff` on `c` under a new handle, written to `out` (checked).
fn register(
    c: &comm::Comm,
    buff: *mut c_void,
    size: usize,
    out: *mut *mut c_void,
    what: &str,
) -> Result<(), Fail> {
    let h = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
    c.register_buffer(h, buff as u64, size);
    put(out, what, h as *mut c_void)
}

/// Ends registration `handle` of `comm` (`what` names its kind in the error).
fn deregister(comm: CommPtr, handle: *mut c_void, what: &str) -> Result<(), Fail> {
    if comm::lookup(comm)?.deregister_buffer(handle as usize) {
        Ok(())
    } else {
        Err(Fail::invalid_argument(format!(
            "{handle:p} is not a {what} of this communicator (deregistered already, or made on \
             another one)"
        )))
    }
}

/// `ncclCommRegister`: registers `size` bytes at `buff` with `comm`; `*handle` names the
/// registration for `ncclCommDeregister`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommRegister(
    comm: CommPtr,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> NcclResult {
    guard("ncclCommRegister", || {
        let c = comm::lookup(comm)?;
        c.check_usable()?;
        check_registration(handle, "handle", buff, size)?;
        register(&c, buff, size, handle, "handle")
    })
}

/// `ncclCommDeregister`: ends a registration `ncclCommRegister` made on `comm`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommDeregister(comm: CommPtr, handle: *mut c_void) -> NcclResult {
    guard("ncclCommDeregister", || {
        deregister(comm, handle, "registration")
    })
}

/// `NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING`: the window flags NCCL defines.
const WIN_FLAGS: i32 = 0x03;

/// Whether every rank of `comm` passed the same `(size, flags)`, `mine` (`None`: this rank's
/// arguments are bad, which fails every rank): a host all-reduce (max) of each value and its
/// complement, so equal values are the only way both survive.
fn agree(c: &comm::Comm, mine: Option<(u64, u64)>) -> Result<bool, Fail> {
    let words: [u64; 4] = match mine {
        Some((size, flags)) => [size, !size, flags, !flags],
        None => [u64::MAX; 4],
    };
    let backend = c.inner.backend();
    let buffer = Buffer::new(backend, size_of_val(&words))?;
    buffer.write(0, &words)?;
    let stream = symcomm::Stream::new(backend)?;
    // SAFETY: `buffer` holds the 4 words and outlives the call (the stream is synchronized
    // before it drops); in place.
    let all = unsafe { symcomm::BufferRef::from_raw(buffer.addr(), 32) };
    c.inner.all_reduce(
        all,
        all,
        4,
        symcomm::DataType::U64,
        symcomm::RedOp::Max,
        &stream,
    )?;
    stream.synchronize()?;
    c.inner.check_error()?;
    let mut out = [0u64; 4];
    buffer.read(0, &mut out)?;
    Ok(mine.is_some() && out == words)
}

/// `ncclCommWindowRegister` (NCCL 2.27): registers `size` bytes at `buff` on every rank of
/// `comm` as a window (collective: every rank passes its own buffer, the same `size` and
/// `winFlags`); `*win` names it for `ncclCommWindowDeregister` and `ncclWinGetUserPtr`. Like
/// `ncclCommRegister` it does not change how collectives run (no symmetric kernels on users'
/// buffers yet).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommWindowRegister(
    comm: CommPtr,
    buff: *mut c_void,
    size: usize,
    win: *mut *mut c_void,
    win_flags: i32,
) -> NcclResult {
    guard("ncclCommWindowRegister", || {
        let c = comm::lookup(comm)?;
        c.check_usable()?;
        let valid = check_registration(win, "win", buff, size).and_then(|()| {
            if win_flags & !WIN_FLAGS == 0 {
                Ok(())
            } else {
                Err(Fail::invalid_argument(format!(
                    "winFlags {win_flags:#x} has bits NCCL does not define"
                )))
            }
        });
        // Every rank takes part, a bad one too, so that all fail together instead of waiting.
        let same = agree(
            &c,
            valid
                .as_ref()
                .ok()
                .map(|()| (size as u64, win_flags as u64)),
        )?;
        valid?;
        if !same {
            return Err(Fail::invalid_usage(
                "ncclCommWindowRegister: the ranks passed different sizes or flags (or another \
                 rank's arguments were refused)",
            ));
        }
        register(&c, buff, size, win, "win")
    })
}

/// `ncclCommWindowDeregister`: ends a window of `comm`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommWindowDeregister(comm: CommPtr, win: *mut c_void) -> NcclResult {
    guard("ncclCommWindowDeregister", || {
        deregister(comm, win, "window")
    })
}

/// `ncclWinGetUserPtr`: the buffer window `win` of `comm` was registered with.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclWinGetUserPtr(
    comm: CommPtr,
    win: *mut c_void,
    out: *mut *mut c_void,
) -> NcclResult {
    guard("ncclWinGetUserPtr", || {
        let c = comm::lookup(comm)?;
        let (addr, _) = c
            .registration(win as usize)
            .ok_or_else(|| Fail::invalid_argument("win is not a window of this communicator"))?;
        put(out, "outUserPtr", addr as *mut c_void)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_up_to_the_granularity() {
        assert_eq!(round_up(1), Some(ALIGN));
        assert_eq!(round_up(ALIGN), Some(ALIGN));
        assert_eq!(round_up(ALIGN + 1), Some(2 * ALIGN));
        assert_eq!(round_up(usize::MAX), None);
    }
}

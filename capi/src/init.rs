//! Ids, communicator creation and destruction, and the queries: `ncclGetVersion`,
//! `ncclGetUniqueId`, `ncclCommInitRank[Config]`, `ncclCommInitAll`, `ncclCommFinalize`,
//! `ncclCommDestroy`, `ncclCommAbort`, `ncclCommGetAsyncError`, `ncclCommCount`,
//! `ncclCommCuDevice`, `ncclCommUserRank`, `ncclGetErrorString`, `ncclGetLastError`.

use std::ffi::{c_char, c_int};
use std::net::{SocketAddr, ToSocketAddrs};
use std::str::FromStr;
use std::sync::{LazyLock, Mutex, PoisonError};

use symcomm::{Backend, Device, UniqueId};

use crate::comm::{self, Found};
use crate::create::{self, PendingInit, Source};
use crate::error::{self, Fail, code_of, guard, guard_code};
use crate::types::{CommPtr, ConfigHead, NCCL_IN_PROGRESS, NCCL_SUCCESS, NcclResult, NcclUniqueId};
use crate::{device, version};

/// Writes `value` through `out`.
///
/// # Errors
/// `ncclInvalidArgument` naming `what` for NULL.
pub(crate) fn put<T>(out: *mut T, what: &str, value: T) -> Result<(), Fail> {
    if out.is_null() {
        return Err(Fail::invalid_argument(format!("{what} is NULL")));
    }
    // SAFETY: non-null; the C caller passes a pointer to writable storage for a `T`.
    unsafe { out.write(value) };
    Ok(())
}

/// `ncclGetVersion`: the version `include/nccl.h` declares (see `version.rs` for the choice).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    guard("ncclGetVersion", || put(version, "version", version::CODE))
}

/// `ncclGetErrorString`: a static text per result code.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetErrorString(result: NcclResult) -> *const c_char {
    error::describe(result).as_ptr().cast()
}

/// `ncclGetLastError`: the calling thread's last error message (any `comm`, NULL included).
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetLastError(_comm: CommPtr) -> *const c_char {
    error::last()
}

/// Drops the reservation of `id` if this process made it (rank 0's init with it returned).
pub(crate) fn forget_id(id: &UniqueId) {
    made_here().retain(|kept| kept != id);
}

/// Ids this process made, kept until rank 0's init with them returns: an id from
/// [`UniqueId::new`] reserves the root's listening port while it lives.
static MADE_HERE: LazyLock<Mutex<Vec<UniqueId>>> = LazyLock::new(Mutex::default);
/// At most this many unused ids keep their reservations (the oldest are dropped first).
const MAX_UNUSED_IDS: usize = 64;

fn made_here() -> std::sync::MutexGuard<'static, Vec<UniqueId>> {
    MADE_HERE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// 32 hex digits → 16 bytes.
fn secret_from_hex(text: &str) -> Option<[u8; 16]> {
    let text = text.trim().as_bytes();
    if text.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (byte, pair) in out.iter_mut().zip(text.chunks(2)) {
        let digit = |c: u8| (c as char).to_digit(16);
        *byte = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Some(out)
}

/// A new id: `NCCL_COMM_ID=<host>:<port>` fixes the root address (with `SYMCOMM_SECRET` as the
/// secret when set, else a random one); without it a fresh id whose port this process reserves.
fn make_id() -> Result<UniqueId, Fail> {
    let Some(addr) = std::env::var("NCCL_COMM_ID").ok().filter(|v| !v.is_empty()) else {
        return Ok(UniqueId::new()?);
    };
    let root: SocketAddr = addr
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            Fail::invalid_argument(format!("NCCL_COMM_ID={addr} is not <host>:<port>"))
        })?;
    let secret = match std::env::var("SYMCOMM_SECRET").ok() {
        Some(hex) => secret_from_hex(&hex).ok_or_else(|| {
            Fail::invalid_argument(format!(
                "SYMCOMM_SECRET must be 32 hex digits, got {} characters",
                hex.chars().count()
            ))
        })?,
        None => UniqueId::random_secret()?,
    };
    Ok(UniqueId::from_parts(root, secret)?)
}

fn encode(id: &UniqueId) -> Result<NcclUniqueId, Fail> {
    let text = id.to_string();
    let mut out = NcclUniqueId { internal: [0; 128] };
    if text.len() >= out.internal.len() {
        return Err(Fail::new(
            crate::types::NCCL_INTERNAL_ERROR,
            format!(
                "the id takes {} bytes, more than ncclUniqueId holds",
                text.len()
            ),
        ));
    }
    for (dst, src) in out.internal.iter_mut().zip(text.bytes()) {
        *dst = src as c_char;
    }
    Ok(out)
}

/// The symcomm id inside an `ncclUniqueId` (errors never show its bytes: it is a credential).
fn decode(id: &NcclUniqueId) -> Result<UniqueId, Fail> {
    let bytes: Vec<u8> = id
        .internal
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    let not_ours = |why: String| {
        Fail::invalid_argument(format!(
            "the ncclUniqueId is not one of this library's (made by ncclGetUniqueId of \
             symcomm-nccl and passed unchanged to every rank?): {why}"
        ))
    };
    if bytes.len() == id.internal.len() {
        return Err(not_ours("it has no terminating NUL".into()));
    }
    let text = String::from_utf8(bytes).map_err(|_| not_ours("it is not text".into()))?;
    UniqueId::from_str(&text).map_err(|e| not_ours(e.to_string()))
}

/// `ncclGetUniqueId`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetUniqueId(unique_id: *mut NcclUniqueId) -> NcclResult {
    guard("ncclGetUniqueId", || {
        if unique_id.is_null() {
            return Err(Fail::invalid_argument("uniqueId is NULL"));
        }
        let id = make_id()?;
        put(unique_id, "uniqueId", encode(&id)?)?;
        let mut kept = made_here();
        if kept.len() >= MAX_UNUSED_IDS {
            kept.remove(0);
        }
        kept.push(id);
        Ok(())
    })
}

fn init_rank(
    out: *mut CommPtr,
    nranks: c_int,
    id: &NcclUniqueId,
    rank: c_int,
    blocking: bool,
) -> Result<NcclResult, Fail> {
    put(out, "comm", std::ptr::null_mut())?;
    let nranks = u32::try_from(nranks)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| Fail::invalid_argument(format!("nranks {nranks} is not positive")))?;
    let rank = crate::types::rank_arg("rank", rank, nranks)?;
    let source = Source::Id {
        id: decode(id)?,
        rank,
        nranks,
        // Now, on the caller's thread: its current CUDA context names the device.
        device: device::for_init()?,
    };
    create::start(PendingInit::new(out, source, blocking))
}

/// `ncclCommInitRank`: joins communicator `comm_id` as `rank` of `nranks` (blocking; inside a
/// group the communicator is made by `ncclGroupEnd`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut CommPtr,
    nranks: c_int,
    comm_id: NcclUniqueId,
    rank: c_int,
) -> NcclResult {
    guard_code("ncclCommInitRank", || {
        init_rank(comm, nranks, &comm_id, rank, true)
    })
}

/// `ncclCommInitRankConfig`: as `ncclCommInitRank`; `config` (may be NULL) must come from
/// `NCCL_CONFIG_INITIALIZER`. `blocking = 0`: non-blocking creation (`ncclInProgress`, see
/// `create.rs`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut CommPtr,
    nranks: c_int,
    comm_id: NcclUniqueId,
    rank: c_int,
    config: *mut ConfigHead,
) -> NcclResult {
    guard_code("ncclCommInitRankConfig", || {
        let blocking = create::blocking(config, true)?;
        init_rank(comm, nranks, &comm_id, rank, blocking)
    })
}

/// `ncclCommInitAll`: `ndev` ranks of a new communicator in this process, made concurrently;
/// rank i on GPU `devlist[i]` (NULL: GPU i), or every rank on the emulator with
/// `SYMCOMM_DEVICE=emu`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitAll(
    comms: *mut CommPtr,
    ndev: c_int,
    devlist: *const c_int,
) -> NcclResult {
    guard("ncclCommInitAll", || {
        if comms.is_null() {
            return Err(Fail::invalid_argument("comm is NULL"));
        }
        let n = u32::try_from(ndev)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| Fail::invalid_argument(format!("ndev {ndev} is not positive")))?;
        let emu = matches!(Device::from_env()?, Device::Emu);
        let id = UniqueId::new()?;
        let mut inits = Vec::with_capacity(n as usize);
        for i in 0..n as usize {
            // SAFETY: the caller's array of `ndev` handles (and of `ndev` devices when given).
            let out = unsafe { comms.add(i) };
            put(out, "comm", std::ptr::null_mut())?;
            let device = if emu {
                Device::Emu
            } else if devlist.is_null() {
                Device::Cuda(i)
            } else {
                // SAFETY: as above.
                let d = unsafe { *devlist.add(i) };
                Device::Cuda(usize::try_from(d).map_err(|_| {
                    Fail::invalid_argument(format!("devlist[{i}] = {d} is not a device"))
                })?)
            };
            let source = Source::Id {
                id: id.clone(),
                rank: i as u32,
                nranks: n,
                device,
            };
            inits.push(PendingInit::new(out, source, true));
        }
        let made = create::run_all(inits).map(drop);
        if made.is_err() {
            // All or nothing: free the ranks that were made.
            for i in 0..n as usize {
                // SAFETY: as above.
                let out = unsafe { comms.add(i) };
                // SAFETY: written above (NULL or a handle).
                let ptr = unsafe { out.read() };
                if !ptr.is_null() {
                    let _ = comm::unregister(ptr);
                    // SAFETY: as above.
                    unsafe { out.write(std::ptr::null_mut()) };
                }
            }
        }
        made
    })
}

/// `ncclCommFinalize`: waits for the communicator's work; then only destroy and abort remain.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommFinalize(comm: CommPtr) -> NcclResult {
    guard("ncclCommFinalize", || {
        let c = comm::lookup(comm)?;
        c.check_usable()?;
        c.synchronize()?;
        c.finalize();
        Ok(c.inner.check_error()?)
    })
}

/// `ncclCommDestroy`: frees this rank's communicator (it waits for the work queued on it and
/// tells the other ranks it left).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommDestroy(comm: CommPtr) -> NcclResult {
    guard("ncclCommDestroy", || comm::unregister(comm).map(drop))
}

/// `ncclCommAbort`: aborts (waits in kernels end, the other ranks are told) and frees; returns
/// promptly.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommAbort(comm: CommPtr) -> NcclResult {
    guard("ncclCommAbort", || {
        if let Some(c) = comm::unregister(comm)? {
            c.inner.abort();
        }
        Ok(())
    })
}

/// `ncclCommGetAsyncError`: `ncclSuccess` with `*async_error` the communicator's sticky error
/// code (its message becomes this thread's last error); `ncclInProgress` while a non-blocking
/// creation runs, then its failure if it failed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: CommPtr,
    async_error: *mut NcclResult,
) -> NcclResult {
    guard("ncclCommGetAsyncError", || {
        let code = match comm::find(comm)? {
            Found::Creating => NCCL_IN_PROGRESS,
            Found::Failed(fail) => {
                error::set_last(&format!("ncclCommGetAsyncError: {}", fail.message));
                fail.code
            }
            Found::Live(c) => match c.inner.check_error() {
                Ok(()) => NCCL_SUCCESS,
                Err(e) => {
                    error::set_last(&format!("ncclCommGetAsyncError: {e}"));
                    code_of(&e)
                }
            },
        };
        put(async_error, "asyncError", code)
    })
}

/// `ncclCommCount`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommCount(comm: CommPtr, count: *mut c_int) -> NcclResult {
    guard("ncclCommCount", || {
        let n = comm::lookup(comm)?.inner.nranks();
        put(count, "count", n as c_int)
    })
}

/// `ncclCommUserRank`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommUserRank(comm: CommPtr, rank: *mut c_int) -> NcclResult {
    guard("ncclCommUserRank", || {
        let r = comm::lookup(comm)?.inner.rank();
        put(rank, "rank", r as c_int)
    })
}

/// `ncclCommCuDevice`: the GPU ordinal, 0 on the emulator (its one emulated GPU).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommCuDevice(comm: CommPtr, device: *mut c_int) -> NcclResult {
    guard("ncclCommCuDevice", || {
        let ordinal = match comm::lookup(comm)?.inner.backend() {
            Backend::Cuda(d) => d.ordinal() as c_int,
            _ => 0,
        };
        put(device, "device", ordinal)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn ids_round_trip_through_128_bytes_and_foreign_ones_are_refused() {
        let id = UniqueId::from_parts(
            "[fd00::1234:5678:9abc:def0]:65535".parse().unwrap(),
            [7; 16],
        )
        .unwrap();
        let encoded = encode(&id).unwrap();
        assert_eq!(decode(&encoded).unwrap(), id);
        let mut foreign = NcclUniqueId { internal: [1; 128] };
        let e = decode(&foreign).err().unwrap();
        assert_eq!(e.code, crate::types::NCCL_INVALID_ARGUMENT);
        foreign.internal[5] = 0;
        assert!(decode(&foreign).is_err());
        // The secret's digits never appear in the message.
        let mut broken = encoded;
        broken.internal[0] = b'x' as c_char;
        let message = decode(&broken).err().unwrap().message;
        assert!(!message.contains("0707070707"), "{message}");
    }

    #[test]
    fn secrets_parse_from_32_hex_digits_only() {
        assert_eq!(secret_from_hex(&"ab".repeat(16)), Some([0xab; 16]));
        assert_eq!(secret_from_hex("abc"), None);
        assert_eq!(secret_from_hex(&"zz".repeat(16)), None);
    }
}

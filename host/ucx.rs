//! UCX tag-matching transport: a thin, bounded wrapper over libucp's nbx tag API.
//!
//! libucp is loaded at run time (`libloading`), so the binary does not link UCX and a
//! missing installation is reported as [`Error::Unsupported`]. The `#[repr(C)]` mirrors
//! below follow UCX 1.13 (`ucp/api/ucp.h`); UCX only reads the fields named in each
//! `field_mask`, so they stay valid for later 1.x releases. `ucs_status_t` is a packed
//! enum in C, i.e. one signed byte.

use crate::{Error, Result};
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicI8, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

type Status = i8;
type Ptr = *mut c_void;
const UCS_OK: Status = 0;
const UCS_INPROGRESS: Status = 1;
const UCS_ERR_MESSAGE_TRUNCATED: Status = -9;
const UCS_ERR_CANCELED: Status = -16;
const UCS_ERR_LAST: isize = -100;

const UCP_PARAM_FIELD_FEATURES: u64 = 1 << 0;
const UCP_FEATURE_TAG: u64 = 1 << 0;
const UCP_WORKER_PARAM_FIELD_THREAD_MODE: u64 = 1 << 0;
const UCS_THREAD_MODE_SERIALIZED: c_int = 1;
const UCP_EP_PARAM_FIELD_REMOTE_ADDRESS: u64 = 1 << 0;
const UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE: u64 = 1 << 1;
const UCP_EP_PARAM_FIELD_ERR_HANDLER: u64 = 1 << 2;
const UCP_ERR_HANDLING_MODE_PEER: c_int = 1;
const UCP_OP_ATTR_FIELD_FLAGS: u32 = 1 << 4;
const UCP_OP_ATTR_FIELD_MEMORY_TYPE: u32 = 1 << 6;
const UCP_OP_ATTR_FIELD_RECV_INFO: u32 = 1 << 7;
const UCP_OP_ATTR_FLAG_NO_IMM_CMPL: u32 = 1 << 16;
const UCP_EP_CLOSE_FLAG_FORCE: u32 = 1 << 0;
const UCP_ATTR_FIELD_MEMORY_TYPES: u64 = 1 << 2;
/// `ucs_memory_type_t`'s CUDA device memory (a bit index into `memory_types`).
const UCS_MEMORY_TYPE_CUDA: u32 = 1;

/// Oldest UCX API this wrapper needs (the nbx calls appeared in 1.10).
const API_MAJOR: c_uint = 1;
const API_MINOR: c_uint = 10;
const LIBUCP: &str = "libucp.so.0";
/// Bits of the UCX tag that carry the sender's rank.
const RANK_BITS: u32 = 20;

#[repr(C)]
struct UcpParams {
    field_mask: u64,
    features: u64,
    request_size: usize,
    request_init: Ptr,
    request_cleanup: Ptr,
    tag_sender_mask: u64,
    mt_workers_shared: c_int,
    estimated_num_eps: usize,
    estimated_num_ppn: usize,
    name: *const c_char,
}

#[repr(C)]
struct UcpWorkerParams {
    field_mask: u64,
    thread_mode: c_int,
    cpu_mask: [u64; 16],
    events: c_uint,
    user_data: Ptr,
    event_fd: c_int,
    flags: u64,
    name: *const c_char,
    am_alignment: usize,
    client_id: u64,
}

type ErrCb = unsafe extern "C" fn(arg: Ptr, ep: Ptr, status: Status);

#[repr(C)]
struct UcpErrHandler {
    cb: Option<ErrCb>,
    arg: Ptr,
}

#[repr(C)]
struct UcsSockAddr {
    addr: *const c_void,
    addrlen: u32,
}

#[repr(C)]
struct UcpEpParams {
    field_mask: u64,
    address: *const c_void,
    err_mode: c_int,
    err_handler: UcpErrHandler,
    user_data: Ptr,
    flags: c_uint,
    sockaddr: UcsSockAddr,
    conn_request: Ptr,
    name: *const c_char,
    local_sockaddr: UcsSockAddr,
}

#[repr(C)]
struct UcpRequestParam {
    op_attr_mask: u32,
    flags: u32,
    request: Ptr,
    cb: Ptr,
    datatype: u64,
    user_data: Ptr,
    reply_buffer: Ptr,
    memory_type: c_int,
    recv_info: Ptr,
    memh: Ptr,
}

#[repr(C)]
struct UcpContextAttr {
    field_mask: u64,
    request_size: usize,
    thread_mode: c_int,
    memory_types: u64,
    name: [c_char; 32],
}

#[repr(C)]
#[derive(Default)]
struct UcpTagRecvInfo {
    sender_tag: u64,
    length: usize,
}

/// All-zero value of a C parameter struct (UCX's documented "nothing set" state).
fn zeroed<T>() -> T {
    // SAFETY: only used for the #[repr(C)] structs above, whose fields are integers, raw
    // pointers and `Option<fn>`, for all of which all-zero bytes is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Resolved libucp entry points; the `Library` handles are kept so the pointers stay valid.
struct Api {
    config_read: unsafe extern "C" fn(*const c_char, *const c_char, *mut Ptr) -> Status,
    config_release: unsafe extern "C" fn(Ptr),
    init_version: unsafe extern "C" fn(c_uint, c_uint, *const UcpParams, Ptr, *mut Ptr) -> Status,
    cleanup: unsafe extern "C" fn(Ptr),
    context_query: unsafe extern "C" fn(Ptr, *mut UcpContextAttr) -> Status,
    context_print_info: unsafe extern "C" fn(Ptr, *mut nix::libc::FILE),
    get_version: unsafe extern "C" fn(*mut c_uint, *mut c_uint, *mut c_uint),
    get_version_string: unsafe extern "C" fn() -> *const c_char,
    worker_create: unsafe extern "C" fn(Ptr, *const UcpWorkerParams, *mut Ptr) -> Status,
    worker_destroy: unsafe extern "C" fn(Ptr),
    worker_get_address: unsafe extern "C" fn(Ptr, *mut Ptr, *mut usize) -> Status,
    worker_release_address: unsafe extern "C" fn(Ptr, Ptr),
    worker_progress: unsafe extern "C" fn(Ptr) -> c_uint,
    ep_create: unsafe extern "C" fn(Ptr, *const UcpEpParams, *mut Ptr) -> Status,
    ep_close_nbx: unsafe extern "C" fn(Ptr, *const UcpRequestParam) -> Ptr,
    tag_send_nbx:
        unsafe extern "C" fn(Ptr, *const c_void, usize, u64, *const UcpRequestParam) -> Ptr,
    tag_send_sync_nbx:
        unsafe extern "C" fn(Ptr, *const c_void, usize, u64, *const UcpRequestParam) -> Ptr,
    tag_recv_nbx: unsafe extern "C" fn(Ptr, Ptr, usize, u64, u64, *const UcpRequestParam) -> Ptr,
    request_check_status: unsafe extern "C" fn(Ptr) -> Status,
    tag_recv_request_test: unsafe extern "C" fn(Ptr, *mut UcpTagRecvInfo) -> Status,
    tag_probe_nb: unsafe extern "C" fn(Ptr, u64, u64, c_int, *mut UcpTagRecvInfo) -> Ptr,
    tag_msg_recv_nbx: unsafe extern "C" fn(Ptr, Ptr, usize, Ptr, *const UcpRequestParam) -> Ptr,
    request_cancel: unsafe extern "C" fn(Ptr, Ptr),
    request_free: unsafe extern "C" fn(Ptr),
    status_string: unsafe extern "C" fn(Status) -> *const c_char,
    _libs: Vec<libloading::Library>,
}

impl Api {
    fn load(name: &str) -> std::result::Result<Api, String> {
        // SAFETY: loading libucp runs its (and libucs') initialisers, which have no
        // preconditions on our side.
        let ucp = unsafe { libloading::Library::new(name) }.map_err(|e| {
            format!("UCX is not installed: {name} could not be loaded (Debian/Ubuntu: apt install libucx0): {e}")
        })?;
        macro_rules! sym {
            ($lib:expr, $name:literal) => {
                // SAFETY: the Rust type matches the C prototype in ucp.h / status.h (UCX 1.13),
                // and the library stays loaded as long as `Api` exists (it is kept in `_libs`).
                unsafe { $lib.get(concat!($name, "\0").as_bytes()) }
                    .map(|s: libloading::Symbol<_>| *s)
                    .map_err(|e| format!("{name} lacks {} (UCX >= 1.10 is required): {e}", $name))?
            };
        }
        // ucs_status_string lives in libucs; dlsym on libucp's handle also searches its
        // dependencies, but load libucs.so.0 explicitly if that fails.
        let mut libs = Vec::new();
        // SAFETY: as for `sym!`: prototype from status.h, library kept alive in `_libs`.
        let status_string = match unsafe { ucp.get(b"ucs_status_string\0") } {
            Ok(s) => *s,
            Err(_) => {
                // SAFETY: as above for libucp.
                let ucs = unsafe { libloading::Library::new("libucs.so.0") }.map_err(|e| {
                    format!("UCX is incomplete: libucs.so.0 could not be loaded: {e}")
                })?;
                let f = sym!(ucs, "ucs_status_string");
                libs.push(ucs);
                f
            }
        };
        let api = Api {
            config_read: sym!(ucp, "ucp_config_read"),
            config_release: sym!(ucp, "ucp_config_release"),
            init_version: sym!(ucp, "ucp_init_version"),
            cleanup: sym!(ucp, "ucp_cleanup"),
            context_query: sym!(ucp, "ucp_context_query"),
            context_print_info: sym!(ucp, "ucp_context_print_info"),
            get_version: sym!(ucp, "ucp_get_version"),
            get_version_string: sym!(ucp, "ucp_get_version_string"),
            worker_create: sym!(ucp, "ucp_worker_create"),
            worker_destroy: sym!(ucp, "ucp_worker_destroy"),
            worker_get_address: sym!(ucp, "ucp_worker_get_address"),
            worker_release_address: sym!(ucp, "ucp_worker_release_address"),
            worker_progress: sym!(ucp, "ucp_worker_progress"),
            ep_create: sym!(ucp, "ucp_ep_create"),
            ep_close_nbx: sym!(ucp, "ucp_ep_close_nbx"),
            tag_send_nbx: sym!(ucp, "ucp_tag_send_nbx"),
            tag_send_sync_nbx: sym!(ucp, "ucp_tag_send_sync_nbx"),
            tag_recv_nbx: sym!(ucp, "ucp_tag_recv_nbx"),
            request_check_status: sym!(ucp, "ucp_request_check_status"),
            tag_recv_request_test: sym!(ucp, "ucp_tag_recv_request_test"),
            tag_probe_nb: sym!(ucp, "ucp_tag_probe_nb"),
            tag_msg_recv_nbx: sym!(ucp, "ucp_tag_msg_recv_nbx"),
            request_cancel: sym!(ucp, "ucp_request_cancel"),
            request_free: sym!(ucp, "ucp_request_free"),
            status_string,
            _libs: Vec::new(),
        };
        libs.push(ucp);
        Ok(Api { _libs: libs, ..api })
    }

    /// The process-wide API for `name`. libucp is never unloaded (UCX does not support
    /// being re-initialised after dlclose), so the table is leaked / cached for good.
    fn get(name: &str) -> Result<&'static Api> {
        static DEFAULT: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
        if name == LIBUCP {
            DEFAULT
                .get_or_init(|| Api::load(name))
                .as_ref()
                .map_err(|e| Error::Unsupported(e.clone()))
        } else {
            Api::load(name)
                .map(|a| &*Box::leak(Box::new(a)))
                .map_err(Error::Unsupported)
        }
    }

    fn unsupported(&self, call: &str, s: Status) -> Error {
        Error::Unsupported(format!("UCX: {call} failed: {}", self.status(s)))
    }

    /// The library's version string (`ucp_get_version_string`).
    fn version(&self) -> String {
        // SAFETY: returns a static NUL-terminated string (or NULL, handled).
        let v = unsafe { (self.get_version_string)() };
        if v.is_null() {
            return "unknown".into();
        }
        // SAFETY: non-null, NUL-terminated, static storage.
        unsafe { CStr::from_ptr(v) }.to_string_lossy().into_owned()
    }

    /// A UCP context with the TAG feature, configured from the environment (`UCX_*`), after
    /// checking the library's API version. The caller owns it (`cleanup`).
    fn context(&self) -> Result<Ptr> {
        let (mut major, mut minor, mut release) = (0, 0, 0);
        // SAFETY: three valid out-pointers.
        unsafe { (self.get_version)(&mut major, &mut minor, &mut release) };
        if major != API_MAJOR || minor < API_MINOR {
            return Err(Error::Unsupported(format!(
                "UCX {major}.{minor}.{release} is too old (need 1.10 or later)"
            )));
        }
        let mut config: Ptr = std::ptr::null_mut();
        // SAFETY: NULL prefix/file mean "UCX_ from the environment"; `config` is an out-pointer.
        let s = unsafe { (self.config_read)(std::ptr::null(), std::ptr::null(), &mut config) };
        if s != UCS_OK {
            return Err(self.unsupported("ucp_config_read", s));
        }
        let mut params: UcpParams = zeroed();
        params.field_mask = UCP_PARAM_FIELD_FEATURES;
        params.features = UCP_FEATURE_TAG;
        let mut context: Ptr = std::ptr::null_mut();
        // SAFETY: params/config are valid; the config may be released right after init.
        let s = unsafe {
            let s = (self.init_version)(API_MAJOR, API_MINOR, &params, config, &mut context);
            (self.config_release)(config);
            s
        };
        if s != UCS_OK {
            return Err(self.unsupported("ucp_init", s));
        }
        Ok(context)
    }

    /// Whether a live context moves CUDA device memory itself (`ucp_context_query`'s memory
    /// types: UCX built with CUDA, and it found the driver).
    fn cuda_memory(&self, context: Ptr) -> Result<bool> {
        let mut attr: UcpContextAttr = zeroed();
        attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
        // SAFETY: `context` is live; `attr` is a valid out-struct with its field mask set.
        let s = unsafe { (self.context_query)(context, &mut attr) };
        if s != UCS_OK {
            return Err(self.unsupported("ucp_context_query", s));
        }
        Ok(attr.memory_types & (1 << UCS_MEMORY_TYPE_CUDA) != 0)
    }

    /// `ucp_context_print_info` of a live context, as text.
    fn print_to_string(&self, context: Ptr) -> String {
        let (mut buf, mut len): (*mut c_char, usize) = (std::ptr::null_mut(), 0);
        // SAFETY: open_memstream allocates `buf` (freed below) and updates buf/len on fclose;
        // the stream is used by UCX only during the call, and `context` is live.
        unsafe {
            let f = nix::libc::open_memstream(&mut buf, &mut len);
            if f.is_null() {
                return String::new();
            }
            (self.context_print_info)(context, f);
            nix::libc::fclose(f);
            if buf.is_null() {
                return String::new();
            }
            let text = String::from_utf8_lossy(std::slice::from_raw_parts(buf.cast::<u8>(), len))
                .into_owned();
            nix::libc::free(buf.cast());
            text
        }
    }

    fn status(&self, s: Status) -> String {
        // SAFETY: ucs_status_string accepts any value and returns a static C string.
        let p = unsafe { (self.status_string)(s) };
        if p.is_null() {
            return format!("UCS status {s}");
        }
        // SAFETY: non-null, NUL-terminated, static storage.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Force-closes `ep`, progressing `worker` until the close completes or `bound` passes.
    fn close_ep(&self, worker: Ptr, ep: Ptr, bound: Duration) {
        let mut param: UcpRequestParam = zeroed();
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_EP_CLOSE_FLAG_FORCE;
        // SAFETY: `ep` is a live endpoint of `worker` and is not used again by the caller.
        let req = unsafe { (self.ep_close_nbx)(ep, &param) };
        if !is_ptr(req) {
            return;
        }
        let start = Instant::now();
        // SAFETY: `req` is a live request of `worker` until freed below; the worker is live.
        unsafe {
            while (self.request_check_status)(req) == UCS_INPROGRESS && start.elapsed() < bound {
                (self.worker_progress)(worker);
            }
            (self.request_free)(req);
        }
    }
}

/// What the installed UCX offers this process (`symcomm info`'s "Between hosts").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UcxInfo {
    /// The library's version string, e.g. `1.13.1`.
    pub version: String,
    /// The transports a context gets under the current `UCX_*` environment, as
    /// `transport/device` (`tcp/eth0`, `rc_mlx5/mlx5_0:1`, `posix/memory`, ...), in UCX's order.
    pub transports: Vec<String>,
    /// Whether UCX can move CUDA device memory itself (it was built with CUDA and found the
    /// driver). When false, traffic between hosts is staged through host memory.
    pub cuda_memory: bool,
}

/// Probes the installed UCX (libucp.so.0) the way a communicator spanning hosts would use it:
/// one context from the current environment, queried and released.
///
/// Errors: [`Error::Unsupported`] naming what is missing (the library, a symbol, a failed call).
pub fn ucx_probe() -> Result<UcxInfo> {
    probe_library(LIBUCP)
}

fn probe_library(lib: &str) -> Result<UcxInfo> {
    let api = Api::get(lib)?;
    let context = api.context()?;
    let cuda_memory = api.cuda_memory(context);
    let text = api.print_to_string(context);
    // SAFETY: the context is ours, live, and not used after this.
    unsafe { (api.cleanup)(context) };
    Ok(UcxInfo {
        version: api.version(),
        transports: resources(&text),
        cuda_memory: cuda_memory?,
    })
}

/// The `transport/device` names of `ucp_context_print_info`'s resource lines
/// (`#      resource 1  :  md 1  dev 1  flags -- tcp/lo`).
fn resources(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let rest = l.trim_start_matches('#').trim_start();
            let rest = rest.strip_prefix("resource")?;
            let (_, name) = rest.rsplit_once("--")?;
            let name = name.trim();
            (!name.is_empty()).then(|| name.to_owned())
        })
        .collect()
}

/// Request parameters with `mask`, telling UCX the buffer is CUDA device memory when `device`.
fn memory_param(mask: u32, device: bool) -> UcpRequestParam {
    let mut param: UcpRequestParam = zeroed();
    param.op_attr_mask = mask;
    if device {
        param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
        param.memory_type = UCS_MEMORY_TYPE_CUDA as c_int;
    }
    param
}

/// `UCS_PTR_IS_PTR`: a real request (not NULL, not an error code).
fn is_ptr(p: Ptr) -> bool {
    (p as usize).wrapping_sub(1) < (UCS_ERR_LAST as usize).wrapping_sub(1)
}

/// `UCS_PTR_IS_ERR` → the error status.
fn ptr_err(p: Ptr) -> Option<Status> {
    ((p as usize) >= (UCS_ERR_LAST as usize)).then_some(p as isize as Status)
}

/// Called by UCX (inside `ucp_worker_progress`) when an endpoint fails.
unsafe extern "C" fn on_ep_error(arg: Ptr, _ep: Ptr, status: Status) {
    // SAFETY: `arg` is the address of the peer's boxed flag, registered in `connect`; the
    // box is dropped only after the worker is destroyed, so it is live here.
    if let Some(flag) = unsafe { (arg as *const AtomicI8).as_ref() } {
        flag.store(
            if status == UCS_OK {
                UCS_ERR_CANCELED
            } else {
                status
            },
            Ordering::Release,
        );
    }
}

struct Peer {
    /// Null once force-closed after a failed exchange.
    ep: Ptr,
    /// Endpoint error status set by `on_ep_error` (0 = healthy).
    failed: Box<AtomicI8>,
}

struct Inner {
    context: Ptr,
    worker: Ptr,
    peers: HashMap<u32, Peer>,
}

// SAFETY: the UCX handles may be used from any thread as long as calls are serialized: the
// worker is created with UCS_THREAD_MODE_SERIALIZED and every use goes through `Ucx::inner`'s
// Mutex. The flags are atomics.
unsafe impl Send for Inner {}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Send,
    Recv,
}

/// A posted, not yet released UCX request.
struct Pending {
    req: Ptr,
    kind: Kind,
    peer: u32,
    tag: u64,
    len: usize,
}

/// One message of an exchange.
pub(crate) enum Op<'a> {
    /// Send `data` to rank `peer` under `tag` (< 2^44).
    Send { peer: u32, tag: u64, data: &'a [u8] },
    /// Receive exactly `data.len()` bytes from rank `peer` sent under `tag` (< 2^44).
    Recv {
        peer: u32,
        tag: u64,
        data: &'a mut [u8],
    },
    /// [`Op::Send`] from a device's memory, by address (UCX reads it itself).
    SendDevice {
        peer: u32,
        tag: u64,
        data: DeviceBytes,
    },
    /// [`Op::Recv`] into a device's memory, by address (UCX writes it itself).
    RecvDevice {
        peer: u32,
        tag: u64,
        data: DeviceBytes,
    },
}

impl Op<'_> {
    fn peer_tag(&self) -> (u32, u64) {
        match *self {
            Op::Send { peer, tag, .. }
            | Op::Recv { peer, tag, .. }
            | Op::SendDevice { peer, tag, .. }
            | Op::RecvDevice { peer, tag, .. } => (peer, tag),
        }
    }

    /// Whether UCX is handed CUDA memory.
    fn on_cuda(&self) -> bool {
        match self {
            Op::SendDevice { data, .. } | Op::RecvDevice { data, .. } => data.cuda,
            Op::Send { .. } | Op::Recv { .. } => false,
        }
    }
}

/// A range of a device's memory that an exchange reads ([`Op::SendDevice`]) or writes
/// ([`Op::RecvDevice`]): the emulator's (host memory) or a GPU's (CUDA memory, which needs
/// [`Ucx::cuda_memory`]; UCX is told its memory type, so it needs no lookup).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeviceBytes {
    addr: u64,
    len: usize,
    cuda: bool,
}

impl DeviceBytes {
    /// # Safety
    /// `addr..addr + len` is memory of this process — CUDA device memory of its context when
    /// `cuda`, else host memory — that stays allocated until the exchange it is handed to
    /// returns, and that nothing else writes (a send) or touches (a receive) meanwhile: no
    /// kernel or copy in flight, no other op's range.
    pub(crate) unsafe fn new(addr: u64, len: usize, cuda: bool) -> DeviceBytes {
        DeviceBytes { addr, len, cuda }
    }
}

/// The requests of one [`Ucx::post`], in flight until [`Flight::wait`] completed them. Dropped
/// before that (a failure elsewhere), it cancels and releases them first: it never lets go
/// while UCX may still touch the ops' memory.
pub(crate) struct Flight<'u> {
    ucx: &'u Ucx,
    pending: Vec<Pending>,
}

impl Flight<'_> {
    /// Progresses the worker until every request of the flight completed: the second half of
    /// [`Ucx::exchange`], with its outcomes, bound (`deadline`) and `check`. Requests of other
    /// flights progress meanwhile but are left to their own wait.
    pub(crate) fn wait(
        mut self,
        what: &str,
        deadline: Instant,
        check: &mut dyn FnMut() -> Option<Error>,
    ) -> Result<()> {
        let ucx = self.ucx;
        let inner = ucx.lock();
        let pending = &mut self.pending;
        let start = Instant::now();
        let mut result = Ok(());
        let mut last_check = start;
        while result.is_ok() && !pending.is_empty() {
            // SAFETY: the worker is live and we hold the lock.
            let progressed = unsafe { (ucx.api.worker_progress)(inner.worker) };
            let mut i = 0;
            while i < pending.len() && result.is_ok() {
                match ucx.test(&pending[i], what) {
                    None => i += 1,
                    Some(r) => {
                        pending.swap_remove(i);
                        result = r;
                    }
                }
            }
            if result.is_err() || pending.is_empty() {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                let timeout_ms =
                    u64::try_from(now.duration_since(start).as_millis()).unwrap_or(u64::MAX);
                result = Err(Error::HostTimeout {
                    rank: ucx.rank,
                    what: what.to_owned(),
                    timeout_ms,
                });
            } else if now.duration_since(last_check) >= Duration::from_millis(1) {
                last_check = now;
                result = pending
                    .iter()
                    .filter_map(|p| inner.peers.get(&p.peer).map(|peer| (p.peer, peer)))
                    .try_for_each(|(rank, peer)| ucx.peer_health(what, rank, peer));
                result = result.and_then(|()| check().map_or(Ok(()), Err));
            } else if progressed == 0 {
                std::thread::yield_now();
            }
        }
        // What is left after a failure is cancelled and released by the flight's drop, which
        // takes the lock.
        drop(inner);
        result
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            let mut inner = self.ucx.lock();
            self.ucx.abort(&mut inner, &mut self.pending);
        }
    }
}

/// Sends posted by [`Ucx::post_send`] and not yet complete, with their data. Hand it to
/// [`Ucx::drain`] before dropping it while sends are in flight.
#[derive(Default)]
pub(crate) struct Outbox {
    sends: Vec<(Pending, Vec<u8>)>,
}

// SAFETY: the requests are UCX handles used only through the `Ucx` that posted them, whose
// mutex serializes every call (as for `Inner`); the data is plain bytes.
unsafe impl Send for Outbox {}

impl Outbox {
    /// Whether no send is in flight.
    pub(crate) fn is_empty(&self) -> bool {
        self.sends.is_empty()
    }
}

/// A UCP context with one worker and one endpoint per connected rank.
///
/// `Send + Sync`; all UCX calls are serialized by an internal mutex (so `check` callbacks
/// passed to [`Ucx::exchange`] must not call back into the same `Ucx`).
pub(crate) struct Ucx {
    api: &'static Api,
    rank: u32,
    address: Vec<u8>,
    /// Whether the context moves CUDA memory itself ([`Ucx::cuda_memory`]).
    cuda_memory: bool,
    inner: Mutex<Inner>,
}

impl Ucx {
    /// Loads libucp.so.0 (+ libucs.so.0 if needed), reads the UCX config from the
    /// environment (UCX_TLS etc. apply), creates a context with the TAG feature and one
    /// worker. `rank` (< 2^20) is this process's rank (for messages and tags).
    ///
    /// Errors: [`Error::Unsupported`] naming what is missing (library, symbol) or the failed
    /// UCX call and its status string; [`Error::InvalidArgument`] if `rank >= 2^20`.
    pub(crate) fn new(rank: u32) -> Result<Ucx> {
        Self::with_library(rank, LIBUCP)
    }

    fn with_library(rank: u32, lib: &str) -> Result<Ucx> {
        if rank >= 1 << RANK_BITS {
            return Err(Error::InvalidArgument(format!(
                "UCX: rank {rank} does not fit in {RANK_BITS} tag bits"
            )));
        }
        let api = Api::get(lib)?;
        let unsupported = |call: &str, s: Status| api.unsupported(call, s);
        let context = api.context()?;
        let cuda_memory = match api.cuda_memory(context) {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: the context is live and owned by us.
                unsafe { (api.cleanup)(context) };
                return Err(e);
            }
        };
        let mut wparams: UcpWorkerParams = zeroed();
        wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
        let mut worker: Ptr = std::ptr::null_mut();
        // SAFETY: `context` is live; params valid; `worker` is an out-pointer.
        let s = unsafe { (api.worker_create)(context, &wparams, &mut worker) };
        if s != UCS_OK {
            // SAFETY: the context is live and owned by us.
            unsafe { (api.cleanup)(context) };
            return Err(unsupported("ucp_worker_create", s));
        }
        let (mut addr, mut len): (Ptr, usize) = (std::ptr::null_mut(), 0);
        // SAFETY: `worker` is live; out-pointers valid.
        let s = unsafe { (api.worker_get_address)(worker, &mut addr, &mut len) };
        if s != UCS_OK {
            // SAFETY: handles are live and owned by us, destroyed in reverse order.
            unsafe {
                (api.worker_destroy)(worker);
                (api.cleanup)(context);
            }
            return Err(unsupported("ucp_worker_get_address", s));
        }
        // SAFETY: UCX returned `len` readable bytes at `addr`; copied, then released once.
        let address = unsafe {
            let v = std::slice::from_raw_parts(addr as *const u8, len).to_vec();
            (api.worker_release_address)(worker, addr);
            v
        };
        tracing::debug!(
            rank,
            address_len = address.len(),
            cuda_memory,
            "UCX worker created"
        );
        Ok(Ucx {
            api,
            rank,
            address,
            cuda_memory,
            inner: Mutex::new(Inner {
                context,
                worker,
                peers: HashMap::new(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave UCX requests behind (exchange releases
        // them before returning), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this UCX moves CUDA device memory itself: built with CUDA, and it found the
    /// driver. Only then may an exchange carry [`Op::SendDevice`] / [`Op::RecvDevice`] (UCX
    /// then picks its own path: GPUDirect RDMA where the NIC and driver allow it, else its own
    /// staging).
    pub(crate) fn cuda_memory(&self) -> bool {
        self.cuda_memory
    }

    /// This worker's address (opaque bytes, sent to the other ranks by the caller).
    pub(crate) fn address(&self) -> Vec<u8> {
        self.address.clone()
    }

    /// Creates the endpoint to `rank` from its worker address (as returned by
    /// [`Ucx::address`] in that process; UCX trusts its contents). Error handling mode is
    /// PEER, so a dead peer gives an error instead of a hang. Connecting a rank again
    /// replaces (force-closes) its previous endpoint.
    pub(crate) fn connect(&self, rank: u32, address: &[u8]) -> Result<()> {
        if address.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "UCX: empty worker address for rank {rank}"
            )));
        }
        let mut inner = self.lock();
        let worker = inner.worker;
        if let Some(old) = inner.peers.remove(&rank).filter(|old| !old.ep.is_null()) {
            self.api.close_ep(worker, old.ep, Duration::from_secs(1));
        }
        let failed = Box::new(AtomicI8::new(0));
        let mut params: UcpEpParams = zeroed();
        params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
            | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
            | UCP_EP_PARAM_FIELD_ERR_HANDLER;
        params.address = address.as_ptr().cast();
        params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        params.err_handler = UcpErrHandler {
            cb: Some(on_ep_error),
            arg: (&*failed as *const AtomicI8).cast_mut().cast(),
        };
        let mut ep: Ptr = std::ptr::null_mut();
        // SAFETY: the worker is live (lock held); `address` is read during the call only; the
        // handler argument is a boxed flag kept in `peers` until after the worker is destroyed.
        let s = unsafe { (self.api.ep_create)(worker, &params, &mut ep) };
        if s != UCS_OK {
            return Err(Error::PeerLost {
                rank,
                reason: format!("UCX: ucp_ep_create: {}", self.api.status(s)),
            });
        }
        tracing::debug!(rank = self.rank, peer = rank, "UCX endpoint created");
        inner.peers.insert(rank, Peer { ep, failed });
        Ok(())
    }

    /// One line for logs: the UCX version and the transport selection (UCX_TLS).
    pub(crate) fn describe(&self) -> String {
        let version = self.api.version();
        let tls = match std::env::var("UCX_TLS") {
            Ok(t) => format!("UCX_TLS={t}"),
            Err(_) => "UCX_TLS unset (all)".to_owned(),
        };
        format!(
            "UCX {version}, {tls}, {} peer endpoint(s)",
            self.lock().peers.len()
        )
    }

    /// Posts every op (receives first), then progresses the worker until all complete. A send
    /// completes when the peer's receive took it (a synchronous send): when this returns,
    /// nothing this rank sent is still in flight.
    ///
    /// The UCX tag is `(tag << 20) | sender_rank` with a full mask, so messages are matched
    /// by (sender, tag). A received length different from `data.len()` is
    /// [`Error::InvalidArgument`]. Past `deadline` → [`Error::HostTimeout`]; `check` is
    /// called about every millisecond and a `Some(e)` it returns ends the exchange with `e`.
    /// UCX request/endpoint failures → [`Error::PeerLost`] for that peer. On every return
    /// path no UCX request is left that could touch the `data` buffers (failed exchanges
    /// cancel them and progress until released; if a send cannot be cancelled the endpoint
    /// to that peer is force-closed, after which that peer reports `PeerLost`).
    pub(crate) fn exchange(
        &self,
        ops: &mut [Op<'_>],
        what: &str,
        deadline: Instant,
        check: &mut dyn FnMut() -> Option<Error>,
    ) -> Result<()> {
        // SAFETY: the flight is waited for before `ops`' borrows end, and not leaked.
        let flight = unsafe { self.post(ops, what) }?;
        flight.wait(what, deadline, check)
    }

    /// The first half of [`Ucx::exchange`]: posts every op (receives first) and returns them in
    /// flight, for [`Flight::wait`] — so that a rank can post its next ops before the previous
    /// ones completed (messages of one tag from one sender match in the order posted).
    ///
    /// # Safety
    /// The ops' memory stays valid, and untouched by anything else (written, for a send;
    /// touched at all, for a receive), until the flight has been waited for or dropped; the
    /// flight is not leaked (`mem::forget`), since only its end releases UCX's requests.
    pub(crate) unsafe fn post(&self, ops: &mut [Op<'_>], what: &str) -> Result<Flight<'_>> {
        if !self.cuda_memory && ops.iter().any(Op::on_cuda) {
            return Err(Error::Unsupported(format!(
                "UCX: {what}: device memory handed to a UCX that cannot move it (built without CUDA, or no driver found)"
            )));
        }
        let mut flight = Flight {
            ucx: self,
            pending: Vec::with_capacity(ops.len()),
        };
        let inner = self.lock();
        let posted = ops.iter().try_for_each(|op| {
            let (peer, tag) = op.peer_tag();
            self.endpoint(&inner, peer, tag, what).map(|_| ())
        });
        let posted = posted.and_then(|()| self.post_ops(&inner, ops, what, &mut flight.pending));
        // The lock is released before an unfinished flight drops (its drop takes it).
        drop(inner);
        posted.map(|()| flight)
    }

    /// Posts a send of `data` to rank `peer` under `tag` (< 2^44) without waiting for it: the
    /// outbox keeps the data until UCX is done with it ([`Ucx::progress`] retires it). For a
    /// loop that sends and receives at once (the proxy), where a blocking send could wait for a
    /// peer that waits for us.
    pub(crate) fn post_send(
        &self,
        out: &mut Outbox,
        peer: u32,
        tag: u64,
        data: Vec<u8>,
        what: &str,
    ) -> Result<()> {
        let inner = self.lock();
        let ep = self.endpoint(&inner, peer, tag, what)?;
        // SAFETY: `ep` is a live endpoint of our worker (lock held); `data`'s heap buffer stays
        // in the outbox (moving the Vec does not move it) until the request is released.
        let p = unsafe {
            self.send(
                ep,
                peer,
                tag,
                (data.as_ptr().cast(), data.len(), false),
                false,
            )
        };
        if is_ptr(p.req) {
            out.sends.push((p, data));
            Ok(())
        } else {
            self.finish(&p, what, ptr_err(p.req).unwrap_or(UCS_OK), data.len())
        }
    }

    /// Progresses the worker once and retires the outbox's completed sends. Returns whether
    /// anything happened; a failed send is [`Error::PeerLost`] for its peer.
    pub(crate) fn progress(&self, out: &mut Outbox, what: &str) -> Result<bool> {
        let inner = self.lock();
        // SAFETY: the worker is live and we hold the lock.
        let progressed = unsafe { (self.api.worker_progress)(inner.worker) } != 0;
        let mut result = Ok(progressed);
        out.sends.retain(|(p, _)| match self.test(p, what) {
            None => true,
            Some(r) => {
                if let Err(e) = r {
                    result = Err(e);
                }
                false
            }
        });
        result
    }

    /// The next message from rank `peer` under `tag` if it has arrived (whole, of any length),
    /// else `None`; waits for its bytes until `deadline` ([`Error::HostTimeout`] then).
    pub(crate) fn try_recv(
        &self,
        peer: u32,
        tag: u64,
        what: &str,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>> {
        let mut inner = self.lock();
        let worker = inner.worker;
        let mut info = UcpTagRecvInfo::default();
        let ucx_tag = (tag << RANK_BITS) | u64::from(peer);
        // SAFETY: the worker is live (lock held); `info` is an out-pointer; remove=1 hands the
        // message to us, to be received with `ucp_tag_msg_recv_nbx` below.
        let msg = unsafe { (self.api.tag_probe_nb)(worker, ucx_tag, u64::MAX, 1, &mut info) };
        if msg.is_null() {
            return Ok(None);
        }
        let mut data = vec![0u8; info.length];
        let mut param: UcpRequestParam = zeroed();
        param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        // SAFETY: `msg` is the message just removed by the probe; `data` has its length and
        // outlives the request (released below before returning).
        let req = unsafe {
            (self.api.tag_msg_recv_nbx)(worker, data.as_mut_ptr().cast(), data.len(), msg, &param)
        };
        let p = Pending {
            req,
            kind: Kind::Recv,
            peer,
            tag,
            len: data.len(),
        };
        if !is_ptr(req) {
            self.finish(&p, what, ptr_err(req).unwrap_or(UCS_OK), data.len())?;
            return Ok(Some(data));
        }
        loop {
            // SAFETY: the worker is live and we hold the lock.
            unsafe { (self.api.worker_progress)(worker) };
            if let Some(r) = self.test(&p, what) {
                return r.map(|()| Some(data));
            }
            if Instant::now() >= deadline {
                self.abort(&mut inner, &mut vec![p]);
                return Err(Error::HostTimeout {
                    rank: self.rank,
                    what: what.to_owned(),
                    timeout_ms: 0,
                });
            }
        }
    }

    /// Releases what the outbox still holds: progresses until its sends complete or `grace`
    /// passed, then cancels the rest (never returns while UCX may still read their data).
    pub(crate) fn drain(&self, out: &mut Outbox, grace: Duration) {
        let start = Instant::now();
        while !out.sends.is_empty() && start.elapsed() < grace {
            let _ = self.progress(out, "draining");
        }
        if !out.sends.is_empty() {
            let mut inner = self.lock();
            // The data stays alive until `abort` released every request.
            let (mut pending, data): (Vec<Pending>, Vec<Vec<u8>>) = out.sends.drain(..).unzip();
            self.abort(&mut inner, &mut pending);
            drop(data);
        }
    }

    /// The endpoint to rank `peer` for a message under `tag`: the tag must fit in 44 bits and
    /// the peer be connected and healthy.
    fn endpoint(&self, inner: &Inner, peer: u32, tag: u64, what: &str) -> Result<Ptr> {
        if tag >= 1 << (64 - RANK_BITS) {
            return Err(Error::InvalidArgument(format!(
                "UCX: {what}: tag {tag} does not fit in 44 bits"
            )));
        }
        match inner.peers.get(&peer) {
            Some(p) => self.peer_health(what, peer, p).map(|()| p.ep),
            None => Err(Error::InvalidArgument(format!(
                "UCX: {what}: rank {peer} is not connected"
            ))),
        }
    }

    /// Posts a send of `data` to `peer` under `tag` (UCX tag `(tag << 20) | our rank`). A
    /// `matched` send completes only once the peer's receive has taken it (UCX's synchronous
    /// send), so nothing of it is in flight when it completes: a rank may destroy its
    /// communicator (and close its endpoints) right after its last collective without its
    /// peers losing the bytes they have not read yet.
    ///
    /// `data`: address, length and whether it is CUDA device memory (told to UCX, which then
    /// needs no lookup).
    ///
    /// # Safety
    /// `ep` is a live endpoint of our worker (the lock held), and `data`'s bytes stay alive and
    /// unchanged until the returned request is released (or it completed at once: not a
    /// pointer); device memory only when [`Ucx::cuda_memory`].
    unsafe fn send(
        &self,
        ep: Ptr,
        peer: u32,
        tag: u64,
        (addr, len, device): (*const c_void, usize, bool),
        matched: bool,
    ) -> Pending {
        let param = memory_param(0, device);
        let ucx_tag = (tag << RANK_BITS) | u64::from(self.rank);
        let post = if matched {
            self.api.tag_send_sync_nbx
        } else {
            self.api.tag_send_nbx
        };
        // SAFETY: the caller's contract.
        let req = unsafe { post(ep, addr, len, ucx_tag, &param) };
        Pending {
            req,
            kind: Kind::Send,
            peer,
            tag,
            len,
        }
    }

    fn peer_health(&self, what: &str, rank: u32, peer: &Peer) -> Result<()> {
        if peer.ep.is_null() {
            return Err(Error::PeerLost {
                rank,
                reason: format!("UCX: {what}: endpoint was closed after an earlier failure"),
            });
        }
        match peer.failed.load(Ordering::Acquire) {
            UCS_OK => Ok(()),
            s => Err(Error::PeerLost {
                rank,
                reason: format!("UCX: {what}: {}", self.api.status(s)),
            }),
        }
    }

    /// Posts all receives, then all sends; stops at the first error (already posted
    /// requests are left in `pending` for the caller to abort).
    fn post_ops(
        &self,
        inner: &Inner,
        ops: &mut [Op<'_>],
        what: &str,
        pending: &mut Vec<Pending>,
    ) -> Result<()> {
        for op in ops.iter_mut() {
            let (peer, tag, addr, len, device) = match op {
                Op::Recv { peer, tag, data } => {
                    (*peer, *tag, data.as_mut_ptr().cast(), data.len(), false)
                }
                Op::RecvDevice { peer, tag, data } => {
                    (*peer, *tag, data.addr as Ptr, data.len, data.cuda)
                }
                Op::Send { .. } | Op::SendDevice { .. } => continue,
            };
            let mut info = UcpTagRecvInfo::default();
            // NO_IMM_CMPL: UCX 1.13 does not fill `recv_info` on immediate completion
            // (observed length 0), so always get a request and read the length from it.
            let mut param = memory_param(
                UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
                device,
            );
            param.recv_info = (&mut info as *mut UcpTagRecvInfo).cast();
            let ucx_tag = (tag << RANK_BITS) | u64::from(peer);
            // SAFETY: the worker is live (lock held); the op's memory stays valid until its
            // flight ends (`post`'s contract; CUDA memory only when `cuda_memory`, checked by
            // `post`), and the flight's end releases the request (see `abort`); `info` is only
            // written during this call (immediate completion).
            let req = unsafe {
                (self.api.tag_recv_nbx)(inner.worker, addr, len, ucx_tag, u64::MAX, &param)
            };
            let p = Pending {
                req,
                kind: Kind::Recv,
                peer,
                tag,
                len,
            };
            if is_ptr(req) {
                pending.push(p);
            } else {
                self.finish(&p, what, ptr_err(req).unwrap_or(UCS_OK), info.length)?;
            }
        }
        for op in ops.iter() {
            let (peer, tag, data) = match op {
                Op::Send { peer, tag, data } => {
                    (*peer, *tag, (data.as_ptr().cast(), data.len(), false))
                }
                Op::SendDevice { peer, tag, data } => (
                    *peer,
                    *tag,
                    (data.addr as *const c_void, data.len, data.cuda),
                ),
                Op::Recv { .. } | Op::RecvDevice { .. } => continue,
            };
            let ep = inner
                .peers
                .get(&peer)
                .map_or(std::ptr::null_mut(), |p| p.ep);
            // SAFETY: `ep` is a live endpoint (checked before posting); the op's memory stays
            // valid until its flight ends, which releases the request (as for the receives).
            let p = unsafe { self.send(ep, peer, tag, data, true) };
            if is_ptr(p.req) {
                pending.push(p);
            } else {
                self.finish(&p, what, ptr_err(p.req).unwrap_or(UCS_OK), data.1)?;
            }
        }
        Ok(())
    }

    /// Tests a pending request; when it is done, frees it and returns its outcome.
    fn test(&self, p: &Pending, what: &str) -> Option<Result<()>> {
        let mut info = UcpTagRecvInfo::default();
        // SAFETY: `p.req` is a live request of our worker (lock held), freed only below.
        let s = unsafe {
            match p.kind {
                Kind::Recv => (self.api.tag_recv_request_test)(p.req, &mut info),
                Kind::Send => (self.api.request_check_status)(p.req),
            }
        };
        if s == UCS_INPROGRESS {
            return None;
        }
        // SAFETY: the request has completed and is freed exactly once (then dropped by caller).
        unsafe { (self.api.request_free)(p.req) };
        let len = if p.kind == Kind::Recv {
            info.length
        } else {
            p.len
        };
        Some(self.finish(p, what, s, len))
    }

    /// The outcome of a completed request with status `s` and received length `len`.
    fn finish(&self, p: &Pending, what: &str, s: Status, len: usize) -> Result<()> {
        let (peer, tag) = (p.peer, p.tag);
        match s {
            UCS_OK if len == p.len => Ok(()),
            UCS_OK | UCS_ERR_MESSAGE_TRUNCATED => {
                let got = if s == UCS_OK {
                    len.to_string()
                } else {
                    "more".to_owned()
                };
                Err(Error::InvalidArgument(format!(
                    "UCX: {what}: message from rank {peer} with tag {tag} has {got} bytes, expected {}",
                    p.len
                )))
            }
            _ => Err(Error::PeerLost {
                rank: peer,
                reason: format!("UCX: {what}: {}", self.api.status(s)),
            }),
        }
    }

    /// Cancels and releases every pending request. Receives are cancelled directly; if
    /// anything is still in flight after 100 ms (sends cannot be cancelled), the endpoints
    /// of those peers are force-closed, which fails their requests. Never returns while a
    /// request is live, since it could still access the caller's buffers.
    fn abort(&self, inner: &mut Inner, pending: &mut Vec<Pending>) {
        let worker = inner.worker;
        for p in pending.iter() {
            // SAFETY: live request of our live worker (lock held).
            unsafe { (self.api.request_cancel)(worker, p.req) };
        }
        let start = Instant::now();
        let mut forced = false;
        let mut last_warn = start;
        while !pending.is_empty() {
            // SAFETY: the worker is live and we hold the lock.
            unsafe { (self.api.worker_progress)(worker) };
            pending.retain(|p| self.test(p, "cancel").is_none());
            if !forced && !pending.is_empty() && start.elapsed() > Duration::from_millis(100) {
                forced = true;
                for p in pending.iter() {
                    if let Some(peer) = inner
                        .peers
                        .get_mut(&p.peer)
                        .filter(|peer| !peer.ep.is_null())
                    {
                        tracing::warn!(
                            rank = self.rank,
                            peer = p.peer,
                            "UCX: force-closing endpoint to release an uncancellable request"
                        );
                        self.api.close_ep(worker, peer.ep, Duration::from_secs(1));
                        peer.ep = std::ptr::null_mut();
                    }
                }
            }
            if last_warn.elapsed() > Duration::from_secs(5) {
                last_warn = Instant::now();
                tracing::warn!(
                    rank = self.rank,
                    left = pending.len(),
                    "UCX: still waiting for cancelled requests to be released"
                );
            }
        }
    }
}

impl Drop for Ucx {
    /// Force-closes the endpoints (progressing up to ~1 s each), destroys the worker and the
    /// context. Messages sent but not yet received by a peer may be lost: synchronize first.
    fn drop(&mut self) {
        let api = self.api;
        let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        for peer in inner.peers.values_mut() {
            if !peer.ep.is_null() {
                api.close_ep(inner.worker, peer.ep, Duration::from_secs(1));
                peer.ep = std::ptr::null_mut();
            }
        }
        // SAFETY: no requests or endpoints remain; handles are destroyed once, in reverse
        // order of creation. The peers' error flags are dropped only after this.
        unsafe {
            (api.worker_destroy)(inner.worker);
            (api.cleanup)(inner.context);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use std::time::Duration;

    /// `n` instances (ranks 0..n) in this process, connected all-to-all (including self).
    fn mesh(n: u32) -> Vec<Ucx> {
        let v: Vec<Ucx> = (0..n).map(|r| Ucx::new(r).expect("Ucx::new")).collect();
        for a in &v {
            for (r, b) in v.iter().enumerate() {
                a.connect(r as u32, &b.address()).expect("connect");
            }
        }
        v
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    fn payload(from: u32, to: u32, tag: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u64 * 31 + tag * 7 + u64::from(from) * 3 + u64::from(to)) as u8)
            .collect()
    }

    #[test]
    fn two_ranks_three_messages() {
        let t = Instant::now();
        let v = mesh(2);
        let sizes = [0usize, 13, 1 << 20];
        std::thread::scope(|s| {
            for u in &v {
                s.spawn(move || {
                    let me = u.rank;
                    let other = 1 - me;
                    let sends: Vec<Vec<u8>> = sizes
                        .iter()
                        .enumerate()
                        .map(|(i, &n)| payload(me, other, 10 + i as u64, n))
                        .collect();
                    let mut recvs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0xAA; n]).collect();
                    let mut ops: Vec<Op> = sends
                        .iter()
                        .enumerate()
                        .map(|(i, d)| Op::Send {
                            peer: other,
                            tag: 10 + i as u64,
                            data: d,
                        })
                        .collect();
                    ops.extend(recvs.iter_mut().enumerate().map(|(i, d)| Op::Recv {
                        peer: other,
                        tag: 10 + i as u64,
                        data: d,
                    }));
                    u.exchange(&mut ops, "test", soon(), &mut || None)
                        .expect("exchange");
                    drop(ops);
                    for (i, r) in recvs.iter().enumerate() {
                        assert_eq!(
                            r,
                            &payload(other, me, 10 + i as u64, sizes[i]),
                            "message {i}"
                        );
                    }
                });
            }
        });
        eprintln!("{} | two ranks: {:?}", v[0].describe(), t.elapsed());
    }

    #[test]
    fn three_ranks_same_tag() {
        let t = Instant::now();
        let v = mesh(3);
        std::thread::scope(|s| {
            for u in &v {
                s.spawn(move || {
                    let me = u.rank;
                    let peers: Vec<u32> = (0..3).filter(|&p| p != me).collect();
                    let sends: Vec<Vec<u8>> =
                        peers.iter().map(|&p| payload(me, p, 5, 100)).collect();
                    let mut recvs = vec![vec![0u8; 100]; peers.len()];
                    let mut ops: Vec<Op> = recvs
                        .iter_mut()
                        .zip(&peers)
                        .map(|(d, &p)| Op::Recv {
                            peer: p,
                            tag: 5,
                            data: d,
                        })
                        .collect();
                    ops.extend(sends.iter().zip(&peers).map(|(d, &p)| Op::Send {
                        peer: p,
                        tag: 5,
                        data: d,
                    }));
                    u.exchange(&mut ops, "all-to-all", soon(), &mut || None)
                        .expect("exchange");
                    drop(ops);
                    for (r, &p) in recvs.iter().zip(&peers) {
                        assert_eq!(r, &payload(p, me, 5, 100), "from rank {p}");
                    }
                });
            }
        });
        eprintln!("three ranks: {:?}", t.elapsed());
    }

    #[test]
    fn timeout_then_usable() {
        let v = mesh(2);
        let mut buf = [0u8; 8];
        let t = Instant::now();
        let e = v[0].exchange(
            &mut [Op::Recv {
                peer: 1,
                tag: 7,
                data: &mut buf,
            }],
            "lonely recv",
            t + Duration::from_millis(200),
            &mut || None,
        );
        let took = t.elapsed();
        match e {
            Err(Error::HostTimeout {
                rank: 0,
                what,
                timeout_ms,
            }) => {
                assert_eq!(what, "lonely recv");
                assert!((150..1000).contains(&timeout_ms), "{timeout_ms}");
            }
            other => panic!("expected HostTimeout, got {other:?}"),
        }
        assert!(took < Duration::from_secs(1), "{took:?}");
        // The cancelled receive must not swallow a later message with the same tag.
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut got = [0u8; 8];
                v[0].exchange(
                    &mut [Op::Recv {
                        peer: 1,
                        tag: 7,
                        data: &mut got,
                    }],
                    "again",
                    soon(),
                    &mut || None,
                )
                .expect("recv");
                assert_eq!(got, *b"12345678");
            });
            s.spawn(|| {
                v[1].exchange(
                    &mut [Op::Send {
                        peer: 0,
                        tag: 7,
                        data: b"12345678",
                    }],
                    "again",
                    soon(),
                    &mut || None,
                )
                .expect("send");
            });
        });
    }

    #[test]
    fn check_stops_exchange() {
        let v = mesh(2);
        let mut buf = [0u8; 8];
        let mut calls = 0;
        let t = Instant::now();
        let e = v[0].exchange(
            &mut [Op::Recv {
                peer: 1,
                tag: 3,
                data: &mut buf,
            }],
            "checked",
            soon(),
            &mut || {
                calls += 1;
                (calls == 3).then(|| Error::PeerLost {
                    rank: 9,
                    reason: "test".into(),
                })
            },
        );
        assert!(matches!(e, Err(Error::PeerLost { rank: 9, .. })), "{e:?}");
        assert_eq!(calls, 3);
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn wrong_size_and_unknown_peer() {
        let v = mesh(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut got = [0u8; 4];
                let e = v[0].exchange(&mut [Op::Recv { peer: 1, tag: 1, data: &mut got }], "sz", soon(), &mut || None);
                assert!(matches!(&e, Err(Error::InvalidArgument(m)) if m.contains("rank 1") && m.contains("tag 1")), "{e:?}");
                let mut got = [0u8; 16];
                let e = v[0].exchange(&mut [Op::Recv { peer: 1, tag: 2, data: &mut got }], "sz", soon(), &mut || None);
                assert!(matches!(&e, Err(Error::InvalidArgument(m)) if m.contains("8 bytes, expected 16")), "{e:?}");
            });
            s.spawn(|| {
                let ops = &mut [
                    Op::Send {
                        peer: 0,
                        tag: 1,
                        data: b"12345678",
                    },
                    Op::Send {
                        peer: 0,
                        tag: 2,
                        data: b"12345678",
                    },
                ];
                v[1].exchange(ops, "sz", soon(), &mut || None)
                    .expect("send");
            });
        });
        let e = v[0].exchange(
            &mut [Op::Send {
                peer: 5,
                tag: 1,
                data: b"x",
            }],
            "x",
            soon(),
            &mut || None,
        );
        assert!(matches!(e, Err(Error::InvalidArgument(_))), "{e:?}");
    }

    /// Device memory is refused by a UCX that cannot move it, before anything is posted, and
    /// the exchange that follows works; with CUDA memory UCX is told its type.
    #[test]
    fn device_memory_needs_a_cuda_capable_ucx() {
        let v = mesh(2);
        assert!(
            !v[0].cuda_memory(),
            "this test needs a UCX without CUDA support or without a driver (scripts/test's)"
        );
        // SAFETY: never handed to UCX: the exchange refuses CUDA memory first.
        let data = unsafe { DeviceBytes::new(0x1000, 8, true) };
        for op in [
            Op::SendDevice {
                peer: 1,
                tag: 3,
                data,
            },
            Op::RecvDevice {
                peer: 1,
                tag: 3,
                data,
            },
        ] {
            let e = v[0].exchange(&mut [op], "dev", soon(), &mut || None);
            assert!(
                matches!(&e, Err(Error::Unsupported(m)) if m.contains("cannot move it")),
                "{e:?}"
            );
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut got = [0u8; 3];
                v[1].exchange(
                    &mut [Op::Recv {
                        peer: 0,
                        tag: 3,
                        data: &mut got,
                    }],
                    "after",
                    soon(),
                    &mut || None,
                )
                .expect("recv after the refusal");
                assert_eq!(&got, b"abc");
            });
            v[0].exchange(
                &mut [Op::Send {
                    peer: 1,
                    tag: 3,
                    data: b"abc",
                }],
                "after",
                soon(),
                &mut || None,
            )
            .expect("send after the refusal");
        });
        let host = memory_param(UCP_OP_ATTR_FIELD_RECV_INFO, false);
        assert_eq!(host.op_attr_mask, UCP_OP_ATTR_FIELD_RECV_INFO);
        let device = memory_param(UCP_OP_ATTR_FIELD_RECV_INFO, true);
        assert_eq!(
            device.op_attr_mask,
            UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FIELD_MEMORY_TYPE
        );
        assert_eq!(device.memory_type, UCS_MEMORY_TYPE_CUDA as c_int);
    }

    /// Two flights of one tag from one sender: matched in the order posted, whichever is waited
    /// for first; a flight dropped unfinished releases its receive (which then takes nothing),
    /// and the worker stays usable.
    #[test]
    fn flights_overlap_and_one_dropped_unfinished_is_released() {
        let v = mesh(2);
        let (mut a, mut b) = ([0u8; 5], [0u8; 5]);
        std::thread::scope(|s| {
            s.spawn(|| {
                for data in [b"first", b"secnd"] {
                    let send = Op::Send {
                        peer: 0,
                        tag: 5,
                        data,
                    };
                    v[1].exchange(&mut [send], "send", soon(), &mut || None)
                        .expect("send");
                }
            });
            // SAFETY: `a` and `b` are not touched until the flights were waited for.
            let first = unsafe {
                v[0].post(
                    &mut [Op::Recv {
                        peer: 1,
                        tag: 5,
                        data: &mut a,
                    }],
                    "f1",
                )
            }
            .expect("post f1");
            // SAFETY: as above.
            let second = unsafe {
                v[0].post(
                    &mut [Op::Recv {
                        peer: 1,
                        tag: 5,
                        data: &mut b,
                    }],
                    "f2",
                )
            }
            .expect("post f2");
            second.wait("f2", soon(), &mut || None).expect("f2");
            first.wait("f1", soon(), &mut || None).expect("f1");
        });
        assert_eq!((&a, &b), (b"first", b"secnd"));
        let mut lost = [0u8; 4];
        // SAFETY: the flight is dropped (its request released) before `lost` is read.
        let never = unsafe {
            v[0].post(
                &mut [Op::Recv {
                    peer: 1,
                    tag: 9,
                    data: &mut lost,
                }],
                "never",
            )
        }
        .expect("post");
        drop(never);
        let mut got = [0u8; 4];
        std::thread::scope(|s| {
            s.spawn(|| {
                let send = Op::Send {
                    peer: 0,
                    tag: 9,
                    data: b"abcd",
                };
                v[1].exchange(&mut [send], "after", soon(), &mut || None)
                    .expect("send after the drop");
            });
            let recv = Op::Recv {
                peer: 1,
                tag: 9,
                data: &mut got,
            };
            v[0].exchange(&mut [recv], "after", soon(), &mut || None)
                .expect("recv after the drop");
        });
        assert_eq!((&got, &lost), (b"abcd", &[0u8; 4]));
    }

    #[test]
    fn unreceived_send_times_out_and_is_released() {
        let v = mesh(2);
        let big = vec![1u8; 4 << 20]; // large enough for rendezvous: cannot complete unreceived
        let t = Instant::now();
        let e = v[0].exchange(
            &mut [Op::Send {
                peer: 1,
                tag: 1,
                data: &big,
            }],
            "big send",
            t + Duration::from_millis(200),
            &mut || None,
        );
        eprintln!("unreceived send: {e:?} after {:?}", t.elapsed());
        match e {
            // Completed locally (a transport may buffer it all) or timed out and was released.
            Ok(()) | Err(Error::HostTimeout { .. }) => {}
            Err(e) => panic!("unexpected {e:?}"),
        }
        drop(big); // the request must not outlive the buffer
        assert!(t.elapsed() < Duration::from_secs(3));
        if e.is_err() {
            // The uncancellable send was released by force-closing the endpoint.
            let e = v[0].exchange(
                &mut [Op::Send {
                    peer: 1,
                    tag: 2,
                    data: b"x",
                }],
                "after",
                soon(),
                &mut || None,
            );
            assert!(
                matches!(&e, Err(Error::PeerLost { rank: 1, reason }) if reason.contains("closed")),
                "{e:?}"
            );
        }
    }

    #[test]
    fn dead_peer_is_peer_lost() {
        let mut v = mesh(2);
        drop(v.pop());
        let mut buf = [0u8; 8];
        let t = Instant::now();
        let e = v[0].exchange(
            &mut [Op::Recv {
                peer: 1,
                tag: 1,
                data: &mut buf,
            }],
            "recv from dead",
            t + Duration::from_secs(5),
            &mut || None,
        );
        eprintln!("dead peer: {e:?} after {:?}", t.elapsed());
        assert!(
            matches!(
                e,
                Err(Error::PeerLost { rank: 1, .. }) | Err(Error::HostTimeout { .. })
            ),
            "{e:?}"
        );
    }

    #[test]
    fn resource_lines_are_parsed() {
        let text = "#\n# UCP context\n#\n#     component 1  :  tcp\n#            md 1  :  component 1  tcp \n\
                    #      resource 0  :  md 0  dev 0  flags -- self/memory0\n\
                    #      resource 1  :  md 1  dev 1  flags -- tcp/lo\n\
                    #      resource 7  :  md 5  dev 4  flags -- rc_mlx5/mlx5_0:1\n#\n";
        assert_eq!(
            resources(text),
            ["self/memory0", "tcp/lo", "rc_mlx5/mlx5_0:1"]
        );
        assert!(resources("").is_empty());
    }

    /// The installed UCX (scripts/test installs it) offers TCP on loopback at least.
    #[test]
    fn probe_lists_transports() {
        let info = ucx_probe().expect("ucx_probe");
        assert!(info.version.starts_with("1."), "{info:?}");
        assert!(info.transports.iter().any(|t| t == "tcp/lo"), "{info:?}");
        match probe_library("libucp-does-not-exist.so.0") {
            Err(Error::Unsupported(m)) => assert!(m.contains("could not be loaded"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn missing_library_is_unsupported() {
        match Ucx::with_library(0, "libucp-does-not-exist.so.0") {
            Err(Error::Unsupported(m)) => assert!(
                m.contains("apt install libucx0") && m.contains("could not be loaded"),
                "{m}"
            ),
            Err(e) => panic!("wrong error {e:?}"),
            Ok(_) => panic!("loaded a bogus library"),
        }
    }

    /// Compares the #[repr(C)] mirrors with the C headers (libucx-dev and gcc, which
    /// scripts/test installs: without them this fails, it does not skip).
    #[test]
    fn layouts_match_headers() {
        use std::mem::{offset_of, size_of};
        assert!(
            std::path::Path::new("/usr/include/ucp/api/ucp.h").exists(),
            "UCX headers not installed (apt install libucx-dev; scripts/test does)"
        );
        let dir = std::env::temp_dir().join(format!("ucx_layout_{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmpdir");
        let checks: Vec<(&str, usize)> = vec![
            ("sizeof(ucs_status_t)", size_of::<Status>()),
            ("sizeof(ucp_params_t)", size_of::<UcpParams>()),
            (
                "offsetof(ucp_params_t, mt_workers_shared)",
                offset_of!(UcpParams, mt_workers_shared),
            ),
            ("offsetof(ucp_params_t, name)", offset_of!(UcpParams, name)),
            ("sizeof(ucp_worker_params_t)", size_of::<UcpWorkerParams>()),
            (
                "offsetof(ucp_worker_params_t, thread_mode)",
                offset_of!(UcpWorkerParams, thread_mode),
            ),
            (
                "offsetof(ucp_worker_params_t, events)",
                offset_of!(UcpWorkerParams, events),
            ),
            (
                "offsetof(ucp_worker_params_t, client_id)",
                offset_of!(UcpWorkerParams, client_id),
            ),
            ("sizeof(ucp_ep_params_t)", size_of::<UcpEpParams>()),
            (
                "offsetof(ucp_ep_params_t, err_mode)",
                offset_of!(UcpEpParams, err_mode),
            ),
            (
                "offsetof(ucp_ep_params_t, err_handler)",
                offset_of!(UcpEpParams, err_handler),
            ),
            (
                "offsetof(ucp_ep_params_t, sockaddr)",
                offset_of!(UcpEpParams, sockaddr),
            ),
            (
                "offsetof(ucp_ep_params_t, local_sockaddr)",
                offset_of!(UcpEpParams, local_sockaddr),
            ),
            ("sizeof(ucp_request_param_t)", size_of::<UcpRequestParam>()),
            (
                "offsetof(ucp_request_param_t, flags)",
                offset_of!(UcpRequestParam, flags),
            ),
            (
                "offsetof(ucp_request_param_t, datatype)",
                offset_of!(UcpRequestParam, datatype),
            ),
            (
                "offsetof(ucp_request_param_t, memory_type)",
                offset_of!(UcpRequestParam, memory_type),
            ),
            (
                "offsetof(ucp_request_param_t, recv_info)",
                offset_of!(UcpRequestParam, recv_info),
            ),
            (
                "offsetof(ucp_request_param_t, memh)",
                offset_of!(UcpRequestParam, memh),
            ),
            ("sizeof(ucp_tag_recv_info_t)", size_of::<UcpTagRecvInfo>()),
            ("sizeof(ucp_context_attr_t)", size_of::<UcpContextAttr>()),
            (
                "offsetof(ucp_context_attr_t, memory_types)",
                offset_of!(UcpContextAttr, memory_types),
            ),
            (
                "offsetof(ucp_context_attr_t, name)",
                offset_of!(UcpContextAttr, name),
            ),
            (
                "UCP_ATTR_FIELD_MEMORY_TYPES",
                UCP_ATTR_FIELD_MEMORY_TYPES as usize,
            ),
            ("UCS_MEMORY_TYPE_CUDA", UCS_MEMORY_TYPE_CUDA as usize),
            (
                "offsetof(ucp_tag_recv_info_t, length)",
                offset_of!(UcpTagRecvInfo, length),
            ),
            ("UCP_FEATURE_TAG", UCP_FEATURE_TAG as usize),
            (
                "UCP_PARAM_FIELD_FEATURES",
                UCP_PARAM_FIELD_FEATURES as usize,
            ),
            (
                "UCP_WORKER_PARAM_FIELD_THREAD_MODE",
                UCP_WORKER_PARAM_FIELD_THREAD_MODE as usize,
            ),
            (
                "UCS_THREAD_MODE_SERIALIZED",
                UCS_THREAD_MODE_SERIALIZED as usize,
            ),
            (
                "UCP_EP_PARAM_FIELD_REMOTE_ADDRESS",
                UCP_EP_PARAM_FIELD_REMOTE_ADDRESS as usize,
            ),
            (
                "UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE",
                UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE as usize,
            ),
            (
                "UCP_EP_PARAM_FIELD_ERR_HANDLER",
                UCP_EP_PARAM_FIELD_ERR_HANDLER as usize,
            ),
            (
                "UCP_ERR_HANDLING_MODE_PEER",
                UCP_ERR_HANDLING_MODE_PEER as usize,
            ),
            ("UCP_OP_ATTR_FIELD_FLAGS", UCP_OP_ATTR_FIELD_FLAGS as usize),
            (
                "UCP_OP_ATTR_FIELD_MEMORY_TYPE",
                UCP_OP_ATTR_FIELD_MEMORY_TYPE as usize,
            ),
            (
                "UCP_OP_ATTR_FIELD_RECV_INFO",
                UCP_OP_ATTR_FIELD_RECV_INFO as usize,
            ),
            (
                "UCP_OP_ATTR_FLAG_NO_IMM_CMPL",
                UCP_OP_ATTR_FLAG_NO_IMM_CMPL as usize,
            ),
            ("UCP_EP_CLOSE_FLAG_FORCE", UCP_EP_CLOSE_FLAG_FORCE as usize),
            ("(size_t)(ssize_t)UCS_ERR_LAST", UCS_ERR_LAST as usize),
            (
                "(size_t)(ssize_t)UCS_ERR_MESSAGE_TRUNCATED",
                UCS_ERR_MESSAGE_TRUNCATED as isize as usize,
            ),
            (
                "(size_t)(ssize_t)UCS_ERR_CANCELED",
                UCS_ERR_CANCELED as isize as usize,
            ),
            ("UCS_INPROGRESS", UCS_INPROGRESS as usize),
        ];
        let mut c = String::from(
            "#include <ucp/api/ucp.h>\n#include <stddef.h>\n#include <stdio.h>\nint main(void){\n",
        );
        for (expr, _) in &checks {
            c.push_str(&format!("printf(\"%zu\\n\", (size_t)({expr}));\n"));
        }
        c.push_str("return 0;}\n");
        let (src, exe) = (dir.join("l.c"), dir.join("l"));
        std::fs::write(&src, c).expect("write");
        let out = std::process::Command::new("gcc")
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .output()
            .expect("gcc (the C compiler the emulator builds with) must be installed");
        assert!(
            out.status.success(),
            "gcc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = std::process::Command::new(&exe)
            .output()
            .expect("run layout probe");
        let got: Vec<usize> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.parse().expect("number"))
            .collect();
        assert_eq!(got.len(), checks.len());
        for ((expr, rust), c) in checks.iter().zip(got) {
            assert_eq!(*rust, c, "{expr}: Rust {rust}, C {c}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! symcomm-nccl: NCCL's C ABI over symcomm, built as `libsymcomm_nccl.so` with SONAME
//! `libnccl.so.2`, so that `LD_PRELOAD` of it (or a `libnccl.so.2` symlink to it on the library
//! path) runs NCCL programs — PyTorch, nccl-tests, C/C++ — on symcomm, on a GPU or on the CPU
//! emulator (`SYMCOMM_DEVICE=emu`). The declarations are `include/nccl.h` (ours, with NCCL
//! 2.21's types and layouts); the library reports version 2.21.5 ([`version`]).
//!
//! The parts: `types.rs` (the C types: results, ids, configs, the element-type and reduction
//! mappings), `error.rs` (the result codes of symcomm's errors, the thread's last message, the
//! FFI guard every entry point runs in), `comm.rs` (the communicator handles and their
//! streams), `device.rs` (which device a new communicator uses), `create.rs` (making
//! communicators: from ids or splits, blocking or not), `init.rs` (ids, the init calls,
//! destruction, queries), `coll.rs` (collectives and send/recv), `premul.rs` (pre-multiplied
//! sums), `group.rs` (groups: what a call inside one defers, and how `ncclGroupEnd` runs it),
//! `memory.rs` (`ncclMemAlloc`, registration), `log.rs` (`NCCL_DEBUG*` onto symcomm's logging),
//! `unimplemented.rs` (the exported names that return `ncclInvalidUsage` until they are
//! implemented).
//!
//! Every entry point validates its arguments and returns a result code; none panics or unwinds
//! across the boundary, and none returns `ncclSuccess` without having done its work.

// The exported C functions are `pub` items of private modules: `#[no_mangle]` exports them from
// the shared library, and no Rust code outside is meant to see them.
#![allow(unreachable_pub)]

mod coll;
mod comm;
mod create;
mod device;
mod error;
mod group;
mod init;
mod log;
mod memory;
mod premul;
mod types;
mod unimplemented;
mod version;

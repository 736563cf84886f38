//! The device library's C ABI for Rust kernels: the functions of `kernel/ffi*.cu`, each wrapping
//! one C++ primitive. Scalars and pointers only; groups and scopes as codes
//! ([`crate::Group::CODE`], [`crate::Scope`]); statuses as `SYMCOMM_STATUS_*`.

use crate::abi::{CollArgs, DevComm, WindowHandleRaw};

unsafe extern "C" {
    pub(crate) fn symcomm_rs_record_user_error(
        comm: *const DevComm,
        status: u32,
        peer: u32,
        code: u32,
        value: u32,
    );
    pub(crate) fn symcomm_rs_recorded_error(comm: *const DevComm) -> u32;
    pub(crate) fn symcomm_rs_abort_requested(comm: *const DevComm) -> u32;

    pub(crate) fn symcomm_rs_signal_set(
        comm: *const DevComm,
        scope: u32,
        peer: u32,
        word: u32,
        value: u64,
    ) -> u32;
    pub(crate) fn symcomm_rs_signal_add(
        comm: *const DevComm,
        scope: u32,
        peer: u32,
        word: u32,
        delta: u64,
        previous: *mut u64,
    ) -> u32;
    pub(crate) fn symcomm_rs_signal_wait_until(
        comm: *const DevComm,
        group: u32,
        scope: u32,
        peer: u32,
        word: u32,
        value: u64,
    ) -> u32;
    pub(crate) fn symcomm_rs_semaphore_signal(
        comm: *const DevComm,
        scope: u32,
        peer: u32,
        word: u32,
    ) -> u32;
    pub(crate) fn symcomm_rs_semaphore_wait(
        comm: *const DevComm,
        group: u32,
        scope: u32,
        peer: u32,
        word: u32,
        expected: *mut u64,
    ) -> u32;

    pub(crate) fn symcomm_rs_fingerprint(
        kind: u32,
        dtype: u32,
        op: u32,
        count: u64,
        root: u32,
    ) -> u32;
    pub(crate) fn symcomm_rs_user_fingerprint(tag: u32, a: u64, b: u64) -> u32;
    pub(crate) fn symcomm_rs_barrier(comm: *const DevComm, group: u32, index: u32, fp: u32) -> u32;
    pub(crate) fn symcomm_rs_grid_sync(comm: *const DevComm, scope: u32, state: *mut u64) -> u32;

    pub(crate) fn symcomm_rs_put(
        group: u32,
        src: *const u8,
        dst: *const WindowHandleRaw,
        dst_offset: u64,
        peer: u32,
        count: u64,
        elem_size: u32,
    ) -> u32;
    pub(crate) fn symcomm_rs_get(
        group: u32,
        src: *const WindowHandleRaw,
        src_offset: u64,
        peer: u32,
        dst: *mut u8,
        count: u64,
        elem_size: u32,
    ) -> u32;
    pub(crate) fn symcomm_rs_put_with_signal(
        comm: *const DevComm,
        group: u32,
        src: *const u8,
        dst: *const WindowHandleRaw,
        dst_offset: u64,
        peer: u32,
        count: u64,
        elem_size: u32,
        word: u32,
        value: u64,
    ) -> u32;

    pub(crate) fn symcomm_rs_cta_part(
        grid: u32,
        index: u32,
        count: u64,
        elem_size: u32,
        lo: *mut u64,
        hi: *mut u64,
    );
    pub(crate) fn symcomm_rs_two_shot_part(
        grid: u32,
        index: u32,
        nranks: u32,
        count: u64,
        q: u32,
        elem_size: u32,
        lo: *mut u64,
        hi: *mut u64,
    );

    pub(crate) fn symcomm_rs_collective_f32(comm: *const DevComm, args: *const CollArgs) -> u32;
    pub(crate) fn symcomm_rs_collective_f64(comm: *const DevComm, args: *const CollArgs) -> u32;
    pub(crate) fn symcomm_rs_collective_f16(comm: *const DevComm, args: *const CollArgs) -> u32;
    pub(crate) fn symcomm_rs_collective_bf16(comm: *const DevComm, args: *const CollArgs) -> u32;
    pub(crate) fn symcomm_rs_collective_i32(comm: *const DevComm, args: *const CollArgs) -> u32;
    pub(crate) fn symcomm_rs_collective_u32(comm: *const DevComm, args: *const CollArgs) -> u32;
    pub(crate) fn symcomm_rs_collective_i64(comm: *const DevComm, args: *const CollArgs) -> u32;
    pub(crate) fn symcomm_rs_collective_u64(comm: *const DevComm, args: *const CollArgs) -> u32;
}

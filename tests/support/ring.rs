//! The put ring (`symcomm_test_put_ring`, device/kernels/device_api.cu) on a communicator's
//! ranks: `put_with_signal` around the ring, a `signal_add` tally to every rank and a `barrier`
//! per round — stores to this host's ranks, the proxy to other hosts' ones. Used by
//! tests/device_across_hosts.rs (emulator) and the GPU checks (tests/gpu/hosts.rs).

use std::time::{Duration, Instant};

use symcomm::{Buffer, Communicator, DEVICE_IMAGE, KernelArgs, LaunchConfig, Window};

/// One thread does the work (`group` of the kernel).
pub(crate) const GROUP_THREAD: u32 = 0;
/// One warp of 32 threads.
pub(crate) const GROUP_WARP: u32 = 1;
/// The whole CTA.
pub(crate) const GROUP_CTA: u32 = 2;

/// One launch of the ring on this rank, one CTA of `threads`: `rounds` rounds of `words` u32
/// (`win` holds `2 * words` per rank, `state` one u64 zeroed before the first launch and kept
/// across launches). Returns the kernel's [status, wrong words, rounds done] and how long the
/// launch took (host clock around the launch and the wait).
pub(crate) fn put_ring(
    comm: &Communicator,
    group: u32,
    threads: u32,
    rounds: u32,
    words: u32,
    state: &Buffer,
    win: &Window<u32>,
) -> Result<([u32; 3], Duration), String> {
    let e = |e: symcomm::Error| e.to_string();
    if win.len() < 2 * words as usize || state.len() < 8 {
        return Err(format!(
            "put_ring: the window needs {} elements and the state 8 bytes",
            2 * words
        ));
    }
    let kernel = comm
        .load_kernel(&DEVICE_IMAGE, "symcomm_test_put_ring")
        .map_err(e)?;
    let stream = comm.create_stream().map_err(e)?;
    let result = Buffer::new(comm.backend(), 12).map_err(e)?;
    let args = KernelArgs::new()
        .arg(&comm.device_handle().map_err(e)?)
        .arg(&win.device_handle().raw())
        .arg(&rounds)
        .arg(&words)
        .arg(&group)
        .arg(&state.addr())
        .arg(&result.addr());
    let start = Instant::now();
    // SAFETY: the kernel takes (DevComm, WindowHandleRaw, u32, u32, u32, u64*, u32*); the window
    // holds 2 * words u32 per rank, `state` 1 u64 and `result` 3 u32 (checked above); all
    // outlive the launch, which is waited for below.
    unsafe { comm.launch(&stream, &kernel, LaunchConfig::linear(1, threads), &args) }.map_err(e)?;
    stream.synchronize().map_err(e)?;
    let took = start.elapsed();
    let mut out = [0u32; 3];
    result.read(0, &mut out).map_err(e)?;
    Ok((out, took))
}

//! One hardware queue (`CUDA_DEVICE_MAX_CONNECTIONS=1`, as Megatron and Transformer Engine set
//! it): the CUDA variable is read when the process creates its context, so these checks run in a
//! child process of this harness with the variable set. In it, 4 ranks as threads:
//! - launches that symcomm does not order (`Stream::launch` of a kernel waiting for peers, two
//!   back to back per rank): whether they deadlock in the shared queue (the emulator's model says
//!   they do; a figure, not a pass condition: it says whether this GPU matches the model);
//! - the windows check (co-resident `comm.launch`, ordered among the ranks) and the lane
//!   turnover check (host collectives): they must pass, bit-exact.

use super::*;

/// Set in the child run: the device (`emu` or a CUDA ordinal) and the element count.
const CHILD: &str = "SYMCOMM_GPU_CHECK_ONE_QUEUE";
/// What the child prints before its JSON result.
const RESULT: &str = "ONE_QUEUE_RESULT ";

/// The check, run from the parent: spawns this executable with one hardware queue and reads
/// what the child found.
pub(crate) fn one_queue_check(device: symcomm::Device, count: usize) -> Outcome {
    let exe = std::env::current_exe().map_err(err)?;
    let dev = match device {
        symcomm::Device::Emu => "emu".to_owned(),
        symcomm::Device::Cuda(o) => o.to_string(),
        other => return Err(format!("no child run for {other:?}")),
    };
    let out = std::process::Command::new(exe)
        .env("CUDA_DEVICE_MAX_CONNECTIONS", "1")
        .env(CHILD, format!("{dev}:{count}"))
        .env_remove("SYMCOMM_GPU_CHECK_JSON")
        .output()
        .map_err(err)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Some(result) = stdout.lines().find_map(|l| l.strip_prefix(RESULT)) else {
        return Err(format!(
            "the child run printed no result (status {}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    };
    let v: Value = serde_json::from_str(result).map_err(err)?;
    let detail = v["detail"].as_str().unwrap_or("").to_owned();
    if v["pass"].as_bool() == Some(true) {
        Ok((detail, v["figures"].clone()))
    } else {
        Err(detail)
    }
}

/// In the child run (`CHILD` set): runs the checks and prints the result; `None` otherwise.
pub(crate) fn one_queue_child() -> Option<ExitCode> {
    let spec = std::env::var(CHILD).ok()?;
    let (dev, count) = spec.split_once(':')?;
    let device = match dev {
        "emu" => symcomm::Device::Emu,
        o => symcomm::Device::Cuda(o.parse().ok()?),
    };
    let count: usize = count.parse().ok()?;
    let unordered = unordered_launches(device);
    let windows = comm_windows_check(device, 4, count, 5);
    let lanes = comm_lanes_check(device, 4, count, 4);
    let pass = windows.is_ok() && lanes.is_ok();
    let line = |o: &Outcome| match o {
        Ok((d, _)) => format!("ok: {d}"),
        Err(d) => format!("FAILED: {d}"),
    };
    let deadlocked = match &unordered {
        Ok(n) if *n > 0 => format!("deadlocked ({n} of 4 ranks timed out, as the emulator models)"),
        Ok(_) => "completed (this GPU did not deadlock them: the model is stricter)".to_owned(),
        Err(e) => format!("could not run: {e}"),
    };
    let result = json!({
        "pass": pass,
        "detail": format!(
            "CUDA_DEVICE_MAX_CONNECTIONS=1, 4 ranks as threads: unordered launches {deadlocked}; \
             ordered launches {}; lane turnover {}",
            line(&windows),
            line(&lanes)
        ),
        "figures": {"unordered_timeouts": unordered.ok()},
    });
    println!("{RESULT}{result}");
    Some(if pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Two launches per rank of a one-shot all-reduce with `Stream::launch` (not ordered among the
/// ranks), queued by every rank before any starts: how many ranks time out (2 s deadline).
fn unordered_launches(device: symcomm::Device) -> Result<usize, String> {
    use symcomm::{KernelArgs, LaunchConfig};
    let options = symcomm::CommOptions::default().with_device_timeout(Duration::from_secs(2));
    let per_rank = support::try_with_ranks_on(device, 4, &options, |comm| {
        let count = 1000usize;
        let w = comm.alloc_window::<f32>(count).map_err(err)?;
        let stream = comm.create_stream().map_err(err)?;
        let kernel = comm
            .load_kernel(&DEVICE_IMAGE, "symcomm_collective_f32")
            .map_err(err)?;
        let raw = w.device_handle().raw();
        let args = KernelArgs::new()
            .arg(&comm.device_handle().map_err(err)?)
            .arg(&support::one_shot_sum_f32(raw, raw, count as u64));
        comm.barrier().map_err(err)?;
        for _ in 0..2 {
            // SAFETY: (DevComm, CollArgs) by value; the window outlives the launches (the
            // stream is synchronized below).
            unsafe { stream.launch(&kernel, LaunchConfig::linear(2, 64), &args) }.map_err(err)?;
        }
        let synced = stream.synchronize();
        Ok(synced
            .and(comm.check_error())
            .is_err_and(|e| e.is_timeout()))
    })?;
    Ok(per_rank.into_iter().filter(|&t| t).count())
}

//! Faults of the ping-pong ring: a missing rank times out, the abort flag stops a wait, a stale ABI
//! version is refused.

use super::*;

/// A fresh 3-rank team with only ranks 0 and 1 launched: rank 0 waits for the absent rank 2.
pub(crate) fn check_timeout(dev: &CudaDevice, module: &CudaModule) -> Outcome {
    let func = module.function(KERNEL).map_err(err)?;
    let streams = vec![
        dev.create_stream().map_err(err)?,
        dev.create_stream().map_err(err)?,
    ];
    let (team, results) = ping_pong_team(dev, 3, 64).map_err(err)?;
    let timeout = Duration::from_millis(200);
    let launch = Launch {
        func: &func,
        streams: &streams,
        results: &results,
        ranks: &[0, 1],
        rounds: 1,
        words: 16,
        threads: 32,
        timeout,
        abi_version: None,
    };
    let (res, took) = run(&team, &launch)?;
    if res[0][0] != SYMCOMM_STATUS_TIMEOUT || res[1][0] != SYMCOMM_STATUS_OK {
        return Err(format!(
            "statuses {:?}/{:?}, expected TIMEOUT for rank 0 and OK for rank 1",
            res[0], res[1]
        ));
    }
    let rec = team.error(0).map_err(err)?;
    if (rec.status, rec.rank, rec.peer, rec.op)
        != (SYMCOMM_STATUS_TIMEOUT, 0, 2, SYMCOMM_OP_SIGNAL_WAIT)
    {
        return Err(format!("rank 0's error record is {rec:?}"));
    }
    if took < timeout || took > timeout * 10 {
        return Err(format!(
            "returned after {took:?} with a {timeout:?} deadline"
        ));
    }
    Ok((
        format!(
            "rank 0 timed out waiting for rank 2 after {took:?} (deadline {timeout:?}); error record {rec:?}"
        ),
        json!({"deadline_s": timeout.as_secs_f64(), "wall_s": took.as_secs_f64()}),
    ))
}

/// Rank 0 alone, with the abort flag already raised and a long deadline: the wait stops at once.
pub(crate) fn check_abort(dev: &CudaDevice, module: &CudaModule) -> Outcome {
    let func = module.function(KERNEL).map_err(err)?;
    let streams = vec![dev.create_stream().map_err(err)?];
    let (team, results) = ping_pong_team(dev, 2, 64).map_err(err)?;
    team.abort.write(0, &[1u32]).map_err(err)?;
    let launch = Launch {
        func: &func,
        streams: &streams,
        results: &results,
        ranks: &[0],
        rounds: 1,
        words: 16,
        threads: 32,
        timeout: Duration::from_secs(20),
        abi_version: None,
    };
    let (res, took) = run(&team, &launch)?;
    let rec = team.error(0).map_err(err)?;
    if res[0][0] != SYMCOMM_STATUS_ABORTED || rec.status != SYMCOMM_STATUS_ABORTED {
        return Err(format!(
            "rank 0 result {:?}, error record {rec:?}; expected ABORTED",
            res[0]
        ));
    }
    if took > Duration::from_secs(2) {
        return Err(format!("the aborted wait took {took:?}"));
    }
    Ok((
        format!("rank 0 stopped by the abort flag after {took:?}"),
        json!({"wall_s": took.as_secs_f64()}),
    ))
}

pub(crate) fn check_abi_mismatch(dev: &CudaDevice, module: &CudaModule) -> Outcome {
    let func = module.function(KERNEL).map_err(err)?;
    let streams = vec![dev.create_stream().map_err(err)?];
    let (team, results) = ping_pong_team(dev, 1, 64).map_err(err)?;
    let launch = Launch {
        func: &func,
        streams: &streams,
        results: &results,
        ranks: &[0],
        rounds: 2,
        words: 4,
        threads: 2,
        timeout: Duration::from_secs(1),
        abi_version: Some(SYMCOMM_ABI_VERSION + 1),
    };
    let (res, _) = run(&team, &launch)?;
    if res[0] != [SYMCOMM_STATUS_ABI_MISMATCH, 0, 0] {
        return Err(format!(
            "result {:?}, expected [ABI_MISMATCH, 0, 0]",
            res[0]
        ));
    }
    Ok(("a stale ABI version is refused".into(), Value::Null))
}

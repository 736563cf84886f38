//! The errors kernels record in a rank's `ErrorRecord`, as typed host errors with the record's
//! operation and detail in words (the encodings are at each recording site in
//! `include/symcomm`).

use symcomm_device::abi::{ErrorRecord, SYMCOMM_ABI_VERSION};

use crate::Error;

/// Name of a `SYMCOMM_OP_*` code.
fn op_name(op: u32) -> &'static str {
    match op {
        symcomm_device::abi::SYMCOMM_OP_SIGNAL_WAIT => "signal_wait",
        symcomm_device::abi::SYMCOMM_OP_BARRIER => "barrier",
        symcomm_device::abi::SYMCOMM_OP_COLLECTIVE => "collective",
        symcomm_device::abi::SYMCOMM_OP_SIGNAL => "signal",
        symcomm_device::abi::SYMCOMM_OP_USER => "user kernel",
        symcomm_device::abi::SYMCOMM_OP_GRID_SYNC => "grid_sync",
        symcomm_device::abi::SYMCOMM_OP_PUT => "put_with_signal",
        symcomm_device::abi::SYMCOMM_OP_LL_WAIT => "ll_wait",
        symcomm_device::abi::SYMCOMM_OP_PROXY => "proxy",
        _ => "device operation",
    }
}

/// What a record's operation and detail word say, in words (the encodings are at each
/// recording site in include/symcomm: barrier.cuh, signal.cuh, grid.cuh, collectives.cuh), e.g.
/// "barrier index 130", "signal word 3 from peer 1", "user code 0x2a, value 7".
pub(crate) fn describe_record(rec: &ErrorRecord) -> String {
    use symcomm_device::abi as a;
    let (hi, lo) = ((rec.detail >> 32) as u32, rec.detail as u32);
    let invalid = rec.status == a::SYMCOMM_STATUS_INVALID_ARGUMENT;
    match rec.op {
        a::SYMCOMM_OP_BARRIER if invalid => format!(
            "barrier index {} (users' indices are [{}, {}))",
            rec.detail,
            a::SYMCOMM_USER_BARRIER_FIRST,
            a::SYMCOMM_USER_BARRIER_END
        ),
        a::SYMCOMM_OP_BARRIER if rec.status == a::SYMCOMM_STATUS_MISMATCH => format!(
            "barrier index {hi}: peer {} arrived with fingerprint {lo:#010x}, this rank with another",
            rec.peer
        ),
        a::SYMCOMM_OP_BARRIER => format!("barrier index {hi}"),
        a::SYMCOMM_OP_SIGNAL | a::SYMCOMM_OP_SIGNAL_WAIT if invalid => format!(
            "signal word {lo} {} peer {hi} (users' signal words are [0, {}), peers the team's ranks)",
            if rec.op == a::SYMCOMM_OP_SIGNAL {
                "to"
            } else {
                "from"
            },
            a::SYMCOMM_USER_SIGNAL_END
        ),
        a::SYMCOMM_OP_SIGNAL_WAIT => {
            format!("signal wait for peer {} (awaited {})", rec.peer, rec.detail)
        }
        a::SYMCOMM_OP_COLLECTIVE => format!("collective kind {}", rec.detail),
        a::SYMCOMM_OP_USER => format!("user code {hi:#x}, value {lo}"),
        a::SYMCOMM_OP_GRID_SYNC => format!("grid_sync generation {}", rec.detail),
        a::SYMCOMM_OP_LL_WAIT if rec.status == a::SYMCOMM_STATUS_MISMATCH => format!(
            "LL all-reduce on barrier index {hi}: peer {} sent fingerprint {lo:#010x}, this rank \
             called another collective",
            rec.peer
        ),
        a::SYMCOMM_OP_LL_WAIT => format!(
            "LL all-reduce on barrier index {hi}: line {lo} from peer {}",
            rec.peer
        ),
        a::SYMCOMM_OP_PROXY if invalid && hi == a::SYMCOMM_REFUSED_REMOTE => format!(
            "a signal to rank {lo} on another host: signal_add asked for the previous value, \
             which stays on that host (or no proxy runs here)"
        ),
        a::SYMCOMM_OP_PROXY if invalid => format!(
            "the proxy could not carry out an operation with rank {} (detail {:#x}: a \
             put_with_signal outside every window, or a message it cannot apply)",
            rec.peer, rec.detail
        ),
        a::SYMCOMM_OP_PROXY => format!(
            "operation with rank {} through the proxy (ticket {})",
            rec.peer, rec.detail
        ),
        op => format!("operation {op}, detail {:#x}", rec.detail),
    }
}

/// Words for an InvalidArgument record's detail: what refused (the collective kind, or the
/// put's peer) and why (`SYMCOMM_REFUSED_*` in bits 32..39).
fn refusal(rec: &ErrorRecord, describe: &str) -> String {
    use symcomm_device::abi as a;
    let (op, detail) = (rec.op, rec.detail);
    let low = detail as u32;
    let what = match op {
        a::SYMCOMM_OP_COLLECTIVE => match low {
            a::SYMCOMM_COLL_ALL_REDUCE_ONE_SHOT => "all_reduce (one-shot)".to_owned(),
            a::SYMCOMM_COLL_ALL_REDUCE_TWO_SHOT => "all_reduce (two-shot)".to_owned(),
            a::SYMCOMM_COLL_ALL_REDUCE_LL => "all_reduce (LL)".to_owned(),
            a::SYMCOMM_COLL_ALL_GATHER => "all_gather".to_owned(),
            a::SYMCOMM_COLL_ALL_GATHER_LL => "all_gather (LL)".to_owned(),
            a::SYMCOMM_COLL_REDUCE_SCATTER => "reduce_scatter".to_owned(),
            a::SYMCOMM_COLL_REDUCE_SCATTER_LL => "reduce_scatter (LL)".to_owned(),
            a::SYMCOMM_COLL_BROADCAST => "broadcast".to_owned(),
            a::SYMCOMM_COLL_BROADCAST_LL => "broadcast (LL)".to_owned(),
            a::SYMCOMM_COLL_REDUCE => "reduce".to_owned(),
            a::SYMCOMM_COLL_SCATTER => "scatter".to_owned(),
            a::SYMCOMM_COLL_ALL_TO_ALL => "all_to_all".to_owned(),
            k => format!("collective kind {k}"),
        },
        a::SYMCOMM_OP_PUT => format!("put_with_signal to rank {low}"),
        _ => {
            return format!(
                "a device-side precondition of {} failed: {describe}",
                op_name(op)
            );
        }
    };
    let why = match (detail >> 32) as u32 & 0xff {
        a::SYMCOMM_REFUSED_CODE => {
            "a kind, dtype, reduction or scope code is invalid or not the kernel's"
        }
        a::SYMCOMM_REFUSED_ROOT => "the root is not a rank",
        a::SYMCOMM_REFUSED_OVERLAP => "the input and output overlap without being in place",
        a::SYMCOMM_REFUSED_CTA_SIZE => {
            "in-place all_to_all needs at least as many threads per CTA as ranks"
        }
        a::SYMCOMM_REFUSED_SRC_RANGE => "the input range does not fit in its window",
        a::SYMCOMM_REFUSED_DST_RANGE => "the output range does not fit in its window",
        a::SYMCOMM_REFUSED_ELEM_SIZE => "the element size is not the window's",
        a::SYMCOMM_REFUSED_DTYPE => "the element type is not the window's",
        a::SYMCOMM_REFUSED_PEER => "a peer is not a rank of the window",
        a::SYMCOMM_REFUSED_LL => "the communicator has no LL area, or the barrier index is past it",
        a::SYMCOMM_REFUSED_REMOTE => {
            "the peer is on another host, which loads and stores cannot reach (signals and \
             put_with_signal go through the proxy; host collectives over UCX)"
        }
        a::SYMCOMM_REFUSED_SOURCE => {
            "the source of a put_with_signal to another host is not global memory (the proxy \
             reads it with a copy)"
        }
        _ => "a device-side precondition failed",
    };
    format!("{what} refused its arguments on the device: {why} (detail {detail:#x})")
}

/// The error a kernel recorded.
pub(crate) fn error_from_record(rec: &ErrorRecord) -> Error {
    use symcomm_device::abi as a;
    let op = op_name(rec.op);
    let detail = describe_record(rec);
    match rec.status {
        a::SYMCOMM_STATUS_TIMEOUT => Error::Timeout {
            rank: rec.rank,
            peer: rec.peer,
            op,
            detail,
        },
        a::SYMCOMM_STATUS_ABORTED => Error::Aborted {
            rank: rec.rank,
            peer: rec.peer,
            op,
            detail,
        },
        a::SYMCOMM_STATUS_MISMATCH => Error::Mismatch {
            rank: rec.rank,
            peer: rec.peer,
            what: format!("{op}: the peer's call fingerprint differs ({detail})"),
        },
        a::SYMCOMM_STATUS_ABI_MISMATCH => Error::Unsupported(format!(
            "rank {}: a kernel was built against another symcomm ABI version (host has {SYMCOMM_ABI_VERSION})",
            rec.rank
        )),
        a::SYMCOMM_STATUS_INVALID_ARGUMENT => {
            Error::InvalidArgument(format!("rank {}: {}", rec.rank, refusal(rec, &detail)))
        }
        s => Error::InvalidArgument(format!(
            "rank {}: a device-side precondition of {op} failed (status {s}: {detail})",
            rec.rank
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn device_records_become_typed_errors() {
        use symcomm_device::abi as a;
        let rec = |status| ErrorRecord {
            status,
            rank: 2,
            peer: 5,
            op: a::SYMCOMM_OP_BARRIER,
            detail: 9,
            time_ns: 1,
        };
        assert!(matches!(
            error_from_record(&rec(a::SYMCOMM_STATUS_TIMEOUT)),
            Error::Timeout {
                rank: 2,
                peer: 5,
                op: "barrier",
                ..
            }
        ));
        assert!(matches!(
            error_from_record(&rec(a::SYMCOMM_STATUS_ABORTED)),
            Error::Aborted {
                rank: 2,
                peer: 5,
                ..
            }
        ));
        assert!(matches!(
            error_from_record(&rec(a::SYMCOMM_STATUS_MISMATCH)),
            Error::Mismatch {
                rank: 2,
                peer: 5,
                ..
            }
        ));
        assert!(matches!(
            error_from_record(&rec(a::SYMCOMM_STATUS_ABI_MISMATCH)),
            Error::Unsupported(_)
        ));
        assert!(matches!(
            error_from_record(&rec(a::SYMCOMM_STATUS_INVALID_ARGUMENT)),
            Error::InvalidArgument(_)
        ));
        // A refused signal call (a signal word outside the users' range) names the operation.
        let refused = ErrorRecord {
            op: a::SYMCOMM_OP_SIGNAL,
            ..rec(a::SYMCOMM_STATUS_INVALID_ARGUMENT)
        };
        assert!(
            matches!(&error_from_record(&refused), Error::InvalidArgument(m) if m.contains("of signal")),
            "{}",
            error_from_record(&refused)
        );
    }

    #[test]
    fn device_records_are_decoded_into_words() {
        use symcomm_device::abi as a;
        let rec = |status, op, peer, detail| ErrorRecord {
            status,
            rank: 0,
            peer,
            op,
            detail,
            time_ns: 1,
        };
        let text = |r: ErrorRecord| error_from_record(&r).to_string();
        let cases = [
            (
                rec(
                    a::SYMCOMM_STATUS_TIMEOUT,
                    a::SYMCOMM_OP_BARRIER,
                    1,
                    130 << 32,
                ),
                "barrier index 130",
            ),
            (
                rec(
                    a::SYMCOMM_STATUS_ABORTED,
                    a::SYMCOMM_OP_BARRIER,
                    1,
                    131 << 32,
                ),
                "barrier index 131",
            ),
            (
                rec(
                    a::SYMCOMM_STATUS_MISMATCH,
                    a::SYMCOMM_OP_BARRIER,
                    1,
                    (130 << 32) | 0xdead_beef,
                ),
                "barrier index 130: peer 1 arrived with fingerprint 0xdeadbeef",
            ),
            (
                rec(
                    a::SYMCOMM_STATUS_INVALID_ARGUMENT,
                    a::SYMCOMM_OP_BARRIER,
                    0,
                    200,
                ),
                "barrier index 200 (users' indices are [128, 175))",
            ),
            (
                rec(
                    a::SYMCOMM_STATUS_INVALID_ARGUMENT,
                    a::SYMCOMM_OP_SIGNAL_WAIT,
                    0,
                    (1 << 32) | 70,
                ),
                "signal word 70 from peer 1",
            ),
            (
                rec(
                    a::SYMCOMM_STATUS_INVALID_ARGUMENT,
                    a::SYMCOMM_OP_SIGNAL,
                    0,
                    (2 << 32) | 3,
                ),
                "signal word 3 to peer 2",
            ),
            (
                rec(a::SYMCOMM_STATUS_TIMEOUT, a::SYMCOMM_OP_SIGNAL_WAIT, 1, 7),
                "signal wait for peer 1 (awaited 7)",
            ),
            (
                rec(
                    a::SYMCOMM_STATUS_MISMATCH,
                    a::SYMCOMM_OP_USER,
                    1,
                    (0x2a << 32) | 9,
                ),
                "user code 0x2a, value 9",
            ),
            (
                rec(a::SYMCOMM_STATUS_TIMEOUT, a::SYMCOMM_OP_GRID_SYNC, 0, 4),
                "grid_sync generation 4",
            ),
            (
                rec(
                    a::SYMCOMM_STATUS_INVALID_ARGUMENT,
                    a::SYMCOMM_OP_COLLECTIVE,
                    0,
                    3,
                ),
                "reduce_scatter refused its arguments",
            ),
            (
                rec(
                    a::SYMCOMM_STATUS_TIMEOUT,
                    a::SYMCOMM_OP_LL_WAIT,
                    2,
                    (5 << 32) | 17,
                ),
                "LL all-reduce on barrier index 5: line 17 from peer 2",
            ),
            (
                rec(
                    a::SYMCOMM_STATUS_INVALID_ARGUMENT,
                    a::SYMCOMM_OP_COLLECTIVE,
                    0,
                    (u64::from(a::SYMCOMM_REFUSED_LL) << 32)
                        | u64::from(a::SYMCOMM_COLL_ALL_REDUCE_LL),
                ),
                "all_reduce (LL) refused its arguments on the device: the communicator has no LL area",
            ),
        ];
        for (r, want) in cases {
            let got = text(r);
            assert!(got.contains(want), "{r:?}: {got:?} lacks {want:?}");
        }
        // The variant follows the status, for users' codes too.
        assert!(matches!(
            error_from_record(&rec(a::SYMCOMM_STATUS_MISMATCH, a::SYMCOMM_OP_USER, 1, 0)),
            Error::Mismatch { peer: 1, .. }
        ));
        assert!(matches!(
            error_from_record(&rec(
                a::SYMCOMM_STATUS_TIMEOUT,
                a::SYMCOMM_OP_GRID_SYNC,
                0,
                0
            )),
            Error::Timeout {
                op: "grid_sync",
                ..
            }
        ));
    }

    #[test]
    fn device_refusals_are_told_in_words() {
        use symcomm_device::abi as a;
        let msg = |op, detail| {
            let rec = ErrorRecord {
                status: a::SYMCOMM_STATUS_INVALID_ARGUMENT,
                rank: 1,
                peer: 1,
                op,
                detail,
                time_ns: 0,
            };
            error_from_record(&rec).to_string()
        };
        let m = msg(
            a::SYMCOMM_OP_COLLECTIVE,
            u64::from(a::SYMCOMM_REFUSED_DST_RANGE) << 32 | u64::from(a::SYMCOMM_COLL_ALL_GATHER),
        );
        assert!(
            m.contains("all_gather") && m.contains("output range does not fit"),
            "{m}"
        );
        let m = msg(
            a::SYMCOMM_OP_COLLECTIVE,
            u64::from(a::SYMCOMM_REFUSED_DTYPE) << 32 | u64::from(a::SYMCOMM_COLL_REDUCE),
        );
        assert!(m.contains("reduce") && m.contains("element type"), "{m}");
        let m = msg(
            a::SYMCOMM_OP_PUT,
            u64::from(a::SYMCOMM_REFUSED_PEER) << 32 | 7,
        );
        assert!(
            m.contains("put_with_signal to rank 7") && m.contains("not a rank"),
            "{m}"
        );
    }
}

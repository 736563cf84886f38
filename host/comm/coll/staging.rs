//! The staged path: buffers that are not windows of this communicator go through the lane's
//! staging windows, chunk by chunk, in stream order.

use symcomm_device::abi::{CollArgs, SYMCOMM_SCOPE_GRID};

use super::lanes::Lane;
use super::{Builtin, Call, layout};
use crate::comm::Communicator;
use crate::stream::{RetainFn, Stream};
use crate::tune::{self, Algorithm, Collective};
use crate::{Error, Result};

/// Default bytes of each staging window (`SYMCOMM_STAGING_BYTES`); a lane has two
/// (input and output).
pub const DEFAULT_STAGING_BYTES: u64 = 4 << 20;

impl Communicator {
    pub(super) fn staging_bytes(&self) -> Result<u64> {
        staging_bytes_from_env()
    }

    /// The staged path: chunks of at most what the staging windows hold, one launch each, in
    /// stream order. Where the model says so ([`tune::stages_in_kernel`]: always on CUDA) the
    /// kernel reads this rank's send buffer and writes its receive buffer itself
    /// (`CollArgs::src_ptr` / `dst_ptr`): it copies into the staging input only what peers read
    /// (nothing for LL, whose lines carry the data) and writes the result straight into the
    /// receive buffer (two-shot: its own share; the shares peers push arrive in the staging
    /// output and the same launch copies them out). Otherwise the stream copies each chunk into
    /// the staging input before the launch and out of the staging output after it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn staged(
        &self,
        call: &Call<'_>,
        lane: &Lane,
        algo: Algorithm,
        kind: u32,
        kernel: &Builtin,
        stream: &Stream,
        dev: &symcomm_device::abi::DevComm,
        retain: RetainFn<'_>,
    ) -> Result<()> {
        let n = u64::from(self.nranks);
        let size = call.dtype.size() as u64;
        let (sb, rb) = layout(call.coll, n);
        // Elements per rank block per chunk: the same on every rank.
        let cap = lane.stage_bytes / size / sb.max(rb);
        if cap == 0 {
            return Err(Error::InvalidArgument(format!(
                "SYMCOMM_STAGING_BYTES ({}) is too small for {} ranks of {}",
                lane.stage_bytes,
                n,
                call.dtype.name()
            )));
        }
        let (win_in, win_out) = (
            lane.stage_handle(&lane.stage_in, self.rank),
            lane.stage_handle(&lane.stage_out, self.rank),
        );
        // Whether this rank reads its send buffer and writes its receive buffer.
        let reads_send = !matches!(call.coll, Collective::Broadcast | Collective::Scatter)
            || self.rank == call.root;
        let writes_recv = call.coll != Collective::Reduce || self.rank == call.root;
        let stage_in = lane.stage_in.base() + u64::from(self.rank) * lane.stage_in.stride();
        let stage_out = lane.stage_out.base() + u64::from(self.rank) * lane.stage_out.stride();
        let mut off = 0;
        while off < call.count {
            let c = cap.min(call.count - off);
            // The kernel vectorizes the buffers' accesses where they share the staging windows'
            // 16-byte phase (0): every block of this chunk in both buffers.
            let aligned = ((call.send.addr + off * size)
                | (call.recv.addr + off * size)
                | (call.count * size * u64::from(sb.max(rb) > 1)))
                % 16
                == 0;
            let chunk_bytes = c * size * sb.max(rb);
            let in_kernel = tune::stages_in_kernel(chunk_bytes, size, aligned, self.backend.kind());
            if !in_kernel && reads_send {
                for j in 0..sb {
                    // SAFETY: validated: the send buffer holds sb * count elements; the staging
                    // input holds sb * cap >= sb * c elements of this rank; stream-ordered after
                    // the previous chunk's kernel, which no peer reads after it ended.
                    unsafe {
                        stream.copy_raw_retaining(
                            stage_in + j * c * size,
                            call.send.addr + (j * call.count + off) * size,
                            c * size,
                            retain,
                        )
                    }?;
                }
            }
            let args = CollArgs {
                kind,
                dtype: call.dtype.code(),
                redop: call.op.code(),
                root: call.root,
                scope: SYMCOMM_SCOPE_GRID,
                index: lane.first_barrier,
                count: c,
                src_offset: 0,
                dst_offset: 0,
                tile_stride: 0,
                src: win_in,
                dst: win_out,
                // In the kernel: it reads the send buffer and writes the receive buffer (block j
                // of this chunk at j * count + off), filling the staging input where peers read.
                src_ptr: if in_kernel && reads_send {
                    call.send.addr + off * size
                } else {
                    0
                },
                dst_ptr: if in_kernel && writes_recv {
                    call.recv.addr + off * size
                } else {
                    0
                },
                ptr_stride: call.count,
            };
            self.launch_coll(
                kernel,
                lane,
                stream,
                dev,
                &args,
                chunk_bytes,
                call.coll,
                algo,
                retain,
            )?;
            if !in_kernel && writes_recv {
                for j in 0..rb {
                    // SAFETY: as above, for the receive buffer (rb * count elements) and this
                    // rank's staging output, after the chunk's kernel in stream order.
                    unsafe {
                        stream.copy_raw_retaining(
                            call.recv.addr + (j * call.count + off) * size,
                            stage_out + j * c * size,
                            c * size,
                            retain,
                        )
                    }?;
                }
            }
            off += c;
        }
        Ok(())
    }
}

/// The staging bytes per lane: `SYMCOMM_STAGING_BYTES` (4096..=16 GiB) or the default (read now).
///
/// # Errors
/// As [`parse_staging_bytes`].
pub(in crate::comm) fn staging_bytes_from_env() -> Result<u64> {
    parse_staging_bytes(crate::config::raw_value("SYMCOMM_STAGING_BYTES").as_deref())
}

/// A `SYMCOMM_STAGING_BYTES` value (`None`: unset, the default).
///
/// # Errors
/// [`Error::InvalidArgument`] for a value outside 4096..=16 GiB or not a number.
pub(crate) fn parse_staging_bytes(value: Option<&str>) -> Result<u64> {
    match value {
        None => Ok(DEFAULT_STAGING_BYTES),
        Some(v) => v
            .parse::<u64>()
            .ok()
            .filter(|&b| (4096..=(1 << 34)).contains(&b))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "SYMCOMM_STAGING_BYTES={v}: expected a byte count from 4096 to 16 GiB"
                ))
            }),
    }
}

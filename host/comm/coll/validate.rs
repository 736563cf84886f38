//! The host-side checks of a call, made before anything is launched.

use symcomm_device::abi::SYMCOMM_DTYPE_NONE;

use super::{Call, DataType, layout};
use crate::comm::Communicator;
use crate::stream::Stream;
use crate::tune::Collective;
use crate::{Error, Result};

impl Communicator {
    /// Refuses a stream of another backend than the communicator's.
    pub(crate) fn check_backend(&self, stream: &Stream, what: &str) -> Result<()> {
        if stream.backend_kind() != self.backend.kind() {
            return Err(Error::InvalidArgument(format!(
                "{what}: the stream belongs to another backend than this communicator ({})",
                self.backend.name()
            )));
        }
        Ok(())
    }

    /// Host-side checks of one call; nothing is launched when they fail.
    pub(super) fn validate(&self, call: &Call<'_>, stream: &Stream) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(format!("{}: {m}", call.coll.name())));
        // Across hosts the collectives run in phases (comm/hosts.rs); windows do not exist there.
        self.check_backend(stream, "collectives")?;
        let n = u64::from(self.nranks);
        if call.coll.has_root() && call.root >= self.nranks {
            return bad(format!("root {} of {} ranks", call.root, self.nranks));
        }
        let size = call.dtype.size() as u64;
        let (sb, rb) = layout(call.coll, n);
        let need = |blocks: u64| {
            call.count
                .checked_mul(blocks)
                .and_then(|e| e.checked_mul(size))
        };
        let (Some(send_bytes), Some(recv_bytes)) = (need(sb), need(rb)) else {
            return bad(format!("count {} overflows", call.count));
        };
        let me = std::ptr::from_ref(self) as usize;
        for (what, b, need) in [
            ("send", &call.send, send_bytes),
            ("recv", &call.recv, recv_bytes),
        ] {
            if b.bytes < need {
                return bad(format!(
                    "the {what} buffer has {} bytes; {} elements of {} x {} blocks need {need}",
                    b.bytes,
                    call.count,
                    call.dtype.name(),
                    if what == "send" { sb } else { rb }
                ));
            }
            if b.addr % size != 0 || b.window.is_some_and(|(_, off, _)| off % size != 0) {
                return bad(format!(
                    "the {what} buffer (address {:#x}) is not aligned to {} bytes",
                    b.addr, size
                ));
            }
            if b.window.is_some_and(|(_, _, owner)| owner != me) {
                return bad(format!("the {what} window belongs to another communicator"));
            }
            // The device refuses these too (after the launch, as a sticky error): refuse here.
            if let Some((w, _, _)) = b.window {
                let size_ok = w.elem_size == 1 || u64::from(w.elem_size) == size;
                let type_ok = w.dtype == SYMCOMM_DTYPE_NONE || w.dtype == call.dtype.code();
                if !size_ok || !type_ok {
                    return bad(format!(
                        "the {what} window holds {} elements; a {} collective cannot use it \
                         (a window of u8 holds any type; of u16, i16 or a user type, any type of that size)",
                        DataType::ALL.get(w.dtype as usize).map_or_else(
                            || format!("{}-byte", w.elem_size),
                            |d| d.name().to_owned()
                        ),
                        call.dtype.name()
                    ));
                }
            }
            if b.addr == 0 && need > 0 {
                return bad(format!("the {what} buffer is null"));
            }
        }
        // Aliasing: only NCCL's in-place conventions may overlap.
        let (s0, s1) = (call.send.addr, call.send.addr + send_bytes);
        let (r0, r1) = (call.recv.addr, call.recv.addr + recv_bytes);
        if send_bytes > 0 && recv_bytes > 0 && s0 < r1 && r0 < s1 {
            let rank_off = u64::from(self.rank) * call.count * size;
            let in_place = match call.coll {
                Collective::AllGather => s0 == r0 + rank_off,
                Collective::ReduceScatter | Collective::Scatter => r0 == s0 + rank_off,
                _ => s0 == r0,
            };
            if !in_place {
                return bad(
                    "the send and recv buffers overlap without being in place (in place: the \
                     same memory; all_gather: send = recv + rank*count; reduce_scatter and \
                     scatter: recv = send + rank*count)"
                        .into(),
                );
            }
        }
        Ok(())
    }
}

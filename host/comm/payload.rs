//! The control plane's vocabulary: the tags of the host-side all-gathers ([`Tag`]: one per
//! collective step, ranks must agree on them) and the typed payloads the ranks contribute, encoded
//! with the bootstrap's codecs (`bootstrap/wire.rs`: big-endian integers, length-prefixed strings,
//! a bounds-checked [`Cursor`]).
//!
//! Every payload is either a value or an [`Outcome`]: the value, or the message of the error that
//! kept the rank from making it (`[1][value]` or `[0][message: u16 length, UTF-8]`, the message cut
//! to [`MAX_PEER_MESSAGE`] bytes on a character boundary). The other ranks report that message
//! in their [`Error::PeerFailed`](crate::Error::PeerFailed).
//!
//! Every decoder is a plain `fn(&[u8]) -> Result<T, FrameError>`: a truncated, overlong or
//! otherwise malformed contribution is a typed error, never a panic.

use std::fmt::Display;

use crate::bootstrap::wire::{Cursor, FrameError, MAX_GATHER, put_string};

/// The tags of the host-side all-gathers, one per collective step: every rank makes the same
/// steps in the same order, and a rank whose step has another tag than a peer's gets
/// [`Error::Mismatch`](crate::Error::Mismatch) instead of the peer's data. The numbers are the
/// wire encoding (grouped by phase: `0x1..` init, `0x2..` allocation, `0x3..` user calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Tag {
    /// Init: every rank opened its device (a status).
    Init = 0x100,
    /// Init: the local leader's socket name ([`encode_socket_name`]).
    Links = 0x101,
    /// Init: every local rank connected its fd-passing link (a status).
    LinksDone = 0x102,
    /// Init: every rank's device ([`DeviceDesc`]).
    Devices = 0x103,
    /// Init: every GPU reaches every other rank's GPU (a status).
    P2p = 0x104,
    /// Allocation: every rank's request ([`AllocRequest`]).
    Alloc = 0x200,
    /// Allocation: every rank created its copy (a status).
    Segment = 0x201,
    /// Allocation: every rank mapped every copy (a status), and, on CUDA, zeroed its own (a
    /// barrier).
    Mapped = 0x202,
    /// A stream's first collective: the lane every rank binds it to ([`LaneProposal`]).
    Lane = 0x203,
    /// [`Communicator::barrier`](crate::Communicator::barrier) (no payload).
    Barrier = 0x300,
    /// [`Communicator::split`](crate::Communicator::split): every rank's request
    /// ([`SplitRequest`]).
    Split = 0x301,
    /// The first collective across hosts: every rank started UCX (a status).
    Ucx = 0x302,
    /// The first collective across hosts: every rank's UCX worker address (raw bytes).
    UcxAddress = 0x303,
    /// The first collective across hosts: every rank's pipeline chunk bytes (a `u64`).
    HostsChunk = 0x304,
}

impl Tag {
    /// Every tag, for lookups by number.
    const ALL: [Tag; 14] = [
        Tag::Init,
        Tag::Links,
        Tag::LinksDone,
        Tag::Devices,
        Tag::P2p,
        Tag::Alloc,
        Tag::Segment,
        Tag::Mapped,
        Tag::Lane,
        Tag::Barrier,
        Tag::Split,
        Tag::Ucx,
        Tag::UcxAddress,
        Tag::HostsChunk,
    ];

    /// The wire number.
    pub(crate) fn code(self) -> u32 {
        self as u32
    }

    /// The tag numbered `code`, if any (for messages about a peer's tag).
    pub(crate) fn from_code(code: u32) -> Option<Tag> {
        Tag::ALL.into_iter().find(|t| t.code() == code)
    }
}

/// Longest error message one rank sends the others, in bytes: what fits in a gather
/// contribution behind the failure byte and the length.
pub(crate) const MAX_PEER_MESSAGE: usize = MAX_GATHER - 3;

/// Longest local socket name (an abstract Unix socket: `sun_path` less its leading NUL).
pub(crate) const MAX_SOCKET_NAME: usize = 107;

/// A rank's contribution to a step it may have failed: the value, or its error's message.
pub(crate) type Outcome<T> = std::result::Result<T, String>;

/// `[1]` + `body(value)`, or `[0]` + the error's message (its `Display`) (cut to [`MAX_PEER_MESSAGE`]).
fn put_outcome<T, E: Display>(
    out: &mut Vec<u8>,
    outcome: &Result<T, E>,
    body: impl FnOnce(&mut Vec<u8>, &T),
) {
    match outcome {
        Ok(v) => {
            out.push(1);
            body(out, v);
        }
        Err(e) => {
            out.push(0);
            put_string(out, &e.to_string(), MAX_PEER_MESSAGE);
        }
    }
}

/// The inverse of [`put_outcome`], then the end of the payload.
fn take_outcome<T>(
    payload: &[u8],
    body: impl FnOnce(&mut Cursor<'_>) -> Result<T, FrameError>,
) -> Result<Outcome<T>, FrameError> {
    let mut c = Cursor::new(payload);
    let outcome = match c.u8("outcome")? {
        1 => Ok(body(&mut c)?),
        0 => Err(c.string(MAX_PEER_MESSAGE, "peer error message")?),
        _ => return Err(FrameError::Malformed("outcome")),
    };
    c.end()?;
    Ok(outcome)
}

/// Whether a step succeeded on this rank (the value itself stays here).
pub(crate) fn encode_status<T, E: Display>(status: &Result<T, E>) -> Vec<u8> {
    let mut out = Vec::new();
    put_outcome(&mut out, status, |_, _| {});
    out
}

/// A peer's [`encode_status`].
pub(crate) fn decode_status(payload: &[u8]) -> Result<Outcome<()>, FrameError> {
    take_outcome(payload, |_| Ok(()))
}

/// The device a rank runs on ([`Tag::Devices`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceDesc {
    /// The emulator (every rank of a host shares emulated GPU 0).
    Emu,
    /// A CUDA GPU, by UUID (all zeros: the UUID could not be read).
    Cuda([u8; 16]),
}

/// `[0]` (emulator) or `[1][uuid: 16 bytes]`.
pub(crate) fn encode_device(device: &DeviceDesc) -> Vec<u8> {
    match device {
        DeviceDesc::Emu => vec![0],
        DeviceDesc::Cuda(uuid) => {
            let mut out = vec![1];
            out.extend_from_slice(uuid);
            out
        }
    }
}

/// A peer's [`encode_device`].
pub(crate) fn decode_device(payload: &[u8]) -> Result<DeviceDesc, FrameError> {
    let mut c = Cursor::new(payload);
    let device = match c.u8("device kind")? {
        0 => DeviceDesc::Emu,
        1 => DeviceDesc::Cuda(c.array("GPU UUID")?),
        _ => return Err(FrameError::Malformed("device kind")),
    };
    c.end()?;
    Ok(device)
}

/// The local leader's socket name, or why it could not listen; the other ranks of the team send
/// an empty name ([`Tag::Links`]).
pub(crate) fn encode_socket_name<E: Display>(name: &Result<Vec<u8>, E>) -> Vec<u8> {
    let mut out = Vec::new();
    put_outcome(&mut out, name, |out, name| {
        let len = name.len().min(MAX_SOCKET_NAME);
        out.extend_from_slice(&(len as u16).to_be_bytes());
        out.extend_from_slice(&name[..len]);
    });
    out
}

/// A peer's [`encode_socket_name`].
pub(crate) fn decode_socket_name(payload: &[u8]) -> Result<Outcome<Vec<u8>>, FrameError> {
    take_outcome(payload, |c| {
        let len = c.u16("socket name length")? as usize;
        if len > MAX_SOCKET_NAME {
            return Err(FrameError::Malformed("socket name length"));
        }
        Ok(c.take(len, "socket name")?.to_vec())
    })
}

/// A rank's window allocation request ([`Tag::Alloc`]): every rank asks for the same size and
/// element size; the stride is a multiple of the largest granularity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AllocRequest {
    /// Bytes per rank.
    pub(crate) bytes: u64,
    /// Bytes per element.
    pub(crate) elem: u32,
    /// This rank's allocation granularity.
    pub(crate) granularity: u64,
}

/// `[1][bytes u64][elem u32][granularity u64]`, or the failure.
pub(crate) fn encode_alloc_request<E: Display>(request: &Result<AllocRequest, E>) -> Vec<u8> {
    let mut out = Vec::with_capacity(21);
    put_outcome(&mut out, request, |out, r| {
        out.extend_from_slice(&r.bytes.to_be_bytes());
        out.extend_from_slice(&r.elem.to_be_bytes());
        out.extend_from_slice(&r.granularity.to_be_bytes());
    });
    out
}

/// A peer's [`encode_alloc_request`].
pub(crate) fn decode_alloc_request(payload: &[u8]) -> Result<Outcome<AllocRequest>, FrameError> {
    take_outcome(payload, |c| {
        Ok(AllocRequest {
            bytes: c.u64("window bytes")?,
            elem: c.u32("element size")?,
            granularity: c.u64("allocation granularity")?,
        })
    })
}

/// A rank's part of a split ([`Tag::Split`]): its color (`None`: it joins no new
/// communicator), its key, and the port its id reserved (it may become the new root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SplitRequest {
    pub(crate) color: Option<u32>,
    pub(crate) key: i32,
    pub(crate) port: u16,
}

/// `[1][has color u8][color u32][key i32][port u16]`, or the failure.
pub(crate) fn encode_split_request<E: Display>(request: &Result<SplitRequest, E>) -> Vec<u8> {
    let mut out = Vec::with_capacity(13);
    put_outcome(&mut out, request, |out, r| {
        out.push(u8::from(r.color.is_some()));
        out.extend_from_slice(&r.color.unwrap_or(0).to_be_bytes());
        out.extend_from_slice(&r.key.to_be_bytes());
        out.extend_from_slice(&r.port.to_be_bytes());
    });
    out
}

/// A peer's [`encode_split_request`].
pub(crate) fn decode_split_request(payload: &[u8]) -> Result<Outcome<SplitRequest>, FrameError> {
    take_outcome(payload, |c| {
        // One encoding per request: the flag is 0 or 1, and no color is encoded as 0.
        let color = match (c.u8("split color flag")?, c.u32("split color")?) {
            (0, 0) => None,
            (1, color) => Some(color),
            _ => return Err(FrameError::Malformed("split color")),
        };
        Ok(SplitRequest {
            color,
            key: c.u32("split key")? as i32,
            port: c.u16("split port")?,
        })
    })
}

/// The lane a rank binds a new stream to ([`Tag::Lane`]): a free lane to reuse, or a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LaneProposal {
    /// The lane's index.
    pub(crate) index: u32,
    /// Whether the lane is new (its staging windows are allocated next).
    pub(crate) new: bool,
}

/// `[1][index u32][new u8]`, or the failure.
pub(crate) fn encode_lane_proposal<E: Display>(proposal: &Result<LaneProposal, E>) -> Vec<u8> {
    let mut out = Vec::with_capacity(6);
    put_outcome(&mut out, proposal, |out, p| {
        out.extend_from_slice(&p.index.to_be_bytes());
        out.push(u8::from(p.new));
    });
    out
}

/// A peer's [`encode_lane_proposal`].
pub(crate) fn decode_lane_proposal(payload: &[u8]) -> Result<Outcome<LaneProposal>, FrameError> {
    take_outcome(payload, |c| {
        let index = c.u32("lane index")?;
        let new = match c.u8("new lane")? {
            0 => false,
            1 => true,
            _ => return Err(FrameError::Malformed("new lane")),
        };
        Ok(LaneProposal { index, new })
    })
}

/// A rank's pipeline chunk size across hosts ([`Tag::HostsChunk`]): `[bytes u64]`.
pub(crate) fn encode_chunk_bytes(bytes: u64) -> Vec<u8> {
    bytes.to_be_bytes().to_vec()
}

/// A peer's [`encode_chunk_bytes`].
pub(crate) fn decode_chunk_bytes(payload: &[u8]) -> Result<u64, FrameError> {
    let mut c = Cursor::new(payload);
    let bytes = c.u64("chunk bytes")?;
    c.end()?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::Error;

    /// `decode(encode(x)) == x`; every strict prefix and every one-byte extension is refused
    /// with a typed error.
    fn round_trip<T: PartialEq + std::fmt::Debug>(
        encoded: &[u8],
        decode: fn(&[u8]) -> Result<T, FrameError>,
        want: &T,
    ) {
        assert_eq!(&decode(encoded).unwrap(), want, "{encoded:?}");
        for cut in 0..encoded.len() {
            assert!(
                matches!(decode(&encoded[..cut]), Err(FrameError::Malformed(_))),
                "{want:?} cut at {cut} decodes"
            );
        }
        for extra in [0u8, 1, 0xff] {
            let mut longer = encoded.to_vec();
            longer.push(extra);
            assert!(
                matches!(decode(&longer), Err(FrameError::Malformed(_))),
                "{want:?} with a trailing {extra:#x} decodes"
            );
        }
    }

    fn failure<T>(message: &str) -> crate::Result<T> {
        Err(Error::InvalidArgument(message.to_owned()))
    }

    #[test]
    fn tags_keep_their_numbers_and_are_found_by_them() {
        let numbers: Vec<u32> = Tag::ALL.iter().map(|t| t.code()).collect();
        assert_eq!(
            numbers,
            [
                0x100, 0x101, 0x102, 0x103, 0x104, 0x200, 0x201, 0x202, 0x203, 0x300, 0x301, 0x302,
                0x303, 0x304
            ]
        );
        for t in Tag::ALL {
            assert_eq!(Tag::from_code(t.code()), Some(t));
        }
        assert_eq!(Tag::from_code(0x105), None);
    }

    #[test]
    fn statuses_round_trip() {
        round_trip(&encode_status(&Ok::<_, Error>(7u8)), decode_status, &Ok(()));
        round_trip(
            &encode_status(&failure::<()>("no GPU")),
            decode_status,
            &Err("invalid argument: no GPU".to_owned()),
        );
        round_trip(
            &encode_status(&failure::<()>("")),
            decode_status,
            &Err("invalid argument: ".to_owned()),
        );
        assert!(matches!(
            decode_status(&[2]),
            Err(FrameError::Malformed("outcome"))
        ));
        // A message that is not UTF-8.
        assert!(decode_status(&[0, 0, 2, 0xc3, 0x28]).is_err());
        // A length beyond the limit, with the bytes behind it.
        let mut long = vec![0];
        long.extend_from_slice(&((MAX_PEER_MESSAGE + 1) as u16).to_be_bytes());
        long.extend_from_slice(&vec![b'x'; MAX_PEER_MESSAGE + 1]);
        assert!(decode_status(&long).is_err());
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary_to_fit_a_gather() {
        // 'é' is two bytes: the limit falls inside one of them.
        let text = "é".repeat(MAX_GATHER);
        let encoded = encode_status(&failure::<()>(&text));
        assert!(encoded.len() <= MAX_GATHER, "{}", encoded.len());
        let message = decode_status(&encoded).unwrap().unwrap_err();
        assert!(message.len() <= MAX_PEER_MESSAGE);
        assert!(message.starts_with("invalid argument: éé"), "{message}");
        assert!(MAX_PEER_MESSAGE - message.len() < 2);
    }

    #[test]
    fn chunk_sizes_round_trip() {
        for bytes in [1, 4 << 20, u64::MAX] {
            round_trip(&encode_chunk_bytes(bytes), decode_chunk_bytes, &bytes);
        }
    }

    #[test]
    fn devices_round_trip() {
        round_trip(
            &encode_device(&DeviceDesc::Emu),
            decode_device,
            &DeviceDesc::Emu,
        );
        let gpu = DeviceDesc::Cuda(*b"0123456789abcdef");
        round_trip(&encode_device(&gpu), decode_device, &gpu);
        let unknown = DeviceDesc::Cuda([0; 16]);
        round_trip(&encode_device(&unknown), decode_device, &unknown);
        assert!(decode_device(&[2; 17]).is_err());
    }

    #[test]
    fn socket_names_round_trip() {
        for name in [
            Vec::new(),
            b"symcomm/0123".to_vec(),
            vec![7; MAX_SOCKET_NAME],
        ] {
            round_trip(
                &encode_socket_name(&Ok::<_, Error>(name.clone())),
                decode_socket_name,
                &Ok(name),
            );
        }
        round_trip(
            &encode_socket_name(&failure("bind")),
            decode_socket_name,
            &Err("invalid argument: bind".to_owned()),
        );
        let mut long = vec![1];
        long.extend_from_slice(&((MAX_SOCKET_NAME + 1) as u16).to_be_bytes());
        long.extend_from_slice(&[b'a'; MAX_SOCKET_NAME + 1]);
        assert!(matches!(
            decode_socket_name(&long),
            Err(FrameError::Malformed("socket name length"))
        ));
    }

    #[test]
    fn alloc_requests_round_trip() {
        for request in [
            AllocRequest {
                bytes: 1,
                elem: 1,
                granularity: 2 << 20,
            },
            AllocRequest {
                bytes: u64::MAX,
                elem: u32::MAX,
                granularity: u64::MAX,
            },
        ] {
            round_trip(
                &encode_alloc_request(&Ok::<_, Error>(request)),
                decode_alloc_request,
                &Ok(request),
            );
        }
        round_trip(
            &encode_alloc_request(&failure("count 0")),
            decode_alloc_request,
            &Err("invalid argument: count 0".to_owned()),
        );
    }

    #[test]
    fn split_requests_round_trip() {
        for request in [
            SplitRequest {
                color: Some(7),
                key: -3,
                port: 41237,
            },
            SplitRequest {
                color: None,
                key: i32::MAX,
                port: 0,
            },
        ] {
            round_trip(
                &encode_split_request(&Ok::<_, Error>(request)),
                decode_split_request,
                &Ok(request),
            );
        }
        // Found by the control fuzz target: a flag byte other than 0 / 1 (or a color without
        // its flag) decoded, and re-encoded to different bytes.
        for bytes in [
            [
                1u8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00,
            ],
            [1, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 1],
        ] {
            assert!(decode_split_request(&bytes).is_err(), "{bytes:?} decoded");
        }
        round_trip(
            &encode_split_request(&failure("no port")),
            decode_split_request,
            &Err("invalid argument: no port".to_owned()),
        );
    }

    #[test]
    fn lane_proposals_round_trip() {
        for proposal in [
            LaneProposal {
                index: 0,
                new: true,
            },
            LaneProposal {
                index: u32::MAX,
                new: false,
            },
        ] {
            round_trip(
                &encode_lane_proposal(&Ok::<_, Error>(proposal)),
                decode_lane_proposal,
                &Ok(proposal),
            );
        }
        round_trip(
            &encode_lane_proposal(&failure("capturing")),
            decode_lane_proposal,
            &Err("invalid argument: capturing".to_owned()),
        );
        assert!(matches!(
            decode_lane_proposal(&[1, 0, 0, 0, 1, 2]),
            Err(FrameError::Malformed("new lane"))
        ));
    }

    #[test]
    fn decoders_refuse_arbitrary_bytes_without_panicking() {
        // Every input of up to two bytes, and longer runs of each byte value.
        let mut inputs: Vec<Vec<u8>> = vec![Vec::new()];
        for a in 0..=255u8 {
            inputs.push(vec![a]);
            for b in [0u8, 1, 2, 0x7f, 0xff] {
                inputs.push(vec![a, b]);
            }
            inputs.push(vec![a; 40]);
            inputs.push(vec![a; MAX_GATHER + 1]);
        }
        for input in &inputs {
            let _ = decode_status(input);
            let _ = decode_device(input);
            let _ = decode_socket_name(input);
            let _ = decode_alloc_request(input);
            let _ = decode_lane_proposal(input);
        }
    }
}

//! The bootstrap wire format as plain values, for the fuzz targets (`fuzz/`) and the property
//! tests (`tests/wire_props.rs`): every frame type's encoder and decoder, through the same code
//! the root and the ranks run (`bootstrap::wire`).

use std::net::IpAddr;

use crate::bootstrap::wire::{
    self, Abort, AbortCode, Auth, Challenge, Claims, Contribution, Farewell, FrameError, FrameType,
    HEADER_LEN, Hello, LostReason,
};
use crate::bootstrap::{PROTOCOL_VERSION, RankInfo};

/// Bytes of a nonce (hello, challenge).
pub const NONCE_LEN: usize = wire::NONCE_LEN;
/// Bytes of a MAC (auth, welcome, table).
pub const MAC_LEN: usize = wire::MAC_LEN;
/// Longest host identity, in bytes.
pub const MAX_HOST_ID: usize = wire::MAX_HOST_ID;
/// Longest abort message, in bytes.
pub const MAX_MESSAGE: usize = wire::MAX_MESSAGE;
/// Largest contribution to a host all-gather, in bytes.
pub const MAX_GATHER: usize = wire::MAX_GATHER;

/// One bootstrap frame. Codes (abort code, lost reason, farewell) are their wire bytes, so that
/// a generator can produce invalid ones too.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Message {
    Hello {
        version: u32,
        nonce: [u8; NONCE_LEN],
    },
    Challenge {
        version: u32,
        nonce: [u8; NONCE_LEN],
    },
    Auth {
        rank: u32,
        nranks: u32,
        pid: u32,
        addr: IpAddr,
        host_id: String,
        mac: [u8; MAC_LEN],
    },
    Welcome {
        mac: [u8; MAC_LEN],
    },
    Abort {
        code: u8,
        value: u32,
        missing: Vec<u32>,
        message: String,
    },
    Table {
        entries: Vec<RankInfo>,
        mac: [u8; MAC_LEN],
    },
    Heartbeat,
    Gather {
        seq: u64,
        tag: u32,
        data: Vec<u8>,
    },
    Gathered {
        seq: u64,
        all: Vec<(u32, Vec<u8>)>,
    },
    PeerLost {
        rank: u32,
        reason: u8,
    },
    Goodbye {
        farewell: u8,
        calls: u64,
        gathers: u64,
    },
    Departed {
        rank: u32,
        calls: u64,
        gathers: u64,
    },
}

fn contribution((tag, data): &(u32, Vec<u8>)) -> Contribution {
    Contribution {
        tag: *tag,
        data: data.clone(),
    }
}

impl Message {
    /// The whole frame (header and payload) as the sender writes it; `None` for a code that is
    /// not a valid wire code (the encoders take typed codes).
    pub fn encode(&self) -> Option<Vec<u8>> {
        Some(match self {
            Message::Hello { version, nonce } => Hello {
                version: *version,
                nonce: *nonce,
            }
            .encode(),
            Message::Challenge { version, nonce } => Challenge {
                version: *version,
                nonce: *nonce,
            }
            .encode(),
            Message::Auth {
                rank,
                nranks,
                pid,
                addr,
                host_id,
                mac,
            } => Auth {
                claims: Claims {
                    rank: *rank,
                    nranks: *nranks,
                    pid: *pid,
                    addr: *addr,
                    host_id: host_id.clone(),
                },
                mac: *mac,
            }
            .encode(),
            Message::Welcome { mac } => wire::encode_welcome(mac),
            Message::Abort {
                code,
                value,
                missing,
                message,
            } => Abort {
                code: AbortCode::from_u8(*code)?,
                value: *value,
                missing: missing.clone(),
                message: message.clone(),
            }
            .encode(),
            Message::Table { entries, mac } => {
                wire::encode_table(&wire::encode_table_body(entries), mac)
            }
            Message::Heartbeat => wire::encode_empty(FrameType::Heartbeat),
            Message::Gather { seq, tag, data } => wire::encode_gather(
                *seq,
                &Contribution {
                    tag: *tag,
                    data: data.clone(),
                },
            ),
            Message::Gathered { seq, all } => {
                let all: Vec<Contribution> = all.iter().map(contribution).collect();
                wire::encode_gathered(*seq, &all)
            }
            Message::PeerLost { rank, reason } => {
                wire::encode_peer_lost(*rank, LostReason::from_u8(*reason)?)
            }
            Message::Goodbye {
                farewell: how,
                calls,
                gathers,
            } => wire::encode_goodbye(Farewell::from_u8(*how)?, *calls, *gathers),
            Message::Departed {
                rank,
                calls,
                gathers,
            } => wire::encode_departed(*rank, *calls, *gathers),
        })
    }

    /// Whether decoding this message's frame gives back its exact bytes. Not so only for a
    /// hello or challenge of another protocol version: the receiver reads their version and
    /// ignores the rest (so that a newer peer gets a version error, not a parse error).
    pub fn bytes_round_trip(&self) -> bool {
        !matches!(self, Message::Hello { version, .. } | Message::Challenge { version, .. }
            if *version != PROTOCOL_VERSION)
    }
}

/// Decodes the first frame of `bytes` as a rank of an `nranks`-rank job would: the header is
/// checked against every frame type and its length limit first (as `read_frame` does, before
/// anything is allocated), then the payload by its type. Returns the message and the bytes it
/// took, or the error's text.
///
/// # Errors
/// A header or payload the receiver refuses, or fewer bytes than the frame announces.
pub fn decode(bytes: &[u8], nranks: u32) -> Result<(Message, usize), String> {
    const ALL: [FrameType; 12] = [
        FrameType::Hello,
        FrameType::Challenge,
        FrameType::Auth,
        FrameType::Welcome,
        FrameType::Abort,
        FrameType::Table,
        FrameType::Heartbeat,
        FrameType::Gather,
        FrameType::Gathered,
        FrameType::PeerLost,
        FrameType::Goodbye,
        FrameType::Departed,
    ];
    let header: [u8; HEADER_LEN] = bytes
        .get(..HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| FrameError::Eof.to_string())?;
    let (kind, len) = wire::decode_header(header, &ALL, nranks).map_err(|e| e.to_string())?;
    let end = HEADER_LEN + len as usize;
    let payload = bytes
        .get(HEADER_LEN..end)
        .ok_or_else(|| FrameError::Truncated.to_string())?;
    decode_payload(kind, payload, nranks)
        .map(|m| (m, end))
        .map_err(|e| e.to_string())
}

/// Every frame of `bytes` in turn, up to the first that does not decode (its error last).
pub fn decode_stream(mut bytes: &[u8], nranks: u32) -> Vec<Result<Message, String>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        match decode(bytes, nranks) {
            Ok((m, used)) => {
                out.push(Ok(m));
                bytes = &bytes[used..];
            }
            Err(e) => {
                out.push(Err(e));
                break;
            }
        }
    }
    out
}

fn decode_payload(kind: FrameType, p: &[u8], nranks: u32) -> Result<Message, FrameError> {
    Ok(match kind {
        FrameType::Hello => {
            let h = Hello::decode(p, PROTOCOL_VERSION)?;
            Message::Hello {
                version: h.version,
                nonce: h.nonce,
            }
        }
        FrameType::Challenge => {
            let c = Challenge::decode(p, PROTOCOL_VERSION)?;
            Message::Challenge {
                version: c.version,
                nonce: c.nonce,
            }
        }
        FrameType::Auth => {
            let (a, _) = Auth::decode(p)?;
            Message::Auth {
                rank: a.claims.rank,
                nranks: a.claims.nranks,
                pid: a.claims.pid,
                addr: a.claims.addr,
                host_id: a.claims.host_id,
                mac: a.mac,
            }
        }
        FrameType::Welcome => Message::Welcome {
            mac: wire::decode_welcome(p)?,
        },
        FrameType::Abort => {
            let a = Abort::decode(p)?;
            Message::Abort {
                code: a.code as u8,
                value: a.value,
                missing: a.missing,
                message: a.message,
            }
        }
        FrameType::Table => {
            let (entries, _, mac) = wire::decode_table(p)?;
            Message::Table { entries, mac }
        }
        // Its length limit is 0: the header check refused any payload.
        FrameType::Heartbeat => Message::Heartbeat,
        FrameType::Gather => {
            let (seq, c) = wire::decode_gather(p)?;
            Message::Gather {
                seq,
                tag: c.tag,
                data: c.data,
            }
        }
        FrameType::Gathered => {
            let (seq, all) = wire::decode_gathered(p, nranks)?;
            Message::Gathered {
                seq,
                all: all.into_iter().map(|c| (c.tag, c.data)).collect(),
            }
        }
        FrameType::PeerLost => {
            let (rank, why) = wire::decode_peer_lost(p)?;
            Message::PeerLost {
                rank,
                reason: why as u8,
            }
        }
        FrameType::Goodbye => {
            let (how, calls, gathers) = wire::decode_goodbye(p)?;
            Message::Goodbye {
                farewell: how as u8,
                calls,
                gathers,
            }
        }
        FrameType::Departed => {
            let (rank, calls, gathers) = wire::decode_departed(p)?;
            Message::Departed {
                rank,
                calls,
                gathers,
            }
        }
    })
}

/// The control-plane steps' tag numbers (`comm::payload::Tag`) whose contributions have a
/// decoder: every tag but the barrier's, which carries no payload.
pub const CONTROL_TAGS: [u32; 13] = [
    0x100, 0x101, 0x102, 0x103, 0x104, 0x200, 0x201, 0x202, 0x203, 0x301, 0x302, 0x303, 0x304,
];

/// Decodes `data` as a rank's contribution to the control-plane step numbered `tag` (the data
/// of a Gather frame) with that step's decoder, and encodes what it decoded again: the bytes a
/// rank would send for it. `None` for a number no step with a payload uses.
///
/// # Errors
/// The decoder's refusal, as text.
pub fn control_round_trip(tag: u32, data: &[u8]) -> Option<Result<Vec<u8>, String>> {
    use crate::comm::payload::{self as p, Tag};
    let text = |e: FrameError| e.to_string();
    Some(match Tag::from_code(tag)? {
        Tag::Init | Tag::LinksDone | Tag::P2p | Tag::Segment | Tag::Mapped | Tag::Ucx => {
            p::decode_status(data)
                .map(|s| p::encode_status(&s))
                .map_err(text)
        }
        Tag::Links => p::decode_socket_name(data)
            .map(|n| p::encode_socket_name(&n))
            .map_err(text),
        Tag::Devices => p::decode_device(data)
            .map(|d| p::encode_device(&d))
            .map_err(text),
        Tag::Alloc => p::decode_alloc_request(data)
            .map(|r| p::encode_alloc_request(&r))
            .map_err(text),
        Tag::Lane => p::decode_lane_proposal(data)
            .map(|l| p::encode_lane_proposal(&l))
            .map_err(text),
        Tag::Split => p::decode_split_request(data)
            .map(|r| p::encode_split_request(&r))
            .map_err(text),
        Tag::UcxAddress => Ok(data.to_vec()),
        Tag::HostsChunk => p::decode_chunk_bytes(data)
            .map(p::encode_chunk_bytes)
            .map_err(text),
        Tag::Barrier => return None,
    })
}

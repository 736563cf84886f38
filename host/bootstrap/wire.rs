//! Bootstrap frames: typed, length-prefixed, bounded, read and written against deadlines.
//!
//! A frame is `[type: u8][length: u32 big-endian][payload: length bytes]`. The reader checks the
//! type against the types it expects and the length against that type's maximum *before*
//! allocating, so a stray `GET / HTTP/1.1` (type `G`), random bytes or a 4 GiB length prefix cost
//! five bytes of reading and nothing else. Payloads are fixed-layout binary (big-endian integers,
//! length-prefixed strings); nothing self-describing travels.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpStream};
use std::time::{Duration, Instant};

use super::RankInfo;
pub(crate) use super::auth::{MAC_LEN, NONCE_LEN};
use super::auth::{Mac, Nonce};

/// Bytes of a frame header: type + length.
pub(crate) const HEADER_LEN: usize = 5;
/// First four payload bytes of every hello, whatever the version.
pub(crate) const MAGIC: [u8; 4] = *b"SYMC";
/// Longest host identity, in bytes.
pub(crate) const MAX_HOST_ID: usize = 255;
/// Longest human-readable message in an abort frame, in bytes.
pub(crate) const MAX_MESSAGE: usize = 1024;
/// Largest contribution of one rank to a host-side all-gather, in bytes.
pub(crate) const MAX_GATHER: usize = 1024;
/// Encoded size of an address: family byte + 16 address bytes.
const ADDR_LEN: usize = 17;
/// Largest encoded table entry: rank, pid, address, host-id length and bytes.
const MAX_ENTRY: usize = 4 + 4 + ADDR_LEN + 2 + MAX_HOST_ID;

/// Frame types. The numbers are the wire encoding and never change meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum FrameType {
    /// Client → root: magic, protocol version, client nonce.
    Hello = 1,
    /// Root → client: protocol version, root nonce.
    Challenge = 2,
    /// Client → root: claims (rank, nranks, pid, address, host id) and the client's MAC.
    Auth = 3,
    /// Root → client: the root's MAC (mutual authentication).
    Welcome = 4,
    /// Root → client: the rendezvous is refused or stopped, with a code and a message.
    Abort = 5,
    /// Root → client: the rank table, MACed.
    Table = 6,
    /// Either way, after the rendezvous: I am alive (no payload).
    Heartbeat = 7,
    /// Rank → root, after the rendezvous: one rank's contribution to a host-side all-gather.
    Gather = 8,
    /// Root → rank: every rank's contribution to an all-gather.
    Gathered = 9,
    /// Root → rank: a rank was lost (its connection closed without a goodbye, or it missed its
    /// heartbeats).
    PeerLost = 10,
    /// Either way: the sender destroyed or aborted its communicator and closes the link on
    /// purpose ([`Farewell`], and how many collective calls and host all-gathers it made).
    Goodbye = 11,
    /// Root → rank: another rank destroyed its communicator after this many collective calls
    /// and host all-gathers.
    Departed = 12,
}

impl FrameType {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => FrameType::Hello,
            2 => FrameType::Challenge,
            3 => FrameType::Auth,
            4 => FrameType::Welcome,
            5 => FrameType::Abort,
            6 => FrameType::Table,
            7 => FrameType::Heartbeat,
            8 => FrameType::Gather,
            9 => FrameType::Gathered,
            10 => FrameType::PeerLost,
            11 => FrameType::Goodbye,
            12 => FrameType::Departed,
            _ => return None,
        })
    }

    /// Largest payload of this type a peer of `nranks` ranks may send.
    pub(crate) fn max_len(self, nranks: u32) -> u32 {
        let n = nranks as usize;
        let max = match self {
            // Room for later versions' hellos, so that a newer client gets a version error
            // instead of a length error.
            FrameType::Hello | FrameType::Challenge => 256,
            FrameType::Auth => 512,
            FrameType::Welcome => 64,
            FrameType::Abort => 1 + 4 + 4 + 4 * n + 2 + MAX_MESSAGE,
            FrameType::Table => 4 + n * MAX_ENTRY + MAC_LEN,
            FrameType::Heartbeat => 0,
            FrameType::Goodbye => 1 + 8 + 8,
            FrameType::Departed => 4 + 8 + 8,
            FrameType::Gather => 8 + 4 + 2 + MAX_GATHER,
            FrameType::Gathered => 8 + 4 + n * (4 + 2 + MAX_GATHER),
            FrameType::PeerLost => 4 + 1,
        };
        u32::try_from(max).unwrap_or(u32::MAX)
    }
}

/// Why reading a frame failed.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The peer closed the connection before sending a byte of this frame.
    Eof,
    /// The peer closed the connection in the middle of a frame.
    Truncated,
    /// A type byte that is not a frame type.
    UnknownType(u8),
    /// A valid frame type that is not allowed here.
    Unexpected(FrameType),
    /// A length above the type's maximum (nothing was allocated).
    TooLong {
        /// The frame type.
        kind: FrameType,
        /// The announced length.
        len: u32,
        /// The maximum for this type.
        max: u32,
    },
    /// The payload does not decode.
    Malformed(&'static str),
    /// The deadline passed.
    Timeout,
    /// Another socket error.
    Io(io::Error),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Eof => f.write_str("connection closed"),
            FrameError::Truncated => f.write_str("connection closed in the middle of a frame"),
            FrameError::UnknownType(t) => write!(f, "unknown frame type 0x{t:02x}"),
            FrameError::Unexpected(t) => write!(f, "unexpected {t:?} frame"),
            FrameError::TooLong { kind, len, max } => {
                write!(
                    f,
                    "{kind:?} frame of {len} bytes exceeds the limit of {max}"
                )
            }
            FrameError::Malformed(what) => write!(f, "malformed frame: {what}"),
            FrameError::Timeout => f.write_str("deadline passed"),
            FrameError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// Checks a frame header against the allowed types and their limits.
pub(crate) fn decode_header(
    header: [u8; HEADER_LEN],
    allowed: &[FrameType],
    nranks: u32,
) -> Result<(FrameType, u32), FrameError> {
    let kind = FrameType::from_u8(header[0]).ok_or(FrameError::UnknownType(header[0]))?;
    if !allowed.contains(&kind) {
        return Err(FrameError::Unexpected(kind));
    }
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    let max = kind.max_len(nranks);
    if len > max {
        return Err(FrameError::TooLong { kind, len, max });
    }
    Ok((kind, len))
}

/// Reads one frame of an allowed type before `deadline`.
pub(crate) fn read_frame(
    stream: &TcpStream,
    deadline: Instant,
    allowed: &[FrameType],
    nranks: u32,
) -> Result<(FrameType, Vec<u8>), FrameError> {
    let mut header = [0u8; HEADER_LEN];
    match read_exact_until(stream, &mut header, deadline) {
        Err(FrameError::Eof) => return Err(FrameError::Eof),
        other => other?,
    }
    let (kind, len) = decode_header(header, allowed, nranks)?;
    let mut payload = vec![0u8; len as usize];
    match read_exact_until(stream, &mut payload, deadline) {
        Err(FrameError::Eof) => Err(FrameError::Truncated),
        Err(e) => Err(e),
        Ok(()) => Ok((kind, payload)),
    }
}

/// `read_exact` bounded by a deadline: every `read` gets the time left, so a peer that trickles
/// one byte at a time cannot stretch the wait. `Eof` only when no byte of `buf` arrived.
fn read_exact_until(
    stream: &TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<(), FrameError> {
    let mut filled = 0;
    while filled < buf.len() {
        let left = remaining(deadline).ok_or(FrameError::Timeout)?;
        stream
            .set_read_timeout(Some(left))
            .map_err(FrameError::Io)?;
        let mut reader = stream;
        match reader.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Err(FrameError::Eof),
            Ok(0) => return Err(FrameError::Truncated),
            Ok(n) => filled += n,
            Err(e) if is_retry(&e) => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    Ok(())
}

/// Writes a whole frame before `deadline`.
pub(crate) fn write_frame(
    stream: &TcpStream,
    frame: &[u8],
    deadline: Instant,
) -> Result<(), FrameError> {
    let mut written = 0;
    while written < frame.len() {
        let left = remaining(deadline).ok_or(FrameError::Timeout)?;
        stream
            .set_write_timeout(Some(left))
            .map_err(FrameError::Io)?;
        let mut writer = stream;
        match writer.write(&frame[written..]) {
            Ok(0) => return Err(FrameError::Truncated),
            Ok(n) => written += n,
            Err(e) if is_retry(&e) => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    Ok(())
}

/// Time left before `deadline` (at least a millisecond: socket timeouts reject zero), `None`
/// once it has passed.
pub(crate) fn remaining(deadline: Instant) -> Option<Duration> {
    let left = deadline.checked_duration_since(Instant::now())?;
    if left.is_zero() {
        None
    } else {
        Some(left.max(Duration::from_millis(1)))
    }
}

fn is_retry(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Header + payload.
fn frame(kind: FrameType, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.push(kind as u8);
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Cursor over a payload; every read is bounds-checked and a short payload is
/// [`FrameError::Malformed`] naming the field (also the decoder of the control plane's payloads,
/// `comm/payload.rs`).
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `buf`.
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf }
    }
    /// The next `n` bytes.
    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], FrameError> {
        if self.buf.len() < n {
            return Err(FrameError::Malformed(what));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, FrameError> {
        Ok(self.take(1, what)?[0])
    }
    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, FrameError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, FrameError> {
        let hi = u64::from(self.u32(what)?);
        let lo = u64::from(self.u32(what)?);
        Ok(hi << 32 | lo)
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, FrameError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(crate) fn array<const N: usize>(
        &mut self,
        what: &'static str,
    ) -> Result<[u8; N], FrameError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }
    fn addr(&mut self) -> Result<IpAddr, FrameError> {
        let family = self.u8("address family")?;
        let bytes: [u8; 16] = self.array("address")?;
        match family {
            // One encoding per address: an IPv4 address's 12 padding bytes must be zero.
            4 if bytes[4..].iter().all(|&b| b == 0) => Ok(IpAddr::V4(Ipv4Addr::new(
                bytes[0], bytes[1], bytes[2], bytes[3],
            ))),
            4 => Err(FrameError::Malformed("address padding")),
            6 => Ok(IpAddr::V6(Ipv6Addr::from(bytes))),
            _ => Err(FrameError::Malformed("address family")),
        }
    }
    /// A string of at most `max` bytes: `[length u16][UTF-8 bytes]`.
    pub(crate) fn string(&mut self, max: usize, what: &'static str) -> Result<String, FrameError> {
        let len = self.u16(what)? as usize;
        if len > max {
            return Err(FrameError::Malformed(what));
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| FrameError::Malformed(what))
    }
    /// Nothing may follow.
    pub(crate) fn end(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Malformed("trailing bytes"))
        }
    }
}

fn put_addr(out: &mut Vec<u8>, addr: IpAddr) {
    let mut bytes = [0u8; 16];
    match addr {
        IpAddr::V4(a) => {
            out.push(4);
            bytes[..4].copy_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            out.push(6);
            bytes = a.octets();
        }
    }
    out.extend_from_slice(&bytes);
}

/// A string field, cut at `max` bytes on a character boundary (read by [`Cursor::string`]).
pub(crate) fn put_string(out: &mut Vec<u8>, s: &str, max: usize) {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_be_bytes());
    out.extend_from_slice(&s.as_bytes()[..end]);
}

/// Client → root, first frame of every connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    /// The client's protocol version.
    pub(crate) version: u32,
    /// The client's nonce (zeros when the version is not ours: the rest is not parsed).
    pub(crate) nonce: Nonce,
}

impl Hello {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(8 + NONCE_LEN);
        p.extend_from_slice(&MAGIC);
        p.extend_from_slice(&self.version.to_be_bytes());
        p.extend_from_slice(&self.nonce);
        frame(FrameType::Hello, &p)
    }

    /// Decodes the magic and version of any version, and the rest only for `ours`.
    pub(crate) fn decode(payload: &[u8], ours: u32) -> Result<Self, FrameError> {
        let mut c = Cursor { buf: payload };
        if c.take(4, "magic")? != MAGIC {
            return Err(FrameError::Malformed("bad magic"));
        }
        let version = c.u32("version")?;
        if version != ours {
            return Ok(Hello {
                version,
                nonce: [0; NONCE_LEN],
            });
        }
        let nonce = c.array("nonce")?;
        c.end()?;
        Ok(Hello { version, nonce })
    }
}

/// Root → client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Challenge {
    pub(crate) version: u32,
    pub(crate) nonce: Nonce,
}

impl Challenge {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(4 + NONCE_LEN);
        p.extend_from_slice(&self.version.to_be_bytes());
        p.extend_from_slice(&self.nonce);
        frame(FrameType::Challenge, &p)
    }

    pub(crate) fn decode(payload: &[u8], ours: u32) -> Result<Self, FrameError> {
        let mut c = Cursor { buf: payload };
        let version = c.u32("version")?;
        if version != ours {
            return Ok(Challenge {
                version,
                nonce: [0; NONCE_LEN],
            });
        }
        let nonce = c.array("nonce")?;
        c.end()?;
        Ok(Challenge { version, nonce })
    }
}

/// What a client claims about itself; covered by its MAC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Claims {
    pub(crate) rank: u32,
    pub(crate) nranks: u32,
    pub(crate) pid: u32,
    pub(crate) addr: IpAddr,
    pub(crate) host_id: String,
}

impl Claims {
    /// The bytes the MAC covers (and the frame carries).
    pub(crate) fn encode_body(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(12 + ADDR_LEN + 2 + self.host_id.len());
        p.extend_from_slice(&self.rank.to_be_bytes());
        p.extend_from_slice(&self.nranks.to_be_bytes());
        p.extend_from_slice(&self.pid.to_be_bytes());
        put_addr(&mut p, self.addr);
        put_string(&mut p, &self.host_id, MAX_HOST_ID);
        p
    }

    fn decode_from(c: &mut Cursor<'_>) -> Result<Self, FrameError> {
        Ok(Claims {
            rank: c.u32("rank")?,
            nranks: c.u32("nranks")?,
            pid: c.u32("pid")?,
            addr: c.addr()?,
            host_id: c.string(MAX_HOST_ID, "host id")?,
        })
    }
}

/// Client → root: claims and proof.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Auth {
    pub(crate) claims: Claims,
    pub(crate) mac: Mac,
}

impl Auth {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut p = self.claims.encode_body();
        p.extend_from_slice(&self.mac);
        frame(FrameType::Auth, &p)
    }

    /// Decodes; also returns the claim bytes the MAC covers, exactly as received.
    pub(crate) fn decode(payload: &[u8]) -> Result<(Self, &[u8]), FrameError> {
        let body_len = payload
            .len()
            .checked_sub(MAC_LEN)
            .ok_or(FrameError::Malformed("auth too short"))?;
        let (body, mac) = payload.split_at(body_len);
        let mut c = Cursor { buf: body };
        let claims = Claims::decode_from(&mut c)?;
        c.end()?;
        let mut tag = [0u8; MAC_LEN];
        tag.copy_from_slice(mac);
        Ok((Auth { claims, mac: tag }, body))
    }
}

/// Root → client: the root's proof.
pub(crate) fn encode_welcome(mac: &Mac) -> Vec<u8> {
    frame(FrameType::Welcome, mac)
}

pub(crate) fn decode_welcome(payload: &[u8]) -> Result<Mac, FrameError> {
    let mut c = Cursor { buf: payload };
    let mac = c.array("mac")?;
    c.end()?;
    Ok(mac)
}

/// Why the root refused or stopped a rendezvous. The numbers are the wire encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum AbortCode {
    /// The client's MAC did not verify. `value` unused.
    AuthFailed = 1,
    /// `value` = the root's protocol version.
    VersionMismatch = 2,
    /// `value` = the rank claimed twice.
    DuplicateRank = 3,
    /// `value` = the claimed rank.
    RankOutOfRange = 4,
    /// `value` = the root's nranks.
    NranksMismatch = 5,
    /// The init deadline passed; `missing` lists the ranks that never joined.
    Timeout = 6,
    /// The root stopped for another reason (see the message).
    Stopped = 7,
}

impl AbortCode {
    /// The code of wire byte `v`, if any.
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => AbortCode::AuthFailed,
            2 => AbortCode::VersionMismatch,
            3 => AbortCode::DuplicateRank,
            4 => AbortCode::RankOutOfRange,
            5 => AbortCode::NranksMismatch,
            6 => AbortCode::Timeout,
            7 => AbortCode::Stopped,
            _ => return None,
        })
    }
}

/// Root → client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Abort {
    pub(crate) code: AbortCode,
    pub(crate) value: u32,
    pub(crate) missing: Vec<u32>,
    pub(crate) message: String,
}

impl Abort {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(11 + 4 * self.missing.len() + self.message.len());
        p.push(self.code as u8);
        p.extend_from_slice(&self.value.to_be_bytes());
        p.extend_from_slice(&(self.missing.len() as u32).to_be_bytes());
        for r in &self.missing {
            p.extend_from_slice(&r.to_be_bytes());
        }
        put_string(&mut p, &self.message, MAX_MESSAGE);
        frame(FrameType::Abort, &p)
    }

    pub(crate) fn decode(payload: &[u8]) -> Result<Self, FrameError> {
        let mut c = Cursor { buf: payload };
        let code =
            AbortCode::from_u8(c.u8("abort code")?).ok_or(FrameError::Malformed("abort code"))?;
        let value = c.u32("abort value")?;
        let count = c.u32("missing count")? as usize;
        // The header limit already bounds the payload; this bounds the loop by what is there.
        if count > c.buf.len() / 4 {
            return Err(FrameError::Malformed("missing count"));
        }
        let mut missing = Vec::with_capacity(count);
        for _ in 0..count {
            missing.push(c.u32("missing rank")?);
        }
        let message = c.string(MAX_MESSAGE, "abort message")?;
        c.end()?;
        Ok(Abort {
            code,
            value,
            missing,
            message,
        })
    }
}

/// The rank table body (the MAC covers exactly these bytes).
pub(crate) fn encode_table_body(table: &[RankInfo]) -> Vec<u8> {
    let mut p = Vec::with_capacity(4 + table.len() * 48);
    p.extend_from_slice(&(table.len() as u32).to_be_bytes());
    for e in table {
        p.extend_from_slice(&e.rank.to_be_bytes());
        p.extend_from_slice(&e.pid.to_be_bytes());
        put_addr(&mut p, e.addr);
        put_string(&mut p, &e.host_id, MAX_HOST_ID);
    }
    p
}

/// Root → client: table body + MAC.
pub(crate) fn encode_table(body: &[u8], mac: &Mac) -> Vec<u8> {
    let mut p = Vec::with_capacity(body.len() + MAC_LEN);
    p.extend_from_slice(body);
    p.extend_from_slice(mac);
    frame(FrameType::Table, &p)
}

/// Decodes a table frame: the entries, the body bytes the MAC covers, and the MAC.
pub(crate) fn decode_table(payload: &[u8]) -> Result<(Vec<RankInfo>, &[u8], Mac), FrameError> {
    let body_len = payload
        .len()
        .checked_sub(MAC_LEN)
        .ok_or(FrameError::Malformed("table too short"))?;
    let (body, mac) = payload.split_at(body_len);
    let mut c = Cursor { buf: body };
    let count = c.u32("table size")? as usize;
    // Every entry takes at least 27 bytes: bound the loop by what arrived.
    if count > c.buf.len() / (4 + 4 + ADDR_LEN + 2) {
        return Err(FrameError::Malformed("table size"));
    }
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        entries.push(RankInfo {
            rank: c.u32("rank")?,
            pid: c.u32("pid")?,
            addr: c.addr()?,
            host_id: c.string(MAX_HOST_ID, "host id")?,
        });
    }
    c.end()?;
    let mut tag = [0u8; MAC_LEN];
    tag.copy_from_slice(mac);
    Ok((entries, body, tag))
}

/// A frame without payload ([`FrameType::Heartbeat`]).
pub(crate) fn encode_empty(kind: FrameType) -> Vec<u8> {
    frame(kind, &[])
}

/// One rank's contribution to the host-side all-gather number `seq`: a tag naming the operation
/// (ranks must agree on it) and at most [`MAX_GATHER`] bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Contribution {
    pub(crate) tag: u32,
    pub(crate) data: Vec<u8>,
}

fn put_contribution(p: &mut Vec<u8>, c: &Contribution) {
    p.extend_from_slice(&c.tag.to_be_bytes());
    let len = c.data.len().min(MAX_GATHER);
    p.extend_from_slice(&(len as u16).to_be_bytes());
    p.extend_from_slice(&c.data[..len]);
}

fn take_contribution(c: &mut Cursor<'_>) -> Result<Contribution, FrameError> {
    let tag = c.u32("gather tag")?;
    let len = c.u16("gather length")? as usize;
    if len > MAX_GATHER {
        return Err(FrameError::Malformed("gather length"));
    }
    Ok(Contribution {
        tag,
        data: c.take(len, "gather data")?.to_vec(),
    })
}

/// Rank → root: contribution to gather `seq`.
pub(crate) fn encode_gather(seq: u64, c: &Contribution) -> Vec<u8> {
    let mut p = Vec::with_capacity(14 + c.data.len());
    p.extend_from_slice(&seq.to_be_bytes());
    put_contribution(&mut p, c);
    frame(FrameType::Gather, &p)
}

pub(crate) fn decode_gather(payload: &[u8]) -> Result<(u64, Contribution), FrameError> {
    let mut c = Cursor { buf: payload };
    let seq = u64::from_be_bytes(c.array("gather sequence")?);
    let contribution = take_contribution(&mut c)?;
    c.end()?;
    Ok((seq, contribution))
}

/// Root → rank: every rank's contribution to gather `seq`, in rank order.
pub(crate) fn encode_gathered(seq: u64, all: &[Contribution]) -> Vec<u8> {
    let mut p = Vec::with_capacity(12 + all.iter().map(|c| 6 + c.data.len()).sum::<usize>());
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&(all.len() as u32).to_be_bytes());
    for c in all {
        put_contribution(&mut p, c);
    }
    frame(FrameType::Gathered, &p)
}

pub(crate) fn decode_gathered(
    payload: &[u8],
    nranks: u32,
) -> Result<(u64, Vec<Contribution>), FrameError> {
    let mut c = Cursor { buf: payload };
    let seq = u64::from_be_bytes(c.array("gathered sequence")?);
    let count = c.u32("gathered count")?;
    if count != nranks {
        return Err(FrameError::Malformed("gathered count"));
    }
    let mut all = Vec::with_capacity(count as usize);
    for _ in 0..count {
        all.push(take_contribution(&mut c)?);
    }
    c.end()?;
    Ok((seq, all))
}

/// Why a rank was declared lost. The numbers are the wire encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum LostReason {
    /// Its connection closed without a goodbye (the process died or closed the socket).
    Disconnected = 1,
    /// No frame from it within the peer timeout.
    HeartbeatMissed = 2,
    /// It aborted its communicator (`Communicator::abort`).
    Aborted = 3,
}

impl LostReason {
    /// The reason of wire byte `v`, if any.
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => LostReason::Disconnected,
            2 => LostReason::HeartbeatMissed,
            3 => LostReason::Aborted,
            _ => return None,
        })
    }
}

/// How a communicator left, in its goodbye. The numbers are the wire encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Farewell {
    /// Destroyed (its last holder dropped it): not a fault in itself.
    Destroyed = 1,
    /// Aborted: a fault, the peers abort too.
    Aborted = 2,
}

impl Farewell {
    /// The farewell of wire byte `v`, if any.
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Farewell::Destroyed,
            2 => Farewell::Aborted,
            _ => return None,
        })
    }
}

/// Either way: the sender leaves (`how`) after `calls` collective calls and `gathers` host
/// all-gathers.
pub(crate) fn encode_goodbye(how: Farewell, calls: u64, gathers: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(17);
    p.push(how as u8);
    p.extend_from_slice(&calls.to_be_bytes());
    p.extend_from_slice(&gathers.to_be_bytes());
    frame(FrameType::Goodbye, &p)
}

pub(crate) fn decode_goodbye(payload: &[u8]) -> Result<(Farewell, u64, u64), FrameError> {
    let mut c = Cursor { buf: payload };
    let how = Farewell::from_u8(c.u8("farewell")?).ok_or(FrameError::Malformed("farewell"))?;
    let calls = c.u64("collective calls")?;
    let gathers = c.u64("host all-gathers")?;
    c.end()?;
    Ok((how, calls, gathers))
}

/// Root → rank: `rank` destroyed its communicator after `calls` collective calls and `gathers`
/// host all-gathers.
pub(crate) fn encode_departed(rank: u32, calls: u64, gathers: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(20);
    p.extend_from_slice(&rank.to_be_bytes());
    p.extend_from_slice(&calls.to_be_bytes());
    p.extend_from_slice(&gathers.to_be_bytes());
    frame(FrameType::Departed, &p)
}

pub(crate) fn decode_departed(payload: &[u8]) -> Result<(u32, u64, u64), FrameError> {
    let mut c = Cursor { buf: payload };
    let rank = c.u32("departed rank")?;
    let calls = c.u64("collective calls")?;
    let gathers = c.u64("host all-gathers")?;
    c.end()?;
    Ok((rank, calls, gathers))
}

/// Root → rank: `rank` is lost.
pub(crate) fn encode_peer_lost(rank: u32, why: LostReason) -> Vec<u8> {
    let mut p = Vec::with_capacity(5);
    p.extend_from_slice(&rank.to_be_bytes());
    p.push(why as u8);
    frame(FrameType::PeerLost, &p)
}

pub(crate) fn decode_peer_lost(payload: &[u8]) -> Result<(u32, LostReason), FrameError> {
    let mut c = Cursor { buf: payload };
    let rank = c.u32("lost rank")?;
    let why =
        LostReason::from_u8(c.u8("lost reason")?).ok_or(FrameError::Malformed("lost reason"))?;
    c.end()?;
    Ok((rank, why))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn split(frame: &[u8]) -> ([u8; HEADER_LEN], &[u8]) {
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&frame[..HEADER_LEN]);
        (h, &frame[HEADER_LEN..])
    }

    #[test]
    fn hello_round_trips_and_other_versions_decode_their_version() {
        let hello = Hello {
            version: 1,
            nonce: [7; NONCE_LEN],
        };
        let f = hello.encode();
        let (h, p) = split(&f);
        assert_eq!(
            decode_header(h, &[FrameType::Hello], 4).unwrap(),
            (FrameType::Hello, p.len() as u32)
        );
        assert_eq!(Hello::decode(p, 1).unwrap(), hello);
        // A version-2 hello with a longer body still yields its version.
        let mut v2 = MAGIC.to_vec();
        v2.extend_from_slice(&2u32.to_be_bytes());
        v2.extend_from_slice(&[0u8; 100]);
        assert_eq!(Hello::decode(&v2, 1).unwrap().version, 2);
        assert!(matches!(
            Hello::decode(b"GET / HTTP/1.1", 1),
            Err(FrameError::Malformed("bad magic"))
        ));
        assert!(matches!(
            Hello::decode(&f[HEADER_LEN..f.len() - 1], 1),
            Err(FrameError::Malformed(_))
        ));
    }

    #[test]
    fn length_limits_are_checked_before_reading_the_payload() {
        // A 4 GiB length prefix on a hello.
        let h = [FrameType::Hello as u8, 0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            decode_header(h, &[FrameType::Hello], 8),
            Err(FrameError::TooLong {
                len: u32::MAX,
                max: 256,
                ..
            })
        ));
        // The first bytes of an HTTP request.
        assert!(matches!(
            decode_header(*b"GET /", &[FrameType::Hello], 8),
            Err(FrameError::UnknownType(b'G'))
        ));
        // A valid type in the wrong place.
        assert!(matches!(
            decode_header([FrameType::Table as u8, 0, 0, 0, 4], &[FrameType::Hello], 8),
            Err(FrameError::Unexpected(FrameType::Table))
        ));
        // Exactly at the limit is fine, one more is not.
        let max = FrameType::Auth.max_len(8);
        let at = max.to_be_bytes();
        assert!(decode_header([3, at[0], at[1], at[2], at[3]], &[FrameType::Auth], 8).is_ok());
        let over = (max + 1).to_be_bytes();
        assert!(
            decode_header(
                [3, over[0], over[1], over[2], over[3]],
                &[FrameType::Auth],
                8
            )
            .is_err()
        );
        // Table limits scale with the rank count.
        assert!(FrameType::Table.max_len(1000) > FrameType::Table.max_len(10));
    }

    #[test]
    fn auth_abort_and_table_round_trip() {
        let claims = Claims {
            rank: 3,
            nranks: 5,
            pid: 4242,
            addr: "10.1.2.3".parse().unwrap(),
            host_id: "node-a/1234".into(),
        };
        let auth = Auth {
            claims: claims.clone(),
            mac: [9; MAC_LEN],
        };
        let f = auth.encode();
        let (h, p) = split(&f);
        decode_header(h, &[FrameType::Auth], 5).unwrap();
        let (back, body) = Auth::decode(p).unwrap();
        assert_eq!(back, auth);
        assert_eq!(body, claims.encode_body().as_slice());

        let abort = Abort {
            code: AbortCode::Timeout,
            value: 0,
            missing: vec![2, 4],
            message: "ranks 2, 4 never joined".into(),
        };
        let f = abort.encode();
        let (h, p) = split(&f);
        decode_header(h, &[FrameType::Abort], 5).unwrap();
        assert_eq!(Abort::decode(p).unwrap(), abort);

        let table = vec![
            RankInfo {
                rank: 0,
                host_id: "a".into(),
                addr: "::1".parse().unwrap(),
                pid: 1,
            },
            RankInfo {
                rank: 1,
                host_id: "b".repeat(MAX_HOST_ID),
                addr: "192.168.0.7".parse().unwrap(),
                pid: 2,
            },
        ];
        let body = encode_table_body(&table);
        let f = encode_table(&body, &[5; MAC_LEN]);
        let (h, p) = split(&f);
        let (_, len) = decode_header(h, &[FrameType::Table], 2).unwrap();
        assert_eq!(len as usize, p.len());
        let (entries, b, mac) = decode_table(p).unwrap();
        assert_eq!(entries, table);
        assert_eq!(b, body.as_slice());
        assert_eq!(mac, [5; MAC_LEN]);
    }

    #[test]
    fn corrupt_payloads_are_errors_not_panics() {
        let abort = Abort {
            code: AbortCode::Stopped,
            value: 1,
            missing: vec![1; 10],
            message: "x".into(),
        }
        .encode();
        let p = &abort[HEADER_LEN..];
        for cut in 0..p.len() {
            assert!(Abort::decode(&p[..cut]).is_err(), "cut at {cut}");
        }
        // A huge missing count with few bytes behind it.
        let mut bad = vec![6u8, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff];
        bad.extend_from_slice(&[0, 0]);
        assert!(Abort::decode(&bad).is_err());
        // A table claiming 2^32-1 entries.
        let mut t = vec![0xff, 0xff, 0xff, 0xff];
        t.extend_from_slice(&[0; MAC_LEN]);
        assert!(decode_table(&t).is_err());
        // Bad address family, bad UTF-8 host id.
        let mut c = Claims {
            rank: 0,
            nranks: 1,
            pid: 0,
            addr: "1.2.3.4".parse().unwrap(),
            host_id: "h".into(),
        }
        .encode_body();
        c[12] = 9;
        c.extend_from_slice(&[0; MAC_LEN]);
        assert!(Auth::decode(&c).is_err());
        let mut c = Claims {
            rank: 0,
            nranks: 1,
            pid: 0,
            addr: "1.2.3.4".parse().unwrap(),
            host_id: "h".into(),
        }
        .encode_body();
        let last = c.len() - 1;
        c[last] = 0xff;
        c.extend_from_slice(&[0; MAC_LEN]);
        assert!(Auth::decode(&c).is_err());
    }

    /// One encoding per address (found by tests/wire_props.rs: an IPv4 address's padding was
    /// ignored, so two byte strings decoded to the same claims).
    #[test]
    fn ipv4_addresses_with_nonzero_padding_are_refused() {
        let mut p = Vec::new();
        put_addr(&mut p, IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)));
        assert_eq!(
            Cursor { buf: &p }.addr().unwrap(),
            IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3))
        );
        p[ADDR_LEN - 1] = 1;
        assert!(matches!(
            Cursor { buf: &p }.addr(),
            Err(FrameError::Malformed("address padding"))
        ));
    }

    #[test]
    fn goodbye_departed_and_peer_lost_round_trip() {
        for how in [Farewell::Destroyed, Farewell::Aborted] {
            for calls in [0, 1, u64::from(u32::MAX) + 7, u64::MAX] {
                let f = encode_goodbye(how, calls, calls / 3);
                let (h, p) = split(&f);
                assert_eq!(h[0], FrameType::Goodbye as u8);
                assert!(p.len() as u32 <= FrameType::Goodbye.max_len(2));
                assert_eq!(decode_goodbye(p).unwrap(), (how, calls, calls / 3));
                let f = encode_departed(3, calls, 7);
                let (_, p) = split(&f);
                assert!(p.len() as u32 <= FrameType::Departed.max_len(2));
                assert_eq!(decode_departed(p).unwrap(), (3, calls, 7));
            }
        }
        for why in [
            LostReason::Disconnected,
            LostReason::HeartbeatMissed,
            LostReason::Aborted,
        ] {
            let f = encode_peer_lost(5, why);
            assert_eq!(decode_peer_lost(split(&f).1).unwrap(), (5, why));
        }
        assert!(decode_goodbye(&[9; 17]).is_err());
        assert!(decode_goodbye(&[1; 9]).is_err());
        assert!(decode_departed(&[0; 21]).is_err());
    }

    #[test]
    fn frames_read_with_deadlines_over_tcp() {
        use std::net::TcpListener;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let writer = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let hello = Hello {
                version: 1,
                nonce: [1; NONCE_LEN],
            }
            .encode();
            // Trickled in two pieces.
            s.write_all(&hello[..3]).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            s.write_all(&hello[3..]).unwrap();
            // Then half a header and silence.
            s.write_all(&[1, 0]).unwrap();
            std::thread::sleep(Duration::from_millis(400));
        });
        let (s, _) = l.accept().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let (kind, p) = read_frame(&s, deadline, &[FrameType::Hello], 1).unwrap();
        assert_eq!(kind, FrameType::Hello);
        assert_eq!(Hello::decode(&p, 1).unwrap().nonce, [1; NONCE_LEN]);
        let t = Instant::now();
        let r = read_frame(
            &s,
            Instant::now() + Duration::from_millis(100),
            &[FrameType::Hello],
            1,
        );
        assert!(matches!(r, Err(FrameError::Timeout)), "{r:?}");
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(90) && waited < Duration::from_millis(300),
            "{waited:?}"
        );
        writer.join().unwrap();
        // The writer closed after half a header: truncated, not a clean EOF.
        let r = read_frame(
            &s,
            Instant::now() + Duration::from_secs(2),
            &[FrameType::Hello],
            1,
        );
        assert!(
            matches!(r, Err(FrameError::Truncated) | Err(FrameError::Eof)),
            "{r:?}"
        );
    }
}

//! [`UniqueId`]: where the root listens and the secret every rank must prove it knows.

use std::fmt;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{PROTOCOL_VERSION, auth, net};
use crate::{Error, Result};

/// A 128-bit rendezvous secret. `Debug` shows a fingerprint, never the bytes.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret([u8; 16]);

impl Secret {
    pub(crate) fn from_bytes(bytes: [u8; 16]) -> Self {
        Secret(bytes)
    }
    pub(crate) fn bytes(&self) -> &[u8; 16] {
        &self.0
    }
    /// Parses exactly 32 hex digits.
    pub(crate) fn from_hex(s: &str) -> Option<Self> {
        let s = s.trim();
        if s.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, pair) in s.as_bytes().chunks(2).enumerate() {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            out[i] = (hi * 16 + lo) as u8;
        }
        Some(Secret(out))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(fingerprint {})", auth::fingerprint(self))
    }
}

/// Lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// The rendezvous credential: the root's socket address, a 128-bit random secret and the
/// bootstrap protocol version.
///
/// One rank (usually rank 0) creates it with [`UniqueId::new`] and hands it to every other rank
/// (a channel between threads, an environment variable, a command line); every rank then calls
/// [`init`](super::init) with it, rank 0 acting as the root.
///
/// The string form (`Display` / `FromStr`) is `symcomm1:<ip>:<port>:<32 hex digits>`, for
/// example `symcomm1:10.0.0.5:41237:8c1f…` or `symcomm1:[fd00::5]:41237:8c1f…`.
///
/// **It is a credential**: anyone who has it can join the rendezvous. `Debug` shows only a
/// fingerprint of the secret; do not log the `Display` form.
#[derive(Clone)]
pub struct UniqueId {
    addr: SocketAddr,
    secret: Secret,
    /// Ids made by [`UniqueId::new_on`] (and their clones): the reservation of this process's
    /// listening socket lasts while one of them lives. Held for its drop.
    #[cfg_attr(not(test), expect(dead_code, reason = "held for its Drop"))]
    hold: Option<Arc<Hold>>,
}

impl PartialEq for UniqueId {
    fn eq(&self, other: &Self) -> bool {
        self.addr == other.addr && self.secret == other.secret
    }
}

impl Eq for UniqueId {}

/// Keeps a reservation ([`Reservation`]) while an id made with it lives; its drop closes the
/// listening socket (clients are refused at once instead of hanging) and forgets the entry.
struct Hold {
    key: u64,
}

impl Drop for Hold {
    fn drop(&mut self) {
        reservations().retain(|r| r.key != self.key);
    }
}

impl UniqueId {
    /// A fresh id: the root address is the address of `SYMCOMM_SOCKET_IFNAME` when set, else a
    /// non-loopback address of this machine, else `127.0.0.1` — never `0.0.0.0`; the port is an
    /// ephemeral one, reserved now (a listening socket is held for rank 0's [`init`](super::init)
    /// in this process, as NCCL's `ncclGetUniqueId` does); the secret comes from the OS CSPRNG.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `SYMCOMM_SOCKET_IFNAME` that names no usable interface;
    /// [`Error::Io`] when no port can be bound or the CSPRNG fails.
    pub fn new() -> Result<Self> {
        let ifname = crate::config::raw_value("SYMCOMM_SOCKET_IFNAME");
        let ip = net::default_root_ip(ifname.as_deref())?;
        Self::new_on(ip)
    }

    /// A fresh id whose root listens on `ip` (an ephemeral port, reserved now) with a random
    /// secret.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unspecified address (`0.0.0.0`, `::`); [`Error::Io`] when
    /// the address cannot be bound or the CSPRNG fails.
    pub fn new_on(ip: IpAddr) -> Result<Self> {
        if ip.is_unspecified() {
            return Err(Error::InvalidArgument(format!(
                "the root address {ip} is not connectable; give the address of one interface"
            )));
        }
        let mut bytes = [0u8; 16];
        auth::fill_random(&mut bytes)?;
        Self::reserve(ip, Secret(bytes))
    }

    /// A fresh id on `ip` (an ephemeral port, reserved now, as [`Self::new_on`]) with `secret`.
    ///
    /// # Errors
    /// [`Error::Io`] when the address cannot be bound.
    pub(crate) fn reserve(ip: IpAddr, secret: Secret) -> Result<Self> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|source| Error::io(format!("reserving a bootstrap port on {ip}"), source))?;
        let addr = listener
            .local_addr()
            .map_err(|source| Error::io("reading the reserved bootstrap port", source))?;
        static NEXT_KEY: AtomicU64 = AtomicU64::new(0);
        let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
        reservations().push(Reservation {
            key,
            addr,
            fingerprint: auth::fingerprint(&secret),
            listener: Some(listener),
        });
        Ok(UniqueId {
            addr,
            secret,
            hold: Some(Arc::new(Hold { key })),
        })
    }

    /// An id for a root address chosen elsewhere (a launcher, a fixed port) and a given secret.
    /// Nothing is reserved: rank 0 binds `addr` in [`init`](super::init).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unspecified address or port 0.
    pub fn from_parts(addr: SocketAddr, secret: [u8; 16]) -> Result<Self> {
        check_addr(addr)?;
        Ok(UniqueId {
            addr,
            secret: Secret(secret),
            hold: None,
        })
    }

    /// 16 bytes from the OS CSPRNG, for [`UniqueId::from_parts`] or `SYMCOMM_SECRET`.
    ///
    /// # Errors
    /// [`Error::Io`] when the CSPRNG fails.
    pub fn random_secret() -> Result<[u8; 16]> {
        let mut bytes = [0u8; 16];
        auth::fill_random(&mut bytes)?;
        Ok(bytes)
    }

    /// The root's listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bootstrap protocol version this id is for (always [`PROTOCOL_VERSION`]: ids of other
    /// versions do not parse).
    pub fn version(&self) -> u32 {
        PROTOCOL_VERSION
    }

    /// A short non-reversible name of the secret (16 hex digits), safe to log.
    pub fn fingerprint(&self) -> String {
        auth::fingerprint(&self.secret)
    }

    pub(crate) fn secret(&self) -> &Secret {
        &self.secret
    }

    pub(crate) fn with_secret(addr: SocketAddr, secret: Secret) -> Self {
        UniqueId {
            addr,
            secret,
            hold: None,
        }
    }
}

fn check_addr(addr: SocketAddr) -> Result<()> {
    if addr.ip().is_unspecified() {
        return Err(Error::InvalidArgument(format!(
            "the root address {} is not connectable; give the address of one interface",
            addr.ip()
        )));
    }
    if addr.port() == 0 {
        return Err(Error::InvalidArgument(
            "the root address needs a port other than 0".into(),
        ));
    }
    Ok(())
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UniqueId")
            .field("addr", &self.addr)
            .field("version", &PROTOCOL_VERSION)
            .field("secret_fingerprint", &self.fingerprint())
            .finish()
    }
}

/// `symcomm1:<ip>:<port>:<secret hex>` — contains the secret.
impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "symcomm{PROTOCOL_VERSION}:{}:{}",
            self.addr,
            hex(&self.secret.0)
        )
    }
}

impl FromStr for UniqueId {
    type Err = Error;

    /// Parses the `Display` form. Errors never echo any part of the input (a misplaced `:` can
    /// put the secret in any field), only which field is wrong and its length.
    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: String| Error::InvalidArgument(format!("invalid UniqueId: {why}"));
        let form = "expected `symcomm<version>:<ip>:<port>:<32 hex digits>` (IPv6 as [addr])";
        let s = s.trim();
        let rest = s
            .strip_prefix("symcomm")
            .ok_or_else(|| bad(format!("does not start with `symcomm`; {form}")))?;
        let (version, rest) = rest
            .split_once(':')
            .ok_or_else(|| bad(format!("missing `:` after the version; {form}")))?;
        let version: u32 = version.parse().map_err(|_| {
            bad(format!(
                "the version ({} characters) is not a number; {form}",
                version.chars().count()
            ))
        })?;
        if version != PROTOCOL_VERSION {
            // A number of 8 or more digits is not shown: it could be 8 characters of a secret
            // (found by the `env` fuzz target).
            let which = if version < 10_000_000 {
                version.to_string()
            } else {
                format!("of {} digits", version.to_string().len())
            };
            return Err(bad(format!(
                "protocol version {which} is not supported (this symcomm speaks version {PROTOCOL_VERSION})"
            )));
        }
        // <ip>:<port> — an IPv6 address is bracketed, so the first `:` after it (or after an
        // IPv4 address) ends the host — then `:<secret>`, the rest.
        let host_end = if rest.starts_with('[') {
            rest.find(']').map(|i| i + 1)
        } else {
            rest.find(':')
        }
        .ok_or_else(|| {
            bad(format!(
                "expected `<ip>:<port>:<secret>` after the version; {form}"
            ))
        })?;
        let (host, after_host) = rest.split_at(host_end);
        let (port, secret) = after_host
            .strip_prefix(':')
            .and_then(|r| r.split_once(':'))
            .ok_or_else(|| {
                bad(format!(
                    "expected `<ip>:<port>:<secret>` after the version; {form}"
                ))
            })?;
        if secret.contains(':') {
            return Err(bad(format!(
                "{} fields after the port where one (the secret) belongs; {form}",
                secret.split(':').count()
            )));
        }
        let addr: SocketAddr = format!("{host}:{port}").parse().map_err(|_| {
            bad(format!(
                "the root address ({} characters) and port ({} characters) are not <ip>:<port>; {form}",
                host.chars().count(),
                port.chars().count()
            ))
        })?;
        // Its message without a second "invalid argument:" prefix.
        check_addr(addr).map_err(|e| match e {
            Error::InvalidArgument(why) => bad(why),
            e => e,
        })?;
        let secret = Secret::from_hex(secret).ok_or_else(|| {
            bad(format!(
                "the secret must be 32 hex digits (128 bits), got {} characters",
                secret.chars().count()
            ))
        })?;
        Ok(UniqueId {
            addr,
            secret,
            hold: None,
        })
    }
}

/// A listening socket held between [`UniqueId::new_on`] and rank 0's init, while an id made with
/// it lives (see [`Hold`]).
struct Reservation {
    key: u64,
    addr: SocketAddr,
    fingerprint: String,
    /// `None` once an init took it: the id is consumed.
    listener: Option<TcpListener>,
}

fn reservations() -> std::sync::MutexGuard<'static, Vec<Reservation>> {
    static RESERVED: Mutex<Vec<Reservation>> = Mutex::new(Vec::new());
    RESERVED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What rank 0's init finds for its id.
pub(crate) enum Reserved {
    /// The listener [`UniqueId::new_on`] bound.
    Listener(TcpListener),
    /// An earlier init already took it: ids are single-use.
    Consumed,
    /// The id was made elsewhere (another process, `from_parts`, parsing): bind it.
    NotHere,
}

/// Takes this process's reservation for `id`.
pub(crate) fn take_reservation(id: &UniqueId) -> Reserved {
    let fp = id.fingerprint();
    let mut list = reservations();
    match list
        .iter_mut()
        .find(|r| r.addr == id.addr && r.fingerprint == fp)
    {
        Some(r) => match r.listener.take() {
            Some(l) => Reserved::Listener(l),
            None => Reserved::Consumed,
        },
        None => Reserved::NotHere,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn secrets_parse_from_exactly_32_hex_digits() {
        let s = Secret::from_hex("00112233445566778899aabbccddeeFF").unwrap();
        assert_eq!(hex(s.bytes()), "00112233445566778899aabbccddeeff");
        assert!(Secret::from_hex("0011").is_none());
        assert!(Secret::from_hex("zz112233445566778899aabbccddeeff").is_none());
        assert!(Secret::from_hex("é0112233445566778899aabbccddeef").is_none());
        assert!(!format!("{s:?}").contains("aabb"));
    }

    /// No error for a malformed id contains the secret, or any 8 characters of it, wherever a
    /// misplaced `:` puts it (issue 11: a trailing colon once echoed it as the root address).
    #[test]
    fn malformed_ids_never_echo_the_secret() {
        let sec = "0123456789abcdef0123456789abcdef";
        let good = [
            format!("symcomm1:127.0.0.1:5000:{sec}"),
            format!("symcomm1:[::1]:5000:{sec}"),
            format!(" symcomm1:10.1.2.3:65535:{} ", sec.to_uppercase()),
        ];
        for g in &good {
            assert!(g.parse::<UniqueId>().is_ok(), "{g}");
        }
        let bad = [
            format!("symcomm1:127.0.0.1:5000:{sec}:"),
            format!("symcomm1:127.0.0.1:5000:{sec}:extra"),
            format!("symcomm1:127.0.0.1:{sec}:5000"),
            format!("symcomm1:{sec}:127.0.0.1:5000"),
            format!("symcomm1:127.0.0.1:{sec}"),
            format!("symcomm1:{sec}"),
            format!("symcomm{sec}:127.0.0.1:5000"),
            format!("symcomm1:127.0.0.1::{sec}"),
            format!("symcomm1:127.0.0.1:5000:{sec}0"),
            format!("symcomm1:127.0.0.1:5000:{}", &sec[..31]),
            format!("symcomm1:127.0.0.1:5000:{}g", &sec[..31]),
            format!("symcomm1:[::1:5000:{sec}"),
            format!("symcomm1:[{sec}]:5000:{sec}"),
            format!("symcomm1:0.0.0.0:5000:{sec}"),
            format!("symcomm1:127.0.0.1:0:{sec}"),
            format!("symcomm2:127.0.0.1:5000:{sec}"),
            format!("symcomm:127.0.0.1:5000:{sec}"),
            sec.to_string(),
            format!("symcomm1:127.0.0.1:5000:{sec}:{sec}"),
            // A version made of the secret's digits (the env fuzz target's find).
            format!("symcomm{}:127.0.0.1:5000:{sec}", &sec[..10]),
            format!("symcomm{}:127.0.0.1:5000:{sec}", &sec[1..9]),
            format!("symcomm1:127.0.0.1:99999:{sec}"),
            format!("symcomm1:localhost:5000:{sec}"),
        ];
        let pieces: Vec<String> = (0..=sec.len() - 8)
            .map(|i| sec[i..i + 8].to_owned())
            .collect();
        for b in &bad {
            let e = b.parse::<UniqueId>().unwrap_err();
            for text in [e.to_string(), format!("{e:?}")] {
                let lower = text.to_lowercase();
                let leak = pieces.iter().find(|p| lower.contains(p.as_str()));
                assert!(
                    leak.is_none(),
                    "`{b}` gave a message with the secret: {text}"
                );
            }
            assert!(matches!(e, Error::InvalidArgument(_)), "{b}: {e}");
            // One prefix (issue 11 minor: "invalid argument: … invalid argument: …").
            assert_eq!(e.to_string().matches("invalid argument").count(), 1, "{e}");
        }
    }

    /// An id dropped without init frees its reservation: the listening socket closes (a client
    /// is refused at once instead of hanging until its deadline) and the entry is forgotten
    /// (issue 11 §4: the list grew forever).
    #[test]
    fn dropped_ids_release_their_reservation() {
        let id = UniqueId::new_on("127.0.0.1".parse().unwrap()).unwrap();
        let addr = id.addr();
        let copy = id.clone();
        drop(id);
        // A clone still holds it.
        assert!(std::net::TcpStream::connect(addr).is_ok(), "still reserved");
        let key = copy.hold.as_ref().unwrap().key;
        drop(copy);
        assert!(
            !reservations().iter().any(|r| r.key == key),
            "the entry outlived every copy of its id"
        );
        let e = std::net::TcpStream::connect(addr).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        // Many cycles leave nothing behind (other tests may hold ids of their own meanwhile).
        for _ in 0..200 {
            drop(UniqueId::new_on("127.0.0.1".parse().unwrap()).unwrap());
        }
        assert!(
            reservations().len() < 50,
            "{} reservations left",
            reservations().len()
        );
    }

    #[test]
    fn reservations_are_single_use() {
        let id = UniqueId::new_on("127.0.0.1".parse().unwrap()).unwrap();
        assert!(matches!(take_reservation(&id), Reserved::Listener(_)));
        assert!(matches!(take_reservation(&id), Reserved::Consumed));
        let other = UniqueId::from_parts(id.addr(), [0; 16]).unwrap();
        assert!(matches!(take_reservation(&other), Reserved::NotHere));
    }
}

//! Ranks 1..N: connect to the root, authenticate both ways, wait for the rank table.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::auth::{self, Label, Nonce};
use super::net::{self, ConnectError};
use super::wire::{
    self, Abort, AbortCode, Auth, Challenge, Claims, FrameError, FrameType, Hello, read_frame,
    write_frame,
};
use super::{Bootstrap, BootstrapConfig, PROTOCOL_VERSION, RankInfo, RootLink, StrayStats};
use crate::{BootstrapErrorKind, Error, Result};

/// How much longer than its own deadline a client waits for the root's verdict, so that the
/// root's timeout (which names the missing ranks) arrives first even when this rank started a
/// little before the root. A live root always answers by its own deadline, so this only
/// stretches the wait when the root started much later or is stuck.
fn verdict_grace(timeout: Duration) -> Duration {
    (timeout / 2).clamp(Duration::from_millis(100), Duration::from_secs(5))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(super) fn run(config: &BootstrapConfig, host_id: String, start: Instant) -> Result<Bootstrap> {
    let deadline = start + config.timeout;
    let root = config.id.addr();
    let timed_out = |missing: Vec<u32>| Error::InitTimeout {
        rank: config.rank,
        missing,
        timeout_ms: millis(config.timeout),
        auth_failed: Vec::new(),
    };
    let bind_ip = match &config.ifname {
        Some(spec) => Some(net::ifname_addr(spec, &net::interfaces()?)?),
        None => None,
    };

    // Until the root decides on this rank's proof. A root that closes the connection before
    // that, without a verdict, dropped it to make room under a flood (or cut it at its
    // deadline): start over on a new connection.
    let mut backoff = Duration::from_millis(5);
    let (stream, claims, client_nonce, root_nonce) = loop {
        let (stream, client_nonce, root_nonce) = open(config, root, bind_ip, deadline)?;
        let local = stream.local_addr().map_err(|source| {
            Error::io(
                "reading the local address of the bootstrap connection",
                source,
            )
        })?;
        let claims = Claims {
            rank: config.rank,
            nranks: config.nranks,
            pid: std::process::id(),
            addr: local.ip(),
            host_id: host_id.clone(),
        };
        let body = claims.encode_body();
        let mac = auth::mac(
            config.id.secret(),
            Label::Client,
            &client_nonce,
            &root_nonce,
            &body,
        );
        let auth = Auth {
            claims: claims.clone(),
            mac,
        };
        let answer = write_frame(&stream, &auth.encode(), deadline).and_then(|()| {
            read_frame(
                &stream,
                deadline,
                &[FrameType::Welcome, FrameType::Abort],
                config.nranks,
            )
        });
        let retry = match answer {
            Ok((FrameType::Welcome, p)) => {
                let tag = wire::decode_welcome(&p).map_err(|e| protocol(root, &e))?;
                if !auth::verify(
                    config.id.secret(),
                    Label::Root,
                    &client_nonce,
                    &root_nonce,
                    &body,
                    &tag,
                ) {
                    return Err(Error::AuthFailed(format!(
                        "rank {}: the root at {root} accepted this rank but could not prove it \
                         knows the secret (an impostor at that address?)",
                        config.rank
                    )));
                }
                break (stream, claims, client_nonce, root_nonce);
            }
            Ok((_, p)) => return Err(abort_error(config, root, &p)),
            Err(FrameError::Timeout) => return Err(timed_out(Vec::new())),
            Err(e) if closed_unread(&e) => e,
            Err(e) => return Err(lost(root, "waiting for the root's proof", &e)),
        };
        tracing::debug!(
            target: "symcomm::bootstrap",
            "rank {}: the root at {root} closed the connection before deciding on this rank's \
             proof ({retry}); retrying",
            config.rank
        );
        let Some(left) = wire::remaining(deadline) else {
            return Err(timed_out(Vec::new()));
        };
        std::thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(Duration::from_millis(200));
    };

    let verdict = deadline + verdict_grace(config.timeout);
    let table = match read_frame(
        &stream,
        verdict,
        &[FrameType::Table, FrameType::Abort],
        config.nranks,
    ) {
        Ok((FrameType::Table, p)) => {
            let (table, table_body, tag) =
                wire::decode_table(&p).map_err(|e| protocol(root, &e))?;
            if !auth::verify(
                config.id.secret(),
                Label::Table,
                &client_nonce,
                &root_nonce,
                table_body,
                &tag,
            ) {
                return Err(Error::AuthFailed(format!(
                    "rank {}: the rank table from {root} does not carry the root's MAC",
                    config.rank
                )));
            }
            check_table(config, root, &claims, table)?
        }
        Ok((_, p)) => return Err(abort_error(config, root, &p)),
        Err(FrameError::Timeout) => return Err(timed_out(Vec::new())),
        Err(e) => return Err(lost(root, "waiting for the rank table", &e)),
    };

    // The link outlives init: plain blocking mode, no leftover timeouts.
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_write_timeout(None);
    Bootstrap::new(
        config,
        table,
        RootLink::Rank { root: stream },
        StrayStats::default(),
    )
}

/// Connects and exchanges hello / challenge, retrying while the root is not there yet or closes
/// the connection unread (its handshake slots are full).
fn open(
    config: &BootstrapConfig,
    root: SocketAddr,
    bind_ip: Option<std::net::IpAddr>,
    deadline: Instant,
) -> Result<(TcpStream, Nonce, Nonce)> {
    let timed_out_root = |detail: &str| {
        tracing::warn!(
            target: "symcomm::bootstrap",
            "rank {}: no answer from the root at {root} within {:?}: {detail}",
            config.rank,
            config.timeout
        );
        Error::InitTimeout {
            rank: config.rank,
            missing: vec![0],
            timeout_ms: millis(config.timeout),
            auth_failed: Vec::new(),
        }
    };
    let mut backoff = Duration::from_millis(5);
    loop {
        let stream = match net::connect(root, bind_ip, deadline) {
            Ok(s) => s,
            Err(ConnectError::Deadline(last)) => {
                let detail = last.map_or_else(|| "no connection".to_owned(), |e| e.to_string());
                return Err(timed_out_root(&detail));
            }
            Err(ConnectError::Fatal(e)) => return Err(e),
        };
        let client_nonce = auth::nonce()?;
        let hello = Hello {
            version: PROTOCOL_VERSION,
            nonce: client_nonce,
        };
        let retry = match write_frame(&stream, &hello.encode(), deadline) {
            Ok(()) => match read_frame(
                &stream,
                deadline,
                &[FrameType::Challenge, FrameType::Abort],
                config.nranks,
            ) {
                Ok((FrameType::Challenge, p)) => {
                    let c =
                        Challenge::decode(&p, PROTOCOL_VERSION).map_err(|e| protocol(root, &e))?;
                    if c.version != PROTOCOL_VERSION {
                        return Err(Error::VersionMismatch {
                            local: PROTOCOL_VERSION,
                            remote: c.version,
                            peer: format!("the root at {root}"),
                        });
                    }
                    return Ok((stream, client_nonce, c.nonce));
                }
                Ok((_, p)) => return Err(abort_error(config, root, &p)),
                Err(FrameError::Timeout) => {
                    return Err(timed_out_root("connected, but the root never answered"));
                }
                Err(e) if closed_unread(&e) => e,
                Err(e) => return Err(protocol(root, &e)),
            },
            Err(FrameError::Timeout) => {
                return Err(timed_out_root("connected, but could not send the hello"));
            }
            Err(e) => e,
        };
        tracing::debug!(
            target: "symcomm::bootstrap",
            "rank {}: the root at {root} closed the connection before the challenge ({retry}); retrying",
            config.rank
        );
        let Some(left) = wire::remaining(deadline) else {
            return Err(timed_out_root("the root kept closing the connection"));
        };
        std::thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(Duration::from_millis(200));
    }
}

/// The root closed or reset the connection without a word (too many handshakes at once).
fn closed_unread(e: &FrameError) -> bool {
    match e {
        FrameError::Eof => true,
        FrameError::Io(e) => matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
        ),
        _ => false,
    }
}

fn protocol(root: SocketAddr, e: &FrameError) -> Error {
    Error::Bootstrap {
        kind: BootstrapErrorKind::Protocol,
        detail: format!(
            "the root at {root} sent an invalid bootstrap frame ({e}); is it a symcomm root?"
        ),
    }
}

fn lost(root: SocketAddr, doing: &str, e: &FrameError) -> Error {
    match e {
        FrameError::UnknownType(_)
        | FrameError::Unexpected(_)
        | FrameError::TooLong { .. }
        | FrameError::Malformed(_) => protocol(root, e),
        _ => Error::Bootstrap {
            kind: BootstrapErrorKind::Disconnected,
            detail: format!("connection to the root at {root} lost while {doing}: {e}"),
        },
    }
}

/// Turns the root's abort frame into this rank's error.
fn abort_error(config: &BootstrapConfig, root: SocketAddr, payload: &[u8]) -> Error {
    let abort = match Abort::decode(payload) {
        Ok(a) => a,
        Err(e) => return protocol(root, &e),
    };
    let kind = |kind| Error::Bootstrap {
        kind,
        detail: format!("{} (reported by the root at {root})", abort.message),
    };
    match abort.code {
        AbortCode::AuthFailed => Error::AuthFailed(format!(
            "rank {}: the root at {root} rejected this rank's proof: the secrets differ (check \
             SYMCOMM_SECRET / SYMCOMM_ID on every rank)",
            config.rank
        )),
        AbortCode::VersionMismatch => Error::VersionMismatch {
            local: PROTOCOL_VERSION,
            remote: abort.value,
            peer: format!("the root at {root}"),
        },
        AbortCode::Timeout => Error::InitTimeout {
            rank: config.rank,
            missing: abort.missing,
            timeout_ms: millis(config.timeout),
            auth_failed: Vec::new(),
        },
        AbortCode::DuplicateRank => kind(BootstrapErrorKind::DuplicateRank),
        AbortCode::RankOutOfRange => kind(BootstrapErrorKind::RankOutOfRange),
        AbortCode::NranksMismatch => kind(BootstrapErrorKind::NranksMismatch),
        AbortCode::Stopped => kind(BootstrapErrorKind::Disconnected),
    }
}

/// The table must list ranks 0..nranks in order and show this rank as it introduced itself.
fn check_table(
    config: &BootstrapConfig,
    root: SocketAddr,
    me: &Claims,
    table: Vec<RankInfo>,
) -> Result<Vec<RankInfo>> {
    let bad = |why: String| Error::Bootstrap {
        kind: BootstrapErrorKind::Protocol,
        detail: format!("the rank table from {root} is inconsistent: {why}"),
    };
    if table.len() != config.nranks as usize {
        return Err(bad(format!(
            "{} entries for {} ranks",
            table.len(),
            config.nranks
        )));
    }
    if let Some((i, e)) = table
        .iter()
        .enumerate()
        .find(|(i, e)| e.rank as usize != *i)
    {
        return Err(bad(format!("entry {i} is rank {}", e.rank)));
    }
    let mine = &table[config.rank as usize];
    if mine.pid != me.pid || mine.addr != me.addr || mine.host_id != me.host_id {
        return Err(bad(format!(
            "this rank's entry {mine:?} is not what it sent"
        )));
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::io::Write;
    use std::net::TcpListener;

    use super::*;
    use crate::bootstrap::UniqueId;

    /// A fake root that reads the hello, then lets `script` answer.
    fn fake_root(
        script: impl FnOnce(&TcpStream, Hello) + Send + 'static,
    ) -> (UniqueId, std::thread::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let id = UniqueId::from_parts(l.local_addr().unwrap(), [7; 16]).unwrap();
        let h = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            let (_, p) = read_frame(&s, deadline, &[FrameType::Hello], 2).unwrap();
            let hello = Hello::decode(&p, PROTOCOL_VERSION).unwrap();
            script(&s, hello);
        });
        (id, h)
    }

    fn join(id: &UniqueId) -> Result<Bootstrap> {
        let config = BootstrapConfig::new(id.clone(), 1, 2).with_timeout(Duration::from_secs(3));
        super::run(&config, "host".into(), Instant::now())
    }

    #[test]
    fn a_root_that_cannot_prove_the_secret_is_refused() {
        let (id, h) = fake_root(|s, _hello| {
            let deadline = Instant::now() + Duration::from_secs(5);
            let c = Challenge {
                version: PROTOCOL_VERSION,
                nonce: [1; 32],
            };
            write_frame(s, &c.encode(), deadline).unwrap();
            // Accepts whatever proof arrives and answers with a made-up one.
            read_frame(s, deadline, &[FrameType::Auth], 2).unwrap();
            write_frame(s, &wire::encode_welcome(&[0; 32]), deadline).unwrap();
            std::thread::sleep(Duration::from_millis(100));
        });
        let t = Instant::now();
        let err = join(&id).unwrap_err();
        assert!(matches!(err, Error::AuthFailed(_)), "{err}");
        assert!(err.to_string().contains("could not prove"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(1));
        h.join().unwrap();
    }

    #[test]
    fn a_root_of_another_version_is_a_version_mismatch() {
        let (id, h) = fake_root(|s, _| {
            let c = Challenge {
                version: 9,
                nonce: [1; 32],
            };
            write_frame(s, &c.encode(), Instant::now() + Duration::from_secs(5)).unwrap();
            std::thread::sleep(Duration::from_millis(100));
        });
        let err = join(&id).unwrap_err();
        assert!(
            matches!(
                err,
                Error::VersionMismatch {
                    local: 1,
                    remote: 9,
                    ..
                }
            ),
            "{err}"
        );
        h.join().unwrap();
    }

    #[test]
    fn a_non_symcomm_server_is_a_protocol_error() {
        let (id, h) = fake_root(|s, _| {
            let mut w = s;
            w.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
            std::thread::sleep(Duration::from_millis(100));
        });
        let err = join(&id).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Bootstrap {
                    kind: BootstrapErrorKind::Protocol,
                    ..
                }
            ),
            "{err}"
        );
        h.join().unwrap();
    }

    #[test]
    fn a_connection_dropped_after_the_challenge_is_retried() {
        // A root that drops the first connection after reading its proof (as a flooded root
        // making room does), then completes the handshake on the second.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let id = UniqueId::from_parts(l.local_addr().unwrap(), [7; 16]).unwrap();
        let h = std::thread::spawn(move || {
            let secret = crate::bootstrap::id::Secret::from_bytes([7; 16]);
            for attempt in 0..2 {
                let (s, _) = l.accept().unwrap();
                let deadline = Instant::now() + Duration::from_secs(5);
                let (_, p) = read_frame(&s, deadline, &[FrameType::Hello], 2).unwrap();
                let hello = Hello::decode(&p, PROTOCOL_VERSION).unwrap();
                let rn = [attempt + 1; 32];
                let c = Challenge {
                    version: PROTOCOL_VERSION,
                    nonce: rn,
                };
                write_frame(&s, &c.encode(), deadline).unwrap();
                let (_, p) = read_frame(&s, deadline, &[FrameType::Auth], 2).unwrap();
                if attempt == 0 {
                    continue;
                }
                let (auth, body) = Auth::decode(&p).unwrap();
                let proof = auth::mac(&secret, Label::Root, &hello.nonce, &rn, body);
                write_frame(&s, &wire::encode_welcome(&proof), deadline).unwrap();
                let me = |rank, c: &Claims| RankInfo {
                    rank,
                    host_id: c.host_id.clone(),
                    addr: c.addr,
                    pid: c.pid,
                };
                let table = wire::encode_table_body(&[me(0, &auth.claims), me(1, &auth.claims)]);
                let tag = auth::mac(&secret, Label::Table, &hello.nonce, &rn, &table);
                write_frame(&s, &wire::encode_table(&table, &tag), deadline).unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let b = join(&id).unwrap();
        assert_eq!(b.table().len(), 2);
        h.join().unwrap();
    }

    #[test]
    fn a_forged_table_is_refused() {
        let (id, h) = fake_root(|s, hello| {
            let deadline = Instant::now() + Duration::from_secs(5);
            let secret = crate::bootstrap::id::Secret::from_bytes([7; 16]);
            let rn = [2; 32];
            let c = Challenge {
                version: PROTOCOL_VERSION,
                nonce: rn,
            };
            write_frame(s, &c.encode(), deadline).unwrap();
            let (_, p) = read_frame(s, deadline, &[FrameType::Auth], 2).unwrap();
            let (_, body) = Auth::decode(&p).unwrap();
            let proof = auth::mac(&secret, Label::Root, &hello.nonce, &rn, body);
            write_frame(s, &wire::encode_welcome(&proof), deadline).unwrap();
            // A table MACed under the wrong label.
            let table = wire::encode_table_body(&[]);
            let tag = auth::mac(&secret, Label::Root, &hello.nonce, &rn, &table);
            write_frame(s, &wire::encode_table(&table, &tag), deadline).unwrap();
            std::thread::sleep(Duration::from_millis(100));
        });
        let err = join(&id).unwrap_err();
        assert!(matches!(err, Error::AuthFailed(_)), "{err}");
        h.join().unwrap();
    }
}

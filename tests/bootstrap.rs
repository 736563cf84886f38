//! The bootstrap rendezvous with ranks as threads of this process, on loopback: tables and local
//! teams for 1–8 ranks, authentication (a wrong secret never joins, and the root's timeout says
//! so without the secret), stray traffic of every kind during init, ranks joining while the port
//! is flooded, timeouts that name the missing rank, duplicate / out-of-range / disagreeing
//! ranks, protocol versions, `UniqueId` strings and launcher variables.
//!
//! Timeouts are short (0.5–10 s) and every wait is bounded, so the file runs in a few seconds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use symcomm::bootstrap::{
    self, Bootstrap, BootstrapConfig, Launcher, LocalHint, RootLink, UniqueId,
};
use symcomm::{BootstrapErrorKind, Error, Result};

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// How late past its deadline a timed-out wait may return on a loaded machine (CI runs the tests
/// on 2 cores, beside builds): generous, while still far from a wait that ignores its deadline.
const SLACK: Duration = Duration::from_millis(1500);

fn new_id() -> UniqueId {
    UniqueId::new_on(LOOPBACK).unwrap()
}

fn config(id: &UniqueId, rank: u32, nranks: u32, timeout: Duration) -> BootstrapConfig {
    BootstrapConfig::new(id.clone(), rank, nranks)
        .with_timeout(timeout)
        .with_host_id("test-host")
}

/// Runs each configuration on its own thread; returns each result with its duration.
fn run_all(configs: Vec<BootstrapConfig>) -> Vec<(Result<Bootstrap>, Duration)> {
    let handles: Vec<_> = configs
        .into_iter()
        .map(|c| {
            thread::spawn(move || {
                let t = Instant::now();
                let r = bootstrap::init_with(&c);
                (r, t.elapsed())
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn spawn_rank(c: BootstrapConfig) -> thread::JoinHandle<(Result<Bootstrap>, Duration)> {
    thread::spawn(move || {
        let t = Instant::now();
        let r = bootstrap::init_with(&c);
        (r, t.elapsed())
    })
}

fn secret_hex(id: &UniqueId) -> String {
    id.to_string().rsplit(':').next().unwrap().to_owned()
}

fn secret_bytes(id: &UniqueId) -> Vec<u8> {
    let hex = secret_hex(id);
    (0..16)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Raw protocol, written from the documentation in `symcomm::bootstrap`, to play hostile or
// broken clients.

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![kind];
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn hello(version: u32, nonce: [u8; 32]) -> Vec<u8> {
    let mut p = b"SYMC".to_vec();
    p.extend_from_slice(&version.to_be_bytes());
    p.extend_from_slice(&nonce);
    frame(1, &p)
}

fn read_raw(s: &mut TcpStream) -> (u8, Vec<u8>) {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut h = [0u8; 5];
    s.read_exact(&mut h).unwrap();
    let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
    assert!(len < 1 << 16, "{len}");
    let mut p = vec![0u8; len];
    s.read_exact(&mut p).unwrap();
    (h[0], p)
}

/// A client that knows the secret (when given) and claims `rank` of `nranks`; returns the
/// root's answer to its proof.
fn raw_join(id: &UniqueId, secret: &[u8], rank: u32, nranks: u32) -> (u8, Vec<u8>) {
    let mut s = TcpStream::connect(id.addr()).unwrap();
    let cn = [0x11u8; 32];
    s.write_all(&hello(1, cn)).unwrap();
    let (kind, challenge) = read_raw(&mut s);
    assert_eq!(kind, 2, "challenge");
    assert_eq!(&challenge[..4], &1u32.to_be_bytes());
    let rn = &challenge[4..36];
    let mut body = Vec::new();
    body.extend_from_slice(&rank.to_be_bytes());
    body.extend_from_slice(&nranks.to_be_bytes());
    body.extend_from_slice(&std::process::id().to_be_bytes());
    body.push(4);
    body.extend_from_slice(&[127, 0, 0, 1]);
    body.extend_from_slice(&[0u8; 12]);
    let host = b"raw-host";
    body.extend_from_slice(&(host.len() as u16).to_be_bytes());
    body.extend_from_slice(host);
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap();
    mac.update(b"symcomm/1/client");
    mac.update(&cn);
    mac.update(rn);
    mac.update(&body);
    let tag = mac.finalize().into_bytes();
    let mut p = body;
    p.extend_from_slice(&tag);
    s.write_all(&frame(3, &p)).unwrap();
    read_raw(&mut s)
}

/// Waits until the root closes `s` (EOF or reset), within `limit`.
fn wait_closed(mut s: TcpStream, limit: Duration) -> Duration {
    let t = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return t.elapsed(),
            Ok(_) => {}
        }
        assert!(t.elapsed() < limit, "the root never closed the connection");
    }
}

// ---------------------------------------------------------------------------------------------

#[test]
fn one_to_eight_ranks_agree_on_the_table_and_keep_their_links() {
    for n in 1..=8u32 {
        let id = new_id();
        let t = Instant::now();
        let results = run_all(
            (0..n)
                .map(|r| config(&id, r, n, Duration::from_secs(10)))
                .collect(),
        );
        let elapsed = t.elapsed();
        let boots: Vec<Bootstrap> = results
            .into_iter()
            .map(|(r, _)| r.unwrap_or_else(|e| panic!("{n} ranks: {e}")))
            .collect();
        assert!(
            elapsed < Duration::from_secs(3),
            "{n} ranks took {elapsed:?}"
        );
        let table = boots[0].table().to_vec();
        assert_eq!(table.len(), n as usize);
        for (r, b) in boots.iter().enumerate() {
            assert_eq!(b.rank(), r as u32);
            assert_eq!(b.nranks(), n);
            assert_eq!(b.table(), table.as_slice(), "rank {r}'s table differs");
            assert_eq!(b.table()[r].rank, r as u32);
            assert_eq!(b.table()[r].pid, std::process::id());
            assert_eq!(b.table()[r].host_id, "test-host");
            assert!(b.table()[r].addr.is_loopback());
            assert_eq!(
                b.local_team().ranks(),
                (0..n).collect::<Vec<_>>().as_slice()
            );
            assert_eq!(b.local_team().index(), r as u32);
            assert_eq!(b.strays().total(), 0);
        }
        // The links are live and pair up: the root's stream to rank r is rank r's stream.
        let root = &boots[0];
        assert!(matches!(root.link(), RootLink::Root { peers } if peers.len() == n as usize));
        assert!(root.link().peer_stream(0).is_none());
        for b in &boots[1..] {
            let mine = b.link().root_stream().unwrap();
            let theirs = root.link().peer_stream(b.rank()).unwrap();
            assert_eq!(mine.local_addr().unwrap(), theirs.peer_addr().unwrap());
            assert_eq!(mine.peer_addr().unwrap(), id.addr());
        }
        eprintln!("{n} ranks: {:.1} ms", elapsed.as_secs_f64() * 1e3);
    }
}

#[test]
fn a_closed_link_is_seen_by_the_root() {
    let id = new_id();
    let mut boots: Vec<Bootstrap> = run_all(
        (0..3)
            .map(|r| config(&id, r, 3, Duration::from_secs(5)))
            .collect(),
    )
    .into_iter()
    .map(|(r, _)| r.unwrap())
    .collect();
    let rank2 = boots.pop().unwrap();
    drop(rank2);
    let mut s = boots[0].link().peer_stream(2).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(s.read(&mut b).unwrap(), 0, "EOF after rank 2 left");
    // Rank 1's link is still open (no data, no EOF).
    let mut s1 = boots[0].link().peer_stream(1).unwrap();
    s1.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    assert!(
        s1.read(&mut b).is_err(),
        "rank 1's link should be idle, not closed"
    );
}

#[test]
fn two_simulated_hosts_give_two_local_teams() {
    let id = new_id();
    let hosts = ["node-a", "node-b", "node-a", "node-b", "node-b"];
    let results = run_all(
        (0..5u32)
            .map(|r| {
                BootstrapConfig::new(id.clone(), r, 5)
                    .with_timeout(Duration::from_secs(5))
                    .with_host_id(hosts[r as usize])
            })
            .collect(),
    );
    for (r, (res, _)) in results.into_iter().enumerate() {
        let b = res.unwrap();
        let (team, index): (&[u32], u32) = match r {
            0 => (&[0, 2], 0),
            2 => (&[0, 2], 1),
            1 => (&[1, 3, 4], 0),
            3 => (&[1, 3, 4], 1),
            _ => (&[1, 3, 4], 2),
        };
        assert_eq!(b.local_team().ranks(), team, "rank {r}");
        assert_eq!(b.local_team().index(), index, "rank {r}");
        assert_eq!(b.table()[3].host_id, "node-b");
    }
}

#[test]
fn a_wrong_secret_is_refused_quickly_and_never_joins() {
    let id = new_id();
    let impostor = UniqueId::from_parts(id.addr(), [0x5a; 16]).unwrap();
    let root = spawn_rank(config(&id, 0, 3, Duration::from_secs(10)));
    // The impostor claims rank 1 before the real rank 1 arrives.
    let t = Instant::now();
    let err = bootstrap::init_with(&config(&impostor, 1, 3, Duration::from_secs(10))).unwrap_err();
    let refused_in = t.elapsed();
    assert!(matches!(err, Error::AuthFailed(_)), "{err}");
    assert!(refused_in < Duration::from_secs(1), "{refused_in:?}");
    // The legitimate ranks complete.
    let legit: Vec<_> = (1..3)
        .map(|r| spawn_rank(config(&id, r, 3, Duration::from_secs(10))))
        .collect();
    let (root, root_time) = root.join().unwrap();
    let root = root.unwrap();
    for h in legit {
        h.join().unwrap().0.unwrap();
    }
    assert_eq!(root.strays().auth_failed, 1);
    assert_eq!(root.strays().total(), 1);
    assert!(root_time < Duration::from_secs(3), "{root_time:?}");
    eprintln!("wrong secret refused in {refused_in:?}; rendezvous in {root_time:?}");
}

#[test]
fn the_roots_timeout_says_a_rank_failed_authentication_without_the_secret() {
    let id = new_id();
    let impostor = UniqueId::from_parts(id.addr(), [0x5a; 16]).unwrap();
    let timeout = Duration::from_millis(1500);
    let root = spawn_rank(config(&id, 0, 3, timeout));
    let rank2 = spawn_rank(config(&id, 2, 3, timeout));
    let refused = bootstrap::init_with(&config(&impostor, 1, 3, timeout)).unwrap_err();
    assert!(matches!(refused, Error::AuthFailed(_)), "{refused}");
    let root_err = root.join().unwrap().0.unwrap_err();
    match &root_err {
        Error::InitTimeout {
            rank: 0,
            missing,
            auth_failed,
            ..
        } => {
            assert_eq!(missing, &[1], "{root_err}");
            assert_eq!(auth_failed, &[1], "{root_err}");
        }
        e => panic!("root: {e}"),
    }
    let text = root_err.to_string();
    assert!(
        text.contains("ranks that never joined: [1]")
            && text.contains("a connection claiming rank 1 failed authentication"),
        "{text}"
    );
    // The other ranks hear the plain verdict.
    let rank2_err = rank2.join().unwrap().0.unwrap_err();
    assert!(
        matches!(&rank2_err, Error::InitTimeout { missing, auth_failed, .. }
            if missing == &[1] && auth_failed.is_empty()),
        "{rank2_err}"
    );
    for e in [&root_err, &refused, &rank2_err] {
        let shown = format!("{e} / {e:?}").to_lowercase();
        for secret in [secret_hex(&id), secret_hex(&impostor)] {
            assert!(!shown.contains(&secret.to_lowercase()), "{shown}");
        }
    }
    eprintln!("root: {root_err}");
}

#[test]
fn ranks_get_in_while_the_port_is_flooded() {
    let n = 4;
    // Far longer than the 10 s handshake deadline that silent connections used to hold a slot
    // for; the ranks must get in long before either.
    let timeout = Duration::from_secs(20);
    let bound = Duration::from_secs(1) + SLACK;
    let j = support::flood::timed_join(n, timeout, Some(support::flood::ISSUE_11));
    for (i, (res, took)) in j.ranks.into_iter().enumerate() {
        res.unwrap_or_else(|e| panic!("rank {} after {took:?}: {e}", i + 1));
    }
    let root = j.root.unwrap();
    let joined_in = j.joined_in;
    assert!(
        joined_in < bound,
        "ranks joined in {joined_in:?} under the flood (bound {bound:?})"
    );
    let s = root.strays();
    assert!(s.total() >= 200, "{s:?}");
    eprintln!(
        "flood of {} connections: {} ranks joined in {joined_in:?}; {s:?}",
        j.opened,
        n - 1
    );
}

#[test]
fn stray_traffic_during_init_is_dropped_and_counted() {
    let id = new_id();
    let n = 4;
    let root = spawn_rank(config(&id, 0, n, Duration::from_secs(10)));
    let addr = id.addr();

    // Port-scan style: connect and close at once.
    for _ in 0..3 {
        drop(TcpStream::connect(addr).unwrap());
    }
    // Strays the root answers by closing: we wait for that before starting the real ranks.
    let mut answered = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        answered.push(s);
    }
    for seed in 0..2u32 {
        let mut s = TcpStream::connect(addr).unwrap();
        let junk: Vec<u8> = (0..512u32)
            .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed * 97) >> 13) as u8 | 0x80)
            .collect();
        s.write_all(&junk).unwrap();
        answered.push(s);
    }
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&[1, 0xff, 0xff, 0xff, 0xff]).unwrap(); // a hello of 4 GiB
        answered.push(s);
    }
    {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&hello(2, [0; 32])).unwrap(); // another protocol version
        answered.push(s);
    }
    // Slow writers: a valid hello, one byte every 100 ms, until the root hangs up.
    let stop = Arc::new(AtomicBool::new(false));
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let stop = Arc::clone(&stop);
            let mut s = TcpStream::connect(addr).unwrap();
            thread::spawn(move || {
                for b in hello(1, [3; 32]) {
                    if stop.load(Ordering::SeqCst) || s.write_all(&[b]).is_err() {
                        return;
                    }
                    thread::sleep(Duration::from_millis(100));
                }
            })
        })
        .collect();
    // A rank with the wrong secret.
    let impostor = UniqueId::from_parts(addr, [1; 16]).unwrap();
    let impostor = spawn_rank(config(&impostor, 2, n, Duration::from_secs(10)));
    for s in answered {
        wait_closed(s, Duration::from_secs(5));
    }
    assert!(matches!(
        impostor.join().unwrap().0,
        Err(Error::AuthFailed(_))
    ));

    // Now the real ranks: they finish quickly although slow writers still hold handshakes.
    let t = Instant::now();
    let ranks: Vec<_> = (1..n)
        .map(|r| spawn_rank(config(&id, r, n, Duration::from_secs(10))))
        .collect();
    for h in ranks {
        h.join().unwrap().0.unwrap();
    }
    let (root, _) = root.join().unwrap();
    let elapsed = t.elapsed();
    stop.store(true, Ordering::SeqCst);
    for h in slow {
        h.join().unwrap();
    }
    let root = root.unwrap();
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    let s = root.strays();
    assert_eq!(s.closed_early, 3, "{s:?}");
    assert_eq!(s.malformed, 6, "{s:?}");
    assert_eq!(s.version_mismatch, 1, "{s:?}");
    assert_eq!(s.auth_failed, 1, "{s:?}");
    assert_eq!(s.timed_out, 2, "{s:?}");
    assert_eq!(s.total(), 13, "{s:?}");
    eprintln!("13 strays; legitimate ranks joined in {elapsed:?}");
}

#[test]
fn a_slow_writer_is_cut_at_its_handshake_deadline() {
    let id = new_id();
    let root = spawn_rank(
        config(&id, 0, 2, Duration::from_secs(5))
            .with_handshake_timeout(Duration::from_millis(300)),
    );
    let s = TcpStream::connect(id.addr()).unwrap();
    let mut w = s.try_clone().unwrap();
    let writer = thread::spawn(move || {
        for b in hello(1, [3; 32]) {
            if w.write_all(&[b]).is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
    });
    let closed_after = wait_closed(s, Duration::from_secs(3));
    assert!(
        closed_after >= Duration::from_millis(250) && closed_after < Duration::from_millis(2500),
        "{closed_after:?}"
    );
    writer.join().unwrap();
    bootstrap::init_with(&config(&id, 1, 2, Duration::from_secs(5))).unwrap();
    let root = root.join().unwrap().0.unwrap();
    assert_eq!(root.strays().timed_out, 1);
    eprintln!("slow writer cut after {closed_after:?}");
}

#[test]
fn a_rank_that_never_starts_is_named_by_everyone_within_the_timeout() {
    let id = new_id();
    let timeout = Duration::from_secs(1);
    let results = run_all(
        [0, 1, 3]
            .into_iter()
            .map(|r| config(&id, r, 4, timeout))
            .collect(),
    );
    for (r, (res, took)) in results.into_iter().enumerate() {
        let err = res.unwrap_err();
        match &err {
            Error::InitTimeout {
                missing,
                timeout_ms,
                ..
            } => {
                assert_eq!(missing, &[2], "rank index {r}: {err}");
                assert_eq!(*timeout_ms, 1000);
            }
            _ => panic!("rank index {r}: {err}"),
        }
        assert!(err.to_string().contains("[2]"), "{err}");
        // The root's clock decides; the others started a hair later.
        assert!(
            took >= timeout - Duration::from_millis(100) && took < timeout + SLACK,
            "rank index {r} took {took:?}"
        );
    }
}

#[test]
fn a_missing_root_is_named_by_every_rank() {
    // The root's port is reserved (listening) but rank 0 never calls init.
    let id = new_id();
    let timeout = Duration::from_millis(500);
    let results = run_all((1..3).map(|r| config(&id, r, 3, timeout)).collect());
    for (res, took) in results {
        let err = res.unwrap_err();
        assert!(
            matches!(&err, Error::InitTimeout { missing, .. } if missing == &[0]),
            "{err}"
        );
        assert!(took >= timeout && took < timeout + SLACK, "{took:?}");
    }
    // Nobody listens at all.
    let free = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let id = UniqueId::from_parts(free, [2; 16]).unwrap();
    let t = Instant::now();
    let err = bootstrap::init_with(&config(&id, 1, 2, timeout)).unwrap_err();
    assert!(
        matches!(&err, Error::InitTimeout { missing, .. } if missing == &[0]),
        "{err}"
    );
    assert!(t.elapsed() < timeout + SLACK, "{:?}", t.elapsed());
}

#[test]
fn a_duplicate_rank_stops_the_rendezvous_for_everyone() {
    let id = new_id();
    let timeout = Duration::from_secs(5);
    let root = spawn_rank(config(&id, 0, 3, timeout));
    let first = spawn_rank(config(&id, 1, 3, timeout));
    thread::sleep(Duration::from_millis(300));
    let second = spawn_rank(config(&id, 1, 3, timeout));
    for (who, h) in [
        ("root", root),
        ("first rank 1", first),
        ("second rank 1", second),
    ] {
        let (res, took) = h.join().unwrap();
        let err = res.unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Bootstrap {
                    kind: BootstrapErrorKind::DuplicateRank,
                    detail
                } if detail.contains("rank 1 joined twice")
            ),
            "{who}: {err}"
        );
        assert!(took < Duration::from_secs(2), "{who} took {took:?}");
    }
}

#[test]
fn ranks_that_disagree_on_nranks_stop_the_rendezvous() {
    let id = new_id();
    let timeout = Duration::from_secs(5);
    let root = spawn_rank(config(&id, 0, 3, timeout));
    let one = spawn_rank(config(&id, 1, 3, timeout));
    thread::sleep(Duration::from_millis(300));
    let two = spawn_rank(config(&id, 2, 4, timeout));
    for (who, h) in [("root", root), ("rank 1", one), ("rank 2", two)] {
        let (res, took) = h.join().unwrap();
        let err = res.unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Bootstrap {
                    kind: BootstrapErrorKind::NranksMismatch,
                    detail
                } if detail.contains("nranks = 4") && detail.contains("nranks = 3")
            ),
            "{who}: {err}"
        );
        assert!(took < Duration::from_secs(2), "{who} took {took:?}");
    }
}

#[test]
fn out_of_range_ranks_are_rejected() {
    let id = new_id();
    // Locally, before any I/O.
    for (rank, nranks) in [(4, 4), (0, 0), (u32::MAX, 3), (0, u32::MAX)] {
        let t = Instant::now();
        let err =
            bootstrap::init_with(&config(&id, rank, nranks, Duration::from_secs(5))).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        // Far below the 5 s timeout: refused before any I/O.
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }
    // By the root, from a client that knows the secret but claims rank 7 of 3: refused, counted,
    // and the real ranks still complete.
    let root = spawn_rank(config(&id, 0, 3, Duration::from_secs(5)));
    let (kind, payload) = raw_join(&id, &secret_bytes(&id), 7, 3);
    assert_eq!(kind, 5, "abort");
    assert_eq!(payload[0], 4, "RankOutOfRange");
    assert_eq!(&payload[1..5], &7u32.to_be_bytes());
    let legit: Vec<_> = (1..3)
        .map(|r| spawn_rank(config(&id, r, 3, Duration::from_secs(5))))
        .collect();
    for h in legit {
        h.join().unwrap().0.unwrap();
    }
    let root = root.join().unwrap().0.unwrap();
    assert_eq!(root.strays().bad_rank, 1);
}

#[test]
fn other_protocol_versions_are_refused_with_both_versions() {
    let id = new_id();
    let root = spawn_rank(config(&id, 0, 2, Duration::from_secs(5)));
    let mut s = TcpStream::connect(id.addr()).unwrap();
    // A longer version-2 hello still gets a version answer, not a length error.
    let mut p = b"SYMC".to_vec();
    p.extend_from_slice(&2u32.to_be_bytes());
    p.extend_from_slice(&[0u8; 100]);
    s.write_all(&frame(1, &p)).unwrap();
    let (kind, payload) = read_raw(&mut s);
    assert_eq!((kind, payload[0]), (5, 2), "Abort(VersionMismatch)");
    assert_eq!(&payload[1..5], &1u32.to_be_bytes(), "the root's version");
    let msg = String::from_utf8_lossy(&payload);
    assert!(msg.contains("version 1") && msg.contains('2'), "{msg}");
    bootstrap::init_with(&config(&id, 1, 2, Duration::from_secs(5))).unwrap();
    let root = root.join().unwrap().0.unwrap();
    assert_eq!(root.strays().version_mismatch, 1);
    // The string form carries the version too.
    let v2 = id.to_string().replacen("symcomm1:", "symcomm2:", 1);
    let err = v2.parse::<UniqueId>().unwrap_err().to_string();
    assert!(
        err.contains("version 2") && err.contains("version 1"),
        "{err}"
    );
}

#[test]
fn ids_are_single_use() {
    let id = new_id();
    bootstrap::init_with(&config(&id, 0, 1, Duration::from_secs(1))).unwrap();
    let err = bootstrap::init_with(&config(&id, 0, 1, Duration::from_secs(1))).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("single-use")),
        "{err}"
    );
}

#[test]
fn unique_ids_round_trip_through_strings() {
    let id = new_id();
    let text = id.to_string();
    assert!(text.starts_with("symcomm1:127.0.0.1:"), "{text}");
    assert_eq!(text.parse::<UniqueId>().unwrap(), id);
    assert_eq!(id.version(), bootstrap::PROTOCOL_VERSION);
    let debug = format!("{id:?}");
    assert!(!debug.contains(&secret_hex(&id)), "{debug}");
    assert!(debug.contains(&id.fingerprint()));

    let v6 = UniqueId::from_parts("[fd00::5]:29500".parse().unwrap(), [0xab; 16]).unwrap();
    assert_eq!(
        v6.to_string(),
        format!("symcomm1:[fd00::5]:29500:{}", "ab".repeat(16))
    );
    assert_eq!(v6.to_string().parse::<UniqueId>().unwrap(), v6);
    assert_eq!(
        format!("  {v6}\n").parse::<UniqueId>().unwrap(),
        v6,
        "surrounding whitespace is ignored"
    );

    let secret = "0123456789abcdef0123456789abcdef";
    let bad = [
        String::new(),
        "symcomm".into(),
        "symcomm1".into(),
        format!("nccl1:127.0.0.1:5000:{secret}"),
        format!("symcommX:127.0.0.1:5000:{secret}"),
        format!("symcomm1:127.0.0.1:{secret}"),
        format!("symcomm1:localhost:5000:{secret}"),
        format!("symcomm1:0.0.0.0:5000:{secret}"),
        format!("symcomm1:127.0.0.1:0:{secret}"),
        format!("symcomm1:127.0.0.1:70000:{secret}"),
        format!("symcomm1:fd00::5:5000:{secret}"),
        "symcomm1:127.0.0.1:5000:0123".into(),
        format!("symcomm1:127.0.0.1:5000:{secret}00"),
        "symcomm1:127.0.0.1:5000:0123456789abcdef0123456789abcdeg".into(),
    ];
    for s in &bad {
        let err = s.parse::<UniqueId>().unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::InvalidArgument(_)), "{s}: {msg}");
        assert!(msg.contains("invalid UniqueId"), "{s}: {msg}");
        assert!(!msg.contains(secret), "an error echoed the secret: {msg}");
    }
    assert!(UniqueId::from_parts("0.0.0.0:5000".parse().unwrap(), [0; 16]).is_err());
    assert!(UniqueId::new_on("0.0.0.0".parse().unwrap()).is_err());
}

#[test]
fn unique_id_new_binds_a_real_address_not_the_wildcard() {
    let id = UniqueId::new().unwrap();
    assert!(!id.addr().ip().is_unspecified());
    assert_ne!(id.addr().port(), 0);
    // The port is reserved: binding it again fails.
    assert!(TcpListener::bind(id.addr()).is_err());
    let a = UniqueId::random_secret().unwrap();
    assert_ne!(a, UniqueId::random_secret().unwrap());
}

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

const SECRET: &str = "00112233445566778899aabbccddeeff";

#[test]
fn from_vars_reads_torchrun() {
    let c = BootstrapConfig::from_vars(vars(&[
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("SYMCOMM_SECRET", SECRET),
        ("SYMCOMM_INIT_TIMEOUT", "2.5s"),
        ("SYMCOMM_HOST_ID", "node7"),
        ("SYMCOMM_SOCKET_IFNAME", "eth0"),
        // Slurm variables around a torchrun job: torchrun's win.
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
    ]))
    .unwrap();
    assert_eq!((c.rank, c.nranks, c.launcher), (3, 8, Launcher::Torchrun));
    assert_eq!(c.id.addr(), "10.0.0.1:29501".parse::<SocketAddr>().unwrap());
    assert_eq!(secret_hex(&c.id), SECRET);
    assert!(c.authenticated);
    assert_eq!(c.timeout, Duration::from_millis(2500));
    assert_eq!(c.host_id.as_deref(), Some("node7"));
    assert_eq!(c.ifname.as_deref(), Some("eth0"));
    assert_eq!(
        c.local_hint,
        Some(LocalHint {
            local_rank: 1,
            local_size: Some(4)
        })
    );
    // SYMCOMM_PORT overrides MASTER_PORT + 1; host names resolve.
    let c = BootstrapConfig::from_vars(vars(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "localhost"),
        ("SYMCOMM_PORT", "4000"),
    ]))
    .unwrap();
    assert_eq!(c.id.addr().port(), 4000);
    assert!(c.id.addr().ip().is_loopback());
    assert!(!c.authenticated);
    assert_eq!(c.timeout, bootstrap::DEFAULT_INIT_TIMEOUT);
}

#[test]
fn from_vars_reads_open_mpi_mpich_and_slurm() {
    let id = UniqueId::from_parts("10.0.0.9:5000".parse().unwrap(), [9; 16]).unwrap();
    let c = BootstrapConfig::from_vars(vars(&[
        ("OMPI_COMM_WORLD_RANK", "5"),
        ("OMPI_COMM_WORLD_SIZE", "6"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "3"),
        ("SYMCOMM_ID", &id.to_string()),
    ]))
    .unwrap();
    assert_eq!((c.rank, c.nranks, c.launcher), (5, 6, Launcher::OpenMpi));
    assert_eq!(c.id, id);
    assert!(c.authenticated);
    assert_eq!(
        c.local_hint,
        Some(LocalHint {
            local_rank: 2,
            local_size: Some(3)
        })
    );

    let c = BootstrapConfig::from_vars(vars(&[
        ("PMI_RANK", "1"),
        ("PMI_SIZE", "2"),
        ("MPI_LOCALRANKID", "1"),
        ("MPI_LOCALNRANKS", "2"),
        ("SYMCOMM_ID", &id.to_string()),
    ]))
    .unwrap();
    assert_eq!((c.rank, c.nranks, c.launcher), (1, 2, Launcher::Mpich));

    let c = BootstrapConfig::from_vars(vars(&[
        ("SLURM_PROCID", "7"),
        ("SLURM_NPROCS", "16"),
        ("SLURM_LOCALID", "3"),
        ("SLURM_NTASKS_PER_NODE", "4(x2),8"),
        ("SLURM_JOB_ID", "4242"),
        ("MASTER_ADDR", "10.0.0.2"),
        ("MASTER_PORT", "29500"),
    ]))
    .unwrap();
    assert_eq!((c.rank, c.nranks, c.launcher), (7, 16, Launcher::Slurm));
    assert_eq!(
        c.local_hint,
        Some(LocalHint {
            local_rank: 3,
            local_size: None
        })
    );
    assert!(!c.authenticated);
    // Without a secret, ranks of one job derive the same one, other jobs another.
    let same_job = BootstrapConfig::from_vars(vars(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "16"),
        ("SLURM_JOB_ID", "4242"),
        ("MASTER_ADDR", "10.0.0.2"),
        ("MASTER_PORT", "29500"),
    ]))
    .unwrap();
    assert_eq!(same_job.id, c.id);
    let other_job = BootstrapConfig::from_vars(vars(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "16"),
        ("SLURM_JOB_ID", "4243"),
        ("MASTER_ADDR", "10.0.0.2"),
        ("MASTER_PORT", "29500"),
    ]))
    .unwrap();
    assert_ne!(other_job.id, c.id);
}

#[test]
fn from_vars_names_the_bad_variable() {
    let base = [("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500")];
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[], "no launcher variables"),
        (&[("RANK", "1")], "WORLD_SIZE"),
        (&[("WORLD_SIZE", "4")], "RANK"),
        (&[("RANK", "x"), ("WORLD_SIZE", "4")], "RANK=x"),
        (&[("RANK", "4"), ("WORLD_SIZE", "4")], "RANK=4"),
        (&[("RANK", "0"), ("WORLD_SIZE", "0")], "WORLD_SIZE is 0"),
        (&[("RANK", "-1"), ("WORLD_SIZE", "4")], "RANK=-1"),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("SYMCOMM_SECRET", "abc"),
            ],
            "SYMCOMM_SECRET",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("SYMCOMM_INIT_TIMEOUT", "soon"),
            ],
            "SYMCOMM_INIT_TIMEOUT",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("SYMCOMM_INIT_TIMEOUT", "0"),
            ],
            "SYMCOMM_INIT_TIMEOUT",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("SYMCOMM_PORT", "70000"),
            ],
            "SYMCOMM_PORT",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("SYMCOMM_ID", "symcomm1:nope"),
            ],
            "SYMCOMM_ID",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("SYMCOMM_HOST_ID", "a\u{7}b"),
            ],
            "host id",
        ),
    ];
    for (extra, want) in cases {
        let mut all: Vec<(&str, &str)> = base.to_vec();
        all.extend_from_slice(extra);
        let err = BootstrapConfig::from_vars(vars(&all)).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{extra:?}: {err}");
        assert!(err.to_string().contains(want), "{extra:?}: {err}");
    }
    let id = new_id().to_string();
    let both = BootstrapConfig::from_vars(vars(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("SYMCOMM_ID", &id),
        ("SYMCOMM_SECRET", SECRET),
    ]))
    .unwrap_err();
    assert!(both.to_string().contains("only one"), "{both}");
    let no_root =
        BootstrapConfig::from_vars(vars(&[("RANK", "0"), ("WORLD_SIZE", "2")])).unwrap_err();
    assert!(no_root.to_string().contains("MASTER_ADDR"), "{no_root}");
    let no_port = BootstrapConfig::from_vars(vars(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.1"),
    ]))
    .unwrap_err();
    assert!(no_port.to_string().contains("MASTER_PORT"), "{no_port}");
}

#[test]
fn configs_from_launcher_variables_complete_a_rendezvous() {
    let port = symcomm::bootstrap::free_port(Ipv4Addr::LOCALHOST.into())
        .unwrap()
        .to_string();
    let configs: Vec<BootstrapConfig> = (0..3)
        .map(|r| {
            let rank = r.to_string();
            BootstrapConfig::from_vars(vars(&[
                ("RANK", &rank),
                ("WORLD_SIZE", "3"),
                ("LOCAL_RANK", &rank),
                ("LOCAL_WORLD_SIZE", "3"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("SYMCOMM_PORT", &port),
                ("SYMCOMM_SECRET", SECRET),
                ("SYMCOMM_INIT_TIMEOUT", "5"),
                ("SYMCOMM_HOST_ID", "launcher-host"),
            ]))
            .unwrap()
        })
        .collect();
    for (r, (res, _)) in run_all(configs).into_iter().enumerate() {
        let b = res.unwrap();
        assert_eq!(b.local_team().index(), r as u32);
        assert_eq!(b.local_team().size(), 3);
    }
}

#[test]
fn init_takes_an_id_rank_count_and_timeout() {
    let id = new_id();
    let handles: Vec<_> = (0..2)
        .map(|r| {
            let id = id.clone();
            thread::spawn(move || bootstrap::init(&id, r, 2, Some(Duration::from_secs(5))))
        })
        .collect();
    for h in handles {
        let b = h.join().unwrap().unwrap();
        assert_eq!(b.table()[0].host_id, b.table()[1].host_id);
        assert_eq!(b.local_team().size(), 2);
    }
}

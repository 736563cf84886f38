//! Properties of the bootstrap wire format (`symcomm::testing::wire`), with proptest:
//! encode∘decode is the identity on every frame type, any bytes decode to a message or a
//! typed refusal (never a panic), a frame that decodes re-encodes to the same bytes, and a
//! truncated or overlong frame is refused. Also checks that the fuzz corpus seeds
//! (`fuzz/corpus/wire/`) are current frames (`SYMCOMM_UPDATE_SEEDS=1` rewrites them).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::collection::vec;
use proptest::prelude::*;
use symcomm::RankInfo;
use symcomm::bootstrap::PROTOCOL_VERSION;
use symcomm::testing::wire::{self, MAC_LEN, MAX_GATHER, MAX_HOST_ID, MAX_MESSAGE, Message};

fn addr() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(|b| IpAddr::V4(Ipv4Addr::from(b))),
        any::<[u8; 16]>().prop_map(|b| IpAddr::V6(Ipv6Addr::from(b))),
    ]
}

/// A string of at most `max` bytes (what the encoder keeps whole).
fn text(max: usize) -> impl Strategy<Value = String> {
    ".{0,64}".prop_map(move |s: String| {
        let mut end = s.len().min(max);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s[..end].to_owned()
    })
}

fn rank_info() -> impl Strategy<Value = RankInfo> {
    (any::<u32>(), text(MAX_HOST_ID), addr(), any::<u32>()).prop_map(
        |(rank, host_id, addr, pid)| RankInfo {
            rank,
            host_id,
            addr,
            pid,
        },
    )
}

/// Any valid message of a job of `nranks` ranks.
fn message(nranks: u32) -> impl Strategy<Value = Message> {
    let n = nranks as usize;
    prop_oneof![
        (
            prop_oneof![Just(PROTOCOL_VERSION), any::<u32>()],
            any::<[u8; 32]>()
        )
            .prop_map(|(version, nonce)| Message::Hello {
                version,
                // Another version's nonce is not read: it decodes as zeros.
                nonce: if version == PROTOCOL_VERSION {
                    nonce
                } else {
                    [0; 32]
                },
            }),
        (
            prop_oneof![Just(PROTOCOL_VERSION), any::<u32>()],
            any::<[u8; 32]>()
        )
            .prop_map(|(version, nonce)| Message::Challenge {
                version,
                nonce: if version == PROTOCOL_VERSION {
                    nonce
                } else {
                    [0; 32]
                },
            }),
        (
            any::<(u32, u32, u32)>(),
            addr(),
            text(MAX_HOST_ID),
            any::<[u8; MAC_LEN]>()
        )
            .prop_map(|((rank, nranks, pid), addr, host_id, mac)| Message::Auth {
                rank,
                nranks,
                pid,
                addr,
                host_id,
                mac
            }),
        any::<[u8; MAC_LEN]>().prop_map(|mac| Message::Welcome { mac }),
        (
            1u8..=7,
            any::<u32>(),
            vec(any::<u32>(), 0..=n),
            text(MAX_MESSAGE)
        )
            .prop_map(|(code, value, missing, message)| Message::Abort {
                code,
                value,
                missing,
                message
            }),
        (vec(rank_info(), 0..=n), any::<[u8; MAC_LEN]>())
            .prop_map(|(entries, mac)| Message::Table { entries, mac }),
        Just(Message::Heartbeat),
        (any::<u64>(), any::<u32>(), vec(any::<u8>(), 0..=MAX_GATHER))
            .prop_map(|(seq, tag, data)| Message::Gather { seq, tag, data }),
        (
            any::<u64>(),
            vec((any::<u32>(), vec(any::<u8>(), 0..=64)), n)
        )
            .prop_map(|(seq, all)| Message::Gathered { seq, all }),
        (any::<u32>(), 1u8..=3).prop_map(|(rank, reason)| Message::PeerLost { rank, reason }),
        (1u8..=2, any::<u64>(), any::<u64>()).prop_map(|(farewell, calls, gathers)| {
            Message::Goodbye {
                farewell,
                calls,
                gathers,
            }
        }),
        (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(rank, calls, gathers)| {
            Message::Departed {
                rank,
                calls,
                gathers,
            }
        }),
    ]
}

fn job() -> impl Strategy<Value = (u32, Message)> {
    (1u32..=8).prop_flat_map(|n| (Just(n), message(n)))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn encode_then_decode_is_the_identity((nranks, m) in job()) {
        let bytes = m.encode().expect("valid codes encode");
        let (back, used) = wire::decode(&bytes, nranks).expect("an encoded frame decodes");
        prop_assert_eq!(&back, &m);
        prop_assert_eq!(used, bytes.len());
    }

    #[test]
    fn every_truncation_of_a_frame_is_refused((nranks, m) in job(), cut in any::<prop::sample::Index>()) {
        let bytes = m.encode().expect("valid codes encode");
        let cut = cut.index(bytes.len());
        prop_assert!(wire::decode(&bytes[..cut], nranks).is_err());
    }

    #[test]
    fn a_frame_with_bytes_appended_to_its_payload_is_refused((nranks, m) in job(), extra in vec(any::<u8>(), 1..16)) {
        let mut bytes = m.encode().expect("valid codes encode");
        let len = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) + extra.len() as u32;
        bytes[1..5].copy_from_slice(&len.to_be_bytes());
        bytes.extend_from_slice(&extra);
        // Another version's hello or challenge ignores its tail by design.
        if m.bytes_round_trip() {
            prop_assert!(wire::decode(&bytes, nranks).is_err());
        }
    }

    #[test]
    fn any_bytes_decode_or_are_refused_and_what_decodes_re_encodes(nranks in 1u32..=8, bytes in vec(any::<u8>(), 0..256)) {
        if let Ok((m, used)) = wire::decode(&bytes, nranks) {
            let again = m.encode().expect("decoded codes are valid");
            if m.bytes_round_trip() {
                prop_assert_eq!(&again[..], &bytes[..used]);
            }
        }
    }

    #[test]
    fn mutated_frames_decode_or_are_refused((nranks, m) in job(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut bytes = m.encode().expect("valid codes encode");
        let at = at.index(bytes.len());
        bytes[at] = byte;
        if let Ok((back, used)) = wire::decode(&bytes, nranks) {
            let again = back.encode().expect("decoded codes are valid");
            if back.bytes_round_trip() {
                prop_assert_eq!(&again[..], &bytes[..used]);
            }
        }
    }
}

/// Invalid codes are refused by the encoder (so a fuzzer's `Message` cannot mean two frames).
#[test]
fn invalid_codes_do_not_encode() {
    for m in [
        Message::Abort {
            code: 0,
            value: 0,
            missing: vec![],
            message: String::new(),
        },
        Message::PeerLost { rank: 0, reason: 9 },
        Message::Goodbye {
            farewell: 0,
            calls: 0,
            gathers: 0,
        },
    ] {
        assert!(m.encode().is_none(), "{m:?}");
    }
}

/// One frame of every type: the wire target's seed corpus.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let nonce: [u8; 32] = std::array::from_fn(|i| i as u8);
    let mac: [u8; 32] = std::array::from_fn(|i| 0xa0 ^ i as u8);
    let host = |rank: u32| RankInfo {
        rank,
        host_id: format!("host-{rank}"),
        addr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, rank as u8)),
        pid: 1000 + rank,
    };
    let all = [
        (
            "hello",
            Message::Hello {
                version: PROTOCOL_VERSION,
                nonce,
            },
        ),
        (
            "hello_v9",
            Message::Hello {
                version: 9,
                nonce: [0; 32],
            },
        ),
        (
            "challenge",
            Message::Challenge {
                version: PROTOCOL_VERSION,
                nonce,
            },
        ),
        (
            "auth_v6",
            Message::Auth {
                rank: 1,
                nranks: 2,
                pid: 4242,
                addr: IpAddr::V6(Ipv6Addr::LOCALHOST),
                host_id: "node-a".into(),
                mac,
            },
        ),
        ("welcome", Message::Welcome { mac }),
        (
            "abort",
            Message::Abort {
                code: 6,
                value: 0,
                missing: vec![1],
                message: "rank 1 did not join".into(),
            },
        ),
        (
            "table",
            Message::Table {
                entries: vec![host(0), host(1)],
                mac,
            },
        ),
        ("heartbeat", Message::Heartbeat),
        (
            "gather",
            Message::Gather {
                seq: 3,
                tag: 0x200,
                data: vec![1, 2, 3, 4],
            },
        ),
        (
            "gathered",
            Message::Gathered {
                seq: 3,
                all: vec![(0x200, vec![1]), (0x200, vec![2])],
            },
        ),
        ("peer_lost", Message::PeerLost { rank: 1, reason: 1 }),
        (
            "goodbye",
            Message::Goodbye {
                farewell: 1,
                calls: 7,
                gathers: 2,
            },
        ),
        (
            "departed",
            Message::Departed {
                rank: 1,
                calls: 7,
                gathers: 2,
            },
        ),
    ];
    all.into_iter()
        .map(|(name, m)| {
            // The target reads its rank count from the first two bytes: 2 ranks (0x0001 + 1).
            let mut bytes = vec![0, 1];
            bytes.extend(m.encode().unwrap());
            (name, bytes)
        })
        .collect()
}

#[test]
fn the_wire_seed_corpus_is_current() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/wire");
    let update = std::env::var_os("SYMCOMM_UPDATE_SEEDS").is_some();
    if update {
        std::fs::create_dir_all(&dir).unwrap();
    }
    for (name, bytes) in seeds() {
        let path = dir.join(format!("seed-{name}"));
        if update {
            std::fs::write(&path, &bytes).unwrap();
        }
        let on_disk = std::fs::read(&path).unwrap_or_else(|e| {
            panic!("{}: {e} (SYMCOMM_UPDATE_SEEDS=1 writes it)", path.display())
        });
        assert_eq!(
            on_disk,
            bytes,
            "{} is stale (SYMCOMM_UPDATE_SEEDS=1 rewrites it)",
            path.display()
        );
        let (m, used) = wire::decode(&bytes[2..], 2).unwrap();
        assert_eq!(used, bytes.len() - 2, "{name}: {m:?}");
    }
}

/// The control target's list covers every control-plane step with a payload: a step added to
/// `comm::payload::Tag` without its number in `CONTROL_TAGS` would go unfuzzed.
#[test]
fn every_control_step_with_a_payload_is_listed_for_the_fuzzer() {
    for tag in 0..0x1000u32 {
        let listed = wire::CONTROL_TAGS.contains(&tag);
        assert_eq!(
            wire::control_round_trip(tag, &[]).is_some(),
            listed,
            "tag {tag:#x}"
        );
    }
}

/// The control target's seeds are contributions that decode, one per kind of payload.
#[test]
fn the_control_seed_corpus_decodes() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/control");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        let tag = wire::CONTROL_TAGS[usize::from(bytes[0]) % wire::CONTROL_TAGS.len()];
        let again = wire::control_round_trip(tag, &bytes[1..]).unwrap().unwrap();
        assert_eq!(again, bytes[1..]);
        seen += 1;
    }
    assert!(seen >= 5, "only {seen} control seeds");
}

proptest! {
    #[test]
    fn control_payloads_decode_or_are_refused_and_re_encode(pick in any::<prop::sample::Index>(), data in vec(any::<u8>(), 0..64)) {
        let tag = wire::CONTROL_TAGS[pick.index(wire::CONTROL_TAGS.len())];
        if let Ok(again) = wire::control_round_trip(tag, &data).unwrap() {
            prop_assert_eq!(again, data);
        }
    }
}

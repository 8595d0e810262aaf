//! Round trips of every message type, and decoding of hostile input.
//! The property tests feed arbitrary and mutated bytes: decoding must never panic.

use bytes::Bytes;
use fanin_proto::*;
use proptest::prelude::*;

fn samples() -> Vec<Message> {
    let stf = StfHeader {
        run_id: 7,
        tf_id: 1 << 40,
        flp_id: 3,
        epn_id: 9,
        crc: Some(0xdead_beef),
        payload_len: 5,
    };
    vec![
        Message::Register(Register {
            role: Role::Epn,
            node_id: Some(4),
            data_addr: "10.0.0.1:5555".into(),
            proof: [7; 32],
        }),
        Message::Register(Register {
            role: Role::Flp,
            node_id: None,
            data_addr: String::new(),
            proof: [0; 32],
        }),
        Message::RegisterAck {
            node_id: 4,
            run_id: 99,
            resume: true,
        },
        Message::Reject {
            code: RejectCode::UnknownId,
            reason: "unknown FLP id 7 (expected 0..2)".into(),
        },
        Message::Prepare(Prepare {
            run_id: 1,
            flps: 2,
            build_timeout_ms: 1000,
            crc: true,
            size: SizeWire {
                kind: 2,
                a: 10,
                b: 20,
                c: 0,
            },
            seed: 42,
            retain: true,
            schedule: fanin_proto::Schedule::OnData,
            rate_mhz: 1_000_000,
            tfs: 5000,
            pull: true,
        }),
        Message::EpnList(vec![
            EpnEntry {
                epn_id: 0,
                addr: "127.0.0.1:1".into(),
            },
            EpnEntry {
                epn_id: 5,
                addr: "[::1]:2".into(),
            },
        ]),
        Message::EpnList(vec![]),
        Message::Ready {
            role: Role::Flp,
            node_id: 1,
            connected: 6,
        },
        Message::RunStart {
            run_id: 3,
            elapsed_us: 1_500_000,
        },
        Message::Assign {
            tf_id: u64::MAX,
            epn_id: u32::MAX,
        },
        Message::Stf {
            header: stf,
            payload: Bytes::from_static(b"hello"),
        },
        Message::Stf {
            header: StfHeader {
                crc: None,
                payload_len: 0,
                ..stf
            },
            payload: Bytes::new(),
        },
        Message::TfReport(TfReport {
            tf_id: 12,
            status: TfStatus::Incomplete,
            reason: Reason::BuildTimeout,
            stfs: 1,
            bytes: 1 << 33,
        }),
        Message::StfDropped {
            tf_id: 8,
            flp_id: 1,
            reason: Reason::FlpBufferFull,
        },
        Message::RunStop { run_id: 3 },
        Message::NodeStats(NodeStats {
            role: Role::Epn,
            node_id: 2,
            counters: vec![("split_tfs".into(), 3), ("duplicate_stfs".into(), 0)],
        }),
        Message::DataHello {
            run_id: 3,
            flp_id: 1,
            proof: [0xa5; 32],
        },
        Message::DataHelloAck { epn_id: 2 },
        Message::Abandon {
            tf_id: 77,
            reason: Reason::FlpBufferFull,
        },
        Message::Release { tf_id: 78 },
        Message::LoadReport {
            free_bytes: 1 << 40,
            building: 17,
        },
        Message::EpnReachable {
            epn_id: 4,
            ok: true,
        },
        Message::Challenge { nonce: [9; 16] },
        Message::RunState {
            state: fanin_proto::RunState::Paused,
            run_number: 42,
        },
        Message::StfAnnounce(vec![
            fanin_proto::StfInfo {
                tf_id: 7,
                size: 1 << 20,
            },
            fanin_proto::StfInfo { tf_id: 8, size: 0 },
        ]),
        Message::SourceEnded {
            ok: false,
            detail: "FLP 1: source exec:x: STF frame 3: bad magic".into(),
        },
        Message::StfsHeld(vec![
            fanin_proto::HeldStf {
                tf_id: 70,
                size: 1 << 16,
                epn: Some(3),
            },
            fanin_proto::HeldStf {
                tf_id: 71,
                size: 0,
                epn: None,
            },
        ]),
        Message::TfsHeld {
            building: vec![5, 9],
            reports: vec![fanin_proto::TfReport::complete(4, 2, 1 << 17)],
        },
        Message::StfSent {
            tf_id: 12,
            epn_id: 3,
        },
        Message::StfReceived {
            tf_id: 12,
            flp_id: 1,
        },
    ]
}

#[test]
fn every_message_round_trips() {
    for m in samples() {
        let bytes = m.encode();
        let (back, used) = Message::decode_frame(&bytes, u32::MAX).unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(back, m);
    }
}

#[test]
fn stf_prefix_matches_full_encoding() {
    for m in samples() {
        if let Message::Stf { header, payload } = &m {
            let mut v = header.encode_frame_prefix().to_vec();
            v.extend_from_slice(payload);
            assert_eq!(v, m.encode());
        }
    }
}

#[test]
fn every_truncation_is_an_error() {
    for m in samples() {
        let bytes = m.encode();
        for cut in 0..bytes.len() {
            assert!(
                Message::decode_frame(&bytes[..cut], u32::MAX).is_err(),
                "{m:?} cut at {cut}"
            );
        }
    }
}

#[test]
fn wrong_version_and_unknown_type_are_named() {
    let mut b = Message::RunStart {
        run_id: 1,
        elapsed_us: 0,
    }
    .encode();
    b[4] = 9;
    let e = Message::decode_frame(&b, 1024).unwrap_err();
    assert!(e.to_string().contains("version 9"), "{e}");
    let mut b = Message::RunStart {
        run_id: 1,
        elapsed_us: 0,
    }
    .encode();
    b[5] = 200;
    assert_eq!(
        Message::decode_frame(&b, 1024).unwrap_err(),
        DecodeError::UnknownType(200)
    );
}

#[test]
fn stf_payload_length_mismatch_is_rejected() {
    let m = &samples()[10];
    let mut b = m.encode();
    // Declare 6 payload bytes while the frame carries 5.
    let off = HEADER_LEN + 29;
    b[off..off + 4].copy_from_slice(&6u32.to_le_bytes());
    assert!(matches!(
        Message::decode_frame(&b, u32::MAX),
        Err(DecodeError::PayloadLength { .. })
    ));
}

#[test]
fn forged_counts_do_not_allocate() {
    // An EpnList claiming 4 billion entries in a 4-byte body.
    let mut b = Message::EpnList(vec![]).encode();
    let off = HEADER_LEN;
    b[off..off + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        Message::decode_frame(&b, u32::MAX),
        Err(DecodeError::InvalidValue { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = Message::decode_frame(&bytes, 1 << 20);
    }

    #[test]
    fn decoding_arbitrary_bodies_never_panics(t in 0u8..24, body in proptest::collection::vec(any::<u8>(), 0..128)) {
        let h = FrameHeader { msg_type: t, length: body.len() as u32 };
        let _ = Message::decode(h, &body);
    }

    #[test]
    fn decoding_mutated_frames_never_panics(idx in any::<prop::sample::Index>(), pos in any::<prop::sample::Index>(), val in any::<u8>()) {
        let all = samples();
        let mut b = all[idx.index(all.len())].encode();
        let i = pos.index(b.len());
        b[i] = val;
        if let Ok((m, _)) = Message::decode_frame(&b, u32::MAX) {
            // Whatever decodes must encode again to a frame that decodes to itself.
            let again = m.encode();
            prop_assert_eq!(Message::decode_frame(&again, u32::MAX).unwrap().0, m);
        }
    }
}

/// The largest first frames a listener reads before a proof fit its handshake limit.
#[test]
fn the_largest_handshake_frames_fit_the_handshake_limit() {
    let register = Message::Register(Register {
        role: Role::Epn,
        node_id: Some(u32::MAX),
        data_addr: "a".repeat(wire::MAX_STR),
        proof: [0xff; 32],
    });
    let hello = Message::DataHello {
        run_id: u64::MAX,
        flp_id: u32::MAX,
        proof: [0xff; 32],
    };
    for m in [register, hello] {
        let body = m.encode().len() - HEADER_LEN;
        assert!(
            body as u32 <= MAX_HANDSHAKE_BODY,
            "{:?}: {body}",
            m.msg_type()
        );
    }
}

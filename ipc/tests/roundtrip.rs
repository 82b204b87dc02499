use proptest::prelude::*;
use vigil_ipc::{
    decode_agent_frame, decode_rank_frame, encode_agent, encode_rank, kind, AgentDecoder, AgentMsg,
    DecodeError, RankDecoder, RankMsg, HEADER_LEN, MAGIC, MAX_NAME_LEN, MAX_PAYLOAD,
    MAX_REASON_LEN, MAX_SECTIONS, PROTOCOL_VERSION,
};

fn rank_bytes(m: &RankMsg) -> Vec<u8> {
    let mut out = Vec::new();
    encode_rank(m, &mut out);
    out
}

fn agent_bytes(m: &AgentMsg) -> Vec<u8> {
    let mut out = Vec::new();
    encode_agent(m, &mut out);
    out
}

fn rank_roundtrip(m: RankMsg) -> Vec<u8> {
    let bytes = rank_bytes(&m);
    assert_eq!(&bytes[..4], &[MAGIC, PROTOCOL_VERSION, m.kind(), 0]);
    let len = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
    assert_eq!(len, bytes.len() - HEADER_LEN);
    assert_eq!(decode_rank_frame(&bytes), Ok((m, bytes.len())));
    bytes
}

fn agent_roundtrip(m: AgentMsg) -> Vec<u8> {
    let bytes = agent_bytes(&m);
    assert_eq!(&bytes[..4], &[MAGIC, PROTOCOL_VERSION, m.kind(), 0]);
    assert_eq!(decode_agent_frame(&bytes), Ok((m, bytes.len())));
    bytes
}

#[test]
fn register_roundtrip() {
    let b = rank_roundtrip(RankMsg::Register {
        rank: 5,
        local_rank: 1,
        pid: 0xdead_beef,
        attempt: 2,
    });
    assert_eq!(b.len(), HEADER_LEN + 16);
    assert_eq!(&b[HEADER_LEN..HEADER_LEN + 4], &5u32.to_le_bytes());
}

#[test]
fn heartbeat_without_step_is_a_bare_header() {
    let b = rank_roundtrip(RankMsg::Heartbeat { step: None });
    assert_eq!(b, [0x56, 1, kind::HEARTBEAT, 0, 0, 0, 0, 0]);
}

#[test]
fn heartbeat_with_step_roundtrip() {
    for step in [0, 1, u64::MAX - 1, u64::MAX] {
        let b = rank_roundtrip(RankMsg::Heartbeat { step: Some(step) });
        assert_eq!(b.len(), HEADER_LEN + 8);
    }
}

#[test]
fn sections_roundtrip() {
    for name in ["step", "", "checkpoint ✓", "段"] {
        rank_roundtrip(RankMsg::SectionStart { name: name.into() });
        rank_roundtrip(RankMsg::SectionEnd { name: name.into() });
    }
    assert_eq!(
        rank_roundtrip(RankMsg::EndAllSections).len(),
        HEADER_LEN,
        "EndAllSections has no payload"
    );
}

#[test]
fn step_timing_and_finished_roundtrip() {
    rank_roundtrip(RankMsg::StepTiming {
        step: 99,
        duration_us: 1_234_567,
    });
    assert_eq!(rank_roundtrip(RankMsg::Finished).len(), HEADER_LEN);
}

#[test]
fn progress_roundtrips_as_a_fixed_8_byte_step() {
    for step in [0, 41, u64::MAX] {
        let b = rank_roundtrip(RankMsg::Progress { step });
        assert_eq!(b.len(), HEADER_LEN + 8);
        assert_eq!(b[2], kind::PROGRESS);
        assert_eq!(b[HEADER_LEN..], step.to_le_bytes());
    }
}

#[test]
fn held_signals_and_a_signal_received_roundtrip_at_fixed_sizes() {
    for signals in [0, 1 << 15 | 1 << 10 | 1 << 12, u64::MAX] {
        let b = rank_roundtrip(RankMsg::HoldsSignals { signals });
        assert_eq!(b.len(), HEADER_LEN + 8);
        assert_eq!(b[2], kind::HOLDS_SIGNALS);
    }
    for signal in [0, 15, u32::MAX] {
        let b = rank_roundtrip(RankMsg::Signalled { signal });
        assert_eq!(b.len(), HEADER_LEN + 4);
        assert_eq!(b[2], kind::SIGNALLED);
        assert_eq!(b[HEADER_LEN..], signal.to_le_bytes());
    }
}

#[test]
fn timeouts_roundtrip() {
    agent_roundtrip(AgentMsg::Timeouts {
        initial_ms: None,
        heartbeat_ms: None,
        out_of_section_ms: None,
        sections: vec![],
    });
    let b = agent_roundtrip(AgentMsg::Timeouts {
        initial_ms: Some(1_800_000),
        heartbeat_ms: Some(300_000),
        out_of_section_ms: Some(u64::MAX),
        sections: vec![("setup".into(), 600_000), ("step".into(), 30_000)],
    });
    assert_eq!(b[HEADER_LEN], 1, "presence byte of initial_ms");
}

#[test]
fn stop_request_roundtrip() {
    agent_roundtrip(AgentMsg::StopRequest {
        reason: "preempted".into(),
        at_step: Some(1200),
    });
    agent_roundtrip(AgentMsg::StopRequest {
        reason: String::new(),
        at_step: None,
    });
}

#[test]
fn encoder_cuts_overlong_strings_at_a_char_boundary() {
    // 128 two-byte characters: 256 bytes; the cut must not split the last one.
    let long = "é".repeat(128);
    let (m, _) = decode_rank_frame(&rank_bytes(&RankMsg::SectionStart { name: long })).unwrap();
    assert_eq!(
        m,
        RankMsg::SectionStart {
            name: "é".repeat(127)
        }
    );
    let reason = "x".repeat(MAX_REASON_LEN + 10);
    let (m, _) = decode_agent_frame(&agent_bytes(&AgentMsg::StopRequest {
        reason,
        at_step: None,
    }))
    .unwrap();
    assert_eq!(
        m,
        AgentMsg::StopRequest {
            reason: "x".repeat(MAX_REASON_LEN),
            at_step: None
        }
    );
}

#[test]
fn encoder_keeps_only_max_sections_and_stays_under_max_payload() {
    let sections: Vec<(String, u64)> = (0..MAX_SECTIONS + 5)
        .map(|i| (format!("{i:0>300}"), i as u64))
        .collect();
    let bytes = agent_bytes(&AgentMsg::Timeouts {
        initial_ms: Some(1),
        heartbeat_ms: Some(2),
        out_of_section_ms: Some(3),
        sections,
    });
    assert!(bytes.len() - HEADER_LEN <= MAX_PAYLOAD);
    match decode_agent_frame(&bytes).unwrap().0 {
        AgentMsg::Timeouts { sections, .. } => {
            assert_eq!(sections.len(), MAX_SECTIONS);
            assert!(sections.iter().all(|(n, _)| n.len() == MAX_NAME_LEN));
            assert_eq!(sections[MAX_SECTIONS - 1].1, (MAX_SECTIONS - 1) as u64);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn encoders_append_without_clearing() {
    let mut out = vec![0xAA];
    encode_rank(&RankMsg::Finished, &mut out);
    encode_rank(&RankMsg::Heartbeat { step: Some(3) }, &mut out);
    assert_eq!(out[0], 0xAA);
    let (m, n) = decode_rank_frame(&out[1..]).unwrap();
    assert_eq!((m, n), (RankMsg::Finished, HEADER_LEN));
    let (m, _) = decode_rank_frame(&out[1 + n..]).unwrap();
    assert_eq!(m, RankMsg::Heartbeat { step: Some(3) });
}

#[test]
fn decoder_fed_one_byte_at_a_time() {
    let msgs = vec![
        RankMsg::Register {
            rank: 1,
            local_rank: 1,
            pid: 7,
            attempt: 0,
        },
        RankMsg::Heartbeat { step: None },
        RankMsg::SectionStart {
            name: "step".into(),
        },
        RankMsg::Heartbeat { step: Some(10) },
        RankMsg::SectionEnd {
            name: "step".into(),
        },
        RankMsg::Finished,
    ];
    let stream: Vec<u8> = msgs.iter().flat_map(rank_bytes).collect();
    let mut d = RankDecoder::new();
    let mut got = Vec::new();
    for b in &stream {
        d.push(std::slice::from_ref(b));
        while let Some(m) = d.next().unwrap() {
            got.push(m);
        }
    }
    assert_eq!(got, msgs);
    assert_eq!(d.buffered(), 0);
}

#[test]
fn decoder_with_whole_stream_in_one_push() {
    let msgs = [
        AgentMsg::Timeouts {
            initial_ms: Some(5),
            heartbeat_ms: None,
            out_of_section_ms: None,
            sections: vec![("a".into(), 1)],
        },
        AgentMsg::StopRequest {
            reason: "r".into(),
            at_step: Some(4),
        },
    ];
    let stream: Vec<u8> = msgs.iter().flat_map(agent_bytes).collect();
    let mut d = AgentDecoder::new();
    d.push(&stream[..stream.len() - 1]);
    assert_eq!(d.next().unwrap(), Some(msgs[0].clone()));
    assert_eq!(d.next().unwrap(), None);
    assert!(d.buffered() > 0);
    d.push(&stream[stream.len() - 1..]);
    assert_eq!(d.next().unwrap(), Some(msgs[1].clone()));
    assert_eq!(d.next().unwrap(), None);
}

#[test]
fn decoder_refuses_an_oversized_header_before_its_payload_arrives() {
    let mut d = RankDecoder::new();
    d.push(&[MAGIC, PROTOCOL_VERSION, kind::SECTION_START, 0]);
    assert_eq!(d.next(), Ok(None));
    d.push(&u32::MAX.to_le_bytes());
    assert_eq!(d.next(), Err(DecodeError::PayloadTooLarge(u32::MAX)));
    assert_eq!(d.buffered(), 0, "nothing is kept after an error");
}

#[test]
fn decoder_refuses_garbage_from_the_first_byte() {
    let mut d = RankDecoder::new();
    d.push(b"G");
    assert_eq!(d.next(), Err(DecodeError::BadMagic(b'G')));
}

#[test]
fn decoder_stays_failed_after_an_error() {
    let mut d = RankDecoder::new();
    d.push(&[MAGIC, 9]);
    let e = DecodeError::UnsupportedVersion {
        got: 9,
        supported: PROTOCOL_VERSION,
    };
    assert_eq!(d.next(), Err(e.clone()));
    d.push(&rank_bytes(&RankMsg::Finished));
    assert_eq!(d.next(), Err(e));
}

#[test]
fn wrong_direction_kinds_are_unknown() {
    let b = rank_bytes(&RankMsg::Finished);
    assert_eq!(
        decode_agent_frame(&b),
        Err(DecodeError::UnknownKind(kind::FINISHED))
    );
    let b = agent_bytes(&AgentMsg::StopRequest {
        reason: String::new(),
        at_step: None,
    });
    assert_eq!(
        decode_rank_frame(&b),
        Err(DecodeError::UnknownKind(kind::STOP_REQUEST))
    );
}

#[test]
fn errors_have_distinct_kinds_and_readable_messages() {
    let errs = [
        DecodeError::Incomplete,
        DecodeError::BadMagic(0),
        DecodeError::UnsupportedVersion {
            got: 2,
            supported: 1,
        },
        DecodeError::UnknownKind(0),
        DecodeError::BadFlags(1),
        DecodeError::PayloadTooLarge(70000),
        DecodeError::BadLength { kind: 2, len: 3 },
        DecodeError::Truncated,
        DecodeError::TrailingBytes(1),
        DecodeError::InvalidUtf8,
        DecodeError::BadPresence(2),
        DecodeError::NameTooLong(256),
        DecodeError::ReasonTooLong(2000),
        DecodeError::TooManySections(129),
    ];
    let kinds: std::collections::HashSet<_> = errs.iter().map(DecodeError::kind).collect();
    assert_eq!(kinds.len(), errs.len());
    let v = DecodeError::UnsupportedVersion {
        got: 2,
        supported: 1,
    }
    .to_string();
    assert!(
        v.contains("version 2") && v.contains("(1)") && v.contains("upgrade the vigil binary"),
        "{v}"
    );
    let older = DecodeError::UnsupportedVersion {
        got: 0,
        supported: 1,
    }
    .to_string();
    assert!(older.contains("rank library is older"), "{older}");
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,63}",
        "[a-z_]{0,255}",
        proptest::collection::vec(any::<char>(), 0..63)
            .prop_map(|v| v.into_iter().collect::<String>()),
    ]
}

fn rank_msg() -> impl Strategy<Value = RankMsg> {
    prop_oneof![
        (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
            |(rank, local_rank, pid, attempt)| RankMsg::Register {
                rank,
                local_rank,
                pid,
                attempt
            }
        ),
        any::<Option<u64>>().prop_map(|step| RankMsg::Heartbeat { step }),
        name().prop_map(|name| RankMsg::SectionStart { name }),
        name().prop_map(|name| RankMsg::SectionEnd { name }),
        Just(RankMsg::EndAllSections),
        (any::<u64>(), any::<u64>())
            .prop_map(|(step, duration_us)| RankMsg::StepTiming { step, duration_us }),
        Just(RankMsg::Finished),
        any::<u64>().prop_map(|step| RankMsg::Progress { step }),
        any::<u64>().prop_map(|signals| RankMsg::HoldsSignals { signals }),
        any::<u32>().prop_map(|signal| RankMsg::Signalled { signal }),
    ]
}

fn agent_msg() -> impl Strategy<Value = AgentMsg> {
    prop_oneof![
        (
            any::<Option<u64>>(),
            any::<Option<u64>>(),
            any::<Option<u64>>(),
            prop_oneof![
                9 => proptest::collection::vec((name(), any::<u64>()), 0..8),
                1 => proptest::collection::vec(("[a-z]{0,8}", any::<u64>()), MAX_SECTIONS),
            ],
        )
            .prop_map(|(initial_ms, heartbeat_ms, out_of_section_ms, sections)| {
                AgentMsg::Timeouts {
                    initial_ms,
                    heartbeat_ms,
                    out_of_section_ms,
                    sections,
                }
            }),
        (
            prop_oneof!["\\PC{0,255}", "[ -~]{1000,1024}"],
            any::<Option<u64>>()
        )
            .prop_map(|(reason, at_step)| AgentMsg::StopRequest { reason, at_step }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn any_rank_msg_roundtrips(m in rank_msg()) {
        let b = rank_bytes(&m);
        prop_assert_eq!(decode_rank_frame(&b), Ok((m, b.len())));
    }

    #[test]
    fn any_agent_msg_roundtrips(m in agent_msg()) {
        let b = agent_bytes(&m);
        prop_assert!(b.len() - HEADER_LEN <= MAX_PAYLOAD);
        prop_assert_eq!(decode_agent_frame(&b), Ok((m, b.len())));
    }

    #[test]
    fn any_rank_stream_survives_any_chunking(
        msgs in proptest::collection::vec(rank_msg(), 0..20),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..10),
    ) {
        let stream: Vec<u8> = msgs.iter().flat_map(rank_bytes).collect();
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
        cuts.push(0);
        cuts.push(stream.len());
        cuts.sort_unstable();
        let mut d = RankDecoder::new();
        let mut got = Vec::new();
        for w in cuts.windows(2) {
            d.push(&stream[w[0]..w[1]]);
            while let Some(m) = d.next().unwrap() {
                got.push(m);
            }
        }
        prop_assert_eq!(got, msgs);
        prop_assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn every_strict_prefix_is_incomplete(m in agent_msg()) {
        let b = agent_bytes(&m);
        for cut in [0, 1, 3, HEADER_LEN - 1, HEADER_LEN, b.len() - 1] {
            if cut < b.len() {
                prop_assert_eq!(decode_agent_frame(&b[..cut]), Err(DecodeError::Incomplete));
            }
        }
    }
}

//! Deterministic fuzzing of both decoders with random and mutated frames.
//!
//! Properties checked for every input: no panic; a frame that decodes is canonical (re-encoding
//! the message gives back exactly the bytes consumed); any prefix of an accepted frame is
//! `Incomplete`; and the incremental decoders, fed the same bytes in random chunks, produce
//! exactly what repeated `decode_*_frame` calls on the whole buffer produce.

use vigil_ipc::{
    decode_agent_frame, decode_rank_frame, encode_agent, encode_rank, AgentDecoder, AgentMsg,
    DecodeError, RankDecoder, RankMsg, HEADER_LEN, MAGIC, MAX_SECTIONS, PROTOCOL_VERSION,
};

const CASES: usize = 200_000;

/// xorshift64*: tiny, fast and reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
    fn u64(&mut self) -> u64 {
        match self.below(4) {
            0 => 0,
            1 => u64::MAX,
            _ => self.next(),
        }
    }
    fn opt(&mut self) -> Option<u64> {
        if self.chance(2) {
            None
        } else {
            Some(self.u64())
        }
    }
    fn string(&mut self, max_chars: usize) -> String {
        const POOL: &[char] = &[
            'a', 'z', '_', ' ', 'é', 'ß', '段', '✓', '🚀', '\0', '\u{7f}',
        ];
        let n = self.below(max_chars + 1);
        (0..n).map(|_| POOL[self.below(POOL.len())]).collect()
    }
}

fn random_rank(r: &mut Rng) -> RankMsg {
    match r.below(10) {
        0 => RankMsg::Register {
            rank: r.next() as u32,
            local_rank: r.next() as u32,
            pid: r.next() as u32,
            attempt: r.next() as u32,
        },
        1 => RankMsg::Heartbeat { step: r.opt() },
        2 => RankMsg::SectionStart { name: r.string(70) },
        3 => RankMsg::SectionEnd { name: r.string(70) },
        4 => RankMsg::EndAllSections,
        5 => RankMsg::StepTiming {
            step: r.u64(),
            duration_us: r.u64(),
        },
        6 => RankMsg::Progress { step: r.u64() },
        7 => RankMsg::HoldsSignals { signals: r.u64() },
        8 => RankMsg::Signalled {
            signal: r.next() as u32,
        },
        _ => RankMsg::Finished,
    }
}

fn random_agent(r: &mut Rng) -> AgentMsg {
    if r.chance(2) {
        let n = if r.chance(50) {
            MAX_SECTIONS
        } else {
            r.below(5)
        };
        AgentMsg::Timeouts {
            initial_ms: r.opt(),
            heartbeat_ms: r.opt(),
            out_of_section_ms: r.opt(),
            sections: (0..n).map(|_| (r.string(20), r.u64())).collect(),
        }
    } else {
        AgentMsg::StopRequest {
            reason: r.string(300),
            at_step: r.opt(),
        }
    }
}

fn valid_frame(r: &mut Rng, out: &mut Vec<u8>) {
    if r.chance(2) {
        encode_rank(&random_rank(r), out);
    } else {
        encode_agent(&random_agent(r), out);
    }
}

/// Applies 1-3 random edits to `buf`.
fn mutate(r: &mut Rng, buf: &mut Vec<u8>) {
    for _ in 0..=r.below(3) {
        let len = buf.len();
        match r.below(8) {
            0 if len > 0 => {
                let i = r.below(len);
                buf[i] ^= 1 << r.below(8);
            }
            1 if len > 0 => {
                let i = r.below(len);
                buf[i] = r.byte();
            }
            2 => {
                let i = r.below(len + 1);
                buf.insert(i, r.byte());
            }
            3 if len > 0 => {
                let i = r.below(len);
                buf.remove(i);
            }
            4 => buf.truncate(r.below(len + 1)),
            5 => {
                for _ in 0..r.below(16) {
                    buf.push(r.byte());
                }
            }
            6 if len >= HEADER_LEN => {
                // Rewrite the length field: small deltas, and values near the limits.
                let cur = u32::from_le_bytes(buf[4..8].try_into().unwrap());
                let new = match r.below(4) {
                    0 => cur.wrapping_add(1),
                    1 => cur.wrapping_sub(1),
                    2 => 65_536 + r.below(3) as u32,
                    _ => r.next() as u32,
                };
                buf[4..8].copy_from_slice(&new.to_le_bytes());
            }
            _ if len > 2 => {
                // A kind code from the other direction or out of range.
                buf[2] = [
                    0x00, 0x01, 0x02, 0x03, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x7f, 0x80,
                    0x81, 0x82, 0xff,
                ][r.below(16)];
            }
            _ => {}
        }
    }
}

fn random_input(r: &mut Rng) -> Vec<u8> {
    let mut buf = Vec::new();
    match r.below(10) {
        0 => {
            for _ in 0..r.below(64) {
                buf.push(r.byte());
            }
        }
        1 => {
            // Valid header, random kind and payload: gets past the header checks.
            let len = r.below(48);
            buf.extend_from_slice(&[MAGIC, PROTOCOL_VERSION, r.byte(), 0]);
            buf.extend_from_slice(&(len as u32).to_le_bytes());
            for _ in 0..len {
                buf.push(r.byte());
            }
        }
        2..=3 => {
            for _ in 0..=r.below(4) {
                valid_frame(r, &mut buf);
            }
        }
        _ => {
            for _ in 0..=r.below(3) {
                valid_frame(r, &mut buf);
            }
            mutate(r, &mut buf);
        }
    }
    buf
}

type FrameDecoder<M> = fn(&[u8]) -> Result<(M, usize), DecodeError>;

/// Decodes frames from the start of `buf` until an error (`Incomplete` included), checking that
/// each accepted frame is canonical and that its strict prefixes are `Incomplete`.
fn decode_all<M>(
    buf: &[u8],
    decode: FrameDecoder<M>,
    encode: fn(&M, &mut Vec<u8>),
) -> (Vec<M>, DecodeError) {
    let mut msgs = Vec::new();
    let mut at = 0;
    loop {
        match decode(&buf[at..]) {
            Ok((m, used)) => {
                assert!(used >= HEADER_LEN && at + used <= buf.len());
                let mut again = Vec::new();
                encode(&m, &mut again);
                assert_eq!(
                    again,
                    &buf[at..at + used],
                    "accepted frame is not canonical"
                );
                assert_eq!(
                    decode(&buf[at..at + used - 1]).err(),
                    Some(DecodeError::Incomplete)
                );
                msgs.push(m);
                at += used;
            }
            Err(e) => return (msgs, e),
        }
    }
}

fn chunks(r: &mut Rng, len: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < len {
        let max = if r.chance(2) { 4 } else { 40 };
        let n = 1 + r.below(max);
        let end = (at + n).min(len);
        out.push((at, end));
        at = end;
    }
    out
}

#[test]
fn random_and_mutated_frames_never_panic_and_decode_consistently() {
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut ok_frames, mut errors) = (0usize, std::collections::BTreeMap::new());
    for _ in 0..CASES {
        let input = random_input(&mut r);

        let (rank_msgs, rank_err) = decode_all(&input, decode_rank_frame, encode_rank);
        let (agent_msgs, agent_err) = decode_all(&input, decode_agent_frame, encode_agent);
        ok_frames += rank_msgs.len() + agent_msgs.len();
        *errors.entry(rank_err.kind()).or_insert(0usize) += 1;
        *errors.entry(agent_err.kind()).or_insert(0usize) += 1;

        let mut rd = RankDecoder::new();
        let mut ad = AgentDecoder::new();
        let (mut rank_got, mut agent_got) = (Vec::new(), Vec::new());
        let (mut rank_fail, mut agent_fail) = (None, None);
        for (a, b) in chunks(&mut r, input.len()) {
            rd.push(&input[a..b]);
            ad.push(&input[a..b]);
            while rank_fail.is_none() {
                match rd.next() {
                    Ok(Some(m)) => rank_got.push(m),
                    Ok(None) => break,
                    Err(e) => rank_fail = Some(e),
                }
            }
            while agent_fail.is_none() {
                match ad.next() {
                    Ok(Some(m)) => agent_got.push(m),
                    Ok(None) => break,
                    Err(e) => agent_fail = Some(e),
                }
            }
        }
        assert_eq!(rank_got, rank_msgs);
        assert_eq!(agent_got, agent_msgs);
        let expect = |e: DecodeError| (e != DecodeError::Incomplete).then_some(e);
        assert_eq!(rank_fail, expect(rank_err));
        assert_eq!(agent_fail, expect(agent_err));
    }
    // The generator must reach deep into the decoders, not just fail on the first byte.
    eprintln!("{CASES} inputs, {ok_frames} frames accepted, errors: {errors:?}");
    assert!(ok_frames > CASES / 4, "only {ok_frames} frames decoded");
    for kind in [
        "incomplete",
        "bad_magic",
        "unsupported_version",
        "unknown_kind",
        "bad_flags",
        "payload_too_large",
        "bad_length",
        "truncated",
        "trailing_bytes",
        "invalid_utf8",
        "bad_presence",
        "name_too_long",
    ] {
        assert!(
            errors.get(kind).copied().unwrap_or(0) > 20,
            "error kind {kind} barely reached: {errors:?}"
        );
    }
}

use crate::{
    kind, AgentMsg, DecodeError, RankMsg, HEADER_LEN, MAGIC, MAX_NAME_LEN, MAX_PAYLOAD,
    MAX_REASON_LEN, MAX_SECTIONS, PROTOCOL_VERSION,
};

/// Decodes the rank -> agent frame at the start of `buf`, returning the message and the number
/// of bytes it took. `Err(Incomplete)` means `buf` holds a valid prefix of a frame.
pub fn decode_rank_frame(buf: &[u8]) -> Result<(RankMsg, usize), DecodeError> {
    let (k, payload) = split_frame(buf, rank_payload_len_ok)?;
    Ok((rank_payload(k, payload)?, HEADER_LEN + payload.len()))
}

/// Decodes the agent -> rank frame at the start of `buf`; see [`decode_rank_frame`].
pub fn decode_agent_frame(buf: &[u8]) -> Result<(AgentMsg, usize), DecodeError> {
    let (k, payload) = split_frame(buf, agent_payload_len_ok)?;
    Ok((agent_payload(k, payload)?, HEADER_LEN + payload.len()))
}

/// `Some(ok)` for a kind of this direction, where `ok` says whether the payload length fits it.
type LenCheck = fn(u8, usize) -> Option<bool>;

fn rank_payload_len_ok(k: u8, len: usize) -> Option<bool> {
    Some(match k {
        kind::REGISTER | kind::STEP_TIMING => len == 16,
        kind::HEARTBEAT => len == 0 || len == 8,
        kind::PROGRESS | kind::HOLDS_SIGNALS | kind::RESTARTABLE => len == 8,
        kind::SIGNALLED => len == 4,
        kind::END_ALL_SECTIONS | kind::FINISHED => len == 0,
        kind::SECTION_START
        | kind::SECTION_END
        | kind::CALCULATE_TIMEOUTS
        | kind::WORKLOAD_CONTROL
        | kind::RAISED => true,
        _ => return None,
    })
}

fn agent_payload_len_ok(k: u8, len: usize) -> Option<bool> {
    match k {
        kind::TIMEOUTS | kind::STOP_REQUEST => Some(true),
        kind::TIMEOUTS_CALCULATED => Some(len == 3),
        kind::GENERATION => Some(len >= 10 && (len - 10).is_multiple_of(4)),
        _ => None,
    }
}

/// Validates the header and returns the kind and the payload. Header bytes are checked as soon as
/// they are present, so a bad peer is refused before a whole header (or any payload) is buffered.
fn split_frame(buf: &[u8], len_ok: LenCheck) -> Result<(u8, &[u8]), DecodeError> {
    if let Some(&m) = buf.first() {
        if m != MAGIC {
            return Err(DecodeError::BadMagic(m));
        }
    }
    if let Some(&v) = buf.get(1) {
        if v != PROTOCOL_VERSION {
            return Err(DecodeError::UnsupportedVersion {
                got: v,
                supported: PROTOCOL_VERSION,
            });
        }
    }
    if let Some(&k) = buf.get(2) {
        if len_ok(k, 0).is_none() {
            return Err(DecodeError::UnknownKind(k));
        }
    }
    if let Some(&f) = buf.get(3) {
        if f != 0 {
            return Err(DecodeError::BadFlags(f));
        }
    }
    if buf.len() < HEADER_LEN {
        return Err(DecodeError::Incomplete);
    }
    let k = buf[2];
    let raw_len = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let len = raw_len as usize;
    if len > MAX_PAYLOAD {
        return Err(DecodeError::PayloadTooLarge(raw_len));
    }
    if len_ok(k, len) != Some(true) {
        return Err(DecodeError::BadLength { kind: k, len });
    }
    match buf.get(HEADER_LEN..HEADER_LEN + len) {
        Some(payload) => Ok((k, payload)),
        None => Err(DecodeError::Incomplete),
    }
}

fn rank_payload(k: u8, payload: &[u8]) -> Result<RankMsg, DecodeError> {
    let mut r = Reader(payload);
    let msg = match k {
        kind::REGISTER => RankMsg::Register {
            rank: r.u32()?,
            local_rank: r.u32()?,
            pid: r.u32()?,
            attempt: r.u32()?,
        },
        kind::HEARTBEAT => RankMsg::Heartbeat {
            step: if payload.is_empty() {
                None
            } else {
                Some(r.u64()?)
            },
        },
        kind::SECTION_START => RankMsg::SectionStart { name: r.name()? },
        kind::SECTION_END => RankMsg::SectionEnd { name: r.name()? },
        kind::END_ALL_SECTIONS => RankMsg::EndAllSections,
        kind::STEP_TIMING => RankMsg::StepTiming {
            step: r.u64()?,
            duration_us: r.u64()?,
        },
        kind::FINISHED => RankMsg::Finished,
        kind::PROGRESS => RankMsg::Progress { step: r.u64()? },
        kind::HOLDS_SIGNALS => RankMsg::HoldsSignals { signals: r.u64()? },
        kind::SIGNALLED => RankMsg::Signalled { signal: r.u32()? },
        kind::RESTARTABLE => RankMsg::Restartable {
            generation: r.u64()?,
        },
        kind::RAISED => RankMsg::Raised {
            error: r.string(MAX_REASON_LEN, DecodeError::ReasonTooLong)?,
        },
        kind::WORKLOAD_CONTROL => RankMsg::WorkloadControl {
            action: r.u8()?,
            description: r.string(MAX_REASON_LEN, DecodeError::ReasonTooLong)?,
        },
        kind::CALCULATE_TIMEOUTS => {
            let heartbeat = r.bool()?;
            let out_of_section = r.bool()?;
            let all_sections = r.bool()?;
            let n = r.u16()? as usize;
            if n > MAX_SECTIONS {
                return Err(DecodeError::TooManySections(n));
            }
            let mut sections = Vec::with_capacity(n);
            for _ in 0..n {
                sections.push(r.name()?);
            }
            RankMsg::CalculateTimeouts {
                heartbeat,
                out_of_section,
                all_sections,
                sections,
            }
        }
        other => return Err(DecodeError::UnknownKind(other)),
    };
    r.finish()?;
    Ok(msg)
}

fn agent_payload(k: u8, payload: &[u8]) -> Result<AgentMsg, DecodeError> {
    let mut r = Reader(payload);
    let msg = match k {
        kind::TIMEOUTS => {
            let initial_ms = r.opt()?;
            let heartbeat_ms = r.opt()?;
            let out_of_section_ms = r.opt()?;
            let n = r.u16()? as usize;
            if n > MAX_SECTIONS {
                return Err(DecodeError::TooManySections(n));
            }
            let mut sections = Vec::with_capacity(n);
            for _ in 0..n {
                let name = r.name()?;
                sections.push((name, r.u64()?));
            }
            AgentMsg::Timeouts {
                initial_ms,
                heartbeat_ms,
                out_of_section_ms,
                sections,
            }
        }
        kind::STOP_REQUEST => AgentMsg::StopRequest {
            reason: r.string(MAX_REASON_LEN, DecodeError::ReasonTooLong)?,
            at_step: r.opt()?,
        },
        kind::TIMEOUTS_CALCULATED => AgentMsg::TimeoutsCalculated {
            heartbeat: r.bool()?,
            sections: r.bool()?,
            out_of_section: r.bool()?,
        },
        kind::GENERATION => {
            let generation = r.u64()?;
            let n = r.u16()? as usize;
            let mut replaced = Vec::with_capacity(n);
            for _ in 0..n {
                replaced.push(r.u32()?);
            }
            AgentMsg::Generation {
                generation,
                replaced,
            }
        }
        other => return Err(DecodeError::UnknownKind(other)),
    };
    r.finish()?;
    Ok(msg)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let (head, rest) = self
            .0
            .split_first_chunk::<N>()
            .ok_or(DecodeError::Truncated)?;
        self.0 = rest;
        Ok(*head)
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        self.take().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        self.take().map(u64::from_le_bytes)
    }

    fn opt(&mut self) -> Result<Option<u64>, DecodeError> {
        match self.take::<1>()?[0] {
            0 => Ok(None),
            1 => self.u64().map(Some),
            b => Err(DecodeError::BadPresence(b)),
        }
    }

    /// A flag byte, 0 or 1; anything else is refused like a bad presence byte.
    fn u8(&mut self) -> Result<u8, DecodeError> {
        let (&b, rest) = self.0.split_first().ok_or(DecodeError::Truncated)?;
        self.0 = rest;
        Ok(b)
    }

    fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.take::<1>()?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(DecodeError::BadPresence(b)),
        }
    }

    fn name(&mut self) -> Result<String, DecodeError> {
        self.string(MAX_NAME_LEN, DecodeError::NameTooLong)
    }

    fn string(
        &mut self,
        max: usize,
        too_long: fn(usize) -> DecodeError,
    ) -> Result<String, DecodeError> {
        let len = self.u16()? as usize;
        if len > max {
            return Err(too_long(len));
        }
        if self.0.len() < len {
            return Err(DecodeError::Truncated);
        }
        let (bytes, rest) = self.0.split_at(len);
        self.0 = rest;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| DecodeError::InvalidUtf8)
    }

    fn finish(self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.0.len()))
        }
    }
}

type FrameDecoder<M> = fn(&[u8]) -> Result<(M, usize), DecodeError>;

/// Byte buffer shared by both incremental decoders. Once a frame fails to decode the buffer is
/// poisoned and keeps returning that error: the stream cannot be resynchronised.
#[derive(Debug, Default)]
struct FrameBuf {
    buf: Vec<u8>,
    start: usize,
    failed: Option<DecodeError>,
}

impl FrameBuf {
    fn push(&mut self, bytes: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    fn next<M>(&mut self, decode: FrameDecoder<M>) -> Result<Option<M>, DecodeError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match decode(&self.buf[self.start..]) {
            Ok((msg, used)) => {
                self.start += used;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                Ok(Some(msg))
            }
            Err(DecodeError::Incomplete) => Ok(None),
            Err(e) => {
                self.failed = Some(e.clone());
                self.buf = Vec::new();
                self.start = 0;
                Err(e)
            }
        }
    }

    fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }
}

/// Incremental decoder for the agent's side of a connection: feed bytes as they arrive, pull whole
/// [`RankMsg`]s.
///
/// Call [`RankDecoder::next`] until it returns `Ok(None)` after every [`RankDecoder::push`]; the
/// buffer then never holds more than one partial frame (at most `HEADER_LEN + MAX_PAYLOAD` bytes)
/// plus the last chunk pushed, whatever lengths the peer announces.
#[derive(Debug, Default)]
pub struct RankDecoder {
    inner: FrameBuf,
}

impl RankDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.inner.push(bytes);
    }

    /// The next whole message, `Ok(None)` when more bytes are needed, or the error that makes the
    /// connection unusable (returned again on every later call).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<RankMsg>, DecodeError> {
        self.inner.next(decode_rank_frame)
    }

    /// Bytes received but not yet returned as messages.
    pub fn buffered(&self) -> usize {
        self.inner.buffered()
    }
}

/// Incremental decoder for a rank's side of a connection; see [`RankDecoder`].
#[derive(Debug, Default)]
pub struct AgentDecoder {
    inner: FrameBuf,
}

impl AgentDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.inner.push(bytes);
    }

    /// See [`RankDecoder::next`].
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<AgentMsg>, DecodeError> {
        self.inner.next(decode_agent_frame)
    }

    /// Bytes received but not yet returned as messages.
    pub fn buffered(&self) -> usize {
        self.inner.buffered()
    }
}

use crate::{
    AgentMsg, RankMsg, HEADER_LEN, MAGIC, MAX_NAME_LEN, MAX_REASON_LEN, MAX_SECTIONS,
    PROTOCOL_VERSION,
};

/// Appends the frame for `msg` to `out`.
///
/// Section names longer than [`MAX_NAME_LEN`] bytes are cut at the last UTF-8 character boundary
/// that fits, so every frame this produces decodes.
pub fn encode_rank(msg: &RankMsg, out: &mut Vec<u8>) {
    let start = begin(out, msg.kind());
    match msg {
        RankMsg::Register {
            rank,
            local_rank,
            pid,
            attempt,
        } => {
            for v in [rank, local_rank, pid, attempt] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        RankMsg::Heartbeat { step } => {
            // The payload length (0 or 8) says whether a step is present.
            if let Some(step) = step {
                out.extend_from_slice(&step.to_le_bytes());
            }
        }
        RankMsg::SectionStart { name } | RankMsg::SectionEnd { name } => {
            put_str(out, name, MAX_NAME_LEN);
        }
        RankMsg::EndAllSections | RankMsg::Finished => {}
        RankMsg::Progress { step } => out.extend_from_slice(&step.to_le_bytes()),
        RankMsg::HoldsSignals { signals } => out.extend_from_slice(&signals.to_le_bytes()),
        RankMsg::Signalled { signal } => out.extend_from_slice(&signal.to_le_bytes()),
        RankMsg::Restartable { generation } => out.extend_from_slice(&generation.to_le_bytes()),
        RankMsg::Raised { error } => put_str(out, error, MAX_REASON_LEN),
        RankMsg::WorkloadControl {
            action,
            description,
        } => {
            out.push(*action);
            put_str(out, description, MAX_REASON_LEN);
        }
        RankMsg::StepTiming { step, duration_us } => {
            out.extend_from_slice(&step.to_le_bytes());
            out.extend_from_slice(&duration_us.to_le_bytes());
        }
        RankMsg::CalculateTimeouts {
            heartbeat,
            out_of_section,
            all_sections,
            sections,
        } => {
            out.extend_from_slice(&[*heartbeat as u8, *out_of_section as u8, *all_sections as u8]);
            let n = sections.len().min(MAX_SECTIONS);
            out.extend_from_slice(&(n as u16).to_le_bytes());
            for name in &sections[..n] {
                put_str(out, name, MAX_NAME_LEN);
            }
        }
    }
    finish(out, start);
}

/// Appends the frame for `msg` to `out`.
///
/// Over-long strings are cut as in [`encode_rank`] (reasons at [`MAX_REASON_LEN`] bytes) and only
/// the first [`MAX_SECTIONS`] sections are sent; the largest possible frame is far below
/// [`crate::MAX_PAYLOAD`].
pub fn encode_agent(msg: &AgentMsg, out: &mut Vec<u8>) {
    let start = begin(out, msg.kind());
    match msg {
        AgentMsg::Timeouts {
            initial_ms,
            heartbeat_ms,
            out_of_section_ms,
            sections,
        } => {
            put_opt(out, *initial_ms);
            put_opt(out, *heartbeat_ms);
            put_opt(out, *out_of_section_ms);
            let n = sections.len().min(MAX_SECTIONS);
            out.extend_from_slice(&(n as u16).to_le_bytes());
            for (name, ms) in &sections[..n] {
                put_str(out, name, MAX_NAME_LEN);
                out.extend_from_slice(&ms.to_le_bytes());
            }
        }
        AgentMsg::StopRequest { reason, at_step } => {
            put_str(out, reason, MAX_REASON_LEN);
            put_opt(out, *at_step);
        }
        AgentMsg::TimeoutsCalculated {
            heartbeat,
            sections,
            out_of_section,
        } => out.extend_from_slice(&[*heartbeat as u8, *sections as u8, *out_of_section as u8]),
        AgentMsg::Generation {
            generation,
            replaced,
        } => {
            out.extend_from_slice(&generation.to_le_bytes());
            // At most u16::MAX ranks fit; one node never replaces more.
            let n = replaced.len().min(u16::MAX as usize);
            out.extend_from_slice(&(n as u16).to_le_bytes());
            for r in &replaced[..n] {
                out.extend_from_slice(&r.to_le_bytes());
            }
        }
    }
    finish(out, start);
}

fn begin(out: &mut Vec<u8>, kind: u8) -> usize {
    let start = out.len();
    out.extend_from_slice(&[MAGIC, PROTOCOL_VERSION, kind, 0, 0, 0, 0, 0]);
    start
}

fn finish(out: &mut [u8], start: usize) {
    let len = (out.len() - start - HEADER_LEN) as u32;
    out[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str, max: usize) {
    let s = truncate_utf8(s, max);
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_opt(out: &mut Vec<u8>, v: Option<u64>) {
    match v {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

pub(crate) fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

//! The rank <-> agent wire protocol (see docs/protocol.md).
//!
//! Every message is one frame: an 8-byte header (`magic, version, kind, flags, payload_len u32 LE`)
//! followed by `payload_len` bytes of payload. Integers are little-endian. Pure codec, no I/O.

mod decode;
mod encode;
mod error;

pub use decode::{decode_agent_frame, decode_rank_frame, AgentDecoder, RankDecoder};
pub use encode::{encode_agent, encode_rank};
pub use error::DecodeError;

/// First byte of every frame (`'V'`).
pub const MAGIC: u8 = 0x56;
/// The major protocol version; a peer speaking another one is refused.
pub const PROTOCOL_VERSION: u8 = 1;
/// Bytes in a frame header.
pub const HEADER_LEN: usize = 8;
/// Largest payload accepted (64 KiB); a header announcing more is an error.
pub const MAX_PAYLOAD: usize = 64 * 1024;
/// Longest section name in bytes (UTF-8).
pub const MAX_NAME_LEN: usize = 255;
/// Longest `StopRequest` reason in bytes (UTF-8).
pub const MAX_REASON_LEN: usize = 1024;
/// Most sections one `Timeouts` message may carry.
pub const MAX_SECTIONS: usize = 128;

/// Message kind codes (header byte 2). Rank -> agent kinds are below 0x80, agent -> rank above.
pub mod kind {
    pub const REGISTER: u8 = 0x01;
    pub const HEARTBEAT: u8 = 0x02;
    pub const SECTION_START: u8 = 0x03;
    pub const SECTION_END: u8 = 0x04;
    pub const END_ALL_SECTIONS: u8 = 0x05;
    pub const STEP_TIMING: u8 = 0x06;
    pub const FINISHED: u8 = 0x07;
    pub const CALCULATE_TIMEOUTS: u8 = 0x08;
    pub const PROGRESS: u8 = 0x09;
    pub const WORKLOAD_CONTROL: u8 = 0x0a;
    pub const HOLDS_SIGNALS: u8 = 0x0b;
    pub const SIGNALLED: u8 = 0x0c;
    pub const RESTARTABLE: u8 = 0x0d;
    pub const RAISED: u8 = 0x0e;
    pub const TIMEOUTS: u8 = 0x81;
    pub const STOP_REQUEST: u8 = 0x82;
    pub const TIMEOUTS_CALCULATED: u8 = 0x83;
    pub const GENERATION: u8 = 0x84;
}

/// A message sent by a training rank to its agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RankMsg {
    /// First message on every connection. `attempt` is `TORCHELASTIC_RESTART_COUNT`.
    Register {
        rank: u32,
        local_rank: u32,
        pid: u32,
        attempt: u32,
    },
    Heartbeat {
        step: Option<u64>,
    },
    SectionStart {
        name: String,
    },
    SectionEnd {
        name: String,
    },
    EndAllSections,
    /// How long one training step took.
    StepTiming {
        step: u64,
        duration_us: u64,
    },
    /// Training finished: the job should not be requeued.
    Finished,
    /// Calculate these timeouts from what was observed (NVRx's `calculate_and_set_*`); every
    /// rank of the node asks, and each gets `TimeoutsCalculated` once the agent decided.
    CalculateTimeouts {
        heartbeat: bool,
        out_of_section: bool,
        /// Every section that was observed; `sections` is then ignored.
        all_sections: bool,
        sections: Vec<String>,
    },
    /// This rank is now at training step `step` (sent by `should_stop(step)` when the step
    /// changed). Not a heartbeat: it says where the rank is, not that it is alive.
    Progress {
        step: u64,
    },
    /// NVRx's workload control request: [`WORKLOAD_EXCLUDE_NODE`] or [`WORKLOAD_SHUTDOWN`]
    /// (another value is kept as sent; the agent ignores what it does not know).
    WorkloadControl {
        action: u8,
        description: String,
    },
    /// This rank holds these signals for `should_stop(step)` (bit `n` is signal `n`): they are
    /// noted, not fatal, so a stop that must end the rank at once cannot use them.
    HoldsSignals {
        signals: u64,
    },
    /// This rank received `signal`, one it holds, from outside (not from the agent).
    Signalled {
        signal: u32,
    },
    /// This rank runs its training function under `vigil.restartable` and is in the wrapper at
    /// `generation` (in-process restarts, docs/inprocess.md): at its start, and again once it
    /// came back to the wrapper after the agent announced a generation. Ranks that never send it
    /// are not restartable: their job uses whole restarts.
    Restartable {
        generation: u64,
    },
    /// This rank's main thread ended with an uncaught exception (`error`: its type and message,
    /// cut to [`MAX_REASON_LEN`]); the process is on its way out. Sent by the shim's exception
    /// hook before the interpreter shuts down, which can take long (a communicator's teardown).
    Raised {
        error: String,
    },
}

/// `WorkloadControl` action: keep this node out of the job from the next attempt on.
pub const WORKLOAD_EXCLUDE_NODE: u8 = 1;
/// `WorkloadControl` action: no further attempt; end the job.
pub const WORKLOAD_SHUTDOWN: u8 = 2;

/// A message sent by the agent to a rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentMsg {
    /// The timeouts in force, in milliseconds; `None` means that check is off.
    Timeouts {
        initial_ms: Option<u64>,
        heartbeat_ms: Option<u64>,
        out_of_section_ms: Option<u64>,
        sections: Vec<(String, u64)>,
    },
    /// Checkpoint and exit at `at_step` (or as soon as possible when `None`).
    StopRequest {
        reason: String,
        at_step: Option<u64>,
    },
    /// The answer to `CalculateTimeouts`: which of the asked-for timeouts were calculated and are
    /// now in force (a `Timeouts` message with the values precedes it).
    TimeoutsCalculated {
        heartbeat: bool,
        sections: bool,
        out_of_section: bool,
    },
    /// Generation `generation` of the attempt begins: these global ranks are being replaced by
    /// new processes. A restartable rank leaves its training function, drops its process group
    /// and calls the function again (docs/inprocess.md).
    Generation { generation: u64, replaced: Vec<u32> },
}

impl RankMsg {
    /// The kind code this message is framed with.
    pub fn kind(&self) -> u8 {
        match self {
            RankMsg::Register { .. } => kind::REGISTER,
            RankMsg::Heartbeat { .. } => kind::HEARTBEAT,
            RankMsg::SectionStart { .. } => kind::SECTION_START,
            RankMsg::SectionEnd { .. } => kind::SECTION_END,
            RankMsg::EndAllSections => kind::END_ALL_SECTIONS,
            RankMsg::StepTiming { .. } => kind::STEP_TIMING,
            RankMsg::Finished => kind::FINISHED,
            RankMsg::CalculateTimeouts { .. } => kind::CALCULATE_TIMEOUTS,
            RankMsg::Progress { .. } => kind::PROGRESS,
            RankMsg::WorkloadControl { .. } => kind::WORKLOAD_CONTROL,
            RankMsg::HoldsSignals { .. } => kind::HOLDS_SIGNALS,
            RankMsg::Signalled { .. } => kind::SIGNALLED,
            RankMsg::Restartable { .. } => kind::RESTARTABLE,
            RankMsg::Raised { .. } => kind::RAISED,
        }
    }
}

impl AgentMsg {
    /// The kind code this message is framed with.
    pub fn kind(&self) -> u8 {
        match self {
            AgentMsg::Timeouts { .. } => kind::TIMEOUTS,
            AgentMsg::StopRequest { .. } => kind::STOP_REQUEST,
            AgentMsg::TimeoutsCalculated { .. } => kind::TIMEOUTS_CALCULATED,
            AgentMsg::Generation { .. } => kind::GENERATION,
        }
    }
}

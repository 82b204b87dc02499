use crate::{MAGIC, MAX_NAME_LEN, MAX_PAYLOAD, MAX_REASON_LEN, MAX_SECTIONS};

/// Why bytes could not be decoded. Every variant but `Incomplete` is fatal for the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("incomplete frame: more bytes are needed")]
    Incomplete,
    #[error("bad magic byte 0x{0:02x} (expected 0x{MAGIC:02x}): the peer does not speak the vigil protocol")]
    BadMagic(u8),
    #[error("rank protocol version {got} is not this vigil's ({supported}): {}", upgrade_advice(*got, *supported))]
    UnsupportedVersion { got: u8, supported: u8 },
    #[error("unknown message kind 0x{0:02x} for this direction")]
    UnknownKind(u8),
    #[error("header flags 0x{0:02x} are not supported (must be 0)")]
    BadFlags(u8),
    #[error("payload of {0} bytes exceeds the limit of {MAX_PAYLOAD}")]
    PayloadTooLarge(u32),
    #[error("message kind 0x{kind:02x} cannot have a payload of {len} bytes")]
    BadLength { kind: u8, len: usize },
    #[error("payload ended inside a field")]
    Truncated,
    #[error("{0} bytes left over after the last field of the payload")]
    TrailingBytes(usize),
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    #[error("optional-value presence byte is {0} (must be 0 or 1)")]
    BadPresence(u8),
    #[error("section name of {0} bytes exceeds the limit of {MAX_NAME_LEN}")]
    NameTooLong(usize),
    #[error("stop reason of {0} bytes exceeds the limit of {MAX_REASON_LEN}")]
    ReasonTooLong(usize),
    #[error("{0} sections exceed the limit of {MAX_SECTIONS}")]
    TooManySections(usize),
}

impl DecodeError {
    /// Stable snake_case name of the variant, as used in `ipc/testdata/vectors.txt` and by the
    /// Python shim's `DecodeError.kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            DecodeError::Incomplete => "incomplete",
            DecodeError::BadMagic(_) => "bad_magic",
            DecodeError::UnsupportedVersion { .. } => "unsupported_version",
            DecodeError::UnknownKind(_) => "unknown_kind",
            DecodeError::BadFlags(_) => "bad_flags",
            DecodeError::PayloadTooLarge(_) => "payload_too_large",
            DecodeError::BadLength { .. } => "bad_length",
            DecodeError::Truncated => "truncated",
            DecodeError::TrailingBytes(_) => "trailing_bytes",
            DecodeError::InvalidUtf8 => "invalid_utf8",
            DecodeError::BadPresence(_) => "bad_presence",
            DecodeError::NameTooLong(_) => "name_too_long",
            DecodeError::ReasonTooLong(_) => "reason_too_long",
            DecodeError::TooManySections(_) => "too_many_sections",
        }
    }
}

/// Which side to upgrade when a rank library of protocol `rank` meets an agent of protocol
/// `agent`: the older one, so that both come from one release.
pub fn upgrade_advice(rank: u8, agent: u8) -> &'static str {
    if rank > agent {
        "the rank library is newer; upgrade the vigil binary (pip install -U vigil-train installs both)"
    } else {
        "the rank library is older; upgrade it to the vigil binary's release (pip install -U vigil-train installs both)"
    }
}

//! The c10d TCPStore wire protocol, as spoken by `torch.distributed.TCPStore`.
//!
//! Checked byte for byte against torch 2.15.0 (client and libuv server, captured
//! on the wire). One persistent TCP connection per client; every request is one
//! opcode byte followed by little-endian fields:
//!
//! * integers: `u32`/`i64`/`u64`, little-endian, no padding;
//! * strings (keys) and byte vectors (values): `u64` length, then the bytes;
//! * key lists: `u64` count, then that many strings.
//!
//! The first request on a connection must be `VALIDATE` with the magic number;
//! a torch client then sends `PING` with a nonce that the server echoes.
//!
//! This module is pure: it parses requests from a byte buffer (incrementally,
//! never trusting a length before the bytes are there) and encodes requests
//! and replies. No I/O.

use std::fmt;

/// The magic number a client sends after `VALIDATE`.
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

/// Longest key accepted (torch's libuv server: 8 KiB; we are more lenient).
pub const MAX_KEY_LEN: u64 = 64 * 1024;
/// Largest value accepted (torch's libuv server: 8 MiB). A bigger one closes
/// the connection before its bytes are buffered.
pub const MAX_VALUE_LEN: u64 = 16 * 1024 * 1024;
/// Most keys in one CHECK / WAIT / MULTI_GET / MULTI_SET (torch: 128 Ki).
pub const MAX_KEY_COUNT: u64 = 1024 * 1024;

/// Request opcodes (torch's `c10d::detail::QueryType`, torch 2.15).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    Validate = 0,
    Set = 1,
    CompareSet = 2,
    Get = 3,
    Add = 4,
    Check = 5,
    Wait = 6,
    GetNumKeys = 7,
    DeleteKey = 8,
    Append = 9,
    MultiGet = 10,
    MultiSet = 11,
    CancelWait = 12,
    Ping = 13,
    QueuePush = 14,
    QueuePop = 15,
    QueueLen = 16,
    ListKeys = 17,
    Barrier = 18,
    /// vigil's own, not torch's: the server answers `u8` 1 if it requires
    /// agents to authenticate (0 if not) and a 32-byte nonce.
    AuthChallenge = 0x60,
    /// vigil's own: 32 bytes, HMAC-SHA256 of the last nonce under the job's
    /// secret (`crate::auth`). The server answers `u8` 1, or `u8` 0 and closes.
    AuthProof = 0x61,
    /// vigil's own, one-way (no reply): `key`. Adds 1 to the counter at `key` and marks it
    /// renewed since the last [`Opcode::Sweep`] of a prefix it falls under (liveness renewals,
    /// docs/scale.md).
    Renew = 0x62,
    /// vigil's own: `prefix`. Answers the counters under `prefix` that were renewed at least
    /// once but not since the previous sweep of the same prefix (a key list), and starts the
    /// next period. One sweeper per prefix.
    Sweep = 0x63,
    /// vigil's own: `u32` tag, then one inner request; the reply is `u32` tag, `u64` length and
    /// the inner request's reply bytes, in any order relative to other tags (docs/store.md,
    /// "Tagged mode").
    Tagged = 0x64,
    /// vigil's own, tagged only: one key (`u64` count, always 1, then the key, like WAIT); parks
    /// until the key exists and answers its value (`u64` length + bytes).
    WaitGet = 0x65,
    /// vigil's own: `key`, `value`, `counter`. SETs `key` to `value`, then adds 1 to the counter
    /// `counter` and answers its new value (`i64`), in one request: a rendezvous join (the
    /// record, then the count that says it is there).
    Join = 0x66,
    /// vigil's own, no payload, no reply: from here on this connection carries a rank's torch
    /// client (the ranks' door of each agent sends it after authenticating): it may use torch's
    /// own operations on keys outside `/vigil/` and nothing else, for good (docs/store.md, "Who
    /// may use the store").
    RankOnly = 0x67,
    /// vigil's own, agents only: `prefix`. Deletes every key and queue whose raw name does not
    /// start with `prefix` (what [`KeySpace::reset_except`](crate::KeySpace::reset_except)
    /// does: a new attempt's clean key space, from an agent that does not host the store) and
    /// answers how many went (`i64`). Nobody is woken.
    ClearExcept = 0x68,
    /// vigil's own, agents only: `prefix`. Deletes every key and queue whose raw name starts with
    /// `prefix` and answers how many went (`i64`). Nobody is woken.
    ClearPrefix = 0x69,
}

impl Opcode {
    /// Every opcode, in numeric order.
    pub const ALL: [Opcode; 19] = [
        Opcode::Validate,
        Opcode::Set,
        Opcode::CompareSet,
        Opcode::Get,
        Opcode::Add,
        Opcode::Check,
        Opcode::Wait,
        Opcode::GetNumKeys,
        Opcode::DeleteKey,
        Opcode::Append,
        Opcode::MultiGet,
        Opcode::MultiSet,
        Opcode::CancelWait,
        Opcode::Ping,
        Opcode::QueuePush,
        Opcode::QueuePop,
        Opcode::QueueLen,
        Opcode::ListKeys,
        Opcode::Barrier,
    ];

    pub fn from_u8(b: u8) -> Option<Opcode> {
        match b {
            0x60 => Some(Opcode::AuthChallenge),
            0x61 => Some(Opcode::AuthProof),
            0x62 => Some(Opcode::Renew),
            0x63 => Some(Opcode::Sweep),
            0x64 => Some(Opcode::Tagged),
            0x65 => Some(Opcode::WaitGet),
            0x66 => Some(Opcode::Join),
            0x67 => Some(Opcode::RankOnly),
            0x68 => Some(Opcode::ClearExcept),
            0x69 => Some(Opcode::ClearPrefix),
            _ => Opcode::ALL.get(b as usize).copied(),
        }
    }
}

/// Reply byte of CHECK (`CheckResponseType`).
pub const CHECK_READY: u8 = 0;
pub const CHECK_NOT_READY: u8 = 1;
/// Reply bytes of WAIT / CANCEL_WAIT / BARRIER (`WaitResponseType`).
pub const WAIT_STOP_WAITING: u8 = 0;
pub const WAIT_CANCELED: u8 = 1;

/// One decoded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Validate {
        magic: u32,
    },
    Set {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    CompareSet {
        key: Vec<u8>,
        expected: Vec<u8>,
        desired: Vec<u8>,
    },
    Get {
        key: Vec<u8>,
    },
    Add {
        key: Vec<u8>,
        delta: i64,
    },
    Check {
        keys: Vec<Vec<u8>>,
    },
    Wait {
        keys: Vec<Vec<u8>>,
    },
    GetNumKeys,
    DeleteKey {
        key: Vec<u8>,
    },
    Append {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    MultiGet {
        keys: Vec<Vec<u8>>,
    },
    MultiSet {
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    CancelWait,
    Ping {
        nonce: u32,
    },
    QueuePush {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    QueuePop {
        key: Vec<u8>,
    },
    QueueLen {
        key: Vec<u8>,
    },
    ListKeys,
    Barrier {
        key: Vec<u8>,
        world_size: i64,
    },
    AuthChallenge,
    AuthProof {
        proof: [u8; crate::auth::PROOF_LEN],
    },
    Renew {
        key: Vec<u8>,
    },
    Sweep {
        prefix: Vec<u8>,
    },
    /// `inner` with a tag its reply carries (never itself tagged, never VALIDATE or AUTH_*).
    Tagged {
        tag: u32,
        inner: Box<Request>,
    },
    /// Parks until `key` exists, then answers its value (tagged only).
    WaitGet {
        key: Vec<u8>,
    },
    Join {
        key: Vec<u8>,
        value: Vec<u8>,
        counter: Vec<u8>,
    },
    RankOnly,
    /// Deletes every key and queue not under `prefix`.
    ClearExcept {
        prefix: Vec<u8>,
    },
    /// Deletes every key and queue under `prefix`.
    ClearPrefix {
        prefix: Vec<u8>,
    },
}

impl Request {
    /// Every key the request names (queues included).
    pub fn keys(&self) -> Vec<&[u8]> {
        match self {
            Request::Set { key, .. }
            | Request::CompareSet { key, .. }
            | Request::Get { key }
            | Request::Add { key, .. }
            | Request::DeleteKey { key }
            | Request::Append { key, .. }
            | Request::QueuePush { key, .. }
            | Request::QueuePop { key }
            | Request::QueueLen { key }
            | Request::Renew { key }
            | Request::Sweep { prefix: key }
            | Request::ClearExcept { prefix: key }
            | Request::ClearPrefix { prefix: key }
            | Request::Barrier { key, .. }
            | Request::WaitGet { key } => vec![key.as_slice()],
            Request::Check { keys } | Request::Wait { keys } | Request::MultiGet { keys } => {
                keys.iter().map(Vec::as_slice).collect()
            }
            Request::MultiSet { pairs } => pairs.iter().map(|(k, _)| k.as_slice()).collect(),
            Request::Join { key, counter, .. } => vec![key.as_slice(), counter.as_slice()],
            Request::Tagged { inner, .. } => inner.keys(),
            Request::Validate { .. }
            | Request::GetNumKeys
            | Request::CancelWait
            | Request::Ping { .. }
            | Request::ListKeys
            | Request::AuthChallenge
            | Request::RankOnly
            | Request::AuthProof { .. } => Vec::new(),
        }
    }

    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Validate { .. } => Opcode::Validate,
            Request::Set { .. } => Opcode::Set,
            Request::CompareSet { .. } => Opcode::CompareSet,
            Request::Get { .. } => Opcode::Get,
            Request::Add { .. } => Opcode::Add,
            Request::Check { .. } => Opcode::Check,
            Request::Wait { .. } => Opcode::Wait,
            Request::GetNumKeys => Opcode::GetNumKeys,
            Request::DeleteKey { .. } => Opcode::DeleteKey,
            Request::Append { .. } => Opcode::Append,
            Request::MultiGet { .. } => Opcode::MultiGet,
            Request::MultiSet { .. } => Opcode::MultiSet,
            Request::CancelWait => Opcode::CancelWait,
            Request::Ping { .. } => Opcode::Ping,
            Request::QueuePush { .. } => Opcode::QueuePush,
            Request::QueuePop { .. } => Opcode::QueuePop,
            Request::QueueLen { .. } => Opcode::QueueLen,
            Request::ListKeys => Opcode::ListKeys,
            Request::Barrier { .. } => Opcode::Barrier,
            Request::AuthChallenge => Opcode::AuthChallenge,
            Request::AuthProof { .. } => Opcode::AuthProof,
            Request::Renew { .. } => Opcode::Renew,
            Request::Sweep { .. } => Opcode::Sweep,
            Request::Tagged { .. } => Opcode::Tagged,
            Request::WaitGet { .. } => Opcode::WaitGet,
            Request::Join { .. } => Opcode::Join,
            Request::RankOnly => Opcode::RankOnly,
            Request::ClearExcept { .. } => Opcode::ClearExcept,
            Request::ClearPrefix { .. } => Opcode::ClearPrefix,
        }
    }

    /// A request that is never answered, not even in tagged mode (where every other request
    /// gets a frame, an empty one for SET and the like): RENEW.
    pub fn one_way(&self) -> bool {
        match self {
            Request::Tagged { inner, .. } => inner.one_way(),
            Request::Renew { .. } | Request::RankOnly => true,
            _ => false,
        }
    }

    /// Appends the wire encoding of this request to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.opcode() as u8);
        match self {
            Request::Validate { magic } => out.extend_from_slice(&magic.to_le_bytes()),
            Request::Set { key, value }
            | Request::Append { key, value }
            | Request::QueuePush { key, value } => {
                put_bytes(out, key);
                put_bytes(out, value);
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                put_bytes(out, key);
                put_bytes(out, expected);
                put_bytes(out, desired);
            }
            Request::Get { key }
            | Request::DeleteKey { key }
            | Request::QueuePop { key }
            | Request::QueueLen { key }
            | Request::Renew { key }
            | Request::Sweep { prefix: key }
            | Request::ClearExcept { prefix: key }
            | Request::ClearPrefix { prefix: key } => put_bytes(out, key),
            Request::Add { key, delta } => {
                put_bytes(out, key);
                out.extend_from_slice(&delta.to_le_bytes());
            }
            Request::Check { keys } | Request::Wait { keys } | Request::MultiGet { keys } => {
                put_u64(out, keys.len() as u64);
                for k in keys {
                    put_bytes(out, k);
                }
            }
            Request::MultiSet { pairs } => {
                put_u64(out, pairs.len() as u64);
                for (k, v) in pairs {
                    put_bytes(out, k);
                    put_bytes(out, v);
                }
            }
            Request::GetNumKeys
            | Request::CancelWait
            | Request::ListKeys
            | Request::RankOnly
            | Request::AuthChallenge => {}
            Request::AuthProof { proof } => out.extend_from_slice(proof),
            Request::Ping { nonce } => out.extend_from_slice(&nonce.to_le_bytes()),
            Request::Barrier { key, world_size } => {
                put_bytes(out, key);
                out.extend_from_slice(&world_size.to_le_bytes());
            }
            Request::Join {
                key,
                value,
                counter,
            } => {
                put_bytes(out, key);
                put_bytes(out, value);
                put_bytes(out, counter);
            }
            Request::Tagged { tag, inner } => {
                out.extend_from_slice(&tag.to_le_bytes());
                inner.encode(out);
            }
            Request::WaitGet { key } => {
                put_u64(out, 1);
                put_bytes(out, key);
            }
        }
    }
}

/// Appends a `u64` little-endian.
pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends an `i64` little-endian.
pub fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a length-prefixed byte vector (also how strings are sent).
pub fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u64(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Why a request could not be decoded. Any of these ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("unknown opcode {0}")]
    UnknownOpcode(u8),
    #[error("key of {0} bytes exceeds the limit of {MAX_KEY_LEN}")]
    KeyTooLong(u64),
    #[error("value of {0} bytes exceeds the limit of {MAX_VALUE_LEN}")]
    ValueTooLong(u64),
    #[error("{0} keys in one request exceed the limit of {MAX_KEY_COUNT}")]
    TooManyKeys(u64),
    #[error("opcode {0} cannot be tagged (a tag inside a tag, VALIDATE or AUTH_*, BARRIER)")]
    NotTaggable(u8),
    #[error("WAIT_GET names {0} keys; it takes exactly one")]
    WaitGetKeys(u64),
}

/// Result of trying to decode one request from the front of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// A whole request, and how many bytes it took.
    Complete(Request, usize),
    /// More bytes are needed: at least this many in total (from the start of
    /// the buffer) before trying again is useful.
    Incomplete(usize),
}

enum Stop {
    Short(usize),
    Bad(ProtocolError),
}

impl From<ProtocolError> for Stop {
    fn from(e: ProtocolError) -> Stop {
        Stop::Bad(e)
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Stop> {
        let end = self.pos.checked_add(n).ok_or(Stop::Short(usize::MAX))?;
        if end > self.buf.len() {
            return Err(Stop::Short(end));
        }
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32, Stop> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, Stop> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn i64(&mut self) -> Result<i64, Stop> {
        Ok(self.u64()? as i64)
    }

    fn key(&mut self) -> Result<Vec<u8>, Stop> {
        let n = self.u64()?;
        if n > MAX_KEY_LEN {
            return Err(ProtocolError::KeyTooLong(n).into());
        }
        Ok(self.take(n as usize)?.to_vec())
    }

    fn value(&mut self) -> Result<Vec<u8>, Stop> {
        let n = self.u64()?;
        if n > MAX_VALUE_LEN {
            return Err(ProtocolError::ValueTooLong(n).into());
        }
        Ok(self.take(n as usize)?.to_vec())
    }

    fn count(&mut self) -> Result<usize, Stop> {
        let n = self.u64()?;
        if n > MAX_KEY_COUNT {
            return Err(ProtocolError::TooManyKeys(n).into());
        }
        Ok(n as usize)
    }

    fn keys(&mut self) -> Result<Vec<Vec<u8>>, Stop> {
        let n = self.count()?;
        // Never pre-allocate from an untrusted count beyond what the bytes can hold.
        let mut keys = Vec::with_capacity(n.min((self.buf.len() - self.pos) / 8 + 1));
        for _ in 0..n {
            keys.push(self.key()?);
        }
        Ok(keys)
    }
}

/// Decodes one request from the front of `buf`.
///
/// Never allocates more than the bytes present justify, so a bogus length
/// cannot make the server reserve memory: it just waits for bytes that never
/// come (or that exceed the limits, which is an error).
pub fn parse_request(buf: &[u8]) -> Result<Parsed, ProtocolError> {
    let mut c = Cursor { buf, pos: 0 };
    match parse_inner(&mut c) {
        Ok(req) => Ok(Parsed::Complete(req, c.pos)),
        Err(Stop::Short(n)) => Ok(Parsed::Incomplete(n)),
        Err(Stop::Bad(e)) => Err(e),
    }
}

fn parse_inner(c: &mut Cursor<'_>) -> Result<Request, Stop> {
    let op = c.take(1)?[0];
    let op = Opcode::from_u8(op).ok_or(ProtocolError::UnknownOpcode(op))?;
    parse_op(c, op)
}

fn parse_op(c: &mut Cursor<'_>, op: Opcode) -> Result<Request, Stop> {
    Ok(match op {
        Opcode::Validate => Request::Validate { magic: c.u32()? },
        Opcode::Set => Request::Set {
            key: c.key()?,
            value: c.value()?,
        },
        Opcode::CompareSet => Request::CompareSet {
            key: c.key()?,
            expected: c.value()?,
            desired: c.value()?,
        },
        Opcode::Get => Request::Get { key: c.key()? },
        Opcode::Add => Request::Add {
            key: c.key()?,
            delta: c.i64()?,
        },
        Opcode::Check => Request::Check { keys: c.keys()? },
        Opcode::Wait => Request::Wait { keys: c.keys()? },
        Opcode::GetNumKeys => Request::GetNumKeys,
        Opcode::DeleteKey => Request::DeleteKey { key: c.key()? },
        Opcode::Append => Request::Append {
            key: c.key()?,
            value: c.value()?,
        },
        Opcode::MultiGet => Request::MultiGet { keys: c.keys()? },
        Opcode::MultiSet => {
            let n = c.count()?;
            let mut pairs = Vec::with_capacity(n.min(c.buf.len() / 16 + 1));
            for _ in 0..n {
                let k = c.key()?;
                let v = c.value()?;
                pairs.push((k, v));
            }
            Request::MultiSet { pairs }
        }
        Opcode::CancelWait => Request::CancelWait,
        Opcode::Ping => Request::Ping { nonce: c.u32()? },
        Opcode::QueuePush => Request::QueuePush {
            key: c.key()?,
            value: c.value()?,
        },
        Opcode::QueuePop => Request::QueuePop { key: c.key()? },
        Opcode::QueueLen => Request::QueueLen { key: c.key()? },
        Opcode::ListKeys => Request::ListKeys,
        Opcode::Barrier => Request::Barrier {
            key: c.key()?,
            world_size: c.i64()?,
        },
        Opcode::AuthChallenge => Request::AuthChallenge,
        Opcode::RankOnly => Request::RankOnly,
        Opcode::AuthProof => Request::AuthProof {
            proof: c
                .take(crate::auth::PROOF_LEN)?
                .try_into()
                .expect("32 bytes"),
        },
        Opcode::Renew => Request::Renew { key: c.key()? },
        Opcode::Join => Request::Join {
            key: c.key()?,
            value: c.value()?,
            counter: c.key()?,
        },
        Opcode::Sweep => Request::Sweep { prefix: c.key()? },
        Opcode::ClearExcept => Request::ClearExcept { prefix: c.key()? },
        Opcode::ClearPrefix => Request::ClearPrefix { prefix: c.key()? },
        Opcode::Tagged => {
            let tag = c.u32()?;
            let b = c.take(1)?[0];
            let op = Opcode::from_u8(b).ok_or(ProtocolError::UnknownOpcode(b))?;
            if matches!(
                op,
                Opcode::Tagged
                    | Opcode::Validate
                    | Opcode::AuthChallenge
                    | Opcode::AuthProof
                    | Opcode::RankOnly
                    | Opcode::Barrier
            ) {
                return Err(ProtocolError::NotTaggable(b).into());
            }
            Request::Tagged {
                tag,
                inner: Box::new(parse_op(c, op)?),
            }
        }
        Opcode::WaitGet => {
            let n = c.u64()?;
            if n != 1 {
                return Err(ProtocolError::WaitGetKeys(n).into());
            }
            Request::WaitGet { key: c.key()? }
        }
    })
}

/// Parses a stored counter the way torch does (`std::stoll`): optional
/// leading whitespace, optional sign, at least one digit; anything after the
/// digits is ignored. `None` when there is no number or it overflows.
pub fn parse_counter(v: &[u8]) -> Option<i64> {
    let mut i = 0;
    while i < v.len() && matches!(v[i], b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c) {
        i += 1;
    }
    let start = i;
    if i < v.len() && (v[i] == b'+' || v[i] == b'-') {
        i += 1;
    }
    let digits = i;
    while i < v.len() && v[i].is_ascii_digit() {
        i += 1;
    }
    if i == digits {
        return None;
    }
    std::str::from_utf8(&v[start..i]).ok()?.parse().ok()
}

/// Shows a key for logs and errors: UTF-8 lossily, truncated.
pub struct KeyDisplay<'a>(pub &'a [u8]);

impl fmt::Display for KeyDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = String::from_utf8_lossy(&self.0[..self.0.len().min(200)]);
        write!(f, "{s}")?;
        if self.0.len() > 200 {
            write!(f, "...")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn parse_all(b: &[u8]) -> Request {
        match parse_request(b).unwrap() {
            Parsed::Complete(r, n) => {
                assert_eq!(n, b.len(), "whole buffer consumed");
                r
            }
            other => panic!("incomplete: {other:?}"),
        }
    }

    /// Bytes captured between torch 2.15.0's TCPStore client and its own server.
    #[test]
    fn decodes_requests_captured_from_torch_2_15() {
        let k = |s: &str| s.as_bytes().to_vec();
        let cases: Vec<(&str, Request)> = vec![
            (
                "00cef7853c",
                Request::Validate {
                    magic: VALIDATION_MAGIC,
                },
            ),
            ("0db02e0000", Request::Ping { nonce: 0x2eb0 }),
            (
                "0e02000000000000002f7102000000000000007171",
                Request::QueuePush {
                    key: k("/q"),
                    value: k("qq"),
                },
            ),
            (
                "1002000000000000002f71",
                Request::QueueLen { key: k("/q") },
            ),
            (
                "06010000000000000002000000000000002f71",
                Request::Wait { keys: vec![k("/q")] },
            ),
            (
                "0f02000000000000002f71",
                Request::QueuePop { key: k("/q") },
            ),
            ("11", Request::ListKeys),
            (
                "1202000000000000002f620100000000000000",
                Request::Barrier {
                    key: k("/b"),
                    world_size: 1,
                },
            ),
            (
                "0402000000000000002f6e0500000000000000",
                Request::Add {
                    key: k("/n"),
                    delta: 5,
                },
            ),
            (
                "0203000000000000002f63730000000000000000010000000000000078",
                Request::CompareSet {
                    key: k("/cs"),
                    expected: vec![],
                    desired: k("x"),
                },
            ),
            (
                "0303000000000000002f6373",
                Request::Get { key: k("/cs") },
            ),
            (
                "05020000000000000003000000000000002f637303000000000000002f7a7a",
                Request::Check {
                    keys: vec![k("/cs"), k("/zz")],
                },
            ),
            ("0c", Request::CancelWait),
            ("07", Request::GetNumKeys),
            (
                "0803000000000000002f6373",
                Request::DeleteKey { key: k("/cs") },
            ),
            (
                "0903000000000000002f6170010000000000000061",
                Request::Append {
                    key: k("/ap"),
                    value: k("a"),
                },
            ),
            (
                "0b020000000000000003000000000000002f6d3101000000000000003103000000000000002f6d32010000000000000032",
                Request::MultiSet {
                    pairs: vec![(k("/m1"), k("1")), (k("/m2"), k("2"))],
                },
            ),
            (
                "0a020000000000000003000000000000002f6d3103000000000000002f6d32",
                Request::MultiGet {
                    keys: vec![k("/m1"), k("/m2")],
                },
            ),
        ];
        for (wire, want) in cases {
            let bytes = hex(wire);
            let got = parse_all(&bytes);
            assert_eq!(got, want, "decoding {wire}");
            let mut enc = Vec::new();
            want.encode(&mut enc);
            assert_eq!(enc, bytes, "encoding {want:?}");
        }
    }

    #[test]
    fn every_proper_prefix_is_incomplete() {
        let mut b = Vec::new();
        Request::MultiSet {
            pairs: vec![
                (b"/a".to_vec(), b"12345".to_vec()),
                (b"/bb".to_vec(), vec![]),
            ],
        }
        .encode(&mut b);
        for n in 0..b.len() {
            match parse_request(&b[..n]).unwrap() {
                Parsed::Incomplete(need) => {
                    assert!(need > n && need <= b.len(), "n={n} need={need}")
                }
                c => panic!("prefix {n} parsed: {c:?}"),
            }
        }
        assert!(matches!(parse_request(&b).unwrap(), Parsed::Complete(_, n) if n == b.len()));
    }

    #[test]
    fn two_requests_back_to_back() {
        let mut b = Vec::new();
        Request::Set {
            key: b"/k".to_vec(),
            value: b"v".to_vec(),
        }
        .encode(&mut b);
        let first = b.len();
        Request::Get {
            key: b"/k".to_vec(),
        }
        .encode(&mut b);
        match parse_request(&b).unwrap() {
            Parsed::Complete(Request::Set { .. }, n) => assert_eq!(n, first),
            o => panic!("{o:?}"),
        }
        assert_eq!(
            parse_all(&b[first..]),
            Request::Get {
                key: b"/k".to_vec()
            }
        );
    }

    #[test]
    fn rejects_unknown_opcodes_and_oversized_fields() {
        assert_eq!(parse_request(&[19]), Err(ProtocolError::UnknownOpcode(19)));
        assert_eq!(
            parse_request(&[0xff]),
            Err(ProtocolError::UnknownOpcode(0xff))
        );
        let mut b = vec![Opcode::Get as u8];
        put_u64(&mut b, MAX_KEY_LEN + 1);
        assert_eq!(
            parse_request(&b),
            Err(ProtocolError::KeyTooLong(MAX_KEY_LEN + 1))
        );
        let mut b = vec![Opcode::Set as u8];
        put_bytes(&mut b, b"/k");
        put_u64(&mut b, u64::MAX);
        assert_eq!(
            parse_request(&b),
            Err(ProtocolError::ValueTooLong(u64::MAX))
        );
        let mut b = vec![Opcode::Wait as u8];
        put_u64(&mut b, u64::MAX);
        assert_eq!(parse_request(&b), Err(ProtocolError::TooManyKeys(u64::MAX)));
        // A large but legal length just waits for more bytes (nothing allocated).
        let mut b = vec![Opcode::Set as u8];
        put_bytes(&mut b, b"/k");
        put_u64(&mut b, 1 << 20);
        assert_eq!(
            parse_request(&b),
            Ok(Parsed::Incomplete(b.len() + (1 << 20)))
        );
    }

    #[test]
    fn opcode_numbers_match_torch() {
        for (i, op) in Opcode::ALL.iter().enumerate() {
            assert_eq!(*op as u8 as usize, i);
            assert_eq!(Opcode::from_u8(i as u8), Some(*op));
        }
        assert_eq!(Opcode::Ping as u8, 13);
        assert_eq!(Opcode::QueueLen as u8, 16);
        assert_eq!(Opcode::Barrier as u8, 18);
        assert_eq!(Opcode::from_u8(19), None);
    }

    #[test]
    fn tagged_requests_round_trip_and_refuse_what_cannot_be_tagged() {
        let req = Request::Tagged {
            tag: 0x0102_0304,
            inner: Box::new(Request::WaitGet {
                key: b"/k".to_vec(),
            }),
        };
        let mut b = Vec::new();
        req.encode(&mut b);
        assert_eq!(&b[..6], &[0x64, 4, 3, 2, 1, 0x65]);
        assert_eq!(parse_all(&b), req);
        assert!(!req.one_way());
        for n in 0..b.len() {
            assert!(matches!(parse_request(&b[..n]), Ok(Parsed::Incomplete(_))));
        }
        for op in [0x64u8, 0, 0x60, 0x61, 0x67, 18] {
            assert_eq!(
                parse_request(&[0x64, 1, 0, 0, 0, op]),
                Err(ProtocolError::NotTaggable(op))
            );
        }
        assert_eq!(
            parse_request(&[0x64, 1, 0, 0, 0, 0x6a]),
            Err(ProtocolError::UnknownOpcode(0x6a))
        );
        // RENEW rides a tag and is still one-way: the server sends no frame for it.
        let renew = Request::Tagged {
            tag: 7,
            inner: Box::new(Request::Renew {
                key: b"/vigil/alive/3".to_vec(),
            }),
        };
        let mut r = Vec::new();
        renew.encode(&mut r);
        assert_eq!(parse_all(&r), renew);
        assert!(renew.one_way());
        let mut b = vec![0x65];
        put_u64(&mut b, 2);
        assert_eq!(parse_request(&b), Err(ProtocolError::WaitGetKeys(2)));
    }

    #[test]
    fn counters_parse_like_stoll() {
        assert_eq!(parse_counter(b"42"), Some(42));
        assert_eq!(parse_counter(b"  -7"), Some(-7));
        assert_eq!(parse_counter(b"+3xyz"), Some(3));
        assert_eq!(parse_counter(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_counter(b"9223372036854775808"), None);
        assert_eq!(parse_counter(b""), None);
        assert_eq!(parse_counter(b"abc"), None);
        assert_eq!(parse_counter(b"-"), None);
    }
}

//! The store's core: every decision the server makes, as plain functions over plain data. No
//! sockets, no tasks, no clock but the one passed in, no randomness but the nonce a session is
//! opened with. The server shell (`crate::server`) frames bytes, reads and writes, and carries
//! out the [`Effects`] a call returns (wake-ups for other connections, lease events, an eviction);
//! it decides nothing of its own.
//!
//! One module per family of operations, each tested without a socket:
//! - [`gate`]: who may do what. The handshake, the roles (agent, rank), and the bounds on a
//!   connection that has not proven the secret (bytes, time, how many at once). Every request
//!   passes [`gate::check`] first: this is the one place authentication is decided.
//! - `kv`: keys and values (SET, GET, ADD, COMPARE_SET, ... JOIN).
//! - `waits`: parked waits, untagged (torch's one per connection) and tagged (many), barriers.
//! - `queues`: QUEUE_PUSH, QUEUE_POP, QUEUE_LEN.
//! - `liveness`: leases (keys a connection's end deletes) and renewals with their sweep.
//! - `tagged`: vigil's tagged mode, framing replies by tag.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use crate::protocol::{ProtocolError, Request, MAX_VALUE_LEN};

pub mod gate;
mod kv;
mod liveness;
mod queues;
mod tagged;
mod waits;

#[cfg(test)]
mod tests;

pub use gate::Role;
pub use liveness::{
    lease_event_json, LeaseEvent, LEASE_LOST_PREFIX, LEASE_PREFIX, LEASE_QUEUE, LEASE_QUEUE_MAX,
};

/// A connection, as the core knows it.
pub type ConnId = u64;
/// A parked wait.
pub type WaitId = u64;

/// Raw-key prefix under which vigil agents keep their own coordination keys.
///
/// [`StoreClient`](crate::StoreClient) and torch's client both put `/` in front of the user's
/// key, so an agent key `vigil/attempt` is stored as `/vigil/attempt`.
/// [`KeySpace::reset`](crate::KeySpace::reset) keeps exactly these. Only an agent's connection
/// may name them (see [`gate`]); LIST_KEYS and GETNUMKEYS leave them out for a rank's.
pub const AGENT_PREFIX: &[u8] = b"/vigil/";

/// Default bound on what the server holds: stored keys and values (each key counted with
/// [`ENTRY_OVERHEAD`]), parked waits, and the requests and replies being transferred. A request
/// that would go over it closes its connection.
pub const DEFAULT_MAX_TOTAL: usize = 256 * 1024 * 1024;
/// Bookkeeping charged per stored key, queued element or key of a parked wait, so that many
/// empty ones are bounded too.
pub const ENTRY_OVERHEAD: usize = 64;
/// Largest reply to one request (MULTI_GET of many large values); a bigger one closes the
/// connection.
pub const MAX_REPLY_LEN: usize = 4 * MAX_VALUE_LEN as usize;
/// Most tagged waits (WAIT, WAIT_GET) one connection may have parked at once; one more closes it.
pub const MAX_TAGGED_WAITS: usize = 1024;
/// Connection buffers up to this size are not charged to the total.
pub const FREE_BUFFER: usize = 64 * 1024;

/// The bounds the core enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Stored, parked and buffered bytes together ([`DEFAULT_MAX_TOTAL`]).
    pub max_total: usize,
    /// How long a connection may take to prove the secret ([`gate::HANDSHAKE_TIMEOUT`]).
    pub handshake_timeout: Duration,
    /// How many connections may be in their handshake at once ([`gate::MAX_IN_HANDSHAKE`]);
    /// one more evicts the oldest.
    pub max_in_handshake: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_total: DEFAULT_MAX_TOTAL,
            handshake_timeout: gate::HANDSHAKE_TIMEOUT,
            max_in_handshake: gate::MAX_IN_HANDSHAKE,
        }
    }
}

/// Why a connection ends. Every variant but [`End::Io`] is the peer's fault and is reported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum End {
    #[error("I/O error")]
    Io,
    #[error("{0}")]
    Protocol(ProtocolError),
    #[error("first request was not VALIDATE")]
    NotValidated,
    #[error("VALIDATE with a wrong magic number")]
    BadMagic,
    #[error("{0} before the connection proved the job's secret: this store serves only the handshake (VALIDATE, PING, AUTH_CHALLENGE, AUTH_PROOF) until then; ranks reach it through their node's vigil agent (MASTER_ADDR:MASTER_PORT), agents need the job's VIGIL_STORE_SECRET")]
    NotAuthenticated(String),
    #[error("no proof of the job's secret within {0:?} of connecting")]
    HandshakeTimeout(Duration),
    #[error("a request of more than {0} bytes, or more than {max} requests, before the connection proved the job's secret; the handshake's requests are a few bytes each", max = gate::HANDSHAKE_REQUESTS)]
    HandshakeBudget(usize),
    #[error("closed to make room: more than {0} connections were in their handshake at once")]
    Evicted(usize),
    #[error("a request for vigil's control keys (/vigil/...) or one of vigil's own operations from a rank's connection: ranks may use torch's operations on their own keys only")]
    Unauthorized,
    #[error("an agent presented a wrong proof of the job's secret: every node needs the same VIGIL_STORE_SECRET")]
    AuthFailed,
    #[error("AUTH_PROOF without AUTH_CHALLENGE")]
    AuthOutOfOrder,
    #[error("ADD or BARRIER on a value that is not a decimal counter, or overflow")]
    NotACounter,
    #[error("WAIT or BARRIER while another one is parked on the same connection")]
    WaitAlreadyPending,
    #[error("the store is full: this request would take it over its limit of {0} bytes (keys, values, parked waits and transfers together); store less, or delete keys no longer needed")]
    Full(usize),
    #[error(
        "a reply of more than {MAX_REPLY_LEN} bytes was asked for; ask for fewer keys at a time"
    )]
    ReplyTooLarge,
    #[error("an untagged request on a connection in tagged mode, or a tagged one while an untagged wait is parked; use one mode per connection")]
    MixedModes,
    #[error("WAIT_GET without a tag; it is only served in tagged mode")]
    UntaggedWaitGet,
    #[error("more than {MAX_TAGGED_WAITS} tagged waits parked on one connection")]
    TooManyTags,
    #[error("tag {0} names a wait that is still parked")]
    DuplicateTag(u32),
}

impl End {
    /// Whether the peer is told nothing of it: an I/O error is nobody's fault to report.
    pub fn is_io(&self) -> bool {
        matches!(self, End::Io)
    }
}

/// What a call asks the shell to carry out for others than the calling connection, in order,
/// while it still holds the core.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// Wake-ups: connection `.0`'s wait `.1` was released.
    pub wakes: Vec<(ConnId, WaitId)>,
    /// Lease events to report, in key-space order.
    pub leases: Vec<LeaseEvent>,
    /// A connection to close ([`End::Evicted`]): too many were in their handshake.
    pub evict: Option<ConnId>,
}

/// A parked tagged wait: the tag its answer carries, and for WAIT_GET the key whose value it is.
#[derive(Debug, Clone)]
struct TagWait {
    tag: u32,
    get: Option<Vec<u8>>,
}

/// One connection's state in the core: its gate, its parked waits, its leases.
#[derive(Debug)]
pub struct Session {
    id: ConnId,
    gate: gate::Gate,
    /// The untagged wait parked (WAIT or BARRIER), if any.
    wait: Option<WaitId>,
    /// Set by the first tagged request: from then on only tagged requests are served.
    tagged: bool,
    tag_waits: HashMap<WaitId, TagWait>,
    /// The tag of each parked tagged wait -> its wait id (a tagged CANCEL_WAIT names the tag).
    tag_ids: HashMap<u32, WaitId>,
    /// Lease keys this connection has stored, whether or not it still owns them.
    leases: HashSet<Vec<u8>>,
    /// Bytes of this connection's buffers charged to the total.
    charged: usize,
}

impl Session {
    pub fn id(&self) -> ConnId {
        self.id
    }

    pub fn role(&self) -> Role {
        self.gate.role()
    }

    /// Whether a wake-up may come for this connection (a wait of its is parked).
    pub fn parked(&self) -> bool {
        self.wait.is_some() || !self.tag_waits.is_empty()
    }

    /// How many bytes the shell may buffer for this connection's next request.
    pub fn read_budget(&self) -> usize {
        self.gate.read_budget()
    }

    /// Whether buffers of `cap` bytes change what is charged (so the shell need not take the
    /// core's lock for buffers that stay within [`FREE_BUFFER`]).
    pub fn charge_changes(&self, cap: usize) -> bool {
        cap.saturating_sub(FREE_BUFFER) != self.charged
    }
}

/// Counters describing the core's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub keys: usize,
    pub queues: usize,
    pub waits: usize,
    pub stored_bytes: usize,
    pub parked_bytes: usize,
    pub buffered_bytes: usize,
    pub in_handshake: usize,
}

/// Everything the store holds, and the rules.
#[derive(Default)]
pub struct Core {
    kv: HashMap<Vec<u8>, Vec<u8>>,
    queues: HashMap<Vec<u8>, VecDeque<Vec<u8>>>,
    waits: waits::Waits,
    /// Lease key -> the connection that owns it, while the key holds that connection's write.
    lease_owner: HashMap<Vec<u8>, ConnId>,
    /// Counters renewed with RENEW -> renewed since the last SWEEP of a prefix they fall under.
    renewed: BTreeMap<Vec<u8>, bool>,
    /// Stored keys, values and queued elements ([`ENTRY_OVERHEAD`] each).
    stored: usize,
    /// Charged connection buffers.
    buffered: usize,
    admission: gate::Admission,
    secret: Option<std::sync::Arc<[u8]>>,
    limits: Limits,
    next_conn: ConnId,
    /// Whether lost leases are also queued on [`LEASE_QUEUE`] (a store outside the job).
    lease_queue: bool,
}

impl Core {
    pub fn new(limits: Limits) -> Core {
        Core {
            limits,
            ..Core::default()
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// With a secret, a connection must prove it before anything but the handshake (see
    /// [`gate`]). Applies to connections opened afterwards.
    pub fn set_secret(&mut self, secret: Option<std::sync::Arc<[u8]>>) {
        self.secret = secret;
    }

    /// With `on`, every [`LeaseEvent::Lost`] is also pushed onto the queue [`LEASE_QUEUE`] (at
    /// most [`LEASE_QUEUE_MAX`] kept, oldest dropped), so that an agent that does not host the
    /// store can learn of it over the wire. Off by default.
    pub fn set_lease_queue(&mut self, on: bool) {
        self.lease_queue = on;
    }

    pub fn usage(&self) -> Usage {
        Usage {
            keys: self.kv.len(),
            queues: self.queues.values().filter(|q| !q.is_empty()).count(),
            waits: self.waits.len(),
            stored_bytes: self.stored,
            parked_bytes: self.waits.bytes(),
            buffered_bytes: self.buffered,
            in_handshake: self.admission.len(),
        }
    }

    /// A new connection, opened at `now`, whose AUTH_CHALLENGE will carry `nonce`. The effects
    /// may evict the oldest connection still in its handshake.
    pub fn open(
        &mut self,
        now: Instant,
        nonce: [u8; crate::auth::NONCE_LEN],
    ) -> (Session, Effects) {
        self.next_conn += 1;
        let id = self.next_conn;
        let gate = gate::Gate::new(self.secret.clone(), nonce, now);
        let evict = self.admission.enter(id, self.limits.max_in_handshake);
        let s = Session {
            id,
            gate,
            wait: None,
            tagged: false,
            tag_waits: HashMap::new(),
            tag_ids: HashMap::new(),
            leases: HashSet::new(),
            charged: 0,
        };
        let fx = Effects {
            evict,
            ..Effects::default()
        };
        (s, fx)
    }

    /// Serves one request of `s`: its reply is appended to `out` exactly as torch's server (or
    /// vigil's tagged mode) writes it. An error ends the connection after what `out` holds is
    /// written.
    pub fn apply(
        &mut self,
        s: &mut Session,
        req: Request,
        out: &mut Vec<u8>,
        fx: &mut Effects,
    ) -> Result<(), End> {
        gate::check(&mut s.gate, &req)?;
        match req {
            Request::Tagged { tag, inner } => self.tagged(s, tag, *inner, out, fx),
            _ if s.tagged => Err(End::MixedModes),
            req => self.plain(s, req, out, fx),
        }
    }

    /// One untagged request (or a tagged one's inner request that does not park).
    fn plain(
        &mut self,
        s: &mut Session,
        req: Request,
        out: &mut Vec<u8>,
        fx: &mut Effects,
    ) -> Result<(), End> {
        match req {
            Request::Validate { magic } => s.gate.validate(magic).map(|admitted| {
                if admitted {
                    self.admission.leave(s.id);
                }
            }),
            Request::Ping { nonce } => {
                out.extend_from_slice(&nonce.to_le_bytes());
                Ok(())
            }
            Request::AuthChallenge => {
                s.gate.challenge(out);
                Ok(())
            }
            Request::AuthProof { proof } => {
                let r = s.gate.prove(&proof, out);
                if s.gate.role() != Role::Handshake {
                    self.admission.leave(s.id);
                }
                r
            }
            Request::RankOnly => {
                s.gate.rank_only();
                Ok(())
            }
            Request::Tagged { .. } => Err(End::MixedModes),
            Request::Wait { keys } => self.park(s, keys, out),
            Request::Barrier { key, world_size } => self.barrier(s, key, world_size, out, fx),
            Request::CancelWait => {
                self.cancel_untagged(s, out);
                Ok(())
            }
            Request::WaitGet { .. } => Err(End::UntaggedWaitGet),
            Request::QueuePush { .. } | Request::QueuePop { .. } | Request::QueueLen { .. } => {
                self.queue_op(req, out, fx)
            }
            Request::Renew { key } => self.renew(key, fx),
            Request::Sweep { prefix } => self.sweep_reply(&prefix, out),
            Request::ClearExcept { prefix } => {
                let n = self.remove_where(|k| !k.starts_with(&prefix));
                crate::protocol::put_i64(out, n as i64);
                Ok(())
            }
            Request::ClearPrefix { prefix } => {
                let n = self.remove_where(|k| k.starts_with(&prefix));
                crate::protocol::put_i64(out, n as i64);
                Ok(())
            }
            req => self.kv_op(s, req, out, fx),
        }
    }

    /// A wake-up for `s`'s wait `id` reached its connection: its answer, unless it was
    /// cancelled (and answered) meanwhile.
    pub fn woken(&mut self, s: &mut Session, id: WaitId, out: &mut Vec<u8>) {
        if s.wait == Some(id) {
            s.wait = None;
            out.push(crate::protocol::WAIT_STOP_WAITING);
            return;
        }
        self.woken_tagged(s, id, out);
    }

    /// The shell's buffers for `s` now take `cap` bytes: charged beyond [`FREE_BUFFER`].
    pub fn charge(&mut self, s: &mut Session, cap: usize) -> Result<(), End> {
        let want = cap.saturating_sub(FREE_BUFFER);
        self.buffered = self.buffered - s.charged + want;
        let grew = want > s.charged;
        s.charged = want;
        if grew && self.total() > self.limits.max_total {
            return Err(End::Full(self.limits.max_total));
        }
        Ok(())
    }

    /// When `s` must have completed its handshake.
    pub fn deadline(&self, s: &Session) -> Option<Instant> {
        s.gate.deadline(self.limits.handshake_timeout)
    }

    /// `s` ended: its waits are unregistered, its buffers uncharged and, when `settle` (the
    /// connection ended by itself, not by the server's shutdown), its leases settled.
    pub fn close(&mut self, s: Session, settle: bool) -> Effects {
        let mut fx = Effects::default();
        for id in s.wait.into_iter().chain(s.tag_waits.keys().copied()) {
            self.waits.cancel(id);
        }
        self.buffered -= s.charged;
        self.admission.leave(s.id);
        if settle {
            self.release_leases(s.id, s.leases, &mut fx);
        }
        fx
    }

    /// What connections hold apart from stored data: parked waits and charged buffers.
    pub fn held(&self) -> usize {
        self.waits.bytes() + self.buffered
    }

    fn total(&self) -> usize {
        self.stored + self.waits.bytes() + self.buffered
    }

    /// Refuses a write that would take the stored and parked bytes over the limit (the buffer
    /// holding this very request is about to be freed: not counted).
    fn admit(&self, growth: usize) -> Result<(), End> {
        if self.stored + self.waits.bytes() + growth > self.limits.max_total {
            return Err(End::Full(self.limits.max_total));
        }
        Ok(())
    }
}

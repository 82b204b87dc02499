//! Who may do what: the one place the store decides authentication, for every operation.
//!
//! A connection starts in [`Role::Handshake`]. There it may send only the handshake: VALIDATE
//! (torch's magic), PING, AUTH_CHALLENGE and AUTH_PROOF, each of a few bytes
//! ([`HANDSHAKE_BYTES`], at most [`HANDSHAKE_REQUESTS`] of them), within
//! [`HANDSHAKE_TIMEOUT`] of connecting; anything else closes it. At most [`MAX_IN_HANDSHAKE`]
//! connections are in their handshake at once: one more evicts the oldest, so a flood of idle
//! connections holds a bounded number of descriptors and cannot park a wait or store a byte.
//!
//! - A store with a secret admits a connection as [`Role::Agent`] once it proves the secret
//!   (AUTH_PROOF, an HMAC of a fresh nonce, compared in constant time).
//! - A store without one (torch's behaviour, or a job that chose to run open) admits it at
//!   VALIDATE.
//!
//! An agent may do everything. RANK_ONLY turns an agent's connection into [`Role::Rank`] for good:
//! torch's own operations on keys outside `/vigil/` and nothing else (the ranks' door of each
//! agent, through which every rank's torch client reaches the store, sends it after proving the
//! secret). So neither a stranger nor a rank can touch vigil's control keys or its operations.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{ConnId, End, AGENT_PREFIX};
use crate::auth;
use crate::protocol::{Opcode, Request, VALIDATION_MAGIC};

/// How long a connection may take to complete its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections in their handshake at once; one more evicts the oldest.
pub const MAX_IN_HANDSHAKE: usize = 256;
/// The most bytes a connection in its handshake may have buffered (its largest request,
/// AUTH_PROOF, takes 33).
pub const HANDSHAKE_BYTES: usize = 64;
/// The most requests a connection may send in its handshake.
pub const HANDSHAKE_REQUESTS: usize = 16;
/// What an admitted connection may buffer for one request: the largest request the protocol
/// allows is bounded by its own limits and the store's total.
const ADMITTED_BYTES: usize = usize::MAX;

/// What a connection may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Not yet admitted: the handshake only.
    Handshake,
    /// Proved the secret (or the store has none): everything.
    Agent,
    /// A rank's torch client behind its agent: torch's operations on keys outside `/vigil/`.
    Rank,
}

/// A connection's side of the gate.
#[derive(Debug)]
pub struct Gate {
    role: Role,
    validated: bool,
    secret: Option<Arc<[u8]>>,
    nonce: [u8; auth::NONCE_LEN],
    challenged: bool,
    opened: Instant,
    handshake_requests: usize,
}

/// The handshake's operations.
fn is_handshake(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::Validate | Opcode::Ping | Opcode::AuthChallenge | Opcode::AuthProof
    )
}

/// torch's own operations (its `QueryType`), the ones a rank's client sends.
fn is_torch(op: Opcode) -> bool {
    (op as u8) <= Opcode::Barrier as u8
}

/// Whether the connection whose gate is `g` may send `req`: the one decision on authentication.
/// A request in the handshake counts against its budget.
pub fn check(g: &mut Gate, req: &Request) -> Result<(), End> {
    let op = req.opcode();
    match g.role {
        Role::Handshake if !is_handshake(op) => {
            return Err(End::NotAuthenticated(format!("opcode {}", op as u8)))
        }
        Role::Handshake => {
            g.handshake_requests += 1;
            if g.handshake_requests > HANDSHAKE_REQUESTS {
                return Err(End::HandshakeBudget(HANDSHAKE_BYTES));
            }
        }
        Role::Rank if !is_torch(op) || req.keys().iter().any(|k| k.starts_with(AGENT_PREFIX)) => {
            return Err(End::Unauthorized)
        }
        Role::Rank | Role::Agent => {}
    }
    if !g.validated && op != Opcode::Validate {
        return Err(End::NotValidated);
    }
    Ok(())
}

impl Gate {
    pub fn new(secret: Option<Arc<[u8]>>, nonce: [u8; auth::NONCE_LEN], now: Instant) -> Gate {
        Gate {
            role: Role::Handshake,
            validated: false,
            secret,
            nonce,
            challenged: false,
            opened: now,
            handshake_requests: 0,
        }
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// VALIDATE; true if it admitted the connection (a store without a secret). A repeated one
    /// with the right magic changes nothing (a rank's client behind the ranks' door sends its own
    /// after the door's).
    pub(super) fn validate(&mut self, magic: u32) -> Result<bool, End> {
        if magic != VALIDATION_MAGIC {
            return Err(End::BadMagic);
        }
        self.validated = true;
        if self.role == Role::Handshake && self.secret.is_none() {
            self.role = Role::Agent;
            return Ok(true);
        }
        Ok(false)
    }

    /// AUTH_CHALLENGE: `u8` 1 if the store requires the secret (else 0), then the nonce.
    pub(super) fn challenge(&mut self, out: &mut Vec<u8>) {
        out.push(self.secret.is_some() as u8);
        out.extend_from_slice(&self.nonce);
        self.challenged = true;
    }

    /// AUTH_PROOF: `u8` 1 and admitted, or `u8` 0 and the connection closes.
    pub(super) fn prove(
        &mut self,
        proof: &[u8; auth::PROOF_LEN],
        out: &mut Vec<u8>,
    ) -> Result<(), End> {
        if !self.challenged {
            return Err(End::AuthOutOfOrder);
        }
        // One proof per nonce.
        self.challenged = false;
        if let Some(secret) = &self.secret {
            if !auth::verify(secret, &self.nonce, proof) {
                out.push(0);
                return Err(End::AuthFailed);
            }
        }
        if self.role == Role::Handshake {
            self.role = Role::Agent;
        }
        out.push(1);
        Ok(())
    }

    /// RANK_ONLY: a rank's connection from now on.
    pub(super) fn rank_only(&mut self) {
        self.role = Role::Rank;
    }

    pub(super) fn read_budget(&self) -> usize {
        match self.role {
            Role::Handshake => HANDSHAKE_BYTES,
            _ => ADMITTED_BYTES,
        }
    }

    pub(super) fn deadline(&self, timeout: Duration) -> Option<Instant> {
        (self.role == Role::Handshake).then(|| self.opened + timeout)
    }
}

/// The connections in their handshake, oldest first. Entering and leaving are O(1) (a job's start
/// has thousands in their handshake at once): one that leaves stays in the order until it reaches
/// the front, and the order is compacted when it holds more departed than present.
#[derive(Debug, Default)]
pub struct Admission {
    order: VecDeque<ConnId>,
    present: std::collections::HashSet<ConnId>,
}

impl Admission {
    /// `id` starts its handshake; the oldest one to evict if that makes more than `cap`.
    pub fn enter(&mut self, id: ConnId, cap: usize) -> Option<ConnId> {
        self.order.push_back(id);
        self.present.insert(id);
        if self.present.len() <= cap.max(1) {
            return None;
        }
        while let Some(old) = self.order.pop_front() {
            if self.present.remove(&old) {
                return Some(old);
            }
        }
        None
    }

    /// `id` completed its handshake or ended.
    pub fn leave(&mut self, id: ConnId) {
        if self.present.remove(&id) && self.order.len() > 2 * self.present.len() + 64 {
            let present = &self.present;
            self.order.retain(|c| present.contains(c));
        }
    }

    pub fn len(&self) -> usize {
        self.present.len()
    }

    pub fn is_empty(&self) -> bool {
        self.present.is_empty()
    }
}

/// Why the store turned away a connection that never got past its handshake: a client without
/// the job's secret (a port scanner, junk, a flood), or a node of another job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// It sent bytes that are not the handshake (or too many, or out of order).
    BadBytes,
    /// It presented a wrong proof of the secret.
    WrongSecret,
    /// It closed (or was closed for its silence, [`HANDSHAKE_TIMEOUT`]) before completing it.
    ClosedInHandshake,
    /// It was closed to make room: more than [`MAX_IN_HANDSHAKE`] were in their handshake.
    OverBudget,
}

impl Refusal {
    pub const ALL: [Refusal; 4] = [
        Refusal::BadBytes,
        Refusal::WrongSecret,
        Refusal::ClosedInHandshake,
        Refusal::OverBudget,
    ];

    /// The name the agent's event log and console use.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::BadBytes => "bad_bytes",
            Refusal::WrongSecret => "wrong_secret",
            Refusal::ClosedInHandshake => "closed_in_handshake",
            Refusal::OverBudget => "over_budget",
        }
    }
}

/// The refusal a connection's end is, when it ended in `role` (`None`: it was admitted, so its
/// end, whatever it was, is not a stranger turned away).
pub fn refusal(role: Role, end: &Result<(), End>) -> Option<Refusal> {
    if role != Role::Handshake {
        return None;
    }
    Some(match end {
        Ok(()) | Err(End::Io) | Err(End::HandshakeTimeout(_)) => Refusal::ClosedInHandshake,
        Err(End::AuthFailed) => Refusal::WrongSecret,
        Err(End::Evicted(_)) => Refusal::OverBudget,
        Err(_) => Refusal::BadBytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn only_a_connection_ended_in_its_handshake_is_a_refusal_and_of_which_kind() {
        use crate::protocol::ProtocolError;
        let h = Role::Handshake;
        let t = Duration::from_secs(10);
        assert_eq!(refusal(h, &Ok(())), Some(Refusal::ClosedInHandshake));
        assert_eq!(refusal(h, &Err(End::Io)), Some(Refusal::ClosedInHandshake));
        assert_eq!(
            refusal(h, &Err(End::HandshakeTimeout(t))),
            Some(Refusal::ClosedInHandshake)
        );
        assert_eq!(
            refusal(h, &Err(End::AuthFailed)),
            Some(Refusal::WrongSecret)
        );
        assert_eq!(
            refusal(h, &Err(End::Evicted(256))),
            Some(Refusal::OverBudget)
        );
        for e in [
            End::BadMagic,
            End::NotValidated,
            End::AuthOutOfOrder,
            End::HandshakeBudget(HANDSHAKE_BYTES),
            End::NotAuthenticated("opcode 9".into()),
            End::Protocol(ProtocolError::UnknownOpcode(200)),
        ] {
            assert_eq!(refusal(h, &Err(e.clone())), Some(Refusal::BadBytes), "{e}");
        }
        // Admitted: an agent's or a rank's end is not a refusal, however it ended.
        for r in [Role::Agent, Role::Rank] {
            assert_eq!(refusal(r, &Ok(())), None);
            assert_eq!(refusal(r, &Err(End::Unauthorized)), None);
            assert_eq!(refusal(r, &Err(End::Io)), None);
        }
        let names: Vec<_> = Refusal::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(
            names,
            [
                "bad_bytes",
                "wrong_secret",
                "closed_in_handshake",
                "over_budget"
            ]
        );
    }

    proptest! {
        /// Against a plain list: the same evictions, in the same order, whatever enters and leaves.
        #[test]
        fn admission_evicts_the_oldest_present_as_a_list_would(
            ops in prop::collection::vec((any::<bool>(), 0u64..40), 0..300),
            cap in 1usize..8,
        ) {
            let mut a = Admission::default();
            let mut list: Vec<ConnId> = Vec::new();
            let mut next = 0;
            for (enter, pick) in ops {
                if enter {
                    next += 1;
                    list.push(next);
                    let want = (list.len() > cap).then(|| list.remove(0));
                    prop_assert_eq!(a.enter(next, cap), want);
                } else if !list.is_empty() {
                    let id = list[pick as usize % list.len()];
                    list.retain(|c| *c != id);
                    a.leave(id);
                }
                prop_assert_eq!(a.len(), list.len());
            }
        }
    }
}

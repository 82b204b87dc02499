//! c10d without node ranks (torchrun's c10d rendezvous): an agent that does not host the store
//! asks it for a node rank. The store's host is node rank 0; the others draw tickets from one
//! counter in the order they reach it (with the store outside the job, every agent draws and the
//! first is node rank 0) ([`super::decide::hand_out_node_rank`] turns a ticket into a
//! node rank). An agent draws once for its life, so it keeps its node rank across every restart of
//! the job; a stray of another shape is refused before it draws (as its connection opens, [`StoreLink::client_unranked`]).

use super::connect::{store_lost, Fatal, StoreLink};
use super::decide::hand_out_node_rank;
use super::wire::key;
use super::CoordConfig;

/// This agent's identity for the rendezvous: its host, its pid and a random id drawn now, so
/// that two agents never share one (not even a pid reused in another container).
pub fn identity(host: &str) -> String {
    let random = vigil_store::auth::random_secret()
        .map(|s| {
            s.iter()
                .take(8)
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        })
        .unwrap_or_default();
    let host: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{host}-{}-{random}", std::process::id())
}

/// Why this agent got no node rank: the store is out of reach, or it refused this agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Unclaimed {
    pub reason: String,
    /// The store is out of reach (the job may be requeued); `false`: this agent was refused.
    pub requeue: bool,
}

impl From<Fatal> for Unclaimed {
    fn from(f: Fatal) -> Self {
        Unclaimed {
            reason: f.reason,
            requeue: f.requeue,
        }
    }
}

/// This agent's node rank, as the rendezvous handed it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimed {
    pub node_rank: u32,
    /// The store runs outside the job (`vigil store`, [`key::SERVICE`]): no agent hosts it,
    /// node rank 0 coordinates through it and hands the work on when it is lost.
    pub outside: bool,
}

/// Asks the job's store (at `cfg.store`, with the job's shape in `cfg`) for this agent's node
/// rank, on the agent's connection (`link`, opened here: the rendezvous goes on on it).
/// `cfg.node_rank` is not read.
pub async fn claim_node_rank(
    link: &StoreLink,
    cfg: &CoordConfig,
    identity: &str,
) -> Result<Claimed, Unclaimed> {
    Ok(claim(link, cfg, identity).await?)
}

async fn claim(link: &StoreLink, cfg: &CoordConfig, identity: &str) -> Result<Claimed, Fatal> {
    let (c, outside) = link.client_unranked(cfg).await?;
    let lost = |e: vigil_store::StoreError| Fatal::lost(store_lost(cfg.store, e));
    let mine = key::node_of(identity);
    if c.check(&[&mine]).await.map_err(lost)? {
        let v = c.get(&mine).await.map_err(lost)?;
        if let Some(node_rank) = std::str::from_utf8(&v).ok().and_then(|s| s.parse().ok()) {
            return Ok(Claimed { node_rank, outside });
        }
    }
    let ticket = c.add(key::NODE_TICKETS, 1).await.map_err(lost)?;
    let node_rank = hand_out_node_rank(ticket, cfg.nnodes, cfg.active, outside)
        .map_err(|e| Fatal::refused(e.to_string()))?;
    c.set(&mine, node_rank.to_string().as_bytes())
        .await
        .map_err(lost)?;
    Ok(Claimed { node_rank, outside })
}

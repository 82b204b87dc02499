//! Connecting to node rank 0's store: the agent's one connection ([`StoreLink`]), proving the
//! secret, and being admitted to the job (an agent of another shape or job is refused before it
//! writes anything).

use std::net::SocketAddr;
use std::sync::Arc;

use vigil_store::{MuxClient, StoreClient};

use super::wire::{key, to_json, JobShape};
use super::CoordConfig;

/// Why this agent cannot take part in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fatal {
    pub reason: String,
    /// The store is gone or out of reach: the job may be requeued. `false`: this agent was
    /// refused (another job, another shape, a node rank taken, a wrong secret).
    pub requeue: bool,
}

impl Fatal {
    pub(super) fn lost(reason: String) -> Self {
        Fatal {
            reason,
            requeue: true,
        }
    }

    pub(super) fn refused(reason: String) -> Self {
        Fatal {
            reason,
            requeue: false,
        }
    }
}

/// Why an agent lost the job's coordination when its connection to the store failed.
pub(super) fn store_lost(store: SocketAddr, e: impl std::fmt::Display) -> String {
    format!(
        "lost the connection to node rank 0's store at {store}: {e}; node rank 0's agent died or the network failed"
    )
}

/// The agent's one connection to node rank 0's store, opened on first use and shared by all
/// that talk to the store: the node-rank claim, the rendezvous and its waits, liveness, the
/// straggler exchange (the store's tagged mode, docs/store.md). The connection holds this node's
/// lease: it ends with the agent. Clones share it.
#[derive(Clone, Default)]
pub struct StoreLink {
    cell: Arc<tokio::sync::OnceCell<Opened>>,
}

/// An open connection, and whether the store said, as it opened, that it runs outside the job
/// ([`key::SERVICE`]; read only for an agent without a node rank).
#[derive(Clone)]
struct Opened {
    client: MuxClient,
    outside: bool,
}

impl std::fmt::Debug for StoreLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreLink")
            .field("open", &self.cell.initialized())
            .finish()
    }
}

impl StoreLink {
    pub fn new() -> Self {
        Self::default()
    }

    /// The connection, opened (to `cfg.store`, with `cfg.secret`) by the first caller; a failed
    /// open is tried again by the next. A connection that died stays dead: its calls fail.
    pub(crate) async fn client(&self, cfg: &CoordConfig) -> Result<MuxClient, Fatal> {
        let opened = (self.cell)
            .get_or_try_init(|| connect_client(cfg, Some(cfg.node_rank)))
            .await?;
        Ok(opened.client.clone())
    }

    /// [`StoreLink::client`] for an agent that has no node rank yet (c10d hands them out), and
    /// whether the store runs outside the job, as the connection found when it opened.
    pub(crate) async fn client_unranked(
        &self,
        cfg: &CoordConfig,
    ) -> Result<(MuxClient, bool), Fatal> {
        let opened = (self.cell)
            .get_or_try_init(|| connect_client(cfg, None))
            .await?;
        Ok((opened.client.clone(), opened.outside))
    }
}

/// Waits out this agent's place in the job's first connects ([`vigil_store::first_connect_delay`]:
/// nothing unless the job has more nodes than this kernel's listen queue holds). Node rank 0
/// hosts the store and connects at once.
async fn stagger(cfg: &CoordConfig, node_rank: Option<u32>) {
    if node_rank == Some(0) {
        return;
    }
    let cap = vigil_store::server::somaxconn().unwrap_or(4096);
    let r = vigil_store::auth::random::<4>().map_or(0, u32::from_le_bytes);
    let d = vigil_store::first_connect_delay(node_rank, cfg.nnodes, cap, r);
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

async fn connect_client(cfg: &CoordConfig, node_rank: Option<u32>) -> Result<Opened, Fatal> {
    stagger(cfg, node_rank).await;
    let mut c = StoreClient::connect(cfg.store, cfg.join_timeout)
        .await
        .map_err(|e| {
            Fatal::lost(format!(
                "cannot reach node rank 0's store at {} ({e}); check that node rank 0 runs vigil with the same --master-addr/--master-port or --rdzv-endpoint",
                cfg.store
            ))
        })?;
    let _ = c.set_peer_timeout(cfg.peer_timeout);
    c.authenticate(cfg.secret.as_deref())
        .await
        .map_err(|e| match e {
            vigil_store::StoreError::Auth(why) => {
                Fatal::refused(format!("node rank 0's store at {}: {why}", cfg.store))
            }
            e => Fatal::lost(store_lost(cfg.store, e)),
        })?;
    let outside = match node_rank {
        Some(0) => false,
        _ => admitted(&mut c, cfg, node_rank).await?,
    };
    let client = MuxClient::from_client(c).map_err(|e| Fatal::lost(store_lost(cfg.store, e)))?;
    Ok(Opened { client, outside })
}

/// Waits (up to `--join-timeout`) for node rank 0's [`JobShape`] and compares this agent's with
/// it; a stray is refused, having written nothing. Done once per agent, as its connection opens
/// and before it turns tagged, in torch's plain requests: a node rank 0 of an older vigil
/// (PROTOCOL 2 and before) knows no tagged request and would drop the connection, which would
/// read as a lost store (exit 75, requeued) instead of the one-line refusal of another version.
/// `node_rank`: `None` while the rendezvous has not handed this agent one; only then is the
/// store asked whether it runs outside the job (the answer, false otherwise).
async fn admitted(
    c: &mut StoreClient,
    cfg: &CoordConfig,
    node_rank: Option<u32>,
) -> Result<bool, Fatal> {
    let lost = |e| Fatal::lost(store_lost(cfg.store, e));
    let outside = node_rank.is_none() && c.check(&[key::SERVICE]).await.map_err(lost)?;
    if outside {
        // No agent hosts the store (`vigil store`): the first agent to reach it says what the
        // job is, and every later one is compared with it.
        c.compare_set(key::JOB, b"", &to_json(&cfg.shape()))
            .await
            .map_err(lost)?;
    }
    let theirs = match c.wait(&[key::JOB], cfg.join_timeout).await {
        Ok(()) => c.get(key::JOB).await,
        Err(e) => Err(e),
    };
    let theirs = match theirs {
        Ok(v) => v,
        Err(e) if e.is_timeout() => {
            return Err(Fatal::lost(format!(
                "node rank 0's store at {} did not say within --join-timeout ({}s) which job it runs; is node rank 0 a vigil agent of this job?",
                cfg.store,
                cfg.join_timeout.as_secs()
            )))
        }
        Err(e) => return Err(Fatal::lost(store_lost(cfg.store, e))),
    };
    let theirs: JobShape = serde_json::from_slice(&theirs).map_err(|_| {
        Fatal::refused(format!(
            "node rank 0's store at {} holds no job this vigil understands; run the same vigil on every node",
            cfg.store
        ))
    })?;
    match theirs.refusal(&cfg.shape(), node_rank) {
        Some(why) => Err(Fatal::refused(why)),
        None => Ok(outside),
    }
}

/// Takes this agent's place in the job: node rank 0 says what the job is; every other agent, admitted
/// as its connection opened ([`admitted`]: a stray, another `--nnodes` or another job, is refused
/// before it writes anything), claims its node rank and holds its lease.
pub(super) async fn claim(ctl: &MuxClient, cfg: &CoordConfig) -> Result<(), Fatal> {
    let lost_store = |e: vigil_store::StoreError| Fatal::lost(store_lost(cfg.store, e));
    if cfg.node_rank == 0 {
        ctl.set(key::JOB, &to_json(&cfg.shape()))
            .await
            .map_err(lost_store)?;
    }
    // Two agents claiming one node rank would silently corrupt the job: refuse.
    let me = format!("{} (pid {})", cfg.host, std::process::id());
    let owner = ctl
        .compare_set(&key::owner(cfg.node_rank), b"", me.as_bytes())
        .await
        .map_err(lost_store)?;
    if owner != me.as_bytes() {
        return Err(Fatal::refused(format!(
            "node rank {} is already taken by {}; give every node its own --node-rank (0 to {})",
            cfg.node_rank,
            String::from_utf8_lossy(&owner),
            cfg.nnodes - 1
        )));
    }
    if cfg.outside && cfg.node_rank == 0 {
        // The store outlives any agent: node rank 0 coordinates first, holding the
        // coordinator's lease, and its node is lost like any other's (its own lease).
        let mine = b"0";
        // A record of an earlier coordinator's loss (a job that ended without clearing) would
        // wake the others' watch at once.
        ctl.delete_key(key::COORD_LOST).await.map_err(lost_store)?;
        let held = ctl
            .compare_set(key::COORD_LEASE, b"", mine)
            .await
            .map_err(lost_store)?;
        if held != mine {
            return Err(Fatal::refused(format!(
                "the store at {} already has a coordinator (node rank {}): one job at a time uses a store outside the job",
                cfg.store,
                String::from_utf8_lossy(&held)
            )));
        }
    }
    if cfg.node_rank != 0 || cfg.outside {
        ctl.set(&key::lease(cfg.node_rank), me.as_bytes())
            .await
            .map_err(lost_store)?;
    }
    Ok(())
}

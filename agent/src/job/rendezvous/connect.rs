//! Connecting to node rank 0's store: proving the secret, and being admitted to the job (an
//! agent of another shape or job is refused before it writes anything).

use std::net::SocketAddr;

use vigil_store::StoreClient;

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

pub(crate) async fn connect_client(cfg: &CoordConfig) -> Result<StoreClient, Fatal> {
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
    Ok(c)
}

/// Waits (up to `--join-timeout`) for node rank 0's [`JobShape`] and compares this agent's with
/// it; a stray is refused, having written nothing.
/// `node_rank`: `None` while the rendezvous has not handed this agent one.
pub(super) async fn admitted(
    ctl: &mut StoreClient,
    cfg: &CoordConfig,
    node_rank: Option<u32>,
) -> Result<(), Fatal> {
    let lost_store = |e: vigil_store::StoreError| Fatal::lost(store_lost(cfg.store, e));
    if let Err(e) = ctl.wait(&[key::JOB], cfg.join_timeout).await {
        return Err(if e.is_timeout() {
            Fatal::lost(format!(
                "node rank 0's store at {} did not say within --join-timeout ({}s) which job it runs; is node rank 0 a vigil agent of this job?",
                cfg.store,
                cfg.join_timeout.as_secs()
            ))
        } else {
            lost_store(e)
        });
    }
    let theirs = ctl.get(key::JOB).await.map_err(lost_store)?;
    let theirs: JobShape = serde_json::from_slice(&theirs).map_err(|_| {
        Fatal::refused(format!(
            "node rank 0's store at {} holds no job this vigil understands; run the same vigil on every node",
            cfg.store
        ))
    })?;
    match theirs.refusal(&cfg.shape(), node_rank) {
        Some(why) => Err(Fatal::refused(why)),
        None => Ok(()),
    }
}

/// Takes this agent's place in the job: node rank 0 says what the job is; every other agent is
/// admitted first (a stray, another `--nnodes` or another job, must be refused before it writes
/// anything), then claims its node rank and, but for node rank 0, holds its lease.
pub(super) async fn claim(ctl: &mut StoreClient, cfg: &CoordConfig) -> Result<(), Fatal> {
    let lost_store = |e: vigil_store::StoreError| Fatal::lost(store_lost(cfg.store, e));
    if cfg.node_rank == 0 {
        ctl.set(key::JOB, &to_json(&cfg.shape()))
            .await
            .map_err(lost_store)?;
    } else {
        admitted(ctl, cfg, Some(cfg.node_rank)).await?;
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
    if cfg.node_rank != 0 {
        ctl.set(&key::lease(cfg.node_rank), me.as_bytes())
            .await
            .map_err(lost_store)?;
    }
    Ok(())
}

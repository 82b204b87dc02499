//! What every agent shares with node rank 0 between the rendezvous: its latest straggler summary.
//!
//! Each agent overwrites its own key (`vigil/perf/<node>`) whenever the runtime hands it a new
//! summary; node rank 0 reads every node's key once per report interval and hands them back to its
//! runtime, which scores the job. The payload is opaque here (the runtime's JSON). A store that
//! cannot be reached only costs reports: the task says so once and tries again on the next
//! summary, never ending the job (the rendezvous decides whether the job can go on).

use std::time::Duration;

use tokio::sync::mpsc;
use vigil_store::MuxClient;

use super::rendezvous::{wire::key, CoordConfig, StoreLink};

/// What the exchange tells its runtime.
#[derive(Debug)]
pub enum FromExchange {
    /// Every node's latest summary, as node rank 0 read them: `(node rank, payload)`; nodes that
    /// published nothing yet are left out.
    Collected(Vec<(u32, Vec<u8>)>),
    /// The store could not be used (said once per agent): reports may miss nodes.
    Trouble(String),
}

/// Why the store could not be used this time; only said, never acted on.
#[derive(Debug, thiserror::Error)]
enum Trouble {
    /// Connecting failed (the reason names the store and what to check).
    #[error("{0}")]
    Connect(String),
    #[error(transparent)]
    Store(#[from] vigil_store::StoreError),
}

/// Starts the exchange on the current `LocalSet`, talking on the agent's connection `link`. Send
/// this node's summaries to the returned sender; node rank 0 receives every node's on the
/// returned receiver every `interval`.
pub fn start(
    link: StoreLink,
    cfg: CoordConfig,
    interval: Duration,
) -> (
    mpsc::UnboundedSender<Vec<u8>>,
    mpsc::UnboundedReceiver<FromExchange>,
) {
    let (pub_tx, pub_rx) = mpsc::unbounded_channel();
    let (col_tx, col_rx) = mpsc::unbounded_channel();
    tokio::task::spawn_local(run(link, cfg, interval, pub_rx, col_tx));
    (pub_tx, col_rx)
}

async fn run(
    link: StoreLink,
    cfg: CoordConfig,
    interval: Duration,
    mut summaries: mpsc::UnboundedReceiver<Vec<u8>>,
    out: mpsc::UnboundedSender<FromExchange>,
) {
    let mut warned = false;
    let mut timer = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let head = cfg.node_rank == 0;
    loop {
        let result = tokio::select! {
            s = summaries.recv() => {
                let Some(mut latest) = s else { return };
                // Only the newest summary matters.
                while let Ok(newer) = summaries.try_recv() {
                    latest = newer;
                }
                match connected(&link, &cfg).await {
                    Ok(c) => c.set(&key::perf(cfg.node_rank), &latest).await.map_err(Trouble::from),
                    Err(e) => Err(e),
                }
            }
            _ = timer.tick(), if head => match connected(&link, &cfg).await {
                Ok(c) => match collect(&c, cfg.nnodes).await {
                    Ok(all) => {
                        if out.send(FromExchange::Collected(all)).is_err() {
                            return;
                        }
                        Ok(())
                    }
                    Err(e) => Err(e.into()),
                },
                Err(e) => Err(e),
            },
        };
        if let Err(e) = result {
            if !warned {
                warned = true;
                let _ = out.send(FromExchange::Trouble(e.to_string()));
            }
        }
    }
}

/// The agent's connection (opened if nobody did yet).
async fn connected(link: &StoreLink, cfg: &CoordConfig) -> Result<MuxClient, Trouble> {
    link.client(cfg)
        .await
        .map_err(|f| Trouble::Connect(f.reason))
}

/// Reads every node's summary; one round trip when all exist, else only the ones that do.
async fn collect(
    c: &MuxClient,
    nnodes: u32,
) -> Result<Vec<(u32, Vec<u8>)>, vigil_store::StoreError> {
    let keys: Vec<String> = (0..nnodes).map(key::perf).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    if c.check(&refs).await? {
        let values = c.multi_get(&refs).await?;
        return Ok((0..nnodes).zip(values).collect());
    }
    let mut out = Vec::new();
    for (node, k) in (0..nnodes).zip(&refs) {
        if c.check(&[k]).await? {
            out.push((node, c.get(k).await?));
        }
    }
    Ok(out)
}

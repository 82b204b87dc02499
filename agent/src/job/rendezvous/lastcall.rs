//! `--nnodes MIN:MAX`: node rank 0's last call (torchrun's `last_call_timeout`). Once MIN nodes
//! joined the rendezvous, it waits that long for another; each one that comes starts the wait
//! again. When the wait runs out, it tells the coordinator, which asks the state machine
//! ([`super::decide::Rendezvous::last_call`]) whether to start with the nodes present.
//!
//! Only the job's first rendezvous has one ([`super::decide::Rendezvous::has_last_call`]). Every
//! joiner of it writes `c0/nth/<k>` after it counted itself the k-th, so that this waits on the
//! next join instead of polling the count.

use std::time::Duration;

use tokio::sync::mpsc;

use super::connect::connect_client;
use super::wire::key;
use super::CoordConfig;

/// A connection of its own, parked on the next join of cycle `c` (a wait dropped with the task
/// when the rendezvous completes first); sends `c` once the last call ran out.
pub(super) fn spawn(
    cfg: CoordConfig,
    c: u32,
    tx: mpsc::UnboundedSender<u32>,
) -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_local(async move {
        let Ok(mut client) = connect_client(&cfg).await else {
            return;
        };
        let Ok(mut k) = client.add(&key::joined(c), 0).await else {
            return;
        };
        while k < cfg.nnodes as i64 {
            let wait = if k >= cfg.active as i64 {
                cfg.last_call
            } else {
                Duration::MAX
            };
            match client.wait(&[&key::nth_join(c, k + 1)], wait).await {
                Ok(()) => k += 1,
                Err(e) if e.is_timeout() => {
                    let _ = tx.send(c);
                    return;
                }
                Err(_) => return,
            }
        }
    })
}

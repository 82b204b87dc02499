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
use vigil_store::MuxClient;

use super::decide::{Fact, Stage};
use super::wire::key;
use super::{CoordConfig, Coordinator, Input};

/// Parked, on the agent's connection, on the next join of attempt `c` (a wait cancelled with the
/// task when the rendezvous completes first); says so once the last call ran out.
pub(super) async fn parked(
    client: MuxClient,
    cfg: CoordConfig,
    c: u32,
    tx: mpsc::UnboundedSender<Input>,
) {
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
                let _ = tx.send(Input::LastCall(c));
                return;
            }
            Err(_) => return,
        }
    }
}

impl Coordinator {
    /// Node rank 0, `--nnodes MIN:MAX`: the last call of attempt `c` ran out: start with the
    /// members present if the state machine says so.
    pub(super) async fn last_call_out(&mut self, c: u32) -> Result<(), vigil_store::StoreError> {
        if self.rdzv.stage() != Stage::WaitAll(c) {
            return Ok(());
        }
        let mut present = Vec::new();
        for n in self.rdzv.members() {
            if self.ctl.check(&[&key::join(c, n)]).await? {
                present.push(n);
            }
        }
        let present = &present;
        let waited = self.cfg.last_call;
        self.decide(Fact::LastCallOut {
            attempt: c,
            present,
            waited,
        })
        .await
    }
}

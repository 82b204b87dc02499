//! The coordinator's sources: the tasks parked on the store that only send it an [`Input`] (the
//! lease queue, the coordinator's lease, the waits, the stop and the job-wide timeouts), and the
//! reads of who has not joined yet (`join_note`, `absent`).

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::sync::mpsc;
use vigil_store::{LeaseEvent, MuxClient};

use super::super::absent::{self, join_wait_note, Absent};
use super::super::decide::{Fact, Stage};
use super::super::liveness::Alarm;
use super::super::wire::*;
use super::super::FromCoord;
use super::{Coordinator, Input, QueuedLoss};

/// Remote head: parks on the store's lease queue and hands each lost lease on, in order, until
/// the connection fails (then the liveness and the waits say the store is lost).
pub(super) async fn watch_lease_queue(ctl: MuxClient, tx: mpsc::UnboundedSender<Input>) {
    const PARK: Duration = Duration::from_secs(3600);
    loop {
        match ctl.next_lease_event(PARK).await {
            Ok(v) => {
                let Ok(q) = serde_json::from_slice::<QueuedLoss>(&v) else {
                    continue;
                };
                let ev = LeaseEvent::Lost {
                    key: q.lost,
                    value: q.value.into_bytes(),
                };
                if tx.send(Input::Lease(ev)).is_err() {
                    return;
                }
            }
            Err(e) if e.is_timeout() => {}
            Err(_) => return,
        }
    }
}

/// The store outside the job, an agent that does not coordinate: parks on the coordinator's lease
/// loss (`vigil/lease_lost/coord`, written by the store the moment that lease's connection ends)
/// and raises [`Alarm::CoordGone`] at once instead of at the next liveness period. Once: a later
/// coordinator's loss is found by the period's read of the lease.
pub(super) async fn watch_coordinator(ctl: MuxClient, tx: mpsc::UnboundedSender<Input>) {
    const PARK: Duration = Duration::from_secs(3600);
    loop {
        match ctl.wait_get(key::COORD_LOST, PARK).await {
            Ok(v) => {
                if let Some(node) = std::str::from_utf8(&v).ok().and_then(|s| s.parse().ok()) {
                    let _ = tx.send(Input::Alarm(Alarm::CoordGone(node)));
                }
                return;
            }
            Err(e) if e.is_timeout() => {}
            Err(_) => return,
        }
    }
}

/// Parks in one of the rendezvous' waits (`all`, `go`, `end`), a `WAIT_GET` of its own on the
/// shared connection, so the coordinator stays free for reports meanwhile.
pub(super) async fn wait_one(
    client: MuxClient,
    key: String,
    timeout: Duration,
    tx: mpsc::UnboundedSender<Input>,
) {
    let r = client.wait_get(&key, timeout).await;
    let result = r.map_err(|e| (e.is_timeout(), e.to_string()));
    let _ = tx.send(Input::Waited { key, result });
}

impl Coordinator {
    /// Node rank 0, every [`CoordConfig::join_note_every`] while a rendezvous waits: says which
    /// node ranks have not joined (field finding 35).
    ///
    /// [`CoordConfig::join_note_every`]: crate::job::rendezvous::CoordConfig::join_note_every
    pub(super) async fn join_note(&mut self) {
        let Some(w) = self.join_wait.as_mut() else {
            return;
        };
        let c = w.attempt;
        if self.rdzv.stage() != Stage::WaitAll(c) || self.ended {
            self.join_wait = None;
            return;
        }
        let now = tokio::time::Instant::now();
        w.next = now + self.cfg.join_note_every;
        let waited = now - w.since;
        let absent = self.absent(c).await;
        if absent.is_empty() {
            return;
        }
        let expected = self.rdzv.members().len();
        let note = join_wait_note(c, waited, &absent, expected, self.cfg.join_timeout);
        self.send(FromCoord::Note(note));
    }

    /// Node rank 0: the members that have not joined attempt `c`, with the agent that took each
    /// node rank where one did: read in place where it hosts the store (no round trip), through
    /// its connection where the store is outside the job (join and owner records only: no c10d
    /// ticket scan); elsewhere, none.
    pub(super) async fn absent(&self, c: u32) -> Vec<Absent> {
        let Some(h) = self.head.as_ref() else {
            return Vec::new();
        };
        let members = self.rdzv.members();
        let Some(keys) = h.keys.as_ref() else {
            return self.absent_remote(c, &members).await;
        };
        let raw = |k: String| format!("/{k}").into_bytes();
        let joined: BTreeSet<u32> = (members.iter().copied())
            .filter(|n| keys.get_raw(&raw(key::join(c, *n))).is_some())
            .collect();
        let missing: Vec<u32> = (members.iter().copied())
            .filter(|n| !joined.contains(n))
            .collect();
        let owners: Vec<(u32, Vec<u8>)> = (missing.iter())
            .filter_map(|n| Some((*n, keys.get_raw(&raw(key::owner(*n)))?)))
            .collect();
        // c10d: an agent writes its ticket before its owner record. The scan is over every key,
        // so it is done only when some missing node has no owner record.
        let tickets: Vec<(String, Vec<u8>)> = if owners.len() < missing.len() {
            (keys.entries_prefix(key::NODE_OF_PREFIX_RAW).into_iter())
                .map(|(k, v)| {
                    let id = &k[key::NODE_OF_PREFIX_RAW.len()..];
                    (String::from_utf8_lossy(id).into_owned(), v)
                })
                .collect()
        } else {
            Vec::new()
        };
        absent::absent(&members, &joined, &absent::claims(&owners, &tickets))
    }

    /// [`Coordinator::absent`] through the connection: one MULTI_GET of the members' join and
    /// owner records (an empty value is a missing key). A store that does not answer: none.
    pub(super) async fn absent_remote(&self, c: u32, members: &[u32]) -> Vec<Absent> {
        let mut names: Vec<String> = members.iter().map(|n| key::join(c, *n)).collect();
        names.extend(members.iter().map(|n| key::owner(*n)));
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let Ok(values) = self.ctl.multi_get_now(&refs).await else {
            return Vec::new();
        };
        let (joins, owners) = values.split_at(members.len());
        let joined: BTreeSet<u32> = (members.iter().zip(joins))
            .filter(|(_, v)| !v.is_empty())
            .map(|(n, _)| *n)
            .collect();
        let owners: Vec<(u32, Vec<u8>)> = (members.iter().zip(owners))
            .filter(|(n, v)| !joined.contains(n) && !v.is_empty())
            .map(|(n, v)| (*n, v.clone()))
            .collect();
        absent::absent(members, &joined, &absent::claims(&owners, &[]))
    }

    /// Parked on the attempt's stop trigger and then on its stop step; aborted (and with it the
    /// wait, cancelled on the store) when the next attempt is joined.
    pub(super) fn spawn_stop_waiter(&mut self, attempt: u32) {
        let c = self.ctl.clone();
        let tx = self.inbox_tx.clone();
        self.stop_task = Some(self.tasks.spawn_local(async move {
            let k = key::stop(attempt);
            let Ok(v) = c.wait_get(&k, Duration::MAX).await else {
                return;
            };
            let trigger = serde_json::from_slice(&v).unwrap_or_else(|_| "a stop".to_string());
            if tx.send(Input::StopAsked { attempt, trigger }).is_err() {
                return;
            }
            let k = key::stop_step(attempt);
            if let Ok(v) = c.wait_get(&k, Duration::MAX).await {
                let step = serde_json::from_slice(&v).unwrap_or(None);
                let _ = tx.send(Input::StopStep { attempt, step });
            }
        }));
    }

    /// This node began in-process generation `generation` of `attempt` (`JobRequest::BeginGeneration`).
    pub(super) async fn generation_begun(
        &mut self,
        attempt: u32,
        generation: u64,
        replaced: &[u32],
    ) -> Result<(), vigil_store::StoreError> {
        self.decide(Fact::GenerationBegun {
            attempt,
            generation,
            replaced,
        })
        .await
    }

    /// In-process generation `generation` of `attempt` was written (the waiter below).
    pub(super) async fn generation_read(
        &mut self,
        attempt: u32,
        generation: u64,
        value: &[u8],
    ) -> Result<(), vigil_store::StoreError> {
        self.decide(Fact::GenerationRead {
            attempt,
            generation,
            value,
        })
        .await
    }

    /// Parked on in-process generation `generation` of `attempt`; aborted at the next join.
    pub(super) fn spawn_generation_waiter(&mut self, attempt: u32, generation: u64) {
        let c = self.ctl.clone();
        let tx = self.inbox_tx.clone();
        self.generation_task = Some(self.tasks.spawn_local(async move {
            let k = key::generation(attempt, generation);
            if let Ok(value) = c.wait_get(&k, Duration::MAX).await {
                let _ = tx.send(Input::Generation {
                    attempt,
                    generation,
                    value,
                });
            }
        }));
    }

    /// Parked until every node has shared its timeouts for `attempt`; aborted (and with it the
    /// wait, cancelled on the store) when the attempt ends first.
    pub(super) fn spawn_timeouts_waiter(&mut self, attempt: u32, round: u32) {
        let c = self.ctl.clone();
        let tx = self.inbox_tx.clone();
        self.timeouts_task = Some(self.tasks.spawn_local(async move {
            let k = key::timeouts(attempt, round);
            if let Ok(value) = c.wait_get(&k, Duration::MAX).await {
                let _ = tx.send(Input::Timeouts {
                    attempt,
                    round,
                    value,
                });
            }
        }));
    }
}

//! The coordinator: moves messages between the store and the rendezvous' state machine, in one
//! event loop (`serve`, `on_input`, `request`). The state machine's steps are carried out in
//! `carry.rs` (`carry_out`); the tasks that feed its inputs are in `sources.rs`.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};
use vigil_store::{KeySpace, LeaseEvent, MuxClient};

use crate::supervise::monitor::Timeouts;
use crate::supervise::{Event, JobEnd, JobRequest};

use super::absent::join_timeout_reason;
use super::connect::{claim, store_lost, Fatal};
use super::decide::{Fact, Rendezvous, Setup, Stage, Woke};
use super::liveness::{liveness, Alarm};
use super::wire::*;
use super::{CoordConfig, FromCoord, HeadSide, StoreLink};

mod carry;
mod hangs;
mod sources;

use sources::{wait_one, watch_coordinator, watch_lease_queue};

/// [`HeadSide`] as the coordinator holds it.
struct Head {
    keys: Option<KeySpace>,
    /// Local: the store's lease events (Remote: they come as [`Input::Lease`]).
    leases: Option<mpsc::UnboundedReceiver<LeaseEvent>>,
}

/// An element of the store's lease queue (`vigil_store::lease_event_json`).
#[derive(serde::Deserialize)]
struct QueuedLoss {
    lost: String,
    value: String,
}

/// The coordinator's side of a store outside the job: lost agents come from the store's lease
/// queue, read by a task parked on it.
fn remote_head(
    ctl: &MuxClient,
    tasks: &mut JoinSet<()>,
    tx: &mpsc::UnboundedSender<Input>,
) -> Head {
    tasks.spawn_local(watch_lease_queue(ctl.clone(), tx.clone()));
    Head {
        keys: None,
        leases: None,
    }
}

/// What the coordinator's sources (the tasks parked on the store, its own timers aside) tell it:
/// each is one input of the event loop, handled by [`Coordinator::on_input`].
pub(super) enum Input {
    /// A wait of the rendezvous (`all`, `go`, `end`) came back: the value, or whether it timed
    /// out and why it failed.
    Waited {
        key: String,
        result: Result<Vec<u8>, (bool, String)>,
    },
    /// Every slot shared its timeouts for the attempt's round: the job-wide ones as written.
    Timeouts {
        attempt: u32,
        round: u32,
        value: Vec<u8>,
    },
    /// In-process generation `generation` of `attempt` was written.
    Generation {
        attempt: u32,
        generation: u64,
        value: Vec<u8>,
    },
    /// A node asked the job to stop at a step (the first trigger written).
    StopAsked { attempt: u32, trigger: String },
    /// The job's stop step was chosen.
    StopStep { attempt: u32, step: Option<u64> },
    /// Node rank 0: the last call of this attempt's rendezvous ran out (lastcall.rs).
    LastCall(u32),
    /// A node asked for the attempt's hang verdict `round` (hangs.rs).
    HangAsked { attempt: u32, round: u32 },
    /// The attempt's hang verdict `round` was written.
    HangNamed {
        attempt: u32,
        round: u32,
        value: Vec<u8>,
    },
    /// The liveness, or the watch on the coordinator's lease.
    Alarm(Alarm),
    /// The store outside the job: a lease was lost (its lease queue).
    Lease(LeaseEvent),
}

/// How long a rendezvous that timed out waits to read how many nodes joined it. The read only
/// adds a number to the reason, which is `?` without it; the join already waited its full
/// `--join-timeout`, and a store that answers at all does so in milliseconds, while one that is
/// gone would hold the failure for a whole `--node-timeout`.
const JOINED_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Moves messages between the store and the rendezvous' state machine ([`Rendezvous`]): reads
/// what it needs, carries out what it decided ([`Coordinator::carry_out`]), tells the runtime.
/// It decides nothing itself.
pub(super) struct Coordinator {
    pub(super) cfg: CoordConfig,
    /// The agent's one connection to the store; every task here uses a clone of it.
    pub(super) ctl: MuxClient,
    tx: mpsc::UnboundedSender<FromCoord>,
    head: Option<Head>,
    pub(super) rdzv: Rendezvous,
    /// Every task parked on the store for it (the sources of [`Input`]), aborted with it.
    tasks: JoinSet<()>,
    /// Where the tasks send what they read.
    inbox_tx: mpsc::UnboundedSender<Input>,
    inbox: mpsc::UnboundedReceiver<Input>,
    /// The rendezvous' wait under way ([`wait_one`]).
    wait: Option<AbortHandle>,
    /// Parked on this attempt's job-wide timeouts.
    timeouts_task: Option<AbortHandle>,
    /// Parked on this attempt's stop trigger, then on its stop step.
    stop_task: Option<AbortHandle>,
    /// Parked on this attempt's next in-process generation (`Step::WaitGeneration`).
    generation_task: Option<AbortHandle>,
    /// Parked on this attempt's hang verdicts (hangs.rs).
    hang_task: Option<AbortHandle>,
    /// Renews this node's counter and watches the others' ([`liveness`]).
    liveness: AbortHandle,
    /// Node rank 0 with standbys: the last call of the rendezvous under way ([`lastcall`]).
    last_call: Option<AbortHandle>,
    /// Set once a `Lost` was sent: nothing more is reported.
    ended: bool,
    /// Node rank 0: the rendezvous under way, while it waits for nodes to join.
    join_wait: Option<JoinWait>,
}

/// Node rank 0 waits for the nodes to join `attempt` since `since`; it says who is missing at
/// `next`.
struct JoinWait {
    attempt: u32,
    since: tokio::time::Instant,
    next: tokio::time::Instant,
}

/// The job-wide timeouts as written to the store, if they read as timeouts.
fn read_timeouts(v: &[u8]) -> Option<Timeouts> {
    let w: WireTimeouts = serde_json::from_slice(v).ok()?;
    Timeouts::try_from(&w).ok()
}

/// Aborts the task, if any (and with it its wait, cancelled on the store).
fn abort(task: &mut Option<AbortHandle>) {
    if let Some(t) = task.take() {
        t.abort();
    }
}

impl Coordinator {
    pub(super) async fn connect(
        link: &StoreLink,
        cfg: CoordConfig,
        head: Option<HeadSide>,
        tx: mpsc::UnboundedSender<FromCoord>,
    ) -> Result<Coordinator, Fatal> {
        let ctl = link.client(&cfg).await?;
        claim(&ctl, &cfg).await?;
        let mut tasks = JoinSet::new();
        let (inbox_tx, inbox) = mpsc::unbounded_channel();
        let is_head = head.is_some();
        let live = liveness(ctl.clone(), cfg.clone(), is_head, inbox_tx.clone());
        let liveness = tasks.spawn_local(live);
        if cfg.outside && !is_head {
            tasks.spawn_local(watch_coordinator(ctl.clone(), inbox_tx.clone()));
        }
        let head = head.map(|h| match h {
            HeadSide::Local { keys, leases } => Head {
                keys: Some(keys),
                leases: Some(leases),
            },
            HeadSide::Remote => remote_head(&ctl, &mut tasks, &inbox_tx),
        });
        let rdzv = Rendezvous::new(Setup {
            nnodes: cfg.nnodes,
            active: cfg.active,
            node_rank: cfg.node_rank,
            segment: cfg.segment,
            max_restarts: cfg.max_restarts,
            head: is_head,
            outside: cfg.outside,
            in_process: cfg.in_process,
        });
        Ok(Coordinator {
            cfg,
            ctl,
            tx,
            head,
            rdzv,
            tasks,
            inbox_tx,
            inbox,
            wait: None,
            timeouts_task: None,
            stop_task: None,
            generation_task: None,
            hang_task: None,
            liveness,
            last_call: None,
            ended: false,
            join_wait: None,
        })
    }

    fn send(&mut self, m: FromCoord) {
        if self.ended {
            return;
        }
        if matches!(m, FromCoord::Event(Event::CoordinationLost { .. })) {
            self.ended = true;
            if !self.rdzv.deposed() && self.rdzv.hosted_by_head() {
                let _ = self.tx.send(FromCoord::HeadLost);
            }
        }
        let _ = self.tx.send(m);
    }

    fn fail(&mut self, reason: String) {
        let reason = self.rdzv.fail(reason);
        self.send(FromCoord::lost(reason, true));
    }

    fn store_error(&mut self, e: impl std::fmt::Display) {
        self.fail(store_lost(self.cfg.store, e));
    }

    /// Parks on `key` for at most `timeout`, instead of the wait under way (if any: one at a
    /// time).
    fn wait_for(&mut self, key: String, timeout: Duration) {
        abort(&mut self.wait);
        let w = wait_one(self.ctl.clone(), key, timeout, self.inbox_tx.clone());
        self.wait = Some(self.tasks.spawn_local(w));
    }

    pub(super) async fn serve(&mut self, mut rx: mpsc::UnboundedReceiver<JobRequest>) {
        loop {
            let lease = async {
                match self.head.as_mut().and_then(|h| h.leases.as_mut()) {
                    Some(l) => l.recv().await,
                    None => std::future::pending().await,
                }
            };
            let note_at = self.join_wait.as_ref().map(|w| w.next);
            let note = async move {
                match note_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            let done = tokio::select! {
                req = rx.recv() => match req {
                    None => return,
                    Some(JobRequest::Leave { poison, highest_step }) => {
                        self.leave(poison, highest_step).await;
                        return;
                    }
                    Some(_) if self.ended => Ok(()),
                    Some(req) => self.request(req).await,
                },
                Some(input) = self.inbox.recv() => self.on_input(input).await,
                Some(ev) = lease => self.lease_event(ev).await,
                () = note => {
                    self.join_note().await;
                    Ok(())
                }
                // Finished tasks are let go of.
                Some(_) = self.tasks.join_next() => Ok(()),
            };
            if let Err(e) = done {
                self.store_error(e);
            }
        }
    }

    async fn on_input(&mut self, input: Input) -> Result<(), vigil_store::StoreError> {
        match input {
            Input::Waited { key, result } => self.waited(key, result).await,
            Input::Timeouts {
                attempt,
                round,
                value,
            } => {
                if let Some(timeouts) = read_timeouts(&value) {
                    self.send(FromCoord::Event(Event::JobTimeouts {
                        attempt,
                        round,
                        timeouts,
                    }));
                }
                Ok(())
            }
            Input::StopAsked { attempt, trigger } => {
                self.send(FromCoord::Event(Event::StopAsked { attempt, trigger }));
                Ok(())
            }
            Input::StopStep { attempt, step } => {
                self.send(FromCoord::Event(Event::StopStep { attempt, step }));
                Ok(())
            }
            Input::Generation {
                attempt,
                generation,
                value,
            } => self.generation_read(attempt, generation, &value).await,
            Input::LastCall(c) => self.last_call_out(c).await,
            Input::HangAsked { attempt, round } => {
                self.send(FromCoord::Event(Event::HangAsked { attempt, round }));
                Ok(())
            }
            Input::HangNamed {
                attempt,
                round,
                value,
            } => {
                self.hang_named(attempt, round, &value);
                Ok(())
            }
            Input::Lease(ev) => self.lease_event(ev).await,
            Input::Alarm(Alarm::Silent(why, node)) => {
                self.decide(Fact::Silent { node, reason: why }).await
            }
            // A job whose end is written lost no coordinator: it left.
            Input::Alarm(Alarm::CoordGone(_)) if self.ended => Ok(()),
            Input::Alarm(Alarm::CoordGone(old)) => self.decide(Fact::CoordinatorGone { old }).await,
            Input::Alarm(Alarm::Deposed(reason)) => self.decide(Fact::Deposed { reason }).await,
        }
    }

    async fn request(&mut self, req: JobRequest) -> Result<(), vigil_store::StoreError> {
        match req {
            // What every active node reports is counted over the slots: a standby reports none
            // (the others' filters are the state machine's: decide/requests.rs).
            JobRequest::HangReport { .. } if !self.rdzv.in_slots() => Ok(()),
            JobRequest::Join {
                attempt,
                calculated,
            } => self.join(attempt, calculated).await,
            JobRequest::Health { healthy } => {
                self.rdzv.health(healthy);
                Ok(())
            }
            JobRequest::ReportEnd { attempt, end } => {
                self.decide(Fact::ReportEnd { attempt, end: &end }).await
            }
            JobRequest::ReportDone { attempt } => self.decide(Fact::ReportDone { attempt }).await,
            JobRequest::ShareTimeouts {
                attempt,
                round,
                timeouts,
            } => {
                let timeouts = &timeouts;
                self.decide(Fact::ShareTimeouts {
                    attempt,
                    round,
                    timeouts,
                })
                .await
            }
            JobRequest::StopTrigger { attempt, trigger } => {
                let trigger = &trigger;
                self.decide(Fact::StopTrigger { attempt, trigger }).await
            }
            JobRequest::StopSteps { attempt, report } => {
                let report = &report;
                self.decide(Fact::StopSteps { attempt, report }).await
            }
            JobRequest::Depart { reason } => self.decide(Fact::Depart { reason }).await,
            JobRequest::BeginGeneration {
                attempt,
                generation,
                replaced,
            } => self.generation_begun(attempt, generation, &replaced).await,
            JobRequest::HangReport {
                attempt,
                round,
                candidates,
            } => self.hang_report(attempt, round, &candidates).await,
            JobRequest::Leave { .. } => unreachable!("handled by serve"),
        }
    }

    async fn join(
        &mut self,
        attempt: u32,
        calculated: Option<Timeouts>,
    ) -> Result<(), vigil_store::StoreError> {
        abort(&mut self.timeouts_task);
        abort(&mut self.stop_task);
        abort(&mut self.generation_task);
        abort(&mut self.hang_task);
        self.spawn_stop_waiter(attempt);
        self.spawn_hang_waiter(attempt);
        let me = NodeInfo {
            topology: self.cfg.topology.clone(),
            healthy: None,
            nproc: self.cfg.nproc,
            host: self.cfg.host.clone(),
            pid: std::process::id(),
        };
        let me = &me;
        self.decide(Fact::Join {
            attempt,
            calculated,
            me,
        })
        .await?;
        self.join_wait = match self.rdzv.stage() {
            Stage::WaitAll(c) => {
                let now = tokio::time::Instant::now();
                Some(JoinWait {
                    attempt: c,
                    since: now,
                    next: now + self.cfg.join_note_every,
                })
            }
            _ => None,
        };
        Ok(())
    }

    async fn waited(
        &mut self,
        key: String,
        result: Result<Vec<u8>, (bool, String)>,
    ) -> Result<(), vigil_store::StoreError> {
        let value = match result {
            Ok(v) => v,
            Err((timed_out, e)) => {
                if !self.ended {
                    let reason = self.wait_failure(timed_out, e).await;
                    self.fail(reason);
                }
                return Ok(());
            }
        };
        match self.rdzv.woke(&key) {
            Some(Woke::AllJoined(attempt)) => self.decide(Fact::AllJoined { attempt }).await?,
            Some(Woke::Verdict(attempt)) => {
                let value = &value;
                self.decide(Fact::Verdict { attempt, value }).await?
            }
            Some(Woke::End(c)) => {
                abort(&mut self.timeouts_task);
                let value = &value;
                self.decide(Fact::Ended { attempt: c, value }).await?;
            }
            None => {}
        }
        Ok(())
    }

    /// Why a wait failed: a rendezvous that timed out counts who joined it; else the store is
    /// gone.
    async fn wait_failure(&mut self, timed_out: bool, e: String) -> String {
        let Some(c) = self.rdzv.join_timed_out(timed_out) else {
            return store_lost(self.cfg.store, e);
        };
        let joined = self
            .ctl
            .get_timeout(&key::joined(c), JOINED_READ_TIMEOUT)
            .await
            .ok()
            .and_then(|v| String::from_utf8(v).ok());
        let absent = self.absent(c).await;
        join_timeout_reason(c, joined, self.cfg.nnodes, self.cfg.join_timeout, &absent)
    }

    async fn lease_event(&mut self, ev: LeaseEvent) -> Result<(), vigil_store::StoreError> {
        let (key, value) = match ev {
            LeaseEvent::Lost { key, value } => (key, value),
            LeaseEvent::Released { key } => return self.released(key).await,
        };
        let node: Option<u32> = key.rsplit('/').next().and_then(|n| n.parse().ok());
        // A standby that left on a signal said why before its connection closed.
        let left = match node {
            Some(n) => self.left(n).await?,
            None => None,
        };
        let reason = left.unwrap_or_else(|| format!(
            "node {key} ({}) was lost: its agent's connection to the store closed or went silent for --node-timeout",
            String::from_utf8_lossy(&value)
        ));
        self.decide(Fact::LeaseLost { node, reason }).await
    }

    /// A lease given back (its agent left): a standby that left the job on a signal wrote why
    /// first ([`key::left`]), and is lost to the job as any node, with that reason. Any other
    /// agent leaving (the job's end) wrote none and loses nobody.
    async fn released(&mut self, lease: String) -> Result<(), vigil_store::StoreError> {
        let Some(node) = lease.rsplit('/').next().and_then(|n| n.parse::<u32>().ok()) else {
            return Ok(());
        };
        match self.left(node).await? {
            Some(reason) => {
                let node = Some(node);
                self.decide(Fact::LeaseLost { node, reason }).await
            }
            None => Ok(()),
        }
    }

    /// Why standby `node` left the job on a signal, if it did ([`key::left`]).
    async fn left(&mut self, node: u32) -> Result<Option<String>, vigil_store::StoreError> {
        let left = self.ctl.multi_get_now(&[key::left(node).as_str()]).await?;
        Ok(left
            .into_iter()
            .next()
            .filter(|v| !v.is_empty())
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// Hands `fact` to the state machine and carries out what it answers (carry.rs).
    pub(super) async fn decide(&mut self, fact: Fact<'_>) -> Result<(), vigil_store::StoreError> {
        let steps = self.rdzv.step(fact);
        self.carry_out(steps).await
    }

    /// This agent leaves the job ([`Rendezvous::leave`]): its waits and liveness end first.
    async fn leave(&mut self, poison: Option<(u32, JobEnd)>, highest_step: Option<u64>) {
        abort(&mut self.timeouts_task);
        self.liveness.abort();
        let hosts_store = self.head.as_ref().is_some_and(|h| h.keys.is_some());
        let steps = self.rdzv.step(Fact::Leave {
            poison,
            highest_step,
            hosts_store,
        });
        // Nothing waits on a leaving agent's store errors (each step is bounded).
        let _ = self.carry_out(steps).await;
    }
}

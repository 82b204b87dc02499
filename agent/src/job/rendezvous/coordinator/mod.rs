//! The coordinator: moves messages between the store and the rendezvous' state machine, in one
//! event loop (`serve`, `on_input`), and carries out the state machine's steps (`carry_out`). The
//! tasks that feed its inputs are in `sources.rs`.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};
use vigil_store::{KeySpace, LeaseEvent, MuxClient};

use crate::supervise::monitor::Timeouts;
use crate::supervise::{Event, JobEnd, JobRequest, StepReport};

use super::absent::join_timeout_reason;
use super::connect::{claim, store_lost, Fatal};
use super::decide::{self, poison, Fact, Joining, Patience, Rendezvous, Setup, Stage, Step, Woke};
use super::liveness::{liveness, Alarm};
use super::wire::*;
use super::{lastcall, CoordConfig, FromCoord, HeadSide, StoreLink};

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
    /// Renews this node's counter and watches the others' ([`liveness`]).
    liveness: AbortHandle,
    /// Node rank 0 with standbys: the last call of the rendezvous under way ([`lastcall`]).
    last_call: Option<AbortHandle>,
    /// Set once a `Lost` was sent: nothing more is reported.
    ended: bool,
    /// This agent coordinated until another took the coordinator's lease over
    /// ([`Alarm::Deposed`]): it leaves without deciding anything for the job.
    deposed: bool,
    /// A standby that leaves the job on a signal (`JobRequest::Depart`): it keeps its lease
    /// until its connection closes, so the coordinator, in the job or through a store outside
    /// it, hears of it as a lost lease and reads why ([`key::left`]).
    departed: bool,
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
            liveness,
            last_call: None,
            ended: false,
            deposed: false,
            departed: false,
            join_wait: None,
        })
    }

    fn send(&mut self, m: FromCoord) {
        if self.ended {
            return;
        }
        if matches!(m, FromCoord::Event(Event::CoordinationLost { .. })) {
            self.ended = true;
            if !self.deposed && self.rdzv.hosted_by_head() {
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
            Input::Lease(ev) => self.lease_event(ev).await,
            Input::Alarm(Alarm::Silent(why, node)) => {
                self.decide(Fact::Silent { node, reason: why }).await
            }
            Input::Alarm(Alarm::CoordGone(old)) => self.coordinator_gone(old).await,
            Input::Alarm(Alarm::Deposed(why)) => {
                self.head = None;
                self.deposed = true;
                self.fail(why);
                Ok(())
            }
        }
    }

    async fn request(&mut self, req: JobRequest) -> Result<(), vigil_store::StoreError> {
        match req {
            // What every active node reports (done, timeouts, stop steps) is counted over the
            // slots: a standby reports none.
            JobRequest::ShareTimeouts { .. }
            | JobRequest::StopSteps { .. }
            | JobRequest::ReportDone { .. }
                if !self.rdzv.in_slots() => {}
            JobRequest::Join {
                attempt,
                calculated,
            } => self.join(attempt, calculated).await?,
            JobRequest::Health { healthy } => self.rdzv.health(healthy),
            JobRequest::ReportEnd { attempt, end } => {
                self.decide(Fact::ReportEnd { attempt, end: &end }).await?;
            }
            JobRequest::ReportDone { attempt } => {
                let count = self.ctl.add(&key::done(attempt), 1).await?;
                self.decide(Fact::DoneCounted { attempt, count }).await?;
            }
            JobRequest::ShareTimeouts {
                attempt,
                round,
                timeouts,
            } => self.share_timeouts(attempt, round, &timeouts).await?,
            JobRequest::StopTrigger { attempt, trigger } => {
                self.ctl
                    .compare_set(&key::stop(attempt), b"", &to_json(&trigger))
                    .await?;
            }
            JobRequest::StopSteps { attempt, report } => self.share_steps(attempt, &report).await?,
            JobRequest::Depart { reason } => {
                self.departed = true;
                self.ctl
                    .set(&key::left(self.cfg.node_rank), reason.as_bytes())
                    .await?;
            }
            JobRequest::BeginGeneration {
                attempt,
                generation,
                replaced,
            } => {
                self.generation_begun(attempt, generation, &replaced)
                    .await?
            }
            JobRequest::Leave { .. } => unreachable!("handled by serve"),
        }
        Ok(())
    }

    async fn join(
        &mut self,
        attempt: u32,
        calculated: Option<Timeouts>,
    ) -> Result<(), vigil_store::StoreError> {
        abort(&mut self.timeouts_task);
        abort(&mut self.stop_task);
        abort(&mut self.generation_task);
        self.spawn_stop_waiter(attempt);
        let healthy = match self.rdzv.join(attempt, calculated) {
            Joining::Join { healthy } => healthy,
            Joining::Ended(end) => {
                let mut steps = poison(attempt, &end);
                steps.push(Step::Tell(FromCoord::attempt_ended(attempt, end)));
                return self.carry_out(steps).await;
            }
        };
        let info = NodeInfo {
            topology: self.cfg.topology.clone(),
            healthy,
            nproc: self.cfg.nproc,
            host: self.cfg.host.clone(),
            pid: std::process::id(),
        };
        let me = self.cfg.node_rank;
        let (record, count) = (key::join(attempt, me), key::joined(attempt));
        let (members, nth) = if self.rdzv.spares() {
            self.ctl.set(&record, &to_json(&info)).await?;
            let members = match self.ctl.check(&[&key::members(attempt)]).await? {
                true => Some(self.ctl.get(&key::members(attempt)).await?),
                false => None,
            };
            (members, self.ctl.add(&count, 1).await?)
        } else {
            // The record and the count in one request (JOIN), the record first.
            (None, self.ctl.join(&record, &to_json(&info), &count).await?)
        };
        abort(&mut self.last_call);
        let members = members.as_deref();
        self.decide(Fact::Counted {
            attempt,
            nth,
            members,
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

    async fn share_timeouts(
        &mut self,
        attempt: u32,
        round: u32,
        timeouts: &Timeouts,
    ) -> Result<(), vigil_store::StoreError> {
        let mine = to_json(&WireTimeouts::from(timeouts));
        let me = self.cfg.node_rank;
        self.ctl
            .set(&key::node_timeouts(attempt, round, me), &mine)
            .await?;
        // A node shares a round only once its previous one was answered (its ranks wait for the
        // answer), so a waiter still parked belongs to a round nobody completes.
        abort(&mut self.timeouts_task);
        self.spawn_timeouts_waiter(attempt, round);
        let count = self
            .ctl
            .add(&key::timeouts_count(attempt, round), 1)
            .await?;
        self.decide(Fact::TimeoutsCounted {
            attempt,
            round,
            count,
        })
        .await
    }

    async fn share_steps(
        &mut self,
        attempt: u32,
        report: &StepReport,
    ) -> Result<(), vigil_store::StoreError> {
        let mine = to_json(&WireSteps::from(report));
        let me = self.cfg.node_rank;
        self.ctl.set(&key::stop_steps(attempt, me), &mine).await?;
        let count = self.ctl.add(&key::stop_count(attempt), 1).await?;
        self.decide(Fact::StepsCounted { attempt, count }).await
    }

    /// What every slot's node wrote under `key(node)`, read in one round trip; a value that does
    /// not parse is left out.
    async fn every_node<T: serde::de::DeserializeOwned>(
        &mut self,
        key: impl Fn(u32) -> String,
    ) -> Result<Vec<T>, vigil_store::StoreError> {
        let keys: Vec<String> = self.rdzv.slots().iter().map(|n| key(*n)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        Ok(self
            .ctl
            .multi_get(&refs)
            .await?
            .iter()
            .filter_map(|v| serde_json::from_slice(v).ok())
            .collect())
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
            Some(Woke::AllJoined(c)) => self.all_joined(c).await?,
            Some(Woke::Verdict(c)) => self.verdict(c, &value).await?,
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

    /// Node rank 0: every member joined attempt `c`: propose the assignment (the first `go`
    /// written wins) and act on the verdict.
    async fn all_joined(&mut self, c: u32) -> Result<(), vigil_store::StoreError> {
        // A node that stopped for good ends the rendezvous by writing `go` before `all`.
        if self.ctl.check(&[&key::go(c)]).await? {
            let v = self.ctl.get(&key::go(c)).await?;
            return self.verdict(c, &v).await;
        }
        let head = self.head.as_ref().expect("only node rank 0 waits for all");
        // Every node's ranks of the last attempt are gone: give this one a clean store.
        match head.keys.as_ref() {
            Some(keys) => {
                keys.reset();
                if c > 0 {
                    keys.clear_prefix(&key::attempt_prefix_raw(c - 1));
                }
            }
            None => {
                self.ctl.clear_except(vigil_store::AGENT_PREFIX).await?;
                if c > 0 {
                    self.ctl
                        .clear_prefix(&key::attempt_prefix_raw(c - 1))
                        .await?;
                }
            }
        }
        let members = self.rdzv.members();
        let keys: Vec<String> = members.iter().map(|i| key::join(c, *i)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let records: Vec<(u32, Vec<u8>)> = members
            .into_iter()
            .zip(self.ctl.multi_get(&refs).await?)
            .collect();
        let records = &records;
        self.decide(Fact::Records {
            attempt: c,
            records,
        })
        .await
    }

    async fn verdict(&mut self, c: u32, value: &[u8]) -> Result<(), vigil_store::StoreError> {
        self.decide(Fact::Verdict { attempt: c, value }).await
    }

    /// The store outside the job: the coordinator's lease (held by node `old`) is gone. The live
    /// agent with the lowest node rank takes the coordinator's work over: it claims the lease
    /// with compare-and-set, rebuilds the coordinator's state ([`Rendezvous::take_over`]) and
    /// loses `old` as any node. An agent with a live lower node rank leaves it to that one (and
    /// is told again next period if nobody took it).
    async fn coordinator_gone(&mut self, old: u32) -> Result<(), vigil_store::StoreError> {
        if self.head.is_some() || self.ended {
            return Ok(());
        }
        let me = self.cfg.node_rank;
        let names: Vec<String> = (0..self.cfg.nnodes).map(key::lease).collect();
        let mut refs: Vec<&str> = names.iter().map(String::as_str).collect();
        refs.push(key::JOB_END);
        let values = self.ctl.multi_get_now(&refs).await?;
        let (leases, job_end) = values.split_at(names.len());
        let leased: Vec<bool> = leases.iter().map(|v| !v.is_empty()).collect();
        // A job whose end is written lost no coordinator: it left.
        let Some(alive) = self.rdzv.successor(old, &leased, !job_end[0].is_empty()) else {
            return Ok(());
        };
        let mine = me.to_string();
        // Gone with its connection, or still held by a coordinator frozen past the node
        // timeout (the lease has expired): taken from either, by compare-and-set.
        let mut held = self
            .ctl
            .compare_set(key::COORD_LEASE, b"", mine.as_bytes())
            .await?;
        if held == old.to_string().as_bytes() {
            held = self
                .ctl
                .compare_set(key::COORD_LEASE, &held, mine.as_bytes())
                .await?;
        }
        if held != mine.as_bytes() {
            return Ok(());
        }
        // The record of the old coordinator's loss is this one's to clear, so that the next
        // loss is a new record.
        self.ctl.delete_key(key::COORD_LOST).await?;
        let reason = format!(
            "node {old} was lost: its agent, the job's coordinator, lost its connection to the store or was silent for --node-timeout"
        );
        self.send(FromCoord::Coordinating { lost: old });
        let alive = &alive;
        let steps = self.rdzv.step(Fact::TookOver { old, alive, reason });
        self.head = Some(remote_head(&self.ctl, &mut self.tasks, &self.inbox_tx));
        // Its liveness sweeps every node's counter from now on.
        self.liveness.abort();
        let live = liveness(
            self.ctl.clone(),
            self.cfg.clone(),
            true,
            self.inbox_tx.clone(),
        );
        self.liveness = self.tasks.spawn_local(live);
        // A wait on a verdict that only it writes now becomes a wait on every member.
        if let Stage::WaitAll(c) = self.rdzv.stage() {
            self.wait_for(key::all(c), self.cfg.join_timeout);
        }
        self.carry_out(steps).await
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

    /// Hands `fact` to the state machine and carries out what it answers.
    pub(super) async fn decide(&mut self, fact: Fact<'_>) -> Result<(), vigil_store::StoreError> {
        let steps = self.rdzv.step(fact);
        self.carry_out(steps).await
    }

    /// Carries out what the state machine decided, in order ([`Step`]); a step whose outcome
    /// it must hear of (the verdict that won, the joins counted) hands that back to it, and its
    /// answer is carried out next.
    async fn carry_out(&mut self, steps: Vec<Step>) -> Result<(), vigil_store::StoreError> {
        let mut todo = VecDeque::from(steps);
        while let Some(step) = todo.pop_front() {
            let then = match step {
                Step::Set(k, v) => {
                    self.ctl.set(&k, &v).await?;
                    continue;
                }
                Step::SetFirst(k, v) => {
                    self.ctl.compare_set(&k, b"", &v).await?;
                    continue;
                }
                Step::Wait(k, patience) => {
                    let timeout = match patience {
                        Patience::Join => self.cfg.join_timeout,
                        Patience::Forever => Duration::MAX,
                    };
                    self.wait_for(k, timeout);
                    continue;
                }
                Step::Propose(c, mine) => {
                    let v = self.ctl.compare_set(&key::go(c), b"", &mine).await?;
                    self.rdzv.step(Fact::Verdict {
                        attempt: c,
                        value: &v,
                    })
                }
                Step::CountJoins(c) => {
                    let joined = String::from_utf8_lossy(&self.ctl.get(&key::joined(c)).await?)
                        .parse::<usize>()
                        .unwrap_or(0);
                    self.rdzv.step(Fact::JoinsCounted { attempt: c, joined })
                }
                Step::MergeTimeouts { attempt, round } => {
                    let all = self
                        .every_node(|i| key::node_timeouts(attempt, round, i))
                        .await?;
                    let all = &all;
                    self.rdzv.step(Fact::TimeoutsRead {
                        attempt,
                        round,
                        all,
                    })
                }
                Step::ChooseStopStep(attempt) => {
                    let all = self.every_node(|i| key::stop_steps(attempt, i)).await?;
                    self.rdzv.step(Fact::StepsRead { attempt, all })
                }
                Step::LastCall(c) => {
                    let tx = self.inbox_tx.clone();
                    let t = lastcall::parked(self.ctl.clone(), self.cfg.clone(), c, tx);
                    self.last_call = Some(self.tasks.spawn_local(t));
                    continue;
                }
                Step::WaitGeneration(attempt, generation) => {
                    abort(&mut self.generation_task);
                    self.spawn_generation_waiter(attempt, generation);
                    continue;
                }
                Step::Tell(m) => {
                    self.send(m);
                    continue;
                }
            };
            for s in then.into_iter().rev() {
                todo.push_front(s);
            }
        }
        Ok(())
    }

    async fn leave(&mut self, poison: Option<(u32, JobEnd)>, highest_step: Option<u64>) {
        abort(&mut self.timeouts_task);
        self.liveness.abort();
        if let Some((c, end)) = poison.filter(|_| !self.deposed) {
            let steps = decide::poison(c, &end);
            let _ = tokio::time::timeout(self.cfg.peer_timeout, self.carry_out(steps)).await;
        }
        match self.head.as_mut() {
            // Its lease ends with its connection: a lost lease, which every coordinator hears of.
            None if self.departed => {}
            None => {
                let lease = key::lease(self.cfg.node_rank);
                let alive = key::alive(self.cfg.node_rank);
                let highest = key::highest(self.cfg.node_rank);
                let _ = tokio::time::timeout(self.cfg.peer_timeout, async {
                    if let Some(step) = highest_step {
                        let _ = self.ctl.set(&highest, step.to_string().as_bytes()).await;
                    }
                    // Left, not lost: node rank 0 stops watching a counter below 1.
                    let _ = self.ctl.set(&alive, b"-1").await;
                    self.ctl.delete_key(&lease).await
                })
                .await;
            }
            Some(Head { keys: None, .. }) => {
                // The store outlives this agent: nothing to hold up. The others stop watching
                // this node's counter, and the store's service clears the job once every agent
                // left.
                let alive = key::alive(self.cfg.node_rank);
                let _ = tokio::time::timeout(self.cfg.peer_timeout, async {
                    let _ = self.ctl.set(&alive, b"-1").await;
                    self.ctl.set(key::JOB_END, b"").await
                })
                .await;
            }
            Some(h) => {
                let keys = h.keys.clone().expect("hosted");
                // The other agents may still read this attempt's verdict from our store: keep it
                // up until each has left (or was lost), for at most one peer timeout.
                let deadline = tokio::time::Instant::now() + self.cfg.peer_timeout;
                let holders = || keys.count_prefix(key::LEASE_PREFIX_RAW);
                let mut open = holders();
                while open > 0 {
                    let Some(leases) = h.leases.as_mut() else {
                        break;
                    };
                    match tokio::time::timeout_at(deadline, leases.recv()).await {
                        Ok(Some(_)) => open = holders(),
                        Ok(None) | Err(_) => break,
                    }
                }
            }
        }
    }
}

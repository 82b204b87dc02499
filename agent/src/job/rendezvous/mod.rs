//! How the nodes of a job agree, through vigil's store on node rank 0 (docs/design.md,
//! "Across nodes").
//!
//! Every cycle (attempt) of the job goes the same way on every node:
//! 1. join: write `c<N>/join/<node>`, count `c<N>/joined`; the last to join sets `c<N>/all`;
//! 2. node rank 0 wakes on `c<N>/all`, clears the ranks' keys of the last attempt, assigns global
//!    ranks by node rank and writes the verdict `c<N>/go`; every node wakes on it and starts;
//! 3. the first node whose ranks fail writes `c<N>/end` (compare-and-set, so the first report
//!    wins); when every node's ranks exited 0, the last one writes `c<N>/end` = done. Every node
//!    is parked in a `WAIT` on `c<N>/end` the whole time, so a failure reaches all nodes in one
//!    round trip, with nothing polling.
//!
//! Node rank 0 also watches the other agents' leases (`lease/<node>`, held by their connection):
//! a lease that disappears without the node leaving means the agent died or went silent (TCP
//! keepalive and user timeout, `--node-timeout`), and the cycle ends `lost`. The other nodes
//! notice a lost node rank 0 themselves: their connections to its store fail.
//!
//! A frozen agent (SIGSTOP, a stuck event loop) keeps its connections: its kernel answers TCP for
//! it. So every agent also adds 1 to `alive/<node>` every `--node-timeout / 8`, and reads the
//! counters it watches (node rank 0: every node's; the others: node rank 0's). A counter that
//! does not move for `--node-timeout`, or a store that does not answer for that long, is a lost
//! node. Silence is measured in the watcher's own running time
//! ([`Liveness`]): a watcher that was itself stopped does not count the time it was away, so a
//! whole job suspended and resumed loses nobody.
//!
//! Each agent talks to the store on one connection ([`StoreLink`], the store's tagged mode): its
//! claim and lease, every wait (each parked under a tag of its own), liveness, the straggler
//! exchange; nothing opens a connection per attempt.
//!
//! Who decides what: every job-wide decision (the ranks, benching, promotions, members, what a
//! verdict or a lost node means) is made by the pure state machine in decide.rs
//! ([`decide::Rendezvous`]); the key names and the messages, with their protocol version, are in
//! wire.rs; [`run`] only does the talking: it reads the store, hands what it read to the state
//! machine, and writes and tells what comes back. Its shape is the supervisor's: the tasks parked
//! on the store (the rendezvous' waits, liveness, the lease queue, the coordinator's lease, the
//! job-wide timeouts, the stop, the last call) live in one `JoinSet` and only send an input
//! (`Input`) to one event loop; the loop hands what it read to the state machine
//! ([`decide::Rendezvous::step`], a [`decide::Fact`]), which answers with the steps to take
//! ([`decide::Step`]: a write, a wait, a message for the runtime), and one function carries them
//! out (`Coordinator::carry_out`).

use std::collections::{BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};
use vigil_store::{KeySpace, LeaseEvent, MuxClient};

use crate::supervise::monitor::Timeouts;
use crate::supervise::{Event, JobEnd, JobRequest, StepReport};

pub mod absent;
mod connect;
pub mod decide;
mod lastcall;
mod liveness;
mod noderank;
#[cfg(test)]
mod tests;
pub(crate) mod wire;

use absent::{join_timeout_reason, join_wait_note, Absent};
pub use connect::StoreLink;
use connect::{claim, store_lost, Fatal};
pub use decide::NodeHosts;
use decide::{poison, Fact, Joining, Patience, Rendezvous, Setup, Stage, Step, Woke};
use liveness::{liveness, Alarm};
pub use liveness::{liveness_period, Liveness, Silent};
pub use noderank::{claim_node_rank, identity, Claimed, Unclaimed};
use wire::to_json;
pub use wire::*;

/// What the job decided, for the agent's event loop.
#[derive(Debug, Clone, PartialEq)]
pub enum FromCoord {
    /// An input of the supervisor, as is: `CycleEnded`, `JobTimeouts`, `StopAsked`, `StopStep`,
    /// `Standby` (this node has no slot in the cycle: it runs no ranks) and `CoordinationLost`
    /// (the job cannot go on here; the last message).
    Event(Event),
    /// This node runs ranks in the cycle: its group rank (slot), for the runtime, and the
    /// supervisor's `Event::Joined`.
    Joined { group_rank: u32, event: Event },
    /// Node rank 0: standbys took lost nodes' slots for `cycle`.
    Promoted {
        cycle: u32,
        promotions: Vec<crate::job::spares::Promotion>,
    },
    /// Something for the console alone (node rank 0: the last call ended).
    Note(String),
    /// The store outside the job: this agent took the coordinator's work over from node rank
    /// `lost`'s agent; it concludes the allocation (the ledger) as node rank 0 would have.
    Coordinating { lost: u32 },
    /// Node rank 0: the hosts of cycle `cycle`'s nodes, before its verdict (NVRx's cycle info).
    Hosts { cycle: u32, hosts: NodeHosts },
}

impl FromCoord {
    /// The job cannot go on here (`Event::CoordinationLost`).
    pub fn lost(reason: String, requeue: bool) -> Self {
        FromCoord::Event(Event::CoordinationLost { reason, requeue })
    }

    /// The job's verdict on `cycle` (`Event::CycleEnded`).
    pub fn cycle_ended(cycle: u32, end: JobEnd) -> Self {
        FromCoord::Event(Event::CycleEnded { cycle, end })
    }
}

#[derive(Debug, Clone)]
pub struct CoordConfig {
    /// Every agent, standbys included.
    pub nnodes: u32,
    /// The nodes that run ranks (slots); `nnodes - active` start as standbys.
    pub active: u32,
    /// `SLURM_TOPOLOGY_ADDR`, when Slurm knows the network's topology.
    pub topology: Option<String>,
    /// `--segment`: node ids in blocks of this many are close.
    pub segment: Option<u32>,
    pub node_rank: u32,
    /// This node's ranks per attempt.
    pub nproc: u32,
    /// Where node rank 0's store listens, as this node reaches it.
    pub store: SocketAddr,
    /// How long every node waits for the others at a rendezvous (and to reach the store).
    pub join_timeout: Duration,
    /// Node rank 0: how often it says which node ranks a rendezvous still waits for
    /// ([`absent::JOIN_NOTE_PERIOD`]; tests shorten it).
    pub join_note_every: Duration,
    /// `--nnodes MIN:MAX`: once MIN joined, how long node rank 0 waits for another
    /// (`last_call_timeout`).
    pub last_call: Duration,
    /// After this long without an answer from a peer, it is lost.
    pub peer_timeout: Duration,
    pub host: String,
    /// Node rank 0's value is the job's budget.
    pub max_restarts: u32,
    /// The job's secret, proven to node rank 0's store on every connection (`None`: the store
    /// asks for none).
    pub secret: Option<Arc<[u8]>>,
    /// The job's identity (`--rdzv-id`, Slurm's or NGC's job id): an agent of another job that
    /// reaches the store is refused.
    pub job: Option<String>,
    /// The store runs outside the job (`vigil store`, every agent `--rdzv-conf is_host=false`,
    /// node ranks given): the coordinator holds `vigil/lease/coord`, and when it is lost the live
    /// agent with the lowest node rank takes its work over.
    pub outside: bool,
}

impl CoordConfig {
    /// What this agent takes the job to be ([`JobShape`]).
    pub fn shape(&self) -> JobShape {
        JobShape {
            job: self.job.clone(),
            nnodes: self.nnodes,
            active: self.active,
            nproc: self.nproc,
            protocol: PROTOCOL,
        }
    }
}

/// What node rank 0 has besides the clients: where it learns of the other agents' leases and how
/// it resets the store between attempts.
pub enum HeadSide {
    /// It hosts the store: its key space (read and reset in place) and the lease events.
    Local {
        keys: KeySpace,
        leases: mpsc::UnboundedReceiver<LeaseEvent>,
    },
    /// The store runs outside the job (`vigil store`, with its lease queue): node rank 0 resets
    /// it with CLEAR_EXCEPT/CLEAR_PREFIX and learns of lost agents from the queue
    /// `vigil/lease_events`, all through its own connection.
    Remote,
}

impl HeadSide {
    /// The key space, where node rank 0 hosts the store.
    pub fn keys(&self) -> Option<&KeySpace> {
        match self {
            HeadSide::Local { keys, .. } => Some(keys),
            HeadSide::Remote => None,
        }
    }
}

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

/// Remote head: parks on the store's lease queue and hands each lost lease on, in order, until
/// the connection fails (then the liveness and the waits say the store is lost).
async fn watch_lease_queue(ctl: MuxClient, tx: mpsc::UnboundedSender<Input>) {
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
async fn watch_coordinator(ctl: MuxClient, tx: mpsc::UnboundedSender<Input>) {
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

/// Carries out one agent's requests until it leaves: returns once `Leave` is done and it is safe
/// for the process to exit. Everything it learns goes to `tx`; a store that cannot be reached or
/// a rendezvous that cannot complete ends in one [`FromCoord::lost`], after which only `Leave`
/// does anything.
pub async fn run(
    cfg: CoordConfig,
    head: Option<HeadSide>,
    rx: mpsc::UnboundedReceiver<JobRequest>,
    tx: mpsc::UnboundedSender<FromCoord>,
) {
    run_linked(StoreLink::new(), cfg, head, rx, tx).await
}

/// [`run`] on the agent's connection `link` (opened here if no one did yet), which the agent's
/// other users of the store share.
pub async fn run_linked(
    link: StoreLink,
    cfg: CoordConfig,
    head: Option<HeadSide>,
    mut rx: mpsc::UnboundedReceiver<JobRequest>,
    tx: mpsc::UnboundedSender<FromCoord>,
) {
    match Coordinator::connect(&link, cfg, head, tx.clone()).await {
        Ok(mut c) => c.serve(rx).await,
        Err(Fatal { reason, requeue }) => {
            let _ = tx.send(FromCoord::lost(reason, requeue));
            while let Some(req) = rx.recv().await {
                if matches!(req, JobRequest::Leave { .. }) {
                    return;
                }
            }
        }
    }
}

/// What the coordinator's sources (the tasks parked on the store, its own timers aside) tell it:
/// each is one input of the event loop, handled by [`Coordinator::on_input`].
enum Input {
    /// A wait of the rendezvous (`all`, `go`, `end`) came back: the value, or whether it timed
    /// out and why it failed.
    Waited {
        key: String,
        result: Result<Vec<u8>, (bool, String)>,
    },
    /// Every slot shared its timeouts for the cycle's round: the job-wide ones as written.
    Timeouts {
        cycle: u32,
        round: u32,
        value: Vec<u8>,
    },
    /// A node asked the job to stop at a step (the first trigger written).
    StopAsked { cycle: u32, trigger: String },
    /// The job's stop step was chosen.
    StopStep { cycle: u32, step: Option<u64> },
    /// Node rank 0: the last call of this cycle's rendezvous ran out (lastcall.rs).
    LastCall(u32),
    /// The liveness, or the watch on the coordinator's lease.
    Alarm(Alarm),
    /// The store outside the job: a lease was lost (its lease queue).
    Lease(LeaseEvent),
}

/// Parks in one of the rendezvous' waits (`all`, `go`, `end`), a `WAIT_GET` of its own on the
/// shared connection, so the coordinator stays free for reports meanwhile.
async fn wait_one(
    client: MuxClient,
    key: String,
    timeout: Duration,
    tx: mpsc::UnboundedSender<Input>,
) {
    let r = client.wait_get(&key, timeout).await;
    let result = r.map_err(|e| (e.is_timeout(), e.to_string()));
    let _ = tx.send(Input::Waited { key, result });
}

/// How long a rendezvous that timed out waits to read how many nodes joined it. The read only
/// adds a number to the reason, which is `?` without it; the join already waited its full
/// `--join-timeout`, and a store that answers at all does so in milliseconds, while one that is
/// gone would hold the failure for a whole `--node-timeout`.
const JOINED_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Moves messages between the store and the rendezvous' state machine ([`Rendezvous`]): reads
/// what it needs, carries out what it decided ([`Coordinator::carry_out`]), tells the runtime.
/// It decides nothing itself.
struct Coordinator {
    cfg: CoordConfig,
    /// The agent's one connection to the store; every task here uses a clone of it.
    ctl: MuxClient,
    tx: mpsc::UnboundedSender<FromCoord>,
    head: Option<Head>,
    rdzv: Rendezvous,
    /// Every task parked on the store for it (the sources of [`Input`]), aborted with it.
    tasks: JoinSet<()>,
    /// Where the tasks send what they read.
    inbox_tx: mpsc::UnboundedSender<Input>,
    inbox: mpsc::UnboundedReceiver<Input>,
    /// The rendezvous' wait under way ([`wait_one`]).
    wait: Option<AbortHandle>,
    /// Parked on this cycle's job-wide timeouts.
    timeouts_task: Option<AbortHandle>,
    /// Parked on this cycle's stop trigger, then on its stop step.
    stop_task: Option<AbortHandle>,
    /// Renews this node's counter and watches the others' ([`liveness`]).
    liveness: AbortHandle,
    /// Node rank 0 with standbys: the last call of the rendezvous under way ([`lastcall`]).
    last_call: Option<AbortHandle>,
    /// Set once a `Lost` was sent: nothing more is reported.
    ended: bool,
    /// This agent coordinated until another took the coordinator's lease over
    /// ([`Alarm::Deposed`]): it leaves without deciding anything for the job.
    deposed: bool,
    /// Node rank 0: the rendezvous under way, while it waits for nodes to join.
    join_wait: Option<JoinWait>,
}

/// Node rank 0 waits for the nodes to join `cycle` since `since`; it says who is missing at
/// `next`.
struct JoinWait {
    cycle: u32,
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
    async fn connect(
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
            liveness,
            last_call: None,
            ended: false,
            deposed: false,
            join_wait: None,
        })
    }

    fn send(&mut self, m: FromCoord) {
        if self.ended {
            return;
        }
        if matches!(m, FromCoord::Event(Event::CoordinationLost { .. })) {
            self.ended = true;
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

    async fn serve(&mut self, mut rx: mpsc::UnboundedReceiver<JobRequest>) {
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
                cycle,
                round,
                value,
            } => {
                if let Some(timeouts) = read_timeouts(&value) {
                    self.send(FromCoord::Event(Event::JobTimeouts {
                        cycle,
                        round,
                        timeouts,
                    }));
                }
                Ok(())
            }
            Input::StopAsked { cycle, trigger } => {
                self.send(FromCoord::Event(Event::StopAsked { cycle, trigger }));
                Ok(())
            }
            Input::StopStep { cycle, step } => {
                self.send(FromCoord::Event(Event::StopStep { cycle, step }));
                Ok(())
            }
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
            JobRequest::Join { cycle, calculated } => self.join(cycle, calculated).await?,
            JobRequest::Health { healthy } => self.rdzv.health(healthy),
            JobRequest::ReportEnd { cycle, end } => {
                self.decide(Fact::ReportEnd { cycle, end: &end }).await?;
            }
            JobRequest::ReportDone { cycle } => {
                let count = self.ctl.add(&key::done(cycle), 1).await?;
                self.decide(Fact::DoneCounted { cycle, count }).await?;
            }
            JobRequest::ShareTimeouts {
                cycle,
                round,
                timeouts,
            } => self.share_timeouts(cycle, round, &timeouts).await?,
            JobRequest::StopTrigger { cycle, trigger } => {
                self.ctl
                    .compare_set(&key::stop(cycle), b"", &to_json(&trigger))
                    .await?;
            }
            JobRequest::StopSteps { cycle, report } => self.share_steps(cycle, &report).await?,
            JobRequest::Leave { .. } => unreachable!("handled by serve"),
        }
        Ok(())
    }

    async fn join(
        &mut self,
        cycle: u32,
        calculated: Option<Timeouts>,
    ) -> Result<(), vigil_store::StoreError> {
        abort(&mut self.timeouts_task);
        abort(&mut self.stop_task);
        self.spawn_stop_waiter(cycle);
        let healthy = match self.rdzv.join(cycle, calculated) {
            Joining::Join { healthy } => healthy,
            Joining::Ended(end) => {
                let mut steps = poison(cycle, &end);
                steps.push(Step::Tell(FromCoord::cycle_ended(cycle, end)));
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
        let (record, count) = (key::join(cycle, me), key::joined(cycle));
        let (members, nth) = if self.rdzv.spares() {
            self.ctl.set(&record, &to_json(&info)).await?;
            let members = match self.ctl.check(&[&key::members(cycle)]).await? {
                true => Some(self.ctl.get(&key::members(cycle)).await?),
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
            cycle,
            nth,
            members,
        })
        .await?;
        self.join_wait = match self.rdzv.stage() {
            Stage::WaitAll(c) => {
                let now = tokio::time::Instant::now();
                Some(JoinWait {
                    cycle: c,
                    since: now,
                    next: now + self.cfg.join_note_every,
                })
            }
            _ => None,
        };
        Ok(())
    }

    /// Node rank 0, every [`CoordConfig::join_note_every`] while a rendezvous waits: says which
    /// node ranks have not joined (field finding 35).
    async fn join_note(&mut self) {
        let Some(w) = self.join_wait.as_mut() else {
            return;
        };
        let c = w.cycle;
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

    /// Node rank 0: the members that have not joined cycle `c`, with the agent that took each
    /// node rank where one did: read in place where it hosts the store (no round trip), through
    /// its connection where the store is outside the job (join and owner records only: no c10d
    /// ticket scan); elsewhere, none.
    async fn absent(&self, c: u32) -> Vec<Absent> {
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
            (keys.keys_raw().into_iter())
                .filter_map(|k| {
                    let id = k.strip_prefix(key::NODE_OF_PREFIX_RAW)?;
                    let id = String::from_utf8_lossy(id).into_owned();
                    Some((id, keys.get_raw(&k)?))
                })
                .collect()
        } else {
            Vec::new()
        };
        absent::absent(&members, &joined, &absent::claims(&owners, &tickets))
    }

    /// [`Coordinator::absent`] through the connection: one MULTI_GET of the members' join and
    /// owner records (an empty value is a missing key). A store that does not answer: none.
    async fn absent_remote(&self, c: u32, members: &[u32]) -> Vec<Absent> {
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

    async fn share_timeouts(
        &mut self,
        cycle: u32,
        round: u32,
        timeouts: &Timeouts,
    ) -> Result<(), vigil_store::StoreError> {
        let mine = to_json(&WireTimeouts::from(timeouts));
        let me = self.cfg.node_rank;
        self.ctl
            .set(&key::node_timeouts(cycle, round, me), &mine)
            .await?;
        // A node shares a round only once its previous one was answered (its ranks wait for the
        // answer), so a waiter still parked belongs to a round nobody completes.
        abort(&mut self.timeouts_task);
        self.spawn_timeouts_waiter(cycle, round);
        let count = self.ctl.add(&key::timeouts_count(cycle, round), 1).await?;
        self.decide(Fact::TimeoutsCounted {
            cycle,
            round,
            count,
        })
        .await
    }

    async fn share_steps(
        &mut self,
        cycle: u32,
        report: &StepReport,
    ) -> Result<(), vigil_store::StoreError> {
        let mine = to_json(&WireSteps::from(report));
        let me = self.cfg.node_rank;
        self.ctl.set(&key::stop_steps(cycle, me), &mine).await?;
        let count = self.ctl.add(&key::stop_count(cycle), 1).await?;
        self.decide(Fact::StepsCounted { cycle, count }).await
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

    /// Parked on the cycle's stop trigger and then on its stop step; aborted (and with it the
    /// wait, cancelled on the store) when the next cycle is joined.
    fn spawn_stop_waiter(&mut self, cycle: u32) {
        let c = self.ctl.clone();
        let tx = self.inbox_tx.clone();
        self.stop_task = Some(self.tasks.spawn_local(async move {
            let k = key::stop(cycle);
            let Ok(v) = c.wait_get(&k, Duration::MAX).await else {
                return;
            };
            let trigger = serde_json::from_slice(&v).unwrap_or_else(|_| "a stop".to_string());
            if tx.send(Input::StopAsked { cycle, trigger }).is_err() {
                return;
            }
            let k = key::stop_step(cycle);
            if let Ok(v) = c.wait_get(&k, Duration::MAX).await {
                let step = serde_json::from_slice(&v).unwrap_or(None);
                let _ = tx.send(Input::StopStep { cycle, step });
            }
        }));
    }

    /// Parked until every node has shared its timeouts for `cycle`; aborted (and with it the
    /// wait, cancelled on the store) when the cycle ends first.
    fn spawn_timeouts_waiter(&mut self, cycle: u32, round: u32) {
        let c = self.ctl.clone();
        let tx = self.inbox_tx.clone();
        self.timeouts_task = Some(self.tasks.spawn_local(async move {
            let k = key::timeouts(cycle, round);
            if let Ok(value) = c.wait_get(&k, Duration::MAX).await {
                let _ = tx.send(Input::Timeouts {
                    cycle,
                    round,
                    value,
                });
            }
        }));
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
                self.decide(Fact::Ended { cycle: c, value }).await?;
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

    /// Node rank 0: every member joined cycle `c`: propose the assignment (the first `go`
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
                    keys.clear_prefix(&key::cycle_prefix_raw(c - 1));
                }
            }
            None => {
                self.ctl.clear_except(vigil_store::AGENT_PREFIX).await?;
                if c > 0 {
                    self.ctl.clear_prefix(&key::cycle_prefix_raw(c - 1)).await?;
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
        self.decide(Fact::Records { cycle: c, records }).await
    }

    async fn verdict(&mut self, c: u32, value: &[u8]) -> Result<(), vigil_store::StoreError> {
        self.decide(Fact::Verdict { cycle: c, value }).await
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
        let LeaseEvent::Lost { key, value } = ev else {
            return Ok(());
        };
        let reason = format!(
            "node {key} ({}) was lost: its agent's connection to the store closed or went silent for --node-timeout",
            String::from_utf8_lossy(&value)
        );
        let node: Option<u32> = key.rsplit('/').next().and_then(|n| n.parse().ok());
        self.decide(Fact::LeaseLost { node, reason }).await
    }

    /// Hands `fact` to the state machine and carries out what it answers.
    async fn decide(&mut self, fact: Fact<'_>) -> Result<(), vigil_store::StoreError> {
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
                        cycle: c,
                        value: &v,
                    })
                }
                Step::CountJoins(c) => {
                    let joined = String::from_utf8_lossy(&self.ctl.get(&key::joined(c)).await?)
                        .parse::<usize>()
                        .unwrap_or(0);
                    self.rdzv.step(Fact::JoinsCounted { cycle: c, joined })
                }
                Step::MergeTimeouts { cycle, round } => {
                    let all = self
                        .every_node(|i| key::node_timeouts(cycle, round, i))
                        .await?;
                    let all = &all;
                    self.rdzv.step(Fact::TimeoutsRead { cycle, round, all })
                }
                Step::ChooseStopStep(cycle) => {
                    let all = self.every_node(|i| key::stop_steps(cycle, i)).await?;
                    self.rdzv.step(Fact::StepsRead { cycle, all })
                }
                Step::LastCall(c) => {
                    let tx = self.inbox_tx.clone();
                    let t = lastcall::parked(self.ctl.clone(), self.cfg.clone(), c, tx);
                    self.last_call = Some(self.tasks.spawn_local(t));
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
                // The other agents may still read this cycle's verdict from our store: keep it
                // up until each has left (or was lost), for at most one peer timeout.
                let deadline = tokio::time::Instant::now() + self.cfg.peer_timeout;
                let holders = || {
                    keys.keys_raw()
                        .iter()
                        .filter(|k| k.starts_with(key::LEASE_PREFIX_RAW))
                        .count()
                };
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

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
//! it. So every agent also adds 1 to `alive/<node>` every `--node-timeout / 8` on a connection of
//! its own, and reads the counters it watches (node rank 0: every node's; the others: node rank
//! 0's). A counter that does not move for `--node-timeout`, or a store that does not answer for
//! that long, is a lost node. Silence is measured in the watcher's own running time
//! ([`Liveness`]): a watcher that was itself stopped does not count the time it was away, so a
//! whole job suspended and resumed loses nobody.
//!
//! The key names, the messages and the rank assignment are plain functions below; [`run`] does
//! the talking.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use vigil_store::{KeySpace, LeaseEvent, StoreClient};

use crate::supervise::monitor::Timeouts;
use crate::supervise::{choose_stop_step, JobEnd, JobRequest, StepReport, AGREEMENT_BUDGET};

mod connect;
mod liveness;
pub(crate) mod wire;

pub(crate) use connect::connect_client;
use connect::{admitted, store_lost, Fatal};
use liveness::liveness;
pub use liveness::{liveness_period, Liveness, Silent};
use wire::to_json;
pub use wire::*;

/// What the job decided, for the agent's event loop.
#[derive(Debug, Clone, PartialEq)]
pub enum FromCoord {
    Joined {
        cycle: u32,
        /// This node's group rank (slot) in the cycle.
        group_rank: u32,
        rank_offset: u32,
        world_size: u32,
        max_restarts: u32,
        calculated: Option<Timeouts>,
    },
    CycleEnded {
        cycle: u32,
        end: JobEnd,
    },
    JobTimeouts {
        cycle: u32,
        round: u32,
        timeouts: Timeouts,
    },
    /// A node asked the job to stop at a step (the first trigger recorded).
    StopAsked {
        cycle: u32,
        trigger: String,
    },
    /// This node has no slot in the cycle: a standby, running no ranks.
    Standby {
        cycle: u32,
    },
    /// Node rank 0: standbys took lost nodes' slots for `cycle`.
    Promoted {
        cycle: u32,
        promotions: Vec<crate::job::spares::Promotion>,
    },
    /// The job's stop step.
    StopStep {
        cycle: u32,
        step: Option<u64>,
    },
    Lost {
        reason: String,
        requeue: bool,
    },
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
}

impl CoordConfig {
    /// What this agent takes the job to be ([`JobShape`]).
    pub fn shape(&self) -> JobShape {
        JobShape {
            job: self.job.clone(),
            nnodes: self.nnodes,
            active: self.active,
            nproc: self.nproc,
        }
    }
}

/// What node rank 0 has besides the clients: its store's key space and the other agents' leases.
pub struct HeadSide {
    pub keys: KeySpace,
    pub leases: mpsc::UnboundedReceiver<LeaseEvent>,
}

/// Carries out one agent's requests until it leaves: returns once `Leave` is done and it is safe
/// for the process to exit. Everything it learns goes to `tx`; a store that cannot be reached or
/// a rendezvous that cannot complete ends in one [`FromCoord::Lost`], after which only `Leave`
/// does anything.
pub async fn run(
    cfg: CoordConfig,
    head: Option<HeadSide>,
    mut rx: mpsc::UnboundedReceiver<JobRequest>,
    tx: mpsc::UnboundedSender<FromCoord>,
) {
    match Coordinator::connect(cfg, head, tx.clone()).await {
        Ok(mut c) => c.serve(rx).await,
        Err((reason, requeue)) => {
            let _ = tx.send(FromCoord::Lost { reason, requeue });
            while let Some(req) = rx.recv().await {
                if matches!(req, JobRequest::Leave { .. }) {
                    return;
                }
            }
        }
    }
}

struct WaitReq {
    key: String,
    timeout: Duration,
}

struct WaitDone {
    key: String,
    result: Result<Vec<u8>, (bool, String)>,
}

/// One connection that does nothing but park in `WAIT`s, one after another, so the control
/// connection stays free for reports while a wait is parked.
async fn waiter(
    mut client: StoreClient,
    mut rx: mpsc::UnboundedReceiver<WaitReq>,
    tx: mpsc::UnboundedSender<WaitDone>,
) {
    while let Some(WaitReq { key, timeout }) = rx.recv().await {
        let r = match client.wait(&[&key], timeout).await {
            Ok(()) => client.get(&key).await,
            Err(e) => Err(e),
        };
        let result = r.map_err(|e| (e.is_timeout(), e.to_string()));
        let failed = result.is_err();
        if tx.send(WaitDone { key, result }).is_err() || failed {
            return;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Idle,
    /// Node rank 0 waits for every node to join cycle N.
    WaitAll(u32),
    WaitGo(u32),
    /// Cycle N runs; parked on its end.
    Running(u32),
}

struct Coordinator {
    cfg: CoordConfig,
    ctl: StoreClient,
    wait_tx: mpsc::UnboundedSender<WaitReq>,
    wait_rx: mpsc::UnboundedReceiver<WaitDone>,
    tx: mpsc::UnboundedSender<FromCoord>,
    head: Option<HeadSide>,
    stage: Stage,
    /// The highest cycle this node joined.
    cycle: u32,
    /// Node rank 0: the calculated timeouts to hand out with the next `go`.
    calculated: Option<Timeouts>,
    /// Node rank 0: a node was lost; every later cycle ends at once.
    lost: Option<String>,
    /// A task parked on this cycle's job-wide timeouts.
    timeouts_task: Option<tokio::task::JoinHandle<()>>,
    timeouts_tx: mpsc::UnboundedSender<(u32, u32, Vec<u8>)>,
    timeouts_rx: mpsc::UnboundedReceiver<(u32, u32, Vec<u8>)>,
    /// A task parked on this cycle's stop trigger, then on its stop step.
    stop_task: Option<tokio::task::JoinHandle<()>>,
    stop_tx: mpsc::UnboundedSender<FromCoord>,
    stop_rx: mpsc::UnboundedReceiver<FromCoord>,
    /// Set once a `Lost` was sent: nothing more is reported.
    ended: bool,
    /// Renews this node's counter and watches the others' ([`liveness`]).
    liveness: tokio::task::JoinHandle<()>,
    silent_rx: mpsc::UnboundedReceiver<(String, Option<u32>)>,
    /// Node rank 0: the node it lost, when known.
    lost_node: Option<u32>,
    /// The node id playing each slot in the current cycle (hot spares; else 0..nnodes).
    slots: Vec<u32>,
    /// Node rank 0: nodes lost while standbys could take their place; never members again.
    dead: Vec<u32>,
    /// Node rank 0: every member's last join record (a lost node's topology is read from it).
    infos: std::collections::BTreeMap<u32, NodeInfo>,
    /// This node's last health check before a rendezvous (hot spares).
    healthy: Option<bool>,
    /// The node each ended cycle failed on (`None`: it did not fail), in order.
    failed_on: Vec<Option<u32>>,
    /// Node rank 0, hot spares: nodes replaced for failing attempts in a row; never given ranks
    /// again in this job.
    benched: Vec<u32>,
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.liveness.abort();
    }
}

/// Parks until `key` is set, then reads it.
async fn wait_get(c: &mut StoreClient, key: &str) -> Result<Vec<u8>, vigil_store::StoreError> {
    c.wait(&[key], Duration::MAX).await?;
    c.get(key).await
}

impl Coordinator {
    async fn connect(
        cfg: CoordConfig,
        head: Option<HeadSide>,
        tx: mpsc::UnboundedSender<FromCoord>,
    ) -> Result<Coordinator, Fatal> {
        let mut ctl = connect_client(&cfg).await?;
        let waiter_client = connect_client(&cfg).await?;
        let lost_store = |e: vigil_store::StoreError| (store_lost(cfg.store, e), true);
        // A stray (another --nnodes, another job) must be refused before it writes anything:
        // node rank 0 says what the job is, every other agent compares before claiming a rank.
        if cfg.node_rank == 0 {
            ctl.set(key::JOB, &to_json(&cfg.shape()))
                .await
                .map_err(lost_store)?;
        } else {
            admitted(&mut ctl, &cfg).await?;
        }
        // Two agents claiming one node rank would silently corrupt the job: refuse.
        let me = format!("{} (pid {})", cfg.host, std::process::id());
        let owner = ctl
            .compare_set(&key::owner(cfg.node_rank), b"", me.as_bytes())
            .await
            .map_err(lost_store)?;
        if owner != me.as_bytes() {
            return Err((
                format!(
                    "node rank {} is already taken by {}; give every node its own --node-rank (0 to {})",
                    cfg.node_rank,
                    String::from_utf8_lossy(&owner),
                    cfg.nnodes - 1
                ),
                false,
            ));
        }
        if cfg.node_rank != 0 {
            ctl.set(&key::lease(cfg.node_rank), me.as_bytes())
                .await
                .map_err(lost_store)?;
        }
        let (wait_tx, req_rx) = mpsc::unbounded_channel();
        let (done_tx, wait_rx) = mpsc::unbounded_channel();
        tokio::task::spawn_local(waiter(waiter_client, req_rx, done_tx));
        let (silent_tx, silent_rx) = mpsc::unbounded_channel();
        let liveness = tokio::task::spawn_local(liveness(
            connect_client(&cfg).await?,
            cfg.clone(),
            silent_tx,
        ));
        let (timeouts_tx, timeouts_rx) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = mpsc::unbounded_channel();
        let cfg_active = cfg.active;
        Ok(Coordinator {
            cfg,
            ctl,
            wait_tx,
            wait_rx,
            tx,
            head,
            stage: Stage::Idle,
            cycle: 0,
            calculated: None,
            lost: None,
            timeouts_task: None,
            timeouts_tx,
            timeouts_rx,
            stop_task: None,
            stop_tx,
            stop_rx,
            ended: false,
            liveness,
            silent_rx,
            lost_node: None,
            slots: (0..cfg_active).collect(),
            dead: Vec::new(),
            infos: Default::default(),
            healthy: None,
            failed_on: Vec::new(),
            benched: Vec::new(),
        })
    }

    fn send(&mut self, m: FromCoord) {
        if self.ended {
            return;
        }
        if matches!(m, FromCoord::Lost { .. }) {
            self.ended = true;
        }
        let _ = self.tx.send(m);
    }

    fn fail(&mut self, mut reason: String) {
        if self.spares() && self.head.is_none() && reason.contains("node rank 0") {
            // docs/design.md, "Hot spares": the store lives on node rank 0.
            reason.push_str("; a standby cannot take node rank 0's place (it hosts the job's store), so the job ends to be requeued");
        }
        self.stage = Stage::Idle;
        self.send(FromCoord::Lost {
            reason,
            requeue: true,
        });
    }

    fn store_error(&mut self, e: impl std::fmt::Display) {
        self.fail(store_lost(self.cfg.store, e));
    }

    fn wait_for(&mut self, key: String, timeout: Duration) {
        let _ = self.wait_tx.send(WaitReq { key, timeout });
    }

    async fn serve(&mut self, mut rx: mpsc::UnboundedReceiver<JobRequest>) {
        loop {
            let lease = async {
                match self.head.as_mut() {
                    Some(h) => h.leases.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                req = rx.recv() => match req {
                    None => return,
                    Some(JobRequest::Leave { poison, highest_step }) => {
                        self.leave(poison, highest_step).await;
                        return;
                    }
                    Some(req) => {
                        if !self.ended {
                            if let Err(e) = self.request(req).await {
                                self.store_error(e);
                            }
                        }
                    }
                },
                Some(w) = self.wait_rx.recv() => {
                    if let Err(e) = self.waited(w).await {
                        self.store_error(e);
                    }
                }
                Some((cycle, round, v)) = self.timeouts_rx.recv() => {
                    if let Ok(timeouts) = serde_json::from_slice(&v) {
                        self.send(FromCoord::JobTimeouts { cycle, round, timeouts });
                    }
                }
                Some(m) = self.stop_rx.recv() => self.send(m),
                Some(ev) = lease => {
                    if let Err(e) = self.lease_event(ev).await {
                        self.store_error(e);
                    }
                }
                Some((why, node)) = self.silent_rx.recv() => {
                    if self.head.is_none() {
                        self.fail(why);
                    } else if let Err(e) = self.node_lost(why, node).await {
                        self.store_error(e);
                    }
                }
            }
        }
    }

    /// Hot spares: some nodes wait as standbys.
    fn spares(&self) -> bool {
        self.cfg.active < self.cfg.nnodes
    }

    /// This node plays a slot in the current cycle (a standby does not report the cycle's end,
    /// timeouts or steps).
    fn in_slots(&self) -> bool {
        self.slots.contains(&self.cfg.node_rank)
    }

    async fn request(&mut self, req: JobRequest) -> Result<(), vigil_store::StoreError> {
        // What every active node reports (done, timeouts, stop steps) is counted over the slots.
        let n = self.slots.len() as i64;
        match req {
            JobRequest::ShareTimeouts { .. }
            | JobRequest::StopSteps { .. }
            | JobRequest::ReportDone { .. }
                if !self.in_slots() => {}
            JobRequest::Join { cycle, calculated } => {
                self.cycle = cycle;
                if let Some(t) = self.timeouts_task.take() {
                    t.abort();
                }
                if let Some(t) = self.stop_task.take() {
                    t.abort();
                }
                self.spawn_stop_waiter(cycle);
                if let Some(reason) = self.lost.clone() {
                    let end = JobEnd::Lost {
                        reason,
                        node: self.lost_node,
                    };
                    self.poison(cycle, &end).await?;
                    self.stage = Stage::Idle;
                    self.send(FromCoord::CycleEnded { cycle, end });
                    return Ok(());
                }
                let info = NodeInfo {
                    topology: self.cfg.topology.clone(),
                    healthy: self.healthy,
                    nproc: self.cfg.nproc,
                    host: self.cfg.host.clone(),
                    pid: std::process::id(),
                };
                self.ctl
                    .set(&key::join(cycle, self.cfg.node_rank), &to_json(&info))
                    .await?;
                let members = if self.spares() && self.ctl.check(&[&key::members(cycle)]).await? {
                    String::from_utf8_lossy(&self.ctl.get(&key::members(cycle)).await?)
                        .parse::<i64>()
                        .unwrap_or(self.cfg.nnodes as i64)
                } else {
                    self.cfg.nnodes as i64
                };
                if self.ctl.add(&key::joined(cycle), 1).await? == members {
                    self.ctl.set(&key::all(cycle), b"").await?;
                }
                if self.head.is_some() {
                    self.calculated = calculated;
                    self.stage = Stage::WaitAll(cycle);
                    self.wait_for(key::all(cycle), self.cfg.join_timeout);
                } else {
                    self.stage = Stage::WaitGo(cycle);
                    self.wait_for(key::go(cycle), self.cfg.join_timeout);
                }
            }
            JobRequest::Health { healthy } => self.healthy = Some(healthy),
            JobRequest::ReportEnd { cycle, end } => {
                if let JobEnd::Failed { node, .. } = &end {
                    self.ctl.set(&key::failed(cycle, *node), b"").await?;
                }
                self.ctl
                    .compare_set(&key::end(cycle), b"", &to_json(&end))
                    .await?;
            }
            JobRequest::ReportDone { cycle } => {
                if self.ctl.add(&key::done(cycle), 1).await? == n {
                    self.ctl
                        .compare_set(&key::end(cycle), b"", &to_json(&JobEnd::Done))
                        .await?;
                }
            }
            JobRequest::ShareTimeouts {
                cycle,
                round,
                timeouts,
            } => {
                self.ctl
                    .set(
                        &key::node_timeouts(cycle, round, self.cfg.node_rank),
                        &to_json(&timeouts),
                    )
                    .await?;
                // A node shares a round only once its previous one was answered (its ranks wait
                // for the answer), so a waiter still parked belongs to a round nobody completes.
                if let Some(t) = self.timeouts_task.take() {
                    t.abort();
                }
                self.spawn_timeouts_waiter(cycle, round);
                if self.ctl.add(&key::timeouts_count(cycle, round), 1).await? == n {
                    let all: Vec<Timeouts> = self
                        .every_node(|i| key::node_timeouts(cycle, round, i))
                        .await?;
                    let merged = merge_timeouts(&all);
                    self.ctl
                        .set(&key::timeouts(cycle, round), &to_json(&merged))
                        .await?;
                }
            }
            JobRequest::StopTrigger { cycle, trigger } => {
                self.ctl
                    .compare_set(&key::stop(cycle), b"", &to_json(&trigger))
                    .await?;
            }
            JobRequest::StopSteps { cycle, report } => {
                self.ctl
                    .set(
                        &key::stop_steps(cycle, self.cfg.node_rank),
                        &to_json(&report),
                    )
                    .await?;
                if self.ctl.add(&key::stop_count(cycle), 1).await? == n {
                    let all: Vec<StepReport> =
                        self.every_node(|i| key::stop_steps(cycle, i)).await?;
                    let step = choose_stop_step(&all, AGREEMENT_BUDGET);
                    self.ctl
                        .compare_set(&key::stop_step(cycle), b"", &to_json(&step))
                        .await?;
                }
            }
            JobRequest::Leave { .. } => unreachable!("handled by serve"),
        }
        Ok(())
    }

    /// What every node wrote under `key(node)`, read in one round trip; a value that does not
    /// parse is left out.
    async fn every_node<T: serde::de::DeserializeOwned>(
        &mut self,
        key: impl Fn(u32) -> String,
    ) -> Result<Vec<T>, vigil_store::StoreError> {
        let keys: Vec<String> = self.slots.iter().map(|n| key(*n)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        Ok(self
            .ctl
            .multi_get(&refs)
            .await?
            .iter()
            .filter_map(|v| serde_json::from_slice(v).ok())
            .collect())
    }

    /// A connection of its own, parked on the cycle's stop trigger and then on its stop step;
    /// dropped (and with it the wait) when the next cycle is joined.
    fn spawn_stop_waiter(&mut self, cycle: u32) {
        let cfg = self.cfg.clone();
        let tx = self.stop_tx.clone();
        self.stop_task = Some(tokio::task::spawn_local(async move {
            let Ok(mut c) = connect_client(&cfg).await else {
                return;
            };
            let k = key::stop(cycle);
            let Ok(v) = wait_get(&mut c, &k).await else {
                return;
            };
            let trigger = serde_json::from_slice(&v).unwrap_or_else(|_| "a stop".to_string());
            if tx.send(FromCoord::StopAsked { cycle, trigger }).is_err() {
                return;
            }
            let k = key::stop_step(cycle);
            if let Ok(v) = wait_get(&mut c, &k).await {
                let step = serde_json::from_slice(&v).unwrap_or(None);
                let _ = tx.send(FromCoord::StopStep { cycle, step });
            }
        }));
    }

    /// A connection of its own, parked until every node has shared its timeouts for `cycle`;
    /// dropped (and with it the wait) when the cycle ends first.
    fn spawn_timeouts_waiter(&mut self, cycle: u32, round: u32) {
        let cfg = self.cfg.clone();
        let tx = self.timeouts_tx.clone();
        self.timeouts_task = Some(tokio::task::spawn_local(async move {
            let Ok(mut c) = connect_client(&cfg).await else {
                return;
            };
            let k = key::timeouts(cycle, round);
            if c.wait(&[&k], Duration::MAX).await.is_ok() {
                if let Ok(v) = c.get(&k).await {
                    let _ = tx.send((cycle, round, v));
                }
            }
        }));
    }

    async fn waited(&mut self, w: WaitDone) -> Result<(), vigil_store::StoreError> {
        let value = match w.result {
            Ok(v) => v,
            Err((timed_out, e)) => {
                if self.ended {
                    return Ok(());
                }
                let reason = match self.stage {
                    Stage::WaitAll(c) | Stage::WaitGo(c) if timed_out => {
                        let joined = self
                            .ctl
                            .get_timeout(&key::joined(c), Duration::from_secs(2))
                            .await
                            .ok()
                            .and_then(|v| String::from_utf8(v).ok())
                            .unwrap_or_else(|| "?".into());
                        format!(
                            "only {joined} of {} nodes joined attempt {c} within {:.0}s (--join-timeout); check that vigil started on every node with the same --nnodes",
                            self.cfg.nnodes,
                            self.cfg.join_timeout.as_secs_f64()
                        )
                    }
                    _ => store_lost(self.cfg.store, e),
                };
                self.fail(reason);
                return Ok(());
            }
        };
        match self.stage {
            Stage::WaitAll(c) if w.key == key::all(c) => {
                // A node that stopped for good ends the rendezvous by writing `go` before `all`.
                if self.ctl.check(&[&key::go(c)]).await? {
                    let v = self.ctl.get(&key::go(c)).await?;
                    self.verdict(c, &v);
                    return Ok(());
                }
                let head = self.head.as_ref().expect("only node rank 0 waits for all");
                // Every node's ranks of the last attempt are gone: give this one a clean store.
                head.keys.reset();
                if c > 0 {
                    head.keys.clear_prefix(&key::cycle_prefix_raw(c - 1));
                }
                let members: Vec<u32> = (0..self.cfg.nnodes)
                    .filter(|n| !self.dead.contains(n))
                    .collect();
                let keys: Vec<String> = members.iter().map(|i| key::join(c, *i)).collect();
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let mut nodes = Vec::with_capacity(keys.len());
                let mut joined = std::collections::BTreeMap::new();
                for (i, v) in members.iter().zip(self.ctl.multi_get(&refs).await?) {
                    match serde_json::from_slice::<NodeInfo>(&v) {
                        Ok(info) => {
                            joined.insert(*i, info.clone());
                            nodes.push(info);
                        }
                        Err(e) => {
                            self.fail(format!("node {i} joined attempt {c} with an unreadable record ({e}); every node must run the same vigil version"));
                            return Ok(());
                        }
                    }
                }
                let go = if self.spares() {
                    // The lost nodes' slots go to standbys (healthy first, then the closest).
                    self.infos.extend(joined.clone());
                    // A node whose ranks failed or hung in the last two attempts in a row is to
                    // blame (allocation/blame.rs's rule): with a standby, it is replaced.
                    let spare_left = members.iter().any(|n| {
                        !self.slots.contains(n)
                            && !self.benched.contains(n)
                            && joined.get(n).and_then(|i| i.healthy) != Some(false)
                    });
                    if let [.., Some(a), Some(b)] = self.failed_on[..] {
                        if a == b && a != 0 && spare_left && !self.benched.contains(&a) {
                            self.benched.push(a);
                        }
                    }
                    // Lost, unfit by their last health check, or to blame: a healthy standby
                    // plays it.
                    let benched = self.benched.clone();
                    let unfit = |n: &u32| {
                        benched.contains(n) || joined.get(n).and_then(|i| i.healthy) == Some(false)
                    };
                    let lost: Vec<(u32, Option<String>)> = self
                        .slots
                        .iter()
                        .filter(|n| self.dead.contains(n) || unfit(n))
                        .map(|n| (*n, self.infos.get(n).and_then(|i| i.topology.clone())))
                        .collect();
                    let standbys: Vec<crate::job::spares::Standby> = members
                        .iter()
                        .filter(|n| !self.slots.contains(n))
                        .map(|n| crate::job::spares::Standby {
                            node: *n,
                            healthy: !unfit(n),
                            topology: joined.get(n).and_then(|i| i.topology.clone()),
                        })
                        .collect();
                    let refilled =
                        crate::job::spares::refill(&self.slots, &lost, &standbys, self.cfg.segment)
                            .ok()
                            .and_then(|(slots, promotions)| {
                                assign_slots(
                                    c,
                                    &slots,
                                    &joined,
                                    self.cfg.max_restarts,
                                    self.calculated.clone(),
                                )
                                .map(|go| (go, promotions))
                            });
                    match refilled {
                        Some((go, promotions)) => {
                            if !promotions.is_empty() {
                                self.send(FromCoord::Promoted {
                                    cycle: c,
                                    promotions,
                                });
                            }
                            go
                        }
                        None => {
                            self.fail(format!(
                                "attempt {c}: no standby left to take the place of lost node(s) {:?}",
                                self.dead
                            ));
                            return Ok(());
                        }
                    }
                } else {
                    assign(c, &nodes, self.cfg.max_restarts, self.calculated.clone())
                };
                let mine = to_json(&Verdict::Go(go));
                let v = self.ctl.compare_set(&key::go(c), b"", &mine).await?;
                self.verdict(c, &v);
            }
            Stage::WaitGo(c) if w.key == key::go(c) => self.verdict(c, &value),
            Stage::Running(c) if w.key == key::end(c) => {
                if let Some(t) = self.timeouts_task.take() {
                    t.abort();
                }
                self.stage = Stage::Idle;
                match serde_json::from_slice::<JobEnd>(&value) {
                    Ok(end) => {
                        self.failed_on.push(match &end {
                            JobEnd::Failed { node, .. } => Some(*node),
                            _ => None,
                        });
                        self.send(FromCoord::CycleEnded { cycle: c, end })
                    }
                    Err(e) => self.fail(format!("attempt {c} ended with an unreadable verdict ({e}); every node must run the same vigil version")),
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn verdict(&mut self, c: u32, value: &[u8]) {
        match serde_json::from_slice::<Verdict>(value) {
            Ok(Verdict::Go(go)) => {
                self.slots = if go.slots.is_empty() {
                    (0..go.offsets.len() as u32).collect()
                } else {
                    go.slots.clone()
                };
                if self.spares() && go.slot_of(self.cfg.node_rank).is_none() {
                    // A standby: no ranks; it follows the cycle to its end like everyone.
                    self.stage = Stage::Running(c);
                    self.wait_for(key::end(c), Duration::MAX);
                    self.send(FromCoord::Standby { cycle: c });
                    return;
                }
                let slot = go.slot_of(self.cfg.node_rank).unwrap_or(self.cfg.node_rank);
                let Some(&rank_offset) = go.offsets.get(slot as usize) else {
                    self.fail(format!(
                        "attempt {c} was assigned for {} nodes, but this is node rank {}; every node must use the same --nnodes",
                        go.offsets.len(),
                        self.cfg.node_rank
                    ));
                    return;
                };
                self.stage = Stage::Running(c);
                self.wait_for(key::end(c), Duration::MAX);
                self.send(FromCoord::Joined {
                    cycle: c,
                    group_rank: slot,
                    rank_offset,
                    world_size: go.world_size,
                    max_restarts: go.max_restarts,
                    calculated: go.calculated,
                });
            }
            Ok(Verdict::End(end)) => {
                self.stage = Stage::Idle;
                self.send(FromCoord::CycleEnded { cycle: c, end });
            }
            Err(e) => self.fail(format!(
                "attempt {c} started with an unreadable verdict ({e}); every node must run the same vigil version"
            )),
        }
    }

    /// Ends cycle `c` and the next one with `end` for every node still waiting on them; a verdict
    /// already given stays (compare-and-set). `all` is set after `go` so that node rank 0, parked
    /// until every node joined, wakes and finds the verdict.
    async fn poison(&mut self, c: u32, end: &JobEnd) -> Result<(), vigil_store::StoreError> {
        let verdict = to_json(&Verdict::End(end.clone()));
        for cycle in [c, c + 1] {
            self.ctl.compare_set(&key::go(cycle), b"", &verdict).await?;
            self.ctl
                .compare_set(&key::end(cycle), b"", &to_json(end))
                .await?;
            self.ctl.set(&key::all(cycle), b"").await?;
        }
        Ok(())
    }

    async fn lease_event(&mut self, ev: LeaseEvent) -> Result<(), vigil_store::StoreError> {
        let LeaseEvent::Lost { key, value } = ev else {
            return Ok(());
        };
        if self.lost.is_some() {
            return Ok(());
        }
        let reason = format!(
            "node {key} ({}) was lost: its agent's connection to the store closed or went silent for --node-timeout",
            String::from_utf8_lossy(&value)
        );
        let node: Option<u32> = key.rsplit('/').next().and_then(|n| n.parse().ok());
        // Only the job's node ranks hold leases that matter; anything else (an agent refused
        // before it claimed a rank, an old vigil) loses nobody.
        if node.is_none_or(|n| n >= self.cfg.nnodes) {
            return Ok(());
        }
        self.node_lost(reason, node).await
    }

    /// Node rank 0: a node is gone; this cycle and every later one end `lost`.
    async fn node_lost(
        &mut self,
        reason: String,
        node: Option<u32>,
    ) -> Result<(), vigil_store::StoreError> {
        if self.lost.is_some() || node.is_some_and(|n| self.dead.contains(&n)) {
            return Ok(());
        }
        if let Some(k) = node.filter(|_| self.spares()) {
            let standbys_left = (0..self.cfg.nnodes)
                .filter(|n| *n != k && !self.dead.contains(n) && !self.slots.contains(n))
                .count();
            if !self.slots.contains(&k) || standbys_left > 0 {
                return self.lose_to_a_standby(k, reason).await;
            }
        }
        self.lost = Some(reason.clone());
        self.lost_node = node;
        self.poison(self.cycle, &JobEnd::Lost { reason, node })
            .await
    }

    /// Node rank 0, hot spares: node `k` is gone, and a standby can take its slot (or it was a
    /// standby). It is never a member again; an attempt it ran in ends as a failure of that node,
    /// so every node restarts, and the next `go` gives its slot to a standby.
    async fn lose_to_a_standby(
        &mut self,
        k: u32,
        reason: String,
    ) -> Result<(), vigil_store::StoreError> {
        self.dead.push(k);
        let members = (self.cfg.nnodes as usize - self.dead.len()).to_string();
        for c in [self.cycle, self.cycle + 1] {
            self.ctl.set(&key::members(c), members.as_bytes()).await?;
        }
        match self.stage {
            // Joining: the rendezvous completes without it.
            Stage::WaitAll(c) => {
                let joined = String::from_utf8_lossy(&self.ctl.get(&key::joined(c)).await?)
                    .parse::<usize>()
                    .unwrap_or(0);
                if joined >= self.cfg.nnodes as usize - self.dead.len() {
                    self.ctl.set(&key::all(c), b"").await?;
                }
            }
            Stage::Running(c) if self.slots.contains(&k) => {
                let end = JobEnd::Failed { node: k, reason };
                self.ctl
                    .compare_set(&key::end(c), b"", &to_json(&end))
                    .await?;
            }
            _ => {}
        }
        Ok(())
    }

    async fn leave(&mut self, poison: Option<(u32, JobEnd)>, highest_step: Option<u64>) {
        if let Some(t) = self.timeouts_task.take() {
            t.abort();
        }
        self.liveness.abort();
        if let Some((c, end)) = poison {
            let _ = tokio::time::timeout(self.cfg.peer_timeout, self.poison(c, &end)).await;
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
            Some(h) => {
                // The other agents may still read this cycle's verdict from our store: keep it
                // up until each has left (or was lost), for at most one peer timeout.
                let deadline = tokio::time::Instant::now() + self.cfg.peer_timeout;
                let holders = |h: &HeadSide| {
                    h.keys
                        .keys_raw()
                        .iter()
                        .filter(|k| k.starts_with(key::LEASE_PREFIX_RAW))
                        .count()
                };
                let mut open = holders(h);
                while open > 0 {
                    match tokio::time::timeout_at(deadline, h.leases.recv()).await {
                        Ok(Some(_)) => open = holders(h),
                        Ok(None) | Err(_) => break,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(nproc: u32) -> NodeInfo {
        NodeInfo {
            topology: None,
            healthy: None,
            nproc,
            host: "h".into(),
            pid: 1,
        }
    }

    #[test]
    fn ranks_follow_node_rank() {
        let go = assign(3, &[node(2), node(4), node(1)], 5, None);
        assert_eq!(go.offsets, vec![0, 2, 6]);
        assert_eq!(go.world_size, 7);
        assert_eq!(go.cycle, 3);
        assert_eq!(go.max_restarts, 5);
    }

    #[test]
    fn verdicts_round_trip() {
        for v in [
            Verdict::Go(assign(0, &[node(1)], 0, Some(Timeouts::default()))),
            Verdict::End(JobEnd::Lost {
                reason: "x".into(),
                node: Some(2),
            }),
        ] {
            let back: Verdict = serde_json::from_slice(&to_json(&v)).unwrap();
            assert_eq!(back, v);
        }
        let end = JobEnd::Failed {
            node: 1,
            reason: "rank 3 exited with code 1".into(),
        };
        let back: JobEnd = serde_json::from_slice(&to_json(&end)).unwrap();
        assert_eq!(back, end);
    }

    #[test]
    fn job_timeouts_are_the_maximum_over_nodes() {
        let s = Duration::from_secs;
        let a = Timeouts {
            initial: Some(s(10)),
            heartbeat: Some(s(3)),
            sections: [("step".to_string(), s(5))].into(),
            ..Default::default()
        };
        let b = Timeouts {
            initial: Some(s(4)),
            heartbeat: Some(s(9)),
            sections: [("step".to_string(), s(2)), ("ckpt".to_string(), s(7))].into(),
            ..Default::default()
        };
        let m = merge_timeouts(&[a, b]);
        assert_eq!(m.initial, Some(s(10)));
        assert_eq!(m.heartbeat, Some(s(9)));
        assert_eq!(m.sections["step"], s(5));
        assert_eq!(m.sections["ckpt"], s(7));
        assert_eq!(m.out_of_section, None);
    }

    proptest::proptest! {
        #[test]
        fn offsets_partition_the_world(nprocs in proptest::collection::vec(1u32..9, 1..40)) {
            let nodes: Vec<NodeInfo> = nprocs.iter().map(|&n| node(n)).collect();
            let go = assign(0, &nodes, 0, None);
            let mut seen = vec![false; go.world_size as usize];
            for (i, n) in nprocs.iter().enumerate() {
                for lr in 0..*n {
                    let r = (go.offsets[i] + lr) as usize;
                    proptest::prop_assert!(!seen[r]);
                    seen[r] = true;
                }
            }
            proptest::prop_assert!(seen.into_iter().all(|x| x));
        }
    }
}

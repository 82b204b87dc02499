//! How the nodes of a job agree, through vigil's store on node rank 0 (docs/design.md,
//! "Across nodes").
//!
//! Every attempt of the job goes the same way on every node:
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
//! keepalive and user timeout, `--node-timeout`), and the attempt ends `lost`. The other nodes
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
//! verdict or a lost node means) is made by the pure state machine in decide/
//! ([`decide::Rendezvous`]; its steps in decide/steps.rs, the rank assignment in decide/assign.rs);
//! the key names and the messages, with their protocol version, are in wire.rs; [`run`] only does
//! the talking, through the coordinator (coordinator/): it reads the store, hands what it read to
//! the state machine, and writes and tells what comes back. Its shape is the supervisor's: the
//! tasks parked on the store (the rendezvous' waits, liveness, the lease queue, the coordinator's
//! lease, the job-wide timeouts, the stop, the last call) live in one `JoinSet` and only send an
//! input (`Input`) to one event loop; the loop hands what it read to the state machine
//! ([`decide::Rendezvous::step`], a [`decide::Fact`]), which answers with the steps to take
//! ([`decide::Step`]: a write, a wait, a read handed back, a message for the runtime), and one
//! function carries them out (`Coordinator::carry_out`, coordinator/carry.rs). The tasks that only
//! feed it inputs are in coordinator/sources.rs.
//!
//! This file keeps what the agent calls: [`run`] and [`run_linked`], [`CoordConfig`], [`HeadSide`]
//! and [`FromCoord`]; the other files: admission (connect.rs), liveness (liveness.rs), who has not
//! joined (absent.rs), c10d node ranks (noderank.rs), MIN:MAX's last call (lastcall.rs).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use vigil_store::{KeySpace, LeaseEvent};

use crate::supervise::{Event, JobEnd, JobRequest};

pub mod absent;
mod connect;
mod coordinator;
pub mod decide;
mod lastcall;
mod liveness;
mod noderank;
#[cfg(test)]
mod tests;
pub(crate) mod wire;

use connect::Fatal;
pub use connect::StoreLink;
use coordinator::{Coordinator, Input};
pub use decide::NodeHosts;
pub use liveness::{liveness_period, Liveness, Silent};
pub use noderank::{claim_node_rank, identity, Claimed, Unclaimed};
pub use wire::*;

/// What the job decided, for the agent's event loop.
#[derive(Debug, Clone, PartialEq)]
pub enum FromCoord {
    /// An input of the supervisor, as is: `Joined` (with where this node's ranks stand), `AttemptEnded`, `JobTimeouts`, `StopAsked`, `StopStep`,
    /// `Standby` (this node has no slot in the attempt: it runs no ranks) and `CoordinationLost`
    /// (the job cannot go on here; the last message).
    Event(Event),
    /// Node rank 0: standbys took lost nodes' slots for `attempt`.
    Promoted {
        attempt: u32,
        promotions: Vec<crate::job::spares::Promotion>,
    },
    /// Something for the console alone (node rank 0: the last call ended).
    Note(String),
    /// The store outside the job: this agent took the coordinator's work over from node rank
    /// `lost`'s agent; it concludes the allocation (the ledger) as node rank 0 would have.
    Coordinating { lost: u32 },
    /// The store hosted by node rank 0: node rank 0 is lost to this agent (its store is gone or
    /// silent), and with it whoever records the allocation; said before the `CoordinationLost`.
    HeadLost,
    /// The coordinator (hot spares): the standbys ready to take a lost node's place as of
    /// `attempt`'s verdict (healthy, never benched).
    SparesReady { attempt: u32, ready: u32 },
    /// The coordinator (hot spares): standby `node` is out of the job (it left on a signal, was
    /// lost, or was silent for the node timeout), for `reason`; `ready` standbys are left.
    StandbyGone {
        node: u32,
        reason: String,
        ready: u32,
    },
    /// Node rank 0: the hosts of attempt `attempt`'s nodes, before its verdict (NVRx's cycle info).
    Hosts { attempt: u32, hosts: NodeHosts },
}

impl FromCoord {
    /// The job cannot go on here (`Event::CoordinationLost`).
    pub fn lost(reason: String, requeue: bool) -> Self {
        FromCoord::Event(Event::CoordinationLost { reason, requeue })
    }

    /// The job's verdict on `attempt` (`Event::AttemptEnded`).
    pub fn attempt_ended(attempt: u32, end: JobEnd) -> Self {
        FromCoord::Event(Event::AttemptEnded { attempt, end })
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
    /// In-process restarts are on (`--in-process-restarts` above 0, docs/inprocess.md): every
    /// agent parks on the running attempt's next in-process generation.
    pub in_process: bool,
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

//! A node that cannot run ranks any more, and stragglers found by the job's reports.
//!
//! A node fault (a critical XID, an uncorrectable ECC error, a failed health check) takes the same
//! path as NVRx's `ExcludeThisNode`: this node's ranks are stopped as after a failure, and the node
//! leaves the job, which ends so it can be requeued without it. The rest of the job learns of it as
//! of any lost node. Before a rendezvous (the health check runs there) the node leaves at once; a
//! fault while backing off between attempts is acted on when the next attempt would start.
//!
//! Stragglers (node rank 0's report) are acted on only with `--stop-if-straggler`: the job stops at
//! an agreed step, as for a signal, so every rank checkpoints; the straggler's nodes are blamed,
//! so node rank 0 requeues the job without them.
//!
//! What needs only some parts is a free function of them: noting a fault ([`note_fault`]: what
//! the node was asked, the attempt), failing an attempt at its start ([`fault_at_start`]: the
//! attempt, what was asked) and blaming stragglers' nodes ([`blame`]). Acting on a fault or on
//! stragglers stays in the supervisor's methods: it takes the phase and goes on to a stop, the
//! stop agreement or the coordination's loss.

use std::time::Instant;

use super::events::{Action, JobEnd, Record, StopReason, SIGTERM};
use super::phase::Phase;
use super::state::{Asked, Attempt};
use super::{verdict, Supervisor};

impl Supervisor {
    /// A node fault: [`note_fault`], then this node leaves the job (before a rendezvous) or stops
    /// its ranks as after a failure. A method: acting on it takes the phase and goes on to the
    /// coordination's loss or to a stop and the report of this node's end.
    pub(super) fn on_node_fault(
        &mut self,
        now: Instant,
        reason: String,
        at_gate: bool,
        out: &mut Vec<Action>,
    ) {
        if !note_fault(&mut self.job.asked, self.attempt, &reason, at_gate, out) {
            return;
        }
        match self.phase {
            // The checks before a rendezvous failed, so this node never joined it: leave the job
            // now, telling the others this node is to be left out.
            _ if at_gate => self.on_coordination_lost(now, reason, true, out),
            Phase::Running => {
                self.begin_stop(now, StopReason::RankFailed, SIGTERM, out);
                self.report_failure(format!("node {}: {reason}", self.cfg.node_rank), out);
            }
            // Waiting to join or backing off: the next attempt fails at its start
            // (`fault_at_start`), through the job's verdict like any failure.
            _ => {}
        }
    }

    /// The call site of [`fault_at_start`].
    pub(super) fn fault_at_start(&mut self, out: &mut Vec<Action>) -> bool {
        let at = (self.attempt, self.cfg.node_rank);
        fault_at_start(&self.job.asked, &mut self.current, at, out)
    }

    /// Stragglers found: with `--stop-if-straggler`, while ranks run and no stop is under way,
    /// [`blame`] their nodes and ask for a stop. A method: it reads the configuration, the phase
    /// and the stop agreement, and goes on to the stop's trigger.
    pub(super) fn on_stragglers(&mut self, now: Instant, nodes: Vec<u32>, out: &mut Vec<Action>) {
        if !self.cfg.stop_if_straggler || self.stop.under_way() || self.phase != Phase::Running {
            return;
        }
        if !blame(&mut self.job.asked, nodes) {
            return;
        }
        let window = self.job.term_timeout;
        self.trigger_stop(now, "straggler".to_string(), window, out);
    }
}

/// A fault (`reason`) in attempt `attempt`, found by the checks before a rendezvous (`at_gate`) or
/// while the node runs: recorded, and kept in what the node was `asked` (it cannot run ranks and
/// is to be left out). Whether to act on it: a fault after the first is only acted on at a gate.
pub(super) fn note_fault(
    asked: &mut Asked,
    attempt: u32,
    reason: &str,
    at_gate: bool,
    out: &mut Vec<Action>,
) -> bool {
    if asked.fault.is_some() && !at_gate {
        return false;
    }
    out.push(Action::Record(Record::NodeFault {
        attempt,
        reason: reason.to_string(),
    }));
    asked.fault = Some(reason.to_string());
    asked.exclude = true;
    true
}

/// Attempt `attempt` was about to start on node `node`, which has a fault (in what it was `asked`):
/// the attempt fails at once instead (the report of this node's end). Whether it had one.
pub(super) fn fault_at_start(
    asked: &Asked,
    current: &mut Attempt,
    (attempt, node): (u32, u32),
    out: &mut Vec<Action>,
) -> bool {
    let Some(reason) = &asked.fault else {
        return false;
    };
    let reason = format!("node {node}: {reason}");
    verdict::report(current, attempt, JobEnd::Failed { node, reason }, out);
    true
}

/// Straggler reports blame `nodes`: each is kept once among the nodes to requeue without.
/// Whether any node is blamed.
pub(super) fn blame(asked: &mut Asked, nodes: Vec<u32>) -> bool {
    let blamed = &mut asked.blamed;
    for n in nodes {
        if !blamed.contains(&n) {
            blamed.push(n);
        }
    }
    !blamed.is_empty()
}

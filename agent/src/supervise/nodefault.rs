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

use std::time::Instant;

use super::events::{Action, Record, StopReason, SIGTERM};
use super::phase::Phase;
use super::Supervisor;

impl Supervisor {
    pub(super) fn on_node_fault(
        &mut self,
        now: Instant,
        reason: String,
        at_gate: bool,
        out: &mut Vec<Action>,
    ) {
        if self.job.asked.fault.is_some() && !at_gate {
            return;
        }
        out.push(Action::Record(Record::NodeFault {
            cycle: self.cycle,
            reason: reason.clone(),
        }));
        self.job.asked.fault = Some(reason.clone());
        self.job.asked.exclude = true;
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

    /// The next attempt was about to start on a node with a fault: it fails at once instead.
    pub(super) fn fault_at_start(&mut self, out: &mut Vec<Action>) -> bool {
        let Some(reason) = self.job.asked.fault.clone() else {
            return false;
        };
        self.report_failure(format!("node {}: {reason}", self.cfg.node_rank), out);
        true
    }

    pub(super) fn on_stragglers(&mut self, now: Instant, nodes: Vec<u32>, out: &mut Vec<Action>) {
        if !self.cfg.stop_if_straggler || self.stop.under_way() || self.phase != Phase::Running {
            return;
        }
        let blamed = &mut self.job.asked.blamed;
        for n in nodes {
            if !blamed.contains(&n) {
                blamed.push(n);
            }
        }
        if blamed.is_empty() {
            return;
        }
        let window = self.job.term_timeout;
        self.trigger_stop(now, "straggler".to_string(), window, out);
    }
}

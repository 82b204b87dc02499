//! What the runtime's parts are configured with, derived from the launch plan in one place
//! rather than copied field by field where they start: the supervisor's configuration and the
//! job's coordination (rendezvous) configuration, and `vigil health`'s options.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::cli::config::LaunchConfig;
use crate::job::rendezvous::CoordConfig;
use crate::supervise::monitor::Timeouts;
use crate::supervise::SupervisorConfig;

/// What the coordination needs beyond the plan: facts of this node and of the store found at
/// start-up.
pub struct CoordFacts {
    /// The node's name (Slurm's, else the hostname).
    pub host: String,
    /// Where node rank 0's store listens, as this node reaches it.
    pub store: SocketAddr,
    /// The job's secret for the store, if it asks for one.
    pub secret: Option<Arc<[u8]>>,
    /// `SLURM_TOPOLOGY_ADDR`, when Slurm knows the network's topology.
    pub topology: Option<String>,
}

impl LaunchConfig {
    /// The supervisor's configuration for this node. `calculated`: the timeouts an earlier run
    /// of the job calculated (node rank 0 loads them and hands them to every node).
    pub fn supervisor_config(&self, calculated: Option<Timeouts>) -> SupervisorConfig {
        let limits = &self.allocation.limits;
        SupervisorConfig {
            nproc: self.nproc,
            // The rendezvous assigns the ranks (`Event::Joined`).
            rank_offset: 0,
            world_size: self.nproc * self.active_nodes,
            max_restarts: self.max_restarts,
            node_rank: self.node_rank,
            saves_timeouts: self.node_rank == 0,
            workers_stop_timeout: self.workers_stop_timeout,
            term_timeout: self.term_timeout,
            timeouts: self.timeouts.clone(),
            warmup_steps: self.warmup_steps,
            safety_factor: self.safety_factor,
            calculates: self.calculate_timeouts,
            termination_signal: self.termination_signal,
            stack_wait: self.stack_wait,
            calculated,
            backoff: self.backoff,
            // One node only: several nodes could judge progress differently and part ways.
            no_progress: (self.nnodes == 1 && limits.max_no_progress > 0)
                .then_some((limits.max_no_progress, limits.min_progress_steps)),
            progress_from_file: self.nvrx.progress_file.is_some(),
            min_progress_steps: limits.min_progress_steps,
            stop_if_straggler: self.straggler.stop,
            in_process: self.in_process,
        }
    }

    /// The job's coordination (rendezvous, liveness, the store) as this node takes part in it.
    pub fn coord_config(&self, facts: CoordFacts) -> CoordConfig {
        CoordConfig {
            nnodes: self.nnodes,
            active: self.active_nodes,
            segment: self.segment,
            topology: facts.topology,
            node_rank: self.node_rank,
            nproc: self.nproc,
            store: facts.store,
            join_timeout: self.join_timeout,
            join_note_every: self.join_note_every,
            last_call: self.last_call,
            peer_timeout: self.node_timeout,
            host: facts.host,
            max_restarts: self.max_restarts,
            secret: facts.secret,
            job: self.job_id.clone(),
            outside: self.rdzv_is_host == Some(false) && !self.node_rank_by_rdzv,
            in_process: self.in_process.restarts > 0,
        }
    }
}

/// `vigil health`'s checks as its flags ask for them.
impl super::HealthArgs {
    pub fn options(&self) -> crate::perf::health::HealthOptions {
        crate::perf::health::HealthOptions {
            nvml_lib: self.nvml_lib.clone(),
            gpus: self.gpus,
            dev_dir: crate::perf::health::dev_dir(),
            min_free_mib: self.min_free_mib,
            ib_root: self.ib_root.clone(),
            require_ib: self.require_ib,
            ib_max_errors: self.ib_max_errors,
            storage_paths: self.storage_path.clone(),
            min_free_gib: self.min_free_gib,
        }
    }
}

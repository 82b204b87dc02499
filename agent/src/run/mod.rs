//! The runtime of one node, the edges: turns the outside world (child exits, signals, deadlines,
//! the ranks' socket, the other nodes) into supervisor events and carries out the supervisor's
//! actions. All decisions live in [`crate::supervise`]; nothing here decides.
//!
//! - `mod.rs`: `run`: start-up, the loop, teardown, in that order.
//! - `startup.rs`: everything before the loop; `teardown.rs`: everything after it (the ledger
//!   on node rank 0, through `allocation.rs`).
//! - `dispatch.rs`: the event loop: sources make internal events, one handler feeds the
//!   supervisor (the dispatcher holds the supervisor's queue of events); `FromCoord` -> `Event`
//!   in one function; `effect.rs`: what the gate and the GPU watch ask of the agent, as values.
//! - `agent.rs`: the effectors, carrying out actions (spawn an attempt, signal, sweep, stacks), in
//!   parts: the ranks (`Ranks`), the outputs (`Outputs`), the links (`Links`).
//! - `report.rs`: all console text about the job, pure (`Reporter::line` for records);
//!   `summary.rs`: the failure summary's text.
//! - `clock.rs`: the job's clock, which skips the agent's own suspension.
//! - `prelaunch.rs`: run directory and checks before any rank starts.
//! - `eventlog.rs`: `events.jsonl`. `store_host.rs`: hosting and finding vigil's store.
//!   `rank_door.rs`: the ranks' door, the loopback port through which this node's ranks reach
//!   the store authenticated (MASTER_ADDR/MASTER_PORT).
//! - `slurm_job.rs`: the Slurm job: the window after its SIGTERM, the exclusions the partition
//!   can spare, the requeue (by `scontrol`, or by the batch script inside a container).
//! - `gate.rs`: the checks before a rendezvous. `gpuwatch.rs`: the node's GPUs (NVML samples, XID
//!   events) while the job runs.
//! - `perf.rs`: `steps` records, step times for straggler scores, the job's straggler report.
//! - `metrics_server.rs`: `--metrics-port` (a minimal HTTP server) and `--metrics-textfile`; the
//!   page is `crate::metrics`' and built when asked for.
//! - `warm/`: the warm process that a rank replaced in process becomes (docs/inprocess.md).
//! - `proc.rs`: process groups, containment, the watchdog. `output.rs`: rank output to logs and
//!   console. `ipc_server.rs`: the ranks' socket. `stacks.rs`: capturing a hung rank's stacks.

mod agent;
mod allocation;
mod clock;
mod dispatch;
mod effect;
mod ending;
mod eventlog;
mod gate;
mod gpuwatch;
pub mod ipc_server;
mod metrics_server;
pub mod output;
mod perf;
mod prelaunch;
pub mod proc;
mod rank_door;
mod report;
mod slurm_job;
pub mod stacks;
mod startup;
mod store_host;
pub mod store_service;
pub mod summary;
mod teardown;
mod warm;

pub use allocation::prepare_state;
pub use prelaunch::{check_command, check_cycle_info_dir, make_run_dir, StartError};
pub use store_host::{
    host_store, host_store_with_backlog, listen_backlog, raise_nofile, ranks_nofile,
    take_store_secret, HostedStore, SECRET_ENV,
};

use std::path::PathBuf;
use std::time::Duration;

use crate::cli::config::LaunchConfig;
use report::console_err;

/// How long to wait, once everything is reaped, for rank output still in the pipes.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);
/// How long, at exit, to wait for a console that is not being read.
const CONSOLE_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// At most one refused-connection notice on the console per this long; the rest are counted.
const REFUSED_NOTICE_WINDOW: Duration = Duration::from_secs(10);

/// Runs the job on this node and returns the agent's exit status.
pub fn run(cfg: LaunchConfig, run_dir: PathBuf) -> i32 {
    // Before any thread starts: the environment is not thread-safe to change.
    let secret = match take_store_secret() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("vigil: error: {e}");
            return crate::exit::USAGE;
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            console_err(format!("vigil: error: cannot start the event loop: {e}"));
            return crate::exit::INTERNAL;
        }
    };
    let local = tokio::task::LocalSet::new();
    let code = local.block_on(&rt, agent_main(cfg, run_dir, secret));
    // The console may be stalled (a stuck srun, `| less`): give it a while, then exit anyway.
    output::flush_console(CONSOLE_FLUSH_TIMEOUT);
    code
}

async fn agent_main(cfg: LaunchConfig, run_dir: PathBuf, secret: Option<Vec<u8>>) -> i32 {
    let (mut dispatcher, mut sources, closing) = match startup::start(cfg, run_dir, secret).await {
        Ok(started) => started,
        Err(status) => return status,
    };
    dispatcher.run(&mut sources).await;
    teardown::finish(dispatcher, sources, closing).await
}

//! Across allocations: when a job must stop to checkpoint before its allocation ends, what
//! happens after the allocation, and the record kept of it.
//!
//! This module owns the pure core and its small edges; the stop-step agreement, the triggers and
//! their wiring into the supervisor and runtime live elsewhere.
//! - [`endtime`]: the allocation's end from `--end-time`, `--time-limit` and Slurm's answers.
//! - [`lead`]: how long before the end to ask the ranks to stop, from what was observed.
//! - [`policy`]: the requeue decision and the exit status, from this allocation's facts and the
//!   ledger's earlier records (the rules are tabled there).
//! - [`ledger`]: one JSON record per allocation in the job's state directory, and `vigil ledger`.
//! - [`slurm`]: the `squeue`/`scontrol` command lines as plain data, parsing their answers, and
//!   [`slurm::run_command`] (the `vigil_slurm` crate's), a blocking runner for use only outside
//!   the agent's event loop (the agent reaps every child with `waitpid(-1)` and would steal a
//!   command's status).

pub mod blame;
pub mod endtime;
pub mod lead;
pub mod ledger;
pub mod policy;
pub mod slurm;

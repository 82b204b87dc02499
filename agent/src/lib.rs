//! vigil: an in-job resiliency agent for distributed training.
//!
//! One folder per concern (docs/design.md has the map); arrows point inward to pure code:
//! - `cli`: flags (torchrun, ft_launcher) -> a checked launch plan (`cli::config`); pure.
//! - `supervise`: the supervisor, the one place that decides, and its timeout/hang checks; pure.
//! - `job`: the nodes of the job, rendezvous between their agents, the job's saved state.
//! - `run`: the runtime: event loop, processes, output, the ranks' socket, stacks, summaries (the
//!   edges).
//! - `metrics`: the Prometheus page (snapshot -> text); pure.
//! - `nvrx`: what NVRx's ft_launcher writes for tools around it (restarter lines, cycle info
//!   files), observed from the supervisor's records; decides nothing.
//! - `perf`: GPU facts (later straggler scores and NVML telemetry).
//! - `exit`: the binary's exit statuses, each named and documented once; a leaf.
//! - `values`: plain values every layer parses; a leaf.

pub mod allocation;
pub mod cli;
pub mod exit;
pub mod job;
pub mod metrics;
pub mod nvrx;
pub mod perf;
pub mod run;
pub mod supervise;
pub mod values;

//! What vigil knows of Slurm, written once for the agent (`vigil run`) and `vigil launch`
//! (recipes/):
//!
//! - [`show_job`]: `scontrol show job` (one-line `-o` or the multi-line form) as `Key=Value`
//!   fields, values with spaces kept.
//! - [`time`]: Slurm's durations (`1-02:03:04`, `MM:SS`, `UNLIMITED`) and timestamps (epoch
//!   seconds, local `YYYY-MM-DDTHH:MM:SS`, `Unknown`), and the `--time` form vigil writes.
//! - [`nodelist`]: the variables that name a job's nodes, in the order they are read, and
//!   [`hostlist`] expansion (`node[001-004,7]`).
//! - [`cmd`]: a Slurm command line as data and the blocking runner that kills it at a timeout.
//!
//! Everything is pure except [`cmd`]'s runners and [`time::local_to_epoch`] (the C library's
//! time zone). What vigil decides from Slurm's answers (requeue, exclusions, the window after
//! Slurm's SIGTERM) stays with the agent; this crate only reads and writes Slurm's forms.

pub mod cmd;
pub mod hostlist;
pub mod nodelist;
pub mod show_job;
pub mod time;

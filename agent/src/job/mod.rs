//! The job beyond this node: who the nodes are (Slurm, NGC, flags; hostlists), the rendezvous
//! between their agents through the head's store, and the state a job keeps between its runs
//! (whose it is, where it lives).

pub mod exchange;
pub mod nodes;
pub mod rendezvous;
pub mod spares;
pub mod state;

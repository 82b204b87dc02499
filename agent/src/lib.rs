//! vigil: an in-job resiliency agent for distributed training.
//!
//! Pure cores (`supervisor`, `config`, `output`'s splitter, `summary`) decide and format; the
//! edges (`proc`, `runtime`, `gpu`) talk to the operating system.

pub mod allocation;
pub mod cli;
pub mod config;
pub mod ftcompat;
pub mod gpu;
pub mod hostlist;
pub mod ipc_server;
pub mod monitor;
pub mod nodes;
pub mod output;
pub mod proc;
pub mod rendezvous;
pub mod runtime;
pub mod stacks;
pub mod state;
pub mod summary;
pub mod supervisor;

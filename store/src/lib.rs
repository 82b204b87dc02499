//! vigil-store: a server that speaks PyTorch's c10d `TCPStore` wire protocol,
//! so that unmodified `torch.distributed.TCPStore(host, port, is_master=False)`
//! clients (and `init_process_group` with `TORCHELASTIC_USE_AGENT_STORE=True`)
//! can use a store hosted by the vigil agent, plus an async client that the
//! agents use for their own coordination.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use vigil_store::{StoreClient, StoreServer};
//!
//! let server = StoreServer::bind("127.0.0.1:0".parse()?).await?;
//! let handle = server.spawn();
//! let mut c = StoreClient::connect(handle.local_addr(), Duration::from_secs(10)).await?;
//! c.set("vigil/attempt", b"0").await?;
//! assert_eq!(c.add("counter", 2).await?, 2);
//! handle.reset(); // keeps only /vigil/... keys for the next attempt
//! handle.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Keys under `vigil/lease/` are leases, deleted and reported
//! ([`StoreServer::lease_events`]) when the connection that set them ends;
//! [`StoreServer::set_peer_timeout`] and [`StoreClient::set_peer_timeout`]
//! make a silent peer end its connection.
//!
//! [`MuxClient`] speaks vigil's tagged mode: one connection carrying many requests and waits at
//! once, for agents that would otherwise open one connection per parked wait.
//!
//! See `docs/store.md` for the opcode table and the torch version checked.

pub mod auth;
pub mod client;
pub mod core;
pub mod mux;
pub mod protocol;
pub mod server;

pub use client::{first_connect_delay, StoreClient, StoreError, DEFAULT_TIMEOUT};
pub use core::{lease_event_json, LeaseEvent, LEASE_LOST_PREFIX, LEASE_QUEUE, LEASE_QUEUE_MAX};
pub use mux::MuxClient;
pub use protocol::{Opcode, VALIDATION_MAGIC};
pub use server::{
    keepalive_timing, set_peer_timeout, somaxconn, DropNotice, KeySpace, Refusal, Refusals,
    StoreHandle, StoreServer, StoreStats, AGENT_PREFIX, CLOSED_IN_HANDSHAKE, DEFAULT_MAX_TOTAL,
    ENTRY_OVERHEAD, LEASE_PREFIX, LISTEN_BACKLOG, MAX_REPLY_LEN, MAX_TAGGED_WAITS,
};

//! The store's server shell: it binds, accepts, frames bytes, reads and writes, and carries out
//! what the core ([`crate::core`]) decides. It holds no rule of its own: who may do what, every
//! bound, every reply and every wake-up come from the core.
//!
//! One Tokio task per connection, one core shared behind a mutex that no task holds across an
//! await. A wake-up for a parked wait is handed to its connection's task through a channel while
//! the core is still locked, so a later `CANCEL_WAIT` on the same connection always sees a
//! consistent picture (`STOP_WAITING` is written before `WAIT_CANCELED` if the wait was satisfied
//! first, as torch's client expects). Nothing polls.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

pub use crate::core::gate::Refusal;
use crate::core::{ConnId, Core, Effects, LeaseEvent, Limits, WaitId};

mod conn;
mod sockopt;

pub use crate::core::{
    AGENT_PREFIX, DEFAULT_MAX_TOTAL, ENTRY_OVERHEAD, LEASE_PREFIX, MAX_REPLY_LEN, MAX_TAGGED_WAITS,
};
pub use sockopt::{keepalive_timing, set_peer_timeout, somaxconn};

/// Listen backlog requested from the kernel (it is capped by `net.core.somaxconn`). torch had
/// connection failures at 4k+ ranks because of a small backlog (pytorch PR #129261).
pub const LISTEN_BACKLOG: u32 = 16384;

/// Counters describing the server's current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Keys in the key-value map (what GETNUMKEYS reports to an agent).
    pub keys: usize,
    /// Non-empty queues.
    pub queues: usize,
    /// Waits parked (WAIT, WAIT_GET, BARRIER, tagged or not).
    pub pending_waits: usize,
    /// Open client connections.
    pub connections: usize,
    /// Connections in their handshake (not yet admitted).
    pub in_handshake: usize,
    /// Connections dropped because of a protocol violation.
    pub dropped_for_protocol_errors: u64,
    /// What stored keys, values and queued elements take (see [`ENTRY_OVERHEAD`]).
    pub stored_bytes: usize,
    /// What parked waits take.
    pub parked_bytes: usize,
    /// Charged buffers of connections: requests and replies being transferred.
    pub buffered_bytes: usize,
}

/// Told why a connection was closed for misbehaving, or ended before it completed its
/// handshake: the peer, the refusal it counts as (`None`: an admitted connection that
/// misbehaved) and the reason.
pub type DropNotice = Arc<dyn Fn(SocketAddr, Option<Refusal>, &str) + Send + Sync>;

/// The reason given for a connection its peer closed before completing its handshake (a
/// [`Refusal::ClosedInHandshake`] the store did not cause).
pub const CLOSED_IN_HANDSHAKE: &str = "it closed the connection before completing its handshake";

/// The connections the store turned away before they completed their handshake, by kind
/// ([`Refusal`]), since it started, and the last one's peer and reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refusals {
    pub bad_bytes: u64,
    pub wrong_secret: u64,
    pub closed_in_handshake: u64,
    pub over_budget: u64,
    pub last_peer: Option<SocketAddr>,
    pub last_why: Option<String>,
}

impl Refusals {
    /// How many of kind `kind`.
    pub fn of(&self, kind: Refusal) -> u64 {
        match kind {
            Refusal::BadBytes => self.bad_bytes,
            Refusal::WrongSecret => self.wrong_secret,
            Refusal::ClosedInHandshake => self.closed_in_handshake,
            Refusal::OverBudget => self.over_budget,
        }
    }

    /// All kinds together.
    pub fn total(&self) -> u64 {
        Refusal::ALL.iter().map(|k| self.of(*k)).sum()
    }

    pub fn count(&mut self, kind: Refusal, peer: SocketAddr, why: &str) {
        let n = match kind {
            Refusal::BadBytes => &mut self.bad_bytes,
            Refusal::WrongSecret => &mut self.wrong_secret,
            Refusal::ClosedInHandshake => &mut self.closed_in_handshake,
            Refusal::OverBudget => &mut self.over_budget,
        };
        *n = n.saturating_add(1);
        self.last_peer = Some(peer);
        if self.last_why.as_deref() != Some(why) {
            self.last_why = Some(why.to_string());
        }
    }
}

/// What a connection's task is told by others.
pub(crate) enum Signal {
    Wake(WaitId),
    Evict,
}

/// The core, and where its effects go.
pub(crate) struct Hub {
    pub(crate) core: Core,
    routes: HashMap<ConnId, mpsc::UnboundedSender<Signal>>,
    lease_tx: Option<mpsc::UnboundedSender<LeaseEvent>>,
}

impl Hub {
    /// Carries out `fx` (under the lock, so that wake-ups and lease events keep the order of
    /// the key-space changes). A receiver gone is a connection that just ended: nothing to do.
    pub(crate) fn carry_out(&mut self, fx: Effects) {
        for (conn, wait) in fx.wakes {
            if let Some(tx) = self.routes.get(&conn) {
                let _ = tx.send(Signal::Wake(wait));
            }
        }
        if let Some(tx) = &self.lease_tx {
            for ev in fx.leases {
                let _ = tx.send(ev);
            }
        }
        if let Some(tx) = fx.evict.and_then(|c| self.routes.get(&c)) {
            let _ = tx.send(Signal::Evict);
        }
    }
}

pub(crate) struct Shared {
    hub: Mutex<Hub>,
    on_drop: Mutex<Option<DropNotice>>,
    /// Set before the server aborts its connections: leases are then left alone.
    shutting_down: AtomicBool,
    connections: AtomicUsize,
    protocol_drops: AtomicU64,
    last_drop: Mutex<Option<String>>,
    refused: Mutex<Refusals>,
}

impl Shared {
    fn new() -> Shared {
        Shared {
            hub: Mutex::new(Hub {
                core: Core::new(Limits::default()),
                routes: HashMap::new(),
                lease_tx: None,
            }),
            on_drop: Mutex::new(None),
            shutting_down: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            protocol_drops: AtomicU64::new(0),
            last_drop: Mutex::new(None),
            refused: Mutex::new(Refusals::default()),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Hub> {
        // No handler panics while holding the lock; if one did, the maps are still
        // structurally sound, so keep serving.
        lock(&self.hub)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A handle on the server's key space, for the agent that hosts the store: reset it between
/// attempts, inspect it, or read and write keys without a TCP round trip. Cheap to clone.
#[derive(Clone)]
pub struct KeySpace {
    shared: Arc<Shared>,
}

impl KeySpace {
    /// Deletes every key and queue except those under [`AGENT_PREFIX`] (`/vigil/`): a new
    /// attempt of the job starts from a clean key space while the agents keep their own
    /// bookkeeping. Returns how many entries were removed. Parked waiters stay parked (they are
    /// released when the new attempt creates their keys).
    pub fn reset(&self) -> usize {
        self.reset_except(AGENT_PREFIX)
    }

    /// Deletes every key and queue whose raw name does not start with `keep`.
    pub fn reset_except(&self, keep: &[u8]) -> usize {
        self.shared
            .lock()
            .core
            .remove_where(|k| !k.starts_with(keep))
    }

    /// Deletes every key and queue whose raw name starts with `prefix`.
    pub fn clear_prefix(&self, prefix: &[u8]) -> usize {
        self.shared
            .lock()
            .core
            .remove_where(|k| k.starts_with(prefix))
    }

    /// Reads a raw key (no `/` is added).
    pub fn get_raw(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.shared.lock().core.get_raw(key).map(<[u8]>::to_vec)
    }

    /// Writes a raw key (no `/` is added), releasing its waiters.
    pub fn set_raw(&self, key: &[u8], value: &[u8]) {
        let mut hub = self.shared.lock();
        let fx = hub.core.set_raw(key, value);
        hub.carry_out(fx);
    }

    /// How many raw keys start with `prefix` (nothing is copied: cheap to ask often).
    pub fn count_prefix(&self, prefix: &[u8]) -> usize {
        self.shared.lock().core.count_prefix(prefix)
    }

    /// The raw keys starting with `prefix` and their values, sorted by key.
    pub fn entries_prefix(&self, prefix: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.shared.lock().core.entries_prefix(prefix)
    }

    /// All raw key names, sorted.
    pub fn keys_raw(&self) -> Vec<Vec<u8>> {
        self.shared.lock().core.keys_raw()
    }

    /// Why the most recent connection dropped for a protocol violation was dropped.
    pub fn last_protocol_error(&self) -> Option<String> {
        lock(&self.shared.last_drop).clone()
    }

    /// The connections turned away in their handshake so far.
    pub fn refusals(&self) -> Refusals {
        lock(&self.shared.refused).clone()
    }

    pub fn stats(&self) -> StoreStats {
        let u = self.shared.lock().core.usage();
        StoreStats {
            keys: u.keys,
            queues: u.queues,
            pending_waits: u.waits,
            connections: self.shared.connections.load(Ordering::Relaxed),
            in_handshake: u.in_handshake,
            dropped_for_protocol_errors: self.shared.protocol_drops.load(Ordering::Relaxed),
            stored_bytes: u.stored_bytes,
            parked_bytes: u.parked_bytes,
            buffered_bytes: u.buffered_bytes,
        }
    }
}

/// A bound, not yet serving, TCPStore-compatible server.
pub struct StoreServer {
    listener: TcpListener,
    shared: Arc<Shared>,
    peer_timeout: Option<Duration>,
}

impl StoreServer {
    /// Binds `addr` (port 0 picks a free port) with a large listen backlog
    /// ([`LISTEN_BACKLOG`]) and `SO_REUSEADDR`. Must run inside a Tokio runtime.
    pub async fn bind(addr: SocketAddr) -> io::Result<StoreServer> {
        Self::bind_with_backlog(addr, LISTEN_BACKLOG).await
    }

    /// [`StoreServer::bind`] with a listen backlog of `backlog` (the kernel caps it at
    /// `net.core.somaxconn`; see [`somaxconn`]).
    pub async fn bind_with_backlog(addr: SocketAddr, backlog: u32) -> io::Result<StoreServer> {
        let sock = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        sock.set_reuseaddr(true)?;
        sock.bind(addr)?;
        let listener = sock.listen(backlog)?;
        Ok(StoreServer {
            listener,
            shared: Arc::new(Shared::new()),
            peer_timeout: None,
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn key_space(&self) -> KeySpace {
        KeySpace {
            shared: self.shared.clone(),
        }
    }

    /// Subscribes to lease events (see [`LEASE_PREFIX`]): one [`LeaseEvent`] per lease key that
    /// a connection had set, when that connection ends other than by the server shutting down.
    /// Call before [`spawn`](StoreServer::spawn) or [`serve`](StoreServer::serve). There is one
    /// subscriber: a second call replaces the first (whose receiver then ends). Without a
    /// subscriber, lost leases are still deleted, silently.
    pub fn lease_events(&mut self) -> mpsc::UnboundedReceiver<LeaseEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.shared.lock().lease_tx = Some(tx);
        rx
    }

    /// With `Some(t)`, every accepted connection gets TCP keepalive and `TCP_USER_TIMEOUT` so
    /// that a peer that vanishes without closing (host lost, network cut) is detected after
    /// roughly `t` (see [`set_peer_timeout`]); its connection then ends with an I/O error, which
    /// releases its leases. `None` (the default) leaves the system defaults. Call before
    /// [`spawn`](StoreServer::spawn) or [`serve`](StoreServer::serve).
    pub fn set_peer_timeout(&mut self, t: Option<Duration>) {
        self.peer_timeout = t;
    }

    /// Requires every connection to prove `secret` before anything but the handshake (see
    /// [`crate::core::gate`]). `None` (the default) admits every connection at VALIDATE, as
    /// torch's server does. Applies to connections accepted afterwards.
    pub fn set_secret(&mut self, secret: Option<Vec<u8>>) {
        self.shared.lock().core.set_secret(secret.map(Arc::from));
    }

    /// With `on`, every lost lease is also pushed onto the queue `vigil/lease_events`
    /// ([`LEASE_QUEUE`](crate::LEASE_QUEUE)), so that agents that only connect to the store (a
    /// store outside the job) learn of it over the wire. Off by default.
    pub fn set_lease_queue(&mut self, on: bool) {
        self.shared.lock().core.set_lease_queue(on);
    }

    /// Bounds what the server holds (default [`DEFAULT_MAX_TOTAL`]): stored keys and values,
    /// parked waits, and the buffers of requests and replies in transfer. A request that would
    /// go over it closes its connection.
    pub fn set_max_total(&mut self, bytes: usize) {
        self.update_limits(|l| l.max_total = bytes);
    }

    /// How long a connection may take to complete its handshake (default
    /// [`crate::core::gate::HANDSHAKE_TIMEOUT`]).
    pub fn set_handshake_timeout(&mut self, t: Duration) {
        self.update_limits(|l| l.handshake_timeout = t);
    }

    /// How many connections may be in their handshake at once (default
    /// [`crate::core::gate::MAX_IN_HANDSHAKE`]); one more closes the oldest.
    pub fn set_max_in_handshake(&mut self, n: usize) {
        self.update_limits(|l| l.max_in_handshake = n);
    }

    fn update_limits(&mut self, f: impl FnOnce(&mut Limits)) {
        let mut hub = self.shared.lock();
        let mut l = hub.core.limits();
        f(&mut l);
        hub.core.set_limits(l);
    }

    /// Called (on the server's thread) with the peer and the reason whenever a connection is
    /// closed for a protocol violation, a failed or missing authentication, or going over a
    /// limit.
    pub fn on_drop(&mut self, f: DropNotice) {
        *lock(&self.shared.on_drop) = Some(f);
    }

    /// Serves until this future is dropped (which also closes every connection it accepted,
    /// without settling their leases).
    pub async fn serve(self) {
        let (_tx, rx) = watch::channel(false);
        accept_loop(self.listener, self.shared, self.peer_timeout, rx).await;
    }

    /// Serves on a background task; the handle resets the key space and shuts the server down.
    pub fn spawn(self) -> StoreHandle {
        let local_addr = self
            .listener
            .local_addr()
            .expect("a bound listener has an address");
        let (tx, rx) = watch::channel(false);
        let keys = self.key_space();
        let task = tokio::spawn(accept_loop(
            self.listener,
            self.shared,
            self.peer_timeout,
            rx,
        ));
        StoreHandle {
            local_addr,
            keys,
            shutdown: tx,
            task: Some(task),
        }
    }
}

/// A running server. Dropping it stops the server without waiting; prefer
/// [`StoreHandle::shutdown`].
pub struct StoreHandle {
    local_addr: SocketAddr,
    keys: KeySpace,
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl StoreHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn key_space(&self) -> &KeySpace {
        &self.keys
    }

    /// See [`KeySpace::reset`]: keeps only `/vigil/...` keys.
    pub fn reset(&self) -> usize {
        self.keys.reset()
    }

    /// See [`KeySpace::clear_prefix`].
    pub fn clear_prefix(&self, prefix: &[u8]) -> usize {
        self.keys.clear_prefix(prefix)
    }

    pub fn stats(&self) -> StoreStats {
        self.keys.stats()
    }

    /// Stops accepting, closes every connection and waits until all of the server's tasks
    /// have finished (the port is free afterwards). Leases are not settled: no [`LeaseEvent`]
    /// is reported and lease keys stay.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for StoreHandle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// Sets [`Shared::shutting_down`] when dropped.
struct ShutdownMark(Arc<Shared>);

impl Drop for ShutdownMark {
    fn drop(&mut self) {
        self.0.shutting_down.store(true, Ordering::SeqCst);
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    peer_timeout: Option<Duration>,
    mut shutdown: watch::Receiver<bool>,
) {
    // Dropping the JoinSet (when `serve()` is dropped) aborts every connection.
    let mut conns = JoinSet::new();
    // Declared after `conns`, so dropped (marking the shutdown) before it.
    let mark = ShutdownMark(shared.clone());
    loop {
        if *shutdown.borrow() {
            break;
        }
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    conns.spawn(conn::serve(stream, peer, shared.clone(), peer_timeout));
                }
                Err(_) => {
                    // EMFILE and friends: back off instead of spinning; never exit.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            r = shutdown.changed() => {
                if r.is_err() {
                    break;
                }
            }
        }
    }
    drop(listener);
    drop(mark);
    // Aborting a connection task drops its socket (closing it) and its session guard (which
    // unregisters its waits without settling its leases).
    conns.shutdown().await;
}

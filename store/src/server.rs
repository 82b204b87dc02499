//! The TCPStore-compatible server.
//!
//! One Tokio task per connection, one key space shared behind a mutex (no
//! handler awaits while holding it). A `WAIT` whose keys are missing parks
//! the connection's wait in the shared state; whoever creates the last missing
//! key sends the wake-up to that connection's task through a channel, while
//! still holding the lock, so a later `CANCEL_WAIT` on the same connection
//! always sees a consistent picture (`STOP_WAITING` is written before
//! `WAIT_CANCELED` if the wait was satisfied first, as torch's client expects).
//! Nothing polls.
//!
//! Lease keys (under [`LEASE_PREFIX`]) are owned by the connection that last
//! set them; when that connection ends, the server deletes the keys it still
//! owns and reports them through [`StoreServer::lease_events`].

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::auth;
use crate::protocol::{
    parse_counter, parse_request, put_bytes, put_i64, Parsed, ProtocolError, Request,
    CHECK_NOT_READY, CHECK_READY, MAX_VALUE_LEN, VALIDATION_MAGIC, WAIT_CANCELED,
    WAIT_STOP_WAITING,
};
use tagged::TagWait;

mod tagged;

/// Raw-key prefix under which vigil agents keep their own coordination keys.
///
/// [`StoreClient`](crate::StoreClient) and torch's client both put `/` in front
/// of the user's key, so an agent key `vigil/attempt` is stored as
/// `/vigil/attempt`. [`KeySpace::reset`] keeps exactly these. When the server
/// has a secret ([`StoreServer::set_secret`]), only connections that proved
/// they hold it may name these keys; any other connection that does is closed,
/// and LIST_KEYS and GETNUMKEYS leave them out for it.
pub const AGENT_PREFIX: &[u8] = b"/vigil/";

/// Raw-key prefix of lease keys: a client writes `vigil/lease/<name>` (stored
/// as `/vigil/lease/<name>`). A lease key is owned by the connection that last
/// stored it with SET, a COMPARE_SET that stored, or MULTI_SET; when that
/// connection ends (EOF, I/O error, protocol error, but not server shutdown)
/// the server deletes the key if it still holds that connection's write and
/// reports a [`LeaseEvent`].
pub const LEASE_PREFIX: &[u8] = b"/vigil/lease/";

fn is_lease_key(key: &[u8]) -> bool {
    key.starts_with(LEASE_PREFIX)
}

/// What happened to a lease key when the connection that owned it ended. See
/// [`StoreServer::lease_events`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// The key still held the value that connection wrote: the server deleted
    /// it. `key` is the name after `/vigil/lease/` (lossy UTF-8); `value` is
    /// what the key held.
    Lost { key: String, value: Vec<u8> },
    /// The key had been deleted or overwritten (by anyone, the owner included)
    /// since that connection last wrote it: nothing was deleted.
    Released { key: String },
}

/// Listen backlog requested from the kernel (it is capped by
/// `net.core.somaxconn`). torch had connection failures at 4k+ ranks because
/// of a small backlog (pytorch PR #129261).
pub const LISTEN_BACKLOG: u32 = 16384;

/// The kernel's cap on a listen backlog (`net.core.somaxconn`), where it can be read.
pub fn somaxconn() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Largest read-buffer growth per read, so a huge declared length does not
/// make us reserve its full size before the bytes arrive.
const READ_CHUNK_MAX: usize = 1 << 20;
const READ_CHUNK_MIN: usize = 4096;

/// Default bound on what the server holds: stored keys and values (each key
/// counted with [`ENTRY_OVERHEAD`]) plus the requests and replies being
/// transferred. A write that would go over it closes the writer's connection.
pub const DEFAULT_MAX_TOTAL: usize = 256 * 1024 * 1024;
/// Bookkeeping charged per stored key or queued element, so that many empty
/// keys are bounded too.
pub const ENTRY_OVERHEAD: usize = 64;
/// Largest reply to one request (MULTI_GET of many large values); a bigger
/// one closes the connection.
pub const MAX_REPLY_LEN: usize = 4 * MAX_VALUE_LEN as usize;
/// Replies are written once this much has been produced, so that pipelined
/// requests from a client that does not read cannot pile replies up.
const OUT_FLUSH: usize = 256 * 1024;
/// Connection buffers up to this size are not charged to the total.
const FREE_BUFFER: usize = 64 * 1024;
/// Most tagged waits (WAIT, WAIT_GET) one connection may have parked at once; one more closes it.
pub const MAX_TAGGED_WAITS: usize = 1024;

fn entry_size(key: &[u8], value: &[u8]) -> usize {
    key.len() + value.len() + ENTRY_OVERHEAD
}

/// Counters describing the server's current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Keys in the key-value map (what GETNUMKEYS reports).
    pub keys: usize,
    /// Non-empty queues.
    pub queues: usize,
    /// Connections currently parked in WAIT or BARRIER.
    pub pending_waits: usize,
    /// Open client connections.
    pub connections: usize,
    /// Connections dropped because of a protocol violation.
    pub dropped_for_protocol_errors: u64,
    /// What stored keys, values and queued elements take (see [`ENTRY_OVERHEAD`]).
    pub stored_bytes: usize,
    /// Charged buffers of connections: requests and replies being transferred.
    pub buffered_bytes: usize,
}

struct Waiter {
    /// Keys still missing before this wait is released.
    remaining: usize,
    /// Keys it was registered under (to unregister on cancel).
    keys: Vec<Vec<u8>>,
    tx: mpsc::UnboundedSender<u64>,
}

#[derive(Default)]
struct State {
    kv: HashMap<Vec<u8>, Vec<u8>>,
    queues: HashMap<Vec<u8>, VecDeque<Vec<u8>>>,
    /// key -> ids of waits registered on it, oldest first.
    waiting: HashMap<Vec<u8>, VecDeque<u64>>,
    waits: HashMap<u64, Waiter>,
    /// Lease key -> id of the connection that owns it. An entry exists only
    /// while the key holds the value that connection stored.
    lease_owner: HashMap<Vec<u8>, u64>,
    /// The lease-event subscriber, if any.
    lease_tx: Option<mpsc::UnboundedSender<LeaseEvent>>,
    /// What the keys, values and queued elements take ([`entry_size`]).
    bytes: usize,
    /// Counters renewed with RENEW -> renewed since the last SWEEP of a prefix they fall under.
    /// An entry exists only while its key does (pruned by the sweep).
    renewed: BTreeMap<Vec<u8>, bool>,
}

impl State {
    /// A key "exists" for CHECK/WAIT if it holds a value or is a non-empty queue.
    fn present(&self, key: &[u8]) -> bool {
        self.kv.contains_key(key) || self.queues.get(key).is_some_and(|q| !q.is_empty())
    }

    /// Stores `key` (no waking, no lease bookkeeping), keeping `bytes` right.
    fn kv_put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.bytes += entry_size(&key, &value);
        if let Some(old) = self.kv.get(&key) {
            self.bytes -= entry_size(&key, old);
        }
        self.kv.insert(key, value);
    }

    fn kv_take(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        let v = self.kv.remove(key)?;
        self.bytes -= entry_size(key, &v);
        Some(v)
    }

    /// How much storing `value` at `key` would add.
    fn growth(&self, key: &[u8], value_len: usize) -> usize {
        let old = self.kv.get(key).map_or(0, |v| entry_size(key, v));
        (key.len() + value_len + ENTRY_OVERHEAD).saturating_sub(old)
    }

    fn fire(&mut self, id: u64) -> bool {
        let Some(w) = self.waits.get_mut(&id) else {
            return false;
        };
        w.remaining = w.remaining.saturating_sub(1);
        if w.remaining > 0 {
            return false;
        }
        let w = self.waits.remove(&id).expect("present");
        // The receiving connection may be gone; its cleanup then finds nothing.
        let _ = w.tx.send(id);
        true
    }

    /// Releases every wait registered on `key` whose last missing key this was.
    fn wake_all(&mut self, key: &[u8]) {
        if self.waiting.is_empty() {
            return;
        }
        if let Some(ids) = self.waiting.remove(key) {
            for id in ids {
                self.fire(id);
            }
        }
    }

    /// Releases one wait on `key` (a queue push makes one element available).
    fn wake_one(&mut self, key: &[u8]) {
        let Some(ids) = self.waiting.get_mut(key) else {
            return;
        };
        let mut ids = std::mem::take(ids);
        while let Some(id) = ids.pop_front() {
            if self.fire(id) {
                break;
            }
        }
        if ids.is_empty() {
            self.waiting.remove(key);
        } else {
            self.waiting.insert(key.to_vec(), ids);
        }
    }

    /// Registers wait `id` on the missing keys. Returns true if nothing is
    /// missing (the caller answers at once and nothing is registered).
    fn register_wait(
        &mut self,
        id: u64,
        keys: Vec<Vec<u8>>,
        tx: &mpsc::UnboundedSender<u64>,
    ) -> bool {
        let missing: Vec<Vec<u8>> = keys.into_iter().filter(|k| !self.present(k)).collect();
        if missing.is_empty() {
            return true;
        }
        for k in &missing {
            self.waiting.entry(k.clone()).or_default().push_back(id);
        }
        self.waits.insert(
            id,
            Waiter {
                remaining: missing.len(),
                keys: missing,
                tx: tx.clone(),
            },
        );
        false
    }

    /// Removes wait `id`. True if it was still pending (not yet released).
    fn cancel_wait(&mut self, id: u64) -> bool {
        let Some(w) = self.waits.remove(&id) else {
            return false;
        };
        for k in &w.keys {
            if let Some(ids) = self.waiting.get_mut(k) {
                ids.retain(|x| *x != id);
                if ids.is_empty() {
                    self.waiting.remove(k);
                }
            }
        }
        true
    }

    /// A write of `key` that takes no lease ownership (it ends any).
    fn set(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.disown(&key);
        self.wake_all(&key);
        self.kv_put(key, value);
    }

    /// A write of `key` by connection `conn` through SET, COMPARE_SET or
    /// MULTI_SET: a lease key becomes owned by that connection.
    fn set_by(&mut self, conn: &mut ConnLeaseSlot<'_>, key: Vec<u8>, value: Vec<u8>) {
        if is_lease_key(&key) {
            let id = conn.own(&key);
            self.lease_owner.insert(key.clone(), id);
            self.wake_all(&key);
            self.kv_put(key, value);
        } else {
            self.set(key, value);
        }
    }

    /// `key` was modified or deleted other than by an owning write.
    fn disown(&mut self, key: &[u8]) {
        if !self.lease_owner.is_empty() {
            self.lease_owner.remove(key);
        }
    }

    /// Deletes a key (not a queue). True if it existed.
    fn delete(&mut self, key: &[u8]) -> bool {
        self.disown(key);
        self.kv_take(key).is_some()
    }

    fn add(&mut self, key: Vec<u8>, delta: i64) -> Result<i64, ConnEnd> {
        let old = match self.kv.get(&key) {
            Some(v) => parse_counter(v).ok_or(ConnEnd::NotACounter)?,
            None => 0,
        };
        let new = old.checked_add(delta).ok_or(ConnEnd::NotACounter)?;
        self.set(key, new.to_string().into_bytes());
        Ok(new)
    }

    /// RENEW: [`State::add`] by one, remembered as renewed for the next sweep.
    fn renew(&mut self, key: Vec<u8>) -> Result<(), ConnEnd> {
        self.add(key.clone(), 1)?;
        self.renewed.insert(key, true);
        Ok(())
    }

    /// SWEEP: the renewed counters under `prefix` not renewed since the previous sweep; every
    /// one under it starts the next period unrenewed. Counters deleted since, or set to 0 or
    /// less (an agent that left says so), are forgotten until renewed again.
    fn sweep(&mut self, prefix: &[u8]) -> Vec<Vec<u8>> {
        let kv = &self.kv;
        let mut stale = Vec::new();
        let mut gone = Vec::new();
        for (k, fresh) in self.renewed.range_mut(prefix.to_vec()..) {
            if !k.starts_with(prefix) {
                break;
            }
            let counting = kv
                .get(k)
                .and_then(|v| parse_counter(v))
                .is_some_and(|c| c > 0);
            if !counting {
                gone.push(k.clone());
            } else if !std::mem::replace(fresh, false) {
                stale.push(k.clone());
            }
        }
        for k in gone {
            self.renewed.remove(&k);
        }
        stale
    }

    fn remove_where(&mut self, mut doomed: impl FnMut(&[u8]) -> bool) -> usize {
        let before = self.kv.len() + self.queues.len();
        let mut freed = 0;
        self.kv.retain(|k, v| {
            let gone = doomed(k);
            if gone {
                freed += entry_size(k, v);
            }
            !gone
        });
        self.queues.retain(|k, q| {
            let gone = doomed(k);
            if gone {
                freed += q.iter().map(|v| entry_size(k, v)).sum::<usize>();
            }
            !gone
        });
        self.bytes -= freed;
        let removed = before - self.kv.len() - self.queues.len();
        let kv = &self.kv;
        self.lease_owner.retain(|k, _| kv.contains_key(k));
        self.renewed.retain(|k, _| kv.contains_key(k));
        removed
    }

    /// Settles the leases of a connection that ended: deletes the keys it
    /// still owns and reports every key it had set.
    fn release_leases(&mut self, leases: ConnLeases) {
        let mut keys: Vec<Vec<u8>> = leases.keys.into_iter().collect();
        keys.sort();
        for key in keys {
            let name = String::from_utf8_lossy(&key[LEASE_PREFIX.len()..]).into_owned();
            let event = if self.lease_owner.get(&key) == Some(&leases.id) {
                self.lease_owner.remove(&key);
                // A deletion: nobody is woken.
                match self.kv_take(&key) {
                    Some(value) => LeaseEvent::Lost { key: name, value },
                    None => LeaseEvent::Released { key: name },
                }
            } else {
                LeaseEvent::Released { key: name }
            };
            // Sent under the lock so that events are in key-space order.
            if let Some(tx) = &self.lease_tx {
                let _ = tx.send(event);
            }
        }
    }
}

/// Told why a connection was closed for misbehaving: the peer and the reason.
pub type DropNotice = Arc<dyn Fn(SocketAddr, &str) + Send + Sync>;

pub(crate) struct Shared {
    state: Mutex<State>,
    /// With a secret, only connections that proved they hold it may use `/vigil/` keys.
    secret: Mutex<Option<Arc<[u8]>>>,
    max_total: AtomicUsize,
    /// Connection buffers charged against `max_total`.
    buffered: AtomicUsize,
    on_drop: Mutex<Option<DropNotice>>,
    next_wait_id: AtomicU64,
    next_lease_owner_id: AtomicU64,
    /// Set before the server aborts its connections: leases are then left alone.
    shutting_down: AtomicBool,
    connections: AtomicUsize,
    protocol_drops: AtomicU64,
    last_drop: Mutex<Option<String>>,
}

impl Shared {
    fn new() -> Shared {
        Shared {
            state: Mutex::new(State::default()),
            secret: Mutex::new(None),
            max_total: AtomicUsize::new(DEFAULT_MAX_TOTAL),
            buffered: AtomicUsize::new(0),
            on_drop: Mutex::new(None),
            next_wait_id: AtomicU64::new(1),
            next_lease_owner_id: AtomicU64::new(1),
            shutting_down: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            protocol_drops: AtomicU64::new(0),
            last_drop: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No handler panics while holding the lock; if one did, the map is
        // still structurally sound, so keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A handle on the server's key space, for the agent that hosts the store:
/// reset it between attempts, inspect it, or read and write keys without a
/// TCP round trip. Cheap to clone.
#[derive(Clone)]
pub struct KeySpace {
    shared: Arc<Shared>,
}

impl KeySpace {
    /// Deletes every key and queue except those under [`AGENT_PREFIX`]
    /// (`/vigil/`): a new attempt of the job starts from a clean key space
    /// while the agents keep their own bookkeeping. Returns how many entries
    /// were removed. Parked waiters stay parked (they are released when the
    /// new attempt creates their keys).
    pub fn reset(&self) -> usize {
        self.reset_except(AGENT_PREFIX)
    }

    /// Deletes every key and queue whose raw name does not start with `keep`.
    pub fn reset_except(&self, keep: &[u8]) -> usize {
        self.shared.lock().remove_where(|k| !k.starts_with(keep))
    }

    /// Deletes every key and queue whose raw name starts with `prefix`.
    pub fn clear_prefix(&self, prefix: &[u8]) -> usize {
        self.shared.lock().remove_where(|k| k.starts_with(prefix))
    }

    /// Reads a raw key (no `/` is added).
    pub fn get_raw(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.shared.lock().kv.get(key).cloned()
    }

    /// Writes a raw key (no `/` is added), releasing its waiters.
    pub fn set_raw(&self, key: &[u8], value: &[u8]) {
        self.shared.lock().set(key.to_vec(), value.to_vec());
    }

    /// All raw key names, sorted.
    pub fn keys_raw(&self) -> Vec<Vec<u8>> {
        let mut keys: Vec<Vec<u8>> = self.shared.lock().kv.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// Why the most recent connection dropped for a protocol violation was dropped.
    pub fn last_protocol_error(&self) -> Option<String> {
        self.shared
            .last_drop
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn stats(&self) -> StoreStats {
        let st = self.shared.lock();
        StoreStats {
            keys: st.kv.len(),
            queues: st.queues.values().filter(|q| !q.is_empty()).count(),
            pending_waits: st.waits.len(),
            connections: self.shared.connections.load(Ordering::Relaxed),
            dropped_for_protocol_errors: self.shared.protocol_drops.load(Ordering::Relaxed),
            stored_bytes: st.bytes,
            buffered_bytes: self.shared.buffered.load(Ordering::Relaxed),
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

    /// Subscribes to lease events (see [`LEASE_PREFIX`]): one
    /// [`LeaseEvent`] per lease key that a connection had set, when that
    /// connection ends other than by the server shutting down. Call before
    /// [`spawn`](StoreServer::spawn) or [`serve`](StoreServer::serve). There is
    /// one subscriber: a second call replaces the first (whose receiver then
    /// ends). Without a subscriber, lost leases are still deleted, silently.
    pub fn lease_events(&mut self) -> mpsc::UnboundedReceiver<LeaseEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.shared.lock().lease_tx = Some(tx);
        rx
    }

    /// With `Some(t)`, every accepted connection gets TCP keepalive and
    /// `TCP_USER_TIMEOUT` so that a peer that vanishes without closing (host
    /// lost, network cut) is detected after roughly `t` (see
    /// [`set_peer_timeout`]); its connection then ends with an I/O error,
    /// which releases its leases. `None` (the default) leaves the system
    /// defaults. Call before [`spawn`](StoreServer::spawn) or
    /// [`serve`](StoreServer::serve).
    pub fn set_peer_timeout(&mut self, t: Option<Duration>) {
        self.peer_timeout = t;
    }

    /// Requires agents to authenticate with `secret` (see [`crate::auth`]):
    /// only connections that did may name keys under [`AGENT_PREFIX`]. `None`
    /// (the default) trusts every connection. Applies to connections
    /// accepted afterwards.
    pub fn set_secret(&mut self, secret: Option<Vec<u8>>) {
        *lock(&self.shared.secret) = secret.map(Arc::from);
    }

    /// Bounds what the server holds (default [`DEFAULT_MAX_TOTAL`]): stored
    /// keys and values plus the buffers of requests and replies in transfer.
    /// A request that would go over it closes its connection.
    pub fn set_max_total(&mut self, bytes: usize) {
        self.shared.max_total.store(bytes, Ordering::Relaxed);
    }

    /// Called (on the server's thread) with the peer and the reason whenever a
    /// connection is closed for a protocol violation, a failed or missing
    /// authentication, or going over a limit.
    pub fn on_drop(&mut self, f: DropNotice) {
        *lock(&self.shared.on_drop) = Some(f);
    }

    /// Serves until this future is dropped (which also closes every
    /// connection it accepted, without settling their leases).
    pub async fn serve(self) {
        let (_tx, rx) = watch::channel(false);
        accept_loop(self.listener, self.shared, self.peer_timeout, rx).await;
    }

    /// Serves on a background task; the handle resets the key space and shuts
    /// the server down.
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

    /// Stops accepting, closes every connection and waits until all of the
    /// server's tasks have finished (the port is free afterwards). Leases are
    /// not settled: no [`LeaseEvent`] is reported and lease keys stay.
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
                    conns.spawn(serve_conn(stream, peer, shared.clone(), peer_timeout));
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
    // Aborting a connection task drops its socket (closing it) and its `Conn`
    // (whose Drop unregisters a parked wait). An aborted task does not reach
    // the end of `serve_conn`, so its leases are not settled.
    conns.shutdown().await;
}

/// A connection's keepalive timing for a peer timeout `t`, with `jitter` in `0..=u16::MAX`
/// drawn per connection: (idle before the first probe, interval between probes, probe count).
///
/// Every connection of a job goes idle at about the same moment (after a rendezvous); probes with
/// one idle time then fire together on every connection, and at 512+ agents the burst overflowed
/// the receive queue and aborted connections (field finding 28). So the idle time is spread over
/// `t/6..t/3` and the interval over `t/12..t/8` (at least 1 s) per connection, and a connection is
/// given enough probes to lose most of them: the kernel ends it only once nothing at all came back
/// for `t` (`TCP_USER_TIMEOUT`, which overrides the count once set).
pub fn keepalive_timing(t: Duration, jitter: u16) -> (Duration, Duration, u32) {
    let frac = f64::from(jitter) / f64::from(u16::MAX);
    let secs = t.as_secs_f64();
    let whole = |s: f64| Duration::from_secs((s.round() as u64).clamp(1, 32767));
    let idle = whole(secs / 6.0 + frac * secs / 6.0);
    let interval = whole(secs / 12.0 + frac * secs / 24.0);
    let left = t.saturating_sub(idle).as_secs_f64();
    let count = ((left / interval.as_secs_f64()).ceil() as u32)
        .saturating_add(1)
        .clamp(3, 127);
    (idle, interval, count)
}

/// A per-connection jitter in `0..=u16::MAX` from the connection's two ports, which differ between
/// connections and spread evenly; no randomness needed.
fn connection_jitter(stream: &TcpStream) -> u16 {
    let port = |a: io::Result<SocketAddr>| a.map(|a| a.port()).unwrap_or(0);
    let (l, p) = (port(stream.local_addr()), port(stream.peer_addr()));
    // Multiplicative hashing (Knuth): neighbouring ports land far apart.
    let h = (u32::from(l) << 16 | u32::from(p)).wrapping_mul(0x9E37_79B1);
    (h >> 16) as u16
}

/// Applies the peer-timeout socket options to a connected TCP socket:
/// `SO_KEEPALIVE` on with [`keepalive_timing`] (the idle time and interval spread per
/// connection, many probes), and on Linux `TCP_USER_TIMEOUT` = `t` in milliseconds (at least
/// 1 ms, at most `i32::MAX` ms, about 24.8 days). A peer that stops answering (no FIN, no RST)
/// then fails the connection after roughly `t`: idle connections through the keepalive probes,
/// connections with unacknowledged data through the user timeout; a lost probe or two does not.
/// Used by [`StoreServer::set_peer_timeout`] and
/// [`StoreClient::set_peer_timeout`](crate::StoreClient::set_peer_timeout).
pub fn set_peer_timeout(stream: &TcpStream, t: Duration) -> io::Result<()> {
    let sock = socket2::SockRef::from(stream);
    let (idle, interval, count) = keepalive_timing(t, connection_jitter(stream));
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(interval)
        .with_retries(count);
    sock.set_tcp_keepalive(&keepalive)?;
    // The kernel reads the option as an int and rejects negative values.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    sock.set_tcp_user_timeout(Some(t.clamp(
        Duration::from_millis(1),
        Duration::from_millis(i32::MAX as u64),
    )))?;
    Ok(())
}

/// Why a connection ends.
#[derive(Debug, thiserror::Error)]
enum ConnEnd {
    #[error("I/O error")]
    Io,
    #[error("{0}")]
    Protocol(ProtocolError),
    #[error("first request was not VALIDATE")]
    NotValidated,
    #[error("VALIDATE with a wrong magic number")]
    BadMagic,
    #[error("ADD or BARRIER on a value that is not a decimal counter, or overflow")]
    NotACounter,
    #[error("WAIT or BARRIER while another one is parked on the same connection")]
    WaitAlreadyPending,
    #[error("a request for vigil's control keys (/vigil/...) from a connection that did not authenticate; only vigil agents holding the job's secret may use them")]
    Unauthorized,
    #[error("an agent presented a wrong proof of the job's secret: every node needs the same VIGIL_STORE_SECRET")]
    AuthFailed,
    #[error("AUTH_PROOF without AUTH_CHALLENGE")]
    AuthOutOfOrder,
    #[error("the store is full: this request would take it over its limit of {0} bytes (keys, values and transfers together); store less, or delete keys no longer needed")]
    Full(usize),
    #[error(
        "a reply of more than {MAX_REPLY_LEN} bytes was asked for; ask for fewer keys at a time"
    )]
    ReplyTooLarge,
    #[error("an untagged request on a connection in tagged mode, or a tagged one while an untagged wait is parked; use one mode per connection")]
    MixedModes,
    #[error("WAIT_GET without a tag; it is only served in tagged mode")]
    UntaggedWaitGet,
    #[error("more than {MAX_TAGGED_WAITS} tagged waits parked on one connection")]
    TooManyTags,
    #[error("tag {0} names a wait that is still parked")]
    DuplicateTag(u32),
}

impl From<io::Error> for ConnEnd {
    fn from(_: io::Error) -> ConnEnd {
        ConnEnd::Io
    }
}

struct Conn {
    shared: Arc<Shared>,
    validated: bool,
    /// May use `/vigil/` keys: the server has no secret, or the peer proved it holds it.
    trusted: bool,
    secret: Option<Arc<[u8]>>,
    /// The nonce of the last AUTH_CHALLENGE.
    nonce: Option<[u8; auth::NONCE_LEN]>,
    /// Bytes of this connection's buffers charged to `Shared::buffered`.
    charged: usize,
    wait: Option<u64>,
    tx: mpsc::UnboundedSender<u64>,
    /// Lease keys this connection has set (allocated on the first one).
    leases: Option<Box<ConnLeases>>,
    /// Set by the first tagged request: from then on only tagged requests are served.
    tagged: bool,
    /// Parked tagged waits: wait id -> what answers it.
    tag_waits: HashMap<u64, TagWait>,
    /// The tag of each parked tagged wait -> its wait id (a tagged CANCEL_WAIT names the tag).
    tag_ids: HashMap<u32, u64>,
}

struct ConnLeases {
    /// This connection's id in [`State::lease_owner`].
    id: u64,
    /// Every lease key it has stored, whether or not it still owns it.
    keys: HashSet<Vec<u8>>,
}

/// A connection's lease bookkeeping, borrowed apart from its `shared` (whose
/// lock is held while it is used).
struct ConnLeaseSlot<'a> {
    leases: &'a mut Option<Box<ConnLeases>>,
    ids: &'a AtomicU64,
}

impl ConnLeaseSlot<'_> {
    /// Records that the connection stored lease `key`; returns its owner id.
    fn own(&mut self, key: &[u8]) -> u64 {
        let ids = self.ids;
        let leases = self.leases.get_or_insert_with(|| {
            Box::new(ConnLeases {
                id: ids.fetch_add(1, Ordering::Relaxed),
                keys: HashSet::new(),
            })
        });
        if !leases.keys.contains(key) {
            leases.keys.insert(key.to_vec());
        }
        leases.id
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.wait.is_some() || !self.tag_waits.is_empty() {
            let mut st = self.shared.lock();
            for id in self
                .wait
                .take()
                .into_iter()
                .chain(self.tag_waits.keys().copied())
            {
                st.cancel_wait(id);
            }
        }
        self.shared
            .buffered
            .fetch_sub(self.charged, Ordering::Relaxed);
        self.shared.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn serve_conn(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    peer_timeout: Option<Duration>,
) {
    let _ = stream.set_nodelay(true);
    if let Some(t) = peer_timeout {
        // Best effort, like TCP_NODELAY: the connection works without it.
        let _ = set_peer_timeout(&stream, t);
    }
    shared.connections.fetch_add(1, Ordering::Relaxed);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let secret = lock(&shared.secret).clone();
    let mut conn = Conn {
        shared: shared.clone(),
        validated: false,
        trusted: secret.is_none(),
        secret,
        nonce: None,
        charged: 0,
        wait: None,
        tx,
        leases: None,
        tagged: false,
        tag_waits: HashMap::new(),
        tag_ids: HashMap::new(),
    };
    let (mut rd, mut wr) = stream.into_split();
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK_MIN);
    let mut out: Vec<u8> = Vec::with_capacity(256);
    let mut need = 1usize;

    let end: Result<(), ConnEnd> = async {
        loop {
            let mut failed = None;
            if buf.len() >= need {
                let mut off = 0;
                loop {
                    match parse_request(&buf[off..]) {
                        Ok(Parsed::Complete(req, n)) => {
                            off += n;
                            if let Err(e) = conn.handle(req, &mut rx, &mut out) {
                                failed = Some(e);
                                break;
                            }
                            if out.len() >= OUT_FLUSH {
                                // Written (the client reading it) before parsing on.
                                break;
                            }
                        }
                        Ok(Parsed::Incomplete(n)) => {
                            need = n;
                            break;
                        }
                        Err(e) => {
                            failed = Some(ConnEnd::Protocol(e));
                            break;
                        }
                    }
                }
                buf.drain(..off);
            }
            // Answer every request before a bad one, then hang up.
            if !out.is_empty() {
                conn.charge(buf.capacity() + out.capacity())?;
                wr.write_all(&out).await?;
                out.clear();
                if out.capacity() > FREE_BUFFER {
                    out.shrink_to(FREE_BUFFER);
                }
            }
            if let Some(e) = failed {
                return Err(e);
            }
            if buf.len() >= need {
                // More complete requests are buffered (the replies were flushed first).
                continue;
            }
            if buf.capacity() > FREE_BUFFER && need <= FREE_BUFFER {
                buf.shrink_to(FREE_BUFFER);
            }
            let spare = buf.capacity() - buf.len();
            if spare < READ_CHUNK_MIN {
                let want = need
                    .saturating_sub(buf.len())
                    .clamp(READ_CHUNK_MIN, READ_CHUNK_MAX);
                buf.reserve(want);
            }
            conn.charge(buf.capacity() + out.capacity())?;
            if conn.wait.is_none() && conn.tag_waits.is_empty() {
                // Wake-ups are only ever sent for a parked wait: just read.
                if rd.read_buf(&mut buf).await? == 0 {
                    return Ok(());
                }
                continue;
            }
            tokio::select! {
                Some(id) = rx.recv() => conn.woken(id, &mut out),
                r = rd.read_buf(&mut buf) => {
                    if r? == 0 {
                        return Ok(());
                    }
                }
            }
        }
    }
    .await;

    drop(buf);
    drop(out);
    conn.charge(0).ok();
    match end {
        Ok(()) | Err(ConnEnd::Io) => {}
        Err(e) => {
            shared.protocol_drops.fetch_add(1, Ordering::Relaxed);
            let why = e.to_string();
            if let Some(f) = lock(&shared.on_drop).clone() {
                f(peer, &why);
            }
            *lock(&shared.last_drop) = Some(why);
        }
    }
    // Only a connection that ended by itself gets here (an aborted task is
    // dropped at an await point), but a shutdown may race with its end.
    if let Some(leases) = conn.leases.take() {
        if !shared.shutting_down.load(Ordering::SeqCst) {
            shared.lock().release_leases(*leases);
        }
    }
    // Dropping the halves closes the socket; dropping `conn` unregisters a wait.
}

impl Conn {
    /// Charges this connection's buffers (`cap` bytes in all, the first
    /// [`FREE_BUFFER`] free) against the server's total.
    fn charge(&mut self, cap: usize) -> Result<(), ConnEnd> {
        let want = cap.saturating_sub(FREE_BUFFER);
        let buffered = &self.shared.buffered;
        if want <= self.charged {
            buffered.fetch_sub(self.charged - want, Ordering::Relaxed);
            self.charged = want;
            return Ok(());
        }
        let more = want - self.charged;
        let before = buffered.fetch_add(more, Ordering::Relaxed);
        self.charged = want;
        let max = self.shared.max_total.load(Ordering::Relaxed);
        let stored = self.shared.lock().bytes;
        if before + more + stored > max {
            return Err(ConnEnd::Full(max));
        }
        Ok(())
    }

    /// Refuses a write that would take the stored bytes over the limit.
    fn admit(&self, st: &State, growth: usize) -> Result<(), ConnEnd> {
        let max = self.shared.max_total.load(Ordering::Relaxed);
        // The buffer holding this very request is about to be freed: not counted.
        if st.bytes + growth > max {
            return Err(ConnEnd::Full(max));
        }
        Ok(())
    }

    fn woken(&mut self, id: u64, out: &mut Vec<u8>) {
        if self.wait == Some(id) {
            self.wait = None;
            out.push(WAIT_STOP_WAITING);
            return;
        }
        self.woken_tagged(id, out);
    }

    /// Refuses a request for `/vigil/` keys from a connection that did not authenticate.
    fn allowed(&self, req: &Request) -> Result<(), ConnEnd> {
        if !self.trusted && req.keys().iter().any(|k| k.starts_with(AGENT_PREFIX)) {
            return Err(ConnEnd::Unauthorized);
        }
        Ok(())
    }

    fn park(
        &mut self,
        st: &mut State,
        keys: Vec<Vec<u8>>,
        out: &mut Vec<u8>,
    ) -> Result<(), ConnEnd> {
        if self.wait.is_some() {
            return Err(ConnEnd::WaitAlreadyPending);
        }
        let id = self.shared.next_wait_id.fetch_add(1, Ordering::Relaxed);
        if st.register_wait(id, keys, &self.tx) {
            out.push(WAIT_STOP_WAITING);
        } else {
            self.wait = Some(id);
        }
        Ok(())
    }

    fn handle(
        &mut self,
        req: Request,
        rx: &mut mpsc::UnboundedReceiver<u64>,
        out: &mut Vec<u8>,
    ) -> Result<(), ConnEnd> {
        match req {
            Request::Tagged { tag, inner } => self.tagged(tag, *inner, rx, out),
            _ if self.tagged => Err(ConnEnd::MixedModes),
            req => self.plain(req, rx, out),
        }
    }

    /// Serves one request, its reply appended to `out` as torch's server writes it.
    fn plain(
        &mut self,
        req: Request,
        rx: &mut mpsc::UnboundedReceiver<u64>,
        out: &mut Vec<u8>,
    ) -> Result<(), ConnEnd> {
        if let Request::Validate { magic } = req {
            if magic != VALIDATION_MAGIC {
                return Err(ConnEnd::BadMagic);
            }
            self.validated = true;
            return Ok(());
        }
        if !self.validated {
            return Err(ConnEnd::NotValidated);
        }
        self.allowed(&req)?;
        match req {
            Request::Validate { .. } => unreachable!("handled above"),
            Request::Tagged { .. } => unreachable!("handled by handle"),
            Request::WaitGet { .. } => return Err(ConnEnd::UntaggedWaitGet),
            Request::AuthChallenge => {
                let nonce = auth::random::<{ auth::NONCE_LEN }>()?;
                out.push(self.secret.is_some() as u8);
                out.extend_from_slice(&nonce);
                self.nonce = Some(nonce);
            }
            Request::AuthProof { proof } => {
                let nonce = self.nonce.take().ok_or(ConnEnd::AuthOutOfOrder)?;
                match &self.secret {
                    Some(secret) if !auth::verify(secret, &nonce, &proof) => {
                        out.push(0);
                        return Err(ConnEnd::AuthFailed);
                    }
                    _ => {
                        self.trusted = true;
                        out.push(1);
                    }
                }
            }
            Request::Ping { nonce } => out.extend_from_slice(&nonce.to_le_bytes()),
            Request::Set { key, value } => {
                let shared = self.shared.clone();
                let mut st = shared.lock();
                self.admit(&st, st.growth(&key, value.len()))?;
                let mut slot = ConnLeaseSlot {
                    leases: &mut self.leases,
                    ids: &self.shared.next_lease_owner_id,
                };
                st.set_by(&mut slot, key, value);
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                let shared = self.shared.clone();
                let mut st = shared.lock();
                self.admit(&st, st.growth(&key, desired.len()))?;
                let mut slot = ConnLeaseSlot {
                    leases: &mut self.leases,
                    ids: &self.shared.next_lease_owner_id,
                };
                match st.kv.get(&key) {
                    // torch: a missing key is created only when `expected` is
                    // empty; otherwise the reply is `expected` and nothing changes.
                    None if expected.is_empty() => {
                        put_bytes(out, &desired);
                        st.set_by(&mut slot, key, desired);
                    }
                    None => put_bytes(out, &expected),
                    Some(cur) if *cur == expected => {
                        put_bytes(out, &desired);
                        st.set_by(&mut slot, key, desired);
                    }
                    Some(cur) => put_bytes(out, cur),
                }
            }
            Request::Get { key } => {
                let st = self.shared.lock();
                put_bytes(out, st.kv.get(&key).map_or(&[][..], |v| v));
            }
            Request::Add { key, delta } => {
                let shared = self.shared.clone();
                let mut st = shared.lock();
                self.admit(&st, st.growth(&key, 20))?;
                let v = st.add(key, delta)?;
                put_i64(out, v);
            }
            Request::Check { keys } => {
                let st = self.shared.lock();
                let ready = keys.iter().all(|k| st.present(k));
                out.push(if ready { CHECK_READY } else { CHECK_NOT_READY });
            }
            Request::Wait { keys } => {
                let shared = self.shared.clone();
                let mut st = shared.lock();
                self.park(&mut st, keys, out)?;
            }
            Request::GetNumKeys => {
                let st = self.shared.lock();
                let n = if self.trusted {
                    st.kv.len()
                } else {
                    st.kv
                        .keys()
                        .filter(|k| !k.starts_with(AGENT_PREFIX))
                        .count()
                };
                put_i64(out, n as i64);
            }
            Request::DeleteKey { key } => {
                let removed = self.shared.lock().delete(&key);
                put_i64(out, removed as i64);
            }
            Request::Append { key, value } => {
                let shared = self.shared.clone();
                let mut st = shared.lock();
                let old = st.kv.get(&key).map_or(0, Vec::len);
                if old + value.len() > MAX_VALUE_LEN as usize {
                    return Err(ConnEnd::Protocol(ProtocolError::ValueTooLong(
                        (old + value.len()) as u64,
                    )));
                }
                self.admit(&st, st.growth(&key, old + value.len()))?;
                st.disown(&key);
                st.wake_all(&key);
                let mut v = st.kv_take(&key).unwrap_or_default();
                v.extend_from_slice(&value);
                st.kv_put(key, v);
            }
            Request::MultiGet { keys } => {
                let st = self.shared.lock();
                let size: usize = keys
                    .iter()
                    .map(|k| 8 + st.kv.get(k).map_or(0, Vec::len))
                    .sum();
                if size > MAX_REPLY_LEN {
                    return Err(ConnEnd::ReplyTooLarge);
                }
                for k in &keys {
                    put_bytes(out, st.kv.get(k).map_or(&[][..], |v| v));
                }
            }
            Request::MultiSet { pairs } => {
                let shared = self.shared.clone();
                let mut st = shared.lock();
                let growth = pairs.iter().map(|(k, v)| st.growth(k, v.len())).sum();
                self.admit(&st, growth)?;
                let mut slot = ConnLeaseSlot {
                    leases: &mut self.leases,
                    ids: &self.shared.next_lease_owner_id,
                };
                for (k, v) in pairs {
                    st.set_by(&mut slot, k, v);
                }
            }
            Request::CancelWait => {
                if let Some(id) = self.wait.take() {
                    let still_pending = self.shared.lock().cancel_wait(id);
                    if !still_pending {
                        // Released before the cancel: the wake-up was sent under
                        // the lock, so it is already in the channel. Answer it
                        // first, as torch's client expects.
                        while let Ok(fired) = rx.try_recv() {
                            if fired == id {
                                out.push(WAIT_STOP_WAITING);
                            }
                        }
                    }
                }
                out.push(WAIT_CANCELED);
            }
            Request::QueuePush { key, value } => {
                let shared = self.shared.clone();
                let mut st = shared.lock();
                let size = entry_size(&key, &value);
                self.admit(&st, size)?;
                st.bytes += size;
                st.queues.entry(key.clone()).or_default().push_back(value);
                st.wake_one(&key);
            }
            Request::QueuePop { key } => {
                let mut st = self.shared.lock();
                match st.queues.get_mut(&key) {
                    Some(q) if !q.is_empty() => {
                        put_i64(out, q.len() as i64);
                        let v = q.pop_front().expect("non-empty");
                        put_bytes(out, &v);
                        if q.is_empty() {
                            st.queues.remove(&key);
                        }
                        st.bytes -= entry_size(&key, &v);
                    }
                    _ => put_i64(out, 0),
                }
            }
            Request::QueueLen { key } => {
                let n = self.shared.lock().queues.get(&key).map_or(0, |q| q.len());
                put_i64(out, n as i64);
            }
            Request::ListKeys => {
                let st = self.shared.lock();
                let visible = |k: &&Vec<u8>| self.trusted || !k.starts_with(AGENT_PREFIX);
                put_i64(out, st.kv.keys().filter(visible).count() as i64);
                for k in st.kv.keys().filter(visible) {
                    put_bytes(out, k);
                }
            }
            Request::Join {
                key,
                value,
                counter,
            } => {
                let shared = self.shared.clone();
                let mut st = shared.lock();
                self.admit(&st, st.growth(&key, value.len()) + st.growth(&counter, 20))?;
                let mut slot = ConnLeaseSlot {
                    leases: &mut self.leases,
                    ids: &self.shared.next_lease_owner_id,
                };
                st.set_by(&mut slot, key, value);
                let v = st.add(counter, 1)?;
                put_i64(out, v);
            }
            Request::Renew { key } => {
                let shared = self.shared.clone();
                let mut st = shared.lock();
                self.admit(&st, st.growth(&key, 20))?;
                st.renew(key)?;
            }
            Request::Sweep { prefix } => {
                let stale = self.shared.lock().sweep(&prefix);
                let size: usize = stale.iter().map(|k| 8 + k.len()).sum();
                if size > MAX_REPLY_LEN {
                    return Err(ConnEnd::ReplyTooLarge);
                }
                put_i64(out, stale.len() as i64);
                for k in &stale {
                    put_bytes(out, k);
                }
            }
            Request::Barrier { key, world_size } => {
                if self.wait.is_some() {
                    return Err(ConnEnd::WaitAlreadyPending);
                }
                let shared = self.shared.clone();
                let mut st = shared.lock();
                self.admit(&st, st.growth(&key, 20))?;
                let count = match st.kv.get(&key) {
                    Some(v) => parse_counter(v)
                        .and_then(|c| c.checked_add(1))
                        .ok_or(ConnEnd::NotACounter)?,
                    None => 1,
                };
                st.disown(&key);
                st.kv_put(key.clone(), count.to_string().into_bytes());
                if count >= world_size {
                    st.wake_all(&key);
                    out.push(WAIT_STOP_WAITING);
                } else {
                    // Parked on a key that exists: released by the last arrival
                    // (or any other write of the key, as in torch).
                    let id = self.shared.next_wait_id.fetch_add(1, Ordering::Relaxed);
                    st.waiting.entry(key.clone()).or_default().push_back(id);
                    st.waits.insert(
                        id,
                        Waiter {
                            remaining: 1,
                            keys: vec![key],
                            tx: self.tx.clone(),
                        },
                    );
                    self.wait = Some(id);
                }
            }
        }
        Ok(())
    }
}

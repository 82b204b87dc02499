//! [`MuxClient`]: one connection carrying many requests at once, in vigil's tagged mode
//! (docs/store.md, "Tagged mode").
//!
//! Every request goes out as `TAGGED tag <request>`; the server answers each with a frame
//! `tag, length, reply`, in whatever order the replies are ready, and parks a WAIT or WAIT_GET
//! under its tag alone, so one connection holds all of an agent's waits and still serves its
//! other requests. A background task reads the frames and hands each to the call that sent its
//! tag; another writes what the calls queue, whole frames only, so a call dropped half way never
//! corrupts the stream (a dropped or timed-out wait sends a tagged CANCEL_WAIT for its tag).
//!
//! Only vigil's server speaks this; torch's does not (use [`StoreClient`] there).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::client::{user_key, user_keys, Result, StoreClient, StoreError};
use crate::protocol::{
    Opcode, Request, CHECK_NOT_READY, CHECK_READY, MAX_VALUE_LEN, WAIT_STOP_WAITING,
};

/// Largest reply frame accepted: the server's largest reply and then some.
const MAX_FRAME: u64 = crate::server::MAX_REPLY_LEN as u64 + MAX_VALUE_LEN;
/// Frames queued by the calls are written in batches of up to this many bytes.
const WRITE_BATCH: usize = 256 * 1024;

/// A connection to vigil's store in tagged mode. Cheap to clone: every clone shares the one
/// connection, and its methods take `&self`, so many tasks may call at once. The connection
/// closes when the last clone is dropped. When it dies (the store closed it, an I/O error),
/// every call waiting on it fails with that error and every later call fails at once.
#[derive(Clone)]
pub struct MuxClient {
    inner: Arc<Inner>,
}

struct Inner {
    peer: SocketAddr,
    timeout: Duration,
    link: Arc<Link>,
    out: mpsc::UnboundedSender<Vec<u8>>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Both halves dropped: the socket closes (and the server settles its leases).
        self.reader.abort();
        self.writer.abort();
    }
}

/// What the calls and the reader share.
struct Link {
    state: Mutex<Calls>,
}

#[derive(Default)]
struct Calls {
    next_tag: u32,
    /// Tag -> the call waiting for its reply.
    waiting: HashMap<u32, oneshot::Sender<Vec<u8>>>,
    /// Why the connection died, once it did.
    dead: Option<(io::ErrorKind, String)>,
}

impl Calls {
    /// Why the connection died, as the error every call gets; `None` while it lives.
    fn died(&self) -> Option<StoreError> {
        let (kind, text) = self.dead.as_ref()?;
        Some(StoreError::Io(io::Error::new(*kind, text.clone())))
    }
}

impl Link {
    fn lock(&self) -> MutexGuard<'_, Calls> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends every call in flight (their senders dropped) and all later ones with `why`.
    fn kill(&self, why: &io::Error) {
        let mut c = self.lock();
        if c.dead.is_none() {
            let text = if why.kind() == io::ErrorKind::UnexpectedEof {
                "the store closed the connection".to_string()
            } else {
                why.to_string()
            };
            c.dead = Some((why.kind(), text));
        }
        c.waiting.clear();
    }

    fn dead_error(&self) -> StoreError {
        self.lock().died().unwrap_or(StoreError::Broken)
    }

    /// A fresh tag and the receiver of its reply; fails at once on a dead connection.
    fn register(&self) -> Result<(u32, oneshot::Receiver<Vec<u8>>)> {
        let mut c = self.lock();
        if let Some(e) = c.died() {
            return Err(e);
        }
        let (tx, rx) = oneshot::channel();
        loop {
            let tag = c.next_tag;
            c.next_tag = c.next_tag.wrapping_add(1);
            if let std::collections::hash_map::Entry::Vacant(e) = c.waiting.entry(tag) {
                e.insert(tx);
                return Ok((tag, rx));
            }
        }
    }
}

/// A call in flight: dropped (answered, timed out or abandoned), it forgets its tag; a wait
/// not answered also cancels itself on the server.
struct InFlight<'a> {
    client: &'a MuxClient,
    tag: u32,
    cancel: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let link = &self.client.inner.link;
        let unanswered = link.lock().waiting.remove(&self.tag).is_some();
        if self.cancel && unanswered {
            // Its answer, if already on the way, is ignored (no call waits for the tag).
            let _ = self
                .client
                .inner
                .out
                .send(frame(self.tag, &Request::CancelWait));
        }
    }
}

fn frame(tag: u32, req: &Request) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(Opcode::Tagged as u8);
    out.extend_from_slice(&tag.to_le_bytes());
    req.encode(&mut out);
    out
}

fn protocol(op: &str, what: impl std::fmt::Display) -> StoreError {
    StoreError::Protocol(format!("{op}: {what}"))
}

fn reply_i64(op: &str, b: &[u8]) -> Result<i64> {
    let b: [u8; 8] = b
        .try_into()
        .map_err(|_| protocol(op, format_args!("a reply of {} bytes", b.len())))?;
    Ok(i64::from_le_bytes(b))
}

/// Splits `n` length-prefixed byte strings off `b`.
fn reply_values(op: &str, mut b: &[u8], n: usize) -> Result<Vec<Vec<u8>>> {
    let mut vals = Vec::with_capacity(n.min(b.len() / 8));
    for _ in 0..n {
        let (len, rest) = b
            .split_first_chunk::<8>()
            .ok_or_else(|| protocol(op, "a reply cut short"))?;
        let len = u64::from_le_bytes(*len);
        if len > rest.len() as u64 {
            return Err(protocol(op, "a reply cut short"));
        }
        let (v, rest) = rest.split_at(len as usize);
        vals.push(v.to_vec());
        b = rest;
    }
    if !b.is_empty() {
        return Err(protocol(op, "a reply longer than asked for"));
    }
    Ok(vals)
}

/// A key list: `i64` count, then the keys (LIST_KEYS, SWEEP).
fn reply_keys(op: &str, b: &[u8]) -> Result<Vec<Vec<u8>>> {
    let (n, rest) = b
        .split_first_chunk::<8>()
        .ok_or_else(|| protocol(op, "a reply cut short"))?;
    let n = i64::from_le_bytes(*n);
    if !(0..=(rest.len() / 8) as i64).contains(&n) {
        return Err(protocol(op, format_args!("a count of {n}")));
    }
    reply_values(op, rest, n as usize)
}

fn reply_value(op: &str, b: &[u8]) -> Result<Vec<u8>> {
    Ok(reply_values(op, b, 1)?.pop().expect("one value"))
}

impl MuxClient {
    /// Connects like [`StoreClient::connect`] (retries, VALIDATE, PING), proves `secret` like
    /// [`StoreClient::authenticate`], and turns the connection to tagged mode.
    pub async fn connect(
        addr: SocketAddr,
        timeout: Duration,
        secret: Option<&[u8]>,
    ) -> Result<MuxClient> {
        let mut c = StoreClient::connect(addr, timeout).await?;
        c.authenticate(secret).await?;
        MuxClient::from_client(c)
    }

    /// Takes over `client`'s connection (validated, authenticated and with its socket options
    /// set as the caller wants): from now on it is in tagged mode. `client`'s default timeout
    /// becomes this one's. Spawns its reader and writer with `tokio::spawn` (a current-thread
    /// runtime, with or without a `LocalSet`, runs them).
    pub fn from_client(client: StoreClient) -> Result<MuxClient> {
        let peer = client.peer_addr();
        let timeout = client.timeout();
        let (rd, wr) = client.into_stream()?.into_split();
        let link = Arc::new(Link {
            state: Mutex::new(Calls::default()),
        });
        let (out, queued) = mpsc::unbounded_channel();
        let reader = tokio::spawn(read_replies(BufReader::new(rd), link.clone()));
        let writer = tokio::spawn(write_requests(wr, queued, link.clone()));
        Ok(MuxClient {
            inner: Arc::new(Inner {
                peer,
                timeout,
                link,
                out,
                reader,
                writer,
            }),
        })
    }

    pub fn peer_addr(&self) -> SocketAddr {
        self.inner.peer
    }

    /// The default timeout of operations (the connect timeout).
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// True once the connection died: every call fails.
    pub fn is_dead(&self) -> bool {
        self.inner.link.lock().dead.is_some()
    }

    /// Sends `req` tagged and waits up to `timeout` for its reply's bytes. `cancel`: a wait,
    /// cancelled on the server when this is dropped or times out unanswered.
    async fn request(
        &self,
        op: &'static str,
        req: &Request,
        timeout: Duration,
        cancel: bool,
    ) -> Result<Vec<u8>> {
        let link = &self.inner.link;
        let (tag, rx) = link.register()?;
        let _in_flight = InFlight {
            client: self,
            tag,
            cancel,
        };
        self.inner
            .out
            .send(frame(tag, req))
            .map_err(|_| link.dead_error())?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(bytes)) => Ok(bytes),
            Ok(Err(_)) => Err(link.dead_error()),
            Err(_) => Err(StoreError::Timeout { op, timeout }),
        }
    }

    /// vigil's JOIN: SETs `key` to `value`, then adds 1 to the counter `counter`, in one
    /// request (the record first, then the count that says it is there). Returns the count.
    pub async fn join(&self, key: &str, value: &[u8], counter: &str) -> Result<i64> {
        let req = Request::Join {
            key: user_key(key),
            value: value.to_vec(),
            counter: user_key(counter),
        };
        reply_i64(
            "join",
            &self
                .request("join", &req, self.inner.timeout, false)
                .await?,
        )
    }

    /// Sends any request answered at once (not WAIT or WAIT_GET: see [`MuxClient::wait`])
    /// and returns its reply's bytes as the server wrote them; keys are sent as given (raw).
    pub async fn call(&self, req: Request) -> Result<Vec<u8>> {
        self.request("call", &req, self.inner.timeout, false).await
    }

    /// Sends a request that is never answered ([`Request::one_way`]); returns once it is queued.
    pub fn send_one_way(&self, req: Request) -> Result<()> {
        if !req.one_way() {
            return Err(StoreError::Protocol(format!(
                "{:?} is answered: use call",
                req.opcode()
            )));
        }
        let link = &self.inner.link;
        if let Some(e) = link.lock().died() {
            return Err(e);
        }
        // No call waits for its tag: any tag does.
        self.inner
            .out
            .send(frame(0, &req))
            .map_err(|_| link.dead_error())
    }

    /// Sets `key` to `value` (the server confirms it).
    pub async fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let req = Request::Set {
            key: user_key(key),
            value: value.to_vec(),
        };
        let r = self.request("set", &req, self.inner.timeout, false).await?;
        if !r.is_empty() {
            return Err(protocol("set", "a reply to SET"));
        }
        Ok(())
    }

    /// Waits (up to the default timeout) until `key` exists, then reads it: one round trip.
    pub async fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.wait_get(key, self.inner.timeout).await
    }

    /// Waits up to `timeout` until `key` exists, then reads it: one round trip.
    pub async fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.wait_get(key, timeout).await
    }

    /// Parks until `key` exists and returns its value, in one round trip (WAIT_GET);
    /// [`StoreError::Timeout`] after `timeout` (`Duration::MAX`: never). Dropped or timed out,
    /// it is cancelled on the server.
    pub async fn wait_get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let req = Request::WaitGet { key: user_key(key) };
        let r = self.request("wait_get", &req, timeout, true).await?;
        reply_value("wait_get", &r)
    }

    /// Parks until every key exists; [`StoreError::Timeout`] after `timeout` (`Duration::MAX`:
    /// never). Dropped or timed out, it is cancelled on the server.
    pub async fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let req = Request::Wait {
            keys: keys.iter().map(|k| user_key(k)).collect(),
        };
        match self.request("wait", &req, timeout, true).await?[..] {
            [WAIT_STOP_WAITING] => Ok(()),
            ref b => Err(protocol("wait", format_args!("answered {b:?}"))),
        }
    }

    /// Adds `delta` to the decimal counter at `key` (created at 0); returns the new value.
    pub async fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let req = Request::Add {
            key: user_key(key),
            delta,
        };
        reply_i64(
            "add",
            &self.request("add", &req, self.inner.timeout, false).await?,
        )
    }

    /// torch's compare-and-set (see [`StoreClient::compare_set`]); returns the value after it.
    pub async fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let req = Request::CompareSet {
            key: user_key(key),
            expected: expected.to_vec(),
            desired: desired.to_vec(),
        };
        let r = self
            .request("compare_set", &req, self.inner.timeout, false)
            .await?;
        reply_value("compare_set", &r)
    }

    /// True if every key exists (without waiting).
    pub async fn check(&self, keys: &[&str]) -> Result<bool> {
        let req = Request::Check {
            keys: keys.iter().map(|k| user_key(k)).collect(),
        };
        match self
            .request("check", &req, self.inner.timeout, false)
            .await?[..]
        {
            [CHECK_READY] => Ok(true),
            [CHECK_NOT_READY] => Ok(false),
            ref b => Err(protocol("check", format_args!("answered {b:?}"))),
        }
    }

    /// Waits (default timeout) for every key, then reads them in order (as
    /// [`StoreClient::multi_get`]).
    pub async fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        self.wait(keys, self.inner.timeout).await?;
        let req = Request::MultiGet {
            keys: keys.iter().map(|k| user_key(k)).collect(),
        };
        let r = self
            .request("multi_get", &req, self.inner.timeout, false)
            .await?;
        reply_values("multi_get", &r, keys.len())
    }

    /// MULTI_GET without waiting for the keys first: a missing key reads empty (the server's
    /// answer); one round trip, never parked.
    pub async fn multi_get_now(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        let req = Request::MultiGet {
            keys: keys.iter().map(|k| user_key(k)).collect(),
        };
        let r = self
            .request("multi_get", &req, self.inner.timeout, false)
            .await?;
        reply_values("multi_get", &r, keys.len())
    }

    /// vigil's RENEW, one-way (see [`StoreClient::renew`]): queued, never answered.
    pub fn renew(&self, key: &str) -> Result<()> {
        self.send_one_way(Request::Renew { key: user_key(key) })
    }

    /// vigil's SWEEP (see [`StoreClient::sweep`]): the counters under `prefix` not renewed
    /// since the previous sweep, without the leading `/`.
    pub async fn sweep(&self, prefix: &str) -> Result<Vec<String>> {
        let req = Request::Sweep {
            prefix: user_key(prefix),
        };
        let r = self
            .request("sweep", &req, self.inner.timeout, false)
            .await?;
        Ok(user_keys(reply_keys("sweep", &r)?))
    }

    /// Pops the oldest element of the queue `key`, `None` if it is empty (does not wait: park
    /// with [`MuxClient::wait`] on the queue's name first).
    pub async fn queue_pop(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let req = Request::QueuePop { key: user_key(key) };
        let r = self
            .request("queue_pop", &req, self.inner.timeout, false)
            .await?;
        let (n, rest) = r
            .split_first_chunk::<8>()
            .ok_or_else(|| protocol("queue_pop", "a reply cut short"))?;
        if i64::from_le_bytes(*n) <= 0 {
            return Ok(None);
        }
        reply_value("queue_pop", rest).map(Some)
    }

    /// vigil's CLEAR_EXCEPT: deletes every key and queue whose raw name (with its leading `/`,
    /// as [`crate::KeySpace::reset_except`] takes it) does not start with `keep`; how many went.
    pub async fn clear_except(&self, keep: &[u8]) -> Result<i64> {
        let req = Request::ClearExcept {
            prefix: keep.to_vec(),
        };
        let r = self
            .request("clear_except", &req, self.inner.timeout, false)
            .await?;
        reply_i64("clear_except", &r)
    }

    /// vigil's CLEAR_PREFIX: deletes every key and queue whose raw name starts with `prefix`
    /// (as [`crate::KeySpace::clear_prefix`]); how many went.
    pub async fn clear_prefix(&self, prefix: &[u8]) -> Result<i64> {
        let req = Request::ClearPrefix {
            prefix: prefix.to_vec(),
        };
        let r = self
            .request("clear_prefix", &req, self.inner.timeout, false)
            .await?;
        reply_i64("clear_prefix", &r)
    }

    /// The next lost lease a store with a lease queue reports (the queue `vigil/lease_events`,
    /// `StoreServer::set_lease_queue`): parks a tagged WAIT on it, then pops. Returns the
    /// element's bytes (`{"lost": ..., "value": ...}`); `Err(Timeout)` after `timeout`.
    pub async fn next_lease_event(&self, timeout: Duration) -> Result<Vec<u8>> {
        let deadline = tokio::time::Instant::now() + timeout;
        let name = "vigil/lease_events";
        loop {
            if let Some(v) = self.queue_pop(name).await? {
                return Ok(v);
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(StoreError::Timeout {
                    op: "next_lease_event",
                    timeout,
                });
            }
            self.wait(&[name], left).await?;
        }
    }

    /// Deletes `key`; true if it existed.
    pub async fn delete_key(&self, key: &str) -> Result<bool> {
        let req = Request::DeleteKey { key: user_key(key) };
        let r = self
            .request("delete_key", &req, self.inner.timeout, false)
            .await?;
        Ok(reply_i64("delete_key", &r)? == 1)
    }
}

/// Hands every reply frame to the call waiting for its tag (a frame nobody waits for, the
/// answer of a call dropped or timed out, is read and ignored); ends the link on EOF, an I/O
/// error or a frame over [`MAX_FRAME`].
async fn read_replies(mut rd: BufReader<OwnedReadHalf>, link: Arc<Link>) {
    let why = loop {
        let mut head = [0u8; 12];
        if let Err(e) = rd.read_exact(&mut head).await {
            break e;
        }
        let tag = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        let len = u64::from_le_bytes(head[4..].try_into().expect("8 bytes"));
        if len > MAX_FRAME {
            break io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the store sent a reply of {len} bytes"),
            );
        }
        let mut v = vec![0u8; len as usize];
        if let Err(e) = rd.read_exact(&mut v).await {
            break e;
        }
        let call = link.lock().waiting.remove(&tag);
        if let Some(call) = call {
            let _ = call.send(v);
        }
    };
    link.kill(&why);
}

/// Writes the frames the calls queue, several at a time; ends the link on an I/O error.
async fn write_requests(
    mut wr: OwnedWriteHalf,
    mut queued: mpsc::UnboundedReceiver<Vec<u8>>,
    link: Arc<Link>,
) {
    let mut buf = Vec::new();
    while let Some(first) = queued.recv().await {
        buf.clear();
        buf.extend_from_slice(&first);
        while buf.len() < WRITE_BATCH {
            match queued.try_recv() {
                Ok(more) => buf.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        if let Err(e) = wr.write_all(&buf).await {
            link.kill(&e);
            return;
        }
    }
}

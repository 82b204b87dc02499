//! One connection's task: read bytes, cut them into requests, hand each to the core, write what
//! it answers, and deliver the wake-ups and evictions others send. Every rule is the core's.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::{lock, set_peer_timeout, Shared, Signal};
use crate::core::{Effects, End, Role, Session, FREE_BUFFER};
use crate::protocol::{parse_request, Parsed};

/// Largest read-buffer growth per read, so a huge declared length does not make us reserve its
/// full size before the bytes arrive.
const READ_CHUNK_MAX: usize = 1 << 20;
const READ_CHUNK_MIN: usize = 4096;
/// Replies are written once this much has been produced, so that pipelined requests from a
/// client that does not read cannot pile replies up.
const OUT_FLUSH: usize = 256 * 1024;
/// When a connection's end frees this much (parked waits, buffers), the allocator is asked to
/// give freed memory back to the system.
const TRIM_AFTER: usize = 8 << 20;

/// Closes the session in the core however the task ends; an aborted task (server shutdown)
/// settles no leases.
struct Guard {
    shared: Arc<Shared>,
    session: Option<Session>,
}

impl Guard {
    /// Closes the session; how many bytes (parked waits, buffers) that freed.
    fn close(&mut self, settle: bool) -> usize {
        let Some(s) = self.session.take() else {
            return 0;
        };
        let mut hub = self.shared.lock();
        hub.routes.remove(&s.id());
        let before = hub.core.held();
        let fx = hub.core.close(s, settle);
        hub.carry_out(fx);
        before.saturating_sub(hub.core.held())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.close(false);
        self.shared.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Conn {
    shared: Arc<Shared>,
    rx: mpsc::UnboundedReceiver<Signal>,
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    buf: Vec<u8>,
    out: Vec<u8>,
    /// Bytes needed in `buf` before parsing again is useful.
    need: usize,
    /// When the handshake must be complete (while it is not).
    deadline: Option<tokio::time::Instant>,
}

pub(super) async fn serve(
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
    let Ok(nonce) = crate::auth::random::<{ crate::auth::NONCE_LEN }>() else {
        shared.connections.fetch_sub(1, Ordering::Relaxed);
        return;
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let (session, deadline) = {
        let mut hub = shared.lock();
        let (s, fx) = hub.core.open(Instant::now(), nonce);
        let deadline = hub.core.deadline(&s);
        hub.routes.insert(s.id(), tx);
        hub.carry_out(fx);
        (s, deadline)
    };
    let mut guard = Guard {
        shared: shared.clone(),
        session: Some(session),
    };
    let (rd, wr) = stream.into_split();
    let mut conn = Conn {
        shared: shared.clone(),
        rx,
        rd,
        wr,
        buf: Vec::with_capacity(READ_CHUNK_MIN),
        out: Vec::with_capacity(256),
        need: 1,
        deadline: deadline.map(tokio::time::Instant::from_std),
    };
    let s = guard.session.as_mut().expect("open");
    let end = conn.run(s).await;
    let role = s.role();
    drop(conn);
    report(&shared, peer, role, end);
    // Only a connection that ended by itself gets here, but a shutdown may race with its end.
    if guard.close(!shared.shutting_down.load(Ordering::SeqCst)) >= TRIM_AFTER {
        trim();
    }
}

/// Counts a connection turned away in its handshake ([`crate::core::gate::refusal`]), and tells
/// the drop notice why a connection was closed: for misbehaving, or before it completed its
/// handshake. An admitted connection's I/O end is nobody's fault and is not told.
fn report(shared: &Shared, peer: SocketAddr, role: Role, end: Result<(), End>) {
    let refusal = crate::core::gate::refusal(role, &end);
    let why = match (&end, refusal) {
        (Err(e), _) if !e.is_io() => {
            shared.protocol_drops.fetch_add(1, Ordering::Relaxed);
            let why = e.to_string();
            *lock(&shared.last_drop) = Some(why.clone());
            why
        }
        (_, Some(_)) => super::CLOSED_IN_HANDSHAKE.to_string(),
        (_, None) => return,
    };
    if let Some(kind) = refusal {
        lock(&shared.refused).count(kind, peer, &why);
    }
    if let Some(f) = lock(&shared.on_drop).clone() {
        f(peer, refusal, &why);
    }
}

/// Gives memory freed by a connection that held much back to the system (glibc keeps it
/// otherwise, and the store's resident size would stay at its peak).
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Conn {
    async fn run(&mut self, s: &mut Session) -> Result<(), End> {
        loop {
            let failed = self.serve_buffered(s).err();
            // Answer every request before a bad one, then hang up.
            self.flush(s).await?;
            if let Some(e) = failed {
                return Err(e);
            }
            if self.need > s.read_budget() {
                return Err(End::HandshakeBudget(s.read_budget()));
            }
            if self.buf.len() >= self.need {
                // More complete requests are buffered (the replies were flushed first).
                continue;
            }
            self.make_room(s)?;
            if s.role() != Role::Handshake {
                self.deadline = None;
            }
            if !self.next_input(s).await? {
                return Ok(());
            }
        }
    }

    /// Hands every complete request in the buffer to the core (one lock for all), up to
    /// [`OUT_FLUSH`] bytes of replies.
    fn serve_buffered(&mut self, s: &mut Session) -> Result<(), End> {
        if self.buf.len() < self.need {
            return Ok(());
        }
        let mut off = 0;
        let mut hub = self.shared.lock();
        let r = loop {
            match parse_request(&self.buf[off..]) {
                Ok(Parsed::Complete(req, n)) => {
                    off += n;
                    self.need = 1;
                    let mut fx = Effects::default();
                    let r = hub.core.apply(s, req, &mut self.out, &mut fx);
                    hub.carry_out(fx);
                    if r.is_err() || self.out.len() >= OUT_FLUSH {
                        // Written (the client reading it) before parsing on.
                        break r;
                    }
                }
                Ok(Parsed::Incomplete(n)) => {
                    self.need = n;
                    break Ok(());
                }
                Err(e) => break Err(End::Protocol(e)),
            }
        };
        drop(hub);
        self.buf.drain(..off);
        r
    }

    async fn flush(&mut self, s: &mut Session) -> Result<(), End> {
        if self.out.is_empty() {
            return Ok(());
        }
        self.charge(s)?;
        self.wr.write_all(&self.out).await.map_err(|_| End::Io)?;
        self.out.clear();
        if self.out.capacity() > FREE_BUFFER {
            self.out.shrink_to(FREE_BUFFER);
        }
        Ok(())
    }

    fn charge(&mut self, s: &mut Session) -> Result<(), End> {
        let cap = self.buf.capacity() + self.out.capacity();
        if !s.charge_changes(cap) {
            return Ok(());
        }
        self.shared.lock().core.charge(s, cap)
    }

    /// Shrinks a buffer a large request left behind, or grows it for the next read.
    fn make_room(&mut self, s: &mut Session) -> Result<(), End> {
        if self.buf.capacity() > FREE_BUFFER && self.need <= FREE_BUFFER {
            self.buf.shrink_to(FREE_BUFFER);
        }
        if self.buf.capacity() - self.buf.len() < READ_CHUNK_MIN {
            let want = self
                .need
                .saturating_sub(self.buf.len())
                .clamp(READ_CHUNK_MIN, READ_CHUNK_MAX);
            self.buf.reserve(want);
        }
        self.charge(s)
    }

    /// Waits for bytes, a wake-up, an eviction or the handshake's deadline. False: the peer
    /// closed.
    async fn next_input(&mut self, s: &mut Session) -> Result<bool, End> {
        if !s.parked() && self.deadline.is_none() {
            // Nothing but bytes can come for an admitted connection with nothing parked.
            return Ok(self.read().await? > 0);
        }
        let deadline = self.deadline;
        tokio::select! {
            Some(signal) = self.rx.recv() => match signal {
                Signal::Wake(id) => {
                    self.shared.lock().core.woken(s, id, &mut self.out);
                    Ok(true)
                }
                Signal::Evict => Err(End::Evicted(self.shared.lock().core.limits().max_in_handshake)),
            },
            r = self.rd.read_buf(&mut self.buf) => Ok(r.map_err(|_| End::Io)? > 0),
            _ = sleep_until(deadline), if deadline.is_some() => {
                Err(End::HandshakeTimeout(self.shared.lock().core.limits().handshake_timeout))
            }
        }
    }

    async fn read(&mut self) -> Result<usize, End> {
        self.rd.read_buf(&mut self.buf).await.map_err(|_| End::Io)
    }
}

async fn sleep_until(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

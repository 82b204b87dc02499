//! The node's Unix socket that ranks talk to through the shim.
//!
//! The socket lives in a directory only this user can enter. Every peer is checked with
//! SO_PEERCRED: another uid, or a process that is not one of the current ranks or their
//! descendants, is refused. A connection's first message must register it as one rank of the
//! current attempt; any malformed or oversized frame closes that connection alone.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fs::DirBuilder;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use vigil_ipc::{encode_agent, AgentMsg, RankDecoder, RankMsg};

/// What the connections tell the event loop.
#[derive(Debug)]
pub enum FromRanks {
    Message {
        attempt: u32,
        local_rank: u32,
        msg: RankMsg,
        /// When it was read from the socket: step and section times are measured from it, not
        /// from when the loop got to it.
        at: std::time::Instant,
    },
    Rejected {
        peer_pid: Option<i32>,
        reason: String,
    },
    /// The last registered connection of this rank closed.
    Closed { attempt: u32, local_rank: u32 },
}

/// One registered connection's way back to its rank.
struct Route {
    conn: u64,
    attempt: u32,
    tx: mpsc::UnboundedSender<AgentMsg>,
}

/// State the event loop shares with the connection tasks (one thread, so plain `Rc`).
#[derive(Default)]
pub struct Shared {
    pub attempt: Cell<u32>,
    /// Process (and session) id of each local rank of the current attempt.
    pub rank_pids: RefCell<Vec<Option<i32>>>,
    /// Registered connections of each local rank, oldest first; messages go to the newest one
    /// of the current attempt.
    routes: RefCell<HashMap<u32, Vec<Route>>>,
    next_conn: Cell<u64>,
}

impl Shared {
    pub fn send(&self, local_rank: u32, msg: AgentMsg) {
        let routes = self.routes.borrow();
        let current = self.attempt.get();
        if let Some(r) = routes
            .get(&local_rank)
            .and_then(|v| v.iter().rev().find(|r| r.attempt == current))
        {
            let _ = r.tx.send(msg);
        }
    }

    pub fn send_all(&self, msg: &AgentMsg) {
        let lrs: Vec<u32> = self.routes.borrow().keys().copied().collect();
        for lr in lrs {
            self.send(lr, msg.clone());
        }
    }

    fn add_route(&self, local_rank: u32, route: Route) {
        self.routes
            .borrow_mut()
            .entry(local_rank)
            .or_default()
            .push(route);
    }

    /// Removes this connection's route; true if the rank has no connection of that attempt left.
    fn remove_route(&self, local_rank: u32, conn: u64, attempt: u32) -> bool {
        let mut routes = self.routes.borrow_mut();
        let Some(v) = routes.get_mut(&local_rank) else {
            return true;
        };
        v.retain(|r| r.conn != conn && r.attempt >= self.attempt.get());
        let left = v.iter().any(|r| r.attempt == attempt);
        if v.is_empty() {
            routes.remove(&local_rank);
        }
        !left
    }
}

/// Messages waiting for the event loop. When it is full the connections stop reading, their
/// socket buffers fill and the shim drops heartbeats (it never blocks on one): the agent's memory
/// stays bounded however fast ranks send.
pub const QUEUE: usize = 256;

pub struct IpcServer {
    dir: PathBuf,
    pub path: PathBuf,
    accept: tokio::task::JoinHandle<()>,
}

impl IpcServer {
    /// The private directory holding the socket.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for IpcServer {
    fn drop(&mut self) {
        // Aborting the accept task drops its JoinSet, which closes every connection.
        self.accept.abort();
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The socket's name in its directory.
pub const SOCKET: &str = "agent.sock";

/// Binds the socket in a fresh private directory under `base` and starts accepting.
pub fn start(
    base: &Path,
    shared: Rc<Shared>,
    tx: mpsc::Sender<FromRanks>,
) -> std::io::Result<IpcServer> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = base.join(format!("vigil-{}-{:x}", std::process::id(), nanos));
    DirBuilder::new().mode(0o700).create(&dir)?;
    let path = dir.join(SOCKET);
    let listener = UnixListener::bind(&path)?;
    let uid = nix::unistd::getuid().as_raw();
    let accept = tokio::task::spawn_local(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                r = listener.accept() => match r {
                    Ok((stream, _)) => {
                        conns.spawn_local(serve(stream, uid, shared.clone(), tx.clone()));
                    }
                    // EMFILE and friends: back off instead of spinning; never stop accepting.
                    Err(_) => tokio::time::sleep(ACCEPT_BACKOFF).await,
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    });
    Ok(IpcServer { dir, path, accept })
}

const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(20);

/// Keeps the last of every run of heartbeats: they arrived together, so only the latest step
/// tells the monitor anything. Other messages keep their order.
pub fn coalesce(msgs: Vec<RankMsg>) -> Vec<RankMsg> {
    let mut out: Vec<RankMsg> = Vec::with_capacity(msgs.len());
    for m in msgs {
        if matches!(m, RankMsg::Heartbeat { .. })
            && matches!(out.last(), Some(RankMsg::Heartbeat { .. }))
        {
            out.pop();
        }
        out.push(m);
    }
    out
}

/// Refused-connection notices: the first of a burst is shown, the rest counted and summed up
/// once per `window`, so a thousand refused connections make two console lines, not a thousand.
#[derive(Debug)]
pub struct NoticeLimit {
    window: std::time::Duration,
    shown_at: Option<std::time::Instant>,
    held: u64,
}

impl NoticeLimit {
    pub fn new(window: std::time::Duration) -> Self {
        NoticeLimit {
            window,
            shown_at: None,
            held: 0,
        }
    }

    /// Whether this notice is shown now; if not it is counted for `due`.
    pub fn admit(&mut self, now: std::time::Instant) -> bool {
        match self.shown_at {
            Some(t) if now.saturating_duration_since(t) < self.window => {
                self.held += 1;
                false
            }
            _ => {
                self.shown_at = Some(now);
                true
            }
        }
    }

    /// How many notices were held back, once the window since the last shown one is over (or at
    /// the end, with `force`).
    pub fn due(&mut self, now: std::time::Instant, force: bool) -> Option<u64> {
        let over = self
            .shown_at
            .is_some_and(|t| now.saturating_duration_since(t) >= self.window);
        if self.held > 0 && (over || force) {
            self.shown_at = Some(now);
            return Some(std::mem::take(&mut self.held));
        }
        None
    }
}

fn ppid_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses; fields resume after the last ')'.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether `pid` is `root` or descends from it: by parent chain, or by session (a rank leads its
/// session, and orphaned descendants are reparented to the agent, breaking the chain).
pub fn belongs_to(pid: i32, root: i32) -> bool {
    if nix::unistd::getsid(Some(nix::unistd::Pid::from_raw(pid)))
        .is_ok_and(|sid| sid.as_raw() == root)
    {
        return true;
    }
    let mut p = pid;
    for _ in 0..64 {
        if p == root {
            return true;
        }
        match ppid_of(p) {
            Some(pp) if pp > 1 => p = pp,
            _ => return false,
        }
    }
    false
}

/// Why a new connection is refused, if it is.
fn check_peer(
    stream: &UnixStream,
    uid: u32,
    shared: &Shared,
) -> Result<i32, (Option<i32>, String)> {
    let cred = stream
        .peer_cred()
        .map_err(|e| (None, format!("cannot read peer credentials: {e}")))?;
    let peer_pid = cred.pid();
    if cred.uid() != uid {
        return Err((
            peer_pid,
            format!("peer uid {} is not the job's uid {uid}", cred.uid()),
        ));
    }
    let pid = peer_pid.ok_or((None, "peer pid unknown".to_string()))?;
    let ours = shared
        .rank_pids
        .borrow()
        .iter()
        .flatten()
        .any(|r| belongs_to(pid, *r));
    if !ours {
        return Err((
            Some(pid),
            format!("process {pid} is not a rank of this agent nor a descendant of one"),
        ));
    }
    Ok(pid)
}

async fn serve(stream: UnixStream, uid: u32, shared: Rc<Shared>, tx: mpsc::Sender<FromRanks>) {
    let pid = match check_peer(&stream, uid, &shared) {
        Ok(pid) => pid,
        Err((peer_pid, reason)) => {
            drop(stream);
            let _ = tx.send(FromRanks::Rejected { peer_pid, reason }).await;
            return;
        }
    };
    let (rd, wr) = stream.into_split();
    let conn = shared.next_conn.get();
    shared.next_conn.set(conn + 1);
    let (out_tx, out_rx) = mpsc::unbounded_channel::<AgentMsg>();
    let writer = tokio::task::spawn_local(write_frames(wr, out_rx));
    let mut c = Conn {
        pid,
        conn,
        me: None,
        out_tx,
        shared,
        tx,
    };
    c.read_frames(rd).await;
    if let Some((attempt, local_rank)) = c.me {
        if c.shared.remove_route(local_rank, c.conn, attempt) {
            let _ =
                c.tx.send(FromRanks::Closed {
                    attempt,
                    local_rank,
                })
                .await;
        }
    }
    drop(c);
    writer.abort();
}

/// Writes what the agent sends this connection, until the connection or the agent closes.
async fn write_frames(mut wr: OwnedWriteHalf, mut out_rx: mpsc::UnboundedReceiver<AgentMsg>) {
    let mut frame = Vec::new();
    while let Some(msg) = out_rx.recv().await {
        frame.clear();
        encode_agent(&msg, &mut frame);
        if wr.write_all(&frame).await.is_err() {
            break;
        }
    }
}

/// Why a connection is closed: the line the event log (and the console) get.
struct Refusal(String);

/// One accepted connection of a checked peer.
struct Conn {
    pid: i32,
    conn: u64,
    /// `(attempt, local rank)` once registered.
    me: Option<(u32, u32)>,
    /// The way back to the rank, for its route once registered.
    out_tx: mpsc::UnboundedSender<AgentMsg>,
    shared: Rc<Shared>,
    tx: mpsc::Sender<FromRanks>,
}

impl Conn {
    /// Reads frames and passes their messages on until the peer closes, a frame is malformed,
    /// or a message is refused.
    async fn read_frames(&mut self, mut rd: OwnedReadHalf) {
        let mut dec = RankDecoder::new();
        let mut buf = vec![0u8; 8192];
        loop {
            let n = match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            dec.push(&buf[..n]);
            let mut batch = Vec::new();
            let mut bad = None;
            loop {
                match dec.next() {
                    Ok(Some(m)) => batch.push(m),
                    Ok(None) => break,
                    Err(e) => {
                        bad = Some(e);
                        break;
                    }
                }
            }
            for msg in coalesce(batch) {
                if !self.forward(msg).await {
                    return;
                }
            }
            if let Some(e) = bad {
                let pid = self.pid;
                self.reject(format!(
                    "malformed frame from process {pid}: {e}; connection closed"
                ))
                .await;
                return;
            }
        }
    }

    /// Passes one message to the event loop; false when the connection is to close.
    async fn forward(&mut self, msg: RankMsg) -> bool {
        let (attempt, local_rank) = match self.me {
            Some(me) => me,
            None => match self.register(&msg) {
                Ok(me) => me,
                Err(Refusal(reason)) => {
                    self.reject(reason).await;
                    return false;
                }
            },
        };
        if attempt != self.shared.attempt.get() {
            return false;
        }
        // Waits while the loop is behind: this connection stops reading meanwhile.
        self.tx
            .send(FromRanks::Message {
                attempt,
                local_rank,
                msg,
                at: std::time::Instant::now(),
            })
            .await
            .is_ok()
    }

    /// A connection's first message must register it as a rank of the current attempt that the
    /// peer is (or descends from).
    fn register(&mut self, msg: &RankMsg) -> Result<(u32, u32), Refusal> {
        let pid = self.pid;
        let RankMsg::Register {
            local_rank,
            attempt,
            ..
        } = msg
        else {
            return Err(Refusal(format!(
                "process {pid} sent a message before registering; connection closed"
            )));
        };
        let (lr, attempt) = (*local_rank, *attempt);
        let expected = self
            .shared
            .rank_pids
            .borrow()
            .get(lr as usize)
            .copied()
            .flatten();
        let current = self.shared.attempt.get();
        if attempt != current || !expected.is_some_and(|r| belongs_to(pid, r)) {
            return Err(Refusal(format!(
                "process {pid} registered as local rank {lr} of cycle {attempt}, which it is not (current cycle {current})"
            )));
        }
        self.me = Some((attempt, lr));
        self.shared.add_route(
            lr,
            Route {
                conn: self.conn,
                attempt,
                tx: self.out_tx.clone(),
            },
        );
        Ok((attempt, lr))
    }

    async fn reject(&self, reason: String) {
        let _ = self
            .tx
            .send(FromRanks::Rejected {
                peer_pid: Some(self.pid),
                reason,
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn heartbeat_runs_keep_the_latest() {
        let hb = |s| RankMsg::Heartbeat { step: Some(s) };
        let got = coalesce(vec![
            hb(1),
            hb(2),
            RankMsg::SectionStart { name: "x".into() },
            hb(3),
            hb(4),
            hb(5),
            RankMsg::Finished,
        ]);
        assert_eq!(
            got,
            vec![
                hb(2),
                RankMsg::SectionStart { name: "x".into() },
                hb(5),
                RankMsg::Finished
            ]
        );
    }

    #[test]
    fn refused_notices_are_summed_per_window() {
        let t0 = Instant::now();
        let w = Duration::from_secs(10);
        let mut l = NoticeLimit::new(w);
        assert!(l.admit(t0));
        for i in 0..2999 {
            assert!(!l.admit(t0 + Duration::from_millis(i)));
        }
        assert_eq!(l.due(t0 + Duration::from_secs(1), false), None);
        assert_eq!(l.due(t0 + w, false), Some(2999));
        assert_eq!(l.due(t0 + w * 3, false), None);
        assert!(l.admit(t0 + w * 3));
        assert!(!l.admit(t0 + w * 3));
        assert_eq!(l.due(t0 + w * 3, true), Some(1));
    }
}

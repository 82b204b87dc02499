//! The metrics page at the edge (docs/metrics.md): `--metrics-port` serves it over HTTP (a minimal
//! GET /metrics server on the agent's own event loop), `--metrics-textfile` writes it for
//! node_exporter's textfile collector (a temp file of a name no one can guess, created
//! exclusively without following links, in the same directory, then renamed) every
//! [`TEXTFILE_EVERY`] and at exit. What the page says is `crate::metrics`' (pure).
//!
//! Connections are served concurrently, at most [`MAX_CONNECTIONS`] at once ([`Slots`]); each has
//! [`REQUEST_READ_TIMEOUT`] to send its request. When all are taken, the oldest connection still
//! waiting for its request is closed for the new one, so clients that connect and send nothing
//! cannot keep a scrape out: a scrape sends its request at once and is answered.
//!
//! A page is built only when one is asked for: a connection hands the loop a [`PageRequest`], the
//! loop answers it between events from what it holds (the supervisor's ranks, the counters it
//! keeps from records, the last straggler report), so heartbeats cost nothing more. When the loop
//! does not answer in [`LOOP_ANSWER`] (it is ending the job), the last page is served again.
//! Node rank 0's goodput is computed from the job's records on a blocking thread, at most once
//! per [`JOB_WIDE_EVERY`], when a page is asked for.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use super::gpuwatch::GpuWatch;
use super::report::{console_err, console_note};
use crate::cli::config::LaunchConfig;
use crate::metrics::{self, text::CONTENT_TYPE, Identity, JobWide, RankRow, Scores, Tally};
use crate::supervise::{Action, Supervisor};

/// How often the textfile is written again.
pub(super) const TEXTFILE_EVERY: Duration = Duration::from_secs(15);
/// Node rank 0's goodput is computed again at most this often.
const JOB_WIDE_EVERY: Duration = Duration::from_secs(30);
/// How long a connection waits for the loop's page before serving the last one.
const LOOP_ANSWER: Duration = Duration::from_secs(2);
/// How long a client has to send its request.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection is served in all, its request and the answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a request read (its line and headers).
const MAX_REQUEST: usize = 8 * 1024;
/// Connections served at once; past this the oldest still waiting for its request is closed.
const MAX_CONNECTIONS: usize = 32;
/// Page requests waiting for the loop.
const QUEUE: usize = 16;
/// How long the page at exit waits for node rank 0's goodput.
const FINAL_JOB_WIDE_WAIT: Duration = Duration::from_secs(20);

/// A connection's request for a page, answered by the loop.
pub(super) type PageRequest = oneshot::Sender<String>;

/// Why metrics cannot be served as asked; the agent exits with the usage status.
#[derive(Debug, thiserror::Error)]
pub(super) enum MetricsError {
    #[error("cannot listen for metrics on port {port}: {source}; give another --metrics-port (0: any free port) or stop what holds it")]
    Bind { port: u16, source: std::io::Error },
    #[error("cannot write metrics into {}: {source}; give --metrics-textfile an existing directory this user can write (node_exporter's --collector.textfile.directory)", .dir.display())]
    Textfile {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// The metrics side of the agent: what the page shows beyond what the loop holds anyway, and
/// where it goes.
pub(super) struct Metrics {
    id: Identity,
    started_unix: f64,
    tally: Tally,
    scores: Option<Scores>,
    /// Node rank 0: the job's goodput as last computed, and whether a computation runs.
    job: Option<Rc<RefCell<Option<JobWide>>>>,
    job_busy: Rc<Cell<bool>>,
    job_started: Option<Instant>,
    /// The directories the job's records are read from (node rank 0).
    job_dirs: Vec<PathBuf>,
    textfile: Option<PathBuf>,
    textfile_due: Option<Instant>,
    /// The last page built, served when the loop does not answer.
    last: Rc<RefCell<String>>,
    /// The HTTP server's task; it ends with the agent's loop.
    _server: Option<tokio::task::JoinHandle<()>>,
    /// Keeps the page channel open when no server runs.
    _tx: mpsc::Sender<PageRequest>,
}

/// What start-up binds and checks, before anything else starts.
pub(super) struct Prepared {
    listener: Option<std::net::TcpListener>,
    textfile: Option<PathBuf>,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The textfile of this node: `vigil_<job>_<node rank>.prom` (node_exporter reads `*.prom`).
fn textfile_name(job_id: &str, node_rank: u32) -> String {
    format!(
        "vigil_{}_{node_rank}.prom",
        crate::values::file_safe(job_id)
    )
}

/// A number no one outside this process can guess: std's hasher keys come from the OS's
/// randomness.
fn unguessable() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Creates a new file `.{stem}.{random}.tmp` in `dir` (not `*.prom`, so never read), exclusively
/// (`O_EXCL`) and without following a link (`O_NOFOLLOW`): a file or link planted under any name
/// is never written through. Its mode is 0666 less the umask, as node_exporter, another user,
/// reads the page.
fn create_temp(dir: &Path, stem: &str) -> std::io::Result<(PathBuf, std::fs::File)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut last = None;
    for _ in 0..8 {
        let path = dir.join(format!(".{stem}.{:016x}.tmp", unguessable()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o666)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(f) => return Ok((path, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free temp name")))
}

/// Writes `page` to `dir/name` atomically: a new temp file beside it ([`create_temp`]), then a
/// rename over the old one (a rename replaces a link, never writes through it).
fn write_textfile(dir: &Path, name: &str, page: &str) -> std::io::Result<()> {
    use std::io::Write;
    let (tmp, mut f) = create_temp(dir, name)?;
    let done = f
        .write_all(page.as_bytes())
        .and_then(|_| std::fs::rename(&tmp, dir.join(name)));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// Binds `--metrics-port` and checks `--metrics-textfile`: the one line that says what is wrong
/// and the usage status, before anything starts.
pub(super) fn prepare(cfg: &LaunchConfig) -> Result<Prepared, i32> {
    let fail = |e: MetricsError| {
        console_err(format!("vigil: error: {e}"));
        crate::exit::USAGE
    };
    let listener = match cfg.metrics_port {
        Some(port) => Some(
            std::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port)))
                .and_then(|l| l.set_nonblocking(true).map(|_| l))
                .map_err(|source| fail(MetricsError::Bind { port, source }))?,
        ),
        None => None,
    };
    if let Some(dir) = &cfg.metrics_textfile {
        create_temp(dir, "vigil-probe")
            .and_then(|(probe, _)| std::fs::remove_file(probe))
            .map_err(|source| {
                fail(MetricsError::Textfile {
                    dir: dir.clone(),
                    source,
                })
            })?;
    }
    Ok(Prepared {
        listener,
        textfile: cfg.metrics_textfile.clone(),
    })
}

impl Metrics {
    /// Starts serving (when asked for); `None` when neither flag was given. `job_dirs`: where
    /// node rank 0 reads the job's records for goodput.
    pub(super) fn start(
        p: Prepared,
        cfg: &LaunchConfig,
        host: &str,
        job_dirs: Vec<PathBuf>,
    ) -> Option<(Metrics, mpsc::Receiver<PageRequest>)> {
        if p.listener.is_none() && p.textfile.is_none() {
            return None;
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let last = Rc::new(RefCell::new(String::new()));
        let server = p.listener.and_then(|l| {
            let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
            let l = TcpListener::from_std(l).ok()?;
            console_note(&format!("metrics at http://{host}:{port}/metrics"));
            Some(tokio::task::spawn_local(serve(l, tx.clone(), last.clone())))
        });
        let mut m = Metrics {
            id: Identity {
                job_id: cfg.job_id.clone().unwrap_or_else(|| cfg.run_id.clone()),
                node: host.to_string(),
                node_rank: cfg.node_rank,
            },
            started_unix: unix_now(),
            tally: Tally::default(),
            scores: None,
            job: (cfg.node_rank == 0).then(|| Rc::new(RefCell::new(None))),
            job_busy: Rc::new(Cell::new(false)),
            job_started: None,
            job_dirs,
            textfile: p.textfile,
            textfile_due: None,
            last,
            _server: server,
            _tx: tx,
        };
        m.refresh_job_wide();
        Some((m, rx))
    }

    /// Counts the records among the supervisor's actions.
    pub(super) fn count(&mut self, actions: &[Action]) {
        for a in actions {
            if let Action::Record(r) = a {
                self.tally.on_record(r);
            }
        }
    }

    /// Node rank 0's straggler report arrived.
    pub(super) fn on_straggler_record(&mut self, record: &serde_json::Value) {
        self.scores = Some(metrics::scores_of(record, unix_now()));
    }

    /// Starts computing the job's goodput on a blocking thread, unless one runs or the last
    /// started within [`JOB_WIDE_EVERY`].
    fn refresh_job_wide(&mut self) {
        let Some(slot) = &self.job else { return };
        // Until the job's records give a first answer, each page asks again.
        let fresh = slot.borrow().is_some()
            && self
                .job_started
                .is_some_and(|t| t.elapsed() < JOB_WIDE_EVERY);
        if self.job_busy.get() || fresh {
            return;
        }
        self.job_busy.set(true);
        self.job_started = Some(Instant::now());
        let (slot, busy, dirs) = (slot.clone(), self.job_busy.clone(), self.job_dirs.clone());
        tokio::task::spawn_local(async move {
            let done = tokio::task::spawn_blocking(move || compute_job_wide(&dirs)).await;
            if let Ok(Some(j)) = done {
                *slot.borrow_mut() = Some(j);
            }
            busy.set(false);
        });
    }
}

/// The job's goodput from its records (`None`: no records yet).
fn compute_job_wide(dirs: &[PathBuf]) -> Option<JobWide> {
    let h = vigil_report::History::load_all(dirs).ok()?;
    Some(metrics::job_wide(&h, unix_now()))
}

impl Metrics {
    /// The page now, from what the loop holds; `running`: false for the page at exit.
    pub(super) fn page(
        &mut self,
        sup: &Supervisor,
        gpus: &GpuWatch,
        now: Instant,
        running: bool,
    ) -> String {
        if running {
            self.refresh_job_wide();
        }
        let ranks = sup
            .rank_views()
            .into_iter()
            .map(|r| {
                let gpu = gpus.gpu_and_uuid(r.local_rank);
                RankRow {
                    local_rank: r.local_rank,
                    rank: r.rank,
                    running: r.running,
                    step: r.step,
                    heartbeat_age_s: r
                        .last_heartbeat
                        .map(|t| now.saturating_duration_since(t).as_secs_f64()),
                    gpu: gpu.as_ref().map(|g| g.0),
                    uuid: gpu.map(|g| g.1),
                }
            })
            .collect();
        let job = self.job.as_ref().and_then(|j| j.borrow().clone());
        let page = metrics::render(&metrics::Snapshot {
            id: &self.id,
            running,
            started_unix: self.started_unix,
            attempt: sup.attempt(),
            tally: &self.tally,
            ranks,
            scores: self.scores.as_ref(),
            job: job.as_ref(),
        });
        self.last.replace(page.clone());
        page
    }

    /// The clock's tick: the textfile, when due.
    pub(super) fn tick(&mut self, sup: &Supervisor, gpus: &GpuWatch, now: Instant) {
        let Some(dir) = self.textfile.clone() else {
            return;
        };
        let due = *self.textfile_due.get_or_insert(now);
        if now < due {
            return;
        }
        self.textfile_due = Some(now + TEXTFILE_EVERY);
        let name = textfile_name(&self.id.job_id, self.id.node_rank);
        let page = self.page(sup, gpus, now, true);
        // Off the loop: the directory may be on a slow file system.
        tokio::task::spawn_blocking(move || {
            if let Err(e) = write_textfile(&dir, &name, &page) {
                console_note(&format!(
                    "cannot write the metrics textfile {}: {e}",
                    dir.join(&name).display()
                ));
            }
        });
    }

    /// At exit, with `--metrics-textfile`: the last page (node rank 0's goodput computed again,
    /// the allocation's decision included), written to the textfile and served to scrapes until
    /// the agent is gone. Without a textfile nothing is left to read it: nothing is done.
    pub(super) async fn at_exit(&mut self, sup: &Supervisor, gpus: &GpuWatch, now: Instant) {
        let Some(dir) = self.textfile.clone() else {
            return;
        };
        if let Some(slot) = self.job.clone() {
            let dirs = self.job_dirs.clone();
            let done = tokio::time::timeout(
                FINAL_JOB_WIDE_WAIT,
                tokio::task::spawn_blocking(move || compute_job_wide(&dirs)),
            )
            .await;
            if let Ok(Ok(Some(j))) = done {
                *slot.borrow_mut() = Some(j);
            }
        }
        let page = self.page(sup, gpus, now, false);
        let name = textfile_name(&self.id.job_id, self.id.node_rank);
        if let Err(e) = write_textfile(&dir, &name, &page) {
            console_note(&format!(
                "cannot write the metrics textfile {}: {e}",
                dir.join(&name).display()
            ));
        }
    }
}

/// How a new connection is taken.
#[derive(Debug, PartialEq, Eq)]
enum Admit<T> {
    Take(u64),
    /// Taken in the place of the oldest connection still waiting for its request, whose handle
    /// is given back to be closed.
    TakeEvicting(u64, Option<T>),
    /// Every connection is being answered: the new one is closed.
    Refuse,
}

/// The connections served, at most `max`: those waiting for their request, oldest first, with a
/// handle to close them, and those being answered.
struct Slots<T> {
    max: usize,
    next: u64,
    waiting: std::collections::BTreeMap<u64, Option<T>>,
    answering: std::collections::BTreeSet<u64>,
}

impl<T> Slots<T> {
    fn new(max: usize) -> Self {
        Slots {
            max,
            next: 0,
            waiting: Default::default(),
            answering: Default::default(),
        }
    }

    fn accept(&mut self) -> Admit<T> {
        let evicted = if self.waiting.len() + self.answering.len() < self.max {
            None
        } else if let Some((_, h)) = self.waiting.pop_first() {
            Some(h)
        } else {
            return Admit::Refuse;
        };
        let id = self.next;
        self.next += 1;
        self.waiting.insert(id, None);
        match evicted {
            None => Admit::Take(id),
            Some(h) => Admit::TakeEvicting(id, h),
        }
    }

    /// The handle that closes connection `id` while it waits.
    fn set_handle(&mut self, id: u64, h: T) {
        if let Some(slot) = self.waiting.get_mut(&id) {
            *slot = Some(h);
        }
    }

    /// Connection `id`'s request came: it is no longer closed for a newer one. False when it was
    /// already closed.
    fn answering(&mut self, id: u64) -> bool {
        let was = self.waiting.remove(&id).is_some();
        if was {
            self.answering.insert(id);
        }
        was
    }

    fn done(&mut self, id: u64) {
        self.waiting.remove(&id);
        self.answering.remove(&id);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.waiting.len() + self.answering.len()
    }
}

type Conns = Rc<RefCell<Slots<tokio::task::AbortHandle>>>;

/// Frees a connection's slot however its task ends: answered, timed out or aborted.
struct Release(Conns, u64);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.borrow_mut().done(self.1);
    }
}

/// Accepts connections until the agent ends; errors (EMFILE) back off instead of spinning.
async fn serve(l: TcpListener, tx: mpsc::Sender<PageRequest>, last: Rc<RefCell<String>>) {
    let conns: Conns = Rc::new(RefCell::new(Slots::new(MAX_CONNECTIONS)));
    loop {
        match l.accept().await {
            Ok((sock, _)) => {
                let id = match conns.borrow_mut().accept() {
                    Admit::Refuse => continue,
                    Admit::Take(id) => id,
                    Admit::TakeEvicting(id, old) => {
                        if let Some(h) = old {
                            h.abort();
                        }
                        id
                    }
                };
                let (tx, last, c) = (tx.clone(), last.clone(), conns.clone());
                let task = tokio::task::spawn_local(async move {
                    let _release = Release(c.clone(), id);
                    let _ =
                        tokio::time::timeout(REQUEST_TIMEOUT, answer(sock, tx, last, c, id)).await;
                });
                conns.borrow_mut().set_handle(id, task.abort_handle());
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Asked {
    Metrics { head: bool },
    Index { head: bool },
    NotFound,
    BadMethod,
    Bad,
}

/// The request line of an HTTP request's head.
fn asked(head: &[u8]) -> Asked {
    let text = String::from_utf8_lossy(head);
    let line = text.lines().next().unwrap_or("");
    let mut words = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (words.next(), words.next(), words.next())
    else {
        return Asked::Bad;
    };
    if !version.starts_with("HTTP/1.") {
        return Asked::Bad;
    }
    let head = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Asked::BadMethod,
    };
    match target.split('?').next().unwrap_or("") {
        "/metrics" => Asked::Metrics { head },
        "/" => Asked::Index { head },
        _ => Asked::NotFound,
    }
}

fn response(status: &str, content_type: &str, body: &str, head: bool) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head {
        r.extend_from_slice(body.as_bytes());
    }
    r
}

/// Reads one request (within [`REQUEST_READ_TIMEOUT`]) and answers it; the connection closes
/// after.
async fn answer(
    mut sock: TcpStream,
    tx: mpsc::Sender<PageRequest>,
    last: Rc<RefCell<String>>,
    conns: Conns,
    id: u64,
) {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let by = tokio::time::Instant::now() + REQUEST_READ_TIMEOUT;
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        match tokio::time::timeout_at(by, sock.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > MAX_REQUEST {
            let _ = sock
                .write_all(&response(
                    "431 Request Header Fields Too Large",
                    "text/plain",
                    "",
                    false,
                ))
                .await;
            return;
        }
    }
    if !conns.borrow_mut().answering(id) {
        return;
    }
    let text_plain = "text/plain; charset=utf-8";
    let out = match asked(&buf) {
        Asked::Metrics { head } => {
            let (otx, orx) = oneshot::channel();
            let page = match tx.try_send(otx) {
                Ok(()) => match tokio::time::timeout(LOOP_ANSWER, orx).await {
                    Ok(Ok(page)) => page,
                    _ => last.borrow().clone(),
                },
                Err(_) => last.borrow().clone(),
            };
            response("200 OK", CONTENT_TYPE, &page, head)
        }
        Asked::Index { head } => response(
            "200 OK",
            text_plain,
            "vigil's metrics are at /metrics (docs/metrics.md)\n",
            head,
        ),
        Asked::NotFound => response(
            "404 Not Found",
            text_plain,
            "not found: try /metrics\n",
            false,
        ),
        Asked::BadMethod => response(
            "405 Method Not Allowed",
            text_plain,
            "only GET and HEAD\n",
            false,
        ),
        Asked::Bad => response("400 Bad Request", text_plain, "bad request\n", false),
    };
    let _ = sock.write_all(&out).await;
    let _ = sock.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_from_their_request_line() {
        assert_eq!(
            asked(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Asked::Metrics { head: false }
        );
        assert_eq!(
            asked(b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Asked::Metrics { head: true }
        );
        assert_eq!(
            asked(b"GET / HTTP/1.1\r\n\r\n"),
            Asked::Index { head: false }
        );
        assert_eq!(asked(b"GET /other HTTP/1.1\r\n\r\n"), Asked::NotFound);
        assert_eq!(asked(b"POST /metrics HTTP/1.1\r\n\r\n"), Asked::BadMethod);
        assert_eq!(asked(b"garbage\r\n\r\n"), Asked::Bad);
        assert_eq!(asked(b"GET /metrics SPDY\r\n\r\n"), Asked::Bad);
    }

    #[test]
    fn a_response_has_its_length_and_a_head_request_no_body() {
        let r = String::from_utf8(response("200 OK", CONTENT_TYPE, "abc\n", false)).unwrap();
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
        assert!(r.contains("Content-Length: 4\r\n"));
        assert!(r.ends_with("\r\n\r\nabc\n"));
        let h = String::from_utf8(response("200 OK", CONTENT_TYPE, "abc\n", true)).unwrap();
        assert!(h.ends_with("Content-Length: 4\r\nConnection: close\r\n\r\n"));
    }

    #[test]
    fn idle_connections_make_room_for_new_ones_oldest_first() {
        let mut s: Slots<&str> = Slots::new(2);
        assert_eq!(s.accept(), Admit::Take(0));
        s.set_handle(0, "a");
        assert_eq!(s.accept(), Admit::Take(1));
        s.set_handle(1, "b");
        // Full: the oldest still waiting for its request goes.
        assert_eq!(s.accept(), Admit::TakeEvicting(2, Some("a")));
        assert!(!s.answering(0), "an evicted connection is not answered");
        assert!(s.answering(1));
        // 1 is being answered: only 2 may go.
        assert_eq!(s.accept(), Admit::TakeEvicting(3, None));
        assert!(s.answering(3));
        // Both are being answered: a new one is refused until one is done.
        assert_eq!(s.accept(), Admit::Refuse);
        s.done(1);
        s.done(2);
        assert_eq!(s.len(), 1);
        assert_eq!(s.accept(), Admit::Take(4));
    }

    #[test]
    fn the_textfile_never_writes_through_a_planted_link() {
        use std::os::unix::fs::symlink;
        let dir = std::env::temp_dir().join(format!("vigil-textfile-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, "mine\n").unwrap();
        let name = textfile_name("j", 0);
        // Links planted under the temp names a writer could guess (this process's id), and under
        // the textfile's own name.
        symlink(
            &victim,
            dir.join(format!(".{name}.{}.tmp", std::process::id())),
        )
        .unwrap();
        symlink(
            &victim,
            dir.join(format!(".vigil-probe.{}.tmp", std::process::id())),
        )
        .unwrap();
        symlink(&victim, dir.join(&name)).unwrap();
        write_textfile(&dir, &name, "a 1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine\n");
        // The link at the textfile's name is replaced, not written through.
        let meta = std::fs::symlink_metadata(dir.join(&name)).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(std::fs::read_to_string(dir.join(&name)).unwrap(), "a 1\n");
        // A temp file is created exclusively, never opened through a link.
        let (p, _) = create_temp(&dir, "x").unwrap();
        assert!(std::fs::symlink_metadata(&p).unwrap().file_type().is_file());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_textfile_is_replaced_whole_and_named_for_node_exporter() {
        let dir = std::env::temp_dir().join(format!("vigil-textfile-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let name = textfile_name("job 1/a", 3);
        assert_eq!(name, "vigil_job_1_a_3.prom");
        write_textfile(&dir, &name, "a 1\n").unwrap();
        write_textfile(&dir, &name, "a 2\n").unwrap();
        let left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, vec![name.clone()]);
        assert_eq!(std::fs::read_to_string(dir.join(&name)).unwrap(), "a 2\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

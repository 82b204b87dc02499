//! The multi-process scale harness (field finding 30: one process holding both ends of every
//! connection hit its own descriptor limit near 3,000 agents, and one loopback address spent
//! seconds finding free ports). Included by `agent/benches/rendezvous.rs`:
//!
//!     cargo bench -p vigil --bench rendezvous -- --workers 4 [--hold 150] [--node-timeout 30] 256,1024,2048
//!
//! The store and node rank 0's agent run in this process (the store on a thread of its own, as
//! in the agent); the other agents are spread over `--workers` worker processes (this same
//! binary, re-run), each reaching the store at its own loopback address (127.0.0.2 to
//! 127.0.0.31), every agent running vigil's real coordination code over real TCP. A run joins
//! attempt 0, fails it from node rank 0, waits for every agent to hold attempt 1, then holds the
//! job idle for `--hold` seconds (any node lost meanwhile is a loss), and leaves.
//!
//! Each run records, from `/proc/net/netstat` and `/proc/net/snmp` (this network namespace, so
//! other programs on the machine count too), listen overflows and drops, TCP aborts and receive
//! queue drops; every process's peak of open descriptors and its CPU time. It exits non-zero
//! with one line when the harness itself caused a loss (its own descriptor limit, a listen
//! overflow, a worker that died) or when the protocol lost a node.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use vigil::job::rendezvous::{self, CoordConfig, FromCoord, HeadSide};
use vigil::supervise::{Event, JobEnd, JobRequest};

/// The counters a run reports, as `Group.Name` of /proc/net/netstat and /proc/net/snmp.
const COUNTERS: &[&str] = &[
    "TcpExt.ListenOverflows",
    "TcpExt.ListenDrops",
    "TcpExt.TCPAbortOnTimeout",
    "TcpExt.TCPAbortOnData",
    "TcpExt.TCPAbortOnClose",
    "TcpExt.TCPAbortOnMemory",
    "TcpExt.TCPBacklogDrop",
    "TcpExt.TCPRcvQDrop",
    "TcpExt.TCPReqQFullDrop",
    "Tcp.AttemptFails",
    "Tcp.EstabResets",
];

/// Counters whose growth means the harness lost connections before the protocol could.
const HARNESS_LOSS: &[&str] = &["TcpExt.ListenOverflows", "TcpExt.ListenDrops"];

/// Every `Group: name ...` / `Group: value ...` pair of lines of the two files.
fn net_counters() -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for f in ["/proc/net/netstat", "/proc/net/snmp"] {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for pair in lines.chunks(2) {
            let [names, values] = pair else { continue };
            let (Some((g, names)), Some((_, values))) =
                (names.split_once(':'), values.split_once(':'))
            else {
                continue;
            };
            for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
                if let Ok(v) = v.parse() {
                    out.insert(format!("{g}.{n}"), v);
                }
            }
        }
    }
    out
}

fn delta(before: &BTreeMap<String, i64>, after: &BTreeMap<String, i64>, k: &str) -> i64 {
    after.get(k).copied().unwrap_or(0) - before.get(k).copied().unwrap_or(0)
}

/// The peak of this process's open descriptors, sampled every 50 ms by a thread.
fn fd_peak_sampler() -> Arc<AtomicUsize> {
    let peak = Arc::new(AtomicUsize::new(0));
    let p = peak.clone();
    std::thread::spawn(move || loop {
        if let Ok(d) = std::fs::read_dir("/proc/self/fd") {
            p.fetch_max(d.count(), Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(50));
    });
    peak
}

/// This process's CPU time (user + system).
fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn coord(nnodes: u32, node_rank: u32, store: SocketAddr, peer_timeout: Duration) -> CoordConfig {
    crate::common::coord(nnodes, nnodes, node_rank, store, peer_timeout)
}

/// What an agent's coordination said, tagged with its node rank.
type Said = (u32, FromCoord);

fn spawn_agent(
    cfg: CoordConfig,
    head: Option<HeadSide>,
    said: mpsc::UnboundedSender<Said>,
) -> (
    mpsc::UnboundedSender<JobRequest>,
    tokio::task::JoinHandle<()>,
) {
    let node = cfg.node_rank;
    let (tx, req_rx) = mpsc::unbounded_channel();
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let task = tokio::task::spawn_local(rendezvous::run(cfg, head, req_rx, ev_tx));
    tokio::task::spawn_local(async move {
        while let Some(m) = ev_rx.recv().await {
            if said.send((node, m)).is_err() {
                return;
            }
        }
    });
    (tx, task)
}

/// A worker's side: `first..first + count` agents reaching the store at `store`; commands on
/// stdin (`join C`, `leave`), reports on stdout (`joined C`, `ended N C why`, `lost N why`,
/// `stats FD_PEAK FD_LIMIT CPU_MS`).
pub fn worker(nnodes: u32, first: u32, count: u32, store: SocketAddr, peer_timeout: Duration) {
    let limit = crate::common::raise_fd_limit();
    let peak = fd_peak_sampler();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let (cmd_tx, mut cmds) = mpsc::unbounded_channel::<String>();
        std::thread::spawn(move || {
            for l in std::io::stdin().lock().lines() {
                let Ok(l) = l else { return };
                if cmd_tx.send(l).is_err() {
                    return;
                }
            }
        });
        let (said_tx, mut said) = mpsc::unbounded_channel();
        let mut agents = BTreeMap::new();
        for node in first..first + count {
            agents.insert(node, spawn_agent(coord(nnodes, node, store, peer_timeout), None, said_tx.clone()));
        }
        let out = |s: String| {
            let mut o = std::io::stdout().lock();
            let _ = writeln!(o, "{s}");
            let _ = o.flush();
        };
        // Agents still to hold their assignment for the attempt the head asked for.
        let mut waiting: BTreeMap<u32, usize> = BTreeMap::new();
        loop {
            tokio::select! {
                c = cmds.recv() => {
                    let Some(c) = c else { return };
                    if let Some(attempt) = c.strip_prefix("join ").and_then(|c| c.parse::<u32>().ok()) {
                        *waiting.entry(attempt).or_default() += agents.len();
                        for (tx, _) in agents.values() {
                            let _ = tx.send(JobRequest::Join { attempt, calculated: None });
                        }
                    } else if c == "leave" {
                        for (_, (tx, task)) in std::mem::take(&mut agents) {
                            let _ = tx.send(JobRequest::Leave { poison: None, highest_step: None });
                            let _ = task.await;
                        }
                        out(format!("stats {} {limit} {}", peak.load(Ordering::Relaxed), cpu_time().as_millis()));
                        return;
                    }
                }
                Some((node, m)) = said.recv() => match m {
                    FromCoord::Event(Event::Joined { attempt, .. })
                    | FromCoord::Event(Event::Standby { attempt }) => {
                        if let Some(w) = waiting.get_mut(&attempt) {
                            *w -= 1;
                            if *w == 0 {
                                waiting.remove(&attempt);
                                out(format!("joined {attempt}"));
                            }
                        }
                    }
                    FromCoord::Event(Event::AttemptEnded { attempt, end }) => {
                        out(format!("ended {node} {attempt} {}", one_line(&format!("{end:?}"))));
                        // Every agent rejoins the next attempt on its own, as the supervisor does.
                        *waiting.entry(attempt + 1).or_default() += 1;
                        if let Some((tx, _)) = agents.get(&node) {
                            let _ = tx.send(JobRequest::Join { attempt: attempt + 1, calculated: None });
                        }
                    }
                    FromCoord::Event(Event::CoordinationLost { reason, .. }) => out(format!("lost {node} {}", one_line(&reason))),
                    _ => {}
                },
            }
        }
    });
}

fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}

/// One worker process, seen from the head.
struct Worker {
    child: Child,
    stdin: ChildStdin,
}

impl Worker {
    fn tell(&mut self, s: &str) {
        let _ = writeln!(self.stdin, "{s}");
        let _ = self.stdin.flush();
    }
}

/// What one run measured.
pub struct Row {
    agents: u32,
    workers: u32,
    connect: Duration,
    join0: Duration,
    restart: Duration,
    hold: Duration,
    losses: Vec<String>,
    counters: Vec<(String, i64)>,
    fd_head: usize,
    fd_worker_max: usize,
    cpu_head: Duration,
    cpu_workers: Duration,
    /// Why the harness, not the protocol, lost something.
    harness_fault: Option<String>,
}

/// Lines from the workers (worker index, line); `None` line: its stdout closed.
type Lines = mpsc::UnboundedReceiver<(usize, Option<String>)>;

async fn until(
    lines: &mut Lines,
    said: &mut mpsc::UnboundedReceiver<Said>,
    deadline: Duration,
    mut done: impl FnMut(Option<(usize, &str)>, Option<&FromCoord>) -> bool,
    losses: &mut Vec<String>,
    fault: &mut Option<String>,
    leaving: bool,
) -> bool {
    let end = tokio::time::Instant::now() + deadline;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Some(why) = head_fd_pressure() {
                    fault.get_or_insert(why);
                    return false;
                }
            }
            l = lines.recv() => match l {
                Some((w, Some(l))) => {
                    if l.starts_with("lost ") {
                        // A worker out of descriptors is the harness's loss, not the protocol's.
                        if l.contains("os error 24") {
                            fault.get_or_insert(format!("worker {w} ran out of descriptors: {l}"));
                        }
                        losses.push(l.clone());
                    }
                    if done(Some((w, &l)), None) {
                        return true;
                    }
                }
                // After `leave`, a worker closes its stdout once it said its stats.
                Some((_, None)) if leaving => {}
                Some((w, None)) => {
                    fault.get_or_insert(format!("worker {w} ended early (crashed or out of descriptors)"));
                    return false;
                }
                None => return false,
            },
            Some((_, m)) = said.recv() => {
                if let FromCoord::Event(Event::CoordinationLost { reason, .. }) = &m {
                    losses.push(format!("lost 0 {reason}"));
                }
                if done(None, Some(&m)) {
                    return true;
                }
            }
            _ = tokio::time::sleep_until(end) => return false,
        }
    }
}

/// One run of `n` agents over `workers` worker processes.
pub async fn run(n: u32, workers: u32, hold: Duration, peer_timeout: Duration) -> Row {
    let workers = workers.clamp(1, n.saturating_sub(1).max(1));
    let fd_limit = crate::common::raise_fd_limit();
    let peak = HEAD_FD_PEAK
        .get_or_init(|| (fd_peak_sampler(), fd_limit))
        .0
        .clone();
    let cpu0 = cpu_time();
    let before = net_counters();
    let (addr, keys, leases) = vigil::run::host_store_with_backlog(
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        peer_timeout,
        None,
        vigil::run::listen_backlog(n, 0),
    )
    .expect("store up");
    let port = addr.port();
    let t0 = Instant::now();
    let (said_tx, mut said) = mpsc::unbounded_channel();
    let (tx0, task0) = spawn_agent(
        coord(n, 0, SocketAddr::from(([127, 0, 0, 1], port)), peer_timeout),
        Some(HeadSide::Local { keys, leases }),
        said_tx,
    );
    let (line_tx, mut lines) = mpsc::unbounded_channel();
    let exe = std::env::current_exe().expect("own path");
    let mut procs = Vec::new();
    let per = (n - 1).div_ceil(workers);
    for w in 0..workers {
        let first = 1 + w * per;
        let count = per.min(n.saturating_sub(first));
        if count == 0 {
            break;
        }
        let ip = Ipv4Addr::new(127, 0, 0, 2 + (w % 30) as u8);
        let mut child = Command::new(&exe)
            .args([
                "--scale-worker",
                &n.to_string(),
                &first.to_string(),
                &count.to_string(),
                &SocketAddr::from((ip, port)).to_string(),
                &peer_timeout.as_secs_f64().to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("worker starts");
        let stdout = child.stdout.take().expect("piped");
        let stdin = child.stdin.take().expect("piped");
        let tx = line_tx.clone();
        let idx = procs.len();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                if tx.send((idx, Some(l))).is_err() {
                    return;
                }
            }
            let _ = tx.send((idx, None));
        });
        procs.push(Worker { child, stdin });
    }
    let nw = procs.len();
    let mut losses = Vec::new();
    let mut fault = None;
    let mut probe = vigil_store::StoreClient::connect(addr, Duration::from_secs(30))
        .await
        .expect("probe connects");
    let owners: Vec<String> = (0..n).map(|i| format!("vigil/owner/{i}")).collect();
    let refs: Vec<&str> = owners.iter().map(String::as_str).collect();
    // In short waits, so that the harness running out of descriptors ends the run.
    let connect_by = Instant::now() + Duration::from_secs(300);
    // (A WAIT that times out breaks the connection; CHECK does not wait.)
    while !probe.check(&refs).await.unwrap_or(false) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Some(why) = head_fd_pressure() {
            fault.get_or_insert(why);
            break;
        }
        if Instant::now() > connect_by {
            fault.get_or_insert("the agents did not all connect within 300 s".into());
            break;
        }
    }
    let connect = t0.elapsed();
    // Join attempt 0: every worker's agents and node rank 0.
    let t1 = Instant::now();
    for w in &mut procs {
        w.tell("join 0");
    }
    let _ = tx0.send(JobRequest::Join {
        attempt: 0,
        calculated: None,
    });
    let joined_all = |attempt: u32, nw: usize| {
        let (mut workers_done, mut head_done) = (0usize, false);
        move |l: Option<(usize, &str)>, m: Option<&FromCoord>| {
            if l.is_some_and(|(_, l)| l == format!("joined {attempt}")) {
                workers_done += 1;
            }
            if matches!(m, Some(FromCoord::Event(Event::Joined { attempt: c, .. })) if *c == attempt)
            {
                head_done = true;
            }
            workers_done == nw && head_done
        }
    };
    let limit = Duration::from_secs(300);
    let ok = fault.is_none()
        && until(
            &mut lines,
            &mut said,
            limit,
            joined_all(0, nw),
            &mut losses,
            &mut fault,
            false,
        )
        .await;
    let join0 = t1.elapsed();
    // A failure reported by node rank 0; every agent (node rank 0 too) rejoins attempt 1.
    let t2 = Instant::now();
    let mut restart = Duration::ZERO;
    if ok {
        let _ = tx0.send(JobRequest::ReportEnd {
            attempt: 0,
            end: JobEnd::Failed {
                node: 0,
                reason: "bench".into(),
            },
        });
        let mut inner = joined_all(1, nw);
        let tx0c = tx0.clone();
        let ok1 = until(
            &mut lines,
            &mut said,
            limit,
            move |l, m| {
                if let Some(FromCoord::Event(Event::AttemptEnded { attempt: 0, .. })) = m {
                    let _ = tx0c.send(JobRequest::Join {
                        attempt: 1,
                        calculated: None,
                    });
                }
                inner(l, m)
            },
            &mut losses,
            &mut fault,
            false,
        )
        .await;
        restart = t2.elapsed();
        if !ok1 {
            fault.get_or_insert("attempt 1 never completed".into());
        }
        // Idle: any end or loss now is a node lost while nothing happened.
        let mut ended = Vec::new();
        until(
            &mut lines,
            &mut said,
            hold,
            |l, m| {
                if let Some((_, l)) = l.filter(|(_, l)| l.starts_with("ended ")) {
                    ended.push(l.to_string());
                }
                if let Some(FromCoord::Event(Event::AttemptEnded { end, .. })) = m {
                    ended.push(format!("ended 0 {end:?}"));
                }
                false
            },
            &mut losses,
            &mut fault,
            false,
        )
        .await;
        losses.extend(ended);
    } else {
        fault.get_or_insert("attempt 0 never completed".into());
    }
    // Leave, and the workers' own measurements.
    let mut fd_worker_max = 0;
    let mut cpu_workers = Duration::ZERO;
    for w in &mut procs {
        w.tell("leave");
    }
    let mut stats = 0;
    let _ = until(
        &mut lines,
        &mut said,
        Duration::from_secs(120),
        |l, _| {
            if let Some((w, l)) = l {
                if let Some(s) = l.strip_prefix("stats ") {
                    let v: Vec<u64> = s.split(' ').filter_map(|x| x.parse().ok()).collect();
                    if let [peak, limit, cpu] = v[..] {
                        fd_worker_max = fd_worker_max.max(peak as usize);
                        cpu_workers += Duration::from_millis(cpu);
                        if peak * 10 >= limit * 9 {
                            fault_note(w, peak, limit);
                        }
                    }
                    stats += 1;
                }
            }
            stats == nw
        },
        &mut losses,
        &mut fault,
        true,
    )
    .await;
    if stats < nw {
        fault.get_or_insert(format!("{} of {nw} workers gave no stats", nw - stats));
    }
    let _ = tx0.send(JobRequest::Leave {
        poison: None,
        highest_step: None,
    });
    let _ = task0.await;
    for w in &mut procs {
        let _ = w.child.wait();
    }
    let after = net_counters();
    let counters: Vec<(String, i64)> = COUNTERS
        .iter()
        .map(|k| (k.to_string(), delta(&before, &after, k)))
        .collect();
    for k in HARNESS_LOSS {
        let d = delta(&before, &after, k);
        if d > 0 {
            fault.get_or_insert(format!(
                "{k} grew by {d}: connections were dropped at the store's listen queue (net.core.somaxconn, the harness's connect storm), not by the protocol"
            ));
        }
    }
    let fd_head = peak.load(Ordering::Relaxed);
    if fd_head as u64 * 10 >= fd_limit * 9 {
        fault.get_or_insert(format!(
            "the head process reached {fd_head} of its {fd_limit} descriptors"
        ));
    }
    if fd_worker_max > 0 && FAULTY_WORKER.load(Ordering::Relaxed) > 0 {
        fault.get_or_insert("a worker reached 90% of its descriptor limit".into());
    }
    Row {
        agents: n,
        workers: nw as u32,
        connect,
        join0,
        restart,
        hold,
        losses,
        counters,
        fd_head,
        fd_worker_max,
        cpu_head: cpu_time() - cpu0,
        cpu_workers,
        harness_fault: fault,
    }
}

static FAULTY_WORKER: AtomicUsize = AtomicUsize::new(0);

/// The head's descriptor peak and limit, checked while it waits.
static HEAD_FD_PEAK: std::sync::OnceLock<(Arc<AtomicUsize>, u64)> = std::sync::OnceLock::new();

/// Why the head is out of descriptors, if it nearly is: the harness's own loss.
fn head_fd_pressure() -> Option<String> {
    let (peak, limit) = HEAD_FD_PEAK.get()?;
    let p = peak.load(Ordering::Relaxed) as u64;
    (p * 10 >= limit * 9).then(|| {
        format!("the head process reached {p} of its {limit} descriptors (raise `ulimit -n`)")
    })
}

fn fault_note(w: usize, peak: u64, limit: u64) {
    eprintln!("worker {w}: {peak} descriptors of its limit {limit}");
    FAULTY_WORKER.fetch_add(1, Ordering::Relaxed);
}

fn short(k: &str) -> &str {
    k.rsplit('.').next().unwrap_or(k)
}

/// Prints the table's header.
pub fn header() {
    let counters: Vec<&str> = COUNTERS.iter().map(|k| short(k)).collect();
    println!(
        "| agents | workers | connect + claim | join 0 | failure to all rejoined | idle hold | nodes lost | {} | fd peak head / worker | CPU head / workers |",
        counters.join(" | ")
    );
    println!("|{}", "---|".repeat(10 + COUNTERS.len()));
}

/// Prints one row; returns the one-line reason the run failed, if it did.
pub fn print(r: &Row) -> Option<String> {
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
    let counters: Vec<String> = r.counters.iter().map(|(_, v)| v.to_string()).collect();
    println!(
        "| {} | {} | {} | {} | {} | {:.0} s | {} | {} | {} / {} | {:.1} s / {:.1} s |",
        r.agents,
        r.workers,
        ms(r.connect),
        ms(r.join0),
        ms(r.restart),
        r.hold.as_secs_f64(),
        r.losses.len(),
        counters.join(" | "),
        r.fd_head,
        r.fd_worker_max,
        r.cpu_head.as_secs_f64(),
        r.cpu_workers.as_secs_f64()
    );
    for l in r.losses.iter().take(5) {
        eprintln!("  {} agents: {l}", r.agents);
    }
    if let Some(f) = &r.harness_fault {
        return Some(format!("{} agents: the harness itself lost: {f}", r.agents));
    }
    (!r.losses.is_empty()).then(|| {
        format!(
            "{} agents: the protocol lost {} node(s) (first: {})",
            r.agents,
            r.losses.len(),
            r.losses[0]
        )
    })
}

//! `vigil store --listen ADDR:PORT`: vigil's store as a long-lived service outside the job
//! (docs/store.md, "The store outside the job"). Agents started with `--rdzv-conf is_host=false`
//! are only its clients; node rank 0 coordinates through it (CLEAR_EXCEPT, CLEAR_PREFIX, the
//! lease queue).
//!
//! Besides serving, it watches the key space: it says when a job joins (`vigil/job` is written)
//! and clears the job's keys so that the next job (or the requeued one) starts from a clean store:
//! once the coordinator recorded the job's end (`vigil/job_end`) and every agent's lease is gone,
//! or, when every agent was lost and none wrote the end, once no lease was left for twice its
//! `--node-timeout`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::signal::unix::{signal, SignalKind};
use vigil_store::{KeySpace, StoreServer};

use crate::job::rendezvous::{key, JobShape};

/// How often the service looks for a job joining or ending.
const WATCH_PERIOD: Duration = Duration::from_millis(200);

/// `vigil store`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreArgs {
    /// Where to listen: ADDR:PORT (port 0 picks a free one; `[::]:PORT` for IPv6).
    #[arg(long = "listen", value_name = "ADDR:PORT")]
    pub listen: String,
    /// A file holding the store's secret (at least 16 bytes; white space around it removed).
    /// Default: $VIGIL_STORE_SECRET. Every agent of a job needs the same one in VIGIL_STORE_SECRET.
    #[arg(long = "secret-file", value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// A connection silent this long is dropped and its agent's lease released (the agents'
    /// --node-timeout).
    #[arg(long = "node-timeout", default_value_t = 30.0, value_parser = crate::values::seconds)]
    pub node_timeout: f64,
    /// Most bytes of keys, values, parked waits and transfers held at once.
    #[arg(long = "max-total-bytes", default_value_t = vigil_store::DEFAULT_MAX_TOTAL)]
    pub max_total_bytes: usize,
    /// Most connections in their handshake (not yet proven the secret) at once; one more closes
    /// the oldest of them. Every agent and rank of a job connects at once when it starts: give at
    /// least nodes x (1 + ranks per node) of the largest job it serves.
    #[arg(long = "max-in-handshake", default_value_t = vigil_store::LISTEN_BACKLOG as usize)]
    pub max_in_handshake: usize,
}

/// Why the service cannot start: one line naming the fix, exit status 2.
fn usage(msg: String) -> i32 {
    eprintln!("vigil store: error: {msg}");
    crate::exit::USAGE
}

/// The secret: from `--secret-file` (through the bounded reader), else `env`.
fn secret(file: Option<&Path>, env: Option<Vec<u8>>) -> Result<Option<Vec<u8>>, String> {
    let Some(path) = file else {
        return Ok(env);
    };
    super::store_host::read_secret(path)
        .map(Some)
        .map_err(|why| format!("cannot use --secret-file {}: {why}", path.display()))
}

/// Refuses an open store anywhere but on loopback: anyone who reaches it could read and change
/// every job's control keys. Pure.
pub fn refusal(addr: SocketAddr, has_secret: bool) -> Option<String> {
    if has_secret || addr.ip().is_loopback() {
        return None;
    }
    Some(format!(
        "refusing to serve {addr} without a secret: anyone who can reach it could read and change the agents' control keys; export VIGIL_STORE_SECRET=$(openssl rand -hex 32) (or give --secret-file FILE) here and the same VIGIL_STORE_SECRET to every agent of the job, or listen on a loopback address"
    ))
}

/// Runs the service until SIGTERM or SIGINT; its exit status.
pub fn store_main(args: StoreArgs) -> i32 {
    // Before any thread starts: the environment is not thread-safe to change.
    let env = match super::take_store_secret() {
        Ok(s) => s,
        Err(e) => return usage(e.to_string()),
    };
    let secret = match secret(args.secret_file.as_deref(), env) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    let addr = match args.listen.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(a)) => a,
        Ok(None) | Err(_) => {
            return usage(format!(
                "--listen {:?} is not ADDR:PORT: give an address of this machine and a port, such as 0.0.0.0:29400",
                args.listen
            ))
        }
    };
    if let Some(why) = refusal(addr, secret.is_some()) {
        return usage(why);
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vigil store: error: cannot start the event loop: {e}");
            return crate::exit::INTERNAL;
        }
    };
    rt.block_on(serve(addr, secret, &args))
}

async fn serve(addr: SocketAddr, secret: Option<Vec<u8>>, args: &StoreArgs) -> i32 {
    let mut server = match StoreServer::bind(addr).await {
        Ok(s) => s,
        Err(e) => return usage(format!("cannot listen on {addr}: {e}; give a free port of an address of this machine with --listen")),
    };
    server.set_secret(secret);
    server.set_max_total(args.max_total_bytes);
    server.set_max_in_handshake(args.max_in_handshake);
    server.set_lease_queue(true);
    if args.node_timeout > 0.0 {
        server.set_peer_timeout(Some(Duration::from_secs_f64(args.node_timeout)));
    }
    // Refusals are summed up on stdout, not told each: a flood of strangers must not cost a
    // line apiece (nor block the store on a stderr nobody reads).
    let (refused_tx, mut refused) = tokio::sync::mpsc::unbounded_channel();
    server.on_drop(super::store_host::service_drop_notice(
        server.key_space(),
        refused_tx,
    ));
    let local = match server.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("vigil store: error: {e}");
            return crate::exit::INTERNAL;
        }
    };
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        _ => {
            eprintln!("vigil store: error: cannot install the signal handlers");
            return crate::exit::INTERNAL;
        }
    };
    println!("listening on {local}");
    let handle = server.spawn();
    let keys = handle.key_space().clone();
    mark_service(&keys);
    let mut jobs = Jobs::default();
    // An agent between its lease's loss and its next one (none) is never this long.
    let grace = Duration::from_secs_f64(args.node_timeout.max(1.0) * 2.0);
    let mut tick = tokio::time::interval(WATCH_PERIOD);
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = tick.tick() => {
                for line in jobs.look(&keys, Instant::now(), grace) {
                    println!("{line}");
                }
            }
            Some(rec) = refused.recv() => {
                if let Some(line) = super::store_host::refused_text(&rec) {
                    println!("{line}");
                }
            }
        }
    }
    handle.shutdown().await;
    println!("stopped");
    crate::exit::SUCCESS
}

/// The job the store serves, as last seen.
#[derive(Default)]
struct Jobs {
    /// `vigil/job` as node rank 0 wrote it.
    current: Option<Vec<u8>>,
    /// Some agent of the current job held a lease.
    leased: bool,
    /// Since when no agent of the current job holds a lease, after some did.
    empty_since: Option<Instant>,
}

/// Tells the agents that no agent hosts this store ([`key::SERVICE`]): every one of them draws
/// its node rank (c10d without node ranks), the first drawing 0.
fn mark_service(keys: &KeySpace) {
    keys.set_raw(&raw(key::SERVICE), b"vigil store");
}

fn raw(k: &str) -> Vec<u8> {
    format!("/{k}").into_bytes()
}

/// How a job is named in the service's lines.
fn describe(shape: &[u8]) -> String {
    match serde_json::from_slice::<JobShape>(shape) {
        Ok(s) => format!(
            "{} (--nnodes {}, node rank 0's --nproc-per-node {})",
            s.job
                .as_deref()
                .map_or("without an id".to_string(), |j| format!("{j:?}")),
            s.nnodes,
            s.nproc
        ),
        Err(_) => "(a job this vigil does not understand)".to_string(),
    }
}

impl Jobs {
    /// What changed since the last look (at `now`), as lines to print. A job is cleared once
    /// its end is written and no lease is left, or, when no agent wrote its end (every one was
    /// lost), once no lease was left for `grace` after some agent held one.
    fn look(&mut self, keys: &KeySpace, now: Instant, grace: Duration) -> Vec<String> {
        let mut out = Vec::new();
        let shape = keys.get_raw(&raw(key::JOB));
        if let Some(s) = &shape {
            if self.current.as_ref() != Some(s) {
                out.push(format!("job {} joined", describe(s)));
                *self = Jobs {
                    current: Some(s.clone()),
                    ..Jobs::default()
                };
            }
        }
        let Some(cur) = self.current.clone() else {
            return out;
        };
        let leases = keys.count_prefix(vigil_store::LEASE_PREFIX);
        // A lease held and lost between two looks leaves its record (the lease queue is on).
        self.leased |= leases > 0 || keys.count_prefix(vigil_store::LEASE_LOST_PREFIX) > 0;
        self.empty_since = match (leases, self.empty_since) {
            (0, Some(t)) => Some(t),
            (0, None) if self.leased => Some(now),
            _ => None,
        };
        let ended = keys.get_raw(&raw(key::JOB_END)).is_some();
        let how = match (ended, self.empty_since) {
            (true, _) if leases == 0 => "ended and every agent left",
            (false, Some(t)) if now.duration_since(t) >= grace => {
                "lost every agent without an end written"
            }
            _ => return out,
        };
        // Every key of the store is the job's: torch's unprefixed `init/` counter too.
        let marked = keys.get_raw(&raw(key::SERVICE)).is_some();
        let n = keys.clear_prefix(b"") - usize::from(marked);
        mark_service(keys);
        out.push(format!(
            "job {} {how}: cleared its {n} keys",
            describe(&cur)
        ));
        *self = Jobs::default();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_store_is_refused_off_loopback_only() {
        let any: SocketAddr = "0.0.0.0:0".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let lo6: SocketAddr = "[::1]:0".parse().unwrap();
        assert!(refusal(any, false).unwrap().contains("VIGIL_STORE_SECRET"));
        assert_eq!(refusal(any, true), None);
        assert_eq!(refusal(lo, false), None);
        assert_eq!(refusal(lo6, false), None);
    }

    #[tokio::test]
    async fn a_job_is_said_once_and_cleared_when_it_ended_and_every_lease_is_gone() {
        let (_addr, keys, _leases) =
            crate::run::host_store("127.0.0.1:0".parse().unwrap(), Duration::from_secs(5), None)
                .expect("store up");
        mark_service(&keys);
        let mut jobs = Jobs::default();
        let t0 = Instant::now();
        let g = Duration::from_secs(10);
        assert!(jobs.look(&keys, t0, g).is_empty());
        let shape = br#"{"protocol": 3, "job": "j1", "nnodes": 2, "active": 2, "nproc": 1}"#;
        keys.set_raw(b"/vigil/job", shape);
        keys.set_raw(b"/vigil/lease/1", b"host");
        keys.set_raw(b"init/", b"2");
        let said = jobs.look(&keys, t0, g);
        assert_eq!(said.len(), 1);
        assert!(said[0].contains("\"j1\" (--nnodes 2"), "{said:?}");
        assert!(jobs.look(&keys, t0, g).is_empty());
        // Ended, but node 1 has not left yet.
        keys.set_raw(b"/vigil/job_end", b"");
        assert!(jobs.look(&keys, t0 + g * 5, g).is_empty());
        keys.clear_prefix(b"/vigil/lease/1");
        let said = jobs.look(&keys, t0 + g * 5, g);
        assert_eq!(said.len(), 1);
        assert!(said[0].contains("cleared its 3 keys"), "{said:?}");
        // The next job finds the store's mark, and nothing of this one.
        assert_eq!(keys.keys_raw(), vec![b"/vigil/service".to_vec()]);
    }

    #[tokio::test]
    async fn a_job_that_lost_every_agent_is_cleared_after_the_grace_and_not_before_a_lease() {
        let (_addr, keys, _leases) =
            crate::run::host_store("127.0.0.1:0".parse().unwrap(), Duration::from_secs(5), None)
                .expect("store up");
        mark_service(&keys);
        let (t0, g) = (Instant::now(), Duration::from_secs(10));
        let mut jobs = Jobs::default();
        // Joined, no lease yet (the agents are still drawing their node ranks): kept.
        keys.set_raw(
            b"/vigil/job",
            br#"{"protocol": 3, "job": "j", "nnodes": 2, "active": 2, "nproc": 1}"#,
        );
        keys.set_raw(b"/vigil/node_tickets", b"2");
        assert_eq!(jobs.look(&keys, t0, g).len(), 1);
        assert!(jobs.look(&keys, t0 + g * 9, g).is_empty());
        // Leases held, then every one gone with no end written: cleared one grace later (a
        // lease held and lost between two looks counts by its loss record).
        keys.set_raw(b"/vigil/lease_lost/coord", b"0");
        assert!(jobs.look(&keys, t0 + g * 10, g).is_empty());
        assert!(jobs.look(&keys, t0 + g * 10 + g / 2, g).is_empty());
        keys.set_raw(b"/vigil/lease/coord", b"0");
        assert!(jobs.look(&keys, t0 + g * 10 + g / 2, g).is_empty());
        keys.clear_prefix(b"/vigil/lease/");
        assert!(jobs.look(&keys, t0 + g * 11, g).is_empty());
        // A lease back within the grace (an agent reconnected) restarts the count.
        keys.set_raw(b"/vigil/lease/1", b"h");
        assert!(jobs.look(&keys, t0 + g * 11 + g / 2, g).is_empty());
        keys.clear_prefix(b"/vigil/lease/");
        assert!(jobs.look(&keys, t0 + g * 12, g).is_empty());
        assert!(jobs.look(&keys, t0 + g * 12 + g / 2, g).is_empty());
        let said = jobs.look(&keys, t0 + g * 13, g);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains("lost every agent without an end written: cleared its 3 keys"),
            "{said:?}"
        );
        assert_eq!(keys.keys_raw(), vec![b"/vigil/service".to_vec()]);
    }
}

//! Hosting vigil's store on node rank 0 and finding it from every node: where it listens, the
//! job's secret, and what the console hears of connections it closed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::report::console_note;
use vigil_events::Record;

mod refused;
use crate::cli::config::LaunchConfig;
use crate::job::rendezvous::HeadSide;
use refused::{drop_notice, RefusedOut};
pub(super) use refused::{refused_text, service_drop_notice, RefusedRx, DROP_NOTE_EVERY};

/// Where this node's agent reaches vigil's store, where the ranks reach it, and, on node rank 0,
/// the store itself.
pub(super) struct StoreSetup {
    pub(super) client_addr: SocketAddr,
    pub(super) for_ranks: (String, u16),
    pub(super) head: Option<HeadSide>,
    /// What this node's agent proves to the store (docs/store.md, "Who may use the store").
    pub(super) secret: Option<Arc<[u8]>>,
    /// The store's `store_refused` records, where this agent hosts it.
    pub(super) refused: Option<RefusedRx>,
}

/// The environment variable that carries the job's store secret to every node's agent.
pub const SECRET_ENV: &str = "VIGIL_STORE_SECRET";

/// Takes the job's store secret out of the environment, so that no rank inherits it. Call before
/// any other thread starts. A secret too short to be one is a one-line error.
pub fn take_store_secret() -> Result<Option<Vec<u8>>, vigil_store::auth::ShortSecret> {
    use std::os::unix::ffi::OsStrExt;
    let Some(v) = std::env::var_os(SECRET_ENV) else {
        return Ok(None);
    };
    std::env::remove_var(SECRET_ENV);
    vigil_store::auth::check_secret(v.as_bytes()).map(|s| Some(s.to_vec()))
}

/// The job's secret in its state directory, when it has one and no `VIGIL_STORE_SECRET`.
pub const SECRET_FILE: &str = "store.secret";

/// How often an agent looks for the secret node rank 0's agent writes.
const SECRET_POLL: Duration = Duration::from_millis(200);

/// The longest secret file read.
const SECRET_FILE_LIMIT: u64 = 4096;

/// Where an agent's store secret comes from (docs/store.md, "Who may use the store").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SecretSource {
    /// `VIGIL_STORE_SECRET`.
    Env,
    /// Alone on one node: as before (a random secret of node rank 0's own).
    Alone,
    /// `<state dir>/store.secret`, created by this agent, which may host the store, unless there
    /// already (a requeued allocation of the same job reuses it).
    CreateInStateDir(PathBuf),
    /// `<state dir>/store.secret`, written by the agent that hosts the store: waited for.
    AwaitInStateDir(PathBuf),
    /// Several nodes and nothing they all read: the control keys stay open (one console note).
    Open,
}

/// Which secret an agent uses: `env`: `VIGIL_STORE_SECRET` is set; `may_host`: this agent hosts
/// the store (node rank 0) or may (a c10d rendezvous endpoint's host); `state_dir`: the job's
/// state directory, if it has one every node may share (`--state-dir`, or a Slurm job's). Pure.
pub(super) fn secret_source(
    env: bool,
    nnodes: u32,
    may_host: bool,
    state_dir: Option<&Path>,
) -> SecretSource {
    if env {
        return SecretSource::Env;
    }
    if nnodes <= 1 {
        return SecretSource::Alone;
    }
    match state_dir {
        Some(d) if may_host => SecretSource::CreateInStateDir(d.join(SECRET_FILE)),
        Some(d) => SecretSource::AwaitInStateDir(d.join(SECRET_FILE)),
        None => SecretSource::Open,
    }
}

/// Whether this agent hosts (or, under a c10d rendezvous, may host) vigil's store.
pub(super) fn may_host(cfg: &LaunchConfig) -> bool {
    if cfg.node_rank_by_rdzv {
        cfg.rdzv_is_host != Some(false)
    } else {
        cfg.node_rank == 0 && cfg.rdzv_is_host != Some(false)
    }
}

/// The secret in a secret file's bytes: without surrounding white space (a file written by
/// `echo` ends in a newline), long enough to be one.
fn parse_secret(bytes: &[u8]) -> Result<Vec<u8>, vigil_store::auth::ShortSecret> {
    let t = bytes.trim_ascii();
    vigil_store::auth::check_secret(t).map(<[u8]>::to_vec)
}

/// Reads the secret at `path` (through the bounded reader). `Err`: why not, without the path.
pub(super) fn read_secret(path: &Path) -> Result<Vec<u8>, String> {
    let bytes = vigil_bounded::read_bytes(path, SECRET_FILE_LIMIT).map_err(|e| e.reason())?;
    parse_secret(&bytes).map_err(|e| {
        format!(
            "it holds {} bytes, fewer than {}",
            e.len,
            vigil_store::auth::MIN_SECRET_LEN
        )
    })
}

/// The secret at `path`, created there first unless it exists: written to a file of its own
/// (mode 0600) and hard-linked into place, so that it is never replaced and never seen half
/// written; the directory is created 0700 if missing. A file system without hard links gets an
/// exclusive create instead.
pub(super) fn create_secret(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    if path.exists() {
        return read_secret(path).map_err(|e| format!("{}: {e}", path.display()));
    }
    let drawn = vigil_store::auth::random_secret()
        .map_err(|e| format!("cannot draw a random secret: {e}"))?;
    let text: String = drawn.iter().map(|b| format!("{b:02x}")).collect();
    let write_new = |at: &Path| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(at)?;
        f.write_all(format!("{text}\n").as_bytes())?;
        f.sync_all()
    };
    let tmp = dir.join(format!(
        ".{SECRET_FILE}.{}.{}",
        std::process::id(),
        &text[..8]
    ));
    let linked = write_new(&tmp).and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        // No hard links here (some object-store file systems): exclusive create, never replace.
        Err(_) => match write_new(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot write {}: {e}", path.display())),
        },
    }
    read_secret(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Waits up to `timeout` (polling every [`SECRET_POLL`]) for the secret the store's host
/// writes to `path`; the error is the one line that names the fix.
pub(super) async fn await_secret(
    path: &Path,
    timeout: Duration,
) -> Result<Vec<u8>, StoreSetupError> {
    let deadline = Instant::now() + timeout;
    loop {
        let why = match read_secret(path) {
            Ok(s) => return Ok(s),
            Err(why) => why,
        };
        if Instant::now() >= deadline {
            return Err(StoreSetupError(format!(
                "node rank 0's store requires the job's secret, which it wrote to {}, and this node cannot read it ({why}, after {}s): give every node a --state-dir they share, or export {SECRET_ENV}=$(openssl rand -hex 32) in the job script",
                path.display(),
                timeout.as_secs()
            )));
        }
        tokio::time::sleep(SECRET_POLL).await;
    }
}

/// The secret this agent proves to (and, hosting, requires of) vigil's store: `env` from
/// `VIGIL_STORE_SECRET`, else by [`secret_source`]. `None` where today's behaviour holds (alone,
/// or several nodes without a state directory).
pub(super) async fn job_secret(
    cfg: &LaunchConfig,
    env: Option<Vec<u8>>,
) -> Result<Option<Vec<u8>>, StoreSetupError> {
    let source = secret_source(
        env.is_some(),
        cfg.nnodes,
        may_host(cfg),
        cfg.allocation
            .state_dir
            .as_deref()
            .filter(|_| cfg.allocation.state_dir_shared),
    );
    match source {
        SecretSource::Env | SecretSource::Alone | SecretSource::Open => Ok(env),
        SecretSource::CreateInStateDir(path) => create_secret(&path).map(Some).map_err(|e| {
            StoreSetupError(format!(
                "cannot keep the job's store secret in its state directory: {e}; give a writable --state-dir, or export {SECRET_ENV}=$(openssl rand -hex 32) in the job script"
            ))
        }),
        SecretSource::AwaitInStateDir(path) => await_secret(&path, cfg.join_timeout).await.map(Some),
    }
}

/// The soft open-file limit this agent was started with, before [`raise_nofile`]: what the ranks
/// get back (torchrun leaves the limit alone, so a training script sees the one its job script
/// set; programs that close every descriptor up to the limit stay fast).
static STARTED_NOFILE: std::sync::OnceLock<libc::rlimit> = std::sync::OnceLock::new();

fn get_nofile() -> Option<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0).then_some(lim)
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (node rank 0's store holds
/// several connections per agent: a common soft limit of 1,024 runs out near 250 nodes), and
/// remembers the limit it started with for the ranks ([`ranks_nofile`]). Returns the soft limit
/// now in force. Call once, before any thread starts.
pub fn raise_nofile() -> u64 {
    let Some(lim) = get_nofile() else {
        return 1024;
    };
    let _ = STARTED_NOFILE.set(lim);
    if lim.rlim_cur >= lim.rlim_max {
        return lim.rlim_cur;
    }
    let raised = libc::rlimit {
        rlim_cur: lim.rlim_max,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: setrlimit only reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        raised.rlim_cur
    } else {
        lim.rlim_cur
    }
}

/// The open-file limit the agent was started with, for a rank to restore between fork and exec
/// (`None`: the agent did not change it).
pub fn ranks_nofile() -> Option<libc::rlimit> {
    let started = *STARTED_NOFILE.get()?;
    let now = get_nofile()?;
    (now.rlim_cur != started.rlim_cur).then_some(started)
}

/// Descriptors node rank 0's store holds per agent: its one connection (which holds its lease and
/// carries every request and wait, PROTOCOL 3), and one for an agent started again (a requeue)
/// while its last connection is still closing.
pub const STORE_FDS_PER_AGENT: u64 = 2;
/// Descriptors the store holds per rank of the job: torch's TCPStore client, and a clone some
/// torch versions open for their watchdog.
pub const STORE_FDS_PER_RANK: u64 = 2;
/// Everything else node rank 0's agent holds open: its own ranks' pipes, the ranks' socket, logs.
pub const STORE_FDS_MARGIN: u64 = 256;

/// The open files node rank 0 needs to host the store for `nnodes` agents of `nproc` ranks.
pub fn store_fds(nnodes: u32, nproc: u32) -> u64 {
    let n = u64::from(nnodes);
    n * STORE_FDS_PER_AGENT + n * u64::from(nproc) * STORE_FDS_PER_RANK + STORE_FDS_MARGIN
}

/// Node rank 0 refuses to host a store it cannot hold: `soft`/`hard` are its open-file limits
/// after [`raise_nofile`].
pub fn check_store_fds(
    nnodes: u32,
    nproc: u32,
    soft: u64,
    hard: u64,
) -> Result<(), StoreSetupError> {
    let need = store_fds(nnodes, nproc);
    if soft >= need {
        return Ok(());
    }
    Err(StoreSetupError(format!(
        "node rank 0 cannot host vigil's store for --nnodes {nnodes} with --nproc-per-node {nproc}: it needs about {need} open files ({STORE_FDS_PER_AGENT} per node, {STORE_FDS_PER_RANK} per rank, {STORE_FDS_MARGIN} more), the open-file limit is {soft} (hard limit {hard}); raise the hard limit on node rank 0 (`ulimit -Hn {need}` where allowed, `nofile` in /etc/security/limits.conf, or Slurm's PropagateResourceLimits / `srun --propagate=NOFILE` from a shell with `ulimit -n {need}`)"
    )))
}

/// Why node rank 0 cannot host vigil's store, or another node cannot find it: one line that
/// names the fix (the agent only prints it).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StoreSetupError(String);

/// MASTER_ADDR for the ranks: the address as the user (or torchrun's defaults) wrote it, as
/// torchrun passes it on (`localhost` stays `localhost`), where it leads to the store: it
/// resolved here to `ranks_ip`, the address the ranks reach the store at. Otherwise, and for a
/// Slurm node name (which DNS may not know), the address itself.
fn ranks_name(
    cfg: &LaunchConfig,
    resolved: std::net::IpAddr,
    ranks_ip: std::net::IpAddr,
) -> String {
    if cfg.master_is_slurm_node || resolved != ranks_ip {
        ranks_ip.to_string()
    } else {
        cfg.master_addr.clone()
    }
}

/// Where node rank 0 listens: one node, loopback only; several, the address `MASTER_ADDR`
/// resolved to (`head`). `master_is_literal`: the user gave that address as an IP, not a name.
pub(super) fn bind_addr(nnodes: u32, head: SocketAddr, master_is_literal: bool) -> SocketAddr {
    let port = head.port();
    let loopback: std::net::IpAddr = match head {
        SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
        SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
    };
    if nnodes == 1 {
        return SocketAddr::new(loopback, port);
    }
    // A name that this machine alone resolves to loopback (Debian's 127.0.1.1 for its own
    // hostname) says nothing about where the other nodes reach it.
    if head.ip().is_loopback() && !master_is_literal {
        return SocketAddr::new(unspecified(head), port);
    }
    head
}

pub(super) fn unspecified(a: SocketAddr) -> std::net::IpAddr {
    match a {
        SocketAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    }
}

pub(super) fn scontrol_show_node(name: &str) -> Option<String> {
    let out = std::process::Command::new("scontrol")
        .args(["show", "node", name, "-o"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(super) fn setup_store(
    cfg: &LaunchConfig,
    secret: Option<Vec<u8>>,
) -> Result<StoreSetup, StoreSetupError> {
    let port = cfg.master_port.unwrap_or(0);
    let head = crate::job::nodes::resolve_head(
        &cfg.master_addr,
        port,
        cfg.master_is_slurm_node,
        &scontrol_show_node,
    )
    .map_err(|e| StoreSetupError(e.to_string()))?;
    let client = || StoreSetup {
        client_addr: head,
        for_ranks: (ranks_name(cfg, head.ip(), head.ip()), head.port()),
        head: None,
        secret: secret.clone().map(Arc::from),
        refused: None,
    };
    if cfg.node_rank_by_rdzv {
        return rdzv_store(cfg, head, secret.clone(), client);
    }
    if cfg.node_rank == 0 && cfg.rdzv_is_host == Some(false) {
        // The store runs outside the job (`vigil store`): node rank 0 coordinates through it.
        return Ok(StoreSetup {
            head: Some(HeadSide::Remote),
            ..client()
        });
    }
    if cfg.node_rank != 0 {
        return Ok(client());
    }
    if cfg.nnodes > 1 {
        if let Some(lim) = get_nofile() {
            check_store_fds(cfg.nnodes, cfg.nproc, lim.rlim_cur, lim.rlim_max)?;
        }
    }
    let secret = head_secret(secret, cfg.nnodes)?;
    let literal = cfg.master_addr.parse::<std::net::IpAddr>().is_ok();
    let mut bind = bind_addr(cfg.nnodes, head, literal);
    warn_small_backlog(cfg);
    let host = |bind| {
        host_job_store(
            bind,
            cfg.node_timeout,
            secret.as_deref().map(<[u8]>::to_vec),
            (cfg.nnodes, cfg.nproc),
        )
    };
    let mut hosted = host(bind);
    if matches!(&hosted, Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable) {
        // MASTER_ADDR is not an address of this machine (NAT, a proxy, a wrong name).
        console_note(&format!(
            "{} (MASTER_ADDR) is not an address of this machine, so vigil's store listens on every address of it",
            head.ip()
        ));
        bind = SocketAddr::new(unspecified(head), port);
        hosted = host(bind);
    }
    let ((bound, keys, leases), refused) = hosted.map_err(|e| {
        StoreSetupError(format!(
            "cannot listen on {bind} for vigil's store: {e}; {}",
            if e.kind() == std::io::ErrorKind::AddrInUse {
                "another program uses that port: give a free one with --master-port"
            } else {
                "give an address of this machine with --master-addr"
            }
        ))
    })?;
    let client_addr = client_addr_of(bound);
    // Alone, the ranks reach the store where it listens: on loopback.
    let ranks_ip = if cfg.nnodes == 1 {
        bind.ip()
    } else {
        head.ip()
    };
    Ok(StoreSetup {
        client_addr,
        for_ranks: (ranks_name(cfg, head.ip(), ranks_ip), bound.port()),
        head: Some(HeadSide::Local { keys, leases }),
        secret,
        refused: Some(refused),
    })
}

/// The secret of the store node rank 0 hosts: the job's, else (alone) one drawn here, else none
/// (several nodes with nothing shared to keep one in: the store runs open, said once).
fn head_secret(secret: Option<Vec<u8>>, nnodes: u32) -> Result<Option<Arc<[u8]>>, StoreSetupError> {
    let secret = match secret {
        Some(s) => s,
        // Alone, this agent is the store's only agent: a secret of its own is enough.
        None if nnodes == 1 => vigil_store::auth::random_secret().map_err(|e| {
            StoreSetupError(format!(
                "cannot draw a random secret for vigil's store: {e}"
            ))
        })?,
        None => {
            console_note(&format!(
                "{SECRET_ENV} is not set and the job has no state directory (--state-dir) to keep one in: anyone who can reach vigil's store can read and change the agents' control keys; export {SECRET_ENV}=$(openssl rand -hex 32) in the job script so that every node inherits the same one"
            ));
            Vec::new()
        }
    };
    let secret = (!secret.is_empty()).then(|| Arc::<[u8]>::from(secret));
    Ok(secret)
}

/// Says once when the kernel caps the listen backlog below the job's own burst (not vigil's
/// larger default).
fn warn_small_backlog(cfg: &LaunchConfig) {
    let burst = connect_burst(cfg.nnodes, cfg.nproc);
    if let Some(cap) = vigil_store::somaxconn().filter(|c| u64::from(*c) < burst) {
        console_note(&format!(
            "net.core.somaxconn is {cap}: vigil's store needs a listen backlog of {burst} for --nnodes {} (every node and rank connecting at once) and the kernel caps it; if agents fail to connect, raise it on node rank 0 (sysctl -w net.core.somaxconn={burst})",
            cfg.nnodes
        ));
    }
}

/// c10d without node ranks (torchrun's): the agent on the endpoint's host that binds it first
/// hosts the store and is node rank 0 (job/nodes.rs `rdzv_host_role`); every other agent (the
/// endpoint is not an address here, or another agent of this machine holds it) is a client.
fn rdzv_store(
    cfg: &LaunchConfig,
    head: SocketAddr,
    secret: Option<Vec<u8>>,
    client: impl Fn() -> StoreSetup,
) -> Result<StoreSetup, StoreSetupError> {
    use crate::job::nodes::{rdzv_host_role, RdzvRole};
    if cfg.rdzv_is_host == Some(false) {
        return Ok(client());
    }
    let secret = secret.filter(|s| !s.is_empty()).map(Arc::<[u8]>::from);
    let host = |at| {
        let secret = secret.as_deref().map(<[u8]>::to_vec);
        host_job_store(at, cfg.node_timeout, secret, (cfg.nnodes, cfg.nproc))
    };
    let literal = cfg.master_addr.parse::<std::net::IpAddr>().is_ok();
    let mut at = bind_addr(cfg.nnodes, head, literal);
    let mut hosted = host(at);
    let bound = hosted.as_ref().map(|_| ()).map_err(std::io::Error::kind);
    match rdzv_host_role(
        cfg.rdzv_is_host,
        bound,
        names_this_machine(&cfg.master_addr),
    ) {
        RdzvRole::Host | RdzvRole::Fail(_) => {}
        RdzvRole::HostOnEveryAddress => {
            at = SocketAddr::new(unspecified(head), head.port());
            hosted = host(at);
        }
        RdzvRole::Client => return Ok(client()),
    }
    // The host is known only now: the same refusal as a node rank 0 given by flags or Slurm.
    if let (true, Some(lim)) = (cfg.nnodes > 1, get_nofile()) {
        check_store_fds(cfg.nnodes, cfg.nproc, lim.rlim_cur, lim.rlim_max)?;
    }
    let ((bound, keys, leases), refused) = hosted.map_err(|e| {
        StoreSetupError(format!(
            "cannot listen on {at} for vigil's store, which this agent hosts as the rendezvous endpoint's host: {e}; give --rdzv-endpoint a free port of one of the job's machines, or --rdzv-conf is_host=false on the agents that should not host it"
        ))
    })?;
    Ok(StoreSetup {
        client_addr: client_addr_of(bound),
        for_ranks: (ranks_name(cfg, head.ip(), head.ip()), bound.port()),
        head: Some(HeadSide::Local { keys, leases }),
        secret,
        refused: Some(refused),
    })
}

/// Whether `host` is this machine's host name, or a fully qualified name of it (torch's
/// `_matches_machine_hostname` also compares the names' addresses; binding did that here).
fn names_this_machine(host: &str) -> bool {
    let Ok(me) = nix::unistd::gethostname() else {
        return false;
    };
    let me = me.to_string_lossy().to_ascii_lowercase();
    let host = host.to_ascii_lowercase();
    !me.is_empty() && (host == me || host.strip_prefix(&me).is_some_and(|r| r.starts_with('.')))
}

/// Where this machine's agent reaches a store listening at `bound`.
fn client_addr_of(bound: SocketAddr) -> SocketAddr {
    match bound {
        SocketAddr::V4(a) if a.ip().is_unspecified() => {
            SocketAddr::from(([127, 0, 0, 1], a.port()))
        }
        SocketAddr::V6(a) if a.ip().is_unspecified() => {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, a.port()))
        }
        a => a,
    }
}

/// A running store: its address, its key space and the other agents' lease events.
pub type HostedStore = (
    SocketAddr,
    vigil_store::KeySpace,
    mpsc::UnboundedReceiver<vigil_store::LeaseEvent>,
);

/// Runs vigil's store on a thread of its own, so that the ranks' and agents' requests are
/// answered whatever the agent's event loop is busy with. With a `secret`, only agents that
/// prove they hold it may use the `/vigil/` keys.
pub fn host_store(
    bind: SocketAddr,
    peer_timeout: Duration,
    secret: Option<Vec<u8>>,
) -> std::io::Result<HostedStore> {
    host_store_with_backlog(bind, peer_timeout, secret, vigil_store::LISTEN_BACKLOG)
}

/// The listen backlog for a job: every agent's first connections and every rank's arriving at
/// once (a job's start), at least vigil_store's default ([`vigil_store::LISTEN_BACKLOG`]).
/// Connections that may arrive at once: each agent's one and each rank's.
fn connect_burst(nnodes: u32, nproc: u32) -> u64 {
    u64::from(nnodes).saturating_mul(1 + u64::from(nproc))
}

pub fn listen_backlog(nnodes: u32, nproc: u32) -> u32 {
    connect_burst(nnodes, nproc).clamp(
        u64::from(vigil_store::LISTEN_BACKLOG),
        u64::from(i32::MAX as u32),
    ) as u32
}

/// How many connections node rank 0's store lets be in their handshake at once: every agent's
/// and every rank's arriving together (a job's start, [`connect_burst`]), at least the store's
/// default. A flood of connections that never prove the secret holds no more descriptors than
/// that, which the open-file check ([`store_fds`]) already counts; beyond it the oldest is closed.
pub fn handshake_cap(nnodes: u32, nproc: u32) -> usize {
    let burst = usize::try_from(connect_burst(nnodes, nproc)).unwrap_or(usize::MAX);
    burst.max(vigil_store::core::gate::MAX_IN_HANDSHAKE)
}

/// The store of a job of `nnodes` nodes of `nproc` ranks: its listen backlog and handshake cap
/// sized for the job ([`listen_backlog`], [`handshake_cap`]), its refusals told to the event loop.
fn host_job_store(
    bind: SocketAddr,
    peer_timeout: Duration,
    secret: Option<Vec<u8>>,
    (nnodes, nproc): (u32, u32),
) -> std::io::Result<(HostedStore, RefusedRx)> {
    let backlog = listen_backlog(nnodes, nproc);
    let (tx, rx) = mpsc::unbounded_channel();
    let sized = (backlog, handshake_cap(nnodes, nproc));
    host_store_sized(bind, peer_timeout, secret, sized, Some(tx)).map(|h| (h, rx))
}

/// [`host_store`] with a listen backlog of `backlog`, and as many connections in their handshake
/// at once (benches and tests that size the store themselves).
pub fn host_store_with_backlog(
    bind: SocketAddr,
    peer_timeout: Duration,
    secret: Option<Vec<u8>>,
    backlog: u32,
) -> std::io::Result<HostedStore> {
    host_store_sized(
        bind,
        peer_timeout,
        secret,
        (backlog, backlog as usize),
        None,
    )
}

/// `(backlog, in_handshake)`: the listen backlog and the connections in their handshake at
/// once; `refused`: where `store_refused` records go (`None`: the console only).
fn host_store_sized(
    bind: SocketAddr,
    peer_timeout: Duration,
    secret: Option<Vec<u8>>,
    (backlog, in_handshake): (u32, usize),
    refused: Option<mpsc::UnboundedSender<Record>>,
) -> std::io::Result<HostedStore> {
    serve_on_own_thread("vigil-store", move || async move {
        let mut server = vigil_store::StoreServer::bind_with_backlog(bind, backlog).await?;
        server.set_peer_timeout(Some(peer_timeout));
        server.set_secret(secret);
        server.set_max_in_handshake(in_handshake);
        let keys = server.key_space();
        server.on_drop(drop_notice(refused.map(|tx| RefusedOut {
            keys: keys.clone(),
            tx,
            notes: Arc::default(),
        })));
        let leases = server.lease_events();
        let hosted = (server.local_addr()?, keys, leases);
        Ok((hosted, server.serve()))
    })
}

/// Runs a service on a thread of its own, on a runtime of its own, so that it answers whatever
/// the agent's event loop is busy with: `setup` (run on that thread) binds it and returns what the
/// caller gets back and the future that serves it; an error in `setup` is the caller's.
pub(super) fn serve_on_own_thread<T, F, Fut, Serve>(name: &str, setup: F) -> std::io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = std::io::Result<(T, Serve)>>,
    Serve: std::future::Future<Output = ()>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            rt.block_on(async move {
                match setup().await {
                    Ok((value, serve)) => {
                        let _ = tx.send(Ok(value));
                        serve.await;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            });
        })?;
    rx.recv()
        .unwrap_or_else(|_| Err(std::io::Error::other(format!("the {name} thread ended"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machines_name_with_or_without_its_domain() {
        let me = nix::unistd::gethostname()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(names_this_machine(&me));
        assert!(names_this_machine(&me.to_ascii_uppercase()));
        assert!(names_this_machine(&format!("{me}.cluster.local")));
        assert!(!names_this_machine(&format!("{me}x")));
        assert!(!names_this_machine("vigil-no-such-host.invalid"));
    }

    #[test]
    fn the_store_listens_where_the_nodes_need_it() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        // Alone: loopback, whatever MASTER_ADDR says.
        assert_eq!(bind_addr(1, a("10.1.2.3:5000"), true), a("127.0.0.1:5000"));
        assert_eq!(bind_addr(1, a("[fd00::1]:5000"), true), a("[::1]:5000"));
        // Several: MASTER_ADDR's address.
        assert_eq!(bind_addr(4, a("10.1.2.3:5000"), false), a("10.1.2.3:5000"));
        assert_eq!(bind_addr(2, a("127.0.0.1:5000"), true), a("127.0.0.1:5000"));
        // A name only this machine resolves to loopback: every address.
        assert_eq!(bind_addr(2, a("127.0.1.1:5000"), false), a("0.0.0.0:5000"));
    }

    #[test]
    fn node_rank_0_refuses_a_job_its_open_file_limit_cannot_hold() {
        // 1,024 (a common soft limit) holds about 30 nodes of 8 ranks (each rank has its own
        // connection), about 90 of simulated agents without ranks.
        assert!(check_store_fds(30, 8, 1024, 1024).is_ok());
        assert!(check_store_fds(90, 0, 1024, 1024).is_ok());
        let e = check_store_fds(250, 8, 1024, 4096).unwrap_err().to_string();
        assert!(
            e.contains("--nnodes 250") && e.contains("1024") && e.contains("ulimit"),
            "{e}"
        );
        assert!(!e.contains('\n'));
        // 10,000 nodes of 8 ranks fit a hard limit of 2^20.
        assert!(check_store_fds(10_000, 8, 1 << 20, 1 << 20).is_ok());
    }

    #[test]
    fn the_secret_comes_from_the_environment_else_the_state_dir_for_several_nodes() {
        let d = Path::new("/shared/vigil-job-c-42");
        let f = d.join(SECRET_FILE);
        use SecretSource::*;
        assert_eq!(secret_source(true, 4, true, Some(d)), Env);
        assert_eq!(secret_source(true, 4, false, None), Env);
        assert_eq!(secret_source(false, 1, true, Some(d)), Alone);
        assert_eq!(
            secret_source(false, 4, true, Some(d)),
            CreateInStateDir(f.clone())
        );
        assert_eq!(secret_source(false, 4, false, Some(d)), AwaitInStateDir(f));
        assert_eq!(secret_source(false, 4, true, None), Open);
        assert_eq!(secret_source(false, 4, false, None), Open);
    }

    #[test]
    fn a_secret_file_is_trimmed_and_must_be_long_enough() {
        assert_eq!(
            parse_secret(b"0123456789abcdef0123\n").unwrap(),
            b"0123456789abcdef0123"
        );
        assert_eq!(parse_secret(b"  short \n").unwrap_err().len, 5);
    }

    #[test]
    fn the_secret_is_created_once_0600_in_a_0700_directory_and_then_reused() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("vigil-secret-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let path = base.join("job").join(SECRET_FILE);
        let a = create_secret(&path).unwrap();
        assert!(a.len() >= 32);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        // A requeued allocation, or another agent that may host: the same secret, not replaced.
        assert_eq!(create_secret(&path).unwrap(), a);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        assert_eq!(
            rt.block_on(await_secret(&path, Duration::from_secs(1)))
                .unwrap(),
            a
        );
        // Nothing left beside it.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(SECRET_FILE)]);
        // A node that never sees it: one line naming both fixes.
        let e = rt
            .block_on(await_secret(
                &base.join("none").join(SECRET_FILE),
                Duration::from_millis(300),
            ))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--state-dir they share")
                && e.contains("openssl rand -hex 32")
                && !e.contains('\n'),
            "{e}"
        );
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn as_many_may_be_in_their_handshake_as_a_job_connects_at_once() {
        assert_eq!(
            handshake_cap(2, 2),
            vigil_store::core::gate::MAX_IN_HANDSHAKE
        );
        assert_eq!(handshake_cap(1024, 0), 1024);
        assert_eq!(handshake_cap(10_000, 8), 90_000);
    }

    #[test]
    fn the_listen_backlog_is_sized_for_the_job() {
        assert_eq!(listen_backlog(2, 8), vigil_store::LISTEN_BACKLOG);
        assert_eq!(listen_backlog(10_000, 8), 90_000);
        assert_eq!(listen_backlog(u32::MAX, u32::MAX), i32::MAX as u32);
    }
}

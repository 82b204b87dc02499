//! Who the nodes of a job are: from torchrun's flags, from Slurm, or from NVIDIA Base Command
//! (NGC). Pure: the environment is passed in as a function. A flag that contradicts the
//! environment is an error naming both, never a silent choice.

use vigil_slurm::nodelist::{self, NodeListError};

use crate::values::{err, ConfigError};

/// torchrun's flags that say who the nodes are (`None`: not given).
#[derive(Debug, Clone, Default)]
pub struct NodeFlags<'a> {
    pub nnodes: Option<&'a str>,
    pub node_rank: Option<u32>,
    pub master_addr: Option<&'a str>,
    pub master_port: Option<u16>,
    /// `host[:port]`; empty when not given.
    pub rdzv_endpoint: &'a str,
    /// `none` when not given (torchrun's default).
    pub rdzv_id: &'a str,
    pub standalone: bool,
    /// `--rdzv-backend`: with `c10d` and no node rank anywhere, the rendezvous hands them out.
    pub rdzv_backend: &'a str,
}

/// Where the node facts came from, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Flags,
    Slurm,
    Ngc,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nodes {
    /// Every agent of the job, standbys included.
    pub nnodes: u32,
    /// The nodes that run ranks (group ranks); the rest are standbys (`--nnodes MIN:MAX`).
    pub active: u32,
    /// 0 until the rendezvous has handed it out, when `rank_by_rdzv`.
    pub node_rank: u32,
    /// No node rank anywhere (flags, Slurm, NGC) and a c10d rendezvous: the agent that hosts the
    /// store at the endpoint is node rank 0, the others get 1..N-1 in the order they join.
    pub rank_by_rdzv: bool,
    /// The job's identity, if something outside vigil names it (`--rdzv-id`, Slurm, NGC).
    pub job_id: Option<String>,
    /// Host name or address of node rank 0, where vigil's store runs.
    pub head_host: String,
    /// The store's port; `None` on a single node without a port: pick a free one.
    pub port: Option<u16>,
    pub source: Source,
    /// Under Slurm: the head's name is a Slurm node name (resolve it through Slurm if DNS fails).
    pub slurm_head: bool,
}

/// torchrun's default port of a c10d rendezvous endpoint given without one.
pub const RDZV_DEFAULT_PORT: u16 = 29400;
/// torchrun's default `--master-port`.
pub const MASTER_DEFAULT_PORT: u16 = 29500;

/// Under Slurm without a port: one derived from the job id, so that jobs sharing a node do not
/// collide, below Linux's ephemeral range (32768+).
pub fn slurm_port(job_id: &str) -> u16 {
    let id: u64 = job_id
        .bytes()
        .filter(u8::is_ascii_digit)
        .fold(0u64, |a, b| {
            a.wrapping_mul(10).wrapping_add((b - b'0') as u64)
        });
    20000 + (id % 12000) as u16
}

/// `host`, `host:port`, `[v6]:port` or `[v6]`. Port 0 is torchrun's "any free port".
pub fn split_endpoint(ep: &str) -> Result<(String, Option<u16>), ConfigError> {
    let bad = |why: &str| {
        ConfigError(format!(
            "--rdzv-endpoint {ep:?}: {why}; give host:port such as node001:29400"
        ))
    };
    let (host, port) = if let Some(rest) = ep.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(|| bad("missing ]"))?;
        match after.strip_prefix(':') {
            Some(p) => (h, Some(p)),
            None if after.is_empty() => (h, None),
            None => return Err(bad("unexpected text after ]")),
        }
    } else if ep.matches(':').count() > 1 {
        return Err(bad("an IPv6 address must be written in brackets"));
    } else {
        match ep.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (ep, None),
        }
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .map_err(|_| bad("the port must be a number from 0 (any free port) to 65535"))?,
        ),
    };
    Ok((host.to_string(), port))
}

fn env_u32(env: &dyn Fn(&str) -> Option<String>, var: &str) -> Result<Option<u32>, ConfigError> {
    match env(var) {
        None => Ok(None),
        Some(v) => match v.trim().parse::<u32>() {
            Ok(n) => Ok(Some(n)),
            Err(_) => err(format!(
                "{var}={v:?} is not a number; vigil reads it to find this job's nodes"
            )),
        },
    }
}

/// What the environment says about the nodes.
struct EnvNodes {
    source: Source,
    nnodes: u32,
    nnodes_var: &'static str,
    node_rank: u32,
    node_rank_var: &'static str,
    head: String,
    run_id: Option<String>,
    port: Option<u16>,
}

fn from_slurm(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<EnvNodes>, ConfigError> {
    let Some(job_id) = env("SLURM_JOB_ID") else {
        return Ok(None);
    };
    // Inside `srun` the step's own values describe the nodes the agents run on.
    let (nnodes, nnodes_var) = match env_u32(env, "SLURM_STEP_NUM_NODES")? {
        Some(n) => (n, "SLURM_STEP_NUM_NODES"),
        None => match env_u32(env, "SLURM_NNODES")? {
            Some(n) => (n, "SLURM_NNODES"),
            None => return Ok(None),
        },
    };
    let node_rank = env_u32(env, "SLURM_NODEID")?.unwrap_or(0);
    if nnodes > 1 && env("SLURM_STEP_ID").is_none() {
        return err(format!(
            "this is a {nnodes}-node Slurm job, but vigil is not running under srun (SLURM_STEP_ID is unset): \
             start it with `srun vigil run ...` so that one agent runs on every node"
        ));
    }
    if let Some(tasks) = env_u32(env, "SLURM_STEP_NUM_TASKS")? {
        if tasks != nnodes {
            return err(format!(
                "srun started {tasks} vigil agents on {nnodes} nodes (SLURM_STEP_NUM_TASKS={tasks}, {nnodes_var}={nnodes}); \
                 vigil runs once per node and starts the ranks itself: use `srun --ntasks-per-node=1 vigil run --nproc-per-node N ...`"
            ));
        }
    }
    let head = slurm_head(env)?;
    Ok(Some(EnvNodes {
        source: Source::Slurm,
        nnodes,
        nnodes_var,
        node_rank,
        node_rank_var: "SLURM_NODEID",
        head,
        port: Some(slurm_port(&job_id)),
        run_id: Some(job_id),
    }))
}

/// Node rank 0's host under Slurm: the first node of the step's (or job's) node list.
fn slurm_head(env: &dyn Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
    let no_store = "cannot tell which node runs vigil's store; give --master-addr";
    match nodelist::nodes(env) {
        // `expand` names at least one host.
        Ok((var, hosts)) => hosts
            .into_iter()
            .next()
            .ok_or_else(|| ConfigError(format!("{var} is empty: {no_store}"))),
        Err(e @ NodeListError::Unset) => err(format!("{e}: {no_store}")),
        Err(e) => err(e.to_string()),
    }
}

fn from_ngc(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<EnvNodes>, ConfigError> {
    let Some(nnodes) = env_u32(env, "NGC_ARRAY_SIZE")? else {
        return Ok(None);
    };
    let node_rank = env_u32(env, "NGC_ARRAY_INDEX")?.unwrap_or(0);
    let head = match env("NGC_MASTER_ADDR") {
        Some(h) if !h.trim().is_empty() => h.trim().to_string(),
        _ if nnodes <= 1 => "127.0.0.1".into(),
        _ => {
            return err(format!(
                "NGC_ARRAY_SIZE={nnodes} but NGC_MASTER_ADDR is unset: cannot tell which node runs vigil's store; give --master-addr"
            ))
        }
    };
    Ok(Some(EnvNodes {
        source: Source::Ngc,
        nnodes,
        nnodes_var: "NGC_ARRAY_SIZE",
        node_rank,
        node_rank_var: "NGC_ARRAY_INDEX",
        head,
        port: None,
        run_id: env("NGC_JOB_ID"),
    }))
}

/// `--nnodes`: `N` or `MIN:MAX`.
pub fn parse_nnodes(s: &str) -> Result<(u32, u32), ConfigError> {
    let bad = || {
        ConfigError(format!(
            "--nnodes {s:?} is not a node count: give N or MIN:MAX with 1 <= MIN <= MAX"
        ))
    };
    let num = |p: &str| p.trim().parse::<u32>().map_err(|_| bad());
    let (lo, hi) = match s.split_once(':') {
        Some((a, b)) => (num(a)?, num(b)?),
        None => {
            let n = num(s)?;
            (n, n)
        }
    };
    if lo == 0 || lo > hi {
        return Err(bad());
    }
    Ok((lo, hi))
}

/// Decides the job's nodes from the flags and the environment.
pub fn discover(f: &NodeFlags, env: &dyn Fn(&str) -> Option<String>) -> Result<Nodes, ConfigError> {
    let flag_nnodes = f.nnodes.map(parse_nnodes).transpose()?;
    if f.standalone {
        return standalone(f, flag_nnodes);
    }
    let envn = match from_slurm(env)? {
        Some(e) => Some(e),
        None => from_ngc(env)?,
    };
    let ep = endpoint_flags(f)?;
    let (active, nnodes) = node_counts(f, flag_nnodes, envn.as_ref())?;
    let (node_rank, rank_by_rdzv) = match node_rank(f, envn.as_ref(), nnodes)? {
        Some(r) => (r, false),
        None => (0, true),
    };
    if let Some(flag) = ep.any_port.filter(|_| nnodes > 1) {
        return err(format!(
            "{flag}: port 0 (any free port) works on one node only; give the port every node should connect to"
        ));
    }
    if node_rank >= nnodes {
        return err(format!(
            "node rank {node_rank} does not exist in a {nnodes}-node job: node ranks run from 0 to {}",
            nnodes - 1
        ));
    }
    let flag_head = ep.host.or(f.master_addr.map(str::to_string));
    let (head_host, slurm_head) = head_host(f, flag_head, envn.as_ref(), nnodes)?;
    let port = ep.port.or(ep.master_port).or(match &envn {
        Some(e) if nnodes > 1 => e.port.or(Some(MASTER_DEFAULT_PORT)),
        _ if nnodes > 1 => Some(MASTER_DEFAULT_PORT),
        _ => None,
    });
    let job_id = explicit_id(f.rdzv_id).or_else(|| envn.as_ref().and_then(|e| e.run_id.clone()));
    Ok(Nodes {
        nnodes,
        active,
        node_rank,
        rank_by_rdzv,
        job_id,
        head_host,
        port,
        source: envn.map_or(Source::Flags, |e| e.source),
        slurm_head,
    })
}

/// `--standalone`: one node, torchrun's `localhost:0` rendezvous.
fn standalone(f: &NodeFlags, flag_nnodes: Option<(u32, u32)>) -> Result<Nodes, ConfigError> {
    if flag_nnodes.is_some_and(|(_, hi)| hi > 1) {
        return err(format!(
            "--standalone runs one node, but --nnodes is {}; drop one of them",
            f.nnodes.unwrap_or("1")
        ));
    }
    Ok(Nodes {
        nnodes: 1,
        active: 1,
        node_rank: 0,
        rank_by_rdzv: false,
        job_id: explicit_id(f.rdzv_id),
        // torchrun's standalone rendezvous is `localhost:0`, and MASTER_ADDR says so.
        head_host: "localhost".into(),
        port: None,
        source: Source::Flags,
        slurm_head: false,
    })
}

/// What `--rdzv-endpoint` and `--master-port` say, port 0 set apart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct EndpointFlags {
    host: Option<String>,
    /// The endpoint's port (torchrun's default when it names none); never 0.
    port: Option<u16>,
    /// `--master-port`; never 0.
    master_port: Option<u16>,
    /// The flag that asked for port 0 (any free port), as written.
    any_port: Option<String>,
}

/// Reads `--rdzv-endpoint` and `--master-port`; refuses two ports that disagree.
fn endpoint_flags(f: &NodeFlags) -> Result<EndpointFlags, ConfigError> {
    let (host, ep_port) = if f.rdzv_endpoint.trim().is_empty() {
        (None, None)
    } else {
        let (h, p) = split_endpoint(f.rdzv_endpoint.trim())?;
        (Some(h), Some(p.unwrap_or(RDZV_DEFAULT_PORT)))
    };
    // `host:0` (or `--master-port 0`): a free port, as torchrun picks for a single node; other
    // nodes could not find it.
    let any_port = match (ep_port, f.master_port) {
        (Some(0), _) => Some(format!("--rdzv-endpoint {}", f.rdzv_endpoint)),
        (_, Some(0)) => Some("--master-port 0".to_string()),
        _ => None,
    };
    let port = ep_port.filter(|&p| p != 0);
    let master_port = f.master_port.filter(|&p| p != 0);
    if let (Some(_), Some(p), Some(mp)) = (&host, port, master_port) {
        if p != mp {
            return err(format!(
                "--rdzv-endpoint {} (port {p}) and --master-port {mp} disagree: vigil runs one store on node rank 0; give one of them",
                f.rdzv_endpoint
            ));
        }
    }
    Ok(EndpointFlags {
        host,
        port,
        master_port,
        any_port,
    })
}

/// `(active, nnodes)`. `MIN:MAX`: MAX agents, MIN of them run ranks, the rest are standbys (hot
/// spares).
fn node_counts(
    f: &NodeFlags,
    flag_nnodes: Option<(u32, u32)>,
    envn: Option<&EnvNodes>,
) -> Result<(u32, u32), ConfigError> {
    match (flag_nnodes, envn) {
        (Some((_, n)), Some(e)) if n != e.nnodes => err(format!(
            "--nnodes {} contradicts {}={}: drop --nnodes, or run the job on {n} nodes",
            f.nnodes.unwrap_or(""),
            e.nnodes_var,
            e.nnodes
        )),
        (Some(range), _) => Ok(range),
        (None, Some(e)) => Ok((e.nnodes, e.nnodes)),
        (None, None) => Ok((1, 1)),
    }
}

/// This node's rank: `--node-rank`, else what the environment says; refuses a contradiction.
/// `None`: the c10d rendezvous hands it out (no node rank anywhere, as torchrun's c10d).
fn node_rank(
    f: &NodeFlags,
    envn: Option<&EnvNodes>,
    nnodes: u32,
) -> Result<Option<u32>, ConfigError> {
    match (f.node_rank, envn) {
        (Some(r), Some(e)) if r != e.node_rank => err(format!(
            "--node-rank {r} contradicts {}={}: drop --node-rank and let vigil read it",
            e.node_rank_var, e.node_rank
        )),
        (Some(r), _) => Ok(Some(r)),
        (None, Some(e)) => Ok(Some(e.node_rank)),
        (None, None) if nnodes > 1 && f.rdzv_backend == "c10d" => Ok(None),
        (None, None) if nnodes > 1 => err(format!(
            "--nnodes {} needs --node-rank on every node (0 to {}), or --rdzv-backend c10d to have the rendezvous hand node ranks out, or run under Slurm (srun) or NGC, which say it",
            f.nnodes.unwrap_or_default(),
            nnodes - 1
        )),
        (None, None) => Ok(Some(0)),
    }
}

/// Node rank 0's host, and whether it is a Slurm node name: the flags' if given, else the
/// environment's.
fn head_host(
    f: &NodeFlags,
    flag_head: Option<String>,
    envn: Option<&EnvNodes>,
    nnodes: u32,
) -> Result<(String, bool), ConfigError> {
    match (flag_head, envn) {
        (Some(h), _) => Ok((h, false)),
        (None, Some(e)) => Ok((e.head.clone(), e.source == Source::Slurm)),
        (None, None) if nnodes > 1 => err(format!(
            "--nnodes {} needs the address of node rank 0: give --master-addr (or --rdzv-endpoint host:port) on every node",
            f.nnodes.unwrap_or_default()
        )),
        // One node and no address: torchrun's own defaults, `localhost` (the standalone
        // rendezvous it picks when no port is given either), else --master-addr's 127.0.0.1.
        (None, None) if f.master_port.is_none() => Ok(("localhost".into(), false)),
        (None, None) => Ok(("127.0.0.1".into(), false)),
    }
}

/// `--rdzv-id`'s default, `none`, names no job.
fn explicit_id(rdzv_id: &str) -> Option<String> {
    (!rdzv_id.is_empty() && rdzv_id != "none").then(|| rdzv_id.to_string())
}

/// Node rank 0's address as this node reaches it. DNS first; a Slurm node name that DNS does not
/// know (`NodeAddr` differs from `NodeName`) is asked of Slurm (`scontrol show node`).
pub fn resolve_head(
    host: &str,
    port: u16,
    slurm: bool,
    scontrol: &dyn Fn(&str) -> Option<String>,
) -> Result<std::net::SocketAddr, ResolveError> {
    use std::net::ToSocketAddrs;
    let dns = (host, port).to_socket_addrs().map(|mut a| a.next());
    if let Ok(Some(a)) = dns {
        return Ok(a);
    }
    if slurm {
        if let Some(addr) = scontrol(host).as_deref().and_then(node_addr) {
            if let Ok(Some(a)) = (addr.as_str(), port)
                .to_socket_addrs()
                .map(|mut a| a.next())
            {
                return Ok(a);
            }
        }
    }
    Err(ResolveError {
        host: host.to_string(),
        dns: dns.err().map(|e| e.to_string()),
    })
}

/// c10d without node ranks: whether this agent hosts the store, from `--rdzv-conf is_host` and
/// what binding the endpoint here gave (torch's c10d backend: the host whose name or address
/// matches the endpoint's, and which can bind it). `bound`: `Ok` when it bound, else the error's
/// kind; `names_this_machine`: the endpoint's host is this machine's host name (an endpoint that
/// resolves elsewhere, such as a service's virtual address, then binds every address).
pub fn rdzv_host_role(
    is_host: Option<bool>,
    bound: Result<(), std::io::ErrorKind>,
    names_this_machine: bool,
) -> RdzvRole {
    use std::io::ErrorKind::{AddrInUse, AddrNotAvailable};
    match (is_host, bound) {
        (Some(false), _) => RdzvRole::Client,
        (_, Ok(())) => RdzvRole::Host,
        (Some(true), Err(AddrNotAvailable)) => RdzvRole::HostOnEveryAddress,
        (None, Err(AddrNotAvailable)) if names_this_machine => RdzvRole::HostOnEveryAddress,
        (None, Err(AddrNotAvailable | AddrInUse)) => RdzvRole::Client,
        (_, Err(kind)) => RdzvRole::Fail(kind),
    }
}

/// What [`rdzv_host_role`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdzvRole {
    /// Host the store where it bound: node rank 0.
    Host,
    /// Host it on every address of this machine: node rank 0.
    HostOnEveryAddress,
    /// Connect to the store elsewhere and be handed a node rank.
    Client,
    /// Cannot bind where it must host (`is_host=true`, or an error other than "in use" or "not
    /// an address here").
    Fail(std::io::ErrorKind),
}

/// Node rank 0's name resolves to no address, by DNS nor (for a Slurm node) by Slurm.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot resolve node rank 0's address {host:?}{}; give --master-addr with an address every node can reach", dns.as_ref().map(|e| format!(" ({e})")).unwrap_or_default())]
pub struct ResolveError {
    pub host: String,
    /// DNS's error, when it gave one (none when it answered with no address).
    pub dns: Option<String>,
}

/// `NodeAddr=` from `scontrol show node NAME -o`.
pub fn node_addr(scontrol_line: &str) -> Option<String> {
    scontrol_line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("NodeAddr="))
        .filter(|a| !a.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k: &str| m.get(k).cloned()
    }

    fn flags() -> NodeFlags<'static> {
        NodeFlags {
            rdzv_id: "none",
            ..Default::default()
        }
    }

    const SLURM: &[(&str, &str)] = &[
        ("SLURM_JOB_ID", "4242"),
        ("SLURM_NNODES", "3"),
        ("SLURM_NODEID", "2"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_STEP_NUM_NODES", "3"),
        ("SLURM_STEP_NUM_TASKS", "3"),
        ("SLURM_JOB_NODELIST", "gpu[007-009]"),
    ];

    #[test]
    fn single_node_by_default() {
        let n = discover(&flags(), &env_of(&[])).unwrap();
        assert_eq!((n.nnodes, n.node_rank, n.port), (1, 0, None));
        // torchrun's: its standalone rendezvous on localhost, or --master-addr's default with a
        // port.
        assert_eq!(n.head_host, "localhost");
        assert_eq!(n.job_id, None);
        let with_port = NodeFlags {
            master_port: Some(29511),
            ..flags()
        };
        let n = discover(&with_port, &env_of(&[])).unwrap();
        assert_eq!(n.head_host, "127.0.0.1");
    }

    #[test]
    fn errors_quote_nnodes_as_written() {
        let f = NodeFlags {
            nnodes: Some("1:4"),
            ..flags()
        };
        let e = discover(&f, &env_of(&[])).unwrap_err().to_string();
        assert!(e.starts_with("--nnodes 1:4 needs"), "{e}");
    }

    #[test]
    fn slurm_alone_says_everything() {
        let n = discover(&flags(), &env_of(SLURM)).unwrap();
        assert_eq!((n.nnodes, n.node_rank), (3, 2));
        assert_eq!(n.head_host, "gpu007");
        assert_eq!(n.job_id.as_deref(), Some("4242"));
        assert_eq!(n.port, Some(slurm_port("4242")));
        assert_eq!(n.source, Source::Slurm);
        assert!(n.slurm_head);
    }

    #[test]
    fn flags_that_agree_with_slurm_are_fine_and_win_for_the_address() {
        let f = NodeFlags {
            nnodes: Some("3"),
            node_rank: Some(2),
            rdzv_endpoint: "10.0.0.1:29500",
            ..flags()
        };
        let n = discover(&f, &env_of(SLURM)).unwrap();
        assert_eq!((n.head_host.as_str(), n.port), ("10.0.0.1", Some(29500)));
        assert!(!n.slurm_head);
    }

    #[test]
    fn contradictions_name_both_values() {
        let f = NodeFlags {
            nnodes: Some("4"),
            ..flags()
        };
        let e = discover(&f, &env_of(SLURM)).unwrap_err().0;
        assert!(
            e.contains("--nnodes 4") && e.contains("SLURM_STEP_NUM_NODES=3"),
            "{e}"
        );
        let f = NodeFlags {
            node_rank: Some(0),
            ..flags()
        };
        let e = discover(&f, &env_of(SLURM)).unwrap_err().0;
        assert!(
            e.contains("--node-rank 0") && e.contains("SLURM_NODEID=2"),
            "{e}"
        );
        let ngc = [
            ("NGC_ARRAY_SIZE", "2"),
            ("NGC_ARRAY_INDEX", "1"),
            ("NGC_MASTER_ADDR", "10.1.1.1"),
        ];
        let f = NodeFlags {
            nnodes: Some("8"),
            ..flags()
        };
        let e = discover(&f, &env_of(&ngc)).unwrap_err().0;
        assert!(
            e.contains("--nnodes 8") && e.contains("NGC_ARRAY_SIZE=2"),
            "{e}"
        );
    }

    #[test]
    fn ngc() {
        let ngc = [
            ("NGC_ARRAY_SIZE", "2"),
            ("NGC_ARRAY_INDEX", "1"),
            ("NGC_MASTER_ADDR", "10.1.1.1"),
        ];
        let n = discover(&flags(), &env_of(&ngc)).unwrap();
        assert_eq!((n.nnodes, n.node_rank), (2, 1));
        assert_eq!(n.head_host, "10.1.1.1");
        assert_eq!(n.port, Some(MASTER_DEFAULT_PORT));
        assert_eq!(n.source, Source::Ngc);
    }

    #[test]
    fn explicit_flags() {
        let f = NodeFlags {
            nnodes: Some("2"),
            node_rank: Some(1),
            master_addr: Some("head"),
            master_port: Some(1234),
            ..flags()
        };
        let n = discover(&f, &env_of(&[])).unwrap();
        assert_eq!(
            (n.nnodes, n.node_rank, n.head_host.as_str(), n.port),
            (2, 1, "head", Some(1234))
        );
        let f = NodeFlags {
            nnodes: Some("2:2"),
            node_rank: Some(0),
            rdzv_endpoint: "head",
            ..flags()
        };
        assert_eq!(
            discover(&f, &env_of(&[])).unwrap().port,
            Some(RDZV_DEFAULT_PORT)
        );
    }

    #[test]
    fn c10d_without_a_node_rank_has_the_rendezvous_hand_them_out() {
        let f = NodeFlags {
            nnodes: Some("2"),
            rdzv_backend: "c10d",
            rdzv_endpoint: "h:29400",
            ..flags()
        };
        let n = discover(&f, &env_of(&[])).unwrap();
        assert!(n.rank_by_rdzv);
        assert_eq!((n.nnodes, n.node_rank, n.port), (2, 0, Some(29400)));
        assert_eq!(n.head_host, "h");
        // A node rank known anywhere stays: the flag's, Slurm's, NGC's.
        let given = NodeFlags {
            node_rank: Some(1),
            ..f.clone()
        };
        let n = discover(&given, &env_of(&[])).unwrap();
        assert_eq!((n.node_rank, n.rank_by_rdzv), (1, false));
        let slurm = NodeFlags {
            nnodes: Some("3"),
            ..f.clone()
        };
        let n = discover(&slurm, &env_of(SLURM)).unwrap();
        assert_eq!((n.node_rank, n.rank_by_rdzv), (2, false));
        let ngc = [
            ("NGC_ARRAY_SIZE", "2"),
            ("NGC_ARRAY_INDEX", "1"),
            ("NGC_MASTER_ADDR", "10.1.1.1"),
        ];
        let n = discover(&f, &env_of(&ngc)).unwrap();
        assert_eq!((n.node_rank, n.rank_by_rdzv), (1, false));
        // One node: node rank 0, nothing to hand out.
        let one = NodeFlags {
            nnodes: Some("1"),
            ..f.clone()
        };
        assert!(!discover(&one, &env_of(&[])).unwrap().rank_by_rdzv);
        // torchrun's static rendezvous has no one to hand them out.
        let stat = NodeFlags {
            rdzv_backend: "static",
            ..f
        };
        let e = discover(&stat, &env_of(&[])).unwrap_err().0;
        assert!(
            e.contains("needs --node-rank") && e.contains("--rdzv-backend c10d"),
            "{e}"
        );
    }

    #[test]
    fn the_store_is_hosted_where_the_endpoint_binds_or_names_this_machine() {
        use std::io::ErrorKind::{AddrInUse, AddrNotAvailable, PermissionDenied};
        use RdzvRole::*;
        let cases = [
            (None, Ok(()), false, Host),
            // Another agent of this machine holds it (a loopback test), or it is elsewhere.
            (None, Err(AddrInUse), true, Client),
            (None, Err(AddrNotAvailable), false, Client),
            // This machine's name, resolving to an address it does not have (a service's).
            (None, Err(AddrNotAvailable), true, HostOnEveryAddress),
            (Some(true), Err(AddrNotAvailable), false, HostOnEveryAddress),
            (Some(true), Err(AddrInUse), true, Fail(AddrInUse)),
            (Some(false), Ok(()), true, Client),
            (None, Err(PermissionDenied), false, Fail(PermissionDenied)),
        ];
        for (is_host, bound, named, want) in cases {
            assert_eq!(
                rdzv_host_role(is_host, bound, named),
                want,
                "{is_host:?} {bound:?} {named}"
            );
        }
    }

    #[test]
    fn min_max_is_max_agents_of_which_min_run_ranks() {
        let n = discover(
            &NodeFlags {
                nnodes: Some("2:3"),
                node_rank: Some(2),
                master_addr: Some("h0"),
                ..flags()
            },
            &env_of(&[]),
        )
        .unwrap();
        assert_eq!((n.nnodes, n.active, n.node_rank), (3, 2, 2));
    }

    #[test]
    fn refusals() {
        type Case<'a> = (NodeFlags<'a>, &'a [(&'a str, &'a str)], &'a str);
        let cases: Vec<Case> = vec![
            (
                NodeFlags {
                    nnodes: Some("2"),
                    master_addr: Some("h"),
                    ..flags()
                },
                &[],
                "needs --node-rank",
            ),
            (
                NodeFlags {
                    nnodes: Some("2"),
                    node_rank: Some(0),
                    ..flags()
                },
                &[],
                "--master-addr",
            ),
            (
                NodeFlags {
                    nnodes: Some("2"),
                    node_rank: Some(2),
                    master_addr: Some("h"),
                    ..flags()
                },
                &[],
                "from 0 to 1",
            ),
            (
                NodeFlags {
                    nnodes: Some("2"),
                    standalone: true,
                    ..flags()
                },
                &[],
                "--standalone",
            ),
            (
                NodeFlags {
                    rdzv_endpoint: "h:1",
                    master_port: Some(2),
                    ..flags()
                },
                &[],
                "disagree",
            ),
            (
                flags(),
                &[
                    ("SLURM_JOB_ID", "1"),
                    ("SLURM_NNODES", "2"),
                    ("SLURM_JOB_NODELIST", "n[1-2]"),
                ],
                "not running under srun",
            ),
            (
                flags(),
                &[
                    ("SLURM_JOB_ID", "1"),
                    ("SLURM_STEP_ID", "0"),
                    ("SLURM_STEP_NUM_NODES", "2"),
                    ("SLURM_STEP_NUM_TASKS", "16"),
                    ("SLURM_JOB_NODELIST", "n[1-2]"),
                ],
                "--ntasks-per-node=1",
            ),
            (
                flags(),
                &[
                    ("SLURM_JOB_ID", "1"),
                    ("SLURM_NNODES", "x"),
                    ("SLURM_JOB_NODELIST", "n1"),
                ],
                "SLURM_NNODES=\"x\"",
            ),
        ];
        for (f, env, want) in cases {
            let e = discover(&f, &env_of(env)).unwrap_err().0;
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
    }

    #[test]
    fn port_zero_is_any_free_port_on_one_node() {
        for ep in ["localhost:0", "127.0.0.1:0"] {
            let f = NodeFlags {
                rdzv_endpoint: ep,
                ..flags()
            };
            let n = discover(&f, &env_of(&[])).unwrap();
            assert_eq!((n.nnodes, n.port), (1, None), "{ep}");
            let two = NodeFlags {
                nnodes: Some("2"),
                node_rank: Some(0),
                ..f
            };
            let e = discover(&two, &env_of(&[])).unwrap_err().0;
            assert!(e.contains("one node only"), "{e}");
        }
        let mp0 = NodeFlags {
            master_port: Some(0),
            ..flags()
        };
        assert_eq!(discover(&mp0, &env_of(&[])).unwrap().port, None);
        let two = NodeFlags {
            nnodes: Some("2"),
            node_rank: Some(1),
            master_addr: Some("10.0.0.1"),
            ..mp0
        };
        let e = discover(&two, &env_of(&[])).unwrap_err().0;
        assert!(
            e.contains("--master-port 0") && e.contains("one node only"),
            "{e}"
        );
    }

    fn slurm_env(nnodes: u32, node_rank: u32) -> EnvNodes {
        EnvNodes {
            source: Source::Slurm,
            nnodes,
            nnodes_var: "SLURM_NNODES",
            node_rank,
            node_rank_var: "SLURM_NODEID",
            head: "n1".into(),
            run_id: Some("7".into()),
            port: Some(slurm_port("7")),
        }
    }

    #[test]
    fn endpoint_flags_set_port_zero_apart() {
        let ep = |rdzv_endpoint: &'static str, master_port: Option<u16>| {
            endpoint_flags(&NodeFlags {
                rdzv_endpoint,
                master_port,
                ..flags()
            })
        };
        assert_eq!(ep("", None).unwrap(), EndpointFlags::default());
        let got = ep("head", Some(29400)).unwrap();
        assert_eq!(
            (got.host.as_deref(), got.port, got.master_port),
            (Some("head"), Some(RDZV_DEFAULT_PORT), Some(29400))
        );
        let got = ep("[::1]:0", None).unwrap();
        assert_eq!((got.host.as_deref(), got.port), (Some("::1"), None));
        assert_eq!(got.any_port.as_deref(), Some("--rdzv-endpoint [::1]:0"));
        let got = ep("", Some(0)).unwrap();
        assert_eq!(
            (got.master_port, got.any_port.as_deref()),
            (None, Some("--master-port 0"))
        );
        // Without an endpoint host the two ports cannot disagree.
        assert!(ep("h:1", Some(2)).unwrap_err().0.contains("disagree"));
        assert!(ep("h:1", Some(1)).is_ok());
    }

    #[test]
    fn node_counts_and_rank_from_flags_or_environment() {
        let f = |nnodes: Option<&'static str>, node_rank: Option<u32>| NodeFlags {
            nnodes,
            node_rank,
            ..flags()
        };
        let env = slurm_env(3, 2);
        assert_eq!(node_counts(&f(None, None), None, None).unwrap(), (1, 1));
        assert_eq!(
            node_counts(&f(None, None), None, Some(&env)).unwrap(),
            (3, 3)
        );
        assert_eq!(
            node_counts(&f(Some("2:3"), None), Some((2, 3)), Some(&env)).unwrap(),
            (2, 3)
        );
        let e = node_counts(&f(Some("4"), None), Some((4, 4)), Some(&env)).unwrap_err();
        assert!(
            e.0.starts_with("--nnodes 4 contradicts SLURM_NNODES=3"),
            "{e}"
        );
        assert_eq!(node_rank(&f(None, None), Some(&env), 3).unwrap(), Some(2));
        assert_eq!(
            node_rank(&f(None, Some(2)), Some(&env), 3).unwrap(),
            Some(2)
        );
        assert_eq!(node_rank(&f(None, None), None, 1).unwrap(), Some(0));
        let e = node_rank(&f(None, Some(1)), Some(&env), 3).unwrap_err();
        assert!(
            e.0.starts_with("--node-rank 1 contradicts SLURM_NODEID=2"),
            "{e}"
        );
        let e = node_rank(&f(Some("2"), None), None, 2).unwrap_err();
        assert!(e.0.contains("(0 to 1)"), "{e}");
    }

    #[test]
    fn the_head_is_the_flags_then_the_environments_then_torchruns_default() {
        let env = slurm_env(3, 2);
        let f = flags();
        assert_eq!(
            head_host(&f, Some("h".into()), Some(&env), 3).unwrap(),
            ("h".to_string(), false)
        );
        assert_eq!(
            head_host(&f, None, Some(&env), 3).unwrap(),
            ("n1".to_string(), true)
        );
        assert_eq!(
            head_host(&f, None, None, 1).unwrap(),
            ("localhost".to_string(), false)
        );
        let with_port = NodeFlags {
            master_port: Some(1),
            ..flags()
        };
        assert_eq!(
            head_host(&with_port, None, None, 1).unwrap(),
            ("127.0.0.1".to_string(), false)
        );
        assert!(head_host(&f, None, None, 2)
            .unwrap_err()
            .0
            .contains("--master-addr"));
    }

    #[test]
    fn the_slurm_head_is_the_first_node_of_the_steps_list() {
        let head = |pairs: &[(&str, &str)]| slurm_head(&env_of(pairs));
        assert_eq!(
            head(&[
                ("SLURM_JOB_NODELIST", "a[1-4]"),
                ("SLURM_STEP_NODELIST", "a[3-4]")
            ])
            .unwrap(),
            "a3"
        );
        assert_eq!(head(&[("SLURM_NODELIST", "old7")]).unwrap(), "old7");
        let e = head(&[]).unwrap_err().0;
        assert!(
            e.starts_with("SLURM_JOB_NODELIST is unset: cannot tell which node runs vigil's store"),
            "{e}"
        );
        let e = head(&[("SLURM_JOB_NODELIST", "n[1-")]).unwrap_err().0;
        assert!(
            e.starts_with("SLURM_JOB_NODELIST=\"n[1-\" is not a Slurm hostlist: hostlist"),
            "{e}"
        );
    }

    #[test]
    fn an_unresolvable_head_says_what_dns_said() {
        let e = resolve_head("vigil-no-such-host.invalid", 1, true, &|_| None).unwrap_err();
        assert_eq!(e.host, "vigil-no-such-host.invalid");
        let text = e.to_string();
        assert!(
            text.starts_with("cannot resolve node rank 0's address \"vigil-no-such-host.invalid\"")
                && text.ends_with("give --master-addr with an address every node can reach"),
            "{text}"
        );
        let via_slurm = resolve_head("vigil-no-such-host.invalid", 80, true, &|_| {
            Some("NodeName=x NodeAddr=127.0.0.1 State=IDLE".into())
        });
        assert_eq!(via_slurm.unwrap().ip().to_string(), "127.0.0.1");
    }

    #[test]
    fn endpoints() {
        assert_eq!(split_endpoint("h:5").unwrap(), ("h".into(), Some(5)));
        assert_eq!(split_endpoint("h").unwrap(), ("h".into(), None));
        assert_eq!(split_endpoint("[::1]:7").unwrap(), ("::1".into(), Some(7)));
        assert_eq!(
            split_endpoint("localhost:0").unwrap(),
            ("localhost".into(), Some(0))
        );
        for bad in ["::1:5", "h:-1", "h:x", ":5", "[::1", "h:65536"] {
            assert!(split_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn head_address_through_slurm_when_dns_does_not_know_it() {
        let sc = |name: &str| {
            (name == "n1")
                .then(|| "NodeName=n1 Arch=x86_64 NodeAddr=127.0.0.1 NodeHostName=box".into())
        };
        let a = resolve_head("n1", 7000, true, &sc).unwrap();
        assert_eq!(a.to_string(), "127.0.0.1:7000");
        assert!(resolve_head("n1.invalid", 7000, false, &sc).is_err());
        assert_eq!(resolve_head("127.0.0.2", 9, false, &sc).unwrap().port(), 9);
    }

    proptest::proptest! {
        #[test]
        fn slurm_ports_stay_out_of_the_ephemeral_range(id in 0u64..u64::MAX) {
            let p = slurm_port(&id.to_string());
            proptest::prop_assert!((20000..32000).contains(&p));
        }
    }

    #[test]
    fn nnodes_forms() {
        assert_eq!(parse_nnodes("2"), Ok((2, 2)));
        assert_eq!(parse_nnodes("1:4"), Ok((1, 4)));
        assert!(parse_nnodes("0").is_err());
        assert!(parse_nnodes("3:2").is_err());
        assert!(parse_nnodes("x").is_err());
    }
}

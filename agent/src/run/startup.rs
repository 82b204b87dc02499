//! Start-up of one node's agent, before the loop: the event log, containment, signals, the ranks'
//! socket, vigil's store and the job's coordination, the supervisor and its first actions. Any
//! failure here is one error line and the agent's exit status.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::agent::{Agent, Links, Outputs, Ranks, Trail};
use super::allocation::{self, EndWatch};
use super::clock::{JobClock, CLOCK_TICK};
use super::dispatch::{Dispatcher, Sources};
use super::eventlog::EventLog;
use super::ipc_server::{self, IpcServer, NoticeLimit, Shared};
use super::metrics_server::{self, Metrics};
use super::prelaunch::provenance;
use super::proc::{self, Watchdog};
use super::rank_door::{self, RankDoor, Upstream};
use super::report::{console_err, console_note, Reporter};
use super::slurm_job::{self, SignalWindow};
use super::store_host::{self, job_secret, setup_store, StoreSetup};
use super::{gpuwatch, perf, REFUSED_NOTICE_WINDOW};
use crate::cli::config::LaunchConfig;
use crate::cli::derive::CoordFacts;
use crate::job::exchange::FromExchange;
use crate::job::rendezvous::{self, FromCoord};
use crate::job::state;
use crate::supervise::{Event, JobRequest, Record, Supervisor};

/// What start-up leaves for the teardown: what it waits for, reads or closes last.
pub(super) struct Closing {
    /// The ranks' socket, removed once everything else is done.
    pub(super) server: IpcServer,
    /// The coordination's task: it returns once this node has left the job.
    pub(super) coordinator: JoinHandle<()>,
    /// Node rank 0: vigil's store's keys (which nodes' ranks failed, the nodes' highest steps).
    pub(super) head_keys: Option<vigil_store::KeySpace>,
    /// When the agent started: the allocation it had is from here.
    pub(super) started: SystemTime,
}

/// Slurm's name for the node when there is one: what `ExcNodeList` and `sinfo` call it (several
/// slurmd may share one machine).
fn node_name() -> String {
    std::env::var("SLURMD_NODENAME")
        .ok()
        .filter(|n| !n.trim().is_empty())
        .or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .map(|h| h.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn open_event_log(cfg: &LaunchConfig, run_dir: &Path) -> Result<File, i32> {
    let path = cfg
        .event_log
        .clone()
        .unwrap_or_else(|| run_dir.join("events.jsonl"));
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| {
            console_err(format!(
                "vigil: error: cannot write the event log {}: {e}; choose a writable --log-dir or --event-log",
                path.display()
            ));
            crate::exit::USAGE
        })
}

/// Keeps every process the ranks start findable, and dying with the agent as far as it can.
fn contain() -> (proc::Containment, Option<Watchdog>) {
    if let Err(e) = proc::become_subreaper() {
        console_note(&format!(
            "cannot become a child subreaper ({e}); orphaned rank descendants are reaped by init"
        ));
    }
    let containment = proc::Containment::create();
    let watchdog = match Watchdog::start(&containment) {
        Ok(w) => Some(w),
        Err(e) => {
            console_note(&format!("cannot start the watchdog ({e}); ranks still die with the agent, their children may not"));
            None
        }
    };
    (containment, watchdog)
}

/// The agent's signal handlers, and SIGCHLD.
fn install_signals(cfg: &LaunchConfig) -> Result<(Vec<(Signal, i32)>, Signal), i32> {
    let mut sigs = Vec::new();
    // torchrun's --signals-to-handle: the others keep their default action. SIGUSR1 and SIGUSR2
    // always ask for a stop at a step (Slurm's `--signal=USR1@N`); their default would kill the
    // agent and with it the job.
    let mut handled = cfg.signals.clone();
    for extra in [libc::SIGUSR1, libc::SIGUSR2] {
        if !handled.contains(&extra) {
            handled.push(extra);
        }
    }
    for num in handled {
        match signal(SignalKind::from_raw(num)) {
            Ok(s) => sigs.push((s, num)),
            Err(e) => {
                console_err(format!(
                    "vigil: error: cannot install a signal handler: {e}"
                ));
                return Err(crate::exit::INTERNAL);
            }
        }
    }
    let Ok(sigchld) = signal(SignalKind::child()) else {
        console_err("vigil: error: cannot watch child processes (SIGCHLD)".to_string());
        return Err(crate::exit::INTERNAL);
    };
    Ok((sigs, sigchld))
}

fn start_ipc(
    shared: Rc<Shared>,
    tx: mpsc::Sender<ipc_server::FromRanks>,
    watchdog: &mut Option<Watchdog>,
) -> Result<IpcServer, i32> {
    let server = ipc_server::start(&std::env::temp_dir(), shared, tx).map_err(|e| {
        console_err(format!(
            "vigil: error: cannot create the ranks' socket under {}: {e}; set TMPDIR to a writable local directory",
            std::env::temp_dir().display()
        ));
        crate::exit::USAGE
    })?;
    if let Some(w) = watchdog {
        // A SIGKILLed agent cannot remove its socket directory; the watchdog does.
        w.remove_on_exit(server.dir());
    }
    Ok(server)
}

fn say_where_the_store_is(cfg: &LaunchConfig, store: &StoreSetup, outside: bool) {
    if cfg.nnodes > 1 {
        console_note(&format!(
            "node {} of {}{}; vigil's store is at {}:{}{}",
            cfg.node_rank,
            cfg.nnodes,
            if cfg.node_rank_by_rdzv {
                " (handed out by the rendezvous)"
            } else {
                ""
            },
            store.for_ranks.0,
            store.for_ranks.1,
            match &store.head {
                Some(rendezvous::HeadSide::Local { .. }) => " (here)",
                Some(rendezvous::HeadSide::Remote) => " (outside the job: vigil store)",
                None if outside => " (outside the job: vigil store)",
                None => "",
            }
        ));
    }
}

/// This node's part in the job's coordination, once started.
struct Coordination {
    /// vigil's store as the ranks reach it (MASTER_ADDR, MASTER_PORT): the ranks' door.
    for_ranks: (String, u16),
    /// vigil's store itself, as the job names node rank 0's address.
    store_at: (String, u16),
    requests: mpsc::UnboundedSender<JobRequest>,
    events: mpsc::UnboundedReceiver<FromCoord>,
    /// Straggler summaries, to node rank 0 and (there) back from every node.
    share: mpsc::UnboundedSender<Vec<u8>>,
    exchange: mpsc::UnboundedReceiver<FromExchange>,
    head_keys: Option<vigil_store::KeySpace>,
    /// The store's refusals, where this node hosts it (a channel that never speaks elsewhere).
    store_refused: store_host::RefusedRx,
    task: JoinHandle<()>,
}

/// Opens this node's ranks' door to vigil's store (`rank_door.rs`), which the ranks are told as
/// MASTER_ADDR and MASTER_PORT.
fn open_door(cfg: &LaunchConfig, store: &StoreSetup) -> Result<RankDoor, i32> {
    let up = Upstream {
        store: store.client_addr,
        secret: store.secret.clone(),
        connect_timeout: cfg.join_timeout.max(Duration::from_secs(1)),
        peer_timeout: cfg.node_timeout.max(Duration::from_secs(1)),
    };
    rank_door::open(up, rank_door::max_connections(cfg.nproc)).map_err(|e| {
        console_err(format!(
            "vigil: error: cannot open the ranks' door to vigil's store on 127.0.0.1: {e}; this node needs a loopback interface and a free port"
        ));
        crate::exit::INTERNAL
    })
}

/// Finds (node rank 0: hosts) vigil's store and starts the rendezvous and the straggler
/// exchange through it.
/// Without a node rank anywhere (c10d), this is where the rendezvous hands this node its own.
async fn start_coordination(
    cfg: &mut LaunchConfig,
    secret: Option<Vec<u8>>,
    host: &str,
) -> Result<Coordination, i32> {
    let secret = job_secret(cfg, secret).await.map_err(|e| {
        console_err(format!("vigil: error: {e}"));
        crate::exit::USAGE
    })?;
    let mut store = setup_store(cfg, secret).map_err(|e| {
        console_err(format!("vigil: error: {e}"));
        crate::exit::USAGE
    })?;
    let (requests, coord_rx_req) = mpsc::unbounded_channel();
    let (coord_ev_tx, events) = mpsc::unbounded_channel();
    let facts = || CoordFacts {
        host: host.to_string(),
        store: store.client_addr,
        secret: store.secret.clone(),
        topology: None,
    };
    // The agent's one connection to the store, shared by all below.
    let link = rendezvous::StoreLink::new();
    let mut outside = false;
    if cfg.node_rank_by_rdzv && store.head.is_none() {
        let me = rendezvous::identity(host);
        let claimed = rendezvous::claim_node_rank(&link, &cfg.coord_config(facts()), &me)
            .await
            .map_err(|e| {
                console_err(format!("vigil: error: {e}"));
                if e.requeue {
                    crate::exit::REQUEUE
                } else {
                    crate::exit::USAGE
                }
            })?;
        cfg.node_rank = claimed.node_rank;
        outside = claimed.outside;
        if outside && claimed.node_rank == 0 {
            // The store runs outside the job (`vigil store`): node rank 0 coordinates through it.
            store.head = Some(rendezvous::HeadSide::Remote);
        }
    }
    let mut coord_cfg = cfg.coord_config(CoordFacts {
        host: host.to_string(),
        store: store.client_addr,
        secret: store.secret.clone(),
        topology: std::env::var("SLURM_TOPOLOGY_ADDR")
            .ok()
            .filter(|t| !t.trim().is_empty()),
    });
    coord_cfg.outside |= outside;
    say_where_the_store_is(cfg, &store, coord_cfg.outside);
    let door = open_door(cfg, &store)?;
    let (share, exchange) =
        crate::job::exchange::start(link.clone(), coord_cfg.clone(), cfg.straggler.interval);
    // Node rank 0 reads which nodes' ranks failed in each attempt when it blames nodes.
    let head_keys = store.head.as_ref().and_then(|h| h.keys().cloned());
    let store_refused = store
        .refused
        .take()
        .unwrap_or_else(|| mpsc::unbounded_channel().1);
    let task = tokio::task::spawn_local(rendezvous::run_linked(
        link,
        coord_cfg,
        store.head,
        coord_rx_req,
        coord_ev_tx,
    ));
    Ok(Coordination {
        for_ranks: (std::net::Ipv4Addr::LOCALHOST.to_string(), door.port),
        store_at: store.for_ranks,
        requests,
        events,
        share,
        exchange,
        head_keys,
        store_refused,
        task,
    })
}

/// Starts everything the loop needs; `Err`: the agent's exit status, the error already said.
pub(super) async fn start(
    mut cfg: LaunchConfig,
    run_dir: PathBuf,
    secret: Option<Vec<u8>>,
) -> Result<(Dispatcher, Sources, Closing), i32> {
    let host = node_name();
    let metrics_flags = metrics_server::prepare(&cfg)?;
    let event_file = open_event_log(&cfg, &run_dir)?;
    let (containment, mut watchdog) = contain();
    let (sigs, sigchld) = install_signals(&cfg)?;
    let shared = Rc::new(Shared::default());
    let (ipc_tx, ipc) = mpsc::channel(ipc_server::QUEUE);
    let server = start_ipc(shared.clone(), ipc_tx, &mut watchdog)?;
    let (stacks_tx, stacks) = mpsc::unbounded_channel();
    let (gpu_tx, gpu) = mpsc::unbounded_channel();
    let (report_tx, reports) = mpsc::unbounded_channel();
    let (gate_tx, gate) = mpsc::unbounded_channel();
    let co = start_coordination(&mut cfg, secret, &host).await?;
    let job_dirs = vec![allocation::state_dir(&cfg, &run_dir), run_dir.clone()];
    // The number this allocation's ledger record takes, as the ledger stands now: whichever
    // agent concludes the allocation (node rank 0, or a survivor of its loss) records it once.
    let allocation_index = allocation::next_index(&cfg, &run_dir);
    let (metrics, pages) = match Metrics::start(metrics_flags, &cfg, &host, job_dirs) {
        Some((m, pages)) => (Some(m), pages),
        None => (None, mpsc::channel(1).1),
    };
    let mut agent = Agent {
        out: outputs(&cfg, &run_dir, &host, event_file),
        ranks: Ranks::new(
            containment,
            watchdog,
            shared,
            server.path.clone(),
            stacks_tx,
        ),
        links: Links {
            coord: co.requests,
            gpus: gpuwatch::GpuWatch::start(cfg.gpu.nvml_lib.clone(), gpu_tx),
            gate_tx,
            share: co.share,
        },
        host,
        run_dir,
        outcome: None,
        store_for_ranks: co.for_ranks,
        store_at: co.store_at,
        leave: None,
        trail: Trail {
            allocation_index,
            ..Trail::default()
        },
        steps_log: Default::default(),
        stragglers: perf::Stragglers::new(cfg.straggler.clone(), cfg.nproc),
        cfg,
    };
    let mut queue = VecDeque::new();
    let Begun {
        sup,
        clock,
        endw,
        signal_window,
        started,
    } = begin(&mut agent, &mut queue);
    let mut ticker = tokio::time::interval(CLOCK_TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let dispatcher = Dispatcher {
        signal_window,
        agent,
        queue,
        sup,
        clock,
        endw,
        refused: NoticeLimit::new(REFUSED_NOTICE_WINDOW),
        report_tx,
        metrics,
        started,
        stop_recorded: false,
    };
    let sources = Sources {
        sigs,
        sigchld,
        ipc,
        coord: co.events,
        exchange: co.exchange,
        reports,
        gate,
        gpu,
        stacks,
        pages,
        store_refused: co.store_refused,
        ticker,
    };
    let closing = Closing {
        server,
        coordinator: co.task,
        head_keys: co.head_keys,
        started,
    };
    Ok((dispatcher, sources, closing))
}

/// The node's outputs: the event log, the console's lines of records, NVRx's files.
fn outputs(cfg: &LaunchConfig, run_dir: &Path, host: &str, event_file: File) -> Outputs {
    Outputs {
        events: EventLog::open(event_file, host, cfg.node_rank),
        report: Reporter {
            run_dir: run_dir.to_path_buf(),
            node_rank: cfg.node_rank,
            nnodes: cfg.nnodes,
        },
        nvrx: nvrx_outputs(cfg, host),
    }
}

/// NVRx's outputs of this node. One node names itself; several nodes' names come from the
/// rendezvous (`FromCoord::Hosts`).
fn nvrx_outputs(cfg: &LaunchConfig, host: &str) -> crate::nvrx::Nvrx {
    let nodes = if cfg.active_nodes == 1 {
        vec![host.to_string()]
    } else {
        Vec::new()
    };
    crate::nvrx::Nvrx::new(&cfg.nvrx, cfg.node_rank, &nodes, cfg.active_nodes)
}

/// What [`begin`] starts.
struct Begun {
    sup: Supervisor,
    clock: JobClock,
    endw: EndWatch,
    signal_window: SignalWindow,
    started: SystemTime,
}

/// The first records, the supervisor and its first actions, and the allocation's end; the
/// supervisor's first events go to `queue`.
fn begin(agent: &mut Agent, queue: &mut VecDeque<Event>) -> Begun {
    agent.out.events.write(&Record::Containment {
        cgroup: agent.ranks.containment.cgroup().map(Path::to_path_buf),
    });
    agent.out.events.write(&Record::Nodes {
        nnodes: Some(agent.cfg.nnodes),
        store: Some(format!("{}:{}", agent.store_at.0, agent.store_at.1)),
        run_id: Some(agent.cfg.run_id.clone()),
        command: Some(
            std::env::args_os()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
        ),
    });
    // Node rank 0 keeps the job's calculated timeouts and hands them to every node.
    let calculated = match (&agent.cfg.timeouts_file.load, agent.cfg.node_rank) {
        (Some(path), 0) => state::load_timeouts(path, &provenance(&agent.cfg), &console_note),
        _ => None,
    };
    let mut clock = JobClock::new();
    let signal_window = slurm_job::signal_window(&agent.cfg);
    let (sup, first) = Supervisor::new(agent.cfg.supervisor_config(calculated));
    agent.execute(first, queue);
    let started = SystemTime::now();
    let mut endw = EndWatch::start(
        &agent.cfg,
        allocation::carried_lead(&agent.cfg, &agent.run_dir),
    );
    endw.helpers = agent.ranks.helper_pids.clone();
    if let Some(ev) = endw.tick(&sup, clock.wake().0) {
        queue.push_back(ev);
    }
    Begun {
        sup,
        clock,
        endw,
        signal_window,
        started,
    }
}

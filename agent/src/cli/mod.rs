//! Command-line interface. `vigil run` takes torchrun's flags with torchrun's meaning, in both the
//! dash and the underscore spelling, each also read from `PET_<NAME>` like torchrun.

pub mod argv;
pub mod config;
pub mod derive;
pub mod ftcompat;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::values::{count, factor, fraction, pet_switch, port, seconds};

/// `vigil --version`: the release, the commit it was built from, and the rank protocol it speaks
/// (a rank library of another protocol is refused, docs/install.md).
pub fn version_text() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        format!(
            "{} ({}, rank protocol {})",
            env!("CARGO_PKG_VERSION"),
            env!("VIGIL_COMMIT"),
            vigil_ipc::PROTOCOL_VERSION
        )
    })
}

#[derive(Debug, Parser)]
#[command(
    name = "vigil",
    version = version_text(),
    about = "In-job resiliency agent for distributed training: a torchrun-compatible launcher that supervises, diagnoses and restarts ranks."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Launch this node's ranks as torchrun would, and supervise them.
    // Negative numbers reach the value parsers, which say what a flag takes.
    // argparse's habit, which wrappers that append overrides rely on: a flag given twice takes
    // the last value. (Prefixes, its other habit, are written out by `ftcompat::translate`.)
    #[command(allow_negative_numbers = true, args_override_self = true)]
    Run(Box<RunArgs>),
    /// Print a job's ledger: one line per allocation (docs/allocations.md).
    Ledger {
        /// A state directory, a log directory holding vigil-job-<key>/, or a job id, looked up in
        /// the submit directory, the current one and $TMPDIR (default: $SLURM_JOB_ID's).
        target: Option<String>,
    },
    /// Render a training recipe into a Slurm job running vigil and submit it (docs/launch.md).
    #[command(
        long_about = "Render a training recipe (TOML) into an sbatch script whose srun line is `vigil run`, check it (partition, image, script, secrets), make an experiment directory ($VIGIL_HOME/experiments/<name>/<name>_<time>/), submit it and print its status block. Flags and --set override the recipe's keys; --dry-run prints the script; --executor bcp --dry-run prints NVIDIA Base Command's `ngc base-command job run` line; --interactive holds an allocation for `vigil attach`. See docs/launch.md."
    )]
    Launch(Box<vigil_recipes::cli::LaunchArgs>),
    /// A launched experiment's state: Slurm's, then vigil's own records.
    Status(vigil_recipes::cli::ExperimentArg),
    /// A launched experiment's job log, or one rank's output (--rank N); -f follows.
    Logs(vigil_recipes::cli::LogsArgs),
    /// Cancel a launched experiment's Slurm job.
    Cancel(vigil_recipes::cli::ExperimentArg),
    /// The launched experiments, oldest first, with their Slurm state.
    List,
    /// Run a shell (or `-- CMD`) inside an interactive experiment's allocation.
    Attach(vigil_recipes::cli::AttachArgs),
    /// Write one HTML page with a job's timeline, steps and straggler scores (docs/report.md).
    Report {
        /// An experiment directory, a log or run directory (vigil_*), a state directory, or an
        /// experiment's name under $VIGIL_HOME/experiments (its newest launch).
        target: String,
        /// Where to write the page (default: <directory>/report.html).
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
    },
    /// Watch jobs from outside (cron, a login node): alert once per problem on a webhook (docs/watch.md).
    Watch(Box<vigil_watch::WatchArgs>),
    /// A job's goodput and badput by category, across its allocations (docs/goodput.md).
    ///
    /// The share of the job's wall time whose step progress was kept, and where the rest went:
    /// start-up, checkpoint saves, progress lost to failures, failure handling, unused stop lead,
    /// queue wait, other; and the ideal step time. From the ledger and the event logs alone.
    Goodput {
        /// As for `vigil report`: an experiment directory, a log, run or state directory, or an
        /// experiment's name under $VIGIL_HOME/experiments (its newest launch).
        target: String,
        /// The same numbers as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run vigil's store as a service outside the jobs (docs/store.md, "The store outside the job").
    ///
    /// Agents started with `--rdzv-conf is_host=false` (and --master-addr/--master-port or
    /// --rdzv-endpoint naming it) are its clients; node rank 0 coordinates through it. Prints
    /// `listening on HOST:PORT` first, one line per job that joins and per job it clears; stops
    /// on SIGTERM or SIGINT (status 0).
    Store(crate::run::store_service::StoreArgs),
    /// Check this node: GPUs, InfiniBand ports, storage (docs/health.md). Exit 0 healthy, 1 not.
    Health(HealthArgs),
    /// Internal: the helper that SIGKILLs rank process groups if the agent dies.
    #[command(name = "__watchdog", hide = true)]
    Watchdog,
}

#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// GPUs that must be present (default: as many as NVML sees; no NVML is then no failure).
    #[arg(long, value_parser = count)]
    pub gpus: Option<u32>,

    /// Free memory, in MiB, every GPU must have.
    #[arg(long = "min-free-mib", value_parser = clap::value_parser!(u64))]
    pub min_free_mib: Option<u64>,

    /// The InfiniBand sysfs tree.
    #[arg(long = "ib-root", default_value = crate::perf::health::IB_ROOT)]
    pub ib_root: PathBuf,

    /// Fail when the node has no InfiniBand device.
    #[arg(long = "require-ib")]
    pub require_ib: bool,

    /// `link_downed` and `symbol_error` counts a port may have (each) and still pass.
    #[arg(long = "ib-max-errors", default_value_t = 0, value_parser = clap::value_parser!(u64))]
    pub ib_max_errors: u64,

    /// Directories that must be writable with --min-free-gib free (checkpoint file systems):
    /// comma-separated, or the flag repeated.
    #[arg(long = "storage-path", value_delimiter = ',')]
    pub storage_path: Vec<PathBuf>,

    /// Free space, in GiB, --storage-path must have.
    #[arg(long = "min-free-gib", default_value_t = 1.0, value_parser = crate::perf::health::parse_gib)]
    pub min_free_gib: f64,

    /// The NVML library to load (default: $VIGIL_NVML_LIB, else the driver's libnvidia-ml.so.1).
    #[arg(long = "nvml-lib")]
    pub nvml_lib: Option<PathBuf>,

    /// Print the checks as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Number of nodes, `N` or `MIN:MAX`: MAX agents, MIN of them run ranks and the rest are
    /// standbys that take a lost node's place (hot spares). Default: from Slurm or NGC, else 1.
    #[arg(help_heading = "torchrun's options", long, env = "PET_NNODES")]
    pub nnodes: Option<String>,

    /// Hot spares without Slurm's topology: node ids in blocks of this many (an NVLink domain, a
    /// switch) are close; a standby from the lost node's block is chosen first (NVRx's `segment`).
    #[arg(help_heading = "Nodes and hot spares (vigil)", long, value_parser = count)]
    pub segment: Option<u32>,

    /// Of the job's nodes (Slurm's), this many wait as standbys (hot spares), as `--nnodes MIN:MAX`.
    #[arg(help_heading = "Nodes and hot spares (vigil)", long = "spare-nodes", alias = "spare_nodes", default_value_t = 0, value_parser = count)]
    pub spare_nodes: u32,

    /// Ranks on this node: an integer, `cpu`, `gpu` or `auto`.
    #[arg(
        help_heading = "torchrun's options",
        long = "nproc-per-node",
        alias = "nproc_per_node",
        env = "PET_NPROC_PER_NODE",
        default_value = "1"
    )]
    pub nproc_per_node: String,

    /// This node's rank among the nodes. Default: from Slurm or NGC, else 0; on several nodes
    /// with --rdzv-backend c10d, handed out by the rendezvous (the endpoint's host is 0).
    #[arg(help_heading = "torchrun's options", long = "node-rank", alias = "node_rank", env = "PET_NODE_RANK", value_parser = count)]
    pub node_rank: Option<u32>,

    /// Address of node rank 0, where vigil's store runs (the ranks' MASTER_ADDR, as written).
    /// Default: from Slurm or NGC, else torchrun's: `localhost` on one node, `127.0.0.1` with
    /// --master-port.
    #[arg(
        help_heading = "torchrun's options",
        long = "master-addr",
        alias = "master_addr",
        env = "PET_MASTER_ADDR"
    )]
    pub master_addr: Option<String>,

    /// Port of vigil's store on node rank 0. Default: a free port on one node; 29500 on several
    /// (under Slurm, a port derived from the job id).
    #[arg(help_heading = "torchrun's options", long = "master-port", alias = "master_port", env = "PET_MASTER_PORT", value_parser = port)]
    pub master_port: Option<u16>,

    /// Rendezvous backend: `static` or `c10d`.
    #[arg(
        help_heading = "torchrun's options",
        long = "rdzv-backend",
        alias = "rdzv_backend",
        env = "PET_RDZV_BACKEND",
        default_value = "static"
    )]
    pub rdzv_backend: String,

    /// Rendezvous endpoint `host[:port]`.
    #[arg(
        help_heading = "torchrun's options",
        long = "rdzv-endpoint",
        alias = "rdzv_endpoint",
        env = "PET_RDZV_ENDPOINT",
        default_value = "",
        hide_default_value = true
    )]
    pub rdzv_endpoint: String,

    /// Job id shared by every node (`TORCHELASTIC_RUN_ID`). Default: the Slurm or NGC job id,
    /// else `none` (torchrun's).
    #[arg(
        help_heading = "torchrun's options",
        long = "rdzv-id",
        alias = "rdzv_id",
        env = "PET_RDZV_ID",
        default_value = "none",
        hide_default_value = true
    )]
    pub rdzv_id: String,

    /// Extra rendezvous settings `key=value,...` (join_timeout, last_call_timeout).
    #[arg(
        help_heading = "torchrun's options",
        long = "rdzv-conf",
        alias = "rdzv_conf",
        env = "PET_RDZV_CONF",
        default_value = "",
        hide_default_value = true
    )]
    pub rdzv_conf: String,

    /// Single-node job with a local rendezvous on a free port.
    #[arg(help_heading = "torchrun's options", long, env = "PET_STANDALONE", value_parser = pet_switch)]
    pub standalone: bool,

    /// In-job restarts of the whole group before giving up.
    #[arg(help_heading = "torchrun's options", 
        long = "max-restarts",
        alias = "max_restarts",
        env = "PET_MAX_RESTARTS",
        default_value_t = 0,
        value_parser = count
    )]
    pub max_restarts: u32,

    /// Accepted for torchrun compatibility; vigil is event-driven and does not poll.
    #[arg(help_heading = "Accepted for torchrun compatibility (no effect)", 
        long = "monitor-interval",
        alias = "monitor_interval",
        env = "PET_MONITOR_INTERVAL",
        default_value_t = 0.1,
        value_parser = seconds
    )]
    pub monitor_interval: f64,

    /// Accepted for torchrun compatibility (`spawn`, `fork`, `forkserver`); ranks are always new processes.
    #[arg(help_heading = "Accepted for torchrun compatibility (no effect)", 
        long = "start-method",
        alias = "start_method",
        env = "PET_START_METHOD",
        default_value = "spawn",
        value_parser = ["spawn", "fork", "forkserver"]
    )]
    pub start_method: String,

    /// Role name (`ROLE_NAME`, console prefix).
    #[arg(
        help_heading = "torchrun's options",
        long,
        env = "PET_ROLE",
        default_value = "default"
    )]
    pub role: String,

    /// Run the script as a Python module (`python -m`).
    #[arg(help_heading = "torchrun's options", short = 'm', long, env = "PET_MODULE", value_parser = pet_switch)]
    pub module: bool,

    /// Run the script as a command without the Python interpreter.
    #[arg(help_heading = "torchrun's options", 
        long = "no-python",
        alias = "no_python",
        env = "PET_NO_PYTHON",
        value_parser = pet_switch
    )]
    pub no_python: bool,

    /// Run the script with `runpy.run_path` (it must be a path to a Python file).
    #[arg(help_heading = "torchrun's options", 
        long = "run-path",
        alias = "run_path",
        env = "PET_RUN_PATH",
        value_parser = pet_switch
    )]
    pub run_path: bool,

    /// Directory for per-rank logs, error files and the event log of every attempt. Default:
    /// $TMPDIR (or /tmp).
    #[arg(
        help_heading = "torchrun's options",
        long = "log-dir",
        alias = "log_dir",
        env = "PET_LOG_DIR"
    )]
    pub log_dir: Option<PathBuf>,

    /// Keep streams out of the console (files only): 0 none, 1 stdout, 2 stderr, 3 both, or `lr:v,...`.
    #[arg(
        help_heading = "torchrun's options",
        short = 'r',
        long,
        env = "PET_REDIRECTS",
        default_value = "0"
    )]
    pub redirects: String,

    /// Streams to show on the console and keep in files (vigil always keeps files): as --redirects.
    #[arg(
        help_heading = "torchrun's options",
        short = 't',
        long,
        env = "PET_TEE",
        default_value = "0"
    )]
    pub tee: String,

    /// Only these local ranks print to the console, e.g. `0` or `0,3` (files keep everything).
    #[arg(
        help_heading = "torchrun's options",
        long = "local-ranks-filter",
        alias = "local_ranks_filter",
        env = "PET_LOCAL_RANKS_FILTER",
        default_value = "",
        hide_default_value = true
    )]
    pub local_ranks_filter: String,

    /// Address of this node for rendezvous.
    #[arg(
        help_heading = "Accepted for torchrun compatibility (no effect)",
        long = "local-addr",
        alias = "local_addr",
        env = "PET_LOCAL_ADDR"
    )]
    pub local_addr: Option<String>,

    /// Accepted for torchrun compatibility; vigil's log layout is fixed (docs/usage.md).
    #[arg(
        help_heading = "Accepted for torchrun compatibility (no effect)",
        long = "logs-specs",
        alias = "logs_specs",
        env = "PET_LOGS_SPECS"
    )]
    pub logs_specs: Option<String>,

    /// Seconds the nodes wait for each other at each rendezvous (also `--rdzv-conf
    /// join_timeout=S`). Default: 600.
    #[arg(help_heading = "Nodes and hot spares (vigil)", long = "join-timeout", alias = "join_timeout", value_parser = seconds)]
    pub join_timeout: Option<f64>,

    /// Seconds after which a node that went silent (machine lost, network cut) counts as lost.
    #[arg(help_heading = "Nodes and hot spares (vigil)", long = "node-timeout", alias = "node_timeout", default_value_t = 30.0, value_parser = seconds)]
    pub node_timeout: f64,

    /// In-process restarts: a failed or hung rank is replaced alone and the other ranks keep their
    /// processes and memory, when every rank runs under vigil.restartable (docs/inprocess.md).
    /// Beyond this many, or when recovery fails, the whole job restarts (--max-restarts).
    #[arg(help_heading = "Supervision and restarts (vigil)", long = "in-process-restarts", alias = "in_process_restarts", default_value_t = 0, value_parser = count)]
    pub in_process_restarts: u32,

    /// Seconds a surviving rank has to leave its training function and come back to
    /// vigil.restartable once a generation began; past it the whole job restarts.
    #[arg(help_heading = "Supervision and restarts (vigil)", long = "abort-timeout", alias = "abort_timeout", default_value_t = 60.0, value_parser = seconds)]
    pub abort_timeout: f64,

    /// Seconds between SIGTERM and SIGKILL when stopping ranks after a failure.
    #[arg(help_heading = "Supervision and restarts (vigil)", 
        long = "workers-stop-timeout",
        alias = "workers_stop_timeout",
        default_value_t = 15.0,
        value_parser = seconds
    )]
    pub workers_stop_timeout: f64,

    /// Seconds a forwarded signal gives ranks before SIGKILL (default: --shutdown-timeout, else 30).
    #[arg(help_heading = "Supervision and restarts (vigil)", long = "term-timeout", alias = "term_timeout", value_parser = seconds)]
    pub term_timeout: Option<f64>,

    /// torchrun's name for --term-timeout; also read from TORCH_ELASTIC_SHUTDOWN_TIMEOUT.
    #[arg(help_heading = "torchrun's options", 
        long = "shutdown-timeout",
        alias = "shutdown_timeout",
        env = "PET_SHUTDOWN_TIMEOUT",
        value_parser = seconds
    )]
    pub shutdown_timeout: Option<f64>,

    /// Signals the agent catches and forwards to the ranks before stopping them (comma-separated).
    #[arg(
        help_heading = "torchrun's options",
        long = "signals-to-handle",
        alias = "signals_to_handle",
        env = "PET_SIGNALS_TO_HANDLE",
        default_value = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    )]
    pub signals_to_handle: String,

    /// Console prefix of each rank's lines; `${role_name}`, `${rank}`, `${local_rank}`,
    /// `${hostname}` are replaced. Default: `[${role_name}${local_rank}]:`.
    #[arg(
        help_heading = "torchrun's options",
        long = "log-line-prefix-template",
        alias = "log_line_prefix_template",
        env = "PET_LOG_LINE_PREFIX_TEMPLATE",
        default_value = "",
        hide_default_value = true
    )]
    pub log_line_prefix_template: String,

    /// Copy stdout lines containing any of these comma-separated strings (`,,` is a comma) to
    /// attempt_<n>/filtered_stdout.log in the run directory.
    #[arg(
        help_heading = "torchrun's options",
        long = "duplicate-stdout-filters",
        alias = "duplicate_stdout_filters",
        env = "PET_DUPLICATE_STDOUT_FILTERS",
        default_value = "",
        hide_default_value = true
    )]
    pub duplicate_stdout_filters: String,

    /// As --duplicate-stdout-filters, for stderr (attempt_<n>/filtered_stderr.log).
    #[arg(
        help_heading = "torchrun's options",
        long = "duplicate-stderr-filters",
        alias = "duplicate_stderr_filters",
        env = "PET_DUPLICATE_STDERR_FILTERS",
        default_value = "",
        hide_default_value = true
    )]
    pub duplicate_stderr_filters: String,

    /// Every rank gets LOCAL_RANK=0 and sees only its own GPU (CUDA_VISIBLE_DEVICES), as device 0.
    #[arg(help_heading = "torchrun's options", 
        long = "virtual-local-rank",
        alias = "virtual_local_rank",
        env = "PET_VIRTUAL_LOCAL_RANK",
        value_parser = pet_switch
    )]
    pub virtual_local_rank: bool,

    /// Accepted for torchrun compatibility; vigil always writes its own event log (--event-log).
    #[arg(help_heading = "Accepted for torchrun compatibility (no effect)", 
        long = "event-log-handler",
        alias = "event_log_handler",
        env = "PET_EVENT_LOG_HANDLER",
        default_value = "null",
        value_parser = ["null", "console", "dynamic_rendezvous"]
    )]
    pub event_log_handler: String,

    /// Bind each rank to the CPUs (and memory) of its GPU's NUMA node: `node`, `socket`,
    /// `exclusive` or `core-complex` (docs/health.md).
    #[arg(help_heading = "torchrun's options", 
        long = "numa-binding",
        alias = "numa_binding",
        value_parser = ["node", "socket", "exclusive", "core-complex"]
    )]
    pub numa_binding: Option<String>,

    /// With --numa-binding, memory comes only from the GPU's NUMA node (true) or preferably from
    /// it (false); ft_launcher's numa_bind_strict.
    #[arg(help_heading = "Node health and GPUs (vigil)", long = "numa-bind-strict", alias = "numa_bind_strict", hide = true, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", default_value = "true",
          value_parser = pet_switch)]
    pub numa_bind_strict: bool,

    /// The NVML library to load (default: $VIGIL_NVML_LIB, else the driver's libnvidia-ml.so.1).
    #[arg(
        help_heading = "Node health and GPUs (vigil)",
        long = "nvml-lib",
        alias = "nvml_lib"
    )]
    pub nvml_lib: Option<PathBuf>,

    /// Check the node (`vigil health`: GPUs, InfiniBand, --health-storage-path) before each
    /// rendezvous; a failing node ends the allocation asking to requeue without it.
    #[arg(help_heading = "Node health and GPUs (vigil)", long = "health-check", alias = "health_check", num_args = 0..=1, require_equals = true,
          overrides_with = "health_check",
          default_missing_value = "true", default_value = "false", hide_default_value = true, value_parser = pet_switch)]
    pub health_check: bool,

    /// Directories --health-check also requires writable with 1 GiB free (comma-separated).
    #[arg(
        help_heading = "Node health and GPUs (vigil)",
        long = "health-storage-path",
        alias = "health_storage_path",
        value_delimiter = ','
    )]
    pub health_storage_path: Vec<PathBuf>,

    /// Seconds to wait between attempts until this node's ranks' GPUs have released their
    /// memory (0: no wait).
    #[arg(help_heading = "Node health and GPUs (vigil)", long = "gpu-memory-reclaim-timeout", alias = "gpu_memory_reclaim_timeout",
          default_value_t = 50.0, value_parser = seconds)]
    pub gpu_memory_reclaim_timeout: f64,

    /// MiB a GPU may still have in use and count as released.
    #[arg(help_heading = "Node health and GPUs (vigil)", long = "gpu-memory-tolerance-mb", alias = "gpu_memory_tolerance_mb",
          default_value_t = 512.0, value_parser = crate::perf::health::parse_mib)]
    pub gpu_memory_tolerance_mb: f64,

    /// Seconds between two looks at the GPUs' memory while waiting.
    #[arg(help_heading = "Node health and GPUs (vigil)", long = "gpu-memory-poll-interval", alias = "gpu_memory_poll_interval",
          default_value_t = 2.0, value_parser = seconds)]
    pub gpu_memory_poll_interval: f64,

    /// Seconds before the second restart in a row; each further one waits twice as long (up to
    /// --restart-backoff-max). The first restart is immediate; 0 turns back-off off.
    #[arg(help_heading = "Supervision and restarts (vigil)", 
        long = "restart-backoff",
        alias = "restart_backoff",
        default_value_t = 1.0,
        value_parser = seconds
    )]
    pub restart_backoff: f64,

    /// The longest wait before a restart, in seconds.
    #[arg(help_heading = "Supervision and restarts (vigil)", 
        long = "restart-backoff-max",
        alias = "restart_backoff_max",
        default_value_t = 30.0,
        value_parser = seconds
    )]
    pub restart_backoff_max: f64,

    /// An attempt that ran this many seconds before failing makes the next restart immediate again.
    #[arg(help_heading = "Supervision and restarts (vigil)", 
        long = "restart-backoff-reset",
        alias = "restart_backoff_reset",
        default_value_t = 300.0,
        value_parser = seconds
    )]
    pub restart_backoff_reset: f64,

    /// Seconds from a rank's start to its first heartbeat (catches ranks that never connect).
    #[arg(help_heading = "Hang detection (vigil; off until a timeout is given)", 
        long = "initial-heartbeat-timeout",
        alias = "initial_heartbeat_timeout",
        value_parser = seconds
    )]
    pub initial_heartbeat_timeout: Option<f64>,

    /// Seconds allowed between two heartbeats of a rank.
    #[arg(help_heading = "Hang detection (vigil; off until a timeout is given)", long = "heartbeat-timeout", alias = "heartbeat_timeout", value_parser = seconds)]
    pub heartbeat_timeout: Option<f64>,

    /// Per-section timeouts `step=60,checkpointing=600`; `warmup=S` applies to every section during the first --warmup-steps heartbeats.
    #[arg(
        help_heading = "Hang detection (vigil; off until a timeout is given)",
        long = "section-timeouts",
        alias = "section_timeouts"
    )]
    pub section_timeouts: Option<String>,

    /// Seconds a rank may spend outside every section (after it connected).
    #[arg(help_heading = "Hang detection (vigil; off until a timeout is given)", 
        long = "out-of-section-timeout",
        alias = "out_of_section_timeout",
        value_parser = seconds
    )]
    pub out_of_section_timeout: Option<f64>,

    /// Heartbeats during which the `warmup` section timeout applies.
    #[arg(help_heading = "Hang detection (vigil; off until a timeout is given)", long = "warmup-steps", alias = "warmup_steps", default_value_t = 5, value_parser = count)]
    pub warmup_steps: u32,

    /// Calculated timeouts are this many times the longest observed.
    #[arg(help_heading = "Hang detection (vigil; off until a timeout is given)", long = "safety-factor", alias = "safety_factor", default_value_t = 5.0, value_parser = factor)]
    pub safety_factor: f64,

    /// Calculate the timeouts given here on its own, once every rank was observed long enough
    /// (16 heartbeats, each timed section closed once). Without it they change only when the
    /// job's code asks (vigil.calculate_timeouts(), NVRx's calculate_and_set_*), as under
    /// ft_launcher.
    #[arg(
        help_heading = "Hang detection (vigil; off until a timeout is given)",
        long = "calculate-timeouts",
        alias = "calculate_timeouts"
    )]
    pub calculate_timeouts: bool,

    /// Signal a hung rank gets once its stacks are captured (SIGKILL follows after --workers-stop-timeout).
    #[arg(
        help_heading = "Hang detection (vigil; off until a timeout is given)",
        long = "rank-termination-signal",
        alias = "rank_termination_signal",
        default_value = "SIGTERM"
    )]
    pub rank_termination_signal: String,

    /// Seconds to wait for a hung rank's Python stack dump before terminating it.
    #[arg(help_heading = "Hang detection (vigil; off until a timeout is given)", 
        long = "stack-dump-timeout",
        alias = "stack_dump_timeout",
        default_value_t = 2.0,
        value_parser = seconds
    )]
    pub stack_dump_timeout: f64,

    /// File for calculated timeouts, loaded at start and saved when they change (default:
    /// timeouts.json in the job's state directory, or in the run directory for a run without a
    /// job id, which loads none).
    #[arg(
        help_heading = "Hang detection (vigil; off until a timeout is given)",
        long = "timeouts-file",
        alias = "timeouts_file"
    )]
    pub timeouts_file: Option<PathBuf>,

    /// Print vigil's shell completion script for `bash` or `zsh` and exit (torchrun's, from shtab).
    #[arg(help_heading = "torchrun's options", 
        long = "print-completion",
        alias = "print_completion",
        value_name = "SHELL",
        value_parser = ["bash", "zsh"]
    )]
    pub print_completion: Option<String>,

    /// Across allocations (docs/allocations.md): seconds before the allocation's end at which
    /// the ranks are asked to checkpoint at one step and exit, at least; vigil raises it to what
    /// it measured a checkpoint and the steps to the stop step take (times --safety-factor).
    #[arg(help_heading = "Across allocations: stop at one step, requeue (vigil)", long = "stop-lead", alias = "stop_lead", default_value_t = 60.0, value_parser = seconds)]
    pub stop_lead: f64,

    /// When the allocation ends: unix seconds or RFC 3339 (2026-11-23T18:00:00Z). Default under
    /// Slurm: the job's end time, re-read as it changes.
    #[arg(
        help_heading = "Across allocations: stop at one step, requeue (vigil)",
        long = "end-time",
        alias = "end_time",
        value_name = "TIME"
    )]
    pub end_time: Option<String>,

    /// How long the allocation lasts from the agent's start, as BCP's --total-runtime: Slurm's
    /// forms (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) or 90s, 45m, 2h, 1d.
    #[arg(
        help_heading = "Across allocations: stop at one step, requeue (vigil)",
        long = "time-limit",
        alias = "time_limit",
        value_name = "DURATION"
    )]
    pub time_limit: Option<String>,

    /// Consecutive failed allocations after which the job is not requeued any more.
    #[arg(help_heading = "Across allocations: stop at one step, requeue (vigil)", long = "max-requeues", alias = "max_requeues", default_value_t = 2, value_parser = count)]
    pub max_requeues: u32,

    /// Allocations in a row without progress (highest step grown by --min-progress-steps) after
    /// which the job is not requeued any more (ft_launcher's max_no_progress_cycles).
    #[arg(help_heading = "Across allocations: stop at one step, requeue (vigil)", long = "max-no-progress", alias = "max_no_progress", default_value_t = 3, value_parser = count)]
    pub max_no_progress: u32,

    /// Steps the highest step must grow by to count as progress, so that a step or two of jitter
    /// is not (ft_launcher's min_progress_iterations); a restart back-off grows only for
    /// attempts without progress (docs/usage.md#progress).
    #[arg(help_heading = "Across allocations: stop at one step, requeue (vigil)", long = "min-progress-steps", alias = "min_progress_steps", default_value_t = crate::allocation::policy::DEFAULT_MIN_PROGRESS_STEPS as u32, value_parser = count)]
    pub min_progress_steps: u32,

    /// The exit status for "do not requeue" (ft_launcher's no_restart_exit_code); default: the
    /// failure's own status.
    #[arg(help_heading = "Across allocations: stop at one step, requeue (vigil)", long = "no-restart-exit-code", alias = "no_restart_exit_code", value_parser = clap::value_parser!(i32).range(1..=255))]
    pub no_restart_exit_code: Option<i32>,

    /// Where the job's ledger and calculated values live across allocations (default: the job's
    /// state directory: under Slurm <log-dir or the job's working dir>/vigil-job-<cluster>-<id>/,
    /// else <log-dir or $TMPDIR>/vigil-job-<id>/).
    #[arg(
        help_heading = "Across allocations: stop at one step, requeue (vigil)",
        long = "state-dir",
        alias = "state_dir",
        value_name = "DIR"
    )]
    pub state_dir: Option<PathBuf>,

    /// Progress as NVRx's tracker measures it: the iteration in this file (one integer, written
    /// by the training code at each checkpoint), read when the job starts and after each attempt,
    /// in place of the steps the ranks report (ft_launcher's --ft-checkpoint-iteration-file).
    #[arg(
        help_heading = "Across allocations: stop at one step, requeue (vigil)",
        long = "checkpoint-iteration-file",
        alias = "checkpoint_iteration_file",
        value_name = "FILE"
    )]
    pub checkpoint_iteration_file: Option<PathBuf>,

    /// Stragglers (docs/stragglers.md): seconds between the job-wide straggler reports node rank
    /// 0 prints and logs (NVRx's report_time_interval).
    #[arg(help_heading = "Stragglers (vigil)", long = "straggler-report-interval", alias = "straggler_report_interval", default_value_t = 300.0, value_parser = seconds)]
    pub straggler_report_interval: f64,

    /// A rank whose relative or individual score is below this is a straggler (NVRx's
    /// gpu_relative_perf_threshold / gpu_individual_perf_threshold).
    #[arg(help_heading = "Stragglers (vigil)", long = "straggler-threshold", alias = "straggler_threshold", default_value_t = 0.7, value_parser = fraction)]
    pub straggler_threshold: f64,

    /// When a report finds a straggler, stop the job at an agreed step (the ranks checkpoint) and
    /// requeue it without the straggler's node (NVRx's stop_if_detected).
    #[arg(
        help_heading = "Stragglers (vigil)",
        long = "stop-if-straggler",
        alias = "stop_if_straggler"
    )]
    pub stop_if_straggler: bool,

    /// For ranks that send no step timings: the section whose durations are their step times.
    #[arg(
        help_heading = "Stragglers (vigil)",
        long = "straggler-section",
        alias = "straggler_section",
        default_value = "step",
        value_name = "NAME"
    )]
    pub straggler_section: String,

    /// JSON-lines event log (default: events.jsonl in the run directory).
    #[arg(
        help_heading = "Output (vigil)",
        long = "event-log",
        alias = "event_log"
    )]
    pub event_log: Option<PathBuf>,

    /// Serve Prometheus metrics at http://<this node>:PORT/metrics on every agent (docs/metrics.md);
    /// 0: any free port, printed.
    #[arg(help_heading = "Output (vigil)", long = "metrics-port", alias = "metrics_port", value_name = "PORT", value_parser = port)]
    pub metrics_port: Option<u16>,

    /// Write the same metrics to DIR/vigil_<job>_<node rank>.prom (temp file and rename) every
    /// 15 s and at exit, for node_exporter's textfile collector.
    #[arg(
        help_heading = "Output (vigil)",
        long = "metrics-textfile",
        alias = "metrics_textfile",
        value_name = "DIR"
    )]
    pub metrics_textfile: Option<PathBuf>,

    /// Print NVRx's `[NestedRestarter] name=[InJob] state=...` lines on stdout (node rank 0), as
    /// NVRx's functional tests expect; on when vigil runs as `ft_launcher` (docs/ft_launcher.md).
    #[arg(
        help_heading = "Output (vigil)",
        long = "nvrx-restarter-log",
        alias = "nvrx_restarter_log"
    )]
    pub nvrx_restarter_log: bool,

    /// Write NVRx's per-cycle info files (`cycle_info.<job>.<attempt>.<cycle>` and the `.current`
    /// link, node rank 0) here; ranks get `NVRX_CURRENT_CYCLE_INFO` (ft_launcher's
    /// --ft-cycle-info-dir).
    #[arg(
        help_heading = "Output (vigil)",
        long = "cycle-info-dir",
        alias = "cycle_info_dir",
        value_name = "DIR"
    )]
    pub cycle_info_dir: Option<PathBuf>,

    /// The training script (or module with -m, or command with --no-python).
    #[arg(value_name = "TRAINING_SCRIPT")]
    pub training_script: String,

    /// Arguments passed to the training script.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    pub training_script_args: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> RunArgs {
        let mut full = vec!["vigil", "run"];
        full.extend_from_slice(args);
        match Cli::try_parse_from(full).unwrap().command {
            Command::Run(r) => *r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn both_spellings() {
        let a = parse(&["--nproc-per-node", "4", "--max_restarts=2", "t.py"]);
        assert_eq!(a.nproc_per_node, "4");
        assert_eq!(a.max_restarts, 2);
        let b = parse(&[
            "--nproc_per_node=3",
            "--node_rank",
            "0",
            "--rdzv_backend",
            "c10d",
            "t.py",
        ]);
        assert_eq!(b.nproc_per_node, "3");
        assert_eq!(b.rdzv_backend, "c10d");
    }

    #[test]
    fn script_args_pass_through_untouched() {
        let a = parse(&[
            "--nproc-per-node",
            "2",
            "train.py",
            "--lr",
            "0.1",
            "-m",
            "--nproc-per-node",
            "9",
        ]);
        assert_eq!(a.training_script, "train.py");
        assert_eq!(
            a.training_script_args,
            vec!["--lr", "0.1", "-m", "--nproc-per-node", "9"]
        );
        assert_eq!(a.nproc_per_node, "2");
        assert!(!a.module);
    }

    #[test]
    fn module_and_short_flags() {
        let a = parse(&["-m", "-r", "3", "-t", "0:1", "pkg.train", "x"]);
        assert!(a.module);
        assert_eq!(a.redirects, "3");
        assert_eq!(a.tee, "0:1");
        assert_eq!(a.training_script, "pkg.train");
    }

    #[test]
    fn unknown_flag_is_an_error() {
        assert!(Cli::try_parse_from(["vigil", "run", "--bogus", "t.py"]).is_err());
    }
}

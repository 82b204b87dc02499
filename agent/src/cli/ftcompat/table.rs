//! Every ft_launcher setting vigil knows: its kind, default, and what it becomes in vigil (a
//! flag, or a note saying why it changes nothing).

/// How a setting's value is read.
#[derive(Debug, Clone, Copy)]
pub(super) enum Kind {
    /// Seconds >= 0; `null`/`none`/`` (and `inf`) mean disabled.
    Timeout,
    /// A number; `null`/`none`/`` mean unset.
    Float,
    /// A number > 0.
    Positive,
    /// An integer.
    Int,
    /// An integer >= 0.
    Count,
    /// A count where 0 or less turns the check off (as 0).
    CountOrOff,
    Bool,
    Str,
    Signal,
    LogLevel,
    Sections,
    Choice(&'static [&'static str]),
}

/// What a setting does in vigil.
#[derive(Debug, Clone, Copy)]
pub(super) enum Effect {
    /// Becomes this vigil flag.
    Map(&'static str),
    /// Accepted, no effect, for this reason.
    Note(&'static str),
}

/// ft_launcher's default, so that a YAML file that merely restates it prints no note.
#[derive(Debug, Clone, Copy)]
pub(super) enum Dflt {
    Null,
    F(f64),
    I(i64),
    B(bool),
    S(&'static str),
}

pub(super) struct Opt {
    /// `FaultToleranceConfig` field name (the YAML key); the flag is `--ft-` + it with dashes.
    pub(super) field: &'static str,
    pub(super) kind: Kind,
    pub(super) effect: Effect,
    pub(super) default: Dflt,
}

pub(super) const DEADLINE: &str =
    "vigil is deadline-driven and acts the moment a timeout expires, not on a polling interval";
pub(super) const NO_NODE_CHECK: &str = "vigil checks the node with `vigil health` / --health-check before each rendezvous (docs/health.md), not on an interval or an endpoint";
pub(super) const NO_ATTRIBUTION: &str = "vigil has no attribution service; its failure summary and event log name the failing rank and the cause";
pub(super) const NO_LOG_FUNNEL: &str =
    "vigil keeps each rank's logs per attempt in its run directory under --log-dir";
pub(super) const NO_SPARES: &str = "vigil keeps every node's group rank and gives a lost node's to the closest healthy standby (SLURM_TOPOLOGY_ADDR, else --segment); this setting has no separate effect";
pub(super) const NO_LOG_LEVEL: &str =
    "vigil's console lines are fixed; every event is in its event log (--event-log)";
pub(super) const ANY_FAILED: &str = "vigil always restarts every rank when one fails (any-failed)";
pub(super) const NO_LAYERED: &str = "vigil has no layered restart protocol to poll";
pub(super) const FIRE_AND_FORGET: &str = "messages from ranks to vigil are always fire-and-forget";
pub(super) const OWN_RDZV: &str = "vigil has its own rendezvous (--rdzv-backend)";
pub(super) const KILLS_GROUPS: &str =
    "vigil always kills what each rank leaves in its process group";
pub(super) const RECORDS_EXITS: &str =
    "vigil records each rank's exit status and error file itself";
pub(super) const NO_CYCLE_INFO_JOB: &str =
    "for nvrx-control only; ft_launcher and vigil name cycle_info files by SLURM_ARRAY_JOB_ID, else SLURM_JOB_ID";

pub(super) const fn map(field: &'static str, kind: Kind, target: &'static str) -> Opt {
    Opt {
        field,
        kind,
        effect: Effect::Map(target),
        default: Dflt::Null,
    }
}

pub(super) const fn note(field: &'static str, kind: Kind, default: Dflt, why: &'static str) -> Opt {
    Opt {
        field,
        kind,
        effect: Effect::Note(why),
        default,
    }
}

#[rustfmt::skip]
pub(super) const OPTS: &[Opt] = &[
    map("initial_rank_heartbeat_timeout", Kind::Timeout, "--initial-heartbeat-timeout"),
    map("rank_heartbeat_timeout", Kind::Timeout, "--heartbeat-timeout"),
    map("rank_section_timeouts", Kind::Sections, "--section-timeouts"),
    map("rank_out_of_section_timeout", Kind::Timeout, "--out-of-section-timeout"),
    map("safety_factor", Kind::Positive, "--safety-factor"),
    map("rank_termination_signal", Kind::Signal, "--rank-termination-signal"),
    map("num_warmup_iterations", Kind::Count, "--warmup-steps"),
    note("workload_check_interval", Kind::Float, Dflt::F(5.0), DEADLINE),
    note("log_level", Kind::LogLevel, Dflt::I(20), NO_LOG_LEVEL),
    note("restart_policy", Kind::Choice(&["any-failed", "min-healthy"]), Dflt::S("any-failed"), ANY_FAILED),
    note("restart_check_interval", Kind::Float, Dflt::F(60.0), NO_LAYERED),
    note("node_health_check_interval", Kind::Float, Dflt::F(5.0), NO_NODE_CHECK),
    note("node_health_check_endpoint", Kind::Str, Dflt::Null, NO_NODE_CHECK),
    map("enable_nic_monitor", Kind::Bool, "--health-check"),
    map("enable_nic_healthcheck", Kind::Bool, "--health-check"),
    note("pci_topo_file", Kind::Str, Dflt::Null, NO_NODE_CHECK),
    note("link_down_path_template", Kind::Str, Dflt::Null, NO_NODE_CHECK),
    note("link_state_path_template", Kind::Str, Dflt::Null, NO_NODE_CHECK),
    map("enable_dist_storage_healthcheck", Kind::Bool, "--health-check"),
    map("storage_healthcheck_path", Kind::Str, "--health-storage-path"),
    note("skip_section_response", Kind::Bool, Dflt::B(true), FIRE_AND_FORGET),
    note("rdzv_impl", Kind::Choice(&["barrier", "legacy"]), Dflt::S("barrier"), OWN_RDZV),
    map("segment", Kind::Int, "--segment"),
    note("use_infra_group_rank", Kind::Bool, Dflt::B(true), NO_SPARES),
    note("domain_id_from_node_name", Kind::Bool, Dflt::B(true), NO_SPARES),
    note("segment_health_check_dir", Kind::Str, Dflt::Null, NO_SPARES),
    map("numa_bind_strict", Kind::Bool, "--numa-bind-strict"),
    map("gpu_memory_reclaim_timeout", Kind::Float, "--gpu-memory-reclaim-timeout"),
    map("gpu_memory_tolerance_mb", Kind::Float, "--gpu-memory-tolerance-mb"),
    map("gpu_memory_poll_interval", Kind::Float, "--gpu-memory-poll-interval"),
    note("check_remaining_processes", Kind::Bool, Dflt::B(false), KILLS_GROUPS),
    note("install_exception_hook", Kind::Bool, Dflt::B(false), RECORDS_EXITS),
    map("max_no_progress_cycles", Kind::CountOrOff, "--max-no-progress"),
    map("max_no_progress_restarts", Kind::CountOrOff, "--max-no-progress"),
    map("min_progress_iterations", Kind::Count, "--min-progress-steps"),
    map("checkpoint_iteration_file", Kind::Str, "--checkpoint-iteration-file"),
    map("no_restart_exit_code", Kind::Int, "--no-restart-exit-code"),
    note("attribution_endpoint", Kind::Str, Dflt::Null, NO_ATTRIBUTION),
    note("attribution_stop_action", Kind::Str, Dflt::Null, NO_ATTRIBUTION),
    note("attribution_export_url", Kind::Str, Dflt::Null, NO_ATTRIBUTION),
    note("attribution_startup_timeout", Kind::Float, Dflt::Null, NO_ATTRIBUTION),
    note("attribution_llm_api_key_file", Kind::Str, Dflt::Null, NO_ATTRIBUTION),
    note("attribution_llm_base_url", Kind::Str, Dflt::Null, NO_ATTRIBUTION),
    note("attribution_llm_model", Kind::Str, Dflt::Null, NO_ATTRIBUTION),
    note("attribution_analysis_backend", Kind::Str, Dflt::Null, NO_ATTRIBUTION),
    note("attribution_compute_timeout", Kind::Float, Dflt::Null, NO_ATTRIBUTION),
    note("attribution_log_level", Kind::Str, Dflt::Null, NO_ATTRIBUTION),
    map("cycle_info_dir", Kind::Str, "--cycle-info-dir"),
    note("cycle_info_job_id", Kind::Str, Dflt::Null, NO_CYCLE_INFO_JOB),
    note("base_logfile", Kind::Str, Dflt::Null, NO_LOG_FUNNEL),
    note("per_cycle_applog_prefix", Kind::Str, Dflt::Null, NO_LOG_FUNNEL),
    note("nvrx_logfile", Kind::Str, Dflt::Null, NO_LOG_FUNNEL),
    note("enable_log_server", Kind::Bool, Dflt::B(false), NO_LOG_FUNNEL),
    note("log_server_port", Kind::Int, Dflt::I(50051), NO_LOG_FUNNEL),
    note("log_aggregator_count", Kind::Int, Dflt::I(0), NO_LOG_FUNNEL),
    note("log_leaf_max_queue_chunks", Kind::Int, Dflt::I(-1), NO_LOG_FUNNEL),
    note("log_server_log_prefix", Kind::Str, Dflt::Null, NO_LOG_FUNNEL),
    note("log_server_graceful_shutdown_timeout", Kind::Float, Dflt::F(60.0), NO_LOG_FUNNEL),
];

/// Flag spellings (dashes, after `--ft-`) that differ from their field name.
pub(super) const FLAG_ALIASES: &[(&str, &str)] =
    &[("storage-health-check-path", "storage_healthcheck_path")];

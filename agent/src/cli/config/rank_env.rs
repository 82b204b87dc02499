//! What each rank sees: its environment as torchrun names it, its console prefix, and the GPU
//! it may use under `--virtual-local-rank`. Pure: the agent's environment is passed in.

use crate::values::ConfigError;

use super::LaunchConfig;

/// What a rank started in a failed rank's place learns of its generation (in-process restarts,
/// docs/inprocess.md): `VIGIL_GENERATION` and the global ranks replaced in it,
/// `VIGIL_REPLACED` (comma-separated).
pub fn generation_env(generation: u64, replaced: &[u32]) -> Vec<(String, String)> {
    let replaced: Vec<String> = replaced.iter().map(u32::to_string).collect();
    vec![
        ("VIGIL_GENERATION".into(), generation.to_string()),
        ("VIGIL_REPLACED".into(), replaced.join(",")),
    ]
}

/// A rank's console prefix from torchrun's `--log-line-prefix-template`, substituted like
/// Python's `string.Template.safe_substitute`: `$name` and `${name}` for `role_name`, `rank`,
/// `local_rank` and `hostname`; `$$` is `$`; anything else stays as written.
pub fn render_prefix(
    template: Option<&str>,
    role: &str,
    rank: u32,
    local_rank: u32,
    hostname: &str,
) -> String {
    let Some(t) = template else {
        return format!("[{role}{local_rank}]:");
    };
    let value = |name: &str| -> Option<String> {
        match name {
            "role_name" => Some(role.to_string()),
            "rank" => Some(rank.to_string()),
            "local_rank" => Some(local_rank.to_string()),
            "hostname" => Some(hostname.to_string()),
            _ => None,
        }
    };
    let is_start = |c: char| c.is_ascii_alphabetic() || c == '_';
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::new();
    let mut rest = t;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(braced) = after.strip_prefix('{') {
            let name_len = braced.find('}').filter(|&n| {
                n > 0 && braced[..n].starts_with(is_start) && braced[..n].chars().all(is_ident)
            });
            match name_len.and_then(|n| value(&braced[..n]).map(|v| (n, v))) {
                Some((n, v)) => {
                    out.push_str(&v);
                    rest = &braced[n + 1..];
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        } else {
            let n = if after.starts_with(is_start) {
                after.find(|c: char| !is_ident(c)).unwrap_or(after.len())
            } else {
                0
            };
            match (n > 0).then(|| value(&after[..n])).flatten() {
                Some(v) => {
                    out.push_str(&v);
                    rest = &after[n..];
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        }
    }
    out.push_str(rest);
    out
}

/// torchrun's `--virtual-local-rank`: the GPU a local rank may see, from the agent's
/// HIP_VISIBLE_DEVICES (if set and not empty) or CUDA_VISIBLE_DEVICES, else the local rank itself.
/// Returns the variable to follow and the device, or why this rank has no GPU.
pub fn virtual_device(
    local_rank: u32,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    let (var, list) = match env("HIP_VISIBLE_DEVICES").filter(|v| !v.is_empty()) {
        Some(v) => ("HIP_VISIBLE_DEVICES", Some(v)),
        None => ("CUDA_VISIBLE_DEVICES", env("CUDA_VISIBLE_DEVICES")),
    };
    match list {
        None => Ok(local_rank.to_string()),
        Some(l) => {
            let devices: Vec<&str> = l.split(',').collect();
            devices
                .get(local_rank as usize)
                .map(|d| d.trim().to_string())
                .ok_or_else(|| {
                    ConfigError(format!(
                        "--virtual-local-rank: local rank {local_rank} has no GPU in {var}={l}; give --nproc-per-node {} or list more devices",
                        devices.len()
                    ))
                })
        }
    }
}

/// Everything a rank's environment depends on besides the launch plan.
pub struct RankSlot<'a> {
    pub local_rank: u32,
    /// This node's group rank in the attempt (its node rank, unless a standby took a lost node's
    /// place).
    pub group_rank: u32,
    pub restart_count: u32,
    /// Global rank of this node's local rank 0, and the job's rank count, from the rendezvous.
    pub rank_offset: u32,
    pub world_size: u32,
    /// vigil's store, as the ranks reach it.
    pub master_addr: &'a str,
    pub master_port: u16,
    pub error_file: &'a str,
}

/// The variables vigil sets for one rank, exactly as torchrun names them. The agent's own
/// environment is inherited underneath; `env` reads it for the defaults that depend on it.
pub fn worker_env(
    cfg: &LaunchConfig,
    slot: &RankSlot,
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<(String, String)> {
    let world = slot.world_size;
    let rank = slot.rank_offset + slot.local_rank;
    let mut v: Vec<(&str, String)> = vec![
        ("RANK", rank.to_string()),
        ("LOCAL_RANK", slot.local_rank.to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("LOCAL_WORLD_SIZE", cfg.nproc.to_string()),
        ("GROUP_RANK", slot.group_rank.to_string()),
        ("GROUP_WORLD_SIZE", cfg.active_nodes.to_string()),
        ("ROLE_RANK", rank.to_string()),
        ("ROLE_NAME", cfg.role.clone()),
        ("ROLE_WORLD_SIZE", world.to_string()),
        ("MASTER_ADDR", slot.master_addr.to_string()),
        ("MASTER_PORT", slot.master_port.to_string()),
        ("TORCHELASTIC_RESTART_COUNT", slot.restart_count.to_string()),
        ("TORCHELASTIC_MAX_RESTARTS", cfg.max_restarts.to_string()),
        ("TORCHELASTIC_RUN_ID", cfg.run_id.clone()),
        // MASTER_ADDR:MASTER_PORT is vigil's store on node rank 0: ranks connect to it as
        // clients (torch then prefixes their keys with /worker/attempt_<n>).
        ("TORCHELASTIC_USE_AGENT_STORE", "True".into()),
        (
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            env("TORCH_NCCL_ASYNC_ERROR_HANDLING").unwrap_or_else(|| "1".into()),
        ),
        ("TORCHELASTIC_ERROR_FILE", slot.error_file.into()),
        (
            "TORCHELASTIC_SIGNALS_TO_HANDLE",
            cfg.signals_to_handle.clone(),
        ),
        // What the shim's StragglerDetectionCallback compares its own arguments with.
        (
            "VIGIL_STRAGGLER_INTERVAL",
            cfg.straggler.interval.as_secs_f64().to_string(),
        ),
        (
            "VIGIL_STRAGGLER_THRESHOLD",
            cfg.straggler.threshold.to_string(),
        ),
        (
            "VIGIL_STOP_IF_STRAGGLER",
            u8::from(cfg.straggler.stop).to_string(),
        ),
    ];
    if cfg.nproc > 1 && env("OMP_NUM_THREADS").is_none() {
        v.push(("OMP_NUM_THREADS", "1".into()));
    }
    if cfg.virtual_local_rank {
        // As torchrun: the rank sees only its own GPU, as device 0. `resolve` checked that the
        // agent's device list covers every local rank.
        if let Some(lr) = v.iter_mut().find(|(k, _)| *k == "LOCAL_RANK") {
            lr.1 = "0".into();
        }
        if let Ok(dev) = virtual_device(slot.local_rank, env) {
            if env("HIP_VISIBLE_DEVICES").is_some_and(|h| !h.is_empty()) {
                v.push(("HIP_VISIBLE_DEVICES", dev.clone()));
            }
            v.push(("CUDA_VISIBLE_DEVICES", dev));
        }
    }
    v.into_iter().map(|(k, val)| (k.to_string(), val)).collect()
}

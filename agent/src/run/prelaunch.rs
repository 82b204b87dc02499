//! Before any rank starts: the run directory, whose saved state this is, and whether every rank's
//! command can be executed.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::proc;
use crate::cli::config::LaunchConfig;
use crate::job::state::Provenance;
use crate::values::file_safe;

/// Who this node's saved state says wrote it.
pub(super) fn provenance(cfg: &LaunchConfig) -> Provenance {
    Provenance {
        job_id: cfg.allocation.identity.as_ref().map(|i| i.key()),
        program: cfg.program.clone(),
        nnodes: cfg.nnodes,
        nproc_per_node: cfg.nproc,
    }
}

/// A problem found before any rank starts; printed as one line, exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StartError(pub String);

/// Creates the run directory, `<log_dir or $TMPDIR>/vigil_<job id or script>_<UTC time>_<hex>/`:
/// a person finds a job's directory by its id or its script, and when it ran; the hex part keeps
/// two agents that start in the same second apart.
pub fn make_run_dir(cfg: &LaunchConfig) -> Result<PathBuf, StartError> {
    let (base, flag) = match &cfg.log_dir {
        Some(d) => (d.clone(), "--log-dir"),
        None => (std::env::temp_dir(), "the temp dir ($TMPDIR)"),
    };
    let now = SystemTime::now();
    let nanos = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let suffix = format!("{:06x}", ((std::process::id() << 16) ^ nanos) & 0xff_ffff);
    let name = run_dir_name(cfg.job_id.as_deref(), &cfg.program, now, &suffix);
    let dir = base.join(name);
    fs::create_dir_all(&dir).map_err(|e| {
        StartError(format!(
            "{flag} {}: cannot create {}: {e}; choose a directory you can write",
            base.display(),
            dir.display()
        ))
    })?;
    // Ranks may change directory; every path they are given must be absolute.
    fs::canonicalize(&dir).map_err(|e| StartError(format!("cannot resolve {}: {e}", dir.display())))
}

/// `vigil_<id or script stem>_<YYYYMMDD-HHMMSS>_<suffix>`.
pub(super) fn run_dir_name(
    job_id: Option<&str>,
    program: &str,
    now: SystemTime,
    suffix: &str,
) -> String {
    let who = job_id
        .map(str::to_string)
        .unwrap_or_else(|| match program.strip_prefix("-m ") {
            Some(module) => module.rsplit('.').next().unwrap_or(module).to_string(),
            None => Path::new(program)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
        });
    let stamp: String = humantime::format_rfc3339_seconds(now)
        .to_string()
        .chars()
        .filter_map(|c| match c {
            '0'..='9' => Some(c),
            'T' => Some('-'),
            _ => None,
        })
        .collect();
    format!("vigil_{}_{stamp}_{suffix}", file_safe(&who))
}

/// Checks that every rank's command can be executed, before anything starts.
pub fn check_command(
    cfg: &LaunchConfig,
    script_is_file: bool,
    script: &str,
) -> Result<(), StartError> {
    let prog = &cfg.command[0];
    if proc::find_program(prog, std::env::var("PATH").ok().as_deref()).is_none() {
        let hint = if script_is_file {
            "; set PYTHON_EXEC to a Python interpreter or put python3 on PATH"
        } else {
            "; check the command name and PATH"
        };
        return Err(StartError(format!(
            "cannot execute {prog:?}: not found or not executable{hint}"
        )));
    }
    if script_is_file && !Path::new(script).is_file() {
        let cwd = std::env::current_dir().unwrap_or_default();
        return Err(StartError(format!(
            "training script {script:?} not found (looked in {}); give a path to an existing file",
            cwd.display()
        )));
    }
    Ok(())
}

/// Checks that `--cycle-info-dir` can take NVRx's cycle info files, as the state directory is
/// checked: created if needed and a probe written there, on every node (node rank 0 writes the
/// files, and which node that is may be decided only at the rendezvous).
pub fn check_cycle_info_dir(cfg: &LaunchConfig) -> Result<(), StartError> {
    let Some(plan) = &cfg.nvrx.cycle_info else {
        return Ok(());
    };
    let tag = format!("cycle-info-{}", std::process::id());
    crate::job::state::check_writable(&plan.dir, &tag).map_err(|e| {
        StartError(format!(
            "--cycle-info-dir {} {}: vigil writes NVRx's cycle_info files there for the ranks' NVRX_CURRENT_CYCLE_INFO; give a writable directory or leave the flag out",
            e.dir.display(),
            e.why
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn run_directories_say_whose_and_when() {
        let t = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        assert_eq!(
            run_dir_name(None, "/w/my train.py", t, "abc123"),
            "vigil_my_train_20261118-110640_abc123"
        );
        assert_eq!(
            run_dir_name(None, "-m pkg.trainer", t, "1"),
            "vigil_trainer_20261118-110640_1"
        );
        assert_eq!(
            run_dir_name(Some("4242"), "/w/train.py", t, "1"),
            "vigil_4242_20261118-110640_1"
        );
    }
}

//! `vigil run`'s argument list as its parser takes it (ft_launcher's flags translated, the
//! `--ft-cfg-path` file read with a bound), and the check `vigil launch` makes of the `vigil run`
//! line it renders: the same parser and the same resolution as the job's agents will make,
//! without starting anything.

use std::path::Path;

use clap::Parser;

use crate::cli::config::{self, Host};
use crate::cli::{Cli, Command};
use crate::values::ConfigError;

/// Reads an `--ft-cfg-path` file: a regular file of at most 1 MiB (a FIFO or `/dev/zero` is
/// refused at once).
pub fn read_config_file(p: &Path) -> std::io::Result<String> {
    vigil_bounded::read_string(p, vigil_bounded::CONFIG_LIMIT)
        .map_err(vigil_bounded::ReadError::into_io)
}

/// `vigil run`'s words after `run`, rewritten for its parser: ft_launcher's flags become
/// vigil's, and a `--` goes before the training script so that nothing after it is read as
/// vigil's flag (torchrun passes everything after the script untouched, but for a `--` right
/// after it). Returns the words and
/// the notes to print.
pub fn run_words(
    words: &[String],
    read: &dyn Fn(&Path) -> std::io::Result<String>,
) -> Result<(Vec<String>, Vec<String>), ConfigError> {
    let t = crate::cli::ftcompat::translate(words, read)?;
    let (ours, script) = t.args.split_at(t.script_at);
    let mut out = crate::cli::ftcompat::join_values(ours);
    let mut script = script.to_vec();
    if script.first().is_some_and(|s| s != "--") {
        // torchrun (argparse) drops a `--` right after the script: `-m pkg.train -- --depth=20`
        // runs `pkg.train --depth=20`. Only that one; a later `--` is the script's own.
        if script.get(1).is_some_and(|s| s == "--") {
            script.remove(1);
        }
        out.push("--".into());
    }
    out.extend(script);
    Ok((out, t.notes))
}

/// The environment `srun` gives node rank 0 of a `nodes`-node job, for checking a rendered line
/// before the job exists: nothing of the submitting host's (its TMPDIR, its GPUs) is asked.
fn job_env(nodes: u32) -> impl Fn(&str) -> Option<String> {
    move |k: &str| {
        let n = nodes.to_string();
        match k {
            "SLURM_JOB_ID" => Some("1".into()),
            "SLURM_NNODES" | "SLURM_STEP_NUM_NODES" | "SLURM_STEP_NUM_TASKS" => Some(n),
            "SLURM_STEP_ID" | "SLURM_NODEID" => Some("0".into()),
            "SLURM_JOB_NODELIST" => Some("vigil-launch-check".into()),
            "TMPDIR" => Some("/tmp".into()),
            _ => None,
        }
    }
}

/// Checks `vigil run`'s words (after `run`) as rendered for a `nodes`-node job with
/// `gpus_per_node` GPUs: parsed by `vigil run`'s own clap definition and resolved by
/// [`config::resolve`], as every node's agent will, so that a bad `[vigil]` value is refused
/// before the job is submitted. The first line of the parser's or the resolution's message on
/// error.
pub fn check_run_line(words: &[String], nodes: u32, gpus_per_node: u32) -> Result<(), ConfigError> {
    let (words, _notes) = run_words(words, &read_config_file)?;
    let argv = ["vigil".to_string(), "run".to_string()]
        .into_iter()
        .chain(words);
    let cli = Cli::try_parse_from(argv).map_err(|e| {
        let text = e.render().to_string();
        let first = text.lines().next().unwrap_or_default();
        ConfigError(first.strip_prefix("error: ").unwrap_or(first).to_string())
    })?;
    let Command::Run(a) = cli.command else {
        return Err(ConfigError("not a vigil run line".into()));
    };
    let env = job_env(nodes);
    let gpus = move || Ok(gpus_per_node);
    // The compute node's limits are not known here: the node's own agent checks them.
    let host = Host {
        cpus: u32::MAX / config::RANKS_PER_CPU,
        nofile: u64::MAX,
        gpus: &gpus,
        env: &env,
        now: std::time::SystemTime::now(),
        // The job's working directory is the compute node's: not known here, not asked.
        cwd: None,
    };
    config::resolve(&a, &host).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_rendered_line_is_checked_by_the_run_parser_and_resolution() {
        let base = [
            "--nnodes",
            "2",
            "--nproc-per-node",
            "2",
            "--rdzv-id",
            "1",
            "--log-dir",
            "/e/runs",
            "--state-dir",
            "/e/state",
        ];
        let mut ok = words(&base);
        ok.extend(words(&["--max-restarts", "3", "t.py", "--steps", "5"]));
        check_run_line(&ok, 2, 0).unwrap();
        let mut bad = words(&base);
        bad.extend(words(&["--max-restarts", "abc", "t.py"]));
        let e = check_run_line(&bad, 2, 0).unwrap_err().0;
        assert!(e.contains("--max-restarts") && !e.contains('\n'), "{e}");
        let mut bad = words(&base);
        bad.extend(words(&["--safety-factor", "0.5", "t.py"]));
        let e = check_run_line(&bad, 2, 0).unwrap_err().0;
        assert!(e.contains("'--safety-factor <SAFETY_FACTOR>'"), "{e}");
        // Past the parser, the resolution's own checks.
        let mut bad = words(&base);
        bad.extend(words(&["--rdzv-backend", "etcd", "t.py"]));
        let e = check_run_line(&bad, 2, 0).unwrap_err().0;
        assert!(
            e.contains("--rdzv-backend \"etcd\" is not supported"),
            "{e}"
        );
    }
}

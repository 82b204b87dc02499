//! What `ft_launcher --help` and `ft_launcher --version` print: ft_launcher's own names (its
//! usage line, its `--ft-*` flags and what each becomes in vigil) and the NVRx release whose
//! ft_launcher vigil stands in for, rather than `vigil run`'s.

use super::table::{Effect, OPTS};

/// The NVIDIA Resiliency Extension release whose `ft_launcher` flags, YAML keys, outputs and
/// exit statuses vigil follows (docs/ft_launcher.md; tests/nvrx run against it).
pub const NVRX_VERSION: &str = "0.7";

/// `ft_launcher --version`: vigil's release and the NVRx release it is compatible with.
pub fn version_text(vigil_version: &str) -> String {
    format!(
        "ft_launcher (vigil {vigil_version}), compatible with ft_launcher of NVIDIA Resiliency Extension (NVRx) {NVRX_VERSION}\n"
    )
}

/// `ft_launcher --help`: what it is, its usage, then `run_help` (vigil run's options, which
/// ft_launcher takes too: torchrun's flags are the same), then every `--ft-*` flag (and YAML
/// key) with the vigil flag it becomes or why it changes nothing.
pub fn help_text(run_help: &str) -> String {
    let mut out = format!(
        "ft_launcher: vigil standing in for ft_launcher of NVIDIA Resiliency Extension (NVRx) {NVRX_VERSION}.\n\
         Its flags and --ft-cfg-path YAML are read as NVRx reads them and turned into vigil run's\n\
         (docs/ft_launcher.md).\n\n\
         Usage: ft_launcher [OPTIONS] <TRAINING_SCRIPT> [ARGS]...\n\n"
    );
    // clap's own usage line names `ft_launcher run`: the line above is the one that holds.
    for line in run_help.lines().filter(|l| !l.starts_with("Usage:")) {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(
        "\nFault tolerance (ft_launcher's flags; each is also a key of --ft-cfg-path's `fault_tolerance:` section):\n\
         \x20     --ft-cfg-path <FILE>\n          NVRx's YAML config file\n\
         \x20     --ignore-missing-fault-tol-cfg, --ft-ignore-missing-cfg\n          A missing or unreadable --ft-cfg-path is a note, not an error\n",
    );
    for o in OPTS {
        let flag = o.field.replace('_', "-");
        out.push_str(&format!("      --ft-{flag} <VALUE>\n"));
        match o.effect {
            Effect::Map(to) => out.push_str(&format!("          vigil run's {to}\n")),
            Effect::Note(why) => out.push_str(&format!("          Accepted, no effect: {why}\n")),
        }
    }
    out.push_str(
        "\nEvery --ft-* flag may also be spelled --ft-x_y, --ft_x_y or --ft-param-x_y, as NVRx accepts.\n",
    );
    out
}

/// What `ft_launcher`'s arguments ask before any run: `--version` or `--help` among the flags
/// before the training script (`args`: vigil run's words, the script after a `--`).
pub fn asked(args: &[String]) -> Option<Asked> {
    let ours = args.split(|a| a == "--").next().unwrap_or_default();
    if ours.iter().any(|a| a == "--version" || a == "-V") {
        Some(Asked::Version)
    } else if ours.iter().any(|a| a == "--help" || a == "-h") {
        Some(Asked::Help)
    } else {
        None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    Version,
    Help,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn help_and_version_are_asked_before_the_script_only() {
        assert_eq!(asked(&sv(&["--version"])), Some(Asked::Version));
        assert_eq!(asked(&sv(&["--nnodes", "2", "-h"])), Some(Asked::Help));
        assert_eq!(asked(&sv(&["--", "t.py", "--help"])), None);
        assert_eq!(asked(&sv(&["--nnodes", "2", "--", "t.py"])), None);
    }

    #[test]
    fn the_help_speaks_ft_launchers_names() {
        let h = help_text(
            "Launch ranks\n\nUsage: ft_launcher run [OPTIONS]\n\nOptions:\n  -h, --help\n",
        );
        assert!(
            h.contains("Usage: ft_launcher [OPTIONS] <TRAINING_SCRIPT>"),
            "{h}"
        );
        assert!(!h.contains("ft_launcher run"), "{h}");
        assert!(h.contains("NVRx) 0.7"), "{h}");
        assert!(
            h.contains("      --ft-rank-heartbeat-timeout <VALUE>\n          vigil run's --heartbeat-timeout\n"),
            "{h}"
        );
        assert!(h.contains("--ft-workload-check-interval <VALUE>\n          Accepted, no effect: vigil is deadline-driven"), "{h}");
        assert!(version_text("1.2.3").starts_with("ft_launcher (vigil 1.2.3), compatible with ft_launcher of NVIDIA Resiliency Extension (NVRx) 0.7"));
    }
}

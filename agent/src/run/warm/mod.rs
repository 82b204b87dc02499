//! Warm processes (in-process restarts, docs/inprocess.md): a Python interpreter started like a
//! rank, ahead of need, that has already imported what is slow (torch) and waits on its stdin.
//! When a rank must be replaced, the agent hands it the rank's identity (its environment) and
//! it runs the user's script or module as the rank would have; the replacement's interpreter
//! start and imports are then off the recovery's critical path.
//!
//! It owns: whether a command can be run warm ([`plan`], pure: a Python interpreter with a
//! script or `-m module`), the warm process's command and environment, the one warm process an
//! agent holds, handing it over, and discarding it. It decides nothing: the supervisor asks
//! for a replacement, and the agent takes the warm process when one is there, or starts the
//! rank cold as before.
//!
//! `VIGIL_WARM_IMPORTS` (the agent's environment) names the modules to import ahead, comma-
//! separated (default `torch`; a module missing from the interpreter is skipped);
//! `VIGIL_WARM_IMPORTS=off` starts no warm process.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::Path;

use super::proc::{self, Spawned};

/// The Python the warm process runs (`-c`), so it needs nothing installed beside the script.
const BOOTSTRAP: &str = include_str!("bootstrap.py");
pub const IMPORTS_VAR: &str = "VIGIL_WARM_IMPORTS";
const DEFAULT_IMPORTS: &str = "torch";

/// Variables that differ between the ranks of a node: a warm process starts without them and
/// learns them when it becomes a rank.
const PER_RANK: &[&str] = &[
    "RANK",
    "LOCAL_RANK",
    "ROLE_RANK",
    "TORCHELASTIC_ERROR_FILE",
    "VIGIL_STACK_FILE",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "VIGIL_GENERATION",
    "VIGIL_REPLACED",
];

/// What a rank's command runs, when it is a Python interpreter's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The interpreter and its own options.
    pub interpreter: Vec<String>,
    /// `script PATH` or `module NAME`, then the script's arguments.
    pub target: Vec<String>,
}

/// Whether `command` can be run warm: `python* [OPTIONS] SCRIPT ARGS` or
/// `python* [OPTIONS] -m MODULE ARGS`, the options being ones without a value or `-X`/`-W`
/// with one. Anything else (`-c`, stdin, another program) is started cold.
pub fn plan(command: &[String]) -> Option<Plan> {
    let exe = command.first()?;
    let base = Path::new(exe).file_name()?.to_str()?;
    if !base.starts_with("python") {
        return None;
    }
    let mut interpreter = vec![exe.clone()];
    let mut i = 1;
    while let Some(a) = command.get(i) {
        match a.as_str() {
            "-m" => {
                let name = command.get(i + 1)?;
                let mut target = vec!["module".to_string(), name.clone()];
                target.extend(command[i + 2..].iter().cloned());
                return Some(Plan {
                    interpreter,
                    target,
                });
            }
            "-X" | "-W" => {
                interpreter.extend(command.get(i..i + 2)?.iter().cloned());
                i += 2;
            }
            "-u" | "-B" | "-O" | "-OO" | "-s" | "-S" | "-E" | "-I" | "-b" | "-bb" | "-d" | "-q"
            | "-R" => {
                interpreter.push(a.clone());
                i += 1;
            }
            s if s.starts_with('-') => return None,
            script => {
                let mut target = vec!["script".to_string(), script.to_string()];
                target.extend(command[i + 1..].iter().cloned());
                return Some(Plan {
                    interpreter,
                    target,
                });
            }
        }
    }
    None
}

impl Plan {
    /// The warm process's command line.
    pub fn argv(&self) -> Vec<String> {
        let mut v = self.interpreter.clone();
        v.push("-c".into());
        v.push(BOOTSTRAP.into());
        v.extend(self.target.iter().cloned());
        v
    }
}

/// The modules to import ahead, from `VIGIL_WARM_IMPORTS`; `None`: no warm process.
pub fn imports(var: Option<&str>) -> Option<String> {
    match var.map(str::trim) {
        None => Some(DEFAULT_IMPORTS.into()),
        Some("off") => None,
        Some(list) => Some(list.into()),
    }
}

/// A warm process's environment: a rank's, less what differs between ranks, with the imports.
pub fn warm_env(rank_env: &[(String, String)], imports: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = rank_env
        .iter()
        .filter(|(k, _)| !PER_RANK.contains(&k.as_str()))
        .cloned()
        .collect();
    env.push((IMPORTS_VAR.into(), imports.into()));
    env
}

/// The line that makes a warm process rank: its whole environment as vigil sets it.
pub fn handoff_line(rank_env: &[(String, String)]) -> String {
    let env: serde_json::Map<String, serde_json::Value> = rank_env
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    let mut line = serde_json::json!({ "env": env }).to_string();
    line.push('\n');
    line
}

/// A warm process: started, importing or waiting.
pub struct Warm {
    sp: Spawned,
    stdin: OwnedFd,
}

impl Warm {
    /// Starts one, as a rank is started (its own session, the agent's cgroup, the parent-death
    /// signal).
    pub fn start(
        plan: &Plan,
        env: &[(String, String)],
        cgroup: Option<&Path>,
    ) -> std::io::Result<Warm> {
        let (sp, stdin) = proc::spawn_with_stdin(&plan.argv(), env, cgroup)?;
        Ok(Warm { sp, stdin })
    }

    pub fn pid(&self) -> i32 {
        self.sp.pid
    }

    /// Makes it the rank whose environment is `rank_env`: the started rank, as
    /// [`proc::spawn_rank`] gives it, or the error when the warm process is gone (it is then
    /// discarded, and the rank is started cold).
    pub fn hand_off(self, rank_env: &[(String, String)]) -> std::io::Result<Spawned> {
        let mut pipe = std::fs::File::from(self.stdin);
        match pipe.write_all(handoff_line(rank_env).as_bytes()) {
            Ok(()) => Ok(self.sp),
            Err(e) => {
                discard(self.sp.pid);
                Err(e)
            }
        }
    }

    /// Ends it and reaps it, so that no sweep finds it as a rank's leftover.
    pub fn discard(self) {
        discard(self.sp.pid);
    }
}

fn discard(pid: i32) {
    use nix::sys::wait::waitpid;
    use nix::unistd::Pid;
    proc::signal_group(pid, libc::SIGKILL);
    let _ = waitpid(Pid::from_raw(pid), None);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn a_script_and_its_arguments() {
        let p = plan(&v(&[
            "/usr/bin/python3",
            "-u",
            "-X",
            "dev",
            "train.py",
            "-m",
            "x",
        ]))
        .unwrap();
        assert_eq!(p.interpreter, v(&["/usr/bin/python3", "-u", "-X", "dev"]));
        assert_eq!(p.target, v(&["script", "train.py", "-m", "x"]));
        let argv = p.argv();
        assert_eq!(argv[4], "-c");
        assert_eq!(&argv[6..], &v(&["script", "train.py", "-m", "x"])[..]);
    }

    #[test]
    fn a_module() {
        let p = plan(&v(&["python3.11", "-m", "pkg.train", "--lr", "1"])).unwrap();
        assert_eq!(p.target, v(&["module", "pkg.train", "--lr", "1"]));
    }

    #[test]
    fn what_is_not_a_python_script_starts_cold() {
        assert_eq!(plan(&v(&["bash", "train.sh"])), None);
        assert_eq!(plan(&v(&["python3", "-c", "print(1)"])), None);
        assert_eq!(plan(&v(&["python3", "-"])), None);
        assert_eq!(plan(&v(&["python3", "-u"])), None);
        assert_eq!(plan(&v(&["python3", "-m"])), None);
        assert_eq!(plan(&v(&["python3", "-X"])), None);
        assert_eq!(plan(&[]), None);
    }

    #[test]
    fn the_imports_default_to_torch_and_off_is_none() {
        assert_eq!(imports(None).as_deref(), Some("torch"));
        assert_eq!(imports(Some("torch,numpy")).as_deref(), Some("torch,numpy"));
        assert_eq!(imports(Some("")).as_deref(), Some(""));
        assert_eq!(imports(Some(" off ")), None);
    }

    #[test]
    fn the_warm_env_leaves_out_the_rank_and_the_handoff_carries_it() {
        let rank = vec![
            ("RANK".to_string(), "3".to_string()),
            ("WORLD_SIZE".to_string(), "4".to_string()),
            ("VIGIL_GENERATION".to_string(), "1".to_string()),
        ];
        let w = warm_env(&rank, "torch");
        assert_eq!(
            w,
            vec![
                ("WORLD_SIZE".to_string(), "4".to_string()),
                (IMPORTS_VAR.to_string(), "torch".to_string())
            ]
        );
        let line = handoff_line(&rank);
        assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
        let back: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["env"]["RANK"], "3");
        assert_eq!(back["env"]["VIGIL_GENERATION"], "1");
    }
}

//! A Slurm command line as plain data, and the blocking runner that kills it at a timeout.
//!
//! [`run_command`] waits for its child by pid: where something else reaps every child with
//! `waitpid(-1)` (the agent's event loop: the agent is a subreaper) it must not run, or that
//! reaper takes the command's exit status from under it.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A command line to run: program, arguments and the variables added to the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmd {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl Cmd {
    /// `program args...` with the caller's environment.
    pub fn new(program: &str, args: &[&str]) -> Cmd {
        Cmd {
            program: program.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: Vec::new(),
        }
    }

    /// The same command with `key=value` added to its environment.
    pub fn with_env(mut self, key: &str, value: &str) -> Cmd {
        self.env.push((key.into(), value.into()));
        self
    }

    /// The command as `std::process` runs it (program, arguments, environment; nothing else).
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }
}

impl std::fmt::Display for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (k, v) in &self.env {
            write!(f, "{k}={v} ")?;
        }
        write!(f, "{}", self.program)?;
        for a in &self.args {
            write!(f, " {a}")?;
        }
        Ok(())
    }
}

/// Why a command gave no answer; one line each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    #[error("cannot run `{cmd}`: {why}")]
    Spawn { cmd: String, why: String },
    #[error("`{cmd}` did not finish in {} s and was killed", after.as_secs_f64())]
    TimedOut { cmd: String, after: Duration },
    #[error("`{cmd}` failed ({status}){}", first_line(stderr))]
    Failed {
        cmd: String,
        status: String,
        stderr: String,
    },
}

fn first_line(stderr: &str) -> String {
    match stderr.lines().map(str::trim).find(|l| !l.is_empty()) {
        Some(line) => format!(": {line}"),
        None => String::new(),
    }
}

/// Runs `cmd` to its end and returns its standard output; kills it (its whole process group) at
/// `timeout`. The command runs in a process group of its own and ignores SIGTERM (see the body).
/// Blocking; see the module doc for where it must not run.
pub fn run_command(cmd: &Cmd, timeout: Duration) -> Result<String, RunError> {
    let shown = cmd.to_string();
    let mut command = cmd.command();
    // `scontrol requeue` SIGTERMs every process of the job's steps, the agent and this command
    // included, while the agent still has `scontrol update ExcNodeList=` to run: the command
    // ignores SIGTERM (an ignored signal stays ignored across exec), the timeout's SIGKILL still
    // works.
    // SAFETY: between fork and exec only async-signal-safe calls: signal(2).
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| RunError::Spawn {
            cmd: shown.clone(),
            why: match e.kind() {
                std::io::ErrorKind::NotFound => format!("{} is not on PATH", cmd.program),
                _ => e.to_string(),
            },
        })?;
    let pid = child.id() as i32;
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let (tx, rx) = mpsc::channel();
    // The pipes are read on threads so that a command that writes much cannot block on a full
    // pipe while we wait for it; the waiting thread reports when all is read and it has exited.
    std::thread::spawn(move || {
        let err_reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(e) = stderr.as_mut() {
                let _ = e.read_to_end(&mut buf);
            }
            buf
        });
        let mut out = Vec::new();
        if let Some(o) = stdout.as_mut() {
            let _ = o.read_to_end(&mut out);
        }
        let err = err_reader.join().unwrap_or_default();
        let status = child.wait();
        let _ = tx.send((status, out, err));
    });
    let (status, out, err) = match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(_) => {
            // A negative pid signals the command's whole process group.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(-pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            // Its reader thread finishes once the group is gone; nothing waits for it.
            return Err(RunError::TimedOut {
                cmd: shown,
                after: timeout,
            });
        }
    };
    let status = status.map_err(|e| RunError::Spawn {
        cmd: shown.clone(),
        why: e.to_string(),
    })?;
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    if status.success() {
        Ok(text(out))
    } else {
        Err(RunError::Failed {
            cmd: shown,
            status: status.to_string(),
            stderr: text(err),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Cmd {
        Cmd::new("sh", &["-c", script]).with_env("SLURM_TIME_FORMAT", "%s")
    }

    #[test]
    fn a_command_line_shows_its_environment_first() {
        let c =
            Cmd::new("squeue", &["-h", "-j", "75", "-o", "%e"]).with_env("SLURM_TIME_FORMAT", "%s");
        assert_eq!(c.to_string(), "SLURM_TIME_FORMAT=%s squeue -h -j 75 -o %e");
        assert_eq!(Cmd::new("scancel", &["7"]).to_string(), "scancel 7");
    }

    #[test]
    fn the_runner_returns_stdout_with_the_environment_given() {
        let out = run_command(
            &sh("echo \"end $SLURM_TIME_FORMAT\""),
            Duration::from_secs(60),
        );
        assert_eq!(out, Ok("end %s\n".into()));
    }

    #[test]
    fn the_runner_reports_failure_with_its_first_stderr_line() {
        let e = run_command(
            &sh("echo; echo 'Invalid job id' >&2; echo more >&2; exit 3"),
            Duration::from_secs(60),
        )
        .unwrap_err();
        let line = e.to_string();
        assert!(
            line.contains("exit status: 3") && line.ends_with(": Invalid job id"),
            "{line}"
        );
        let e = run_command(&sh("exit 4"), Duration::from_secs(60)).unwrap_err();
        assert!(e.to_string().ends_with("failed (exit status: 4)"), "{e}");
        let e = run_command(
            &Cmd::new("vigil-no-such-program", &[]),
            Duration::from_secs(60),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("vigil-no-such-program is not on PATH"),
            "{e}"
        );
    }

    #[test]
    fn the_runner_kills_a_command_that_overruns_with_its_children() {
        let dir = std::env::temp_dir().join(format!("vigil-slurm-run-cmd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("child.pid");
        let script = format!("sleep 300 & echo $! > {}; wait", pidfile.display());
        let e = run_command(&sh(&script), Duration::from_millis(500)).unwrap_err();
        assert!(matches!(e, RunError::TimedOut { .. }), "{e}");
        assert!(e.to_string().contains("did not finish in 0.5 s"), "{e}");
        // The background sleep was in the command's process group: it is gone (or a zombie
        // about to be reaped by init), never left running.
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit(')').next().map(|r| r.trim().chars().next()))
                .flatten();
            if matches!(state, None | Some('Z') | Some('X')) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "sleep {pid} still {state:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

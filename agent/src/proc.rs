//! Process control at the edge: starting ranks, signalling their process groups, reaping, and the
//! watchdog that SIGKILLs every rank group when the agent dies without cleaning up (SIGKILL, OOM).

use std::collections::BTreeSet;
use std::io::{self, BufRead, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::supervisor::ExitKind;

/// Orphaned descendants of ranks are reparented to the agent, so it can reap them and nothing is
/// left as a zombie under init.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes a plain integer argument.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub struct Spawned {
    pub pid: i32,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// Starts one rank in a new session (so it leads its own process group, away from the terminal's
/// Ctrl-C) that dies with SIGKILL if the agent's thread dies. Exec errors are reported here.
pub fn spawn_rank(argv: &[String], env: &[(String, String)]) -> io::Result<Spawned> {
    let parent = std::process::id() as i32;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure only makes async-signal-safe system calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            // The agent may have died between fork and prctl; then nobody would signal us.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let stdout = child.stdout.take().expect("piped").into();
    let stderr = child.stderr.take().expect("piped").into();
    // The child is reaped by `reap_all`, never through this handle.
    Ok(Spawned {
        pid: child.id() as i32,
        stdout,
        stderr,
    })
}

/// Sends `sig` to a process group; a group that no longer exists is not an error. A stopped group
/// (SIGSTOP, `scontrol suspend`) is continued so it can act on the signal.
pub fn signal_group(pgid: i32, sig: i32) {
    let Ok(signal) = Signal::try_from(sig) else {
        return;
    };
    match killpg(Pid::from_raw(pgid), signal) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => eprintln!("[vigil] cannot send {signal} to process group {pgid}: {e}"),
    }
    if signal != Signal::SIGKILL && signal != Signal::SIGCONT {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGCONT);
    }
}

/// Reaps every child that has ended (ranks and orphaned descendants alike).
pub fn reap_all() -> Vec<(i32, ExitKind)> {
    let mut out = Vec::new();
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => out.push((pid.as_raw(), ExitKind::Code(code))),
            Ok(WaitStatus::Signaled(pid, sig, _)) => {
                out.push((pid.as_raw(), ExitKind::Signal(sig as i32)))
            }
            Ok(WaitStatus::StillAlive) | Err(_) => break,
            Ok(_) => continue,
        }
    }
    out
}

/// Resolves a program the way execvp will, so a command that cannot run is refused before any
/// rank starts.
pub fn find_program(prog: &str, path_var: Option<&str>) -> Option<std::path::PathBuf> {
    let is_exec = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if prog.contains('/') {
        let p = Path::new(prog);
        return is_exec(p).then(|| p.to_path_buf());
    }
    path_var?
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(prog))
        .find(|p| is_exec(p))
}

/// The agent's side of the watchdog: a pipe to a helper process that outlives an agent killed
/// without warning and SIGKILLs every process group still registered when the pipe closes.
pub struct Watchdog {
    stdin: Option<std::process::ChildStdin>,
}

impl Watchdog {
    pub fn start() -> io::Result<Watchdog> {
        let child = Command::new("/proc/self/exe")
            .arg("__watchdog")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()?;
        Ok(Watchdog { stdin: child.stdin })
    }

    fn send(&mut self, line: String) {
        if let Some(s) = &mut self.stdin {
            if s.write_all(line.as_bytes()).is_err() {
                eprintln!("[vigil] the watchdog is gone; ranks are still killed by their parent-death signal");
                self.stdin = None;
            }
        }
    }

    pub fn guard(&mut self, pgid: i32) {
        self.send(format!("+{pgid}\n"));
    }

    pub fn release(&mut self, pgid: i32) {
        self.send(format!("-{pgid}\n"));
    }
}

/// The watchdog process itself (`vigil __watchdog`).
pub fn watchdog_main() -> i32 {
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGPIPE,
    ] {
        // SAFETY: setting a signal to SIG_IGN installs no handler code.
        unsafe {
            let _ = nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigIgn);
        }
    }
    let mut groups = BTreeSet::new();
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (op, n) = line.split_at(line.len().min(1));
        let Ok(pgid) = n.parse::<i32>() else { continue };
        if pgid <= 1 {
            continue;
        }
        match op {
            "+" => {
                groups.insert(pgid);
            }
            "-" => {
                groups.remove(&pgid);
            }
            _ => {}
        }
    }
    for pgid in groups {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    0
}

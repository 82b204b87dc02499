//! Process control at the edge: starting ranks, signalling their process groups, reaping, finding
//! every process a rank left behind (a cgroup of the agent's own, and a token in every rank's
//! environment), and the watchdog that does the same when the agent dies without cleaning up
//! (SIGKILL, OOM).

use std::collections::BTreeSet;
use std::ffi::CString;
use std::io::{self, BufRead, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::supervise::ExitKind;

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

/// The environment variable that carries an agent instance's token into every rank, and from there
/// into everything a rank starts (unless it clears its environment).
pub const TOKEN_VAR: &str = "VIGIL_AGENT_TOKEN";
/// Tells `vigil __watchdog` what to sweep after the agent is gone: `TOKEN` or `TOKEN CGROUP_DIR`.
const WATCHDOG_VAR: &str = "VIGIL_WATCHDOG_SWEEP";
/// `VIGIL_CGROUP=off` keeps the agent from creating a cgroup (the token and the subreaper still
/// find what ranks leave behind).
const CGROUP_VAR: &str = "VIGIL_CGROUP";

/// Everything this agent instance started, wherever it went: a cgroup v2 of its own where one can
/// be created (`cgroup.kill` ends everything in it, however it detached), and always a random token
/// in every rank's environment, found again by a scan of /proc.
#[derive(Debug, Clone)]
pub struct Containment {
    token: String,
    cgroup: Option<PathBuf>,
}

impl Containment {
    /// A fresh token and, where the agent may create one under its own cgroup, a cgroup.
    pub fn create() -> Containment {
        let token = new_token();
        let wanted = std::env::var(CGROUP_VAR).map_or(true, |v| v != "off");
        let cgroup = own_cgroup_dir().filter(|_| wanted).and_then(|dir| {
            let mine = dir.join(format!("vigil-{}-{}", std::process::id(), &token[..8]));
            std::fs::create_dir(&mine).ok().map(|_| mine)
        });
        Containment { token, cgroup }
    }

    fn from_watchdog_env() -> Option<Containment> {
        let v = std::env::var(WATCHDOG_VAR).ok()?;
        let mut it = v.splitn(2, ' ');
        let token = it.next().filter(|t| t.len() >= 16)?.to_string();
        let cgroup = it.next().map(PathBuf::from);
        Some(Containment { token, cgroup })
    }

    fn watchdog_env(&self) -> String {
        match &self.cgroup {
            Some(c) => format!("{} {}", self.token, c.display()),
            None => self.token.clone(),
        }
    }

    pub fn cgroup(&self) -> Option<&Path> {
        self.cgroup.as_deref()
    }

    /// The entry every rank's environment gets.
    pub fn env(&self) -> (String, String) {
        (TOKEN_VAR.into(), self.token.clone())
    }

    /// SIGKILLs every process of this agent instance's ranks that is still alive: the cgroup's
    /// members, every same-uid process whose environment carries the token and, with
    /// `orphans_of = Some(agent)`, every child of the agent (a subreaper) but the `spare` ones.
    /// Scans again until a scan finds nothing, since a process may fork while it is being found.
    /// Returns how many distinct processes were killed.
    pub fn sweep(&self, orphans_of: Option<(i32, &[i32])>) -> usize {
        let needle = format!("{TOKEN_VAR}={}", self.token).into_bytes();
        let me = std::process::id() as i32;
        let uid = nix::unistd::geteuid().as_raw();
        let mut killed = BTreeSet::new();
        // Bounded, so a fork bomb cannot keep the agent here; each round kills all it found.
        for _ in 0..200 {
            let mut found = Vec::new();
            if let Some(cg) = &self.cgroup {
                let members = cgroup_members(cg);
                if !members.is_empty() && std::fs::write(cg.join("cgroup.kill"), "1").is_err() {
                    for pid in &members {
                        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
                    }
                }
                found.extend(members);
            }
            for pid in leftovers(&needle, uid, me, orphans_of) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                found.push(pid);
            }
            if found.is_empty() {
                break;
            }
            killed.extend(found);
            std::thread::sleep(Duration::from_millis(5));
        }
        killed.len()
    }

    /// Removes the cgroup once it is empty (a few tries: killed members leave it asynchronously).
    pub fn remove(&self) {
        if let Some(cg) = &self.cgroup {
            for _ in 0..100 {
                match std::fs::remove_dir(cg) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    _ => return,
                }
            }
        }
    }
}

fn new_token() -> String {
    let mut buf = [0u8; 16];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .is_ok();
    if !ok {
        // Unique per instance is all that is needed: pid and the clock serve without urandom.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        buf[..8].copy_from_slice(&(t as u64).to_le_bytes());
        buf[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// The directory of the agent's own cgroup v2, from /proc/self/cgroup and the cgroup2 mount.
fn own_cgroup_dir() -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let rel = cgroup_v2_path(&cgroups)?;
    let mount = cgroup2_mount(&mounts)?;
    let dir = mount.join(rel.trim_start_matches('/'));
    dir.is_dir().then_some(dir)
}

/// The `0::PATH` entry of /proc/PID/cgroup (the unified hierarchy).
pub fn cgroup_v2_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::trim_end)
        .filter(|p| p.starts_with('/'))
}

/// The mount point of the cgroup2 file system in a /proc/PID/mountinfo.
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (post.split_whitespace().next()? == "cgroup2")
            .then(|| pre.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

fn cgroup_members(cg: &Path) -> Vec<i32> {
    std::fs::read_to_string(cg.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Whether a NUL-separated environment block holds exactly the entry `needle`.
pub fn environ_has(environ: &[u8], needle: &[u8]) -> bool {
    environ.split(|b| *b == 0).any(|e| e == needle)
}

/// State and parent pid from a /proc/PID/stat line (the command name may hold spaces and
/// parentheses, so the fields are read after the last `)`).
pub fn stat_state_ppid(stat: &str) -> Option<(char, i32)> {
    let mut f = stat.rsplit_once(')')?.1.split_whitespace();
    let state = f.next()?.chars().next()?;
    Some((state, f.next()?.parse().ok()?))
}

/// The state letter of a process (`R`, `S`, `T` stopped, `Z` zombie...), if it exists.
pub fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_state_ppid(&stat).map(|(s, _)| s)
}

/// Live processes (other than `me`) left by this agent's ranks: same-uid processes whose
/// environment holds `needle`, and children of `orphans_of.0` not in `orphans_of.1`. Zombies
/// are dead already and left to their reaper.
fn leftovers(needle: &[u8], uid: u32, me: i32, orphans_of: Option<(i32, &[i32])>) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        if pid == me || (uid != 0 && e.metadata().ok()?.uid() != uid) {
            return None;
        }
        let (state, ppid) = stat_state_ppid(&std::fs::read_to_string(e.path().join("stat")).ok()?)?;
        if state == 'Z' || state == 'X' {
            return None;
        }
        if orphans_of.is_some_and(|(agent, spare)| ppid == agent && !spare.contains(&pid)) {
            return Some(pid);
        }
        let environ = std::fs::read(e.path().join("environ")).ok()?;
        environ_has(&environ, needle).then_some(pid)
    })
    .collect()
}

/// Starts one rank in a new session (so it leads its own process group, away from the terminal's
/// Ctrl-C) that dies with SIGKILL if the agent's thread dies. Exec errors are reported here. With
/// `cgroup`, the rank moves itself into it before exec, so nothing it starts can be outside.
pub fn spawn_rank(
    argv: &[String],
    env: &[(String, String)],
    cgroup: Option<&Path>,
    numa: Option<&crate::perf::numa::Prepared>,
) -> io::Result<Spawned> {
    spawn(argv, env, cgroup, numa, false).map(|(sp, _)| sp)
}

/// Starts a process as a rank is started ([`spawn_rank`]), with a pipe to its stdin: a warm
/// process (`warm/`) that is told there which rank it becomes.
pub fn spawn_with_stdin(
    argv: &[String],
    env: &[(String, String)],
    cgroup: Option<&Path>,
) -> io::Result<(Spawned, OwnedFd)> {
    let (sp, stdin) = spawn(argv, env, cgroup, None, true)?;
    Ok((sp, stdin.expect("piped")))
}

fn spawn(
    argv: &[String],
    env: &[(String, String)],
    cgroup: Option<&Path>,
    numa: Option<&crate::perf::numa::Prepared>,
    stdin_pipe: bool,
) -> io::Result<(Spawned, Option<OwnedFd>)> {
    let parent = std::process::id() as i32;
    let procs =
        cgroup.and_then(|c| CString::new(c.join("cgroup.procs").as_os_str().as_bytes()).ok());
    let numa = numa.copied();
    let nofile = super::store_host::ranks_nofile();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(if stdin_pipe {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure only makes async-signal-safe system calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            // Best effort: the token still finds what a rank left if this move failed.
            if let Some(p) = &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd >= 0 {
                    libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                }
            }
            // Best effort, as the cgroup move: the CPUs were checked against the agent's own.
            if let Some(n) = &numa {
                let _ = n.apply();
            }
            // The open-file limit the agent started with, not the one it raised for the store.
            if let Some(l) = &nofile {
                libc::setrlimit(libc::RLIMIT_NOFILE, l);
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
    let stdin = child.stdin.take().map(OwnedFd::from);
    // The child is reaped by `reap_all`, never through this handle.
    Ok((
        Spawned {
            pid: child.id() as i32,
            stdout,
            stderr,
        },
        stdin,
    ))
}

/// Sends `sig` to a process group; a group that no longer exists is not an error. A stopped group
/// (SIGSTOP, `scontrol suspend`) is continued so it can act on the signal.
pub fn signal_group(pgid: i32, sig: i32) {
    let Ok(signal) = Signal::try_from(sig) else {
        return;
    };
    match killpg(Pid::from_raw(pgid), signal) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => crate::run::output::note(&format!(
            "cannot send {signal} to process group {pgid}: {e}"
        )),
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
    pid: i32,
}

impl Watchdog {
    pub fn start(c: &Containment) -> io::Result<Watchdog> {
        let child = Command::new("/proc/self/exe")
            .arg("__watchdog")
            .env(WATCHDOG_VAR, c.watchdog_env())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()?;
        Ok(Watchdog {
            pid: child.id() as i32,
            stdin: child.stdin,
        })
    }

    fn send(&mut self, line: String) {
        if let Some(s) = &mut self.stdin {
            if s.write_all(line.as_bytes()).is_err() {
                crate::run::output::note(
                    "the watchdog is gone; ranks are still killed by their parent-death signal",
                );
                self.stdin = None;
            }
        }
    }

    /// The watchdog's pid: a child of the agent that is not a rank's leftover.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn guard(&mut self, pgid: i32) {
        self.send(format!("+{pgid}\n"));
    }

    pub fn release(&mut self, pgid: i32) {
        self.send(format!("-{pgid}\n"));
    }

    /// The agent's socket directory: the watchdog removes its socket and the directory (if then
    /// empty) once the agent is gone, so that a SIGKILLed agent leaves nothing in $TMPDIR.
    pub fn remove_on_exit(&mut self, socket_dir: &Path) {
        match socket_dir.to_str() {
            Some(d) if !d.contains('\n') => self.send(format!("d{d}\n")),
            _ => {}
        }
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
    let mut socket_dir: Option<PathBuf> = None;
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (op, n) = line.split_at(line.len().min(1));
        if op == "d" {
            socket_dir = Some(PathBuf::from(n));
            continue;
        }
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
    // Whatever the ranks started and detached (setsid, double fork) is found by cgroup and token.
    if let Some(c) = Containment::from_watchdog_env() {
        c.sweep(None);
        c.remove();
    }
    if let Some(d) = socket_dir {
        // Only what the agent put there: its socket, then the directory if that left it empty.
        let _ = std::fs::remove_file(d.join(crate::run::ipc_server::SOCKET));
        let _ = std::fs::remove_dir(&d);
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_unified_cgroup_path() {
        let c = "12:pids:/x\n1:name=systemd:/\n0::/user.slice/job 1\n";
        assert_eq!(cgroup_v2_path(c), Some("/user.slice/job 1"));
        assert_eq!(cgroup_v2_path("4:memory:/a\n"), None);
    }

    #[test]
    fn finds_the_cgroup2_mount() {
        let m = "30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu\n\
                 35 25 0:31 / /sys/fs/cgroup/unified rw,relatime shared:14 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(m),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(cgroup2_mount("30 25 0:26 / /x rw - cgroup c rw\n"), None);
    }

    #[test]
    fn environ_matches_whole_entries_only() {
        let env = b"A=1\0VIGIL_AGENT_TOKEN=abc\0B=2\0";
        assert!(environ_has(env, b"VIGIL_AGENT_TOKEN=abc"));
        assert!(!environ_has(env, b"VIGIL_AGENT_TOKEN=ab"));
        assert!(!environ_has(
            b"XVIGIL_AGENT_TOKEN=abc\0",
            b"VIGIL_AGENT_TOKEN=abc"
        ));
    }

    #[test]
    fn reads_state_and_parent_after_the_command_name() {
        assert_eq!(stat_state_ppid("42 (a) b) (c) T 7 42 42 0"), Some(('T', 7)));
        assert_eq!(stat_state_ppid("1 (init) S 0 1 1"), Some(('S', 0)));
        assert_eq!(stat_state_ppid("garbage"), None);
    }

    #[test]
    fn tokens_are_distinct_hex() {
        let (a, b) = (new_token(), new_token());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}

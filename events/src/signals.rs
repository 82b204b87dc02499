//! Signal names as vigil writes them (`SIGTERM`), and which signals ask the job to stop at a
//! step rather than end it.

/// Linux's numbers for the signals a rank or an agent may see, with their names.
const NAMES: &[(i32, &str)] = &[
    (libc::SIGHUP, "SIGHUP"),
    (libc::SIGINT, "SIGINT"),
    (libc::SIGQUIT, "SIGQUIT"),
    (libc::SIGILL, "SIGILL"),
    (libc::SIGTRAP, "SIGTRAP"),
    (libc::SIGABRT, "SIGABRT"),
    (libc::SIGBUS, "SIGBUS"),
    (libc::SIGFPE, "SIGFPE"),
    (libc::SIGKILL, "SIGKILL"),
    (libc::SIGUSR1, "SIGUSR1"),
    (libc::SIGSEGV, "SIGSEGV"),
    (libc::SIGUSR2, "SIGUSR2"),
    (libc::SIGPIPE, "SIGPIPE"),
    (libc::SIGALRM, "SIGALRM"),
    (libc::SIGTERM, "SIGTERM"),
    #[cfg(target_os = "linux")]
    (libc::SIGSTKFLT, "SIGSTKFLT"),
    (libc::SIGCHLD, "SIGCHLD"),
    (libc::SIGCONT, "SIGCONT"),
    (libc::SIGSTOP, "SIGSTOP"),
    (libc::SIGTSTP, "SIGTSTP"),
    (libc::SIGTTIN, "SIGTTIN"),
    (libc::SIGTTOU, "SIGTTOU"),
    (libc::SIGURG, "SIGURG"),
    (libc::SIGXCPU, "SIGXCPU"),
    (libc::SIGXFSZ, "SIGXFSZ"),
    (libc::SIGVTALRM, "SIGVTALRM"),
    (libc::SIGPROF, "SIGPROF"),
    (libc::SIGWINCH, "SIGWINCH"),
    (libc::SIGIO, "SIGIO"),
    #[cfg(target_os = "linux")]
    (libc::SIGPWR, "SIGPWR"),
    (libc::SIGSYS, "SIGSYS"),
];

/// The signals that ask the job to stop at one step (checkpoint, then end to be requeued):
/// Slurm's SIGTERM before the time limit, and SIGUSR1/SIGUSR2 from `--signal` or `scancel`.
pub const STOP_SIGNALS: [i32; 3] = [libc::SIGTERM, libc::SIGUSR1, libc::SIGUSR2];

/// `SIGTERM` for 15; `signal 99` for a number that names no signal.
pub fn signal_name(sig: i32) -> String {
    match NAMES.iter().find(|(n, _)| *n == sig) {
        Some((_, name)) => (*name).to_string(),
        None => format!("signal {sig}"),
    }
}

/// A stop trigger: stop every rank at one step, as for the allocation's end.
pub fn is_stop_signal(sig: i32) -> bool {
    STOP_SIGNALS.contains(&sig)
}

/// Whether a stop trigger's name (`SIGTERM`, `time-limit`, ...) is one of the stop signals: a
/// preemption or `scancel --signal` rather than the time limit.
pub fn is_stop_signal_name(name: &str) -> bool {
    STOP_SIGNALS.iter().any(|s| signal_name(*s) == name)
}

#[cfg(test)]
mod tests {
    use super::{is_stop_signal, is_stop_signal_name, signal_name};

    #[test]
    fn names_and_stop_signals() {
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(5), "SIGTRAP");
        assert_eq!(signal_name(99), "signal 99");
        assert!(is_stop_signal(libc::SIGUSR1) && !is_stop_signal(libc::SIGINT));
        assert!(is_stop_signal_name("SIGUSR2") && !is_stop_signal_name("time-limit"));
    }
}

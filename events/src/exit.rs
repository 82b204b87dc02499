//! The `vigil` binary's exit statuses, each once (here, below the agent, because an outcome's
//! status is part of its record), with what it tells a job script (docs/usage.md
//! "Exit status" and docs/allocations.md "Exit statuses" are the user's copy of this list).
//!
//! The statuses follow the BSD `sysexits.h` names where one fits, so that a wrapper that already
//! knows `EX_TEMPFAIL` reads vigil's "run me again" without a table. A leaf: it imports nothing.

/// Every rank on every node exited 0 (or called `vigil.mark_finished()`); `vigil health`: the
/// node is healthy.
pub const SUCCESS: i32 = 0;

/// A rank failed and the job is not to run again (or, for `vigil health`, a check failed). A
/// rank's own 75 is reported as this, so that only the agent asks for a requeue.
pub const FAILURE: i32 = 1;

/// The request cannot be carried out as given: a bad flag, config file, recipe or target, a
/// missing script, an unwritable log directory, a command that cannot be executed, a node rank
/// taken twice, a store secret that does not match. One line on stderr names the fix; nothing
/// was started (or what was started is stopped).
pub const USAGE: i32 = 2;

/// `EX_SOFTWARE`: vigil itself could not work here (the event loop, a signal handler or the
/// SIGCHLD watch could not be set up). Not the job's fault and not the user's input.
pub const INTERNAL: i32 = 70;

/// `EX_TEMPFAIL`, "try again later": run the job again (stopped at an agreed step for a signal or
/// the allocation's end, failed or lost with requeues left). The only status that asks for a
/// requeue.
pub const REQUEUE: i32 = 75;

/// The shell's "command not found": the `ft_launcher` shim cannot find or run the `vigil` binary
/// beside it.
pub const NOT_FOUND: i32 = 127;

/// Stopped by signal `sig` (143 for SIGTERM, 130 for SIGINT), as a shell reports it.
pub const fn signaled(sig: i32) -> i32 {
    128 + sig
}

/// An `i32` status as the process's exit code: statuses outside 0..=255 are clamped, as the
/// kernel would truncate them otherwise (a 256 would read as success).
pub fn code(status: i32) -> std::process::ExitCode {
    std::process::ExitCode::from(status.clamp(0, 255) as u8)
}

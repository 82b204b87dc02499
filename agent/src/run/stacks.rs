//! Where a hung rank is: its Python stacks (through the shim's faulthandler, on SIGUSR2) and what
//! the kernel says of every thread (/proc wchan and stack).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The signal the shim's faulthandler listens on (docs/protocol.md).
pub const DUMP_SIGNAL: i32 = libc::SIGUSR2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackReport {
    /// File holding the Python stacks, when the rank dumped any.
    pub python: Option<PathBuf>,
    /// File holding the kernel's view of every thread.
    pub proc: Option<PathBuf>,
    /// Innermost frames, one line per thread: `thread: File "x.py", line 5 in f`.
    pub innermost: Vec<String>,
    /// Why there are no Python stacks, when there are none.
    pub missing: String,
}

/// What the runtime's stack work hands back to the event loop.
#[derive(Debug)]
pub enum StackNews {
    /// A hung rank's stacks: (attempt, local rank, report).
    Captured(u32, u32, StackReport),
    /// A hang probe's answer for `attempt`: the stopped ranks, and where the main threads of
    /// the ranks asked are (`true`: waiting in a collective).
    Probed {
        attempt: u32,
        stopped: Vec<u32>,
        waiting: Vec<(u32, bool)>,
    },
}

/// Why a rank left no Python stacks: it never connected (no shim), the stacks' directory could
/// not be written (the log disk), or it did not answer the signal in time.
pub fn why_missing(via_shim: bool, write_error: Option<&str>, wait: Duration) -> String {
    match (via_shim, write_error) {
        (false, _) => "the rank has not imported the vigil shim".into(),
        (true, Some(e)) => format!("the log directory cannot be written ({e})"),
        (true, None) => format!(
            "the rank did not write them within {:.1}s of the dump signal",
            wait.as_secs_f64()
        ),
    }
}

/// The main thread's id (as faulthandler prints it) that the shim of process `pid` wrote to the
/// stack file at import (`vigil: main thread of pid P is 0x...`; the latest such line counts).
pub fn main_thread_of(stack_file: &str, pid: i32) -> Option<u64> {
    let prefix = format!("vigil: main thread of pid {pid} is ");
    stack_file
        .lines()
        .rev()
        .filter_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .find_map(thread_id)
}

/// The thread id in `Thread 0x00007f01 ...`, `Current thread 0x00007f01 [name] ...` or `0x7f01`.
fn thread_id(text: &str) -> Option<u64> {
    let hex = text.split_whitespace().find_map(|w| w.strip_prefix("0x"))?;
    u64::from_str_radix(hex, 16).ok()
}

/// From faulthandler's dump, each thread's innermost frames (most recent call first), at most
/// `per_thread` frames for each of at most `threads` threads: the main thread first (`main`, the
/// id the shim recorded; named `(main)`), then the thread the signal landed on, then the others.
pub fn innermost_frames(
    dump: &str,
    main: Option<u64>,
    per_thread: usize,
    threads: usize,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut blocks: Vec<(String, Vec<String>)> = Vec::new();
    for line in dump.lines() {
        let t = line.trim();
        if t.ends_with("(most recent call first):") {
            let name = t
                .trim_end_matches("(most recent call first):")
                .trim()
                .to_string();
            blocks.push((name, Vec::new()));
        } else if t.starts_with("File ") {
            if let Some((_, frames)) = blocks.last_mut() {
                frames.push(t.to_string());
            }
        }
    }
    let is_main = |name: &str| main.is_some() && thread_id(name) == main;
    for (name, _) in blocks.iter_mut() {
        if is_main(name) {
            name.push_str(" (main)");
        }
    }
    blocks.sort_by_key(|(name, _)| {
        (
            !name.ends_with(" (main)"),
            !name.starts_with("Current thread"),
        )
    });
    for (name, frames) in blocks.into_iter().take(threads) {
        for f in from_user_code(frames).into_iter().take(per_thread) {
            out.push(format!("{name}: {f}"));
        }
    }
    out
}

/// A thread's frames (innermost first) from the innermost one of the user's code: the library
/// frames inside it (torch, site-packages, the standard library) are folded into a count on
/// that frame, with the innermost of them named: `File "/x/train.py", line 9 in step [+3
/// library frames, innermost: distributed_c10d.py:3421 in barrier]`. A thread with no frame of
/// the user's keeps its frames as they are.
fn from_user_code(frames: Vec<String>) -> Vec<String> {
    let Some(first) = frames.iter().position(|f| !is_library_frame(f)) else {
        return frames;
    };
    if first == 0 {
        return frames;
    }
    let inner = short_frame(&frames[0]);
    let mut rest: Vec<String> = frames.into_iter().skip(first).collect();
    rest[0].push_str(&format!(
        " [+{first} library frame{}, innermost: {inner}]",
        if first == 1 { "" } else { "s" }
    ));
    rest
}

/// The file of a faulthandler frame (`File "/x/train.py", line 5 in f`).
fn frame_file(frame: &str) -> Option<&str> {
    let rest = frame.trim().strip_prefix("File \"")?;
    rest.split_once('"').map(|(file, _)| file)
}

/// `distributed_c10d.py:3421 in barrier`.
fn short_frame(frame: &str) -> String {
    let file = frame_file(frame).unwrap_or("?");
    let base = file.rsplit('/').next().unwrap_or(file);
    match frame.split_once("\", line ") {
        Some((_, tail)) => match tail.split_once(' ') {
            Some((line, func)) => format!("{base}:{line} {}", func.trim()),
            None => format!("{base}:{tail}"),
        },
        None => base.to_string(),
    }
}

/// Code the user did not write: installed packages (torch among them), the standard library,
/// frozen modules. A frame whose file cannot be read out of the line counts as the user's.
fn is_library_frame(frame: &str) -> bool {
    let Some(file) = frame_file(frame) else {
        return false;
    };
    // `<frozen importlib._bootstrap>` is Python's; `<string>` (`python -c`) is the user's.
    if file.starts_with("<frozen") {
        return true;
    }
    let stdlib = file
        .match_indices("/lib/python")
        .any(|(i, m)| file[i + m.len()..].starts_with(|c: char| c.is_ascii_digit()));
    stdlib
        || ["/site-packages/", "/dist-packages/", "/torch/"]
            .iter()
            .any(|p| file.contains(p))
}

fn proc_snapshot(pid: i32) -> String {
    let mut s = String::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let _ = writeln!(s, "process {pid}: {} thread(s)", tasks.len());
    for tid in tasks {
        let read = |f: &str| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/{f}"))
                .map(|t| t.trim().to_string())
                .unwrap_or_else(|e| format!("<{e}>"))
        };
        let state = read("stat")
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next().map(str::to_string))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "\nthread {tid} ({}) state {state} wchan {}",
            read("comm"),
            read("wchan")
        );
        let _ = writeln!(s, "{}", read("stack"));
    }
    s
}

/// The most of a rank's stack dump read (its thousands of threads fit many times over).
const STACKS_LIMIT: u64 = 16 << 20;
/// How far into the stack file the shim's main-thread line is looked for.
const MAIN_LINE_LIMIT: u64 = 1 << 20;

/// What was added to `p` after `from`, at most `cap` bytes; `None` when nothing was, or when `p`
/// is no regular file (the rank's directory is the rank's: it may have put a FIFO there).
fn read_from(p: &Path, from: u64, cap: u64) -> Option<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = vigil_bounded::open_regular(p).ok()?;
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut b = Vec::new();
    f.take(cap).read_to_end(&mut b).ok()?;
    (!b.is_empty()).then_some(b)
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// Waits until `py_path` grew past `before` and stopped growing, or until `deadline`.
async fn await_dump(py_path: &Path, before: u64, deadline: Instant) {
    let mut last = before;
    let mut stable = 0;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let len = file_len(py_path);
        if len > before && len == last {
            stable += 1;
            if stable >= 2 {
                return;
            }
        } else {
            stable = 0;
        }
        last = len;
    }
}

/// The frames of thread `main` (innermost first) in faulthandler's `dump`; `None` when the dump
/// has no such thread.
pub fn thread_frames(dump: &str, main: u64) -> Option<Vec<String>> {
    let mut frames: Option<Vec<String>> = None;
    for line in dump.lines() {
        let t = line.trim();
        if t.ends_with("(most recent call first):") {
            if frames.is_some() {
                break;
            }
            if thread_id(t) == Some(main) {
                frames = Some(Vec::new());
            }
        } else if t.starts_with("File ") {
            if let Some(f) = frames.as_mut() {
                f.push(t.to_string());
            }
        }
    }
    frames
}

/// Whether a thread with these frames waits inside torch's collective machinery: a frame in
/// `torch/distributed/` (a collective, a barrier, a store), in `torch/autograd/` (a backward,
/// where DDP's all-reduce runs) or in DDP's own module. A rank stuck in its own code, or in
/// compute outside these, is not.
pub fn in_collective(frames: &[String]) -> bool {
    const WAITING: [&str; 3] = [
        "/torch/distributed/",
        "/torch/autograd/",
        "/torch/nn/parallel/distributed.py",
    ];
    frames
        .iter()
        .filter_map(|f| frame_file(f))
        .any(|file| WAITING.iter().any(|w| file.contains(w)))
}

/// Where the main thread of each of `ranks` (local rank, pid, its stack file) is, asked all at
/// once through the shim's dump signal and waited for until `wait` is over: `true` when it
/// waits in a collective ([`in_collective`]). A rank whose dump did not come, or whose main
/// thread cannot be found in it, is left out (unknown). Stopped ranks must not be asked: the
/// signal waits until they continue.
pub async fn where_main_threads(
    ranks: Vec<(u32, i32, PathBuf)>,
    wait: Duration,
) -> Vec<(u32, bool)> {
    let asked: Vec<(u32, i32, PathBuf, u64)> = ranks
        .into_iter()
        .map(|(lr, pid, path)| {
            let before = file_len(&path);
            // SAFETY: a plain kill(2) call.
            unsafe { libc::kill(pid, DUMP_SIGNAL) };
            (lr, pid, path, before)
        })
        .collect();
    let deadline = Instant::now() + wait;
    let mut out = Vec::new();
    for (lr, pid, path, before) in asked {
        await_dump(&path, before, deadline).await;
        let main = read_from(&path, 0, MAIN_LINE_LIMIT)
            .and_then(|b| main_thread_of(&String::from_utf8_lossy(&b), pid));
        let dump = read_from(&path, before, STACKS_LIMIT);
        let frames = main
            .zip(dump)
            .and_then(|(main, d)| thread_frames(&String::from_utf8_lossy(&d), main));
        if let Some(f) = frames {
            out.push((lr, in_collective(&f)));
        }
    }
    out
}

/// Records the kernel's view, asks the shim for Python stacks and waits (up to `wait`) until the
/// dump stops growing. A stopped rank is continued so its signal handler can run.
pub async fn capture(pid: i32, dir: &Path, via_shim: bool, wait: Duration) -> StackReport {
    let proc_path = dir.join("proc_stacks.txt");
    let (proc, write_error) = match std::fs::write(&proc_path, proc_snapshot(pid)) {
        Ok(()) => (Some(proc_path), None),
        Err(e) => (None, Some(format!("{}: {e}", proc_path.display()))),
    };
    let py_path = dir.join("stacks.txt");
    let before = file_len(&py_path);
    if via_shim {
        // SAFETY: plain kill(2) calls.
        unsafe {
            libc::kill(pid, DUMP_SIGNAL);
            libc::kill(pid, libc::SIGCONT);
        }
        await_dump(&py_path, before, Instant::now() + wait).await;
    }
    // The shim names the main thread near the start of the file, at import.
    let main = read_from(&py_path, 0, MAIN_LINE_LIMIT)
        .and_then(|b| main_thread_of(&String::from_utf8_lossy(&b), pid));
    let dump =
        read_from(&py_path, before, STACKS_LIMIT).map(|b| String::from_utf8_lossy(&b).into_owned());
    StackReport {
        innermost: dump
            .as_deref()
            .map(|d| innermost_frames(d, main, 3, 4))
            .unwrap_or_default(),
        // A full disk may still take part of a dump (the rest of a page the shim's first line
        // started): say that it cannot be written either way.
        missing: if dump.is_some() && write_error.is_none() {
            String::new()
        } else {
            why_missing(via_shim, write_error.as_deref(), wait)
        },
        python: dump.map(|_| py_path),
        proc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_main_thread_in_torch_s_collectives_waits_one_in_user_code_does_not() {
        let dump = "Thread 0x00000000000002 (most recent call first):\n  File \"/usr/lib/python3.11/site-packages/torch/autograd/graph.py\", line 744 in _engine_run_backward\n  File \"/usr/lib/python3.11/site-packages/torch/autograd/__init__.py\", line 289 in backward\n  File \"/usr/lib/python3.11/site-packages/torch/_tensor.py\", line 521 in backward\n  File \"/x/train.py\", line 30 in <module>\n\nCurrent thread 0x00000000000001 (most recent call first):\n  File \"/x/train.py\", line 28 in <module>\n";
        let waiting = thread_frames(dump, 2).unwrap();
        assert_eq!(waiting.len(), 4);
        assert!(in_collective(&waiting));
        let sleeping = thread_frames(dump, 1).unwrap();
        assert_eq!(sleeping, vec!["File \"/x/train.py\", line 28 in <module>"]);
        assert!(!in_collective(&sleeping));
        assert_eq!(thread_frames(dump, 3), None);
        let c10d = vec![
            "File \"/p/torch/distributed/distributed_c10d.py\", line 9 in all_reduce".to_string(),
        ];
        assert!(in_collective(&c10d));
        let ddp =
            vec!["File \"/p/torch/nn/parallel/distributed.py\", line 9 in forward".to_string()];
        assert!(in_collective(&ddp));
        let compute = vec!["File \"/p/torch/nn/functional.py\", line 9 in linear".to_string()];
        assert!(!in_collective(&compute));
    }

    #[test]
    fn parses_faulthandler_dump_current_thread_first() {
        let dump = "Thread 0x00007f01 (most recent call first):\n  File \"/x/loader.py\", line 10 in get\n  File \"/usr/lib/python3.11/threading.py\", line 975 in run\n\nCurrent thread 0x00007f00 (most recent call first):\n  File \"/x/train.py\", line 5 in spin\n  File \"/x/train.py\", line 9 in step\n  File \"/x/train.py\", line 12 in main\n  File \"/x/train.py\", line 14 in <module>\n";
        let f = innermost_frames(dump, None, 2, 4);
        assert_eq!(
            f,
            vec![
                "Current thread 0x00007f00: File \"/x/train.py\", line 5 in spin",
                "Current thread 0x00007f00: File \"/x/train.py\", line 9 in step",
                "Thread 0x00007f01: File \"/x/loader.py\", line 10 in get",
                "Thread 0x00007f01: File \"/usr/lib/python3.11/threading.py\", line 975 in run",
            ]
        );
        assert!(innermost_frames("garbage\n", None, 3, 3).is_empty());
    }

    #[test]
    fn the_main_thread_comes_first_whichever_thread_took_the_signal() {
        // Four loader threads (the newest first, as faulthandler lists them), the signal on one of
        // them, the main thread last: without the shim's line it would be cut off.
        let mut dump = String::from(
            "vigil: main thread of pid 7 is 0x00007f0000000099\n\
             vigil: main thread of pid 42 is 0x00007f0000000001\n",
        );
        let before = dump.len();
        for t in 2..6 {
            let head = if t == 4 { "Current thread" } else { "Thread" };
            dump.push_str(&format!(
                "{head} 0x00007f000000000{t} (most recent call first):\n  File \"/x/loader.py\", line {t} in get\n\n"
            ));
        }
        dump.push_str("Thread 0x00007f0000000001 [python3] (most recent call first):\n  File \"/x/train.py\", line 5 in train_loop\n");
        let main = main_thread_of(&dump, 42);
        assert_eq!(main, Some(0x7f0000000001));
        assert_eq!(main_thread_of(&dump, 7), Some(0x7f0000000099));
        assert_eq!(main_thread_of(&dump, 8), None);
        let f = innermost_frames(&dump[before..], main, 1, 3);
        assert_eq!(
            f,
            vec![
                "Thread 0x00007f0000000001 [python3] (main): File \"/x/train.py\", line 5 in train_loop",
                "Current thread 0x00007f0000000004: File \"/x/loader.py\", line 4 in get",
                "Thread 0x00007f0000000002: File \"/x/loader.py\", line 2 in get",
            ]
        );
        // Without the line (a rank with an older shim): the signalled thread first, as before.
        assert!(innermost_frames(&dump[before..], None, 1, 3)[0].starts_with("Current thread"));
    }

    #[test]
    fn the_users_innermost_frames_lead_and_library_frames_inside_them_are_counted() {
        // Field finding 46: a rank hung in a collective showed three frames of torch.
        let dump = "Current thread 0x00007f00 (most recent call first):\n  \
File \"/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py\", line 3421 in barrier\n  \
File \"/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py\", line 79 in wrapper\n  \
File \"/usr/lib/python3.11/contextlib.py\", line 81 in inner\n  \
File \"/home/u/train.py\", line 9 in step\n  \
File \"/home/u/train.py\", line 20 in main\n  \
File \"/home/u/train.py\", line 30 in <module>\n\n\
Thread 0x00007f01 (most recent call first):\n  \
File \"/usr/lib/python3.11/threading.py\", line 324 in wait\n  \
File \"/usr/lib/python3.11/threading.py\", line 600 in run\n";
        let f = innermost_frames(dump, Some(0x7f00), 2, 4);
        assert_eq!(
            f,
            vec![
                "Current thread 0x00007f00 (main): File \"/home/u/train.py\", line 9 in step [+3 library frames, innermost: distributed_c10d.py:3421 in barrier]",
                "Current thread 0x00007f00 (main): File \"/home/u/train.py\", line 20 in main",
                // No frame of the user's: as it is.
                "Thread 0x00007f01: File \"/usr/lib/python3.11/threading.py\", line 324 in wait",
                "Thread 0x00007f01: File \"/usr/lib/python3.11/threading.py\", line 600 in run",
            ]
        );
        assert!(is_library_frame(
            "File \"<frozen importlib._bootstrap>\", line 1 in f"
        ));
        assert!(is_library_frame(
            "File \"/src/pytorch/torch/nn/modules/module.py\", line 1 in f"
        ));
        assert!(!is_library_frame(
            "File \"/home/u/python3/lib/pythonic.py\", line 1 in f"
        ));
        assert!(!is_library_frame("File \"/home/u/train.py\", line 1 in f"));
        assert!(!is_library_frame("File \"<string>\", line 5 in f"));
    }

    #[test]
    fn missing_stacks_name_the_disk_not_the_shim() {
        let w = Duration::from_secs(2);
        assert!(why_missing(false, None, w).contains("not imported the vigil shim"));
        let disk = why_missing(true, Some("/l/proc_stacks.txt: No space left on device"), w);
        assert!(
            disk.contains("No space left") && !disk.contains("shim"),
            "{disk}"
        );
        assert!(why_missing(true, None, w).contains("2.0s"));
    }
}

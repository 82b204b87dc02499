//! Rank output: whole lines, prefixed for the console the way torchrun prefixes them
//! (`[default0]:`), kept byte for byte in per-rank log files, with a short tail kept for the
//! failure summary.
//!
//! The console is written by one thread per stream, fed by a queue bounded in bytes: a console
//! nobody reads (a stuck srun, `| less`) fills the queue and costs rank lines on the console
//! (counted and reported once it moves again), never the event loop's time or the log files.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Longest line shown whole on the console; a longer one is cut into pieces of this size so one
/// rank printing without newlines cannot grow the agent's memory. Log files are never cut.
pub const MAX_LINE: usize = 64 * 1024;
/// Lines of stderr kept per rank for the failure summary.
pub const TAIL_LINES: usize = 20;
/// Console bytes waiting per stream before rank lines are dropped; the agent's own notes may use
/// as much again, so a hang report still gets through behind a flood.
pub const CONSOLE_QUEUE_BYTES: usize = 4 << 20;

/// Splits a byte stream into complete lines (without the newline).
#[derive(Debug, Default)]
pub struct LineSplitter {
    partial: Vec<u8>,
}

impl LineSplitter {
    /// Feeds bytes and calls `line` for every line they complete.
    pub fn push(&mut self, mut bytes: &[u8], line: &mut dyn FnMut(&[u8])) {
        while let Some(nl) = bytes.iter().position(|&b| b == b'\n') {
            let (head, rest) = bytes.split_at(nl);
            if self.partial.is_empty() {
                line(head);
            } else {
                self.partial.extend_from_slice(head);
                line(&self.partial);
                self.partial.clear();
            }
            bytes = &rest[1..];
        }
        self.partial.extend_from_slice(bytes);
        while self.partial.len() >= MAX_LINE {
            let rest = self.partial.split_off(MAX_LINE);
            line(&self.partial);
            self.partial = rest;
        }
    }

    /// End of stream: a last line without a newline is still a line.
    pub fn finish(&mut self, line: &mut dyn FnMut(&[u8])) {
        if !self.partial.is_empty() {
            line(&self.partial);
            self.partial.clear();
        }
    }
}

pub type Tail = Rc<RefCell<VecDeque<String>>>;

/// A rank's log file and where it is, for the notices when it cannot be written.
pub struct LogFile {
    pub path: PathBuf,
    file: File,
    /// Bytes of output that could not be written since the last write that could.
    lost: u64,
}

impl LogFile {
    /// A log file just created (empty).
    pub fn new(path: PathBuf, file: File) -> LogFile {
        LogFile {
            path,
            file,
            lost: 0,
        }
    }
}

/// Where one stream of one rank goes.
pub struct Sink {
    /// `[default0]:`
    pub prefix: String,
    /// Console stream to copy lines to (the agent's stdout or stderr), if shown.
    pub console: Option<ConsoleStream>,
    pub file: Option<LogFile>,
    pub tail: Option<Tail>,
    /// torchrun's `--duplicate-std*-filters`: matching lines, prefixed, also go to this file.
    pub dup: Option<Dup>,
}

/// A filtered log shared by every rank of an attempt (`filtered_stdout.log`).
#[derive(Clone)]
pub struct Dup {
    pub filters: Rc<Vec<String>>,
    pub file: Rc<RefCell<Option<File>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsoleStream {
    Stdout,
    Stderr,
}

/// Set once any rank log could not be written, so the agent says so once, not per line or rank.
static LOG_WRITE_FAILED: AtomicBool = AtomicBool::new(false);
/// Set once a rank log was written again after a failure; said once too (a file whose last page
/// has room takes small writes and refuses large ones, over and over).
static LOG_WRITE_RESUMED: AtomicBool = AtomicBool::new(false);

impl Sink {
    /// Writes `bytes` to the log file as they are, and the complete lines in them to the console
    /// (each console write holds whole lines only) and the tail.
    pub fn write(&mut self, splitter: &mut LineSplitter, bytes: &[u8], eof: bool) {
        if let Some(f) = self.file.as_mut().filter(|_| !bytes.is_empty()) {
            // What part of a failed write fitted stays (the file is bytes as the rank wrote them,
            // not records); the next write tries again.
            match f.file.write_all(bytes) {
                Ok(()) if f.lost > 0 => {
                    if !LOG_WRITE_RESUMED.swap(true, Ordering::Relaxed) {
                        note(&format!(
                            "the rank log {} is written again; up to {} bytes of output are \
                             missing from it (the console showed them)",
                            f.path.display(),
                            f.lost
                        ));
                    }
                    f.lost = 0;
                }
                Ok(()) => {}
                // A full, read-only or vanished log disk must not stop supervision; the console
                // still shows the rank's lines, and the next write tries again.
                Err(e) => {
                    if !LOG_WRITE_FAILED.swap(true, Ordering::Relaxed) {
                        note(&format!(
                            "cannot write the rank log {}: {e}; ranks go on, their output may be \
                             missing from log files until there is room (free space or fix \
                             --log-dir; the console still shows it)",
                            f.path.display()
                        ));
                    }
                    f.lost += bytes.len() as u64;
                }
            }
        }
        let mut console = Vec::new();
        let mut dup = Vec::new();
        let mut lines = 0u64;
        let mut on_line = |l: &[u8]| {
            if let Some(d) = &self.dup {
                if line_matches(&d.filters, l) {
                    dup.extend_from_slice(self.prefix.as_bytes());
                    dup.extend_from_slice(l);
                    dup.push(b'\n');
                }
            }
            if self.console.is_some() {
                console.extend_from_slice(self.prefix.as_bytes());
                console.extend_from_slice(l);
                console.push(b'\n');
                lines += 1;
            }
            if let Some(t) = &self.tail {
                let mut t = t.borrow_mut();
                if t.len() == TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(String::from_utf8_lossy(l).into_owned());
            }
        };
        splitter.push(bytes, &mut on_line);
        if eof {
            splitter.finish(&mut on_line);
        }
        if let Some(d) = &self.dup {
            let mut f = d.file.borrow_mut();
            if let Some(f) = f.as_mut().filter(|_| !dup.is_empty()) {
                write_whole_lines(f, &dup);
            }
        }
        if let Some(stream) = self.console.filter(|_| !console.is_empty()) {
            console_queue(stream).push(console, lines, false);
        }
    }
}

/// Appends `lines` whole or not at all: a write that fails (the disk full) costs these lines, what
/// part of them was written is cut off again, and the next lines try again.
fn write_whole_lines(f: &mut File, lines: &[u8]) {
    use std::io::{Seek, SeekFrom};
    let Ok(at) = f.stream_position() else {
        return;
    };
    if f.write_all(lines).is_err() {
        let _ = f.set_len(at).and_then(|_| f.seek(SeekFrom::Start(at)));
    }
}

/// An agent notice on stderr: `[vigil] msg`. Never blocks.
pub fn note(msg: &str) {
    console_text(ConsoleStream::Stderr, &note_line(msg));
}

/// The console line of an agent notice, newline-terminated.
pub fn note_line(msg: &str) -> String {
    format!("[vigil] {msg}\n")
}

/// Agent text (already formatted, newline-terminated) for the console. Never blocks.
pub fn console_text(stream: ConsoleStream, text: &str) {
    let lines = text.bytes().filter(|&b| b == b'\n').count().max(1) as u64;
    console_queue(stream).push(text.as_bytes().to_vec(), lines, true);
}

/// Waits (up to `bound`) until everything queued for the console is written, the missed-lines
/// notice included; a console that stays stalled costs only the bound.
pub fn flush_console(bound: Duration) {
    let deadline = Instant::now() + bound;
    for s in [ConsoleStream::Stdout, ConsoleStream::Stderr] {
        console_queue(s).wait_idle(deadline);
    }
}

#[derive(Default)]
struct QueueState {
    chunks: VecDeque<Vec<u8>>,
    bytes: usize,
    /// Rank lines not queued because the queue was full, not yet reported.
    dropped: u64,
    /// The writer holds a chunk it is writing.
    busy: bool,
    /// The console is gone (EPIPE and such): nothing more is queued.
    closed: bool,
}

/// One console stream's queue and the thread that writes it.
struct ConsoleQueue {
    stream: ConsoleStream,
    state: Mutex<QueueState>,
    /// Signalled when a chunk is queued.
    more: Condvar,
    /// Signalled when the writer has nothing left.
    idle: Condvar,
}

fn console_queue(stream: ConsoleStream) -> &'static Arc<ConsoleQueue> {
    static QUEUES: OnceLock<[Arc<ConsoleQueue>; 2]> = OnceLock::new();
    let qs = QUEUES.get_or_init(|| {
        [
            ConsoleQueue::start(ConsoleStream::Stdout),
            ConsoleQueue::start(ConsoleStream::Stderr),
        ]
    });
    match stream {
        ConsoleStream::Stdout => &qs[0],
        ConsoleStream::Stderr => &qs[1],
    }
}

/// Whether a chunk of `len` bytes fits in a queue holding `queued`; the agent's notes get twice
/// the room of rank output.
pub fn fits(queued: usize, len: usize, agent_note: bool) -> bool {
    let room = if agent_note {
        2 * CONSOLE_QUEUE_BYTES
    } else {
        CONSOLE_QUEUE_BYTES
    };
    queued + len <= room
}

fn dropped_notice(n: u64) -> String {
    format!(
        "[vigil] {n} line(s) of output were not shown: the console was not being read; the rank log files have every line\n"
    )
}

impl ConsoleQueue {
    fn start(stream: ConsoleStream) -> Arc<ConsoleQueue> {
        let q = Arc::new(ConsoleQueue {
            stream,
            state: Mutex::new(QueueState::default()),
            more: Condvar::new(),
            idle: Condvar::new(),
        });
        let w = q.clone();
        let name = match stream {
            ConsoleStream::Stdout => "vigil-stdout",
            ConsoleStream::Stderr => "vigil-stderr",
        };
        if std::thread::Builder::new()
            .name(name.into())
            .spawn(move || w.writer())
            .is_err()
        {
            // Without a writer nothing could ever leave the queue: show nothing rather than block.
            q.lock().closed = true;
        }
        q
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // A poisoned lock only means a writer panicked mid-chunk; the state is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, chunk: Vec<u8>, lines: u64, agent_note: bool) {
        let mut st = self.lock();
        if st.closed {
            return;
        }
        if !fits(st.bytes, chunk.len(), agent_note) {
            st.dropped += lines;
            return;
        }
        st.bytes += chunk.len();
        st.chunks.push_back(chunk);
        self.more.notify_one();
    }

    fn write_out(&self, bytes: &[u8]) -> std::io::Result<()> {
        match self.stream {
            ConsoleStream::Stdout => {
                let mut o = std::io::stdout().lock();
                o.write_all(bytes)?;
                o.flush()
            }
            ConsoleStream::Stderr => std::io::stderr().lock().write_all(bytes),
        }
    }

    fn writer(&self) {
        loop {
            let chunk = {
                let mut st = self.lock();
                loop {
                    if let Some(c) = st.chunks.pop_front() {
                        st.bytes -= c.len();
                        st.busy = true;
                        break c;
                    }
                    if st.dropped > 0 {
                        // Caught up after dropping: say how many, once, where they were missed.
                        let n = std::mem::take(&mut st.dropped);
                        st.busy = true;
                        break dropped_notice(n).into_bytes();
                    }
                    st.busy = false;
                    self.idle.notify_all();
                    st = self.more.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            };
            if self.write_out(&chunk).is_err() {
                // The reader is gone: stop queueing for it; the log files have everything.
                let mut st = self.lock();
                st.closed = true;
                st.chunks.clear();
                st.bytes = 0;
                st.dropped = 0;
                st.busy = false;
                self.idle.notify_all();
                return;
            }
        }
    }

    fn wait_idle(&self, deadline: Instant) {
        let mut st = self.lock();
        while !st.closed && (st.busy || !st.chunks.is_empty() || st.dropped > 0) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            st = self
                .idle
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

/// torchrun's filter test: the line contains any of the filters.
pub fn line_matches(filters: &[String], line: &[u8]) -> bool {
    filters.iter().any(|f| {
        let f = f.as_bytes();
        line.windows(f.len()).any(|w| w == f)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut s = LineSplitter::default();
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut |l| out.push(l.to_vec()));
        }
        s.finish(&mut |l| out.push(l.to_vec()));
        out
    }

    #[test]
    fn whole_lines_across_chunks() {
        assert_eq!(
            split(&[b"ab", b"c\nde", b"f\n\ng"]),
            vec![
                b"abc".to_vec(),
                b"def".to_vec(),
                b"".to_vec(),
                b"g".to_vec()
            ]
        );
    }

    #[test]
    fn long_lines_are_cut() {
        let big = vec![b'x'; MAX_LINE * 2 + 5];
        let lines = split(&[&big]);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].len(), MAX_LINE);
        assert_eq!(lines[2].len(), 5);
    }

    #[test]
    fn agent_notes_get_room_behind_a_full_queue() {
        assert!(fits(0, CONSOLE_QUEUE_BYTES, false));
        assert!(!fits(CONSOLE_QUEUE_BYTES, 1, false));
        assert!(fits(CONSOLE_QUEUE_BYTES, 100, true));
        assert!(!fits(2 * CONSOLE_QUEUE_BYTES, 1, true));
    }

    #[test]
    fn log_file_is_byte_exact() {
        let dir = std::env::temp_dir().join(format!("vigil-sink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stdout.log");
        let mut sink = Sink {
            prefix: "[default0]:".into(),
            console: None,
            file: Some(LogFile::new(path.clone(), File::create(&path).unwrap())),
            tail: Some(Tail::default()),
            dup: None,
        };
        let mut want = Vec::new();
        let mut splitter = LineSplitter::default();
        let long = vec![b'z'; MAX_LINE * 3 + 7];
        for chunk in [&b"a\n\xff\xfe"[..], &long, b"\r\n\x00end"] {
            sink.write(&mut splitter, chunk, false);
            want.extend_from_slice(chunk);
        }
        sink.write(&mut splitter, &[], true);
        assert_eq!(std::fs::read(&path).unwrap(), want);
        let tail = sink.tail.as_ref().unwrap().borrow();
        assert_eq!(tail.back().map(String::as_str), Some("\0end"));
        drop(tail);
        let _ = std::fs::remove_dir_all(&dir);
    }

    proptest::proptest! {
        #[test]
        fn chunking_never_changes_lines(data in proptest::collection::vec(proptest::sample::select(vec![b'a', b'b', b'\n']), 0..300), cuts in proptest::collection::vec(0usize..300, 0..10)) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.sort();
            let mut chunks: Vec<&[u8]> = Vec::new();
            let mut prev = 0;
            for c in cuts { chunks.push(&data[prev..c]); prev = c; }
            chunks.push(&data[prev..]);
            let want = split(&[&data]);
            proptest::prop_assert_eq!(split(&chunks), want);
        }
    }

    #[test]
    fn duplicate_filters_match_like_torchrun() {
        let f = crate::cli::config::parse_filters("loss=,WARN");
        assert!(line_matches(&f, b"step 3 loss=0.1"));
        assert!(line_matches(&f, b"[WARN] x"));
        assert!(!line_matches(&f, b"warn lower case"));
        assert!(!line_matches(&[], b"anything"));
    }
}

//! Rank output: whole lines only, prefixed for the console the way torchrun prefixes them
//! (`[default0]:`), kept raw in per-rank log files, with a short tail kept for the failure summary.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::rc::Rc;

/// Longest line kept whole; a longer one is cut into pieces of this size so one rank printing
/// without newlines cannot grow the agent's memory.
pub const MAX_LINE: usize = 64 * 1024;
/// Lines of stderr kept per rank for the failure summary.
pub const TAIL_LINES: usize = 20;

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

/// Where one stream of one rank goes.
pub struct Sink {
    /// `[default0]:`
    pub prefix: String,
    /// Console stream to copy lines to (the agent's stdout or stderr), if shown.
    pub console: Option<ConsoleStream>,
    pub file: Option<File>,
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

impl Sink {
    /// Writes the complete lines in `bytes`: each console write holds whole lines only.
    pub fn write(&mut self, splitter: &mut LineSplitter, bytes: &[u8], eof: bool) {
        let mut console = Vec::new();
        let mut file = Vec::new();
        let mut dup = Vec::new();
        let mut on_line = |l: &[u8]| {
            if let Some(d) = &self.dup {
                if crate::config::line_matches(&d.filters, l) {
                    dup.extend_from_slice(self.prefix.as_bytes());
                    dup.extend_from_slice(l);
                    dup.push(b'\n');
                }
            }
            if self.console.is_some() {
                console.extend_from_slice(self.prefix.as_bytes());
                console.extend_from_slice(l);
                console.push(b'\n');
            }
            file.extend_from_slice(l);
            file.push(b'\n');
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
        if let Some(f) = &mut self.file {
            if !file.is_empty() && f.write_all(&file).is_err() {
                // A full or vanished log disk must not stop supervision; the console still works.
                self.file = None;
            }
        }
        if let Some(d) = &self.dup {
            let mut f = d.file.borrow_mut();
            if !dup.is_empty() && f.as_mut().is_some_and(|f| f.write_all(&dup).is_err()) {
                *f = None;
            }
        }
        if !console.is_empty() {
            let _ = match self.console {
                Some(ConsoleStream::Stdout) => std::io::stdout().lock().write_all(&console),
                Some(ConsoleStream::Stderr) => std::io::stderr().lock().write_all(&console),
                None => Ok(()),
            };
        }
    }
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
}

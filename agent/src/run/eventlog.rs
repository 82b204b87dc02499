//! The node's event log, `events.jsonl`: one JSON record per line.
//!
//! A write that fails (the log directory full, an I/O error) costs neither the log nor, up to a
//! bound, the record: the file is cut back to the end of the last whole line, so a reader never
//! sees a cut line; the record is held back in memory (with the time it was made) and the console
//! says so once per burst of failures; each next record tries again, and the first write that works
//! writes what was held first, in order. Records past the bound are lost: an `events_lost` record,
//! after the held ones, counts them and says when.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use super::report::console_note;
use crate::supervise::Record;

/// Where the event log's lines go: a file that can be cut back to a length.
pub(super) trait LogFile: Write + Send {
    /// Cuts the file back to `len` bytes (what was there before a failed write).
    fn truncate(&mut self, len: u64) -> std::io::Result<()>;
}

impl LogFile for File {
    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        // The file is opened to append: the next write goes to this new end.
        self.set_len(len)
    }
}

/// The most bytes of records held back while the log cannot be written (a few thousand records:
/// far more than a job writes in the minutes a full disk takes to be noticed and freed).
const HELD_MAX_BYTES: usize = 4 << 20;

/// Records that could not be written nor held back, since the last one written.
#[derive(Debug, Clone, PartialEq)]
struct Lost {
    records: u64,
    first_ts: f64,
    last_ts: f64,
    /// The last write error.
    error: String,
}

pub(super) struct EventLog {
    file: Box<dyn LogFile>,
    /// The file's length up to the end of its last whole line.
    len: u64,
    /// A failed write's bytes could not be cut off yet: cut them before the next write.
    cut_pending: bool,
    /// Whole lines not written yet, oldest first, and their bytes.
    held: VecDeque<String>,
    held_bytes: usize,
    held_max: usize,
    lost: Option<Lost>,
    host: String,
    node_rank: u32,
}

/// Seconds since the epoch.
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Adds what every record has: when, and which node.
pub(super) fn stamp(v: &mut serde_json::Value, host: &str, node_rank: u32) {
    if let Some(o) = v.as_object_mut() {
        o.insert("ts".into(), now().into());
        o.insert("host".into(), host.into());
        o.insert("node_rank".into(), node_rank.into());
    }
}

impl EventLog {
    /// The log in `file`, `len` bytes long now (new lines go after them).
    pub(super) fn new(file: Box<dyn LogFile>, len: u64, host: &str, node_rank: u32) -> EventLog {
        EventLog {
            file,
            len,
            cut_pending: false,
            held: VecDeque::new(),
            held_bytes: 0,
            held_max: HELD_MAX_BYTES,
            lost: None,
            host: host.to_string(),
            node_rank,
        }
    }

    /// An event log opened to append to `file`.
    pub(super) fn open(file: File, host: &str, node_rank: u32) -> EventLog {
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        EventLog::new(Box::new(file), len, host, node_rank)
    }

    pub(super) fn write(&mut self, rec: &Record) {
        self.write_value(serde_json::to_value(rec).unwrap_or_default());
    }

    pub(super) fn write_value(&mut self, mut v: serde_json::Value) {
        stamp(&mut v, &self.host, self.node_rank);
        self.write_line(v.to_string());
    }

    /// A record that stands for an earlier time `ts` (seconds since the epoch; now when `None`).
    pub(super) fn write_value_at(&mut self, mut v: serde_json::Value, ts: Option<f64>) {
        stamp(&mut v, &self.host, self.node_rank);
        if let (Some(o), Some(ts)) = (v.as_object_mut(), ts) {
            o.insert("ts".into(), ts.into());
        }
        self.write_line(v.to_string());
    }

    /// A record already stamped ([`stamp`]) and serialised, off the event loop when it is large.
    pub(super) fn write_line(&mut self, mut line: String) {
        line.push('\n');
        let ts = now();
        if let Err(e) = self.catch_up().and_then(|_| self.append(line.as_bytes())) {
            self.hold(line, ts, &e);
        }
    }

    /// Writes what was held back, then the count of what was lost; `Err` when the log still
    /// cannot be written (what is left stays held).
    fn catch_up(&mut self) -> std::io::Result<()> {
        if self.held.is_empty() && self.lost.is_none() {
            return Ok(());
        }
        let mut written = 0;
        while let Some(line) = self.held.pop_front() {
            if let Err(e) = self.append(line.as_bytes()) {
                self.held.push_front(line);
                return Err(e);
            }
            self.held_bytes -= line.len();
            written += 1;
        }
        let mut note = format!(
            "the event log is written again; {written} record(s) held back while it could not be \
             written are in it now"
        );
        if let Some(lost) = self.lost.clone() {
            self.append(self.lost_line(&lost).as_bytes())?;
            self.lost = None;
            note += &format!(", {} more were lost ({})", lost.records, lost.error);
        }
        console_note(&note);
        Ok(())
    }

    /// Keeps `line`, made at `ts`, for a later write, or counts it lost past the bound; the
    /// console hears of the first failure of a burst only.
    fn hold(&mut self, line: String, ts: f64, e: &std::io::Error) {
        if self.held.is_empty() && self.lost.is_none() {
            console_note(&format!(
                "cannot write the event log ({e}); the job goes on, its records are held back \
                 (up to {} MiB) and written once the log can be (free space in --log-dir)",
                self.held_max >> 20
            ));
        }
        if self.lost.is_none() && self.held_bytes + line.len() <= self.held_max {
            self.held_bytes += line.len();
            self.held.push_back(line);
        } else {
            self.count_lost(ts, e);
        }
    }

    /// Appends whole lines `bytes`, or leaves the file as it was and says why not.
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let f = &mut self.file;
        if self.cut_pending {
            f.truncate(self.len)?;
            self.cut_pending = false;
        }
        let wrote = f.write_all(bytes).and_then(|_| f.flush());
        match wrote {
            Ok(()) => {
                self.len += bytes.len() as u64;
                Ok(())
            }
            Err(e) => {
                // Part of the line may be in the file: cut it, now or before the next write.
                self.cut_pending = f.truncate(self.len).is_err();
                Err(e)
            }
        }
    }

    /// One more record lost at `ts`.
    fn count_lost(&mut self, ts: f64, e: &std::io::Error) {
        match &mut self.lost {
            Some(l) => {
                l.records += 1;
                l.last_ts = ts;
                l.error = e.to_string();
            }
            None => {
                self.lost = Some(Lost {
                    records: 1,
                    first_ts: ts,
                    last_ts: ts,
                    error: e.to_string(),
                });
            }
        }
    }

    /// The `events_lost` line for `lost`, stamped now.
    fn lost_line(&self, lost: &Lost) -> String {
        let rec = Record::EventsLost {
            records: lost.records,
            first_ts: lost.first_ts,
            last_ts: lost.last_ts,
            error: lost.error.clone(),
        };
        let mut v = serde_json::to_value(rec).unwrap_or_default();
        stamp(&mut v, &self.host, self.node_rank);
        let mut s = v.to_string();
        s.push('\n');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A file that holds `room` bytes: a write past it writes what fits, then fails as a full
    /// disk does (ENOSPC).
    #[derive(Clone, Default)]
    struct SmallFile {
        state: Arc<Mutex<(Vec<u8>, usize)>>,
        /// Truncations to refuse (an I/O error) before one works.
        refuse_cuts: Arc<Mutex<usize>>,
    }

    impl SmallFile {
        fn set_room(&self, room: usize) {
            self.state.lock().unwrap().1 = room;
        }
        fn text(&self) -> String {
            String::from_utf8(self.state.lock().unwrap().0.clone()).unwrap()
        }
    }

    impl Write for SmallFile {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let mut s = self.state.lock().unwrap();
            let fits = s.1.saturating_sub(s.0.len()).min(buf.len());
            if fits == 0 && !buf.is_empty() {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            s.0.extend_from_slice(&buf[..fits]);
            Ok(fits)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl LogFile for SmallFile {
        fn truncate(&mut self, len: u64) -> std::io::Result<()> {
            let mut refuse = self.refuse_cuts.lock().unwrap();
            if *refuse > 0 {
                *refuse -= 1;
                return Err(std::io::Error::from_raw_os_error(libc::EIO));
            }
            self.state.lock().unwrap().0.truncate(len as usize);
            Ok(())
        }
    }

    fn record(n: u32) -> Record {
        Record::InProcessDeclined {
            attempt: n,
            reason: "x".repeat(40),
        }
    }

    fn lines(file: &SmallFile) -> Vec<serde_json::Value> {
        file.text()
            .lines()
            .map(|l| serde_json::from_str(l).expect("every line is whole JSON"))
            .collect()
    }

    fn events(lines: &[serde_json::Value]) -> Vec<&str> {
        lines.iter().map(|v| v["event"].as_str().unwrap()).collect()
    }

    #[test]
    fn a_full_log_holds_records_back_and_writes_them_in_order_once_it_can() {
        let file = SmallFile::default();
        file.set_room(1 << 20);
        let mut log = EventLog::new(Box::new(file.clone()), 0, "h", 0);
        log.write(&record(0));
        let first = file.text().len();
        // Room for half a line: the second record is cut mid-line, then fails.
        file.set_room(first + 30);
        log.write(&record(1));
        log.write(&record(2));
        assert_eq!(
            file.text().len(),
            first,
            "a cut line was left: {}",
            file.text()
        );
        file.set_room(1 << 20);
        log.write(&record(3));
        log.write(&record(4));
        let lines = lines(&file);
        assert_eq!(events(&lines), ["in_process_declined"; 5]);
        let cycles: Vec<_> = lines.iter().map(|l| l["cycle"].as_u64().unwrap()).collect();
        assert_eq!(cycles, [0, 1, 2, 3, 4]);
        // Each keeps the time it was made, not the time it was written.
        let ts: Vec<f64> = lines.iter().map(|l| l["ts"].as_f64().unwrap()).collect();
        assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{ts:?}");
    }

    #[test]
    fn records_past_what_is_held_are_lost_counted_and_told_after_the_held_ones() {
        let file = SmallFile::default();
        let mut log = EventLog::new(Box::new(file.clone()), 0, "h", 0);
        // Room to hold two records, not three.
        log.held_max = 2 * (serde_json::to_string(&record(0)).unwrap().len() + 60);
        for n in 0..5 {
            log.write(&record(n));
        }
        assert_eq!(file.text(), "");
        assert_eq!(log.held.len(), 2);
        file.set_room(1 << 20);
        log.write(&record(5));
        let lines = lines(&file);
        assert_eq!(
            events(&lines),
            [
                "in_process_declined",
                "in_process_declined",
                "events_lost",
                "in_process_declined"
            ]
        );
        assert_eq!(
            (lines[0]["cycle"].clone(), lines[1]["cycle"].clone()),
            (0.into(), 1.into())
        );
        let lost = &lines[2];
        assert_eq!(lost["records"], 3);
        assert!(lost["first_ts"].as_f64().unwrap() <= lost["last_ts"].as_f64().unwrap());
        assert!(lost["last_ts"].as_f64().unwrap() <= lost["ts"].as_f64().unwrap());
        assert!(lost["error"].as_str().unwrap().contains("No space left"));
        assert_eq!(lost["node_rank"], 0);
        assert_eq!(lines[3]["cycle"], 5);
        assert_eq!((log.held.len(), log.held_bytes), (0, 0));
    }

    #[test]
    fn a_cut_line_that_could_not_be_cut_at_once_is_cut_before_the_next_write() {
        let file = SmallFile::default();
        file.set_room(1 << 20);
        let mut log = EventLog::new(Box::new(file.clone()), 0, "h", 0);
        log.write(&record(0));
        let first = file.text().len();
        file.set_room(first + 30);
        *file.refuse_cuts.lock().unwrap() = 1;
        log.write(&record(1));
        assert_eq!(file.text().len(), first + 30, "the cut was refused");
        file.set_room(1 << 20);
        log.write(&record(2));
        let events: Vec<String> = file
            .text()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("whole JSON");
                v["event"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(events, ["in_process_declined"; 3]);
    }
}

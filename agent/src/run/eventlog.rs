//! The node's event log, `events.jsonl`: one JSON record per line.
//!
//! A write that fails (the log directory full, an I/O error) costs that record, not the log: the
//! file is cut back to the end of the last whole line, so a reader never sees a cut line; the
//! console says so once per burst of failures; the next record tries again, and the first write
//! that works again is preceded by an `events_lost` record counting what was lost and when.

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

/// Records that could not be written, since the last one that could.
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
        if let Some(lost) = self.lost.clone() {
            let notice = self.lost_line(&lost);
            if let Err(e) = self.append(notice.as_bytes()) {
                self.count_lost(ts, &e);
                return;
            }
            self.lost = None;
            console_note(&format!(
                "the event log is written again; {} record(s) were lost ({})",
                lost.records, lost.error
            ));
        }
        if let Err(e) = self.append(line.as_bytes()) {
            self.count_lost(ts, &e);
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

    /// One more record lost at `ts`; the console hears of the first of a burst only.
    fn count_lost(&mut self, ts: f64, e: &std::io::Error) {
        match &mut self.lost {
            Some(l) => {
                l.records += 1;
                l.last_ts = ts;
                l.error = e.to_string();
            }
            None => {
                console_note(&format!(
                    "cannot write the event log ({e}); the job goes on, and its records are counted \
                     and the log written again once it can be (free space in --log-dir)"
                ));
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

    #[test]
    fn a_full_log_loses_records_not_the_log_and_counts_them() {
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
        let lines: Vec<serde_json::Value> = file
            .text()
            .lines()
            .map(|l| serde_json::from_str(l).expect("every line is whole JSON"))
            .collect();
        let events: Vec<_> = lines.iter().map(|v| v["event"].as_str().unwrap()).collect();
        assert_eq!(
            events,
            [
                "in_process_declined",
                "events_lost",
                "in_process_declined",
                "in_process_declined"
            ]
        );
        let cycles: Vec<_> = [0, 2, 3]
            .iter()
            .map(|i| lines[*i]["cycle"].clone())
            .collect();
        assert_eq!(cycles, [0, 3, 4]);
        let lost = &lines[1];
        assert_eq!(lost["records"], 2);
        assert!(lost["first_ts"].as_f64().unwrap() <= lost["last_ts"].as_f64().unwrap());
        assert!(lost["last_ts"].as_f64().unwrap() <= lost["ts"].as_f64().unwrap());
        assert!(lost["error"].as_str().unwrap().contains("No space left"));
        assert_eq!(lost["node_rank"], 0);
    }

    #[test]
    fn the_lost_notice_itself_failing_counts_on() {
        let file = SmallFile::default();
        let mut log = EventLog::new(Box::new(file.clone()), 0, "h", 0);
        log.write(&record(0));
        log.write(&record(1));
        assert_eq!(file.text(), "");
        log.write(&record(2));
        file.set_room(1 << 20);
        log.write(&record(3));
        let lines: Vec<serde_json::Value> = file
            .text()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["event"], "events_lost");
        assert_eq!(lines[0]["records"], 3);
        assert_eq!(lines[1]["cycle"], 3);
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
        assert_eq!(
            events,
            ["in_process_declined", "events_lost", "in_process_declined"]
        );
    }
}

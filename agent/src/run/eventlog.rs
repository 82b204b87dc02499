//! The node's event log, `events.jsonl`: one JSON record per line.

use std::fs::File;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use super::report::console_note;
use crate::supervise::Record;

pub(super) struct EventLog {
    pub(super) file: Option<File>,
    pub(super) host: String,
    pub(super) node_rank: u32,
}

/// Adds what every record has: when, and which node.
pub(super) fn stamp(v: &mut serde_json::Value, host: &str, node_rank: u32) {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    if let Some(o) = v.as_object_mut() {
        o.insert("ts".into(), ts.into());
        o.insert("host".into(), host.into());
        o.insert("node_rank".into(), node_rank.into());
    }
}

impl EventLog {
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
        if let Some(f) = &mut self.file {
            line.push('\n');
            if let Err(e) = f.write_all(line.as_bytes()) {
                console_note(&format!(
                    "cannot write the event log ({e}); continuing without it"
                ));
                self.file = None;
            }
        }
    }
}

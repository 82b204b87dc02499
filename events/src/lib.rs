//! The records vigil writes to disk and reads back, defined once: the event log's lines
//! (`events.jsonl`, [`log`]), the job's ledger (`ledger.jsonl`, [`ledger`]), an experiment's
//! record (`experiment.json`, [`experiment`]) and the names of signals that both logs carry
//! ([`signals`]), and how a job id is written into the names of the directories that hold them
//! ([`file_safe`]).
//!
//! The agent and `vigil launch` write these types and `vigil report`, `status`, `ledger` and
//! `watch` read them back, so a field renamed here is renamed on both sides. Reading is
//! tolerant: an event a newer vigil adds reads as [`log::Record::Unknown`], fields this vigil
//! does not know are ignored, and fields an older vigil did not write take their defaults.

pub mod exit;
pub mod experiment;
pub mod ledger;
pub mod log;
pub mod signals;

pub use log::{HangKind, Record, Timeouts};
pub use signals::{is_stop_signal, signal_name};

/// The longest duration vigil takes anywhere: a year. Larger values overflow the clock
/// arithmetic and are never meant.
pub const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// A job id made safe for a file name: anything but `[A-Za-z0-9._-]` becomes `_`. The agent
/// names its run and state directories with it and `vigil report` and `vigil ledger` look for
/// them by it, so both take it from here.
pub fn file_safe(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn file_safe_keeps_letters_digits_dots_dashes_and_underscores() {
        assert_eq!(super::file_safe("eos-1234_5.x"), "eos-1234_5.x");
        assert_eq!(super::file_safe("a/b c:é"), "a_b_c__");
    }
}

//! The records vigil writes to disk and reads back, defined once: the event log's lines
//! (`events.jsonl`, [`log`]), the job's ledger (`ledger.jsonl`, [`ledger`]), an experiment's
//! record (`experiment.json`, [`experiment`]) and the names of signals that both logs carry
//! ([`signals`]).
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

//! What a message from beside the loop (the checks before a rendezvous, the GPU watch) asks of the
//! agent, as values: the dispatcher carries them out, so those sources need not reach into it.

use crate::supervise::{Event, JobRequest, Record};

#[derive(Debug, PartialEq)]
pub(super) enum Effect {
    /// A line for the console.
    Note(String),
    /// A record for the event log.
    Write(Record),
    /// A request to the job's coordination.
    Send(JobRequest),
    /// An event for the supervisor.
    Event(Event),
}

//! The job's hang verdict, the coordinator's side: a node's candidates put on the wire (their
//! silence as wall time) and the waiter that tells this node of each round's request and
//! verdict. What is written, counted and read, and the choice, are the state machine's
//! (`decide::report_hangs`, `Fact::HangsCounted`, `decide::hangs_read`), carried out as Steps.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::supervise::{Event, HangCandidate, HungRank};

use super::super::decide::Fact;
use super::super::wire::{key, WireHangCandidate};
use super::super::FromCoord;
use super::{Coordinator, Input};

/// `c` on the wire: when its silence began as wall time, from this process' clock now.
fn wire(c: &HangCandidate, now: Instant, wall: SystemTime) -> WireHangCandidate {
    let since = wall - now.saturating_duration_since(c.since);
    WireHangCandidate {
        rank: c.rank,
        pid: c.pid,
        step: c.step,
        section: c.section.clone(),
        silent_since_ms: since
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        stopped: c.stopped,
        waiting: c.waiting,
    }
}

/// A verdict as written (`null` or a candidate); `None` when it does not read as one.
fn read_named(v: &[u8]) -> Option<Option<HungRank>> {
    let w: Option<WireHangCandidate> = serde_json::from_slice(v).ok()?;
    Some(w.map(|w| HungRank {
        rank: w.rank,
        pid: w.pid,
        stopped: w.stopped,
    }))
}

impl Coordinator {
    /// This node's candidates for `attempt`'s hang verdict `round`, put on the wire with this
    /// process' clocks, for the state machine to write and count ([`Rendezvous::report_hangs`]).
    ///
    /// [`Rendezvous::report_hangs`]: super::super::decide::Rendezvous::report_hangs
    pub(super) async fn hang_report(
        &mut self,
        attempt: u32,
        round: u32,
        candidates: &[HangCandidate],
    ) -> Result<(), vigil_store::StoreError> {
        let (now, wall) = (Instant::now(), SystemTime::now());
        let mine: Vec<WireHangCandidate> = candidates.iter().map(|c| wire(c, now, wall)).collect();
        self.decide(Fact::HangReport {
            attempt,
            round,
            candidates: &mine,
        })
        .await
    }

    /// Parked on the attempt's hang verdicts, round after round: each request, then its
    /// verdict; aborted (and with it the wait) when the next attempt is joined.
    pub(super) fn spawn_hang_waiter(&mut self, attempt: u32) {
        let c = self.ctl.clone();
        let tx = self.inbox_tx.clone();
        self.hang_task = Some(self.tasks.spawn_local(async move {
            for round in 0.. {
                if c.wait_get(&key::hang(attempt, round), Duration::MAX)
                    .await
                    .is_err()
                    || tx.send(Input::HangAsked { attempt, round }).is_err()
                {
                    return;
                }
                let Ok(value) = c
                    .wait_get(&key::hang_named(attempt, round), Duration::MAX)
                    .await
                else {
                    return;
                };
                let named = Input::HangNamed {
                    attempt,
                    round,
                    value,
                };
                if tx.send(named).is_err() {
                    return;
                }
            }
        }));
    }

    /// A hang verdict as read, for the supervisor (one that does not read names no rank).
    pub(super) fn hang_named(&mut self, attempt: u32, round: u32, value: &[u8]) {
        let hung = read_named(value).flatten();
        self.send(FromCoord::Event(Event::HangNamed {
            attempt,
            round,
            hung,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::wire::to_json;
    use super::*;

    #[test]
    fn a_candidate_s_silence_goes_on_the_wire_as_wall_time() {
        let now = Instant::now();
        let wall = UNIX_EPOCH + Duration::from_secs(1_000);
        let c = HangCandidate {
            local_rank: 1,
            rank: 3,
            pid: 42,
            step: Some(7),
            section: Some("step".into()),
            since: now - Duration::from_millis(2_500),
            stopped: false,
            waiting: Some(true),
        };
        let w = wire(&c, now, wall);
        assert_eq!(
            (w.rank, w.pid, w.step, w.waiting),
            (3, 42, Some(7), Some(true))
        );
        assert_eq!(w.silent_since_ms, 997_500);
        let named = read_named(&to_json(&Some(w))).unwrap().unwrap();
        assert_eq!((named.rank, named.pid, named.stopped), (3, 42, false));
        assert_eq!(read_named(b"null"), Some(None));
        assert_eq!(read_named(b"junk"), None);
    }
}

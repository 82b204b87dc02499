//! What node rank 0's agent says of the connections its store closed: a `store_refused` record
//! and a console line for connections turned away in their handshake (docs/store.md,
//! "Connections turned away"), a console line for an admitted one that misbehaved.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::console_note;
use vigil_events::log::STORE_REFUSED_EVERY;
use vigil_events::Record;

/// What the event loop hears of the store's refusals: `store_refused` records ([`drop_notice`]).
pub(in crate::run) type RefusedRx = mpsc::UnboundedReceiver<Record>;

/// At most one console line per this long about connections the store closed.
pub(in crate::run) const DROP_NOTE_EVERY: Duration = Duration::from_secs(10);

/// Tells the console why the store closed a connection, at most once per [`DROP_NOTE_EVERY`].
fn console_drops() -> vigil_store::DropNotice {
    let last: std::sync::Mutex<(Option<Instant>, u64)> = std::sync::Mutex::new((None, 0));
    Arc::new(move |peer, _, why| {
        let mut g = last.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if g.0.is_some_and(|t| now.duration_since(t) < DROP_NOTE_EVERY) {
            g.1 += 1;
            return;
        }
        let more = std::mem::take(&mut g.1);
        g.0 = Some(now);
        drop(g);
        console_note(&format!(
            "vigil's store closed the connection from {peer}: {why}{}",
            if more > 0 {
                format!(" ({more} more closed since the last note)")
            } else {
                String::new()
            }
        ));
    })
}

/// When the agent says that the store turned connections away (a `store_refused` record and a
/// console line): at once for the first, then at most once per [`STORE_REFUSED_EVERY`], a burst
/// inside that window said once at its end. Pure: the caller brings the clock and the timer.
#[derive(Debug, Default)]
pub(super) struct RefusedNotes {
    /// When the last was said.
    last: Option<Instant>,
    /// A note is due at the end of the window (its timer is armed).
    due: bool,
    /// The store's total of refusals at the last note.
    said: u64,
}

/// What to do about a refusal.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Say {
    Now,
    /// Arm a timer for then, and say it ([`RefusedNotes::due_now`]) when it fires.
    At(Instant),
    /// A note is already due.
    Later,
}

impl RefusedNotes {
    pub(super) fn on_refusal(&mut self, now: Instant) -> Say {
        if self.due {
            return Say::Later;
        }
        match self.last {
            Some(t) if now.duration_since(t) < STORE_REFUSED_EVERY => {
                self.due = true;
                Say::At(t + STORE_REFUSED_EVERY)
            }
            _ => {
                self.last = Some(now);
                Say::Now
            }
        }
    }

    /// The timer of a due note fired at `now`.
    pub(super) fn due_now(&mut self, now: Instant) {
        self.due = false;
        self.last = Some(now);
    }

    /// How many refusals are new since the last note, the store's total being `total`.
    pub(super) fn take_new(&mut self, total: u64) -> u64 {
        let n = total.saturating_sub(self.said);
        self.said = self.said.max(total);
        n
    }
}

/// The `store_refused` record of the store's refusals `r`, `new` of them since the last.
pub(super) fn refused_record(r: &vigil_store::Refusals, new: u64) -> Record {
    Record::StoreRefused {
        new,
        bad_bytes: r.bad_bytes,
        wrong_secret: r.wrong_secret,
        closed_in_handshake: r.closed_in_handshake,
        over_budget: r.over_budget,
        last_peer: r.last_peer.map(|p| p.to_string()),
        last_reason: r.last_why.clone(),
    }
}

/// The console's line for a `store_refused` record.
pub(in crate::run) fn refused_text(rec: &Record) -> Option<String> {
    let Record::StoreRefused {
        new,
        bad_bytes,
        wrong_secret,
        closed_in_handshake,
        over_budget,
        last_peer,
        last_reason,
    } = rec
    else {
        return None;
    };
    let mut text = format!(
        "vigil's store turned away {new} connection(s) that did not prove the job's secret (since it started: {bad_bytes} sent bytes that are not the handshake, {wrong_secret} a wrong secret, {closed_in_handshake} closed in their handshake, {over_budget} over the handshake budget)"
    );
    if let Some(peer) = last_peer {
        text.push_str(&format!("; the last from {peer}"));
        if let Some(why) = last_reason {
            text.push_str(&format!(": {why}"));
        }
    }
    Some(text)
}

/// Where the store's refusals go: its counts, and the agent's event loop.
#[derive(Clone)]
pub(super) struct RefusedOut {
    pub(super) keys: vigil_store::KeySpace,
    pub(super) tx: mpsc::UnboundedSender<Record>,
    pub(super) notes: Arc<std::sync::Mutex<RefusedNotes>>,
}

impl RefusedOut {
    fn send_note(&self) {
        let r = self.keys.refusals();
        let new = self
            .notes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take_new(r.total());
        if new > 0 {
            let _ = self.tx.send(refused_record(&r, new));
        }
    }

    fn on_refusal(&self) {
        let now = Instant::now();
        let say = self
            .notes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .on_refusal(now);
        match say {
            Say::Now => self.send_note(),
            Say::At(t) => {
                // On the store's own runtime (the notice runs in a connection's task there).
                let Ok(rt) = tokio::runtime::Handle::try_current() else {
                    return self.send_note();
                };
                let me = self.clone();
                rt.spawn(async move {
                    tokio::time::sleep_until(t.into()).await;
                    me.notes
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .due_now(Instant::now());
                    me.send_note();
                });
            }
            Say::Later => {}
        }
    }
}

/// What `vigil store` hears of the connections it closed: refusals as `store_refused` records on
/// `tx` (at once for the first, then at most one per [`STORE_REFUSED_EVERY`]), an admitted
/// connection that misbehaved on the console, at most a line per [`DROP_NOTE_EVERY`]. So a flood
/// of strangers costs the service a line now and then, not one each.
pub(in crate::run) fn service_drop_notice(
    keys: vigil_store::KeySpace,
    tx: mpsc::UnboundedSender<Record>,
) -> vigil_store::DropNotice {
    drop_notice(Some(RefusedOut {
        keys,
        tx,
        notes: Arc::default(),
    }))
}

/// What the agent hears of the connections its store closed: a refusal (a connection closed in
/// its handshake) goes to the event loop (`refused`, which writes `store_refused` and the
/// console line); an admitted connection that misbehaved, and every refusal of a store hosted
/// without an event loop, to the console ([`console_drops`]).
pub(super) fn drop_notice(refused: Option<RefusedOut>) -> vigil_store::DropNotice {
    let console = console_drops();
    let Some(out) = refused else {
        return console;
    };
    Arc::new(move |peer, refusal, why| match refusal {
        Some(_) => out.on_refusal(),
        None => console(peer, refusal, why),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    #[test]
    fn refusals_are_said_at_once_then_once_per_window_a_burst_at_its_end() {
        let t0 = Instant::now();
        let s = |x: u64| t0 + Duration::from_millis(x);
        let mut n = RefusedNotes::default();
        assert_eq!(n.on_refusal(s(0)), Say::Now);
        assert_eq!(n.take_new(1), 1);
        // A burst inside the window: one timer, for the window's end.
        let end = s(0) + STORE_REFUSED_EVERY;
        assert_eq!(n.on_refusal(s(5)), Say::At(end));
        for i in 6..300 {
            assert_eq!(n.on_refusal(s(i)), Say::Later);
        }
        n.due_now(end);
        assert_eq!(n.take_new(300), 299);
        // Nothing new since: nothing to say.
        assert_eq!(n.take_new(300), 0);
        // The next one, inside the window the timer's note opened, waits for its end.
        let later = end + Duration::from_secs(1);
        assert_eq!(n.on_refusal(later), Say::At(end + STORE_REFUSED_EVERY));
        n.due_now(end + STORE_REFUSED_EVERY);
        // One long after: at once again.
        assert_eq!(n.on_refusal(end + STORE_REFUSED_EVERY * 3), Say::Now);
    }

    #[test]
    fn a_store_refused_record_carries_the_counts_and_the_last_peer() {
        let mut r = vigil_store::Refusals::default();
        let peer: SocketAddr = "10.0.0.7:51234".parse().unwrap();
        r.count(
            vigil_store::Refusal::BadBytes,
            peer,
            "VALIDATE with a wrong magic number",
        );
        for _ in 0..3 {
            r.count(
                vigil_store::Refusal::ClosedInHandshake,
                peer,
                vigil_store::CLOSED_IN_HANDSHAKE,
            );
        }
        let rec = refused_record(&r, 4);
        let v = serde_json::to_value(&rec).unwrap();
        assert_eq!(v["event"], "store_refused");
        assert_eq!(
            (
                &v["new"],
                &v["bad_bytes"],
                &v["closed_in_handshake"],
                &v["over_budget"]
            ),
            (&4.into(), &1.into(), &3.into(), &0.into())
        );
        assert_eq!(v["last_peer"], "10.0.0.7:51234");
        let text = refused_text(&rec).unwrap();
        assert!(
            text.contains("turned away 4 connection(s)")
                && text.contains("1 sent bytes")
                && text.contains("3 closed in their handshake")
                && text.contains("from 10.0.0.7:51234: it closed"),
            "{text}"
        );
        assert!(refused_text(&Record::Unknown).is_none());
    }
}

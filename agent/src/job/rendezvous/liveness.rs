//! Whether the other agents are alive: every agent renews a counter in the store with a one-way
//! RENEW; node rank 0 asks the store once per period which counters did not move (SWEEP), the
//! others read node rank 0's. A counter that does not move for the node timeout, in the
//! watcher's own running time, is a lost node.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use vigil_store::MuxClient;

use super::wire::key;
use super::{CoordConfig, Input};

/// How silent each watched node has been, in the watcher's own running time. Pure: the caller
/// says when it woke and what it read.
#[derive(Debug)]
pub struct Liveness {
    timeout: Duration,
    period: Duration,
    last: Option<Instant>,
    /// Watched node -> (its counter when last read, silence since it last moved).
    seen: BTreeMap<u32, (Vec<u8>, Duration)>,
    /// How long the read in flight has been unanswered.
    unanswered: Option<Duration>,
}

/// Who [`Liveness`] found silent for the timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Silent {
    /// The store did not answer a read.
    Store(Duration),
    /// This node's counter did not move.
    Node(u32, Duration),
}

impl Liveness {
    /// `period` is how often the caller wakes; a longer gap between wake-ups means the watcher
    /// itself was not running, and counts as one period.
    pub fn new(timeout: Duration, period: Duration) -> Self {
        Liveness {
            timeout,
            period,
            last: None,
            seen: BTreeMap::new(),
            unanswered: None,
        }
    }

    /// The watcher woke at `now`: silence grows by the time it ran since the last wake-up.
    pub fn wake(&mut self, now: Instant) {
        let dt = match self.last {
            Some(l) => now.saturating_duration_since(l).min(self.period),
            None => Duration::ZERO,
        };
        self.last = Some(now);
        for (_, silence) in self.seen.values_mut() {
            *silence += dt;
        }
        if let Some(u) = self.unanswered.as_mut() {
            *u += dt;
        }
    }

    /// A read of the counters was sent.
    pub fn asked(&mut self) {
        self.unanswered.get_or_insert(Duration::ZERO);
    }

    /// The read came back: each watched node's counter, `None` if it has none (not started yet,
    /// or left: it deletes its counter when it leaves).
    pub fn answered(&mut self, values: impl IntoIterator<Item = (u32, Option<Vec<u8>>)>) {
        self.unanswered = None;
        for (node, v) in values {
            match v {
                Some(v) => match self.seen.get_mut(&node) {
                    Some(e) if e.0 == v => {}
                    _ => {
                        self.seen.insert(node, (v, Duration::ZERO));
                    }
                },
                None => {
                    self.seen.remove(&node);
                }
            }
        }
    }

    /// A sweep came back: of the `watched` nodes, `stale` did not renew since the previous sweep,
    /// the others did (or never renewed, or left: the store forgets those, and they are not
    /// held against anyone, as a missing counter in [`Liveness::answered`]).
    pub fn swept(&mut self, watched: &[u32], stale: &BTreeSet<u32>) {
        self.unanswered = None;
        for n in watched {
            if stale.contains(n) {
                self.seen.entry(*n).or_insert((Vec::new(), Duration::ZERO));
            } else {
                self.seen.insert(*n, (Vec::new(), Duration::ZERO));
            }
        }
    }

    /// Stops watching `node` (it was reported lost and is never a member again).
    pub fn forget(&mut self, node: u32) {
        self.seen.remove(&node);
    }

    /// The first watched thing silent for the timeout, if any. While a read is unanswered, the
    /// counters cannot move: the store is to blame.
    pub fn silent(&self) -> Option<Silent> {
        let node = self
            .seen
            .iter()
            .find(|(_, (_, s))| *s >= self.timeout)
            .map(|(n, (_, s))| Silent::Node(*n, *s));
        match self.unanswered {
            Some(u) if u >= self.timeout || node.is_some() => Some(Silent::Store(u)),
            _ => node,
        }
    }
}

/// How often an agent renews its counter and reads the others'.
pub fn liveness_period(node_timeout: Duration) -> Duration {
    (node_timeout / 8).max(Duration::from_millis(50))
}

/// What the liveness tells the coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Alarm {
    /// A watched node (`None`: the store) was silent for the node timeout, for this reason.
    Silent(String, Option<u32>),
    /// The store outside the job: the coordinator's lease, held by this node, is gone (its
    /// connection ended). Said every period until some agent holds it again.
    CoordGone(u32),
    /// The store outside the job: this agent coordinated, but the coordinator's lease names
    /// another node now (this one was frozen past the node timeout); or node rank 0 dropped
    /// this node from the job (`vigil/dropped/<node>`, frozen past the node timeout). It leaves,
    /// writing nothing of the job's: its node was lost, and the job goes on without it.
    Deposed(String),
}

/// Renews this node's counter and watches the others' until a watched node or the store is
/// silent for the node timeout, then says why. An error of the store ends it quietly: the
/// agent's other uses of the connection report that. `head`: this agent coordinates (it sweeps
/// every counter); else it watches the coordinator's: node rank 0's, or, with the store outside
/// the job, the node that holds the coordinator's lease.
pub(super) async fn liveness(
    client: MuxClient,
    cfg: CoordConfig,
    head: bool,
    tx: mpsc::UnboundedSender<Input>,
) {
    let period = liveness_period(cfg.peer_timeout);
    let me = key::alive(cfg.node_rank);
    let how = match (head, cfg.outside) {
        (true, true) => Watch::Fenced(cfg.node_rank),
        (true, false) => Watch::Sweep,
        (false, false) => Watch::Node0(cfg.node_rank),
        (false, true) => Watch::Coordinator,
    };
    let mut w = Watcher {
        watched: if head {
            (0..cfg.nnodes).filter(|n| *n != cfg.node_rank).collect()
        } else {
            vec![0]
        },
        coord: None,
        live: Liveness::new(cfg.peer_timeout, period),
        cfg,
        head,
        tx,
    };
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    type Round = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Reading>>>>;
    // One round in flight at a time: a period whose round is still unanswered asks nothing more.
    let mut round: Option<Round> = None;
    loop {
        let in_flight = async {
            match round.as_mut() {
                Some(r) => r.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = ticker.tick() => {
                w.live.wake(Instant::now());
                if let Some(s) = w.live.silent() {
                    if !w.silent(s) {
                        return;
                    }
                } else if round.is_none() {
                    w.live.asked();
                    round = Some(Box::pin(renew_and_read(client.clone(), me.clone(), how)));
                }
            }
            r = in_flight => {
                round = None;
                if !r.is_some_and(|reading| w.read(reading)) {
                    return;
                }
            }
        }
    }
}

/// The liveness' state between periods: whom it watches and how silent each has been.
struct Watcher {
    cfg: CoordConfig,
    head: bool,
    watched: Vec<u32>,
    /// The store outside the job: the coordinator as last read from its lease.
    coord: Option<u32>,
    live: Liveness,
    tx: mpsc::UnboundedSender<Input>,
}

impl Watcher {
    /// Tells the coordinator; `false`: it is gone.
    fn alarm(&self, a: Alarm) -> bool {
        self.tx.send(Input::Alarm(a)).is_ok()
    }

    /// Something was silent for the node timeout: says so. `false`: the watch ends (node rank 0
    /// goes on watching the others after a silent node, and renewing its own counter, which
    /// every other agent watches: with standbys the job outlives a node).
    fn silent(&mut self, s: Silent) -> bool {
        let (head, outside) = (self.head, self.cfg.outside);
        if let Silent::Node(n, _) = s {
            if !head && outside && self.coord == Some(n) {
                // The store outside the job: a coordinator silent for the node timeout has lost
                // its lease as if it had expired, whether or not the store dropped its
                // connection yet.
                self.live.forget(n);
                return self.alarm(Alarm::CoordGone(n));
            }
        }
        let t = self.cfg.peer_timeout.as_secs_f64();
        let store = self.cfg.store;
        let why = match s {
            Silent::Store(_) if head && !outside => format!("this node's own store did not answer for {t:.0}s (--node-timeout)"),
            Silent::Store(_) if outside => format!("the store at {store} did not answer for {t:.0}s (--node-timeout)"),
            Silent::Store(_) => format!("node rank 0 was lost: its store at {store} did not answer for {t:.0}s (--node-timeout): its agent is frozen, overloaded or cut off"),
            Silent::Node(n, _) => format!("node {n} was lost: its agent gave no sign of life for {t:.0}s (--node-timeout): frozen, overloaded or cut off"),
        };
        let node = match s {
            Silent::Node(n, _) => Some(n),
            Silent::Store(_) if !head && !outside => Some(0),
            Silent::Store(_) => None,
        };
        let _ = self.alarm(Alarm::Silent(why, node));
        match s {
            Silent::Node(n, _) if head => {
                self.live.forget(n);
                self.watched.retain(|w| *w != n);
                true
            }
            _ => false,
        }
    }

    /// A period's round came back. `false`: the watch ends.
    fn read(&mut self, reading: Reading) -> bool {
        match reading {
            Reading::Deposed(by) => {
                let why = format!(
                    "node {} was lost: its agent, the job's coordinator, was frozen or cut off for longer than --node-timeout and node rank {by} coordinates the job now",
                    self.cfg.node_rank
                );
                let _ = self.alarm(Alarm::Deposed(why));
                return false;
            }
            Reading::Dropped(why) => {
                let _ = self.alarm(Alarm::Deposed(why));
                return false;
            }
            Reading::Counters(values) => self.live.answered(values),
            Reading::Stale(stale) => self.live.swept(&self.watched, &stale),
            Reading::Coordinator(now, values) => {
                match (self.coord, now) {
                    // Its lease is gone: its silent counter is no one's to blame; the
                    // coordinator (this agent or another) loses its node.
                    (Some(old), None) => {
                        self.live.forget(old);
                        self.live.answered(Vec::new());
                        return self.alarm(Alarm::CoordGone(old));
                    }
                    (Some(old), Some(new)) if old != new => self.live.forget(old),
                    _ => {}
                }
                if now.is_some() {
                    self.coord = now;
                }
                self.live.answered(values);
            }
        }
        true
    }
}

/// What a period's round reads besides renewing.
#[derive(Clone, Copy)]
enum Watch {
    /// The coordinator: a SWEEP of every counter.
    Sweep,
    /// The coordinator, with the store outside the job: the SWEEP, and whether the
    /// coordinator's lease still names this node (another agent takes it over from one frozen
    /// for the node timeout).
    Fenced(u32),
    /// Node rank 0's counter, and whether node rank 0 dropped this node from the job.
    Node0(u32),
    /// The store outside the job: who holds the coordinator's lease, and its counter.
    Coordinator,
}

/// What one period's round read.
enum Reading {
    /// The coordinator's node as its lease names it (`None`: no lease), and its counter.
    Coordinator(Option<u32>, Vec<(u32, Option<Vec<u8>>)>),
    /// The watched nodes' counters (every agent but node rank 0 watches node rank 0's).
    Counters(Vec<(u32, Option<Vec<u8>>)>),
    /// Node rank 0: the nodes whose counters did not move since its previous sweep.
    Stale(BTreeSet<u32>),
    /// The coordinator's lease names this other node: this agent coordinates no more.
    Deposed(u32),
    /// Node rank 0 lost this node for good (it was frozen past the node timeout, or silent): it
    /// is no member of the job any more; why it leaves ([`dropped_reason`]).
    Dropped(String),
}

/// Node rank 0's `vigil/dropped/<node>` as read (empty: not written): why node `node`, dropped
/// from the job while its agent was frozen, leaves it now. Read each period by the liveness
/// check and before each join, so that a woken agent joins no attempt, not even as a standby
/// for the period until its liveness check reads it.
pub(super) fn dropped_reason(node: u32, read: &[u8]) -> Option<String> {
    (!read.is_empty()).then(|| {
        format!(
            "node {node} was dropped from the job: {}; it woke since and leaves the job, to be requeued",
            String::from_utf8_lossy(read)
        )
    })
}

/// One period: renews this node's counter (one-way) and reads what it watches, in one round
/// trip. `None`: the store failed.
async fn renew_and_read(c: MuxClient, me: String, how: Watch) -> Option<Reading> {
    c.renew(&me).ok()?;
    if let Watch::Coordinator = how {
        // MULTI_GET answers at once; a missing key reads empty.
        let v = c.multi_get_now(&[key::COORD_LEASE]).await.ok()?;
        let coord: Option<u32> = v
            .first()
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok());
        let Some(k) = coord else {
            return Some(Reading::Coordinator(None, Vec::new()));
        };
        let v = c.add(&key::alive(k), 0).await.ok()?;
        let values = vec![(k, (v > 0).then(|| v.to_string().into_bytes()))];
        return Some(Reading::Coordinator(Some(k), values));
    }
    if let Watch::Node0(me) = how {
        // Lost for good while frozen past the node timeout: node rank 0 said so (and why).
        let dropped = c.multi_get_now(&[key::dropped(me).as_str()]).await.ok()?;
        if let Some(why) = dropped.first().and_then(|v| dropped_reason(me, v)) {
            return Some(Reading::Dropped(why));
        }
        // ADD 0 reads without waiting; 0 or less: not started, or left.
        let v = c.add(&key::alive(0), 0).await.ok()?;
        let values = vec![(0, (v > 0).then(|| v.to_string().into_bytes()))];
        return Some(Reading::Counters(values));
    }
    if let Watch::Fenced(me) = how {
        let v = c.multi_get_now(&[key::COORD_LEASE]).await.ok()?;
        let holder: Option<u32> = v
            .first()
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok());
        if let Some(other) = holder.filter(|h| *h != me) {
            return Some(Reading::Deposed(other));
        }
    }
    let stale = c.sweep(key::ALIVE_PREFIX).await.ok()?;
    let stale = stale
        .iter()
        .filter_map(|k| k.strip_prefix(key::ALIVE_PREFIX)?.parse().ok())
        .collect();
    Some(Reading::Stale(stale))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(8);
    const P: Duration = Duration::from_secs(1);

    fn counter(n: i64) -> Option<Vec<u8>> {
        Some(n.to_string().into_bytes())
    }

    #[test]
    fn a_node_dropped_by_node_rank_0_leaves_saying_why_and_one_not_dropped_stays() {
        assert_eq!(dropped_reason(1, b""), None);
        let why = dropped_reason(1, b"node 1 was lost: its agent gave no sign of life for 3s");
        assert_eq!(
            why.as_deref(),
            Some("node 1 was dropped from the job: node 1 was lost: its agent gave no sign of life for 3s; it woke since and leaves the job, to be requeued")
        );
    }

    #[test]
    fn a_moving_counter_is_never_silent() {
        let t0 = Instant::now();
        let mut l = Liveness::new(T, P);
        for i in 0..100u32 {
            l.wake(t0 + P * i);
            assert_eq!(l.silent(), None);
            l.asked();
            l.answered([(1, counter(i as i64 + 1))]);
        }
    }

    #[test]
    fn a_frozen_node_is_silent_after_the_timeout_of_running_time() {
        let t0 = Instant::now();
        let mut l = Liveness::new(T, P);
        l.wake(t0);
        l.answered([(1, counter(5))]);
        for i in 1..8u32 {
            l.wake(t0 + P * i);
            l.asked();
            l.answered([(1, counter(5))]);
            assert_eq!(l.silent(), None, "{i}s");
        }
        l.wake(t0 + P * 8);
        assert_eq!(l.silent(), Some(Silent::Node(1, T)));
    }

    #[test]
    fn a_watcher_that_was_stopped_counts_one_period_for_the_gap() {
        let t0 = Instant::now();
        let mut l = Liveness::new(T, P);
        l.wake(t0);
        l.answered([(1, counter(5))]);
        // The whole job was stopped for an hour; on waking, nobody is to blame yet.
        l.wake(t0 + Duration::from_secs(3600));
        assert_eq!(l.silent(), None);
        l.asked();
        l.answered([(1, counter(6))]);
        l.wake(t0 + Duration::from_secs(3601));
        assert_eq!(l.silent(), None);
    }

    #[test]
    fn an_unanswered_read_blames_the_store() {
        let t0 = Instant::now();
        let mut l = Liveness::new(T, P);
        l.wake(t0);
        l.answered([(0, counter(1))]);
        l.asked();
        for i in 1..=8u32 {
            l.wake(t0 + P * i);
        }
        assert_eq!(l.silent(), Some(Silent::Store(T)));
    }

    #[test]
    fn a_node_the_sweeps_find_stale_for_the_timeout_is_silent_and_a_renewal_clears_it() {
        let t0 = Instant::now();
        let mut l = Liveness::new(T, P);
        let watched = [1, 2, 3];
        let stale = |s: &[u32]| s.iter().copied().collect::<BTreeSet<u32>>();
        l.wake(t0);
        l.swept(&watched, &stale(&[]));
        for i in 1..8u32 {
            l.wake(t0 + P * i);
            l.asked();
            // Node 2 renews only in the 4th period; node 3 never again.
            let s = if i == 4 { stale(&[3]) } else { stale(&[2, 3]) };
            l.swept(&watched, &s);
            assert_eq!(l.silent(), None, "{i}s");
        }
        l.wake(t0 + P * 8);
        assert_eq!(l.silent(), Some(Silent::Node(3, T)));
        l.forget(3);
        // Node 2 went quiet after period 4: silent 4 periods later than node 3.
        for i in 9..12u32 {
            l.wake(t0 + P * i);
            l.swept(&[1, 2], &stale(&[2]));
            assert_eq!(l.silent(), None, "{i}s");
        }
        l.wake(t0 + P * 12);
        assert_eq!(l.silent(), Some(Silent::Node(2, T)));
    }

    #[test]
    fn a_node_that_left_or_never_started_is_not_watched() {
        let t0 = Instant::now();
        let mut l = Liveness::new(T, P);
        l.wake(t0);
        l.answered([(1, counter(3)), (2, None)]);
        l.answered([(1, None)]);
        for i in 1..=20u32 {
            l.wake(t0 + P * i);
        }
        assert_eq!(l.silent(), None);
    }
}

//! Hang detection and calculated timeouts, as plain functions over plain data.
//!
//! A [`RankMonitor`] follows one rank's heartbeats and sections and says when it would be hung
//! ([`RankMonitor::deadline`]); it also records what it observed (longest initial delay, heartbeat
//! gap, section durations, out-of-section time) so [`calculate`] can set timeouts from them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use vigil_events::log::{is_checkpoint_section, MAX_SECTION_RECORDS};
use vigil_ipc::RankMsg;

use crate::values::{err, ConfigError};

/// Heartbeats every rank must have sent before vigil calculates timeouts on its own (flags mode;
/// NVRx waits for >16 steps in its examples).
pub const AUTO_MIN_STEPS: u32 = 16;
/// Heartbeats every rank must have sent before heartbeat timeouts can be calculated on request:
/// the first gives the initial delay, the second the first gap (as NVRx's calculator needs).
pub const CALC_MIN_STEPS: u32 = 2;
/// No calculated timeout is shorter than this: a rank's ordinary jitter (GC, page faults) must not
/// look like a hang because its steps happened to be short while it was observed.
pub const CALC_FLOOR: Duration = Duration::from_secs(1);
/// Distinct section names whose durations are kept per rank: a job that names sections after
/// data (a step number, a file) would otherwise make every calculation, merge and timeouts
/// message grow without end. As many as one timeouts message to the ranks carries; names with a
/// timeout in force are kept past it.
pub const MAX_SECTION_NAMES: usize = vigil_ipc::MAX_SECTIONS;

/// The least initial timeout a calculation turns on where none was in force (NVRx's `null`).
///
/// The initial timeout covers a rank's start: the interpreter, imports, data, compilation and the
/// rendezvous with every other rank, all slower on a loaded node, a cold file cache or beside a
/// slow peer. One quick start says little about the next, and a false hang there costs a whole
/// attempt, so a calculation never lowers the initial timeout in force (the configured one, to
/// begin with): it can only raise it, after a slow start was seen.
pub const INITIAL_CALC_FLOOR: Duration = Duration::from_secs(60);

/// The timeouts in force, and which one a hung rank ran past: records of the event log and the
/// state file, so the schema crate's.
pub use vigil_events::log::{HangKind, Timeouts};

/// Per-section timeouts, and the `warmup` one.
pub type SectionTimeouts = (BTreeMap<String, Duration>, Option<Duration>);

/// Parses `step=60,checkpointing=600,warmup=900` (seconds; `:` works as well as `=`).
/// Returns the per-section timeouts and the `warmup` one.
pub fn parse_section_timeouts(s: &str) -> Result<SectionTimeouts, ConfigError> {
    let mut sections = BTreeMap::new();
    let mut warmup = None;
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((name, secs)) = part.split_once(['=', ':']) else {
            return err(format!(
                "--section-timeouts {s:?}: expected NAME=SECONDS pairs such as step=60,checkpointing=600"
            ));
        };
        let name = name.trim();
        let secs: f64 = secs.trim().parse().map_err(|_| {
            ConfigError(format!("--section-timeouts {s:?}: {secs:?} is not a number of seconds for section {name:?}"))
        })?;
        if !(secs.is_finite() && secs > 0.0 && secs <= crate::values::MAX_SECONDS)
            || name.is_empty()
            || name.len() > 255
        {
            return err(format!(
                "--section-timeouts {s:?}: {name:?}={secs}: give a section name and a positive number of seconds up to a year"
            ));
        }
        if name == "warmup" {
            warmup = Some(Duration::from_secs_f64(secs));
        } else {
            sections.insert(name.to_string(), Duration::from_secs_f64(secs));
        }
    }
    Ok((sections, warmup))
}

/// A deadline and what passing it means: the timeout, how long it is, and since when it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub at: Instant,
    pub kind: HangKind,
    pub limit: Duration,
    pub since: Instant,
}

/// What one rank was seen to need, for calculating timeouts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    pub initial: Option<Duration>,
    pub heartbeat: Option<Duration>,
    pub sections: BTreeMap<String, Duration>,
    pub out_of_section: Option<Duration>,
    pub steps: u32,
    /// Opened a section before any heartbeat and has sent none since: watched through sections
    /// alone.
    pub sections_only: bool,
}

fn max_opt(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

impl Observed {
    /// The maximum over ranks; `steps` is the minimum, since every rank must be past warm-up.
    pub fn merge(&self, o: &Observed) -> Observed {
        let mut sections = self.sections.clone();
        for (k, v) in &o.sections {
            let e = sections.entry(k.clone()).or_default();
            *e = (*e).max(*v);
        }
        Observed {
            initial: max_opt(self.initial, o.initial),
            heartbeat: max_opt(self.heartbeat, o.heartbeat),
            sections,
            out_of_section: max_opt(self.out_of_section, o.out_of_section),
            steps: self.steps.min(o.steps),
            sections_only: self.sections_only && o.sections_only,
        }
    }

    /// Whether vigil calculates `configured` on its own (flags mode): every rank sent
    /// [`AUTO_MIN_STEPS`] heartbeats (unless every rank is watched through sections alone), and
    /// every section that has a timeout was seen closed at least once.
    pub fn ready_for(&self, configured: &Timeouts) -> bool {
        (self.sections_only || self.steps >= AUTO_MIN_STEPS)
            && configured
                .sections
                .keys()
                .all(|s| self.sections.contains_key(s))
    }

    /// `ready_for` of the ranks' merge, without merging: its cost grows with the configured
    /// sections, not with the names the ranks used.
    pub fn all_ready_for(ranks: &[&Observed], configured: &Timeouts) -> bool {
        let sections_only = !ranks.is_empty() && ranks.iter().all(|o| o.sections_only);
        let steps = ranks.iter().map(|o| o.steps).min().unwrap_or(0);
        (sections_only || steps >= AUTO_MIN_STEPS)
            && configured
                .sections
                .keys()
                .all(|s| ranks.iter().any(|o| o.sections.contains_key(s)))
    }
}

/// Which timeouts a job asked to have calculated (NVRx's `calculate_and_set_hb_timeouts` and
/// `calculate_and_set_section_timeouts`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CalcRequest {
    pub heartbeat: bool,
    pub out_of_section: bool,
    pub all_sections: bool,
    pub sections: Vec<String>,
}

impl CalcRequest {
    /// Both requests at once: what either asked for.
    pub fn union(&self, o: &CalcRequest) -> CalcRequest {
        let mut sections = self.sections.clone();
        for s in &o.sections {
            if !sections.contains(s) {
                sections.push(s.clone());
            }
        }
        CalcRequest {
            heartbeat: self.heartbeat || o.heartbeat,
            out_of_section: self.out_of_section || o.out_of_section,
            all_sections: self.all_sections || o.all_sections,
            sections,
        }
    }

    fn wants_sections(&self) -> bool {
        self.all_sections || !self.sections.is_empty()
    }
}

/// Which of the asked-for timeouts could be calculated (enough was observed) and were set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Calculated {
    pub heartbeat: bool,
    pub sections: bool,
    pub out_of_section: bool,
}

/// The timeouts after a calculation the job asked for: each asked-for timeout that was observed
/// becomes `factor` times the longest observed (see [`calculate`]), whether it was configured,
/// disabled (`null`) or not; everything else stays as in `current`. A heartbeat calculation needs
/// every rank's first heartbeat and one gap after it; a section calculation needs every named
/// section observed (`all_sections`: those observed) and, when asked with it, an out-of-section
/// observation: sections and out-of-section are set together or not at all.
pub fn calculate_requested(
    current: &Timeouts,
    obs: &Observed,
    previous: Option<&Timeouts>,
    factor: f64,
    req: &CalcRequest,
) -> (Timeouts, Calculated) {
    let mut done = Calculated::default();
    let mut wanted = Timeouts {
        warmup: current.warmup,
        ..Timeouts::default()
    };
    if req.heartbeat
        && obs.steps >= CALC_MIN_STEPS
        && obs.initial.is_some()
        && obs.heartbeat.is_some()
    {
        done.heartbeat = true;
        // Never below the initial timeout in force: `calculate` keeps the larger.
        wanted.initial = Some(current.initial.unwrap_or(INITIAL_CALC_FLOOR));
        wanted.heartbeat = Some(Duration::MAX);
    }
    // As NVRx's calculator: the sections and the out-of-section timeout asked for together are
    // set together, or not at all.
    if req.wants_sections() || req.out_of_section {
        let names: Vec<&String> = if req.all_sections {
            obs.sections.keys().collect()
        } else {
            req.sections.iter().collect()
        };
        let sections_ok = names.iter().all(|n| obs.sections.contains_key(*n));
        let oos_ok = !req.out_of_section || obs.out_of_section.is_some();
        if sections_ok && oos_ok {
            done.sections = req.wants_sections();
            done.out_of_section = req.out_of_section;
            for n in names {
                wanted.sections.insert(n.clone(), Duration::MAX);
            }
            if req.out_of_section {
                wanted.out_of_section = Some(Duration::MAX);
            }
        }
    }
    let fresh = calculate(&wanted, obs, previous, factor);
    let mut next = current.clone();
    if done.heartbeat {
        next.initial = fresh.initial;
        next.heartbeat = fresh.heartbeat;
    }
    next.sections.extend(fresh.sections);
    if done.out_of_section {
        next.out_of_section = fresh.out_of_section;
    }
    (next, done)
}

/// New timeouts from observations: `factor` times the longest observed, averaged with the previous
/// calculated value when there is one, never below [`CALC_FLOOR`]; the initial timeout never below
/// the one in `current` (see [`INITIAL_CALC_FLOOR`]). Only checks that are enabled in `current` are
/// calculated; the others stay as they are.
pub fn calculate(
    current: &Timeouts,
    obs: &Observed,
    previous: Option<&Timeouts>,
    factor: f64,
) -> Timeouts {
    let calc = |enabled: Option<Duration>, seen: Option<Duration>, prev: Option<Duration>| {
        let (Some(_), Some(seen)) = (enabled, seen) else {
            return enabled;
        };
        let fresh = seen.mul_f64(factor).max(CALC_FLOOR);
        Some(match prev {
            Some(p) => (fresh + p) / 2,
            None => fresh,
        })
    };
    let mut sections = current.sections.clone();
    for (name, t) in sections.iter_mut() {
        if let Some(v) = calc(
            Some(*t),
            obs.sections.get(name).copied(),
            previous.and_then(|p| p.sections.get(name).copied()),
        ) {
            *t = v;
        }
    }
    Timeouts {
        initial: calc(
            current.initial,
            obs.initial,
            previous.and_then(|p| p.initial),
        )
        .map(|t| t.max(current.initial.unwrap_or_default())),
        heartbeat: calc(
            current.heartbeat,
            obs.heartbeat,
            previous.and_then(|p| p.heartbeat),
        ),
        sections,
        out_of_section: calc(
            current.out_of_section,
            obs.out_of_section,
            previous.and_then(|p| p.out_of_section),
        ),
        warmup: current.warmup,
    }
}

/// One rank's liveness, from its start.
#[derive(Debug, Clone)]
pub struct RankMonitor {
    started: Instant,
    registered: bool,
    last_heartbeat: Option<Instant>,
    section: Option<(String, Instant)>,
    /// When the rank last left a section (or registered): out-of-section time runs from here.
    out_since: Option<Instant>,
    finished: bool,
    /// Registered, then closed its connection: monitoring pauses until it registers again.
    disconnected: bool,
    /// Opened a section before any heartbeat: a sections-only rank, which no heartbeat check
    /// applies to until it sends one.
    sections_only: bool,
    /// What it does no longer counts as what it needs (it, or a rank of its attempt, was hung).
    frozen: bool,
    /// It closed a section whose name found no room under [`MAX_SECTION_NAMES`].
    names_capped: bool,
    /// Checkpoint sections it closed that were given to be recorded (at most
    /// [`MAX_SECTION_RECORDS`]).
    saves_recorded: u32,
    pub observed: Observed,
}

/// A checkpoint section a rank closed ([`is_checkpoint_section`]), for its `section` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Save {
    pub name: String,
    pub took: Duration,
    /// The rank's last one recorded in this attempt ([`MAX_SECTION_RECORDS`]).
    pub last: bool,
}

impl RankMonitor {
    pub fn new(started: Instant) -> Self {
        RankMonitor {
            started,
            registered: false,
            last_heartbeat: None,
            section: None,
            out_since: None,
            finished: false,
            disconnected: false,
            sections_only: false,
            frozen: false,
            names_capped: false,
            saves_recorded: 0,
            observed: Observed::default(),
        }
    }

    pub fn registered(&self) -> bool {
        self.registered
    }

    /// When its last heartbeat came (`None`: none yet).
    pub fn last_heartbeat(&self) -> Option<Instant> {
        self.last_heartbeat
    }

    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Registered and still connected: it speaks to the agent now.
    pub fn watched(&self) -> bool {
        self.registered && !self.disconnected
    }

    /// A new generation of its attempt began (an in-process restart, docs/inprocess.md): the
    /// rank starts over as at its start (the initial timeout runs again from `now`) on the same
    /// connection, so it stays registered; what it was seen to need is kept.
    pub fn new_generation(&mut self, now: Instant) {
        self.started = now;
        self.last_heartbeat = None;
        self.section = None;
        self.out_since = None;
        self.sections_only = false;
    }

    /// The section it is in, if any.
    pub fn section_name(&self) -> Option<&str> {
        self.section.as_ref().map(|(n, _)| n.as_str())
    }

    /// When it last said anything the monitor keeps (a heartbeat, a section opened or closed,
    /// its registration), or its start: when its silence began.
    pub fn last_heard(&self) -> Instant {
        [
            self.last_heartbeat,
            self.section.as_ref().map(|(_, at)| *at),
            self.out_since,
        ]
        .into_iter()
        .flatten()
        .fold(self.started, Instant::max)
    }

    /// Stops learning from this rank: a hang's gap, or the time the attempt spent being stopped
    /// after it, says nothing about what the job needs.
    pub fn freeze(&mut self) {
        self.frozen = true;
    }

    /// Counts the time since the rank left its last section as out-of-section time, when no
    /// section is open: asked for a calculation between sections, the current stretch may be the
    /// longest (NVRx does the same).
    pub fn bump_out_of_section(&mut self, now: Instant) {
        if self.frozen || self.section.is_some() {
            return;
        }
        if let Some(out) = self.out_since {
            let d = now.saturating_duration_since(out);
            self.observed.out_of_section = max_opt(self.observed.out_of_section, Some(d));
        }
    }

    /// Whether a section name was dropped under [`MAX_SECTION_NAMES`] (said once per rank).
    pub fn names_capped(&self) -> bool {
        self.names_capped
    }

    pub fn on_msg(&mut self, now: Instant, msg: &RankMsg) -> Option<Save> {
        self.on_msg_keeping(now, msg, &BTreeMap::new())
    }

    /// As [`Self::on_msg`]; the names in `timed` (the timeouts in force) are kept past the cap.
    /// Costs the same whatever the number of names seen: no copy of what was observed. Returns
    /// the checkpoint section the message closed, if one is to be recorded.
    pub fn on_msg_keeping(
        &mut self,
        now: Instant,
        msg: &RankMsg,
        timed: &BTreeMap<String, Duration>,
    ) -> Option<Save> {
        let learn = !self.frozen;
        let mut closed = None;
        match msg {
            RankMsg::Register { .. } => {
                if !self.registered {
                    self.registered = true;
                    self.out_since = Some(now);
                } else if self.disconnected {
                    // Back after closing on purpose: every window starts afresh.
                    self.disconnected = false;
                    self.section = None;
                    self.out_since = Some(now);
                    if self.last_heartbeat.is_some() {
                        self.last_heartbeat = Some(now);
                    }
                }
            }
            RankMsg::Heartbeat { .. } => {
                if learn {
                    let o = &mut self.observed;
                    match self.last_heartbeat {
                        None => {
                            let d = now.saturating_duration_since(self.started);
                            o.initial = max_opt(o.initial, Some(d));
                        }
                        Some(last) => {
                            let d = now.saturating_duration_since(last);
                            o.heartbeat = max_opt(o.heartbeat, Some(d));
                        }
                    }
                    o.steps = o.steps.saturating_add(1);
                    // It heartbeats after all: calculation waits for its heartbeats too.
                    o.sections_only = false;
                }
                self.last_heartbeat = Some(now);
            }
            RankMsg::SectionStart { name } => {
                closed = self.end_section(now, timed);
                if let Some(out) = self.out_since.take() {
                    if learn {
                        let d = now.saturating_duration_since(out);
                        let o = &mut self.observed;
                        o.out_of_section = max_opt(o.out_of_section, Some(d));
                    }
                }
                if self.last_heartbeat.is_none() {
                    self.sections_only = true;
                    if learn {
                        self.observed.sections_only = true;
                    }
                }
                self.section = Some((name.clone(), now));
            }
            RankMsg::SectionEnd { name } => {
                if self.section.as_ref().is_some_and(|(open, _)| open == name) {
                    closed = self.end_section(now, timed);
                }
            }
            RankMsg::EndAllSections => closed = self.end_section(now, timed),
            RankMsg::Finished => self.finished = true,
            RankMsg::StepTiming { .. }
            | RankMsg::CalculateTimeouts { .. }
            | RankMsg::Progress { .. }
            | RankMsg::HoldsSignals { .. }
            | RankMsg::Signalled { .. }
            | RankMsg::Restartable { .. }
            | RankMsg::Raised { .. }
            | RankMsg::WorkloadControl { .. } => {}
        }
        closed
    }

    pub fn on_disconnect(&mut self) {
        if self.registered {
            self.disconnected = true;
        }
    }

    fn end_section(&mut self, now: Instant, timed: &BTreeMap<String, Duration>) -> Option<Save> {
        let (name, since) = self.section.take()?;
        self.out_since = Some(now);
        let d = now.saturating_duration_since(since);
        // Recorded whether or not it is learnt from: a save of a frozen rank still took its time.
        let save = (is_checkpoint_section(&name) && self.saves_recorded < MAX_SECTION_RECORDS)
            .then(|| {
                self.saves_recorded += 1;
                Save {
                    name: name.clone(),
                    took: d,
                    last: self.saves_recorded == MAX_SECTION_RECORDS,
                }
            });
        if self.frozen {
            return save;
        }
        let sections = &mut self.observed.sections;
        if let Some(e) = sections.get_mut(&name) {
            *e = (*e).max(d);
        } else if sections.len() < MAX_SECTION_NAMES || timed.contains_key(&name) {
            sections.insert(name, d);
        } else {
            self.names_capped = true;
        }
        save
    }

    /// The earliest moment this rank counts as hung under `t`, if any check applies.
    pub fn deadline(&self, t: &Timeouts, warmup_steps: u32) -> Option<Due> {
        if self.finished || self.disconnected {
            return None;
        }
        let mut best: Option<Due> = None;
        let mut offer = |since: Instant, limit: Option<Duration>, kind: HangKind| {
            if let Some(limit) = limit {
                let at = since + limit;
                if best.as_ref().is_none_or(|b| at < b.at) {
                    best = Some(Due {
                        at,
                        kind,
                        limit,
                        since,
                    });
                }
            }
        };
        match self.last_heartbeat {
            // A rank that monitors itself with sections alone never heartbeats.
            None if self.sections_only => {}
            None => offer(self.started, t.initial, HangKind::Initial),
            Some(last) => offer(last, t.heartbeat, HangKind::Heartbeat),
        }
        match &self.section {
            Some((name, since)) => {
                let in_warmup = self.observed.steps < warmup_steps && t.warmup.is_some();
                let limit = if in_warmup {
                    t.warmup
                } else {
                    t.sections.get(name).copied()
                };
                offer(*since, limit, HangKind::Section(name.clone()));
            }
            None => {
                if let Some(out) = self.out_since {
                    offer(out, t.out_of_section, HangKind::OutOfSection);
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    fn hb() -> RankMsg {
        RankMsg::Heartbeat { step: None }
    }

    fn reg() -> RankMsg {
        RankMsg::Register {
            rank: 0,
            local_rank: 0,
            pid: 1,
            attempt: 0,
        }
    }

    fn start(n: &str) -> RankMsg {
        RankMsg::SectionStart { name: n.into() }
    }

    fn end(n: &str) -> RankMsg {
        RankMsg::SectionEnd { name: n.into() }
    }

    #[test]
    fn initial_then_heartbeat_deadlines() {
        let t0 = Instant::now();
        let t = Timeouts {
            initial: Some(s(100)),
            heartbeat: Some(s(10)),
            ..Default::default()
        };
        let mut m = RankMonitor::new(t0);
        let d = m.deadline(&t, 0).unwrap();
        assert_eq!((d.at, d.kind), (t0 + s(100), HangKind::Initial));
        m.on_msg(t0 + s(3), &reg());
        assert_eq!(
            m.deadline(&t, 0).unwrap().at,
            t0 + s(100),
            "registering is not a heartbeat"
        );
        m.on_msg(t0 + s(5), &hb());
        let d = m.deadline(&t, 0).unwrap();
        assert_eq!((d.at, d.kind), (t0 + s(15), HangKind::Heartbeat));
        m.on_msg(t0 + s(12), &RankMsg::Finished);
        assert_eq!(m.deadline(&t, 0), None);
    }

    #[test]
    fn sections_warmup_and_out_of_section() {
        let t0 = Instant::now();
        let t = Timeouts {
            sections: [("step".to_string(), s(20))].into(),
            out_of_section: Some(s(7)),
            warmup: Some(s(300)),
            ..Default::default()
        };
        let mut m = RankMonitor::new(t0);
        assert_eq!(
            m.deadline(&t, 2),
            None,
            "nothing applies before registration"
        );
        m.on_msg(t0, &reg());
        assert_eq!(m.deadline(&t, 2).unwrap().kind, HangKind::OutOfSection);
        m.on_msg(t0 + s(1), &start("step"));
        let d = m.deadline(&t, 2).unwrap();
        assert_eq!((d.at, d.limit), (t0 + s(301), s(300)), "warm-up override");
        m.on_msg(t0 + s(2), &hb());
        m.on_msg(t0 + s(3), &hb());
        let d = m.deadline(&t, 2).unwrap();
        assert_eq!(
            (d.at, d.kind),
            (t0 + s(21), HangKind::Section("step".into()))
        );
        m.on_msg(t0 + s(4), &end("step"));
        assert_eq!(m.deadline(&t, 2).unwrap().at, t0 + s(11));
        m.on_msg(t0 + s(5), &start("eval"));
        assert_eq!(
            m.deadline(&t, 2),
            None,
            "a section without a timeout has no deadline"
        );
    }

    #[test]
    fn observes_maxima_and_readiness() {
        let t0 = Instant::now();
        let mut m = RankMonitor::new(t0);
        m.on_msg(t0, &reg());
        m.on_msg(t0 + s(4), &hb());
        let mut now = t0 + s(4);
        for i in 0..AUTO_MIN_STEPS {
            now += if i == 3 { s(9) } else { s(1) };
            m.on_msg(now, &start("step"));
            m.on_msg(now + s(i as u64 % 3), &end("step"));
            m.on_msg(now, &hb());
        }
        assert_eq!(m.observed.initial, Some(s(4)));
        assert_eq!(m.observed.heartbeat, Some(s(9)));
        assert_eq!(m.observed.sections["step"], s(2));
        // Calculation waits for the sections the job configured, whatever they are called.
        let configured = Timeouts {
            sections: [
                ("step".to_string(), s(60)),
                ("checkpoint".to_string(), s(600)),
            ]
            .into(),
            ..Default::default()
        };
        assert!(!m.observed.ready_for(&configured), "no checkpoint yet");
        m.on_msg(now, &start("checkpoint"));
        m.on_msg(now + s(30), &end("checkpoint"));
        assert!(m.observed.ready_for(&configured));
        // Across ranks: the same verdict as on their merge.
        let other = Observed {
            steps: AUTO_MIN_STEPS - 1,
            ..Default::default()
        };
        let merged = m.observed.merge(&other);
        assert!(!merged.ready_for(&configured));
        assert!(!Observed::all_ready_for(
            &[&m.observed, &other],
            &configured
        ));
        let other = Observed {
            steps: AUTO_MIN_STEPS,
            ..Default::default()
        };
        assert!(m.observed.merge(&other).ready_for(&configured));
        assert!(Observed::all_ready_for(&[&m.observed, &other], &configured));
        assert!(!Observed::all_ready_for(&[], &configured));
    }

    #[test]
    fn sections_only_rank_has_no_heartbeat_deadline_and_is_ready_without_heartbeats() {
        let t0 = Instant::now();
        let t = Timeouts {
            initial: Some(s(2)),
            heartbeat: Some(s(2)),
            sections: [("step".to_string(), s(60))].into(),
            ..Default::default()
        };
        let mut m = RankMonitor::new(t0);
        m.on_msg(t0, &reg());
        m.on_msg(t0 + s(1), &start("step"));
        let d = m.deadline(&t, 0).unwrap();
        assert_eq!(d.kind, HangKind::Section("step".into()));
        m.on_msg(t0 + s(5), &end("step"));
        assert!(
            m.observed.ready_for(&t),
            "a sections-only rank waits for no heartbeat"
        );
        m.on_msg(t0 + s(6), &hb());
        assert_eq!(m.deadline(&t, 0).unwrap().kind, HangKind::Heartbeat);
        assert!(
            !m.observed.ready_for(&t),
            "once it heartbeats, calculation waits for its heartbeats"
        );
    }

    #[test]
    fn requested_calculation_enables_disabled_checks_and_keeps_the_rest() {
        let cur = Timeouts {
            sections: [("step".to_string(), s(10))].into(),
            out_of_section: Some(s(30)),
            ..Default::default()
        };
        let obs = Observed {
            initial: Some(s(3)),
            heartbeat: Some(s(2)),
            sections: [("step".to_string(), s(1)), ("checkpoint".to_string(), s(4))].into(),
            out_of_section: None,
            steps: 2,
            sections_only: false,
        };
        let hb = CalcRequest {
            heartbeat: true,
            ..Default::default()
        };
        let (next, done) = calculate_requested(&cur, &obs, None, 5.0, &hb);
        assert!(done.heartbeat && !done.sections && !done.out_of_section);
        // 5 x 3 s of start would be 15 s: one quick start is no floor for the next.
        assert_eq!(
            (next.initial, next.heartbeat),
            (Some(INITIAL_CALC_FLOOR), Some(s(10)))
        );
        let slow_start = Observed {
            initial: Some(s(30)),
            ..obs.clone()
        };
        let (next, _) = calculate_requested(&cur, &slow_start, None, 5.0, &hb);
        assert_eq!(next.initial, Some(s(150)), "a slow start raises it");
        let configured = Timeouts {
            initial: Some(s(1800)),
            ..cur.clone()
        };
        let (next, _) = calculate_requested(&configured, &slow_start, None, 5.0, &hb);
        assert_eq!(next.initial, Some(s(1800)), "never below the one in force");
        assert_eq!(next.sections, cur.sections, "sections were not asked for");
        let too_early = Observed {
            steps: 1,
            ..obs.clone()
        };
        let (same, done) = calculate_requested(&cur, &too_early, None, 5.0, &hb);
        assert_eq!((same, done), (cur.clone(), Calculated::default()));
        // Sections and out-of-section asked together are set together: no out-of-section yet.
        let sec = CalcRequest {
            out_of_section: true,
            sections: vec!["checkpoint".into()],
            ..Default::default()
        };
        assert_eq!(
            calculate_requested(&cur, &obs, None, 5.0, &sec),
            (cur.clone(), Calculated::default())
        );
        let with_oos = Observed {
            out_of_section: Some(s(2)),
            ..obs.clone()
        };
        let (next, done) = calculate_requested(&cur, &with_oos, None, 5.0, &sec);
        assert!(done.sections && done.out_of_section && !done.heartbeat);
        assert_eq!(next.sections["checkpoint"], s(20));
        assert_eq!(next.sections["step"], s(10), "not selected");
        assert_eq!(next.out_of_section, Some(s(10)));
        let all = CalcRequest {
            all_sections: true,
            ..Default::default()
        };
        let (next, _) = calculate_requested(&cur, &obs, None, 5.0, &all);
        assert_eq!(
            (next.sections["step"], next.sections["checkpoint"]),
            (s(5), s(20))
        );
    }

    #[test]
    fn section_names_are_capped_except_timed_ones() {
        let t0 = Instant::now();
        let mut m = RankMonitor::new(t0);
        m.on_msg(t0, &reg());
        for i in 0..MAX_SECTION_NAMES + 5 {
            let n = format!("s{i}");
            m.on_msg(t0, &start(&n));
            m.on_msg(t0 + s(1), &end(&n));
            assert_eq!(m.names_capped(), i >= MAX_SECTION_NAMES, "{i}");
        }
        assert_eq!(m.observed.sections.len(), MAX_SECTION_NAMES);
        // A name already kept still learns; a name with a timeout in force is kept past the cap.
        m.on_msg(t0 + s(1), &start("s0"));
        m.on_msg(t0 + s(9), &end("s0"));
        assert_eq!(m.observed.sections["s0"], s(8));
        let timed = [("checkpoint".to_string(), s(600))].into();
        m.on_msg_keeping(t0, &start("checkpoint"), &timed);
        m.on_msg_keeping(t0 + s(3), &end("checkpoint"), &timed);
        assert_eq!(m.observed.sections["checkpoint"], s(3));
        assert_eq!(m.observed.sections.len(), MAX_SECTION_NAMES + 1);
    }

    #[test]
    fn closed_checkpoint_sections_are_given_for_their_record_up_to_the_cap() {
        let t0 = Instant::now();
        let mut m = RankMonitor::new(t0);
        m.on_msg(t0, &reg());
        assert_eq!(m.on_msg(t0, &start("step")), None);
        // Opening a checkpoint section closes `step`, which is not recorded.
        assert_eq!(m.on_msg(t0 + s(1), &start("checkpointing")), None);
        // A close under another name leaves it open.
        assert_eq!(m.on_msg(t0 + s(2), &end("step")), None);
        let save = m.on_msg(t0 + s(4), &end("checkpointing")).unwrap();
        assert_eq!(
            (save.name.as_str(), save.took, save.last),
            ("checkpointing", s(3), false)
        );
        // Closed by the next section's start, and by "end all"; a frozen rank's save still counts.
        m.on_msg(t0 + s(5), &start("async_checkpoint"));
        assert_eq!(m.on_msg(t0 + s(7), &start("step")).unwrap().took, s(2));
        m.freeze();
        m.on_msg(t0 + s(8), &start("checkpointing"));
        assert_eq!(
            m.on_msg(t0 + s(9), &RankMsg::EndAllSections).unwrap().took,
            s(1)
        );
        let mut t = t0 + s(10);
        let mut last = None;
        for _ in 3..MAX_SECTION_RECORDS {
            m.on_msg(t, &start("checkpointing"));
            t += s(1);
            last = m.on_msg(t, &end("checkpointing"));
            assert!(last.is_some());
        }
        assert!(
            last.unwrap().last,
            "the cap's own record says it is the last"
        );
        m.on_msg(t, &start("checkpointing"));
        assert_eq!(m.on_msg(t + s(1), &end("checkpointing")), None);
    }

    #[test]
    fn a_frozen_rank_learns_nothing() {
        let t0 = Instant::now();
        let mut m = RankMonitor::new(t0);
        m.on_msg(t0, &reg());
        m.on_msg(t0 + s(1), &hb());
        m.on_msg(t0 + s(2), &hb());
        let before = m.observed.clone();
        m.freeze();
        m.on_msg(t0 + s(5), &hb());
        m.on_msg(t0 + s(6), &start("a"));
        m.on_msg(t0 + s(7), &end("a"));
        m.bump_out_of_section(t0 + s(9));
        assert_eq!(m.observed, before, "the hang's gap is not observed");
    }

    #[test]
    fn calculation_blends_and_respects_enabled_checks() {
        let cur = Timeouts {
            heartbeat: Some(s(600)),
            sections: [("step".to_string(), s(600))].into(),
            ..Default::default()
        };
        let obs = Observed {
            initial: Some(s(50)),
            heartbeat: Some(s(4)),
            sections: [("step".to_string(), s(3))].into(),
            steps: 20,
            ..Default::default()
        };
        let c = calculate(&cur, &obs, None, 5.0);
        assert_eq!(c.heartbeat, Some(s(20)));
        assert_eq!(c.sections["step"], s(15));
        assert_eq!(c.initial, None, "a disabled check stays disabled");
        let c2 = calculate(
            &c,
            &obs,
            Some(&Timeouts {
                heartbeat: Some(s(40)),
                ..c.clone()
            }),
            5.0,
        );
        assert_eq!(c2.heartbeat, Some(s(30)));
        let tiny = Observed {
            heartbeat: Some(Duration::from_millis(10)),
            ..obs
        };
        assert_eq!(
            calculate(&cur, &tiny, None, 5.0).heartbeat,
            Some(CALC_FLOOR)
        );
    }

    #[test]
    fn a_calculated_initial_timeout_is_never_below_the_one_in_force() {
        let cur = Timeouts {
            initial: Some(s(60)),
            heartbeat: Some(s(600)),
            ..Default::default()
        };
        let quick = Observed {
            initial: Some(s(3)),
            heartbeat: Some(s(1)),
            steps: 20,
            ..Default::default()
        };
        // 5 x 3 s = 15 s would declare a start of 15 s hung (field finding 9).
        let c = calculate(&cur, &quick, None, 5.0);
        assert_eq!((c.initial, c.heartbeat), (Some(s(60)), Some(s(5))));
        let again = calculate(&c, &quick, Some(&c), 5.0);
        assert_eq!(
            again.initial,
            Some(s(60)),
            "quick starts never wear it down"
        );
        let slow = Observed {
            initial: Some(s(40)),
            ..quick.clone()
        };
        let raised = calculate(&c, &slow, Some(&c), 5.0);
        assert_eq!(
            raised.initial,
            Some(s(130)),
            "(200 + 60) / 2: a slow start raises it"
        );
        let after = calculate(&raised, &quick, Some(&raised), 5.0);
        assert_eq!(after.initial, Some(s(130)), "and it stays raised");
    }

    #[test]
    fn section_timeout_syntax() {
        let (m, w) = parse_section_timeouts("step=60, checkpointing:600,warmup=900").unwrap();
        assert_eq!(m["step"], s(60));
        assert_eq!(m["checkpointing"], s(600));
        assert_eq!(w, Some(s(900)));
        assert!(parse_section_timeouts("step").is_err());
        assert!(parse_section_timeouts("step=-1").is_err());
        assert!(parse_section_timeouts("step=abc")
            .unwrap_err()
            .0
            .contains("abc"));
    }

    #[test]
    fn state_file_round_trip() {
        let t = Timeouts {
            initial: Some(Duration::from_millis(1500)),
            heartbeat: Some(s(20)),
            sections: [("step".to_string(), s(15))].into(),
            out_of_section: None,
            warmup: None,
        };
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<Timeouts>(&text).unwrap(), t);
    }

    proptest::proptest! {
        /// The deadline is never before the moment its timeout started running.
        #[test]
        fn deadline_never_precedes_its_start(ops in proptest::collection::vec(0u8..6, 0..40), hb_s in 1u64..50, sec_s in 1u64..50) {
            let t0 = Instant::now();
            let t = Timeouts { initial: Some(s(99)), heartbeat: Some(s(hb_s)), sections: [("a".to_string(), s(sec_s))].into(), out_of_section: Some(s(5)), warmup: None };
            let mut m = RankMonitor::new(t0);
            let mut now = t0;
            for op in ops {
                now += Duration::from_millis(700);
                let msg = match op { 0 => reg(), 1 => hb(), 2 => start("a"), 3 => end("a"), 4 => RankMsg::EndAllSections, _ => start("b") };
                m.on_msg(now, &msg);
                if let Some(d) = m.deadline(&t, 0) {
                    proptest::prop_assert!(d.at >= d.since && d.at == d.since + d.limit);
                    proptest::prop_assert!(d.since <= now);
                }
            }
        }
    }
}

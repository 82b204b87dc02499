//! The event loop, as nextest's dispatcher: each source turns what happened into one
//! [`Internal`] event and nothing else ([`Sources::next`]); one handler ([`Dispatcher::handle`])
//! turns it into supervisor events, records and text; [`Dispatcher::feed`] hands those events to
//! the supervisor and carries out its actions. Nothing here decides.

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime};

use tokio::signal::unix::Signal;
use tokio::sync::mpsc;
use tokio::time::Interval;

use super::agent::Agent;
use super::allocation::{self, EndWatch};
use super::clock::JobClock;
use super::effect::Effect;
use super::eventlog;
use super::gate::{self, FromGate};
use super::gpuwatch::FromGpu;
use super::ipc_server::{FromRanks, NoticeLimit};
use super::metrics_server::{Metrics, PageRequest};
use super::output::{self, ConsoleStream};
use super::perf;
use super::proc;
use super::report::{self, console_note, note_refused};
use super::slurm_job::SignalWindow;
use super::stacks::{StackNews, StackReport};
use crate::job::exchange::FromExchange;
use crate::job::rendezvous::FromCoord;
use crate::supervise::{Action, Event, ExitKind, JobEnd, Outcome, Record, Supervisor};

/// A straggler report with its event-log line, serialised off the loop.
pub(super) type ReadyReport = (perf::Report, String);

/// Something that happened, as the loop's sources tell it.
pub(super) enum Internal {
    /// Children of the agent were reaped.
    Reaped(Vec<(i32, ExitKind)>),
    /// One of the agent's signals arrived.
    Signal(i32),
    /// The ranks' socket.
    Ipc(FromRanks),
    /// The job's coordination (rendezvous, liveness, the stop agreement).
    Coord(FromCoord),
    /// The straggler summaries shared through the store.
    Exchange(FromExchange),
    /// Node rank 0's straggler report, ready.
    StragglerReport(ReadyReport),
    /// The checks before a rendezvous.
    Gate(FromGate),
    /// The node's GPUs.
    Gpu(FromGpu),
    /// A hung rank's stacks were captured.
    Stacks {
        attempt: u32,
        local_rank: u32,
        report: StackReport,
    },
    /// A hang probe's answer (`ProbeStopped`).
    Probed {
        attempt: u32,
        stopped: Vec<u32>,
        waiting: Vec<(u32, bool)>,
    },
    /// A metrics page was asked for (`--metrics-port`).
    Page(PageRequest),
    /// The store this node hosts turned connections away (a `store_refused` record).
    StoreRefused(Record),
    /// The clock's regular tick (`clock::CLOCK_TICK`).
    Tick,
    /// The supervisor's next deadline is reached.
    Deadline,
}

/// Where events come from: signals, children, channels from the agent's tasks, the clock.
pub(super) struct Sources {
    pub(super) sigs: Vec<(Signal, i32)>,
    pub(super) sigchld: Signal,
    pub(super) ipc: mpsc::Receiver<FromRanks>,
    pub(super) coord: mpsc::UnboundedReceiver<FromCoord>,
    pub(super) exchange: mpsc::UnboundedReceiver<FromExchange>,
    pub(super) reports: mpsc::UnboundedReceiver<ReadyReport>,
    pub(super) gate: mpsc::UnboundedReceiver<FromGate>,
    pub(super) gpu: mpsc::UnboundedReceiver<FromGpu>,
    pub(super) stacks: mpsc::UnboundedReceiver<StackNews>,
    pub(super) pages: mpsc::Receiver<PageRequest>,
    pub(super) store_refused: super::store_host::RefusedRx,
    pub(super) ticker: Interval,
}

impl Sources {
    /// Waits for the next thing to happen; `deadline`: the supervisor's next, in real time.
    async fn next(&mut self, deadline: Option<Instant>) -> Internal {
        let sleep = tokio::time::sleep_until(
            deadline
                .map(tokio::time::Instant::from_std)
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600)),
        );
        tokio::select! {
            _ = self.sigchld.recv() => Internal::Reaped(proc::reap_all()),
            num = first_signal(&mut self.sigs) => Internal::Signal(num),
            Some(m) = self.ipc.recv() => Internal::Ipc(m),
            Some(m) = self.coord.recv() => Internal::Coord(m),
            Some(m) = self.exchange.recv() => Internal::Exchange(m),
            Some(r) = self.reports.recv() => Internal::StragglerReport(r),
            Some(out) = self.gate.recv() => Internal::Gate(out),
            Some(m) = self.gpu.recv() => Internal::Gpu(m),
            Some(news) = self.stacks.recv() => match news {
                StackNews::Captured(attempt, local_rank, report) => {
                    Internal::Stacks { attempt, local_rank, report }
                }
                StackNews::Probed { attempt, stopped, waiting } => {
                    Internal::Probed { attempt, stopped, waiting }
                }
            },
            Some(reply) = self.pages.recv() => Internal::Page(reply),
            Some(r) = self.store_refused.recv() => Internal::StoreRefused(r),
            _ = self.ticker.tick() => Internal::Tick,
            _ = sleep, if deadline.is_some() => Internal::Deadline,
        }
    }
}

/// Waits for the first of the agent's stop signals and returns its number.
async fn first_signal(sigs: &mut [(Signal, i32)]) -> i32 {
    std::future::poll_fn(|cx| {
        for (s, num) in sigs.iter_mut() {
            if let std::task::Poll::Ready(Some(())) = s.poll_recv(cx) {
                return std::task::Poll::Ready(*num);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// The supervisor's event for a message from the job's coordination; `None` for what concerns
/// the runtime alone (promotions, node rank 0's ledger).
pub(super) fn event_of(m: FromCoord) -> Option<Event> {
    match m {
        FromCoord::Event(ev) => Some(ev),
        FromCoord::Promoted { .. }
        | FromCoord::SparesReady { .. }
        | FromCoord::StandbyGone { .. }
        | FromCoord::HeadLost
        | FromCoord::Note(_)
        | FromCoord::Coordinating { .. }
        | FromCoord::Hosts { .. } => None,
    }
}

/// The one owner of the node's state while the loop runs: the supervisor, the effectors, the
/// job's clock and the allocation's end.
pub(super) struct Dispatcher {
    pub(super) agent: Agent,
    /// Events for the supervisor, fed to it at the top of the loop's next turn.
    pub(super) queue: VecDeque<Event>,
    pub(super) sup: Supervisor,
    pub(super) clock: JobClock,
    pub(super) endw: EndWatch,
    pub(super) signal_window: SignalWindow,
    /// Refused connections on the ranks' socket, told at most once per window.
    pub(super) refused: NoticeLimit,
    /// Where straggler reports come back once serialised off the loop.
    pub(super) report_tx: mpsc::UnboundedSender<ReadyReport>,
    /// `--metrics-port`, `--metrics-textfile`: the counters and where pages go.
    pub(super) metrics: Option<Metrics>,
    /// When the agent started: the allocation it had is from here.
    pub(super) started: SystemTime,
    /// This allocation was recorded when its stop was agreed.
    pub(super) stop_recorded: bool,
}

/// The step of a stop agreed for a SIGTERM among `actions`, if one was.
fn agreed_sigterm_stop(actions: &[Action]) -> Option<Option<u64>> {
    actions.iter().find_map(|a| match a {
        Action::Record(Record::StopAgreed { step, trigger, .. }) if trigger == "SIGTERM" => {
            Some(*step)
        }
        _ => None,
    })
}

impl Dispatcher {
    /// Runs until the supervisor gives the agent's outcome.
    pub(super) async fn run(&mut self, src: &mut Sources) {
        loop {
            let (now, suspended) = self.clock.wake();
            if let Some(away) = suspended {
                self.agent.out.events.write(&Record::Suspended {
                    seconds: away.as_secs_f64(),
                });
                console_note(&report::suspended(away));
            }
            self.feed(now);
            if self.agent.outcome.is_some() {
                return;
            }
            let deadline = self.sup.next_deadline().map(|d| self.clock.to_real(d));
            let ev = src.next(deadline).await;
            // `now` from the top of this turn: waking the clock here would hide a suspension.
            self.handle(now, ev);
            if deadline.is_some_and(|d| Instant::now() >= d) && self.queue.is_empty() {
                self.queue.push_back(Event::Tick);
            }
        }
    }

    /// Feeds the queued events to the supervisor and carries out its actions.
    pub(super) fn feed(&mut self, now: Instant) {
        while let Some(ev) = self.queue.pop_front() {
            let actions = self.sup.handle(now, ev);
            if let Some(m) = &mut self.metrics {
                m.count(&actions);
            }
            let early = !self.stop_recorded && self.agent.cfg.allocation.slurm_job_id.is_some();
            let agreed = early.then(|| agreed_sigterm_stop(&actions)).flatten();
            self.agent.execute(actions, &mut self.queue);
            if let Some(step) = agreed {
                self.record_agreed_stop(step);
            }
        }
        // An attempt that just ended here gets its last `steps` record at once.
        self.log_steps(now);
    }

    /// Under Slurm, node rank 0 records the allocation once a stop for a SIGTERM is agreed, the
    /// ranks already told: Slurm SIGKILLs the job `KillWait` later, whether or not they are done
    /// ([`allocation::record_agreed_stop`]). Once per allocation: `feed` looks for the stop only
    /// until then, and only under Slurm.
    fn record_agreed_stop(&mut self, step: Option<u64>) {
        self.stop_recorded = true;
        let outcome = Outcome::Stopped {
            trigger: "SIGTERM".into(),
            step,
        };
        if let Some(e) = super::ending::of(
            &self.agent,
            &self.sup,
            &self.endw,
            (None, self.started),
            &outcome,
        ) {
            allocation::record_agreed_stop(e);
        }
    }

    /// The `steps` record due, if any ([`perf::StepsLog::due`]).
    pub(super) fn log_steps(&mut self, now: Instant) {
        let agent = &mut self.agent;
        let step_s = agent.stragglers.step_s();
        let Some(due) = agent.steps_log.due(now, self.sup.attempt_steps(), step_s) else {
            return;
        };
        match due.at {
            Some(at) => {
                // The time the steps were reached: that long before now on the wall clock.
                let ago = now.saturating_duration_since(at);
                let ts = SystemTime::now()
                    .checked_sub(ago)
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_secs_f64());
                agent.out.events.write_value_at(due.record, ts);
            }
            None => agent.out.events.write_value(due.record),
        }
    }

    /// What one thing that happened means: events for the supervisor (queued for `feed`), and
    /// the records and text of what only the runtime sees.
    fn handle(&mut self, now: Instant, ev: Internal) {
        let queue = |d: &mut Dispatcher, ev: Event| d.queue.push_back(ev);
        match ev {
            Internal::Reaped(reaped) => {
                for (pid, how) in reaped {
                    queue(self, Event::Reaped { pid, how });
                }
            }
            Internal::Signal(signal) => {
                // Slurm's window, as it stands when the signal came (a SIGTERM far from the
                // allocation's end is no time limit's: slurm_job::SignalWindow).
                let window = self.signal_window.at(self.endw.end(), SystemTime::now());
                queue(self, Event::Signal { signal, window })
            }
            Internal::Ipc(m) => self.on_ipc(m),
            Internal::Coord(m) => self.on_coord(m),
            Internal::Exchange(m) => self.on_exchange(m),
            Internal::StragglerReport((r, line)) => {
                output::console_text(ConsoleStream::Stderr, &r.text);
                self.agent.out.events.write_line(line);
                if let Some(m) = &mut self.metrics {
                    m.on_straggler_record(&r.record);
                }
                if !r.nodes.is_empty() {
                    queue(self, Event::Stragglers { nodes: r.nodes });
                }
            }
            Internal::Gate(out) => self.apply(gate::effects(out)),
            Internal::Gpu(m) => {
                let effects = self.agent.links.gpus.effects(m, self.agent.cfg.nproc);
                self.apply(effects);
            }
            Internal::Stacks {
                attempt,
                local_rank,
                report,
            } => {
                let at = (attempt, local_rank, self.sup.placement().rank_offset);
                self.agent.on_stacks(at, report);
                if attempt == self.sup.attempt() {
                    queue(self, Event::StacksCaptured { local_rank });
                }
            }
            Internal::Probed {
                attempt,
                stopped,
                waiting,
            } => {
                if attempt == self.sup.attempt() {
                    queue(self, Event::Probed { stopped, waiting });
                }
            }
            Internal::Page(reply) => {
                if let Some(m) = &mut self.metrics {
                    let _ = reply.send(m.page(&self.sup, &self.agent.links.gpus, now, true));
                }
            }
            Internal::StoreRefused(r) => {
                if let Some(text) = super::store_host::refused_text(&r) {
                    console_note(&text);
                }
                self.agent.out.events.write(&r);
            }
            Internal::Tick => self.on_tick(now),
            Internal::Deadline => queue(self, Event::Tick),
        }
    }

    /// Carries out what the gate or the GPU watch asked for, in order.
    fn apply(&mut self, effects: Vec<Effect>) {
        for e in effects {
            match e {
                Effect::Note(line) => console_note(&line),
                Effect::Write(rec) => self.agent.out.events.write(&rec),
                Effect::Send(req) => {
                    let _ = self.agent.links.coord.send(req);
                }
                Effect::Event(ev) => self.queue.push_back(ev),
            }
        }
    }

    fn on_ipc(&mut self, m: FromRanks) {
        let current = self.sup.attempt();
        match m {
            FromRanks::Message {
                attempt,
                local_rank,
                msg,
                at,
            } if attempt == current => {
                self.agent.stragglers.on_msg(at, local_rank, &msg);
                self.queue.push_back(Event::Message { local_rank, msg });
            }
            FromRanks::Closed {
                attempt,
                local_rank,
            } if attempt == current => {
                self.queue.push_back(Event::Disconnected { local_rank });
            }
            FromRanks::Message { .. } | FromRanks::Closed { .. } => {}
            FromRanks::Rejected { peer_pid, reason } => {
                if self.refused.admit(Instant::now()) {
                    console_note(&format!(
                        "refused a connection on the ranks' socket: {reason}"
                    ));
                }
                self.agent
                    .out
                    .events
                    .write(&Record::IpcRejected { peer_pid, reason });
            }
        }
    }

    fn on_coord(&mut self, m: FromCoord) {
        let agent = &mut self.agent;
        match &m {
            FromCoord::Event(Event::Joined { .. }) => agent.stragglers.new_attempt(),
            FromCoord::Event(Event::AttemptEnded { attempt, end }) => {
                agent.trail.attempt_ends.push((*attempt, end.clone()));
                if *end != JobEnd::Done {
                    agent.trail.peer_end = Some(end.clone());
                }
            }
            FromCoord::Promoted {
                attempt,
                promotions,
            } => agent.on_promoted(*attempt, promotions),
            FromCoord::HeadLost => agent.trail.head_lost = true,
            FromCoord::SparesReady { attempt, ready } => {
                let r = Record::Spares {
                    attempt: *attempt,
                    ready: *ready,
                };
                self.runtime_record(r);
            }
            FromCoord::StandbyGone {
                node,
                reason,
                ready,
            } => {
                console_note(&format!("{reason}; standbys ready now: {ready}"));
                let r = Record::StandbyGone {
                    node: *node,
                    reason: reason.clone(),
                    ready: *ready,
                };
                self.runtime_record(r);
            }
            FromCoord::Note(note) => console_note(note),
            FromCoord::Coordinating { lost } => {
                console_note(&format!(
                    "node rank {} coordinates the job from now on: node rank {lost}'s agent, the coordinator, was lost (its lease vigil/lease/coord ended or expired)",
                    agent.cfg.node_rank
                ));
                agent.trail.coordinates = true;
            }
            FromCoord::Hosts { hosts, .. } => {
                agent.out.nvrx.set_hosts(&hosts.active, &hosts.standby)
            }
            _ => {}
        }
        if let Some(ev) = event_of(m) {
            self.queue.push_back(ev);
        }
    }

    /// A record of what only the runtime sees, written and counted for the metrics.
    fn runtime_record(&mut self, r: Record) {
        self.agent.out.events.write(&r);
        if let Some(m) = &mut self.metrics {
            m.count(&[Action::Record(r)]);
        }
    }

    fn on_exchange(&mut self, m: FromExchange) {
        match m {
            FromExchange::Collected(all) => {
                let threshold = self.agent.stragglers.threshold();
                let tx = self.report_tx.clone();
                let (host, node) = (self.agent.host.clone(), self.agent.cfg.node_rank);
                tokio::task::spawn_blocking(move || {
                    if let Some(mut r) = perf::report(threshold, &all) {
                        // 10 MB for 100,000 ranks: serialised here, not on the event loop.
                        eventlog::stamp(&mut r.record, &host, node);
                        let line = r.record.to_string();
                        let _ = tx.send((r, line));
                    }
                });
            }
            FromExchange::Trouble(why) => console_note(&format!(
                "cannot share straggler summaries through the store ({why}); reports may miss nodes until it works again"
            )),
        }
    }

    /// The clock's tick: notices held back, the allocation's end, `steps` records, straggler
    /// summaries.
    fn on_tick(&mut self, now: Instant) {
        if let Some(n) = self.refused.due(Instant::now(), false) {
            note_refused(n);
        }
        self.endw.maybe_reread();
        self.log_steps(now);
        let agent = &mut self.agent;
        let gpus = &agent.links.gpus;
        let gpu_of = |lr: u32| gpus.explain(lr);
        if let Some(s) = agent.stragglers.share_due(
            now,
            agent.cfg.node_rank,
            &agent.host,
            self.sup.placement().rank_offset,
            &gpu_of,
        ) {
            let _ = agent.links.share.send(s);
        }
        if let Some(ev) = self.endw.tick(&self.sup, now) {
            self.queue.push_back(ev);
        }
        if let Some(m) = &mut self.metrics {
            m.tick(&self.sup, &self.agent.links.gpus, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervise::Placement;

    #[test]
    fn promotions_concern_the_runtime_alone() {
        let m = FromCoord::Promoted {
            attempt: 1,
            promotions: vec![],
        };
        assert_eq!(event_of(m), None);
    }

    #[test]
    fn a_joined_attempt_keeps_its_assignment_for_the_supervisor() {
        let joined = Event::Joined {
            attempt: 2,
            placement: Placement {
                group_rank: 1,
                rank_offset: 4,
                world_size: 8,
            },
            max_restarts: 3,
            calculated: None,
        };
        let m = FromCoord::Event(joined.clone());
        assert_eq!(event_of(m), Some(joined));
    }
}

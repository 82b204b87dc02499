//! The coordinator carrying out the state machine's [`Step`]s (`carry_out`): each store
//! operation, wait and message as decided, and each read whose outcome the state machine must
//! hear of handed back to it as a [`Fact`]. Nothing here decides anything for the job.

use std::collections::VecDeque;
use std::time::Duration;

use vigil_store::StoreError;

use super::super::decide::{Fact, Patience, Step};
use super::super::lastcall;
use super::super::liveness::{dropped_reason, liveness};
use super::super::wire::*;
use super::{abort, remote_head, Coordinator};

impl Coordinator {
    /// Carries out what the state machine decided, in order ([`Step`]); a step whose outcome
    /// it must hear of (the verdict that won, the joins counted) hands that back to it, and its
    /// answer is carried out next.
    pub(super) async fn carry_out(&mut self, steps: Vec<Step>) -> Result<(), StoreError> {
        let mut todo = VecDeque::from(steps);
        while let Some(step) = todo.pop_front() {
            let then = self.carry_one(step).await?;
            for s in then.into_iter().rev() {
                todo.push_front(s);
            }
        }
        Ok(())
    }

    /// Carries out one step: what the state machine answers to what it handed back, if anything.
    async fn carry_one(&mut self, step: Step) -> Result<Vec<Step>, StoreError> {
        match step {
            Step::Set(k, v) => self.ctl.set(&k, &v).await?,
            Step::SetFirst(k, v) => {
                self.ctl.compare_set(&k, b"", &v).await?;
            }
            Step::Delete(k) => {
                self.ctl.delete_key(&k).await?;
            }
            Step::Wait(k, patience) => {
                let timeout = match patience {
                    Patience::Join => self.cfg.join_timeout,
                    Patience::Forever => Duration::MAX,
                };
                self.wait_for(k, timeout);
            }
            Step::LastCall(c) => {
                let tx = self.inbox_tx.clone();
                let t = lastcall::parked(self.ctl.clone(), self.cfg.clone(), c, tx);
                self.last_call = Some(self.tasks.spawn_local(t));
            }
            Step::WaitGeneration(attempt, generation) => {
                abort(&mut self.generation_task);
                self.spawn_generation_waiter(attempt, generation);
            }
            Step::WaitTimeouts { attempt, round } => {
                abort(&mut self.timeouts_task);
                self.spawn_timeouts_waiter(attempt, round);
            }
            Step::Tell(m) => self.send(m),
            Step::ResetStore { previous } => self.reset_store(previous).await?,
            Step::Coordinate => self.coordinate(),
            Step::StepDown => self.head = None,
            Step::Bounded(steps) => {
                let peer_timeout = self.cfg.peer_timeout;
                let steps = Box::pin(self.carry_out(steps));
                let _ = tokio::time::timeout(peer_timeout, steps).await;
            }
            Step::BestEffort(steps) => {
                let _ = tokio::time::timeout(self.cfg.peer_timeout, async {
                    for s in steps {
                        let _ = Box::pin(self.carry_out(vec![s])).await;
                    }
                })
                .await;
            }
            Step::HoldStore => self.hold_store().await,
            read => return self.read(read).await,
        }
        Ok(Vec::new())
    }

    /// Carries out a step that reads the store (or proposes, and reads the winner) and hands
    /// what it read back to the state machine: its answer.
    async fn read(&mut self, step: Step) -> Result<Vec<Step>, StoreError> {
        Ok(match step {
            Step::Propose(c, mine) => {
                let v = self.ctl.compare_set(&key::go(c), b"", &mine).await?;
                self.rdzv.step(Fact::Verdict {
                    attempt: c,
                    value: &v,
                })
            }
            Step::CountJoins(c) => {
                let joined = String::from_utf8_lossy(&self.ctl.get(&key::joined(c)).await?)
                    .parse::<usize>()
                    .unwrap_or(0);
                self.rdzv.step(Fact::JoinsCounted { attempt: c, joined })
            }
            Step::MergeTimeouts { attempt, round } => {
                let all = self
                    .every_node(|i| key::node_timeouts(attempt, round, i))
                    .await?;
                let all = &all;
                self.rdzv.step(Fact::TimeoutsRead {
                    attempt,
                    round,
                    all,
                })
            }
            Step::ChooseHung { attempt, round } => {
                let all = self
                    .every_node(|i| key::hang_report(attempt, round, i))
                    .await?;
                self.rdzv.step(Fact::HangsRead {
                    attempt,
                    round,
                    all,
                })
            }
            Step::ChooseStopStep(attempt) => {
                let all = self.every_node(|i| key::stop_steps(attempt, i)).await?;
                self.rdzv.step(Fact::StepsRead { attempt, all })
            }
            Step::Add(k, counted) => {
                let count = self.ctl.add(&k, 1).await?;
                self.rdzv.step(counted.fact(count))
            }
            Step::Join {
                attempt,
                record,
                members,
            } => self.join_record(attempt, &record, members).await?,
            Step::ReadEarlyVerdict(c) => {
                if self.ctl.check(&[&key::go(c)]).await? {
                    let value = &self.ctl.get(&key::go(c)).await?;
                    self.rdzv.step(Fact::Verdict { attempt: c, value })
                } else {
                    self.rdzv.step(Fact::NoEarlyVerdict { attempt: c })
                }
            }
            Step::ReadRecords { attempt, members } => {
                let keys: Vec<String> = members.iter().map(|i| key::join(attempt, *i)).collect();
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let records: Vec<(u32, Vec<u8>)> = members
                    .into_iter()
                    .zip(self.ctl.multi_get(&refs).await?)
                    .collect();
                let records = &records;
                self.rdzv.step(Fact::Records { attempt, records })
            }
            Step::ReadLeases { old } => self.read_leases(old).await?,
            Step::ClaimCoordinator { old, alive, from } => {
                let mine = self.cfg.node_rank.to_string();
                let held = self
                    .ctl
                    .compare_set(key::COORD_LEASE, &from, mine.as_bytes())
                    .await?;
                let (alive, from, held) = (&alive, &from, &held);
                self.rdzv.step(Fact::CoordinatorClaimed {
                    old,
                    alive,
                    from,
                    held,
                })
            }
            other => unreachable!("carry_one carries {other:?} out"),
        })
    }

    /// Writes this node's join record for `attempt` and counts it ([`Step::Join`]); the state
    /// machine's answer to the count.
    async fn join_record(
        &mut self,
        attempt: u32,
        record: &[u8],
        with_members: bool,
    ) -> Result<Vec<Step>, StoreError> {
        let me = self.cfg.node_rank;
        let (at, count) = (key::join(attempt, me), key::joined(attempt));
        if with_members && self.head.is_none() {
            // Woken after node rank 0 dropped this node: leave rather than stand by.
            let read = self.ctl.multi_get_now(&[key::dropped(me).as_str()]).await?;
            if let Some(reason) = read.first().and_then(|v| dropped_reason(me, v)) {
                return Ok(self.rdzv.step(Fact::Deposed { reason }));
            }
        }
        let (members, nth) = if with_members {
            self.ctl.set(&at, record).await?;
            let members = match self.ctl.check(&[&key::members(attempt)]).await? {
                true => Some(self.ctl.get(&key::members(attempt)).await?),
                false => None,
            };
            (members, self.ctl.add(&count, 1).await?)
        } else {
            (None, self.ctl.join(&at, record, &count).await?)
        };
        abort(&mut self.last_call);
        let members = members.as_deref();
        Ok(self.rdzv.step(Fact::Counted {
            attempt,
            nth,
            members,
        }))
    }

    /// Node rank 0: a clean store for the next attempt ([`Step::ResetStore`]): reset in place
    /// where it hosts the store, through its connection where the store is outside the job.
    async fn reset_store(&mut self, previous: Option<u32>) -> Result<(), StoreError> {
        let head = self.head.as_ref().expect("only node rank 0 waits for all");
        match head.keys.as_ref() {
            Some(keys) => {
                keys.reset();
                if let Some(p) = previous {
                    keys.clear_prefix(&key::attempt_prefix_raw(p));
                }
            }
            None => {
                self.ctl.clear_except(vigil_store::AGENT_PREFIX).await?;
                if let Some(p) = previous {
                    self.ctl.clear_prefix(&key::attempt_prefix_raw(p)).await?;
                }
            }
        }
        Ok(())
    }

    /// Every node's lease and the job's end, read at once ([`Step::ReadLeases`]); the state
    /// machine's answer.
    async fn read_leases(&mut self, old: u32) -> Result<Vec<Step>, StoreError> {
        let names: Vec<String> = (0..self.cfg.nnodes).map(key::lease).collect();
        let mut refs: Vec<&str> = names.iter().map(String::as_str).collect();
        refs.push(key::JOB_END);
        let values = self.ctl.multi_get_now(&refs).await?;
        let (leases, job_end) = values.split_at(names.len());
        let leased: Vec<bool> = leases.iter().map(|v| !v.is_empty()).collect();
        let leased = &leased;
        Ok(self.rdzv.step(Fact::LeasesRead {
            old,
            leased,
            job_ended: !job_end[0].is_empty(),
        }))
    }

    /// This agent coordinates from now on ([`Step::Coordinate`]): it reads the store's lease
    /// queue, and its liveness sweeps every node's counter.
    fn coordinate(&mut self) {
        self.head = Some(remote_head(&self.ctl, &mut self.tasks, &self.inbox_tx));
        self.liveness.abort();
        let live = liveness(
            self.ctl.clone(),
            self.cfg.clone(),
            true,
            self.inbox_tx.clone(),
        );
        self.liveness = self.tasks.spawn_local(live);
    }

    /// Node rank 0 hosting the store, leaving ([`Step::HoldStore`]): the other agents may still
    /// read this attempt's verdict from it, so it stays up until each has left (or was lost),
    /// for at most one peer timeout.
    async fn hold_store(&mut self) {
        let Some(h) = self.head.as_mut() else {
            return;
        };
        let Some(keys) = h.keys.clone() else {
            return;
        };
        let deadline = tokio::time::Instant::now() + self.cfg.peer_timeout;
        let holders = || keys.count_prefix(key::LEASE_PREFIX_RAW);
        let mut open = holders();
        while open > 0 {
            let Some(leases) = h.leases.as_mut() else {
                break;
            };
            match tokio::time::timeout_at(deadline, leases.recv()).await {
                Ok(Some(_)) => open = holders(),
                Ok(None) | Err(_) => break,
            }
        }
    }

    /// What every slot's node wrote under `key(node)`, read in one round trip; a value that does
    /// not parse is left out.
    pub(super) async fn every_node<T: serde::de::DeserializeOwned>(
        &mut self,
        key: impl Fn(u32) -> String,
    ) -> Result<Vec<T>, StoreError> {
        let keys: Vec<String> = self.rdzv.slots().iter().map(|n| key(*n)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        Ok(self
            .ctl
            .multi_get(&refs)
            .await?
            .iter()
            .filter_map(|v| serde_json::from_slice(v).ok())
            .collect())
    }
}

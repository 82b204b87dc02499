//! Carrying out the supervisor's actions on this node: spawning a cycle's ranks, signalling and
//! sweeping process groups, stacks of a hung rank.

use super::*;

impl Agent {
    pub(super) fn attempt_dir(&self, cycle: u32, local_rank: u32) -> PathBuf {
        self.run_dir
            .join(format!("attempt_{cycle}"))
            .join(local_rank.to_string())
    }

    pub(super) fn spawn_cycle(&mut self, cycle: u32) {
        self.tails = (0..self.cfg.nproc).map(|_| Tail::default()).collect();
        // Pumps of earlier attempts that reached end-of-file need no waiting for at exit.
        self.readers.retain(|h| !h.is_finished());
        self.shared.cycle.set(cycle);
        *self.shared.rank_pids.borrow_mut() = vec![None; self.cfg.nproc as usize];
        let env_of = |k: &str| std::env::var(k).ok();
        let dups = [
            (&self.cfg.dup_stdout, "filtered_stdout.log"),
            (&self.cfg.dup_stderr, "filtered_stderr.log"),
        ]
        .map(|(filters, name)| {
            (!filters.is_empty()).then(|| {
                let dir = self.run_dir.join(format!("attempt_{cycle}"));
                let file = fs::create_dir_all(&dir)
                    .and_then(|_| File::create(dir.join(name)))
                    .ok();
                Dup {
                    filters: Rc::new(filters.clone()),
                    file: Rc::new(std::cell::RefCell::new(file)),
                }
            })
        });
        let hostname = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default();
        let numa = self.cfg.gpu.numa.map(|mode| {
            let cvd = env_of("CUDA_VISIBLE_DEVICES");
            let g = &self.cfg.gpu;
            let (p, warnings) = crate::perf::numa::prepare(
                g.nvml_lib.as_deref(),
                mode,
                g.numa_strict,
                self.cfg.nproc,
                cvd.as_deref(),
            );
            for w in warnings.iter().filter(|_| cycle == 0) {
                console_note(w);
            }
            p
        });
        for lr in 0..self.cfg.nproc {
            let dir = self.attempt_dir(cycle, lr);
            let error_file = dir.join("error.json");
            // A log directory that is full, read-only or gone costs the log files, not the job.
            let open_log = |name: &str| -> std::io::Result<LogFile> {
                fs::create_dir_all(&dir)?;
                let path = dir.join(name);
                Ok(LogFile {
                    file: File::create(&path)?,
                    path,
                })
            };
            let (out_log, err_log) = match (open_log("stdout.log"), open_log("stderr.log")) {
                (Ok(o), Ok(e)) => (Some(o), Some(e)),
                (Err(e), _) | (_, Err(e)) => {
                    if !self.log_create_failed {
                        self.log_create_failed = true;
                        console_note(&format!(
                            "cannot create the rank logs in {}: {e}; ranks run without log files \
                             (free space or fix --log-dir; the console still shows their output)",
                            dir.display()
                        ));
                    }
                    (None, None)
                }
            };
            let error_file_s = error_file.to_string_lossy().into_owned();
            let slot = RankSlot {
                local_rank: lr,
                group_rank: self.group_rank,
                restart_count: cycle,
                rank_offset: self.rank_offset,
                world_size: self.world_size,
                master_addr: &self.store_for_ranks.0,
                master_port: self.store_for_ranks.1,
                error_file: &error_file_s,
            };
            let mut env = worker_env(&self.cfg, &slot, &env_of);
            env.push((
                "VIGIL_RUN_DIR".into(),
                self.run_dir.to_string_lossy().into_owned(),
            ));
            env.push((
                "VIGIL_SOCKET".into(),
                self.socket.to_string_lossy().into_owned(),
            ));
            // The shim refuses to speak another protocol before it connects (docs/protocol.md).
            env.push((
                "VIGIL_PROTOCOL".into(),
                vigil_ipc::PROTOCOL_VERSION.to_string(),
            ));
            env.push((
                "VIGIL_STACK_FILE".into(),
                dir.join("stacks.txt").to_string_lossy().into_owned(),
            ));
            env.push(self.containment.env());
            match proc::spawn_rank(
                &self.cfg.command,
                &env,
                self.containment.cgroup(),
                numa.as_ref().and_then(|n| n[lr as usize].as_ref()),
            ) {
                Ok(sp) => {
                    if let Some(w) = &mut self.watchdog {
                        w.guard(sp.pid);
                    }
                    self.shared.rank_pids.borrow_mut()[lr as usize] = Some(sp.pid);
                    let prefix = crate::cli::config::render_prefix(
                        self.cfg.prefix_template.as_deref(),
                        &self.cfg.role,
                        self.rank_offset + lr,
                        lr,
                        &hostname,
                    );
                    let console = self.cfg.console[lr as usize];
                    self.readers.push(pump(
                        sp.stdout,
                        Sink {
                            prefix: prefix.clone(),
                            console: console.stdout.then_some(ConsoleStream::Stdout),
                            file: out_log,
                            tail: None,
                            dup: dups[0].clone(),
                        },
                    ));
                    self.readers.push(pump(
                        sp.stderr,
                        Sink {
                            prefix,
                            console: console.stderr.then_some(ConsoleStream::Stderr),
                            file: err_log,
                            tail: Some(self.tails[lr as usize].clone()),
                            dup: dups[1].clone(),
                        },
                    ));
                    self.queue.push_back(Event::RankSpawned {
                        local_rank: lr,
                        pid: sp.pid,
                    });
                }
                Err(e) => {
                    self.queue.push_back(Event::SpawnFailed {
                        local_rank: lr,
                        error: format!("cannot execute {:?}: {e}", self.cfg.command[0]),
                    });
                    return;
                }
            }
        }
    }

    pub(super) fn execute(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                // Leaving waits until the loop is over (the output drained).
                Action::Job(leave @ JobRequest::Leave { .. }) => self.leave = Some(leave),
                Action::Job(req @ JobRequest::Join { cycle, .. })
                    if gate::wanted(&self.cfg.gpu, cycle) =>
                {
                    let (nproc, node) = (self.cfg.nproc, self.cfg.node_rank);
                    let spares = self.cfg.active_nodes < self.cfg.nnodes;
                    gate::start(
                        self.cfg.gpu.clone(),
                        nproc,
                        node,
                        spares,
                        req,
                        self.gate_tx.clone(),
                    );
                }
                Action::Job(req) => {
                    let _ = self.coord.send(req);
                }
                Action::SpawnCycle { cycle } => self.spawn_cycle(cycle),
                Action::SignalGroups { pgids, signal } => {
                    for p in pgids {
                        proc::signal_group(p, signal);
                    }
                }
                Action::ReapGroups { pgids } => {
                    for p in &pgids {
                        proc::signal_group(*p, libc::SIGKILL);
                    }
                    self.sweep(self.shared.cycle.get());
                    for p in pgids {
                        if let Some(w) = &mut self.watchdog {
                            w.release(p);
                        }
                    }
                }
                Action::Record(rec) => {
                    if let Record::StopTriggered { trigger, .. }
                    | Record::StopAgreed { trigger, .. } = &rec
                    {
                        self.stop_trigger.get_or_insert_with(|| trigger.clone());
                    }
                    self.note(&rec);
                    self.events.write(&rec);
                }
                Action::Finish(o) => self.outcome = Some(o),
                Action::CaptureStacks {
                    local_rank,
                    pid,
                    via_shim,
                } => {
                    let dir = self.attempt_dir(self.shared.cycle.get(), local_rank);
                    let cycle = self.shared.cycle.get();
                    let wait = self.cfg.stack_wait;
                    let tx = self.stacks_tx.clone();
                    tokio::task::spawn_local(async move {
                        let report = stacks::capture(pid, &dir, via_shim, wait).await;
                        let _ = tx.send((cycle, local_rank, report));
                    });
                }
                Action::ProbeStopped { ranks } => {
                    let stopped = ranks
                        .into_iter()
                        .filter(|(_, pid)| matches!(proc::process_state(*pid), Some('T' | 't')))
                        .map(|(lr, _)| lr)
                        .collect();
                    self.queue.push_back(Event::Probed { stopped });
                }
                Action::SendToRank { local_rank, msg } => self.shared.send(local_rank, msg),
                Action::SendToAll(msg) => self.shared.send_all(&msg),
                Action::SaveTimeouts(t) => {
                    let path = self.cfg.timeouts_file.save_path(&self.run_dir);
                    if let Err(e) = state::save_timeouts(&path, &provenance(&self.cfg), &t) {
                        console_note(&format!(
                            "cannot save calculated timeouts to {}: {e}",
                            path.display()
                        ));
                    }
                }
            }
        }
    }

    /// Kills whatever the ranks left running outside their process groups (daemons that called
    /// setsid, double forks) and says so. Called once no rank of the attempt runs, so every child
    /// of the agent but the watchdog is such a leftover.
    pub(super) fn sweep(&mut self, cycle: u32) {
        let mut spare: Vec<i32> = self.watchdog.iter().map(Watchdog::pid).collect();
        spare.extend(
            self.helper_pids
                .lock()
                .map(|h| h.clone())
                .unwrap_or_default(),
        );
        let me = std::process::id() as i32;
        let killed = self.containment.sweep(Some((me, &spare)));
        if killed > 0 {
            console_note(&format!(
                "killed {killed} process(es) the ranks of attempt {cycle} left running outside their process groups"
            ));
            self.events.write(&Record::LeftoversKilled {
                cycle,
                count: killed,
            });
        }
    }

    pub(super) fn on_stacks(&mut self, cycle: u32, local_rank: u32, report: StackReport) {
        let rank = self.rank_offset + local_rank;
        let mut msg = format!("rank {rank} stacks captured");
        match &report.python {
            Some(p) if report.missing.is_empty() => {
                msg.push_str(&format!(" (Python: {})", p.display()))
            }
            Some(p) => msg.push_str(&format!(
                " (Python: {}, perhaps cut short: {})",
                p.display(),
                report.missing
            )),
            None => msg.push_str(&format!(" (no Python stacks: {})", report.missing)),
        }
        if let Some(p) = &report.proc {
            msg.push_str(&format!(", kernel view: {}", p.display()));
        }
        if !report.innermost.is_empty() {
            msg.push_str("; innermost frames:");
            for f in &report.innermost {
                msg.push_str(&format!("\n    {f}"));
            }
        }
        console_note(&msg);
        self.events.write(&Record::Stacks {
            cycle,
            local_rank,
            rank,
            python_stacks: report.python.clone(),
            proc_stacks: report.proc.clone(),
            innermost: report.innermost.clone(),
        });
        self.stack_reports.push((cycle, local_rank, report));
    }
}

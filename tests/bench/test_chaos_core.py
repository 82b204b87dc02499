"""The chaos soak's pure parts (bench/chaos_core.py): the seeded schedule and each invariant, fed
histories that keep it and histories that break it."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("chaos_core", ROOT / "bench" / "chaos_core.py")
core = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(core)


def test_a_plan_depends_on_the_seed_and_run_alone():
    assert core.plan_run(7, 3) == core.plan_run(7, 3)
    assert core.plan_run(7, 3) != core.plan_run(8, 3)
    assert core.plan_run(7, 3) != core.plan_run(7, 4)


def test_plans_keep_their_rules_over_many_seeds():
    seen = set()
    for seed in range(200):
        p = core.plan_run(seed, 0)
        ats = [f["at"] for f in p["faults"]]
        assert 2 <= len(ats) <= 4 and ats == sorted(ats) and ats[0] >= 20
        assert all(b - a >= 12 for a, b in zip(ats, ats[1:])), ats
        kinds = [f["kind"] for f in p["faults"]]
        assert sum(k in core.NODE_LOSS for k in kinds) <= 1, kinds
        if not p["spare"]:
            assert not set(kinds) & core.SPARE_ONLY, p
        assert all(0 <= f["pick"] < 1 for f in p["faults"])
        seen |= set(kinds)
    assert seen == set(core.CATALOG), set(core.CATALOG) - seen


def test_a_plan_draws_only_from_the_kinds_given():
    for seed in range(50):
        p = core.plan_run(seed, 1, kinds=["rank_sigkill", "scancel_usr1"])
        assert {f["kind"] for f in p["faults"]} <= {"rank_sigkill", "scancel_usr1"}


def ev(event, ts, **kw):
    return {"event": event, "ts": ts, "host": kw.pop("host", "n1"), "node_rank": kw.pop("node_rank", 0), **kw}


def test_rank_faults_need_their_own_pid_and_kind_in_the_events():
    events = [ev("rank_exited", 101, pid=5, exit_code=1), ev("rank_exited", 102, pid=6, signal=9),
              ev("hang", 120, pid=7, stopped=True), ev("hang", 130, pid=8, timeout={"section": "step"})]
    nr = core.node_ranks_of(events)
    assert core.evidence({"kind": "rank_exit1", "t": 100, "pid": 5}, events, nr)
    assert core.evidence({"kind": "rank_exit1", "t": 100, "pid": 6}, events, nr) is None
    assert core.evidence({"kind": "rank_sigkill", "t": 100, "pid": 6}, events, nr)
    assert core.evidence({"kind": "rank_sigsegv", "t": 100, "pid": 6}, events, nr) is None
    assert core.evidence({"kind": "rank_sigstop", "t": 100, "pid": 7}, events, nr)
    assert core.evidence({"kind": "rank_section_hang", "t": 100, "pid": 7}, events, nr) is None
    assert core.evidence({"kind": "rank_section_hang", "t": 100, "pid": 8}, events, nr)
    beat = [ev("hang", 130, pid=9, timeout="heartbeat"), ev("hang", 131, pid=10, timeout="initial")]
    assert core.evidence({"kind": "rank_section_hang", "t": 100, "pid": 9}, beat, nr)
    assert core.evidence({"kind": "rank_section_hang", "t": 100, "pid": 10}, beat, nr) is None
    # An event long before the fault is not its record.
    assert core.evidence({"kind": "rank_exit1", "t": 500, "pid": 5}, events, nr) is None


def test_agent_faults_need_the_node_named_lost_or_its_own_signal():
    events = [ev("joined", 1, host="n1", node_rank=0), ev("joined", 1, host="n2", node_rank=1),
              ev("promotion", 110, slot=1, lost=1, standby=2),
              ev("stop_triggered", 120, host="n2", node_rank=1, trigger="SIGTERM")]
    nr = core.node_ranks_of(events)
    assert core.evidence({"kind": "agent_sigkill", "t": 100, "host": "n2"}, events, nr)
    assert core.evidence({"kind": "agent_sigkill", "t": 100, "host": "n1"}, events, nr) is None
    assert core.evidence({"kind": "agent_sigterm", "t": 100, "host": "n2"}, events, nr)
    assert core.evidence({"kind": "agent_sigterm", "t": 100, "host": "n1"}, events, nr) is None
    assert core.evidence({"kind": "store_junk", "t": 100}, events, nr) is None


def steps_history(resume_from=26):
    """Rank 0 saves 25, is killed at 30; both ranks resume from `resume_from`."""
    r0 = [{"ev": "start", "t": 1, "alloc": 0, "attempt": 0, "pid": 1, "resumed_from": 0}]
    r0 += [{"ev": "step", "t": 1 + s * 0.1, "alloc": 0, "attempt": 0, "pid": 1, "step": s} for s in range(31)]
    r0 += [{"ev": "saving", "t": 3.55, "alloc": 0, "attempt": 0, "pid": 1, "step": 25},
           {"ev": "saved", "t": 3.56, "alloc": 0, "attempt": 0, "pid": 1, "step": 25}]
    r0.sort(key=lambda r: r["t"])
    r0 += [{"ev": "start", "t": 10, "alloc": 0, "attempt": 1, "pid": 2, "resumed_from": resume_from}]
    r0 += [{"ev": "step", "t": 10 + i * 0.1, "alloc": 0, "attempt": 1, "pid": 2, "step": resume_from + i}
           for i in range(10)]
    r1 = [dict(r, pid=r["pid"] + 100) for r in r0 if r["ev"] in ("start", "step")]
    return {0: r0, 1: r1}


def test_steps_resume_from_the_last_checkpoint_only():
    assert core.check_steps(steps_history(26)) == []
    bad = core.check_steps(steps_history(31))  # past the checkpoint
    assert bad and all(inv == "steps go back only to a checkpoint" for inv, _ in bad), bad
    assert core.check_steps(steps_history(0))  # back further than the checkpoint


def test_steps_skipped_within_an_attempt_are_a_violation():
    h = steps_history()
    h[1] = [r for r in h[1] if r.get("step") != 5]
    assert any("within one attempt" in d for _, d in core.check_steps(h))


def test_a_stop_must_save_one_step_on_every_rank():
    ledger = [{"allocation": 1, "outcome": "stopped", "stop_step": 40, "end": 100}]
    steps = {r: [{"ev": "step", "t": 1, "alloc": 0, "step": 40},
                 {"ev": "stopped", "t": 2, "alloc": 0, "step": 40}] for r in (0, 1)}
    steps[0].append({"ev": "saved", "t": 3, "alloc": 0, "step": 40})
    assert core.check_stops(ledger, steps) == []
    steps[1][-1]["step"] = 41
    assert core.check_stops(ledger, steps)
    steps[1][-1]["step"] = 40
    steps[0] = [r for r in steps[0] if r["ev"] != "saved"]
    assert core.check_stops(ledger, steps)


def test_no_rank_steps_after_its_allocation_ended():
    ledger = [{"allocation": 1, "end": 100.0}]
    ok = {0: [{"ev": "step", "t": 99.0, "alloc": 0, "step": 1}]}
    late = {0: [{"ev": "step", "t": 105.0, "alloc": 0, "step": 1}]}
    assert core.check_no_rank_after_end(ledger, ok) == []
    assert core.check_no_rank_after_end(ledger, late)
    # A stop recorded when its step was agreed: the ranks run on to that step, not past it.
    stopped = [{"allocation": 1, "end": 100.0, "outcome": "stopped", "stop_step": 40}]
    to_the_step = {0: [{"ev": "step", "t": 101.5, "alloc": 0, "step": 40}]}
    past_it = {0: [{"ev": "step", "t": 101.5, "alloc": 0, "step": 41}]}
    assert core.check_no_rank_after_end(stopped, to_the_step) == []
    assert core.check_no_rank_after_end(stopped, past_it)
    assert core.check_no_rank_after_end(ledger, to_the_step)  # no agreed step: still late


def test_the_ledger_has_each_allocation_once_and_does_not_loop():
    led = [{"allocation": 1}, {"allocation": 2}]
    assert core.check_ledger(led, {"Restarts": "1"}, 6) == []
    assert core.check_ledger(led, {"Restarts": "2"}, 6)  # an allocation Slurm ran is missing
    assert core.check_ledger([{"allocation": 1}, {"allocation": 1}], {"Restarts": "1"}, 6)
    assert core.check_ledger(led, {"Restarts": "1"}, 0)
    # An allocation followed by another says requeue (soak seeds 8 and 9: a `scontrol requeue`
    # recorded as a cancel's stop), or that Slurm ran the job again over vigil's stop.
    cancel = "the Slurm job is ending before its time limit (scancel, or a preemption past its grace)"
    said = [dict(led[0], decision="stop", why=cancel), dict(led[1], decision="finished", why="")]
    assert [i for i, _ in core.check_ledger(said, {"Restarts": "1"}, 6)] == ["the ledger says why each allocation ended"]
    said[0]["decision"] = "requeue"
    assert core.check_ledger(said, {"Restarts": "1"}, 6) == []
    said[0].update(decision="stop", why="no progress; Slurm requeued the job itself (scontrol requeue, or a "
                   "preemption), so it runs again unless cancelled (scancel)")
    assert core.check_ledger(said, {"Restarts": "1"}, 6) == []


def test_the_job_ends_finished_or_for_a_stated_reason():
    base = {"ended": True, "slurm": {}}
    assert core.check_ended(dict(base, ledger=[{"decision": "finished"}])) == []
    assert core.check_ended(dict(base, ledger=[{"decision": "stop", "why": "max-requeues"}])) == []
    assert core.check_ended(dict(base, ledger=[{"decision": "requeue"}]))
    assert core.check_ended(dict(base, ledger=[]))
    assert core.check_ended(dict(base, ended=False, ledger=[{"decision": "finished"}]))


def test_kept_step_time_leaves_out_steps_done_again():
    h = steps_history(26)
    # Attempt 0: steps 0..30 at 0.1 s, the steps up to 25 kept (25 intervals); attempt 1: 9 intervals.
    assert abs(core.kept_step_time(h[0]) - (25 * 0.1 + 9 * 0.1)) < 1e-6


def test_goodput_must_add_up_and_agree_with_the_step_log():
    h = steps_history(26)
    own = core.kept_step_time(h[0])
    gp = {"breakdown": {"goodput": own, "other": 20 - own}, "wall_s": 20.0, "goodput_fraction": own / 20}
    assert core.check_goodput(gp, h, 0.05) == []
    assert core.check_goodput(dict(gp, goodput_fraction=own / 20 + 0.2), h, 0.05)
    assert core.check_goodput(dict(gp, breakdown={"goodput": own, "other": 5.0}), h, 0.05)
    assert core.check_goodput(None, h, 0.05)


def test_the_table_ends_with_the_summary_line():
    results = [{"seed": 1, "index": 0, "faults": [{"kind": "rank_sigkill"}], "survived": True,
                "violations": [], "requeues": 0, "goodput": 0.5},
               {"seed": 1, "index": 1, "faults": [{"kind": "preempt"}, {"kind": "rank_exit1"}],
                "survived": False, "violations": [("the job ends", "x", 12.0)], "requeues": 1, "goodput": None}]
    text = core.table(results)
    assert text.splitlines()[-1] == "chaos: 3 faults, 1 survived, 1 violations"
    assert "| 1 | 1 | 12 | the job ends | x |" in text


def test_every_fault_that_came_due_must_be_in_the_events():
    base = {"steps": {}, "ledger": [{"allocation": 1, "decision": "finished", "end": 10}], "ended": True,
            "slurm": {"Restarts": "0"}, "max_requeues": 6, "leftovers": [], "events": [],
            "goodput": {"breakdown": {"other": 10.0}, "wall_s": 10.0, "goodput_fraction": 0.0}}
    fault = {"kind": "time_limit", "t": 5.0}
    assert core.check_run(dict(base, faults=[])) == []
    assert [inv for inv, _ in core.check_run(dict(base, faults=[fault]))] == ["fault in the events"]
    assert core.check_run(dict(base, faults=[dict(fault, superseded=True)])) == []
    assert core.check_run(dict(base, faults=[], leftovers=["7 python3"]))


def test_node_rank_0_lost_is_read_from_the_others_losing_its_store():
    events = [ev("joined", 1, host="n1", node_rank=0), ev("joined", 1, host="n2", node_rank=1),
              ev("cycle_ended", 110, host="n2", node_rank=1, end="lost",
                 reason="lost the connection to node rank 0's store at 127.0.0.1:20004")]
    nr = core.node_ranks_of(events)
    assert core.evidence({"kind": "agent_sigkill", "t": 100, "host": "n1"}, events, nr)
    assert core.evidence({"kind": "agent_sigkill", "t": 100, "host": "n2"}, events, nr) is None


def test_store_faults_need_node_rank_0s_store_refused_record_of_their_kind():
    junk = {"kind": "store_junk", "t": 100}
    flood = {"kind": "store_flood", "t": 100}
    counts = dict(wrong_secret=0, over_budget=0, last_peer="10.0.0.9:4711")
    only_junk = [ev("store_refused", 101, new=1, bad_bytes=1, closed_in_handshake=0, **counts)]
    nr = core.node_ranks_of(only_junk)
    assert core.evidence(junk, only_junk, nr)
    assert core.evidence(flood, only_junk, nr) is None
    both = only_junk + [ev("store_refused", 111, new=300, bad_bytes=1, closed_in_handshake=256,
                           **{**counts, "over_budget": 44})]
    assert core.evidence(flood, both, nr)["ts"] == 111
    # Another node's record, a record with nothing new, or a console-ish event is not it.
    other = [ev("store_refused", 101, node_rank=1, new=1, bad_bytes=1, closed_in_handshake=0, **counts)]
    assert core.evidence(junk, other, core.node_ranks_of(other)) is None
    stale = [ev("store_refused", 101, new=0, bad_bytes=1, closed_in_handshake=0, **counts)]
    assert core.evidence(junk, stale, nr) is None
    assert core.evidence(junk, [ev("ipc_rejected", 101, peer_pid=None, reason="not a rank")], nr) is None


def test_a_full_checkpoint_directory_needs_the_failed_save_and_its_ranks_exit():
    rank0 = [{"ev": "saving", "t": 90, "pid": 5, "step": 25}, {"ev": "saved", "t": 90.2, "pid": 5, "step": 25},
             {"ev": "saving", "t": 105, "pid": 5, "step": 50}, {"ev": "saving", "t": 140, "pid": 9, "step": 50},
             {"ev": "saved", "t": 140.1, "pid": 9, "step": 50}]
    # The save begun in the window (100-120) never finished; one before it or after it is not it.
    assert core.failed_save(rank0, 100, 120) == (5, 50)
    assert core.failed_save(rank0, 121, 150) is None
    assert core.failed_save(rank0, 80, 95) is None
    full = {"kind": "ckpt_full", "t": 100, "save_pid": 5}
    events = [ev("rank_exited", 105.3, pid=5, exit_code=1)]
    assert core.evidence(full, events, core.node_ranks_of(events))
    # Its rank stopped by vigil for another's failure (exit 0 or a signal only) is not the save failing.
    for other in (ev("rank_exited", 105.3, pid=5, exit_code=0), ev("rank_exited", 105.3, pid=6, exit_code=1),
                  ev("rank_exited", 105.3, pid=5, signal=15)):
        assert core.evidence(full, [other], core.node_ranks_of([other])) is None


def test_a_killed_slurmd_needs_no_event_but_the_job_must_end():
    assert "slurmd_kill" in core.UNSEEN and core.UNSEEN <= set(core.CATALOG)
    base = {"steps": {}, "events": [], "ledger": [{"allocation": 1, "decision": "finished"}],
            "goodput": None, "slurm": {"JobState": "COMPLETED", "Restarts": "0"}, "leftovers": [],
            "max_requeues": 6, "ended": True}
    fault = {"kind": "slurmd_kill", "t": 100, "host": "n2"}
    inv = [i for i, _ in core.check_run(dict(base, faults=[fault]))]
    assert "fault in the events" not in inv
    # A job that did not end after it is a violation as for any fault.
    inv = [i for i, _ in core.check_run(dict(base, faults=[fault], ended=False))]
    assert "the job ends" in inv


def test_in_process_kills_are_drawn_only_for_runs_with_in_process_restarts():
    seen = 0
    for seed in range(200):
        p = core.plan_run(seed, 0)
        kinds = {f["kind"] for f in p["faults"]}
        if not p["inprocess"]:
            assert not kinds & core.INPROCESS_ONLY, p
        seen += "inprocess_kill" in kinds
    assert seen
    # Asked for alone, every run has in-process restarts; without it, none.
    assert core.plan_run(3, 0, kinds=["inprocess_kill"])["inprocess"]
    assert not any(core.plan_run(s, 0, kinds=["rank_sigkill", "slurmd_kill"])["inprocess"] for s in range(50))


def test_the_kinds_of_an_older_catalog_replay_its_plans():
    old = sorted(set(core.CATALOG) - {"inprocess_kill", "slurmd_kill", "ckpt_full", "logs_full", "head_sigkill"})
    assert len(old) == 18
    # Seed 2 run 0 of docs/reliability.md's results.
    p = core.plan_run(2, 0, kinds=old)
    assert [f["kind"] for f in p["faults"]] == ["rank_section_hang", "scancel_usr1", "rank_sigstop"]
    assert not p["inprocess"]


def test_an_in_process_kill_needs_a_generation_naming_its_rank():
    fault = {"kind": "inprocess_kill", "t": 100, "pid": 5, "rank": 3}
    gen = [ev("generation", 101, cycle=0, generation=1, ranks=[3], step=56)]
    assert core.evidence(fault, gen, core.node_ranks_of(gen))
    other = [ev("generation", 101, cycle=0, generation=1, ranks=[2], step=56)]
    assert core.evidence(fault, other, core.node_ranks_of(other)) is None
    declined = [ev("in_process_declined", 101, cycle=0, reason="no in-process restarts left")]
    assert core.evidence(fault, declined, core.node_ranks_of(declined))


def st(ev_, t, **kw):
    return {"ev": ev_, "t": t, "alloc": 0, "attempt": 0, "pid": kw.pop("pid", 1), **kw}


def test_a_generation_goes_on_where_the_survivors_were():
    def steps(resumed_from):
        r0 = [st("start", 0, resumed_from=0), st("saving", 3, step=25), st("saved", 3.1, step=25),
              *[st("step", 1 + i * 0.1, step=i) for i in range(57)],
              st("start", 20, resumed_from=resumed_from, generation=1)]
        r1 = [st("start", 0, resumed_from=0, pid=2), st("start", 20, resumed_from=resumed_from, generation=1, pid=3)]
        return {0: r0, 1: r1}
    assert core.check_steps(steps(57)) == []
    assert core.check_steps(steps(58)) == []
    # Back to the checkpoint (redone) or beyond the survivors (skipped): a violation per rank.
    for bad in (26, 60):
        v = core.check_steps(steps(bad))
        assert [i for i, _ in v] == ["an in-process restart goes on where the survivors were"] * 2, v


def test_a_full_log_directory_needs_node_rank_0s_event_log_to_go_on_after_it_is_freed():
    full = {"kind": "logs_full", "t": 100, "freed_t": 120}
    during = [ev("rank_exited", 110, pid=5, exit_code=1)]
    assert core.evidence(full, during, core.node_ranks_of(during)) is None
    after = during + [ev("result", 130, outcome="succeeded")]
    assert core.evidence(full, after, core.node_ranks_of(after))
    other_node = during + [ev("result", 130, node_rank=1, host="n2", outcome="succeeded")]
    assert core.evidence(full, other_node, core.node_ranks_of(other_node)) is None


def test_a_generation_must_recover_on_every_node_that_began_it():
    gen = [ev("generation", 10, node_rank=0, host="n1", cycle=0, generation=1, ranks=[2]),
           ev("generation", 10, node_rank=1, host="n2", cycle=0, generation=1, ranks=[2])]
    both = gen + [ev("generation_recovered", 10.4, node_rank=1, host="n2", cycle=0, generation=1, seconds=0.4),
                  ev("generation_recovered", 10.5, node_rank=0, host="n1", cycle=0, generation=1, seconds=0.5)]
    assert core.check_generations(both) == []
    # Seed 3 of `--kinds inprocess_kill`: node 0 never recovered generation 1.
    v = core.check_generations(both[:3])
    assert [i for i, _ in v] == ["an in-process restart recovers on every node"]
    assert "node 0 attempt 0 generation 1" in v[0][1]
    # The same generation number in the next attempt is another generation.
    later = both + [ev("generation", 50, node_rank=0, host="n1", cycle=1, generation=1, ranks=[0])]
    assert len(core.check_generations(later)) == 1
    # Seed 7 run 5: a second rank failed with the first, and the attempt ended at once: cut
    # short by the escalation, not stuck. Ended 15 s later (seed 3's violation 9): stuck.
    at_once = gen + [ev("cycle_ended", 10.1, node_rank=0, host="n1", cycle=0, end="failed"),
                     ev("cycle_ended", 10.1, node_rank=1, host="n2", cycle=0, end="failed")]
    assert core.check_generations(at_once) == []
    stuck = gen + [ev("cycle_ended", 25, node_rank=0, host="n1", cycle=0, end="failed"),
                   ev("cycle_ended", 25, node_rank=1, host="n2", cycle=0, end="failed")]
    assert len(core.check_generations(stuck)) == 2


def test_a_node_taken_out_of_the_job_never_comes_back_in_that_allocation():
    lost = "node 1 was lost: its agent gave no sign of life for 10s (--node-timeout): frozen"
    start = [ev("joined", 1, node_rank=n, host=f"n{n + 1}", cycle=0) for n in range(3)] + \
        [ev("rank_started", 1.1, node_rank=n, host=f"n{n + 1}", cycle=0, rank=n) for n in range(2)]
    loss = [ev("cycle_ended", 20, node_rank=0, cycle=0, end="failed", node=1, reason=lost),
            ev("promotion", 20.5, node_rank=0, cycle=1, slot=1, lost=1, standby=2),
            ev("rank_started", 20.6, node_rank=2, host="n3", cycle=1, rank=1)]
    # Woken, node 1 reads that it was dropped and leaves: nothing of it in the job after.
    left = [ev("suspended", 28, node_rank=1, host="n2", seconds=18.0),
            ev("cycle_ended", 28.1, node_rank=1, host="n2", cycle=0, end="lost", reason="node 1 was dropped"),
            ev("result", 28.2, node_rank=1, host="n2", exit_code=75, outcome="lost")]
    assert core.check_taken_out(start + loss + left) == []
    # The soak's seed 1 run 0 (before the drop was read by active nodes): woken, it joined the
    # next attempt as a standby.
    back = [ev("joined", 28.3, node_rank=1, host="n2", cycle=1), ev("standby", 28.3, node_rank=1, host="n2", cycle=1)]
    v = core.check_taken_out(start + loss + back)
    assert [i for i, _ in v] == ["a node taken out of the job never comes back"] * 2, v
    assert "node 1 (n2) joined cycle 1 at 28.3, taken out at 20.0 (cycle_ended)" in v[0][1], v
    # Running ranks after its slot went to the standby is one too, whatever took it out.
    ranks = [ev("rank_started", 40, node_rank=1, host="n2", cycle=2, rank=1)]
    assert len(core.check_taken_out(loss[1:] + ranks)) == 1
    # A standby gone (frozen, then dropped) may not stand by again either.
    gone = [ev("standby_gone", 30, node_rank=0, node=2, reason="no sign of life", ready=0),
            ev("standby", 35, node_rank=2, host="n3", cycle=1)]
    assert len(core.check_taken_out(gone)) == 1
    # A node to blame, whose slot a standby took, may stand by; it may not run ranks.
    benched = [ev("promotion", 20.5, node_rank=0, cycle=2, slot=1, lost=1, standby=2),
               ev("standby", 21, node_rank=1, host="n2", cycle=2)]
    assert core.check_taken_out(benched) == []
    # A rank failure blamed on node 1 takes nothing out.
    failed = [ev("cycle_ended", 20, node_rank=0, cycle=0, end="failed", node=1, reason="rank 1 failed (exit 1)"),
              ev("rank_started", 21, node_rank=1, host="n2", cycle=1, rank=1)]
    assert core.check_taken_out(failed) == []
    # Node rank 0's result ends the allocation: in the requeued one, node 1 is in the job again.
    requeued = [ev("result", 30, node_rank=0, exit_code=75, outcome="lost"),
                ev("joined", 60, node_rank=1, host="n2", cycle=0),
                ev("rank_started", 60.1, node_rank=1, host="n2", cycle=0, rank=1)]
    assert core.check_taken_out(start + loss + requeued) == []
    # So does its next agent's first record, where Slurm killed node rank 0 before its result
    # (the soak's chaos6 run 0: a standby gone at a requeue stood by in the next allocation).
    killed = [ev("containment", 60, node_rank=0), ev("joined", 60.1, node_rank=1, host="n2", cycle=0)]
    assert core.check_taken_out(start + loss + killed) == []
    assert len(core.check_taken_out(start + loss + killed[1:])) == 1
    # check_run counts it.
    base = {"steps": {}, "events": start + loss + back, "ledger": [{"allocation": 1, "decision": "finished"}],
            "goodput": {"breakdown": {"productive": 1.0}, "wall_s": 1.0, "goodput_fraction": 1.0},
            "slurm": {"Restarts": "0"}, "faults": [], "leftovers": [], "max_requeues": 3, "ended": True}
    assert "a node taken out of the job never comes back" in [i for i, _ in core.check_run(base)]


def test_head_kills_are_drawn_only_with_the_store_outside_the_job_and_a_standby():
    heads = bare = at_service = 0
    for seed in range(300):
        for index in (0, 1):
            p = core.plan_run(seed, index)
            assert p == core.plan_run(seed, index)  # the same plan on every call
            kinds = {f["kind"] for f in p["faults"]}
            if "head_sigkill" in kinds:
                assert p["outside"] and p["spare"], p
                heads += 1
            if p["outside"]:
                bare += not p["spare"]
                at_service += bool(kinds & core.STORE_KINDS)
    # Junk and floods reach the store outside too (`vigil store`), where a run has it.
    assert heads and bare and at_service, (heads, bare, at_service)
    # Asked for alone, every run has the store outside and a standby, and loses node rank 0 once.
    for seed in range(30):
        p = core.plan_run(seed, 0, kinds=["head_sigkill"])
        assert p["outside"] and p["spare"] and [f["kind"] for f in p["faults"]] == ["head_sigkill"], p
    # Without the kind, no run has the store outside (the plans of an older catalog stay as they were).
    assert not any(core.plan_run(s, 0, kinds=["rank_sigkill", "agent_sigkill"])["outside"] for s in range(100))
    # Seed 4 run 0 of `--kinds head_sigkill,rank_sigkill` (docs/reliability.md) draws it first.
    p = core.plan_run(4, 0, kinds=["head_sigkill", "rank_sigkill"])
    assert p["outside"] and p["spare"] and p["faults"][0]["kind"] == "head_sigkill", p


def test_a_head_kill_needs_the_promotion_of_node_rank_0s_slot_not_a_requeue():
    fault = {"kind": "head_sigkill", "t": 100, "host": "n1"}
    start = [ev("joined", 1, host=f"n{n + 1}", node_rank=n) for n in range(3)]
    # Node rank 1 coordinates from then on and gives slot 0 to the standby, node rank 2.
    promoted = start + [ev("cycle_ended", 104, host="n2", node_rank=1, cycle=0, end="failed", node=0,
                           reason="node 0 was lost"),
                        ev("promotion", 105, host="n2", node_rank=1, cycle=1, slot=0, lost=0, standby=2)]
    assert core.evidence(fault, promoted, core.node_ranks_of(promoted))["event"] == "promotion"
    # The allocation ending for the loss (75, requeued) is what the store inside the job does.
    requeued = start + [ev("cycle_ended", 104, host="n2", node_rank=1, cycle=0, end="lost", node=0,
                           reason="node rank 0's store: connection lost"),
                        ev("result", 105, host="n2", node_rank=1, exit_code=75, outcome="lost", node=0)]
    assert core.evidence(fault, requeued, core.node_ranks_of(requeued)) is None
    # Another node's slot promoted is not it either.
    other = start + [ev("promotion", 105, host="n1", node_rank=0, cycle=1, slot=1, lost=1, standby=2)]
    assert core.evidence(fault, other, core.node_ranks_of(other)) is None
    # check_run requires it.
    base = {"steps": {}, "events": requeued, "ledger": [{"allocation": 1, "decision": "finished"}],
            "goodput": {"breakdown": {"productive": 1.0}, "wall_s": 1.0, "goodput_fraction": 1.0},
            "slurm": {"Restarts": "0"}, "faults": [fault], "leftovers": [], "max_requeues": 3, "ended": True}
    assert "fault in the events" in [i for i, _ in core.check_run(base)]
    assert "fault in the events" not in [i for i, _ in core.check_run(dict(base, events=promoted))]


def test_the_coordinator_after_node_rank_0_takes_nodes_out_too():
    # With the store outside the job, node rank 1 coordinates once node rank 0's agent is lost:
    # its promotion takes node 0 out, and its standby_gone the standby.
    promo = [ev("promotion", 20, host="n2", node_rank=1, cycle=1, slot=0, lost=0, standby=2),
             ev("rank_started", 30, host="n1", node_rank=0, cycle=2, rank=0)]
    v = core.check_taken_out(promo)
    assert [i for i, _ in v] == ["a node taken out of the job never comes back"], v
    gone = [ev("standby_gone", 20, host="n2", node_rank=1, node=2, reason="no sign of life", ready=0),
            ev("standby", 30, host="n3", node_rank=2, cycle=1)]
    assert len(core.check_taken_out(gone)) == 1
    # Another node's cycle_ended names a loss it saw, not a decision: node rank 0's alone count.
    seen = [ev("cycle_ended", 20, host="n2", node_rank=1, cycle=0, end="failed", node=2, reason="node 2 was lost"),
            ev("rank_started", 30, host="n3", node_rank=2, cycle=1, rank=1)]
    assert core.check_taken_out(seen) == []


def test_the_store_outsides_lines_are_its_refusals_as_node_rank_0_records_them():
    said = ("vigil's store turned away 59 connection(s) that did not prove the job's secret (since it started: "
            "60 sent bytes that are not the handshake, 0 a wrong secret, 2 closed in their handshake, 0 over the "
            "handshake budget); the last from 127.0.0.1:5000: not the store's handshake")
    lines = [(100.0, "listening on 127.0.0.1:4000"), (101.0, said), (102.0, "job \"x\" joined: --nnodes 2")]
    (e,) = core.outside_store_refusals(lines)
    assert e == {"event": "store_refused", "outside": True, "ts": 101.0, "new": 59, "bad_bytes": 60,
                 "wrong_secret": 0, "closed_in_handshake": 2, "over_budget": 0}, e
    junk = {"kind": "store_junk", "t": 99.0}
    assert core.evidence(junk, [e], {}) == e
    assert core.evidence(dict(junk, t=300.0), [e], {}) is None  # long before the fault: not its trace
    assert core.evidence({"kind": "store_flood", "t": 99.0}, [e], {}) == e  # closed in their handshake
    # A run's check takes the store's lines for the store's faults.
    run = {"steps": {}, "events": [], "ledger": [{"allocation": 1, "decision": "finished"}],
           "goodput": {"breakdown": {"productive": 1.0}, "wall_s": 1.0, "goodput_fraction": 1.0},
           "slurm": {"Restarts": "0"}, "faults": [junk], "leftovers": [], "max_requeues": 3, "ended": True}
    assert "fault in the events" in [i for i, _ in core.check_run(run)]
    assert "fault in the events" not in [i for i, _ in core.check_run(dict(run, store_lines=lines))]

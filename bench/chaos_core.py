"""The pure parts of the chaos soak (bench/chaos.py): the fault catalog, the seeded fault schedule,
the invariants checked over what a job and vigil wrote, and the table. No I/O here: every function
takes parsed records (the ranks' step logs, vigil's events and ledger, `vigil goodput --json`,
Slurm's view of the job) and returns data, so tests/bench/test_chaos_core.py can feed it histories
that break each invariant.
"""
import random
import re
from collections import Counter, defaultdict

# kind -> (what it targets, what must show in vigil's events). `target`: "rank" (a rank of the
# current attempt), "active" (an agent that runs ranks), "standby" (a hot spare's agent), "job"
# (the Slurm job), "head" (node rank 0's agent, of a run with the store outside the job and a
# standby), "store" (node rank 0's store), "slurmd" (the slurmd of a node the job runs
# on), "ckpt" / "logs" (the run's checkpoint / log directory, a small tmpfs of its own).
CATALOG = {
    "rank_exit1": ("rank", "rank_exited of that pid with exit_code 1"),
    "rank_exit0_early": ("rank", "rank_exited of that pid with exit_code 0 before the job finished"),
    "rank_sigkill": ("rank", "rank_exited of that pid with signal 9"),
    "rank_sigsegv": ("rank", "rank_exited of that pid with signal 11"),
    "rank_sigstop": ("rank", "hang of that pid, stopped: true"),
    "rank_section_hang": ("rank", "hang of that pid, not stopped (its heartbeat or its section timed out)"),
    "agent_sigkill": ("active", "the node lost: cycle_ended lost naming it, or a promotion of its slot"),
    "agent_sigstop": ("active", "the node lost (as agent_sigkill) or its agent's suspended event"),
    "agent_sigterm": ("active", "stop_triggered SIGTERM logged by that node"),
    "standby_sigkill": ("standby", "an event naming the standby lost"),
    "standby_sigstop": ("standby", "an event naming the standby lost, or its suspended event"),
    "standby_sigterm": ("standby", "stop_triggered SIGTERM logged by the standby, or it lost"),
    "scancel_usr1": ("job", "stop_triggered SIGUSR1, or rank_signalled with SIGUSR1"),
    "scontrol_requeue": ("job", "stop_triggered SIGTERM (Slurm's requeue signals every step)"),
    "preempt": ("job", "stop_triggered SIGTERM (the preemption's signal)"),
    "time_limit": ("job", "stop_triggered time-limit or end-time"),
    "store_junk": ("store", "store_refused of node rank 0 (or the store outside's line) counting bad_bytes"),
    "store_flood": ("store", "store_refused of node rank 0 (or the store outside's line) counting closed_in_handshake or over_budget"),
    "inprocess_kill": ("rank", "generation naming that rank, or in_process_declined (a whole restart, with its reason)"),
    "head_sigkill": ("head", "promotion of node rank 0's slot (lost 0), in the same allocation"),
    "slurmd_kill": ("slurmd", None),
    "ckpt_full": ("ckpt", "rank_exited of the rank 0 whose save failed, exit_code not 0"),
    "logs_full": ("logs", "node rank 0's event log goes on once the space is freed: a record of it after that"),
}
# Faults vigil cannot see, so nothing of them is required in its events: a node's slurmd killed
# and started again within SlurmdTimeout leaves the job's steps (under their slurmstepd) running,
# and the job must simply go on (the other invariants).
UNSEEN = {k for k, (_, seen) in CATALOG.items() if seen is None}
# Faults that lose a node: a job may lose one per run (a second leaves too few nodes on the
# 3-node test cluster for the requeued job, which then waits in the queue for ever).
NODE_LOSS = {"agent_sigkill", "agent_sigstop", "head_sigkill"}
SPARE_ONLY = {"standby_sigkill", "standby_sigstop", "standby_sigterm"}
# Faults only a run with in-process restarts gets (`--in-process-restarts`, the restartable job).
INPROCESS_ONLY = {"inprocess_kill"}
# Faults only a run with the store outside the job (`vigil store` beside the cluster, every agent
# its client) and a standby gets: there losing node rank 0 is a promotion, not a requeue.
OUTSIDE_ONLY = {"head_sigkill"}
# Faults aimed at the job's store: node rank 0's agent's, or `vigil store` in a run with the store
# outside the job (then seen in its lines, [outside_store_refusals]).
STORE_KINDS = {"store_junk", "store_flood"}


def plan_run(seed: int, index: int, kinds=None, first_s: float = 20.0, span_s: float = 110.0,
             gap_s: float = 12.0) -> dict:
    """The plan of run `index` of the soak seeded `seed`, the same on every call: whether the job
    has a hot spare, in-process restarts, the store outside the job, its faults as [{"at": seconds after the ranks' first step, "kind": ...,
    "pick": a number in [0, 1) that chooses the target among those alive then}]."""
    rng = random.Random(f"vigil-chaos:{seed}:{index}")
    kinds = sorted(kinds or CATALOG)
    spare = rng.random() < 0.4
    # Drawn apart, so that the other draws of a plan do not depend on it.
    # Only with a kind that needs it: a plan of the kinds of an older catalog is what it was.
    inprocess = bool(set(kinds) & INPROCESS_ONLY) and (
        set(kinds) <= INPROCESS_ONLY or random.Random(f"vigil-chaos-inprocess:{seed}:{index}").random() < 0.3)
    # The same for the store outside the job; its kinds alone force it, with the standby they need.
    outside = bool(set(kinds) & OUTSIDE_ONLY) and (
        set(kinds) <= OUTSIDE_ONLY or random.Random(f"vigil-chaos-outside:{seed}:{index}").random() < 0.3)
    spare = spare or set(kinds) <= OUTSIDE_ONLY
    allowed = [k for k in kinds if (spare or k not in SPARE_ONLY | OUTSIDE_ONLY)
               and (inprocess or k not in INPROCESS_ONLY) and (outside or k not in OUTSIDE_ONLY)]
    n = rng.randint(2, 4)
    times, t = [], first_s
    for _ in range(n):
        t += rng.uniform(0, (span_s - first_s) / n)
        times.append(round(t, 1))
        t += gap_s
    faults, lost = [], False
    for at in times:
        pool = [k for k in allowed if not (lost and k in NODE_LOSS)]
        if not pool:
            break  # only node losses asked for, and the run had its one
        kind = rng.choice(pool)
        lost = lost or kind in NODE_LOSS
        faults.append({"at": at, "kind": kind, "pick": rng.random()})
    return {"seed": seed, "index": index, "spare": spare, "inprocess": inprocess, "outside": outside,
            "faults": faults}


def _sig(v):
    names = {"SIGKILL": 9, "SIGSEGV": 11, "SIGTERM": 15, "SIGUSR1": 10, "SIGSTOP": 19}
    if isinstance(v, str):
        return names.get(v.upper(), names.get("SIG" + v.upper()))
    return v


def evidence(fault: dict, events: list, node_ranks: dict, window_s: float = 150.0):
    """The first event that records `fault` as what it was, or None.

    fault: {"kind", "t" (unix time injected), "pid" (rank faults), "host" (agent faults)}.
    events: every node's events. node_ranks: host name -> node rank (from the events)."""
    kind, t0 = fault["kind"], fault["t"]
    host = fault.get("host")
    nr = node_ranks.get(host)
    near = [e for e in events if t0 - 2 <= e.get("ts", 0) <= t0 + window_s]

    def lost(e):
        # `end` is "lost", or "failed" with the reason naming the node lost (seen on a frozen agent).
        if e["event"] == "cycle_ended" and e.get("node") == nr and (
                e.get("end") == "lost" or "lost" in str(e.get("reason", ""))):
            return True
        if e["event"] == "promotion" and e.get("lost") == nr:
            return True
        # Node rank 0 hosts the store: the others see its loss as the store's connection lost.
        if nr == 0 and e["event"] in ("cycle_ended", "result") and "node rank 0's store" in str(e.get("reason", "")):
            return True
        return e["event"] == "result" and e.get("outcome") == "lost" and e.get("node") == nr

    for e in near:
        ev = e["event"]
        if kind.startswith("rank_"):
            if e.get("pid") != fault.get("pid"):
                continue
            if kind == "rank_exit1" and ev == "rank_exited" and e.get("exit_code") == 1:
                return e
            if kind == "rank_exit0_early" and ev == "rank_exited" and e.get("exit_code") == 0:
                return e
            if kind in ("rank_sigkill", "rank_sigsegv") and ev == "rank_exited":
                if _sig(e.get("signal")) == (9 if kind == "rank_sigkill" else 11):
                    return e
            if kind == "rank_sigstop" and ev == "hang" and e.get("stopped"):
                return e
            # The rank sleeps inside section "step": whichever of its heartbeat and its section
            # timeout runs out first names it (with --heartbeat-timeout 15 and step=15 kept, the
            # heartbeat, last sent before the section opened).
            if kind == "rank_section_hang" and ev == "hang" and not e.get("stopped") and (
                e.get("timeout") in ({"section": "step"}, "heartbeat")
            ):
                return e
        elif kind == "inprocess_kill":
            if ev == "generation" and fault.get("rank") in (e.get("ranks") or []):
                return e
            if ev == "in_process_declined" and e.get("reason"):
                return e
        elif kind == "head_sigkill":
            # The standby takes node rank 0's slot; the allocation ending (75, lost) is not it.
            if ev == "promotion" and e.get("lost") == 0:
                return e
        elif kind in ("agent_sigkill", "standby_sigkill"):
            if lost(e):
                return e
        elif kind in ("agent_sigstop", "standby_sigstop"):
            if lost(e) or (ev == "suspended" and e.get("host") == host):
                return e
        elif kind in ("agent_sigterm", "standby_sigterm"):
            if signalled(e, 15) and e.get("host") == host:
                return e
            if kind == "standby_sigterm" and lost(e):
                return e
        elif kind == "scancel_usr1":
            if signalled(e, 10):
                return e
            if ev == "rank_signalled" and _sig(e.get("signal")) == 10:
                return e
        elif kind in ("scontrol_requeue", "preempt"):
            if signalled(e, 15):
                return e
        elif kind == "time_limit":
            if ev == "stop_triggered" and e.get("trigger") in ("time-limit", "end-time"):
                return e
        elif kind == "logs_full":
            if e.get("node_rank") == 0 and e.get("ts", 0) > fault["freed_t"]:
                return e
        elif kind == "ckpt_full":
            if ev == "rank_exited" and e.get("pid") == fault.get("save_pid") and e.get("exit_code") not in (0, None):
                return e
        elif kind in STORE_KINDS and ev == "store_refused" and (e.get("node_rank") == 0 or e.get("outside")):
            if e.get("new", 0) > 0 and refused_as(kind, e):
                return e
    return None


def failed_save(rank0, t0, t1):
    """The save rank 0 began while its checkpoint directory was full (`t0` to `t1`) and never
    finished: (pid, step), or None when it began none then (the fault was not exercised).
    rank0: rank 0's step records."""
    done = {(r["pid"], r["step"]) for r in rank0 if r["ev"] == "saved"}
    for r in rank0:
        if r["ev"] == "saving" and t0 <= r["t"] <= t1 and (r["pid"], r["step"]) not in done:
            return r["pid"], r["step"]
    return None


_TURNED_AWAY = re.compile(
    r"vigil's store turned away (?P<new>\d+) connection\(s\) .*\(since it started: (?P<bad_bytes>\d+) sent bytes "
    r"that are not the handshake, (?P<wrong_secret>\d+) a wrong secret, (?P<closed_in_handshake>\d+) closed in "
    r"their handshake, (?P<over_budget>\d+) over the handshake budget\)")


def outside_store_refusals(lines):
    """`store_refused` events (marked `outside`) from the lines `vigil store` printed, each with
    the time it was read: [(unix time, line)]. The service says what node rank 0's agent records."""
    out = []
    for t, line in lines:
        m = _TURNED_AWAY.search(line)
        if m:
            out.append({"event": "store_refused", "outside": True, "ts": t,
                        **{k: int(v) for k, v in m.groupdict().items()}})
    return out


def refused_as(kind, e):
    """A `store_refused` record counts what `kind` does: junk is bytes that are not the store's
    handshake; a flood, connections closed in their handshake or over its budget."""
    if kind == "store_junk":
        return e.get("bad_bytes", 0) > 0
    return e.get("closed_in_handshake", 0) + e.get("over_budget", 0) > 0


def signalled(e, signum):
    """The agent took signal `signum`: a stop at a step for it (`stop_triggered`), or, when no rank
    was stepping yet, its ranks stopped for it (`stop` reason `signal`) or its own verdict."""
    ev = e["event"]
    if ev == "stop_triggered":
        return _sig(e.get("trigger")) == signum
    if ev == "stop" and e.get("reason") == "signal":
        return _sig(e.get("signal")) == signum
    return ev == "result" and e.get("outcome") == "signaled" and _sig(e.get("signal")) == signum


def node_ranks_of(events: list) -> dict:
    """host -> node rank, from the events' own fields."""
    out = {}
    for e in events:
        if "host" in e and "node_rank" in e:
            out.setdefault(e["host"], e["node_rank"])
    return out


def check_run(run: dict) -> list:
    """Every invariant over one finished run; returns [(invariant, detail)].

    run: {"steps": {rank: [records]}, "events": [...], "ledger": [...], "goodput": dict or None,
    "slurm": {"JobState", "Restarts"}, "faults": [applied faults], "leftovers": [pids],
    "max_requeues": int, "ended": bool (the job reached a terminal state in time),
    "gp_tolerance": fraction}"""
    v = []
    v += check_ended(run)
    v += check_ledger(run["ledger"], run["slurm"], run["max_requeues"])
    v += check_steps(run["steps"])
    v += check_stops(run["ledger"], run["steps"])
    v += check_no_rank_after_end(run["ledger"], run["steps"])
    v += [("no process outlives the job", f"pids {run['leftovers']} still alive")] if run["leftovers"] else []
    v += check_goodput(run.get("goodput"), run["steps"], run.get("gp_tolerance", 0.10))
    v += check_generations(run["events"])
    v += check_taken_out(run["events"])
    nr = node_ranks_of(run["events"])
    with_store = run["events"] + outside_store_refusals(run.get("store_lines", []))
    for f in run["faults"]:
        if f.get("superseded") or f["kind"] in UNSEEN:
            continue  # the fault never came due (another one ended its allocation first), or vigil cannot see it
        if evidence(f, with_store if f["kind"] in STORE_KINDS else run["events"], nr) is None:
            v.append(("fault in the events", f"{f['kind']} at {f['t']:.1f} ({_target(f)}) not recorded"))
    return v


def _target(f):
    if "save_pid" in f:
        return f"rank 0 pid {f['save_pid']} saving step {f.get('save_step')}"
    return f"pid {f['pid']} rank {f.get('rank')}" if "pid" in f else f"host {f.get('host', '-')}"


def check_ended(run):
    if not run["ended"]:
        return [("the job ends", f"not ended: {run['slurm']}")]
    led = run["ledger"]
    if not led:
        return [("the job ends", "no ledger record")]
    last = led[-1]
    if last.get("decision") == "finished":
        return []
    if last.get("decision") == "stop" and last.get("why"):
        return []
    return [("the job ends", f"last allocation decided {last.get('decision')!r}: {last.get('why')!r}")]


def check_ledger(ledger, slurm, max_requeues):
    v = []
    nums = [r.get("allocation") for r in ledger]
    if nums != list(range(1, len(nums) + 1)):
        v.append(("every allocation in the ledger once", f"allocations {nums}"))
    restarts = int(slurm.get("Restarts", "0") or 0)
    if ledger and len(ledger) != restarts + 1:
        v.append(("every allocation in the ledger once", f"{len(ledger)} records, Slurm Restarts={restarts}"))
    if len(ledger) > max_requeues + 1:
        v.append(("the job never loops", f"{len(ledger)} allocations, --max-requeues {max_requeues}"))
    # Every allocation but the last was followed by another: its record says requeue (by vigil or,
    # `scontrol requeue` or a preemption, by Slurm), or that Slurm ran the job again over a stop.
    for r in ledger[:-1]:
        if r.get("decision", "requeue") != "requeue" and "runs again unless cancelled" not in r.get("why", ""):
            v.append(("the ledger says why each allocation ended",
                      f"allocation {r.get('allocation')} decided {r.get('decision')!r} ({r.get('why')!r}), "
                      "yet the job ran again"))
    return v


def _lineage(steps):
    """Per rank, its records in order, split into runs (one per start record)."""
    out = {}
    for rank, recs in steps.items():
        runs, cur = [], None
        for r in recs:
            if r["ev"] == "start":
                cur = {"start": r, "recs": []}
                runs.append(cur)
            elif cur is not None:
                cur["recs"].append(r)
        out[rank] = runs
    return out


def check_steps(steps):
    """Steps only go backward to a checkpoint, never past one: every start resumes from the step
    after the latest checkpoint rank 0 had written (or begun writing) by then, or 0 without one."""
    v = []
    saves = sorted((r["t"], r["step"], r["ev"]) for r in steps.get(0, []) if r["ev"] in ("saving", "saved"))
    for rank, runs in _lineage(steps).items():
        for run in runs:
            s = run["start"]
            if s.get("generation"):
                v += _check_generation(rank, s, steps)
                continue
            before = [(t, st, ev) for t, st, ev in saves if t <= s["t"]]
            done = [st for _, st, ev in before if ev == "saved"]
            begun = {st for _, st, ev in before if ev == "saving"}
            want = max(done) + 1 if done else 0
            got = s["resumed_from"]
            if got != want and not (got - 1 in begun and got - 1 >= want - 1):
                v.append(("steps go back only to a checkpoint",
                          f"rank {rank} alloc {s['alloc']} attempt {s['attempt']} resumed from {got}, "
                          f"last checkpoint {want - 1}"))
            if s.get("mismatch"):
                v.append(("steps go back only to a checkpoint", f"rank {rank} loaded {s['mismatch']}"))
            prev = None
            for r in run["recs"]:
                if r["ev"] == "step":
                    if prev is not None and r["step"] != prev + 1:
                        v.append(("steps go back only to a checkpoint",
                                  f"rank {rank} stepped {prev} -> {r['step']} within one attempt"))
                    prev = r["step"]
    return v


def _check_generation(rank, s, steps):
    """An in-process restart's start (generation > 0) goes on where the survivors were: from the
    step after the last one any rank of that attempt recorded before it, or one more (a survivor
    may have finished a step it had not yet written down). Neither back to a checkpoint (nothing
    is redone) nor further (nothing skipped)."""
    done = [r["step"] for recs in steps.values() for r in recs
            if r["ev"] == "step" and r.get("alloc") == s["alloc"] and r.get("attempt") == s["attempt"]
            and r["t"] <= s["t"]]
    want = max(done) + 1 if done else 0
    if s["resumed_from"] in (want, want + 1):
        return []
    return [("an in-process restart goes on where the survivors were",
             f"rank {rank} alloc {s['alloc']} attempt {s['attempt']} generation {s['generation']} "
             f"resumed from {s['resumed_from']}, the last step done {want - 1}")]


def check_generations(events, grace_s: float = 5.0):
    """Every in-process generation a node begins (`generation`) recovers there
    (`generation_recovered`, its ranks back in their training function): the survivors and the
    replacement of a generation take about a second, so one that is still recovering when its
    attempt ends (another failure ends it, declined as "during recovery") is stuck. One whose
    attempt ended within `grace_s` of its start was cut short, not stuck: a second rank failing
    with the first (both blocked on a third that left) ends it as the escalation rules say
    (docs/inprocess.md: a failure during recovery restarts the whole job)."""
    begun, recovered, ended = {}, set(), {}
    for e in events:
        key = (e.get("node_rank"), e.get("cycle"), e.get("generation"))
        if e["event"] == "generation":
            begun.setdefault(key, e["ts"])
        elif e["event"] == "generation_recovered":
            recovered.add(key)
        elif e["event"] == "cycle_ended":
            ended.setdefault((e.get("node_rank"), e.get("cycle")), e["ts"])
    cut_short = {k for k, ts in begun.items() if ended.get(k[:2], ts + grace_s + 1) <= ts + grace_s}
    return [("an in-process restart recovers on every node",
             f"node {nr} attempt {att} generation {g} (begun at {ts:.1f}) never recovered")
            for (nr, att, g), ts in sorted(begun.items(), key=lambda kv: kv[1])
            if (nr, att, g) not in recovered and (nr, att, g) not in cut_short]


# What a node does when it is in the job: runs ranks (`cycle_start`, `rank_started`), or joins an
# attempt (`joined`) or stands by in it (`standby`).
RUNS_RANKS = {"cycle_start", "rank_started"}
IN_THE_JOB = RUNS_RANKS | {"joined", "standby"}


def taken_out(e):
    """What the coordinator's record `e` takes out of the job: (node, what it may no longer do), or
    None. A node lost (its attempt ended as `node N was lost`) or a standby gone (`standby_gone`)
    is never a member again (docs/spares.md); a node whose slot a standby took (`promotion`: lost
    or to blame) never runs ranks again, though one to blame may stay as a standby."""
    ev = e["event"]
    # Only the coordinator writes `promotion` and `standby_gone`: node rank 0, or, with the store
    # outside the job, the lowest node left once node rank 0's agent was lost.
    if e.get("node_rank") != 0 and ev not in ("promotion", "standby_gone"):
        return None
    if ev == "standby_gone":
        return e.get("node"), IN_THE_JOB
    if ev == "cycle_ended" and e.get("node") is not None and f"node {e['node']} " in str(e.get("reason", "")) \
            and "was lost" in str(e.get("reason", "")):
        return e["node"], IN_THE_JOB
    if ev == "promotion":
        return e.get("lost"), RUNS_RANKS
    return None


def check_taken_out(events):
    """A node taken out of the job by node rank 0 never comes back in the same allocation: after
    the record that takes it out and before node rank 0's `result` (its allocation's end), no
    record of that node says it ran ranks, joined an attempt or stood by (a frozen agent, woken,
    must read that it was dropped and leave). Node ranks are the allocation's: a requeued
    allocation starts with every node in the job again, from node rank 0's agent's first record
    (`containment`; its `result` may be missing where Slurm killed it)."""
    v, out = [], {}
    for e in sorted(events, key=lambda e: e.get("ts", 0)):
        if e.get("node_rank") == 0 and e["event"] in ("result", "containment"):
            out = {}
            continue
        took = taken_out(e)
        if took and took[0] is not None:
            node, banned = took
            had = out.get(node)
            out[node] = (had[0], had[1] | banned) if had else (e, banned)
            continue
        had = out.get(e.get("node_rank"))
        if had and e["event"] in had[1]:
            why = had[0]
            v.append(("a node taken out of the job never comes back",
                      f"node {e['node_rank']} ({e.get('host')}) {e['event']} cycle {e.get('cycle')} at "
                      f"{e['ts']:.1f}, taken out at {why['ts']:.1f} ({why['event']})"))
    return v


def check_stops(ledger, steps):
    """Every allocation stopped at a step (signal, time limit) saved that step on every rank."""
    v = []
    for rec in ledger:
        # A stop with no step (`stop_step` null: the ranks were not stepping yet) saves nothing new.
        if rec.get("outcome") != "stopped" or rec.get("stop_step") is None:
            continue
        s, alloc = rec["stop_step"], rec["allocation"] - 1
        for rank, recs in steps.items():
            mine = [r for r in recs if r.get("alloc") == alloc]
            if not any(r["ev"] == "step" for r in mine):
                continue  # a rank that did not run in this allocation (a spare's slot, a lost node)
            last = [r for r in mine if r["ev"] == "stopped"]
            if not last or last[-1]["step"] != s:
                v.append(("a stop saves one step on every rank",
                          f"allocation {alloc + 1} stopped at {s}, rank {rank} stopped at "
                          f"{last[-1]['step'] if last else None}"))
        saved = [r["step"] for r in steps.get(0, []) if r["ev"] == "saved" and r.get("alloc") == alloc]
        if s not in saved:
            v.append(("a stop saves one step on every rank", f"allocation {alloc + 1}: step {s} not saved"))
    return v


def check_no_rank_after_end(ledger, steps, slack_s: float = 1.0):
    """No rank stepped after vigil said its allocation ended (the ledger's end). Under Slurm a
    stop for a SIGTERM is recorded as soon as its step is agreed (docs/allocations.md): its `end`
    is the agreement, and the ranks run on to the agreed `stop_step`, no further."""
    v = []
    ends = {r["allocation"] - 1: r.get("end") for r in ledger}
    until = {r["allocation"] - 1: r.get("stop_step") for r in ledger if r.get("outcome") == "stopped"}
    for rank, recs in steps.items():
        for r in recs:
            end = ends.get(r.get("alloc"))
            stop_step = until.get(r.get("alloc"))
            if stop_step is not None and r["ev"] == "step" and r["step"] <= stop_step:
                continue
            if r["ev"] == "step" and end is not None and r["t"] > end + slack_s:
                v.append(("no rank runs after the job stopped",
                          f"rank {rank} step {r['step']} at {r['t']:.2f}, allocation {r['alloc'] + 1} "
                          f"ended {end:.2f}"))
                break
    return v


def kept_step_time(recs):
    """The job's own goodput in seconds from rank 0's records: the time of each step (since the
    previous step of the same attempt) whose progress was kept, that is, not done again later."""
    runs, cur = [], None
    for r in recs:
        if r["ev"] == "start":
            cur = {"from": r["resumed_from"], "steps": []}
            runs.append(cur)
        elif r["ev"] == "step" and cur is not None:
            cur["steps"].append((r["t"], r["step"]))
    total = 0.0
    for i, run in enumerate(runs):
        redo_from = min([later["from"] for later in runs[i + 1:]], default=None)
        pts = run["steps"]
        for (t0, _), (t1, s1) in zip(pts, pts[1:]):
            if redo_from is None or s1 < redo_from:
                total += t1 - t0
    return total


def check_goodput(gp, steps, tolerance):
    if gp is None:
        return [("goodput adds up", "vigil goodput gave no answer")]
    v = []
    b, wall = gp["breakdown"], gp["wall_s"]
    if abs(sum(b.values()) - wall) > 1e-3 or any(x < 0 for x in b.values()):
        v.append(("goodput adds up", f"categories sum {sum(b.values()):.3f} != wall {wall:.3f}: {b}"))
    if wall > 0 and 0 in steps:
        own = kept_step_time(steps[0]) / wall
        if abs(own - gp["goodput_fraction"]) > tolerance:
            v.append(("goodput agrees with the job's step log",
                      f"vigil {gp['goodput_fraction']:.3f}, the job's own {own:.3f} of {wall:.0f}s"))
    return v


def table(results: list) -> str:
    """results: [{"seed", "index", "faults": [{"kind", "at_s"}], "survived": bool, "violations":
    [(invariant, detail, at_s)], "requeues", "goodput"}]. The soak's one table and last line."""
    by_kind = defaultdict(lambda: [0, 0])
    for r in results:
        for f in r["faults"]:
            by_kind[f["kind"]][0] += 1
            by_kind[f["kind"]][1] += 1 if r["survived"] else 0
    lines = ["| fault | injected | survived |", "|---|---|---|"]
    for k in sorted(by_kind):
        lines.append(f"| {k} | {by_kind[k][0]} | {by_kind[k][1]} |")
    lines += ["", "| seed | run | faults | ended | requeues | goodput | violations |", "|---|---|---|---|---|---|---|"]
    for r in results:
        gp = f"{r['goodput']:.1%}" if r.get("goodput") is not None else "-"
        lines.append(f"| {r['seed']} | {r['index']} | {', '.join(f['kind'] for f in r['faults']) or '-'} | "
                     f"{r.get('end', '-')} | {r['requeues']} | {gp} | {len(r['violations'])} |")
    viol = [(r["seed"], r["index"], *x) for r in results for x in r["violations"]]
    if viol:
        lines += ["", "| seed | run | at (s into the soak) | invariant | detail |", "|---|---|---|---|---|"]
        for seed, idx, inv, detail, at in viol:
            lines.append(f"| {seed} | {idx} | {at:.0f} | {inv} | {detail} |")
    faults = sum(len(r["faults"]) for r in results)
    survived = sum(len(r["faults"]) for r in results if r["survived"])
    lines += ["", f"chaos: {faults} faults, {survived} survived, {len(viol)} violations"]
    return "\n".join(lines)


def count_kinds(results):
    return Counter(f["kind"] for r in results for f in r["faults"])

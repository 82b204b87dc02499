"""Self-test of the local Slurm cluster, and the facts about Slurm that vigil builds on
(docs/slurm-testing.md): what a job step's tasks see, and what srun does when one task fails."""
from pathlib import Path

from .slurmlib import parse_show_job, read_env_file, sbatch, slurm_cmd, wait_for_path, wait_job


def output(workdir: Path, job_id: int) -> str:
    p = Path(workdir) / f"slurm-{job_id}.out"
    return p.read_text() if p.exists() else "(no output file)"


def completed(job_id: int, workdir: Path, timeout=120) -> dict:
    info = wait_job(job_id, timeout=timeout)
    assert info["JobState"] == "COMPLETED", f"{info}\n--- output:\n{output(workdir, job_id)}"
    return info


def test_two_node_job_gives_each_step_task_its_node(slurm_cluster, tmp_path):
    job_id = sbatch(
        f"""#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=1
env | sort > {tmp_path}/batch.env
export SET_IN_BATCH=yes
srun bash -c 'env | sort > {tmp_path}/step_$SLURM_NODEID.env'
""",
        tmp_path,
        extra_args=["--export=ALL,SET_BY_SUBMITTER=probe"],
    )
    info = completed(job_id, tmp_path)
    assert info["ExitCode"] == "0:0"
    assert info["NodeList"] == "n[1-2]"
    assert info["NumNodes"] == "2"
    assert info["BatchHost"] == "n1"
    assert info["Restarts"] == "0"

    batch = read_env_file(tmp_path / "batch.env")
    assert batch["SLURM_JOB_ID"] == str(job_id)
    assert batch["SLURM_NNODES"] == "2"
    assert batch["SLURM_NODEID"] == "0"
    assert batch["SLURMD_NODENAME"] == "n1"
    assert batch["SLURM_JOB_NODELIST"] == batch["SLURM_NODELIST"] == "n[1-2]"
    assert batch["SET_BY_SUBMITTER"] == "probe"
    # The batch script is not a step: no step variables, and no restart count before a requeue.
    for absent in ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NODELIST", "SLURM_RESTART_COUNT"):
        assert absent not in batch, absent
    # ...but it looks like task 0 of the allocation: an agent started outside srun would think so.
    assert batch["SLURM_PROCID"] == batch["SLURM_LOCALID"] == "0" and batch["SLURM_NTASKS"] == "2"
    # slurmd tells jobs where the config is (also when the submitter had no SLURM_CONF).
    assert batch["SLURM_CONF"] == str(slurm_cluster.conf)

    steps = {}
    for node_id, node in enumerate(slurm_cluster.nodes[:2]):  # the job has two nodes
        f = tmp_path / f"step_{node_id}.env"
        assert f.exists(), f"no env from node {node_id}\n--- output:\n{output(tmp_path, job_id)}"
        steps[node_id] = env = read_env_file(f)
        assert env["SLURM_NODEID"] == str(node_id)
        assert env["SLURM_PROCID"] == str(node_id)
        assert env["SLURM_LOCALID"] == "0"
        assert env["SLURMD_NODENAME"] == node
        assert env["SLURM_JOB_ID"] == str(job_id)
        assert env["SLURM_NNODES"] == env["SLURM_STEP_NUM_NODES"] == "2"
        assert env["SLURM_NTASKS"] == env["SLURM_STEP_NUM_TASKS"] == "2"
        assert env["SLURM_STEP_ID"] == env["SLURM_STEPID"] == "0"
        for var in ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_NODELIST"):
            assert env[var] == "n[1-2]", var
        assert "SLURM_RESTART_COUNT" not in env
        # srun passes the batch script's environment through, including the submitter's.
        assert env["SET_IN_BATCH"] == "yes"
        assert env["SET_BY_SUBMITTER"] == "probe"
    # Both nodes are this host: only SLURMD_NODENAME / SLURM_NODEID tell them apart.
    assert steps[0]["SLURM_TOPOLOGY_ADDR"] == "n1" and steps[1]["SLURM_TOPOLOGY_ADDR"] == "n2"


def test_node_addresses_come_from_scontrol(slurm_cluster):
    # Node names need not resolve (here they do not); the controller knows each node's address.
    for node in slurm_cluster.nodes:
        out = slurm_cmd("scontrol", "show", "node", "-o", node).stdout
        info = parse_show_job(out)
        assert info["NodeName"] == node
        assert info["NodeAddr"] == "127.0.0.1"


# Task 1 fails; task 0 logs the signals it gets and waits (bounded) until srun has reported task
# 1's exit in the job output, then for a kill that would follow it.
BAD_EXIT_TASK = r"""#!/bin/bash
log={dir}/task$SLURM_NODEID.log
echo start > $log
for s in TERM INT HUP CONT USR1 USR2; do
    trap "echo got $s >> $log; [ $s = TERM ] && exit 143" $s
done
if [ "$SLURM_NODEID" = 1 ]; then echo exit3 >> $log; exit 3; fi
for i in $(seq 600); do
    grep -q 'task 1: Exited with exit code 3' {dir}/slurm-$SLURM_JOB_ID.out && break
    sleep 0.1
done
# srun acts on a bad exit as soon as it reports it (measured: within 10 ms); 2 s is a wide margin.
for i in $(seq 20); do sleep 0.1; done
echo survived >> $log
"""


def submit_bad_exit_job(workdir: Path, srun_opts: str) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "task.sh").write_text(BAD_EXIT_TASK.format(dir=workdir))
    script = f"""#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=1
srun {srun_opts} bash {workdir}/task.sh
echo "srun rc=$?"
"""
    return sbatch(script, workdir)


def bad_exit_result(workdir: Path, job_id: int) -> tuple:
    """(job output, task 0's log lines, task 1's log lines) once the job completed."""
    completed(job_id, workdir)
    logs = ((workdir / f"task{i}.log").read_text().splitlines() for i in (0, 1))
    return output(workdir, job_id), *logs


def test_srun_leaves_the_other_tasks_running_when_one_exits_nonzero(slurm_cluster, tmp_path):
    # Slurm's defaults (KillOnBadExit=0, WaitTime=0) and an explicit --kill-on-bad-exit=0 agree.
    variants = ((tmp_path / "default", ""), (tmp_path / "kob0", "--kill-on-bad-exit=0"))
    jobs = {d: submit_bad_exit_job(d, opts) for d, opts in variants}
    for d, job_id in jobs.items():
        out, task0, task1 = bad_exit_result(d, job_id)
        assert task1 == ["start", "exit3"], out
        assert task0 == ["start", "survived"], out  # no signal at all
        assert "srun rc=3" in out, out


def test_kill_on_bad_exit_sends_sigterm_to_the_other_tasks(slurm_cluster, tmp_path):
    job_id = submit_bad_exit_job(tmp_path, "--kill-on-bad-exit=1")
    out, task0, task1 = bad_exit_result(tmp_path, job_id)
    assert task1 == ["start", "exit3"]
    assert "survived" not in task0, out
    # slurmstepd sends SIGCONT and SIGTERM (the task exits on it; SIGKILL follows KillWait later).
    assert "got TERM" in task0, task0
    assert "srun rc=" in out and "srun rc=0" not in out, out


def test_requeue_restarts_the_job_with_a_restart_count(slurm_cluster, tmp_path):
    job_id = sbatch(
        f"""#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=1 --open-mode=append
n=$(ls {tmp_path}/batch_*.env 2>/dev/null | wc -l)
env | sort > {tmp_path}/batch_$n.env
srun bash -c "env | sort > {tmp_path}/step_${{n}}_\\$SLURM_NODEID.env"
touch {tmp_path}/ran_$n
[ $n -ge 1 ] && exit 0
sleep 300  # ended by the requeue
""",
        tmp_path,
    )
    # The first run's step has finished (its files are complete) and the batch script sleeps.
    wait_for_path(tmp_path / "ran_0", timeout=120)
    slurm_cmd("scontrol", "requeue", str(job_id))
    info = completed(job_id, tmp_path)
    assert info["Restarts"] == "1"
    for n, count in ((0, None), (1, "1")):
        files = [tmp_path / f"batch_{n}.env"] + [tmp_path / f"step_{n}_{i}.env" for i in (0, 1)]
        for f in files:
            env = read_env_file(f)
            assert env.get("SLURM_RESTART_COUNT") == count, f
            assert env["SLURM_JOB_ID"] == str(job_id), f


def test_one_task_per_node_in_a_multi_task_allocation_needs_ntasks(slurm_cluster, tmp_path):
    # Training jobs allocate several tasks per node (one per GPU); vigil wants one agent per node.
    # srun takes the batch script's SLURM_NTASKS=8 for --ntasks, so --ntasks-per-node=1 alone is
    # ignored (with a warning); -n $SLURM_NNODES makes it hold.
    job_id = sbatch(
        f"""#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=4
srun --ntasks-per-node=1 bash -c 'env | sort > {tmp_path}/a_$SLURM_PROCID.env'
srun --ntasks-per-node=1 -n $SLURM_NNODES bash -c 'env | sort > {tmp_path}/b_$SLURM_PROCID.env'
srun -N 2 -n 2 bash -c 'env | sort > {tmp_path}/c_$SLURM_PROCID.env'
""",
        tmp_path,
    )
    completed(job_id, tmp_path)
    out = output(tmp_path, job_id)
    assert "Ignoring --ntasks-per-node" in out, out

    a = [read_env_file(f) for f in sorted(tmp_path.glob("a_*.env"))]
    assert len(a) == 8
    assert {e["SLURM_STEP_NUM_TASKS"] for e in a} == {"8"}
    assert sorted(e["SLURMD_NODENAME"] for e in a) == ["n1"] * 4 + ["n2"] * 4

    for step in ("b", "c"):
        envs = [read_env_file(f) for f in sorted(tmp_path.glob(f"{step}_*.env"))]
        assert [e["SLURMD_NODENAME"] for e in envs] == ["n1", "n2"], step
        for node_id, e in enumerate(envs):
            assert e["SLURM_NODEID"] == e["SLURM_PROCID"] == str(node_id)
            assert e["SLURM_STEP_NUM_TASKS"] == "2" and e["SLURM_STEP_NUM_NODES"] == "2"
            assert e["SLURM_STEP_TASKS_PER_NODE"] == "1(x2)"
            assert e["SLURM_NTASKS"] == e["SLURM_NPROCS"] == "2"
            assert e["SLURM_TASKS_PER_NODE"] == "1(x2)"
            # srun sets SLURM_NTASKS_PER_NODE only when given --ntasks-per-node: otherwise the
            # task sees the allocation's. Only the SLURM_STEP_* variables always describe the step.
            assert e["SLURM_NTASKS_PER_NODE"] == ("1" if step == "b" else "4")

"""examples/toy_train.py under the real agent: a restart or a new start resumes from the checkpoint."""
import re

from harness import REPO, base_env, of, read_events, run_dirs, run_vigil

TOY = str(REPO / "examples" / "toy_train.py")


def rank_lines(run_dir, attempt, local_rank):
    return (run_dir / f"attempt_{attempt}" / str(local_rank) / "stdout.log").read_text().splitlines()


def resumed_step(lines):
    found = [int(m.group(1)) for m in (re.search(r"resumed from step (\d+)$", l) for l in lines) if m]
    assert len(found) == 1, lines
    return found[0]


def test_readme_command_crashes_once_and_the_restart_resumes_from_the_checkpoint(job):
    # The README's first command, with the logs kept in the test's scratch directory.
    r = run_vigil(
        ["run", "--nproc-per-node", "4", "--max-restarts", "1", "--log-dir", "logs",
         TOY, "--steps", "20", "--crash-at", "5"],
        cwd=job, env=base_env(), timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "rank 3: simulated crash at step 5" in r.stderr
    (run_dir,) = run_dirs(job / "logs")
    for lr in range(4):
        first, second = rank_lines(run_dir, 0, lr), rank_lines(run_dir, 1, lr)
        assert f"rank {lr}: starting at step 0" in first
        n = resumed_step(second)
        # The crash came at the start of step 5, so the last checkpoint is from before it.
        assert 0 < n < 5, second
        assert second[-1] == f"rank {lr}: done after 20 steps"
    # Rank 0 went on from the checkpoint: no step 0 in the second attempt, and its loss carried on
    # (10 * 0.9**16 after step 15, the same as without the crash).
    assert "[default0]:attempt 1 step 0 " not in r.stdout
    assert "[default0]:attempt 1 step 15 loss 1.853" in r.stdout
    ev = read_events(run_dir / "events.jsonl")
    assert [e["to_cycle"] for e in of(ev, "restart")] == [1]
    # Every rank's Progress messages were taken by the agent: no connection was dropped for them.
    assert of(ev, "ipc_rejected") == []


def test_a_new_start_of_the_same_job_resumes_where_the_last_one_ended(job):
    def start(steps):
        return run_vigil(
            ["run", "--nproc-per-node", "2", "--rdzv-id", "toyjob", "--log-dir", "logs",
             TOY, "--steps", str(steps)],
            cwd=job, env=base_env(), timeout=300,
        )

    first = start(10)
    assert first.returncode == 0, first.stderr
    assert "[default1]:rank 1: starting at step 0" in first.stdout
    second = start(20)
    assert second.returncode == 0, second.stderr
    for lr in range(2):
        assert f"[default{lr}]:rank {lr}: resumed from step 9" in second.stdout
        assert f"[default{lr}]:rank {lr}: done after 20 steps" in second.stdout
    assert "attempt 0 step 0 " not in second.stdout
    assert "[default0]:attempt 0 step 10 loss 3.138" in second.stdout  # 10 * 0.9**11
    # The checkpoints live next to the run directories, keyed by the job's identity.
    assert sorted(p.name for p in (job / "logs" / "toy_ckpt_toyjob").iterdir()) == ["rank0.json", "rank1.json"]

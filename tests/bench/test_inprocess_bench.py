"""bench/inprocess.py's count of redone steps: a step counts as redone only when a rank did it twice."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("inprocess_bench", ROOT / "bench" / "inprocess.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def firsts_after(rows, tk):
    after = {}
    for s, t, rank in rows:
        if t > tk and (rank not in after or t < after[rank][1]):
            after[rank] = (s, t)
    return after


def test_a_step_written_by_survivors_either_side_of_the_kill_is_not_redone():
    # Ranks 0 and 2 finished step 31's collectives together; rank 0 wrote it just before the kill
    # at t=10.0, rank 2 just after. Rank 1 (killed, then replaced) goes on at 32 from a peer.
    rows = [(30, 9.9, 0), (30, 9.9, 1), (30, 9.9, 2), (31, 9.99, 0), (31, 10.01, 2),
            (32, 10.3, 0), (32, 10.3, 1), (32, 10.3, 2)]
    assert bench.redone_at(rows, 10.0, firsts_after(rows, 10.0)) == 0


def test_a_whole_restart_from_the_checkpoint_redoes_the_steps_since_it():
    rows = [(s, 5 + s * 0.05, r) for s in range(1, 131) for r in range(2)]
    tk = 5 + 130 * 0.05 + 0.01
    rows += [(s, tk + 8 + s * 0.05, r) for s in range(101, 140) for r in range(2)]
    assert bench.redone_at(rows, tk, firsts_after(rows, tk)) == 30

"""Who a rendezvous waits for (field finding 35). Real agents on loopback, c10d without node ranks:
the second agent is frozen (SIGSTOP) right after the rendezvous handed it node rank 1, before it
joins; the third never starts. Node rank 0 says, every period while it waits (30 s, shortened here
by the hidden VIGIL_TEST_JOIN_NOTE_PERIOD_MS), which node ranks have not joined and the host of
the agent that took node rank 1, and its join timeout names them too. Bounds are failure limits,
never timing goals."""
import os
import re
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

from harness import wait_for  # noqa: E402
from test_c10d import C10d, listening  # noqa: E402

HANDED_OUT = "node 1 of 3 (handed out by the rendezvous)"


class Lines:
    """A process's stderr, read as it comes (a thread of its own), line by line."""

    def __init__(self, stream, on_line=None):
        self.lines, self.on_line = [], on_line
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        for line in stream:
            if self.on_line:
                self.on_line(line)
            self.lines.append(line)

    def text(self):
        return "".join(self.lines)


def frozen_job(job):
    """Node rank 0, and node rank 1 stopped as soon as it says its node rank. Returns the agents,
    node rank 0's stderr, and whether node rank 1 was stopped before it joined (it may win the race
    to its join: the note and the join are microseconds apart)."""
    c = C10d(job, 3, nproc=1, extra=["--join-timeout", "15", "--node-timeout", "300"],
             env={"VIGIL_TEST_JOIN_NOTE_PERIOD_MS": "300"})
    head = c.start()
    wait_for(lambda: listening(c.port) or head.poll() is not None, 60, "node rank 0's store")
    assert head.poll() is None, head.communicate()
    head_err = Lines(head.stderr)
    stopped = threading.Event()

    second = None

    def stop_on_rank(line):
        if HANDED_OUT in line and not stopped.is_set():
            os.kill(second.pid, signal.SIGSTOP)
            stopped.set()

    second = c.start(SLURMD_NODENAME="node-b")
    second_err = Lines(second.stderr, stop_on_rank)
    wait_for(stopped.is_set, 60, f"node 1 handed its node rank: {second_err.text()}")
    return c, head, second, head_err


def test_node_rank_0_names_the_frozen_node_and_its_host_before_the_join_timeout(job):
    for attempt in range(5):
        (job / f"try{attempt}").mkdir()
        c, head, second, head_err = frozen_job(job / f"try{attempt}")
        try:
            notes = lambda: re.findall(r"\[vigil\] attempt 0 has waited \d+s for node rank\(s\) [^\n]*",
                                       head_err.text())
            wait_for(notes, 30, f"node rank 0's note on who it waits for: {head_err.text()}")
            if "; 2 of 3 joined" in notes()[0]:
                print(f"try {attempt}: node 1 joined before the SIGSTOP reached it; again")
                continue
            want = (f"node rank(s) 1 (host node-b, pid {second.pid}: its agent took the node rank and "
                    "has not joined) and 2 (not started, or not reached the store); 1 of 3 joined "
                    "(--join-timeout 15s)")
            wait_for(lambda: any(want in n for n in notes()), 30, f"{want!r} in {notes()}")
            # The join timeout names them too.
            timed_out = "only 1 of 3 nodes joined attempt 0 within 15s (--join-timeout)"
            wait_for(lambda: timed_out in head_err.text(), 60, f"the join timeout: {head_err.text()}")
            # Node rank 0 keeps its store up for the agents still connected: end the frozen one.
            os.kill(second.pid, signal.SIGKILL)
            assert head.wait(timeout=60) == 75, head_err.text()
            head_err.thread.join(timeout=10)
            text = head_err.text()
            assert "only 1 of 3 nodes joined attempt 0 within 15s (--join-timeout): node rank(s) 1 (host node-b" in text, text
            assert "and 2 (not started, or not reached the store) did not" in text, text
            # The notes came while it waited, before the timeout.
            assert text.index("has waited") < text.index("only 1 of 3 nodes joined"), text
            return
        finally:
            for p in c.procs:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGCONT)
                    p.kill()
                p.wait(timeout=30)
    raise AssertionError("node 1 joined before it could be stopped, 5 times in a row")

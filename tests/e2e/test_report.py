"""`vigil report` end to end: real runs of the real binary, then the report on their records.

The page is parsed with Python's html.parser: it must be well-formed (every element closed in
order), hold its plots as inline `<svg>` inside named figures, and name in the plots' own text
what happened: the failure, the restart, the hang and the frame it hung in.
"""
import json
import socket
from html.parser import HTMLParser
from pathlib import Path

from harness import REPO, base_env, events, of, run_dirs, run_vigil, start_vigil, write

TOY = str(REPO / "examples" / "toy_train.py")
VOID = {"meta", "br", "img", "hr", "input", "link", "col", "area", "base", "wbr", "source"}

# Heartbeats a few times, then waits in a function the report must name; the attempt after the
# restart exits 0 at once.
HANGS_ONCE = """
import os, sys, time
import vigil

def wait_forever_in_this_function():
    time.sleep(600)

if int(os.environ["TORCHELASTIC_RESTART_COUNT"]) >= 1:
    sys.exit(0)
for i in range(5):
    vigil.heartbeat(i)
    time.sleep(0.05)
wait_forever_in_this_function()
"""

# Rank 3 (on node 1 of two nodes with two ranks each) fails at once in the first attempt; the
# others wait to be stopped. Every rank of the second attempt exits 0.
RANK_3_FAILS_ONCE = """
import os, sys, time
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if attempt == 0:
    if rank == 3:
        sys.exit(3)
    time.sleep(600)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

# Every rank times its steps; the rank named by SLOW_RANK takes 4x as long (as in
# test_stragglers.py). A rank stops when the agent names a stop step, else after `steps` steps.
TIMED_STEPS = """
import os, sys, time, vigil
rank = int(os.environ["RANK"])
slow = int(os.environ.get("SLOW_RANK", "-1"))
for step in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    time.sleep(0.04 if rank == slow else 0.01)
    vigil.step_timing(step, time.perf_counter() - t0)
    if vigil.should_stop(step):
        sys.exit(0)
"""


class Page(HTMLParser):
    """Checks that elements nest and close in order, and collects per figure id its `<svg>`
    count and the text of its SVG `<text>` elements, and the page's table rows by class."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack = []
        self.errors = []
        self.figures = {}
        self.empty = {}
        self.rows = []
        self.scripts = 0
        self._figure = None
        self._in_text = False
        self._text = ""
        self._row = None
        self._empty_id = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self.scripts += 1
        if tag not in VOID:
            self.stack.append(tag)
        if tag == "figure":
            self._figure = a.get("id")
            self.figures[self._figure] = {"svg": 0, "texts": [], "circles": 0}
        elif tag == "svg" and self._figure:
            self.figures[self._figure]["svg"] += 1
            if "xmlns" not in a or "width" not in a:
                self.errors.append(f"svg without xmlns/width: {a}")
        elif tag == "text" and self._figure:
            self._in_text, self._text = True, ""
        elif tag == "tr":
            self._row = [a.get("class"), ""]
        elif tag == "p" and a.get("class") == "empty" and a.get("id"):
            self._empty_id = a["id"]
            self.empty[self._empty_id] = ""

    def handle_startendtag(self, tag, attrs):
        if tag == "svg":
            self.errors.append("an empty svg")
        elif tag == "circle" and self._figure:
            self.figures[self._figure]["circles"] += 1

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()
        if tag == "figure":
            self._figure = None
        elif tag == "text" and self._in_text:
            self.figures[self._figure]["texts"].append(self._text.strip())
            self._in_text = False
        elif tag == "tr" and self._row:
            self.rows.append(tuple(self._row))
            self._row = None
        elif tag == "p":
            self._empty_id = None

    def handle_data(self, data):
        if self._in_text:
            self._text += data
        if self._row is not None:
            self._row[1] += data + " "
        if self._empty_id:
            self.empty[self._empty_id] += data


def parse(path: Path) -> Page:
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>"), text[:100]
    p = Page()
    p.feed(text)
    p.close()
    assert not p.errors, p.errors
    assert p.stack == [], f"unclosed elements: {p.stack}"
    assert p.scripts == 0, "the page is self-contained: no scripts"
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", ""), "nothing loaded from the network"
    return p


def texts(page: Page, figure: str):
    assert figure in page.figures, (figure, list(page.figures), page.empty)
    assert page.figures[figure]["svg"] == 1, page.figures[figure]
    return page.figures[figure]["texts"]


def has(texts_, needle):
    return any(needle in t for t in texts_)


def test_a_crash_and_its_restart_are_on_the_report_of_an_experiment_named_by_its_name(job):
    # The experiment layout `vigil launch` writes: runs/ and state/ under the launch's directory.
    exp = job / "home" / "experiments" / "demo" / "demo_20260101-000000"
    r = run_vigil(
        ["run", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(exp / "runs"),
         "--state-dir", str(exp / "state"), TOY, "--steps", "10", "--crash-at", "5"],
        cwd=job, timeout=180)
    assert r.returncode == 0, r.stderr
    ev = events(exp / "runs")
    assert len(of(ev, "rank_exited", expected=False)) == 1 and len(of(ev, "restart")) == 1, ev

    rep = run_vigil(["report", "demo"], cwd=job, env=base_env(VIGIL_HOME=job / "home"), timeout=60)
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout.strip() == str(exp / "report.html")
    page = parse(exp / "report.html")

    tl = texts(page, "timeline-plot")
    assert has(tl, "failure: rank 1 exited with code 1"), tl
    assert has(tl, "restart -> attempt 1"), tl
    assert has(tl, "attempt 0") and has(tl, "attempt 1"), tl
    assert has(tl, "node 0 ("), tl
    # The allocation comes from the ledger node rank 0 wrote.
    assert has(tl, "allocation 1: finished -> finished"), tl

    kinds = [c for c, _ in page.rows]
    assert kinds.index("failure") < kinds.index("restart") < kinds.index("result"), page.rows
    failure_row = next(t for c, t in page.rows if c == "failure")
    assert "attempt 0: rank 1 exited with code 1" in failure_row
    # Each failure once: no `attempt 0 failed: rank 1 exited with code 1` row after it.
    assert sum("rank 1 exited with code 1" in t for c, t in page.rows if c != "rank-failure") == 1, page.rows
    # The failures table names the rank's logs and the line its stderr.log ends with.
    (detail,) = [t for c, t in page.rows if c == "rank-failure"]
    (run,) = run_dirs(exp / "runs")
    assert str(run / "attempt_0" / "1" / "stderr.log") in detail, detail
    assert "simulated crash at step 5" in detail, detail
    assert "waited" in next(t for c, t in page.rows if c == "restart"), page.rows
    # The title names the job: the script, from the run directory's name (no job id here).
    assert "<title>vigil report: toy_train</title>" in (exp / "report.html").read_text()
    # The command line the agent was started with, from its `nodes` record.
    command = (exp / "report.html").read_text().split('<pre class="command">')[1].split("</pre>")[0]
    assert command.endswith(f"run --nproc-per-node 2 --max-restarts 1 --log-dir {exp / 'runs'} "
                            f"--state-dir {exp / 'state'} {TOY} --steps 10 --crash-at 5"), command

    # Steps: plotted when the run recorded `steps` events, else the section says there are none.
    if of(ev, "steps"):
        assert texts(page, "steps-plot"), page.figures
    else:
        assert page.empty["steps-plot"].startswith("No steps recorded"), page.empty
    if any(e.get("ranks") for e in of(ev, "straggler_report")):
        assert texts(page, "stragglers-plot"), page.figures
    else:
        assert page.empty["stragglers-plot"].startswith("No straggler scores recorded"), page.empty


def test_a_hang_is_on_the_timeline_with_the_frame_it_hung_in_despite_a_cut_last_line(job):
    write(job / "t.py", HANGS_ONCE)
    r = run_vigil(["run", "--max-restarts", "1", "--heartbeat-timeout", "1", "--log-dir", "logs", "t.py"],
                  cwd=job, timeout=120)
    assert r.returncode == 0, r.stderr
    (run,) = run_dirs(job / "logs")
    ev = events(job / "logs")
    (stacks,) = of(ev, "stacks")
    assert any("wait_forever_in_this_function" in f for f in stacks["innermost"]), stacks
    # An agent killed mid-write leaves half a line: the report still reads the rest.
    with open(run / "events.jsonl", "a") as f:
        f.write('{"event":"cycle_start","cyc')

    out = job / "out" / "page.html"
    out.parent.mkdir()
    rep = run_vigil(["report", str(run), "-o", str(out)], cwd=job, timeout=60)
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout.strip() == str(out)
    assert not (run / "report.html").exists(), "-o names the page's place"
    page = parse(out)
    tl = texts(page, "timeline-plot")
    assert has(tl, "hang: rank 0 hung (heartbeat timeout) in t.py:6 in wait_forever_in_this_function"), tl
    assert has(tl, "restart -> attempt 1"), tl
    hang_row = next(t for c, t in page.rows if c == "hang")
    assert "wait_forever_in_this_function" in hang_row, hang_row
    # The failures table names the hung rank's stacks, each file once, by its absolute path.
    (detail,) = [t for c, t in page.rows if c == "rank-failure"]
    assert detail.count("/stacks.txt") == 1 and str(run / "attempt_0" / "0" / "stacks.txt") in detail, detail
    html = out.read_text()
    assert "events.jsonl: skipped its last line, cut short" in html


def test_a_two_node_job_is_one_allocation_with_a_row_per_node_and_one_restart(job):
    write(job / "t.py", RANK_3_FAILS_ONCE)
    port = free_port()
    procs = []
    for node in (0, 1):
        logs = job / f"node{node}" / "logs"
        logs.mkdir(parents=True)
        procs.append(start_vigil(
            ["run", "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
             "--master-port", str(port), "--nproc-per-node", "2", "--max-restarts", "1",
             "--rdzv-id", "two", "--log-dir", str(logs), "t.py"], cwd=job))
    try:
        results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [r[2] for r in results] == [0, 0], results
    assert of(events(job / "node1" / "logs"), "rank_exited", expected=False, rank=3)

    rep = run_vigil(["report", str(job)], cwd=job, timeout=60)
    assert rep.returncode == 0, rep.stderr
    page = parse(job / "report.html")
    tl = texts(page, "timeline-plot")
    assert has(tl, "node 0 (") and has(tl, "node 1 ("), tl
    assert has(tl, "failure: rank 3 exited with code 3"), tl
    assert sum("restart -> attempt 1" in t for t in tl) == 2, ("each node restarted", tl)
    assert sum(t.startswith("allocation ") for t in tl) == 1, ("both nodes ran in one allocation", tl)
    summary = (job / "report.html").read_text().split('<pre class="status">')[1].split("</pre>")[0]
    assert summary.startswith("vigil: 1 allocation, 1 in-job restart, 0 requeues\n  allocation 1 (job two): "), summary
    assert ", 2 nodes (" in summary, summary
    assert "last failure: " in summary and "node 1 (" in summary and "rank 3 exited with code 3" in summary, summary
    # The failure once in the events table, though both nodes ended attempt 0 for it.
    assert sum("rank 3 exited with code 3" in t for c, t in page.rows if c != "rank-failure") == 1, page.rows


def test_steps_and_straggler_scores_of_a_real_two_node_run_are_plotted(job):
    write(job / "train.py", TIMED_STEPS)
    port = free_port()
    procs = []
    for node in (0, 1):
        logs = job / f"node{node}" / "logs"
        logs.mkdir(parents=True)
        procs.append(start_vigil(
            ["run", "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
             "--master-port", str(port), "--nproc-per-node", "2", "--straggler-report-interval", "1",
             "--log-dir", str(logs), "train.py", "300"],
            cwd=job, env=base_env(SLOW_RANK=3, SLURMD_NODENAME=f"n{node}")))
    try:
        results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [r[2] for r in results] == [0, 0], [r[1][-2000:] for r in results]
    ev0, ev1 = events(job / "node0" / "logs"), events(job / "node1" / "logs")
    reports = [e for e in of(ev0, "straggler_report") if e.get("ranks")]
    assert reports, "node rank 0 logged no scored straggler report"
    steps = of(ev0, "steps") + of(ev1, "steps")
    assert of(ev0, "steps") and of(ev1, "steps"), "each node logs its ranks' steps"

    rep = run_vigil(["report", str(job)], cwd=job, timeout=60)
    assert rep.returncode == 0, rep.stderr
    page = parse(job / "report.html")

    st = texts(page, "steps-plot")
    assert has(st, "node 0") and has(st, "node 1") and has(st, "step"), st
    assert page.figures["steps-plot"]["circles"] == len(steps), (page.figures["steps-plot"], steps)

    sc = texts(page, "stragglers-plot")
    assert has(sc, "rank 3 (n1)"), sc
    assert has(sc, "threshold 0.70"), sc
    assert has(sc, "relative score (1.0 best)"), sc
    # A point per report for each rank it scored (all 4 ranks are among the worst 5 drawn).
    scored = sum(1 for rep in reports for r in rep["ranks"] if r.get("relative") is not None)
    assert page.figures["stragglers-plot"]["circles"] == scored, (page.figures["stragglers-plot"], scored)

    summary = (job / "report.html").read_text().split('<pre class="status">')[1].split("</pre>")[0]
    assert "stragglers: last report " in summary and "worst rank 3 on n1 (relative 0." in summary, summary
    assert "1 below 0.70: [3]" in summary, summary


def test_a_directory_without_records_is_refused_in_one_line_and_nothing_is_written(job):
    (job / "empty" / "sub").mkdir(parents=True)
    write(job / "empty" / "sub" / "other.jsonl", json.dumps({"event": "x"}) + "\n")
    rep = run_vigil(["report", "empty"], cwd=job, timeout=60)
    assert rep.returncode == 2, (rep.stdout, rep.stderr)
    lines = rep.stderr.strip().splitlines()
    assert len(lines) == 1, rep.stderr
    assert lines[0].startswith("vigil report: error: empty: no vigil records in it"), lines
    assert "events.jsonl and ledger.jsonl" in lines[0], lines
    assert not (job / "empty" / "report.html").exists()

    rep = run_vigil(["report", "no-such-experiment"], cwd=job, env=base_env(VIGIL_HOME=job / "home"), timeout=60)
    assert rep.returncode == 2
    assert rep.stderr.strip() == (
        f"vigil report: error: no-such-experiment: no such directory, and no experiment of that name in "
        f"{job / 'home' / 'experiments'}; give an experiment directory, a run directory (vigil_*) or a state directory"
    ), rep.stderr


def test_a_state_directory_alone_finds_the_run_directories_of_its_job(job):
    """Field finding 24/26: `--log-dir logs --state-dir state`, then `vigil report state` and
    `vigil logs --rank 1 state`: the ledger records no run directory, which is found beside it."""
    write(job / "train.py", "import os, sys\nprint('rank', os.environ['RANK'], file=sys.stderr)\n")
    r = run_vigil(["run", "--log-dir", str(job / "logs"), "--state-dir", str(job / "state"), "--rdzv-id", "j42",
                   "--nproc-per-node", "2", str(job / "train.py")], cwd=job)
    assert r.returncode == 0, r.stderr
    env = base_env(VIGIL_HOME=job / "home")
    rep = run_vigil(["report", str(job / "state"), "-o", str(job / "r.html")], cwd=job, env=env)
    assert rep.returncode == 0, rep.stderr
    page = parse(job / "r.html")
    tl = texts(page, "timeline-plot")
    assert has(tl, "node 0 (") and has(tl, "attempt 0"), tl
    assert "<title>vigil report: job j42</title>" in (job / "r.html").read_text()
    logs = run_vigil(["logs", "--rank", "1", str(job / "state")], cwd=job, env=env)
    assert logs.returncode == 0 and logs.stderr == "rank 1\n", (logs.stdout, logs.stderr)


def test_a_ledger_of_thousands_of_allocations_makes_a_page_of_a_few_hundred(job):
    """Field finding 44: `vigil report` on 100,000 allocations wrote a 290 MB page (and held the
    ledger whole). The page lists and draws the latest few hundred allocations and says how many
    earlier ones it summarised. Bounds are on what is written, not on time."""
    state = job / "state"
    state.mkdir()
    n = 3000
    with open(state / "ledger.jsonl", "w") as f:
        for i in range(1, n + 1):
            start = 1767225600.0 + i * 100
            f.write(json.dumps({
                "format": 1, "allocation": i, "job_id": "42", "nodes": ["a", "b"], "start": start,
                "end": start + 90, "outcome": "stopped", "highest_step": i * 10, "restarts": 1,
                "stop_step": i * 10, "stop_trigger": "time-limit", "decision": "requeue",
                "why": f"time-limit, reached step {i * 10}", "excluded": [], "exit_status": 75}) + "\n")
    out = job / "r.html"
    r = run_vigil(["report", str(state), "-o", str(out)], cwd=job, timeout=600)
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert len(html) < 1_000_000, f"{len(html)} bytes for {n} allocations"
    page = parse(out)  # still well-formed
    section = html.split('<section id="allocations">')[1].split("</section>")[0]
    rows = section.count("<tr><td>")
    assert rows == 300, rows
    # The latest are the ones listed; the page says how many earlier ones it summarised.
    assert f"<tr><td>{n}</td>" in section and "<tr><td>2700</td>" not in section
    assert "This page shows the last 300 of 3000 allocations one by one; the 2700 before them" in html
    assert "2700 stopped" in html
    assert page is not None

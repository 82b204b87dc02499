"""Prometheus metrics (issue 23, docs/metrics.md): `vigil run --metrics-port` scraped by a real
Prometheus server while a real job's rank crashes once and the job recovers, then asked through
Prometheus' HTTP API; `--metrics-textfile` read while it is being rewritten (never a partial file);
bind and directory errors as one line with exit 2 before any rank starts.

The Prometheus test is skipped when no `prometheus` binary is installed, unless
VIGIL_REQUIRE_PROMETHEUS=1 (CI), which makes that an error.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest

from fakes.nvml import gpu, nvml_env, write_nvml
from harness import base_env, run_vigil, start_vigil, wait_for, write

# Rank 1 raises at step 3 of attempt 0; attempt 1 heartbeats until the test says it is done.
CRASHES_ONCE = """
import os, sys, time, vigil
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
done = {done!r}
for step in range(100000):
    vigil.heartbeat(step)
    if attempt == 0 and rank == 1 and step == 3:
        raise ValueError("bad batch")
    if attempt > 0 and os.path.exists(done):
        break
    if step > 2000:
        sys.exit("the test never said it was done")
    time.sleep(0.05)
"""

METRICS_AT = re.compile(r"\[vigil\] metrics at http://[^:/\s]+:(\d+)/metrics")


def prometheus():
    path = shutil.which("prometheus")
    if path:
        return path
    if os.environ.get("VIGIL_REQUIRE_PROMETHEUS") == "1":
        raise RuntimeError("VIGIL_REQUIRE_PROMETHEUS=1 but no prometheus found: apt-get install prometheus")
    pytest.skip("prometheus is not installed (set VIGIL_REQUIRE_PROMETHEUS=1 to make this an error)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stderr:
    """Collects a process's stderr on a thread, so a full pipe never stalls it."""

    def __init__(self, proc):
        self.text = ""
        self._t = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._t.start()

    def _read(self, proc):
        for line in proc.stderr:
            self.text += line


def scrape_port(err: Stderr):
    m = METRICS_AT.search(err.text)
    return int(m.group(1)) if m else None


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type"), r.read().decode()


def query(api, q):
    """The instant vector Prometheus answers for `q`: [(labels, value)]."""
    try:
        _, _, body = http_get(f"{api}/api/v1/query?query={urllib.parse.quote(q)}")
    except OSError:
        return []
    data = json.loads(body)
    assert data["status"] == "success", data
    return [(r["metric"], float(r["value"][1])) for r in data["data"]["result"]]


def parse_page(text):
    """A page in the text format: {sample key: value}, checking that every sample's family has
    `# HELP` and `# TYPE` lines before it and that the page ends with a newline."""
    assert text.endswith("\n"), text[-200:]
    samples, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            parts = line.split(" ", 3)
            if parts[1] == "TYPE":
                assert parts[3] in ("counter", "gauge"), line
                typed.add(parts[2])
            continue
        key, value = line.rsplit(" ", 1)
        assert key.split("{")[0] in typed, line
        samples[key] = float(value)
    return samples


def test_prometheus_scrapes_the_agent_and_counts_the_restart(job):
    prom = prometheus()
    done = job / "done"
    script = write(job / "train.py", CRASHES_ONCE.format(done=str(done)))
    nvml = write_nvml(job / "nvml.json", [gpu(0), gpu(1)])
    p = start_vigil(["run", "--log-dir", str(job / "logs"), "--nproc-per-node", "2",
                     "--max-restarts", "1", "--metrics-port", "0", "--rdzv-id", "metrics-e2e",
                     str(script)], cwd=job, env=nvml_env(base_env(), nvml))
    err = Stderr(p)
    server = None
    try:
        port = wait_for(lambda: scrape_port(err), 60, "the metrics port on the console")
        # The agent's own page first: the format Prometheus is told it speaks.
        status, ctype, page = http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and ctype == "text/plain; version=0.0.4; charset=utf-8", ctype
        parse_page(page)

        api_port = free_port()
        (job / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: vigil\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{port}']\n")
        server = subprocess.Popen(
            [prom, f"--config.file={job / 'prometheus.yml'}",
             f"--storage.tsdb.path={job / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{api_port}"],
            cwd=job, stdout=subprocess.DEVNULL, stderr=open(job / "prometheus.log", "w"))
        api = f"http://127.0.0.1:{api_port}"

        def restarts():
            return [v for m, v in query(api, "vigil_restarts_total") if v == 1.0 and
                    m.get("job_id") == "metrics-e2e" and m.get("job") == "vigil"]
        try:
            wait_for(restarts, 120, "Prometheus to see vigil_restarts_total == 1")
        except AssertionError:
            log = (job / "prometheus.log").read_text()[-3000:]
            raise AssertionError(f"no restart in Prometheus; vigil: {err.text[-2000:]}\nprometheus: {log}")
        # The attempt after the restart: both ranks run again, each with its step and its GPU.
        wait_for(lambda: [v for _, v in query(api, "vigil_ranks_running") if v == 2.0], 60,
                 "both ranks running again")
        ranks = wait_for(lambda: (r := query(api, "vigil_rank_info")) and len(r) == 2 and r, 60,
                         "both ranks' info")
        assert sorted((m["rank"], m["gpu"], m["UUID"]) for m, _ in ranks) == [
            ("0", "0", "GPU-fake-0000"), ("1", "1", "GPU-fake-0001")], ranks
        # Joined on UUID, as a query joins dcgm-exporter's series.
        joined = query(api, 'vigil_rank_step * on(UUID) group_left() vigil_rank_info')
        assert len(joined) == 2, joined
        ages = wait_for(lambda: (a := query(api, "vigil_rank_heartbeat_age_seconds")) and len(a) == 2 and a,
                        60, "both running ranks' heartbeat ages")
        assert all(0 <= v < 60 for _, v in ages), ages
        assert [v for m, v in query(api, "vigil_attempts_total")] == [2.0]
        assert [v for m, v in query(api, 'vigil_rank_stops_total{reason="rank_failed"}')] == [1.0]
        wait_for(lambda: query(api, "vigil_goodput_seconds"), 60, "node rank 0's goodput")
    finally:
        done.touch()
        if server:
            server.terminate()
            server.wait(timeout=30)
        try:
            p.wait(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
    assert p.returncode == 0, err.text[-3000:]


def test_the_textfile_is_always_whole_and_says_how_the_job_ended(job):
    done = job / "done"
    script = write(job / "train.py", CRASHES_ONCE.format(done=str(done)))
    out = job / "textfile"
    out.mkdir()
    nvml = write_nvml(job / "nvml.json", [gpu(0), gpu(1)])
    p = start_vigil(["run", "--log-dir", str(job / "logs"), "--nproc-per-node", "2",
                     "--max-restarts", "1", "--metrics-textfile", str(out), "--rdzv-id", "tf/1",
                     str(script)], cwd=job, env=nvml_env(base_env(), nvml))
    err = Stderr(p)
    seen, bad, others = [], [], set()
    stop = threading.Event()

    def reader():
        # node_exporter reads every *.prom file it finds: each read must be a whole page.
        while not stop.is_set():
            for f in out.iterdir():
                if not f.name.endswith(".prom"):
                    continue
                if f.name != "vigil_tf_1_0.prom":
                    others.add(f.name)
                try:
                    text = f.read_text()
                except FileNotFoundError:
                    continue
                try:
                    parse_page(text)
                    if not seen or seen[-1] != text:
                        seen.append(text)
                except (AssertionError, ValueError) as e:
                    bad.append((str(e), text[-300:]))

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        wait_for(lambda: "attempt 1" in err.text, 120, "the restart")
        done.touch()
        assert p.wait(timeout=120) == 0, err.text[-3000:]
    finally:
        done.touch()
        stop.set()
        t.join(timeout=10)
        if p.poll() is None:
            p.kill()
    assert not bad, bad[:3]
    assert not others, others
    final = parse_page((out / "vigil_tf_1_0.prom").read_text())
    assert len(seen) >= 2, "the page written at start and the one at exit"
    node = 'job_id="tf/1",node="'
    pick = lambda name: [v for k, v in final.items() if k.startswith(name + "{" + node)]
    assert pick("vigil_agent_running") == [0.0]
    assert pick("vigil_restarts_total") == [1.0]
    assert pick("vigil_attempts_total") == [2.0]
    assert pick("vigil_ranks_running") == [0.0]
    assert sum(pick("vigil_badput_seconds")) + sum(pick("vigil_goodput_seconds")) == pytest.approx(
        pick("vigil_job_wall_seconds")[0], abs=1e-6)
    steps = {k: v for k, v in final.items() if k.startswith("vigil_rank_step{")}
    assert any('UUID="GPU-fake-0001"' in k and 'rank="1"' in k for k in steps), steps
    # Only the page is left in the directory: no temp file.
    assert [f.name for f in out.iterdir()] == ["vigil_tf_1_0.prom"]


# Heartbeats until the test says it is done.
WAITS = """
import os, sys, time, vigil
for step in range(100000):
    vigil.heartbeat(step)
    if os.path.exists({done!r}):
        break
    time.sleep(0.1)
"""


def test_idle_connections_do_not_keep_scrapes_out(job):
    done = job / "done"
    script = write(job / "train.py", WAITS.format(done=str(done)))
    p = start_vigil(["run", "--log-dir", str(job / "logs"), "--nproc-per-node", "1", "--metrics-port", "0",
                     str(script)], cwd=job)
    err = Stderr(p)
    idle = []
    try:
        port = wait_for(lambda: scrape_port(err), 60, "the metrics port on the console")
        assert http_get(f"http://127.0.0.1:{port}/metrics")[0] == 200
        # 40 clients connect and send nothing (more than the agent serves at once), and stay.
        for _ in range(40):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        time.sleep(0.5)
        results = []
        for _ in range(10):
            try:
                status, _, page = http_get(f"http://127.0.0.1:{port}/metrics", timeout=10)
                results.append(status if "vigil_agent_running" in page else "no page")
            except OSError as e:
                results.append(repr(e))
        assert results == [200] * 10, results
    finally:
        for s in idle:
            s.close()
        done.touch()
        try:
            p.wait(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
    assert p.returncode == 0, err.text[-3000:]


def test_the_textfile_never_writes_through_links_planted_in_its_directory(job):
    # node_exporter's directory is often writable by others. Another user plants links to a file
    # of this user's under every temp name a writer could guess: the names an agent started next
    # would get from its pid (the next few thousand pids), for the page and for the start-up
    # check, and under the page's own name.
    out = job / "textfile"
    out.mkdir()
    victim = write(job / "precious", "mine\n")
    with open("/proc/sys/kernel/ns_last_pid") as f:
        last = int(f.read())
    for pid in range(last + 1, last + 3000):
        for name in (f".vigil_tl_0.prom.{pid}.tmp", f".vigil-probe.{pid}.tmp"):
            os.symlink(victim, out / name)
    os.symlink(victim, out / "vigil_tl_0.prom")
    script = write(job / "t.py", "pass\n")
    r = run_vigil(["run", "--log-dir", str(job / "logs"), "--metrics-textfile", str(out), "--rdzv-id", "tl",
                   str(script)], cwd=job)
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "mine\n"
    page = out / "vigil_tl_0.prom"
    assert not page.is_symlink() and "vigil_agent_running" in page.read_text()
    assert not [f for f in out.iterdir() if not f.is_symlink() and f.name != page.name]


def test_a_port_in_use_is_one_line_and_exit_2_before_any_rank_starts(job):
    marker = job / "ran"
    script = write(job / "t.py", f"open({str(marker)!r}, 'w').close()\n")
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_vigil(["run", "--log-dir", str(job / "logs"), "--metrics-port", str(port),
                       str(script)], cwd=job)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"vigil: error: cannot listen for metrics on port {port}: Address already in use (os error 98);"
        " give another --metrics-port (0: any free port) or stop what holds it"], r.stderr
    assert not marker.exists()


def test_a_textfile_directory_that_is_not_there_is_one_line_and_exit_2(job):
    marker = job / "ran"
    script = write(job / "t.py", f"open({str(marker)!r}, 'w').close()\n")
    r = run_vigil(["run", "--log-dir", str(job / "logs"), "--metrics-textfile",
                   str(job / "nowhere"), str(script)], cwd=job)
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"vigil: error: cannot write metrics into {job / 'nowhere'}: "), line
    assert line.endswith("give --metrics-textfile an existing directory this user can write"
                         " (node_exporter's --collector.textfile.directory)"), line
    assert not marker.exists()


# Every rank times its steps; rank SLOW_RANK takes 4x as long (as in test_stragglers.py).
TIMED = """
import os, sys, time, vigil
rank = int(os.environ["RANK"])
slow = int(os.environ.get("SLOW_RANK", "-1"))
for step in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    time.sleep(0.04 if rank == slow else 0.01)
    vigil.step_timing(step, time.perf_counter() - t0)
    vigil.heartbeat(step)
"""


def test_node_rank_0_adds_the_job_wide_series_and_each_node_its_own_ranks(job):
    from test_multinode import Nodes
    write(job / "train.py", TIMED)
    out = job / "textfile"
    out.mkdir()
    nodes = Nodes(job, 2, ["train.py", "200"], nproc=2,
                  extra=["--straggler-report-interval", "1", "--rdzv-id", "mn",
                         "--metrics-textfile", str(out)],
                  env={"SLOW_RANK": "3"}, per_node_env=lambda i: {"SLURMD_NODENAME": f"n{i}"})
    res = nodes.wait(timeout=120)
    assert [r[0] for r in res] == [0, 0], [r[2][-2000:] for r in res]
    assert sorted(f.name for f in out.iterdir()) == ["vigil_mn_0.prom", "vigil_mn_1.prom"]
    head, other = (parse_page((out / f"vigil_mn_{i}.prom").read_text()) for i in (0, 1))
    ranks = lambda page: sorted(re.search(r'rank="(\d+)"', k).group(1)
                                for k in page if k.startswith("vigil_rank_info{"))
    assert (ranks(head), ranks(other)) == (["0", "1"], ["2", "3"])
    assert all('node="n1"' in k for k in other if k.startswith("vigil_rank_step{")), other
    # The job-wide series are node rank 0's alone.
    for name in ("vigil_goodput_seconds", "vigil_straggler_score", "vigil_job_wall_seconds"):
        assert any(k.startswith(name + "{") for k in head), name
        assert not any(k.startswith(name + "{") for k in other), name
    scores = {k: v for k, v in head.items() if k.startswith("vigil_straggler_score{") and 'score="relative"' in k}
    slow = [v for k, v in scores.items() if 'rank="3"' in k and 'node="n1"' in k]
    assert len(scores) == 4 and len(slow) == 1 and slow[0] < 0.5, scores
    # This allocation's decision, on the page written at exit after the ledger.
    decisions = {k: v for k, v in head.items() if k.startswith("vigil_allocation_decisions_total{")}
    assert list(decisions.values()) == [1.0] and 'decision="finished"' in next(iter(decisions)), decisions

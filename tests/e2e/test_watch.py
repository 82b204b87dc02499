"""`vigil watch` end to end: real records from real runs of the real binary, a local HTTP server
that records every request it gets standing in for the webhook and the heartbeat, and, for the
rules that read Slurm's state, a fake `scontrol` on the PATH.

Each problem is told once, a second pass tells nothing new (the alerts file), a cleared problem
is told as resolved, and the heartbeat is pinged only after a healthy pass. The webhook's URL
(its secret) never shows in `ps`; `--once` ends however a server answers (a drip, an endless
answer); only 2xx is delivered (an https redirect is not); a URL with CR/LF is refused; a bad
`job_id` never reaches `scontrol`.
"""
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from harness import base_env, events, of, run_vigil, start_vigil, vigil_bin, wait_for, write


def argv_holding(secret):
    """The command lines of this machine's processes (what `ps` shows everyone) that hold
    `secret`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if secret in argv and str(os.getpid()) != pid:
            found.append(argv)
    return found


class Recorder(BaseHTTPRequestHandler):
    def _record(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode() if n else ""
        self.server.got.append((self.command, self.path, body))
        # While vigil waits for this answer, is its URL in any command line?
        self.server.in_ps.extend(argv_holding(self.path.rsplit("/", 1)[-1]) if "secret" in self.path else [])
        self.server.headers_seen.append(dict(self.headers))
        status = self.server.status
        self.send_response(status)
        if 300 <= status < 400:
            self.send_header("Location", "https://elsewhere.example/hook")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _record

    def log_message(self, *a):
        pass


def serving(tls=None):
    """A recording server on a thread; `tls`: an SSLContext to speak https with."""
    s = HTTPServer(("127.0.0.1", 0), Recorder)
    if tls:
        s.socket = tls.wrap_socket(s.socket, server_side=True)
    s.got, s.in_ps, s.headers_seen, s.status = [], [], [], 200
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s


@pytest.fixture
def server():
    s = serving()
    yield s
    s.shutdown()
    s.server_close()


def url(s, path):
    return f"http://127.0.0.1:{s.server_address[1]}{path}"


def take(s):
    """The requests received since the last call."""
    got, s.got[:] = list(s.got), []
    return got


def alerts(got):
    """The webhook's messages as (problem, status, text)."""
    out = []
    for method, path, body in got:
        if path == "/hook":
            assert method == "POST", got
            m = json.loads(body)
            out.append((m["vigil"]["problem"], m["vigil"]["status"], m["text"]))
    return sorted(out)


def pings(got):
    return [(m, p) for m, p, _ in got if p == "/beat"]


def watch(job, server, *args, env=None):
    hook = write(job / "webhook", url(server, "/hook") + "\n")
    hook.chmod(0o600)
    r = run_vigil(["watch", "--once", "--webhook-file", str(hook), "--heartbeat-url", url(server, "/beat"),
                   "--state-file", str(job / "alerts.json"), *args], cwd=job, env=env or base_env(VIGIL_HOME=job / "home"))
    assert r.returncode == 0, r.stderr
    return take(server)


def run_job(job, script):
    return run_vigil(["run", "--nproc-per-node", "1", "--log-dir", str(job / "logs"), "--state-dir",
                      str(job / "state"), "--rdzv-id", "w1", "--max-restarts", "1", "--max-requeues", "9", script],
                     cwd=job, env=base_env(OUT_DIR=job))


def test_a_restart_storm_and_a_requeue_loop_are_told_once_then_resolved_and_the_heartbeat_follows(job, server):
    write(job / "crash.py", "import sys\nsys.exit(3)\n")
    write(job / "ok.py", "import sys\nsys.exit(0)\n")
    # Three allocations (a wrapper loop's), each failing twice: three restarts, three failed
    # allocations requeued.
    for _ in range(3):
        r = run_job(job, "crash.py")
        assert r.returncode == 75, r.stderr
    got = watch(job, server, "state", "--storm-window", "10m")
    found = alerts(got)
    assert [(k, s) for k, s, _ in found] == [("requeue_loop", "open"), ("restart_storm", "open")], got
    assert any("requeue loop: the last 3 allocations (1..3) failed and were requeued" in t for _, _, t in found), found
    assert any("restart storm: 3 in-job restarts in the last 10m" in t for _, _, t in found), found
    assert all(t.startswith("[vigil] state: ") for _, _, t in found), found
    assert pings(got) == [], "no heartbeat while problems are open"

    # The next pass finds the same problems: nothing new is sent.
    assert watch(job, server, "state", "--storm-window", "10m") == []

    # The job gets out of its loop (an allocation that finishes), and the restarts leave the window.
    r = run_job(job, "ok.py")
    assert r.returncode == 0, r.stderr
    time.sleep(1.5)
    got = watch(job, server, "state", "--storm-window", "1s")
    assert [(k, s) for k, s, _ in alerts(got)] == [("requeue_loop", "resolved"), ("restart_storm", "resolved")], got
    assert all(": resolved: " in t for _, _, t in alerts(got)), got
    assert pings(got) == [("GET", "/beat")], got

    # Healthy again: only the heartbeat.
    got = watch(job, server, "state", "--storm-window", "1s")
    assert alerts(got) == [] and pings(got) == [("GET", "/beat")], got
    assert json.loads((job / "alerts.json").read_text()) == {"jobs": {}}


# Stays at step 5 (no progress) until $OUT_DIR/go appears, then ends.
STALLS = """
import os, time
import vigil
go = os.path.join(os.environ["OUT_DIR"], "go")
for _ in range(1200):
    if os.path.exists(go):
        break
    vigil.should_stop(5)
    time.sleep(0.1)
"""


def test_no_progress_is_told_while_the_job_runs_and_resolved_when_it_ends(job, server):
    write(job / "stalls.py", STALLS)
    p = start_vigil(["run", "--nproc-per-node", "1", "--log-dir", str(job / "logs"), "stalls.py"], cwd=job,
                    env=base_env(OUT_DIR=job))
    try:
        wait_for(lambda: list((job / "logs").glob("vigil_*")) and of(events(job / "logs"), "steps"),
                 what="the steps record")
        time.sleep(1.5)
        got = watch(job, server, "logs", "--stall", "1s")
        found = alerts(got)
        assert [(k, s) for k, s, _ in found] == [("no_progress", "open")], got
        assert "no progress: step 5 was reached" in found[0][2], found
        assert watch(job, server, "logs", "--stall", "1s") == []
    finally:
        write(job / "go", "")
        _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    # Ended: no longer running, so no longer stalled.
    got = watch(job, server, "logs", "--stall", "1s")
    assert [(k, s) for k, s, _ in alerts(got)] == [("no_progress", "resolved")], got


FAKE_SCONTROL = """#!/bin/sh
cat "$FAKE_SCONTROL_OUT"
"""


def test_slurm_rules_a_held_job_and_an_agent_that_stopped_writing_read_scontrol(job, server):
    write(job / "ok.py", "import sys\nsys.exit(0)\n")
    r = run_job(job, "ok.py")
    assert r.returncode == 0, r.stderr
    # `vigil launch` writes the job id into experiment.json; the fake scontrol answers for it.
    (job / "experiment.json").write_text(json.dumps({"job_id": "4242"}))
    bin_dir = job / "bin"
    bin_dir.mkdir()
    write(bin_dir / "scontrol", FAKE_SCONTROL).chmod(0o755)
    out = job / "scontrol.out"
    env = base_env(VIGIL_HOME=job / "home", FAKE_SCONTROL_OUT=out, PATH=f"{bin_dir}:{os.environ['PATH']}")

    out.write_text("JobId=4242 JobName=t JobState=PENDING Reason=JobHoldMaxRequeue Dependency=(null)\n")
    got = watch(job, server, str(job), env=env)
    found = alerts(got)
    assert [(k, s) for k, s, _ in found] == [("held", "open")], got
    assert "job 4242 held by Slurm (JobHoldMaxRequeue" in found[0][2], found

    # Released and running, but the event logs are old: the agents stopped writing.
    time.sleep(1.5)
    out.write_text("JobId=4242 JobName=t JobState=RUNNING Reason=None ExcNodeList=(null)\n")
    got = watch(job, server, str(job), "--silent", "1s", env=env)
    assert sorted((k, s) for k, s, _ in alerts(got)) == [("held", "resolved"), ("stopped_writing", "open")], got
    assert pings(got) == []

    # Pending on a node it excluded.
    out.write_text("JobId=4242 JobState=PENDING Reason=ReqNodeNotAvail,_UnavailableNodes:n7 "
                   "ReqNodeList=n7 ExcNodeList=n[6-7]\n")
    got = watch(job, server, str(job), "--silent", "1s", env=env)
    found = alerts(got)
    assert [(k, s) for k, s, _ in found] == [("stopped_writing", "resolved"), ("unreachable_nodes", "open")], got
    assert "on node(s) it excluded: n7" in found[1][2], found


def test_a_target_that_names_no_job_is_a_usage_error(job):
    r = run_vigil(["watch", "--once", "--state-file", str(job / "a.json"), "no-such-experiment"], cwd=job,
                  env=base_env(VIGIL_HOME=job / "home"))
    assert r.returncode == 2, r.stderr
    assert "vigil watch: error: no-such-experiment: no such directory" in r.stderr, r.stderr


def test_spares_exhausted_when_the_only_standby_took_a_lost_nodes_place(job, server):
    from test_spares import TRAIN, start_agents
    write(job / "train.py", TRAIN)
    procs = start_agents(job, ["--nproc-per-node", "1", "--max-restarts", "2", "--rdzv-id", "sp"],
                         ["train.py", "80"])
    try:
        wait_for(lambda: (job / "ckpt_1").exists() and int((job / "ckpt_1").read_text()) >= 5, timeout=60,
                 what="progress")
        got = watch(job, server, str(job))
        assert alerts(got) == [] and pings(got) == [("GET", "/beat")], got
        procs[1].send_signal(signal.SIGKILL)
        procs[1].communicate()
        res = [p.communicate(timeout=120) for p in (procs[0], procs[2])]
        assert [procs[0].returncode, procs[2].returncode] == [0, 0], [r[1][-2000:] for r in res]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    got = watch(job, server, str(job))
    found = alerts(got)
    assert [(k, s) for k, s, _ in found] == [("spares_exhausted", "open")], got
    assert "every standby" in found[0][2], found


def test_a_node_blamed_in_two_allocations_is_one_alert_naming_it(job, server):
    # The node fails its health check (a FAKE NVML library: GPU 0 with uncorrectable ECC errors)
    # in two allocations of one job (a wrapper's rerun): each records a `node_fault` and a ledger
    # line excluding it. Slurm's node name is what both records call the node.
    from fakes.nvml import gpu, nvml_env, write_nvml
    nvml = write_nvml(job / "nvml.json", [gpu(0, ecc_uncorrected_volatile=2)])
    write(job / "ok.py", "pass\n")
    env = nvml_env(base_env(SLURMD_NODENAME="gpu-007", SLURM_JOB_NODELIST="gpu-007"), nvml)

    def allocation():
        r = run_vigil(["run", "--nproc-per-node", "1", "--health-check", "--health-storage-path", str(job),
                       "--log-dir", str(job / "logs"), "--state-dir", str(job / "state"), "--rdzv-id", "bl",
                       "ok.py"], cwd=job, env=env)
        assert r.returncode == 75, r.stderr

    allocation()
    # Blamed once (its exclusion and the fault behind it are one blame): nothing to tell.
    got = watch(job, server, "state")
    assert alerts(got) == [] and pings(got) == [("GET", "/beat")], got

    allocation()
    ledger = [json.loads(l) for l in (job / "state" / "ledger.jsonl").read_text().splitlines()]
    assert [r["excluded"] for r in ledger] == [["gpu-007"], ["gpu-007"]], ledger
    # Each allocation's log has the fault (the health check's, and the GPU telemetry's when its
    # first sample came first), all in attempt 0 on that node: one blame each with the exclusion.
    faults = [[(e["host"], e["cycle"]) for e in map(json.loads, (d / "events.jsonl").read_text().splitlines())
               if e["event"] == "node_fault"] for d in sorted((job / "logs").glob("vigil_*"))]
    assert len(faults) == 2 and all(f and set(f) == {("gpu-007", 0)} for f in faults), faults
    got = watch(job, server, "state")
    found = alerts(got)
    assert [(k, s) for k, s, _ in found] == [("node_blamed:gpu-007", "open")], got
    assert "node gpu-007 blamed 2 times (excluded or faulted)" in found[0][2], found
    assert found[0][2].startswith("[vigil] state: "), found
    assert pings(got) == [], got
    # Told once: the next pass sends nothing.
    assert watch(job, server, "state") == []


def held_job(job):
    """A job that ran once, whose Slurm job (a fake `scontrol`) is held: one alert to send. The
    environment to watch it with."""
    write(job / "ok.py", "import sys\nsys.exit(0)\n")
    r = run_job(job, "ok.py")
    assert r.returncode == 0, r.stderr
    (job / "experiment.json").write_text(json.dumps({"job_id": "4242"}))
    bin_dir = job / "bin"
    bin_dir.mkdir()
    write(bin_dir / "scontrol", FAKE_SCONTROL).chmod(0o755)
    out = job / "scontrol.out"
    out.write_text("JobId=4242 JobName=t JobState=PENDING Reason=JobHoldMaxRequeue Dependency=(null)\n")
    return base_env(VIGIL_HOME=job / "home", FAKE_SCONTROL_OUT=out, PATH=f"{bin_dir}:{os.environ['PATH']}")


def test_the_webhooks_url_comes_from_a_file_or_the_environment_and_never_shows_in_ps(job, server):
    env = held_job(job)
    secret = url(server, "/hook/secret-T0B0XXXX")
    hook = write(job / "hook.url", secret + "\n")
    hook.chmod(0o600)
    state = ["--state-file", str(job / "alerts.json")]

    r = run_vigil(["watch", "--once", "--webhook-file", str(hook), *state, str(job)], cwd=job, env=env)
    assert r.returncode == 0, r.stderr
    assert [(m, p) for m, p, _ in take(server)] == [("POST", "/hook/secret-T0B0XXXX")]
    assert server.in_ps == [], server.in_ps
    assert r.stderr == "", r.stderr

    (job / "alerts.json").unlink()
    r = run_vigil(["watch", "--once", *state, str(job)], cwd=job, env={**env, "VIGIL_WEBHOOK_URL": secret})
    assert r.returncode == 0, r.stderr
    assert [(m, p) for m, p, _ in take(server)] == [("POST", "/hook/secret-T0B0XXXX")]
    assert server.in_ps == [], server.in_ps

    # The old flag still works, and says what it exposes and the fix.
    (job / "alerts.json").unlink()
    r = run_vigil(["watch", "--once", "--webhook", secret, *state, str(job)], cwd=job, env=env)
    assert r.returncode == 0, r.stderr
    assert len(take(server)) == 1
    assert "vigil watch: warning: --webhook puts the webhook's URL, which is its secret, on the command line" \
        in r.stderr, r.stderr
    assert "--webhook-file FILE" in r.stderr and "$VIGIL_WEBHOOK_URL" in r.stderr, r.stderr

    # A file others can read gets a note; both ways at once is a usage error.
    hook.chmod(0o644)
    (job / "alerts.json").unlink()
    r = run_vigil(["watch", "--once", "--webhook-file", str(hook), *state, str(job)], cwd=job, env=env)
    assert r.returncode == 0 and "is readable by others (mode 644): chmod 600 it" in r.stderr, r.stderr
    r = run_vigil(["watch", "--once", "--webhook-file", str(hook), "--webhook", secret, *state, str(job)],
                  cwd=job, env=env)
    assert r.returncode == 2 and "give the webhook's URL one way" in r.stderr, r.stderr


@pytest.mark.parametrize("flag", ["--webhook", "--heartbeat-url"])
def test_a_url_with_cr_lf_is_refused_before_anything_is_sent(job, server, flag):
    env = held_job(job)
    smuggled = url(server, "/hook") + "\r\nX-Smuggled: 1\r\n"
    # The held job has an alert to send on the webhook; with no job, the pass is healthy and the
    # heartbeat is sent.
    target = [str(job)] if flag == "--webhook" else []
    r = run_vigil(["watch", "--once", flag, smuggled, "--state-file", str(job / "alerts.json"), *target],
                  cwd=job, env=env)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "it has a carriage return (CR) at character" in r.stderr, r.stderr
    assert "percent-encode it" in r.stderr, r.stderr
    assert "X-Smuggled" not in r.stderr and "/hook" not in r.stderr, "the URL itself is not shown"
    assert take(server) == [] and not any("X-Smuggled" in h for h in server.headers_seen)


class Bad(threading.Thread):
    """A server that answers every connection badly: `drip` sends a byte a second forever,
    `endless` sends bytes with no line end as fast as they are read."""

    def __init__(self, how):
        super().__init__(daemon=True)
        self.how, self.stop = how, threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]

    def run(self):
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, c):
        try:
            while not self.stop.is_set():
                if self.how == "drip":
                    c.sendall(b"H")
                    time.sleep(1)
                else:
                    c.sendall(b"x\x1b" * 32768)
        except OSError:
            pass
        finally:
            c.close()


@pytest.mark.parametrize("how", ["drip", "endless"])
def test_once_ends_however_the_server_answers_and_quotes_little_of_it(job, how):
    bad = Bad(how)
    bad.start()
    try:
        # No job to watch: a healthy pass, then the heartbeat to the bad server.
        p = subprocess.Popen([vigil_bin(), "watch", "--once", "--heartbeat-url", f"http://127.0.0.1:{bad.port}/beat",
                              "--state-file", str(job / "alerts.json")], cwd=job,
                             env=base_env(VIGIL_HOME=job / "home"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        try:
            _, err = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            pytest.fail(f"vigil watch --once against a server that answers with {how} did not end in 90 s")
    finally:
        bad.stop.set()
    assert p.returncode == 1, err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"vigil watch: heartbeat: http://127.0.0.1:{bad.port}/...: "), line
    assert len(line) < 500, line
    if how == "drip":
        assert 'no whole answer within 15 s (read so far: "HHH' in line, line
    else:
        assert 'no HTTP status line: "x\\x1bx\\x1b' in line, line
        assert "... (16384 bytes)" in line, line


def self_signed(job):
    """A certificate for 127.0.0.1 and the key, made with openssl."""
    cert, key = job / "cert.pem", job / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
                    "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


@pytest.fixture
def https_server(job):
    if subprocess.run(["sh", "-c", "command -v openssl && command -v curl"], capture_output=True).returncode:
        pytest.skip("openssl and curl are needed for a local https server")
    cert, key = self_signed(job)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    s = serving(ctx)
    s.cert = cert
    yield s
    s.shutdown()
    s.server_close()


def test_an_https_redirect_is_no_delivery_and_names_where_it_leads(job, https_server):
    server, cert = https_server, https_server.cert
    env = held_job(job)
    env["CURL_CA_BUNDLE"] = str(cert)
    hook = f"https://127.0.0.1:{server.server_address[1]}/hook/secret-https"
    args = ["watch", "--once", "--state-file", str(job / "alerts.json"), "--webhook", hook, str(job)]

    server.status = 302
    r = run_vigil(args, cwd=job, env=env)
    assert r.returncode == 1, r.stderr
    assert [(m, p) for m, p, _ in take(server)] == [("POST", "/hook/secret-https")]
    assert "answered HTTP 302, a redirect to \"https://elsewhere.example/hook\"; vigil follows none" in r.stderr, \
        r.stderr
    assert "secret-https" not in r.stderr, r.stderr
    # (--webhook puts it in vigil's own command line; curl's has it not.)
    assert [a for a in server.in_ps if "curl" in a.split(" ")[0]] == [], server.in_ps
    assert any(a.split(" ")[1:3] == ["watch", "--once"] for a in server.in_ps), "the check sees command lines"
    # Not recorded as told: the next pass, to a server that takes it, tells it.
    server.status = 200
    r = run_vigil(args, cwd=job, env=env)
    assert r.returncode == 0, r.stderr
    assert [(m, p) for m, p, _ in take(server)] == [("POST", "/hook/secret-https")]


def test_a_job_id_that_is_no_slurm_job_id_never_reaches_scontrol(job, server):
    env = held_job(job)
    calls = job / "scontrol.calls"
    write(job / "bin" / "scontrol", f'#!/bin/sh\necho "$@" >> {calls}\ncat "$FAKE_SCONTROL_OUT"\n').chmod(0o755)
    (job / "experiment.json").write_text(json.dumps({"job_id": "--help\u001b[2J"}))
    r = run_vigil(["watch", "--once", "--heartbeat-url", url(server, "/beat"), "--state-file",
                   str(job / "alerts.json"), str(job)], cwd=job, env=env)
    assert not calls.exists(), calls.read_text()
    assert r.returncode == 1, r.stderr
    assert f"{job}/experiment.json: job_id \"--help\\x1b[2J\" is not a Slurm job id (digits, as 1234," in r.stderr, \
        r.stderr
    assert "\x1b" not in r.stderr
    assert pings(take(server)) == [], "an unhealthy pass pings nothing"

    # An array task's id is one.
    (job / "experiment.json").write_text(json.dumps({"job_id": "4242_7"}))
    r = run_vigil(["watch", "--once", "--state-file", str(job / "alerts.json"), str(job)], cwd=job,
                  env={**env, "VIGIL_WEBHOOK_URL": url(server, "/hook")})
    assert r.returncode == 0, r.stderr
    assert calls.read_text() == "show job -o 4242_7\n"
    assert [(k, s) for k, s, _ in alerts(take(server))] == [("held", "open")]

"""`vigil report` as a browser shows it (issue 25, field finding 24): a real 6-second job whose
rank 1 raises in attempt 0 and whose attempt 1 resumes from a checkpoint, reported from its state
directory alone, then the page rendered by headless Chromium.

Two checks, on structure rather than pixels: the DOM Chromium built (`--dump-dom`: the title names
the job, the summary has the job's last step, the failure is in the events table once, the
failures table holds the exception and the rank's log paths, the timeline draws the wait before the
restart, the steps axis has whole, distinct steps), and a screenshot (`--screenshot`): a PNG of the
window's size that is not blank, with the attempts' red and green bars below the page's top.

Skipped when no Chromium is installed, unless VIGIL_REQUIRE_CHROMIUM=1 (CI), which makes that an
error.
"""
import os
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser

import pytest

from harness import base_env, run_dirs, run_vigil, write

# Rank 1 raises at step 8 of attempt 0; attempt 1 resumes from the checkpoint of step 5.
RAISES_ONCE = """
import os, time, vigil
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])

def train_step(step):
    if attempt == 0 and rank == 1 and step == 8:
        raise ValueError("bad batch at step %d" % step)
    time.sleep(0.08)

for step in range(0 if attempt == 0 else 6, 30):
    vigil.heartbeat(step)
    train_step(step)
"""

WIDTH, HEIGHT, SCALE = 1200, 2200, 0.5


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("VIGIL_REQUIRE_CHROMIUM") == "1":
        raise RuntimeError("VIGIL_REQUIRE_CHROMIUM=1 but no chromium found: apt-get install chromium")
    pytest.skip("chromium is not installed (set VIGIL_REQUIRE_CHROMIUM=1 to make this an error)")


def headless(browser, tmp, *args):
    # Root in a container needs --no-sandbox; a profile of its own keeps runs apart.
    cmd = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        "--no-first-run", "--user-data-dir=%s" % (tmp / "profile"), *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, cwd=tmp)


class Dom(HTMLParser):
    """The title, section ids, each table row's class and text, and per figure its SVG texts."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.title = ""
        self.sections = []
        self.rows = []
        self.figures = {}
        self.summary = ""
        self._tags = []
        self._row = None
        self._figure = None
        self._text = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self._tags.append(tag)
        if tag == "section":
            self.sections.append(a.get("id"))
        elif tag == "tr":
            self._row = [a.get("class") or "", ""]
        elif tag == "figure":
            self._figure = a.get("id")
            self.figures[self._figure] = []
        elif tag == "text" and self._figure:
            self._text = ""

    def handle_endtag(self, tag):
        while self._tags and self._tags.pop() != tag:
            pass
        if tag == "tr" and self._row:
            self.rows.append((self._row[0], self._row[1].strip()))
            self._row = None
        elif tag == "figure":
            self._figure = None
        elif tag == "text" and self._text is not None:
            self.figures[self._figure].append(self._text.strip())
            self._text = None

    def handle_data(self, data):
        if self._tags[-1:] == ["title"]:
            self.title += data
        if self._tags[-1:] == ["pre"] and "summary" in self.sections[-1:]:
            self.summary += data
        if self._row is not None:
            self._row[1] += data + " "
        if self._text is not None:
            self._text += data


def png_pixels(path):
    """(width, height, rows of (r, g, b)) of an 8-bit RGB or RGBA PNG, unfiltered."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, color = ihdr[:4]
    assert depth == 8 and color in (2, 6), ihdr
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 255
            elif f == 4:
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(w)])
        prev = line
    return w, h, rows


def test_the_report_of_a_failed_and_resumed_job_renders_in_chromium(job):
    browser = chromium()
    write(job / "train.py", RAISES_ONCE)
    args = ["run", "--log-dir", str(job / "logs"), "--state-dir", str(job / "state"), "--rdzv-id", "resnet-7",
            "--nproc-per-node", "2", "--max-restarts", "1", str(job / "train.py")]
    p = run_vigil(args, cwd=job)
    assert p.returncode == 0, p.stderr
    (run,) = run_dirs(job / "logs")
    page = job / "page.html"
    p = run_vigil(["report", str(job / "state"), "-o", str(page)], cwd=job, env=base_env(VIGIL_HOME=job / "home"))
    assert p.returncode == 0, p.stderr

    out = headless(browser, job, "--dump-dom", page.as_uri())
    assert out.returncode == 0, out.stderr
    dom = Dom()
    dom.feed(out.stdout)
    assert dom.title == "vigil report: job resnet-7", dom.title
    for s in ["summary", "failures", "timeline", "steps", "allocations", "events"]:
        assert s in dom.sections, dom.sections
    # The job's last step: the ledger's, later than the last `steps` record.
    assert "step: 29 (when allocation 1 ended" in dom.summary, dom.summary
    # Each failure once in the events table, no `attempt 0 failed: <the same>` after it.
    texts = [t for _, t in dom.rows]
    assert sum("rank 1 exited with code 1" in t for c, t in dom.rows if c != "rank-failure") == 1, texts
    (failed,) = [t for c, t in dom.rows if c == "rank-failure"]
    assert "ValueError: bad batch at step 8" in failed, failed
    assert 'in train_step' in failed, failed
    assert str(run / "attempt_0" / "1" / "stderr.log") in failed, failed
    (restart,) = [t for c, t in dom.rows if c == "restart"]
    assert "waited" in restart, restart
    timeline = dom.figures["timeline-plot"]
    assert any(t.startswith("restart -> attempt 1, waited") for t in timeline), timeline
    assert any(t.startswith("failure: rank 1 exited with code 1") for t in timeline), timeline
    steps = dom.figures["steps-plot"]
    assert "allocation 1 ended at step 29 (ledger)" in steps, steps
    # The step axis: whole steps, none repeated.
    ys = [t for t in steps if t.isdigit()]
    assert len(ys) >= 2 and len(set(ys)) == len(ys), steps

    shot = job / "shot.png"
    out = headless(browser, job, "--screenshot=%s" % shot, "--window-size=%d,%d" % (WIDTH, HEIGHT),
                   "--force-device-scale-factor=%s" % SCALE, page.as_uri())
    assert out.returncode == 0 and shot.exists(), out.stderr
    w, h, rows = png_pixels(shot)
    assert (w, h) == (int(WIDTH * SCALE), int(HEIGHT * SCALE)), (w, h)

    def kind(px):
        r, g, b = px
        if r > 235 and g > 235 and b > 235:
            return "white"
        if r > 170 and g < 120 and b < 120:
            return "red"
        if g > 140 and r < 130 and b < 130:
            return "green"
        return "ink"

    counts = {"white": 0, "red": 0, "green": 0, "ink": 0}
    first = {}
    for y, row in enumerate(rows):
        for px in row:
            k = kind(px)
            counts[k] += 1
            first.setdefault(k, y)
    total = w * h
    # Not blank, not one colour: text and plots on a white page.
    assert 0.5 < counts["white"] / total < 0.98, counts
    assert counts["ink"] > total * 0.01, counts
    # The failed attempt's red bar and the done attempt's green bar are drawn, below the title.
    assert counts["red"] > 50 and counts["green"] > 50, counts
    assert first["ink"] < first["green"], first

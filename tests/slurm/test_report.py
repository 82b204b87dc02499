"""`vigil report` on the records of a real 2-node job launched on the test cluster: the page is
well-formed, self-contained, and its timeline plot names both nodes by their Slurm names, the
attempt and the allocation the ledger recorded.
"""
from html.parser import HTMLParser

from .slurmlib import wait_job
from .test_launch import all_started, launch, poll, vigil


class Figures(HTMLParser):
    """Elements close in order; per figure id, its `<svg>` count and its SVG `<text>` strings."""

    VOID = {"meta", "br", "img", "hr", "input", "link"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.figures, self.scripts = [], [], {}, 0
        self.figure, self.text = None, None

    def handle_starttag(self, tag, attrs):
        self.scripts += tag == "script"
        if tag not in self.VOID:
            self.stack.append(tag)
        if tag == "figure":
            self.figure = dict(attrs).get("id")
            self.figures[self.figure] = {"svg": 0, "texts": []}
        elif tag == "svg" and self.figure:
            self.figures[self.figure]["svg"] += 1
        elif tag == "text" and self.figure:
            self.text = ""

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:]}")
            return
        self.stack.pop()
        if tag == "figure":
            self.figure = None
        elif tag == "text" and self.text is not None:
            self.figures[self.figure]["texts"].append(self.text.strip())
            self.text = None

    def handle_data(self, data):
        if self.text is not None:
            self.text += data


def test_report_of_a_real_two_node_job(slurm_cluster, tmp_path):
    exp, job, d = launch(tmp_path)
    poll(lambda: all_started(tmp_path), 120, "all four ranks to start")
    (tmp_path / "release").write_text("")
    info = wait_job(int(job), timeout=120)
    assert info["JobState"] == "COMPLETED", info

    p = vigil(tmp_path, "report", exp)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(d / "report.html")
    html = (d / "report.html").read_text()
    page = Figures()
    page.feed(html)
    page.close()
    assert not page.errors and page.stack == [], (page.errors, page.stack)
    assert page.scripts == 0
    tl = page.figures["timeline-plot"]
    assert tl["svg"] == 1, page.figures
    texts = tl["texts"]
    # Node rank 0 ran on n1, node rank 1 on n2 (test_launch: rank 3 is on n2).
    assert "node 0 (n1)" in texts and "node 1 (n2)" in texts, texts
    assert texts.count("attempt 0") == 2, texts
    assert any(t.startswith("allocation 1: finished -> finished") for t in texts), texts
    assert f"allocation 1 (job {job}): " in html, html
    assert "vigil: 1 allocation, 0 in-job restarts, 0 requeues" in html

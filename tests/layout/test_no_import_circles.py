"""agent/src keeps the layout of docs/design.md: no two modules import each other, directly or
through others, and the pure cores (`supervise`, `values`) import nothing from the edges."""

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "agent" / "src"
PATH_RE = re.compile(r"\b(crate|super)((?:::[a-z_][a-z0-9_]*)+)")
# `crate::a::{b, c::{d, e}}` and `super::{a, b}`: a path that opens a group of imports.
GROUP_RE = re.compile(r"\b(crate|super)((?:::[a-z_][a-z0-9_]*)*)::\{")
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def module_of(f: Path):
    parts = list(f.relative_to(SRC).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)


def modules():
    return {module_of(f): f for f in SRC.rglob("*.rs") if f.name != "main.rs"}


def non_test_code(text):
    # Tests may reach across (a `#[cfg(test)] mod tests` runs inside its module only).
    i = text.find("#[cfg(test)]\nmod tests")
    return text if i < 0 else text[:i]


TOKEN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[{},*]")


def group_paths(text, i):
    """The paths inside the group of imports that opens at `text[i] == "{"`, each a list of
    segments relative to the group's prefix (nested groups expanded, `x as y` read as `x`)."""
    paths, stack, cur, alias = [], [], [], False
    for tok in TOKEN_RE.finditer(text, i + 1):
        t = tok.group()
        if t == "{":
            stack.append(cur)
            cur = []
        elif t in (",", "}"):
            if cur:
                paths.append([s for prefix in stack for s in prefix] + cur)
            cur, alias = [], False
            if t == "}":
                if not stack:
                    return paths
                stack.pop()
        elif t == "as":
            alias = True
        elif not alias and t != "*":
            cur.append(t)
    raise ValueError(f"unclosed import group at {i}")


def named_paths(text):
    """Every `(root, segments)` the text names: plain paths and each path of a group import."""
    for root, rest in PATH_RE.findall(text):
        yield root, [s for s in rest.split("::") if s]
    for m in GROUP_RE.finditer(text):
        prefix = [s for s in m.group(2).split("::") if s]
        for p in group_paths(text, m.end() - 1):
            yield m.group(1), prefix + [s for s in p if s != "self"]


def imports(mod, text, known):
    """The modules `mod`'s non-test code names, each resolved to the longest known module."""
    out = set()
    for root, segs in named_paths(non_test_code(text)):
        # `super` in `a/b.rs` and in `a/b/mod.rs` alike names `a`.
        base = [] if root == "crate" else list(mod[:-1])
        path = tuple(base + segs)
        while path and path not in known:
            path = path[:-1]
        if path and path != mod and not mod[: len(path)] == path:
            out.add(path)
    return out


def graph():
    known = modules()
    return {m: imports(m, f.read_text(), known) for m, f in known.items()}


def cycles(g):
    found, state = [], {}

    def visit(n, stack):
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                found.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m, stack)
        stack.pop()
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n, [])
    return found


def test_the_graph_is_read_from_the_sources():
    g = graph()
    # Sanity: the reader sees the arrows that certainly exist, so an empty graph cannot pass.
    assert ("supervise",) in g[("run",)]
    assert ("job", "nodes") in g[("cli", "config")]


def test_grouped_imports_are_read():
    known = {("a",), ("a", "b"), ("a", "c"), ("d",), ("e", "f"), ("e",)}
    text = "use crate::{a::{b::X, c}, d::{self, Y as Z}};\nuse super::{f as g, h};\n"
    assert imports(("e", "x"), text, known) == {("a", "b"), ("a", "c"), ("d",), ("e", "f")}
    assert imports(("e", "x"), "use super::{f, g};", known) == {("e", "f")}


def test_no_module_imports_one_that_imports_it():
    circles = [" -> ".join("::".join(m) for m in c) for c in cycles(graph())]
    assert circles == [], "import circles: " + "; ".join(circles)


def test_pure_cores_import_no_edge():
    g = graph()
    for m, deps in g.items():
        if m[:1] in (("supervise",), ("values",)):
            bad = [d for d in deps if d[:1] not in (("supervise",), ("values",))]
            assert bad == [], f"{'::'.join(m)} imports {bad}"

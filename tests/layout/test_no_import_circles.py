"""agent/src keeps the layout of docs/design.md: no two modules import each other, directly or
through others, and the pure cores (`supervise`, `values`) import nothing from the edges."""

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "agent" / "src"
PATH_RE = re.compile(r"\b(crate|super)((?:::[a-z_][a-z0-9_]*)+)")


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


def imports(mod, text, known):
    """The modules `mod`'s non-test code names, each resolved to the longest known module."""
    out = set()
    for root, rest in PATH_RE.findall(non_test_code(text)):
        segs = [s for s in rest.split("::") if s]
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


def test_no_module_imports_one_that_imports_it():
    circles = [" -> ".join("::".join(m) for m in c) for c in cycles(graph())]
    assert circles == [], "import circles: " + "; ".join(circles)


def test_pure_cores_import_no_edge():
    g = graph()
    for m, deps in g.items():
        if m[:1] in (("supervise",), ("values",)):
            bad = [d for d in deps if d[:1] not in (("supervise",), ("values",))]
            assert bad == [], f"{'::'.join(m)} imports {bad}"

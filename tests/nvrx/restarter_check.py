"""NVRx's check of the `[NestedRestarter]` lines, from its functional scripts
(tests/fault_tolerance/func/run_local_ddp_test_{heartbeats,sections}.sh,
`assert_restarter_sequence_is_correct`), in Python."""
import re

# NVRx's assert_restarter_sequence_is_correct, verbatim but for Python's spelling of the grep.
START = r"\[NestedRestarter\] name=\[InJob\] state=initialize\s*"
HANDLING = (
    r"(?:\[NestedRestarter\] name=\[InJob\] state=handling stage=starting\s*"
    r"(?:\[NestedRestarter\] name=\[InJob\] state=handling stage=processing\s*)*"
    r"\[NestedRestarter\] name=\[InJob\] state=handling stage=completed\s*)+"
)
LEAVING = (
    r"\[NestedRestarter\] name=\[InJob\] state=handling stage=starting\s*"
    r"(?:\[NestedRestarter\] name=\[InJob\] state=handling stage=processing\s*)*"
    r"\[NestedRestarter\] name=\[InJob\] state=aborted\s*"
)


def restarter_sequence_ok(console: str, with_restarts: bool) -> bool:
    # grep -oP '\[NestedRestarter\].*$' log > restarter.txt; grep -qPzo PATTERN restarter.txt
    lines = "".join(m.group(0) + "\n" for m in re.finditer(r"\[NestedRestarter\].*$", console, re.M))
    pattern = START + (HANDLING if with_restarts else "") + LEAVING
    return re.search(pattern, lines) is not None

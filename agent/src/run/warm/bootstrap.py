# vigil's warm process (agent/src/run/warm/mod.rs, docs/inprocess.md). Run as
#   PYTHON [FLAGS] -c <this> script PATH ARGS... | module NAME ARGS...
# It imports the modules named in VIGIL_WARM_IMPORTS (comma-separated) ahead of need, then waits
# on stdin for one line: {"env": {...}}, the identity of the rank it becomes. It takes that
# environment and runs the user's script or module as `python PATH ARGS` / `python -m NAME ARGS`
# would. End of file on stdin (the agent discards it) ends it.
import os
import sys


def _vigil_warm():
    kind, name, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    for mod in os.environ.pop("VIGIL_WARM_IMPORTS", "").split(","):
        if mod.strip():
            try:
                __import__(mod.strip())
            except Exception:
                # Not there for this interpreter: the script's own import says so, as at a cold start.
                pass
    line = sys.stdin.buffer.readline()
    if not line:
        os._exit(0)
    import json

    os.environ.update(json.loads(line)["env"])
    # A rank's stdin is /dev/null.
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    import runpy

    if kind == "script":
        sys.argv[:] = [name] + args
        sys.path[0] = os.path.dirname(os.path.realpath(name))
        runpy.run_path(name, run_name="__main__")
    else:
        sys.argv[:] = ["-m"] + args
        sys.path[0] = os.getcwd()
        runpy.run_module(name, run_name="__main__", alter_sys=True)


_vigil_warm()

"""Tests against a real three-node Slurm cluster on this machine (cluster.sh, docs/slurm-testing.md).

A package, so that its conftest is `slurm.conftest` and leaves the `conftest` module name to the
suites that import from theirs (python-shim/tests).
"""

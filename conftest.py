"""Hermetic tests: every test, in every suite, gets a fresh `$TMPDIR` of its own.

vigil keeps its socket, run directories and (for jobs without an identity) its state under
`$TMPDIR`; with a private one per test, no test sees what an earlier run of vigil or of the suite
left on the machine, and two tests never share a file. The directory is short (`/tmp/vt-XXXX`)
because Unix socket paths are limited to 107 bytes.
"""
import os
import shutil
import tempfile

import pytest


@pytest.fixture(autouse=True)
def _private_tmpdir(monkeypatch, tmp_path_factory):
    # pytest's own base temp dir is fixed first, from the real $TMPDIR, so tmp_path stays valid.
    tmp_path_factory.getbasetemp()
    d = tempfile.mkdtemp(prefix="vt-", dir=os.environ.get("VIGIL_TEST_TMP_ROOT", "/tmp"))
    monkeypatch.setenv("TMPDIR", d)
    yield d
    shutil.rmtree(d, ignore_errors=True)

"""`make lab`: JupyterLab from the project's venv on notebooks/, started by make itself, headless on a
free port with a token.  Its REST API must open the report notebook with its cells, and (jupytext's
server extension, from the notebooks extra) the paired py:percent twin as the same notebook.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def _make_lab(args: list[str]) -> list[str]:
    """`make lab` with this Python's venv as the project's (-o: taken as installed, not rebuilt)."""
    venv = Path(sys.prefix)
    return ["make", "--no-print-directory", "-o", f"{venv}/.installed", "lab", f"VENV={venv}",
            f"LAB_ARGS={' '.join(args)}"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str) -> dict:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture
def lab(tmp_path):
    """A running JupyterLab: (base URL, token); shut down through its API, killed only if that fails."""
    import jupyterlab  # noqa: F401  (the notebooks extra installs it: a missing one fails here, not skips)

    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_DATA_DIR=str(tmp_path / "data"), IPYTHONDIR=str(tmp_path / "ipython"))
    log = open(tmp_path / "lab.log", "w+")
    proc = subprocess.Popen(_make_lab(["--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
                                       "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}"]),
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                _get(f"{base}/api/status", token)
                break
            except (urllib.error.URLError, ConnectionError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"JupyterLab did not start (exit {proc.poll()}):\n{log.read()[-3000:]}")
                time.sleep(0.3)
        yield base, token
    finally:
        if proc.poll() is None:
            req = urllib.request.Request(f"{base}/api/shutdown", method="POST",
                                         headers={"Authorization": f"token {token}"})
            try:
                urllib.request.urlopen(req, timeout=10).close()
                proc.wait(timeout=30)
            except (urllib.error.URLError, ConnectionError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)  # make and the server it started
                proc.wait()
        log.close()
    assert proc.returncode == 0, f"JupyterLab did not shut down cleanly (exit {proc.returncode})"


def test_make_lab_serves_the_notebooks_and_their_paired_py_files(lab):
    base, token = lab
    # The server's root is notebooks/: every notebook and its twin are there.
    names = {c["name"] for c in _get(f"{base}/api/contents/", token)["content"]}
    for nb in sorted(NOTEBOOKS.glob("*.ipynb")):
        assert {nb.name, nb.with_suffix(".py").name} <= names, names
    # The lab page itself is served (its static assets are installed with it).
    req = urllib.request.Request(f"{base}/lab?token={token}")
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200 and b"JupyterLab" in r.read()
    committed = nbformat.read(NOTEBOOKS / "03_report.ipynb", as_version=4)
    want = [(c.cell_type, c.source) for c in committed.cells]
    got = _get(f"{base}/api/contents/03_report.ipynb?content=1", token)
    assert got["type"] == "notebook" and got["format"] == "json"
    cells = [(c["cell_type"], c["source"]) for c in got["content"]["cells"]]
    assert len(cells) > 10 and cells == want
    assert any("parameters" in c.get("metadata", {}).get("tags", []) for c in got["content"]["cells"])
    # The py:percent twin opens as the same notebook: jupytext's contents manager is in the server.
    twin = _get(f"{base}/api/contents/03_report.py?type=notebook&content=1", token)
    assert twin["type"] == "notebook"
    assert [(c["cell_type"], c["source"]) for c in twin["content"]["cells"]] == want
    assert twin["content"]["metadata"]["jupytext"]["formats"] == "ipynb,py:percent"

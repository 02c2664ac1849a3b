"""scripts/slim_sglang_wheel.py: an SGLang wheel rewritten without what a text-only server never imports."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slim_sglang_wheel.py"
KEEP = ["sglang/__init__.py", "sglang/srt/speculative/eagle_worker_v2.py",
        "sglang/srt/rust_extensions/_server.cpython-312-x86_64-linux-gnu.so",
        "sglang/srt/rust_extensions/loader.py", "sglang/srt/mem_cache/rust_tree_core/mem_cache.cpython-312-x86_64-linux-gnu.so",
        "sglang/srt/multimodal/processors/base.py", "sglang-0.5.23.dist-info/RECORD"]
DROP = ["sglang/multimodal_gen/runtime/x.py", "sglang/srt/rust_extensions/_grpc.cpython-312-x86_64-linux-gnu.so",
        "sglang/srt/rust_extensions/_bench.cpython-312-x86_64-linux-gnu.so",
        "sglang/srt/rust_extensions/_multimodal.cpython-312-x86_64-linux-gnu.so"]


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_the_wheel_keeps_the_server_and_loses_the_rest(tmp_path):
    whl = tmp_path / "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for name in KEEP + DROP:
            z.writestr(name, name * 200)  # contents that tell the members apart
    p = run(str(whl))
    assert p.returncode == 0, p.stderr
    with zipfile.ZipFile(whl) as z:
        assert sorted(z.namelist()) == sorted(KEEP)
        assert all(z.read(n) == (n * 200).encode() for n in KEEP)
    assert list(tmp_path.iterdir()) == [whl]  # no temporary file left


def test_a_file_that_is_not_a_wheel_is_one_line_and_stays_as_it_was(tmp_path):
    bad = tmp_path / "sglang-0.5.23-x.whl"
    bad.write_bytes(b"not a zip")
    p = run(str(bad))
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1 and "File is not a zip file" in p.stderr
    assert bad.read_bytes() == b"not a zip" and list(tmp_path.iterdir()) == [bad]
    assert run("nothing.txt").returncode == 2

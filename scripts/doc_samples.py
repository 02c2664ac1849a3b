"""Sample outputs in the docs, checked against what the commands print today.

A sample is a comment naming the command, then a fenced block holding its output:

    <!-- sample: dynspec sim --profile seed-blackwell --arm baseline --concurrency 1 -->
    ```
    ...what it prints...
    ```

    python scripts/doc_samples.py           # exit 1 and a diff for every stale sample
    python scripts/doc_samples.py --write   # rewrite the stale blocks with today's output

Each command runs as `python -m dynspec ARGS` in an empty temporary folder (it may write
files there), so only commands that are deterministic and take seconds belong here.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SAMPLE = re.compile(r"<!-- sample: (?P<cmd>.+?) -->\n```[a-z]*\n(?P<body>.*?)```", re.S)


@dataclass
class Sample:
    path: Path
    cmd: str
    shown: str
    span: tuple[int, int]  # of the block's body in the file

    def run(self) -> str:
        args = shlex.split(self.cmd)
        if args[:1] != ["dynspec"]:
            raise ValueError(f"{self.path.name}: sample command must start with 'dynspec': {self.cmd}")
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run([sys.executable, "-m", "dynspec", *args[1:]], cwd=tmp, capture_output=True,
                                  text=True, timeout=300)
        if proc.returncode not in (0, 2):  # 2: a sample of a refusal is fine
            raise RuntimeError(f"{self.path.name}: `{self.cmd}` exited {proc.returncode}: {proc.stderr[-500:]}")
        return proc.stdout + proc.stderr


def samples(paths=DOCS) -> list[Sample]:
    out = []
    for path in paths:
        text = path.read_text()
        for m in SAMPLE.finditer(text):
            out.append(Sample(path, m["cmd"], m["body"], m.span("body")))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite stale samples with today's output")
    args = ap.parse_args(argv)
    stale = []
    for s in samples():
        now = s.run()
        if now != s.shown:
            stale.append((s, now))
            sys.stdout.writelines(difflib.unified_diff(s.shown.splitlines(True), now.splitlines(True),
                                                       f"{s.path.name}: {s.cmd} (shown)", "(prints today)"))
    if args.write:
        for path in {s.path for s, _ in stale}:
            text = path.read_text()
            for s, now in sorted((x for x in stale if x[0].path == path), key=lambda x: -x[0].span[0]):
                text = text[: s.span[0]] + now + text[s.span[1]:]
            path.write_text(text)
        print(f"rewrote {len(stale)} sample(s)")
        return 0
    print(f"{len(stale)} stale sample(s)" if stale else "every sample matches")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

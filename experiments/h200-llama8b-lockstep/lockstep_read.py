"""What goodput read from the prefill forwards of a live run, level by level.

The patched server tells the policy every prefill result (`note_prefill`); goodput reports in
/get_server_info whether finishes came in lockstep (docs/POLICIES.md, "Finishes that come
together").  The live sweep saves /get_server_info after each level in scrapes/; this prints,
per level, the prompts prefilled and forwards in it (differences of the counters), the decode
steps and the speculative ones among them, and goodput's estimates after it (EMAs over the
server's life, mostly that level's):

    python experiments/h200-llama8b-lockstep/lockstep_read.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

from dynspec.live.server_info import dynspec_state

SCRAPE = re.compile(r"(?P<arm>.+)_c(?P<c>\d+)_r(?P<r>\d+)\.json(\.gz)?$")
COUNTERS = ("prompts_prefilled", "prefills", "steps", "steps_spec")


def _load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def rows(run: Path) -> list[dict]:
    out = []
    for path in sorted((run / "scrapes").glob("*.json*"), key=lambda p: (SCRAPE.match(p.name) is None, p.name)):
        m = SCRAPE.match(path.name)
        if not m:
            continue
        scrape = _load(path)
        before, after = (dynspec_state((scrape.get(k) or {}).get("server_info")) for k in ("before", "after"))
        if after is None:
            continue  # not a patched server
        row = {"run": run.name, "arm": m["arm"], "concurrency": int(m["c"]), "repeat": int(m["r"])}
        for k in COUNTERS:
            row[k] = after.get(k, 0) - ((before or {}).get(k) or 0)
        row.update(after.get("prefill_estimates") or {})
        out.append(row)
    return sorted(out, key=lambda r: (r["arm"], r["repeat"], r["concurrency"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    args = ap.parse_args(argv)
    for run in args.runs:
        if not (run / "scrapes").is_dir():
            print(f"lockstep_read: {run} has no scrapes/ folder (not a live run)", file=sys.stderr)
            return 2
    import pandas as pd

    df = pd.DataFrame([r for run in args.runs for r in rows(run)])
    if df.empty:
        print("lockstep_read: no level of a patched server in these runs", file=sys.stderr)
        return 2
    print(df.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

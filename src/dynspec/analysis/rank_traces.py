"""Every tensor-parallel rank's step trace compared step by step: did the ranks decide alike?

A patched server started with DYNSPEC_STEP_TRACE=PATH writes one trace per TP rank (rank 0
PATH, rank r PATH.rankR; dynspec.sglang.step_trace).  Every field but the time is rank-identical
when the ranks decide alike: the decision before each step (s/p) with its batch size, each
launched prefill (f), each result (S/P with accepted drafts, F with requests and prompt tokens).
The first line where two ranks differ is where their decisions (or what they saw) parted.

A rank's trace is written about once a second, so a server stopped mid-run leaves the ranks'
files cut at different lines: the common prefix is compared and the cut reported
(`complete` is False).

    python -m dynspec.analysis.rank_traces PATH_OR_FOLDER... [--require-complete]

prints one line per trace (a folder: every trace in it that has a .rank1 beside it) and exits
1 if any ranks differ (or, with --require-complete, were cut at different lines).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

Row = tuple[str, int, int]  # kind, batch, count: what every rank must write alike


class TraceError(ValueError):
    """A trace that cannot be read; the message is one line."""


def read_trace(path: Path) -> list[Row]:
    """A step trace's rows without their times."""
    rows: list[Row] = []
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    if not lines or lines[0] != "t,kind,batch,count":
        raise TraceError(f"{path}: not a step trace (first line should be t,kind,batch,count)")
    for n, line in enumerate(lines[1:], start=2):
        parts = line.split(",")
        try:
            if len(parts) != 4:
                raise ValueError
            float(parts[0])
            rows.append((parts[1], int(parts[2]), int(parts[3])))
        except ValueError:
            raise TraceError(f"{path}:{n}: not a trace line: {line!r}") from None
    return rows


def rank_files(path: Path) -> list[Path]:
    """Rank 0's trace and its ranks' beside it (PATH.rank1, PATH.rank2, ... while they exist)."""
    files = [path]
    while (nxt := Path(f"{path}.rank{len(files)}")).exists():
        files.append(nxt)
    return files


@dataclass(frozen=True)
class Comparison:
    path: Path
    lines: tuple[int, ...]  # rows per rank
    compared: int  # rows of the common prefix
    decisions: int  # s/p rows in it: decode steps every rank decided alike
    plain: int  # of which plain
    mismatch: int | None  # index of the first row where ranks differ
    rows_at_mismatch: tuple[Row, ...] = ()

    @property
    def ranks(self) -> int:
        return len(self.lines)

    @property
    def agree(self) -> bool:
        return self.mismatch is None

    @property
    def complete(self) -> bool:
        return len(set(self.lines)) == 1

    def line(self) -> str:
        head = f"{self.path}: {self.ranks} ranks, rows {'/'.join(map(str, self.lines))}"
        if not self.agree:
            got = "; ".join(f"rank {r}: {row}" for r, row in enumerate(self.rows_at_mismatch))
            return f"{head}: DIFFER at row {self.mismatch + 1} ({got})"  # type: ignore[operator]
        cut = "" if self.complete else f" (cut at different rows: compared the first {self.compared})"
        return (f"{head}: identical over {self.compared} rows, {self.decisions} decisions "
                f"({self.plain} plain){cut}")


def compare(path: Path) -> Comparison:
    """Rank 0's trace at `path` against every other rank's, row by row."""
    files = rank_files(path)
    if len(files) < 2:
        raise TraceError(f"{path}: no {path.name}.rank1 beside it (a TP=1 server writes one trace)")
    traces = [read_trace(f) for f in files]
    n = min(len(t) for t in traces)
    mismatch = next((i for i in range(n) if any(t[i] != traces[0][i] for t in traces[1:])), None)
    upto = n if mismatch is None else mismatch
    kinds = [traces[0][i][0] for i in range(upto)]
    return Comparison(path, tuple(len(t) for t in traces), upto, sum(k in "sp" for k in kinds),
                      kinds.count("p"), mismatch,
                      tuple(t[mismatch] for t in traces) if mismatch is not None else ())


def traces_in(target: Path) -> list[Path]:
    """A trace path itself, or every rank-0 trace in a folder (tree) that has a .rank1 beside it."""
    if not target.is_dir():
        return [target]
    return sorted(p for p in target.rglob("*") if p.is_file() and ".rank" not in p.name
                  and Path(f"{p}.rank1").exists())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dynspec.analysis.rank_traces", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", type=Path, help="rank 0's trace (PATH) or a folder of traces")
    ap.add_argument("--require-complete", action="store_true",
                    help="also fail when the ranks' traces were cut at different rows")
    args = ap.parse_args(argv)
    paths = [p for t in args.paths for p in traces_in(t)]
    if not paths:
        print(f"rank_traces: no TP traces (PATH with PATH.rank1 beside it) in {', '.join(map(str, args.paths))}")
        return 1
    bad = 0
    for p in paths:
        try:
            c = compare(p)
        except TraceError as exc:
            print(f"rank_traces: {exc}")
            bad += 1
            continue
        print(c.line())
        bad += not c.agree or (args.require_complete and not c.complete)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

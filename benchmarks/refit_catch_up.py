"""Refit the fitted profiles' draft catch-up from a calibrated profile.

Until `dynspec calibrate` has measured the KV-only catch-up and the resume on a GPU, the fit
specs in configs/fits/ carry fixed shares (catch_up_fraction, resume_fraction) from the
../shared DESIGN notes, with an assumption saying so.  Once the calibrated profile has
catchup_ms and resume_ms, this replaces them in every spec by `catch_up_from: PROFILE` (per
knot, the measured shares at that batch size; the fit writes where they came from into the
profile's assumptions) and refits each spec's shipped profile.

    PYTHONPATH=src .venv/bin/python benchmarks/refit_catch_up.py [--from h200-llama8b] [SPEC ...]

Exit status 2 when the source profile has no catchup_ms (calibrate it first) or a fit fails.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from dynspec.cli import main as dynspec
from dynspec.sim.profile import ProfileError, load_profile

ROOT = Path(__file__).resolve().parents[1]
MARKER = "to be replaced by a calibrate run"  # the interim assumption's label


def use_measured(text: str, source: str) -> str:
    """The spec text with its fixed catch-up shares and their interim assumption replaced by
    `catch_up_from: source`."""
    text = re.sub(r"^(catch_up_fraction|resume_fraction|catch_up_from):.*\n", "", text, flags=re.M)
    text = "".join(line for line in text.splitlines(keepends=True) if MARKER not in line)
    return text.rstrip("\n") + f"\ncatch_up_from: {source}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="*", help="fit specs (default: configs/fits/*.yaml)")
    ap.add_argument("--from", dest="source", default="h200-llama8b",
                    help="the calibrated profile, shipped name or path (default h200-llama8b)")
    ap.add_argument("--profiles", default="src/dynspec/sim/profiles", help="where each spec's profile is written")
    args = ap.parse_args(argv)
    try:
        src = load_profile(args.source)
    except ProfileError as exc:
        print(f"refit_catch_up: {exc}", file=sys.stderr)
        return 2
    if src.steps[0].catchup_ms is None:
        print(f"refit_catch_up: profile {src.name} has no catchup_ms/resume_ms: run the new dynspec calibrate "
              "first", file=sys.stderr)
        return 2
    specs = [Path(s) for s in args.specs] or sorted((ROOT / "configs" / "fits").glob("*.yaml"))
    for spec in specs:
        spec.write_text(use_measured(spec.read_text(), args.source))
        rel = spec.relative_to(ROOT) if spec.is_relative_to(ROOT) else spec
        name = re.search(r"^name:\s*(\S+)", spec.read_text(), flags=re.M).group(1)
        out = Path(args.profiles) / f"{name}.yaml"
        print(f"\n== dynspec fit {rel} --out {out}")
        if dynspec(["fit", str(rel), "--out", str(out)]) != 0:
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

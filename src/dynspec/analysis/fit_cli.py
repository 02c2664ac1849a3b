"""`dynspec fit`: a profile fitted to published throughputs (a fit spec) or to a sweep's own
plain and EAGLE-3 arms (--from-run).  The command line of dynspec.sim.fit and dynspec.analysis.run_fit, apart
from both so that neither imports the other."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from dynspec.io.atomic import write_text
from dynspec.sim.fit import FitError, FitSpec, fit, format_table, load_fit_spec, profile_yaml
from dynspec.models import validation_message


def _spec(args) -> FitSpec:
    if bool(args.spec) == bool(args.from_run):
        raise FitError("give a fit spec or --from-run RUN_DIR, not both and not neither")
    if args.spec:
        return load_fit_spec(args.spec)
    from pydantic import ValidationError

    from dynspec.analysis.run_fit import spec_from_run

    try:
        return spec_from_run(args.from_run, baseline_arm=args.baseline_arm, eagle3_arm=args.eagle3_arm,
                             name=args.name, catch_up_fraction=args.catch_up_fraction,
                             accept_length=args.accept_length)
    except ValidationError as exc:
        raise FitError(validation_message(exc, f"fit spec from {args.from_run}")) from None


def _run(args) -> int:
    import shlex

    from dynspec import provenance

    prog = "dynspec fit"
    argv = provenance.argv_of(args)
    try:
        out = Path(args.out)
        if out.suffix not in (".yaml", ".yml"):
            raise FitError(f"{out}: a profile is written as .yaml")
        spec = _spec(args)
        profile, table = fit(spec, command=shlex.join(argv) if argv else None,
                             log=(lambda m: print(m, file=sys.stderr)) if args.verbose else None)
    except FitError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    print(format_table(table))
    written = []
    if args.from_run:  # the spec built from the run, beside the profile: what was fitted, and rerunnable
        spec_out = write_text(out.with_name(out.stem + ".fit.yaml"),
                              yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False,
                                             width=100))
        written.append(spec_out)
        print(f"wrote {spec_out} (the fit spec; `dynspec fit {spec_out} --out {out}` refits it)")
    written.insert(0, write_text(out, profile_yaml(profile, table)))
    provenance.write(provenance.beside(out), "fit", spec, argv=argv, profile=spec.catch_up_from, outputs=written)
    print(f"wrote {out} (worst error {100 * max(abs(r['error']) for r in table):.2f}%)")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("fit", help="fit a profile's step times to published or measured throughputs (runs the simulator)")
    p.add_argument("spec", nargs="?", help="a fit spec YAML (see configs/fits/)")
    p.add_argument("--from-run", metavar="RUN_DIR",
                   help="instead of a spec: a sweep's run folder, its plain and EAGLE-3 arms as the targets")
    p.add_argument("--baseline-arm", default="baseline", help="with --from-run: the plain arm (default baseline)")
    p.add_argument("--eagle3-arm", default="eagle3", help="with --from-run: the always-speculating arm (default eagle3)")
    p.add_argument("--name", help="with --from-run: the profile's name (default RUN_ID-fitted)")
    p.add_argument("--catch-up-fraction", type=float, default=0.0,
                   help="with --from-run: a switching server's plain-step overhead, as a fraction (default 0)")
    p.add_argument("--accept-length", type=float, help="with --from-run: instead of the arm's measured mean")
    p.add_argument("--out", required=True, help="the profile YAML to write")
    p.add_argument("--verbose", action="store_true", help="print each iteration's worst error")
    p.set_defaults(func=_run)

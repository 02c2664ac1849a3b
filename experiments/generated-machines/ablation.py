"""Each goodput mechanism switched off in turn, on open-loop arrivals with varied output lengths (simulated).

The question: does a mechanism earn its place on work shaped like real traffic?  On the first N
members of family S, at concurrency caps C, requests arrive at a share (--load) of the rate the
member's plain server completes at that C in a closed loop (gamma intervals, --burstiness 1:
Poisson), output lengths drawn in [0.5, 1] x the member's, --level-scale x max(5C, 50) of them.
A load above 1 queues behind the cap: throughput is then the server's.  Each member-level runs the
whole policy and the policy with one mechanism off, under the same simulator seeds.

A mechanism earns at a member-level where, over the seeds, the whole policy's output tok/s, mean
TPOT or mean end-to-end latency is better by >= 0.5% and by more than two standard errors of the
seeds' paired ratios (one seed's luck at batch 1 is not a mechanism's worth).  Rows go to a
journal as each member finishes (--out; a rerun resumes it).

    .venv/bin/python experiments/generated-machines/ablation.py --out F.jsonl [--family 24] [--seed 0]
        [--concurrency 2,8,32,96] [--load 0.5,0.8,1.2] [--seeds 4] [--level-scale 2] [--mechanisms a,b]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

from dynspec.policy.goodput import acceptance, policy, prefill, steps, times

CANDIDATES = [0, 1, 3, 5, 7]
_read_bursts, _count = prefill.PrefillAccount._read_bursts, steps.GoodputK._count


def _patches(*items: tuple[object, str, object]) -> Callable[[], contextlib.ExitStack]:
    """(class or module, attribute, replacement), applied together for one run."""
    def enter() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        for target, attr, new in items:
            stack.enter_context(mock.patch.object(target, attr, new))
        return stack
    return enter


def _never_lockstep(self) -> None:
    _read_bursts(self)
    self._lock = False


def _without_acc_prior(self, accepted, k, b) -> None:
    _count(self, accepted, k, b)
    self.inner.acc_prior = None


def _switch_uncounted(self) -> None:
    self._sw_dir = -1


Acc, Pre, Tim, Gp, GK = (acceptance.AcceptanceEstimates, prefill.PrefillAccount, times.StepTimes, policy.Goodput,
                         steps.GoodputK)
# name: (the policy it belongs to, spec options that switch it off, patches that do, what it is)
MECHANISMS: dict[str, tuple[str, str, Callable[[], contextlib.ExitStack] | None, str]] = {
    "lead": ("goodput", "lead=0,lead_apart=0", None, "speculation must promise more output than plain to be chosen"),
    "lead-apart": ("goodput", "lead_apart=0.05", None, "the lead falls where finishes come at random"),
    "margin": ("goodput", "margin=0", None, "a switch needs a margin's advantage (hysteresis)"),
    "dwell": ("goodput", "dwell=0", None, "a switch holds for a few steps"),
    "merge": ("goodput", "merge=0", None, "a spec step gathers more arrivals into one prefill forward"),
    "scatter": ("goodput", "", _patches((Pre, "_scatter", lambda self, b, acc, tp, ts: 0.0)),
                "a spec step scatters finishes that come in lockstep"),
    "lockstep": ("goodput", "", _patches((Pre, "_read_bursts", _never_lockstep)),
                 "probes from plain are rationed while finishes come in lockstep"),
    "survivorship": ("goodput", "", _patches((Acc, "_settled", lambda self, a, f, regime=1.0: a)),
                     "requests that accept little linger in a speculating batch"),
    "per-request": ("goodput", "", _patches((Acc, "set_batch", lambda self, requests: None)),
                    "small batches are estimated request by request"),
    "pairs": ("goodput", "", _patches((Acc, "_pair_sample", lambda self, rids, accepted: None)),
              "how requests differ, from pairs of speculative steps"),
    "shift": ("goodput", "", _patches((Gp, "SHIFT_Z", math.inf)), "a probe that contradicts the estimate restarts it"),
    "regret": ("goodput", "", _patches((Gp, "REGRET_Z", 0.0)),
               "probes come sooner while the other mode may win (the estimate's uncertainty)"),
    "borrow": ("goodput", "", _patches((Gp, "BORROW", math.inf)),
               "a new bucket is decided from a neighbour that clearly knows"),
    "fill": ("goodput", "", _patches((Tim, "_fill", lambda self, b: None)),
             "a bucket's unmeasured step time lies between its neighbours'"),
    "prefill-overhead": ("goodput", "", _patches((Pre, "_overhead", lambda self, mode, seconds, requests: None)),
                         "each mode's steps carry their share of the prefills' overhead"),
    "switch-costs": ("goodput", "", _patches((Tim, "_end_switch", _switch_uncounted)),
                     "what a switch costs each way is measured and priced"),
    "plain-probes": ("goodput-k", "", _patches((GK, "_plain_probe_target", lambda self, b: None)),
                     "a K not yet run is probed while goodput decodes plainly"),
    "acc-prior": ("goodput-k", "", _patches((GK, "_count", _without_acc_prior)),
                  "goodput's young buckets lean on every K's steps, read by position"),
    "rescale": ("goodput-k", "", _patches((Acc, "rescale_requests", lambda self, r: None)),
                "a change of K rescales how requests differ"),
    "lead-by-k": ("goodput-k", "", _patches((steps, "LEAD_BY_K", False)),
                  "the lead follows the drafts the chosen K accepts"),
    "own-k": ("goodput-k", "", _patches((steps, "_OWN_K_BUCKETS", 0)),
              "at batch 1, K follows the request's own acceptance"),
    "settle": ("goodput-k", "", _patches((steps, "SETTLE", False)),
               "each K is priced at the batch it settles into (requests differ)"),
    "chain-spread": ("goodput-k", "", _patches((GK, "_sd_at", lambda self, b: None)),
                     "until measured, a request's spread is the chain's at the bucket's K"),
}

METRICS = (("output_throughput", 1), ("mean_tpot_ms", -1), ("mean_e2e_ms", -1))  # 1: higher is better


def _arm(policy_name: str, options: str) -> str:
    return f"policy:{policy_name}" + (f":{options}" if options else "")


def run_level(args: argparse.Namespace, index: int, c: int, load: float, seeds: range,
              names: list[str], wholes: bool = True) -> list[dict]:
    """One member-level under each simulator seed: the whole policies of `names` and each
    mechanism off.  Requests arrive at `load` x the rate the member's plain server completes at
    C in a closed loop."""
    from dynspec.analysis.family import level_requests, member
    from dynspec.sim.run import simulate_level

    m = member(args.seed, index)
    p = m.profile()
    work = level_requests(m, c, 0.5, args.level_scale)
    plain, _ = simulate_level(p, "policy:never", c, **work)
    rate = load * plain["request_throughput"]
    variants = [(w, w, "", None) for w in sorted({MECHANISMS[n][0] for n in names})] + \
        [(n, *MECHANISMS[n][:3]) for n in names]
    rows = []
    for seed in seeds:  # simulator seeds: arrivals and acceptance draws
        for variant, pol, options, patch in variants:
            cands = CANDIDATES if pol == "goodput-k" else None
            with patch() if patch else contextlib.nullcontext():
                mt, _ = simulate_level(p, _arm(pol, options), c, seed=seed, candidate_steps=cands,
                                       request_rate=rate, burstiness=args.burstiness, **work)
            rows.append({"member": index, "concurrency": c, "load": load, "seed": seed, "variant": variant,
                         **{k: mt[k] for k, _ in METRICS}, "spec_share": mt["spec_step_fraction"]})
    return rows


def run_member(args: argparse.Namespace, index: int) -> list[dict]:
    """Every level of one member under seeds 0..seeds-1: the rows the journal keeps for it."""
    return [r for c in args.concurrency for load in args.load
            for r in run_level(args, index, c, load, range(args.seeds), args.mechanisms)]


def confirm_unit(args: argparse.Namespace, unit: tuple[str, int, int, float]) -> list[dict]:
    name, index, c, load = unit
    return run_level(args, index, c, load, range(args.seeds, args.seeds + args.confirm), [name])


def levels(df, names: list[str]):
    """Per mechanism: the whole policy over the policy without it at each member-level, per
    metric (better > 1), the mean over seeds and its standard error."""
    import pandas as pd

    level = ["member", "concurrency", "load"]
    for name in names:
        whole = df[df.variant == MECHANISMS[name][0]].set_index([*level, "seed"])
        off = df[df.variant == name].set_index([*level, "seed"])
        ratios = pd.DataFrame({k: (whole[k] / off[k]) ** sign for k, sign in METRICS}).dropna()
        if ratios.empty:
            continue
        g = ratios.groupby(level)
        mean = g.mean()
        se = g.std(ddof=1).fillna(0.0).div(g.size().pow(0.5), axis=0)
        yield name, mean, se


def _beyond(mean, se, sign: int):
    """Member-levels where some metric moved >= 0.5% that way, by more than two standard errors."""
    d = (mean - 1.0) * sign
    return ((d >= 0.005) & (d > 2.0 * se)).any(axis=1)


def judge(df, names: list[str]):
    """Per mechanism: member-levels where it earns and where it costs, its best and worst."""
    import pandas as pd

    out = []
    for name, mean, se in levels(df, names):
        best = mean.max(axis=1)
        out.append({"mechanism": name, "policy": MECHANISMS[name][0], "levels": len(mean),
                    "earns": int(_beyond(mean, se, 1).sum()), "costs": int(_beyond(mean, se, -1).sum()),
                    "best": round(float(best.max()), 4), "best_at": _where(best.idxmax()),
                    "worst": round(float(mean.min(axis=1).min()), 4), "worst_at": _where(mean.min(axis=1).idxmin()),
                    **{f"median_{k}": round(float(mean[k].median()), 4) for k, _ in METRICS}})
    return pd.DataFrame(out)


def _where(level: tuple) -> str:
    member, c, load = level
    return f"{member} C={c} load {load}"


def _journal_rows(path: Path) -> dict[str, list[dict]]:
    """A journal's finished units, read without resuming it."""
    from dynspec.io.jsonl import read_jsonl

    return {e["key"]: e["rows"] for i, e in read_jsonl(path, SystemExit) if i > 1}  # type: ignore[index]


def _run(journal, todo: list, work, args: argparse.Namespace) -> None:
    """Each unit of todo through work(args, unit), into the journal as it finishes."""
    if args.jobs > 1 and len(todo) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.jobs) as pool:
            for unit, rows in zip(todo, pool.map(work, [args] * len(todo), todo)):
                journal.add(_key(unit), rows)
    else:
        for unit in todo:
            journal.add(_key(unit), work(args, unit))


def _key(unit) -> str:
    return "/".join(map(str, unit)) if isinstance(unit, tuple) else str(unit)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="journal of rows (.jsonl); a rerun with the same options resumes it")
    ap.add_argument("--family", type=int, default=24, help="the first N members")
    ap.add_argument("--seed", type=int, default=0, help="the family")
    ap.add_argument("--concurrency", default="2,8,32,96", help="concurrency caps of the open loop")
    ap.add_argument("--load", default="0.5,0.8,1.2", help="arrival rates as shares of the plain server's closed-loop rate")
    ap.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrival intervals (1: Poisson)")
    ap.add_argument("--seeds", type=int, default=4, help="simulator seeds 0..N-1 per member-level")
    ap.add_argument("--level-scale", type=int, default=2, help="requests per level: this x max(5C, 50)")
    ap.add_argument("--mechanisms", default="all", help=f"comma-separated, or all: {', '.join(MECHANISMS)}")
    ap.add_argument("--confirm", type=int, default=0,
                    help="then run each member-level where a mechanism earned again under N fresh seeds "
                         "(journal OUT.confirmN.jsonl): out of hundreds of levels a few pass by chance")
    ap.add_argument("--jobs", type=int, default=1, help="members simulated at once")
    args = ap.parse_args(argv)
    try:
        args.concurrency = [int(x) for x in args.concurrency.split(",")]
        args.load = [float(x) for x in args.load.split(",")]
    except ValueError as exc:
        ap.error(f"--concurrency and --load are comma-separated numbers ({exc})")
    args.mechanisms = list(MECHANISMS) if args.mechanisms == "all" else args.mechanisms.split(",")
    unknown = [n for n in args.mechanisms if n not in MECHANISMS]
    if unknown:
        ap.error(f"unknown mechanism {unknown[0]!r}; known: {', '.join(MECHANISMS)}")
    if (args.family < 1 or args.seeds < 2 or args.level_scale < 1 or args.jobs < 1 or min(args.concurrency) < 1
            or min(args.load) <= 0 or not 0 < args.burstiness < math.inf or args.confirm not in (0, *range(2, 1000))):
        ap.error("need --family, --level-scale, --jobs, concurrencies >= 1, --seeds >= 2, --confirm 0 or >= 2, "
                 "loads and --burstiness > 0")
    import pandas as pd

    from dynspec.io.journal import Journal, code_digest

    out = Path(args.out)
    config = {k: v for k, v in vars(args).items() if k not in ("out", "jobs", "confirm")} | {"code": code_digest()}
    done = _journal_rows(out) if out.exists() and out.stat().st_size else {}
    if any(str(i) not in done for i in range(args.family)):  # a finished journal is read, not resumed
        journal = Journal(out, config)
        _run(journal, [i for i in range(args.family) if str(i) not in journal.done], run_member, args)
        done = journal.done
    df = pd.DataFrame([r for i in range(args.family) for r in done[str(i)]])
    print(f"SIMULATED, family {args.seed} members 0..{args.family - 1}, open loop (gamma shape {args.burstiness}), "
          f"caps {args.concurrency}, loads {args.load}, output lengths in [0.5, 1] x, simulator seeds 0..{args.seeds - 1}; "
          "whole policy / policy without the mechanism (> 1: the mechanism helps):")
    print(judge(df, args.mechanisms).to_string(index=False))
    if not args.confirm:
        return 0
    units = [(name, *lv) for name, mean, se in levels(df, args.mechanisms)
             for lv in mean.index[_beyond(mean, se, 1)]]
    cj = Journal(out.with_suffix(f".confirm{args.confirm}.jsonl"), config | {"confirm": args.confirm})
    _run(cj, [u for u in units if _key(u) not in cj.done], confirm_unit, args)
    cf = pd.DataFrame([r for u in units for r in cj.done[_key(u)]]) if units else pd.DataFrame()
    print(f"\nThe member-levels where it earned, again under simulator seeds {args.seeds}..{args.seeds + args.confirm - 1}:")
    for name in args.mechanisms:
        tried = [u[1:] for u in units if u[0] == name]
        kept = []
        if tried:
            sub = cf[cf.variant.isin([name, MECHANISMS[name][0]])]
            for _, mean, se in levels(sub, [name]):
                kept = [(_where(lv), round(float(mean.loc[lv].max()), 4)) for lv in mean.index[_beyond(mean, se, 1)]]
        verdict = "EARNS" if kept else "does not earn"
        print(f"  {name:17s} {verdict:13s} confirmed at {len(kept)} of {len(tried)}: {kept[:4]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

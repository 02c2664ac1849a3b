"""The report's tables, each computed from the levels table (`level_table`): speedup, the envelope,
the load crossover, latencies, goodput, speculation, and the reference beside the run.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dynspec.analysis import levels as lv
from dynspec.analysis.report.run import _EXTRA_PCT, ReportError, numeric_metrics
from dynspec.results import LATENCIES, closed_loop, open_loop, percentile_label


LEVEL_METRICS = [
    "output_throughput", "request_throughput", "request_goodput", "slo_attainment",
    *[f"{s}_{m}_ms" for m in LATENCIES for s in ("mean", "median", "p90", "p95", "p99")],
    "accept_length", "spec_step_fraction", "switches",
]


def static_arms(levels: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(arms that never speculate, arms that always do), by policy, else by the seed's arm names
    (dynspec.analysis.levels.static_arms, after dynspec.roles).

    A server without speculation is written "none" (no drafter) or "never" (a policy that
    declines); a config may hold several always-speculating arms (EAGLE-3 on the v1 and
    the v2 worker, say).
    """
    return lv.static_arms(levels)


def roles(levels: pd.DataFrame) -> tuple[str | None, str | None]:
    """(the baseline arm, the eagle3 arm): an arm so named if there is one, else the first by name;
    for the baseline, a server without a drafter (policy "none") before a patched one that declines
    every step (`never`, whose price the report shows against it)."""
    plain, spec = static_arms(levels)
    if "policy" in levels:
        drafterless = set(levels.loc[levels["policy"].astype(str) == "none", "arm"].astype(str))
        plain = [a for a in plain if a in drafterless] + [a for a in plain if a not in drafterless]

    def pick(arms: list[str], name: str) -> str | None:
        return name if name in arms else (arms[0] if arms else None)

    return pick(plain, "baseline"), pick(spec, "eagle3")


def arm_order(levels: pd.DataFrame) -> list[str]:
    """Arms in legend order: plain servers, always-speculate arms, then policies."""
    plain, spec = static_arms(levels)
    rest = sorted(set(levels["arm"]) - set(plain) - set(spec))
    return plain + spec + rest


def level_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (run_id, arm, concurrency) of the closed-loop levels: repeats averaged, failed
    repeats left out.  (Open-loop levels: rate_table.)

    A repeat counts as failed when it is not usable (dynspec.analysis.levels: an error, nothing completed,
    a failed request or no throughput); `repeats` and `failed_repeats` say how many went into and
    out of each mean.
    """
    return _levels(closed_loop(results), ["run_id", "arm", "concurrency"])


def rate_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (run_id, arm, request_rate, concurrency cap) of the open-loop levels, as level_table."""
    return _levels(open_loop(results), ["run_id", "arm", "request_rate", "concurrency"])


def _levels(results: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    df = numeric_metrics(results)
    metrics = LEVEL_METRICS + [c for c in df.columns if _EXTRA_PCT.fullmatch(str(c)) and c not in LEVEL_METRICS]
    return lv.level_means(df, keys, metrics)


def failed_levels(results: pd.DataFrame) -> pd.DataFrame:
    """The rows that do not count, with their error and why (dynspec.analysis.levels): shown in the report,
    never averaged in."""
    return lv.unusable_rows(results)


def speedup_table(levels: pd.DataFrame) -> pd.DataFrame:
    """Each arm's output throughput over the baseline's at the same concurrency."""
    base, _ = roles(levels)
    if base is None:
        raise ReportError("no baseline arm (policy none or never, or an arm named baseline) to compare with")
    b = levels.loc[levels["arm"] == base, ["run_id", "concurrency", "output_throughput"]]
    b = b.rename(columns={"output_throughput": "baseline_throughput"})
    out = levels.merge(b, on=["run_id", "concurrency"], how="inner")
    out["speedup"] = out["output_throughput"] / out["baseline_throughput"]
    return out[["run_id", "arm", "policy", "concurrency", "output_throughput", "baseline_throughput", "speedup"]]


def envelope_table(levels: pd.DataFrame) -> pd.DataFrame:
    """Per arm and concurrency: the envelope max(baseline, eagle3) and the arm's share of it.

    With several static arms of a kind (EAGLE-3 v1 and v2), the envelope is the best of all.
    """
    plain, spec = static_arms(levels)
    if not plain or not spec:
        raise ReportError("the envelope needs a baseline arm and an always-speculate (eagle3) arm")
    env = lv.envelope(levels, ["run_id", "concurrency"], plain + spec)
    out = levels.merge(env, on=["run_id", "concurrency"], how="inner")
    out["of_envelope"] = out["output_throughput"] / out["envelope"]
    return out[["run_id", "arm", "policy", "concurrency", "output_throughput", "envelope", "envelope_arm",
                "of_envelope"]]


def envelope_summary(levels: pd.DataFrame) -> pd.DataFrame:
    """Per arm: mean and worst share of the envelope over the levels measured."""
    env = envelope_table(levels).dropna(subset=["of_envelope"])
    g = env.groupby(["run_id", "arm"])["of_envelope"]
    out = pd.DataFrame({"mean_of_envelope": g.mean(), "worst_of_envelope": g.min(),
                        "levels": g.size()}).reset_index()
    worst_at = env.loc[g.idxmin(), ["run_id", "arm", "concurrency"]].rename(columns={"concurrency": "worst_at_concurrency"})
    return out.merge(worst_at, on=["run_id", "arm"]).sort_values(["run_id", "mean_of_envelope"], ascending=[True, False])


@dataclass(frozen=True)
class LoadCrossover:
    """Where EAGLE-3 stops paying under load: its speedup over baseline falls through 1 (the load
    crossover; the per-step one is a profile's: see dynspec.analysis.levels).

    status: "crosses" (concurrency interpolated on a log axis between two measured
    levels), "never-pays" (EAGLE-3 loses at every level measured: any crossover is
    below the lowest), "always-pays" (it wins at every level: any crossover is above
    the highest), or "unknown" (no level has both arms).
    """

    status: str
    concurrency: float | None = None
    between: tuple[int, int] | None = None
    arm: str = "eagle3"

    def describe(self) -> str:
        who = "EAGLE-3" if self.arm == "eagle3" else f"EAGLE-3 (`{self.arm}`)"
        if self.status == "crosses":
            assert self.between is not None and self.concurrency is not None  # both set when it crosses
            lo, hi = self.between
            # Two significant figures: the point is interpolated between two measured levels.
            return (f"{who} stops paying between C={lo} and C={hi} "
                    f"(near C={two_figures(self.concurrency)}, interpolated)")
        if self.status == "never-pays":
            return f"{who} loses to the baseline at every concurrency measured: no crossover in range"
        if self.status == "always-pays":
            return f"{who} beats the baseline at every concurrency measured: the crossover lies beyond the range"
        return "no crossover: the run lacks a baseline or an eagle3 arm at a common concurrency"


def two_figures(x: float) -> str:
    """220.3 -> "220", 5.66 -> "5.7": as precise as a point between two measured levels can be."""
    digits = 1 - math.floor(math.log10(abs(x))) if x else 1
    return f"{round(x, digits):.{max(digits, 0)}f}"


def load_crossover(levels: pd.DataFrame, arm: str | None = None) -> LoadCrossover:
    """The first concurrency, going up, at which EAGLE-3's speedup over baseline drops below 1.

    arm: which always-speculating arm (default: the eagle3 arm of `roles`).
    """
    base, spec = roles(levels)
    spec = arm or spec
    if base is None or spec is None:
        return LoadCrossover("unknown")
    sp = speedup_table(levels)
    s = sp.loc[sp["arm"] == spec].dropna(subset=["speedup"]).groupby("concurrency")["speedup"].mean().sort_index()
    if s.empty:
        return LoadCrossover("unknown", arm=spec)
    pays = (s >= 1.0).to_numpy()
    if not pays.any():
        return LoadCrossover("never-pays", arm=spec)
    for i in range(len(s) - 1):
        if pays[i] and not pays[i + 1]:
            (c0, r0), (c1, r1) = (s.index[i], s.iloc[i]), (s.index[i + 1], s.iloc[i + 1])
            # Linear in log(concurrency): levels are spaced geometrically.
            t = (r0 - 1.0) / (r0 - r1)
            c = math.exp(math.log(c0) + t * (math.log(c1) - math.log(c0)))
            return LoadCrossover("crosses", c, (int(c0), int(c1)), spec)
    # Pays at every level, or loses first and pays from some level on (never falling back).
    return LoadCrossover("always-pays", arm=spec)


crossover = load_crossover  # the name the notebook, tests and docs knew it by


def reference_comparison(levels: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    """The seed's numbers beside the run's at the seed's levels (the run interpolated in log C).

    Values outside the run's measured range are left empty rather than extrapolated.
    """
    base, spec = roles(levels)
    names = {"baseline": base, "eagle3": spec}
    rows = []
    for _, r in reference.iterrows():
        arm = names.get(r["arm"], r["arm"])
        mine = levels.loc[levels["arm"] == arm].dropna(subset=["output_throughput"]).sort_values("concurrency")
        val = math.nan
        if len(mine) and mine["concurrency"].min() <= r["concurrency"] <= mine["concurrency"].max():
            val = float(np.interp(math.log(r["concurrency"]), np.log(mine["concurrency"].to_numpy(float)),
                                  mine["output_throughput"].to_numpy(float)))
        rows.append({"arm": r["arm"], "run_arm": arm, "concurrency": int(r["concurrency"]), "level": r["level"],
                     "seed_output_throughput": r["output_throughput"], "approximate": bool(r["approximate"]),
                     "run_output_throughput": val, "run_over_seed": val / r["output_throughput"]})
    return pd.DataFrame(rows)


def latency_table(levels: pd.DataFrame, percentiles=(50, 99), metrics=("ttft", "tpot")) -> pd.DataFrame:
    """Latency percentiles (ms) by concurrency (rows) and arm (columns): each metric of `metrics`
    (ttft, tpot, itl, e2e) at each percentile (the run's: run_percentiles)."""
    cols = {f"{percentile_label(p)}_{m}_ms": f"{m.upper()} {'median' if p == 50 else percentile_label(p)}"
            for m in metrics for p in percentiles}
    return _wide_many(levels, {c: label for c, label in cols.items() if c in levels})


def goodput_table(levels: pd.DataFrame) -> pd.DataFrame:
    """Requests per second meeting every SLO, and their share of all requests, by level and arm."""
    return _wide_many(levels, {"request_goodput": "goodput (req/s)", "slo_attainment": "met every SLO"})


def rate_summary(rates: pd.DataFrame, percentiles=(50, 99)) -> pd.DataFrame:
    """The open-loop levels as one long table: offered and achieved rates, throughput, latencies, goodput."""
    cols = ["arm", "request_rate", "concurrency", "request_throughput", "output_throughput"]
    cols += [f"{percentile_label(p)}_{m}_ms" for m in ("ttft", "tpot") for p in percentiles]
    cols += ["request_goodput", "slo_attainment"]
    out = rates[[c for c in cols if c in rates]].rename(columns={
        "request_rate": "offered req/s", "concurrency": "cap (0: none)", "request_throughput": "served req/s",
        "output_throughput": "output tok/s"})
    return out.dropna(axis=1, how="all")


def speculation_table(levels: pd.DataFrame) -> pd.DataFrame:
    """Accept length, fraction of steps speculated and mode switches by concurrency and arm."""
    cols = {"accept_length": "accept length", "spec_step_fraction": "steps speculated", "switches": "switches"}
    return _wide_many(levels, cols)


def _wide_many(levels: pd.DataFrame, cols: dict[str, str]) -> pd.DataFrame:
    order = arm_order(levels)
    parts = {label: levels.pivot_table(index="concurrency", columns="arm", values=col, dropna=False)
             .reindex(columns=[a for a in order if a in set(levels["arm"])]) for col, label in cols.items()}
    return pd.concat(parts, axis=1)


def wide(table: pd.DataFrame, value: str, digits: int = 2) -> pd.DataFrame:
    """A value by concurrency (rows) and arm (columns), for display."""
    if table["run_id"].nunique() > 1:
        return table.pivot_table(index="concurrency", columns=["run_id", "arm"], values=value).round(digits)
    out = table.pivot_table(index="concurrency", columns="arm", values=value)
    return out.reindex(columns=[a for a in arm_order(table) if a in out.columns]).round(digits)


def versus(levels: pd.DataFrame, run_id: str, other_id: str, value: str = "output_throughput") -> pd.DataFrame:
    """This run's value beside a compared run's (e.g. its simulated twin), per arm and level,
    with their ratio other/this: where a model and a measurement agree, and by how much they miss."""
    this = levels[levels["run_id"] == run_id].set_index(["arm", "concurrency"])[value]
    other = levels[levels["run_id"] == other_id].set_index(["arm", "concurrency"])[value]
    out = pd.DataFrame({run_id: this, other_id: other}).dropna()
    out[f"{other_id} / {run_id}"] = out[other_id] / out[run_id]
    return out.round(3).reset_index()


def pareto_points(levels: pd.DataFrame, percentile: float = 50) -> pd.DataFrame:
    """Each arm and level as a point (tokens/s per user = 1000 / TPOT at the percentile, output tok/s),
    and whether no other point of the run beats it on both axes (`pareto`)."""
    col = f"{percentile_label(percentile)}_tpot_ms"
    d = levels[["arm", "concurrency", "output_throughput", col]].dropna().copy()
    d["per_user"] = 1000.0 / d[col]
    xs, ys = d["per_user"].to_numpy(), d["output_throughput"].to_numpy()
    d["pareto"] = [not ((xs >= x) & (ys >= y) & ((xs > x) | (ys > y))).any() for x, y in zip(xs, ys)]
    return d.reset_index(drop=True)


def coinciding_arms(levels: pd.DataFrame, arms: list[str], tol: float = 0.005) -> list[str]:
    """The arms (two or more) whose output throughput agrees within `tol` at every common level."""
    if len(arms) < 2:
        return []
    w = levels[levels["arm"].isin(arms)].pivot_table(index=["run_id", "concurrency"], columns="arm",
                                                     values="output_throughput").dropna()
    if w.empty:
        return []
    spread = (w.max(axis=1) - w.min(axis=1)) / w.max(axis=1)
    return sorted(w.columns) if bool((spread <= tol).all()) else []


def environment_tables(env: dict) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(machine, packages, topology) from dynspec.environment's description, for display."""
    gpu = env.get("gpu") or {}
    tc = env.get("torch_cuda") or {}
    if gpu.get("available"):
        names = sorted({g["name"] for g in gpu.get("gpus", [])})
        gpus = f"{gpu.get('count')} x {', '.join(names)}"
    else:
        gpus = gpu.get("note", "no GPU")
    machine = pd.DataFrame([
        ("host", env.get("host")), ("platform", env.get("platform")), ("python", env.get("python")),
        ("CPU cores", env.get("cpu_count")), ("GPUs", gpus), ("driver", gpu.get("driver") or "-"),
        ("CUDA (driver)", gpu.get("cuda_driver_version") or "-"), ("CUDA (nvcc)", env.get("nvcc") or "-"),
        ("CUDA (torch build)", tc.get("torch_cuda") or "-"),
    ], columns=["item", "value"]).astype(str)
    packages = pd.DataFrame([(k, v or "not installed") for k, v in (env.get("packages") or {}).items()],
                            columns=["package", "version"])
    topology = gpu.get("topology") if gpu.get("available") else None
    if topology:
        topology = re.sub(r"\x1b\[[0-9;]*m", "", topology)  # nvidia-smi underlines the header row
    return machine, packages, topology or gpu.get("note", "no GPU: no topology")


def patch_table(patchset) -> pd.DataFrame:
    """A patch series (dynspec.sglang.patching.PatchSet) file by file: hunks, lines added and removed."""
    rows = []
    for name, file_patches in patchset.patches:
        for fp in file_patches:
            tags = [tag for h in fp.hunks for tag, _ in h.lines]
            rows.append({"patch": name, "file": fp.path, "hunks": len(fp.hunks),
                         "added": tags.count("+"), "removed": tags.count("-")})
    return pd.DataFrame(rows, columns=["patch", "file", "hunks", "added", "removed"])

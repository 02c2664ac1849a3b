"""Figures and tables from a run's results, with the seed's reference numbers beside them.

The report notebook (notebooks/03_report) is a thin reader over this module: every
number it shows is computed here from the results table (dynspec.results), so the
same findings can be checked in tests and quoted in the run index.

Roles: the *baseline* arm never speculates (policy `none` or `never`, or an arm named baseline)
and the *eagle3* arm always does (policy `always`, or an arm named eagle3).  Every
other arm is a policy judged against the envelope max(baseline, eagle3): the best a
server could do if it knew, at each load, which of the two static choices wins.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from dynspec.paths import REPO_ROOT
from dynspec.roles import arms_by_role
from dynspec.results import DEFAULT_PERCENTILES, LATENCIES, METRIC_COLUMNS, closed_loop, open_loop, \
    percentile_label, read_table, wall_clock_problem

SEED_LABEL = "measured by the seed investigation on 8x RTX PRO 6000 Blackwell, TP 8"
REFERENCE_COLUMNS = ["arm", "concurrency", "output_throughput", "approximate", "level", "source"]
# Where the seed's table lives in a checkout (data/ is not package data).
DEFAULT_REFERENCE = Path(__file__).resolve().parents[2] / "data" / "reference" / "seed.csv"
LEVEL_METRICS = [
    "output_throughput", "request_throughput", "request_goodput", "slo_attainment",
    *[f"{s}_{m}_ms" for m in LATENCIES for s in ("mean", "median", "p90", "p95", "p99")],
    "accept_length", "spec_step_fraction", "switches",
]
FEW_SPEC_STEPS = 0.2  # below this share of steps speculated, an accept length is a probe's estimate
_EXTRA_PCT = re.compile(r"p[0-9.]+_(ttft|tpot|itl|e2e)_ms")


class ReportError(ValueError):
    """A run or reference that cannot be reported on; the message is one line naming it."""


# Loading ------------------------------------------------------------------------------

@dataclass
class Run:
    """One run folder as the report sees it."""

    run_dir: Path
    run_id: str
    results: pd.DataFrame
    meta: dict = field(default_factory=dict)  # run.json
    config: dict = field(default_factory=dict)  # config.yaml (resolved)
    environment: dict = field(default_factory=dict)  # environment.json

    @property
    def backend(self) -> str:
        return _one(self.results, "backend") or str(self.meta.get("backend", ""))

    @property
    def profile(self) -> str:
        return _one(self.results, "profile") or str(self.meta.get("profile") or self.config.get("profile", ""))

    @property
    def hardware(self) -> str:
        return str(self.meta.get("hardware") or self.config.get("hardware") or "")

    @property
    def config_name(self) -> str:
        return str(self.meta.get("config") or self.config.get("name") or "")


def _one(df: pd.DataFrame, col: str) -> str:
    vals = sorted({str(v) for v in df[col].dropna() if str(v)}) if col in df else []
    return ", ".join(vals)


def numeric_metrics(df: pd.DataFrame) -> pd.DataFrame:
    """Metric columns as floats whatever the file held (a column with no value at all reads as text)."""
    df = df.copy()
    for col in METRIC_COLUMNS + [c for c in df.columns if _EXTRA_PCT.fullmatch(str(c))]:
        if col != "error" and col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    return data if isinstance(data, dict) else {}


def load_run(run_dir: str | Path) -> Run:
    """Read data/runs/<run-id>/: results.csv (required), run.json, config.yaml, environment.json."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run folder")
    results_path = run_dir / "results.csv"
    if not results_path.is_file():
        raise ReportError(f"{run_dir}: no results.csv (did the sweep start?)")
    try:
        df = read_table(results_path)
    except (ValueError, pd.errors.ParserError) as exc:
        raise ReportError(f"{results_path}: {exc}") from None
    if df.empty:
        raise ReportError(f"{results_path}: no rows yet")
    df = numeric_metrics(df)
    meta = _read_json(run_dir / "run.json")
    config: dict = {}
    if (run_dir / "config.yaml").is_file():
        loaded = yaml.safe_load((run_dir / "config.yaml").read_text())
        config = loaded if isinstance(loaded, dict) else {}
    run_id = str(meta.get("run_id") or _one(df, "run_id") or run_dir.name)
    return Run(run_dir, run_id, df, meta, config, _read_json(run_dir / "environment.json"))


def list_runs(runs_dir: str | Path) -> list[Path]:
    """Run folders that hold a results file, oldest first (by modification time)."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return []
    runs = [p for p in runs_dir.iterdir() if p.is_dir() and (p / "results.csv").is_file()]
    return sorted(runs, key=lambda p: ((p / "results.csv").stat().st_mtime, p.name))


def latest_run(runs_dir: str | Path) -> Path | None:
    runs = list_runs(runs_dir)
    return runs[-1] if runs else None


def load_reference(path: str | Path | None = None) -> pd.DataFrame:
    """The seed's measured table (data/reference/seed.csv), validated."""
    path = Path(path) if path is not None else DEFAULT_REFERENCE
    if not path.is_file():
        raise ReportError(f"{path}: no such reference table")
    df = pd.read_csv(path)
    missing = [c for c in REFERENCE_COLUMNS if c not in df.columns]
    if missing:
        raise ReportError(f"{path}: missing reference columns: {', '.join(missing)}")
    thr = pd.to_numeric(df["output_throughput"], errors="coerce")
    conc = pd.to_numeric(df["concurrency"], errors="coerce")
    if thr.isna().any() or (thr <= 0).any() or conc.isna().any() or (conc < 1).any():
        raise ReportError(f"{path}: concurrency and output_throughput must be positive numbers")
    df["output_throughput"], df["concurrency"] = thr.astype(float), conc.astype(int)
    df["approximate"] = df["approximate"].astype(str).str.lower().isin(["true", "1", "yes"])
    return df[REFERENCE_COLUMNS]


# Tables -------------------------------------------------------------------------------

def static_arms(levels: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(arms that never speculate, arms that always do), by policy, else by the seed's arm names.

    A server without speculation is written "none" (no drafter) or "never" (a policy that
    declines); a config may hold several always-speculating arms (EAGLE-3 on the v1 and
    the v2 worker, say).
    """
    by_role = arms_by_role(levels)
    return ([a for a, r in by_role.items() if r == "plain"], [a for a, r in by_role.items() if r == "spec"])


def roles(levels: pd.DataFrame) -> tuple[str | None, str | None]:
    """(the baseline arm, the eagle3 arm): an arm so named if there is one, else the first by name."""
    plain, spec = static_arms(levels)

    def pick(arms: list[str], name: str) -> str | None:
        return name if name in arms else (arms[0] if arms else None)

    return pick(plain, "baseline"), pick(spec, "eagle3")


def level_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (run_id, arm, concurrency) of the closed-loop levels: repeats averaged, failed
    repeats left out.  (Open-loop levels: rate_table.)

    A repeat counts as failed when it has an error or completed nothing; `repeats` and
    `failed_repeats` say how many went into and out of each mean.
    """
    return _levels(closed_loop(results), ["run_id", "arm", "concurrency"])


def rate_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (run_id, arm, request_rate, concurrency cap) of the open-loop levels, as level_table."""
    return _levels(open_loop(results), ["run_id", "arm", "request_rate", "concurrency"])


def _levels(results: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    df = numeric_metrics(results)
    metrics = LEVEL_METRICS + [c for c in df.columns if _EXTRA_PCT.fullmatch(str(c)) and c not in LEVEL_METRICS]
    for m in metrics:
        if m not in df:
            df[m] = np.nan
    bad = (df["error"].astype(str) != "") | ~(pd.to_numeric(df["completed"], errors="coerce") > 0) \
        | pd.to_numeric(df["output_throughput"], errors="coerce").isna()
    df["_bad"] = bad
    if df.empty:
        return pd.DataFrame(columns=keys + ["repeats", "failed_repeats", "policy", "backend", "profile"] + metrics)
    agg = {m: "mean" for m in metrics}
    good = df[~bad]
    out = good.groupby(keys, sort=True).agg(agg).reset_index() if len(good) else pd.DataFrame(columns=keys + metrics)
    counts = df.groupby(keys).agg(repeats=("_bad", "size"), failed_repeats=("_bad", "sum"),
                                  policy=("policy", "first"), backend=("backend", "first"),
                                  profile=("profile", "first")).reset_index()
    out = counts.merge(out, on=keys, how="left")
    out["concurrency"] = out["concurrency"].astype(int)
    return out.sort_values(keys).reset_index(drop=True)


def failed_levels(results: pd.DataFrame) -> pd.DataFrame:
    """The rows that failed, with their error: shown in the report, never averaged in."""
    bad = (results["error"].astype(str) != "") | ~(pd.to_numeric(results["completed"], errors="coerce") > 0)
    return results.loc[bad, ["arm", "concurrency", "repeat", "completed", "failed", "error"]].reset_index(drop=True)


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
    wide = levels.pivot_table(index=["run_id", "concurrency"], columns="arm", values="output_throughput")
    static = wide[[a for a in plain + spec if a in wide.columns]]
    # A level where any static arm is missing has no envelope (skipna=False), not a smaller one.
    env = static.max(axis=1, skipna=False).rename("envelope")
    best = static.fillna(-1.0).idxmax(axis=1).where(env.notna()).rename("envelope_arm")
    out = levels.merge(pd.concat([env, best], axis=1).reset_index(), on=["run_id", "concurrency"], how="inner")
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
class Crossover:
    """Where EAGLE-3 stops paying: speedup over baseline falls through 1.

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


def crossover(levels: pd.DataFrame, arm: str | None = None) -> Crossover:
    """The first concurrency, going up, at which EAGLE-3's speedup over baseline drops below 1.

    arm: which always-speculating arm (default: the eagle3 arm of `roles`).
    """
    base, spec = roles(levels)
    spec = arm or spec
    if base is None or spec is None:
        return Crossover("unknown")
    sp = speedup_table(levels)
    s = sp.loc[sp["arm"] == spec].dropna(subset=["speedup"]).groupby("concurrency")["speedup"].mean().sort_index()
    if s.empty:
        return Crossover("unknown", arm=spec)
    pays = (s >= 1.0).to_numpy()
    if not pays.any():
        return Crossover("never-pays", arm=spec)
    for i in range(len(s) - 1):
        if pays[i] and not pays[i + 1]:
            (c0, r0), (c1, r1) = (s.index[i], s.iloc[i]), (s.index[i + 1], s.iloc[i + 1])
            # Linear in log(concurrency): levels are spaced geometrically.
            t = (r0 - 1.0) / (r0 - r1)
            c = math.exp(math.log(c0) + t * (math.log(c1) - math.log(c0)))
            return Crossover("crosses", c, (int(c0), int(c1)), spec)
    # Pays at every level, or loses first and pays from some level on (never falling back).
    return Crossover("always-pays", arm=spec)


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


def run_percentiles(run: "Run") -> list[float]:
    """The percentiles the run's config asked for (the default four for runs before they could)."""
    ps = (run.config.get("metrics") or {}).get("percentiles") if isinstance(run.config, dict) else None
    return [float(p) for p in ps] if isinstance(ps, list) and ps else list(DEFAULT_PERCENTILES)


def run_slo(run: "Run") -> dict:
    """The run's SLOs in ms ({"ttft_ms": ..}); empty when it gave none."""
    slo = (run.config.get("metrics") or {}).get("slo") if isinstance(run.config, dict) else None
    return {k: v for k, v in slo.items() if v is not None} if isinstance(slo, dict) else {}


def goodput_table(levels: pd.DataFrame) -> pd.DataFrame:
    """Requests per second meeting every SLO, and their share of all requests, by level and arm."""
    return _wide_many(levels, {"request_goodput": "goodput (req/s)", "slo_attainment": "met every SLO"})


def _markdown(text: str):
    from IPython.display import Markdown

    return Markdown(text)


def slo_text(slo: dict) -> str:
    return ", ".join(f"{k.removesuffix('_ms').upper()} <= {v:g} ms" for k, v in slo.items())


def goodput_section(levels: pd.DataFrame, slo: dict) -> list:
    """What the notebook shows under goodput: the SLOs and the table, or why there is none."""
    if not slo:
        return [_markdown("*No SLOs in this run's config (`metrics.slo`): no goodput.*")]
    return [_markdown(f"SLOs: {slo_text(slo)}"), goodput_table(levels).round(3)]


def rate_section(run: "Run", percentiles) -> list:
    """What the notebook shows for the open-loop levels: their table, or that there are none."""
    rates = rate_table(run.results)
    if not len(rates):
        return [_markdown("*No open-loop levels in this run.*")]
    return [rate_summary(rates, percentiles).round(2)]


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


# Words --------------------------------------------------------------------------------

def open_run(run_dir: str | Path | None, *, runs_dir: str | Path = "data/runs") -> Run:
    """The run to report on: run_dir, else the latest in runs_dir.

    A report only reads runs: with none yet, the sweep (`02_sweep`, `dynspec sweep`) makes one.
    """
    if run_dir is not None:
        return load_run(run_dir)
    latest = latest_run(runs_dir)
    if latest is None:
        raise ReportError(f"{runs_dir}: no runs yet (run a sweep first: notebooks/02_sweep or `dynspec sweep`)")
    return load_run(latest)


def wide(table: pd.DataFrame, value: str, digits: int = 2) -> pd.DataFrame:
    """A value by concurrency (rows) and arm (columns), for display."""
    if table["run_id"].nunique() > 1:
        return table.pivot_table(index="concurrency", columns=["run_id", "arm"], values=value).round(digits)
    out = table.pivot_table(index="concurrency", columns="arm", values=value)
    return out.reindex(columns=[a for a in arm_order(table) if a in out.columns]).round(digits)



def catch_up_note(profile_name: str) -> str:
    """What a switching arm's plain step costs extra on this profile, as a sentence ("" if nothing)."""
    from dynspec.profile import ProfileError, load_profile

    try:
        p = load_profile(profile_name)
    except ProfileError:
        return ""
    top = max(t.batch_size[-1] for t in p.steps)
    lo, hi = (p.catch_up_time(b) / p.plain_time(b) for b in (1, top))
    if not lo and not hi:
        return ""
    if p.steps[0].resume_ms is None:
        return (f" Arms with a policy pay the patched server's draft catch-up on every plain step: "
                f"{lo:.1%} of a plain step at batch 1, {hi:.1%} at {top} (the profile's extend_ms).")
    r_lo, r_hi = (p.resume_time(b) / p.plain_time(b) for b in (1, top))
    return (f" Arms with a policy pay the patched server's KV-only draft catch-up on every plain step: "
            f"{lo:.1%} of a plain step at batch 1, {hi:.1%} at {top} (the profile's catchup_ms), and a resume "
            f"on each switch to speculating: {r_lo:.1%} .. {r_hi:.1%} of a plain step (resume_ms).")


def banner(run: Run) -> str:
    """One line that says where the numbers come from; the report shows it first."""
    backend = run.backend
    if backend == "sim":
        return (f"Simulated: these numbers are simulated from profile {run.profile} "
                f"(dynspec's in-process simulator, virtual time), not measured on a GPU."
                + catch_up_note(run.profile))
    if backend == "emulate":
        scale = float((run.config.get("emulate") or {}).get("time_scale", 1.0) or 1.0)
        clock = "" if scale == 1.0 or wall_clock_problem(run.run_dir) else \
            f" It ran {scale:g}x faster than the profile; every number is on the profile's clock."
        return (f"Emulated: these numbers are simulated from profile {run.profile}, served in real time by "
                f"dynspec's emulator behind SGLang's HTTP API, not measured on a GPU.{clock}"
                + catch_up_note(run.profile))
    hw = f" on {run.hardware}" if run.hardware else ""
    what = str(run.config.get("description") or "").strip()
    return f"Measured live{hw} (backend {backend or 'unknown'})." + (f" What ran: {what}" if what else "")


def headline(run: Run) -> dict:
    """The few figures the run index shows for a run."""
    levels = level_table(run.results)
    base, spec = roles(levels)
    out: dict = {"run_id": run.run_id, "backend": run.backend, "profile": run.profile,
                 "config": run.config_name, "hardware": run.hardware,
                 "arms": sorted(set(levels["arm"])), "levels": sorted(set(levels["concurrency"].tolist())),
                 "failed_rows": int(len(failed_levels(run.results)))}

    def peak(arm):
        d = levels.loc[levels["arm"] == arm].dropna(subset=["output_throughput"])
        if d.empty:
            return None
        r = d.loc[d["output_throughput"].idxmax()]
        return {"output_throughput": round(float(r["output_throughput"]), 1), "concurrency": int(r["concurrency"])}

    out["baseline_peak"] = peak(base) if base else None
    out["eagle3_peak"] = peak(spec) if spec else None
    x = crossover(levels)
    out["crossover"] = {"status": x.status, "concurrency": None if x.concurrency is None else round(x.concurrency, 1),
                        "text": x.describe()}
    out["best_policy"] = None
    if base and spec:
        summ = envelope_summary(levels)
        plain, specs = static_arms(levels)
        pol = summ.loc[~summ["arm"].isin(plain + specs)]
        if len(pol):
            r = pol.iloc[0]
            out["best_policy"] = {"arm": r["arm"], "mean_of_envelope": float(r["mean_of_envelope"]),
                                  "worst_of_envelope": float(r["worst_of_envelope"]),
                                  "worst_at_concurrency": int(r["worst_at_concurrency"])}
    return out


MEASURED_DIR = REPO_ROOT / "data" / "measured"  # in a checkout of the repo


def measured_runs(measured_dir: Path = MEASURED_DIR) -> list[tuple[str, str]]:
    """(run id, hardware) of every live run committed under data/measured/: where the patched
    server has really run, read from the runs themselves."""
    out = []
    for meta in sorted(measured_dir.glob("*/run.json")) if measured_dir.is_dir() else []:
        m = _read_json(meta)
        if m.get("backend") == "live":
            out.append((str(m.get("run_id") or meta.parent.name), str(m.get("hardware") or "?")))
    return out


def status_box(run: Run, measured_dir: Path = MEASURED_DIR) -> list[tuple[str, str]]:
    """What is measured, fitted, simulated and never run, as (label, sentence) rows, from the
    run and its profile's provenance: the first thing a report shows."""
    from dynspec.profile import ProfileError, load_profile

    rows = [("Numbers", banner(run).split(" Arms with a policy")[0])]
    if clock := wall_clock_problem(run.run_dir):
        rows.append(("Clock", clock))
    profile = None
    if run.backend in ("sim", "emulate") and run.profile:
        try:
            profile = load_profile(run.profile)
        except ProfileError:
            pass
    if profile is not None:
        prov = profile.provenance
        if prov.kind == "fitted":
            rows.append(("Profile", f"{profile.name} was fitted to {prov.source}. Agreement with those "
                                    "numbers is by construction, not validation."))
        else:
            when = f", {prov.date}" if prov.date else ""
            rows.append(("Profile", f"{profile.name} is {prov.kind}: {prov.source}{when}."))
        note = catch_up_note(run.profile).strip()
        if note:
            rows.append(("Switch cost", note + " As the profile states it: see its provenance."))
    measured = measured_runs(measured_dir)
    if measured:
        where = "; ".join(f"{rid} ({hw})" for rid, hw in measured)
        rows.append(("Real SGLang", "dynspec's patched SGLang 0.5.9 has served real requests on a CPU in CI "
                                    f"(tests/test_real_sglang.py) and in these measured runs: {where}."))
        hw = run.hardware.split(" (")[0].strip()
        if hw and run.backend != "live" and not any(hw in h for _, h in measured):
            rows.append(("Never run", f"the patched server has never run on {run.hardware}; "
                                      "this run's numbers for it are a model."))
    return rows


def banner_html(run: Run) -> str:
    """The status box as a self-contained HTML block (inline style: the report fetches nothing)."""
    import html

    simulated = run.backend in ("sim", "emulate")
    colour = ("#fff4e5", "#b35c00") if simulated else ("#e8f4ea", "#1e6b33")
    rows = "".join(f'<tr><td style="padding:2px 10px 2px 0;vertical-align:top"><b>{html.escape(k)}</b></td>'
                   f'<td style="padding:2px 0">{html.escape(v)}</td></tr>' for k, v in status_box(run))
    return (f'<div class="dynspec-status" style="background:{colour[0]};border-left:6px solid {colour[1]};'
            f'padding:10px 14px;margin:8px 0;font-size:14px"><table style="border:none">{rows}</table></div>')


def reference_for(run: Run, reference: pd.DataFrame | None) -> pd.DataFrame | None:
    """The seed's measurements, only beside a run of (a model of) the seed's node in the seed's
    time: an emulated run at another time scale, or another machine, gets none."""
    if reference is None or not len(reference):
        return None
    if not run.profile.startswith("seed-blackwell") and "RTX PRO 6000" not in run.hardware:
        return None
    if wall_clock_problem(run.run_dir):  # an old emulated run, X times faster than the seed
        return None
    return reference


def reference_caption(run: Run, shown: pd.DataFrame | None) -> str:
    if shown is None:
        return ("*The seed's measurements (8x RTX PRO 6000 Blackwell) are not drawn: this run is not of "
                "that node, or not in its time.*")
    from dynspec.profile import ProfileError, load_profile

    fitted = ""
    try:
        if run.profile and load_profile(run.profile).provenance.kind == "fitted":
            fitted = (f" Profile `{run.profile}` was fitted to these numbers, so the lines pass through "
                      "the squares by construction.")
    except ProfileError:  # a profile that will not load changes only this caption
        pass
    return ("Open squares: the seed's measurements on 8x RTX PRO 6000 Blackwell (TP 8, EAGLE-3 on the v1 "
            "worker with a 16-token tree), drawn for scale; not from this run." + fitted)


def run_summary(run: Run) -> str:
    lv = level_table(run.results)
    parts = [f"**Run** `{run.run_id}`", f"config `{run.config_name or '?'}`", f"backend `{run.backend}`"]
    if run.backend in ("sim", "emulate"):
        parts.append(f"profile `{run.profile}`")
    if run.hardware:
        parts.append(f"hardware: {run.hardware}")
    parts.append(f"arms: {', '.join(sorted(set(run.results['arm'])))}")
    if len(lv):
        parts.append(f"concurrency: {', '.join(str(c) for c in sorted(set(lv['concurrency'])))}")
    rates = rate_table(run.results)
    if len(rates):
        parts.append(f"request rates (req/s): {', '.join(f'{r:g}' for r in sorted(set(rates['request_rate'])))}")
    source = prompt_source(run.config)
    if source:
        parts.append(f"prompts: {source}")
    slo = run_slo(run)
    if slo:
        parts.append(f"SLOs: {slo_text(slo)}")
    return " · ".join(parts)


def prompt_source(config: dict) -> str:
    """Which prompts the run sent, in words, from its saved config ("" when it does not say)."""
    if not isinstance(config, dict) or not config:
        return ""
    p = config.get("prompts") or {}
    source = p.get("source", "random") if isinstance(p, dict) else "random"
    out_len = config.get("output_len")
    if source == "random":
        return f"random token ids ({config.get('input_len')} in / {out_len} out)"
    name = Path(str(p.get("path") or "")).name
    words = {"jsonl": "JSONL prompt file", "sharegpt": "ShareGPT file", "mtbench": "MT-bench question file"}
    lengths = p.get("output_lens", "fixed")
    how = {"dataset": "output lengths from the dataset", "fixed": f"{out_len} output tokens each",
           "range": f"output lengths drawn in [{p.get('range_ratio')} x {out_len}, {out_len}]"}.get(lengths, "")
    return f"{words.get(source, source)} `{name}`" + (f", {how}" if how else "")


def findings(levels: pd.DataFrame, config: dict | None = None) -> str:
    """The report's conclusions in a few bullets, each computed from the levels table (and the
    run's resolved config, for what the workload explains)."""
    base, spec = roles(levels)
    plain, specs = static_arms(levels)
    out = [f"- **Crossover:** {crossover(levels, a).describe()}." for a in specs] or \
        [f"- **Crossover:** {crossover(levels).describe()}."]
    if base and spec:
        sp = speedup_table(levels)
        for a in specs:
            s = sp.loc[sp["arm"] == a].dropna(subset=["speedup"]).sort_values("concurrency")
            if len(s):
                lo, hi = s.iloc[0], s.iloc[-1]
                out.append(f"- **`{a}` vs baseline:** {lo['speedup']:.2f}x at C={int(lo['concurrency'])}, "
                           f"{hi['speedup']:.2f}x at C={int(hi['concurrency'])}.")
    for arm, role in ((base, "baseline"), (spec, "eagle3")):
        d = levels.loc[levels["arm"] == arm].dropna(subset=["output_throughput"]) if arm else levels.iloc[0:0]
        if len(d):
            r = d.loc[d["output_throughput"].idxmax()]
            out.append(f"- **Peak {role}** (`{arm}`): {r['output_throughput']:.1f} tok/s at C={int(r['concurrency'])}.")
    if base and spec:
        summ = envelope_summary(levels)
        for _, r in summ.loc[~summ["arm"].isin(plain + specs)].iterrows():
            out.append(f"- **Policy `{r['arm']}`:** {r['mean_of_envelope']:.1%} of the envelope on average, "
                       f"worst {r['worst_of_envelope']:.2%} at C={int(r['worst_at_concurrency'])}.")
    price = switch_price(levels)
    if price:
        out.append(f"- **Price of being able to switch:** {price}")
    same = coinciding_arms(levels, specs)
    if same and set(levels["backend"].dropna()) <= {"sim", "emulate"}:
        out.append(f"- **{' and '.join(f'`{a}`' for a in same)} coincide** (within 0.5% at every level): "
                   "the simulator models every EAGLE-3 arm as the same chain; the v1 worker's draft tree "
                   "is not modelled apart. dynspec's patch switches the v2 worker (topk 1) only.")
    note = lockstep_ttft_note(levels, config or {})
    if note:
        out.append(f"- **TTFT:** {note}")
    failed = int(levels["failed_repeats"].sum())
    if failed:
        out.append(f"- **Failed:** {failed} measurement(s) failed and are left out (listed at the end).")
    return "\n".join(out)


def switch_price(levels: pd.DataFrame) -> str:
    """What the patched server told never to speculate keeps of a plain server's throughput, per
    level ("" unless the run has both: an arm of policy "none" and one of policy "never")."""
    if "policy" not in levels:
        return ""
    pol = levels.groupby("arm")["policy"].first().astype(str).str.lower()
    none, never = sorted(pol[pol == "none"].index), sorted(pol[pol == "never"].index)
    if not none or not never:
        return ""
    w = levels.pivot_table(index="concurrency", columns="arm", values="output_throughput")
    ratio = (w[never[0]] / w[none[0]]).dropna()
    if ratio.empty:
        return ""
    per = ", ".join(f"{r:.3f} at C={int(c)}" for c, r in ratio.items())
    return (f"`{never[0]}` (speculation off by policy, the draft kept current) delivers {per} of "
            f"`{none[0]}`'s output throughput (a plain server); worst {ratio.min():.3f}.")


def lockstep_ttft_note(levels: pd.DataFrame, config: dict) -> str:
    """Why the plain arm's TTFT dwarfs EAGLE-3's, when it does and the workload explains it ("" else).

    With fixed output lengths in a closed loop, a plain server emits one token per request per
    step, so requests admitted together finish together and their clients send the next ones
    at once: each new request waits behind a whole cohort's prefill.  Speculation's accepted
    lengths differ per request and break the cohorts.  Randomized output lengths (as
    bench_serving's --random-range-ratio) break them too: measured on seed-blackwell, simulated,
    C=30: 665 -> 41 ms with output lengths uniform in [128, 256] (docs/PIPELINE.md)."""
    base, spec = roles(levels)
    if not base or not spec or (config.get("prompts") or {}).get("output_lens", "fixed") != "fixed":
        return ""
    w = levels.pivot_table(index="concurrency", columns="arm", values="median_ttft_ms")
    if base not in w or spec not in w:
        return ""
    ratio = (w[base] / w[spec]).dropna()
    if ratio.empty or ratio.max() < 5:
        return ""
    c = int(ratio.idxmax())
    return (f"`{base}`'s median is {ratio.max():.0f}x `{spec}`'s at C={c} "
            f"({w.loc[c, base]:.0f} vs {w.loc[c, spec]:.0f} ms). An artifact of fixed output lengths in a closed "
            f"loop: plain requests admitted together finish together, and their clients' next requests queue "
            f"behind one another's prefill. Randomized lengths (`prompts.output_lens: range`) remove it.")


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
    """A patch series (dynspec.patching.PatchSet) file by file: hunks, lines added and removed."""
    rows = []
    for name, file_patches in patchset.patches:
        for fp in file_patches:
            tags = [tag for h in fp.hunks for tag, _ in h.lines]
            rows.append({"patch": name, "file": fp.path, "hunks": len(fp.hunks),
                         "added": tags.count("+"), "removed": tags.count("-")})
    return pd.DataFrame(rows, columns=["patch", "file", "hunks", "added", "removed"])


def _shown(path: Path) -> str:
    """A path as a published page shows it: relative to the checkout when inside it (the
    nearest folder up from the working directory with a pyproject.toml; notebooks run in
    notebooks/), so no page carries this machine's layout."""
    path, cwd = Path(path).resolve(), Path.cwd().resolve()
    root = next((d for d in (cwd, *cwd.parents) if (d / "pyproject.toml").is_file()), cwd)
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def run_details(run: Run) -> str:
    """Where the run lives, its status and the machine it ran on, as Markdown."""
    machine, packages, _ = environment_tables(run.environment) if run.environment else (None, None, None)
    lines = [f"- Run folder: `{_shown(run.run_dir)}`"]
    for key in ("status", "started", "finished"):
        if key in run.meta:
            lines.append(f"- {key}: {run.meta[key]}")
    if machine is not None:
        m = dict(zip(machine["item"], machine["value"]))
        lines.append(f"- Machine: {m.get('GPUs')}; driver {m.get('driver')}; CUDA {m.get('CUDA (driver)')}")
        v = {r.package: r.version for r in packages.itertuples()}
        lines.append("- Versions: " + ", ".join(f"{k} {v[k]}" for k in ("torch", "sglang", "flashinfer-python",
                                                                          "dynspec") if k in v))
    return "\n".join(lines)


# Figures ------------------------------------------------------------------------------

# Colours by role, the same arm the same colour in every figure: plain servers blue,
# always-speculate arms red/purple, policies green/orange and on.
_PLAIN_COLOURS = ["tab:blue", "tab:cyan", "navy"]
_SPEC_COLOURS = ["tab:red", "tab:purple", "tab:pink", "darkred"]
_POLICY_COLOURS = ["tab:green", "tab:orange", "tab:olive", "tab:brown", "tab:gray", "gold"]


def arm_order(levels: pd.DataFrame) -> list[str]:
    """Arms in legend order: plain servers, always-speculate arms, then policies."""
    plain, spec = static_arms(levels)
    rest = sorted(set(levels["arm"]) - set(plain) - set(spec))
    return plain + spec + rest


def palette(levels: pd.DataFrame) -> dict[str, str]:
    plain, spec = static_arms(levels)
    rest = [a for a in arm_order(levels) if a not in plain and a not in spec]
    out = {}
    for arms, colours in ((plain, _PLAIN_COLOURS), (spec, _SPEC_COLOURS), (rest, _POLICY_COLOURS)):
        out.update({a: colours[i % len(colours)] for i, a in enumerate(arms)})
    return out


def _style():
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    return plt, sns


def _log_x(ax, levels: pd.Series) -> None:
    """A log concurrency axis labelled at the measured levels, thinned so labels do not collide."""
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    ax.set_xscale("log")
    ticks: list[int] = []
    measured = sorted({int(c) for c in levels.dropna()})
    for c in measured:
        if not ticks or c / ticks[-1] >= 1.6:
            ticks.append(c)
    if measured and ticks[-1] != measured[-1]:  # the highest level is always labelled
        if len(ticks) > 1 and measured[-1] / ticks[-1] < 1.6:
            ticks.pop()
        ticks.append(measured[-1])
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel("concurrency (clients, log scale)")


def _arm_lines(sns, ax, data: pd.DataFrame, y: str, levels: pd.DataFrame, **kw) -> None:
    """One line per arm in its colour; runs told apart by line style when there are several."""
    order = [a for a in arm_order(levels) if a in set(data["arm"])]
    several = data["run_id"].nunique() > 1 if "run_id" in data else False
    sns.lineplot(data=data, x="concurrency", y=y, hue="arm", hue_order=order, palette=palette(levels),
                 style="run_id" if several else "arm", style_order=None if several else order,
                 markers=True, dashes=several, ax=ax, **kw)


def _legend_below(fig, ax) -> None:
    """The legend in rows under the figure, so long labels never squeeze the axes."""
    fig.tight_layout()
    if ax.get_legend() is None:
        return
    handles, labels = ax.get_legend_handles_labels()
    ax.get_legend().remove()
    ncol = min(len(labels), 4)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, fontsize=8,
               frameon=False)


def throughput_figure(levels: pd.DataFrame, reference: pd.DataFrame | None = None):
    """Output throughput vs concurrency per arm; the seed's measurements as squares beside them.

    The seed measured three levels, so its points stand alone: a line between them
    would claim values it never measured.
    """
    plt, sns = _style()
    fig, ax = plt.subplots(figsize=(10, 4.8))
    d = levels.dropna(subset=["output_throughput"])
    _arm_lines(sns, ax, d, "output_throughput", levels)
    xs = d["concurrency"]
    if reference is not None and len(reference):
        base, spec = roles(levels)
        colours = palette(levels)
        role_colour = {"baseline": colours.get(base, "0.25"), "eagle3": colours.get(spec, "tab:red")}
        for arm, r in reference.groupby("arm"):
            r = r.sort_values("concurrency")
            ax.plot(r["concurrency"], r["output_throughput"], linestyle="none", marker="s", markersize=9,
                    markerfacecolor="white", markeredgewidth=2, color=role_colour.get(arm, "0.5"),
                    label=f"{arm} ({SEED_LABEL})")
            for _, p in r[r["approximate"]].iterrows():
                ax.annotate("~", (p["concurrency"], p["output_throughput"]), textcoords="offset points",
                            xytext=(7, 5))
        xs = pd.concat([xs, reference["concurrency"]])
    _log_x(ax, xs)
    ax.set_ylabel("output throughput (tok/s)")
    ax.set_title("Output throughput vs concurrency")
    _legend_below(fig, ax)
    return fig


def speedup_figure(levels: pd.DataFrame):
    plt, sns = _style()
    sp = speedup_table(levels).dropna(subset=["speedup"])
    fig, ax = plt.subplots(figsize=(10, 4.2))
    _arm_lines(sns, ax, sp, "speedup", levels)
    ax.axhline(1.0, color="0.3", linewidth=1)
    _log_x(ax, sp["concurrency"])
    ax.set_ylabel("output throughput / baseline")
    ax.set_title("Speedup over the baseline (above 1: speculation pays)")
    _legend_below(fig, ax)
    return fig


def envelope_figure(levels: pd.DataFrame):
    """Throughput with the envelope max(baseline, eagle3), and each arm's share of it."""
    plt, sns = _style()
    env = envelope_table(levels).dropna(subset=["of_envelope"])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.4))
    e = env.drop_duplicates(["run_id", "concurrency"]).sort_values("concurrency")
    a1.fill_between(e["concurrency"], 0, e["envelope"], color="0.88", label="envelope")
    _arm_lines(sns, a1, env, "output_throughput", levels, legend=False)
    _log_x(a1, env["concurrency"])
    a1.set_ylabel("output throughput (tok/s)")
    a1.set_title("Arms against the envelope (grey)")
    _arm_lines(sns, a2, env, "of_envelope", levels)
    a2.axhline(1.0, color="0.3", linewidth=1)
    _log_x(a2, env["concurrency"])
    a2.set_ylabel("share of envelope")
    a2.set_title("How close each arm comes to the envelope")
    _legend_below(fig, a2)
    return fig


def latency_figure(levels: pd.DataFrame, percentiles=(50, 99)):
    """TTFT and TPOT at each percentile (one line style each), per arm."""
    plt, sns = _style()
    long = []
    stats = [percentile_label(p) for p in percentiles]
    for metric in ("ttft", "tpot"):
        for stat in stats:
            col = f"{stat}_{metric}_ms"
            if col not in levels:
                continue
            d = levels[["arm", "concurrency", col]].rename(columns={col: "ms"})
            long.append(d.assign(metric=metric.upper(), percentile=stat))
    long = pd.concat(long).dropna(subset=["ms"])
    order = [a for a in arm_order(levels) if a in set(long["arm"])]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
    for ax, metric in zip(axes, ("TTFT", "TPOT")):
        sns.lineplot(data=long[long["metric"] == metric], x="concurrency", y="ms", hue="arm", hue_order=order,
                     palette=palette(levels), style="percentile", style_order=stats, markers=True,
                     ax=ax, legend=metric == "TPOT")
        _log_x(ax, long["concurrency"])
        ax.set_yscale("log")
        ax.set_ylabel(f"{metric} (ms, log scale)")
        ax.set_title(f"{metric}: {', '.join(stats)} (one line style each)")
    _legend_below(fig, axes[1])
    return fig


def pareto_points(levels: pd.DataFrame, percentile: float = 50) -> pd.DataFrame:
    """Each arm and level as a point (tokens/s per user = 1000 / TPOT at the percentile, output tok/s),
    and whether no other point of the run beats it on both axes (`pareto`)."""
    col = f"{percentile_label(percentile)}_tpot_ms"
    d = levels[["arm", "concurrency", "output_throughput", col]].dropna().copy()
    d["per_user"] = 1000.0 / d[col]
    xs, ys = d["per_user"].to_numpy(), d["output_throughput"].to_numpy()
    d["pareto"] = [not ((xs >= x) & (ys >= y) & ((xs > x) | (ys > y))).any() for x, y in zip(xs, ys)]
    return d.reset_index(drop=True)


def pareto_figure(levels: pd.DataFrame, percentile: float = 50, slo_tpot_ms: float | None = None):
    """Output throughput against tokens per second per user (1000 / TPOT at the percentile), one line
    per arm through its levels; the run's Pareto front outlined; an SLO on TPOT as a line."""
    plt, sns = _style()
    d = pareto_points(levels, percentile)
    fig, ax = plt.subplots(figsize=(8, 5))
    order = [a for a in arm_order(levels) if a in set(d["arm"])]
    colours = palette(levels)
    for arm in order:
        a = d[d["arm"] == arm].sort_values("concurrency")
        ax.plot(a["per_user"], a["output_throughput"], marker="o", color=colours.get(arm), label=arm)
    front = d[d["pareto"]].sort_values("per_user")
    ax.plot(front["per_user"], front["output_throughput"], linestyle="none", marker="o", markersize=13,
            markerfacecolor="none", markeredgecolor="black", label="Pareto front")
    if slo_tpot_ms:
        ax.axvline(1000.0 / slo_tpot_ms, color="grey", linestyle="--", label=f"TPOT SLO {slo_tpot_ms:g} ms")
    ax.set_xlabel(f"tokens/s per user (1000 / {percentile_label(percentile)} TPOT ms)")
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput against interactivity (each point a concurrency level)")
    ax.legend()
    _legend_below(fig, ax)
    return fig


def speculation_figure(levels: pd.DataFrame):
    """Accept length and the fraction of decode steps speculated, against the load.

    With closed-loop clients the decode batch is the number of requests in flight, at
    most the concurrency, so concurrency stands for batch size here.
    """
    plt, sns = _style()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.2))
    acc = levels.dropna(subset=["accept_length"])
    # An arm that speculates on a few steps only (a policy's probes) estimates its accept
    # length from few verifies: drawn as hollow points, not joined, so the noise does not
    # read as a trend.
    few = acc["spec_step_fraction"].fillna(1.0) < FEW_SPEC_STEPS
    if (~few).any():
        _arm_lines(sns, a1, acc[~few], "accept_length", levels, legend=False)
    colours = palette(levels)
    for arm, d in acc[few].groupby("arm"):
        a1.plot(d["concurrency"], d["accept_length"], linestyle="none", marker="o", markersize=6,
                markerfacecolor="none", color=colours.get(arm, "0.5"),
                label=f"{arm} (under {FEW_SPEC_STEPS:.0%} of steps speculated)")
    if few.any():
        a1.legend(fontsize=8, loc="lower left")
    # From 1 (nothing accepted): a cut axis makes small differences look large.
    top = max(2.0, float(acc["accept_length"].max()) if len(acc) else 2.0)
    a1.set_ylim(1.0, top * 1.05)
    a1.set_ylabel("accept length (tokens per verify)")
    a1.set_title("Accept length (bonus token included; 1 = nothing accepted)")
    frac = levels.dropna(subset=["spec_step_fraction"])
    if len(frac):
        _arm_lines(sns, a2, frac, "spec_step_fraction", levels)
    a2.set_ylim(-0.05, 1.05)
    a2.set_ylabel("fraction of decode steps speculated")
    a2.set_title("Steps speculated vs batch size")
    for ax in (a1, a2):
        _log_x(ax, levels["concurrency"])
        ax.set_xlabel("concurrency = max decode batch size (log scale)")
    _legend_below(fig, a2)
    return fig


def versus(levels: pd.DataFrame, run_id: str, other_id: str, value: str = "output_throughput") -> pd.DataFrame:
    """This run's value beside a compared run's (e.g. its simulated twin), per arm and level,
    with their ratio other/this: where a model and a measurement agree, and by how much they miss."""
    this = levels[levels["run_id"] == run_id].set_index(["arm", "concurrency"])[value]
    other = levels[levels["run_id"] == other_id].set_index(["arm", "concurrency"])[value]
    out = pd.DataFrame({run_id: this, other_id: other}).dropna()
    out[f"{other_id} / {run_id}"] = out[other_id] / out[run_id]
    return out.round(3).reset_index()


DYNAMIC_TARGET = 0.97  # what a switching arm should keep of the better static arm, level by level


def headline_sentence(levels: pd.DataFrame) -> str:
    """The report's answer in one sentence: which static arm wins where, and how much of the better
    one, level by level, each switching arm keeps (against its target)."""
    base, spec = roles(levels)
    if base is None or spec is None:
        return "No answer from this run: it needs a plain (baseline) arm and an always-speculating arm."
    cross = crossover(levels, spec)
    sp = speedup_table(levels)
    s = sp.loc[sp["arm"] == spec].groupby("concurrency")["speedup"].mean()
    wins = f"{spec} {s.min():.2f}x to {s.max():.2f}x of {base}"
    if cross.status == "never-pays":
        first = f"Speculation never paid here: {base} won at every level ({wins})."
    elif cross.status == "always-pays":
        first = f"Speculation paid at every level ({wins})."
    else:
        first = f"Speculation paid at low load and stopped paying as load grew ({wins}; {cross.describe()})."
    plain, specs = static_arms(levels)
    summ = envelope_summary(levels)
    dyn = summ.loc[~summ["arm"].isin(plain + specs)]
    parts = [f"{r.arm} kept {r.mean_of_envelope:.1%} of the better static arm per level on average and "
             f"{r.worst_of_envelope:.2%} at worst (C={int(r.worst_at_concurrency)}), "
             f"{'meeting' if r.worst_of_envelope >= DYNAMIC_TARGET else 'short of'} its {DYNAMIC_TARGET:.0%} target"
             for r in dyn.itertuples()]
    return first + (" " + "; ".join(parts) + "." if parts else "")

"""The analysis vocabulary: which rows of a results table count, how a level averages them, and
the envelope every switching arm is judged against.  One rule each, for the report, tune and
crossover alike (arm roles are one rule too: dynspec.roles).

Usable rows.  A results row (one repeat of one arm at one level) is usable when it has no error,
completed at least one request, failed none, and measured a positive output throughput.  The rest
are shown with their reason (`unusable_rows`), never averaged in (`level_means`).

The envelope.  At each level, the better of the static arms: max(plain arms, always-speculating
arms), the best a server could do if it knew, at that load, which static choice wins.  A level
where any static arm is missing has no envelope, not a smaller one.

Two crossovers, not to be confused:

- the *step crossover* (`Profile.crossover_batch`, tabulated by `crossover.step_crossover_table`):
  the decode batch size from which one speculative step costs more than the accept_length plain
  steps it replaces; read off a profile's step-time table, no load involved.
- the *load crossover* (`report.load_crossover`): the concurrency at which a measured or
  simulated always-speculating arm's output throughput falls below the plain arm's, interpolated
  in log concurrency between two levels; prefill and the spread of acceptance count there.

tune's `cutoff_range` is neither: the range of static cutoffs that model the same on the levels
measured.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from dynspec.roles import arms_by_role

METRIC = "output_throughput"


def _num(df: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(df[col], errors="coerce") if col in df else pd.Series(np.nan, index=df.index)


def unusable_reasons(results: pd.DataFrame) -> pd.Series:
    """Why each row cannot be used ("" when it can), the first reason that applies."""
    err = results["error"].astype(object).fillna("").astype(str).str.strip() if "error" in results \
        else pd.Series("", index=results.index)
    thr, done, failed = _num(results, METRIC), _num(results, "completed"), _num(results, "failed")
    why = pd.Series("", index=results.index, dtype=object)
    has_failed = failed > 0
    why[has_failed] = failed[has_failed].map(lambda n: f"{int(n)} failed requests")
    why[~(done > 0)] = "no completed requests"
    why[~(np.isfinite(thr) & (thr > 0))] = f"no {METRIC}"
    why[err != ""] = "error: " + err[err != ""].str[:80]
    return why


def usable(results: pd.DataFrame) -> pd.Series:
    """True for each row that counts (see the module's docstring)."""
    return unusable_reasons(results) == ""


def unusable_rows(results: pd.DataFrame) -> pd.DataFrame:
    """The rows that do not count, with their error and the reason they are left out."""
    why = unusable_reasons(results)
    cols = [c for c in ("arm", "concurrency", "repeat", "completed", "failed", "error") if c in results]
    return results.loc[why != "", cols].assign(reason=why[why != ""]).reset_index(drop=True)


def level_means(results: pd.DataFrame, keys: list[str], metrics: Sequence[str]) -> pd.DataFrame:
    """One row per `keys`: each metric averaged over the usable repeats (NaN where none was), with
    `repeats` and `failed_repeats` saying how many rows went into and out of each mean, and the
    level's policy, backend and profile."""
    df = results.copy()
    metrics = list(metrics)
    for m in metrics:
        df[m] = pd.to_numeric(df[m], errors="coerce") if m in df else np.nan
    for col in ("policy", "backend", "profile"):
        if col not in df:
            df[col] = ""
    if df.empty:
        return pd.DataFrame(columns=keys + ["repeats", "failed_repeats", "policy", "backend", "profile"] + metrics)
    df["_bad"] = ~usable(df)
    good = df[~df["_bad"]]
    out = good.groupby(keys, sort=True).agg({m: "mean" for m in metrics}).reset_index() if len(good) \
        else pd.DataFrame(columns=keys + metrics)
    counts = df.groupby(keys).agg(repeats=("_bad", "size"), failed_repeats=("_bad", "sum"),
                                  policy=("policy", "first"), backend=("backend", "first"),
                                  profile=("profile", "first")).reset_index()
    out = counts.merge(out, on=keys, how="left")
    out["concurrency"] = out["concurrency"].astype(int)
    return out.sort_values(keys).reset_index(drop=True)


def static_arms(table: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(arms that never speculate, arms that always do), by dynspec.roles."""
    by_role = arms_by_role(table)
    return ([a for a, r in by_role.items() if r == "plain"], [a for a, r in by_role.items() if r == "spec"])


def envelope(table: pd.DataFrame, keys: list[str], arms: Sequence[str] | None = None,
             value: str = METRIC) -> pd.DataFrame:
    """Per `keys` (a level: run and concurrency, or concurrency and seed): the envelope, the best
    `value` of the static arms (default: every plain and always-speculating arm of the table), and
    `envelope_arm`, the arm that gives it.  NaN where any of those arms is missing at the level."""
    if arms is None:
        plain, spec = static_arms(table)
        arms = plain + spec
    wide = table.pivot_table(index=keys, columns="arm", values=value)
    static = wide[[a for a in arms if a in wide.columns]]
    env = static.max(axis=1, skipna=False).rename("envelope")
    best = static.fillna(-1.0).idxmax(axis=1).where(env.notna()).rename("envelope_arm")
    return pd.concat([env, best], axis=1).reset_index()


def envelope_of(*values: float | None) -> float | None:
    """The envelope of one level from its static arms' values: their max, None if any is missing."""
    if any(v is None for v in values):
        return None
    return max(v for v in values if v is not None)

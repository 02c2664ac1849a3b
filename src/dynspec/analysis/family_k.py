"""Draft length on generated machines: which K per step, against static K, SGLang 0.5.23's tiers,
on/off goodput and a batch-size -> K table (`experiments/generated-machines/envelope.py
--family N --candidate-steps 0,1,3,5,7`).

Every arm runs on the switching server (its plain steps pay the member's catch-up) with the
same candidate steps, the same requests and acceptance draws (dynspec.analysis.family.level_requests;
output lengths varied by default), in a closed loop.  Arms:

- `static-K` for each candidate K: every decode step at K (K = 0: plain steps, `never`);
- `oracle`: at each level the best static K there, knowing the results (computed, not run);
- `goodput-k`: goodput's on/off with the K of most expected output per second (policy.goodput.steps);
- `goodput`: goodput's on/off, speculating at the member's own num_steps (the candidate nearest);
- `sglang-tiers`: SGLang 0.5.23's default adaptive tiers (policy.tiers), started at the member's N;
- `k-table`: a vLLM-style static batch-size -> K table, K_TABLE.

Each is judged over the steady state (dynspec.analysis.family.level_throughputs).
"""

from __future__ import annotations

from dynspec.analysis.family import LEVELS, Member, level_requests, level_throughputs, levels_for

K_TABLE = "table:1-7=5,8-31=3,32-63=1,64-=0"
ADAPTIVE_ARMS = {"goodput-k": "policy:goodput-k", "goodput": "policy:goodput",
                 "sglang-tiers": "policy:sglang-default-tiers", "k-table": f"policy:{K_TABLE}"}


def static_arm(k: int) -> str:
    return "policy:never" if k == 0 else f"policy:table:1-={k}"


def run_member_k(m: Member, candidate_steps: tuple[int, ...], levels=LEVELS, sim_seed: int = 0,
                 range_ratio: float = 0.5, level_scale: int = 1) -> list[dict]:
    """One row per (arm, level) of member m: output tok/s over the whole run and the steady
    state, and the mean draft steps of its speculative steps."""
    from dynspec.sim.run import simulate_level  # noqa: F401 - level_throughputs runs it

    p = m.profile()
    cands = list(candidate_steps)
    arms = {f"static-{k}": static_arm(k) for k in cands}
    arms.update(ADAPTIVE_ARMS)
    arms["sglang-tiers"] = f"policy:sglang-default-tiers:steps={m.num_steps}"
    rows = []
    for c in levels_for(m, levels):
        work = level_requests(m, c, range_ratio, level_scale)
        got = {}
        for name, arm in arms.items():
            whole, steady = level_throughputs(p, arm, c, sim_seed, candidate_steps=cands, **work)
            got[name] = (whole, steady)
        best_k = max(cands, key=lambda k: got[f"static-{k}"][1])
        got["oracle"] = got[f"static-{best_k}"]
        for name, (whole, steady) in got.items():
            rows.append({"member": m.index, "arm": name, "concurrency": c, "output_throughput": whole,
                         "steady_throughput": steady, "best_static_k": best_k, "num_steps": m.num_steps})
    return rows


def _dist(r) -> str:
    import numpy as np

    r = np.asarray(r, dtype=float)
    if not len(r):
        return "none"
    return (f"worst {r.min():.3f}  p1 {np.percentile(r, 1):.3f}  median {np.median(r):.3f}  "
            f"mean {r.mean():.3f}  >= 0.97: {100 * (r >= 0.97).mean():5.1f}%  (n={len(r)})")


def summarize_k(df, column: str = "steady_throughput") -> tuple[list[str], dict[str, object]]:
    """The report's lines and figures: goodput-k against the best static K per level (the oracle),
    against SGLang's tiers where the two differ by more than 1%, and against on/off goodput where
    an intermediate K (neither 0 nor the largest candidate) is the best static one."""
    import numpy as np

    t = df.pivot_table(index=["member", "concurrency"], columns="arm", values=column)
    best = df[df.arm == "oracle"].set_index(["member", "concurrency"]).best_static_k.reindex(t.index)
    kmax = max(int(a.split("-")[1]) for a in t.columns if a.startswith("static-"))
    lines: list[str] = []
    fig: dict[str, object] = {}
    for arm in ("goodput-k", "goodput", "sglang-tiers", "k-table", f"static-{kmax}"):
        r = t[arm] / t["oracle"]
        lines.append(f"  {arm:14s} / oracle: {_dist(r)}")
        fig[f"{arm}/oracle"] = (float(r.min()), float(r.median()))
    rt = t["goodput-k"] / t["sglang-tiers"]
    diff = rt[(rt - 1).abs() > 0.01]
    lines.append(f"  goodput-k / sglang-tiers where they differ by > 1%: {len(diff)} of {len(rt)} member-levels, "
                 f"goodput-k ahead at {int((diff > 1).sum())}; {_dist(diff)}")
    fig["vs_tiers"] = (len(diff), int((diff > 1).sum()), float(diff.median()) if len(diff) else np.nan,
                       float(diff.min()) if len(diff) else np.nan)
    inter = (best > 0) & (best < kmax)
    ro = (t["goodput-k"] / t["goodput"])[inter]
    lines.append(f"  goodput-k / goodput (on/off) where an intermediate K is best ({int(inter.sum())} member-levels "
                 f"on {ro.index.get_level_values(0).nunique()} members): {_dist(ro)}")
    fig["vs_onoff_intermediate"] = (int(inter.sum()), float(ro.median()) if len(ro) else np.nan)
    per_member = ro.groupby(level=0).median()
    lines.append(f"    per member (median over its such levels): median {per_member.median():.3f}, "
                 f"share of members >= 1.02: {100 * (per_member >= 1.02).mean():.1f}%")
    fig["vs_onoff_member_median"] = float(per_member.median()) if len(per_member) else np.nan
    share = df[df.arm == "oracle"].best_static_k.value_counts(normalize=True).sort_index()
    lines.append("  best static K by member-level: " + ", ".join(f"K={k}: {100 * v:.0f}%" for k, v in share.items()))
    return lines, fig

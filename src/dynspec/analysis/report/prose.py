"""The report in words: the status box and banner, the run's summary and details, the headline
sentence, the findings, captions and notes, and the notebook's sections that are prose beside a table.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd

from dynspec.analysis.report.run import EXPERIMENTS_DIR, Run, measured_runs, run_slo
from dynspec.analysis.report.tables import coinciding_arms, envelope_summary, environment_tables, failed_levels, \
    goodput_table, level_table, load_crossover, rate_summary, rate_table, roles, speedup_table, static_arms
from dynspec.results import wall_clock_problem


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


def identity_section(run: Run) -> list:
    """Each arm's greedy tokens against the baseline's, prompt by prompt (dynspec.live.identity),
    summed over levels; or why there is nothing to compare."""
    from dynspec.live.identity import IdentityError, output_mismatches

    try:
        table = output_mismatches(run.run_dir)
    except (IdentityError, OSError, ValueError):
        table = None
    if table is None or not table["compared"].any():
        return [_markdown("*No request of this run carries a digest of its tokens: a simulated run, the "
                          "`bench_serving` driver or an OpenAI API, or a run made before 2026-12-01.*")]
    per_arm = table.groupby("arm", sort=False)[["compared", "differ"]].sum().reset_index()
    differ, ref = int(per_arm["differ"].sum()), table["reference"].iloc[0]
    if differ:
        bad = ", ".join(f"{r.arm} ({r.differ} of {r.compared})" for r in per_arm.itertuples() if r.differ)
        text = f"**Requests whose tokens differ from {ref}'s: {bad}.**"
    else:
        text = f"Every compared request generated the same tokens as {ref}'s ({int(per_arm['compared'].sum())} requests)."
    return [_markdown(text), per_arm]


def catch_up_note(profile_name: str) -> str:
    """What a switching arm's plain step costs extra on this profile, as a sentence ("" if nothing)."""
    from dynspec.sim.profile import ProfileError, load_profile

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


def status_box(run: Run, experiments_dir: Path = EXPERIMENTS_DIR) -> list[tuple[str, str]]:
    """What is measured, fitted, simulated and never run, as (label, sentence) rows, from the
    run and its profile's provenance: the first thing a report shows."""
    from dynspec.sim.profile import ProfileError, load_profile

    rows = [("Numbers", banner(run).split(" Arms with a policy")[0])]
    if clock := wall_clock_problem(run.run_dir):
        rows.append(("Clock", clock))
    if lag := emulator_lag_problem(run.results):
        rows.append(("Lag", lag))
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
    measured = measured_runs(experiments_dir)
    if measured:
        machines = Counter(hw.split(" (")[0].strip() for _, hw in measured)
        where = "; ".join(f"{n} on {hw}" for hw, n in sorted(machines.items()))
        rows.append(("Real SGLang", "dynspec's patched SGLang 0.5.9 has served real requests on a CPU in CI "
                                    f"(tests/test_real_sglang.py) and in {len(measured)} measured runs under "
                                    f"experiments/: {where}."))
        hw = run.hardware.split(" (")[0].strip()
        if hw and run.backend != "live" and not any(hw in h for _, h in measured):
            rows.append(("Never run", f"the patched server has never run on {run.hardware}; "
                                      "this run's numbers for it are a model."))
    return rows


def emulator_lag_problem(results: pd.DataFrame) -> str:
    """A sentence naming the emulated levels whose emulator fell behind its profile by more than
    EMULATOR_LAG_LIMIT of their duration ('' when none did): their servers ran slower than the profile."""
    from dynspec.results import EMULATOR_LAG_LIMIT

    if "emulator_lag_s" not in results.columns or results.empty:
        return ""
    bad = results[results["emulator_lag_s"] > EMULATOR_LAG_LIMIT * results["duration_s"]]
    if bad.empty:
        return ""
    names = [f"{a} C={int(c)}" + (f" r{int(r)}" if r else "") for a, c, r in zip(bad["arm"], bad["concurrency"], bad["repeat"])]
    worst = float((bad["emulator_lag_s"] / bad["duration_s"]).max())
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return (f"The emulator fell behind its profile by more than {EMULATOR_LAG_LIMIT:.0%} of the level on "
            f"{len(names)} level(s) ({shown}; worst {worst:.1%}): the machine could not keep the profile's pace, "
            "so those levels measured a slower server than the profile and their comparisons may be wrong "
            "(emulator_lag_s in results.csv).")


def banner_html(run: Run) -> str:
    """The status box as a self-contained HTML block (inline style: the report fetches nothing)."""
    import html

    simulated = run.backend in ("sim", "emulate")
    colour = ("#fff4e5", "#b35c00") if simulated else ("#e8f4ea", "#1e6b33")
    rows = "".join(f'<tr><td style="padding:2px 10px 2px 0;vertical-align:top"><b>{html.escape(k)}</b></td>'
                   f'<td style="padding:2px 0">{html.escape(v)}</td></tr>' for k, v in status_box(run))
    return (f'<div class="dynspec-status" style="background:{colour[0]};border-left:6px solid {colour[1]};'
            f'padding:10px 14px;margin:8px 0;font-size:14px"><table style="border:none">{rows}</table></div>')


def reference_caption(run: Run, shown: pd.DataFrame | None) -> str:
    if shown is None:
        return ("*The seed's measurements (8x RTX PRO 6000 Blackwell) are not drawn: this run is not of "
                "that node, or not in its time.*")
    from dynspec.sim.profile import ProfileError, load_profile

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
    lines = [f"- Run folder: `{_shown(run.run_dir)}`"]
    for key in ("status", "started", "finished"):
        if key in run.meta:
            lines.append(f"- {key}: {run.meta[key]}")
    if run.environment:
        machine, packages, _ = environment_tables(run.environment)
        m = dict(zip(machine["item"], machine["value"]))
        lines.append(f"- Machine: {m.get('GPUs')}; driver {m.get('driver')}; CUDA {m.get('CUDA (driver)')}")
        v = {r.package: r.version for r in packages.itertuples()}
        lines.append("- Versions: " + ", ".join(f"{k} {v[k]}" for k in ("torch", "sglang", "flashinfer-python",
                                                                          "dynspec") if k in v))
    return "\n".join(lines)


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
    x = load_crossover(levels)
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


DYNAMIC_TARGET = 0.97  # what a switching arm should keep of the better static arm, level by level


def headline_sentence(levels: pd.DataFrame) -> str:
    """The report's answer in one sentence: which static arm wins where, and how much of the better
    one, level by level, each switching arm keeps (against its target)."""
    base, spec = roles(levels)
    if base is None or spec is None:
        return "No answer from this run: it needs a plain (baseline) arm and an always-speculating arm."
    cross = load_crossover(levels, spec)
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


def findings(levels: pd.DataFrame, config: dict | None = None) -> str:
    """The report's conclusions in a few bullets, each computed from the levels table (and the
    run's resolved config, for what the workload explains)."""
    base, spec = roles(levels)
    plain, specs = static_arms(levels)
    out = [f"- **Crossover:** {load_crossover(levels, a).describe()}." for a in specs] or \
        [f"- **Crossover:** {load_crossover(levels).describe()}."]
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
    level ("" unless the run has both: an arm of policy "none" and one of policy "never").

    Several arms of a policy are pooled (their mean per level): a run whose arms go plain, never,
    never, plain (ABBA) compares servers that ran, on average, at the same moment, so a GPU that
    drifts (clocks, temperature) over the run favours neither."""
    if "policy" not in levels:
        return ""
    pol = levels.groupby("arm")["policy"].first().astype(str).str.lower()
    none, never = sorted(pol[pol == "none"].index), sorted(pol[pol == "never"].index)
    if not none or not never:
        return ""
    w = levels.pivot_table(index="concurrency", columns="arm", values="output_throughput")
    ratio = (w[never].mean(axis=1, skipna=False) / w[none].mean(axis=1, skipna=False)).dropna()
    if ratio.empty:
        return ""
    per = ", ".join(f"{r:.3f} at C={int(c)}" for c, r in ratio.items())
    pooled = (f" (means of {len(never)} and {len(none)} arms; run in ABBA order, they cancel a steady drift)"
              if len(never) > 1 or len(none) > 1 else "")
    return (f"{_arm_names(never)} (speculation off by policy, the draft kept current) delivers {per} of "
            f"{_arm_names(none)}'s output throughput (a plain server){pooled}; worst {ratio.min():.4f}.")


def _arm_names(arms: list[str]) -> str:
    return " + ".join(f"`{a}`" for a in arms)


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

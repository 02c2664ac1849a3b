# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # When does EAGLE-3 pay?
#
# Output throughput of a plain SGLang server (`baseline`), the same server speculating
# with EAGLE-3 at every step (`eagle3`), and dynspec's policies that switch speculation
# on and off at run time, across concurrency levels.

# %% tags=["parameters"]
# Relative paths are taken from the repository root, wherever the notebook runs.
run_dir = None  # a data/runs/<run-id> folder; None: the latest run in runs_dir
runs_dir = "data/runs"
compare_runs = []  # other run folders drawn beside this one
reference = "data/reference/seed.csv"  # the seed's measured table; None to leave it out
profiles = []  # profile names or paths for "By profile"; []: every shipped profile
profile_levels = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 256]

# %%
import pandas as pd
from IPython.display import HTML, Markdown, display

from dynspec.analysis import cache, crossover, report
from dynspec.paths import from_repo

run_dir, runs_dir, reference = map(from_repo, (run_dir, runs_dir, reference))
run = report.open_run(run_dir, runs_dir=runs_dir)  # a report only reads: 02_sweep makes the run
levels = report.level_table(run.results)
# Compared runs appear in the throughput and speedup figures; every other number is this run's.
others = [report.load_run(from_repo(d)) for d in compare_runs]
compared = report.level_table(pd.concat([run.results] + [o.results for o in others], ignore_index=True))
ref = report.reference_for(run, report.load_reference(reference) if reference else None)
display(HTML(report.banner_html(run)), Markdown(f"**{report.headline_sentence(levels)}**"),
        Markdown(report.run_summary(run)))

# %% [markdown]
# ## Findings

# %%
display(Markdown(report.findings(levels, run.config)))

# %% [markdown]
# ## Beside the compared runs
#
# Output throughput of this run and of each compared run (for a measured run, its simulated
# twin: the same config through `dynspec sweep --backend sim`), per arm and level, and their
# ratio. Empty when nothing is compared.

# %%
for o in others:
    display(Markdown(f"**{o.run_id}** ({o.backend}, profile {o.profile})"))
    display(HTML(report.versus(compared, run.run_id, o.run_id).to_html(index=False)))

# %% [markdown]
# ## Output throughput vs concurrency
#
# Lines: this run (compared runs, if any, in other line styles).

# %%
report.show(report.throughput_figure(compared, ref));
display(Markdown(report.reference_caption(run, ref)))

# %%
display(report.wide(levels, "output_throughput", digits=1))

# %% [markdown]
# ## Speedup over the baseline

# %%
report.show(report.speedup_figure(compared));

# %%
display(report.wide(report.speedup_table(levels), "speedup", digits=3))

# %% [markdown]
# ## The envelope: max(baseline, eagle3)
#
# A server that always knew which static choice wins at the current load would follow
# the envelope. How close each arm comes to it, level by level and overall:

# %%
base_arm, spec_arm = report.roles(levels)
if base_arm and spec_arm:
    report.show(report.envelope_figure(levels))
    display(report.wide(report.envelope_table(levels), "of_envelope", digits=3))
    display(HTML(report.envelope_summary(levels).round(3).to_html(index=False)))
else:
    display(Markdown("*No envelope: this run has no plain (baseline) arm or no always-speculating arm.*"))

# %% [markdown]
# ## Latency: TTFT, TPOT, ITL and E2E
#
# At the percentiles the run's config asked for (`metrics.percentiles`; 50, 90, 95 and 99 by default).

# %%
percentiles = report.run_percentiles(run)
report.show(report.latency_figure(levels, percentiles));

# %%
display(*(report.latency_table(levels, percentiles, (m,)).round(1) for m in ("ttft", "tpot", "itl", "e2e")))

# %% [markdown]
# ## Throughput against interactivity, and goodput
#
# Each level as a point: output tokens/s against tokens/s per user (1000 / median TPOT); circled
# points are the run's Pareto front. With SLOs in the config (`metrics.slo`, vLLM's `--goodput`
# semantics), goodput is the requests per second that met every one of them.

# %%
slo = report.run_slo(run)
report.show(report.pareto_figure(levels, 50, slo.get("tpot_ms")));

# %%
display(*report.goodput_section(levels, slo))

# %% [markdown]
# ## Open-loop levels (request rates)
#
# Requests arriving at an offered rate (gamma intervals; `burstiness` 1 is Poisson) instead of a
# fixed number of clients. Empty when the run has none.

# %%
display(*report.rate_section(run, percentiles))

# %% [markdown]
# ## Speculation: accept length and steps speculated

# %%
report.show(report.speculation_figure(levels));

# %%
display(report.speculation_table(levels).round(3))

# %% [markdown]
# ## Same prompts, same tokens
#
# Every arm got the same prompts at a level and repeat and was asked for greedy tokens, so arms
# serving one model should generate the same tokens, prompt by prompt (`dynspec.live.identity`):
# requests compared with the baseline's and how many differ, per arm over every level.

# %%
display(*report.identity_section(run))

# %% [markdown]
# ## The seed's reference
#
# These numbers were measured by the seed investigation on 8x RTX PRO 6000 Blackwell
# (TP 8, EAGLE-3 on SGLang's v1 worker with a 16-token tree), not by this run; rows
# marked approximate are its "~" saturation figures (C=70+). `run_arm` is the arm of
# this run set beside each; its values are interpolated in log concurrency at the
# seed's levels and left empty outside the run's range. Conditions:
# `data/reference/README.md`.

# %%
display(Markdown(report.reference_caption(run, ref)))
if ref is not None:
    display(HTML(report.reference_comparison(levels, ref).round(3).to_html(index=False)))

# %% [markdown]
# ## By profile: where speculation stops paying
#
# Not this run: the shipped step-cost profiles (or the `profiles` parameter), side by
# side. A speculative step emits `accept_length` tokens per request and costs spec/plain
# plain steps, so per step it pays while the curve is below the accept length. The
# table gives the batch size from which it no longer does, per profile and context
# ("never": not even at batch 1; "> N": beyond the measured batch sizes).

# %%
shipped = crossover.load_profiles(profiles or None)
report.show(report.step_cost_figure(shipped));

# %%
display(crossover.step_crossover_table(shipped))

# %% [markdown]
# Why, where a profile was measured with `dynspec calibrate`: the target's forward time
# against the tokens it processes (batch x q tokens per request). Where the lines of
# different q meet, the weights' GEMMs set the time and it depends only on the tokens
# (compute-bound): a verify of k+1 tokens per request gets there at a k+1 times smaller
# batch than a plain step. Where q=1 lies above the others, the KV cache read per request
# dominates, which a verify shares across its k+1 tokens: longer contexts favour speculation.

# %%
report.show(report.forward_curve_figure(shipped)) or display(Markdown("No profile here holds a measured forward curve."));

# %% [markdown]
# Under load, simulated (1024 in / 256 out, seed 0): at which levels EAGLE-3 beats the
# plain server, and how close the dynamic policy (`goodput`) comes to
# max(baseline, eagle3) at every level.

# %%
display(cache.envelope_by_profile(shipped, profile_levels))  # simulated once per profile and code version

# %% [markdown]
# ## Failed levels and run details

# %%
failed = report.failed_levels(run.results)
display(HTML(failed.to_html(index=False)) if len(failed) else Markdown("No level failed."))
display(Markdown(report.run_details(run)))

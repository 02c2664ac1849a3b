"""Figures and tables from a run's results, with the seed's reference numbers beside them.

The report notebook (notebooks/03_report) is a thin reader over this package: every
number it shows is computed here from the results table (dynspec.results), so the
same findings can be checked in tests and quoted in the run index.

Roles: the *baseline* arm never speculates (policy `none` or `never`, or an arm named baseline)
and the *eagle3* arm always does (policy `always`, or an arm named eagle3).  Every
other arm is a policy judged against the envelope max(baseline, eagle3): the best a
server could do if it knew, at each load, which of the two static choices wins.  Which rows
count and the envelope itself are dynspec.analysis.levels' rules.

In four parts, each importing only those above it, every public name re-exported here
(`from dynspec.analysis import report; report.level_table(...)`):

  run      loading a run folder, the latest run, the seed's reference table
  tables   level tables, speedup, envelope, the load crossover, latency/goodput/speculation
  prose    status box and banner, summary, headline sentence, findings, captions, notes
  alt_text what each figure shows, in words from its data (its image's alt text), and `show`
  figures  matplotlib/seaborn figures of a run, and of profiles' step costs ("By profile")
"""

from __future__ import annotations

from dynspec.analysis.report.alt_text import alt_of, describe, show
from dynspec.analysis.report.figures import FEW_SPEC_STEPS, envelope_figure, forward_curve_figure, latency_figure, \
    palette, pareto_figure, speculation_figure, speedup_figure, step_cost_figure, throughput_figure
from dynspec.analysis.report.prose import DYNAMIC_TARGET, banner, banner_html, catch_up_note, findings, \
    goodput_section, headline, headline_sentence, identity_section, lockstep_ttft_note, prompt_source, \
    rate_section, reference_caption, run_details, run_summary, slo_text, status_box, switch_price
from dynspec.analysis.report.run import DEFAULT_REFERENCE, EXPERIMENTS_DIR, REFERENCE_COLUMNS, SEED_LABEL, ReportError, \
    Run, latest_run, list_runs, load_reference, load_run, measured_runs, numeric_metrics, open_run, \
    reference_for, run_percentiles, run_slo
from dynspec.analysis.report.tables import LEVEL_METRICS, LoadCrossover, arm_order, coinciding_arms, crossover, \
    envelope_summary, envelope_table, environment_tables, failed_levels, goodput_table, latency_table, \
    level_table, load_crossover, pareto_points, patch_table, rate_summary, rate_table, reference_comparison, \
    roles, speculation_table, speedup_table, static_arms, two_figures, versus, wide

__all__ = [
    # run
    "DEFAULT_REFERENCE", "EXPERIMENTS_DIR", "REFERENCE_COLUMNS", "SEED_LABEL", "ReportError", "Run", "latest_run",
    "list_runs", "load_reference", "load_run", "measured_runs", "numeric_metrics", "open_run", "reference_for",
    "run_percentiles", "run_slo",
    # tables
    "LEVEL_METRICS", "LoadCrossover", "arm_order", "coinciding_arms", "crossover", "envelope_summary",
    "envelope_table", "environment_tables", "failed_levels", "goodput_table", "latency_table", "level_table",
    "load_crossover", "pareto_points", "patch_table", "rate_summary", "rate_table", "reference_comparison",
    "roles", "speculation_table", "speedup_table", "static_arms", "two_figures", "versus", "wide",
    # prose
    "DYNAMIC_TARGET", "banner", "banner_html", "catch_up_note", "findings", "goodput_section", "headline",
    "headline_sentence", "identity_section", "lockstep_ttft_note", "prompt_source", "rate_section", "reference_caption",
    "run_details", "run_summary", "slo_text", "status_box", "switch_price",
    # alt_text
    "alt_of", "describe", "show",
    # figures
    "FEW_SPEC_STEPS", "envelope_figure", "forward_curve_figure", "latency_figure", "palette", "pareto_figure",
    "speculation_figure", "speedup_figure", "step_cost_figure", "throughput_figure",
]

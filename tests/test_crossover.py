"""Where speculation stops paying: the per-step crossover table and the simulated envelope
by profile (the report's "By profile" section and experiments/generated-machines/envelope.py)."""

from __future__ import annotations

import pytest

from dynspec.analysis import crossover
from dynspec.analysis import report
from dynspec.sim.profile import parse_profile
from tests.test_policy import profile_dict


def _profile(name, plain, spec, batch=(1, 64), **over):
    d = profile_dict(**over)
    d["name"] = name
    d["steps"] = {"batch_size": list(batch), "plain_ms": list(plain), "spec_ms": list(spec)}
    return parse_profile(d)


def test_crossover_table_says_never_a_batch_or_beyond():
    loses = _profile("loses", (10, 20), (30, 80))  # spec/plain 3.0 at batch 1: no accept length here pays
    crosses = _profile("crosses", (10, 20), (12, 60))  # 1.2 -> 3.0 over 1..64
    always = _profile("always", (10, 20), (11, 22), accept_length=3.0)  # 1.1 throughout
    t = crossover.crossover_table([loses, crosses, always], accept_lengths=(2.0, 2.5))
    assert list(t.profile) == ["loses", "crosses", "always"]
    assert list(t["stops paying at accept length 2"]) == ["never", str(crosses.crossover_batch(2.0)), "> 64 (> 256 extrapolated)"]
    b = int(t["stops paying at accept length 2.5"][1])
    assert 2.5 * crosses.plain_time(b) <= crosses.spec_time(b) and 2.5 * crosses.plain_time(b - 1) > crosses.spec_time(b - 1)
    assert list(t["spec/plain at batch 1"]) == [3.0, 1.2, 1.1]


def test_crossover_table_has_a_row_per_context():
    d = profile_dict()
    d["steps"] = [{"context_len": c, "batch_size": [1, 64], "plain_ms": [10, 20], "spec_ms": [12, s]}
                  for c, s in ((1024, 60), (4096, 39))]
    p = parse_profile(d)
    t = crossover.crossover_table([p], accept_lengths=(2.0,))
    assert list(t.context) == [1024, 4096]
    cells = list(t["stops paying at accept length 2"])
    assert cells[0] == str(p.crossover_batch(2.0, 1024)) and cells[1] == f"> 64 (~{p.crossover_batch(2.0, 4096, up_to=256)}, extrapolated)"  # 39/20 < 2 at 64


def test_simulated_envelope_measures_each_arm_against_the_better_static_one():
    p = _profile("crosses", (10, 20), (12, 60))
    df = crossover.simulate_envelope(p, levels=(1, 32), seeds=2, arms=("dynamic", "policy:never"),
                                     num_prompts=40, output_len=64)
    assert set(df.seed) == {0, 1} and len(df) == 2 * 2 * 4
    best = df[df.arm.isin(crossover.STATIC)].groupby(["concurrency", "seed"]).of_envelope.max()
    assert (best == 1.0).all()
    never = df[df.arm == "policy:never"].set_index(["concurrency", "seed"]).output_throughput
    baseline = df[df.arm == "baseline"].set_index(["concurrency", "seed"]).output_throughput
    assert (never == baseline).all()  # never speculating is the baseline, step for step


def test_envelope_by_profile_names_where_eagle3_wins_and_the_dynamic_arms_worst():
    loses = _profile("loses", (10, 20), (30, 80))
    row = crossover.envelope_by_profile([loses], levels=(1, 4, 16), num_prompts=40, output_len=64).iloc[0]
    assert row["eagle3 beats baseline at C"] == "none"
    assert 0.95 < row["dynamic: worst of envelope"] <= row["dynamic: mean of envelope"] <= 1.0
    assert row["at C"] in (1, 4, 16) and row["levels"] == "1-16"


@pytest.mark.parametrize("chosen,expected", [([], "none"), ([1, 2, 4], "1-4"), ([1, 2, 16], "1-2, 16"), ([8], "8")])
def test_level_ranges(chosen, expected):
    assert crossover._ranges(chosen, [1, 2, 4, 8, 16]) == expected


def test_forward_curve_figure_draws_a_line_per_q_for_measured_tables_only():
    d = profile_dict()
    d["steps"] = {"batch_size": [1, 64], "plain_ms": [10, 20], "spec_ms": [12, 60],
                  "forward_ms": {1: [10, 20], 4: [11, 50]}}
    measured, fitted = parse_profile(d), _profile("fitted", (10, 20), (12, 60))
    fig = report.forward_curve_figure([fitted, measured])
    [ax] = fig.axes
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert sorted(lines) == ["q=1", "q=4"]
    assert list(lines["q=4"].get_xdata()) == [4, 256] and list(lines["q=4"].get_ydata()) == [11, 50]
    assert report.forward_curve_figure([fitted]) is None


def test_step_cost_figure_plots_spec_over_plain_per_profile_and_context():
    d = profile_dict()
    d["steps"] = [{"context_len": c, "batch_size": [1, 64], "plain_ms": [10, 20], "spec_ms": [12, s]}
                  for c, s in ((1024, 60), (4096, 39))]
    fig = report.step_cost_figure([parse_profile(d), _profile("one", (10, 20), (30, 80))], accept_lengths=(2.0,))
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")}
    assert lines == {"test (context 1024)": [1.2, 3.0], "test (context 4096)": [1.2, 1.95], "one": [3.0, 4.0]}


def test_a_crossover_beyond_a_shorter_tables_measured_range_is_marked_extrapolated():
    # context 4096 measured only to batch 32; it crosses near batch 45, within the 1024 table's range
    d = profile_dict()
    d["steps"] = [{"context_len": 1024, "batch_size": [1, 64], "plain_ms": [10, 20], "spec_ms": [12, 24]},
                  {"context_len": 4096, "batch_size": [1, 32], "plain_ms": [10, 15], "spec_ms": [12, 28]}]
    p = parse_profile(d)
    far = p.crossover_batch(2.0, 4096, up_to=128)
    assert 32 < far <= 64
    cell = crossover.crossover_table([p], accept_lengths=(2.0,))["stops paying at accept length 2"][1]
    assert cell == f"> 32 (~{far}, extrapolated)"

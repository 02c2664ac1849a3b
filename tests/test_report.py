"""dynspec.analysis.report on synthetic results whose right answers are known by construction."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from dynspec.analysis import report
from dynspec.results import make_row, write_table

pytest.importorskip("matplotlib", reason="the notebooks extra: pip install -e '.[notebooks]'").use("Agg")

# Output tok/s by arm and concurrency: eagle3 pays at C<=4 and loses from C=16 on.
THROUGHPUT = {
    "baseline": {1: 100.0, 4: 350.0, 16: 1000.0, 64: 1600.0},
    "eagle3": {1: 150.0, 4: 420.0, 16: 800.0, 64: 700.0},
    "dynamic": {1: 140.0, 4: 400.0, 16: 950.0, 64: 1500.0},
}
POLICY = {"baseline": "none", "eagle3": "always", "dynamic": "goodput"}  # as the sim writes them


def _rows(throughput=THROUGHPUT, run_id="r1", backend="sim", repeats=1, policy=POLICY):
    rows = []
    for arm, levels in throughput.items():
        for c, thr in levels.items():
            for rep in range(repeats):
                spec = policy[arm] not in ("none", "never")
                rows.append(make_row(
                    {"run_id": run_id, "arm": arm, "policy": policy[arm], "backend": backend,
                     "profile": "seed-blackwell", "concurrency": c, "repeat": rep},
                    {"completed": 50, "failed": 0, "duration_s": 10.0, "output_throughput": thr,
                     "median_ttft_ms": 50.0 * c, "p99_ttft_ms": 80.0 * c, "mean_ttft_ms": 55.0 * c,
                     "median_tpot_ms": 10.0 + c, "p99_tpot_ms": 15.0 + c, "mean_tpot_ms": 11.0 + c,
                     "accept_length": 2.5 if spec else math.nan,
                     "spec_step_fraction": {"none": 0.0, "never": 0.0, "always": 1.0}.get(policy[arm], 1.0 / c),
                     "switches": 0}))
    return pd.DataFrame(rows)


def _levels(**kw):
    return report.level_table(_rows(**kw))


def test_crossover_interpolates_on_log_concurrency():
    # speedup 1.1 at C=4 and 0.7 at C=16: a quarter of the way in log C, C = 4 * 4**0.25.
    t = {"baseline": {1: 100.0, 4: 100.0, 16: 100.0}, "eagle3": {1: 130.0, 4: 110.0, 16: 70.0}}
    x = report.crossover(_levels(throughput=t))
    assert x.status == "crosses"
    assert x.between == (4, 16)
    assert x.concurrency == pytest.approx(4 * 4 ** 0.25)
    # Two significant figures: the point lies between two measured levels, nothing finer.
    assert "between C=4 and C=16 (near C=5.7, interpolated)" in x.describe()
    assert report.two_figures(220.3) == "220" and report.two_figures(5.657) == "5.7"
    assert report.two_figures(0.0312) == "0.031" and report.two_figures(1234.0) == "1200"


def test_crossover_never_and_always_pays():
    seed_like = {"baseline": {1: 92.6, 30: 711.0, 70: 780.0}, "eagle3": {1: 77.5, 30: 299.5, 70: 340.0}}
    assert report.crossover(_levels(throughput=seed_like)).status == "never-pays"
    wins = {"baseline": {1: 90.0, 30: 700.0}, "eagle3": {1: 100.0, 30: 701.0}}
    assert report.crossover(_levels(throughput=wins)).status == "always-pays"
    only_base = {"baseline": {1: 90.0}}
    assert report.crossover(_levels(throughput=only_base, policy={"baseline": "never"})).status == "unknown"


def test_roles_follow_policy_not_names():
    t = {"plain": {1: 100.0, 8: 500.0}, "spec": {1: 150.0, 8: 400.0}}
    levels = _levels(throughput=t, policy={"plain": "never", "spec": "always"})
    assert report.roles(levels) == ("plain", "spec")
    sp = report.speedup_table(levels).set_index(["arm", "concurrency"])["speedup"]
    assert sp[("spec", 1)] == pytest.approx(1.5)
    assert sp[("spec", 8)] == pytest.approx(0.8)


def test_the_baseline_is_a_server_without_a_drafter_before_a_patched_never():
    """A run with a plain server and policies sharing a patched one: `never` sorts first by name
    but is the patched server declining, not the baseline it is priced against."""
    t = {"a-never": {1: 97.0}, "plain": {1: 100.0}, "spec": {1: 150.0}}
    levels = _levels(throughput=t, policy={"a-never": "never", "plain": "none", "spec": "always"})
    assert report.roles(levels) == ("plain", "spec")


def test_level_table_averages_repeats_and_drops_failed_ones():
    df = _rows(repeats=2)
    # Second repeat of baseline C=16 measured 1200; a third one failed outright.
    df.loc[(df["arm"] == "baseline") & (df["concurrency"] == 16) & (df["repeat"] == 1), "output_throughput"] = 1200.0
    failed = make_row({"run_id": "r1", "arm": "baseline", "policy": "never", "backend": "sim", "profile": "p",
                       "concurrency": 16, "repeat": 2},
                      {"completed": 0, "failed": 50, "output_throughput": math.nan, "error": "server died"})
    df = pd.concat([df, pd.DataFrame([failed])], ignore_index=True)
    lv = report.level_table(df).set_index(["arm", "concurrency"])
    assert lv.loc[("baseline", 16), "output_throughput"] == pytest.approx(1100.0)
    assert lv.loc[("baseline", 16), "repeats"] == 3
    assert lv.loc[("baseline", 16), "failed_repeats"] == 1
    assert lv.loc[("eagle3", 16), "failed_repeats"] == 0
    fl = report.failed_levels(df)
    assert fl["error"].tolist() == ["server died"]


def test_envelope_is_the_better_static_arm_and_policies_are_judged_against_it():
    lv = _levels()
    env = report.envelope_table(lv).set_index(["arm", "concurrency"])
    assert env.loc[("dynamic", 1), "envelope"] == 150.0  # eagle3 wins at C=1
    assert env.loc[("dynamic", 1), "envelope_arm"] == "eagle3"
    assert env.loc[("dynamic", 64), "envelope"] == 1600.0  # baseline wins at C=64
    assert env.loc[("dynamic", 64), "of_envelope"] == pytest.approx(1500 / 1600)
    summ = report.envelope_summary(lv).set_index("arm")
    dyn = [140 / 150, 400 / 420, 950 / 1000, 1500 / 1600]
    assert summ.loc["dynamic", "mean_of_envelope"] == pytest.approx(sum(dyn) / 4)
    assert summ.loc["dynamic", "worst_of_envelope"] == pytest.approx(min(dyn))
    assert summ.loc["dynamic", "worst_at_concurrency"] == 1
    assert summ.loc["eagle3", "worst_at_concurrency"] == 64
    assert summ.loc["eagle3", "worst_of_envelope"] == pytest.approx(700 / 1600)


def test_envelope_needs_both_static_arms():
    with pytest.raises(report.ReportError, match="eagle3"):
        report.envelope_table(_levels(throughput={"baseline": {1: 1.0, 2: 2.0}}, policy={"baseline": "never"}))


def test_shipped_reference_holds_the_seed_numbers():
    ref = report.load_reference()
    got = {(r.arm, r.concurrency): (r.output_throughput, r.approximate) for r in ref.itertuples()}
    assert got == {
        ("baseline", 1): (92.6, False), ("baseline", 30): (711.0, False), ("baseline", 70): (780.0, True),
        ("eagle3", 1): (77.5, False), ("eagle3", 30): (299.5, False), ("eagle3", 70): (340.0, True),
    }


@pytest.mark.parametrize("text, complaint", [
    ("arm,concurrency,output_throughput\nbaseline,1,9\n", "missing reference columns: approximate, level, source"),
    ("arm,concurrency,output_throughput,approximate,level,source\nbaseline,1,-3,false,C=1,x\n", "positive"),
    ("arm,concurrency,output_throughput,approximate,level,source\nbaseline,one,3,false,C=1,x\n", "positive"),
])
def test_bad_reference_is_refused_in_one_line(tmp_path, text, complaint):
    p = tmp_path / "ref.csv"
    p.write_text(text)
    with pytest.raises(report.ReportError) as exc:
        report.load_reference(p)
    assert complaint in str(exc.value) and str(p) in str(exc.value) and "\n" not in str(exc.value)


def test_reference_comparison_interpolates_inside_the_range_only():
    t = {"baseline": {1: 100.0, 10: 1000.0}, "eagle3": {1: 50.0, 100: 500.0}}
    cmp = report.reference_comparison(_levels(throughput=t), report.load_reference()).set_index(["arm", "concurrency"])
    # baseline: C=30 lies beyond the run's last level (10) -> left empty, not extrapolated.
    assert cmp.loc[("baseline", 1), "run_output_throughput"] == pytest.approx(100.0)
    assert math.isnan(cmp.loc[("baseline", 30), "run_output_throughput"])
    # eagle3: C=30 between 1 and 100, linear in log C: 50 + 450 * log(30)/log(100).
    want = 50 + 450 * math.log(30) / math.log(100)
    assert cmp.loc[("eagle3", 30), "run_output_throughput"] == pytest.approx(want)
    assert cmp.loc[("eagle3", 30), "run_over_seed"] == pytest.approx(want / 299.5)
    assert bool(cmp.loc[("eagle3", 70), "approximate"]) is True


def _write_run(tmp_path, df, meta=None, name="r1"):
    d = tmp_path / name
    write_table(df.to_dict("records"), d / "results.csv")
    (d / "run.json").write_text(json.dumps(meta or {"run_id": name, "backend": "sim", "hardware": "8x RTX PRO 6000"}))
    (d / "config.yaml").write_text("name: tiny\nprofile: seed-blackwell\n")
    return d


def test_load_run_and_headline(tmp_path):
    run = report.load_run(_write_run(tmp_path, _rows()))
    assert run.backend == "sim" and run.profile == "seed-blackwell" and run.config_name == "tiny"
    h = report.headline(run)
    assert h["baseline_peak"] == {"output_throughput": 1600.0, "concurrency": 64}
    assert h["eagle3_peak"] == {"output_throughput": 800.0, "concurrency": 16}
    assert h["crossover"]["status"] == "crosses"
    assert h["best_policy"]["arm"] == "dynamic"
    assert h["levels"] == [1, 4, 16, 64]
    json.dumps(h)  # the index stores it as JSON


def test_load_run_errors_name_the_problem(tmp_path):
    with pytest.raises(report.ReportError, match="no such run folder"):
        report.load_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(report.ReportError, match="no results.csv"):
        report.load_run(tmp_path / "empty")
    d = _write_run(tmp_path, _rows().iloc[0:0], name="norows")
    with pytest.raises(report.ReportError, match="no rows yet"):
        report.load_run(d)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.csv").write_text("a,b\n1,2\n")
    with pytest.raises(report.ReportError, match="missing result columns"):
        report.load_run(tmp_path / "bad")


def test_latest_run_is_the_most_recently_written(tmp_path):
    import os

    a = _write_run(tmp_path, _rows(), name="a")
    b = _write_run(tmp_path, _rows(), name="b")
    os.utime(b / "results.csv", (1, 1))  # b is older
    (tmp_path / "no-results").mkdir()
    assert report.latest_run(tmp_path) == a
    assert report.latest_run(tmp_path / "missing") is None


def test_open_run_reads_the_latest_run_and_never_makes_one(tmp_path):
    with pytest.raises(report.ReportError, match="no runs yet .run a sweep first"):
        report.open_run(None, runs_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []
    a = _write_run(tmp_path, _rows(), name="a")
    assert report.open_run(None, runs_dir=tmp_path).run_dir == a


def test_banner_says_simulated_from_which_profile(tmp_path):
    sim = report.load_run(_write_run(tmp_path, _rows(), name="s"))
    assert report.banner(sim).startswith("Simulated") and "seed-blackwell" in report.banner(sim)
    emu = report.load_run(_write_run(tmp_path, _rows(backend="emulate"), name="e"))
    assert report.banner(emu).startswith("Emulated") and "seed-blackwell" in report.banner(emu)
    live = report.load_run(_write_run(tmp_path, _rows(backend="live"), name="l"))
    assert report.banner(live).startswith("Measured live on 8x RTX PRO 6000")


def test_throughput_figure_has_log_x_every_arm_and_the_seed_labelled():
    fig = report.throughput_figure(_levels(), report.load_reference())
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    for arm in THROUGHPUT:
        assert arm in labels
    assert f"baseline ({report.SEED_LABEL})" in labels and f"eagle3 ({report.SEED_LABEL})" in labels
    seed_line = next(l for l in ax.get_lines() if l.get_label() == f"eagle3 ({report.SEED_LABEL})")
    assert list(seed_line.get_ydata()) == [77.5, 299.5, 340.0]


def test_other_figures_plot_the_computed_tables():
    import matplotlib.pyplot as plt

    lv = _levels()
    sp = report.speedup_figure(lv)
    ax = sp.axes[0]
    assert ax.get_xscale() == "log"
    ys = {tuple(l.get_ydata()) for l in ax.get_lines()}
    assert (1.5, 1.2, 0.8, 700 / 1600) in ys  # eagle3's speedups
    assert (1.0, 1.0) in ys  # the break-even line
    env = report.envelope_figure(lv)
    assert len(env.axes) == 2 and all(a.get_xscale() == "log" for a in env.axes)
    lat = report.latency_figure(lv)
    assert [a.get_yscale() for a in lat.axes] == ["log", "log"]
    spec = report.speculation_figure(lv)
    frac_lines = {tuple(l.get_ydata()) for l in spec.axes[1].get_lines()}
    assert (0.0, 0.0, 0.0, 0.0) in frac_lines and (1.0, 1.0, 1.0, 1.0) in frac_lines
    plt.close("all")


def test_several_always_speculating_arms_share_one_envelope():
    # The seed's live config: EAGLE-3 on the v1 and on the v2 worker, a policy on v2.
    t = {"baseline": {1: 100.0, 16: 1000.0}, "eagle3-v1": {1: 160.0, 16: 500.0},
         "eagle3-v2": {1: 130.0, 16: 600.0}, "dynspec": {1: 128.0, 16: 990.0}}
    pol = {"baseline": "none", "eagle3-v1": "always", "eagle3-v2": "always", "dynspec": "goodput"}
    lv = _levels(throughput=t, policy=pol)
    assert report.static_arms(lv) == (["baseline"], ["eagle3-v1", "eagle3-v2"])
    assert report.roles(lv) == ("baseline", "eagle3-v1")
    env = report.envelope_table(lv).set_index(["arm", "concurrency"])
    assert env.loc[("dynspec", 1), "envelope"] == 160.0 and env.loc[("dynspec", 1), "envelope_arm"] == "eagle3-v1"
    assert env.loc[("dynspec", 16), "envelope"] == 1000.0
    assert report.arm_order(lv) == ["baseline", "eagle3-v1", "eagle3-v2", "dynspec"]
    text = report.findings(lv)
    assert "`eagle3-v1` vs baseline:** 1.60x at C=1" in text and "`eagle3-v2` vs baseline:** 1.30x" in text
    assert "Policy `dynspec`:** 89.5% of the envelope on average" in text  # (128/160 + 990/1000) / 2


def test_a_results_file_written_row_by_row_reads_back_numeric(tmp_path):
    # The sweep writes with ResultsWriter (csv module: NaN as "nan"); the report needs numbers.
    from dynspec.results import ResultsWriter

    d = tmp_path / "r"
    w = ResultsWriter(d / "results.csv")
    for row in _rows().to_dict("records"):
        w.append(row)
    run = report.load_run(d)
    assert run.results["accept_length"].dtype.kind == "f"
    lv = report.level_table(run.results).set_index(["arm", "concurrency"])
    assert math.isnan(lv.loc[("baseline", 1), "accept_length"]) and lv.loc[("eagle3", 1), "accept_length"] == 2.5


def test_findings_name_failures_and_failed_rows_stay_out_of_the_means():
    df = _rows()
    df.loc[(df["arm"] == "eagle3") & (df["concurrency"] == 64), ["error", "completed"]] = ["timeout", 0]
    lv = report.level_table(df)
    assert "1 measurement(s) failed" in report.findings(lv)
    row = lv.set_index(["arm", "concurrency"]).loc[("eagle3", 64)]
    assert math.isnan(row["output_throughput"]) and row["failed_repeats"] == 1
    # With eagle3 missing at C=64 there is no envelope there, rather than a smaller one.
    env = report.envelope_table(lv)
    assert env.loc[env["concurrency"] == 64, "envelope"].isna().all()


def test_environment_tables_say_plainly_when_there_is_no_gpu():
    env = {"host": "h", "python": "3.11", "gpu": {"available": False, "note": "no GPU: nvidia-smi not found"},
           "packages": {"torch": "2.9.1", "sglang": None}}
    machine, packages, topo = report.environment_tables(env)
    assert dict(zip(machine["item"], machine["value"]))["GPUs"] == "no GPU: nvidia-smi not found"
    assert dict(zip(packages["package"], packages["version"])) == {"torch": "2.9.1", "sglang": "not installed"}
    assert topo == "no GPU: nvidia-smi not found"
    # As nvidia-smi topo -m printed it on an H200 node: the header row underlined with ANSI codes.
    topo_raw = "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\nGPU0\t X \t0-15\t0\t\tN/A\n"
    gpu = {"available": True, "count": 8, "gpus": [{"name": "RTX PRO 6000"}] * 8, "driver": "580",
           "cuda_driver_version": "13.0", "topology": topo_raw}
    machine, _, topo = report.environment_tables({"gpu": gpu})
    assert dict(zip(machine["item"], machine["value"]))["GPUs"] == "8 x RTX PRO 6000"
    assert topo == "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-15\t0\t\tN/A\n"


def test_patch_table_counts_each_files_changes():
    from dynspec.sglang.patching import FilePatch, Hunk, PatchSet

    h = Hunk(1, 2, 1, 3, [(" ", "a\n"), ("-", "b\n"), ("+", "c\n"), ("+", "d\n")])
    ps = PatchSet("0.5.9", Path("."), [("0001-x.patch", [FilePatch("sglang/x.py", [h, h])])], {})
    t = report.patch_table(ps)
    assert t.to_dict("records") == [{"patch": "0001-x.patch", "file": "sglang/x.py", "hunks": 2, "added": 4,
                                     "removed": 2}]


def test_compared_runs_are_told_apart_by_line_style():
    both = pd.concat([_rows(run_id="sim"), _rows(run_id="live", backend="live")], ignore_index=True)
    both.loc[(both["run_id"] == "live") & (both["arm"] == "baseline"), "output_throughput"] *= 0.5
    lv = report.level_table(both)
    fig = report.throughput_figure(lv)
    ax = fig.axes[0]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "sim" in labels and "live" in labels
    ys = {tuple(l.get_ydata()) for l in ax.get_lines()}
    assert (100.0, 350.0, 1000.0, 1600.0) in ys and (50.0, 175.0, 500.0, 800.0) in ys
    # Speedups are against each run's own baseline.
    sp = report.speedup_table(lv).set_index(["run_id", "arm", "concurrency"])["speedup"]
    assert sp[("sim", "eagle3", 1)] == pytest.approx(1.5) and sp[("live", "eagle3", 1)] == pytest.approx(3.0)


def test_published_paths_are_relative_to_the_checkout(tmp_path, monkeypatch):
    from dynspec.analysis.report.prose import _shown

    monkeypatch.chdir(tmp_path)
    assert _shown(tmp_path / "data" / "runs" / "r1") == "data/runs/r1"
    outside = tmp_path.parent / "elsewhere"
    assert _shown(outside) == str(outside.resolve())
    (tmp_path / "pyproject.toml").write_text("")  # a checkout, with the notebook running in notebooks/
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    assert _shown(tmp_path / "data" / "runs" / "r1") == "data/runs/r1"


def test_banner_states_the_profiles_catch_up_cost(tmp_path):
    import yaml

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "name": "p", "hardware": "a GPU", "acceptance": {"accept_length": 2.5},
        "steps": {"batch_size": [1, 64, 256], "plain_ms": [10, 20, 40], "spec_ms": [12, 30, 60],
                  "catchup_ms": [0.13, 0.2, 0.24], "resume_ms": [0.55, 1.1, 2.2]},
        "provenance": {"kind": "measured", "source": "test"}}))
    note = report.catch_up_note(str(path))
    assert "KV-only" in note and "1.3% of a plain step at batch 1, 0.6% at 256 (the profile's catchup_ms)" in note
    assert "5.5% .. 5.5% of a plain step (resume_ms)" in note
    assert report.catch_up_note("no-such-profile") == ""


def test_headline_says_who_wins_where_and_how_close_the_switching_arm_comes():
    text = report.headline_sentence(_levels())
    assert text.startswith("Speculation paid at low load and stopped paying as load grew (eagle3 0.44x to 1.50x")
    assert "dynamic kept 94.3% of the better static arm per level on average and 93.33% at worst (C=1)" in text
    assert text.endswith("short of its 97% target.")
    never = {"baseline": THROUGHPUT["baseline"], "eagle3": {c: t / 2 for c, t in THROUGHPUT["baseline"].items()},
             "dynamic": {c: t * 0.98 for c, t in THROUGHPUT["baseline"].items()}}
    text = report.headline_sentence(_levels(throughput=never))
    assert text.startswith("Speculation never paid here: baseline won at every level (eagle3 0.50x to 0.50x")
    assert "98.00% at worst" in text and text.endswith("meeting its 97% target.")
    only_plain = {"baseline": THROUGHPUT["baseline"]}
    assert report.headline_sentence(_levels(throughput=only_plain)).startswith("No answer from this run")


def _live_run(root, run_id, hardware, backend="live"):
    d = root / "a-study" / "data" / run_id
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"run_id": run_id, "backend": backend, "hardware": hardware}))


def test_status_box_names_the_fit_and_where_the_patch_has_really_run(tmp_path):
    measured = tmp_path / "experiments"
    _live_run(measured, "h200-live", "1x NVIDIA H200 (torch 2.11)")
    _live_run(measured, "h200-crafted", "1x NVIDIA H200")
    _live_run(measured, "an-emulated-one", "8x RTX PRO 6000", backend="emulate")  # not a measurement
    sim = report.load_run(_write_run(tmp_path, _rows(), name="s"))
    box = dict(report.status_box(sim, measured))
    assert box["Numbers"].startswith("Simulated") and "Arms with a policy" not in box["Numbers"]
    assert "seed-blackwell was fitted to seed investigation" in box["Profile"] and "by construction" in box["Profile"]
    assert "KV-only" in box["Switch cost"]
    assert "in 2 measured runs under experiments/: 2 on 1x NVIDIA H200." in box["Real SGLang"]
    assert box["Never run"].startswith("the patched server has never run on 8x RTX PRO 6000")
    # Once a live run on that hardware is committed, the line goes.
    _live_run(measured, "seed-node", "8x RTX PRO 6000 Blackwell")
    assert "Never run" not in dict(report.status_box(sim, measured))
    live = report.load_run(_write_run(tmp_path, _rows(backend="live"), name="l",
                                      meta={"run_id": "l", "backend": "live", "hardware": "1x H100"}))
    box = dict(report.status_box(live, measured))
    assert box["Numbers"].startswith("Measured live on 1x H100") and "Profile" not in box and "Never run" not in box
    assert 'class="dynspec-status"' in report.banner_html(sim) and "by construction" in report.banner_html(sim)


def test_the_seed_is_drawn_only_beside_its_own_node_in_its_own_time(tmp_path):
    ref = report.load_reference()
    sim = report.load_run(_write_run(tmp_path, _rows(), name="s"))
    assert report.reference_for(sim, ref) is ref
    assert "fitted to these numbers" in report.reference_caption(sim, ref)
    h200 = report.load_run(_write_run(tmp_path, _rows(backend="live"), name="h",
                                      meta={"run_id": "h", "backend": "live", "hardware": "1x NVIDIA H200"}))
    h200.config["profile"] = ""
    h200.results["profile"] = ""
    assert report.reference_for(h200, ref) is None
    assert "not drawn" in report.reference_caption(h200, None)
    # An emulated run 8x faster than its profile: beside the seed only once its rows are on the
    # profile's clock (run.json says so; runs from before wrote the wall clock).
    for clock, drawn in ((None, False), ("profile", True)):
        meta = {"run_id": "e", "backend": "emulate", **({"clock": clock} if clock else {})}
        d = _write_run(tmp_path / str(clock), _rows(backend="emulate"), name="e", meta=meta)
        (d / "config.yaml").write_text("name: tiny\nprofile: seed-blackwell\nemulate: {time_scale: 8.0}\n")
        emu = report.load_run(d)
        assert (report.reference_for(emu, ref) is ref) == drawn, clock
        assert ("profile's clock" in report.banner(emu)) == drawn


def test_coinciding_arms_are_named_in_the_findings():
    same = dict(THROUGHPUT, eagle3b={c: t * 1.003 for c, t in THROUGHPUT["eagle3"].items()})
    pol = dict(POLICY, eagle3b="always")
    lv = _levels(throughput=same, policy=pol)
    assert report.coinciding_arms(lv, ["eagle3", "eagle3b"]) == ["eagle3", "eagle3b"]
    assert "`eagle3` and `eagle3b` coincide" in report.findings(lv)
    apart = dict(THROUGHPUT, eagle3b={c: t * 1.02 for c, t in THROUGHPUT["eagle3"].items()})
    lv = _levels(throughput=apart, policy=pol)
    assert report.coinciding_arms(lv, ["eagle3", "eagle3b"]) == [] and "coincide" not in report.findings(lv)


def test_the_price_of_switching_is_stated_where_a_run_measures_it():
    """A run with a plain server (policy none) and the patched one told never to speculate gets a
    finding with their throughput ratio per level; a run without both gets none."""
    base = THROUGHPUT["baseline"]
    tp = dict(THROUGHPUT, never={c: t * (0.95 if c == 1 else 0.99) for c, t in base.items()})
    lv = _levels(throughput=tp, policy=dict(POLICY, never="never"))
    text = report.switch_price(lv)
    assert "0.950 at C=1" in text and "worst 0.950" in text and "`baseline`" in text
    assert "Price of being able to switch" in report.findings(lv)
    assert report.switch_price(_levels()) == ""


def test_the_price_pools_arms_of_a_policy_so_abba_order_cancels_drift():
    """Arms run plain, never, never, plain on a GPU that slows 1% per arm: each `never` arm keeps
    0.99 of a plain server at the same moment.  The pooled ratio is 0.99 exactly; the first arm of
    each policy alone would say 0.99 * 0.99 (never ran one arm after plain)."""
    drift = [1.0, 0.99, 0.98, 0.97]  # the GPU's speed while each arm ran, in run order
    order = ["plain-a", "never-a", "never-b", "plain-b"]
    base = {1: 100.0, 8: 700.0}
    tp = {arm: {c: t * d * (0.99 if arm.startswith("never") else 1.0) for c, t in base.items()}
          for arm, d in zip(order, drift)}
    lv = _levels(throughput=tp, policy={"plain-a": "none", "plain-b": "none", "never-a": "never",
                                        "never-b": "never"})
    text = report.switch_price(lv)
    assert "0.990 at C=1, 0.990 at C=8" in text, text
    assert "`never-a` + `never-b`" in text and "`plain-a` + `plain-b`" in text and "ABBA" in text


def test_figures_keep_their_legend_below_and_accept_length_from_one():
    lv = _levels()
    fig = report.throughput_figure(lv)
    assert fig.legends and fig.axes[0].get_legend() is None  # a figure legend, not squeezing the axes
    fig = report.speculation_figure(lv)
    acc = fig.axes[0]
    assert acc.get_ylim()[0] == 1.0
    # dynamic speculates on 1/C of its steps: from C=16 on under 20%, drawn hollow and named so.
    hollow = [t.get_text() for t in acc.get_legend().get_texts()]
    assert hollow == ["dynamic (under 20% of steps speculated)"]
    fig = report.pareto_figure(lv)
    assert fig.legends and fig.axes[0].get_legend() is None
    ticks = [int(t) for t in report_ticks(report.throughput_figure(_levels(throughput={
        "baseline": {c: 10.0 * c for c in (1, 2, 4, 8, 16, 30, 32, 48, 64, 70, 96, 128)}},
        policy={"baseline": "none"})).axes[0])]
    assert ticks == [1, 2, 4, 8, 16, 30, 48, 128], ticks  # no two labels closer than x1.6, the top one kept


def report_ticks(ax):
    return ax.xaxis.get_major_locator().tick_values(1, 128)


def test_percentiles_goodput_rates_and_prompt_source_reach_the_report(tmp_path):
    from dynspec.live.config import parse_config
    from dynspec.live.sweep import run_sweep

    cfg = parse_config({
        "name": "metrics", "backend": "sim", "profile": "seed-blackwell", "concurrency": [1, 8],
        "request_rates": [0.5, 50], "num_prompts": 24, "input_len": 128, "output_len": 16,
        "metrics": {"percentiles": [50, 75, 99], "slo": {"ttft_ms": 200, "tpot_ms": 60}},
        "arms": [{"name": "baseline", "sim_arm": "baseline"}, {"name": "eagle3", "sim_arm": "eagle3"}]})
    res = run_sweep(cfg, run_id="m", runs_dir=tmp_path, progress=False)
    assert not res.failed and res.rows == 8
    run = report.load_run(res.run_dir)
    assert report.run_percentiles(run) == [50.0, 75.0, 99.0]
    levels = report.level_table(run.results)
    assert sorted(set(levels["concurrency"])) == [1, 8]  # rate levels kept apart
    t = report.latency_table(levels, report.run_percentiles(run), ("ttft", "e2e"))
    assert [c[0] for c in t.columns[::2]] == ["TTFT median", "TTFT p75", "TTFT p99", "E2E median", "E2E p75",
                                              "E2E p99"]
    assert (t["TTFT p75"] <= t["TTFT p99"]).all().all()
    g = report.goodput_table(levels)
    assert ((g["met every SLO"] >= 0) & (g["met every SLO"] <= 1)).all().all()
    # goodput <= throughput, and equal to it where every request met both SLOs
    assert (levels["request_goodput"] <= levels["request_throughput"] + 1e-9).all()
    rates = report.rate_table(run.results)
    assert sorted(set(rates["request_rate"])) == [0.5, 50.0] and set(rates["concurrency"]) == {0}
    slow, fast = (rates[(rates["arm"] == "baseline") & (rates["request_rate"] == r)].iloc[0] for r in (0.5, 50.0))
    assert slow["request_goodput"] > 0 and fast["p99_ttft_ms"] > slow["p99_ttft_ms"]  # a queue at 50 req/s
    summary = report.run_summary(run)
    assert "request rates (req/s): 0.5, 50" in summary and "prompts: random token ids (128 in / 16 out)" in summary
    assert "TTFT <= 200 ms" in summary
    pts = report.pareto_points(levels)
    best = pts.loc[pts["output_throughput"].idxmax()]
    assert best["pareto"]  # the highest throughput is never dominated
    for _i, a in pts.iterrows():  # a point on the front: nothing beats it on both axes
        if a["pareto"]:
            assert not ((pts["per_user"] >= a["per_user"]) & (pts["output_throughput"] > a["output_throughput"])).any()
    report.pareto_figure(levels, 50, 60.0)
    report.latency_figure(levels, [50, 75, 99])


def test_the_lockstep_ttft_artifact_is_explained_only_where_it_applies():
    lv = _levels()  # baseline TTFT 50*C ms, eagle3 the same: no artifact
    assert report.lockstep_ttft_note(lv, {}) == ""
    rows = _rows()
    rows.loc[rows["arm"] == "eagle3", "median_ttft_ms"] = 46.0  # plain TTFT up to 3200 ms at C=64
    lv = report.level_table(rows)
    note = report.lockstep_ttft_note(lv, {"prompts": {"output_lens": "fixed"}})
    assert note.startswith("`baseline`'s median is 70x `eagle3`'s at C=64 (3200 vs 46 ms)")
    assert "- **TTFT:** `baseline`'s median is 70x" in report.findings(lv, {})
    assert report.lockstep_ttft_note(lv, {"prompts": {"output_lens": "range"}}) == ""  # not this workload


def test_with_no_run_in_data_runs_the_report_opens_the_one_make_report_left_in_build(tmp_path, monkeypatch):
    """`make report` writes its run to build/runs; the report notebook's defaults then said "no runs yet"."""
    from dynspec import paths

    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path)  # a checkout with no data/runs yet
    made = _write_run(tmp_path / "build" / "runs", _rows(), name="seed-blackwell-sim")
    assert report.open_run(None, runs_dir=tmp_path / "data" / "runs").run_dir == made
    other = tmp_path / "elsewhere"
    other.mkdir()
    with pytest.raises(report.ReportError, match="no runs yet"):  # only the checkout's default folder falls back
        report.open_run(None, runs_dir=other)


def _run_figures(lv):
    return {"throughput": report.throughput_figure(lv, report.load_reference()), "speedup": report.speedup_figure(lv),
            "envelope": report.envelope_figure(lv), "latency": report.latency_figure(lv),
            "pareto": report.pareto_figure(lv, 50, 20.0), "speculation": report.speculation_figure(lv)}


def test_every_figure_says_in_words_what_it_shows_from_its_data():
    import matplotlib.pyplot as plt

    alts = {name: report.alt_of(fig) for name, fig in _run_figures(_levels()).items()}
    for name, text in alts.items():
        assert text and all(arm in text for arm in THROUGHPUT), (name, text)
    assert "eagle3 above baseline up to C=4, below baseline from C=16" in alts["throughput"]
    assert "seed's measurements for baseline and eagle3" in alts["throughput"]
    assert "eagle3: 1.50x at C=1 to 0.44x at C=64, above 1 up to C=4, below 1 from C=16" in alts["speedup"]
    assert "eagle3 0.44 at C=64" in alts["envelope"]
    assert "Pareto front: baseline at C=64" in alts["pareto"] and "TPOT SLO of 20 ms" in alts["pareto"]
    assert "dynamic: 1.00 of steps speculated at C=1, 0.02 at C=64" in alts["speculation"]
    # Another run's numbers give another text: EAGLE-3 losing everywhere is said so.
    losing = {"baseline": {1: 100.0, 8: 500.0}, "eagle3": {1: 90.0, 8: 300.0}}
    text = report.alt_of(report.throughput_figure(_levels(throughput=losing, policy=POLICY)))
    assert "eagle3 below baseline at every level" in text and "dynamic" not in text
    # A compared run beside this one: each run's crossover told apart by name.
    both = report.level_table(pd.concat([_rows(), _rows(run_id="r2", throughput=losing, policy=POLICY)]))
    text = report.alt_of(report.speedup_figure(both))
    assert "Runs r1 and r2 in different line styles" in text
    assert "In r1: eagle3: 1.50x at C=1" in text and "In r2: eagle3: 0.90x at C=1 to 0.60x at C=8, below 1 at every level" in text
    crossing = {"baseline": {1: 100.0, 2: 100.0, 4: 100.0, 8: 100.0}, "eagle3": {1: 120.0, 2: 90.0, 4: 110.0, 8: 80.0}}
    text = report.alt_of(report.speedup_figure(_levels(throughput=crossing, policy=POLICY)))
    assert "above 1 at C=1, 4; below 1 at C=2, 8" in text, text
    from dynspec.analysis import crossover

    shipped = crossover.load_profiles(None)
    steps = report.alt_of(report.step_cost_figure(shipped))
    assert all(p.name in steps for p in shipped) and "accept length 2, 2.5 and 3" in steps
    plt.close("all")


def test_every_image_of_the_published_report_carries_alt_text_naming_what_it_draws(pub):
    from html.parser import HTMLParser

    from dynspec.analysis import crossover

    class Images(HTMLParser):
        def __init__(self):
            super().__init__()
            self.found: list[tuple[str, dict]] = []

        def handle_starttag(self, tag, attrs):
            if tag in ("img", "svg"):
                self.found.append((tag, dict(attrs)))

    parser = Images()
    parser.feed((pub.report_dir / "report.html").read_text())
    alts = [(a.get("alt") or a.get("aria-label") or "").strip() for _, a in parser.found]
    assert len(alts) >= 7, "six figures of the run and the profiles' step costs"
    assert all(alts) and not [a for a in alts if "No description" in a], alts
    run_alts = [a for a in alts if "concurrency" in a]
    assert len(run_alts) == 6, run_alts
    for text in run_alts:
        assert all(arm in text for arm in ("baseline", "eagle3", "dynamic")), text
    steps = next(a for a in alts if a.startswith("Speculative over plain step time"))
    assert all(p.name in steps for p in crossover.load_profiles(None)), steps

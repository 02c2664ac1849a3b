"""`dynspec tune`: the cutoff it picks, what it writes for each engine, and what it refuses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynspec.cli import main
from dynspec.policy import build_policy
from dynspec.results import write_table
from dynspec.analysis.tune import Level, TuneConfig, TuneError, choose_cutoff, score, tune


def sweep(path: Path, arms: dict[str, dict[int, float]], *, policies=None, profile="", extra=()) -> Path:
    """A results file: arms {name: {concurrency: output tok/s}}; extra rows appended as given."""
    policies = policies or {"baseline": "none", "eagle3": "always"}
    rows = []
    for arm, levels in arms.items():
        for c, v in levels.items():
            rows.append(dict(run_id="t", arm=arm, policy=policies.get(arm, arm), backend="sim", profile=profile,
                             concurrency=c, repeat=0, completed=50, failed=0, output_throughput=v))
    rows.extend(extra)
    return write_table(rows, path)


CROSS = {"baseline": {1: 90.0, 8: 500.0, 16: 800.0, 32: 1200.0, 64: 1500.0},
         "eagle3": {1: 180.0, 8: 700.0, 16: 820.0, 32: 1000.0, 64: 1100.0}}


def run_tune(path, **kw) -> dict:
    return tune(TuneConfig(results=path, **kw))


def test_crossover_in_the_middle(tmp_path):
    rep = run_tune(sweep(tmp_path / "r.csv", CROSS), num_steps=3)
    assert rep["cutoff"] == 16
    assert rep["cutoff_range"] == {"low": 16, "high": 31}
    assert [lv["speculates"] for lv in rep["levels"]] == [True, True, True, False, False]
    assert [lv["modelled"] for lv in rep["levels"]] == [180.0, 700.0, 820.0, 1200.0, 1500.0]
    assert all(lv["shortfall"] == 0 for lv in rep["levels"])
    t = rep["targets"]
    assert t["sglang-adaptive"]["config"] == {"1": {"candidate_steps": [3]}, "17": {"candidate_steps": [0]}}
    assert t["vllm"]["config"]["num_speculative_tokens_per_batch_size"] == [[1, 16, 3], [17, 1024, 0]]
    assert t["trtllm"]["config"] == {"max_concurrency": 16, "max_draft_len": 3}
    assert t["trtllm"]["alternative"]["draft_len_schedule"] == {"16": 3}
    assert t["threshold"]["config"] == "threshold:on=16,off=16,dwell=16"
    # The dynspec spec really speculates up to 16 and not above.
    pol = build_policy(t["threshold"]["config"])
    assert pol.decide(16) is True
    assert build_policy(t["threshold"]["config"]).decide(17) is False


def test_vllm_schedule_matches_its_documented_rules(tmp_path):
    """Inclusive (start, end, K) ranges, first starting at 1, no overlap, K >= 0."""
    sched = run_tune(sweep(tmp_path / "r.csv", CROSS), num_steps=4, max_batch_size=256)["targets"]["vllm"]["config"]
    ranges = sched["num_speculative_tokens_per_batch_size"]
    assert ranges[0][0] == 1 and ranges[-1][1] == 256
    for (_s0, e0, _), (s1, _, _) in zip(ranges, ranges[1:]):
        assert s1 == e0 + 1
    dense = {b: k for s, e, k in ranges for b in range(s, e + 1)}
    assert all(dense[b] == 4 for b in range(1, 17)) and all(dense[b] == 0 for b in range(17, 257))


def test_eagle3_always_loses_never_speculates(tmp_path):
    seed = {"baseline": {1: 92.6, 30: 711.0, 70: 780.0}, "eagle3": {1: 77.5, 30: 299.5, 70: 340.0}}
    rep = run_tune(sweep(tmp_path / "r.csv", seed), num_steps=3)
    assert rep["cutoff"] == 0
    assert [lv["modelled"] for lv in rep["levels"]] == [92.6, 711.0, 780.0]
    t = rep["targets"]
    for engine in ("sglang-adaptive", "vllm", "trtllm"):
        assert t[engine]["config"] is None and "lost at every measured level" in t[engine]["refused"]
    assert t["threshold"]["config"] == "never"


def test_eagle3_always_wins_says_the_top_is_unmeasured(tmp_path):
    wins = {"baseline": {1: 90.0, 8: 400.0, 64: 1000.0}, "eagle3": {1: 200.0, 8: 700.0, 64: 1100.0}}
    rep = run_tune(sweep(tmp_path / "r.csv", wins), num_steps=5)
    assert rep["cutoff"] == 64 and rep["cutoff_range"]["high"] is None
    assert rep["targets"]["sglang-adaptive"]["config"]["65"] == {"candidate_steps": [0]}
    assert any("unmeasured" in n for n in rep["targets"]["sglang-adaptive"]["notes"])


def test_a_single_cutoff_cannot_follow_two_crossings_and_says_what_it_costs(tmp_path):
    zigzag = {"baseline": {1: 100.0, 8: 500.0, 16: 700.0, 32: 900.0},
              "eagle3": {1: 150.0, 8: 450.0, 16: 1000.0, 32: 800.0}}
    rep = run_tune(sweep(tmp_path / "r.csv", zigzag), num_steps=3)
    # Speculating through 16 loses 10% at C=8 but gains 43% at C=16: the mean ratio prefers it.
    assert rep["cutoff"] == 16
    by_c = {lv["concurrency"]: lv for lv in rep["levels"]}
    assert by_c[8]["modelled"] == 450.0 and by_c[8]["shortfall_pct"] == pytest.approx(10.0)
    assert by_c[16]["shortfall"] == 0 and by_c[32]["modelled"] == 900.0
    # The min-ratio objective weighs the worst level instead: C=8's 10% loss vs never's 33% at 16.
    assert run_tune(sweep(tmp_path / "r.csv", zigzag), objective="min-ratio")["cutoff"] == 16
    assert run_tune(sweep(tmp_path / "r.csv", zigzag), objective="total")["cutoff"] == 16


levels_strategy = st.lists(
    st.tuples(st.floats(1.0, 5000.0), st.floats(1.0, 5000.0)), min_size=1, max_size=7)


@settings(max_examples=200, deadline=None)
@given(levels_strategy, st.sampled_from(["mean-ratio", "min-ratio", "total"]))
def test_the_chosen_cutoff_is_as_good_as_any_integer_cutoff(values, objective):
    cs = [1, 2, 4, 8, 16, 32, 64][: len(values)]
    levels = [Level(c, b, s) for c, (b, s) in zip(cs, values)]
    best = choose_cutoff(levels, objective)
    brute = max(score(levels, t, objective) for t in range(0, cs[-1] + 2))
    assert score(levels, best, objective) == pytest.approx(brute, rel=1e-12)
    assert best == 0 or best in cs


def test_missing_arm_is_refused_in_one_line(tmp_path, capsys):
    only = sweep(tmp_path / "r.csv", {"baseline": CROSS["baseline"]})
    with pytest.raises(TuneError, match="no always-speculate arm"):
        run_tune(only)
    out = tmp_path / "out"
    assert main(["tune", "--results", str(only), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dynspec tune:") and "--spec-arm" in err and "\n" not in err
    assert not out.exists()


def test_gaps_and_failed_rows_are_reported_not_guessed(tmp_path):
    bad = dict(run_id="t", arm="eagle3", policy="always", backend="sim", profile="", concurrency=32, repeat=0,
               completed=0, failed=0, output_throughput=math.nan, error="server died")
    arms = {"baseline": CROSS["baseline"], "eagle3": {c: v for c, v in CROSS["eagle3"].items() if c != 32}}
    arms["eagle3"].pop(64)
    rep = run_tune(sweep(tmp_path / "r.csv", arms, extra=[bad]), num_steps=3)
    assert [lv["concurrency"] for lv in rep["levels"]] == [1, 8, 16]
    assert rep["gaps"] == [{"concurrency": 32, "missing": ["eagle3"]}, {"concurrency": 64, "missing": ["eagle3"]}]
    assert any("server died" in n for n in rep["notes"])
    # Spec won at every level both arms reached: the cutoff stops there and says the rest is unmeasured.
    assert rep["cutoff"] == 16 and rep["cutoff_range"]["high"] is None


def test_no_common_level_is_refused(tmp_path):
    path = sweep(tmp_path / "r.csv", {"baseline": {1: 90.0}, "eagle3": {8: 700.0}})
    with pytest.raises(TuneError, match="no concurrency has usable rows of both"):
        run_tune(path)


def test_unknown_num_steps_refuses_what_needs_it(tmp_path):
    rep = run_tune(sweep(tmp_path / "r.csv", CROSS))
    assert rep["num_steps"] is None
    t = rep["targets"]
    assert t["sglang-adaptive"]["config"] is None and "--num-steps" in t["sglang-adaptive"]["refused"]
    assert t["vllm"]["config"] is None and "--num-steps" in t["vllm"]["refused"]
    assert t["trtllm"]["config"] == {"max_concurrency": 16} and "alternative" not in t["trtllm"]
    assert t["threshold"]["config"] == "threshold:on=16,off=16,dwell=16"


def test_num_steps_comes_from_the_rows_profile(tmp_path):
    rep = run_tune(sweep(tmp_path / "r.csv", CROSS, profile="seed-blackwell"))
    assert rep["num_steps"] == 3  # seed-blackwell.yaml: speculative.num_steps
    assert any("topk=4" in n for n in rep["notes"])  # its tree is not what the engines' schedules run


def test_two_spec_arms_need_a_choice(tmp_path):
    arms = {**CROSS, "eagle3-v2": {c: v * 1.1 for c, v in CROSS["eagle3"].items()}}
    path = sweep(tmp_path / "r.csv", arms, policies={"baseline": "none", "eagle3": "always", "eagle3-v2": "always"})
    with pytest.raises(TuneError, match="several arms look like the always-speculate arm"):
        run_tune(path)
    rep = run_tune(path, spec_arm="eagle3-v2", num_steps=3)
    assert rep["arms"] == {"baseline": "baseline", "spec": "eagle3-v2"}
    assert rep["levels"][2]["spec"] == pytest.approx(902.0)


def test_repeats_are_averaged_and_overlap_is_flagged(tmp_path):
    extra = [dict(run_id="t", arm=a, policy=p, backend="sim", profile="", concurrency=16, repeat=1,
                  completed=50, failed=0, output_throughput=v)
             for a, p, v in (("baseline", "none", 840.0), ("eagle3", "always", 780.0))]
    rep = run_tune(sweep(tmp_path / "r.csv", CROSS, extra=extra), num_steps=3)
    lv16 = next(lv for lv in rep["levels"] if lv["concurrency"] == 16)
    assert lv16["baseline"] == pytest.approx(820.0) and lv16["spec"] == pytest.approx(800.0)
    assert lv16["repeats"] == [2, 2]
    assert any("C=16" in n and "within noise" in n for n in rep["notes"])
    assert rep["cutoff"] == 8  # on the mean, plain now wins at 16


def test_cli_json_and_out_files(tmp_path, capsys):
    path = sweep(tmp_path / "r.csv", CROSS)
    out = tmp_path / "tuned"
    assert main(["tune", "--results", str(path), "--num-steps", "3", "--json", "--out", str(out),
                 "--target", "sglang-adaptive", "--target", "threshold"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert set(rep["targets"]) == {"sglang-adaptive", "threshold"}
    assert json.loads((out / "tune.json").read_text()) == rep
    assert json.loads((out / "sglang_adaptive_config.json").read_text()) == rep["targets"]["sglang-adaptive"]["config"]
    saved = (out / "tune_config.yaml").read_text()
    assert "num_steps: 3" in saved and "sglang-adaptive" in saved
    assert not list(out.glob("*.tmp"))


def test_cli_table(tmp_path, capsys):
    assert main(["tune", "--results", str(sweep(tmp_path / "r.csv", CROSS)), "--num-steps", "3"]) == 0
    text = capsys.readouterr().out
    assert "speculate while batch <= 16" in text and "any cutoff 16..31 models the same" in text
    assert '{"1": {"candidate_steps": [3]}, "17": {"candidate_steps": [0]}}' in text


@pytest.mark.parametrize("argv, needle", [
    (["--num-steps", "0"], "--num-steps"),
    (["--objective", "best"], "invalid choice"),
])
def test_cli_bad_arguments(tmp_path, capsys, argv, needle):
    path = sweep(tmp_path / "r.csv", CROSS)
    try:
        code = main(["tune", "--results", str(path), *argv])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    assert code == 2
    assert needle in capsys.readouterr().err


def test_missing_results_file(tmp_path, capsys):
    assert main(["tune", "--results", str(tmp_path / "nope.csv")]) == 2
    assert "no such results file" in capsys.readouterr().err


def test_on_a_real_simulated_sweep(tmp_path):
    """A `dynspec sweep --backend sim` run with a profile whose crossover lies inside the levels."""
    import yaml

    from dynspec.live.config import load_config
    from dynspec.live.sweep import run_sweep

    profile = {
        "name": "crossing", "hardware": "synthetic", "provenance": {"kind": "derived", "source": "test_tune"},
        "speculative": {"num_steps": 3, "topk": 1, "num_draft_tokens": 4},
        "acceptance": {"accept_length": 2.5},
        # Plain steps barely grow with batch; speculative steps grow fast: speculation pays only small.
        "steps": {"batch_size": [1, 64], "plain_ms": [10.0, 16.0], "spec_ms": [14.0, 60.0]},
    }
    (tmp_path / "crossing.yaml").write_text(yaml.safe_dump(profile))
    cfg_path = tmp_path / "sweep.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "name": "crossing", "backend": "sim", "profile": str(tmp_path / "crossing.yaml"),
        "concurrency": [1, 4, 16, 48], "num_prompts": 24, "input_len": 64, "output_len": 48,
        "arms": [{"name": "baseline", "sim_arm": "baseline"}, {"name": "eagle3", "sim_arm": "eagle3"}],
    }))
    res = run_sweep(load_config(cfg_path), runs_dir=tmp_path / "runs", run_id="x", progress=False)
    assert not res.failed
    rep = run_tune(res.run_dir / "results.csv")
    assert rep["num_steps"] == 3  # read from the profile the rows name
    by_c = {lv["concurrency"]: lv for lv in rep["levels"]}
    assert by_c[1]["best_static"] == "spec" and by_c[48]["best_static"] == "plain"
    assert 1 <= rep["cutoff"] < 48
    # Winners are monotone in C here, so one cutoff reaches the envelope everywhere.
    assert all(lv["shortfall"] == 0 for lv in rep["levels"])
    from dynspec.results import read_table

    df = read_table(res.run_dir / "results.csv")
    for lv in rep["levels"]:
        got = df[(df.arm == "eagle3") & (df.concurrency == lv["concurrency"])]["output_throughput"].iloc[0]
        assert lv["spec"] == pytest.approx(got)

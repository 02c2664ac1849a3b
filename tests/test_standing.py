"""dynspec.analysis.standing: a switching arm judged round by round against the envelope."""

from __future__ import annotations

import pandas as pd
import pytest

from dynspec.analysis.standing import main, standing


def _results(tmp_path=None) -> pd.DataFrame:
    rows = []
    # round 1 finds the whole GPU 30% slower, and the static arms in the other order
    for rep, tput in enumerate(({"baseline": 100.0, "eagle3": 150.0, "dynspec-goodput": 150.0, "threshold-8": 140.0},
                                {"baseline": 70.0, "eagle3": 60.0, "dynspec-goodput": 63.0, "threshold-8": 70.0})):
        for arm, x in tput.items():
            policy = {"baseline": "none", "eagle3": "always"}.get(arm, "goodput")
            rows.append(dict(run_id="r", arm=arm, policy=policy, backend="live", concurrency=8, repeat=rep,
                             completed=10, failed=0, output_throughput=x, error=""))
    df = pd.DataFrame(rows)
    if tmp_path is not None:
        df.to_csv(tmp_path / "results.csv", index=False)
    return df


def test_each_round_is_judged_against_its_own_envelope():
    # level means first would give 106.5 / 110 = 0.968; round by round it is 1.0 and 0.9
    row = standing(_results(), "dynspec-goodput").iloc[0]
    assert row["rounds"] == 2
    assert row["of_envelope"] == pytest.approx(0.95) and row["worst_round"] == pytest.approx(0.9)
    assert row["spec_over_plain"] == pytest.approx((1.5 + 60 / 70) / 2)
    assert row["over_threshold-8"] == pytest.approx((150 / 140 + 0.9) / 2)


def test_sim_over_live_compares_level_means():
    sim = _results().assign(output_throughput=lambda d: d["output_throughput"] * 1.1)
    assert standing(_results(), "dynspec-goodput", sim).iloc[0]["sim_over_live"] == pytest.approx(1.1)


def test_the_command_prints_a_row_per_level_and_refuses_an_unknown_arm(tmp_path, capsys):
    _results(tmp_path)
    assert main([str(tmp_path)]) == 0
    assert "of_envelope" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no arm 'goodptu' in the run"):
        main([str(tmp_path), "--arm", "goodptu"])


def test_two_plain_servers_give_the_noise_floor_of_a_round():
    df = _results()
    twin = df[df["arm"] == "baseline"].assign(arm="baseline-2")
    twin["output_throughput"] = [90.0, 77.0]  # 0.9 and 1.1 of its twin
    row = standing(pd.concat([df, twin]), "dynspec-goodput").iloc[0]
    assert row["twin_spread"] == pytest.approx((100 / 90 + 77 / 70) / 2)
    assert row["worst_twin_spread"] == pytest.approx(100 / 90)
    # the envelope takes the faster of the two plain servers
    assert row["worst_round"] == pytest.approx(63 / 77)
    assert "twin_spread" not in standing(df, "dynspec-goodput").columns


def test_a_skipped_arm_is_no_twin_and_no_envelope(tmp_path, capsys):
    df = _results()
    other = df[df["arm"] == "baseline"].assign(arm="baseline-torch", output_throughput=[200.0, 20.0])
    pd.concat([df, other]).to_csv(tmp_path / "results.csv", index=False)
    assert main([str(tmp_path), "--skip", "baseline-torch"]) == 0
    out = capsys.readouterr().out
    assert "twin_spread" not in out and "0.950" in out  # as if the arm were not there
    assert main([str(tmp_path)]) == 0
    assert "twin_spread" in capsys.readouterr().out  # counted, it is taken for a second plain server
    with pytest.raises(SystemExit, match="--skip baseline-3: no such arm"):
        main([str(tmp_path), "--skip", "baseline-3"])


def _rounds(ratios: list[float]) -> pd.DataFrame:
    """Rounds at C=16 where goodput measures `ratios` of threshold-16 (and 1.1x of threshold-32)."""
    rows = []
    for rep, r in enumerate(ratios):
        for arm, x in (("baseline", 100.0), ("eagle3", 120.0), ("threshold-16", 120.0),
                       ("threshold-32", 120.0 * r / 1.1), ("dynspec-goodput", 120.0 * r)):
            policy = {"baseline": "none", "eagle3": "always"}.get(arm, "goodput")
            rows.append(dict(run_id="r", arm=arm, policy=policy, backend="live", concurrency=16, repeat=rep,
                             completed=10, failed=0, output_throughput=x, error=""))
    return pd.DataFrame(rows)


def test_the_rounds_settle_within_the_margin_only_when_two_standard_errors_do():
    tight = standing(_rounds([0.99, 0.995, 1.0]), "dynspec-goodput").iloc[0]
    assert tight["best_other"] == "threshold-16"  # the arm it trails most
    assert tight["vs_best"] == pytest.approx(0.995)
    assert tight["vs_best_se"] == pytest.approx(0.005 / 3 ** 0.5)
    assert tight["verdict"] == "met"
    behind = standing(_rounds([0.95, 0.955, 0.96]), "dynspec-goodput").iloc[0]
    assert behind["verdict"] == "short"
    # a 3% mean deficit with rounds 0.88-1.05 apart settles nothing; (2 sd / 0.02)^2 = 72.3 rounds would
    loose = standing(_rounds([0.88, 0.97, 1.05]), "dynspec-goodput").iloc[0]
    assert loose["verdict"] == "unresolved" and loose["rounds_for_margin"] == 73
    assert standing(_rounds([0.88, 0.97, 1.05]), "dynspec-goodput", margin=0.15).iloc[0]["verdict"] == "met"
    assert standing(_rounds([0.9]), "dynspec-goodput").iloc[0]["verdict"] == "unresolved"  # one round
    with pytest.raises(SystemExit, match="--margin must lie between 0 and 1"):
        standing(_rounds([0.9, 1.0]), "dynspec-goodput", margin=2.0)


def test_the_steady_window_judges_the_levels_when_asked(tmp_path, capsys):
    # the whole level says goodput trails the threshold by 10%; the steady window, that it is level with it
    df = _rounds([0.9, 0.9, 0.9])
    df["steady_output_throughput"] = df["output_throughput"].where(df["arm"] != "dynspec-goodput", 120.0)
    assert standing(df, "dynspec-goodput").iloc[0]["verdict"] == "short"
    steady = standing(df, "dynspec-goodput", metric="steady_output_throughput").iloc[0]
    assert steady["vs_best"] == pytest.approx(1.0) and steady["of_envelope"] == pytest.approx(1.0)
    df.to_csv(tmp_path / "results.csv", index=False)
    assert main([str(tmp_path), "--metric", "steady_output_throughput"]) == 0
    assert " met" in capsys.readouterr().out
    _results(tmp_path)  # a run from before the steady window
    with pytest.raises(SystemExit, match="the run has no steady_output_throughput"):
        main([str(tmp_path), "--metric", "steady_output_throughput"])


def test_a_run_of_switching_arms_alone_is_judged_against_them(tmp_path):
    # One patched process taking policies in turn has no plain or EAGLE-3 server: no envelope,
    # the ratios to the other switching arms round by round.
    df = _results()
    df = df[~df["arm"].isin(["baseline", "eagle3"])]
    row = standing(df, "dynspec-goodput").iloc[0]
    assert "of_envelope" not in row.index and row["rounds"] == 2
    assert row["over_threshold-8"] == pytest.approx((150 / 140 + 0.9) / 2)
    assert row["best_other"] == "threshold-8"
    with pytest.raises(SystemExit, match="or another switching arm"):
        standing(df[df["arm"] == "dynspec-goodput"], "dynspec-goodput")

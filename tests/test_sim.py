"""Closed-loop simulation, the shipped profiles' fits, and the `dynspec sim` / `dynspec fit` CLIs."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from dynspec.cli import main
from dynspec.sim.fit import FitError, fit, load_fit_spec
from dynspec.sim.profile import load_profile, parse_profile, shipped_profiles
from dynspec.results import RESULT_COLUMNS, read_table
from dynspec.sim.run import SIM_ARMS, arm_policy_spec, default_num_prompts, run_sim, simulate_level


def crossover_profile():
    """Speculation pays below batch ~16 and loses above it."""
    return parse_profile({
        "name": "crossover",
        "speculative": {"num_steps": 3},
        "acceptance": {"accept_length": 2.5},
        "steps": {"batch_size": [1, 16, 64], "plain_ms": [10.0, 12.0, 30.0], "spec_ms": [14.0, 28.0, 110.0]},
        "prefill": {"fixed_ms": 2.0, "per_token_ms": 0.01},
        "provenance": {"kind": "derived", "source": "test"},
    })


def test_arms_map_to_policies():
    assert SIM_ARMS == ("baseline", "eagle3", "dynamic")
    assert arm_policy_spec("baseline") is None
    assert arm_policy_spec("eagle3") == "always"
    assert arm_policy_spec("dynamic") == "goodput"
    assert arm_policy_spec("policy:threshold:32") == "threshold:32"
    for bad in ("eagle", "policy:nope", "policy:threshold:x", ""):
        with pytest.raises(ValueError, match="arm"):
            arm_policy_spec(bad)


def test_default_num_prompts():
    assert [default_num_prompts(c) for c in (1, 10, 11, 128)] == [50, 50, 55, 640]


def test_baseline_at_c1_is_exactly_prefill_plus_plain_steps():
    p = crossover_profile()
    m, recs = simulate_level(p, "baseline", 1, num_prompts=4, input_len=300, output_len=20)
    per_request = p.prefill.time_s(300) + 19 * p.plain_time(1)
    assert m["completed"] == 4 and m["failed"] == 0
    assert m["duration_s"] == pytest.approx(4 * per_request)
    assert m["output_throughput"] == pytest.approx(80 / (4 * per_request))
    assert m["mean_ttft_ms"] == pytest.approx(1000 * p.prefill.time_s(300))
    assert m["mean_itl_ms"] == pytest.approx(1000 * p.plain_time(1))
    assert math.isnan(m["accept_length"]) and m["spec_step_fraction"] == 0 and m["switches"] == 0


def test_closed_loop_keeps_at_most_c_in_flight_and_serves_every_prompt():
    p = crossover_profile()
    m, recs = simulate_level(p, "eagle3", 3, num_prompts=17, input_len=64, output_len=40, seed=2)
    assert len(recs) == m["completed"] == 17
    assert all(r.output_tokens == 40 and r.input_tokens == 64 for r in recs)
    events = sorted([(r.start, 1) for r in recs] + [(r.end, -1) for r in recs], key=lambda e: (e[0], e[1]))
    level, peak = 0, 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak == 3
    assert m["spec_step_fraction"] == 1.0 and m["accept_length"] > 1.0
    assert all(len(r.itls) == 39 for r in recs)  # a chunk of k tokens counts k gaps


def test_simulation_is_deterministic_per_seed():
    p = crossover_profile()
    a, _ = simulate_level(p, "dynamic", 8, num_prompts=30, output_len=64, seed=5)
    b, _ = simulate_level(p, "dynamic", 8, num_prompts=30, output_len=64, seed=5)
    c, _ = simulate_level(p, "dynamic", 8, num_prompts=30, output_len=64, seed=6)
    assert a == b
    assert a != c


def test_dynamic_arm_speculates_where_it_pays_and_not_where_it_loses():
    p = crossover_profile()
    small, _ = simulate_level(p, "dynamic", 2, num_prompts=20, output_len=128)
    large, _ = simulate_level(p, "dynamic", 64, num_prompts=320, output_len=128)
    assert small["spec_step_fraction"] > 0.9
    assert large["spec_step_fraction"] < 0.1
    for m, c in ((small, 2), (large, 64)):
        b, _ = simulate_level(p, "baseline", c, num_prompts=m["completed"], output_len=128)
        e, _ = simulate_level(p, "eagle3", c, num_prompts=m["completed"], output_len=128)
        assert m["output_throughput"] >= 0.95 * max(b["output_throughput"], e["output_throughput"])


def test_seed_blackwell_reproduces_the_seeds_six_numbers_within_3_percent():
    p = load_profile("seed-blackwell")
    targets = {("baseline", 1): 92.6, ("baseline", 30): 711.0, ("baseline", 70): 780.0,
               ("eagle3", 1): 77.5, ("eagle3", 30): 299.5, ("eagle3", 70): 340.0}
    for (arm, c), want in targets.items():
        m, _ = simulate_level(p, arm, c)  # 1024 in / 256 out, max(5C, 50) prompts: the fit's workload
        assert m["output_throughput"] == pytest.approx(want, rel=0.03), (arm, c)
    assert p.provenance.kind == "fitted"
    assert p.provenance.command.startswith("dynspec fit configs/fits/seed-blackwell.yaml")
    assert any("accept length" in a for a in p.provenance.assumptions)


def test_shipped_profiles_include_one_where_speculation_wins_to_a_large_batch():
    assert {"seed-blackwell", "h100-llama31-8b-eagle3"} <= set(shipped_profiles())
    p = load_profile("h100-llama31-8b-eagle3")
    assert "EAGLE-3" in p.provenance.source and p.provenance.kind == "derived"
    for c in (1, 64):
        b, _ = simulate_level(p, "baseline", c, input_len=128)
        e, _ = simulate_level(p, "eagle3", c, input_len=128)
        assert e["output_throughput"] > 1.3 * b["output_throughput"]


TINY_FIT_SPEC = """
name: tiny
source: a test
speculative: {num_steps: 2}
acceptance: {accept_length: 2.0}
prefill: {fixed_ms: 1.0, per_token_ms: 0.001}
workload: {input_len: 32, output_len: 32, num_prompts: 8}
targets:
  - {concurrency: 1, baseline: 100.0, eagle3: 120.0}
  - {concurrency: 4, baseline: 300.0, eagle3_speedup: 0.9}
assumptions: ["made up"]
"""


def test_fit_converges_and_records_its_command(tmp_path):
    spec_path = tmp_path / "fit.yaml"
    spec_path.write_text(TINY_FIT_SPEC)
    spec = load_fit_spec(spec_path)
    profile, table = fit(spec, command="dynspec fit X --out Y")
    assert all(abs(r["error"]) < 0.03 for r in table) and len(table) == 4
    assert profile.provenance.command == "dynspec fit X --out Y"
    assert profile.provenance.assumptions == ["made up"]
    b4 = next(r for r in table if r == {**r, "arm": "baseline", "concurrency": 4})
    e4 = next(r for r in table if r == {**r, "arm": "eagle3", "concurrency": 4})
    assert e4["simulated"] / b4["simulated"] == pytest.approx(0.9, rel=0.03)

    out = tmp_path / "tiny.yaml"
    assert main(["fit", str(spec_path), "--out", str(out)]) == 0
    loaded = load_profile(out)
    assert loaded.provenance.command == f"dynspec fit {spec_path} --out {out}"
    assert loaded.steps[0].batch_size == [1, 4]
    assert loaded.catch_up_time(1) == 0.0  # no catch_up_fraction: no extend_ms

    # catch_up_fraction: extend_ms is that share of each plain knot, and the fitted arms (which never
    # take a plain step inside a speculative server) come out the same.
    spec_path.write_text(spec_path.read_text() + "catch_up_fraction: 0.05\n")
    with_cu, table2 = fit(load_fit_spec(spec_path))
    assert with_cu.steps[0].extend_ms == [round(0.05 * x, 4) for x in with_cu.steps[0].plain_ms]
    assert with_cu.steps[0].plain_ms == profile.steps[0].plain_ms and table2 == table


def test_fit_spec_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsource: s\nspeculative: {}\nacceptance: {accept_length: 2}\nprefill: {}\n"
                   "targets: [{concurrency: 4, baseline: 1, eagle3: 1}, {concurrency: 2, baseline: 1, eagle3: 1}]\n")
    with pytest.raises(FitError, match="increasing order"):
        load_fit_spec(bad)
    with pytest.raises(FitError, match="no such fit spec"):
        load_fit_spec(tmp_path / "missing.yaml")


def test_run_sim_rows_follow_the_results_schema():
    p = crossover_profile()
    rows = run_sim(p, ["baseline", "policy:threshold:4"], [1, 4], num_prompts=6, output_len=16, run_id="r1")
    assert [(r["arm"], r["concurrency"]) for r in rows] == [
        ("baseline", 1), ("baseline", 4), ("policy:threshold:4", 1), ("policy:threshold:4", 4)]
    for r in rows:
        assert list(r) == RESULT_COLUMNS
        assert r["backend"] == "sim" and r["profile"] == "crossover" and r["run_id"] == "r1"
        assert r["completed"] == 6 and r["total_output_tokens"] == 96
    assert rows[0]["policy"] == "none" and rows[2]["policy"] == "threshold:4"
    with pytest.raises(ValueError, match="unknown arm"):
        run_sim(p, ["baseline", "bogus"], [1])


def test_sim_cli_writes_table_and_config(tmp_path, capsys):
    out = tmp_path / "r.parquet"
    rc = main(["sim", "--profile", "seed-blackwell", "--arm", "baseline", "--arm", "eagle3",
               "--concurrency", "1,4", "--num-prompts", "4", "--output-len", "16", "--out", str(out)])
    assert rc == 0
    df = read_table(out)
    assert len(df) == 4 and set(df["arm"]) == {"baseline", "eagle3"}
    cfg = json.loads((tmp_path / "r.parquet.config.json").read_text())
    assert cfg["config"]["concurrencies"] == [1, 4] and cfg["profile"]["name"] == "seed-blackwell"
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("argv,needle", [
    (["--arm", "eagle4"], "unknown arm 'eagle4'"),
    (["--concurrency", "1,x"], "'x' is not an integer"),
    (["--concurrency", "0"], "concurrency"),
    (["--profile", "no-such-profile"], "no such profile"),
    (["--out", "r.txt"], ".csv or .parquet"),
])
def test_sim_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, needle):
    monkeypatch.chdir(tmp_path)
    base = {"--profile": "seed-blackwell", "--concurrency": "1", "--out": "r.csv"}
    args = ["sim"]
    for k, v in base.items():
        if k not in argv:
            args += [k, v]
    rc = main(args + argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and needle in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_fit_writes_a_kv_only_catch_up_and_a_resume(tmp_path):
    """resume_fraction: the catch-up is the KV-only one (catchup_ms) and a switch pays resume_ms;
    catch_up_from: both shares per knot from a calibrated profile, said so in the assumptions."""
    spec_text = TINY_FIT_SPEC
    spec_path = tmp_path / "fit.yaml"
    spec_path.write_text(spec_text + "catch_up_fraction: 0.01\nresume_fraction: 0.05\n")
    p, table = fit(load_fit_spec(spec_path))
    t = p.steps[0]
    assert t.extend_ms is None and t.catchup_ms == [round(0.01 * x, 4) for x in t.plain_ms]
    assert t.resume_ms == [round(0.05 * x, 4) for x in t.plain_ms]
    assert p.resume_time(1) == pytest.approx(t.resume_ms[0] / 1000)
    # a calibrated source: 2% / 10% at batch 1, 1% / 5% at batch 4 (its plain 10 -> 20 ms)
    src = tmp_path / "src.yaml"
    src.write_text(yaml.safe_dump({
        "name": "measured-src", "hardware": "a GPU", "acceptance": {"accept_length": 2.0},
        "steps": {"batch_size": [1, 4], "plain_ms": [10.0, 20.0], "spec_ms": [12.0, 30.0],
                  "catchup_ms": [0.2, 0.2], "resume_ms": [1.0, 1.0]},
        "provenance": {"kind": "measured", "source": "test", "date": "2026-11-30"}}))
    spec_path.write_text(spec_text + f"catch_up_from: {src}\n")
    q, table2 = fit(load_fit_spec(spec_path))
    u = q.steps[0]
    assert u.catchup_ms == [round(f * x, 4) for f, x in zip((0.02, 0.01), u.plain_ms)]
    assert u.resume_ms == [round(f * x, 4) for f, x in zip((0.1, 0.05), u.plain_ms)]
    assert u.plain_ms == t.plain_ms and table2 == table  # the fitted arms never pay either
    note = q.provenance.assumptions[-1]
    assert "2.00%, 1.00%" in note and "10.00%, 5.00%" in note and "measured-src" in note and "2026-11-30" in note
    # two context tables: the workload's mean context (48) is below both, so the first's shares
    two = yaml.safe_load(src.read_text())
    t0 = {**two["steps"], "context_len": 1024}
    two["steps"] = [t0, {**t0, "context_len": 4096, "catchup_ms": [0.9, 0.9], "resume_ms": [3.0, 3.0]}]
    src.write_text(yaml.safe_dump(two))
    assert fit(load_fit_spec(spec_path))[0].steps[0].catchup_ms == u.catchup_ms
    assert "context 1024" in fit(load_fit_spec(spec_path))[0].provenance.assumptions[-1]
    spec_path.write_text(spec_text + f"catch_up_from: {src}\ncatch_up_fraction: 0.01\n")
    with pytest.raises(FitError, match="catch_up_from or catch_up_fraction"):
        load_fit_spec(spec_path)
    old = yaml.safe_load(src.read_text())
    old["steps"] = [{k: v for k, v in t.items() if k not in ("catchup_ms", "resume_ms")} for t in old["steps"]]
    src.write_text(yaml.safe_dump(old))  # a profile calibrated before the KV-only catch-up
    spec_path.write_text(spec_text + f"catch_up_from: {src}\n")
    with pytest.raises(FitError, match="has no catchup_ms"):
        fit(load_fit_spec(spec_path))

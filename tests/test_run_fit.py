"""`dynspec fit --from-run`: a sweep's own plain and EAGLE-3 arms calibrate the simulator.

The "measured" run here is a simulated sweep of the seed-blackwell profile, so the fit must
recover that profile's step times and acceptance from the results alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dynspec.cli import main
from dynspec.sim.fit import FitError
from dynspec.sim.profile import load_profile
from dynspec.analysis.run_fit import spec_from_run
from dynspec.live.sweep import run_sweep

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runfit")
    data = yaml.safe_load((ROOT / "configs" / "ci-tiny.yaml").read_text())
    data.update(backend="sim", concurrency=[1, 8, 32], num_prompts=64, input_len=512, output_len=64)
    data["arms"][1]["launch"] = ["python", "-m", "sglang.launch_server", "--speculative-num-steps", "3",
                                 "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    cfg = tmp / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    from dynspec.live.config import load_config

    result = run_sweep(load_config(cfg), run_id="measured", runs_dir=tmp / "runs", progress=False, backend="sim")
    assert not result.failed
    return result.run_dir


def test_the_fit_recovers_the_profile_that_produced_the_run(run_dir, tmp_path, capsys):
    out = tmp_path / "fitted.yaml"
    assert main(["fit", "--from-run", str(run_dir), "--catch-up-fraction", "0.04", "--out", str(out)]) == 0
    fitted, source = load_profile(out), load_profile("seed-blackwell")
    assert fitted.name == "measured-fitted" and fitted.provenance.kind == "fitted"
    assert fitted.acceptance.accept_length == pytest.approx(source.acceptance.accept_length, rel=0.03)
    assert (fitted.speculative.num_steps, fitted.speculative.topk) == (3, 1)
    [table] = fitted.steps
    assert table.batch_size == [1, 8, 32]
    for bs, plain, spec in zip(table.batch_size, table.plain_ms, table.spec_ms):
        assert plain == pytest.approx(1000 * source.plain_time(bs), rel=0.1), bs
        assert spec == pytest.approx(1000 * source.spec_time(bs), rel=0.1), bs
    assert table.extend_ms == [round(0.04 * x, 4) for x in table.plain_ms]
    # the spec it fitted is saved beside the profile, and refits to the same step times
    spec_file = tmp_path / "fitted.fit.yaml"
    assert main(["fit", str(spec_file), "--out", str(tmp_path / "again.yaml")]) == 0
    assert load_profile(tmp_path / "again.yaml").steps[0].plain_ms == table.plain_ms
    assert f"dynspec fit --from-run {run_dir}" in fitted.provenance.command
    assert "wrote" in capsys.readouterr().out


def test_the_fit_spec_takes_the_runs_workload_and_measurements(run_dir):
    spec = spec_from_run(run_dir, name="x", accept_length=2.0)
    assert spec.acceptance.accept_length == 2.0 and spec.name == "x"
    assert (spec.workload.input_len, spec.workload.output_len, spec.workload.num_prompts) == (512, 64, 64)
    assert [t.concurrency for t in spec.targets] == [1, 8, 32] and all(t.baseline and t.eagle3 for t in spec.targets)
    assert spec.prefill.per_token_ms > 0 and spec.prefill.fixed_ms == 0
    assert any("given on the command line" in a for a in spec.assumptions)


@pytest.mark.parametrize("argv,message", [
    (["--eagle3-arm", "eagle9"], "no arm 'eagle9' in the run (arms: baseline, eagle3); name the eagle3 arm with --eagle3-arm"),
    (["--baseline-arm", "plain"], "no arm 'plain' in the run"),
    (["--accept-length", "0.5"], "accept length must be above 1 (tokens per request per verify, bonus included), got 0.5"),
    (["--accept-length", "6"], "acceptance.accept_length 6 exceeds 1 + speculative.num_steps = 4"),
])
def test_bad_from_run_input_is_one_line(run_dir, tmp_path, capsys, argv, message):
    out = tmp_path / "p.yaml"
    assert main(["fit", "--from-run", str(run_dir), *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dynspec fit: ") and message in err and err.count("\n") == 1
    assert not out.exists()


def test_from_run_needs_a_run_folder_and_excludes_a_spec(tmp_path, capsys):
    assert main(["fit", "--from-run", str(tmp_path), "--out", str(tmp_path / "p.yaml")]) == 2
    assert "no results.csv (a dynspec sweep's run folder holds both)" in capsys.readouterr().err
    assert main(["fit", "x.yaml", "--from-run", str(tmp_path), "--out", str(tmp_path / "p.yaml")]) == 2
    assert "not both and not neither" in capsys.readouterr().err
    with pytest.raises(FitError, match="share 1 measured level"):
        run = tmp_path / "one"
        run.mkdir()
        (run / "config.yaml").write_text(yaml.safe_dump({"name": "one", "concurrency": [1],
                                                          "arms": [{"name": "baseline"}, {"name": "eagle3"}]}))
        from dynspec.results import write_table

        rows = [{"run_id": "one", "arm": a, "concurrency": 1, "output_throughput": 10.0, "accept_length": 2.0,
                 "median_ttft_ms": 5.0, "error": ""} for a in ("baseline", "eagle3")]
        write_table(rows, run / "results.csv")
        spec_from_run(run)


def test_the_run_config_is_read_as_a_sweep_config(run_dir, tmp_path):
    """Defaults come from SweepConfig, and a config it refuses is one line naming the key."""
    import shutil

    from dynspec.live.config import SweepConfig

    run = shutil.copytree(run_dir, tmp_path / "run")
    data = yaml.safe_load((run / "config.yaml").read_text())
    del data["input_len"]
    (run / "config.yaml").write_text(yaml.safe_dump(data))
    assert spec_from_run(run).workload.input_len == SweepConfig.model_fields["input_len"].default
    (run / "config.yaml").write_text(yaml.safe_dump({**data, "input_len": "long"}))
    with pytest.raises(FitError, match=r"config.yaml: input_len") as err:
        spec_from_run(run)
    assert "\n" not in str(err.value)


def test_the_prefill_is_the_servers_own_timing_where_a_scrape_carries_it(run_dir, tmp_path):
    """A time to first token holds the HTTP path and the wait for a step: on the H200 it was three
    times the prefill forward the patched server timed, and the fit found no step times at all
    (worst error 56%, a negative plain step).  The servers' own figure wins where it exists."""
    import gzip
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    for i, ms in enumerate((12.0, 14.0, 30.0)):
        state = {"dynspec": {"policy": "goodput", "prefill_estimates": {"fixed_ms": ms}}}
        with gzip.open(run / "scrapes" / f"dynspec_c{i}_r0.json.gz", "wt") as f:
            json.dump({"after": {"server_info": {"internal_states": [state]}}}, f)
    spec = spec_from_run(run)
    assert spec.prefill.per_token_ms == pytest.approx(14.0 / 512, rel=1e-3)
    assert any("patched servers' own timing" in a for a in spec.assumptions)
    assert spec_from_run(run_dir).prefill.per_token_ms != pytest.approx(14.0 / 512, rel=0.05)


def test_a_run_of_varied_lengths_and_few_prompts_is_fitted_on_its_own_workload(tmp_path):
    """A run whose random prompts vary in length (output_lens: range) and whose levels hold
    prompts_per_client x C requests: the fit simulates those lengths and level sizes, not a fixed
    length and max(5C, 50) requests, or its step times answer another workload than the one
    measured (on one H100 the simulator's own plain arm came back 0.83-0.93 of live)."""
    data = yaml.safe_load((ROOT / "configs" / "ci-tiny.yaml").read_text())
    data.update(backend="sim", concurrency=[1, 8, 32], input_len=512, output_len=128, prompts_per_client=2,
                min_prompts=8, prompts={"source": "random", "output_lens": "range", "range_ratio": 0.25})
    data.pop("num_prompts", None)
    data["arms"][1]["launch"] = ["python", "-m", "sglang.launch_server", "--speculative-num-steps", "3"]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    from dynspec.live.config import load_config

    run = run_sweep(load_config(cfg), run_id="varied", runs_dir=tmp_path / "runs", progress=False, backend="sim")
    spec = spec_from_run(run.run_dir)
    w = spec.workload
    assert (w.range_ratio, w.prompts_per_client, w.min_prompts, w.num_prompts) == (0.25, 2, 8, None)
    assert any("uniform in [0.25 x, 1 x] 512 / 128" in a for a in spec.assumptions)
    out = tmp_path / "fitted.yaml"
    assert main(["fit", "--from-run", str(run.run_dir), "--out", str(out)]) == 0
    fitted, source = load_profile(out), load_profile("seed-blackwell")
    [table] = fitted.steps
    for bs, plain, spec_ms in zip(table.batch_size, table.plain_ms, table.spec_ms):  # fixed lengths: 1.10-1.12
        assert plain == pytest.approx(1000 * source.plain_time(bs), rel=0.05), bs
        assert spec_ms == pytest.approx(1000 * source.spec_time(bs), rel=0.05), bs


def test_each_level_is_fitted_on_the_prompts_of_every_repeat_the_arms_measured(tmp_path):
    """Each repeat of a level draws its own prompts, and a level of a few dozen requests of varied
    length moves with the draw: the fit's simulated figure is the mean over the repeats the
    target averages, each on its own prompts.  The "measured" run is the simulator on a known
    profile, so that profile simulated over those repeats gives back the targets exactly; over the
    first repeat's prompts alone it does not (on one H100's run, 0.94-1.12 of live)."""
    from dynspec.results import read_table, write_table
    from dynspec.sim.fit import simulate_targets

    data = yaml.safe_load((ROOT / "configs" / "ci-tiny.yaml").read_text())
    data.update(backend="sim", concurrency=[4, 16], input_len=256, output_len=128, prompts_per_client=2,
                min_prompts=8, repeats=3, prompts={"source": "random", "output_lens": "range", "range_ratio": 0.25})
    data.pop("num_prompts", None)
    data["arms"][1]["launch"] = ["python", "-m", "sglang.launch_server", "--speculative-num-steps", "3"]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    from dynspec.live.config import load_config

    run = run_sweep(load_config(cfg), run_id="rounds", runs_dir=tmp_path / "runs", progress=False, backend="sim")
    # one arm lost the last repeat at C=16: that level's target is the mean of the first two
    results = run.run_dir / "results.csv"
    rows = read_table(results)
    rows = rows[~((rows["arm"] == "eagle3") & (rows["concurrency"] == 16) & (rows["repeat"] == 2))]
    write_table(rows.to_dict("records"), results)
    spec = spec_from_run(run.run_dir)
    assert [t.repeats for t in spec.targets] == [[0, 1, 2], [0, 1]]
    source = load_profile("seed-blackwell")
    spec = spec.model_copy(update={"acceptance": source.acceptance})
    sim = simulate_targets(source, spec)
    for t in spec.targets:
        assert sim[("baseline", t.concurrency)] == pytest.approx(t.baseline, rel=1e-3), t
        assert sim[("eagle3", t.concurrency)] == pytest.approx(t.eagle3, rel=1e-3), t
    first = simulate_targets(source, spec.model_copy(update={"targets": [t.model_copy(update={"repeats": None})
                                                                        for t in spec.targets]}))
    assert any(abs(first[k] / sim[k] - 1) > 0.005 for k in sim)

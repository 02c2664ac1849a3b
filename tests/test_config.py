"""Sweep configs: shipped ones load; each kind of bad config gets one line naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dynspec.live.config import ConfigError, check_live, load_config, parse_config, resolved_yaml
from dynspec.policy import check_spec

ROOT = Path(__file__).resolve().parents[1]
# the configs a user starts from, and every study's sweep config (its profiles and fit specs aside)
CONFIGS = sorted((ROOT / "configs").glob("*.yaml")) + sorted(
    p for p in (ROOT / "experiments").glob("*/*.yaml") if "arms" in (yaml.safe_load(p.read_text()) or {}))

BASE = {
    "name": "t",
    "concurrency": [1, 4],
    "arms": [{"name": "a", "sim_arm": "baseline",
              "launch": "python -m sglang.launch_server --model-path {model} --port {port}"}],
}


def write(tmp_path: Path, data, name="cfg.yaml") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def with_(**changes) -> dict:
    d = yaml.safe_load(yaml.safe_dump(BASE))
    d.update(changes)
    return d


def error_of(tmp_path: Path, data) -> str:
    p = write(tmp_path, data)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(str(p) + ": ")
    return msg


@pytest.mark.parametrize("path", CONFIGS, ids=[f"{p.parent.name}/{p.stem}" for p in CONFIGS])
def test_shipped_configs_load(path):
    cfg = load_config(path)
    assert cfg.arms and cfg.levels()
    # The resolved config is itself a valid config that means the same.
    assert parse_config(yaml.safe_load(resolved_yaml(cfg))) == cfg


def test_seed_config_matches_the_seed_investigation():
    cfg = load_config(ROOT / "configs" / "seed-blackwell.yaml")
    assert {1, 30, 70} <= set(cfg.concurrency) and max(cfg.concurrency) == 128
    assert [a.name for a in cfg.arms] == ["baseline", "eagle3-v1", "eagle3-v2", "dynspec"]
    v1, v2, dyn = cfg.arm("eagle3-v1"), cfg.arm("eagle3-v2"), cfg.arm("dynspec")
    assert "--tp" in v1.launch and v1.launch[v1.launch.index("--tp") + 1] == "8"
    assert v1.launch[v1.launch.index("--speculative-num-draft-tokens") + 1] == "16"
    assert v2.env == {"SGLANG_ENABLE_SPEC_V2": "1"}
    assert v2.launch[v2.launch.index("--speculative-eagle-topk") + 1] == "1"
    assert dyn.env["DYNSPEC_POLICY"] == "goodput" and dyn.sim_arm == "dynamic"
    assert not cfg.arm("baseline").speculates and v1.speculates


def test_seed_config_placeholders_fail_for_live_naming_the_key():
    path = ROOT / "configs" / "seed-blackwell.yaml"
    cfg = load_config(path)
    with pytest.raises(ConfigError, match=r"seed-blackwell.yaml: model: fill in"):
        check_live(cfg, str(path))
    filled = cfg.model_copy(update={"model": "/models/llama"})
    with pytest.raises(ConfigError, match=r": draft_model: fill in .*arm eagle3-v1"):
        check_live(filled, str(path))
    check_live(filled.model_copy(update={"draft_model": "/models/eagle3"}), str(path))


@pytest.mark.parametrize("value", ["FILL_ME", "/path/to/model", "<model dir>", "", None])
def test_placeholder_model_values_refused(value):
    cfg = parse_config(with_(model=value))
    with pytest.raises(ConfigError, match="model: fill in"):
        check_live(cfg)


def test_live_needs_port_placeholder_and_launch():
    cfg = parse_config(with_(model="/m", arms=[{"name": "a", "launch": "python -m sglang.launch_server"}]))
    with pytest.raises(ConfigError, match=r"arms\.0\.launch: must contain --port \{port\}"):
        check_live(cfg)
    cfg = parse_config(with_(model="/m", arms=[{"name": "a"}]))
    with pytest.raises(ConfigError, match=r"arms\.0\.launch: the live backend needs"):
        check_live(cfg)


@pytest.mark.parametrize("data, where, what", [
    (with_(concurrncy=[1]), "concurrncy", "unknown key"),
    (with_(arms=[{"name": "a", "lanch": "x"}]), "arms.0.lanch", "unknown key"),
    (with_(timeouts={"startup": 5}), "timeouts.startup", "unknown key"),
    (with_(concurrency=[0, 4]), "concurrency", "at least 1"),
    (with_(concurrency=[4, 4]), "concurrency", "must not repeat"),
    (with_(request_rates=[0]), "request_rates.0", "greater than 0"),
    (with_(request_rates=[float("inf")]), "request_rates.0", "finite number"),
    (with_(request_rates=[2, 2.0]), "request_rates", "must not repeat"),
    (with_(burstiness=0), "burstiness", "greater than 0"),
    (with_(max_concurrency=0), "max_concurrency", "greater than or equal to 1"),
    (with_(metrics={"percentiles": [0]}), "metrics.percentiles", "must be in (0, 100]"),
    (with_(metrics={"percentiles": [101]}), "metrics.percentiles", "must be in (0, 100]"),
    (with_(metrics={"percentiles": [True]}), "metrics.percentiles.0", "valid number"),
    (with_(metrics={"percentiles": []}), "metrics.percentiles", "at least 1 item"),
    (with_(metrics={"slo": {}}), "metrics.slo", "give at least one of ttft_ms, tpot_ms, e2e_ms"),
    (with_(metrics={"slo": {"ttft_ms": -5}}), "metrics.slo.ttft_ms", "greater than 0"),
    (with_(metrics={"slo": {"itl_ms": 5}}), "metrics.slo.itl_ms", "unknown key"),
    (with_(concurrency="many"), "concurrency", "valid list"),
    (with_(arms=[]), "arms", "at least 1 item"),
    (with_(arms=[{"name": "a"}, {"name": "a"}]), "arms", "must be unique (a repeats)"),
    (with_(arms=[{"name": "a/b"}]), "arms.0.name", "should match pattern"),
    (with_(arms=[{"name": "a", "sim_arm": "eagle"}]), "arms.0.sim_arm", "'eagle' is not one of"),
    (with_(arms=[{"name": "a", "sim_arm": "policy:threshold:on=x"}]), "arms.0.sim_arm", "threshold"),
    (with_(arms=[{"name": "a", "api": "grpc"}]), "arms.0.api", "'generate', 'openai' or 'chat'"),
    (with_(arms=[{"name": "a", "launch": "serve --model {modle} --port {port}"}]), "arms.0.launch",
     "unknown placeholder {modle}"),
    (with_(prompts={"source": "jsonl"}), "prompts", "source jsonl needs a path"),
    # booleans as numbers, absurd sizes, non-finite timeouts and scales
    (with_(concurrency=[1e30]), "concurrency.0", "valid integer"),
    (with_(concurrency=[True]), "concurrency.0", "valid integer"),
    (with_(concurrency=[10 ** 7]), "concurrency.0", "less than or equal to 65536"),
    (with_(repeats=10 ** 6), "repeats", "less than or equal to 100"),
    (with_(repeats=True), "repeats", "valid integer"),
    (with_(input_len=10 ** 9), "input_len", "less than or equal to"),
    (with_(timeouts={"level_s": float("inf")}), "timeouts.level_s", "finite number"),
    (with_(timeouts={"startup_s": 1e12}), "timeouts.startup_s", "less than or equal to"),
    (with_(emulate={"time_scale": float("inf")}), "emulate.time_scale", "finite number"),
    (with_(emulate={"time_scale": True}), "emulate.time_scale", "valid number"),
    (with_(prompts={"source": "random", "path": "x.jsonl"}), "prompts", "path is only for"),
    (with_(prompts={"source": "csv", "path": "x"}), "prompts.source", "'random', 'jsonl', 'sharegpt' or 'mtbench'"),
    (with_(prompts={"source": "mtbench", "path": "q.jsonl", "output_lens": "dataset"}), "prompts",
     "gives no output lengths"),
    (with_(prompts={"output_lens": "range"}), "prompts", "needs range_ratio below 1"),
    (with_(prompts={"output_lens": "range", "range_ratio": 1.5}), "prompts.range_ratio", "less than or equal to 1"),
    (with_(prompts={"tokenizer": "/tok"}), "prompts", "tokenizer only counts ShareGPT replies"),
    (with_(input_len=0), "input_len", "greater than or equal to 1"),
    (with_(repeats=0), "repeats", "greater than or equal to 1"),
    (with_(timeouts={"level_s": -1}), "timeouts.level_s", "greater than 0"),
    (with_(backend="cloud"), "backend", "'live', 'sim' or 'emulate'"),
    ({k: v for k, v in BASE.items() if k != "name"}, "name", "Field required"),
])
def test_bad_config_names_the_key(tmp_path, data, where, what):
    msg = error_of(tmp_path, data)
    assert f": {where}: " in msg, msg
    assert what in msg, msg


def test_a_problem_of_the_whole_config_names_no_key(tmp_path):
    msg = error_of(tmp_path, with_(concurrency=[]))
    assert msg == f"{tmp_path / 'cfg.yaml'}: give concurrency levels, request_rates, or both"


def test_bad_yaml_and_shapes(tmp_path):
    assert "not valid YAML" in error_of(tmp_path, "name: [unclosed\n")
    assert "a sweep config is a YAML mapping, got list" in error_of(tmp_path, "- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"nope.yaml: no such config file"):
        load_config(tmp_path / "nope.yaml")


def test_prompt_file_resolved_relative_to_config(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "p.jsonl").write_text('{"prompt": "hi"}\n')
    cfg = load_config(write(tmp_path / "sub", with_(prompts={"source": "jsonl", "path": "p.jsonl"})))
    assert cfg.prompts.path == str((tmp_path / "sub" / "p.jsonl").resolve())
    msg = error_of(tmp_path, with_(prompts={"source": "sharegpt", "path": "missing.json"}))
    assert ": prompts.path: no such file" in msg


def test_defaults_and_coercions():
    cfg = parse_config(with_(arms=[{"name": "a", "env": {"SGLANG_ENABLE_SPEC_V2": 1, "X": True},
                                    "launch": ["python", "-m", "x", "--port", "{port}"]},
                                   {"name": "b", "sim_arm": "policy:threshold:32",
                                    "launch": "python -m x --tp 8 --nnodes 2 --node-rank 0 --port {port}"}]))
    a, b = cfg.arms
    assert a.env == {"SGLANG_ENABLE_SPEC_V2": "1", "X": "1"}
    assert a.launch == ["python", "-m", "x", "--port", "{port}"]
    # Multi-node flags pass through untouched.
    assert b.launch == ["python", "-m", "x", "--tp", "8", "--nnodes", "2", "--node-rank", "0", "--port", "{port}"]
    assert b.sim_arm == "policy:" + check_spec("threshold:32")
    assert cfg.prompts_for(1) == 50 and cfg.prompts_for(30) == 150
    assert parse_config(with_(num_prompts=7)).prompts_for(30) == 7
    assert cfg.backend == "live" and cfg.profile == "seed-blackwell"


def test_emulated_twin_mirrors_the_seed_config():
    seed = load_config(ROOT / "configs" / "seed-blackwell.yaml")
    twin = load_config(ROOT / "configs" / "seed-blackwell-emulated.yaml")
    assert twin.backend == "emulate" and seed.backend == "live"
    assert twin.arms == seed.arms and twin.concurrency == seed.concurrency and twin.profile == seed.profile


def test_levels_closed_then_open_with_their_prompt_counts(tmp_path):
    from dynspec.live.config import Level, parse_config

    cfg = parse_config({**BASE, "concurrency": [1, 8], "request_rates": [0.5, 4], "max_concurrency": 64,
                        "rate_duration_s": 20, "metrics": {"percentiles": [50, 99.9], "slo": {"ttft_ms": 200}}})
    assert cfg.levels() == [Level(1), Level(8), Level(64, 0.5), Level(64, 4.0)]
    assert [lv.label for lv in cfg.levels()] == ["c1", "c8", "rate0.5_c64", "rate4_c64"]
    assert [cfg.prompts_for(lv) for lv in cfg.levels()] == [50, 50, 50, 80]  # max(rate x 20 s, 50)
    assert cfg.summary_args() == {"percentiles": [50.0, 99.9], "slo": {"ttft": 200.0}}
    assert cfg.result_columns()[-4:] == ["p99.9_ttft_ms", "p99.9_tpot_ms", "p99.9_itl_ms", "p99.9_e2e_ms"]
    only_rates = parse_config({**BASE, "concurrency": [], "request_rates": [2]})
    assert only_rates.levels() == [Level(0, 2.0)]  # no cap


PATCHED = "python -m dynspec.realsglang serve --patched -- --model-path {model} --port {port}"


@pytest.mark.parametrize("arm, what", [
    ({"name": "g", "sim_arm": "dynamic", "env": {"DYNSPEC_POLICY": "goodptu"}},
     "arms.0: arm 'g': env DYNSPEC_POLICY: 'goodptu': unknown policy 'goodptu'"),
    ({"name": "g", "sim_arm": "dynamic", "env": {"DYNSPEC_POLICY": "threshold:16"}},
     "arm 'g': sim_arm 'dynamic' runs goodput but env DYNSPEC_POLICY is 'threshold:16'; state the policy once"),
    ({"name": "n", "sim_arm": "baseline", "env": {"DYNSPEC_POLICY": "never"}},
     "sim_arm 'baseline' runs no speculation but env DYNSPEC_POLICY is 'never'"),
])
def test_an_arms_policy_stated_twice_must_agree(tmp_path, arm, what):
    """A typo in DYNSPEC_POLICY used to load: the patched server fell back to speculating on
    every step and the results row said goodput."""
    msg = error_of(tmp_path, with_(arms=[{**arm, "launch": PATCHED}]))
    assert what in msg, msg


def test_a_switching_arms_launch_environment_comes_from_sim_arm(tmp_path):
    cfg = load_config(write(tmp_path, with_(arms=[
        {"name": "t", "sim_arm": "policy:threshold:16", "launch": PATCHED},
        {"name": "g", "sim_arm": "dynamic", "launch": PATCHED, "env": {"SGLANG_ENABLE_SPEC_V2": "1"}},
        {"name": "e", "sim_arm": "eagle3", "launch": PATCHED},
        {"name": "same", "sim_arm": "policy:threshold:16", "launch": PATCHED, "env": {"DYNSPEC_POLICY": "threshold:16"}},
    ])))
    t, g, e, same = cfg.arms
    assert t.env == {"DYNSPEC_POLICY": "threshold:16"}
    assert g.env == {"SGLANG_ENABLE_SPEC_V2": "1", "DYNSPEC_POLICY": "goodput"}
    assert e.env == {} and same.env == {"DYNSPEC_POLICY": "threshold:16"}

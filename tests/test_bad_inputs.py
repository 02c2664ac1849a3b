"""No input ends in a traceback: every command that reads a file answers a bad one with
exit 2 and one line on stderr, and writes nothing.

A corpus of damaged files (not UTF-8, nested thousands deep, an alias bomb, a name too
long, a folder where a file belongs, the wrong shape) goes through every command that
reads files; a bounded hypothesis fuzz does the same with generated configs, profiles,
policy specs and import files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynspec.cli import main

ROOT = Path(__file__).resolve().parents[1]

ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8))
# The bomb through the one field that used to stringify before checking types.
ENV_BOMB = ALIAS_BOMB + ("name: t\nconcurrency: [1]\nprofile: seed-blackwell\n"
                         "arms: [{name: a, sim_arm: baseline, env: {X: *i}}]\n")

CORPUS: dict[str, bytes | None] = {
    "latin1.yaml": "name: caf\xe9\n".encode("latin-1"),
    "binary.yaml": bytes(range(256)) * 4,
    "deep-list.yaml": b"[" * 5000 + b"]" * 5000,
    "deep-map.yaml": b"{a: " * 3000 + b"1" + b"}" * 3000,
    "alias-bomb.yaml": ALIAS_BOMB.encode(),
    "env-bomb.yaml": ENV_BOMB.encode(),
    "self-alias.yaml": b"&a [*a]\n",
    "list.yaml": b"- 1\n- 2\n",
    "scalar.yaml": b"42\n",
    "empty.yaml": b"",
    "bad-date.yaml": b"name: 2024-13-45\n",
    "deep.json": b"[" * 100_000 + b"]" * 100_000,
    "deep.jsonl": b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"\n",
    "list-tag.jsonl": b'!!python/object:os.system ["echo"]\n',
    "latin1.jsonl": '{"x": "caf\xe9"}\n'.encode("latin-1"),
    "binary.json": bytes(range(256)),
    "a-folder.yaml": None,  # made a directory
    "x" * 300 + ".yaml": b"",  # a name too long for the file system
}


@pytest.fixture
def corpus(tmp_path) -> dict[str, Path]:
    out = {}
    for name, data in CORPUS.items():
        p = tmp_path / name
        if data is None:
            p.mkdir()
        elif len(name) < 255:
            p.write_bytes(data)
        out[name] = p
    return out


TALLY = {"inputs": 0}


@pytest.fixture(scope="module", autouse=True)
def tally():
    """Prints how many inputs went through the commands (pytest -s shows it; the README quotes it)."""
    yield
    print(f"\n[bad inputs] {TALLY['inputs']} inputs through the CLI, every one exit 0 or one line with exit 2")


def one_line_refusal(capsys, argv: list[str], tmp_path: Path) -> str:
    TALLY["inputs"] += 1
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, f"{argv}: exit {code}: {err}"
    assert err.count("\n") == 1 and "Traceback" not in err, f"{argv}: {err}"
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before, f"{argv} wrote something"
    return err


YAML_COMMANDS = {
    "sweep": lambda f, t: ["sweep", "--config", f, "--backend", "sim", "--runs-dir", str(t / "runs"), "--no-progress"],
    "pipeline": lambda f, t: ["pipeline", "--config", f, "--runs-dir", str(t / "runs"), "--reports-dir",
                              str(t / "reports")],
    "sim": lambda f, t: ["sim", "--profile", f, "--concurrency", "1", "--out", str(t / "o.csv")],
    "emulate": lambda f, t: ["emulate", "--profile", f, "--arm", "baseline", "--port", "0"],
    "fit": lambda f, t: ["fit", f, "--out", str(t / "p.yaml")],
}
RESULT_COMMANDS = {
    "import-results": lambda f, t: ["import-results", f, "--out", str(t / "o.csv")],
    "tune": lambda f, t: ["tune", "--results", f],
}


@pytest.mark.parametrize("command", sorted(YAML_COMMANDS))
def test_bad_yaml_files_are_one_line(corpus, tmp_path, capsys, command):
    for name, path in corpus.items():
        if name.endswith(".yaml"):
            one_line_refusal(capsys, YAML_COMMANDS[command](str(path), tmp_path), tmp_path)


@pytest.mark.parametrize("command", sorted(RESULT_COMMANDS))
def test_bad_result_files_are_one_line(corpus, tmp_path, capsys, command):
    for name, path in corpus.items():
        if command == "tune" and name.endswith((".json", ".jsonl")):
            continue  # tune reads .csv and .parquet; they get their own cases below
        one_line_refusal(capsys, RESULT_COMMANDS[command](str(path), tmp_path), tmp_path)


def test_fit_from_a_damaged_run_folder_is_one_line(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.csv").write_bytes(CORPUS["binary.yaml"])
    for name in ("latin1.yaml", "deep-list.yaml", "alias-bomb.yaml", "list.yaml"):
        (run / "config.yaml").write_bytes(CORPUS[name])
        one_line_refusal(capsys, ["fit", "--from-run", str(run), "--out", str(tmp_path / "p.yaml")], tmp_path)
    (run / "config.yaml").write_text("arms: [{name: baseline}, {name: eagle3}]\n")
    one_line_refusal(capsys, ["fit", "--from-run", str(run), "--out", str(tmp_path / "p.yaml")], tmp_path)


def test_env_alias_bomb_is_refused_quickly(tmp_path):
    import time

    from dynspec.live.config import ConfigError, load_config

    p = tmp_path / "bomb.yaml"
    p.write_text(ENV_BOMB)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="too large"):
        load_config(p)
    assert time.perf_counter() - t0 < 2


def test_import_results_bad_fields_and_out(tmp_path, capsys):
    good = {"completed": 10, "duration": 1.0, "output_throughput": 100.0, "mean_ttft_ms": 5.0, "mean_e2e_latency_ms": 9.0,
            "max_concurrency": 4}
    cases = {
        "server-info.jsonl": {**good, "server_info": ["not", "a", "dict"]},
        "server-info-decode.jsonl": {**good, "server_info": {"decode": [1]}},
        "lots.jsonl": {**good, "completed": "lots"},
        "nan.jsonl": {**good, "output_throughput": float("nan")},
        "negative.jsonl": {**good, "output_throughput": -5.0},
        "bool.jsonl": {**good, "completed": True},
        "huge-int.jsonl": {**good, "completed": 10 ** 400},
    }
    for name, obj in cases.items():
        p = tmp_path / name
        p.write_text(json.dumps(obj) + "\n")
        one_line_refusal(capsys, ["import-results", str(p), "--out", str(tmp_path / "o.csv")], tmp_path)
    ok = tmp_path / "ok.jsonl"
    ok.write_text(json.dumps(good) + "\n")
    for out in ("o.txt", "a-folder", "no/such/dir/" + "y" * 300 + ".csv"):
        (tmp_path / "a-folder").mkdir(exist_ok=True)
        one_line_refusal(capsys, ["import-results", str(ok), "--out", str(tmp_path / out)], tmp_path)


@pytest.mark.parametrize("command", ["sweep", "pipeline"])
def test_run_ids_are_limited_to_a_safe_set(tmp_path, capsys, command):
    config = str(ROOT / "configs" / "ci-tiny.yaml")
    for rid in ("x\n", "x" * 200, "../x", "-x", "a b"):
        argv = YAML_COMMANDS[command](config, tmp_path) + [f"--run-id={rid}"]
        if command == "sweep":
            argv[argv.index("--backend") + 1] = "sim"
        err = one_line_refusal(capsys, argv, tmp_path)
        assert "run id" in err


# Fuzz: generated inputs, bounded so CI runs it in seconds -------------------------------------

FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

NASTY = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10 ** 30), max_value=10 ** 30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(blacklist_categories=("Cs",)), max_size=30),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12)

BASE_CONFIG = yaml.safe_load((ROOT / "configs" / "ci-tiny.yaml").read_text())
BASE_PROFILE = {
    "name": "fuzz", "speculative": {"num_steps": 3},
    "acceptance": {"accept_length": 2.5, "concentration": 10},
    "steps": {"batch_size": [1, 64], "plain_ms": [10.0, 20.0], "spec_ms": [12.0, 30.0]},
    "provenance": {"kind": "derived", "source": "fuzz"},
}
BASE_IMPORT = {"completed": 10, "failed": 0, "duration": 1.5, "output_throughput": 100.0, "mean_ttft_ms": 5.0,
               "mean_e2e_latency_ms": 9.0, "max_concurrency": 4, "accept_length": 2.1, "tag": "a",
               "server_info": {"speculative_algorithm": "EAGLE3"}}


def _paths(d, prefix=()):
    """Every key path in nested dicts and lists."""
    yield prefix
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated(draw, base: dict):
    """base with a few values (at any depth) replaced by nasty ones, or a key added or dropped."""
    d = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(d))[1:]))
        node = d
        try:
            for k in path[:-1]:
                node = node[k]
            if draw(st.booleans()) and isinstance(node, dict):
                node.pop(path[-1], None)
            else:
                node[path[-1]] = draw(NASTY)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change removed this path
    return d


def _dump(data, raw: bool) -> bytes:
    if raw:
        return data
    return yaml.safe_dump(data, allow_unicode=True).encode()


def exit_0_or_one_line(capsys, argv) -> int:
    TALLY["inputs"] += 1
    code = main(argv)
    err = capsys.readouterr().err
    assert code in (0, 2), f"{argv}: exit {code}: {err}"
    if code == 2:
        assert err.count("\n") == 1 and "Traceback" not in err, f"{argv}: {err}"
    return code


@FUZZ
@given(data=mutated(BASE_CONFIG) | st.binary(max_size=200))
def test_fuzz_configs(tmp_path, capsys, data):
    f = tmp_path / "cfg.yaml"
    f.write_bytes(_dump(data, isinstance(data, bytes)))
    # Everything is checked before the notebooks run; an empty notebooks folder stops a valid config there.
    exit_0_or_one_line(capsys, ["pipeline", "--config", str(f), "--runs-dir", str(tmp_path / "runs"),
                                "--reports-dir", str(tmp_path / "reports"), "--notebooks-dir", str(tmp_path)])


@FUZZ
@given(data=mutated(BASE_PROFILE) | st.binary(max_size=200))
def test_fuzz_profiles(tmp_path, capsys, data):
    f = tmp_path / "p.yaml"
    f.write_bytes(_dump(data, isinstance(data, bytes)))
    if exit_0_or_one_line(capsys, ["sim", "--profile", str(f), "--concurrency", "1", "--num-prompts", "2",
                                   "--input-len", "8", "--output-len", "4", "--out", str(tmp_path / "o.csv")]) == 0:
        from dynspec.results import read_table

        tput = read_table(tmp_path / "o.csv").output_throughput
        assert (tput > 0).all() and np.isfinite(tput).all(), "an accepted profile simulates to a finite throughput"


@FUZZ
@given(spec=st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)
       | st.sampled_from(["goodput", "threshold:on=", "table:1=2", "always:x=1", "threshold:on=inf",
                          "threshold:on=1e400", "threshold:on=nan"]).map(lambda s: s))
def test_fuzz_policy_specs(capsys, spec):
    exit_0_or_one_line(capsys, ["policy", "check", spec])


@FUZZ
@given(data=mutated(BASE_IMPORT) | st.binary(max_size=200))
def test_fuzz_import_files(tmp_path, capsys, data):
    f = tmp_path / "r.jsonl"
    f.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode() + b"\n")
    if exit_0_or_one_line(capsys, ["import-results", str(f), "--out", str(tmp_path / "o.csv")]) == 0:
        from dynspec.results import METRIC_COLUMNS, read_table

        df = read_table(tmp_path / "o.csv")
        for c in METRIC_COLUMNS[:-1]:  # every numeric column: a number, finite and not negative, or missing
            values = pd.to_numeric(df[c], errors="raise")
            assert ((values >= 0) | values.isna()).all() and not np.isinf(values).any(), c


def test_policy_bench_without_samples_is_one_line(tmp_path, capsys):
    err = one_line_refusal(capsys, ["policy", "bench", "goodput", "--steps", "0"], tmp_path)
    assert "--steps must be at least 2" in err


def test_policy_bench_with_no_batch_is_one_line(tmp_path, capsys):
    err = one_line_refusal(capsys, ["policy", "bench", "goodput", "--batch", "0"], tmp_path)
    assert "--batch must be in 1..4096, got 0" in err


def test_policy_bench_with_no_rounds_is_one_line(tmp_path, capsys):
    err = one_line_refusal(capsys, ["policy", "bench", "goodput", "goodput-k", "--rounds", "0"], tmp_path)
    assert "--rounds must be at least 1, got 0" in err

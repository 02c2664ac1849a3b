"""No input ends in a traceback: every command that reads a file answers a bad one with
exit 2 and one line on stderr, and writes nothing.

A corpus of damaged files (not UTF-8, nested thousands deep, an alias bomb, a name too
long, a folder where a file belongs, the wrong shape) goes through every command that
reads files; a bounded hypothesis fuzz does the same with generated configs, profiles,
policy specs and import files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

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


def one_line_refusal(capsys, argv: list[str], tmp_path: Path) -> str:
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


def test_env_alias_bomb_is_refused_quickly(tmp_path):
    import time

    from dynspec.config import ConfigError, load_config

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

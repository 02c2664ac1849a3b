"""The provenance record beside every command's output (dynspec.provenance, docs/PROVENANCE.md):
one test per command family, each invoking the command as a user does and reading the record back."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from dynspec import provenance
from dynspec.cli import main

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "src" / "dynspec" / "sim" / "profiles"
KEYS = {"dynspec", "git", "command", "argv", "config", "profile", "outputs", "machine", "created"}


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def version_printed(capsys) -> str:
    capsys.readouterr()  # what the command printed
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    name, version = capsys.readouterr().out.split()
    assert name == "dynspec"
    return version


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def read_record(path: Path, command: str, argv: list[str] | None, capsys) -> dict:
    """The record at path, checked for what every record holds."""
    assert path.is_file(), f"no provenance record at {path}"
    rec = json.loads(path.read_text())
    assert set(rec) == KEYS
    assert rec["dynspec"] == version_printed(capsys)
    assert rec["command"] == command and rec["argv"] == argv
    assert rec["git"]["commit"] == git("rev-parse", "HEAD") and isinstance(rec["git"]["dirty"], bool)
    assert set(rec["machine"]) == {"host", "platform", "python", "cpu_count", "gpus"}
    assert rec["machine"]["python"] == sys.version.split()[0] and rec["machine"]["cpu_count"] == os.cpu_count()
    assert datetime.fromisoformat(rec["created"]).tzinfo is not None
    return rec


def renamed_profile(tmp_path: Path, name: str, source: str = "seed-blackwell") -> Path:
    """A shipped profile under another name, as a file: its hash is not the shipped one's."""
    data = yaml.safe_load((SHIPPED / f"{source}.yaml").read_text())
    data["name"] = name
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# --- the record itself ----------------------------------------------------------------------

def test_git_state_of_a_checkout_clean_then_dirty(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", cwd=repo)
    (repo / "a.txt").write_text("a\n")
    git("add", "a.txt", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a", cwd=repo)
    assert provenance.git_state(repo) == {"commit": git("rev-parse", "HEAD", cwd=repo), "dirty": False}
    (repo / "a.txt").write_text("b\n")
    assert provenance.git_state(repo)["dirty"] is True
    # a folder inside a checkout is not the checkout dynspec runs from (an installed package in a repo)
    (repo / "pkg").mkdir()
    assert provenance.git_state(repo / "pkg") is None
    assert provenance.git_state(tmp_path) is None  # not a checkout at all


@pytest.mark.parametrize("script", ["exit 1", "sleep 5"], ids=["git-fails", "git-hangs"])
def test_a_git_that_fails_or_hangs_gives_git_null(tmp_path, monkeypatch, script):
    fake = tmp_path / "bin" / "git"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    assert provenance.git_state(ROOT, timeout=0.5) is None


def test_without_git_the_command_still_writes_its_record(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git (nor anything else) on PATH
    out = tmp_path / "r.csv"
    argv = ["sim", "--profile", "seed-blackwell", "--arm", "baseline", "--concurrency", "1", "--num-prompts", "2",
            "--output-len", "4", "--out", str(out)]
    assert main(argv) == 0
    rec = json.loads(provenance.beside(out).read_text())
    assert rec["git"] is None and rec["argv"] == ["dynspec", *argv] and rec["dynspec"] == version_printed(capsys)
    assert rec["machine"]["gpus"] == []  # no nvidia-smi: no GPU named


def test_config_data_of_a_dataclass_and_a_model():
    from dynspec.analysis.tune import TuneConfig

    cfg = TuneConfig(results=Path("r.csv"), num_steps=3)
    assert provenance.config_data(cfg) == json.loads(json.dumps(cfg.model_dump(mode="json")))
    assert TuneConfig.model_validate(provenance.config_data(cfg)) == cfg

    @dataclasses.dataclass
    class C:
        out: Path
        sizes: tuple[int, ...]

    assert provenance.config_data(C(Path("a/b"), (1, 2))) == {"out": "a/b", "sizes": [1, 2]}


# --- one test per command family -------------------------------------------------------------

def test_sim(tmp_path, capsys):
    from dynspec.sim.run import SimConfig

    out = tmp_path / "r.csv"
    argv = ["sim", "--profile", "seed-blackwell", "--arm", "baseline", "--arm", "eagle3", "--concurrency", "1,2",
            "--num-prompts", "2", "--output-len", "4", "--seed", "3", "--out", str(out)]
    assert main(argv) == 0
    rec = read_record(tmp_path / "r.csv.provenance.json", "sim", ["dynspec", *argv], capsys)
    assert SimConfig.model_validate(rec["config"]) == SimConfig(
        profile="seed-blackwell", arms=["baseline", "eagle3"], concurrencies=[1, 2], num_prompts=2, output_len=4,
        seed=3, out=str(out))
    assert rec["profile"] == {"name": "seed-blackwell", "source": "seed-blackwell",
                              "sha256": sha256(SHIPPED / "seed-blackwell.yaml")}
    # a profile given as a path is hashed as that file
    mine = renamed_profile(tmp_path, "mine")
    argv[argv.index("seed-blackwell")] = str(mine)
    assert main(argv) == 0
    rec = read_record(provenance.beside(out), "sim", ["dynspec", *argv], capsys)
    assert rec["profile"] == {"name": "mine", "source": str(mine), "sha256": sha256(mine)}
    assert rec["profile"]["sha256"] != sha256(SHIPPED / "seed-blackwell.yaml")


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):
    """A simulated sweep through the command, of a profile given as a path: (run folder, argv, config)."""
    tmp = tmp_path_factory.mktemp("prov-sweep")
    profile = renamed_profile(tmp, "swept")
    data = yaml.safe_load((ROOT / "configs" / "ci-tiny.yaml").read_text())
    data.update(profile=str(profile), concurrency=[1, 8, 32], num_prompts=64, input_len=512, output_len=64)
    data["arms"][1]["launch"] = ["python", "-m", "sglang.launch_server", "--speculative-num-steps", "3"]
    config = tmp / "cfg.yaml"
    config.write_text(yaml.safe_dump(data))
    argv = ["sweep", "--config", str(config), "--backend", "sim", "--run-id", "prov", "--runs-dir",
            str(tmp / "runs"), "--no-progress"]
    assert main(argv) == 0
    return tmp / "runs" / "prov", argv, config, profile


def test_sweep_and_its_resumed_session(sim_run, capsys):
    from dynspec.live.config import SweepConfig, load_config

    run_dir, argv, config, profile = sim_run
    rec = read_record(run_dir / "provenance.json", "sweep", ["dynspec", *argv], capsys)
    saved = SweepConfig.model_validate(rec["config"])
    assert saved == load_config(config).model_copy(update={"backend": "sim"})  # the backend as run, not as configured
    assert rec["profile"] == {"name": "swept", "source": str(profile), "sha256": sha256(profile)}
    assert rec["outputs"] is None  # results.csv grows after the record is written
    # a resumed session adds its own record; the first one is never rewritten
    first = (run_dir / "provenance.json").read_bytes()
    again = [*argv, "--resume"]
    assert main(again) == 0
    assert (run_dir / "provenance.json").read_bytes() == first
    rec2 = read_record(run_dir / "provenance.session2.json", "sweep", ["dynspec", *again], capsys)
    assert rec2["config"] == rec["config"]
    assert [s["resume"] for s in json.loads((run_dir / "run.json").read_text())["sessions"]] == [False, True]


def test_fit_from_a_spec_and_from_a_run(sim_run, tmp_path, capsys):
    from dynspec.sim.fit import load_fit_spec
    from dynspec.sim.profile import load_profile
    from test_sim import TINY_FIT_SPEC

    shares = renamed_profile(tmp_path, "shares")  # catch_up_from: a profile the fit reads
    spec_path = tmp_path / "fit.yaml"
    spec_path.write_text(TINY_FIT_SPEC + f"catch_up_from: {shares}\n")
    out = tmp_path / "tiny.yaml"
    argv = ["fit", str(spec_path), "--out", str(out)]
    assert main(argv) == 0
    rec = read_record(tmp_path / "tiny.yaml.provenance.json", "fit", ["dynspec", *argv], capsys)
    assert type(load_fit_spec(spec_path)).model_validate(rec["config"]) == load_fit_spec(spec_path)
    assert rec["profile"] == {"name": "shares", "source": str(shares), "sha256": sha256(shares)}
    assert rec["outputs"] == {"tiny.yaml": sha256(out)}
    assert load_profile(out).provenance.command == shlex.join(["dynspec", *argv])  # the recorded argv

    run_dir = sim_run[0]
    out = tmp_path / "fitted.yaml"
    argv = ["fit", "--from-run", str(run_dir), "--catch-up-fraction", "0.04", "--out", str(out)]
    assert main(argv) == 0
    rec = read_record(provenance.beside(out), "fit", ["dynspec", *argv], capsys)
    spec_out = tmp_path / "fitted.fit.yaml"
    assert type(load_fit_spec(spec_out)).model_validate(rec["config"]) == load_fit_spec(spec_out)
    assert rec["config"]["catch_up_fraction"] == 0.04 and rec["profile"] is None
    assert rec["outputs"] == {"fitted.yaml": sha256(out), "fitted.fit.yaml": sha256(spec_out)}
    assert load_profile(out).provenance.command == shlex.join(["dynspec", *argv])


def test_tune(tmp_path, capsys):
    from dynspec.analysis.tune import TuneConfig
    from test_tune import CROSS, sweep

    results = sweep(tmp_path / "r.csv", CROSS, profile="seed-blackwell")
    out = tmp_path / "tuned"
    argv = ["tune", "--results", str(results), "--objective", "min-ratio", "--out", str(out)]
    assert main(argv) == 0
    rec = read_record(out / "provenance.json", "tune", ["dynspec", *argv], capsys)
    assert TuneConfig.model_validate(rec["config"]) == TuneConfig(results=results, objective="min-ratio")
    # num_steps came from the rows' profile: the record names and hashes it
    assert rec["profile"] == {"name": "seed-blackwell", "source": "seed-blackwell",
                              "sha256": sha256(SHIPPED / "seed-blackwell.yaml")}
    names = ["tune.json", "tune_config.yaml", "sglang_adaptive_config.json"]
    assert rec["outputs"] == {n: sha256(out / n) for n in names}
    # given --num-steps, no profile is read
    assert main([*argv, "--num-steps", "3"]) == 0
    assert json.loads((out / "provenance.json").read_text())["profile"] is None


def test_import_results(tmp_path, capsys):
    from dynspec.live.readers import ImportConfig
    from test_readers import VLLM_RESULT

    src = tmp_path / "vllm-c16.json"
    src.write_text(json.dumps(VLLM_RESULT))
    out = tmp_path / "imported.csv"
    argv = ["import-results", str(src), "--out", str(out), "--arm", "v"]
    assert main(argv) == 0
    rec = read_record(provenance.beside(out), "import-results", ["dynspec", *argv], capsys)
    assert rec["config"] == {"files": [str(src)], "out": str(out), "arm": "v", "run_id": None, "profile": ""}
    assert ImportConfig(**{**rec["config"], "files": tuple(map(Path, rec["config"]["files"])),
                           "out": Path(rec["config"]["out"])}) == ImportConfig(files=(src,), out=out, arm="v")
    assert rec["profile"] is None and rec["outputs"] == {"imported.csv": sha256(out)}


def test_calibrate(tmp_path, capsys):
    pytest.importorskip("torch")
    from dynspec.calibrate import run as cal
    from dynspec.sim.profile import load_profile

    out = tmp_path / "tiny-cpu.yaml"
    argv = ["calibrate", "--shape", "tiny", "--device", "cpu", "--dtype", "float32", "--draft-vocab", "100",
            "--batch-sizes", "1,2", "--context", "16", "--tokens-per-request", "1", "--input-len", "8",
            "--repeats", "1", "--warmup", "0", "--name", "tiny-cpu", "--out", str(out)]
    assert main(argv) == 0
    rec = read_record(provenance.beside(out), "calibrate", ["dynspec", *argv], capsys)
    config = {k: v for k, v in rec["config"].items() if k != "dims"}  # dims: derived from the shape
    again = cal.CalibrateConfig(**{**config, "out": Path(config["out"]),
                                   **{k: tuple(config[k]) for k in ("batch_sizes", "contexts", "tokens_per_request")}})
    assert again == cal.config_from_args(argparse_of(cal, argv))
    assert rec["config"]["dims"] == dataclasses.asdict(again.dims)
    assert rec["profile"] is None
    assert rec["outputs"] == {"tiny-cpu.yaml": sha256(out), "tiny-cpu.raw.json": sha256(tmp_path / "tiny-cpu.raw.json")}
    command = shlex.join(["dynspec", *argv])  # the recorded argv, in the profile and the raw timings
    assert load_profile(out).provenance.command == command
    assert json.loads((tmp_path / "tiny-cpu.raw.json").read_text())["command"] == command


def argparse_of(module, argv: list[str]):
    import argparse

    parser = argparse.ArgumentParser()
    module.add_cli(parser.add_subparsers())
    return parser.parse_args(argv)


def test_pipeline_report_folder_and_its_run_folder(pub, capsys):
    from dynspec.analysis.pipeline import load_settings, settings_from_data

    argv = ["dynspec", "pipeline", "--config", str(pub.config), "--run-id", "ci-tiny", "--runs-dir", str(pub.runs),
            "--reports-dir", str(pub.reports)]
    rec = read_record(pub.report_dir / "provenance.json", "pipeline", argv, capsys)
    assert rec["config"] == yaml.safe_load((pub.report_dir / "pipeline.yaml").read_text())  # paths relative
    assert settings_from_data(rec["config"], pub.report_dir) == load_settings(pub.report_dir / "pipeline.yaml")
    assert rec["profile"]["sha256"] == sha256(SHIPPED / "seed-blackwell.yaml")
    # the sweep the 02_sweep notebook ran (a library call: no argv of its own)
    run = read_record(pub.runs / "ci-tiny" / "provenance.json", "sweep", None, capsys)
    assert run["config"]["name"] == "tiny" and run["profile"] == rec["profile"]


def test_report(sim_run, tmp_path, monkeypatch, capsys):
    """`dynspec report` writes its record before any notebook runs (the notebook is stubbed to fail here)."""
    from dynspec.analysis import pipeline

    def fail(pc, name, log_output=False):
        raise pipeline.NotebookFailed(name, pc.report_dir / f"{name}.ipynb", RuntimeError("not run in this test"))

    monkeypatch.setattr(pipeline, "ensure_kernel", lambda name: "")
    monkeypatch.setattr(pipeline, "execute_notebook", fail)
    run_dir, _, _, profile = sim_run
    reports = tmp_path / "reports"
    argv = ["report", str(run_dir), "--reports-dir", str(reports), "--no-reference"]
    assert main(argv) == 1
    # in the folder the report is built in (renamed to reports/prov once whole), kept as it failed
    rec = read_record(reports / ".prov.building" / "provenance.json", "report", ["dynspec", *argv], capsys)
    assert not (reports / "prov").exists()
    pc = pipeline.settings_from_data(rec["config"], reports / ".prov.building")
    assert pc.run_dir == run_dir.resolve() and pc.backend == "sim" and pc.reference is None
    assert rec["profile"] == {"name": "swept", "source": str(profile), "sha256": sha256(profile)}


def test_report_leaves_the_committed_reports_alone_unless_asked_to_publish(sim_run, monkeypatch):
    """`dynspec report RUN` used to rewrite the tracked reports/ and its index.html."""
    from dynspec.analysis import pipeline

    went = []
    monkeypatch.setattr(pipeline, "run_pipeline", lambda pc, **kw: went.append(pc.reports_dir))
    run_dir = sim_run[0]
    assert main(["report", str(run_dir), "--no-reference"]) == 0
    assert main(["report", str(run_dir), "--no-reference", "--publish"]) == 0
    assert went == [Path("build/reports").resolve(), Path("reports").resolve()]

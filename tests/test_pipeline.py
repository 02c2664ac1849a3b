"""`dynspec pipeline` end to end (papermill on the real notebooks), its failure path, its inputs."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from dynspec.analysis import pipeline
from dynspec.analysis.report import headline, load_run
from pipeline_fixture import ROOT, TINY_CONFIG, run_pipeline

nbformat = pytest.importorskip("nbformat", reason="the notebooks extra: pip install -e '.[notebooks]'")

STAGES = ["kernel", *pipeline.NOTEBOOKS, "render html", "index", "total"]


# End to end ---------------------------------------------------------------------------

def test_prints_every_stage_with_its_time_and_the_report_path(pub):
    out = pub.proc.stdout
    for stage in STAGES:
        assert re.search(rf"^\[pipeline\] {re.escape(stage)}\s+\d+\.\d s$", out, re.M), f"no time for {stage}"
    assert out.rstrip().splitlines()[-1] == f"report: {pub.report_dir / 'report.html'}"
    # Where the run goes, said first; then every level as the sweep measures it, counted, with an ETA.
    assert f"[pipeline] run folder: {(pub.runs / pub.run_id).resolve()}" in out or \
        f"[pipeline] run folder: {pub.runs / pub.run_id}" in out
    levels = re.findall(r"^\[sweep\] (\S+): [\d.]+ output tok/s.* \[level (\d+)/(\d+), ETA \d+:\d\d\]$", out, re.M)
    assert [int(k) for _, k, _ in levels] == list(range(1, 10)) and {n for _, _, n in levels} == {"9"}
    assert levels[0][0] == "baseline_c1_r0" and levels[-1][0] == "dynamic_c16_r0"


def test_keeps_the_executed_notebooks_with_their_outputs(pub):
    for name in pipeline.NOTEBOOKS:
        nb = nbformat.read(pub.report_dir / f"{name}.ipynb", as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert any(c.outputs for c in code), f"{name} has no outputs"
        assert not any(o.get("output_type") == "error" for c in code for o in c.outputs)
        injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        assert injected, f"{name}: papermill injected no parameters"
    sweep = nbformat.read(pub.report_dir / "02_sweep.ipynb", as_version=4)
    injected = next(c for c in sweep.cells if "injected-parameters" in c.metadata.get("tags", []))
    assert f'run_id = "{pub.run_id}"' in injected.source and 'backend = "sim"' in injected.source


def test_the_sweep_wrote_the_run_folder_the_report_reads(pub):
    run = load_run(pub.runs / pub.run_id)
    assert run.backend == "sim"
    assert set(run.results["arm"]) == {"baseline", "eagle3", "dynamic"}
    assert sorted(set(run.results["concurrency"])) == [1, 4, 16]
    saved = yaml.safe_load((pub.report_dir / "pipeline.yaml").read_text())
    # paths relative to the report's folder: the published file says nothing of this machine
    assert saved["config"] == os.path.relpath(pub.config, pub.report_dir) and not saved["runs_dir"].startswith("/")
    pc = pipeline.load_settings(pub.report_dir / "pipeline.yaml")  # the resolved settings round-trip
    assert pc.run_id == pub.run_id and pc.backend == "sim" and pc.config == pub.config
    assert pc.run_dir == (pub.runs / pub.run_id).resolve()


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'<img[^>]+src="data:image/png;base64,([^"]+)"', page)]


def test_report_html_embeds_its_figures_hides_code_and_fetches_nothing(pub):
    page = (pub.report_dir / "report.html").read_text()
    imgs = _images(page)
    assert len(imgs) >= 6, "throughput, speedup, envelope, latency, speculation, step-cost figures"
    assert all(b.startswith(b"\x89PNG\r\n\x1a\n") and len(b) > 5000 for b in imgs)
    assert not re.search(r"<img[^>]+src=\"(?!data:)", page), "an image that is not embedded"
    # Nothing from a CDN, nor any other network fetch.
    assert not re.search(r"<script[^>]+src=", page)
    assert not re.search(r"<link[^>]+href=\"(https?:)?//", page)
    assert not [u for u in re.findall(r"(?:src|href)=\"([^\"]*)\"", page) if "cdn" in u.lower() and not u.startswith("data:")]
    assert pipeline.external_references(page) == []
    # Code hidden: no notebook source in the page.
    assert "from dynspec import report" not in page and "report.throughput_figure" not in page
    # The banner, and the seed's numbers labelled as such.
    assert "Simulated: these numbers are simulated from profile seed-blackwell" in page
    assert "measured by the seed investigation on 8x RTX PRO 6000" in page
    # "By profile": every shipped profile's crossover and simulated envelope, the measured H200 among them
    assert "By profile: where speculation stops paying" in page
    assert page.count("h200-llama8b") >= 3 and "stops paying at accept length 2.5" in page
    assert "dynamic: worst of envelope" in page
    assert "299.5" in page and "711.0" in page


def test_index_lists_the_run_with_its_headline(pub):
    page = (pub.reports / "index.html").read_text()
    assert f'href="{pub.run_id}/report.html"' in page
    summary = json.loads((pub.report_dir / "summary.json").read_text())
    want = headline(load_run(pub.runs / pub.run_id))
    for key in ("baseline_peak", "eagle3_peak", "crossover", "best_policy", "backend", "config"):
        assert summary[key] == json.loads(json.dumps(want[key]))
    row = next(r for r in page.split("<tr>") if pub.run_id in r)
    assert "tiny" in row and "sim (seed-blackwell)" in row and "CI (simulated)" in row
    assert f"{summary['baseline_peak']['output_throughput']:.1f} tok/s" in row


def test_a_second_run_is_refused_unless_resumed_or_overwritten(pub, tmp_path):
    args = ["--config", str(pub.config), "--run-id", pub.run_id, "--runs-dir", str(pub.runs),
            "--reports-dir", str(tmp_path / "elsewhere")]
    before = sorted(p.name for p in pub.runs.iterdir())
    proc = run_pipeline(*args)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "run folder exists; pass --resume" in proc.stderr
    assert not (tmp_path / "elsewhere").exists()
    assert sorted(p.name for p in pub.runs.iterdir()) == before


@pytest.mark.slow  # every notebook end to end, a kernel each: `make test` runs it
def test_emulate_backend_runs_through_the_notebook_over_loopback_http(tmp_path):
    # The sweep's HTTP clients run their own asyncio loop inside a kernel that has one.
    proc = run_pipeline("--config", str(ROOT / "configs" / "ci-tiny.yaml"), "--backend", "emulate",
                        "--run-id", "emu", "--runs-dir", str(tmp_path / "runs"),
                        "--reports-dir", str(tmp_path / "reports"), timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = load_run(tmp_path / "runs" / "emu")
    assert run.backend == "emulate" and len(run.results) == 4
    assert (run.results["error"] == "").all() and (run.results["completed"] == 8).all()
    page = (tmp_path / "reports" / "emu" / "report.html").read_text()
    assert "Emulated: these numbers are simulated from profile seed-blackwell" in page


# Failure ------------------------------------------------------------------------------

def test_a_failing_notebook_stops_the_pipeline_and_stays_for_inspection(tmp_path):
    nb_dir = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", nb_dir)
    nb = nbformat.read(nb_dir / "02_sweep.ipynb", as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell("raise RuntimeError('boom from the test')"))
    nbformat.write(nb, nb_dir / "02_sweep.ipynb")
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_CONFIG)
    reports = tmp_path / "reports"
    proc = run_pipeline("--config", str(config), "--run-id", "broken", "--runs-dir", str(tmp_path / "runs"),
                        "--reports-dir", str(reports), "--notebooks-dir", str(nb_dir))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "dynspec pipeline: 02_sweep failed at cell In [" in proc.stderr
    assert "RuntimeError: boom from the test" in proc.stderr
    assert "failing cell:\n    raise RuntimeError('boom from the test')" in proc.stderr
    kept = reports / ".broken.building" / "02_sweep.ipynb"  # built beside reports/broken, never published
    assert f"executed notebook kept for inspection: {kept}" in proc.stderr
    executed = nbformat.read(kept, as_version=4)
    errors = [o for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert errors and errors[0]["evalue"] == "boom from the test"
    # It stopped there: earlier stages ran, later ones did not, nothing was published.
    assert "[pipeline] 01_patch" in proc.stdout and "[pipeline] 02_sweep" not in proc.stdout
    assert not (reports / ".broken.building" / "03_report.ipynb").exists()
    assert not (reports / "broken").exists()
    assert not (reports / "index.html").exists()


# Inputs -------------------------------------------------------------------------------

@pytest.mark.parametrize("args, complaint", [
    (["--config", "no/such.yaml"], "no/such.yaml: no such config file"),
    (["--config", "{tiny}", "--run-id", "bad id"], "run id 'bad id'"),
    (["--config", "{tiny}", "--resume"], "--resume needs the --run-id"),
    (["--config", "{tiny}", "--run-id", "x", "--resume", "--overwrite"], "give one of them"),
    (["--config", "{tiny}", "--run-id", "x", "--resume"], "nothing to resume"),
    (["--config", "{tiny}", "--reference", "no/ref.csv"], "no such reference table"),
    (["--config", "{tiny}", "--cell-timeout", "0"], "cell_timeout_s: Input should be greater than 0"),
    (["--config", "{tiny}", "--compare", "no/run"], "not a run folder"),
    (["--config", "{tiny}", "--notebooks-dir", "{tmp}"], "missing notebooks 00_environment.ipynb"),
    (["--config", "{live}", "--backend", "live"], "model: fill in the target model's path"),
])
def test_bad_input_is_one_line_and_changes_nothing(tmp_path, args, complaint):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(TINY_CONFIG)
    live = ROOT / "configs" / "seed-blackwell.yaml"
    args = [a.format(tiny=tiny, tmp=tmp_path, live=live) for a in args]
    reports, runs = tmp_path / "reports", tmp_path / "runs"
    proc = run_pipeline(*args, "--reports-dir", str(reports), "--runs-dir", str(runs), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("dynspec pipeline: ") and proc.stderr.count("\n") == 1
    assert complaint in proc.stderr
    assert not reports.exists() and not runs.exists()


def test_overwrite_never_replaces_a_live_run(tmp_path):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(TINY_CONFIG)
    run = tmp_path / "runs" / "precious"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "precious", "backend": "live"}))
    with pytest.raises(pipeline.PipelineError, match="a live run is never overwritten"):
        pipeline.resolve(tiny, run_id="precious", overwrite=True, runs_dir=tmp_path / "runs",
                         reports_dir=tmp_path / "reports")
    assert (run / "run.json").is_file()
    pc = pipeline.resolve(tiny, run_id="fresh", runs_dir=tmp_path / "runs", reports_dir=tmp_path / "reports")
    assert pc.cell_timeout_s == 600 and pc.run_dir == tmp_path / "runs" / "fresh"
    assert pipeline.resolve(tiny, run_id="f", backend="emulate", runs_dir=tmp_path).cell_timeout_s > 3600


def test_default_run_id_follows_the_sweeps_naming(tmp_path):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(TINY_CONFIG)
    pc = pipeline.resolve(tiny, backend="sim", runs_dir=tmp_path / "runs", reports_dir=tmp_path / "reports")
    assert re.fullmatch(r"tiny-sim-\d{8}-\d{6}", pc.run_id)


# Pieces -------------------------------------------------------------------------------

@pytest.mark.parametrize("page, found", [
    ('<script src="https://cdnjs.cloudflare.com/require.js"></script>', 1),
    ('<script src="//cdn.example/x.js"></script>', 1),
    ('<link rel="stylesheet" href="http://fonts.example/f.css">', 1),
    ("<style>@import 'https://fonts.example/f.css';</style>", 1),
    ("<style>body { background: url(https://x.example/b.png) }</style>", 1),
    ('<img src="https://x.example/a.png">', 1),
    ('<img src="data:image/png;base64,AAAA"><a href="https://example.org">a link is not a fetch</a>', 0),
    ('<script>var x = "https://not.fetched";</script><link rel="icon" href="data:,">', 0),
])
def test_external_references_finds_what_a_browser_would_fetch(page, found):
    assert len(pipeline.external_references(page)) == found


def _summary(tmp_path: Path, run_id: str, generated: str, with_report=True) -> None:
    d = tmp_path / run_id
    d.mkdir()
    s = {"run_id": run_id, "generated": generated, "config": "c", "hardware": "h", "backend": "sim",
         "profile": "p", "baseline_peak": {"output_throughput": 700.04, "concurrency": 64},
         "eagle3_peak": None, "crossover": {"status": "crosses", "concurrency": 7.5},
         "best_policy": {"arm": "dyn", "mean_of_envelope": 0.98, "worst_of_envelope": 0.9}, "report": "report.html"}
    (d / "summary.json").write_text(json.dumps(s))
    if with_report:
        (d / "report.html").write_text("<html></html>")


def test_index_is_newest_first_and_only_links_reports_that_exist(tmp_path):
    _summary(tmp_path, "old", "2026-01-01T00:00:00+00:00")
    _summary(tmp_path, "new", "2026-02-01T00:00:00+00:00")
    _summary(tmp_path, "half", "2026-03-01T00:00:00+00:00", with_report=False)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "summary.json").write_text("{not json")
    for name, data in (("deep", b"[" * 100_000 + b"]" * 100_000), ("list", b"[1]"), ("latin1", b'{"a": "\xe9"}')):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_bytes(data)
        (tmp_path / name / "report.html").write_text("x")
    page = pipeline.write_index(tmp_path).read_text()
    links = re.findall(r'href="([^"]+)"', page)
    assert links == ["new/report.html", "old/report.html"]
    assert all((tmp_path / link).is_file() for link in links)
    assert "700.0 tok/s @ C=64" in page and "C≈7.5" in page and "dyn: 98.0% (worst 90.0%)" in page
    assert pipeline.external_references(page) == []


def test_index_without_reports_says_so(tmp_path):
    page = pipeline.write_index(tmp_path).read_text()
    assert "no reports yet" in page and "<a " not in page


# The notebooks themselves ---------------------------------------------------------------

NOTEBOOK_DIR = ROOT / "notebooks"


@pytest.mark.parametrize("name", pipeline.NOTEBOOKS)
def test_notebook_is_paired_thin_and_committed_without_outputs(name):
    import jupytext

    nb = nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
    assert nb.metadata["jupytext"]["formats"] == "ipynb,py:percent"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), f"{name}.ipynb has outputs"
    assert [("parameters" in c.metadata.get("tags", [])) for c in code].count(True) == 1
    # The .py twin says the same: same cells, same sources (jupytext --sync keeps them so).
    py = jupytext.read(NOTEBOOK_DIR / f"{name}.py")
    assert [(c.cell_type, c.source) for c in py.cells] == [(c.cell_type, c.source) for c in nb.cells]
    # Thin: the logic lives in dynspec; a notebook is prose, parameters and calls.
    assert sum(len(c.source.splitlines()) for c in code) <= 60


@pytest.mark.slow  # every notebook end to end, a kernel each: `make test` runs it
def test_each_notebook_runs_with_its_default_parameters(tmp_path):
    """As in JupyterLab: the notebook's own kernel, cwd notebooks/, no parameters given but the
    runs folder (so that the test writes nothing into the checkout)."""
    import papermill as pm

    runs = tmp_path / "data" / "runs"

    def run(name):
        out = tmp_path / f"{name}.out.ipynb"
        params = {"runs_dir": str(runs)} if name in ("02_sweep", "03_report") else {}
        pm.execute_notebook(str(NOTEBOOK_DIR / f"{name}.ipynb"), str(out), cwd=str(NOTEBOOK_DIR),
                            parameters=params, progress_bar=False, execution_timeout=300)
        return nbformat.read(out, as_version=4)

    # 03 on a checkout with no runs only reads: it says to run the sweep and writes nothing.
    with pytest.raises(pm.PapermillExecutionError, match="no runs yet"):
        run("03_report")
    assert not runs.exists()
    sweep = run("02_sweep")
    assert len(list(runs.iterdir())) == 1
    assert "complete" in json.dumps([c.get("outputs") for c in sweep.cells])
    report = run("03_report")  # the run the sweep just made
    assert "Simulated" in json.dumps([c.get("outputs") for c in report.cells])
    env = json.dumps([c.get("outputs") for c in run("00_environment").cells])
    assert "no GPU" in env or "GPUs" in env
    patch = json.dumps([c.get("outputs") for c in run("01_patch").cells])
    assert "nothing changed" in patch


# Published reports ---------------------------------------------------------------------

def _published_report(reports: Path, run_id: str, backend: str) -> Path:
    """A committed report as a fresh clone has it: reports/<id>/ and no data/runs/<id>/."""
    d = reports / run_id
    d.mkdir(parents=True)
    (d / "report.html").write_text("<html>published</html>")
    (d / "summary.json").write_text(json.dumps({"backend": backend, "report": "report.html"}))
    return d


def test_a_published_report_is_never_replaced_without_overwrite(tmp_path):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(TINY_CONFIG)
    reports, runs = tmp_path / "reports", tmp_path / "runs"
    d = _published_report(reports, "published", "sim")
    proc = run_pipeline("--config", str(tiny), "--run-id", "published", "--reports-dir", str(reports),
                        "--runs-dir", str(runs), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "published report exists" in proc.stderr
    assert (d / "report.html").read_text() == "<html>published</html>" and not runs.exists()
    # --overwrite is the way to replace a sim report
    pc = pipeline.resolve(tiny, run_id="published", overwrite=True, runs_dir=runs, reports_dir=reports)
    assert pc.report_dir == d


def test_a_published_live_report_is_never_replaced(tmp_path):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(TINY_CONFIG)
    reports, runs = tmp_path / "reports", tmp_path / "runs"
    d = _published_report(reports, "measured", "live")
    for kw in ({}, {"overwrite": True}):
        with pytest.raises(pipeline.PipelineError, match="live"):
            pipeline.resolve(tiny, run_id="measured", runs_dir=runs, reports_dir=reports, **kw)
    assert (d / "report.html").read_text() == "<html>published</html>"


@pytest.mark.parametrize("damage", ["corrupt", "list", "link"])
def test_overwrite_on_a_damaged_or_linked_run_folder_is_one_line(tmp_path, damage):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(TINY_CONFIG)
    runs = tmp_path / "runs"
    run = runs / "x"
    if damage == "link":
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "keep.txt").write_text("keep")
        runs.mkdir()
        run.symlink_to(outside)
    else:
        run.mkdir(parents=True)
        (run / "run.json").write_text("{not json" if damage == "corrupt" else "[1, 2]")
    proc = run_pipeline("--config", str(tiny), "--run-id", "x", "--overwrite", "--reports-dir",
                        str(tmp_path / "reports"), "--runs-dir", str(runs), timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr and str(run) in proc.stderr
    if damage == "link":
        assert (tmp_path / "outside" / "keep.txt").read_text() == "keep"


def test_backend_defaults_to_the_configs(tmp_path):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(TINY_CONFIG)
    assert pipeline.resolve(tiny, run_id="a", runs_dir=tmp_path / "runs").backend == "sim"
    tiny.write_text(TINY_CONFIG.replace("backend: sim", "backend: emulate"))
    assert pipeline.resolve(tiny, run_id="b", runs_dir=tmp_path / "runs").backend == "emulate"
    tiny.write_text(TINY_CONFIG.replace("backend: sim\n", ""))  # a sweep config is live unless it says otherwise
    with pytest.raises(pipeline.PipelineError, match="model: fill in"):
        pipeline.resolve(tiny, run_id="c", runs_dir=tmp_path / "runs")


def test_version_and_index_column(tmp_path, capsys):
    from dynspec import __version__
    from dynspec.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"dynspec {__version__}"
    page = pipeline.write_index(tmp_path).read_text()
    assert "switching arm / best static arm per level" in page and "best policy" not in page


@pytest.mark.parametrize("cwd", ["repo root", "elsewhere"])
def test_the_sweep_notebook_finds_its_default_config_from_any_folder(tmp_path, cwd):
    """`papermill notebooks/02_sweep.ipynb` from the repo root (or anywhere): the default config,
    a path relative to the repository, is found; before, defaults were relative to notebooks/."""
    import papermill as pm

    where = ROOT if cwd == "repo root" else tmp_path
    runs = tmp_path / "runs"
    pm.execute_notebook(str(ROOT / "notebooks" / "02_sweep.ipynb"), str(tmp_path / "out.ipynb"),
                        parameters={"runs_dir": str(runs), "run_id": "from-anywhere"},
                        kernel_name=pipeline.ensure_kernel() and pipeline.KERNEL, cwd=str(where),
                        progress_bar=False)
    run = load_run(runs / "from-anywhere")
    assert run.config_name == "ci-tiny" and len(run.results) > 0


def _published_copy(pub, tmp_path: Path) -> tuple[str, ...]:
    """The published run and report the test run shares (`pub`), copied under tmp_path (an --overwrite test's
    starting point; a publish of its own costs a pipeline run), and the arguments that name them."""
    runs, reports, config = tmp_path / "runs", tmp_path / "reports", tmp_path / "tiny.yaml"
    shutil.copytree(pub.runs, runs)
    shutil.copytree(pub.reports, reports)
    config.write_text(TINY_CONFIG)
    return ("--config", str(config), "--run-id", pub.run_id, "--runs-dir", str(runs), "--reports-dir", str(reports))


def test_a_failed_overwrite_leaves_the_published_report_as_it_was(pub, tmp_path):
    """The report is built beside the published one and renamed into place once whole: an
    --overwrite that dies half-way (here its report notebook raises; Ctrl-C during `make publish`
    alike) used to delete report.html and summary.json before anything new existed."""
    common = _published_copy(pub, tmp_path)
    reports = tmp_path / "reports"
    published = {p.name: p.read_bytes() for p in (reports / pub.run_id).iterdir()}
    assert {"report.html", "summary.json"} <= set(published)

    nb_dir = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", nb_dir)
    nb = nbformat.read(nb_dir / "03_report.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("raise RuntimeError('killed half-way')"))
    nbformat.write(nb, nb_dir / "03_report.ipynb")
    second = run_pipeline(*common, "--overwrite", "--notebooks-dir", str(nb_dir))
    assert second.returncode == 1 and "killed half-way" in second.stderr
    assert {p.name: p.read_bytes() for p in (reports / pub.run_id).iterdir()} == published
    assert f'href="{pub.run_id}/report.html"' in (reports / "index.html").read_text()


def test_a_publish_cut_between_its_two_renames_is_undone_on_the_next_start(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_CONFIG)
    pc = pipeline.resolve(config, run_id="cut", runs_dir=tmp_path / "runs", reports_dir=tmp_path / "reports")
    pc.old_dir.mkdir(parents=True)  # the published report set aside, the new one not yet in place
    (pc.old_dir / "report.html").write_text("the published one")
    again = pipeline.resolve(config, run_id="cut", resume=False, overwrite=True, runs_dir=tmp_path / "runs",
                             reports_dir=tmp_path / "reports")
    assert (again.report_dir / "report.html").read_text() == "the published one"
    assert not again.old_dir.exists()


def test_a_report_another_command_is_building_is_refused_in_one_line(tmp_path):
    """Two `pipeline --overwrite` of one run id used to delete each other's folders."""
    from dynspec.io.lock import held, lock_file

    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_CONFIG)
    kw = dict(run_id="busy", runs_dir=tmp_path / "runs", reports_dir=tmp_path / "reports")
    pc = pipeline.resolve(config, **kw)
    with held(lock_file("report", pc.report_dir), "held {pid}", RuntimeError):
        with pytest.raises(pipeline.PipelineError, match=r"report busy is being built by another dynspec command "
                                                         rf"\(pid {os.getpid()}\); nothing changed"):
            pipeline.resolve(config, overwrite=True, **kw)
        with pytest.raises(pipeline.PipelineError, match="is being built by another dynspec command"):
            pipeline.run_pipeline(pc, echo=lambda *_: None)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "reports").exists()


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_an_interrupted_overwrite_is_one_line_and_leaves_the_published_report_byte_identical(pub, tmp_path, how):
    """SIGTERM used to kill the pipeline where it stood, with no message; Ctrl-C (SIGINT to the
    terminal's process group) printed the kernel's traceback of its closed sockets."""
    import signal
    import subprocess
    import sys
    import time

    common = _published_copy(pub, tmp_path)
    reports = tmp_path / "reports"
    published = {p.name: p.read_bytes() for p in (reports / pub.run_id).iterdir()}
    proc = subprocess.Popen([sys.executable, "-m", "dynspec", "pipeline", *common, "--overwrite"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    t0 = time.monotonic()
    while not (reports / f".{pub.run_id}.building" / "03_report.ipynb").exists() and time.monotonic() - t0 < 200:
        time.sleep(0.05)  # the report notebook's kernel is running a cell
    time.sleep(1.0)
    if how == "SIGTERM":
        proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("dynspec pipeline: interrupted")
    assert {p.name: p.read_bytes() for p in (reports / pub.run_id).iterdir()} == published

"""`dynspec pipeline`: a config -> executed notebooks -> a published, offline HTML report.

    reports/
      index.html                 a row per run: date, config, hardware, backend, headline figures
      <run-id>/
        pipeline.yaml            the resolved pipeline settings of this report
        provenance.json          argv, settings, dynspec version, git commit, machine (docs/PROVENANCE.md)
        00_environment.ipynb     the executed notebooks (kept, also when one fails)
        01_patch.ipynb
        02_sweep.ipynb           writes data/runs/<run-id>/
        03_report.ipynb
        report.html              03_report rendered: code hidden, figures embedded, no CDN
        summary.json             the headline figures the index shows

Notebooks run with papermill in the kernel the setup installs (`dynspec`, this
interpreter), each cell under a timeout.  A failing notebook stops the pipeline with
papermill's error and the failing cell; its executed notebook stays for inspection.

The settings and pipeline.yaml are pipeline_settings, the offline page pipeline_html, the index
pipeline_index, building beside the published report and renaming into place pipeline_publish.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

from pydantic import ValidationError

from dynspec.analysis.pipeline_html import external_references, render_html  # noqa: F401  (re-exported)
from dynspec.analysis.pipeline_index import write_index, write_summary
from dynspec.interrupt import sigterm_as_interrupt
from dynspec.io.atomic import remove_stale_temps
from dynspec.analysis.pipeline_publish import _prepare_dirs, _publish, _recover
from dynspec.analysis.pipeline_settings import KERNEL, NOTEBOOKS, PipelineConfig, PipelineError, _abs
from dynspec.analysis.pipeline_settings import (  # noqa: F401  (re-exported: pipeline.yaml and provenance.json)
    load_settings, save_provenance, save_settings, settings_data, settings_from_data)
from dynspec.io.jsonl import read_json
from dynspec.io.lock import held, lock_file
from dynspec.live.config import run_id_problem
from dynspec.models import validation_message
from dynspec.paths import REPO_ROOT


def resolve(config: str | Path, *, backend: str | None = None, run_id: str | None = None, resume: bool = False,
            overwrite: bool = False, runs_dir: str | Path = "data/runs", reports_dir: str | Path = "reports",
            notebooks_dir: str | Path | None = None, reference: str | Path | None = "default",
            compare_runs=(), kernel: str = KERNEL, cell_timeout_s: float | None = None,
            apply_patch: bool = False, patch_dry_run: bool = True, sglang_path: str | None = None) -> PipelineConfig:
    """Check everything that can be checked before any notebook runs; PipelineError names the problem."""
    from dynspec.live.config import ConfigError, check_live, load_config
    from dynspec.sim.profile import ProfileError, load_profile

    try:
        cfg = load_config(config)
        backend = backend or cfg.backend  # the config says where its numbers come from
        if backend == "live":
            check_live(cfg, str(config))
        else:
            load_profile(cfg.profile)
    except (ConfigError, ProfileError) as exc:
        raise PipelineError(str(exc)) from None
    if resume and overwrite:
        raise PipelineError("--resume continues a run and --overwrite replaces it: give one of them")
    if resume and run_id is None:
        raise PipelineError("--resume needs the --run-id of the run to continue")
    if run_id is None:
        run_id = f"{cfg.name}-{backend}-{time.strftime('%Y%m%d-%H%M%S')}"  # as dynspec.live.sweep names runs
    if run_id_problem(run_id):
        raise PipelineError(run_id_problem(run_id))
    nb_dir = _abs(notebooks_dir) if notebooks_dir else REPO_ROOT / "notebooks"
    missing = [n for n in NOTEBOOKS if not (nb_dir / f"{n}.ipynb").is_file()]
    if missing:
        raise PipelineError(f"{nb_dir}: missing notebooks {', '.join(m + '.ipynb' for m in missing)}")
    if reference == "default":
        from dynspec.analysis.report import DEFAULT_REFERENCE

        reference = DEFAULT_REFERENCE
    ref = _abs(reference) if reference else None
    if ref is not None and not ref.is_file():
        raise PipelineError(f"{ref}: no such reference table")
    others = [_abs(p) for p in compare_runs]
    for p in others:
        if not (p / "results.csv").is_file():
            raise PipelineError(f"{p}: not a run folder (no results.csv) to compare with")
    if cell_timeout_s is None:
        # A live sweep runs in one cell: every level of every arm, servers started and stopped.
        cell_timeout_s = 600.0 if backend == "sim" else 7 * 24 * 3600.0
    try:
        pc = PipelineConfig(config=_abs(config), backend=backend, run_id=run_id, resume=resume, overwrite=overwrite,
                            runs_dir=_abs(runs_dir), reports_dir=_abs(reports_dir), notebooks_dir=nb_dir,
                            reference=ref, compare_runs=others, kernel=kernel, cell_timeout_s=cell_timeout_s,
                            apply_patch=apply_patch, patch_dry_run=patch_dry_run, sglang_path=sglang_path)
    except ValidationError as exc:
        raise PipelineError(validation_message(exc)) from None
    for d in (pc.run_dir, pc.report_dir, pc.build_dir, pc.old_dir):
        if d.is_symlink():  # --overwrite would empty whatever it points at
            raise PipelineError(f"{d}: is a symbolic link; dynspec writes only into real folders")
    with _report_lock(pc):  # a publish another command has under way is not a cut one
        _recover(pc)
        if pc.report_dir.is_dir():  # what a killed write left, under the report's lock
            remove_stale_temps(pc.report_dir)
    run_exists = pc.run_dir.is_dir() and any(pc.run_dir.iterdir())
    # A fresh clone has reports/<id>/ committed and no data/runs/<id>/: the report alone is enough to guard.
    published = (pc.report_dir / "summary.json").is_file() or (pc.report_dir / "report.html").is_file()
    if resume and not (pc.run_dir / "run.json").is_file():
        raise PipelineError(f"{pc.run_dir}: nothing to resume (no run.json there)")
    if run_exists and not (resume or overwrite):
        raise PipelineError(f"{pc.run_dir}: run folder exists; pass --resume to continue it, "
                            f"--overwrite to replace it, or another --run-id")
    if published and not (resume or overwrite):
        raise PipelineError(f"{pc.report_dir}: a published report exists; pass --overwrite to replace it "
                            f"or choose another --run-id")
    if (run_exists or published) and (resume or overwrite):
        old = {_backend_of(pc.run_dir / "run.json"), _backend_of(pc.report_dir / "summary.json")}
        if overwrite and ("live" in old or backend == "live"):
            raise PipelineError(f"{pc.report_dir}: a live run is never overwritten; choose another --run-id")
        if resume and old - {None, backend}:  # the report would be cleared before the sweep refuses
            raise PipelineError(f"{pc.run_dir}: was run with backend {(old - {None, backend}).pop()}, not {backend}")
    return pc


def _backend_of(path: Path) -> str | None:
    """The backend a run.json or summary.json names; None when the file is absent."""
    if not path.exists():
        return None
    data = read_json(path, PipelineError)
    if not isinstance(data, dict):
        raise PipelineError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return str(data.get("backend"))


# Kernel -------------------------------------------------------------------------------

def _runs_this_python(argv0: str) -> bool:
    # jupyter_client puts sys.executable in place of a bare "python"; compare without resolving
    # symlinks, since a venv's python links to the interpreter it was made from.
    if argv0 in ("python", "python3", f"python3.{sys.version_info.minor}"):
        return True
    return os.path.abspath(argv0) == os.path.abspath(sys.executable)


def ensure_kernel(name: str = KERNEL) -> str:
    """The kernel papermill runs: this interpreter's, installed into sys.prefix if missing."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    ksm = KernelSpecManager()
    try:
        spec = ksm.get_kernel_spec(name)
    except NoSuchKernel:
        spec = None
    if spec is None:
        from ipykernel.kernelspec import install

        install(kernel_name=name, display_name=f"Python ({name})", prefix=sys.prefix)
        spec = KernelSpecManager().get_kernel_spec(name)
    if not _runs_this_python(spec.argv[0]):
        raise PipelineError(f"kernel {name!r} ({spec.resource_dir}) runs {spec.argv[0]}, not {sys.executable}; "
                            f"reinstall it with `{sys.executable} -m ipykernel install --prefix {sys.prefix} "
                            f"--name {name}` or pass --kernel")
    return spec.resource_dir


# Stages -------------------------------------------------------------------------------

class NotebookFailed(PipelineError):
    def __init__(self, stage: str, notebook: Path, exc: Exception):
        self.stage, self.notebook, self.exc = stage, notebook, exc
        cell = getattr(exc, "exec_count", None)
        ename, evalue = getattr(exc, "ename", type(exc).__name__), getattr(exc, "evalue", str(exc))
        where = f" at cell In [{cell}]" if cell is not None else ""
        super().__init__(f"{stage} failed{where}: {ename}: {evalue}")

    def details(self) -> str:
        """The failing cell's source and the end of its traceback, as papermill reported them."""
        source = getattr(self.exc, "source", "") or ""
        tb = getattr(self.exc, "traceback", None) or []
        tb_text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(tb))
        tail = "\n".join(tb_text.strip().splitlines()[-12:])
        return (f"failing cell:\n{_indent(source)}\ntraceback (end):\n{_indent(tail)}\n"
                f"executed notebook kept for inspection: {self.notebook}")


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def _kernel_manager_logging_to(log_path: Path):
    """nbclient's kernel manager, the kernel's own stderr into log_path: on Ctrl-C the kernel,
    its parent gone, printed a traceback of its closed sockets over the pipeline's one line.
    (Cells' output still reaches the notebook through the kernel's messages.)"""
    from jupyter_client.manager import AsyncKernelManager

    class _LoggingKernelManager(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd, **kw):
            with open(log_path, "ab") as log:  # the child keeps its own descriptor
                kw["stderr"] = log
                await super()._async_launch_kernel(kernel_cmd, **kw)

    return _LoggingKernelManager


def execute_notebook(pc: PipelineConfig, name: str, log_output: bool = False) -> Path:
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    src = pc.notebooks_dir / f"{name}.ipynb"
    out = pc.build_dir / f"{name}.ipynb"
    kernel_log = pc.build_dir / f"{name}.kernel.log"  # kept beside the notebook only when it failed
    try:
        pm.execute_notebook(str(src), str(out), parameters=pc.parameters()[name], kernel_name=pc.kernel,
                            execution_timeout=pc.cell_timeout_s, cwd=str(pc.notebooks_dir),
                            progress_bar=False, log_output=log_output,
                            kernel_manager_class=_kernel_manager_logging_to(kernel_log),
                            # ipykernel warns at every start that loopback TCP is unencrypted.
                            extra_arguments=["--IPKernelApp.log_level=ERROR"])
    except PapermillExecutionError as exc:
        raise NotebookFailed(name, out, exc) from None
    except Exception as exc:  # a cell timeout or a dead kernel: papermill saved what ran
        raise NotebookFailed(name, out, exc) from None
    kernel_log.unlink(missing_ok=True)
    return out


# Orchestration ------------------------------------------------------------------------

def _report_lock(pc: PipelineConfig):
    return held(lock_file("report", pc.report_dir),
                f"report {pc.run_id} is being built by another dynspec command (pid {{pid}})", PipelineError)


def run_pipeline(pc: PipelineConfig, *, echo=print, log_output: bool = False,
                 notebooks: tuple[str, ...] = NOTEBOOKS, command: str = "pipeline",
                 argv: list[str] | None = None) -> Path:
    """Run every stage, printing each one's time; return the report's path.  command and argv:
    what the report folder's provenance record says was invoked."""
    timings: dict[str, float] = {}
    t_all = time.perf_counter()

    def stage(name: str, fn):
        t0 = time.perf_counter()
        result = fn()
        timings[name] = time.perf_counter() - t0
        echo(f"[pipeline] {name:<15s} {timings[name]:6.1f} s")
        return result

    stage("kernel", lambda: ensure_kernel(pc.kernel))
    with _report_lock(pc):  # one command per report: two --overwrite would empty each other's folders
        _prepare_dirs(pc, command, argv)
        echo(f"[pipeline] run folder: {pc.run_dir} (its sweep.log says what happened)")
        for name in notebooks:
            if name == "02_sweep":
                with _following(pc.run_dir / "sweep.log", echo):
                    stage(name, lambda name=name: execute_notebook(pc, name, log_output))
            else:
                stage(name, lambda name=name: execute_notebook(pc, name, log_output))
        stage("render html", lambda: render_html(pc.build_dir / "03_report.ipynb",
                                                 pc.build_dir / "report.html", f"dynspec report: {pc.run_id}"))
        write_summary(pc, timings)
        _publish(pc)
        report = pc.report_dir / "report.html"
        index = stage("index", lambda: write_index(pc.reports_dir))
    echo(f"[pipeline] {'total':<15s} {time.perf_counter() - t_all:6.1f} s")
    echo(f"index:  {index}")
    echo(f"report: {report}")
    return report


@contextlib.contextmanager
def _following(log_path: Path, echo):
    """While the sweep notebook runs, echo each measured level from its sweep.log ("[level k/N,
    ETA m:ss]" lines): the notebook's kernel keeps its own output until the cell ends."""
    stop = threading.Event()
    start = log_path.stat().st_size if log_path.exists() else 0

    def follow():
        pos, rest = start, ""
        while True:
            done = stop.wait(0.5)
            try:
                with log_path.open(errors="replace") as f:
                    f.seek(pos)
                    chunk = f.read()
                    pos = f.tell()
            except OSError:
                chunk = ""
            lines = (rest + chunk).split("\n")
            rest = lines.pop()
            for line in lines:
                if "[level " in line:
                    echo("[sweep] " + line.split(" ", 3)[-1])
            if done:
                return

    t = threading.Thread(target=follow, name="dynspec-follow-sweep", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=5)


def resolve_report(run_dir: str | Path, *, reports_dir: str | Path = "reports", overwrite: bool = False,
                   compare_runs=(), reference: str | Path | None = "default") -> PipelineConfig:
    """A report of a run that exists (measured elsewhere, or interrupted): nothing is run again."""
    run_dir = _abs(run_dir)
    try:
        backend = json.loads((run_dir / "run.json").read_text())["backend"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PipelineError(f"{run_dir}: not a run folder with a readable run.json ({type(exc).__name__})") from None
    if (_abs(reports_dir) / run_dir.name).exists() and not overwrite:
        raise PipelineError(f"{_abs(reports_dir) / run_dir.name}: a report exists; pass --overwrite to replace it")
    return resolve(run_dir / "config.yaml", backend=backend, run_id=run_dir.name, resume=True,
                   runs_dir=run_dir.parent, reports_dir=reports_dir, compare_runs=compare_runs, reference=reference)


def _report_main(args) -> int:
    from dynspec.provenance import argv_of

    # The committed reports/ (and its index) change only when asked: a look at a run goes to build/.
    reports_dir = args.reports_dir or ("reports" if args.publish else "build/reports")
    try:
        pc = resolve_report(args.run_dir, reports_dir=reports_dir, overwrite=args.overwrite,
                            compare_runs=args.compare, reference=None if args.no_reference else "default")
        run_pipeline(pc, notebooks=("03_report",), command="report", argv=argv_of(args))
    except NotebookFailed as exc:  # before PipelineError, which it is
        print(f"dynspec report: {exc}", file=sys.stderr)
        return 1
    except PipelineError as exc:
        print(f"dynspec report: {exc}", file=sys.stderr)
        return 2
    return 0


# CLI ----------------------------------------------------------------------------------

def _main(args) -> int:
    prog = "dynspec pipeline"
    if args.verbose:  # papermill logs each cell's output at INFO
        import logging

        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        with sigterm_as_interrupt(quiet=not args.verbose):
            return _run(args, prog)
    except KeyboardInterrupt:  # one that landed after _run's own handler
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def _run(args, prog: str) -> int:
    from dynspec.provenance import argv_of
    from dynspec.analysis.report import ReportError

    try:
        pc = resolve(args.config, backend=args.backend, run_id=args.run_id, resume=args.resume,
                     overwrite=args.overwrite, runs_dir=args.runs_dir, reports_dir=args.reports_dir,
                     notebooks_dir=args.notebooks_dir, reference=None if args.no_reference else args.reference,
                     compare_runs=args.compare, kernel=args.kernel, cell_timeout_s=args.cell_timeout,
                     apply_patch=args.apply_patch, patch_dry_run=not args.patch_for_real,
                     sglang_path=args.sglang_path)
        run_pipeline(pc, log_output=args.verbose, argv=argv_of(args))
    except NotebookFailed as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        print(exc.details(), file=sys.stderr)
        return 1
    except PipelineError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except ReportError as exc:  # the run has nothing to summarise for the index
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; the notebooks executed so far are in {args.reports_dir}/<run-id>/; "
              f"continue with --resume --run-id <run-id>", file=sys.stderr)
        return 130
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("pipeline", help="run the notebooks for a config and publish reports/<run-id>/report.html")
    p.add_argument("--config", required=True, help="sweep config (YAML), e.g. configs/seed-blackwell.yaml")
    p.add_argument("--backend", choices=("sim", "emulate", "live"), default=None,
                   help="sim (in-process, virtual time), emulate, or live SGLang servers (default: the config's)")
    p.add_argument("--run-id", help="run and report folder name (default: <config name>-<backend>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue the sweep of --run-id, then report")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing sim/emulate run of --run-id and its report (never a live one)")
    p.add_argument("--runs-dir", default="data/runs", help="where run folders go (default: data/runs)")
    p.add_argument("--reports-dir", default="reports", help="where reports go (default: reports)")
    p.add_argument("--notebooks-dir", help="the notebooks to run (default: the checkout's notebooks/)")
    p.add_argument("--reference", default="default", help="the seed's table (default: data/reference/seed.csv)")
    p.add_argument("--no-reference", action="store_true", help="leave the seed's numbers out of the report")
    p.add_argument("--compare", action="append", default=[], metavar="RUN_DIR",
                   help="another run folder to draw beside this one (repeatable)")
    p.add_argument("--kernel", default=KERNEL, help=f"Jupyter kernel for papermill (default: {KERNEL}, "
                                                    f"installed for this interpreter when missing)")
    p.add_argument("--cell-timeout", type=float, metavar="SECONDS",
                   help="per-cell timeout (default: 600 for sim, a week for emulate and live)")
    p.add_argument("--apply-patch", action="store_true",
                   help="01_patch applies the dynamic-disable patch (a dry run unless --patch-for-real)")
    p.add_argument("--patch-for-real", action="store_true", help="with --apply-patch: change SGLang's files")
    p.add_argument("--sglang-path", help="the SGLang installation 01_patch looks at (default: the installed one)")
    p.add_argument("--verbose", action="store_true", help="echo every cell's output while it runs")
    p.set_defaults(func=_main)
    r = sub.add_parser("report", help="render build/reports/<run-id>/report.html (reports/ with --publish) from an "
                                      "existing run folder (runs nothing)")
    r.add_argument("run_dir", help="a run folder, e.g. data/runs/h200-llama8b-live")
    r.add_argument("--reports-dir", default=None,
                   help="where reports go (default: build/reports; reports with --publish)")
    r.add_argument("--publish", action="store_true",
                   help="publish into reports/ and its index.html (tracked files), not build/reports")
    r.add_argument("--compare", action="append", default=[], metavar="RUN_DIR",
                   help="another run folder to draw beside this one, e.g. its simulated twin (repeatable)")
    r.add_argument("--no-reference", action="store_true", help="leave the seed's numbers out of the report")
    r.add_argument("--overwrite", action="store_true", help="replace this run's existing report")
    r.set_defaults(func=_report_main)

"""reports/index.html: a row per published report (date, config, hardware, backend, headline
figures), read from each report's summary.json."""

from __future__ import annotations

import html
import json
from datetime import datetime, timezone
from pathlib import Path

from dynspec.analysis.pipeline_settings import PipelineConfig
from dynspec.io.atomic import write_text
from dynspec.io.jsonl import read_json


def write_summary(pc: PipelineConfig, timings: dict[str, float]) -> dict:
    from dynspec.analysis.report import headline, load_run

    summary = headline(load_run(pc.run_dir))
    summary.update(generated=datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds"),
                   report="report.html", stage_seconds={k: round(v, 2) for k, v in timings.items()})
    write_text(pc.build_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def _fmt_peak(p: dict | None) -> str:
    return "–" if not p else f"{p['output_throughput']:.1f} tok/s @ C={p['concurrency']}"


def _index_row(run_id: str, s: dict) -> str:
    from dynspec.analysis.report import two_figures

    e = html.escape
    x = s.get("crossover") or {}
    if x.get("status") == "crosses":
        cross = f"C≈{two_figures(x['concurrency'])}"  # interpolated between two levels: no finer
    else:
        cross = {"never-pays": "never pays", "always-pays": "always pays"}.get(x.get("status", ""), "–")
    best = s.get("best_policy")
    best_txt = "–" if not best else f"{best['arm']}: {best['mean_of_envelope']:.1%} (worst {best['worst_of_envelope']:.1%})"
    backend = s.get("backend", "")
    if backend in ("sim", "emulate") and s.get("profile"):
        backend = f"{backend} ({s['profile']})"
    link = f"{run_id}/{s.get('report', 'report.html')}"
    cells = [e(s.get("generated", "")[:19].replace("T", " ")), f'<a href="{e(link)}">{e(run_id)}</a>',
             e(s.get("config", "")), e(s.get("hardware", "")), e(backend), e(_fmt_peak(s.get("baseline_peak"))),
             e(_fmt_peak(s.get("eagle3_peak"))), e(cross), e(best_txt)]
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def write_index(reports_dir: Path) -> Path:
    """reports/index.html from every reports/<run-id>/summary.json, newest first."""
    rows = []
    for f in sorted(reports_dir.glob("*/summary.json")):
        if f.parent.name.startswith("."):  # a report being built or replaced
            continue
        try:
            s = read_json(f, ValueError)
        except ValueError:
            continue  # a half-written or foreign file: leave that run out rather than fail every index
        if not isinstance(s, dict):
            continue
        if (f.parent / s.get("report", "report.html")).is_file():
            rows.append((s.get("generated", ""), f.parent.name, s))
    rows.sort(key=lambda r: (r[0], r[1]), reverse=True)
    heads = ["date", "run (report)", "config", "hardware", "backend", "baseline peak", "EAGLE-3 peak",
             "EAGLE-3 crossover", "switching arm / best static arm per level: mean (worst)"]
    body = "\n".join(_index_row(run_id, s) for _, run_id, s in rows) or \
        f'<tr><td colspan="{len(heads)}">no reports yet: run <code>make report</code></td></tr>'
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dynspec reports</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; }} th, td {{ border: 1px solid #ccc; padding: 4px 10px; text-align: left; }}
th {{ background: #f2f2f2; }} tr:nth-child(even) td {{ background: #fafafa; }}
td:nth-child(1), td:nth-child(2) {{ white-space: nowrap; }}
</style></head>
<body>
<h1>dynspec reports</h1>
<p>One row per pipeline run (<code>dynspec pipeline</code>). Sim and emulate runs are simulated from a
profile, not measured; each report says so at the top.</p>
<table>
<thead><tr>{''.join(f'<th>{h}</th>' for h in heads)}</tr></thead>
<tbody>
{body}
</tbody>
</table>
</body></html>
"""
    out = reports_dir / "index.html"
    write_text(out, page)
    return out

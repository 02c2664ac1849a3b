"""Readers: the real sglang.bench_serving (0.5.9, from its wheel) against the emulator, read
back into the results table; vLLM `bench serve` JSON; the import-results command."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dynspec.live.readers import ReaderError, read_bench_serving, read_external, read_vllm_bench
from dynspec.results import RESULT_COLUMNS, read_table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynspec.realsglang import wheels as sglang_wheels  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench_serving_jsonl(tmp_path_factory) -> tuple[Path, dict]:
    """Run the real `python -m sglang.bench_serving` once against an emulated EAGLE-3 server."""
    import importlib.util

    missing = [m for m in ("transformers", "datasets", "pybase64", "PIL", "requests")
               if importlib.util.find_spec(m) is None]
    assert not missing, (f"sglang.bench_serving needs {', '.join(missing)}: run `make venv` "
                         f"(requirements/sglang-cpu.txt and requirements/bench-serving.txt)")
    from dynspec.live.servers import ArmServer, emulator_argv, free_port
    from dynspec.sglang.bench_serving import bench_serving_argv, build_tiny_tokenizer, run_bench_serving

    tmp = tmp_path_factory.mktemp("bench_serving")
    sglang_dir = sglang_wheels.unpack("0.5.9", tmp / "site")
    tok = build_tiny_tokenizer(tmp / "tokenizer")
    out = tmp / "bench.jsonl"
    port = free_port()
    with ArmServer("emu", emulator_argv("seed-blackwell", "eagle3", "127.0.0.1", port, 20.0, 0), port=port,
                   log_path=tmp / "emu.log", startup_timeout=60, shutdown_grace=10) as srv:
        srv.wait_healthy()
        argv = bench_serving_argv(host="127.0.0.1", port=port, tokenizer_dir=tok, concurrency=4, num_prompts=12,
                                  input_len=32, output_len=16, output_file=out, tag="eagle3-v2")
        p = run_bench_serving(sglang_dir, argv, timeout=300, cwd=tmp)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = out.read_text().splitlines()
    assert len(lines) == 1
    return out, json.loads(lines[0])


def test_real_bench_serving_jsonl_reads_into_the_table(bench_serving_jsonl):
    path, raw = bench_serving_jsonl
    (row,) = read_bench_serving(path)
    assert list(row) == RESULT_COLUMNS
    assert row["arm"] == "eagle3-v2" and row["concurrency"] == 4 and row["repeat"] == 0
    assert row["run_id"] == "bench" and row["backend"] == "live"
    assert row["completed"] == 12 and row["total_output_tokens"] == 12 * 16 and row["total_input_tokens"] == 12 * 32
    # The emulator tells /get_server_info it runs policy "always" (EAGLE-3 on every step).
    assert row["policy"] == "always"
    assert row["accept_length"] == raw["accept_length"] and row["accept_length"] > 1.0
    for ours, theirs in [("output_throughput", "output_throughput"), ("duration_s", "duration"),
                         ("mean_ttft_ms", "mean_ttft_ms"), ("p99_itl_ms", "p99_itl_ms"),
                         ("median_tpot_ms", "median_tpot_ms"), ("mean_e2e_ms", "mean_e2e_latency_ms"),
                         ("p99_e2e_ms", "p99_e2e_latency_ms")]:
        assert row[ours] == raw[theirs], ours
    assert math.isnan(row["spec_step_fraction"]) and math.isnan(row["failed"])  # not in the format


def test_repeats_numbered_and_arm_overridden(bench_serving_jsonl, tmp_path):
    path, raw = bench_serving_jsonl
    twice = tmp_path / "twice.jsonl"
    twice.write_text(path.read_text() * 2)
    rows = read_bench_serving(twice, arm="mine", run_id="r", profile="seed-blackwell")
    assert [(r["arm"], r["repeat"], r["run_id"], r["profile"]) for r in rows] == [
        ("mine", 0, "r", "seed-blackwell"), ("mine", 1, "r", "seed-blackwell")]


def test_import_results_command(bench_serving_jsonl, tmp_path):
    path, _ = bench_serving_jsonl
    vllm = tmp_path / "vllm.json"
    vllm.write_text(json.dumps(VLLM_RESULT))
    out = tmp_path / "table.parquet"
    p = subprocess.run([sys.executable, "-m", "dynspec", "import-results", str(path), str(vllm), "--out", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    df = read_table(out)
    assert list(df.arm) == ["eagle3-v2", "vllm-eagle3"] and list(df.concurrency) == [4, 16]
    p = subprocess.run([sys.executable, "-m", "dynspec", "import-results", str(tmp_path / "nope.jsonl"),
                        "--out", str(tmp_path / "x.csv")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and p.stderr.strip().endswith("nope.jsonl: no such file")
    assert not (tmp_path / "x.csv").exists()


# The keys `vllm bench serve --save-result --percentile-metrics ttft,tpot,itl,e2el` writes.
VLLM_RESULT = {
    "date": "20250101-000000", "backend": "vllm", "label": "vllm-eagle3", "model_id": "m", "num_prompts": 80,
    "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 16, "duration": 12.5, "completed": 78, "failed": 2,
    "total_input_tokens": 79872, "total_output_tokens": 19968, "request_throughput": 6.24,
    "request_goodput": None, "output_throughput": 1597.44, "total_token_throughput": 7987.2,
    "mean_ttft_ms": 40.0, "median_ttft_ms": 38.0, "std_ttft_ms": 5.0, "p99_ttft_ms": 70.0,
    "mean_tpot_ms": 9.0, "median_tpot_ms": 8.8, "std_tpot_ms": 1.0, "p99_tpot_ms": 12.0,
    "mean_itl_ms": 18.0, "median_itl_ms": 17.0, "std_itl_ms": 4.0, "p99_itl_ms": 30.0,
    "mean_e2el_ms": 2400.0, "median_e2el_ms": 2380.0, "std_e2el_ms": 50.0, "p99_e2el_ms": 2600.0,
    "spec_decode_acceptance_rate": 48.0, "spec_decode_acceptance_length": 2.44,
    "input_lens": [], "output_lens": [], "ttfts": [], "itls": [], "generated_texts": [], "errors": [],
}


def test_vllm_bench_serve_json(tmp_path):
    p = tmp_path / "vllm-c16.json"
    p.write_text(json.dumps(VLLM_RESULT))
    (row,) = read_vllm_bench(p)
    assert row["arm"] == "vllm-eagle3" and row["concurrency"] == 16 and row["run_id"] == "vllm-c16"
    assert (row["completed"], row["failed"], row["duration_s"]) == (78, 2, 12.5)
    assert row["mean_e2e_ms"] == 2400.0 and row["p99_e2e_ms"] == 2600.0 and row["median_itl_ms"] == 17.0
    assert row["accept_length"] == 2.44 and row["policy"] == "always"
    assert read_external(p) == [row]
    # Without e2el in --percentile-metrics the E2E columns are NaN, not invented.
    partial = {k: v for k, v in VLLM_RESULT.items() if "e2el" not in k and not k.startswith("spec_")}
    p.write_text(json.dumps(partial))
    (row,) = read_vllm_bench(p)
    assert math.isnan(row["mean_e2e_ms"]) and math.isnan(row["accept_length"]) and row["policy"] == ""


def test_open_loop_runs_percentiles_and_goodput_are_read(tmp_path):
    p = tmp_path / "vllm-rate4.json"
    p.write_text(json.dumps({**VLLM_RESULT, "request_rate": 4.0, "max_concurrency": None, "request_goodput": 3.5,
                             "p90_ttft_ms": 55.0, "p99.9_ttft_ms": 90.0, "p95_e2el_ms": 2550.0}))
    (row,) = read_vllm_bench(p)
    assert (row["concurrency"], row["request_rate"]) == (0, 4.0)
    assert (row["p90_ttft_ms"], row["p99.9_ttft_ms"], row["p95_e2e_ms"]) == (55.0, 90.0, 2550.0)
    assert row["request_goodput"] == 3.5 and math.isnan(row["p90_tpot_ms"])
    b = tmp_path / "bs.jsonl"  # bench_serving --request-rate 2 --max-concurrency 8
    good = {"completed": 1, "duration": 1.0, "output_throughput": 1.0, "mean_ttft_ms": 1.0, "request_rate": 2,
            "max_concurrency": 8, "p90_e2e_latency_ms": 7.0, "p95_itl_ms": 3.0}
    b.write_text(json.dumps(good) + "\n" + json.dumps({**good, "request_rate": "inf"}) + "\n")
    rows = read_bench_serving(b)
    assert [(r["concurrency"], r["request_rate"], r["repeat"]) for r in rows] == [(8, 2.0, 0), (8, math.inf, 0)]
    assert rows[0]["p90_e2e_ms"] == 7.0 and rows[0]["p95_itl_ms"] == 3.0


def test_reader_errors_name_file_and_line(tmp_path):
    p = tmp_path / "b.jsonl"
    good = {"completed": 1, "duration": 1.0, "output_throughput": 1.0, "mean_ttft_ms": 1.0, "max_concurrency": 2}
    p.write_text(json.dumps(good) + "\n{oops\n")
    with pytest.raises(ReaderError, match=r"b.jsonl:2: not JSON"):
        read_bench_serving(p)
    p.write_text(json.dumps({**good, "max_concurrency": None}) + "\n")
    with pytest.raises(ReaderError, match=r"b.jsonl:1: max_concurrency is None; a run is a level with"):
        read_bench_serving(p)
    p.write_text(json.dumps({**good, "request_rate": -1}) + "\n")
    with pytest.raises(ReaderError, match=r"b.jsonl:1: request_rate is '-1', not a rate"):
        read_bench_serving(p)
    p.write_text(json.dumps({"hello": 1}) + "\n")
    with pytest.raises(ReaderError, match=r"b.jsonl:1: not a benchmark result \(missing completed"):
        read_bench_serving(p)
    p.write_text("")
    with pytest.raises(ReaderError, match=r"b.jsonl: no results in the file"):
        read_bench_serving(p)
    v = tmp_path / "v.json"
    v.write_text("[1, 2]")
    with pytest.raises(ReaderError, match=r"v.json: expected a JSON object, got list"):
        read_vllm_bench(v)

"""dynspec's load generator against the real sglang.bench_serving, same emulated server, same machine.

Target: at C=256 against `dynspec emulate`, one core of dynspec's generator
handles at least 1.5x the streamed tokens/s of sglang.bench_serving (SGLang 0.5.9, run
offline: --dataset-name random-ids --tokenize-prompt, a small local tokenizer).

    .venv/bin/python benchmarks/bench_loadgen.py [--concurrency 256] [--num-prompts 1024]
        [--input-len 128] [--output-len 256] [--time-scale 20] [--repeats 2] [--out FILE.json]
        [--baseline-src DIR]

--baseline-src DIR adds a third client, "dynspec@baseline": the generator of another
source tree (DIR holds its dynspec package, e.g. `git archive COMMIT src | tar -x -C /tmp/old`
then /tmp/old/src), so a change to the generator is measured before and after, side by side
against the same emulator.  Both generators then run in child processes on the same CPU.

Both clients run on CPU 0, the emulator on CPU 1 (when the machine has two).  On a
small machine the emulator, not the client, may set the wall-clock pace, so the
figure of merit is the client's capacity: output tokens streamed per CPU-second the
client process spent in the measured phase (= tokens/s one fully busy core sustains).
The wall-clock output tok/s of each is printed beside it.

bench_serving's CPU is read from /proc/<pid>/stat when it prints "Starting main
benchmark run" (warm-up done) and when it prints its result table; that window also
holds its one-second sleep (no CPU) and its metric computation (re-tokenizing the
outputs), which the client would also do.  Exit status 1 when the ratio misses 1.5.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
TARGET = 1.5


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def run_dynspec(url: str, args) -> dict:
    try:
        from dynspec.live.bench import random_prompts, run_level
    except ImportError:  # a --baseline-src from before the subpackages (2026-11-30): dynspec/bench.py
        from dynspec.bench import random_prompts, run_level

    prompts = random_prompts(args.num_prompts, args.input_len, args.output_len, seed=args.seed)
    warm = random_prompts(2, args.input_len, args.output_len, seed=args.seed + 1)
    run_level(url, warm, 2)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    res = run_level(url, prompts, args.concurrency, request_timeout=600)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    tokens = sum(r.output_tokens for r in res.requests if r.ok)
    from dynspec.results import summarize

    return {"client": "dynspec", "tokens": tokens, "failed": res.failed, "cpu_s": cpu, "wall_s": wall,
            "output_throughput": summarize(res.requests)["output_throughput"]}


def run_child(url: str, args, src: str, name: str) -> dict:
    """run_dynspec in a child whose dynspec comes from `src` (it inherits the CPU pinning).  Both
    generators run this way when a baseline is measured: an A/A run (the same tree on both sides)
    measured the in-process client at 1.57x the CPU efficiency of the same code in a child."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, __file__, "--client-only", url, "--num-prompts", str(args.num_prompts),
            "--input-len", str(args.input_len), "--output-len", str(args.output_len),
            "--concurrency", str(args.concurrency), "--seed", str(args.seed)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the {name} client failed:\n{proc.stderr[-3000:]}")
    return {**json.loads(proc.stdout.splitlines()[-1]), "client": name}


def run_bench_serving(port: int, sglang_dir: Path, tok: Path, args, tmp: Path) -> dict:
    from dynspec.sglang.bench_serving import bench_serving_argv, offline_env

    out = tmp / f"bs-{time.monotonic_ns()}.jsonl"
    argv = bench_serving_argv(host="127.0.0.1", port=port, tokenizer_dir=tok, concurrency=args.concurrency,
                              num_prompts=args.num_prompts, input_len=args.input_len, output_len=args.output_len,
                              output_file=out, seed=args.seed, warmup_requests=2)
    proc = subprocess.Popen(argv, env=offline_env(sglang_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=tmp, preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    marks: dict[str, float] = {}
    tail: list[str] = []
    for line in proc.stdout:  # its own prints mark the measured phase
        tail = (tail + [line])[-40:]
        if "Starting main benchmark run" in line and "cpu0" not in marks:
            marks["cpu0"] = _cpu_seconds(proc.pid)
        elif "Serving Benchmark Result" in line and "cpu1" not in marks:
            marks["cpu1"] = _cpu_seconds(proc.pid)
    proc.wait()
    if proc.returncode != 0 or len(marks) != 2:
        raise SystemExit("sglang.bench_serving failed:\n" + "".join(tail))
    result = json.loads(out.read_text().splitlines()[-1])
    return {"client": "sglang.bench_serving", "tokens": result["total_output_tokens"],
            "failed": args.num_prompts - result["completed"], "cpu_s": marks["cpu1"] - marks["cpu0"],
            "wall_s": result["duration"], "output_throughput": result["output_throughput"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--num-prompts", type=int, default=1024)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--time-scale", type=float, default=20.0, help="emulator speed-up over the profile")
    ap.add_argument("--profile", default="seed-blackwell")
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs of each client; medians reported")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "loadgen.json"))
    ap.add_argument("--baseline-src", metavar="DIR", help="also run the generator of this source tree (before/after)")
    ap.add_argument("--client-only", metavar="URL", help=argparse.SUPPRESS)  # the baseline's child process
    args = ap.parse_args(argv)
    if args.client_only:
        print(json.dumps(run_dynspec(args.client_only, args)))
        return 0
    if args.baseline_src and not any((Path(args.baseline_src) / "dynspec" / f).is_file()
                                     for f in ("live/bench.py", "bench.py")):
        ap.error(f"--baseline-src {args.baseline_src}: no dynspec/live/bench.py (or dynspec/bench.py) there")

    from dynspec.realsglang import wheels as sglang_wheels

    from dynspec.live.servers import ArmServer, emulator_argv, free_port
    from dynspec.sglang.bench_serving import build_tiny_tokenizer

    two_cpus = len(os.sched_getaffinity(0)) >= 2
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        sglang_dir = sglang_wheels.unpack("0.5.9", tmp / "site")
        tok = build_tiny_tokenizer(tmp / "tokenizer")
        port = free_port()
        runs = []
        with ArmServer("emu", emulator_argv(args.profile, "baseline", "127.0.0.1", port, args.time_scale, 0),
                       port=port, log_path=tmp / "emu.log", startup_timeout=60) as srv:
            srv.wait_healthy()
            if two_cpus:
                os.sched_setaffinity(srv.proc.pid, {1})
                os.sched_setaffinity(0, {0})
            clients = {"dynspec": lambda: run_dynspec(srv.base_url, args),
                       "sglang.bench_serving": lambda: run_bench_serving(port, sglang_dir, tok, args, tmp)}
            if args.baseline_src:
                import dynspec

                here = str(Path(dynspec.__file__).resolve().parents[1])
                clients["dynspec"] = lambda: run_child(srv.base_url, args, here, "dynspec")
                clients["dynspec@baseline"] = lambda: run_child(srv.base_url, args, args.baseline_src,
                                                                "dynspec@baseline")
            for i in range(args.repeats):
                for client, run in clients.items():
                    r = run()
                    r["tokens_per_cpu_s"] = r["tokens"] / r["cpu_s"]
                    r["cpu_utilization"] = r["cpu_s"] / r["wall_s"]
                    runs.append(r)
                    print(f"  run {i} {client:22s} {r['output_throughput']:9.0f} tok/s wall  "
                          f"{r['tokens_per_cpu_s']:9.0f} tok per CPU-s  (CPU {100 * r['cpu_utilization']:.0f}%, "
                          f"{r['failed']} failed)", flush=True)
            lag = srv.scrape().metrics.get("dynspec_emulator_lag_seconds_total")

    def med(client, key):
        return statistics.median(r[key] for r in runs if r["client"] == client)

    ours, theirs = "dynspec", "sglang.bench_serving"
    ratio = med(ours, "tokens_per_cpu_s") / med(theirs, "tokens_per_cpu_s")
    wall_ratio = med(ours, "output_throughput") / med(theirs, "output_throughput")
    summary = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "config": vars(args),
        "machine": {"cpus": os.cpu_count(), "pinned": two_cpus, "platform": platform.platform()},
        "runs": runs, "emulator_lag_s": lag,
        "median": {c: {k: med(c, k) for k in ("output_throughput", "tokens_per_cpu_s", "cpu_utilization")}
                   for c in clients},
        "capacity_ratio": ratio, "wall_ratio": wall_ratio, "target": TARGET, "pass": ratio >= TARGET,
    }
    if args.baseline_src:
        base = "dynspec@baseline"
        summary["baseline"] = {"src": args.baseline_src,
                               "capacity_ratio": med(ours, "tokens_per_cpu_s") / med(base, "tokens_per_cpu_s"),
                               "wall_ratio": med(ours, "output_throughput") / med(base, "output_throughput")}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_name(out.name + ".tmp")
    tmp_out.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp_out, out)
    print(f"C={args.concurrency}, {args.num_prompts} prompts of {args.input_len}+{args.output_len} tokens, "
          f"emulator x{args.time_scale:g} (lag {lag or 0:.1f}s)")
    for c in clients:
        m = summary["median"][c]
        print(f"{c:22s} median {m['output_throughput']:9.0f} output tok/s wall, {m['tokens_per_cpu_s']:9.0f} "
              f"tok per client CPU-second (CPU {100 * m['cpu_utilization']:.0f}%)")
    print(f"capacity ratio (tok per CPU-s) {ratio:.2f}x (target {TARGET}x: {'PASS' if ratio >= TARGET else 'FAIL'}); "
          f"wall-clock ratio {wall_ratio:.2f}x -> {out}")
    if args.baseline_src:
        b = summary["baseline"]
        print(f"dynspec against dynspec@baseline ({args.baseline_src}): {b['capacity_ratio']:.2f}x tok per CPU-s, "
              f"{b['wall_ratio']:.2f}x wall-clock")
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())

"""Running the real `sglang.bench_serving`: the sweep's bench_serving driver, and offline on CPU.

`measure_level` is one level of `dynspec sweep` with driver bench_serving: the `python -m
sglang.bench_serving` of the server's environment with --max-concurrency or --request-rate,
its JSONL read by dynspec.live.readers into one results row.

Offline (tests, benchmarks/bench_loadgen.py): bench_serving needs a tokenizer even for --dataset-name random-ids (it takes the vocab
size from it, and re-tokenizes outputs); this builds a small word-level one from
nothing (the `tokenizers` library, no hub download) that transformers.AutoTokenizer
loads from a directory.  SGLang itself is not installed: its wheel is unpacked and put
on PYTHONPATH.  Used by the readers test and the load-generator benchmark.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path


def build_tiny_tokenizer(dest: str | Path, vocab_size: int = 32000, specials: tuple[str, ...] = ("[UNK]", "[PAD]"),
                         **config) -> Path:
    """A word-level tokenizer of vocab_size tokens (the specials, then "w<i>") in dest;
    `config` adds to or overrides its tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    vocab = {w: i for i, w in enumerate(specials)}
    vocab.update({f"w{i}": i for i in range(len(specials), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "pad_token": "[PAD]",
        "model_max_length": 1 << 20, **config}))
    return dest


def bench_serving_argv(*, host: str, port: int, tokenizer_dir: str | Path, concurrency: int, num_prompts: int,
                       input_len: int, output_len: int, output_file: str | Path, seed: int = 1,
                       warmup_requests: int = 1, backend: str = "sglang", tag: str | None = None,
                       progress: bool = False) -> list[str]:
    """bench_serving's command line for a closed-loop random-ids run of fixed lengths."""
    argv = [sys.executable, "-m", "sglang.bench_serving", "--backend", backend, "--host", host,
            "--port", str(port), "--model", str(tokenizer_dir), "--tokenizer", str(tokenizer_dir),
            "--dataset-name", "random-ids", "--tokenize-prompt",
            "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--random-range-ratio", "1.0", "--num-prompts", str(num_prompts),
            "--max-concurrency", str(concurrency), "--warmup-requests", str(warmup_requests),
            "--seed", str(seed), "--output-file", str(output_file)]
    if tag:
        argv += ["--tag", tag]
    if not progress:
        argv.append("--disable-tqdm")
    return argv


def offline_env(sglang_dir: str | Path, extra: dict | None = None) -> dict[str, str]:
    """Environment for bench_serving: the unpacked wheel first on the path, every hub offline."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(sglang_dir)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1",
               TOKENIZERS_PARALLELISM="false")
    env.update(extra or {})
    return env


def run_bench_serving(sglang_dir: str | Path, argv: list[str], *, timeout: float = 600,
                      cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=offline_env(sglang_dir), capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)


# The bench_serving driver of `dynspec sweep`: one level = one bench_serving run -------------------

_BACKENDS = {"generate": "sglang", "openai": "sglang-oai", "chat": "sglang-oai-chat"}


class DriverError(RuntimeError):
    """bench_serving could not measure the level; one line saying why."""


def bench_python(cfg, arm) -> str:
    """The interpreter whose sglang.bench_serving measures an arm: the config's bench_serving.python,
    else the arm's launch interpreter when it is one (`python -m sglang.launch_server ...`), else
    dynspec's own."""
    if cfg.bench_serving.python:
        return cfg.bench_serving.python
    launch = cfg.host_of(arm).launch  # an arm sharing a server is measured with its python
    first = launch[0] if launch else ""
    if first == "{python}" or not first:
        return sys.executable
    return first if Path(first).name.startswith("python") else sys.executable


def dataset_args(cfg, level_dir: Path, n: int, seed: int) -> list[str]:
    """bench_serving's dataset arguments for the config's prompts (what bench_serving_problem allows)."""
    p = cfg.prompts
    if p.source == "random":
        ratio = p.range_ratio if p.output_lens == "range" else 1.0
        return ["--dataset-name", "random-ids", "--tokenize-prompt", "--random-input-len", str(cfg.input_len),
                "--random-output-len", str(cfg.output_len), "--random-range-ratio", str(ratio)]
    path = p.path
    if p.source == "mtbench":  # bench_serving has no MT-bench reader: its first turns as ShareGPT pairs
        from dynspec.live.prompts import file_prompts

        pairs = [{"conversations": [{"from": "human", "value": q.text}, {"from": "gpt", "value": "-"}]}
                 for q in file_prompts("mtbench", p.path, n, cfg.output_len, seed=seed)]
        path = level_dir / "mtbench-as-sharegpt.json"
        path.write_text(json.dumps(pairs))
    args = ["--dataset-name", "sharegpt", "--dataset-path", str(path)]
    if p.output_lens == "fixed":
        args += ["--sharegpt-output-len", str(cfg.output_len)]
    return args


def level_argv(cfg, arm, level, *, host: str, port: int, num_prompts: int, seed: int, output_file: Path,
               level_dir: Path) -> list[str]:
    """The command line that measures one level of one arm."""
    tokenizer = cfg.bench_serving.tokenizer or cfg.model
    argv = [bench_python(cfg, arm), "-m", "sglang.bench_serving", "--backend", _BACKENDS[arm.api],
            "--host", host, "--port", str(port), "--model", str(tokenizer), "--tokenizer", str(tokenizer),
            "--num-prompts", str(num_prompts), "--seed", str(seed), "--warmup-requests", str(cfg.warmup_requests),
            "--output-file", str(output_file), "--output-details", "--disable-tqdm", "--tag", arm.name]
    argv += dataset_args(cfg, level_dir, num_prompts, seed)
    if level.closed:
        argv += ["--max-concurrency", str(level.concurrency)]
    else:
        argv += ["--request-rate", f"{level.rate:g}"]
        if level.concurrency:
            argv += ["--max-concurrency", str(level.concurrency)]
    return argv + list(cfg.bench_serving.extra_args)


def driver_env(cfg) -> dict[str, str]:
    env = dict(os.environ)
    extra = [str(Path(p).resolve()) for p in cfg.bench_serving.pythonpath]
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(extra + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def records_from_details(obj: dict) -> list:
    """Per-request records from bench_serving's --output-details: TTFT, ITLs, output tokens and errors.
    It records no send times: each record starts at 0 and ends at TTFT + its ITLs (E2E)."""
    from dynspec.results import RequestRecord

    ttfts, itls = obj.get("ttfts") or [], obj.get("itls") or []
    outs, ins, errors = obj.get("output_lens") or [], obj.get("input_lens") or [], obj.get("errors") or []
    recs = []
    for i, ttft in enumerate(ttfts):
        gaps = [float(x) for x in (itls[i] if i < len(itls) and itls[i] else [])]
        err = errors[i] if i < len(errors) else ""
        ok = not err and ttft is not None and ttft > 0
        t = float(ttft or 0.0)
        recs.append(RequestRecord(start=0.0, end=t + sum(gaps), output_tokens=int(outs[i]) if i < len(outs) else 0,
                                  input_tokens=int(ins[i]) if i < len(ins) else 0, ttft=t if ok else None,
                                  itls=gaps, ok=ok, error=str(err)[:300] if err else ""))
    return recs


def measure_level(cfg, arm, level, *, host: str, port: int, num_prompts: int, seed: int, level_dir: Path,
                  name: str, timeout: float) -> tuple[dict, list]:
    """Run bench_serving for one level; return (metric columns, per-request records).

    The row's numbers are bench_serving's (dynspec.live.readers); the percentiles it does not print
    (TTFT/TPOT p90/p95, extra ones) and the SLO goodput are computed from its per-request details,
    with its duration.  Its output, command first, goes to LEVEL_DIR/NAME.log."""
    from dynspec.live.readers import ReaderError, bench_serving_row
    from dynspec.results import METRIC_COLUMNS, summarize

    level_dir.mkdir(parents=True, exist_ok=True)
    out = level_dir / f"{name}.jsonl"
    if out.exists():  # bench_serving appends: an earlier attempt's file is kept under another name
        k = 1
        while out.with_name(f"{name}.attempt{k}.jsonl").exists():
            k += 1
        os.replace(out, out.with_name(f"{name}.attempt{k}.jsonl"))
    argv = level_argv(cfg, arm, level, host=host, port=port, num_prompts=num_prompts, seed=seed, output_file=out,
                      level_dir=level_dir)
    log_path = level_dir / f"{name}.log"
    try:
        with log_path.open("w") as logf:
            logf.write(" ".join(argv) + "\n\n")
            logf.flush()
            p = subprocess.run(argv, env=driver_env(cfg), stdout=logf, stderr=subprocess.STDOUT, timeout=timeout,
                               cwd=level_dir)
    except subprocess.TimeoutExpired:
        raise DriverError(f"sglang.bench_serving did not finish within {timeout:g}s (log: {log_path})") from None
    except OSError as exc:
        raise DriverError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    if p.returncode != 0 or not out.is_file():
        said = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines()[1:] if ln.strip()]
        tail = " | ".join(said[-2:]) or "no output"
        raise DriverError(f"sglang.bench_serving exited with code {p.returncode}: {tail[-400:]} (log: {log_path})")
    lines = [line for line in out.read_text().splitlines() if line.strip()]
    try:
        obj = json.loads(lines[-1])
        row = bench_serving_row(obj, where=str(out))
    except (ValueError, IndexError, ReaderError) as exc:
        raise DriverError(f"{out}: not a bench_serving result ({' '.join(str(exc).split())[:200]})") from None
    recs = records_from_details(obj)
    mine = summarize(recs, **cfg.summary_args())
    metrics = {k: v for k, v in row.items() if k in METRIC_COLUMNS}
    for k, v in mine.items():  # what bench_serving does not report, from its details
        if k not in metrics or (isinstance(metrics[k], float) and math.isnan(metrics[k])):
            metrics[k] = v
    if cfg.metrics.slo and row["duration_s"] > 0:
        from dynspec.results import good_requests

        metrics["request_goodput"] = good_requests(recs, cfg.metrics.slo.as_dict()) / row["duration_s"]
    return metrics, recs

"""Running the real `sglang.bench_serving` offline, against an emulated server.

bench_serving needs a tokenizer even for --dataset-name random-ids (it takes the vocab
size from it, and re-tokenizes outputs); this builds a small word-level one from
nothing (the `tokenizers` library, no hub download) that transformers.AutoTokenizer
loads from a directory.  SGLang itself is not installed: its wheel is unpacked and put
on PYTHONPATH.  Used by the readers test and the load-generator benchmark.
"""

from __future__ import annotations

import json
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

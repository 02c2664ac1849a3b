"""What a level sends: prompts and their output lengths, from random ids or a dataset file.

Sources (the config's `prompts.source`):
  random    random token ids below vocab_size (seeded), input_len each, as bench_serving's random-ids
  jsonl     one object per line: {"prompt": text} or {"input_ids": [...]}, optional "output_len"
  sharegpt  ShareGPT's format, a JSON list (or JSONL) of {"conversations": [{"from", "value"}, ...]}:
            as bench_serving, the first turn is the prompt, the second the reference reply, and
            conversations of fewer than two turns are left out
  mtbench   MT-bench's question.jsonl: {"question_id", "category", "turns": [...]}: the first turn
Output lengths (`prompts.output_lens`): fixed (the config's output_len), dataset (the file's:
"output_len" of a jsonl line, the ShareGPT reply's tokens), or range (uniform in
[range_ratio x output_len, output_len], seeded, as bench_serving's --random-range-ratio; with
random prompts the input length is drawn the same way).  A reply's tokens are counted with
`prompts.tokenizer` (a Hugging Face tokenizer folder) when given, else as the emulator counts
text: one token per 4 UTF-8 bytes.  Nothing is downloaded: the files are the user's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dynspec.io.jsonl import read_json, read_jsonl, read_text
from dynspec.sim.lengths import draw_lengths, level_lengths

SOURCES = ("random", "jsonl", "sharegpt", "mtbench")


@dataclass(frozen=True)
class Prompt:
    """One request's input: token ids or text, and how many tokens to generate (ignore_eos)."""

    output_len: int
    input_ids: tuple[int, ...] | None = None
    text: str | None = None

    @property
    def input_len(self) -> int:
        """Known input length (token ids); 0 for text, which the server counts."""
        return len(self.input_ids) if self.input_ids is not None else 0

    @property
    def tokens(self) -> int:
        """Input tokens: the ids, or the text counted as the emulator counts it."""
        return self.input_len or count_text_tokens(self.text or "")


class PromptError(ValueError):
    """A prompt file that cannot be used; one line naming the file and line."""


def count_text_tokens(text: str) -> int:
    """Tokens of a text without a tokenizer: one per 4 UTF-8 bytes, at least one (the emulator's rule)."""
    return max(1, math.ceil(len(text.encode("utf-8")) / 4))


def prompt_classes(n: int, k: int, order: str) -> list[int]:
    """The id class of each of n prompts over k classes: in turn prompt by prompt (interleaved), or
    in k consecutive blocks as equal as n allows (in_turn)."""
    if order == "in_turn":
        return [i * k // n for i in range(n)]
    return [i % k for i in range(n)]


def random_prompts(n: int, input_len: int, output_len: int, *, vocab_size: int = 32000, seed: int = 0,
                   range_ratio: float = 1.0, id_ranges: Sequence[Sequence[int]] | None = None,
                   class_order: str = "interleaved") -> list[Prompt]:
    """n prompts of random token ids (seeded): input_len ids each generating output_len tokens, or
    lengths drawn in [range_ratio x len, len].  Ids avoid the lowest 1000, where tokenizers keep
    their special tokens; with id_ranges, each prompt draws from one [lo, hi) class instead
    (prompt_classes)."""
    rng = random.Random(seed)
    ranges = [tuple(r) for r in id_ranges] if id_ranges else [(min(1000, vocab_size // 2), vocab_size)]
    classes = prompt_classes(n, len(ranges), class_order)
    if range_ratio >= 1.0:
        ins, outs = [input_len] * n, [output_len] * n
    else:
        pairs = level_lengths(seed, n, input_len, output_len, range_ratio)
        ins, outs = [i for i, _ in pairs], [o for _, o in pairs]
    return [Prompt(o, input_ids=tuple(rng.randrange(*ranges[c]) for _ in range(i)))
            for i, o, c in zip(ins, outs, classes)]


# Dataset files: each reader gives (prompt, reference output length or None) ---------------------

def _counter(tokenizer: str | None):
    if not tokenizer:
        return count_text_tokens
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
    except Exception as exc:  # noqa: BLE001 - any failure to load is the user's path or package
        raise PromptError(f"prompts.tokenizer: cannot load {tokenizer} ({' '.join(str(exc).split())[:200]})") from None
    return lambda text: max(1, len(tok.encode(text, add_special_tokens=False)))


def _read_jsonl(path: Path, count) -> list[tuple[Prompt, int | None]]:
    out = []
    for i, obj in read_jsonl(path, PromptError):
        if not isinstance(obj, dict):
            raise PromptError(f"{path}:{i}: each line is an object with prompt or input_ids")
        n = obj.get("output_len")
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise PromptError(f"{path}:{i}: output_len must be a positive integer")
        if isinstance(obj.get("input_ids"), list) and obj["input_ids"]:
            ids = obj["input_ids"]
            if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                raise PromptError(f"{path}:{i}: input_ids must be non-negative integers")
            out.append((Prompt(1, input_ids=tuple(ids)), n))
        elif isinstance(obj.get("prompt"), str) and obj["prompt"]:
            out.append((Prompt(1, text=obj["prompt"]), n))
        else:
            raise PromptError(f"{path}:{i}: needs a non-empty prompt (text) or input_ids (list of ints)")
    return out


def _records(path: Path, what: str) -> list[tuple[str, object]]:
    """(where, value) of each record of a JSON list or a JSONL file."""
    text = read_text(path, PromptError).lstrip()
    if text.startswith("["):
        data = read_json(path, PromptError)
        assert isinstance(data, list)  # JSON text that opens with "[" is a list
        return [(f"{path}: item {i}", v) for i, v in enumerate(data)]
    if not text.startswith("{"):
        raise PromptError(f"{path}: a {what} file is a JSON list or JSON Lines of objects")
    return [(f"{path}:{i}", v) for i, v in read_jsonl(path, PromptError)]


def _read_sharegpt(path: Path, count) -> list[tuple[Prompt, int | None]]:
    out: list[tuple[Prompt, int | None]] = []
    for _, conv in _records(path, "ShareGPT"):
        turns = conv.get("conversations", conv.get("conversation")) if isinstance(conv, dict) else None
        # As bench_serving: the first turn is the prompt; conversations need two turns.
        if isinstance(turns, list) and len(turns) >= 2 and all(isinstance(t, dict) for t in turns[:2]):
            text = turns[0].get("value", turns[0].get("content"))
            reply = turns[1].get("value", turns[1].get("content"))
            if isinstance(text, str) and text and isinstance(reply, str):
                out.append((Prompt(1, text=text), count(reply) if reply else None))
    return out


def _read_mtbench(path: Path, count) -> list[tuple[Prompt, int | None]]:
    out: list[tuple[Prompt, int | None]] = []
    for where, q in _records(path, "MT-bench question"):
        turns = q.get("turns") if isinstance(q, dict) else None
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0]:
            raise PromptError(f"{where}: an MT-bench question needs turns, a list of strings")
        out.append((Prompt(1, text=turns[0]), None))
    return out


_READERS = {"jsonl": _read_jsonl, "sharegpt": _read_sharegpt, "mtbench": _read_mtbench}


def file_prompts(source: str, path: str | Path, n: int, output_len: int, *, seed: int = 0,
                 output_lens: str = "fixed", range_ratio: float = 1.0, tokenizer: str | None = None) -> list[Prompt]:
    """n prompts from a dataset file: shuffled with the seed, reused in turn if fewer than n."""
    path = Path(path)
    if not path.is_file():
        raise PromptError(f"{path}: no such prompt file")
    if source not in _READERS:
        raise PromptError(f"unknown prompt source {source!r} ({', '.join(SOURCES)})")
    count = _counter(tokenizer) if output_lens == "dataset" and source == "sharegpt" else count_text_tokens
    pool = _READERS[source](path, count)
    if not pool:
        raise PromptError(f"{path}: no usable prompts")
    if output_lens == "dataset":
        missing = sum(n_out is None for _, n_out in pool)
        if missing == len(pool):
            raise PromptError(f"{path}: output_lens dataset, but the file gives no output lengths "
                              f"(use output_lens fixed or range)")
        pool = [(p, o) for p, o in pool if o is not None]  # as bench_serving: unusable rows are left out
    random.Random(seed).shuffle(pool)
    chosen = [pool[i % len(pool)] for i in range(n)]
    outs: list[int]
    if output_lens == "dataset":
        outs = [o for _, o in chosen if o is not None]  # all of them: the pool kept known lengths only
    elif output_lens == "range":
        outs = draw_lengths(random.Random(f"lengths-{seed}"), n, output_len, range_ratio)
    else:
        # a jsonl line's own output_len is kept (as before 2026-11-30); otherwise the config's
        outs = [o if source == "jsonl" and o is not None else output_len for _, o in chosen]
    return [Prompt(o, p.input_ids, p.text) for (p, _), o in zip(chosen, outs)]


def build_prompts(prompts_cfg, n: int, input_len: int, output_len: int, seed: int) -> list[Prompt]:
    """The prompts of one level from the config's `prompts` section."""
    if prompts_cfg.source == "random":
        ratio = prompts_cfg.range_ratio if prompts_cfg.output_lens == "range" else 1.0
        return random_prompts(n, input_len, output_len, vocab_size=prompts_cfg.vocab_size, seed=seed,
                              range_ratio=ratio, id_ranges=prompts_cfg.id_ranges,
                              class_order=prompts_cfg.class_order)
    return file_prompts(prompts_cfg.source, prompts_cfg.path, n, output_len, seed=seed,
                        output_lens=prompts_cfg.output_lens, range_ratio=prompts_cfg.range_ratio,
                        tokenizer=prompts_cfg.tokenizer)

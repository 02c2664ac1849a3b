"""Prompt sources (dynspec.live.prompts): ShareGPT and MT-bench files made here, output lengths from the
dataset, fixed or by a range ratio; nothing downloaded."""

from __future__ import annotations

import json
import re

import pytest

from dynspec.live.config import parse_config
from dynspec.live.prompts import PromptError, count_text_tokens, file_prompts, random_prompts

CONVS = [
    {"id": "a", "conversations": [{"from": "human", "value": "What is a transformer?"},
                                  {"from": "gpt", "value": "w5 w6 w7 w8 w9 w10 w11 w12"}]},
    {"id": "b", "conversations": [{"from": "human", "value": "Say hi"}, {"from": "gpt", "value": "w1 w2"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "one turn only"}]},  # left out, as bench_serving
    {"id": "d", "conversation": [{"role": "user", "content": "Chat style"},
                                 {"role": "assistant", "content": "w3 w4 w5"}]},
]
QUESTIONS = [{"question_id": 81, "category": "writing", "turns": ["Compose a travel blog post.", "Rewrite it."]},
             {"question_id": 82, "category": "math", "turns": ["What is 2+2?", "And 3+3?"]}]


@pytest.fixture()
def files(tmp_path):
    sj = tmp_path / "share.json"
    sj.write_text(json.dumps(CONVS))
    sl = tmp_path / "share.jsonl"
    sl.write_text("".join(json.dumps(c) + "\n" for c in CONVS))
    mt = tmp_path / "question.jsonl"
    mt.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return sj, sl, mt


def test_sharegpt_json_and_jsonl_give_first_turns_and_reply_lengths(files, tmp_path):
    sj, sl, _ = files
    a = file_prompts("sharegpt", sj, 6, 99, seed=1, output_lens="dataset")
    assert a == file_prompts("sharegpt", sl, 6, 99, seed=1, output_lens="dataset")  # either layout
    want = {"What is a transformer?": count_text_tokens("w5 w6 w7 w8 w9 w10 w11 w12"),
            "Say hi": count_text_tokens("w1 w2"), "Chat style": count_text_tokens("w3 w4 w5")}
    assert {p.text: p.output_len for p in a} == want  # every usable conversation, reused in turn
    assert all(p.output_len == 99 for p in file_prompts("sharegpt", sj, 4, 99, output_lens="fixed"))
    from dynspec.sglang.bench_serving import build_tiny_tokenizer

    tok = build_tiny_tokenizer(tmp_path / "tok", vocab_size=64)  # word-level: one token per "w<i>"
    c = file_prompts("sharegpt", sj, 3, 99, output_lens="dataset", tokenizer=str(tok))
    assert {p.text: p.output_len for p in c} == {"What is a transformer?": 8, "Say hi": 2, "Chat style": 3}


def test_mtbench_first_turns_with_fixed_or_ranged_lengths(files):
    _, _, mt = files
    ps = file_prompts("mtbench", mt, 40, 100, seed=0, output_lens="range", range_ratio=0.5)
    assert {p.text for p in ps} == {"Compose a travel blog post.", "What is 2+2?"}
    lens = [p.output_len for p in ps]
    assert min(lens) >= 50 and max(lens) <= 100 and len(set(lens)) > 10  # drawn, not fixed
    assert lens == [p.output_len for p in file_prompts("mtbench", mt, 40, 100, seed=0, output_lens="range",
                                                       range_ratio=0.5)]  # seeded
    with pytest.raises(PromptError, match="gives no output lengths"):
        file_prompts("mtbench", mt, 2, 100, output_lens="dataset")
    bad = mt.with_name("bad.jsonl")
    bad.write_text('{"question_id": 1, "turns": []}\n')
    with pytest.raises(PromptError, match=r"bad.jsonl:1: an MT-bench question needs turns"):
        file_prompts("mtbench", bad, 1, 8)
    bad.write_text("hello")
    with pytest.raises(PromptError, match="a MT-bench question file is a JSON list or JSON Lines"):
        file_prompts("mtbench", bad, 1, 8)


def test_random_prompts_range_ratio_draws_both_lengths():
    ps = random_prompts(200, 100, 50, seed=3, range_ratio=0.25)
    ins, outs = [len(p.input_ids) for p in ps], [p.output_len for p in ps]
    assert min(ins) >= 25 and max(ins) <= 100 and min(outs) >= 12 and max(outs) <= 50
    assert len(set(ins)) > 30 and sum(outs) / len(outs) == pytest.approx(31, rel=0.1)
    assert all(len(p.input_ids) == 100 and p.output_len == 50 for p in random_prompts(5, 100, 50))


def test_a_sim_sweep_sends_the_datasets_lengths_and_the_report_names_the_source(files, tmp_path):
    from dynspec.analysis import report
    from dynspec.live.sweep import run_sweep

    sj, _, _ = files
    cfg = parse_config({"name": "share", "backend": "sim", "profile": "seed-blackwell", "concurrency": [2],
                        "num_prompts": 12, "prompts": {"source": "sharegpt", "path": str(sj), "output_lens": "dataset"},
                        "arms": [{"name": "baseline", "sim_arm": "baseline"}]})
    res = run_sweep(cfg, run_id="s", runs_dir=tmp_path / "runs", progress=False)
    run = report.load_run(res.run_dir)
    row = run.results.iloc[0]
    ps = file_prompts("sharegpt", sj, 12, 256, seed=0, output_lens="dataset")
    assert row["total_output_tokens"] == sum(p.output_len for p in ps)  # the replies' lengths, not output_len
    assert row["total_input_tokens"] == sum(p.tokens for p in ps)
    assert "prompts: ShareGPT file `share.json`, output lengths from the dataset" in report.run_summary(run)


def _classes_cfg(**prompts):
    return parse_config({"name": "cls", "backend": "sim", "concurrency": [2], "num_prompts": 10,
                         "prompts": {"source": "random", **prompts},
                         "arms": [{"name": "baseline", "sim_arm": "baseline"}]})


def test_prompt_classes_draw_each_prompt_from_one_id_range_in_turn_or_in_blocks():
    """A crafted model's classes of token ids accept at their own rates; in_turn shifts a level's
    closed-loop clients from one class to the next mid-level (an acceptance shift)."""
    from dynspec.live.prompts import build_prompts

    ranges = [[1000, 3048], [3048, 5096]]
    blocks = build_prompts(_classes_cfg(id_ranges=ranges, class_order="in_turn").prompts, 10, 16, 8, seed=0)
    inter = build_prompts(_classes_cfg(id_ranges=ranges).prompts, 10, 16, 8, seed=0)

    def cls(p):
        (c,) = {0 if i < 3048 else 1 for i in p.input_ids}  # every id of a prompt in one class
        assert all(1000 <= i < 5096 for i in p.input_ids)
        return c

    assert [cls(p) for p in blocks] == [0] * 5 + [1] * 5
    assert [cls(p) for p in inter] == [0, 1] * 5
    # no classes: the draws of before (ids from 1000 below the vocabulary size), seed for seed
    plain = build_prompts(_classes_cfg(vocab_size=5096).prompts, 10, 16, 8, seed=0)
    assert [p.input_ids for p in plain] == [p.input_ids for p in random_prompts(10, 16, 8, vocab_size=5096, seed=0)]


@pytest.mark.parametrize("prompts, what", [
    ({"id_ranges": [[10, 10]]}, "id_ranges: [10, 10] is empty"),
    ({"id_ranges": []}, "give at least one [lo, hi] range"),
    ({"id_ranges": [[1, 2, 3]]}, "id_ranges.0"),
    ({"id_ranges": [[5, 9]], "source": "sharegpt", "path": "x.json"}, "id_ranges is only for source random"),
])
def test_bad_id_ranges_are_refused(prompts, what):
    from dynspec.live.config import ConfigError

    with pytest.raises(ConfigError, match=re.escape(what)):
        _classes_cfg(**prompts)

"""Crafted real-shaped models: a target that follows a planted cycle and an EAGLE-3 head right on a
chosen share of positions (dynspec.realsglang.crafted), checked at reduced width and depth on CPU:
the construction in plain torch and transformers, and the accept length a real SGLang 0.5.9 server
measures with it."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("torch", reason="requirements/sglang-cpu.txt installs the CPU torch")

from dynspec.realsglang import crafted  # noqa: E402

SMALL = dict(active=256, draft_vocab=2048)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    c = crafted.Crafted(crafted.small_dims(8), accuracy=(0.9, 0.3), **SMALL)
    out = tmp_path_factory.mktemp("crafted")
    crafted.write(out, c, dtype="float32")
    return out, c


def test_the_draft_is_right_on_exactly_its_share_of_each_class(models):
    out, c = models
    for k in c.classes():
        n = k["hi"] - k["lo"]
        # over a whole cycle every token is the input once: the share is exact
        assert crafted.draft_accuracy(out, k["lo"], n) == round(k["accuracy"] * n) / n


def test_the_target_follows_the_cycle_and_stays_in_its_class(models):
    import torch
    from transformers import LlamaForCausalLM

    out, c = models
    g = torch.load(out / "cycle.pt")
    model = LlamaForCausalLM.from_pretrained(out / "target", dtype=torch.float32).eval()
    rng = random.Random(0)
    for k in c.classes():
        ids = [rng.randrange(k["lo"], k["hi"]) for _ in range(12)]
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=24, do_sample=False, pad_token_id=0)[0].tolist()
        seq = gen[len(ids) - 1:]
        assert all(int(g[a - c.first_id]) + c.first_id == b for a, b in zip(seq, seq[1:]))
        assert all(k["lo"] <= t < k["hi"] for t in seq)


def test_accept_length_follows_the_accuracy():
    assert crafted.accept_length(0.6, 3) == pytest.approx(1 + 0.6 + 0.36 + 0.216)
    assert crafted.accept_length(0.0, 3) == 1.0 and crafted.accept_length(1.0, 3) == 4.0


@pytest.mark.parametrize("text, why", [("0.6,x", "a number"), ("1.5", "a number"), ("", "a number")])
def test_a_bad_accuracy_is_one_line(text, why):
    with pytest.raises(crafted.CraftError, match=why):
        crafted.parse_accuracy(text)


def test_shapes_that_cannot_be_built_are_refused():
    with pytest.raises(crafted.CraftError, match="hidden size"):
        crafted.Crafted(crafted.small_dims(), active=512, draft_vocab=2048)
    with pytest.raises(crafted.CraftError, match="one of"):
        crafted.crafted("llama-9000", "0.6")
    with pytest.raises(crafted.CraftError, match="split into"):
        crafted.Crafted(crafted.small_dims(), accuracy=(0.5, 0.5, 0.5), active=256, draft_vocab=2048)


@pytest.mark.slow
def test_a_real_server_accepts_what_the_accuracy_predicts(models, tmp_path):
    """Real SGLang 0.5.9 (EAGLE-3, spec v2, 3 steps) on this CPU, the patched server speculating on
    every step, at batch 1 and 4: accept length within 0.1 of 1 + p + p^2 + p^3 in each class."""
    from concurrent.futures import ThreadPoolExecutor

    from dynspec.live.server_info import dynspec_state
    from dynspec.realsglang.arms import Arm, generate, server_info, start_arms

    out, c = models
    rng = random.Random(1)
    with start_arms([Arm("always", patched=True, policy="always")], out, tmp_path / "logs") as servers:
        s = servers["always"]
        for k in c.classes():
            for conc in (1, 4):
                before = dynspec_state(server_info(s))
                prompts = [[rng.randrange(k["lo"], k["hi"]) for _ in range(16)] for _ in range(conc * 2)]
                with ThreadPoolExecutor(conc) as pool:
                    list(pool.map(lambda p: generate(s.base_url, p, 40), prompts))
                after = dynspec_state(server_info(s))
                n = after["request_steps_speculated"] - before["request_steps_speculated"]
                got = 1 + (after["drafts_accepted"] - before["drafts_accepted"]) / n
                assert got == pytest.approx(k["accept_length"], abs=0.1), (k, conc, got)

"""`dynspec calibrate`: the random-weight model computes the right thing, and the CLI
writes a valid measured profile (CPU, tiny preset; no timing assertions)."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import pytest

from dynspec.calibrate import run as cal
from dynspec.calibrate import model_shapes as shapes
from dynspec.cli import main
from dynspec.sim.profile import load_profile

torch = pytest.importorskip("torch", reason="the calibrate extra: pip install -e '.[calibrate]'")
from dynspec.calibrate import random_model as rm  # noqa: E402 (it imports torch)

DIMS = shapes.PRESETS["tiny"]
F64 = torch.float64  # correctness checks in double precision: differences are bugs, not rounding


def naive_attention(q, k, v, pos):
    """Reference: kv heads repeated, explicit causal mask with offset, softmax in float64."""
    _, t, h, d = q.shape
    g = h // k.shape[1]
    k, v = k.repeat_interleave(g, 1).double(), v.repeat_interleave(g, 1).double()
    scores = q.transpose(1, 2).double() @ k.transpose(-1, -2) / d ** 0.5  # [b, h, t, s]
    allowed = torch.arange(k.shape[2])[None, :] <= (pos + torch.arange(t))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)


@pytest.mark.parametrize("pos,t", [(0, 6), (9, 1), (9, 4), (1, 3)])
def test_grouped_attention_matches_naive(pos, t):
    g = torch.Generator().manual_seed(pos * 10 + t)
    q = torch.randn(3, t, 8, 16, generator=g, dtype=F64)
    k = torch.randn(3, 2, pos + t, 16, generator=g, dtype=F64)
    v = torch.randn(3, 2, pos + t, 16, generator=g, dtype=F64)
    assert torch.allclose(rm.attend(q, k, v, pos), naive_attention(q, k, v, pos), atol=1e-10)


def test_attention_self_check_reports_small_errors():
    errors = rm.check_attention(DIMS, torch.float32, torch.device("cpu"), context_len=33, queries=[4, 8])
    assert sorted(errors) == [1, 4, 8] and all(0 <= e < 1e-5 for e in errors.values())
    errors = rm.check_attention(DIMS, torch.bfloat16, torch.device("cpu"), context_len=33, queries=[4])
    assert all(1e-5 < e < 3e-2 for e in errors.values())  # bf16 rounding, measured: not zero


def test_attention_refuses_a_cache_of_the_wrong_length():
    q = torch.zeros(1, 2, 4, 16)
    with pytest.raises(ValueError, match="cached keys"):
        rm.attend(q, torch.zeros(1, 2, 5, 16), torch.zeros(1, 2, 5, 16), 4)


@pytest.fixture(scope="module")
def target():
    return rm.TargetModel(DIMS, F64, torch.device("cpu"), max_len=64, seed=0)


def test_kv_cached_decode_matches_full_forward(target):
    """Token by token through the KV cache gives the logits of one forward over the whole prefix."""
    tokens = torch.randint(0, DIMS.vocab, (2, 12), generator=torch.Generator().manual_seed(1))
    full, _ = target.forward(tokens, target.new_cache(2, 64), 0)
    full = target.logits(full)
    cache = target.new_cache(2, 64)
    h, _ = target.forward(tokens[:, :5], cache, 0)  # prefill the first 5
    assert torch.allclose(target.logits(h), full[:, :5], atol=1e-9)
    for p in range(5, 12):
        h, _ = target.forward(tokens[:, p:p + 1], cache, p)
        assert torch.allclose(target.logits(h)[:, 0], full[:, p], atol=1e-9), f"position {p}"
    # and the positions matter: decoding token 11 as if at position 10 gives other logits
    h, _ = target.forward(tokens[:, 11:12], cache.batch(2), 11)
    assert torch.allclose(target.logits(h)[:, 0], full[:, 11], atol=1e-9)


def test_verify_of_k_tokens_equals_k_decode_steps(target):
    tokens = torch.randint(0, DIMS.vocab, (3, 14), generator=torch.Generator().manual_seed(2))
    prefix, k = 10, 4
    seq = target.new_cache(3, 64)
    target.forward(tokens[:, :prefix], seq, 0)
    ver = rm.KVCache([x.clone() for x in seq.k], [x.clone() for x in seq.v])
    steps = [target.logits(target.forward(tokens[:, p:p + 1], seq, p)[0])[:, 0] for p in range(prefix, prefix + k)]
    h, aux = target.forward(tokens[:, prefix:prefix + k], ver, prefix, aux=True)
    assert torch.allclose(target.logits(h), torch.stack(steps, 1), atol=1e-9)
    assert len(aux) == 3 and all(a.shape == (3, k, DIMS.hidden) for a in aux)
    for i in range(DIMS.layers):  # both wrote the same keys and values
        assert torch.allclose(ver.k[i][:, :, :prefix + k], seq.k[i][:, :, :prefix + k], atol=1e-9)


def test_draft_extend_equals_sequential_draft_forwards(target):
    draft = rm.DraftHead(target, draft_vocab=100, seed=1)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, DIMS.vocab, (2, 4), generator=g)
    hidden3 = torch.randn(2, 4, 3 * DIMS.hidden, generator=g, dtype=F64)  # the target's aux states
    pre = torch.randint(0, DIMS.vocab, (2, 6), generator=g)
    a, b = draft.new_cache(2, 64), draft.new_cache(2, 64)
    for c in (a, b):  # the same 6 tokens of draft context in both caches
        draft.forward(pre, torch.randn(2, 6, 3 * DIMS.hidden, generator=torch.Generator().manual_seed(4),
                                       dtype=F64), c, 0)
    hn, out = draft.forward(tokens, hidden3, a, 6)
    for i in range(4):
        hn_i, out_i = draft.forward(tokens[:, i:i + 1], hidden3[:, i:i + 1], b, 6 + i)
        assert torch.allclose(hn[:, i:i + 1], hn_i, atol=1e-9) and torch.allclose(out[:, i:i + 1], out_i, atol=1e-9)
    assert draft.logits(hn).shape == (2, 4, 100)
    # its own hidden state (width H) skips the fc: fed back, it is a valid input
    assert draft.forward(tokens[:, :1], out[:, -1:], b, 10)[0].shape == (2, 1, DIMS.hidden)


def test_verify_step_counts_accepted_drafts(target):
    """A draft is accepted only while every draft before it equals the target's greedy choice."""
    draft = rm.DraftHead(target, draft_vocab=100)
    tcache, dcache = target.new_cache(3, 64), draft.new_cache(3, 64)
    tcache.fill_random(torch.Generator().manual_seed(5))
    steps = rm.StepSet(target, draft, tcache, dcache, bs=3, context_len=20, num_steps=3)
    # Request r's draft number wrong[r] is wrong; every other draft is the target's greedy choice
    # after the tokens before it, so drafts after a wrong one match too but must not count.
    wrong = [None, 1, 2]
    chosen = [steps.tokens[:, :1].clone()]
    for i in range(3):  # one decode step at a time, into the positions the verify will rewrite
        h, _ = target.forward(chosen[-1], steps.tcache, 20 + i)
        nxt = target.logits(h)[:, -1:].argmax(-1)
        for r, w in enumerate(wrong):
            if w == i + 1:
                nxt[r] = (nxt[r] + 1) % DIMS.vocab
        chosen.append(nxt)
    steps.tokens.copy_(torch.cat(chosen, 1))
    steps.verify()
    assert steps.out_accept.tolist() == [4, 1, 2]
    assert steps.out_aux.shape == (3, 4, 3 * DIMS.hidden) and steps.out_aux.abs().sum() > 0


def test_step_pieces_run_and_write_their_outputs(target):
    draft = rm.DraftHead(target, draft_vocab=100)
    steps = rm.StepSet(target, draft, target.new_cache(4, 64), draft.new_cache(4, 64), bs=3, context_len=30,
                        num_steps=3)
    for out in (steps.out_token, steps.out_drafts):
        out.fill_(-1)
    steps.plain()
    assert ((steps.out_token >= 0) & (steps.out_token < DIMS.vocab)).all()
    steps.draft_chain()
    assert steps.out_drafts.shape == (3, 2) and set(steps.out_drafts.flatten().tolist()) <= set(draft.hot_ids.tolist())
    steps.out_token.fill_(-1)
    steps.extend()
    assert set(steps.out_token.tolist()) <= set(draft.hot_ids.tolist())


# An independent Llama / EAGLE-3 forward, no cache, float64: RoPE as explicit rotations of the
# dimension pairs (i, i + D/2), attention by naive_attention.
def ref_rope(x, positions):  # x [B, T, n, D]
    d = x.shape[-1]
    out = x.clone()
    for i in range(d // 2):
        ang = positions.double() * DIMS.rope_theta ** (-2 * i / d)
        c, s = ang.cos()[None, :, None], ang.sin()[None, :, None]
        out[..., i] = x[..., i] * c - x[..., i + d // 2] * s
        out[..., i + d // 2] = x[..., i + d // 2] * c + x[..., i] * s
    return out


def ref_norm(x, w):
    return x / (x.pow(2).mean(-1, keepdim=True) + DIMS.norm_eps).sqrt() * w


def ref_attention(layer, x):
    b, t, _ = x.shape
    hd, h, kv = DIMS.head_dim, DIMS.heads, DIMS.kv_heads
    qkv = x @ layer.wqkv.T
    q = qkv[..., :h * hd].reshape(b, t, h, hd)
    k = qkv[..., h * hd:(h + kv) * hd].reshape(b, t, kv, hd)
    v = qkv[..., (h + kv) * hd:].reshape(b, t, kv, hd)
    pos = torch.arange(t)
    out = naive_attention(ref_rope(q, pos), ref_rope(k, pos).transpose(1, 2), v.transpose(1, 2), 0)
    return out.reshape(b, t, h * hd) @ layer.wo.T


def ref_mlp(layer, x):
    gate, up = (x @ layer.w13.T).chunk(2, -1)
    return (gate * torch.sigmoid(gate) * up) @ layer.w2.T


def ref_target_logits(m, tokens):
    x = m.embed[tokens]
    for layer in m.layers:
        x = x + ref_attention(layer, ref_norm(x, layer.ln_attn))
        x = x + ref_mlp(layer, ref_norm(x, layer.ln_mlp))
    return ref_norm(x, m.norm) @ m.lm_head.T


def ref_draft(d, tokens, hidden3):
    hidden = hidden3 @ d.fc.T
    x = torch.cat([ref_norm(d.embed[tokens], d.layer.ln_attn), ref_norm(hidden, d.ln_hidden)], -1)
    r = hidden + ref_attention(d.layer, x)
    out = r + ref_mlp(d.layer, ref_norm(r, d.layer.ln_mlp))
    return ref_norm(out, d.norm) @ d.lm_head.T, out


def test_target_matches_a_reference_llama_forward(target):
    tokens = torch.randint(0, DIMS.vocab, (2, 9), generator=torch.Generator().manual_seed(6))
    ref = ref_target_logits(target, tokens)
    cache = target.new_cache(2, 64)
    h, _ = target.forward(tokens[:, :6], cache, 0)  # the prefill path
    assert torch.allclose(target.logits(h), ref[:, :6], atol=1e-9)
    h, _ = target.forward(tokens[:, 6:], cache, 6)  # the verify path, over the cache
    assert torch.allclose(target.logits(h), ref[:, 6:], atol=1e-9)


def test_draft_head_matches_a_reference_eagle3_forward(target):
    draft = rm.DraftHead(target, draft_vocab=100, seed=1)
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, DIMS.vocab, (2, 7), generator=g)
    hidden3 = torch.randn(2, 7, 3 * DIMS.hidden, generator=g, dtype=F64)
    ref_logits, ref_out = ref_draft(draft, tokens, hidden3)
    cache = draft.new_cache(2, 64)
    draft.forward(tokens[:, :3], hidden3[:, :3], cache, 0)
    hn, out = draft.forward(tokens[:, 3:], hidden3[:, 3:], cache, 3)  # an extend over the cache
    assert torch.allclose(draft.logits(hn), ref_logits[:, 3:], atol=1e-9)
    assert torch.allclose(out, ref_out[:, 3:], atol=1e-9)


def test_prefill_prompts_fill_at_most_one_chunk():
    def prompts(input_len, batch_sizes=(1, 128)):
        return cal.prefill_prompts(cal.CalibrateConfig(shape="tiny", accept_length=2, name="x", out=Path("x.yaml"),
                                                       draft_vocab=10, input_len=input_len, batch_sizes=batch_sizes))
    assert prompts(1024) == [1, 2, 4, 8]  # up to 8192 tokens, SGLang's default chunk
    assert prompts(1100) == [1, 2, 4]  # 8 x 1100 would overflow it
    assert prompts(16, (1, 2, 4)) == [1, 2, 4]  # no more prompts than the largest batch
    assert prompts(20000) == [1]


def test_fit_prefill_recovers_a_line():
    fixed, per_token = cal.fit_prefill({256: 2 + 0.01 * 256, 512: 2 + 0.01 * 512, 1024: 2 + 0.01 * 1024})
    assert fixed == pytest.approx(2.0) and per_token == pytest.approx(0.01)
    assert cal.fit_prefill({8: 1.0}) == (1.0, 0.0)
    assert cal.fit_prefill({100: 5.0, 200: 4.0})[1] == 0.0  # never a negative per-token cost
    assert cal.fit_prefill({100: 0.5, 200: 2.0})[0] == 0.0  # nor a negative fixed cost


TINY = ["calibrate", "--shape", "tiny", "--device", "cpu", "--dtype", "float32", "--draft-vocab", "100",
        "--batch-sizes", "1,2,4", "--context", "24", "--input-len", "16", "--repeats", "3", "--warmup", "1",
        "--accept-length", "2.5", "--name", "tiny-cpu"]


def test_cli_writes_a_valid_measured_profile(tmp_path, capsys):
    out = tmp_path / "profiles" / "tiny-cpu.yaml"
    assert main(TINY + ["--out", str(out)]) == 0
    p = load_profile(out)
    assert p.name == "tiny-cpu"
    [table] = p.steps
    assert table.batch_size == [1, 2, 4] and table.context_len == 24
    for key in ("plain_ms", "draft_ms", "verify_ms", "extend_ms", "catchup_ms", "resume_ms", "extend_eager_ms"):
        times = getattr(table, key)
        assert len(times) == 3 and all(t > 0 for t in times), key
    # a switching server's plain step now pays the KV-only catch-up, and a switch the resume
    # At a knot the lookup is the knot's time, floored at half of batch 1's (profile._interp): on a
    # busy machine batch 1's median can come out over twice another's, and then the floor holds.
    assert p.catch_up_time(2) == pytest.approx(max(table.catchup_ms[1], table.catchup_ms[0] / 2) / 1000)
    assert p.resume_time(4) == pytest.approx(max(table.resume_ms[2], table.resume_ms[0] / 2) / 1000)
    assert any(a.startswith("catchup: ") and "no attention, MLP or LM head" in a for a in p.provenance.assumptions)
    assert table.spec_ms is None  # the speculative step is given in its parts
    assert sorted(table.forward_ms) == [1, 2, 4, 8] and table.forward_ms[1] == table.plain_ms
    assert p.speculative.num_steps == 3 and p.speculative.num_draft_tokens == 4 and p.speculative.topk == 1
    assert p.acceptance.accept_length == 2.5
    assert p.prefill.fixed_ms >= 0 and p.prefill.per_token_ms >= 0
    prov = p.provenance
    assert prov.kind == "measured"
    assert "tiny shapes" in prov.source and "float32" in prov.source and "median of 3" in prov.source
    assert any("accept_length 2.5" in a and "not measured" in a for a in prov.assumptions)
    assert any(a.startswith("random weights") for a in prov.assumptions)
    # the recorded command is complete: parsed again it gives the same configuration
    argv = shlex.split(prov.command)
    assert argv[:2] == ["dynspec", "calibrate"]
    parser = argparse.ArgumentParser()
    cal.add_cli(parser.add_subparsers())
    again = cal.config_from_args(parser.parse_args(argv[1:]))
    assert again == cal.config_from_args(parser.parse_args(TINY + ["--out", str(out)]))
    # the raw timings: every repeat of every point, beside the profile
    raw = json.loads((out.parent / "tiny-cpu.raw.json").read_text())
    assert list(raw["steps"]) == ["24"] and sorted(raw["steps"]["24"]) == ["1", "2", "4"]
    points = raw["steps"]["24"]
    kinds = [*cal.STEP_KINDS, "forward_q2", "forward_q4", "forward_q8"]
    assert all(sorted(points[bs]) == sorted(kinds) and len(points[bs][k]["ms"]) == 3 for bs in points for k in kinds)
    assert [(int(n), v["prompts"]) for n, v in raw["prefill"].items()] == [(16, 1), (32, 2), (64, 4)]
    assert sorted(x.name for x in out.parent.iterdir()) == [  # no temp files
        "tiny-cpu.raw.json", "tiny-cpu.yaml", "tiny-cpu.yaml.provenance.json"]
    printed = capsys.readouterr().out
    assert "spec/plain" in printed and "catchup" in printed and "ext-eager" in printed and "(validated)" in printed


def test_cli_one_step_chain_has_no_draft_forward(tmp_path):
    out = tmp_path / "one.yaml"
    argv = [a for a in TINY if a != "2.5"]
    argv[argv.index("--accept-length") + 1:argv.index("--accept-length") + 1] = ["1.6"]
    assert main(argv + ["--num-steps", "1", "--out", str(out)]) == 0
    p = load_profile(out)
    assert p.steps[0].draft_ms == [0.0, 0.0, 0.0] and all(t > 0 for t in p.steps[0].verify_ms)
    assert p.speculative.num_draft_tokens == 2


def _with(option, value):
    argv = list(TINY)
    if option in argv:
        argv[argv.index(option) + 1] = value
    else:
        argv += [option, value]
    return argv


BAD = [
    (_with("--shape", "llama-9"), "unknown --shape 'llama-9' (a preset: llama-3.1-8b, tiny; or a path to a config.json)"),
    (_with("--shape", "nowhere/config.json"), "nowhere/config.json: cannot read"),
    (_with("--context", "4096,1024"), "--context: must be positive, strictly increasing integers, got 4096,1024"),
    (_with("--tokens-per-request", "0,4"), "--tokens-per-request: must be positive"),
    (_with("--tokens-per-request", "1,x"), "--tokens-per-request takes comma-separated integers"),
    (_with("--draft-layers", "0"), "--draft-layers: Input should be greater than or equal to 1"),
    (_with("--batch-sizes", "4,2"), "--batch-sizes: must be at least two positive, strictly increasing"),
    (_with("--batch-sizes", "8"), "--batch-sizes: must be at least two"),
    (_with("--batch-sizes", "0,1"), "--batch-sizes: must be at least two positive"),
    (_with("--batch-sizes", "1,two"), "--batch-sizes takes comma-separated integers"),
    (_with("--accept-length", "1.0"), "--accept-length must be in (1, 4] for --num-steps 3"),
    (_with("--accept-length", "4.5"), "--accept-length must be in (1, 4]"),
    (_with("--num-steps", "1"), "--accept-length must be in (1, 2] for --num-steps 1"),
    (_with("--num-steps", "0"), "--num-steps: Input should be greater than or equal to 1"),
    (_with("--draft-vocab", "1000"), "--draft-vocab 1000 exceeds the tiny vocabulary (512)"),
    (_with("--context", "0"), "--context: must be positive"),
    (_with("--dtype", "int8"), "--dtype: must be one of bfloat16, float16, float32"),
    (_with("--device", "tpu"), "--device: must be cuda, cuda:N or cpu"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[m.split(" ")[0] + "-" + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "p.yaml"
    assert main(argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dynspec calibrate: ") and message in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir())


def test_out_must_be_yaml(tmp_path, capsys):
    assert main(TINY + ["--out", str(tmp_path / "p.json")]) == 2
    assert "p.json: a profile is written as .yaml" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_no_cuda_is_one_line(tmp_path, capsys):
    assert main(_with("--device", "cuda") + ["--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err == "dynspec calibrate: no CUDA device: torch.cuda.is_available() is False (use --device cpu)\n"


# --shape: a Hugging Face config.json ------------------------------------------------


LLAMA_8B_CONFIG = {  # the fields of meta-llama/Llama-3.1-8B's config.json that set the shapes
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "vocab_size": 128256, "torch_dtype": "bfloat16",
}


def test_hf_config_gives_the_presets_shapes(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_8B_CONFIG))
    assert shapes.resolve_shape(str(path)) == shapes.PRESETS["llama-3.1-8b"]
    nested = {"text_config": {**LLAMA_8B_CONFIG, "head_dim": 96, "num_key_value_heads": None}}
    path.write_text(json.dumps(nested))
    dims = shapes.resolve_shape(str(path))
    assert dims.head_dim == 96 and dims.kv_heads == 32 and dims.hidden == 4096  # explicit head_dim; MHA


@pytest.mark.parametrize("content,message", [
    ("{not json", "not JSON"),
    ("[" * 100_000 + "]" * 100_000, "config.json: not JSON (nested too deeply)"),
    ("\udc80", "config.json: not UTF-8 text"),
    ("[1, 2]", "a config.json is a JSON object"),
    (json.dumps({k: v for k, v in LLAMA_8B_CONFIG.items() if k not in ("vocab_size", "hidden_size")}),
     "missing or not an integer: hidden_size, vocab_size"),
    (json.dumps({**LLAMA_8B_CONFIG, "num_local_experts": 8}), "a mixture-of-experts model"),
    (json.dumps({**LLAMA_8B_CONFIG, "num_key_value_heads": 5}), "must split into kv_heads groups"),
])
def test_bad_hf_config_is_one_line_naming_the_file(tmp_path, capsys, content, message):
    path = tmp_path / "config.json"
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    assert main(_with("--shape", str(path)) + ["--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dynspec calibrate: ") and message in err and err.count("\n") == 1
    assert sorted(x.name for x in tmp_path.iterdir()) == ["config.json"]


def test_cli_on_a_config_json_and_two_contexts(tmp_path, capsys):
    config = tmp_path / "tiny-model" / "config.json"
    config.parent.mkdir()
    d = shapes.PRESETS["tiny"]
    config.write_text(json.dumps({"hidden_size": d.hidden, "num_hidden_layers": d.layers, "num_attention_heads": d.heads,
                                  "num_key_value_heads": d.kv_heads, "intermediate_size": d.intermediate,
                                  "vocab_size": d.vocab}))
    out = tmp_path / "two.yaml"
    argv = _with("--shape", str(config))
    argv[argv.index("--context") + 1] = "24,40"
    assert main(argv + ["--tokens-per-request", "2,4", "--draft-layers", "2", "--out", str(out)]) == 0
    p = load_profile(out)
    assert [t.context_len for t in p.steps] == [24, 40] and p.context_aware
    assert all(sorted(t.forward_ms) == [1, 2, 4] for t in p.steps)
    assert "tiny-model shapes" in p.provenance.source and "2 layer(s)" in p.model
    assert p.provenance.date and len(p.provenance.date) == 10
    printed = capsys.readouterr().out
    assert "context 24:" in printed and "context 40:" in printed and "accept length 2.5:" in printed


def test_forward_of_q_tokens_is_the_targets_greedy_choice_at_each(target):
    draft = rm.DraftHead(target, draft_vocab=100)
    cache = target.new_cache(2, 64)
    cache.fill_random(torch.Generator().manual_seed(8))
    steps = rm.StepSet(target, draft, cache, draft.new_cache(2, 64), bs=2, context_len=30, num_steps=3, max_q=8)
    before = rm.KVCache([k.clone() for k in cache.k], [v.clone() for v in cache.v])
    steps.forward_fn(4)()
    h, _ = target.forward(steps.tok_q[:, :4], before, 30)
    assert torch.equal(steps.out_q[:, :4], target.logits(h).argmax(-1))
    assert steps.forward_fn(1) == steps.plain


def test_a_deeper_draft_head_keeps_a_cache_per_layer_and_extends_as_it_decodes(target):
    draft = rm.DraftHead(target, draft_vocab=100, seed=1, layers=3)
    assert draft.n_layers == 3 and len(draft.new_cache(1, 8).k) == 3
    g = torch.Generator().manual_seed(9)
    tokens = torch.randint(0, DIMS.vocab, (2, 4), generator=g)
    hidden3 = torch.randn(2, 4, 3 * DIMS.hidden, generator=g, dtype=F64)
    a, b = draft.new_cache(2, 64), draft.new_cache(2, 64)
    hn, _ = draft.forward(tokens, hidden3, a, 0)
    for i in range(4):
        hn_i, _ = draft.forward(tokens[:, i:i + 1], hidden3[:, i:i + 1], b, i)
        assert torch.allclose(hn[:, i:i + 1], hn_i, atol=1e-9)
    one = rm.DraftHead(target, draft_vocab=100, seed=1, layers=1)
    assert not torch.allclose(one.forward(tokens, hidden3, one.new_cache(2, 64), 0)[0], hn)  # the layers count


def test_batches_whose_cache_does_not_fit_are_left_out():
    """fitting_batch counts the target's and the draft's KV cache at the context, plus the step's
    activations and 4 GiB spare: exactly enough memory for 192 requests at 4096 gives 192."""
    cfg = cal.CalibrateConfig(shape="llama-3.1-8b", name="x", out=Path("x.yaml"), contexts=(1024, 4096))
    per_token = 2 * (32 + 1) * 8 * 128 * 2  # k and v, 32 target layers + 1 draft layer, 8 kv heads x 128, bf16
    acts = 8 * (128256 * (2 + 4) + 4 * 14336 * 2)  # 8 tokens (q=8): logits + a float copy, the MLP's
    # positions: the context, then the longest of a q=8 forward and a catch-up window, then a verify
    need = 192 * (per_token * (4096 + max(8, cfg.catch_up_window) + 4) + acts) + 4 * 2**30
    assert cal.fitting_batch(cfg, 4096, need) == 192
    assert cal.fitting_batch(cfg, 4096, need - 1) == 160
    assert cal.fitting_batch(cfg, 1024, need) == 256  # a shorter context fits more
    assert cal.fitting_batch(cfg, 4096, 2**30) == 0


def test_the_dynspec_command_does_not_import_torch():
    """torch is calibrate's alone: every other command (and a patched server) starts without it."""
    import subprocess
    import sys

    code = "import sys, dynspec.cli, dynspec.calibrate.run; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# KV-only catch-up and resume -------------------------------------------------------


def _draft_with_context(target, n_ctx=6, batch=2, seed=10):
    """A draft head and two caches holding the same n_ctx positions of draft context."""
    draft = rm.DraftHead(target, draft_vocab=100, seed=1)
    pre = torch.randint(0, DIMS.vocab, (batch, n_ctx), generator=torch.Generator().manual_seed(seed))
    aux = torch.randn(batch, n_ctx, 3 * DIMS.hidden, generator=torch.Generator().manual_seed(seed + 1), dtype=F64)
    caches = [draft.new_cache(batch, 64) for _ in range(2)]
    for c in caches:
        draft.forward(pre, aux, c, 0)
    return draft, caches


@pytest.mark.parametrize("t", [1, 3])
def test_kv_only_catch_up_writes_exactly_what_the_full_draft_forward_writes(target, t):
    draft, (full, kv_only) = _draft_with_context(target)
    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, DIMS.vocab, (2, t), generator=g)
    aux = torch.randn(2, t, 3 * DIMS.hidden, generator=g, dtype=F64)
    before = kv_only.k[0].clone()
    draft.forward(tokens, aux, full, 6)
    draft.catch_up(tokens, aux, kv_only, 6)
    # every cache entry alike: the new positions' K and V, and nothing else touched
    assert torch.allclose(kv_only.k[0], full.k[0], atol=1e-12) and torch.allclose(kv_only.v[0], full.v[0], atol=1e-12)
    assert not torch.allclose(kv_only.k[0][:, :, 6:6 + t], before[:, :, 6:6 + t])  # it did write them
    assert torch.equal(kv_only.k[0][:, :, 6 + t:], before[:, :, 6 + t:])


def test_catch_ups_then_one_resume_give_the_draft_state_of_full_forwards(target):
    """A plain stretch of KV-only catch-ups, then the resume (a full 1-token forward at the last
    position), leaves the draft where full forwards at every step would: same cache, same next
    draft token and hidden state."""
    draft, (full, lazy) = _draft_with_context(target)
    g = torch.Generator().manual_seed(12)
    tokens = torch.randint(0, DIMS.vocab, (2, 5), generator=g)
    aux = torch.randn(2, 5, 3 * DIMS.hidden, generator=g, dtype=F64)
    for i in range(5):
        hn_full, out_full = draft.forward(tokens[:, i:i + 1], aux[:, i:i + 1], full, 6 + i)
    for i in range(4):  # plain steps
        draft.catch_up(tokens[:, i:i + 1], aux[:, i:i + 1], lazy, 6 + i)
    hn, out = draft.forward(tokens[:, 4:], aux[:, 4:], lazy, 10)  # the resume
    assert torch.allclose(hn, hn_full, atol=1e-10) and torch.allclose(out, out_full, atol=1e-10)
    assert torch.equal(draft.logits(hn).argmax(-1), draft.logits(hn_full).argmax(-1))
    assert torch.allclose(lazy.k[0], full.k[0], atol=1e-12) and torch.allclose(lazy.v[0], full.v[0], atol=1e-12)


def test_a_deeper_draft_heads_catch_up_is_its_full_forward(target):
    draft = rm.DraftHead(target, draft_vocab=100, seed=1, layers=2)
    g = torch.Generator().manual_seed(13)
    tokens = torch.randint(0, DIMS.vocab, (2, 2), generator=g)
    aux = torch.randn(2, 2, 3 * DIMS.hidden, generator=g, dtype=F64)
    a, b = draft.new_cache(2, 16), draft.new_cache(2, 16)
    draft.forward(tokens, aux, a, 0)
    draft.catch_up(tokens, aux, b, 0)
    assert all(torch.allclose(x, y, atol=1e-12) for x, y in zip(a.k + a.v, b.k + b.v))
    assert b.k[1].abs().sum() > 0  # the second layer's cache is written too


def test_step_set_catchup_and_resume_pieces(target):
    draft = rm.DraftHead(target, draft_vocab=100)
    dcache = draft.new_cache(3, 64)
    dcache.fill_random(torch.Generator().manual_seed(14))
    steps = rm.StepSet(target, draft, target.new_cache(3, 64), dcache, bs=3, context_len=30, num_steps=3)
    ref = rm.KVCache([x.clone() for x in steps.dcache.k], [x.clone() for x in steps.dcache.v])
    hn, hid = draft.forward(steps.tok1, steps.aux1, ref, 30)  # what the resume computes
    assert steps.aux1.is_contiguous()
    before = steps.dcache.k[0].clone()
    steps.catchup()
    assert torch.allclose(steps.dcache.k[0], ref.k[0], atol=1e-12) and torch.allclose(steps.dcache.v[0], ref.v[0])
    assert torch.equal(steps.dcache.k[0][:, :, :30], before[:, :, :30])  # only position 30 written
    steps.out_token.fill_(-1)
    steps.resume()
    assert torch.equal(steps.out_token, draft.hot_ids[draft.logits(hn)[:, -1].argmax(-1)])
    assert torch.allclose(steps.out_hidden, hid[:, -1])

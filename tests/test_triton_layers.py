"""dynspec's fused Triton bodies for RMSNorm, SiluAndMul and neox rope (dynspec.realsglang.triton_layers),
run on this CPU by Triton's interpreter and checked against the float64 math of SGLang's torch bodies.

The interpreter is chosen when triton is first imported, and torch imports triton: the checks run
in a child process that starts with TRITON_INTERPRET=1, so no other test (nor the SGLang servers
they start) inherits it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]


def test_fused_kernels_match_the_torch_math_under_tritons_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.split() == [f"ok:{c.__name__}" for c in CHECKS]


def close(a, b, tol=2e-2):
    """Within bf16's rounding of values of order one (8 bits of mantissa)."""
    return torch.allclose(a.double(), b.double(), atol=tol, rtol=tol)


def check_rms_norm_with_and_without_residual(tl_mod):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 96, generator=g).to(torch.bfloat16)
    res = torch.randn(5, 96, generator=g).to(torch.bfloat16)
    w = (1 + 0.5 * torch.randn(96, generator=g)).to(torch.bfloat16)
    eps = 1e-5

    def ref(v):
        v = v.double()
        return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w.double()

    assert close(tl_mod.rms_norm(x, w, eps), ref(x))
    summed = x.double() + res.double()
    r = res.clone()
    out, r_out = tl_mod.rms_norm(x, w, eps, r)
    assert r_out is r and close(r, summed)  # the residual holds x + residual afterwards
    assert close(out, ref(summed))
    assert not close(tl_mod.rms_norm(x, w, eps), ref(summed))  # the add matters at this scale


def check_rms_norm_rows_of_a_3d_tensor_and_empty(tl_mod):
    x = torch.randn(2, 3, 64).to(torch.bfloat16)
    w = torch.ones(64, dtype=torch.bfloat16)
    out = tl_mod.rms_norm(x, w, 1e-6)
    assert out.shape == x.shape
    assert close(out[1, 2], x[1, 2].double() / x[1, 2].double().pow(2).mean().sqrt())
    assert tl_mod.rms_norm(torch.empty(0, 64, dtype=torch.bfloat16), w, 1e-6).shape == (0, 64)


def check_silu_and_mul(tl_mod):
    x = torch.randn(3, 2 * 1100).to(torch.bfloat16)  # d over one block: two programs a row
    out = tl_mod.silu_and_mul(x)
    gate, up = x[:, :1100].double(), x[:, 1100:].double()
    assert out.shape == (3, 1100) and close(out, torch.nn.functional.silu(gate) * up)


def check_rope_neox_rotates_q_and_k_heads_in_place(tl_mod):
    head, rot, n_q, n_k, n = 16, 8, 3, 2, 4
    base = 10000.0
    inv = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = torch.arange(32, dtype=torch.float64)[:, None] * inv[None, :]
    cache = torch.cat([ang.cos(), ang.sin()], dim=-1).float()  # SGLang's layout: [cos | sin]
    pos = torch.tensor([0, 5, 31, 7])
    qkv = torch.randn(n, (n_q + 2 * n_k) * head).to(torch.bfloat16)
    q, k, v = qkv.split([n_q * head, n_k * head, n_k * head], dim=-1)  # views, as in the model
    v0 = v.clone()
    q0, k0 = q.clone().view(n, n_q, head).double(), k.clone().view(n, n_k, head).double()
    tl_mod.rope_neox_(pos, q, k, head, rot, cache)

    def ref(x):
        c, s = cache[pos, : rot // 2].double()[:, None], cache[pos, rot // 2:].double()[:, None]
        x1, x2, rest = x[..., : rot // 2], x[..., rot // 2: rot], x[..., rot:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)

    assert close(q.view(n, n_q, head), ref(q0)) and close(k.view(n, n_k, head), ref(k0))
    assert torch.equal(q.view(n, n_q, head)[0].double(), q0[0])  # position 0 is the identity
    assert torch.equal(v, v0)  # the kernel writes q and k only


class RMSNorm:  # named as SGLang's, with the attributes its body reads
    def __init__(self, **kw):
        self.weight = torch.ones(8, dtype=torch.bfloat16)
        self.variance_epsilon, self.variance_size_override = 1e-6, None
        self.fp32_residual = self.cast_x_before_out_mul = False
        self.override_orig_dtype = None
        self.native_calls = 0
        self.__dict__.update(kw)

    def forward_native(self, x, residual=None, post=None):
        self.native_calls += 1
        return x


def check_uncovered_cases_keep_the_torch_body(tl_mod):
    x = torch.randn(2, 8).to(torch.bfloat16)
    for kw in ({"variance_size_override": 4}, {"fp32_residual": True}, {"cast_x_before_out_mul": True}):
        op = RMSNorm(**kw)
        tl_mod.layer_forward(op)(x)
        assert op.native_calls == 1, kw
    op = RMSNorm()
    tl_mod.layer_forward(op)(x, torch.randn(8, 2).to(torch.bfloat16).t())  # a strided residual
    assert op.native_calls == 1
    tl_mod.layer_forward(op)(x)
    assert op.native_calls == 1  # covered: the fused body ran
    assert tl_mod.layer_forward(object()) is None


CHECKS = [check_rms_norm_with_and_without_residual, check_rms_norm_rows_of_a_3d_tensor_and_empty,
          check_silu_and_mul, check_rope_neox_rotates_q_and_k_heads_in_place,
          check_uncovered_cases_keep_the_torch_body]

if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import dynspec.realsglang.triton_layers as mod

    for check in CHECKS:
        check(mod)
        print(f"ok:{check.__name__}")

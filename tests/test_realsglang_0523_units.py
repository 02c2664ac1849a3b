"""The pieces of dynspec.realsglang's SGLang 0.5.23 support that need no server: the sgl_kernel
stand-in's CPU ops (sglang-kernel 0.4.10's argument conventions), compat hooks keyed by
version, and how a 0.5.23 server's environment and command are built."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="requirements/sglang-cpu.txt installs the CPU torch")

from dynspec import realsglang  # noqa: E402
from dynspec.realsglang import compat  # noqa: E402
from dynspec.realsglang.__main__ import main as realsglang_main  # noqa: E402


@pytest.fixture(scope="module")
def sgl_kernel():
    sys.path.insert(0, str(realsglang.SITE_0523))
    try:
        yield importlib.import_module("sgl_kernel")
    finally:
        sys.path.remove(str(realsglang.SITE_0523))
        for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
            del sys.modules[name]


def test_the_stand_in_is_0_5_23s_and_raises_for_what_it_lacks(sgl_kernel):
    assert sgl_kernel.__version__ == "0.4.10"
    assert sgl_kernel.__file__.startswith(str(realsglang.SITE_0523))
    from sgl_kernel import copy_all_layer_kv_cache_cpu  # bound at import by SGLang's KV pool

    with pytest.raises(NotImplementedError, match="sgl_kernel.copy_all_layer_kv_cache_cpu"):
        copy_all_layer_kv_cache_cpu(torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1))


# Three requests in pool rows 4, 0 and 2 of a req_to_token table 16 wide.
ROWS, STARTS, ENDS = [4, 0, 2], [3, 0, 7], [6, 2, 8]


def test_req_to_token_segments_are_written_and_read_back_request_by_request(sgl_kernel):
    r2t = torch.full((6, 16), -1, dtype=torch.int32)
    locs = torch.arange(100, 106, dtype=torch.int64)  # 3 + 2 + 1 slots, packed
    idx, start, end = torch.tensor(ROWS), torch.tensor(STARTS), torch.tensor(ENDS)
    sgl_kernel.assign_req_to_token_pool_cpu(idx, r2t, start, end, locs, 16)
    assert r2t[4, 3:6].tolist() == [100, 101, 102] and r2t[0, 0:2].tolist() == [103, 104]
    assert r2t[2, 7].item() == 105 and int((r2t != -1).sum()) == 6  # nothing else written
    back = torch.zeros(6, dtype=torch.int64)
    sgl_kernel.assign_extend_cache_locs_cpu(idx, r2t, start, end, back, 16)
    assert back.tolist() == locs.tolist()


def test_draft_cache_locs_are_each_requests_slots_after_its_prefix(sgl_kernel):
    r2t = torch.arange(6 * 16, dtype=torch.int32).reshape(6, 16)
    out = torch.zeros(3 * 3, dtype=torch.int64)
    sgl_kernel.assign_draft_cache_locs_contiguous_cpu(torch.tensor(ROWS), r2t, torch.tensor([5, 1, 9]), out,
                                                      16, 1, 3)
    assert out.tolist() == [4 * 16 + 5, 4 * 16 + 6, 4 * 16 + 7, 1, 2, 3, 2 * 16 + 9, 2 * 16 + 10, 2 * 16 + 11]


def test_the_bonus_token_is_the_last_accepted_one(sgl_kernel):
    # accept_tokens: 4 per request; accept_lens counts the bonus token (1 = nothing accepted)
    tokens = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]])
    bonus = torch.zeros(3, dtype=torch.int64)
    sgl_kernel.fill_bonus_tokens_cpu(tokens, torch.tensor([1, 4, 2], dtype=torch.int32), bonus, 4)
    assert bonus.tolist() == [10, 23, 31]


def test_accepted_kv_slots_are_packed_in_order(sgl_kernel):
    accept_index = torch.tensor([[0, 1, -1, -1], [4, -1, -1, -1], [8, 9, 10, 11]])
    out_cache_loc = torch.arange(500, 512)
    packed = torch.full((12,), -7, dtype=torch.int64)
    sgl_kernel.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, packed)
    assert packed.tolist()[:7] == [500, 501, 504, 508, 509, 510, 511]
    assert packed.tolist()[7:] == [-7] * 5


def test_chain_verify_is_shared_with_the_0_5_9_stand_in(sgl_kernel):
    from dynspec.realsglang import chain_ops

    bs, n = 2, 4
    candidates = torch.tensor([[7, 1, 2, 3], [7, 5, 6, 9]])
    target = torch.tensor([[1, 2, 0, 0], [5, 6, 8, 4]])  # request 0 accepts 2 drafts, request 1 accepts 2
    ri = torch.arange(bs * n).reshape(bs, n)
    args = dict(candidates=candidates, retrive_index=ri, retrive_next_token=ri, retrive_next_sibling=ri,
                target_predict=target)
    outs = []
    for fn in (sgl_kernel.verify_tree_greedy_cpu, chain_ops.verify_tree_greedy):
        predicts = torch.zeros(bs * n, dtype=torch.int32)
        accept_index = torch.zeros(bs, n, dtype=torch.int64)
        num = torch.zeros(bs, dtype=torch.int32)
        fn(predicts=predicts, accept_index=accept_index, accept_token_num=num, **args)
        outs.append((predicts.tolist(), accept_index.tolist(), num.tolist()))
    assert outs[0] == outs[1]
    assert outs[0][2] == [2, 2] and outs[0][1] == [[0, 1, 2, -1], [4, 5, 6, -1]]


def test_compat_hooks_run_only_for_the_version_served(monkeypatch):
    seen = []
    monkeypatch.setitem(compat._HOOKS, "dynspec_test_module", [])
    compat.after_import("dynspec_test_module", version="0.5.23")(lambda m: seen.append("0.5.23"))
    compat.after_import("dynspec_test_module")(lambda m: seen.append("0.5.9"))
    for version in ("0.5.9", "0.5.23"):
        monkeypatch.setattr(compat, "_VERSION", version)
        for hook in compat._HOOKS["dynspec_test_module"]:
            hook(object())
    assert seen == ["0.5.9", "0.5.23"]


def test_compat_refuses_a_version_it_has_no_patches_for(monkeypatch):
    monkeypatch.setattr(compat, "_VERSION", compat._VERSION)
    with pytest.raises(ValueError, match="no patches for SGLang 0.6.0"):
        compat.install("0.6.0")


def test_a_0_5_23_server_gets_its_own_stand_ins_and_dependencies(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNSPEC_SGLANG_0523_DEPS", str(tmp_path / "deps"))
    env = realsglang.server_env(tmp_path / "site", base={"PYTHONPATH": "/elsewhere"}, version="0.5.23")
    path = env["PYTHONPATH"].split(os.pathsep)
    assert path == [str(realsglang.SITE_0523), str(realsglang.SITE_CPU), str(tmp_path / "deps"),
                    str(tmp_path / "site"), "/elsewhere"]
    assert str(realsglang.SITE) not in path  # 0.5.9's sgl_kernel would shadow 0.5.23's
    assert env["SGLANG_EXTERNAL_MODEL_PACKAGE"] == "dynspec_models"
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    old = realsglang.server_env(tmp_path / "site", base={}, version="0.5.9")
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE" not in old
    assert old["PYTHONPATH"].split(os.pathsep)[0] == str(realsglang.SITE)
    argv = realsglang.server_argv("m", 1234, draft="d", version="0.5.23")
    assert "--sleep-on-idle" in argv and "--sleep-on-idle" in realsglang.server_argv("m", 1234)  # CPU: both
    assert "--sleep-on-idle" not in realsglang.server_argv("m", 1234, gpu=True)  # a GPU's configs choose
    gpu = realsglang.server_env(tmp_path / "site", gpu=True, base={}, version="0.5.23")
    # on a GPU: no CPU stand-ins (torchvision) and no CPU engine; the layers' torch bodies
    assert gpu["PYTHONPATH"].split(os.pathsep) == [str(realsglang.SITE_0523), str(tmp_path / "deps"),
                                                   str(tmp_path / "site")]
    assert gpu["SGLANG_FORCE_FUSED_OP_BACKEND"] == "torch" and "SGLANG_USE_CPU_ENGINE" not in gpu
    assert "SGLANG_FORCE_FUSED_OP_BACKEND" not in env
    with pytest.raises(ValueError, match="not '0.6.0'"):
        realsglang.sglang_site(False, root=tmp_path, version="0.6.0")


def test_serve_refuses_unknown_versions(capsys):
    for argv, says in ((["serve", "--sglang", "0.6.0", "--", "--port", "1"], "invalid choice"),):
        with pytest.raises(SystemExit) as exc:
            realsglang_main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert says in err[-1], err


# On a GPU, the names 0.5.23 binds that need the native kernel package (or the `cutlass` package):
# module -> (the name a hook replaces, where the module's source defines or imports it).
GPU_HOOKED = {
    "sglang.srt.layers.dual_gemm": "_select_mode",
    "sglang.kernels.ops.speculative.tree": "verify_tree_greedy",
    "sglang.srt.layers.attention.triton_backend": "is_arch_support_pdl",
    "sglang.srt.mem_cache.memory_pool": "can_use_store_cache",
}


def test_the_gpu_hooks_replace_what_0_5_23_binds_there_and_only_on_a_gpu(monkeypatch):
    import types

    from dynspec.realsglang import chain_ops, compat_0523  # noqa: F401  (registers 0.5.23's hooks)

    site = realsglang.sglang_site(False, version="0.5.23")
    for module, name in GPU_HOOKED.items():
        source = (site / (module.replace(".", "/") + ".py")).read_text()
        assert name in source, (module, name)  # the hook's target is still where 0.5.23 has it
        assert module in compat._HOOKS, module
    monkeypatch.setattr(compat, "_VERSION", "0.5.23")

    def hooked(module: str, cuda: bool) -> types.SimpleNamespace:
        m = types.SimpleNamespace(DualGemm=type("DualGemm", (), {"_select_mode": lambda self, g, h: "cutedsl"}),
                                  build_tree_kernel_efficient="jit", verify_tree_greedy="jit",
                                  is_arch_support_pdl="native", can_use_store_cache="jit")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        for hook in compat._HOOKS[module]:
            hook(m)
        return m

    assert hooked("sglang.srt.layers.dual_gemm", cuda=False).DualGemm()._select_mode(None, 8) == "cutedsl"
    assert hooked("sglang.srt.layers.dual_gemm", cuda=True).DualGemm()._select_mode(None, 8) is None
    tree = hooked("sglang.kernels.ops.speculative.tree", cuda=True)
    assert tree.verify_tree_greedy is chain_ops.verify_tree_greedy
    assert tree.build_tree_kernel_efficient is chain_ops.build_tree_kernel_efficient
    assert hooked("sglang.kernels.ops.speculative.tree", cuda=False).verify_tree_greedy == "jit"
    assert hooked("sglang.srt.layers.attention.triton_backend", cuda=True).is_arch_support_pdl() is False
    assert hooked("sglang.srt.mem_cache.memory_pool", cuda=True).can_use_store_cache(256, 256) is False

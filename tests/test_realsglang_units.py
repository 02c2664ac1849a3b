"""The pieces of dynspec.realsglang that need no server: the sgl_kernel stand-in's ops,
stand-in modules, the CPU index kernels and the tiny models' construction."""

from __future__ import annotations

import importlib
import random
import sys

import pytest

torch = pytest.importorskip("torch", reason="requirements/sglang-cpu.txt installs the CPU torch")

from dynspec import realsglang  # noqa: E402
from dynspec.realsglang import compat  # noqa: E402


@pytest.fixture(scope="module")
def sgl_kernel():
    sys.path.insert(0, str(realsglang.SITE))
    try:
        yield importlib.import_module("sgl_kernel")
    finally:
        sys.path.remove(str(realsglang.SITE))
        for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
            del sys.modules[name]


def test_unimplemented_kernels_import_and_raise_naming_themselves(sgl_kernel):
    from sgl_kernel import rmsnorm  # noqa: F401  (SGLang binds names like this at import)
    from sgl_kernel.elementwise import fused_add_rmsnorm

    with pytest.raises(NotImplementedError, match="sgl_kernel.rmsnorm"):
        sgl_kernel.rmsnorm(torch.zeros(2))
    with pytest.raises(NotImplementedError, match="sgl_kernel.elementwise.fused_add_rmsnorm"):
        fused_add_rmsnorm()


def chain_reference(seq_lens, n):
    """The chain's verify inputs spelled out request by request."""
    positions, mask = [], []
    for _b, s in enumerate(seq_lens):
        positions += [s + k for k in range(n)]
        for k in range(n):
            mask += [True] * s + [j <= k for j in range(n)]
    return positions, mask


def test_build_tree_for_a_chain(sgl_kernel):
    seq_lens, n = [5, 2, 9], 4
    bs = len(seq_lens)
    seq = torch.tensor(seq_lens)
    mask = torch.full((sum(seq_lens) * n + n * n * bs,), True)
    positions = torch.empty(bs * n, dtype=torch.long)
    ri, rn, rs = torch.full((3, bs, n), -1, dtype=torch.long)
    sgl_kernel.build_tree_kernel_efficient(torch.empty(bs, 0), torch.zeros(bs, n - 1, dtype=torch.long), seq,
                                           mask, positions, ri, rn, rs, 1, n - 1, n, 0)
    want_pos, want_mask = chain_reference(seq_lens, n)
    assert positions.tolist() == want_pos and mask.tolist() == want_mask
    assert ri.tolist() == [[b * n + k for k in range(n)] for b in range(bs)]
    assert rn.tolist() == [[1, 2, 3, -1]] * bs and rs.tolist() == [[-1] * n] * bs
    with pytest.raises(NotImplementedError, match="topk=4"):
        sgl_kernel.build_tree_kernel_efficient(None, None, seq, mask, positions, ri, rn, rs, 4, 3, n, 0)


def test_verify_tree_greedy_accepts_the_matching_prefix(sgl_kernel):
    rng = random.Random(0)
    bs, n = 64, 4
    for _ in range(20):
        target = torch.tensor([[rng.randrange(5) for _ in range(n)] for _ in range(bs)])
        cand = torch.tensor([[rng.randrange(5)] + [rng.randrange(5) for _ in range(n - 1)] for _ in range(bs)])
        predicts = torch.zeros(bs * n + 1, dtype=torch.int32)
        accept_index = torch.full((bs, n), -1, dtype=torch.int32)
        accept_num = torch.empty(bs, dtype=torch.int32)
        ri = torch.arange(bs * n).reshape(bs, n)
        sgl_kernel.verify_tree_greedy(predicts, accept_index, accept_num, cand, ri, None, None, target)
        for b in range(bs):
            a = 0
            while a < n - 1 and cand[b, a + 1] == target[b, a]:
                a += 1
            assert accept_num[b] == a
            assert accept_index[b].tolist() == [b * n + k for k in range(a + 1)] + [-1] * (n - 1 - a)
            assert predicts[b * n:b * n + a + 1].tolist() == target[b, :a + 1].tolist()


def test_cpu_index_kernels_copy_each_requests_segment():
    req_to_token = torch.arange(40).reshape(4, 10)
    out = torch.zeros(5, dtype=torch.int64)
    kernel = compat._TorchKernel(compat._assign_extend_cache_locs)
    kernel[(2,)](torch.tensor([3, 1]), req_to_token, torch.tensor([2, 7]), torch.tensor([4, 10]), out, 10, 2)
    assert out.tolist() == [32, 33, 17, 18, 19]
    pool = torch.zeros(4, 10, dtype=torch.int64)
    compat._TorchKernel(compat._assign_req_to_token_pool)[(2,)](
        torch.tensor([3, 1]), pool, torch.tensor([2, 7]), torch.tensor([4, 10]), out, 10, 2)
    assert pool[3, 2:4].tolist() == [32, 33] and pool[1, 7:10].tolist() == [17, 18, 19]


def test_tiny_target_follows_its_permutation_most_of_the_time(tmp_path):
    pytest.importorskip("transformers")
    from dynspec.realsglang.tinymodels import expected_follow_rate, make_models

    make_models(tmp_path)
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 256) for _ in range(rng.randrange(8, 40))] for _ in range(4)]
    rate = expected_follow_rate(tmp_path, prompts, max_new_tokens=24)
    assert 0.7 <= rate <= 0.97  # context matters, and the draft has something to be right about


def test_the_sync_census_counts_each_waiting_call_at_its_call_site(tmp_path):
    """In a fresh process (the census rewrites torch.Tensor methods): every call that would wait for
    a GPU is counted at the line that made it; arithmetic is not; the counts reach the folder."""
    import subprocess
    import sys
    import textwrap

    pytest.importorskip("torch")
    from dynspec.realsglang import census

    script = tmp_path / "calls.py"
    script.write_text(textwrap.dedent(f"""
        from dynspec.realsglang import census
        census.install({str(tmp_path / 'c')!r})
        import torch
        t = torch.arange(4)
        for _ in range(3):
            t.tolist()
        t.sum().item()
        bool(t.any())
        t.to("cpu")
        u = t * 2 + 1
        ev = torch.cpu.Event() if hasattr(torch.cpu, "Event") else None
    """))
    subprocess.run([sys.executable, str(script)], check=True, timeout=120)
    counts = census.read(tmp_path / "c")
    by_line = {k.split(" ")[0].rsplit(":", 1)[1] + " " + k.split(" ")[-1]: v for k, v in counts.items()}
    assert by_line == {"7 tolist": 3, "8 item": 1, "9 __bool__": 1, "10 to(cpu)": 1}, counts


def test_serve_site_must_hold_an_sglang_package(tmp_path, capsys, monkeypatch):
    """`serve --site DIR` serves that unpacked SGLang (the tests' broken copies); a folder without
    one is a one-line usage error before anything starts."""
    from dynspec.realsglang.__main__ import main

    monkeypatch.setattr("os.execve", lambda *a: pytest.fail("a server was started"))
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--site", str(tmp_path), "--", "--model-path", "m"])
    assert exc.value.code == 2 and "no sglang package there" in capsys.readouterr().err
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    seen = {}
    monkeypatch.setattr("os.execve", lambda exe, argv, env: seen.update(argv=argv, env=env))
    main(["serve", "--site", str(tmp_path), "--", "--model-path", "m"])
    assert seen["argv"][1:] == ["-m", "sglang.launch_server", "--model-path", "m"]
    assert str(tmp_path.resolve()) in seen["env"]["PYTHONPATH"].split(":")


def test_the_v2_draft_extend_graph_is_replayed_with_the_eager_layout():
    """0.5.9 replays the spec-v2 draft-extend graph with v1's layout (queries at cumsum(accept
    lengths), KV over whole lengths); the GPU fix must leave n queries per request and the KV of
    each request's prefix only, as the eager extend plans it."""
    import types

    import torch

    def kv_indices_kernel(grid):  # create_flashinfer_kv_indices_triton, in torch
        def run(req_to_token, pools, lens, indptr, start, out, stride):
            for b in range(grid[0]):
                a = int(indptr[b])
                out[a:a + int(lens[b])] = req_to_token[int(pools[b]), :int(lens[b])]
        return run

    class Backend:  # what 0.5.9's replay leaves for a v2 draft extend
        def __init__(self):
            self.num_draft_tokens, self.device = 4, "cpu"
            self.qo_indptr = torch.zeros(9, dtype=torch.int32)
            self.kv_indptr = torch.zeros(9, dtype=torch.int32)
            self.cuda_graph_kv_indices = torch.full((200,), -1, dtype=torch.int64)
            self.req_to_token = torch.arange(4 * 50).reshape(4, 50)

        def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum,
                                                    encoder_lens, forward_mode, spec_info, seq_lens_cpu):
            self.qo_indptr[1:bs + 1] = torch.cumsum(spec_info.accept_length[:bs], 0)
            self.kv_indptr[1:bs + 1] = torch.cumsum(seq_lens[:bs], 0)

    kernel = type("Kernel", (), {"__getitem__": lambda self, grid: kv_indices_kernel(grid)})()
    m = types.SimpleNamespace(TritonAttnBackend=Backend, create_flashinfer_kv_indices_triton=kernel)
    compat.draft_extend_v2_graph_layout(m)
    backend = Backend()
    v2 = types.SimpleNamespace(is_draft_extend_v2=lambda: True)
    seq = torch.tensor([10, 7, 12])  # prefix + 4 drafted tokens each
    spec = types.SimpleNamespace(accept_length=torch.tensor([2, 1, 4]), extend_seq_lens_tensor=torch.tensor([4, 4, 4]))
    backend.init_forward_metadata_replay_cuda_graph(3, torch.tensor([2, 0, 3]), seq, 29, None, v2, spec, None)
    assert backend.qo_indptr[:4].tolist() == [0, 4, 8, 12]
    assert backend.kv_indptr[:4].tolist() == [0, 6, 9, 17]
    assert backend.cuda_graph_kv_indices[:17].tolist() == [*range(100, 106), *range(0, 3), *range(150, 158)]
    other = Backend()  # any other mode: 0.5.9's own replay, untouched
    other.init_forward_metadata_replay_cuda_graph(3, torch.tensor([2, 0, 3]), seq, 29, None,
                                                  types.SimpleNamespace(is_draft_extend_v2=lambda: False), spec, None)
    assert other.qo_indptr[:4].tolist() == [0, 2, 3, 7]


def test_cpu_cores_are_split_between_tp_ranks():
    """SGLang 0.5.9 on a CPU binds each TP rank to cores; a one-NUMA-node machine gets them split."""
    assert [compat.rank_cores(2, r, [0, 1]) for r in range(2)] == ["0", "1"]
    assert [compat.rank_cores(2, r, [3, 0, 1, 2]) for r in range(2)] == ["0,1", "2,3"]
    assert [compat.rank_cores(3, r, [0, 1]) for r in range(3)] == ["0", "1", "0"]  # fewer cores than ranks
    assert compat.rank_cores(2, 1, [4, 5, 6, 7, 8]) == "6,7"


@pytest.mark.parametrize("spawn_env, expected", [(None, "fork"), ("1", "spawn")])
def test_a_cpu_server_forks_its_processes_unless_told_to_spawn(monkeypatch, spawn_env, expected):
    """SGLang's engine sets the start method to spawn; on a CPU the hook makes that a fork (its
    children keep the launcher's imports), and DYNSPEC_CPU_SPAWN=1 leaves SGLang's spawn."""
    import multiprocessing
    import types

    assert len(compat._HOOKS["sglang.srt.entrypoints.engine"]) == 2  # 0.5.9's engine and 0.5.23's
    if spawn_env is None:
        monkeypatch.delenv("DYNSPEC_CPU_SPAWN", raising=False)
    else:
        monkeypatch.setenv("DYNSPEC_CPU_SPAWN", spawn_env)
    monkeypatch.setattr(multiprocessing, "set_start_method", multiprocessing.set_start_method)
    before = multiprocessing.get_start_method(allow_none=True)
    try:
        compat.fork_server_processes(types.SimpleNamespace())
        multiprocessing.set_start_method("spawn", force=True)  # what the engine does
        assert multiprocessing.get_start_method() == expected
    finally:
        multiprocessing.context._default_context._actual_context = None
        if before is not None:
            multiprocessing.context._default_context.set_start_method(before, force=True)


def test_an_unpacked_sglang_is_byte_compiled_naming_where_it_will_live(tmp_path):
    """Every server process reads the compiled modules instead of compiling them again, and a
    traceback names the cache folder the copy is renamed to, not the temporary one."""
    import importlib.util
    import marshal

    tree = tmp_path / ".tmp-copy"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "__init__.py").write_text("X = 1\n")
    realsglang._compile(tree, tmp_path / "final")
    pyc = tree / "pkg" / importlib.util.cache_from_source("__init__.py")
    assert pyc.is_file()
    code = marshal.loads(pyc.read_bytes()[16:])
    assert code.co_filename == str(tmp_path / "final" / "pkg" / "__init__.py")

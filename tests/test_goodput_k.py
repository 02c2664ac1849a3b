"""goodput-k: the draft length K with the most expected output per second, from per-position
acceptance read off accept lengths and per-K step costs."""

from __future__ import annotations

import math
import random

import pytest

from dynspec.policy import StepRecord, build_policy
from dynspec.policy.goodput.steps import GoodputK
from dynspec.sim.engine import Engine
from dynspec.sim.run import simulate_level
from tests.test_engine import make_profile

CANDS = [0, 1, 3, 5, 7]


def policy() -> GoodputK:
    p = build_policy("goodput-k")
    assert isinstance(p, GoodputK)
    p.set_candidate_steps(CANDS, 3)
    return p


def chain(rng: random.Random, qs: list[float], k: int) -> int:
    j = 0
    while j < k and rng.random() < qs[min(j, len(qs) - 1)]:
        j += 1
    return j


def test_position_estimates_come_from_accept_lengths_censored_at_k():
    p, rng = policy(), random.Random(0)
    qs = [0.9, 0.5, 0.3]
    for _ in range(400):
        acc = [chain(rng, qs, 5) for _ in range(16)]
        p.observe(StepRecord(16, True, acc, None, None, True, 5))
    s = p.survival()
    # P(>= 1) = .9, P(>= 2) = .45, P(>= 3) = .135: a mean-based estimate (one rate) gets these wrong
    assert s[0] == pytest.approx(0.9, abs=0.03)
    assert s[1] == pytest.approx(0.45, abs=0.03)
    assert s[2] == pytest.approx(0.135, abs=0.03)
    # Chains of one draft say nothing of position 2: it repeats position 1 (not "always rejected")
    q = policy()
    for _ in range(200):
        q.observe(StepRecord(16, True, [chain(rng, [0.8], 1) for _ in range(16)], None, None, True, 1))
    s = q.survival()
    assert s[0] == pytest.approx(0.8, abs=0.04) and s[1] == pytest.approx(s[0] ** 2, rel=0.02)


def test_every_step_weighs_alike_in_the_position_counts():
    # While young every speculative step is counted, later one in UPDATE_EVERY: a level's first
    # requests (here easy, 95% a position) and eight times as many steps of later ones (50%) must
    # weigh as the steps they are, (0.95 + 8 x 0.5) / 9 = 0.55 at position 1.  Counted at one weight
    # a sample, the first 64 samples weighed as much as the next 64 strided ones: 0.71.
    ests = []
    for seed in range(8):
        p, rng = policy(), random.Random(seed)
        p.set_candidate_steps(CANDS, 5)
        young = 0
        while p.tried[0] < 64:
            p.observe(StepRecord(2, True, [chain(rng, [0.95], 5) for _ in range(2)], None, None, True, 5))
            young += 1
        for _ in range(8 * young):
            p.observe(StepRecord(2, True, [chain(rng, [0.5], 5) for _ in range(2)], None, None, True, 5))
        ests.append(p.survival()[0])
    assert sum(ests) / len(ests) == pytest.approx(0.55, abs=0.04), ests


def test_cost_of_an_unmeasured_k_is_linear_between_measured_ones_plain_at_zero():
    p = policy()
    b = 10  # a bucket index
    p.t_k[b][0], p.t_k[b][3] = 0.010, 0.016
    assert p.cost(b, 1) == pytest.approx(0.012)
    assert p.cost(b, 5) == pytest.approx(0.020)  # beyond: the last segment extended
    p.t_k[b][5] = 0.030  # measured: between 3 and 5 now as measured
    assert p.cost(b, 4) == pytest.approx(0.023)
    assert p.cost(b, 7) == pytest.approx(0.044)


def test_steady_steps_of_each_k_are_timed_and_the_first_after_a_change_is_not():
    p = policy()
    p.observe(StepRecord(1, True, [1], 0.050, None, True, 3))  # after nothing: not steady
    assert p.t_k[0][3] is None
    p.observe(StepRecord(1, True, [1], 0.020, None, True, 3))
    p.observe(StepRecord(1, True, [0], 0.030, None, True, 1))  # K changed: not steady
    assert p.t_k[0][3] == 0.020 and p.t_k[0][1] is None


def k_profile():
    # N = 3.  Batch 1: a draft step costs 0.67 ms beside a 10 ms plain step; batch 128: 10 ms beside
    # 30.  The first draft is right 90% of the time, deeper ones 30%: K = 3 pays alone (expected
    # 2.25 tokens for 12 ms against 1.9 for 10.67), K = 1 at 128 (1.9 for 40 ms against 2.25 for 60).
    return make_profile(acceptance={"accept_length": 2.25, "concentration": 60, "position_rates": [0.9, 0.3]},
                        steps={"batch_size": [1, 8, 128], "plain_ms": [10.0, 11.0, 30.0],
                               "spec_ms": [12.0, 14.0, 60.0]})


def test_it_picks_a_long_chain_alone_and_k1_at_a_large_batch():
    prof = k_profile()
    got = {}
    for c in (1, 128):
        rows = {}
        for arm in ("policy:goodput-k", "policy:table:1-=1", "policy:table:1-=3", "policy:table:1-=5"):
            engines: list[Engine] = []
            m, _ = simulate_level(prof, arm, c, input_len=64, output_len=300, num_prompts=max(5 * c, 40),
                                  candidate_steps=CANDS, engine_out=engines)
            rows[arm] = (m["output_throughput"], engines[0])
        got[c] = rows
        best = max(v for a, (v, _) in rows.items() if a.startswith("policy:table"))
        assert rows["policy:goodput-k"][0] >= 0.97 * best, (c, {a: v for a, (v, _) in rows.items()})
    alone = got[1]["policy:goodput-k"][1]
    big = got[128]["policy:goodput-k"][1]
    assert alone.stats.mean_draft_steps > 2.5  # 3 drafts alone
    assert big.stats.mean_draft_steps < 1.5  # one draft at 128
    # and at 128, K = 1 beats K = 3 there (the profile does what the test says)
    assert got[128]["policy:table:1-=1"][0] > 1.05 * got[128]["policy:table:1-=3"][0]


def test_a_probe_shows_goodput_the_chosen_ks_acceptance():
    p = policy()
    seen = []
    p.inner.observe = p._inner_observe = seen.append  # type: ignore[method-assign]
    b = 0
    p.k_cur[b] = 3
    p._probe_left = 0
    p.observe(StepRecord(1, True, [5], 0.02, None, True, 7))  # probe above: cut to 3
    p.observe(StepRecord(1, True, [1], 0.02, None, True, 1))  # probe below: nothing to tell
    p.observe(StepRecord(1, True, [2], 0.02, None, True, 3))  # the chosen K: as it is
    assert list(seen[0].accepted) == [3] and seen[0].step_time_s is None
    assert list(seen[1].accepted) == [] and list(seen[2].accepted) == [2] and seen[2].step_time_s == 0.02


def test_without_candidates_or_under_tp_it_is_goodput_on_off():
    # A one-count server (0.5.9's path, no candidate steps): step for step what goodput does.
    prof = k_profile()
    got = []
    for arm in ("policy:goodput", "policy:goodput-k"):
        engines: list[Engine] = []
        m, _ = simulate_level(prof, arm, 16, input_len=64, output_len=200, num_prompts=80, engine_out=engines)
        st = engines[0].stats
        got.append((m["output_throughput"], st.steps_spec, st.steps_plain, st.switches))
    assert got[0] == got[1]
    q = build_policy("goodput-k", sync=lambda v: v)
    q.set_candidate_steps(CANDS, 5)
    ks = {q.decide_steps(4) for _ in range(200)}
    assert ks <= {0, 5}


def test_family_k_runs_every_arm_and_the_oracle_is_the_best_static_k():
    import pandas as pd

    from dynspec.analysis.family import member
    from dynspec.analysis.family_k import run_member_k, summarize_k

    rows = run_member_k(member(0, 12), (0, 1, 3, 5, 7), levels=(1, 64))
    df = pd.DataFrame(rows)
    assert {"goodput-k", "goodput", "sglang-tiers", "k-table", "oracle", "static-0", "static-7"} <= set(df.arm)
    t = df.pivot_table(index="concurrency", columns="arm", values="steady_throughput")
    statics = t[[f"static-{k}" for k in (0, 1, 3, 5, 7)]]
    assert (t["oracle"] == statics.max(axis=1)).all()
    lines, fig = summarize_k(df)
    worst, median = fig["goodput-k/oracle"]
    assert 0 < worst <= median  # goodput-k against the best static K, per level
    assert any("sglang-tiers" in line for line in lines)


def drive(p: GoodputK, qs: list[float], t_of, steps: int, bs: int = 16, seed: int = 1) -> list[int]:
    """Decode steps of batch bs against a machine whose step with K drafts takes t_of(K) and whose
    requests accept position i with qs[i - 1]: the K run at each step."""
    rng, ks = random.Random(seed), []
    for _ in range(steps):
        k = p.decide_steps(bs)
        acc = [chain(rng, qs, k) for _ in range(bs)] if k else []
        p.observe(StepRecord(bs, k > 0, acc, t_of(k), None, True, k))
        ks.append(k)
    return ks


def test_it_reaches_the_longest_chain_in_a_few_steps_when_deep_positions_pay():
    # Plain 10 ms; a step with K drafts 16 + 1.5 K ms (the extend above plain, a draft step and a
    # verified token per K).  Position 3 accepts 60%, deeper ones 98%: from the positions K = 1
    # shows, K = 7 looks no better (a never-reached position repeats the last seen), and it is
    # best by 6% over K = 5 (expected 1 + 3.0 accepted for 26.5 ms against 1 + 2.5 for 23.5).
    # Climbing one neighbour per probe (every 48 speculative steps) takes about 60 steps to get there.
    p = build_policy("goodput-k")
    assert isinstance(p, GoodputK)
    p.set_candidate_steps(CANDS, 1)
    ks = drive(p, [0.85, 0.8, 0.6, 0.98, 0.98, 0.98, 0.98], lambda k: 0.010 if k == 0 else 0.016 + 0.0015 * k, 240)
    b = 7  # bucket of batch 16
    assert p.k_cur[b] == 7
    first = next(i for i, k in enumerate(ks) if k == 7)
    assert first <= 16, "".join(map(str, ks[:80]))
    # and it stays there: probes aside (3 steps in 48 at most), K = 7 from then on
    assert ks[24:].count(7) >= 0.9 * len(ks[24:])


def test_k_is_not_chosen_from_the_prior_before_position_one_is_seen():
    # Two plain and two speculative steps at batch 1, every draft accepted: one request's two
    # steps say little, and the prior alone (60% per position) would pick K = 1 at these costs.
    p = policy()
    ks = drive(p, [1.0], lambda k: 0.010 if k == 0 else 0.014 + 0.004 * k, 4, bs=1)
    assert ks == [0, 0, 3, 3]
    assert p.k_cur[0] == 3


def test_goodputs_own_probe_from_plain_runs_the_chosen_k_and_a_k_is_probed_from_plain_once():
    # A bucket where Goodput decodes plainly: its probes of speculation are its only evidence,
    # so they run the chosen K, not another K's probe (which would show it nothing of the chosen
    # K's acceptance: it stayed plain for hundreds of steps, open loop, member 0:5 at C=4).
    p = policy()
    b = 7  # batch 16
    for k in (1, 3, 5, 7):
        p.t_k[b][k] = None
    p.t_k[b][0], p.t_k[b][3] = 0.010, 0.014  # plain and the chosen K = 3 measured
    _set_counts(p, [100.0] * 7, [90.0] * 7)  # 90% per position: every K beats plain by far
    g = p.inner
    g.decide = lambda bs: True  # type: ignore[method-assign]
    p._inner_decide = g.decide
    p._next_probe[b] = 0  # a K probe is due
    g._probing = True  # ... but this step is Goodput's probe from plain
    assert p.decide_steps(16) == 3
    g._probing = False  # speculating by choice: the due probe goes to the largest K not yet run
    assert [p.decide_steps(16) for _ in range(3)] == [7, 7, 7]
    # Plain by choice: a K not yet run there whose estimate beats the plain step is probed once.
    g.decide = lambda bs: False  # type: ignore[method-assign]
    p._inner_decide = g.decide
    p.t_k[b][7] = 0.020  # the probe above measured 7
    p._next_plain_probe[b] = 0
    got = [p.decide_steps(16) for _ in range(3)]
    assert got[0] in (1, 5) and got == [got[0]] * 3
    p.t_k[b][1] = p.t_k[b][5] = 0.012  # both measured now: nothing left to probe from plain
    assert {p.decide_steps(16) for _ in range(200)} == {0}


def test_with_one_k_run_in_a_plain_bucket_the_best_other_k_is_probed_from_plain():
    # Only K = 5 run in a bucket where plain wins: the line from the plain step through it prices
    # K = 1 at 17 ms, (1 + 0.6) / 17 ms = 94 a second under plain's 100, so no K "beats plain" and the
    # choice cannot move off 5 on one K measured; Goodput's probes of speculation keep running it.
    p = policy()
    b = 7  # batch 16
    for k in (1, 3, 5, 7):
        p.t_k[b][k] = None
    p.t_k[b][0], p.t_k[b][5] = 0.010, 0.045
    p.k_cur[b] = 5
    _set_counts(p, [100.0] * 7, [60.0] * 7)
    assert max(r for r in p.rates(b).values() if r is not None) < 100.0
    g = p.inner
    g.decide = lambda bs: False  # type: ignore[method-assign]
    p._inner_decide = g.decide
    p._next_plain_probe[b] = 0
    assert [p.decide_steps(16) for _ in range(3)] == [1, 1, 1]  # the best estimate, once
    p.t_k[b][1] = 0.017  # measured: two K now, and no K left that beats plain
    assert {p.decide_steps(16) for _ in range(200)} == {0}


def test_goodputs_probes_from_plain_at_a_large_batch_run_a_short_chain():
    """Member 4099:99 at C=128 (TTFT-heavy: 7,350-token prompts, 95-token outputs; K = 0 the best
    static K, K = 1 0.994 of it, K = 5 0.938): only K = 5 had run at batch 96+, so Goodput's
    probes of speculation ran five drafts every 16 steps or so (0.984 of the best static K,
    twenty waves).  With a short chain measured there, its probes cost little more than a plain step."""
    assert _share_of_best_static_k(4099, 99, 128, 4) >= 0.99


def test_ablation_switches_each_mechanism_off_for_its_own_runs_only(tmp_path, capsys):
    """experiments/generated-machines/ablation.py: a mechanism is off in its own runs and on in
    the whole policy's, the classes are whole again afterwards, the journal resumes without
    running a member twice, and bad input is one line that writes nothing."""
    from benchmark_scripts import load

    from dynspec.policy.goodput.policy import Goodput

    mod = load("ablation")
    target, shift = GoodputK._plain_probe_target, Goodput.SHIFT_Z
    seen: list[tuple[bool, float]] = []
    real = GoodputK.decide_steps

    def spy(self, bs):
        seen.append((GoodputK._plain_probe_target is target, self.inner.SHIFT_Z))
        return real(self, bs)

    out = tmp_path / "rows.jsonl"
    argv = ["--out", str(out), "--family", "1", "--concurrency", "4", "--load", "0.9", "--seeds", "2",
            "--mechanisms", "plain-probes,shift"]
    GoodputK.decide_steps = spy  # type: ignore[method-assign]
    try:
        assert mod.main(argv) == 0
    finally:
        GoodputK.decide_steps = real  # type: ignore[method-assign]
    assert GoodputK._plain_probe_target is target and Goodput.SHIFT_Z == shift
    assert (True, shift) in seen and (False, shift) in seen  # goodput-k whole, and without plain probes
    assert all(z == shift for _, z in seen)  # shift is goodput's: its runs are on/off, not goodput-k
    text = capsys.readouterr().out
    assert "plain-probes" in text and "shift" in text and "earns" in text
    rows = out.read_text().splitlines()
    assert len(rows) == 2  # the config, then member 0
    import json

    got = json.loads(rows[1])["rows"]
    assert {r["variant"] for r in got} == {"goodput", "goodput-k", "plain-probes", "shift"}
    assert len(got) == 4 * 2  # every variant under both simulator seeds
    GoodputK.decide_steps = lambda self, bs: (_ for _ in ()).throw(AssertionError("ran again"))  # type: ignore[method-assign]
    try:
        assert mod.main(argv) == 0  # resumed: member 0 is in the journal
    finally:
        GoodputK.decide_steps = real  # type: ignore[method-assign]
    capsys.readouterr()
    assert mod.main([*argv, "--confirm", "2"]) == 0  # where it earned, again under seeds 2 and 3
    assert "again under simulator seeds 2..3" in capsys.readouterr().out
    assert json.loads((tmp_path / "rows.confirm2.jsonl").read_text().splitlines()[0])["config"]["confirm"] == 2
    for bad, why in ((["--seeds", "1"], "--seeds >= 2"), (["--confirm", "1"], "--confirm 0 or >= 2"), (["--mechanisms", "nope"], "unknown mechanism 'nope'"),
                     (["--load", "x"], "comma-separated numbers")):
        with pytest.raises(SystemExit):
            mod.main(["--out", str(tmp_path / "bad.jsonl"), *bad])
        assert why in capsys.readouterr().err
    assert not (tmp_path / "bad.jsonl").exists()


def _set_counts(g: GoodputK, tried: list[float], kept: list[float]) -> None:
    """goodput-k's position counts set by hand, with the survival and running sums read from them."""
    g.tried, g.kept = tried, kept
    g._surv = g._survival()
    g._cum = [0.0, *(sum(g._surv[:i]) for i in range(1, len(g._surv) + 1))]


def _share_of_best_static_k(seed: int, index: int, c: int, level_scale: int = 1) -> float:
    """goodput-k's steady output tok/s over the best static K's at one member-level of a family
    (five waves times level_scale, output lengths in [0.5, 1] x, as envelope.py --candidate-steps)."""
    from dynspec.analysis.family import level_requests, level_throughputs, member

    m = member(seed, index)
    work, cands = level_requests(m, c, 0.5, level_scale), [0, 1, 3, 5, 7]
    arms = ["policy:never", *(f"policy:table:1-={k}" for k in cands[1:])]
    best = max(level_throughputs(m.profile(), a, c, 0, candidate_steps=cands, **work)[1] for a in arms)
    return level_throughputs(m.profile(), "policy:goodput-k", c, 0, candidate_steps=cands, **work)[1] / best


def test_at_batch_one_goodputs_acceptance_leans_on_every_ks_steps():
    """Member 0:66 at C=1 (K = 3 best, every K beats plain): Goodput's own acceptance at batch 1
    came from a probe or two of one request's draws, and it decoded plainly for most of the
    level (0.900 of the best static K).  Leaning on the acceptance read by position from every
    K's steps, it speculates."""
    assert _share_of_best_static_k(0, 66, 1) >= 0.97


def test_at_batch_one_k_follows_the_requests_own_acceptance(monkeypatch):
    """Member 2718:22 at C=1 (requests differ: concentration 4.7; K = 3 the best static K): with
    one K for every request goodput-k keeps about the best static K (0.996, twenty waves), where
    SGLang 0.5.23's tiers, moving K with each request's acceptance, reached 1.032.  Choosing K
    for the request's own acceptance (its estimate over the population's, every position's rate
    scaled by one factor), it beats the best static K (1.051)."""
    share = _share_of_best_static_k(2718, 22, 1, 4)
    assert share >= 1.03
    # A request that has accepted more than most runs a deeper chain than the population's
    # choice, one that accepted less a shallower one; none told: the population's.
    from dynspec.policy.goodput import steps

    g = build_policy("goodput-k")
    g.set_candidate_steps([0, 1, 3, 5, 7], 3)
    _set_counts(g, [100.0] * 7, [100.0 * q for q in (0.75, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7)])
    for own, deeper in ((2.8, True), (0.8, False)):
        monkeypatch.setattr(g.inner, "_own_draws", lambda b, own=own: [(own, 0.5)])
        cum = g._request_cum(0)
        assert (cum[7] - cum[3] > g._cum[7] - g._cum[3]) is deeper
        assert cum[3] == pytest.approx(0.5 * own + 0.5 * g._cum[3], rel=1e-4)  # Goodput's estimate of it
    monkeypatch.setattr(steps, "_OWN_K_BUCKETS", 0)  # the mechanism off: one K for every request
    assert _share_of_best_static_k(2718, 22, 1, 4) < share - 0.03


def test_a_change_of_k_rescales_how_requests_differ():
    """Member 2713:46 at C=32 (K = 1 best, 1.11x plain): the spread between requests measured
    at K = 4 made the slow ones linger at K = 1 beyond what accepted drafts of 0 or 1 allow, and
    speculation there looked like a loss (0.916 of the best static K).  The spread between
    requests is kept in the server's own K's unit and each bucket reads it at its K."""
    assert _share_of_best_static_k(2713, 46, 32) >= 0.97
    g = build_policy("goodput-k")
    g.set_candidate_steps([0, 1, 3, 5, 7], 5)
    inner = g.inner
    inner._var_between, inner._var_within, inner._last_b = 0.8, 2.0, 3
    inner._req["r"] = [10.0, 40.0, 4.0]
    g._switch(3, 5, 1)
    r = g._cum[1] / g._cum[5]
    assert inner._var_between == 0.8 and inner._acc_scale[3] == pytest.approx(r)
    assert inner._acc_scale[4] == 1.0 and inner._var_within == pytest.approx(2.0 * r * r)
    assert inner._req["r"][:2] == pytest.approx([10.0 * r, 40.0 * r * r])


def test_each_bucket_reads_how_requests_differ_at_its_own_k():
    """Member 6151:125 (requests differ: between-request variance 1.7 drafts^2 at K = 3): at
    C=64 bucket 64+ ran K = 1 while the spread came from K = 3's steps, and the batch settled
    at 0.91 accepted drafts a step at K = 1 (the population's first position: 0.61).  Read at
    each bucket's own K, what a batch settles into stays within what its K can accept."""
    g = build_policy("goodput-k")
    g.set_candidate_steps([0, 1, 3, 5, 7], 3)
    _set_counts(g, [100.0] * 7, [100.0 * q for q in (0.6, 0.65, 0.65, 0.65, 0.65, 0.65, 0.65)])
    inner = g.inner
    inner._last_b = 0
    g._switch(11, 3, 1)  # bucket 64+ at K = 1, bucket 0 at the server's K = 3
    inner._var_between = 1.7
    k1 = g._cum[1]
    for b, k in ((11, 1), (0, 3)):
        inner.acc_est[b], inner.n_acc[b], inner._f_acc[b] = g._cum[k], 500, 0.9
    inner._f = 0.35  # mostly plain now: the batch holds more of the requests that accept much
    assert inner._population(11, inner._f) <= 1.0
    # read at K = 3, the same spread moves bucket 0 by (3's accepted / 1's)^2 times as much, to first order
    moved1 = inner._population(11, inner._f) - k1
    moved3 = inner._population(0, inner._f) - g._cum[3]
    assert moved3 > moved1 * (g._cum[3] / k1) * 0.8 > 0.0


def test_where_prefills_are_most_of_the_work_the_decode_steps_count_their_share():
    """Member 6151:125 at C = 48 and 64 (prompts of 3,121 tokens, 62 output, prefill 84% of the
    server's time; K = 0 best, K = 1 0.98 and 0.97 of it): the prefills a spec step merges
    (a share of its own time) were set against the step and its share of the prefills, five
    times as long, and the batch's share of the prefills priced at the bucket's middle (78
    requests at C=64, 55 at C=48); goodput-k speculated on 78% of steps at K = 1 (0.965 and 0.983
    of the best static K).  Member 6151:25 at C=128 (prefill 94% of the time; K = 1 1.6% ahead of
    plain): the lead and the margin, which price and guard the decode steps, counted in full
    against the whole cost, held it plain (0.987 once the merges counted their share alone)."""
    for c in (48, 64):
        assert _share_of_best_static_k(6151, 125, c, 4) >= 0.985
    assert _share_of_best_static_k(6151, 25, 128, 4) >= 0.995


def test_the_lead_follows_the_drafts_the_chosen_k_accepts(monkeypatch):
    """At batch 64 one draft gives 4% more output than plain (1.6 tokens for 15.4 ms against 1 for 10)
    and three or more give less.  The lead goodput asks (5% at the server's own N = 3) prices
    requests drifting apart, which one draft a step does less than three (0.6 accepted against 1.6):
    at K = 1 it is 0.37 of that, so speculation at K = 1 starts as soon as K = 1 is measured.  With
    the lead of N = 3, the 4% gain is the lead's and the bucket decodes plainly."""
    from dynspec.policy.buckets import _BUCKETS
    from dynspec.policy.goodput import steps

    t = {0: 0.010, 1: 0.0154, 3: 0.028, 5: 0.038, 7: 0.048}
    qs = [0.6, 0.9, 0.9]
    b = _BUCKETS[64]
    p = policy()
    ks = drive(p, qs, t.__getitem__, 200, bs=64)
    assert p.k_cur[b] == 1
    assert p.inner._lead_share[b] == pytest.approx(p.survival()[0] / sum(p.survival()[:3]))
    assert ks[70:200].count(1) >= 0.8 * 130, "".join(map(str, ks))
    monkeypatch.setattr(steps, "LEAD_BY_K", False)
    one_lead = policy()
    ks = drive(one_lead, qs, t.__getitem__, 200, bs=64)
    assert one_lead.inner._lead_share[b] == 1.0
    assert ks[70:200].count(1) < 0.3 * 130, "".join(map(str, ks))


def test_lead_by_k_study_reruns_the_adaptive_arms_both_ways_and_resumes(tmp_path, capsys, monkeypatch):
    """experiments/generated-machines/lead_by_k.py: goodput-k with and without the lead by K and
    on/off goodput at every level of the committed rows, the switch restored afterwards, a rerun
    resumed from the journal, and rows that are not a K run refused in one line."""
    import json

    import pandas as pd
    from benchmark_scripts import load

    from dynspec.policy.goodput import steps

    mod = load("lead_by_k")
    arms = ["static-0", "static-1", "static-3", "static-5", "static-7", "oracle", "sglang-tiers", "k-table",
            "goodput-k", "goodput"]
    committed = pd.DataFrame([{"member": 0, "arm": a, "concurrency": c, "output_throughput": 100.0 + i,
                               "steady_throughput": 100.0 + i, "best_static_k": 7, "num_steps": 3}
                              for c in (1, 32) for i, a in enumerate(arms)])
    rows = tmp_path / "family-0-k.csv.gz"
    committed.to_csv(rows, index=False)
    (tmp_path / "family-0-k.csv.provenance.json").write_text(json.dumps(
        {"config": {"family_seed": 0, "candidate_steps": CANDS, "range_ratio": 0.5, "level_scale": 1}}))
    out = tmp_path / "fresh.csv"
    assert mod.main(["--rows", str(rows), "--out", str(out), "--jobs", "1"]) == 0
    assert steps.LEAD_BY_K is True
    fresh = pd.read_csv(out)
    assert sorted(fresh.arm.unique()) == ["goodput", "goodput-k", "goodput-k-one-lead"]
    assert sorted(fresh.concurrency.unique()) == [1, 32] and (fresh.steady_throughput > 0).all()
    assert "lead by K / one lead" in capsys.readouterr().out
    monkeypatch.setattr(mod, "run_member", lambda task: (_ for _ in ()).throw(AssertionError("ran again")))
    assert mod.main(["--rows", str(rows), "--out", str(out), "--jobs", "1"]) == 0  # member 0 is in the journal
    with pytest.raises(SystemExit):
        mod.main(["--rows", str(tmp_path / "none.csv.gz"), "--out", str(tmp_path / "bad.csv")])
    assert "not a K-envelope run" in capsys.readouterr().err and not list(tmp_path.glob("bad.csv*"))


def test_own_k_study_runs_both_ways_and_refuses_bad_input(capsys):
    """experiments/generated-machines/own_k.py: member 2718:22 at C=1 moves up with the request's
    own K (the mechanism is back on after its run without), and bad input is one line."""
    from benchmark_scripts import load

    from dynspec.policy.goodput import steps

    mod = load("own_k")
    assert mod.main(["--family", "2718", "--members", "22-22", "--concurrency", "1"]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("2718:22"))
    assert float(row[2]) > float(row[1]) + 0.02 and steps._OWN_K_BUCKETS == steps._BUCKETS[steps.OWN_K_UP_TO] + 1
    assert "better by > 0.5% at 1, worse at 0 of 1" in out
    for bad in (["--members", "5-2"], ["--concurrency", "0"]):
        with pytest.raises(SystemExit):
            mod.main(bad)
        assert "error:" in capsys.readouterr().err


def test_k_against_sets_a_revision_beside_this_tree_and_refuses_bad_input(capsys):
    """experiments/generated-machines/k_against.py: against the revision checked out, both sides
    measure the same share; the temporary worktree is gone after; bad input is one line."""
    import subprocess

    from benchmark_scripts import load

    mod = load("k_against")
    assert mod.main(["HEAD", "--family", "7919", "--members", "115-115", "--concurrency", "2",
                     "--level-scale", "1"]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("7919:115@2"))
    assert 0.5 < float(row[2]) <= 1.2 and "better by > 0.5% at 0, worse at 0" in out
    if not subprocess.run(["git", "-C", str(mod.ROOT), "status", "--porcelain", "src"],
                          capture_output=True, text=True).stdout:  # a clean tree: HEAD is this tree
        assert float(row[2]) == float(row[5])
    worktrees = subprocess.run(["git", "-C", str(mod.ROOT), "worktree", "list"], capture_output=True, text=True)
    assert len(worktrees.stdout.splitlines()) == 1
    assert mod.main(["no-such-revision", "--members", "1-1"]) == 2
    assert "is not a revision" in capsys.readouterr().err
    for bad in (["HEAD", "--members", "5-2"], ["HEAD", "--concurrency", "0"]):
        with pytest.raises(SystemExit):
            mod.main(bad)
        assert "error:" in capsys.readouterr().err


def test_until_measured_a_requests_spread_is_the_chains_at_the_buckets_k():
    """Goodput times its probes by the gain's uncertainty, one request's accepted drafts varying by
    a fixed 1 until it measures them (batches of 8 or fewer).  At K = 1 they are 0 or 1 (sd
    sqrt(q (1 - q)), 0.49 at q = 0.6); at K = 5 the chain's spread is larger.  Once measured, the
    measurement stands."""
    p = policy()
    b = 7  # batch 16: above what Goodput measures request by request
    _set_counts(p, [100.0] * 7, [60.0] * 7)
    p.inner.t_est[0][b], p.inner.t_est[1][b] = 0.010, 0.020
    s = p._surv
    for k in (1, 5):
        p._switch(b, p.k_cur[b], k)
        e, e2 = sum(s[:k]), sum((2 * i + 1) * s[i] for i in range(k))
        assert p.inner._sd_within == pytest.approx(math.sqrt(e2 - e * e))
    p.inner._var_within = 0.3 ** 2  # measured: kept whatever K runs
    p.inner._sd_within = 0.3
    p._switch(b, 5, 1)
    assert p.inner._sd_within == 0.3


def test_a_plain_bucket_at_k_one_probes_as_a_draw_of_zero_or_one_allows():
    """Member 4099:24 at C=16 (TTFT-heavy; K = 0 best, K = 1 0.935 of it): with K = 1 chosen where
    plain decodes, Goodput's probes came every 16-22 steps, its gain's uncertainty priced with a
    request's spread of 1 accepted draft (0.987 of the best static K, twenty waves)."""
    assert _share_of_best_static_k(4099, 24, 16, 4) >= 0.99


def test_between_short_and_long_chains_each_k_is_priced_at_the_batch_it_settles_into():
    """Member 4099:69 at C=8 (requests' acceptance a Beta of concentration 7; K = 3 best, K = 5 2%
    behind): the position counts, read from a batch settled at K = 5, which holds more slow
    requests than one at K = 3 would, priced the two 0.2% apart, and goodput-k kept K = 5
    (0.976 of the best static K, twenty waves).  Settled, 0.994; 0.989 once the spread between
    requests was kept in one unit across K (0.45 drafts^2 at K = 3 at the level's end, about
    what the member's Beta of concentration 7 gives, 0.36 to first order, where rescaling it at
    every change of K had worn it to 0.01): the level leaves its first choice, K = 5, for K = 3
    about 300 steps later."""
    assert _share_of_best_static_k(4099, 69, 8, 4) >= 0.985


def test_at_batch_one_a_request_that_accepts_more_is_a_geometric_chain_not_a_sure_one():
    """Member 6151:164 at C=1 (N = 2, K = 1 best, plain 0.915 of it; requests' rates a Beta of
    concentration 7.5): a request that accepted its first drafts read, by the population's
    position rates scaled by one factor and capped at 1, as sure at every depth; it took K = 7,
    whose step the on/off decision, its draws rescaled by the population's chain, priced as a
    loss, and it decoded plainly to its end (the fifth of requests that accept most speculated
    on 28% of their steps; the level 0.960 of the best static K)."""
    assert _share_of_best_static_k(6151, 164, 1, 4) >= 0.99
    g = build_policy("goodput-k")
    g.set_candidate_steps([0, 1, 3, 5, 7], 2)
    _set_counts(g, [100.0] * 7, [100.0 * q for q in (0.45, 0.6, 0.65, 0.7, 0.7, 0.7, 0.7)])
    g.k_cur[0] = 1
    g.inner._own_draws = lambda b: [(0.9, 0.75)]  # its own mean at K = 1, weighed 3:1 against the arrivals'
    cum = g._request_cum(0)
    for k in (1, 3, 7):  # its own part the geometric chain at its rate, the rest the population's
        own = sum(0.9 ** i for i in range(1, k + 1))
        assert cum[k] == pytest.approx(0.75 * own + 0.25 * g._cum[k], rel=1e-6)
    assert cum[7] < 0.8 * 7  # not sure at every depth
    g.inner._own_draws = lambda b: [None]  # nothing told yet: the population's
    assert g._request_cum(0) is g._cum


def _with_counts(q: list[float], seen: float, behind: float) -> tuple[GoodputK, int]:
    """goodput-k at K = 1 in the bucket of batch 16, positions accepted at rates q from `seen`
    request-samples on, steps of K = 0 / 1 measured at 8 / 10 ms and K = 3's at the time that
    puts its estimate `behind` K = 1's (0.99: 1% behind)."""
    from dynspec.policy.buckets import bucket_of

    g = build_policy("goodput-k")
    g.set_candidate_steps([0, 1, 3, 5, 7], 3)
    kept, n = [], seen
    for x in q:  # each position's samples are those the one before kept
        kept.append(n * x)
        n *= x
    _set_counts(g, [seen, *kept[:-1]], kept)
    g.seen = list(g.tried)
    b = bucket_of(16)
    g.k_cur[b] = 1
    g.t_k[b][0], g.t_k[b][1], g.t_k[b][3] = 0.008, 0.010, 0.012
    r = g.rates(b)
    g.t_k[b][3] = 0.012 * r[3] / r[1] / behind
    return g, b


def test_probes_of_a_runner_up_within_the_counts_noise_do_not_thin_out():
    """Member 8191:142 at C=5 (K = 3 best): the second position rested on the few samples K = 3's
    probes gave and read low, K = 3 looked about 1% behind K = 1, and every probe that
    "confirmed" K = 1 doubled the interval between probes up to 768 spec steps, which starved
    that position of samples and froze the reading (0.979 of the best static K).  The interval
    now doubles only while the runner-up trails by PROBE_Z of its standard errors."""
    from dynspec.policy.goodput import steps

    q = [0.55, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    tie, b = _with_counts(q, 60.0, 0.99)  # K = 3 1% behind, on tens of samples
    r = tie.rates(b)
    assert r[3] / r[1] == pytest.approx(0.99)
    tie._probe_iv[b] = 2 * steps.PROBE_MIN
    tie._choose(b, after_probe=True)
    assert tie.k_cur[b] == 1 and tie._probe_iv[b] == steps.PROBE_MIN
    clear, b = _with_counts(q, 5000.0, 0.9)  # well behind, on thousands
    clear._probe_iv[b] = steps.PROBE_MIN
    clear._choose(b, after_probe=True)
    assert clear.k_cur[b] == 1 and clear._probe_iv[b] == 2 * steps.PROBE_MIN
    assert _share_of_best_static_k(8191, 142, 5, 4) >= 0.99


def test_at_small_batches_k_follows_the_running_requests_own_acceptance():
    """Member 8191:85 at C=2 (requests differ: concentration 4.9; K = 5 the best static K): with
    the population's K for a batch of two, goodput-k kept 0.991 of the best static K where SGLang
    0.5.23's tiers, moving K with the acceptance of the requests running, reached 1.008.  Up to
    OWN_K_UP_TO requests, K is chosen for the mean of each request's own chain."""
    from dynspec.policy.buckets import bucket_of

    assert _share_of_best_static_k(8191, 85, 2, 4) >= 1.0
    g = build_policy("goodput-k")
    g.set_candidate_steps([0, 1, 3, 5, 7], 3)
    _set_counts(g, [100.0] * 7, [100.0 * q for q in (0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6)])
    b = bucket_of(2)
    g.inner._batch = ("fast", "slow")
    g.inner._own_draws = lambda b: [(2.7, 0.8), (0.3, 0.8)]  # their own means at K = 3
    cum = g._request_cum(b)
    for k in (1, 3, 7):  # the mean of the two, each its own chain blended with the population's
        fast = sum(g._own_rate(2.7, 3) ** i for i in range(1, k + 1))
        slow = sum(g._own_rate(0.3, 3) ** i for i in range(1, k + 1))
        assert cum[k] == pytest.approx(0.5 * (0.8 * (fast + slow) + 0.4 * g._cum[k]), rel=1e-6)
    assert cum[3] == pytest.approx(0.5 * (0.8 * 3.0 + 0.4 * g._cum[3]), rel=1e-4)

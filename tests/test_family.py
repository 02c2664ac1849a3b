"""The generated profile family (dynspec.analysis.family) and the dynamic arm on a small piece of it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dynspec.analysis.family import LEVELS, SHAPES, family, levels_for, member, run_member, vllm_k0_profile
from dynspec.sim.profile import Profile


def test_members_are_reproducible_validated_profiles_of_every_shape():
    members = family(40, seed=3)
    assert members == family(40, seed=3)  # same seed, same family
    assert member(3, 7) == members[7]  # one member alone, as --family-member draws it
    assert family(5, seed=4) != members[:5]
    assert {m.shape for m in members} == set(SHAPES)
    assert {m.workload for m in members} == {"decode-heavy", "ttft-heavy"}
    for m in members:
        p = m.profile()
        assert isinstance(p, Profile)
        assert 1.5 <= m.accept_length <= 4 and 2 <= m.num_steps <= 5
        assert 0.005 <= m.catch_up <= 0.06
        assert p.catch_up_time(8) == pytest.approx(m.catch_up * p.plain_time(8), rel=1e-3)
        g = [m.accept_length * p.plain_time(b) / p.spec_time(b) for b in (1, 16, 256)]
        assert g[0] >= g[1] * (1 - 1e-4) and g[1] >= g[2] * (1 - 1e-4)  # speedup never rises with the batch (tables rounded)
        if m.shape in ("falling", "flat-then-falling"):
            # the per-step crossover lies where it was drawn: a knot of the table
            assert p.crossover_batch(up_to=256) == m.crossover or math.isclose(m.gain(m.crossover), 1.0)
        elif m.shape == "never-above-1":
            assert p.crossover_batch(up_to=256) == 1
        else:
            assert p.crossover_batch(up_to=256) is None


def test_a_speculative_step_always_costs_more_than_a_plain_one():
    """spec_ms = accept_length * plain_ms / G: a G drawn above the accept length made a speculative
    step cheaper than a plain one (21 of family 0's 200 members, before the cap), which no server
    does: it verifies k+1 tokens per request and runs k draft forwards."""
    members = [(m, m.profile().steps[0]) for m in family(200, seed=0)]
    cheaper = {}
    for m, t in members:
        ratios = [s / p for s, p in zip(t.spec_ms, t.plain_ms)]
        if min(ratios) <= 1:
            cheaper[m.index] = round(min(ratios), 3)
    assert not cheaper, f"members whose speculative step costs no more than a plain one: {cheaper}"

    from dynspec.analysis.family import MIN_SPEC_OVERHEAD

    assert 0 < MIN_SPEC_OVERHEAD < 0.2
    capped = 0
    for m, t in members:
        for b, s, p in zip(t.batch_size, t.spec_ms, t.plain_ms):
            assert s >= p * (1 + MIN_SPEC_OVERHEAD) * (1 - 1e-5), (m.index, b, s, p)  # tables rounded to 1e-5 ms
            capped += m.gain(b) < m.uncapped_gain(b)
    assert capped  # the cap is exercised: some knots were drawn above it


def test_the_cap_leaves_members_that_were_physical_as_they_were():
    m = member(0, 0)  # drawn with G at most 1.52 against accept length 2.54: never near the cap
    t = m.profile().steps[0]
    assert all(m.gain(b) == m.uncapped_gain(b) for b in t.batch_size)
    assert t.spec_ms == [round(m.accept_length * m.plain(b) / m.uncapped_gain(b), 5) for b in t.batch_size]
    # the table the generator made before the cap, byte for byte
    assert t.spec_ms[:4] == [8.60648, 8.96716, 9.19662, 9.36955] and t.spec_ms[-1] == 16.32377
    # member 192 was not (G 2.38 at batch 1 against accept length 1.52): the same draws, capped
    # knots at exactly 1 + MIN_SPEC_OVERHEAD plain steps, the rest and the crossover as drawn
    from dynspec.analysis.family import MIN_SPEC_OVERHEAD

    m = member(0, 192)
    t = m.profile().steps[0]
    assert t.plain_ms[0] == 39.091 and t.spec_ms[0] == pytest.approx(39.091 * (1 + MIN_SPEC_OVERHEAD), abs=1e-5)
    assert t.spec_ms[-1] == 1245.72673 and m.profile().crossover_batch(up_to=256) == m.crossover


def test_crossovers_fall_between_bucket_edges_and_levels_cover_them():
    from dynspec.policy import BUCKET_EDGES

    crossing = [m for m in family(200) if m.crossover]
    inside = [m for m in crossing if m.crossover not in BUCKET_EDGES]
    assert len(inside) > len(crossing) / 2
    m = inside[0]
    assert {m.crossover - 1, m.crossover, m.crossover + 1} <= set(levels_for(m))
    assert set(LEVELS) <= set(levels_for(m))


def test_vllm_k0_pays_a_full_draft_forward_on_every_plain_step():
    p = member(0, 0).profile()
    k0 = vllm_k0_profile(p)
    assert k0.catch_up_time(32) == pytest.approx(p.resume_time(32))
    assert k0.resume_time(32) == 0 and k0.spec_time(32) == p.spec_time(32)


@pytest.mark.parametrize("range_ratio, worst", [(1.0, 0.93), (0.5, 0.975)])
def test_dynamic_arm_on_a_small_family(range_ratio, worst):
    """Ten members at levels 1, 4, 16, 64 and each one's crossover, at fixed output lengths and at
    lengths drawn in [0.5, 1] x:
    the dynamic arm must stay near the switching server's best mode at every level (simulated on
    2026-12-01: worst / median 0.940 / 0.994 fixed, 0.954 / 0.999 varied; then 0.940 / 0.994 and
    0.984 / 0.999; with each request's own acceptance and the lead in proportion to the batch,
    0.947 / 0.994 and 0.983 / 1.000; with the lead that follows how finishes come, 0.944 / 0.994
    and 0.989 / 1.000).  A broken policy, e.g.
    one that always or never speculates, falls far below on some member: see the control."""
    levels = (1, 4, 16, 64)
    ratios, always = [], []
    for m in family(10, seed=1):
        rows = run_member(m, arms=("dynamic",), levels=levels, range_ratio=range_ratio)
        ratios += [r["of_switching"] for r in rows if r["arm"] == "dynamic"]
        always += [r["of_switching"] for r in rows if r["arm"] == "eagle3"]
    ratios = np.array(ratios)
    assert ratios.min() >= worst and np.median(ratios) >= 0.99, (ratios.min(), np.median(ratios))
    assert min(always) < 0.8  # the control: some member punishes a policy that does not adapt


def test_varied_output_lengths_lift_the_lockstep_cost_off_speculation():
    """Member 0:72 at C=32: with one fixed output length the plain server's requests finish
    together and prefill together, while speculation scatters them, so EAGLE-3 loses (about 0.9 of
    plain, simulated) though its step gains about 5%; with lengths drawn in [0.5, 1] x (the same
    draws for every arm) it wins.  A run_member that ignores range_ratio fails the second assert."""
    m = member(0, 72)

    def tps(ratio):
        rows = run_member(m, arms=(), levels=(32,), range_ratio=ratio)
        return {r["arm"]: r["output_throughput"] for r in rows if r["concurrency"] == 32}

    fixed, varied = tps(1.0), tps(0.5)
    assert fixed["eagle3"] < 0.95 * fixed["baseline"], fixed
    assert varied["eagle3"] > 1.02 * varied["baseline"], varied
    assert tps(0.5) == varied  # seeded: the same draws on every run


def test_a_longer_level_amortizes_what_the_policy_learns_once():
    """Member 0:117 at C=32 (varied lengths; plain wins there by 4x per token): the dynamic arm
    starts from nothing at every level, and what it learns once weighs less in a longer level
    (of the switching server's best, simulated: 0.961 -> 0.987 at 4 x the requests on 2026-12-01; 0.986 -> 0.992 since a draining level borrows its losses through the
    per-request bound instead of trying a spec step in every bucket).  A run_member that ignores
    level_scale fails both asserts."""
    from dynspec.analysis.family import level_requests

    m = member(0, 117)
    assert len(level_requests(m, 32, 0.5, 4)["lengths"]) == 4 * len(level_requests(m, 32, 0.5)["lengths"])

    def of_switching(scale):
        rows = run_member(m, arms=("dynamic",), levels=(32,), range_ratio=0.5, level_scale=scale)
        return next(r["of_switching"] for r in rows if r["arm"] == "dynamic" and r["concurrency"] == 32)

    short, long = of_switching(1), of_switching(4)
    assert long > short + 0.003, (short, long)


def test_the_steady_state_is_the_waves_between_the_first_and_the_drain():
    """level_throughputs: the steady figure is C x tokens / latency over the requests sent after
    the first wave and before any request still running at the last send.  A plain server's fixed-length closed loop runs
    in waves, each sent at one moment, so that is waves 2 .. W-1: (W - 2) x C x L tokens over the
    time from the second wave's send to the last's.  Counting the first wave (its prompts all
    prefill before any decodes) or the drain, or timing a window instead of the requests' own
    lives, misses the exact figure."""
    from dynspec.analysis.family import level_requests, level_throughputs
    from dynspec.sim.run import simulate_level

    m, c = member(0, 72), 31
    work = level_requests(m, c)
    n, out = work["num_prompts"], m.output_len
    whole, steady = level_throughputs(m.profile(), "baseline", c, **work)
    _, records = simulate_level(m.profile(), "baseline", c, **work)
    sends = sorted({r.start for r in records})
    assert len(sends) == math.ceil(n / c) >= 4  # waves: every request of one is sent at one moment
    middle = (n - 1) // c - 1  # whole waves between the first and the last
    assert steady == pytest.approx(middle * c * out / (sends[-1] - sends[1]), rel=1e-12)
    assert whole == simulate_level(m.profile(), "baseline", c, **work)[0]["output_throughput"]


def test_the_steady_state_keeps_the_slow_requests_of_its_cohort():
    """steady_throughput on a closed loop of 8 clients whose requests take 1 or, one in ten, 10
    time units (20 requests a client, 300 seeds): the truth is 8 x tokens / mean latency.
    Keeping the requests finished by the last send drops the slow ones still running there and
    reads 12% high; a cohort chosen by send time keeps them (within 4%)."""
    import heapq
    import random
    from collections import namedtuple

    from dynspec.analysis.family import steady_throughput

    rec = namedtuple("rec", "start end output_tokens")
    c, n, seeds = 8, 160, 300
    mean = 0.9 * 1.0 + 0.1 * 10.0
    got = 0.0
    for s in range(seeds):
        rng, free, recs = random.Random(s), [(0.0, i) for i in range(c)], []
        for _ in range(n):
            t, i = heapq.heappop(free)
            d = 10.0 if rng.random() < 0.1 else 1.0
            recs.append(rec(t, t + d, 10))
            heapq.heappush(free, (t + d, i))
        got += steady_throughput(recs, c) / seeds
    assert got == pytest.approx(c * 10 / mean, rel=0.04)


def test_the_steady_state_does_not_depend_on_how_long_the_level_runs():
    """Member 0:72 at C=63, fixed lengths: EAGLE-3 scatters finishes, so its last requests drain at
    a falling batch while the plain lockstep's last wave ends together, and a five-wave level
    charges it for that.  Over the steady state EAGLE-3 / never is about what a level of 8x the
    requests gives (simulated: whole run 0.864 at 1x, 0.951 at 8x; steady 0.995 and 0.967: at 1x
    EAGLE-3's middle waves still keep some of the first wave's lockstep), and for a TTFT-heavy
    member where the drain and the first wave's prefill nearly cancel (0:49 at C=256) it agrees
    with the whole run at any length.  run_member's steady columns are each arm's share of the best."""
    def ratios(mi, c, scale):
        rows = run_member(member(0, mi), arms=("dynamic",), levels=(c,), level_scale=scale)
        by = {r["arm"]: r for r in rows if r["concurrency"] == c}
        return by, by["eagle3"]["output_throughput"] / by["never"]["output_throughput"], \
            by["eagle3"]["steady_throughput"] / by["never"]["steady_throughput"]

    by, whole, steady = ratios(72, 63, 1)
    _, whole8, steady8 = ratios(72, 63, 8)
    assert whole < 0.9 < 0.95 < whole8 and abs(steady8 - whole8) < 0.03 and steady > whole + 0.1
    _, whole, steady = ratios(49, 256, 1)
    assert abs(steady - whole) < 0.01, (whole, steady)
    best = max(by["never"]["steady_throughput"], by["eagle3"]["steady_throughput"])
    assert by["dynamic"]["steady_of_switching"] == pytest.approx(by["dynamic"]["steady_throughput"] / best)
    assert max(by["never"]["steady_of_switching"], by["eagle3"]["steady_of_switching"]) == 1.0


def test_an_acceptance_estimate_that_drifts_low_does_not_stick():
    """Member 0:156 (EAGLE-3 1.10x per step at every batch) at C=1 and 2, varied lengths: with an
    EMA of accepted drafts over about 50 requests (acc_alpha 0.02) an unlucky run turns speculation
    off, only probes sample it after that, and the estimate settles low (0.93 of the switching
    server's best, simulated); over about 200 (the default, 0.005) goodput stays within 3%.  Since
    a probe's sample weighs as much as the steps it stands for, 0.02 recovers
    part of it (0.949 / 0.965 at C = 1 / 2); an EMA over about 20 requests (0.05) still sticks at
    C=1 (0.936; at C=2 each request's own estimate lifts it to 0.965).  Since probes come before
    waiting costs more in expectation than a probe (the estimate's uncertainty, _refresh), even
    that fast EMA, whose estimate rests on few steps, is sampled back: 0.970 at C=1."""
    from dynspec.analysis.family import level_requests
    from dynspec.sim.run import simulate_level

    m = member(0, 156)
    for c in (1, 2):
        work = level_requests(m, c, range_ratio=0.5)
        t = {a: simulate_level(m.profile(), a, c, **work)[0]["output_throughput"]
             for a in ("eagle3", "policy:never", "policy:goodput", "policy:goodput:acc_alpha=0.05")}
        best = max(t["eagle3"], t["policy:never"])
        assert t["policy:goodput"] >= 0.97 * best, (c, t)
        if c == 1:  # a fast EMA: 0.936 before probes followed the estimate's uncertainty
            assert t["policy:goodput:acc_alpha=0.05"] >= 0.95 * best, (c, t)


def test_the_oracle_reads_the_running_requests_true_acceptance():
    """experiments/generated-machines/oracle_acceptance.py: the what-if policy's acceptance is the mean over the
    requests the engine runs of r + r^2 + ... + r^n (their own rates), whatever it observed."""
    from benchmark_scripts import load

    oa = load("oracle_acceptance")
    p = member(0, 67).profile()  # requests very unlike each other (concentration 4.3)
    pol = oa.OracleAcceptance(lead=0.0)
    eng = oa._Engine(p, pol, seed=0)
    assert pol.engine is eng
    for _ in range(3):
        eng.submit(64, 32)
    while len(eng.running) < 3:
        eng.step()
    n = eng.num_steps
    truth = sum(sum(r.accept_rate ** j for j in range(1, n + 1)) for r in eng.running) / 3
    assert pol._accepted(0) == pytest.approx(truth)
    rates = {round(r.accept_rate, 3) for r in eng.running}
    assert len(rates) == 3  # three different requests: the batch's truth is their mean, not a bucket's


def test_family_variants_reruns_every_member_level_of_a_csv(tmp_path, capsys, monkeypatch):
    """experiments/generated-machines/family_variants.py --all: each spec on every member-level of an envelope CSV,
    in the CSV's order whatever the number of jobs.  The default spec reproduces the CSV's
    dynamic arm exactly (the simulator is seeded); a second spec's column is its own runs."""
    import pandas as pd

    from benchmark_scripts import load

    fv = load("family_variants")
    monkeypatch.setitem(__import__("sys").modules, "family_variants", fv)  # its pool pickles _level_tps by name
    rows = run_member(member(0, 5), arms=("dynamic",), levels=(2, 16))
    csv = tmp_path / "f.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    r = fv.variants(str(csv), ["goodput", "goodput:lead=0.3"], 0, 0, 0, 1.0, every=True, jobs=2)
    assert len(r) == len({row["concurrency"] for row in rows}) >= 2 and set(r["set"]) == {"all"}
    assert np.allclose(r["goodput"], r["dynamic (from the CSV)"])
    d = pd.DataFrame(rows).pivot_table(index="concurrency", columns="arm", values="output_throughput")
    own = d[["never", "eagle3"]].max(axis=1)
    ratios = (d["dynamic"] / own).sort_values()  # the CSV's order: worst first
    alone = [fv.tps(member(0, 5), "policy:goodput:lead=0.3", int(c)) / own[c] for c in ratios.index]
    assert np.allclose(r["goodput:lead=0.3"], alone)
    out = capsys.readouterr().out
    assert "below 0.97" in out
    # each spec's member-levels that moved by more than 1% against the CSV's dynamic arm
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert lines["goodput"].endswith("rose / fell by more than 1%: 0 / 0")
    d = r["goodput:lead=0.3"] - r["dynamic (from the CSV)"]
    assert lines["goodput:lead=0.3"].endswith(f"rose / fell by more than 1%: {(d > 0.01).sum()} / {(d < -0.01).sum()}")
    assert "rose" not in lines["dynamic"]
    # --out writes each row under its member-level
    assert list(r.index.names) == ["member", "concurrency"]
    assert list(r.index.get_level_values("concurrency")) == list(ratios.index)
    # --level-scale K: the CSV's levels served K x the requests, and so do the reruns (at scale 1
    # the default spec would not reproduce the CSV's dynamic arm)
    rows = run_member(member(0, 5), arms=("dynamic",), levels=(16,), level_scale=2)
    pd.DataFrame(rows).to_csv(csv, index=False)
    for k in (2, 1):
        r = fv.variants(str(csv), ["goodput"], 0, 0, 0, 1.0, every=True, level_scale=k)
        assert np.allclose(r["goodput"], r["dynamic (from the CSV)"]) == (k == 2), (k, r)
    # --steady: judged over each level's steady state, the CSV's own steady ratios reproduced
    r = fv.variants(str(csv), ["goodput"], 0, 0, 0, 1.0, every=True, level_scale=2, steady=True)
    dyn = {row["concurrency"]: row["steady_of_switching"] for row in rows if row["arm"] == "dynamic"}
    got = r["dynamic (from the CSV)"]
    assert got.tolist() == pytest.approx([dyn[c] for c in got.index.get_level_values("concurrency")])
    assert np.allclose(r["goodput"], r["dynamic (from the CSV)"])
    pd.DataFrame(rows).drop(columns=["steady_throughput"]).to_csv(csv, index=False)
    with pytest.raises(SystemExit, match="no steady_throughput column"):
        fv.variants(str(csv), ["goodput"], 0, 0, 0, 1.0, every=True, level_scale=2, steady=True)


def test_envelope_counts_the_levels_no_switching_arm_can_meet(tmp_path, capsys):
    """experiments/generated-machines/envelope.py names the member-levels where max(never, EAGLE-3) on the switching
    server is itself below 0.97 of max(plain, EAGLE-3) (the catch-up's cap).  Member 0:117 pays
    5.8% of a plain step for catch-up and loses to plain above batch 2, so some of its levels are
    out of reach; the count must be the CSV's own."""
    import re

    import pandas as pd

    from benchmark_scripts import load

    csv = tmp_path / "m.csv"
    load("envelope").main(["--family-member", "0:117", "--out", str(csv)])
    out = capsys.readouterr().out
    found = re.search(r"below 0.97 of max\(baseline, eagle3\) at (\d+) member-levels on (\d+) members", out)
    assert found, out
    t = pd.read_csv(csv).pivot_table(index="concurrency", columns="arm", values="output_throughput")
    capped = int((t[["never", "eagle3"]].max(axis=1) < 0.97 * t[["baseline", "eagle3"]].max(axis=1)).sum())
    assert capped > 0 and (int(found.group(1)), int(found.group(2))) == (capped, 1)


def test_confirm_reruns_the_switching_servers_misses_and_judges_them_on_seed_means(tmp_path, capsys):
    """--confirm 2 reruns exactly the levels where dynamic fell below 0.97 of max(never, eagle3),
    over the whole run or the steady state (member 0:26 at five waves has both kinds: C=255 over
    the whole run alone, C=95, 96, 191, 192 over the steady state), with simulator seed 1; seed 0's rows are the
    main run's, whole and steady.  The steady gate's line judges those levels on the two seeds'
    means and every other level on its one run."""
    import re

    import pandas as pd

    from benchmark_scripts import load
    from dynspec.analysis.family import confirm_levels

    csv = tmp_path / "m.csv"
    load("envelope").main(["--family-member", "0:26", "--out", str(csv), "--confirm", "2"])
    out = capsys.readouterr().out
    dyn = pd.read_csv(csv).query("arm == 'dynamic'").set_index("concurrency")
    missed = set(dyn.index[(dyn.of_switching < 0.97) | (dyn.steady_of_switching < 0.97)])
    conf = pd.read_csv(tmp_path / "m.confirm.csv")
    assert len(missed) >= 2 and set(conf.concurrency) == missed and sorted(conf.sim_seed.unique()) == [0, 1]
    assert (dyn.of_switching < 0.97).any() and (dyn.steady_of_switching < 0.97).any()
    rows = pd.read_csv(csv)
    first = conf[conf.sim_seed == 0].set_index("concurrency").sort_index()
    for arm in ("baseline", "eagle3", "never", "dynamic"):
        mine = rows[rows.arm == arm].set_index("concurrency").loc[first.index]
        assert np.allclose(first[arm], mine.output_throughput)
        assert np.allclose(first[f"steady_{arm}"], mine.steady_throughput)
    c = min(missed)
    again = confirm_levels((member(0, 26), (c,), (0,), 1.0, 1))[0]
    assert again["dynamic"] == pytest.approx(first.loc[c, "dynamic"], rel=1e-12)
    assert again["steady_dynamic"] == pytest.approx(first.loc[c, "steady_dynamic"], rel=1e-12)
    mean = conf.groupby("concurrency").mean(numeric_only=True)
    steady = mean.steady_dynamic / mean[["steady_never", "steady_eagle3"]].max(axis=1)
    once = steady[sorted(set(dyn.index[dyn.steady_of_switching < 0.97]))]
    stay = re.search(r"over the steady state: (\d+) of (\d+) stay below", out)
    assert stay and (int(stay.group(1)), int(stay.group(2))) == (int((once < 0.97).sum()), len(once))
    gate = dyn.steady_of_switching.copy()
    gate[steady.index] = steady
    line = re.search(r"(PASS|FAIL): over the steady state / max\(never, eagle3\), the misses on the mean of "
                     r"seeds 0..1: worst (\S+) \(member 0:26 at C=(\d+)\), median (\S+)", out)
    assert line, out
    assert float(line.group(2)) == pytest.approx(gate.min(), abs=5e-4) and int(line.group(3)) == gate.idxmin()
    assert float(line.group(4)) == pytest.approx(gate.median(), abs=5e-4)
    assert line.group(1) == ("PASS" if gate.min() >= 0.97 and gate.median() >= 0.99 else "FAIL")


@pytest.mark.parametrize("argv, says", [
    (["--family", "2", "--confirm", "1"], "--confirm must be 0 (off) or at least 2 seeds, got 1"),
    (["--family", "2", "--confirm", "-3"], "--confirm must be 0 (off) or at least 2 seeds, got -3"),
    (["--family", "2", "--level-scale", "0"], "--level-scale must be an integer >= 1, got 0"),
    (["--family", "2", "--range-ratio", "1.5"], "--range-ratio must be in (0, 1], got 1.5"),
])
def test_envelope_refuses_bad_family_options_in_one_line(argv, says, capsys):
    """A bad option is one line naming it, before anything is simulated (exit status 2)."""
    from benchmark_scripts import load

    with pytest.raises(SystemExit) as info:
        load("envelope").main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and says in err.strip().splitlines()[-1]


@pytest.mark.parametrize("out, confirm", [
    ("runs/f.csv", "runs/f.confirm.csv"),
    ("runs/f.parquet", "runs/f.confirm.parquet"),
    ("runs.d/f", "runs.d/f.confirm.csv"),
])
def test_confirm_rows_go_beside_out_in_its_format(out, confirm):
    """--confirm's table takes --out's format (a parquet run used to get a CSV beside it), and a
    dot in a folder's name is not taken for an extension."""
    from benchmark_scripts import load

    assert load("envelope")._confirm_path(out) == confirm


def test_steady_measure_study_prints_every_figure_and_refuses_bad_input(capsys):
    """experiments/generated-machines/steady_measure.py: every arm at every scale, three figures
    each, the best static K's whole run at the longest scale 1.000; bad input is one line."""
    from benchmark_scripts import load

    mod = load("steady_measure")
    assert mod.main(["0:77", "8", "--scales", "1,2"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(("K=", "goodput-k"))]
    assert [r[0] for r in rows] == ["K=0", "K=1", "K=3", "K=5", "K=7", "goodput-k"]
    assert all(len(r) == 7 for r in rows) and max(float(r[4]) for r in rows[:5]) == 1.0
    for bad in (["0:77", "0"], ["x", "8"], ["0:77", "8", "--scales", "0"]):
        with pytest.raises(SystemExit):
            mod.main(bad)
        assert "error:" in capsys.readouterr().err


"""The results table's latency percentiles and SLO goodput, legacy files, and open-loop arrivals
(dynspec.results, dynspec.sim.arrivals, dynspec.sim.run's rate levels)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dynspec.sim.arrivals import arrival_times
from dynspec.sim.profile import load_profile
from dynspec.results import (
    LEGACY_COLUMNS,
    PREVIOUS_COLUMNS,
    RESULT_COLUMNS,
    RequestRecord,
    ResultsWriter,
    extra_columns,
    good_requests,
    read_rows,
    read_table,
    steady_window,
    summarize,
)
from dynspec.sim.run import simulate_level


def rec(ttft_ms, e2e_ms, tokens, ok=True, start=0.0):
    return RequestRecord(start=start, end=start + e2e_ms / 1000, output_tokens=tokens, ttft=ttft_ms / 1000,
                         itls=[(e2e_ms - ttft_ms) / 1000 / max(tokens - 1, 1)] * (tokens - 1), ok=ok)


def test_percentiles_are_numpys_and_extra_ones_add_columns():
    reqs = [rec(t, t + 100, 11) for t in range(1, 101)]  # TTFT 1..100 ms, TPOT 10 ms each
    row = summarize(reqs, percentiles=(50, 99.9))
    ttfts = np.arange(1, 101, dtype=float)
    for label, p in (("median", 50), ("p90", 90), ("p95", 95), ("p99", 99), ("p99.9", 99.9)):
        assert row[f"{label}_ttft_ms"] == pytest.approx(np.percentile(ttfts, p)), label
    assert row["p90_ttft_ms"] == pytest.approx(90.1)  # interpolated, not the 90th value
    assert row["p95_tpot_ms"] == pytest.approx(10.0) and row["p99_e2e_ms"] == pytest.approx(199.01)
    assert extra_columns([50, 99.9, 75]) == [f"{p}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2e")
                                             for p in ("p75", "p99.9")]
    assert math.isnan(row["request_goodput"]) and math.isnan(row["slo_attainment"])  # no SLO given


def test_goodput_counts_requests_meeting_every_slo_as_vllm():
    reqs = [
        rec(50, 150, 11, start=0.0),     # TTFT 50, TPOT 10: good under both
        rec(150, 250, 11, start=0.0),    # TTFT too slow
        rec(50, 450, 11, start=0.0),     # TPOT 40: too slow
        rec(80, 80, 1, start=0.0),       # one token: TPOT counts as 0 -> good
        rec(10, 100, 11, ok=False),      # failed: never good, but counted in the attainment
    ]
    slo = {"ttft": 100.0, "tpot": 20.0}
    assert good_requests(reqs, slo) == 2
    row = summarize(reqs, slo=slo)
    duration = max(r.end for r in reqs if r.ok)  # every request started at 0
    assert row["request_goodput"] == pytest.approx(2 / duration)
    assert row["slo_attainment"] == pytest.approx(2 / 5)
    assert good_requests(reqs, {"e2e": 200.0}) == 2  # e2e 150 and 80
    assert summarize([rec(10, 100, 5, ok=False)], slo=slo)["request_goodput"] == 0.0


def test_legacy_results_file_reads_and_is_upgraded_in_place(tmp_path):
    path = tmp_path / "results.csv"
    old = dict(zip(LEGACY_COLUMNS, ["r", "baseline", "none", "sim", "p", "8", "0", "10", "0", "2.0", "100", "200",
                                    "100.0", "5.0"] + ["1.5"] * 12 + ["nan", "nan", "nan", ""]))
    path.write_text(",".join(LEGACY_COLUMNS) + "\n" + ",".join(old[c] for c in LEGACY_COLUMNS) + "\n")
    (row,), torn = read_rows(path)
    assert not torn and row["request_rate"] == "inf" and row["p90_ttft_ms"] == "nan"
    df = read_table(path)
    assert list(df.columns) == RESULT_COLUMNS and math.isinf(df["request_rate"][0])
    assert df["median_ttft_ms"][0] == 1.5 and math.isnan(df["p95_e2e_ms"][0])
    w = ResultsWriter(path, RESULT_COLUMNS + extra_columns([99.9]))  # a resumed run with another schema
    assert path.read_text().splitlines()[0].split(",") == w.columns
    (again,), _ = read_rows(path)
    assert again["output_throughput"] == "100.0" and again["p99.9_ttft_ms"] == "nan"


def _tokens_at(start: float, first: float, n: int, gap: float = 1.0, first_chunk: int = 1) -> RequestRecord:
    """A request sent at `start` whose first chunk (of `first_chunk` tokens) arrives at `first`,
    then a token every `gap` seconds."""
    return RequestRecord(start=start, end=first + (n - first_chunk) * gap, output_tokens=n, ttft=first - start,
                         itls=[gap] * (n - first_chunk))


def test_the_steady_window_runs_from_the_first_waves_last_first_token_to_the_last_dispatch():
    # Two clients: A (tokens at 1..10) and B (2..6) go first; C is sent when B ends (tokens 7..10),
    # D when A ends, decoding alone for 20 s: the drain a whole-level figure is dragged down by.
    reqs = [_tokens_at(0, 1, 10), _tokens_at(0, 2, 5), _tokens_at(6, 7, 4), _tokens_at(10, 11, 20)]
    tput, seconds = steady_window(reqs, 2)
    assert seconds == pytest.approx(8.0)  # (2, 10]
    assert tput == pytest.approx((8 + 4 + 4) / 8)  # A's 3..10, B's 3..6, C's 7..10
    row = summarize(reqs, concurrency=2)
    assert row["steady_output_throughput"] == pytest.approx(2.0) and row["steady_s"] == pytest.approx(8.0)
    assert row["output_throughput"] == pytest.approx(39 / 30)
    assert steady_window(list(reversed(reqs)), 2) == (tput, seconds)  # the order of completion does not matter
    # a first chunk of 3 tokens: all three arrive with it
    chunked = [_tokens_at(0, 1, 10), _tokens_at(0, 2, 5, first_chunk=3), _tokens_at(6, 7, 4), _tokens_at(10, 11, 20)]
    assert steady_window(chunked, 2)[0] == pytest.approx((8 + 2 + 4) / 8)  # B: 3 tokens at 2, then 3, 4
    # no window: a single wave, a failed request, an open loop
    assert all(map(math.isnan, steady_window(reqs[:2], 2)))
    failed = reqs[:3] + [RequestRecord(start=10, end=10.5, ok=False, error="500")]
    assert all(map(math.isnan, steady_window(failed, 2)))
    assert math.isnan(summarize(reqs)["steady_output_throughput"])


def test_the_simulated_closed_loop_has_a_steady_window_at_the_full_batchs_rate():
    prof = load_profile("seed-blackwell")
    metrics, records = simulate_level(prof, "baseline", 8, num_prompts=64, output_len=128)
    assert metrics["steady_s"] > 0
    # all 8 in flight, no drain: faster than the whole level, slower than 8 tokens a plain step
    assert metrics["output_throughput"] < metrics["steady_output_throughput"]
    assert metrics["steady_output_throughput"] <= 8 / prof.plain_time(8) * 1.0001


def test_a_results_file_without_the_steady_window_reads_and_is_upgraded_in_place(tmp_path):
    path = tmp_path / "results.csv"
    row = {c: "nan" for c in PREVIOUS_COLUMNS}
    row.update(run_id="r", arm="baseline", policy="none", backend="live", profile="", concurrency="8",
               request_rate="inf", repeat="0", completed="10", failed="0", output_throughput="100.0", error="")
    path.write_text(",".join(PREVIOUS_COLUMNS) + "\n" + ",".join(row[c] for c in PREVIOUS_COLUMNS) + "\n")
    df = read_table(path)
    assert list(df.columns) == RESULT_COLUMNS and math.isnan(df["steady_output_throughput"][0])
    ResultsWriter(path)  # a resumed run
    assert path.read_text().splitlines()[0].split(",") == RESULT_COLUMNS
    (again,), _ = read_rows(path)
    assert again["output_throughput"] == "100.0" and again["steady_s"] == "nan"


def test_arrivals_have_the_rate_and_the_burstiness_asked_for():
    for b, cv in ((1.0, 1.0), (0.25, 2.0), (4.0, 0.5)):  # gamma: CV of the gaps = 1/sqrt(shape)
        t = arrival_times(20001, rate=4.0, burstiness=b, seed=3)
        gaps = np.diff(t)
        assert t[0] == 0.0 and np.all(gaps >= 0)
        assert gaps.mean() == pytest.approx(0.25, rel=0.03), b
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05), b
    assert arrival_times(5, 2.0, seed=1) == arrival_times(5, 2.0, seed=1) != arrival_times(5, 2.0, seed=2)
    assert arrival_times(3, math.inf) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="burstiness"):
        arrival_times(3, 1.0, burstiness=0)


def test_sim_rate_levels_queue_above_capacity_and_respect_the_cap():
    prof = load_profile("seed-blackwell")
    kw = dict(num_prompts=60, input_len=256, output_len=32, seed=0)
    low, _ = simulate_level(prof, "baseline", 0, request_rate=0.5, **kw)
    closed1, _ = simulate_level(prof, "baseline", 1, **kw)
    # Far below capacity: requests rarely overlap, so the offered rate is what gets served and
    # a request's TTFT is about the closed-loop C=1 one (its prefill).
    assert low["request_throughput"] == pytest.approx(0.5, rel=0.35)
    assert low["median_ttft_ms"] == pytest.approx(closed1["median_ttft_ms"], rel=0.2)
    flood, _ = simulate_level(prof, "baseline", 0, request_rate=1000.0, **kw)  # all at once: a queue forms
    assert flood["p99_ttft_ms"] > 10 * low["p99_ttft_ms"]
    capped, _ = simulate_level(prof, "baseline", 1, request_rate=1000.0, **kw)  # at most one in flight
    assert capped["output_throughput"] == pytest.approx(closed1["output_throughput"], rel=0.02)
    assert capped["median_ttft_ms"] == pytest.approx(closed1["median_ttft_ms"], rel=0.05)  # clock starts when sent

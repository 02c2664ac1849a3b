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
    RESULT_COLUMNS,
    RequestRecord,
    ResultsWriter,
    extra_columns,
    good_requests,
    read_rows,
    read_table,
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

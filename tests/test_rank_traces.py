"""dynspec.analysis.rank_traces: TP ranks' step traces compared row by row (the real-server use
is tests/test_real_sglang_tp.py; here the traces come from Controllers in threads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynspec.analysis import rank_traces
from dynspec.analysis.rank_traces import TraceError, compare
from dynspec.policy import build_policy
from dynspec.sglang.hook import Controller
from dynspec.sglang.step_trace import StepTrace
from tp_ranks import FakeAllReduce, run_ranks

STREAM = [(4, [1, 1, 1, 1])] * 40 + [(80, [0] * 80)] * 90 + [(3, [2, 2, 2])] * 30


def traced_ranks(path: Path, local: bool = False) -> list[Controller]:
    """Two ranks serving STREAM with sglang's tiers; `local`: rank 1 decides from batch + 40
    (a rank-local input), as a broken policy would."""
    reduce = FakeAllReduce(2)
    ctls = [Controller(build_policy("sglang-default-tiers"), spec="tiers", tp_rank=r, tp_size=2,
                       sync=reduce.hook(r)) for r in range(2)]
    for r, c in enumerate(ctls):
        c.trace = StepTrace(str(path), r)

    def rank(r):
        ctl = ctls[r]
        for i, (bs, acc) in enumerate(STREAM):
            if i % 50 == 0:
                ctl.note_other_forward()
                ctl.note_prefill(2, 30)
            spec = ctl.decide(bs + (40 * r if local else 0))
            ctl.observe(bs, spec, acc if spec else ())
        ctl.trace.flush()

    run_ranks(rank, 2)
    return ctls


def test_ranks_that_decide_alike_write_the_same_trace(tmp_path):
    ctls = traced_ranks(tmp_path / "t.csv")
    c = compare(tmp_path / "t.csv")
    assert c.agree and c.complete and c.ranks == 2
    assert c.decisions == len(STREAM) and 0 < c.plain < c.decisions == ctls[0].step
    assert c.plain == ctls[0].steps_plain
    assert "identical over" in c.line()
    assert rank_traces.main([str(tmp_path / "t.csv"), "--require-complete"]) == 0


def test_a_rank_local_decision_is_found_at_its_row(tmp_path, capsys):
    traced_ranks(tmp_path / "t.csv", local=True)
    c = compare(tmp_path / "t.csv")
    assert not c.agree
    # The prefill rows (f, F) agree; the first decision is where rank 1 read its own batch size.
    assert c.mismatch == 2 and c.compared == 2 and c.decisions == 0
    assert c.rows_at_mismatch == (("s", 4, 0), ("s", 44, 0))
    assert "DIFFER at row 3 (rank 0: ('s', 4, 0); rank 1: ('s', 44, 0))" in c.line()
    assert rank_traces.main([str(tmp_path)]) == 1
    assert "DIFFER at row" in capsys.readouterr().out


def test_traces_cut_at_different_rows_compare_their_common_rows(tmp_path):
    traced_ranks(tmp_path / "t.csv")
    r1 = tmp_path / "t.csv.rank1"
    r1.write_text("".join(r1.read_text().splitlines(keepends=True)[:-25]))
    c = compare(tmp_path / "t.csv")
    assert c.agree and not c.complete and c.compared == c.lines[1]
    assert rank_traces.main([str(tmp_path / "t.csv")]) == 0
    assert rank_traces.main([str(tmp_path / "t.csv"), "--require-complete"]) == 1


def test_bad_traces_are_one_line_errors(tmp_path, capsys):
    solo = tmp_path / "solo.csv"
    solo.write_text(StepTrace.HEADER)
    with pytest.raises(TraceError, match="no solo.csv.rank1"):
        compare(solo)
    (tmp_path / "x.csv").write_text("not,a,trace\n")
    (tmp_path / "x.csv.rank1").write_text(StepTrace.HEADER)
    with pytest.raises(TraceError, match="not a step trace"):
        compare(tmp_path / "x.csv")
    (tmp_path / "x.csv").write_text(StepTrace.HEADER + "1.0,s,4\n")
    with pytest.raises(TraceError, match=r"x.csv:2: not a trace line"):
        compare(tmp_path / "x.csv")
    assert rank_traces.main([str(tmp_path / "x.csv")]) == 1
    assert rank_traces.main([str(tmp_path / "empty")]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and all(x.startswith("rank_traces: ") for x in out), out


def test_agreements_are_counted_and_timed_per_rank(tmp_path):
    ctls = traced_ranks(tmp_path / "t.csv")
    stats = [c.stats() for c in ctls]
    assert stats[0]["tp_agreements"] == stats[1]["tp_agreements"] == len(STREAM) // 64
    assert all(s["tp_agreement_ms"] > 0 for s in stats)

"""experiments/generated-machines/trace_level.py: a member-level's decisions stretch by stretch (simulated)."""

from __future__ import annotations

import pytest
from benchmark_scripts import load

from dynspec.analysis.family import level_requests, member
from dynspec.sim.run import simulate_level


def test_the_trace_accounts_for_every_step_and_does_not_change_the_level():
    tl = load("trace_level")
    m, c = member(0, 72), 31
    engines = []
    plain_run = simulate_level(m.profile(), "policy:goodput", c, engine_out=engines, **level_requests(m, c))[0]
    t = tl.trace("0:72", c, segments=7)
    st = engines[0].stats
    # watching through on_step changes nothing: the same throughput as the envelope's level
    assert t["tps"]["goodput"] == plain_run["output_throughput"]
    rows = t["stretches"]
    assert len(rows) == 7
    assert sum(r["steps"] for r in rows) == st.steps_plain + st.steps_spec
    assert sum(round(r["speculative"] * r["steps"]) for r in rows) == st.steps_spec
    assert sum(r["forwards"] for r in rows) == st.steps_prefill
    assert sum(r["switches"] for r in rows) == st.switches
    # a fixed-length closed loop starts in lockstep: the first wave's prompts in full forwards
    assert rows[0]["lockstep"] is True and rows[0]["prompts_per_forward"] > 10
    assert t["bucket"] == "24+" and t["estimates"][t["bucket"]]["plain_ms"] > 0


@pytest.mark.parametrize("argv, says", [
    (["0-72", "31"], "member must be S:I"),
    (["0:72", "0"], "at least 1"),
    (["0:72", "31", "--range-ratio", "1.5"], "--range-ratio"),
    (["0:72", "31", "--spec", "goodput:lead=2"], "goodput"),
])
def test_bad_arguments_are_one_line_errors(argv, says, capsys):
    tl = load("trace_level")
    with pytest.raises(SystemExit) as exc:
        tl.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert says in err and "Traceback" not in err

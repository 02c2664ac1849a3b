"""dynspec.analysis.cost_ratio: the ratio a plain and an EAGLE-3 arm imply beside the one goodput
acted on, and a step trace split into steady steps and the rest."""

from __future__ import annotations

import gzip
import json

import pytest

from dynspec.analysis import cost_ratio


def _run(tmp_path):
    run = tmp_path / "run"
    (run / "scrapes").mkdir(parents=True)
    rows = ["arm,concurrency,repeat,output_throughput,accept_length,error",
            "baseline,8,0,600,,", "eagle3,8,0,400,2.0,", "dynspec-goodput,8,0,590,1.9,",
            "baseline,64,0,2000,,", "eagle3,64,0,1000,1.5,", "dynspec-goodput,64,0,1900,1.2,boom"]
    (run / "results.csv").write_text("\n".join(rows) + "\n")
    info = {"after": {"server_info": {"internal_states": [{"dynspec": {
        "policy": "goodput", "estimates": {"8+": {"cost_ratio": 3.3}, "64+": {"cost_ratio": 2.0}}}}]}}}
    with gzip.open(run / "scrapes" / "dynspec-goodput_c8_r0.json.gz", "wt") as f:
        json.dump(info, f)
    return run


def test_implied_and_acted_on_ratios(tmp_path, capsys):
    rows = cost_ratio.ratios(_run(tmp_path))
    assert [r["concurrency"] for r in rows] == [8, 64]
    assert rows[0]["implied"] == pytest.approx(2.0 * 600 / 400)
    assert rows[0]["acted_on"] == 3.3 and rows[0]["acted_over_implied"] == pytest.approx(1.1)
    assert rows[1]["implied"] == pytest.approx(3.0) and rows[1]["acted_on"] is None  # no scrape
    assert cost_ratio.main([str(tmp_path / "run")]) == 0
    assert "acted_over_implied" in capsys.readouterr().out


def test_a_trace_splits_into_steady_steps_and_the_rest(tmp_path):
    lines = ["t,kind,batch,count"]
    t = 100.0
    for i in range(40):  # plain steps of 10 ms, a 30 ms prefill after every tenth
        lines.append(f"{t:.6f},p,8,0")
        t += 0.010
        lines.append(f"{t:.6f},P,8,0")
        if i % 10 == 9:
            t += 0.030
            lines.append(f"{t:.6f},F,1,128")
    path = tmp_path / "trace.csv"
    path.write_text("\n".join(lines) + "\n")
    (seg,) = cost_ratio.trace_split(path)
    assert (seg["steps_plain"], seg["steps_spec"], seg["prefills"]) == (40, 0, 4)
    assert seg["steady_plain_ms"] == pytest.approx(10.0)
    assert seg["wall_ms_per_step"] > 12.0  # the prefills: what steady steps leave out


def test_bad_input_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        cost_ratio.main([str(tmp_path)])
    assert e.value.code == 2

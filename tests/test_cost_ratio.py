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


def test_the_ratio_at_one_point_moves_the_spec_time_along_its_plane():
    """Speculation off for long leaves its time where it was last measured (4,000 fewer KV tokens
    here): moved to the plain time's point, 2 us a KV token, the spec step costs 8 ms more.  A scrape
    without prefill_ms gives the same figure from the share backed out of the ratio."""
    est = {"plain_ms": 10.0, "spec_ms": 20.0, "accepted": 0.5, "prefill_ms": 1.0, "cost_ratio": 21.5 / 11.0,
           "kv_tokens": [5000, 1000], "batch": [64.0, 64.0], "us_per_kv_token": [0.5, 2.0], "ms_per_request": [0.0, 0.0]}
    assert cost_ratio.at_plain_point(est) == pytest.approx((28.0 + 1.5) / 11.0)
    older = {k: v for k, v in est.items() if k != "prefill_ms"}
    assert cost_ratio.at_plain_point(older) == pytest.approx((28.0 + 1.5) / 11.0)
    # where the ratio cannot tell the share (r = 1 + accepted), the move is read at its largest
    blind = {**older, "accepted": 21.5 / 11.0 - 1.0}
    assert cost_ratio.at_plain_point(blind) == pytest.approx(21.5 / 11.0 + 8.0 / 10.0)
    # the move is bounded as the policy bounds it: half the spec time
    assert cost_ratio.at_plain_point({**est, "us_per_kv_token": [0.5, 10.0]}) == pytest.approx((30.0 + 1.5) / 11.0)
    # a bucket with no point (no KV tokens reported) is read as reported
    assert cost_ratio.at_plain_point({**est, "kv_tokens": [None, None]}) == pytest.approx(21.5 / 11.0)
    assert cost_ratio.at_plain_point({"cost_ratio": 2.0}) is None


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


def test_a_traces_prefills_split_by_mode_and_by_an_idle_launch(tmp_path):
    """A prefill launched on an idle server is timed from its launch (a whole forward); one
    launched while decoding from the previous result (what it added), as the Controller times them."""
    lines, t = ["t,kind,batch,count"], 100.0
    for i in range(20):  # spec steps of 10 ms; every fifth, a busy 1-prompt prefill adding 4 ms
        lines.append(f"{t:.6f},s,2,0")
        t += 0.010
        if i % 5 == 4:
            lines.append(f"{t - 0.001:.6f},f,0,0")  # launched before the step's result is read
        lines.append(f"{t:.6f},S,2,2")
        if i % 5 == 4:
            t += 0.004
            lines.append(f"{t:.6f},F,1,100")
    t += 0.3  # the server goes idle; a prompt is launched and takes 30 ms
    lines.append(f"{t:.6f},f,0,0")
    t += 0.030
    lines.append(f"{t:.6f},F,1,100")
    for _ in range(5):
        lines.append(f"{t:.6f},s,1,0")
        t += 0.010
        lines.append(f"{t:.6f},S,1,1")
    path = tmp_path / "trace.csv"
    path.write_text("\n".join(lines) + "\n")
    (seg,) = cost_ratio.prefill_split(path)
    assert seg["busy_spec_prompts"] == 4 and seg["idle_spec_prompts"] == 1
    assert seg["busy_spec_ms"] == pytest.approx(4.0, abs=1.1) and seg["idle_spec_ms"] == pytest.approx(30.0)
    assert seg["busy_plain_ms"] is None
    assert cost_ratio.main(["--trace", str(path), "--prefills"]) == 0

"""dynspec.analysis.replay: a step trace read back through goodput's estimates."""

from __future__ import annotations

import gzip

import pytest

from dynspec.analysis.replay import main, read_levels, replay, tenths


def write_trace(path, spec_ms: float, plain_ms: float = 7.3, batch: int = 32, levels: int = 2) -> None:
    """Levels of a closed loop at `batch`, alternating stretches of each mode (as a goodput server
    probes), a request finishing every tenth step and refilled one step later; spec steps accept
    1.2 drafts a request."""
    t, lines = 100.0, ["t,kind,batch,count"]
    for _ in range(levels):
        lines.append(f"{t:.6f},F,{batch},{batch * 128}")
        for i in range(400):
            spec = (i // 40) % 2 == 1
            bs = batch - 1 if i % 10 == 9 else batch
            lines.append(f"{t:.6f},{'s' if spec else 'p'},{bs},0")
            t += (spec_ms if spec else plain_ms) / 1000
            lines.append(f"{t:.6f},{'S' if spec else 'P'},{bs},{round(1.2 * bs) if spec else 0}")
            if bs < batch:
                lines.append(f"{t:.6f},f,0,0")
                t += 0.008
                lines.append(f"{t:.6f},F,1,128")
        t += 5.0  # idle between levels
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")


@pytest.mark.parametrize("spec_ms, wins", [(13.0, True), (18.0, False)])
def test_the_gain_read_back_follows_the_step_costs(tmp_path, spec_ms, wins):
    # 2.2 tokens a request for 13 ms against 7.3 ms for one: speculation wins by about 20%;
    # for 18 ms it loses by about 10%.
    path = tmp_path / "goodput.csv.gz"
    write_trace(path, spec_ms)
    rows = replay(read_levels(path))
    assert [r["peak_batch"] for r in rows] == [32, 32]
    assert rows[1]["spec_share"] == pytest.approx(0.5, abs=0.01)
    gain = rows[1]["gain"]
    assert (gain > 1.1) if wins else (gain < 0.95), gain
    assert rows[1]["overhead_ms_per_request"] > 5.0  # the 8 ms refill forwards
    least, median = rows[1]["probe_interval"]  # steps to the next probe of the other mode
    assert 1 <= least <= median <= 2000


def test_the_probe_interval_read_back_grows_as_the_loser_is_sampled(tmp_path):
    # Speculation loses by half (2.2 tokens for 32 ms against 7.3 ms for one): once the level's
    # stretches of it are behind the estimate, probes of it come rarely.
    path = tmp_path / "goodput.csv.gz"
    write_trace(path, 32.0, levels=3)
    rows = replay(read_levels(path))
    assert rows[2]["gain"] < 0.6
    assert rows[2]["probe_interval"][1] > rows[0]["probe_interval"][0]
    assert rows[2]["probe_interval"][1] >= 100


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "missing.csv")]) == 2
    path = tmp_path / "goodput.csv.gz"
    write_trace(path, 13.0, levels=1)
    assert main([str(path), "--spec", "never"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "replay reads goodput's estimates" in err[1]
    assert main([str(path)]) == 0
    other = tmp_path / "results.csv"
    other.write_text("arm,concurrency\nbaseline,8\n")
    assert main([str(other)]) == 2
    assert "not a step trace" in capsys.readouterr().err


def test_a_level_followed_tenth_by_tenth_from_a_fresh_policy(tmp_path, capsys):
    path = tmp_path / "goodput.csv.gz"
    write_trace(path, 13.0)
    rows = tenths(read_levels(path)[1])
    assert [r["tenth"] for r in rows] == list(range(1, 11)) and {r["peak_batch"] for r in rows} == {32}
    assert rows[0]["spec_ms"] is None and rows[0]["gain"] is None  # the first 40 steps ran plain
    last = rows[-1]
    assert last["plain_ms"] == pytest.approx(7.3, rel=0.15) and last["spec_ms"] == pytest.approx(13.0, rel=0.15)
    assert last["gain"] > 1.1  # as the whole level's replay says
    assert main([str(path), "--level", "1", "--tenths"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("tenth\tpeak batch")
    assert main([str(path), "--level", "1"]) == 0  # a fresh policy from level 1: one row
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert main([str(path), "--level", "2"]) == 2
    assert "the trace has levels 0..1" in capsys.readouterr().err

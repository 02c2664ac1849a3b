"""dynspec.io.journal and the family run that uses it (experiments/generated-machines/envelope.py --family --out):
a crash keeps every member already simulated, and the same command resumes from there."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dynspec.io.journal import Journal, JournalError, code_digest


def test_a_journal_hands_back_what_it_holds_and_drops_a_torn_last_line(tmp_path):
    path = tmp_path / "run.journal.jsonl"
    j = Journal(path, {"seed": 0, "levels": (1, 2)})
    j.add("member:0", [{"member": 0, "x": 0.5}])
    j.add("member:1", [{"member": 1, "x": 1.5}])
    with open(path, "a") as f:
        f.write('{"key": "member:2", "rows": [{"mem')  # a crash mid-append
    again = Journal(path, {"seed": 0, "levels": [1, 2]})  # a tuple reads back as a list: the same config
    assert again.done == {"member:0": [{"member": 0, "x": 0.5}], "member:1": [{"member": 1, "x": 1.5}]}
    assert path.read_text().endswith("}]}\n")  # the torn line is gone, the whole ones stay
    again.add("member:2", [{"member": 2, "x": 2.5}])
    assert Journal(path, {"seed": 0, "levels": [1, 2]}).done["member:2"] == [{"member": 2, "x": 2.5}]


def test_a_journal_of_another_run_is_refused_and_left_as_it_is(tmp_path):
    path = tmp_path / "run.journal.jsonl"
    Journal(path, {"seed": 0, "code": "a"}).add("member:0", [{"x": 1}])
    before = path.read_bytes()
    with pytest.raises(JournalError, match=r"made by another run \(differs in code, seed\)"):
        Journal(path, {"seed": 1, "code": "b"})
    assert path.read_bytes() == before
    path.write_text("not json\n")
    with pytest.raises(JournalError, match="not JSON"):
        Journal(path, {"seed": 0})
    path.write_text('{"config": 7}\n')
    with pytest.raises(JournalError, match="not a dynspec journal"):
        Journal(path, {"seed": 0})
    path.write_text('{"config": {"seed": 0}}\n[1, 2]\n')
    with pytest.raises(JournalError, match=r":2: not a journal entry"):
        Journal(path, {"seed": 0})


def test_the_code_digest_follows_the_sources(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    first = code_digest(tmp_path)
    assert code_digest(tmp_path) == first
    (tmp_path / "a.py").write_text("x = 2\n")
    assert code_digest(tmp_path) != first
    assert len(code_digest()) == 64  # the installed package's own


def test_a_family_run_resumes_from_its_journal_and_simulates_only_what_is_missing(tmp_path, monkeypatch, capsys):
    """Two members; the run is cut after the first (its journal line kept, a torn second one
    planted), then run again: only member 1 is simulated, and the table equals an uncut run's."""
    from benchmark_scripts import load

    import dynspec.analysis.family as fam

    out = tmp_path / "fam.csv"
    calls = []
    real = fam.run_member

    def counted(m, *a, **kw):
        calls.append(m.index)
        return real(m, *a, levels=(1, 4), **kw)

    monkeypatch.setattr(fam, "run_member", counted)
    argv = ["--family", "2", "--seed", "3", "--out", str(out)]
    assert load("envelope").main(argv) in (0, 1)
    whole = pd.read_csv(out)
    assert calls == [0, 1] and set(whole.member) == {0, 1}
    prov = json.loads((tmp_path / "fam.csv.provenance.json").read_text())
    assert prov["config"]["family_seed"] == 3 and prov["config"]["members"] == [0, 1]

    journal = tmp_path / "fam.csv.journal.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    keep = [ln for ln in lines if '"member:1"' not in ln]
    journal.write_text("".join(keep) + '{"key": "member:1", "rows": [')  # cut during member 1
    out.unlink()
    calls.clear()
    assert load("envelope").main(argv) in (0, 1)
    assert calls == [1], calls
    assert "1 of 2 members already simulated" in capsys.readouterr().out
    pd.testing.assert_frame_equal(pd.read_csv(out), whole)

    calls.clear()  # other options: refused in one line, nothing simulated, the journal untouched
    before = journal.read_bytes()
    assert load("envelope").main([*argv, "--range-ratio", "0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert calls == [] and journal.read_bytes() == before
    assert len(err) == 1 and "made by another run (differs in range_ratio)" in err[0]


def test_a_table_is_written_whole_as_csv_or_parquet(tmp_path):
    """dynspec.io.atomic.write_frame (envelope.py's --out, results.write_table): the table reads
    back as written, and no temporary file is left beside it."""
    import pandas as pd

    from dynspec.io.atomic import write_frame

    df = pd.DataFrame({"member": [0, 1], "arm": ["dynamic", "eagle3"], "of_switching": [0.97, 1.0]})
    for name, read in (("f.parquet", pd.read_parquet), ("f.csv", pd.read_csv)):
        out = write_frame(tmp_path / name, df)
        pd.testing.assert_frame_equal(read(out), df)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.csv", "f.parquet"]

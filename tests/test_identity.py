"""dynspec.live.identity: greedy outputs of a live run's arms compared prompt by prompt."""

from __future__ import annotations

import math

import pytest

from dynspec.live import identity
from dynspec.live.bench import output_digest, write_requests
from dynspec.live.config import Level, level_name
from dynspec.results import RequestRecord, ResultsWriter


def make_run(tmp_path, outputs: dict[tuple[str, int], list], repeat: int = 0):
    """A run folder: results rows and per-request records; outputs[(arm, C)] lists each prompt's
    token ids, or None for a failed request, or "" for a request without a digest."""
    w = ResultsWriter(tmp_path / "results.csv")
    for (arm, c), outs in outputs.items():
        w.append({"run_id": "t", "arm": arm, "policy": "none", "backend": "live", "profile": "",
                  "concurrency": c, "request_rate": math.inf, "repeat": repeat})
        recs = [RequestRecord(start=i, end=i + 1, output_tokens=3, ok=o is not None,
                              output_digest=output_digest(o) if o else "") for i, o in enumerate(outs)]
        write_requests(tmp_path / "requests" / f"{level_name(arm, Level(c), repeat)}.jsonl", recs)
    return tmp_path


def test_counts_the_prompts_whose_tokens_differ_from_the_reference(tmp_path):
    ref = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    run = make_run(tmp_path, {
        ("baseline", 4): ref,
        ("patched", 4): [[1, 2, 3], [4, 5, 6], [7, 8, 9]],
        ("broken", 4): [[1, 2, 3], [4, 5, 7], None],  # one differs, one failed: not compared
        ("eagle3", 4): [[1, 2, 3], "", [7, 8, 0]],  # one without a digest: not compared
    })
    t = identity.output_mismatches(run).set_index("arm")
    assert t.loc["patched", "compared"] == 3 and t.loc["patched", "differ"] == 0
    assert t.loc["broken", "compared"] == 2 and t.loc["broken", "differ"] == 1
    assert t.loc["eagle3", "compared"] == 2 and t.loc["eagle3", "differ"] == 1
    assert set(t["reference"]) == {"baseline"}
    assert identity.main([str(run)]) == 1
    # Against another reference the roles turn: the baseline now differs from "broken".
    t2 = identity.output_mismatches(run, reference="broken").set_index("arm")
    assert t2.loc["baseline", "differ"] == 1 and "broken" not in t2.index


def test_levels_are_compared_level_by_level(tmp_path):
    run = make_run(tmp_path, {("baseline", 1): [[1]], ("patched", 1): [[1]],
                              ("baseline", 4): [[2], [3]], ("patched", 4): [[2], [3]]})
    t = identity.output_mismatches(run)
    assert sorted(t["concurrency"]) == [1, 4] and t["differ"].sum() == 0 and t["compared"].sum() == 3
    assert identity.main([str(run)]) == 0


def test_nothing_to_compare_and_bad_folders_are_one_line_errors(tmp_path, capsys):
    run = make_run(tmp_path / "a", {("baseline", 1): [""], ("patched", 1): [""]})
    assert identity.main([str(run)]) == 2
    assert "no request carries an output digest" in capsys.readouterr().err
    assert identity.main([str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert "results.csv: no such file" in err and "\n" not in err
    with pytest.raises(identity.IdentityError, match="no arm 'x'"):
        identity.output_mismatches(run, reference="x")


def test_the_report_says_which_arms_differ_or_that_none_does(tmp_path):
    from dynspec.analysis import report
    from dynspec.results import read_table

    def section(run):
        return report.identity_section(report.Run(run_dir=run, run_id="t", results=read_table(run / "results.csv")))

    run = make_run(tmp_path / "a", {("baseline", 4): [[1], [2]], ("patched", 4): [[1], [2]], ("broken", 4): [[1], [3]]})
    text, table = section(run)
    assert "broken (1 of 2)" in text.data and "patched" not in text.data
    assert list(table["arm"]) == ["patched", "broken"] and list(table["differ"]) == [0, 1]
    run = make_run(tmp_path / "b", {("baseline", 4): [[1], [2]], ("patched", 4): [[1], [2]]})
    assert "same tokens as baseline's (2 requests)" in section(run)[0].data
    (only,) = section(make_run(tmp_path / "c", {("baseline", 1): [""], ("patched", 1): [""]}))
    assert "No request of this run carries a digest" in only.data

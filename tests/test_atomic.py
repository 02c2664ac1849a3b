"""Small files are replaced whole or not at all."""

from __future__ import annotations

import json

import pytest

from dynspec.io.atomic import write_json, write_text


def test_write_creates_folders_and_replaces_whole(tmp_path):
    path = tmp_path / "a" / "b" / "f.txt"
    write_text(path, "one\n")
    write_text(path, "two\n")
    assert path.read_text() == "two\n" and sorted(x.name for x in path.parent.iterdir()) == ["f.txt"]
    write_json(tmp_path / "d.json", {"p": tmp_path})  # what json cannot encode goes in as str
    assert json.loads((tmp_path / "d.json").read_text()) == {"p": str(tmp_path)}


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "f.txt"
    write_text(path, "old\n")
    from dynspec.io.atomic import write_bytes

    with pytest.raises(TypeError):
        write_bytes(path, 42)  # not bytes: fails inside the write, after the temp file exists
    assert path.read_text() == "old\n" and sorted(x.name for x in tmp_path.iterdir()) == ["f.txt"]


def test_a_planted_temp_name_or_link_is_never_written_through(tmp_path):
    from dynspec.io.atomic import open_append

    outside = tmp_path / "outside.txt"
    outside.write_text("keep\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml.tmp").symlink_to(outside)  # the name the old writer used for its temp file
    (run / "run.json.tmp").symlink_to(outside)
    write_text(run / "config.yaml", "a: 1\n")
    write_json(run / "run.json", {"a": 1})
    assert outside.read_text() == "keep\n" and (run / "config.yaml").read_text() == "a: 1\n"
    # results tables too (results.write_table once used PATH.tmp, unsynced)
    from dynspec.results import make_row, read_table, write_table

    (run / "results.csv.tmp").symlink_to(outside)
    write_table([make_row({"arm": "baseline", "concurrency": 4}, {"output_throughput": 10.0})], run / "results.csv")
    assert outside.read_text() == "keep\n" and read_table(run / "results.csv").output_throughput.tolist() == [10.0]
    (run / "sweep.log").symlink_to(outside)
    with pytest.raises(OSError):
        open_append(run / "sweep.log")
    assert outside.read_text() == "keep\n"

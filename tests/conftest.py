"""Fixtures shared across test modules."""

from __future__ import annotations

import pytest

from pipeline_fixture import Published, publish


@pytest.fixture(scope="session")
def pub(tmp_path_factory) -> Published:
    """One end-to-end pipeline run per session, shared by the tests that read what
    it published: test_pipeline, test_report_browser, test_provenance."""
    p = publish(tmp_path_factory.mktemp("pipeline"))
    assert p.proc.returncode == 0, p.proc.stdout + p.proc.stderr
    return p

"""A report is built in reports/.RUN_ID.building and published by renames: the published one set
aside to reports/.RUN_ID.old, the new one into its place, the old one removed.  A publish cut between
the renames is undone on the next start (_recover)."""

from __future__ import annotations

import shutil

from dynspec.analysis.pipeline_settings import PipelineConfig, save_provenance, save_settings


def _recover(pc: PipelineConfig) -> None:
    """Undo what an interrupted publish left: the old report back if the new one never arrived."""
    if pc.old_dir.is_dir():
        if pc.report_dir.exists():
            shutil.rmtree(pc.old_dir)
        else:
            pc.old_dir.rename(pc.report_dir)


def _prepare_dirs(pc: PipelineConfig, command: str, argv: list[str] | None) -> None:
    _recover(pc)
    if pc.overwrite and pc.run_dir.exists():
        shutil.rmtree(pc.run_dir)
    if pc.build_dir.exists():  # an earlier attempt's notebooks would pass for this one's
        shutil.rmtree(pc.build_dir)
    pc.build_dir.mkdir(parents=True)
    save_settings(pc)
    save_provenance(pc, command, argv)


def _publish(pc: PipelineConfig) -> None:
    """The built report into place: the published one aside, the new one in, the old one gone."""
    if pc.report_dir.exists():
        pc.report_dir.rename(pc.old_dir)
    pc.build_dir.rename(pc.report_dir)
    _recover(pc)

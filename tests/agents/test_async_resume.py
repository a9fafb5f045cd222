"""Crash and resume of multi-turn trajectories under fully_async: a ``quickstart_tools`` run (the
native engine, the calc tool, partial rollouts across weight pushes) is killed with SIGKILL while
trajectories are in flight after a checkpoint; the resumed run neither loses nor repeats a
trajectory's prompt (:func:`rlzoo.testing.runs.kill_9_then_resume`: the prompts trained before the
checkpoint, those trained after the resume and those still outstanding at the end are disjoint and
together exactly the loader's order so far)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlzoo.testing.runs import kill_9_then_resume


@pytest.mark.timeout(300)
def test_kill_9_mid_trajectories_then_resume_loses_and_repeats_nothing(tmp_path: Path) -> None:
    recs = kill_9_then_resume("quickstart_tools", tmp_path, [], batch=8, wait_s=240)
    assert any(r["agent/tool_calls/mean"] > 0 for r in recs)  # multi-turn trajectories were trained

"""Crash and resume of gateway episodes under fully_async (tests/agents/test_async_resume.py's check,
:func:`rlzoo.testing.runs.kill_9_then_resume`, for ``quickstart_gateway``): a run whose agent is the
shipped calc agent as a command (one process per episode, partial rollouts across weight pushes) is
killed with SIGKILL while episodes are in flight after a checkpoint; the resumed run neither loses
nor repeats an episode's prompt. The recipe's GRPO stage alone (``stages=[]``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlzoo.testing.runs import kill_9_then_resume

pytest.importorskip("openai")

COMMAND = ("stages=[]", "rollout.agent=command", "rollout.agent.argv=[python,-m,rlzoo.tasks.calc_agent]")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_kill_9_mid_episodes_then_resume_loses_and_repeats_nothing(tmp_path: Path) -> None:
    recs = kill_9_then_resume("quickstart_gateway", tmp_path, [*COMMAND, "rollout.n=2"], batch=4, wait_s=400)
    assert all(r["agent/gateway/calls"] > 0 for r in recs[-3:])  # the agent's episodes were trained

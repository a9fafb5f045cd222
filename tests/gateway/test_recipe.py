"""``rollout.agent`` in a recipe: validated before anything loads."""

from __future__ import annotations

import pytest

import rlzoo
from rlzoo.kernel.errors import ConfigError


def test_an_agent_and_an_environment_together_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"set one of rollout\.environment and rollout\.agent"):
        rlzoo.build_run("quickstart_gateway", ["rollout.environment=tool_arithmetic"])


def test_a_bad_split_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match="split must be one of split, refuse"):
        rlzoo.build_run("quickstart_gateway", ["rollout.gateway.split=maybe"])

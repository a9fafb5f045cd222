"""``rollout.agent`` in a recipe: validated before anything loads."""

from __future__ import annotations

import pytest

import rlzoo
from rlzoo.kernel.errors import ConfigError


def test_an_environment_beside_the_agent_judges_and_plays_nothing() -> None:
    from rlzoo.train.inputs import agent_setup, gateway_setup

    cfg = rlzoo.build_run("quickstart_gateway", []).config
    assert cfg.rollout.environment.name == "tool_arithmetic"
    gw = gateway_setup(cfg)
    assert gw is not None and gw.make_env is not None and gw.env_name == "tool_arithmetic"
    assert agent_setup(cfg) is None  # no multi-turn rollout of the environment's own


def test_the_runs_tools_beside_an_agent_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"an agent \(rollout\.agent\) runs its own tools"):
        rlzoo.build_run("quickstart_gateway", ["rollout.tools=[calc]"])


def test_a_bad_split_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match="split must be one of split, refuse"):
        rlzoo.build_run("quickstart_gateway", ["rollout.gateway.split=maybe"])

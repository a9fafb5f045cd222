"""The composition API: your own objects go straight into part slots, no registration."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from plugin_fixtures import MINIMAL_RECIPE

import rlzoo
from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.plugins import PluginManager


def my_loss(inputs, params):  # type: ignore[no-untyped-def]
    """My own policy loss."""


@dataclass(frozen=True)
class MyLossParams:
    """Params of my loss."""

    beta: float = rlzoo.param(0.5, help="a knob")


def test_user_loss_object_goes_into_the_selection(pm: PluginManager) -> None:
    run = rlzoo.build_run(MINIMAL_RECIPE, pm=pm, policy_loss=my_loss)
    sel = run.config.algorithm.policy_loss
    assert sel.fn is my_loss and sel.name == "my_loss" and sel.kind == "policy_loss"
    assert sel.component.plugin == "<python object>" and sel.component.summary == "My own policy loss."
    assert sel in run.config.selections()
    assert "my_loss" not in pm.registry("policy_loss")  # nothing was registered


def test_user_part_with_params_and_capabilities(pm: PluginManager) -> None:
    part = rlzoo.part(
        my_loss, params=MyLossParams(beta=2.0), capabilities={"needs_entropy": True}, name="mine"
    )
    run = rlzoo.build_run(MINIMAL_RECIPE, ["algorithm.advantage.name=rloo"], pm=pm, policy_loss=part)
    sel = run.config.algorithm.policy_loss
    assert sel.name == "mine" and sel.params == MyLossParams(beta=2.0)
    assert sel.capability("needs_entropy") is True
    assert run.config.algorithm.advantage.name == "rloo"  # overrides still apply


def test_unknown_slot_is_an_error(pm: PluginManager) -> None:
    with pytest.raises(ConfigError, match="policy_los: not a part slot"):
        rlzoo.build_run(MINIMAL_RECIPE, pm=pm, policy_los=my_loss)

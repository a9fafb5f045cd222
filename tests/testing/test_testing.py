"""The conformance suites catch parts that break their kind's contract."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

import rlzoo
from rlzoo.kernel.plugins import PluginManager
from rlzoo.kernel.registry import Registry
from rlzoo.testing import (
    SUITES,
    AdvantageConformance,
    ComponentConformance,
    KLConformance,
    LossAggConformance,
    check_component,
    component_problems,
    suite_for,
)


@dataclass
class UnfrozenParams:
    """Params that break the rules."""

    documented: float = rlzoo.param(1.0, help="fine")
    undocumented: float = 2.0


def _part(*args):  # type: ignore[no-untyped-def]
    """A part."""


def test_check_component_lists_every_problem() -> None:
    reg: Registry = Registry("kl")
    comp = reg.register("bad", _part, plugin="p", params=UnfrozenParams, doc="")
    problems = component_problems(comp)
    assert any("must be frozen" in p for p in problems)
    assert any("'undocumented' has no help text" in p for p in problems)
    with pytest.raises(AssertionError, match="part does not conform"):
        check_component(comp)
    good = reg.register("good", _part, plugin="p", doc="Fine.")
    check_component(good)


def test_unimportable_target_is_a_problem() -> None:
    comp = Registry("kl").register("lazy", "no_such_module_xyz:fn", plugin="p", doc="Lazy.")
    assert any("does not import" in p for p in component_problems(comp))
    assert component_problems(comp, load=False) == []


def bad_advantage(inputs, params):  # type: ignore[no-untyped-def]
    """Leaks into masked positions and divides by a zero std."""
    from rlzoo.kernel.protocols import AdvantageOutput

    r = inputs.token_level_rewards.sum(-1)  # [B]
    adv = ((r - r.mean()) / r.std(unbiased=False))[:, None].expand_as(inputs.response_mask)  # [B, T]
    return AdvantageOutput(advantages=adv.clone(), returns=adv.clone())


def bad_agg(per_token_loss, mask, ctx, params):  # type: ignore[no-untyped-def]
    """Divides by the local token count: micro-batch splits do not add up."""
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1)


def bad_kl(log_probs, ref_log_probs, params):  # type: ignore[no-untyped-def]
    """Not zero at equality."""
    return (log_probs - ref_log_probs) + 0.1


class BadParts:
    @rlzoo.hookimpl
    def rlzoo_register_advantages(self, registry):  # type: ignore[no-untyped-def]
        registry.register("bad_adv", bad_advantage, capabilities={"needs_group": True})

    @rlzoo.hookimpl
    def rlzoo_register_loss_aggs(self, registry):  # type: ignore[no-untyped-def]
        registry.register("bad_agg", bad_agg)

    @rlzoo.hookimpl
    def rlzoo_register_kls(self, registry):  # type: ignore[no-untyped-def]
        registry.register("bad_kl", bad_kl)


@pytest.fixture
def bad_pm(pm: PluginManager) -> Iterator[PluginManager]:
    pm.register(BadParts(), "bad_parts")
    yield pm
    pm.unregister("bad_parts")


def _suite(base: type[ComponentConformance], name: str, pm: PluginManager) -> ComponentConformance:
    cls = type("Suite", (base,), {"name": name, "plugin_manager": lambda self: pm})
    return cls()  # type: ignore[no-any-return]


def test_advantage_suite_catches_a_bad_part(bad_pm: PluginManager) -> None:
    suite = _suite(AdvantageConformance, "bad_adv", bad_pm)
    with pytest.raises(AssertionError, match="zero where response_mask is 0"):
        suite.test_output_shapes_and_mask()  # type: ignore[attr-defined]
    with pytest.raises(AssertionError, match="NaN or inf"):
        _suite(AdvantageConformance, "bad_adv", bad_pm).test_all_equal_rewards()  # type: ignore[attr-defined]


def test_loss_agg_suite_catches_local_normalisation(bad_pm: PluginManager) -> None:
    suite = _suite(LossAggConformance, "bad_agg", bad_pm)
    with pytest.raises(AssertionError, match="sum over micro-batches"):
        suite.test_micro_batch_splits_sum_to_the_whole()  # type: ignore[attr-defined]


def test_kl_suite_catches_nonzero_at_equality(bad_pm: PluginManager) -> None:
    with pytest.raises(AssertionError, match="must be 0"):
        _suite(KLConformance, "bad_kl", bad_pm).test_zero_when_equal()  # type: ignore[attr-defined]


def test_suite_for_every_kind() -> None:
    assert suite_for("advantage") is AdvantageConformance
    generic = suite_for("train_backend")  # the extension point until backend suites exist
    assert issubclass(generic, ComponentConformance) and generic.kind == "train_backend"
    assert set(SUITES) == {
        "advantage",
        "policy_loss",
        "loss_agg",
        "kl",
        "rollout_correction",
        "sample_filter",
        "scorer",
        "environment",
        "tool",
        "reward_manager",
        "logger",
        "agent",
    }
    with pytest.raises(KeyError, match="unknown kind"):
        suite_for("advantages")


def test_unknown_part_name_fails_clearly(pm: PluginManager) -> None:
    suite = _suite(AdvantageConformance, "no_such_part", pm)
    with pytest.raises(rlzoo.UnknownComponentError, match=r"Suite\.name"):
        suite.test_registered_under_kind()  # type: ignore[attr-defined]

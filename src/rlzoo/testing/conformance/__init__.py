"""Conformance suites: the contract of each kind, as pytest classes a plugin subclasses.

Every suite derives from :class:`ComponentConformance`, which checks what all parts share
(registered, a doc line, documented params whose defaults bind). Each kind's suite adds the
contract written in :mod:`rlzoo.kernel.hookspecs` and :mod:`rlzoo.kernel.protocols`: output shapes, masks
respected, no NaN / inf on edge cases (a group of one, all-equal rewards, fully masked rows,
length-1 responses, empty responses), determinism.

A test method takes no fixture, so a suite can also be driven outside pytest: instantiate the
class and call its ``test_*`` methods (a failing check raises ``AssertionError``; a check that does
not apply calls ``pytest.skip``).

Extension point: a kind without a suite of its own (``train_backend``, ``rollout_backend``,
``runner``, ``dataset``) gets the generic checks from :func:`suite_for`. A backend suite subclasses
:class:`ComponentConformance`, sets ``kind`` and builds the part through :meth:`make_part`
(``factory(params, spec)``), then adds it to :data:`SUITES`.

The suites live in modules per kind family and are all re-exported here:
:mod:`~rlzoo.testing.conformance.base` (:class:`ComponentConformance`, :func:`check_component`),
:mod:`~rlzoo.testing.conformance.advantage` (``advantage``, ``sample_filter``),
:mod:`~rlzoo.testing.conformance.losses` (``policy_loss``, ``loss_agg``, ``kl``,
``rollout_correction``), :mod:`~rlzoo.testing.conformance.rewards` (``scorer``,
``reward_manager``), :mod:`~rlzoo.testing.conformance.agents` (``tool``, ``environment``),
:mod:`~rlzoo.testing.conformance.gateway_agents` (``agent``) and
:mod:`~rlzoo.testing.conformance.loggers` (``logger``).
"""

from __future__ import annotations

from rlzoo.kernel.kinds import KIND_BY_NAME
from rlzoo.testing.conformance.advantage import AdvantageConformance, SampleFilterConformance
from rlzoo.testing.conformance.agents import EnvironmentConformance, ToolConformance, tool_problems
from rlzoo.testing.conformance.base import ComponentConformance, check_component, component_problems
from rlzoo.testing.conformance.gateway_agents import AgentConformance, StubOpenAI
from rlzoo.testing.conformance.loggers import LoggerConformance
from rlzoo.testing.conformance.losses import (
    KLConformance,
    LossAggConformance,
    PolicyLossConformance,
    RolloutCorrectionConformance,
    token_mean_agg,
)
from rlzoo.testing.conformance.rewards import (
    RewardManagerConformance,
    ScorerConformance,
    dict_scorer,
    nan_scorer,
    raising_scorer,
    stub_scorer,
)

__all__ = [
    "SUITES",
    "AdvantageConformance",
    "AgentConformance",
    "ComponentConformance",
    "EnvironmentConformance",
    "KLConformance",
    "LoggerConformance",
    "LossAggConformance",
    "PolicyLossConformance",
    "RewardManagerConformance",
    "RolloutCorrectionConformance",
    "SampleFilterConformance",
    "ScorerConformance",
    "StubOpenAI",
    "ToolConformance",
    "check_component",
    "component_problems",
    "dict_scorer",
    "nan_scorer",
    "raising_scorer",
    "stub_scorer",
    "suite_for",
    "token_mean_agg",
    "tool_problems",
]


# ---------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------
#: kind -> its conformance suite. Kinds missing here (backends, runners, datasets) get the
#: generic checks of :class:`ComponentConformance` from :func:`suite_for` until they have a suite.
SUITES: dict[str, type[ComponentConformance]] = {
    "advantage": AdvantageConformance,
    "policy_loss": PolicyLossConformance,
    "loss_agg": LossAggConformance,
    "kl": KLConformance,
    "rollout_correction": RolloutCorrectionConformance,
    "sample_filter": SampleFilterConformance,
    "scorer": ScorerConformance,
    "reward_manager": RewardManagerConformance,
    "logger": LoggerConformance,
    "environment": EnvironmentConformance,
    "tool": ToolConformance,
    "agent": AgentConformance,
}


def suite_for(kind: str) -> type[ComponentConformance]:
    """The conformance suite of ``kind`` (the generic one for kinds without their own yet)."""
    if kind not in KIND_BY_NAME:
        raise KeyError(f"unknown kind {kind!r}; kinds are {', '.join(sorted(KIND_BY_NAME))}")
    if kind in SUITES:
        return SUITES[kind]
    return type(f"{kind.title().replace('_', '')}Conformance", (ComponentConformance,), {"kind": kind})

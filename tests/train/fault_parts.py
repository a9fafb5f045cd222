"""User code that fails, as a plugin for the fault suites (tests/train/test_faults.py,
tests/train/test_failure_policy.py): an environment that raises on the model's second turn, one
whose rewards are NaN / inf / 1e300, and a scorer that hangs.

``python fault_parts.py ARGS...`` runs ``rlzoo train ARGS...`` with these parts registered and exits
with its exit code (the fault suite's subprocess runs).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import rlzoo
from rlzoo.kernel.protocols import AgentTurn, EnvStep

#: what the raising environment's error says (the tests look for it in the run's output)
TURN2_ERROR = "the environment broke on turn 2"


def _question(row: Mapping[str, Any]) -> str:
    """The tool_arithmetic row's question, spaced digits (the quickstart_tools tokenizer's words)."""
    info = row.get("extra_info") or {}
    return f"{' '.join(str(info['a']))} + {' '.join(str(info['b']))}"


@dataclass(frozen=True)
class Turn2Params:
    """Every first turn is answered with the question again (reward 0); the second turn raises."""

    reward: float = 0.0


class RaisesOnTurn2:
    def __init__(self, params: Turn2Params) -> None:
        self.reward = float(params.reward)

    def reset(self, row: Mapping[str, Any]) -> EnvStep:
        self.q = _question(row)
        return EnvStep(messages=[{"role": "user", "content": self.q}])

    def step(self, turn: AgentTurn) -> EnvStep:
        if turn.turn >= 1:
            raise RuntimeError(TURN2_ERROR)
        return EnvStep(messages=[{"role": "user", "content": self.q}], reward=self.reward, done=False)

    def tools(self) -> list[Any]:
        return []


@dataclass(frozen=True)
class BadRewardParams:
    """The first turn ends the episode with this reward (NaN, inf, 1e300 ...), given as text: a float
    setting of NaN or inf is refused by validate (issue 39, finding 7) before any environment runs."""

    reward: str = "nan"


class BadReward(RaisesOnTurn2):
    def __init__(self, params: BadRewardParams) -> None:  # type: ignore[override]
        self.reward = float(params.reward)

    def step(self, turn: AgentTurn) -> EnvStep:
        return EnvStep(messages=[], reward=self.reward, done=True)


def hangs(response: str, ground_truth: Any, data_source: str, extra_info: Any, params: Any) -> float:
    """A scorer that never answers (well, not for an hour)."""
    time.sleep(3600)
    return 0.0


def raises(response: str, ground_truth: Any, data_source: str, extra_info: Any, params: Any) -> float:
    """A scorer that always raises."""
    raise ValueError("the grader is down")


@rlzoo.hookimpl
def rlzoo_register_environments(registry: Any) -> None:
    registry.register("raises_on_turn_2", RaisesOnTurn2, params=Turn2Params)
    registry.register("bad_reward", BadReward, params=BadRewardParams)


@rlzoo.hookimpl
def rlzoo_register_scorers(registry: Any) -> None:
    registry.register("hangs", hangs)
    registry.register("raises", raises)


def register() -> str | None:
    """Register this module as a plugin (returns its name, for ``unregister``)."""
    return rlzoo.get_plugin_manager().register(sys.modules[__name__], "fault-parts")


if __name__ == "__main__":
    from rlzoo.cli import main

    register()
    sys.exit(main(["train", *sys.argv[1:]]))

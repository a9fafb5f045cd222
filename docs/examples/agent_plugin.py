"""An outside package's environment and tool, as a plugin (see docs/agents.md).

In a package of your own this is ``my_agents/plugin.py``, announced in its ``pyproject.toml``::

    [project.entry-points.rlzoo]
    my_agents = "my_agents.plugin"

and selected in a recipe by ``rollout.environment: {name: guess_number}``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import rlzoo
from rlzoo.kernel.protocols import AgentTurn, EnvironmentFactory, EnvStep, Tool, ToolFactory


@dataclass(frozen=True)
class HintParams:
    """Hint tool: says whether a guess is too low or too high (the secret is in the episode)."""

    timeout_s: float = rlzoo.param(1.0, gt=0, help="per-call timeout in seconds")


class HintTool:
    name = "hint"
    description = "Compare a guess with the secret number."
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {"guess": {"type": "integer"}},
        "required": ["guess"],
    }

    def __init__(self, params: HintParams, secret: int = 0) -> None:
        self.timeout_s = params.timeout_s
        self.secret = secret

    async def call(self, arguments: Mapping[str, Any]) -> str:  # async: awaited off the engine
        await asyncio.sleep(0)
        guess = int(arguments["guess"])
        return "equal" if guess == self.secret else ("too low" if guess < self.secret else "too high")


@dataclass(frozen=True)
class GuessParams:
    """Guess the number: find a secret in [1, high] in a few turns; reward 1 when found."""

    high: int = rlzoo.param(100, ge=2, help="the secret is drawn from 1..high")
    max_guesses: int = rlzoo.param(5, ge=1, help="answers allowed before the episode ends")


class GuessNumber:
    """One episode (the factory is called once per trajectory)."""

    def __init__(self, params: GuessParams) -> None:
        self.params = params
        self.secret = 0
        self.left = params.max_guesses
        self._hint = HintTool(HintParams())

    def tools(self) -> Sequence[Tool]:
        return [self._hint]

    def reset(self, row: Mapping[str, Any]) -> EnvStep:
        rng = random.Random(str((row.get("extra_info") or {}).get("index", 0)))
        self.secret = rng.randint(1, self.params.high)
        self._hint.secret = self.secret
        question = f"I picked a number from 1 to {self.params.high}. Guess it."
        return EnvStep(messages=[{"role": "user", "content": question}])

    def step(self, turn: AgentTurn) -> EnvStep:
        self.left -= 1
        digits = "".join(c for c in turn.text if c.isdigit())
        found = digits == str(self.secret)
        done = found or self.left <= 0
        reply = [] if done else [{"role": "user", "content": "No. Try again."}]
        return EnvStep(messages=reply, reward=1.0 if found else 0.0, done=done, info={"found": found})


@rlzoo.hookimpl
def rlzoo_register_tools(registry: rlzoo.Registrar[ToolFactory]) -> None:
    registry.register(
        "hint", lambda params: HintTool(params), params=HintParams, capabilities={"is_async": True}
    )


@rlzoo.hookimpl
def rlzoo_register_environments(registry: rlzoo.Registrar[EnvironmentFactory]) -> None:
    registry.register(
        "guess_number",
        GuessNumber,
        params=GuessParams,
        capabilities={"offers_tools": True, "per_turn_rewards": False},
    )

"""Built-in agents (kind ``agent``): ``command``, any program that talks to the run's gateway, and
``calc_agent``, the tool arithmetic task's OpenAI-SDK agent in the run's process.

Import-light: the params and the registration; the code is in :mod:`rlzoo.gateway.command` and
:mod:`rlzoo.tasks._agents`. A
Python agent of your own registers the same way from your package (``rlzoo_register_agents``): a
factory ``factory(params) -> Agent`` whose ``run(client, row)`` (sync or ``async``) plays one
episode (docs/agents.md, "bring your own agent").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl, param

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import AgentFactory
    from rlzoo.kernel.registry import Registrar


@dataclass(frozen=True)
class CommandAgentParams:
    """Any program as the agent: started once per episode with ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``
    set, the row as JSON on stdin, its result as a JSON object line on stdout.

    The result is ``{"reward": number | null, "final_answer": text | null, "info": {...}}``; with no
    reward the recipe's scorer judges the final answer. A non-zero exit, no result line or a hang past
    ``rollout.gateway.agent_timeout_s`` fails the episode (counted; a streak aborts the run).
    """

    argv: list[str] = param(
        [],
        help="the command and its arguments (no shell); a first word 'python' is the run's own interpreter",
    )
    cwd: str | None = param(None, help="working directory of the command (None: the run's)")
    max_result_bytes: int = param(
        1_000_000, ge=1, help="bytes the command may print on stdout at most (more fails the episode)"
    )


@dataclass(frozen=True)
class CalcAgentParams:
    """:mod:`rlzoo.tasks.calc_agent`'s plain OpenAI function-calling loop (the ``quickstart_gateway``
    agent), run in the run's process with one ``openai`` client per process. The same loop as a
    command: ``{name: command, argv: [python, -m, rlzoo.tasks.calc_agent]}``.
    """

    tool: bool = param(True, help="offer the calc function (False: the task without the tool)")
    turns: int = param(2, ge=1, help="model replies per episode at most")


@hookimpl
def rlzoo_register_agents(registry: Registrar[AgentFactory]) -> None:
    registry.register("command", "rlzoo.gateway.command:make_command", params=CommandAgentParams)
    registry.register("calc_agent", "rlzoo.tasks._agents:make_calc_agent", params=CalcAgentParams)

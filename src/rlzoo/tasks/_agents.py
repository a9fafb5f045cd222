"""The ``calc_agent`` Python agent: :mod:`rlzoo.tasks.calc_agent`'s OpenAI-SDK loop, in the run's process.

The agent holds one ``openai`` client per process, as a long-lived agent service does (building one
costs an HTTP connection pool and an SSL context, ~0.1 s); each episode gets a copy of it aimed at
that episode's base URL, sharing its connections.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from rlzoo.kernel.protocols import AgentResult, ClientConfig
from rlzoo.tasks.agents import CalcAgentParams
from rlzoo.tasks.calc_agent import play

_clients: dict[str, Any] = {}  # api key -> the process's client (one per run)
_lock = threading.Lock()


def _client(config: ClientConfig) -> Any:
    from openai import OpenAI

    with _lock:
        base = _clients.get(config.api_key)
        if base is None:
            base = _clients[config.api_key] = OpenAI(
                base_url=config.base_url, api_key=config.api_key, max_retries=0
            )
    return base.with_options(base_url=config.base_url)


class CalcAgent:
    """Plays one episode with :func:`rlzoo.tasks.calc_agent.play`; the recipe's environment or scorer
    judges it (the agent gives no reward)."""

    def __init__(self, params: CalcAgentParams) -> None:
        self.params = params

    def run(self, client: ClientConfig, row: Mapping[str, Any]) -> AgentResult:
        answer = play(_client(client), client.model, row, tool=self.params.tool, turns=self.params.turns)
        return AgentResult(final_answer=answer)


def make_calc_agent(params: CalcAgentParams) -> CalcAgent:
    return CalcAgent(params)

"""``rollout.gateway``: how the run serves a user's agent (import-light: no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from rlzoo.kernel.params import param

#: what an episode whose calls do not extend each other becomes
SPLIT_POLICIES = ("split", "refuse")


@dataclass(frozen=True)
class GatewaySettings:
    """The OpenAI-compatible gateway an agent (``rollout.agent``) talks to.

    It binds to loopback on a free port and requires a random key made for the run. Each model turn
    is bounded by ``rollout.multi_turn.per_turn_max_tokens`` and what is left of the trajectory's
    response budget (``data.max_response_length``); tool calls are read with
    ``rollout.multi_turn.tool_call_format``; an episode makes at most ``rollout.multi_turn.max_turns``
    calls.
    """

    host: str = param(
        "127.0.0.1",
        help="address the gateway binds to; loopback by default (an agent on another machine needs "
        "another address, and then anyone who can reach it and has the key can sample the policy)",
    )
    model_name: str = param("policy", help="the model name the gateway serves (/v1/models); any other is 404")
    max_request_bytes: int = param(
        1_000_000, ge=1, help="body size of one request at most; a larger one is refused (413)"
    )
    max_tokens: int = param(
        4096,
        ge=1,
        help="max_tokens / max_completion_tokens a request may ask for at most (more is a 400 error); "
        "what one call samples is further cut to the turn's budget (finish_reason 'length')",
    )
    max_n: int = param(8, ge=1, help="choices one request may ask for (n) at most")
    idle_timeout_s: float = param(
        60.0,
        gt=0,
        help="seconds a connection may wait for its next request, or for the rest of one whose headers or "
        "body stopped arriving; then the gateway closes it (an OpenAI client reconnects) and its thread ends",
    )
    split: str = param(
        "split",
        help="an episode whose calls do not all extend each other (the agent edited, summarised or "
        "re-rendered its history): 'split' trains each run of extending calls as its own sample sharing "
        "the episode's reward (gateway/splits counts them by reason); 'refuse' fails the episode instead",
    )
    agent_timeout_s: float = param(
        300.0, gt=0, help="seconds one episode may take; past it the agent is stopped and the episode fails"
    )
    concurrency: int = param(64, ge=1, help="episodes running at once")

    def __post_init__(self) -> None:
        if self.split not in SPLIT_POLICIES:
            raise ValueError(f"split must be one of {', '.join(SPLIT_POLICIES)}, got {self.split!r}")

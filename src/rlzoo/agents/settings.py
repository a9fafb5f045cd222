"""``rollout.multi_turn``: the settings of a multi-turn rollout (import-light: no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from rlzoo.kernel.params import param

#: how tool calls are written in a model's turn (see :mod:`rlzoo.agents.parsing`)
TOOL_CALL_FORMATS = ("hermes", "plain")


@dataclass(frozen=True)
class MultiTurnSettings:
    """How a multi-turn rollout runs (used when ``rollout.environment`` is set).

    A trajectory alternates model turns and observations (tool results, the environment's
    reply) until the environment says ``done``, a turn ends without its stop token, or a limit
    below is reached. The response budget (``data.max_response_length``) counts every token after
    the prompt: the model's and the observations'.
    """

    max_turns: int = param(4, ge=1, help="model turns per trajectory at most")
    max_tool_calls: int = param(
        4, ge=0, help="tool calls per trajectory at most; a call past it is an error observation"
    )
    per_turn_max_tokens: int | None = param(
        None, ge=1, help="tokens one model turn may sample (None: what is left of the response budget)"
    )
    tool_call_format: str = param(
        "hermes",
        help='\'hermes\': <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen2.5, Hermes); '
        "'plain': a turn whose first word names a tool calls it with the rest of the turn as its one "
        "string argument (tiny word-level models)",
    )
    env_timeout_s: float = param(
        30.0,
        gt=0,
        help="seconds an environment's reset / step may take; past it (or when it raises) the trajectory "
        "fails, scored as a failed sample: reward/failed, and reward.max_failed_steps aborts the run",
    )
    concurrency: int = param(
        64,
        ge=1,
        help="environment / tool calls running at once (a sync call runs on a thread of its own; one that "
        "hangs past its timeout is abandoned and gives its slot back: agent/abandoned_calls)",
    )
    max_observation_chars: int = param(
        32_768,
        ge=1,
        help="characters of one message an environment or a tool may add; a longer one is cut before it "
        "is tokenized (agent/observations_truncated); a first observation longer than this fails its "
        "trajectory",
    )
    max_abs_reward: float = param(
        1e6,
        gt=0,
        help="an environment's reward (and each token reward) beyond +-this, or not a finite number, "
        "fails its trajectory",
    )

    def __post_init__(self) -> None:
        if self.tool_call_format not in TOOL_CALL_FORMATS:
            raise ValueError(
                f"tool_call_format must be one of {', '.join(TOOL_CALL_FORMATS)}, got {self.tool_call_format!r}"
            )

"""What user code (an environment, a tool) returns, checked where it enters the rollout, and the
record of a failure.

Every value is checked before it is used: an ``EnvStep`` (types, messages of text that encodes as
UTF-8, a reward and token rewards that are finite numbers within ``max_abs_reward``), a tool's
result (text, UTF-8), and sizes (an observation's text is cut to ``max_observation_chars`` *before*
it is tokenized). A bad value fails its trajectory (an environment's) or is an error the model
reads (a tool's), never the run. A :class:`Failure` carries what part B's failure policy prints and
aggregates: its kind, the part, a message naming what was wrong, and the traceback's text.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Mapping
from numbers import Real
from typing import Any

from rlzoo.agents.loop import CallTimeout, UserCodeError
from rlzoo.kernel.protocols import EnvStep, Message

__all__ = ["FAILURE_KINDS", "Failure", "cut", "failure_of", "step_problem", "text_problem"]

#: ``timeout``: past its limit; ``exception``: it raised (a ``BaseException`` too);
#: ``bad_value``: it returned something the rollout cannot use
FAILURE_KINDS = ("timeout", "exception", "bad_value")
#: characters of a bad value quoted in its message
_QUOTE = 80


class Failure(Exception):
    """User code failed: ``kind`` (one of :data:`FAILURE_KINDS`), ``part`` (``"environment"``,
    ``"tool calc"``), ``message`` (names the part, the call and what was wrong), ``traceback``."""

    def __init__(self, kind: str, part: str, message: str, tb: str = "") -> None:
        super().__init__(message)
        self.kind, self.part, self.message, self.traceback = kind, part, message, tb

    def record(self) -> dict[str, str]:
        """The failure as ``Sample.agent["failure"]`` (and ``tool_failures``) keep it."""
        return {"kind": self.kind, "part": self.part, "message": self.message, "traceback": self.traceback}


def failure_of(exc: BaseException, part: str, call: str) -> Failure:
    """A :class:`Failure` of ``part``'s ``call`` from what it raised (``CallTimeout``'s message
    already names the limit and its setting)."""
    if isinstance(exc, Failure):
        return exc
    if isinstance(exc, CallTimeout):
        return Failure("timeout", part, str(exc))
    what = f"{part} {call}".strip()
    if isinstance(exc, UserCodeError):
        return Failure("exception", part, f"{what}: {exc}", exc.traceback)
    text = "".join(traceback.format_exception(exc))
    return Failure("exception", part, f"{what}: {type(exc).__name__}: {exc}", text)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _QUOTE else text[:_QUOTE] + "..."


def text_problem(value: Any) -> str | None:
    """Why ``value`` cannot be text the model reads (None: it can)."""
    if not isinstance(value, str):
        return f"returned {type(value).__name__}, not text (str): {_show(value)}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"returned text that is not UTF-8 ({exc.reason} at character {exc.start})"
    return None


def _number_problem(value: Any, what: str, bound: float) -> str | None:
    if isinstance(value, bool) or not isinstance(value, Real):
        return f"{what} {_show(value)} is not a number"
    x = float(value)
    if not math.isfinite(x):
        return f"{what} {x} is not finite"
    if abs(x) > bound:
        return f"{what} {x:g} is beyond +-{bound:g} (rollout.multi_turn.max_abs_reward)"
    return None


def _messages_problem(messages: Any) -> str | None:
    if not isinstance(messages, list):
        return f"messages must be a list of chat messages, got {type(messages).__name__}"
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            return f"messages[{i}] must be a mapping with a 'role' (str), got {_show(m)}"
        problem = text_problem(m.get("content"))
        if problem is not None:
            return f"messages[{i}] content must be text (str) that encodes as UTF-8: it {problem}"
    return None


def step_problem(out: Any, *, first: bool, max_abs_reward: float) -> str | None:
    """What is wrong with an environment's ``EnvStep`` (``first``: reset's; None: nothing)."""
    if not isinstance(out, EnvStep):
        return f"must return an EnvStep, got {_show(out)}"
    problem = _messages_problem(out.messages)
    if problem is not None:
        return problem
    if first and not out.messages:
        return "must return the first messages (the prompt), got none"
    if out.reward is not None:
        problem = _number_problem(out.reward, "reward", max_abs_reward)
        if problem is not None:
            return problem
    if not isinstance(out.info, Mapping):
        return f"info must be a mapping, got {_show(out.info)}"
    if out.token_rewards is not None:
        if not isinstance(out.token_rewards, list) or not all(isinstance(r, list) for r in out.token_rewards):
            return f"token_rewards must be a list of lists of numbers, got {_show(out.token_rewards)}"
        for k, rs in enumerate(out.token_rewards):
            for j, r in enumerate(rs):
                problem = _number_problem(r, f"token_rewards[{k}][{j}]", max_abs_reward)
                if problem is not None:
                    return problem
    return None


def cut(messages: list[Message], limit: int) -> tuple[list[Message], int]:
    """``messages`` with each content cut to ``limit`` characters (a note of how much was cut
    appended), and how many were cut. Done before tokenizing: a 10 MB reply costs microseconds."""
    out: list[Message] = []
    n = 0
    for m in messages:
        content = m["content"]
        if len(content) > limit:
            n += 1
            m = {**m, "content": content[:limit] + f" [{len(content) - limit} characters cut]"}
        out.append(m)
    return out, n

"""Conformance suites of the agent kinds: ``tool`` and ``environment``."""

from __future__ import annotations

import asyncio
import inspect
import math
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pytest

from rlzoo.kernel.protocols import AgentTurn, Environment, EnvStep, Tool
from rlzoo.testing.conformance.base import ComponentConformance

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


async def _await(value: Any) -> Any:
    return await value


def _resolve(value: Any) -> Any:
    """A sync method's result, or an async one's, awaited."""
    return asyncio.run(_await(value)) if inspect.isawaitable(value) else value


def tool_problems(tool: Any) -> list[str]:
    """What is wrong with a tool object (empty: it meets :class:`rlzoo.kernel.protocols.Tool`)."""
    if not isinstance(tool, Tool):
        return [f"{tool!r} is not a Tool (name, description, parameters, timeout_s, call)"]
    out = []
    if not isinstance(tool.name, str) or not _TOOL_NAME.match(tool.name):
        out.append(f"tool name {tool.name!r} must match {_TOOL_NAME.pattern} (chat templates need it)")
    if not isinstance(tool.description, str) or not tool.description.strip():
        out.append(f"tool {tool.name!r}: give it a description (the model reads it)")
    schema = tool.parameters
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        out.append(f"tool {tool.name!r}: parameters must be a JSON schema with type 'object', got {schema!r}")
    else:
        props = schema.get("properties", {})
        missing = [r for r in schema.get("required", []) if r not in props]
        if missing:
            out.append(f"tool {tool.name!r}: required {missing} not among properties {sorted(props)}")
    if not (
        isinstance(tool.timeout_s, (int, float)) and tool.timeout_s > 0 and math.isfinite(tool.timeout_s)
    ):
        out.append(f"tool {tool.name!r}: timeout_s must be a finite number > 0, got {tool.timeout_s!r}")
    return out


# ---------------------------------------------------------------------------------------------
# tool
# ---------------------------------------------------------------------------------------------
def example_arguments(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments a schema accepts, made up: each required property's ``default``, first ``enum``
    value, or a value of its JSON type (``"1"``, ``1``, ``True``, ``[]``, ``{}``)."""
    props = schema.get("properties", {}) if isinstance(schema, Mapping) else {}
    made = {"string": "1", "integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}
    out: dict[str, Any] = {}
    for key in schema.get("required", []) if isinstance(schema, Mapping) else []:
        spec = props.get(key, {}) if isinstance(props.get(key), Mapping) else {}
        if "default" in spec:
            out[key] = spec["default"]
        elif spec.get("enum"):
            out[key] = spec["enum"][0]
        else:
            kind = spec.get("type")
            out[key] = made.get(kind, "1") if isinstance(kind, str) else "1"
    return out


def call_within(tool: Any, arguments: Mapping[str, Any]) -> tuple[bool, Any]:
    """``tool.call(arguments)`` (awaited if async) held to the tool's ``timeout_s``, on a daemon
    thread so that a hang fails the test instead of hanging it: ``(True, result)`` or ``(False,
    the Exception it raised)``. A call past ``timeout_s``, or one raising a ``BaseException``
    (``SystemExit``), fails the assertion."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append((True, _resolve(tool.call(dict(arguments)))))
        except Exception as exc:
            out.append((False, exc))
        except BaseException as exc:  # reported below, not raised in this thread
            out.append((None, exc))

    limit = float(tool.timeout_s)
    t0 = time.monotonic()
    thread = threading.Thread(target=run, name="rlzoo-conformance-call", daemon=True)
    thread.start()
    thread.join(limit + 1.0)
    took = time.monotonic() - t0
    assert out and took <= limit, (
        f"tool {tool.name!r}: call({dict(arguments)!r}) took {took:.2f} s"
        f"{'' if out else ' and did not return'}, past its timeout_s of {limit:g} s (the rollout gives up "
        "on it there: make the call faster, or declare a longer timeout_s)"
    )
    ok, value = out[0]
    assert ok is not None, (
        f"tool {tool.name!r}: call({dict(arguments)!r}) raised {type(value).__name__} (a BaseException): a tool "
        "must raise an Exception (an error the model reads), never end the process"
    )
    return ok, value


class ToolConformance(ComponentConformance):
    """``factory(params) -> Tool``; ``tool.call(arguments) -> str`` (or a coroutine of one), within
    the tool's ``timeout_s``.

    Set :attr:`cases` to ``(arguments, expected_text)`` pairs worked out by hand, and
    :attr:`arguments` to one valid call's arguments (default: made up from the schema's required
    properties, :func:`example_arguments`). A call on bad arguments may raise an ``Exception`` (the
    rollout turns it into an error observation) or return text; it must not hang, run past
    ``timeout_s``, return anything but text or end the process.
    """

    kind = "tool"
    cases: ClassVar[Sequence[tuple[Mapping[str, Any], str]]] = ()
    arguments: ClassVar[Mapping[str, Any] | None] = None
    bad_arguments: ClassVar[Sequence[Mapping[str, Any]]] = ({}, {"unexpected": 1})

    def make_tool(self) -> Any:
        return self.make_part()(self.params)

    def test_is_a_tool(self) -> None:
        problems = tool_problems(self.make_tool())
        assert not problems, "\n".join(problems)

    def test_a_call_returns_text_within_timeout_s(self) -> None:
        """Without cases too: a valid call returns ``str`` (or raises an Exception) in time."""
        tool = self.make_tool()
        arguments = dict(self.arguments) if self.arguments is not None else example_arguments(tool.parameters)
        ok, got = call_within(tool, arguments)
        assert not ok or isinstance(got, str), (
            f"tool {tool.name!r}: call({arguments!r}) returned {type(got).__name__}, not str: {got!r:.80}"
        )

    def test_cases(self) -> None:
        if not self.cases:
            pytest.skip("no cases given (set `cases` to (arguments, expected text) pairs)")
        tool = self.make_tool()
        for arguments, expected in self.cases:
            ok, got = call_within(tool, arguments)
            assert ok, f"call({arguments!r}) raised {type(got).__name__}: {got}"
            assert isinstance(got, str), f"call({arguments!r}) returned {type(got).__name__}, not str"
            assert got == expected, f"call({arguments!r}) = {got!r}, expected {expected!r}"

    def test_bad_arguments_raise_an_exception_or_return_text(self) -> None:
        tool = self.make_tool()
        for arguments in self.bad_arguments:
            ok, got = call_within(tool, arguments)
            if ok:
                assert isinstance(got, str), f"call({arguments!r}) returned {type(got).__name__}, not str"


# ---------------------------------------------------------------------------------------------
# environment
# ---------------------------------------------------------------------------------------------
class EnvironmentConformance(ComponentConformance):
    """``factory(params) -> Environment``: ``reset(row)``, ``step(turn)``, ``tools()``.

    Set :attr:`row` to a dataset row the environment accepts, and :attr:`episodes` to
    ``(row, [turn texts], expected total reward)`` triples worked out by hand (each turn's text is
    what the model said; tool calls are the rollout's business and are not made here).
    """

    kind = "environment"
    row: ClassVar[Mapping[str, Any]] = {"prompt_text": "hello", "ground_truth": "1", "extra_info": {}}
    episodes: ClassVar[Sequence[tuple[Mapping[str, Any], Sequence[str], float]]] = ()
    odd_turns: ClassVar[Sequence[str]] = ("", " \n ", "x" * 5000, "答案 ✓", "<tool_call>{</tool_call>")

    def make_env(self) -> Any:
        env = self.make_part()(self.params)
        assert isinstance(env, Environment), (
            f"{self.name}: the factory must return an Environment (reset, step, tools), got {env!r}"
        )
        return env

    def check_step(self, out: Any, what: str) -> EnvStep:
        assert isinstance(out, EnvStep), f"{what} returned {type(out).__name__}, not EnvStep"
        assert isinstance(out.messages, list), f"{what}: messages must be a list"
        for m in out.messages:
            assert isinstance(m, Mapping) and isinstance(m.get("role"), str), f"{what}: bad message {m!r}"
            assert isinstance(m.get("content"), str), f"{what}: message content must be text, got {m!r}"
        if out.reward is not None:
            assert math.isfinite(float(out.reward)), f"{what}: reward {out.reward!r} is not finite"
        assert isinstance(out.info, Mapping), f"{what}: info must be a mapping"
        return out

    def test_reset_gives_the_first_observation(self) -> None:
        first = self.check_step(_resolve(self.make_env().reset(dict(self.row))), "reset(row)")
        assert first.messages, "reset(row) must return at least one message (the prompt)"
        assert not first.done, "reset(row) must not end the episode"

    def test_tools_are_tools_with_unique_names(self) -> None:
        tools = list(self.make_env().tools())
        problems = [p for t in tools for p in tool_problems(t)]
        assert not problems, "\n".join(problems)
        names = [t.name for t in tools]
        assert len(names) == len(set(names)), f"tool names repeat: {names}"
        if not self.component.caps.offers_tools:  # type: ignore[attr-defined]
            assert not tools, f"{self.name} offers tools {names} but does not declare offers_tools"

    def test_odd_turns(self) -> None:
        for text in self.odd_turns:
            env = self.make_env()
            _resolve(env.reset(dict(self.row)))
            self.check_step(_resolve(env.step(AgentTurn(text=text, turn=0))), f"step({text[:20]!r})")

    def test_episodes(self) -> None:
        if not self.episodes:
            pytest.skip("no episodes given (set `episodes` to (row, turns, expected reward) triples)")
        for row, turns, expected in self.episodes:
            env = self.make_env()
            self.check_step(_resolve(env.reset(dict(row))), "reset(row)")
            total = 0.0
            for i, text in enumerate(turns):
                out = self.check_step(_resolve(env.step(AgentTurn(text=text, turn=i))), f"step {i}")
                total += float(out.reward or 0.0)
                if out.done:
                    break
            assert math.isclose(total, expected, abs_tol=1e-6), (
                f"episode {list(turns)!r} on {dict(row)!r}: reward {total}, expected {expected}"
            )

    def test_episodes_are_independent(self) -> None:
        """Two environments from the factory keep separate state (one per trajectory)."""
        if len(self.episodes) < 2:
            pytest.skip("needs two episodes")
        (row1, turns1, r1), (row2, turns2, r2) = self.episodes[:2]
        e1, e2 = self.make_env(), self.make_env()
        _resolve(e1.reset(dict(row1)))
        _resolve(e2.reset(dict(row2)))
        got2 = _resolve(e2.step(AgentTurn(text=turns2[0], turn=0)))
        got1 = _resolve(e1.step(AgentTurn(text=turns1[0], turn=0)))
        if got1.done and got2.done:
            assert math.isclose(float(got1.reward or 0), r1) and math.isclose(float(got2.reward or 0), r2)

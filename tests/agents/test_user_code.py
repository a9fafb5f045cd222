"""User code in a multi-turn rollout (environments, tools) never hangs or crashes the run (issue 39):
a ``BaseException`` from a tool or an environment, a synchronous call that hangs past its timeout, a
bad value returned at the boundary and untrusted sizes each fail their trajectory (or become an error
the model reads), are counted, and the rollout goes on. A scripted backend stands in for the model."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from run_fixtures import default_sigint

from agents.helpers import ScriptedBackend, requests
from rlzoo.agents.parsing import parse_tool_calls
from rlzoo.agents.rollout import MultiTurnRollout, agent_metrics
from rlzoo.agents.settings import MultiTurnSettings
from rlzoo.kernel.protocols import AgentTurn, EnvStep, Sample, Tool
from rlzoo.models.tiny import build_tokenizer
from rlzoo.tasks._tools import CHAT_TEMPLATE, WORDS
from rlzoo.train.rewards import score_samples

TOK = build_tokenizer((*WORDS, "slow", "boom", "exit", "sync"), CHAT_TEMPLATE, extra_special=("<|tool|>",))
EOS = int(TOK.eos_token_id)


def rollout(
    make_env: Any, *, tools: Sequence[Tool] = (), budget: int = 40, prompt: int = 64, **settings: Any
) -> MultiTurnRollout:
    return MultiTurnRollout(
        ScriptedBackend(TOK, SCRIPT, EOS),  # type: ignore[arg-type]
        make_env,
        TOK,
        MultiTurnSettings(**{"tool_call_format": "plain", **settings}),
        max_response_length=budget,
        max_prompt_length=prompt,
        stop_ids=(EOS,),
        tools=tools,
    )


#: the scripted model: turn 0 says "<word> 1" (a call when <word> names a tool), then answers
SCRIPT_WORD: dict[str, str] = {"word": "2"}


def SCRIPT(turn: int, prompt: str) -> str:
    return f"{SCRIPT_WORD['word']} 1" if turn == 0 else "Answer: 2"


def generate(mt: MultiTurnRollout, n: int = 1, deadline: float = 30.0) -> list[Sample]:
    """``mt.generate`` for ``n`` trajectories, failing the test (not hanging it) past ``deadline``."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(_try(lambda: mt.generate(requests(n_prompts=n, n=1)))))
    t.daemon = True
    t.start()
    t.join(deadline)
    if t.is_alive():
        pytest.fail(f"the rollout hung for more than {deadline} s")
    (got,) = out
    if isinstance(got, BaseException):
        raise got
    return list(got)


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except BaseException as exc:  # handed to the test's thread
        return exc


class Env:
    """One question, answered in one turn (reward 1); subclasses break one thing."""

    def tools(self) -> Sequence[Tool]:
        return []

    def reset(self, row: Mapping[str, Any]) -> EnvStep:
        return EnvStep(messages=[{"role": "user", "content": "1 + 1"}])

    def step(self, turn: AgentTurn) -> EnvStep:
        return EnvStep(messages=[], reward=1.0, done=True)


class Raiser:
    """A tool (sync or async) raising ``exc``."""

    description = "Breaks."
    parameters = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
    timeout_s = 0.5

    def __init__(self, name: str, exc: BaseException, is_async: bool = False) -> None:
        self.name, self.exc, self.is_async = name, exc, is_async

    def call(self, arguments: Mapping[str, Any]) -> Any:
        if self.is_async:

            async def go() -> str:
                raise self.exc

            return go()
        raise self.exc


# ---------------------------------------------------------------------------------------------
# 1. BaseException from user code
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()], ids=["SystemExit", "KeyboardInterrupt"])
def test_a_tool_raising_a_base_exception_fails_its_trajectory_and_the_rollout_goes_on(
    exc: BaseException, is_async: bool
) -> None:
    SCRIPT_WORD["word"] = "exit"
    mt = rollout(Env, tools=[Raiser("exit", exc, is_async)])
    first = generate(mt, n=2)
    name = type(exc).__name__
    for s in first:
        assert s.agent is not None and name in str(s.agent["error"]), s.agent
        failure = s.agent["failure"]
        assert (failure["kind"], failure["part"]) == ("exception", "tool exit")
        assert name in failure["message"] and "Traceback" in failure["traceback"]
    assert all(r.failed for r in score_samples(None, TOK, first))
    SCRIPT_WORD["word"] = "2"  # the side loop still works: the next trajectories are scored
    (s,) = generate(mt)
    assert s.agent is not None and s.agent["error"] is None and s.agent["reward"] == 1.0
    mt.shutdown()


class ExitingEnv(Env):
    def step(self, turn: AgentTurn) -> EnvStep:
        raise SystemExit("argparse said no")


def test_an_environment_raising_system_exit_fails_its_trajectory() -> None:
    SCRIPT_WORD["word"] = "2"
    mt = rollout(ExitingEnv)
    (s,) = generate(mt)
    assert s.agent is not None and "SystemExit: argparse said no" in str(s.agent["error"])
    assert (s.agent["failure"]["kind"], s.agent["failure"]["part"]) == ("exception", "environment")
    assert "Traceback" in s.agent["failure"]["traceback"]
    mt.shutdown()


STEP_STARTED = threading.Event()


class SlowAsyncEnv(Env):
    async def step(self, turn: AgentTurn) -> EnvStep:
        STEP_STARTED.set()
        await asyncio.sleep(20)
        return EnvStep(messages=[], reward=1.0, done=True)


def test_a_real_ctrl_c_still_stops_the_rollout() -> None:
    """A KeyboardInterrupt of the caller's thread (Ctrl-C) is not a tool's: it propagates.

    A real SIGINT, in a process of its own (as a user's run is), once the environment's step runs
    (in-session with ``_thread.interrupt_main`` after a fixed delay, it failed in full sessions only)."""
    script = Path(__file__).with_name("_ctrl_c_rollout.py")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, preexec_fn=default_sigint
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("INTERRUPTED"))
    seconds = float(line.split()[2])
    assert seconds < 20 and line.endswith("step started: True")  # the step's 20 s sleep was not waited for


# ---------------------------------------------------------------------------------------------
# 2. synchronous calls that hang
# ---------------------------------------------------------------------------------------------
FOREVER = threading.Event()  # never set: a wait on it is a hang


class HangOnce(Env):
    """``step`` hangs for ever in the first ``hang`` trajectories (a synchronous hang)."""

    hang = 0

    def step(self, turn: AgentTurn) -> EnvStep:
        if HangOnce.hang > 0:
            HangOnce.hang -= 1
            FOREVER.wait()
        return super().step(turn)


def test_a_hanging_sync_step_never_takes_the_capacity_of_the_next_resets() -> None:
    """concurrency 2 and two steps hung for ever: the next batch's resets and steps still run
    (before issue 39 the hung threads held the pool and every next reset timed out)."""
    SCRIPT_WORD["word"] = "2"
    HangOnce.hang = 2
    mt = rollout(HangOnce, env_timeout_s=0.3, concurrency=2)
    first = generate(mt, n=2)
    for s in first:
        assert s.agent is not None
        assert s.agent["error"] == "environment step exceeded 0.3 s (rollout.multi_turn.env_timeout_s)"
        assert s.agent["failure"]["kind"] == "timeout" and s.agent["abandoned_calls"] == 1
    assert agent_metrics([s.agent for s in first])["agent/abandoned_calls"] == 2.0
    second = generate(mt, n=4)
    assert all(s.agent is not None and s.agent["error"] is None and s.agent["reward"] == 1.0 for s in second)
    mt.shutdown()


class SlowSyncTool:
    name = "sync"
    description = "Sleeps (synchronously)."
    parameters = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
    timeout_s = 0.2

    def call(self, arguments: Mapping[str, Any]) -> str:
        FOREVER.wait()
        return "never"


def test_a_hanging_sync_tool_is_an_error_naming_its_limit_and_is_counted() -> None:
    SCRIPT_WORD["word"] = "sync"
    mt = rollout(Env, tools=[SlowSyncTool()], concurrency=1)
    for s in generate(mt, n=2):
        assert s.agent is not None and s.agent["error"] is None and s.agent["reward"] == 1.0
        assert s.agent["tool_errors"] == 1 and s.agent["abandoned_calls"] == 1
        (result,) = s.agent["tool_failures"]
        assert (
            result["kind"] == "timeout" and result["message"] == "tool sync exceeded its timeout_s of 0.2 s"
        )
        observation = TOK.decode([t for t, m in zip(s.response_ids, s.loss_mask or []) if not m])
        assert observation.startswith("<|tool|>")
    mt.shutdown()


# ---------------------------------------------------------------------------------------------
# 3. values checked at the boundary
# ---------------------------------------------------------------------------------------------
def _env_returning(**step: Any) -> Callable[[], Env]:
    class Bad(Env):
        def step(self, turn: AgentTurn) -> EnvStep:
            return EnvStep(**{"messages": [], "done": True, **step})

    return Bad


@pytest.mark.parametrize(
    ("step", "said"),
    [
        ({"reward": "abc"}, "reward 'abc' is not a number"),
        ({"reward": math.nan}, "reward nan is not finite"),
        ({"reward": math.inf}, "reward inf is not finite"),
        ({"reward": 1e300}, "reward 1e+300 is beyond"),
        ({"reward": 1.0, "token_rewards": [[math.nan, 0.0, 0.0]]}, "token_rewards"),
        ({"reward": 1.0, "messages": "hi"}, "messages must be a list"),
        ({"reward": 1.0, "done": False, "messages": [{"role": "user", "content": b"\xff"}]}, "content"),
        ({"reward": 1.0, "done": False, "messages": [{"role": "user", "content": "\udcff"}]}, "UTF-8"),
    ],
)
def test_a_bad_value_from_step_fails_its_trajectory_not_the_run(step: dict[str, Any], said: str) -> None:
    SCRIPT_WORD["word"] = "2"
    mt = rollout(_env_returning(**step), max_abs_reward=1e6)
    (s,) = generate(mt)
    assert s.agent is not None and said in str(s.agent["error"]), s.agent["error"]
    assert s.agent["failure"]["kind"] == "bad_value"
    (r,) = score_samples(None, TOK, [s])
    assert r.failed and math.isfinite(r.reward)
    mt.shutdown()


class BadFirst(Env):
    content: Any = "1 + 1"

    def reset(self, row: Mapping[str, Any]) -> EnvStep:
        return EnvStep(messages=[{"role": "user", "content": self.content}])


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"1 + \xff", "content must be text (str)"),
        ("1 + \udcff", "UTF-8"),
        (" ".join(["1"] * 200), "longer than the prompt budget (data.max_prompt_length=64)"),
        ("1" * 100_000, "rollout.multi_turn.max_observation_chars"),
    ],
)
def test_a_bad_first_observation_fails_its_trajectory(content: Any, said: str) -> None:
    SCRIPT_WORD["word"] = "2"
    env = type("B", (BadFirst,), {"content": content})
    mt = rollout(env, max_observation_chars=10_000)
    (s,) = generate(mt)
    assert s.agent is not None and said in str(s.agent["error"]), s.agent["error"]
    assert len(s.prompt_ids) <= 64
    mt.shutdown()


class SaysGoodbye(Env):
    def step(self, turn: AgentTurn) -> EnvStep:
        return EnvStep(messages=[{"role": "user", "content": "well done"}], reward=1.0, done=True)


def test_messages_returned_with_done_are_kept_on_the_record() -> None:
    SCRIPT_WORD["word"] = "2"
    mt = rollout(SaysGoodbye)
    (s,) = generate(mt)
    assert s.agent is not None and s.agent["reward"] == 1.0
    assert s.agent["final_messages"] == [{"role": "user", "content": "well done"}]
    mt.shutdown()


class Returns:
    description = "Returns a value."
    parameters = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
    timeout_s = 1.0

    def __init__(self, name: str, value: Any) -> None:
        self.name, self.value = name, value

    def call(self, arguments: Mapping[str, Any]) -> Any:
        return self.value


@pytest.mark.parametrize(
    ("value", "said"), [(42, "returned int, not text"), ("\udcff", "not UTF-8"), (None, "returned NoneType")]
)
def test_a_tool_returning_no_text_is_an_error_and_counted(value: Any, said: str) -> None:
    SCRIPT_WORD["word"] = "slow"
    mt = rollout(Env, tools=[Returns("slow", value)])
    (s,) = generate(mt)
    assert s.agent is not None and s.agent["error"] is None and s.agent["tool_errors"] == 1
    (failure,) = s.agent["tool_failures"]
    assert failure["kind"] == "bad_value" and said in failure["message"], failure
    mt.shutdown()


def test_a_huge_tool_result_is_cut_before_tokenizing_and_counted() -> None:
    """A 10 MB observation costs milliseconds: cut to max_observation_chars first."""
    SCRIPT_WORD["word"] = "slow"
    mt = rollout(Env, tools=[Returns("slow", "1 " * 5_000_000)], max_observation_chars=100, budget=200)
    t0 = time.perf_counter()
    (s,) = generate(mt)
    took = time.perf_counter() - t0
    assert s.agent is not None and s.agent["observations_truncated"] == 1
    assert s.agent["env_tokens"] <= 100
    assert took < 2.0, took
    assert agent_metrics([s.agent])["agent/observations_truncated"] == 1.0
    mt.shutdown()


# ---------------------------------------------------------------------------------------------
# 4. the tool-call parser: linear, and never raising
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [4_000, 100_000])
def test_the_hermes_parser_is_linear_in_repeated_open_tags(n: int) -> None:
    t0 = time.perf_counter()
    calls = parse_tool_calls("<tool_call>" * n, "hermes", {})
    assert time.perf_counter() - t0 < 1.0
    assert calls and all(c.malformed for c in calls)


@pytest.mark.parametrize(
    "body",
    ["[" * 100_000 + "]" * 100_000, '{"name": "calc", "arguments": {"x": ' + "9" * 5000 + "}}"],
    ids=["nested", "5000-digit"],
)
def test_json_that_python_refuses_is_a_malformed_call(body: str) -> None:
    (call,) = parse_tool_calls(f"<tool_call>{body}</tool_call>", "hermes", {})
    assert call.malformed and "malformed tool call" in call.malformed


def test_malformed_calls_are_in_the_turn_s_tool_calls() -> None:
    good = json.dumps({"name": "calc", "arguments": {"expression": "1+1"}})
    calls = parse_tool_calls(
        f"<tool_call>{{x</tool_call> <tool_call>{good}</tool_call> <tool_call>", "hermes", {}
    )
    assert [c.malformed is not None for c in calls] == [True, False, True]
    assert calls[1].arguments == {"expression": "1+1"} and calls[0].raw == "<tool_call>{x</tool_call>"


@pytest.mark.slow
def test_a_run_whose_environment_hangs_for_ever_ends_on_its_own(tmp_path: Path) -> None:
    """``rlzoo``'s Python API in a subprocess: ``quickstart_tools`` with an environment whose sync
    ``step`` never returns, ``env_timeout_s=1``, 2 steps. The process ends by itself (before issue
    39 the hung pool threads were joined at exit: it never did), with its summary, and the
    abandoned calls are counted (~35 s on 2 busy cores, most of it start-up)."""
    script = Path(__file__).with_name("_hang_forever_run.py")
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "data"), str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"RUN_DIR={out}" in proc.stdout
    assert json.loads((out / "summary.json").read_text())["ended"] == "completed"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) > 0]
    assert len(steps) == 2 and all(r["agent/abandoned_calls"] >= 1 for r in steps)
    # each distinct failure is kept in failures.jsonl (and printed once where the console logs)
    kept = (out / "failures.jsonl").read_text()
    assert "environment hangs_for_ever step exceeded 1 s (rollout.multi_turn.env_timeout_s)" in kept


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_timeout_error_a_tool_raises_itself_is_its_error_not_the_limit(is_async: bool) -> None:
    SCRIPT_WORD["word"] = "boom"
    mt = rollout(Env, tools=[Raiser("boom", TimeoutError("the database is slow"), is_async)])
    (s,) = generate(mt)
    assert s.agent is not None and s.agent["abandoned_calls"] == 0
    (failure,) = s.agent["tool_failures"]
    assert failure["kind"] == "exception" and "TimeoutError: the database is slow" in failure["message"]
    mt.shutdown()


class Reads(Env):
    """Records the turn it read."""

    seen: list[AgentTurn] = []

    def tools(self) -> Sequence[Tool]:
        return [Returns("calc", "2")]

    def step(self, turn: AgentTurn) -> EnvStep:
        Reads.seen.append(turn)
        return super().step(turn)


def test_the_environment_reads_a_malformed_call_in_the_turn_s_tool_calls() -> None:
    """Before issue 39 a malformed call was shown to the model but missing from AgentTurn.tool_calls."""
    bad = "<tool_call>{x</tool_call>"
    tok = build_tokenizer((*WORDS, bad), CHAT_TEMPLATE, extra_special=("<|tool|>",))
    script = {0: bad, 1: "Answer: 2"}
    mt = MultiTurnRollout(
        ScriptedBackend(tok, lambda t, _: script[t], int(tok.eos_token_id)),  # type: ignore[arg-type]
        Reads,
        tok,
        MultiTurnSettings(tool_call_format="hermes"),
        max_response_length=40,
        stop_ids=(int(tok.eos_token_id),),
    )
    Reads.seen = []
    (s,) = generate(mt)
    assert s.agent is not None and s.agent["malformed_calls"] == 1 and s.agent["tool_calls"] == 0
    (turn,) = Reads.seen
    (call,) = turn.tool_calls
    assert call.raw == bad and call.malformed is not None and "not JSON" in call.malformed
    assert turn.tool_results == (f"error: {call.malformed}",)
    mt.shutdown()

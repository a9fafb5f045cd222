"""Tool calls, errors, timeouts and limits of multi-turn rollouts, and how they are counted
(``agent/*`` metrics, failed samples and the failure streak). A scripted backend stands in for the
model so that each case is exact."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from agents.helpers import ScriptedBackend, requests
from rlzoo.agents.parsing import parse_tool_calls, schema_problems
from rlzoo.agents.rollout import MultiTurnRollout, agent_metrics
from rlzoo.agents.settings import MultiTurnSettings
from rlzoo.kernel.protocols import AgentTurn, EnvStep, Sample, Tool
from rlzoo.models.tiny import build_tokenizer
from rlzoo.tasks._tools import CHAT_TEMPLATE, WORDS, CalcTool, ToolArithmetic
from rlzoo.tasks.tools import CalcParams, ToolArithmeticParams
from rlzoo.train.batching import rollout_metrics, samples_to_batch
from rlzoo.train.failures import RewardFailureError, RewardFailures
from rlzoo.train.rewards import score_samples

TOK = build_tokenizer((*WORDS, "slow", "boom"), CHAT_TEMPLATE, extra_special=("<|tool|>",))
EOS = int(TOK.eos_token_id)
ROW = {"extra_info": {"a": 123, "b": 456}, "ground_truth": "579", "data_source": "rlzoo/tool_arithmetic"}


def run(
    script: Any, make_env: Any, *, tools: Sequence[Tool] = (), n: int = 1, budget: int = 40, **settings: Any
) -> list[Sample]:
    mt = MultiTurnRollout(
        ScriptedBackend(TOK, script, EOS),  # type: ignore[arg-type]
        make_env,
        TOK,
        MultiTurnSettings(**{"tool_call_format": "plain", **settings}),
        max_response_length=budget,
        stop_ids=(EOS,),
        tools=tools,
    )
    reqs = requests(n_prompts=n, n=1)
    for r in reqs:
        r.data.update(ROW)
    return mt.generate(reqs)


def arithmetic() -> ToolArithmetic:
    return ToolArithmetic(ToolArithmeticParams())


def test_a_tool_call_then_the_answer() -> None:
    script = {0: "calc 1 2 3 + 4 5 6", 1: "Answer: 5 7 9"}
    (s,) = run(lambda turn, _: script[turn], arithmetic)
    rec = s.agent
    assert rec is not None
    assert (rec["turns"], rec["tool_calls"], rec["tool_errors"], rec["reward"]) == (2, 1, 0, 1.0)
    assert (
        TOK.decode(s.response_ids)
        == "calc 1 2 3 + 4 5 6 <eos> <|tool|> 5 7 9 <|assistant|> Answer: 5 7 9 <eos>"
    )
    #            model (mask 1) ............ | tool's delta (mask 0) ..... | model (mask 1)
    assert s.loss_mask == [1] * 9 + [0] * 5 + [1] * 5
    (result,) = score_samples(None, TOK, [s])
    assert (result.reward, result.failed, result.info["acc"]) == (1.0, False, 1.0)


def test_tool_errors_are_observations_and_counted() -> None:
    """A call the tool refuses, an unknown tool (hermes), a malformed call: each becomes an error the
    model reads, and is counted."""
    script = {0: "calc 1 +", 1: "Answer: 5 7 9"}
    (s,) = run(lambda t, _: script[t], arithmetic)
    assert s.agent is not None and s.agent["tool_errors"] == 1 and s.agent["reward"] == 1.0
    observation = [t for t, m in zip(s.response_ids, s.loss_mask or []) if not m]
    assert TOK.decode(observation).startswith("<|tool|> [UNK]")  # "error: calc: cannot parse ..."
    (call,) = parse_tool_calls(
        '<tool_call>{"name": "calc", "arguments": {"expression": "1+1"}}</tool_call>', "hermes", {}
    )
    assert call.arguments == {"expression": "1+1"} and call.malformed is None
    bad = parse_tool_calls("<tool_call>{name: calc}</tool_call> <tool_call>{", "hermes", {})
    assert [c.malformed is not None for c in bad] == [True, True]
    assert "not JSON" in str(bad[0].malformed) and "without </tool_call>" in str(bad[1].malformed)
    assert schema_problems({"expression": 5}, CalcTool(CalcParams()).parameters) == [
        "argument 'expression' must be a string, got int"
    ]


class SlowTool:
    name = "slow"
    description = "Sleeps."
    parameters = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
    timeout_s = 0.2

    async def call(self, arguments: Mapping[str, Any]) -> str:
        await asyncio.sleep(30)
        return "late"


class BoomTool(SlowTool):
    name = "boom"

    def call(self, arguments: Mapping[str, Any]) -> str:  # type: ignore[override]
        raise RuntimeError("tool exploded")


def test_a_hanging_tool_times_out_and_a_raising_one_is_an_error() -> None:
    script = {0: "slow 1", 1: "boom 2", 2: "Answer: 5 7 9"}
    t0 = time.monotonic()
    (s,) = run(lambda t, _: script[t], arithmetic, tools=[SlowTool(), BoomTool()], max_turns=4)
    assert time.monotonic() - t0 < 10  # the 30 s sleep was cut at 0.2 s
    assert s.agent is not None
    assert (s.agent["tool_calls"], s.agent["tool_errors"], s.agent["reward"]) == (2, 2, 1.0)


def test_max_tool_calls_and_max_turns() -> None:
    (s,) = run(lambda t, _: "calc 1 + 1", arithmetic, max_turns=3, max_tool_calls=1)
    assert s.agent is not None
    assert (s.agent["turns"], s.agent["tool_calls"], s.agent["tool_errors"]) == (3, 2, 1)
    assert s.agent["truncated"] and s.finish_reason == "length" and s.agent["reward"] is None


def test_the_response_budget_counts_every_turn() -> None:
    (s,) = run(lambda t, _: "calc 1 2 3 + 4 5 6", arithmetic, max_turns=10, max_tool_calls=10, budget=30)
    assert len(s.response_ids) <= 30 and s.agent is not None and s.agent["truncated"]


class RaisingEnv:
    def tools(self) -> Sequence[Tool]:
        return []

    def reset(self, row: Mapping[str, Any]) -> EnvStep:
        return EnvStep(messages=[{"role": "user", "content": "1 + 1"}])

    def step(self, turn: AgentTurn) -> EnvStep:
        raise ValueError("environment exploded")


class HangingEnv(RaisingEnv):
    async def step(self, turn: AgentTurn) -> EnvStep:  # type: ignore[override]
        await asyncio.sleep(30)
        raise AssertionError("unreachable")


@pytest.mark.parametrize(
    ("env", "error"),
    [(RaisingEnv, "environment exploded"), (HangingEnv, "exceeded 0.3 s (rollout.multi_turn.env_timeout_s)")],
)
def test_a_failing_environment_fails_its_samples_and_the_streak_aborts(env: Any, error: str) -> None:
    samples = run(lambda t, _: "2", env, n=3, env_timeout_s=0.3)
    assert all(s.agent is not None and error in str(s.agent["error"]) for s in samples)
    results = score_samples(None, TOK, samples)
    assert all(r.failed and "environment" in r.info["error"] for r in results)
    failures = RewardFailures(limit=2)
    for step in (1, 2):
        failures.record(results)
        failures.end_step(step)
    with pytest.raises(RewardFailureError, match=re.escape(error)):
        failures.check()
    batch = samples_to_batch(samples, results, 0)
    assert rollout_metrics(batch, 40)["agent/env_failed"] == 3.0


def test_agent_metrics_of_a_batch() -> None:
    script = {0: "calc 1 2 3 + 4 5 6", 1: "Answer: 5 7 9"}
    samples = run(lambda t, _: script[t], arithmetic, n=2)
    samples += run(lambda t, _: "Answer: 1", arithmetic, n=2)
    m = agent_metrics([s.agent for s in samples])
    # by hand: turns 2, 2, 1, 1; calls 1, 1, 0, 0; model tokens 9+5, 9+5, 3, 3; env tokens 5, 5, 0, 0
    assert m["agent/turns/mean"] == 1.5 and m["agent/turns/max"] == 2.0
    assert m["agent/tool_calls/mean"] == 0.5 and m["agent/tool_errors/mean"] == 0.0
    assert m["agent/model_tokens/mean"] == (14 + 14 + 3 + 3) / 4 and m["agent/env_tokens/mean"] == 2.5
    assert m["agent/truncated_frac"] == 0.0 and m["agent/env/acc"] == 0.5
    batch = samples_to_batch(samples, score_samples(None, TOK, samples), 0)
    assert int(batch["response_mask"].sum()) == 34  # model tokens only are trained
    # the reward sits on the last trained token
    last = [max(j for j, v in enumerate(row.tolist()) if v) for row in batch["response_mask"]]
    assert [float(batch["token_level_scores"][i, j]) for i, j in enumerate(last)] == [1.0, 1.0, 0.0, 0.0]


def test_the_environment_sees_the_turn_s_tool_calls_and_shapes_on_them() -> None:
    """call_credit: the answer turn earns call_credit x the share of the question the calc call
    repeated in place. By hand: "1 2 3 + 4 5 7" repeats 6 of the 7 words of "1 2 3 + 4 5 6"; the
    answer 5 8 0 (what the tool said) is wrong: reward 0 + 0.5 * 6 / 7."""
    script = {0: "calc 1 2 3 + 4 5 7", 1: "Answer: 5 8 0"}
    (s,) = run(lambda t, _: script[t], lambda: ToolArithmetic(ToolArithmeticParams(call_credit=0.5)))
    assert s.agent is not None
    assert s.agent["reward"] == pytest.approx(0.5 * 6 / 7) and s.agent["env_info"][
        "call_match"
    ] == pytest.approx(6 / 7)
    script = {0: "calc 1 2 3 + 4 5 6", 1: "Answer: 5 7 9"}
    (s,) = run(lambda t, _: script[t], lambda: ToolArithmetic(ToolArithmeticParams(call_credit=0.5)))
    assert s.agent is not None and s.agent["reward"] == pytest.approx(1.5)


def test_answer_credit_pays_for_repeating_the_result_of_a_call_that_repeated_the_question() -> None:
    """answer_credit: the answer turn also earns answer_credit x (the share of the calc result's
    digits it repeats in place) x (the call's share of the question). By hand, question 1 2 3 + 4 5 6
    (sum 579), answer_credit 1, call_credit 0:"""
    env = lambda: ToolArithmetic(ToolArithmeticParams(answer_credit=1.0))  # noqa: E731
    # the call repeats 6/7 words; the tool says 5 8 0; the answer "5 8 1" repeats 2 of its 3 digits
    (s,) = run(lambda t, _: {0: "calc 1 2 3 + 4 5 7", 1: "Answer: 5 8 1"}[t], env)
    assert s.agent is not None
    assert s.agent["reward"] == pytest.approx(6 / 7 * 2 / 3)
    assert s.agent["env_info"]["answer_match"] == pytest.approx(2 / 3)
    # a call unrelated to the question ("calc 7"): repeating its result earns nothing
    (s,) = run(lambda t, _: {0: "calc 7", 1: "Answer: 7"}[t], env)
    assert s.agent is not None and s.agent["reward"] == 0.0 and s.agent["env_info"]["answer_match"] == 1.0
    # no call: the digits of a guess earn nothing (only the exact sum: 1.0 + 0)
    (s,) = run(lambda t, _: {0: "5 7 0"}[t], env)
    assert s.agent is not None and s.agent["reward"] == 0.0
    (s,) = run(lambda t, _: {0: "5 7 9"}[t], env)
    assert s.agent is not None and s.agent["reward"] == 1.0
    # the right call and answer: 1 (exact) + 1 x 1 x 1
    (s,) = run(lambda t, _: {0: "calc 1 2 3 + 4 5 6", 1: "Answer: 5 7 9"}[t], env)
    assert s.agent is not None and s.agent["reward"] == pytest.approx(2.0)

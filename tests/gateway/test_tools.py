"""Tool calls through the gateway, deterministic: a scripted engine "samples" the calc call and then
the answer, in the plain protocol of the task's tiny word-level model (and the Hermes JSON form).

The agent is the shipped one (``rlzoo.tasks.calc_agent``), run as a command: the SDK gets the call
as an OpenAI ``tool_calls`` entry, the agent runs calc and sends a ``role: tool`` message, which the
gateway renders through the chat template as the delta after the model's stop token (mask 0); the
scorer then judges the final answer.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import pytest

from gateway.conftest import ScriptedCalls
from rlzoo.kernel.protocols import GenerationRequest, Sample, SamplingParams

pytest.importorskip("openai")

CALL = "calc 4 5 6 + 7 8 9"
ANSWER = "Answer: 4 5 6 + 7 8 9 = 1 2 4 5"
TOOL_REPLY = "4 5 6 + 7 8 9 = 1 2 4 5"


class Scripted(ScriptedCalls):
    """An engine that answers call k of an episode with ``script[k]`` (+ EOS)."""

    def __init__(self, tok: Any, eos: int, script: Sequence[str]) -> None:
        super().__init__()
        self.tok, self.eos, self.script = tok, eos, list(script)

    def ids(self, request: GenerationRequest, call: int) -> list[int]:
        return [*self.tok(self.script[call], add_special_tokens=False)["input_ids"], self.eos]


def _gateway(
    tok: Any, eos: int, script: Sequence[str], fmt: str, agent: Any, prompt: int = 16, response: int = 48
) -> tuple[Any, Scripted]:
    from rlzoo.agents.settings import MultiTurnSettings
    from rlzoo.gateway.rollout import GatewayRollout
    from rlzoo.gateway.settings import GatewaySettings

    eng = Scripted(tok, eos, script)
    gw = GatewayRollout(
        eng,  # type: ignore[arg-type]
        lambda: agent,
        tok,
        GatewaySettings(agent_timeout_s=60.0),
        MultiTurnSettings(max_turns=2, per_turn_max_tokens=16, tool_call_format=fmt),
        max_response_length=response,
        max_prompt_length=prompt,
        stop_ids=(eos,),
        agent_name="calc",
    )
    return gw, eng


def _calc_episode(tok: Any, agent: Any, make_env: Any = None) -> tuple[Sample, Scripted]:
    """One episode of ``456 + 789`` played by ``agent`` against the scripted call and answer."""
    gw, eng = _gateway(tok, int(tok.eos_token_id), [CALL, ANSWER], "plain", agent)
    gw.make_env = make_env
    try:
        sp = SamplingParams(n=1, max_new_tokens=48, seed=1)
        (s,) = gw.generate([GenerationRequest("p0", [0], sp, data={"extra_info": {"a": 456, "b": 789}})])
    finally:
        gw.shutdown()
    return s, eng


def test_the_calc_agent_command_calls_calc_through_the_plain_protocol() -> None:
    from rlzoo.gateway.command import CommandAgent
    from rlzoo.tasks._tools import build_tokenizer, score
    from rlzoo.tasks.tools import ToolArithmeticScorerParams

    tok = build_tokenizer()
    eos = int(tok.eos_token_id)
    s, eng = _calc_episode(tok, CommandAgent([sys.executable, "-m", "rlzoo.tasks.calc_agent"]))
    rec = s.agent
    assert rec["error"] is None, rec["error"]  # type: ignore[index]
    assert rec["turns"] == 2 and rec["tool_calls"] == 1 and rec["final_text"] == ANSWER  # type: ignore[index]
    assert rec["gateway"]["splits"] == {}  # type: ignore[index]
    call_ids = tok(CALL, add_special_tokens=False)["input_ids"]
    answer_ids = tok(ANSWER, add_special_tokens=False)["input_ids"]
    # [call, EOS] (mask 1), the template's rendering of calc's reply (mask 0), [answer, EOS] (mask 1)
    mask = s.loss_mask or []
    assert s.response_ids[: len(call_ids) + 1] == [*call_ids, eos]
    assert s.response_ids[-len(answer_ids) - 1 :] == [*answer_ids, eos]
    delta = s.response_ids[len(call_ids) + 1 : -len(answer_ids) - 1]
    assert mask == [1] * (len(call_ids) + 1) + [0] * len(delta) + [1] * (len(answer_ids) + 1)
    assert TOOL_REPLY in tok.decode(delta)  # the agent's calc result, through the template
    assert eng.seen[1].prompt_ids == [*s.prompt_ids, *s.response_ids[: -len(answer_ids) - 1]]
    assert s.rollout_log_probs == [-0.5 if m else 0.0 for m in mask]
    verdict = score(rec["final_text"], "1245", "rlzoo/tool_arithmetic", {}, ToolArithmeticScorerParams())  # type: ignore[index]
    assert verdict["score"] == 1.0  # type: ignore[index]


def test_hermes_tool_calls_come_back_as_openai_tool_calls(smollm2_tokenizer: Any) -> None:
    import openai

    from rlzoo.kernel.protocols import AgentResult

    tok = smollm2_tokenizer
    eos = int(tok.convert_tokens_to_ids("<|im_end|>"))
    got: dict[str, Any] = {}
    call = '<tool_call>{"name": "calc", "arguments": {"expression": "1+2"}}</tool_call>'

    class Agent:
        def run(self, client: Any, row: Any) -> AgentResult:
            from rlzoo.tasks.calc_agent import CALC

            api = openai.OpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
            msgs: list[Any] = [{"role": "user", "content": "1+2?"}]
            m = api.chat.completions.create(model=client.model, messages=msgs, tools=[CALC]).choices[0]  # type: ignore[list-item]
            got["first"] = m
            msgs += [m.message.model_dump(exclude_none=True)]
            msgs += [{"role": "tool", "tool_call_id": m.message.tool_calls[0].id, "content": "3"}]  # type: ignore[index]
            got["second"] = api.chat.completions.create(model=client.model, messages=msgs, tools=[CALC])  # type: ignore[list-item]
            return AgentResult(reward=1.0)

    gw, _ = _gateway(tok, eos, [call, "It is 3."], "hermes", Agent(), prompt=512, response=200)
    try:
        (s,) = gw.generate([GenerationRequest("p0", [0], SamplingParams(n=1, max_new_tokens=48), data={})])
    finally:
        gw.shutdown()
    assert s.agent["error"] is None, s.agent["error"]  # type: ignore[index]
    first = got["first"]
    assert first.finish_reason == "tool_calls" and first.message.content is None
    (tc,) = first.message.tool_calls
    assert tc.function.name == "calc" and tc.function.arguments == '{"expression": "1+2"}'
    assert got["second"].choices[0].message.content == "It is 3."
    assert s.agent["turns"] == 2 and s.agent["tool_calls"] == 1 and s.agent["gateway"]["splits"] == {}  # type: ignore[index]


def test_a_batch_of_episodes_connecting_at_once_is_served() -> None:
    """256 episodes open their connections at once (one new connection per call): none is reset
    (the server's accept queue holds them; the default of 5 did not)."""
    import http.client
    import json

    from rlzoo.kernel.protocols import AgentResult
    from rlzoo.tasks._tools import build_tokenizer

    class Raw:
        def run(self, client: Any, row: Any) -> AgentResult:
            host, rest = client.base_url[len("http://") :].split("/", 1)
            name, port = host.split(":")
            conn = http.client.HTTPConnection(name, int(port), timeout=60)
            body = {"model": client.model, "messages": [{"role": "user", "content": "1 2 3"}]}
            headers = {"Authorization": f"Bearer {client.api_key}", "Content-Type": "application/json"}
            conn.request("POST", f"/{rest}/chat/completions", json.dumps(body), headers)
            assert conn.getresponse().status == 200
            return AgentResult(reward=0.0)

    tok = build_tokenizer()
    eos = int(tok.eos_token_id)
    gw, _ = _gateway(tok, eos, ["1 2"], "plain", Raw())
    try:
        sp = SamplingParams(n=16, max_new_tokens=16, seed=1)
        out = gw.generate([GenerationRequest(f"p{i}", [0], sp, data={}) for i in range(16)])
    finally:
        gw.shutdown()
    assert len(out) == 256
    assert [s.agent["error"] for s in out if s.agent["error"]] == []  # type: ignore[index]


def test_an_environment_beside_the_agent_judges_the_episode_with_its_token_rewards() -> None:
    """quickstart_gateway's reward: the shipped Python agent plays, the ``tool_arithmetic`` environment
    (quickstart_tools' dense shaping) judges; its per-token rewards land on the tokens of each call."""
    from functools import partial

    from rlzoo.tasks._agents import make_calc_agent
    from rlzoo.tasks._tools import build_tokenizer, make_tool_arithmetic
    from rlzoo.tasks.agents import CalcAgentParams
    from rlzoo.tasks.tools import ToolArithmeticParams

    env = ToolArithmeticParams(
        with_tool=True,
        spaced_digits=True,
        echo=True,
        blanks=True,
        call_credit=1.0,
        answer_credit=1.0,
        dense=True,
    )
    agent = make_calc_agent(CalcAgentParams())
    s, _ = _calc_episode(build_tokenizer(), agent, partial(make_tool_arithmetic, env))
    rec = s.agent
    assert rec["error"] is None, rec["error"]  # type: ignore[index]
    n_call = len(CALL.split()) + 1  # 8 words (one token each) + EOS
    n_answer = len(ANSWER.split()) + 1  # 13 words + EOS
    start = len(s.response_ids) - n_answer  # the answer's first token, after calc's reply (mask 0)
    # every word repeated in place: credit / (words + 1) on each word and on the stop token
    want = [[j, 1.0 / 9] for j in range(n_call)] + [[start + j, 1.0 / 14] for j in range(n_answer)]
    got = rec["token_rewards"]  # type: ignore[index]
    assert [p for p, _ in got] == [p for p, _ in want]
    assert [r for _, r in got] == pytest.approx([r for _, r in want])
    assert all((s.loss_mask or [])[p] == 1 for p, _ in got)  # only sampled tokens carry them
    # the exact sum (1.0) plus the shaping (1.0 for the call, 1.0 for the answer)
    assert rec["reward"] == pytest.approx(3.0)  # type: ignore[index]
    assert rec["env_info"] == {"acc": 1.0, "call_match": 1.0, "answer_match": 1.0}  # type: ignore[index]


def test_a_judging_environment_with_token_rewards_that_do_not_fit_fails_the_episode_loudly() -> None:
    from rlzoo.kernel.protocols import EnvStep
    from rlzoo.tasks._agents import make_calc_agent
    from rlzoo.tasks._tools import build_tokenizer
    from rlzoo.tasks.agents import CalcAgentParams

    class OneRewardTooFew:
        def reset(self, row: Any) -> EnvStep:
            return EnvStep(messages=[{"role": "user", "content": "q"}])

        def step(self, turn: Any) -> EnvStep:  # two calls were made: one list for the first only
            return EnvStep(
                messages=[], reward=1.0, done=True, token_rewards=[[0.0] * len(turn.turn_tokens[0])]
            )

        def tools(self) -> list[Any]:
            return []

    s, _ = _calc_episode(build_tokenizer(), make_calc_agent(CalcAgentParams()), OneRewardTooFew)
    rec = s.agent
    assert "token_rewards that must hold one list per turn" in (rec["error"] or "")  # type: ignore[index]
    assert rec["failure"]["part"] == "environment"  # type: ignore[index]
    assert rec["token_rewards"] == []  # type: ignore[index]

"""``quickstart_gateway``'s SFT stage trains the very ids the gateway feeds and records for the agent.

The stage trains on the ``tool_arithmetic`` environment's own solutions, rendered by the sft runner
(:func:`rlzoo.sources.demos.render`, the chat template with the environment's tools). The GRPO stage
after it is played by the shipped agent (``rlzoo.tasks.calc_agent``, the OpenAI SDK in process)
through the gateway. Here an engine "samples" each demonstration's assistant turns, id for id, for
the agent: the gateway's episode must then be the demonstration itself -- the same prompt ids (the
agent's question through the template), the same sampled ids, the same ids of calc's reply between
them (the agent's own calc, sent back as ``role: tool``) and the same loss mask. With the tool and
without it (``rollout.agent.tool=false rollout.environment.with_tool=false``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from agents.helpers import mask_runs

import rlzoo
from gateway.conftest import ScriptedCalls
from rlzoo.kernel.protocols import GenerationRequest, SamplingParams

pytest.importorskip("openai")

ROW = {
    "extra_info": {"split": "train", "index": 0, "a": 456, "b": 789},
    "data_source": "rlzoo/tool_arithmetic",
}
NO_TOOL = ["rollout.agent.tool=false", "rollout.environment.with_tool=false"]


class Turns(ScriptedCalls):
    """An engine whose call k samples ``turns[k]`` (ids, the stop token included)."""

    def __init__(self, turns: Sequence[list[int]]) -> None:
        super().__init__()
        self.turns = list(turns)

    def ids(self, request: GenerationRequest, call: int) -> list[int]:
        return self.turns[call]


@pytest.mark.parametrize("overrides", [[], NO_TOOL], ids=["tool", "no_tool"])
def test_the_sft_stage_trains_what_the_gateway_renders_for_the_agent(overrides: list[str]) -> None:
    from rlzoo.agents.chat import ChatTemplate
    from rlzoo.gateway.rollout import GatewayRollout
    from rlzoo.recipe.stages import stage_config
    from rlzoo.sources.demos import render
    from rlzoo.tasks._tools import build_tokenizer

    cfg = rlzoo.build_run("quickstart_gateway", overrides).config
    sft, grpo = (stage_config(cfg, k, rlzoo.get_plugin_manager()) for k in (0, 1))
    assert sft.runner.name == "sft" and sft.rollout.agent is None  # the environment writes the demos
    assert grpo.runner.name == "sync" and grpo.rollout.agent.name == "calc_agent"
    assert sft.rollout.environment.params == grpo.rollout.environment.params  # the same task
    tok = build_tokenizer()
    eos = int(tok.eos_token_id)

    # the demonstration as the sft runner lays it out (rlzoo.sources.sft: the environment's tools)
    env = sft.rollout.environment.fn(sft.rollout.environment.params)
    messages = env.solve(dict(ROW))
    template = ChatTemplate(tok, list(env.tools()), (eos,), {})
    prompt, response, mask = render(template, messages)
    turns = [response[a:b] for a, b in mask_runs(mask)]
    assert len(turns) == (2 if grpo.rollout.environment.params.with_tool else 1)

    # the same conversation played by the recipe's agent through the gateway
    engine = Turns(turns)
    agent = grpo.rollout.agent
    gw = GatewayRollout(
        engine,  # type: ignore[arg-type]
        lambda: agent.fn(agent.params),
        tok,
        grpo.rollout.gateway,
        grpo.rollout.multi_turn,
        max_response_length=grpo.data.max_response_length,
        max_prompt_length=grpo.data.max_prompt_length,
        stop_ids=(eos,),
        agent_name=agent.name,
    )
    try:
        sp = SamplingParams(n=1, max_new_tokens=grpo.data.max_response_length, seed=1)
        (s,) = gw.generate([GenerationRequest("p0", [eos], sp, data=dict(ROW))])
    finally:
        gw.shutdown()
    assert s.agent["error"] is None, s.agent["error"]  # type: ignore[index]
    assert s.agent["gateway"]["splits"] == {}  # type: ignore[index]  # one trajectory
    assert s.agent["turns"] == len(turns)  # type: ignore[index]
    assert s.prompt_ids == prompt  # the agent's question, rendered as the demonstration's
    assert s.response_ids == response  # the turns, and calc's reply between them
    assert s.loss_mask == mask  # trained: the assistant turns and their stop tokens only
    # each call was fed the demonstration up to the turn it samples (calc's reply included)
    assert [list(r.prompt_ids) for r in engine.seen] == [[*prompt, *response[:a]] for a, _ in mask_runs(mask)]

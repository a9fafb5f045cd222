"""The ``smol_calc_agent`` agent and the ``smollm2_gateway`` recipe: the script's calculator by hand,
one episode through the gateway with SmolLM2's real tokenizer and a scripted engine (the agent's
OpenAI messages render to the native ``smollm2_calc`` prompt, the call and the tool's reply extend
it), the recipe's scorer on an echoed expression, and the recipe for one step on a tiny GGUF
(``docs/agents.md`` reports the real model's curve)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from agents.conftest import smollm2_tokenizer  # noqa: F401  (the fixture, shared)

import rlzoo
from rlzoo.kernel.protocols import GenerationRequest, SamplingParams
from rlzoo.report.metrics import read_metrics
from rlzoo.tasks.smol_calc_agent import calc

ROW = {"extra_info": {"a": 27, "op": "*", "b": 82}}


def test_calc_evaluates_integer_arithmetic_and_refuses_the_rest() -> None:
    # worked out by hand: 27 * 82 = 2160 + 54; (10 - 3) * 4 = 28
    assert calc("27 * 82") == "2214"
    assert calc("(10 - 3) * 4") == "28"
    assert calc("12 - 34") == "-22"
    assert calc("2 ** 99").startswith("error")  # no powers (huge numbers)
    assert calc("__import__('os')").startswith("error")
    assert calc("27 *").startswith("error")
    assert calc("").startswith("error")


@pytest.mark.parametrize("form", ["python", "command"])
def test_an_episode_through_the_gateway_is_the_native_prompt_extended(
    smollm2_tokenizer: Any,  # noqa: F811
    form: str,
) -> None:
    """The agent's few-shot OpenAI messages (an assistant ``tool_calls`` entry, a ``role: tool``
    reply) render, through the gateway and SmolLM2's template, to the ids of the native task's first
    observation; the model's ``calc`` reply becomes an OpenAI tool call, the agent's result goes back
    as the template's tool turn, and the answer ends the episode. In the run's process (the part)
    and as a command (the same script, ``python -m rlzoo.tasks.smol_calc_agent``)."""
    pytest.importorskip("openai")
    from gateway.test_tools import _gateway

    from rlzoo.gateway.command import CommandAgent
    from rlzoo.tasks._smollm2_calc import make_agent, messages
    from rlzoo.tasks.smollm2_calc import SmolCalcAgentParams

    tok = smollm2_tokenizer
    eos = int(tok.convert_tokens_to_ids("<|im_end|>"))
    if form == "python":
        agent: Any = make_agent(SmolCalcAgentParams())
    else:
        agent = CommandAgent([sys.executable, "-m", "rlzoo.tasks.smol_calc_agent"])
    gw, eng = _gateway(tok, eos, ["calc 27 * 82", "2214"], "plain", agent, prompt=512, response=64)
    try:
        sp = SamplingParams(n=1, max_new_tokens=64, seed=1)
        (s,) = gw.generate([GenerationRequest("p0", [0], sp, data=ROW)])
    finally:
        gw.shutdown()
    rec = s.agent
    assert rec["error"] is None, rec["error"]  # type: ignore[index]
    assert rec["turns"] == 2 and rec["tool_calls"] == 1 and rec["final_text"] == "2214"  # type: ignore[index]
    assert rec["gateway"]["splits"] == {}  # type: ignore[index]  # one exact trajectory
    assert rec["env_info"] == {"calls": 1.0, "replies": 2.0, "called": 1.0}  # type: ignore[index]

    def render(conversation: list[Any]) -> list[int]:
        text = tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        return list(tok(text, add_special_tokens=False)["input_ids"])

    native = messages(27, "*", 82)  # the smollm2_calc environment's first observation
    assert eng.seen[0].prompt_ids == render(native)
    called = [*native, {"role": "assistant", "content": "calc 27 * 82"}, {"role": "tool", "content": "2214"}]
    assert eng.seen[1].prompt_ids == render(called)  # the agent ran calc: 2214 came back as the tool turn
    assert s.prompt_ids == render(native)


def test_the_scorer_reads_the_number_not_an_echoed_expression() -> None:
    """The untrained model's greedy reply repeats the question's expression ("71 * 25"); math-verify
    reads that as the product, so the recipe's scorer takes the last number instead."""
    from rlzoo.algorithms.functional.scoring import gsm8k
    from rlzoo.algorithms.scorers import GSM8KParams

    cfg = rlzoo.build_run("smollm2_gateway", []).config
    assert cfg.reward.scorer.name == "gsm8k"
    params = cfg.reward.scorer.params
    assert isinstance(params, GSM8KParams) and params.method == "flexible"

    def score(response: str) -> float:
        return float(gsm8k.compute_score(response, "1775", "rlzoo/smollm2_calc", {}, params)["score"])

    # 71 * 25 = 1775 by hand (1750 + 25)
    assert score("71 * 25") == 0.0
    assert score("1775") == 1.0
    assert score("71 * 25 = 1,775") == 1.0


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("smollm2_gateway")


def test_recipe_runs_one_step_on_a_tiny_gguf(data_dir: Path, tmp_path: Path, gguf_file: Path) -> None:
    pytest.importorskip("openai")
    run = rlzoo.build_run(
        "smollm2_gateway",
        [
            f"data.dir={data_dir / 'data'}",
            f"run.output_dir={tmp_path / 'run'}",
            f"+data.prepare.gguf_file={gguf_file}",
            "data.max_prompt_length=256",  # the tiny byte-level tokenizer spends more ids
            "data.prepare.train_size=16",
            "data.prepare.val_size=2",
            "data.train_batch_size=2",
            "rollout.n=2",
            "trainer.ppo_mini_batch_size=2",
            "trainer.total_steps=1",
            "rollout.multi_turn.per_turn_max_tokens=4",
            "run.progress=false",
            "run.loggers=[jsonl]",
        ],
    )
    run.train()
    recs = read_metrics(run.run_dir)
    assert [r["step"] for r in recs] == [0, 1]
    assert "val/mean" in recs[0] and "val/mean" in recs[-1]
    r = recs[-1]
    assert 0.0 <= r["critic/score/mean"] <= 1.0
    assert r["agent/turns/mean"] >= 1  # the agent's calls reached the gateway
    assert r["agent/env_failed"] == 0.0  # no episode failed

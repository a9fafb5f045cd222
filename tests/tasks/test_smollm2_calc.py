"""The ``smollm2_calc`` task: the environment against the conformance suite and by hand, the
dataset's held-out split, the first observation through SmolLM2's real chat template, and the
``smollm2_calc_agent`` recipe for two steps on sync and fully_async (a tiny GGUF stands in for
SmolLM2; ``benchmarks/smollm2_agent.py`` measures the real model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import rlzoo
from rlzoo.kernel.protocols import AgentTurn, ToolCall
from rlzoo.report.metrics import read_metrics
from rlzoo.tasks._smollm2_calc import SYSTEM, SmolLM2Calc, last_integer, prepare
from rlzoo.tasks.smollm2_calc import SmolLM2CalcDataParams, SmolLM2CalcEnvParams
from rlzoo.testing import EnvironmentConformance

ROW = {"extra_info": {"a": 27, "op": "*", "b": 82}}
ROW2 = {"extra_info": {"a": 10, "op": "+", "b": 5}}


class TestSmolLM2CalcConformance(EnvironmentConformance):
    name = "smollm2_calc"
    row = ROW
    # 27 * 82 = 2214, 10 + 5 = 15, worked out by hand; the first turn is the answer (done)
    episodes = ((ROW, ["2214"], 1.0), (ROW2, ["14"], 0.0), (ROW, ["27 * 82 = 2,214."], 1.0))


def _answer(env: SmolLM2Calc, text: str, calls: tuple[str, ...] = (), results: tuple[str, ...] = ()) -> Any:
    turn = AgentTurn(
        text=text,
        turn=len(calls),
        tool_calls=tuple(ToolCall(name=c, arguments={"expression": "27 * 82"}, raw="") for c in calls),
        tool_results=results,
    )
    return env.step(turn)


def test_first_observation_is_the_example_then_the_question() -> None:
    env = SmolLM2Calc(SmolLM2CalcEnvParams())
    msgs = env.reset(ROW).messages
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert msgs[0]["content"] == SYSTEM
    assert [m["content"] for m in msgs[1:]] == [
        "What is 12 * 34?",
        "calc 12 * 34",
        "408",
        "408",
        "What is 27 * 82?",
    ]
    bare = SmolLM2Calc(SmolLM2CalcEnvParams(example=False)).reset(ROW).messages
    assert [m["role"] for m in bare] == ["system", "user"]


def test_answer_scoring_and_info() -> None:
    env = SmolLM2Calc(SmolLM2CalcEnvParams())
    env.reset(ROW)
    out = _answer(env, "2214", ("calc",), ("2214",))
    assert (out.reward, out.done, out.info) == (1.0, True, {"acc": 1.0, "called": 1.0, "call_exact": 1.0})
    out = _answer(env, "The answer is 2215", ("calc",), ("2215",))  # a call of another expression
    assert (out.reward, out.info) == (0.0, {"acc": 0.0, "called": 1.0, "call_exact": 0.0})
    out = _answer(env, "no number")
    assert (out.reward, out.info) == (0.0, {"acc": 0.0, "called": 0.0, "call_exact": 0.0})
    assert (
        last_integer("27 * 82 = 2,214") == "2214" and last_integer("-5") == "-5" and last_integer("x") is None
    )


def test_reset_names_what_the_row_lacks() -> None:
    env = SmolLM2Calc(SmolLM2CalcEnvParams())
    with pytest.raises(ValueError, match=r"'a', 'op' and 'b'.*missing \['op'\]"):
        env.reset({"extra_info": {"a": 1, "b": 2}})


def test_params_refuse_bad_values() -> None:
    with pytest.raises(ValueError, match="op must be one of"):
        SmolLM2CalcDataParams(op="/")
    with pytest.raises(ValueError, match="hi must be greater than lo"):
        SmolLM2CalcDataParams(lo=50, hi=50)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory, gguf_file: Path) -> Path:
    out = tmp_path_factory.mktemp("smollm2_calc")
    return out


def test_dataset_holds_out_validation_pairs(data_dir: Path, gguf_file: Path) -> None:
    params = SmolLM2CalcDataParams(train_size=500, val_size=40, lo=10, hi=30, gguf_file=str(gguf_file))
    files = prepare(data_dir / "split", params)
    train = pq.read_table(files["train"]).to_pylist()
    val = pq.read_table(files["val"]).to_pylist()
    pair = lambda r: (r["extra_info"]["a"], r["extra_info"]["b"])  # noqa: E731
    assert len(train) == 500 and len(val) == 40 == len({pair(r) for r in val})
    assert not {pair(r) for r in train} & {pair(r) for r in val}
    assert (12, 34) not in {pair(r) for r in train + val}  # the worked example's pair
    r = val[0]
    a, b = pair(r)
    assert r["reward_model"]["ground_truth"] == str(a * b)
    assert (
        r["prompt"] == SmolLM2Calc(SmolLM2CalcEnvParams()).reset(r).messages
    )  # the loader's prompt is the env's


def test_first_observation_renders_with_smollm2s_template(smollm2_tokenizer: Any) -> None:
    msgs = SmolLM2Calc(SmolLM2CalcEnvParams()).reset(ROW).messages
    text = smollm2_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n408<|im_end|>\n" in text
    assert text.endswith("<|im_start|>user\nWhat is 27 * 82?<|im_end|>\n<|im_start|>assistant\n")
    # the recipe's max_prompt_length (160) holds the prompt
    assert len(smollm2_tokenizer.apply_chat_template(msgs, add_generation_prompt=True)) <= 160


@pytest.mark.parametrize(
    "runner",
    [
        [],
        [
            "runner={name:fully_async,staleness_threshold:0.5,trigger_parameter_sync_step:1,"
            "require_batches:1,partial_rollout:true}",
            "algorithm.rollout_correction.name=token_is",
        ],
    ],
    ids=["sync", "fully_async"],
)
def test_recipe_runs_two_steps_on_a_tiny_gguf(
    runner: list[str], data_dir: Path, tmp_path: Path, gguf_file: Path
) -> None:
    gguf = gguf_file
    run = rlzoo.build_run(
        "smollm2_calc_agent",
        [
            f"data.dir={data_dir / 'data'}",
            f"run.output_dir={tmp_path / 'run'}",
            f"+data.prepare.gguf_file={gguf}",
            "data.max_prompt_length=256",  # the tiny byte-level tokenizer spends more ids
            "data.prepare.train_size=32",
            "data.prepare.val_size=4",
            "data.train_batch_size=2",
            "rollout.n=4",
            "trainer.ppo_mini_batch_size=2",
            "trainer.total_steps=2",
            "trainer.test_freq=-1",
            "rollout.multi_turn.per_turn_max_tokens=4",
            "run.progress=false",
            "run.loggers=[jsonl]",
            *runner,
        ],
    )
    run.train()
    recs = read_metrics(run.run_dir)
    assert [r["step"] for r in recs] == [0, 1, 2]
    assert "val/mean" in recs[0] and "val/mean" in recs[-1]
    for r in recs[1:]:
        assert 0.0 <= r["critic/score/mean"] <= 1.0
        # the random tiny model's turns run out of tokens (no answer for the environment to read)
        assert r["agent/turns/mean"] >= 1 and r["agent/truncated_frac"] > 0


def test_validate_refuses_the_recipe_without_the_calc_tool() -> None:
    """The prompt teaches calc turns: without the tool every one would be scored wrong, silently.
    Checked at validate time (the environment's own rule, which every selected part now gets)."""
    from rlzoo.kernel.errors import ConfigError

    rlzoo.build_run("smollm2_calc_agent")  # as shipped: valid
    with pytest.raises(ConfigError, match=r"rollout.tools does not offer; add rollout.tools: \[calc\]"):
        rlzoo.build_run("smollm2_calc_agent", ["rollout.tools=[]"])

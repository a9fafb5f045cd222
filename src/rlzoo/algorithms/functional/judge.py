"""The ``judge`` reward manager: a language model served by a rollout backend judges each response.

Each sample becomes one judge prompt (the params' template, filled in and wrapped in the judge's
chat template); the prompts go to the rollout backend in batches of ``batch_size`` with greedy
sampling by default; the judge's output is decoded and the last match of ``score_pattern`` is the
score. An output without a (valid) score is a failed sample, counted in ``failed_outputs``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rlzoo.kernel.errors import RlzooError
from rlzoo.kernel.protocols import GenerationRequest, RewardItem, RewardResult, RolloutBackend, SamplingParams
from rlzoo.kernel.settings import RolloutSpec

from ..judge import JudgeParams
from .reward import BoundScorerFn, failed_result

log = logging.getLogger(__name__)


class JudgeManager:
    """``manager(items) -> [RewardResult]``: the judge's parsed score for each item.

    ``engine`` and ``tokenizer`` may be given (a test's stub, an engine the caller already holds);
    otherwise they load on the first call: the tokenizer with transformers, the engine from the
    rollout backend registered as ``params.backend``.
    """

    def __init__(
        self,
        params: JudgeParams,
        scorer: BoundScorerFn | None = None,
        *,
        engine: Any = None,
        tokenizer: Any = None,
    ) -> None:
        self.pattern = re.compile(params.score_pattern)  # checked by JudgeParams
        self.params = params
        self.engine: Any = engine
        self.tokenizer: Any = tokenizer
        self.failed_outputs = 0  # judge outputs without a valid score, over every call
        self.calls = 0  # calls of the rollout backend

    # -- loading ------------------------------------------------------------------------------
    def _load(self) -> None:
        p = self.params
        if self.tokenizer is None:
            from rlzoo.data.tokenizer import load_tokenizer

            self.tokenizer = load_tokenizer(
                p.tokenizer_path or p.model, trust_remote_code=p.trust_remote_code
            )
        if p.chat and not getattr(self.tokenizer, "chat_template", None):
            raise RlzooError(
                f"judge {p.model}: its tokenizer has no chat template; set chat: false to send the "
                "template's text as it is"
            )
        if self.engine is None:
            self.engine = self._build_engine()

    def _build_engine(self) -> RolloutBackend:
        import torch

        from rlzoo.kernel.plugins import get_plugin_manager

        p = self.params
        comp = get_plugin_manager().get("rollout_backend", p.backend, key="reward.manager.backend")
        defaults = comp.default_params()
        try:
            backend_params = replace(defaults, **p.backend_params) if defaults is not None else None
        except TypeError as e:
            raise RlzooError(f"judge backend_params for rollout backend {p.backend!r}: {e}") from None
        device = p.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        tok = self.tokenizer
        eos = (int(tok.eos_token_id),) if tok.eos_token_id is not None else ()
        pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
        spec = RolloutSpec(
            model_path=p.model,
            tokenizer_path=p.tokenizer_path or p.model,
            seed=p.seed,
            dtype=p.dtype,
            device=device,
            trust_remote_code=p.trust_remote_code,
            max_prompt_length=p.max_prompt_length,
            max_response_length=p.max_new_tokens,
            eos_token_ids=eos,
            pad_token_id=int(pad),
        )
        engine: RolloutBackend = comp.load()(backend_params, spec)
        return engine

    # -- prompts and scores -------------------------------------------------------------------
    def render(self, item: RewardItem) -> str:
        """The judge prompt of one item (the template filled in, in a user turn when ``chat``)."""
        text = self.params.template.format(
            prompt=item.prompt,
            response=item.response,
            ground_truth="" if item.ground_truth is None else str(item.ground_truth),
            data_source=item.data_source,
        )
        if not self.params.chat:
            return text
        rendered: str = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return rendered

    def parse(self, output: str) -> float | str:
        """The score in one judge output, or why there is none."""
        matches = list(self.pattern.finditer(output))
        if not matches:
            return f"no score in the judge's output (pattern {self.params.score_pattern!r})"
        raw = matches[-1].group(1)
        try:
            score = float(raw)
        except (TypeError, ValueError):
            return f"the judge's score {raw!r} is not a number"
        p = self.params
        if score != score or score in (float("inf"), float("-inf")):
            return f"the judge's score {raw!r} is not finite"
        if (p.min_score is not None and score < p.min_score) or (
            p.max_score is not None and score > p.max_score
        ):
            return f"the judge's score {score} is outside [{p.min_score}, {p.max_score}]"
        return score

    def __call__(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        if not items:
            return []
        if self.tokenizer is None or self.engine is None:
            self._load()
        p = self.params
        sampling = SamplingParams(
            n=1,
            temperature=p.temperature if p.temperature > 0 else 1.0,
            greedy=p.temperature == 0,
            max_new_tokens=p.max_new_tokens,
            seed=p.seed,
        )
        results: list[RewardResult | None] = [None] * len(items)
        requests: list[tuple[int, GenerationRequest]] = []
        for k, item in enumerate(items):
            ids = self.tokenizer(self.render(item), add_special_tokens=False)["input_ids"]
            if not ids:
                results[k] = failed_result("the judge prompt is empty", p.failure_reward)
                continue
            if len(ids) > p.max_prompt_length:
                results[k] = failed_result(
                    f"the judge prompt has {len(ids)} tokens, more than max_prompt_length={p.max_prompt_length}",
                    p.failure_reward,
                )
                continue
            requests.append(
                (k, GenerationRequest(request_id=f"judge-{k}", prompt_ids=list(ids), sampling=sampling))
            )
        failed = 0
        for start in range(0, len(requests), p.batch_size):
            batch = requests[start : start + p.batch_size]
            samples = self.engine.generate([r for _, r in batch])
            self.calls += 1
            by_id = {s.request_id: s for s in samples}
            for k, req in batch:
                sample = by_id.get(req.request_id)
                if sample is None:
                    results[k] = failed_result(
                        "the judge's rollout backend returned no output", p.failure_reward
                    )
                    failed += 1
                    continue
                output = self.tokenizer.decode(sample.response_ids, skip_special_tokens=True)
                verdict = self.parse(output)
                if isinstance(verdict, str):
                    r = failed_result(verdict, p.failure_reward)
                    failed += 1
                else:
                    r = RewardResult(reward=verdict, score=verdict)
                r.info["judge_output"] = output
                results[k] = r
        self.failed_outputs += failed
        if failed:
            log.warning(
                "judge: %d of %d outputs had no valid score (%d over the run); they get failure_reward=%s",
                failed,
                len(requests),
                self.failed_outputs,
                p.failure_reward,
            )
        return [r for r in results if r is not None]

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()

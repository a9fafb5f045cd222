"""A generative judge as a reward manager (``judge``): params and registration.

Import-light: the manager lives in :mod:`rlzoo.algorithms.functional.judge`; the tokenizer and the
rollout backend that serves the judge load when it first scores. See ``docs/components/judge.md``.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlzoo import hookimpl, param
from rlzoo.kernel.params import MAX_SEED

if TYPE_CHECKING:
    from rlzoo.kernel.registry import PartFactory, Registrar

#: the fields a judge template may name
TEMPLATE_FIELDS = ("prompt", "response", "ground_truth", "data_source")

DEFAULT_TEMPLATE = (
    "Rate the response to the question from 0 to 10.\n"
    "Question: {prompt}\nReference answer: {ground_truth}\nResponse: {response}\n"
    "Reply with 'Score: N'."
)


@dataclass(frozen=True)
class JudgeParams:
    """Ask a language model served by a rollout backend to judge each response, and parse its score.

    Each sample's judge prompt is ``template`` with ``{prompt}``, ``{response}``, ``{ground_truth}``
    and ``{data_source}`` filled in (``{{`` / ``}}`` for literal braces), wrapped as one user turn of
    the judge's chat template when ``chat`` is true. The judge answers greedily by default
    (``temperature: 0``), ``batch_size`` prompts per call of the rollout backend. The score is the
    first group of the **last** match of ``score_pattern`` in the judge's output, as a float; an
    output with no match, or a score outside ``[min_score, max_score]``, fails that sample
    (``failure_reward``, ``failed``; the manager counts them). The recipe's scorer is not called.
    """

    model: str = param(help="HF path or name of the judge (a causal LM)")
    tokenizer_path: str | None = param(None, help="its tokenizer (default: model)")
    backend: str = param("native", help="rollout backend that serves the judge ('native', 'vllm')")
    backend_params: dict[str, Any] = param({}, help="params of that rollout backend (its own keys)")
    template: str = param(DEFAULT_TEMPLATE, help="the judge prompt; fields: " + ", ".join(TEMPLATE_FIELDS))
    chat: bool = param(True, help="wrap the prompt as a user turn of the judge's chat template")
    score_pattern: str = param(
        r"(?i)score\s*[:=]?\s*(-?\d+(?:\.\d+)?)",
        help="regular expression whose first group is the score; the last match counts",
    )
    min_score: float | None = param(None, help="lowest valid score (a lower one fails the sample)")
    max_score: float | None = param(None, help="highest valid score (a higher one fails the sample)")
    max_new_tokens: int = param(64, ge=1, help="longest judge output, in tokens")
    max_prompt_length: int = param(
        2048, ge=1, help="longest judge prompt, in tokens (longer: the sample fails)"
    )
    temperature: float = param(0.0, ge=0.0, help="0: greedy (the default); > 0: sampled")
    seed: int = param(0, ge=0, le=MAX_SEED, help="sampling seed (temperature > 0)")
    batch_size: int = param(16, ge=1, help="judge prompts per call of the rollout backend")
    dtype: str = param("float32", help="dtype the judge runs in")
    device: str = param("auto", help="'auto' (cuda when available), 'cpu', 'cuda' or 'cuda:N'")
    trust_remote_code: bool = param(False, help="passed to from_pretrained")
    failure_reward: float = param(0.0, help="reward of a sample whose judge output has no valid score")

    def __post_init__(self) -> None:  # checked by `rlzoo validate`, before any model loads
        check_template(self.template)
        try:
            groups = re.compile(self.score_pattern).groups
        except re.error as e:
            raise ValueError(f"score_pattern {self.score_pattern!r}: {e}") from None
        if groups < 1:
            raise ValueError(f"score_pattern {self.score_pattern!r} has no group: put the score in ( )")


def check_template(template: str) -> None:
    """Refuse a template naming a field the judge does not fill, or with unbalanced braces."""
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ValueError(f"template: {e} (write {{{{ and }}}} for literal braces)") from None
    bad = [n for n in names if n not in TEMPLATE_FIELDS]
    if bad:
        raise ValueError(
            f"template names {', '.join(repr(b) for b in bad)}; it may name "
            + ", ".join("{" + f + "}" for f in TEMPLATE_FIELDS)
        )


@hookimpl
def rlzoo_register_reward_managers(registry: Registrar[PartFactory]) -> None:
    registry.register("judge", "rlzoo.algorithms.functional.judge:JudgeManager", params=JudgeParams)

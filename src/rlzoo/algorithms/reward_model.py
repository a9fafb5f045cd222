"""A learned reward model as a reward manager (``reward_model``): params and registration.

Import-light: the manager lives in :mod:`rlzoo.algorithms.functional.reward_model`; torch and
transformers are imported when it first scores. See ``docs/components/reward_model.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rlzoo import hookimpl, param

if TYPE_CHECKING:
    from rlzoo.kernel.registry import PartFactory, Registrar

_MANAGER = "rlzoo.algorithms.functional.reward_model:RewardModelManager"


@dataclass(frozen=True)
class RewardModelParams:
    """Score each (prompt, response) with a sequence-classification reward model, batched.

    The model (``AutoModelForSequenceClassification`` with one label, e.g. Skywork-Reward,
    FsfairX-LLaMA3-RM) reads ``prompt + response + response_suffix`` as its tokenizer encodes it
    (the prompt as the policy's chat template rendered it) and its score head's output at the last
    real token is the sample's score, as verl's reward-model worker reads it. Batches of
    ``batch_size`` are left-padded with position ids that restart at each row's first real token,
    so a batched score equals the score of the sample alone. ``with_scorer`` decides what the
    recipe's rule-based scorer (``reward.scorer``) adds: ``off`` (not called; reward = score = the
    model's), ``metric`` (its verdict is ``score``, e.g. accuracy; reward = the model's) or ``add``
    (reward = the model's + the scorer's). The model's score is always in ``info["rm_score"]``.
    """

    path: str = param(help="HF path or name of the reward model (a sequence classifier with num_labels=1)")
    tokenizer_path: str | None = param(None, help="its tokenizer (default: path)")
    batch_size: int = param(8, ge=1, help="samples per forward")
    max_length: int | None = param(
        None, ge=1, help="longest input in tokens; longer ones are cut from the left (the scored end is kept)"
    )
    response_suffix: str = param(
        "", help="text appended after the response, e.g. the chat template's end-of-turn ('<|im_end|>')"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = param("float32", help="dtype the model runs in")
    device: str = param("auto", help="'auto' (cuda when available), 'cpu', 'cuda' or 'cuda:N'")
    trust_remote_code: bool = param(False, help="passed to from_pretrained")
    with_scorer: Literal["off", "metric", "add"] = param(
        "off",
        help="'off': reward model only; 'metric': reward.scorer's verdict is score; 'add': reward += it",
    )
    failure_reward: float = param(
        0.0, help="reward of a sample whose scorer failed (with_scorer metric / add)"
    )
    timeout: float | None = param(
        60.0, help="seconds one sample's scorer may take (as naive's); null: no limit"
    )


@hookimpl
def rlzoo_register_reward_managers(registry: Registrar[PartFactory]) -> None:
    registry.register("reward_model", _MANAGER, params=RewardModelParams)

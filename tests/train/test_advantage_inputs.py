"""The policy trainer gives each advantage the inputs its capabilities declare.

- ``needs_sum_pi_squared`` (optimal token baselines): old log-probs and ``sum_pi_squared`` from one
  ``compute_log_probs_and_sum_pi_squared`` forward, the rollout IS weights of the correction, and
  no skipped old-log-prob forward even when the update is exactly on-policy;
- ``needs_reward_components`` (gdpo): ``reward_components [B, K]`` from each sample's scorer info by
  ``reward_keys``; a key the scorer did not return fails the step naming it and what was returned.

Expected advantages come from the estimator called directly with inputs built here by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from run_fixtures import as_rollout
from transformers import AutoModelForCausalLM

from rlzoo.algorithms.functional import advantage as F
from rlzoo.backends.native.train import NativeTrainBackend
from rlzoo.backends.native.train_params import NativeTrainParams
from rlzoo.kernel.batch import Batch
from rlzoo.kernel.protocols import AdvantageInputs
from rlzoo.kernel.settings import MicroBatchSettings, TrainSpec
from rlzoo.models.tiny import tiny_qwen2_config
from rlzoo.recipe.config import load_config
from rlzoo.testing.backends import make_train_batch
from rlzoo.train.update import PolicyTrainer, trainer_setup
from rlzoo.train_kit.formulas import offpolicy_metrics

V = 64
ONE_MINI_BATCH = ("trainer.ppo_mini_batch_size=2", "trainer.ppo_epochs=1")  # 2 prompts x 4: exactly on-policy


def _backend(temperature: float = 1.0) -> NativeTrainBackend:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_qwen2_config(V)).float()
    spec = TrainSpec(model_path="", temperature=temperature, micro_batch=MicroBatchSettings(log_prob_size=3))
    return NativeTrainBackend.from_module(model, NativeTrainParams(device="cpu"), spec)


def _batch(be: NativeTrainBackend, infos: list[dict[str, Any]] | None = None) -> Batch:
    g = torch.Generator().manual_seed(1)
    prompts = [
        [int(t) for t in torch.randint(2, V, (int(n),), generator=g)] for n in (3, 1, 5, 2, 4, 2, 3, 1)
    ]
    responses = [
        [int(t) for t in torch.randint(2, V, (int(n),), generator=g)] for n in (4, 2, 6, 1, 3, 5, 2, 6)
    ]
    b = make_train_batch(prompts, responses, seed=1)
    mask = b["response_mask"]
    lp, _ = be.compute_log_probs(b)
    scores = torch.zeros_like(mask)
    scores[torch.arange(8), mask.sum(-1).long() - 1] = torch.tensor([1.0, 0, 0, 1, 1, 1, 0, 0])
    out = as_rollout(b, lp, scores, g, {"uid": [f"r{i // 4}/{i % 4}" for i in range(8)]})
    if infos is not None:
        out["reward_info"] = infos
        out["failed"] = [bool(i.get("error")) for i in infos]
    return out


def _trainer(tmp_path: Path, be: Any, *extra: str) -> PolicyTrainer:
    cfg = load_config("quickstart", [f"data.dir={tmp_path}", "rollout.n=4", *ONE_MINI_BATCH, *extra])
    return trainer_setup(cfg).build(be, offpolicy_metrics=offpolicy_metrics)


def _null_timer(name: str) -> Any:
    import contextlib

    return contextlib.nullcontext()


def _prepared(
    tmp_path: Path, *extra: str, infos: list[dict[str, Any]] | None = None
) -> tuple[Any, Any, Batch]:
    """A stub backend, a trainer with the quickstart recipe + ``extra`` on it, and a batch it prepared."""
    be = _backend()
    tr = _trainer(tmp_path, be, *extra)
    batch = _batch(be, infos)
    tr.prepare(batch, _null_timer)
    return be, tr, batch


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_token_baselines_get_sum_pi_squared_from_the_old_log_prob_forward(tmp_path: Path, name: str) -> None:
    be = _backend(temperature=0.8)
    tr = _trainer(tmp_path, be, f"algorithm.advantage={name}")
    batch = _batch(be)
    assert not tr.reuses_log_probs(batch)  # the advantage reads them before the update
    tr.prepare(batch, _null_timer)
    old, sps = be.compute_log_probs_and_sum_pi_squared(batch)
    torch.testing.assert_close(batch["old_log_probs"], old, atol=0, rtol=0)
    torch.testing.assert_close(batch["sum_pi_squared"], sps, atol=0, rtol=0)
    want = getattr(F, name)(
        AdvantageInputs(
            batch["token_level_scores"],
            batch["response_mask"],
            group_ids=batch["group_ids"],
            old_log_probs=old,
            sum_pi_squared=sps,
        ),
        tr.setup.advantage.params,
    )
    torch.testing.assert_close(batch["advantages"], want.advantages)
    assert batch["advantages"].abs().sum() > 0


def test_token_baseline_gets_the_corrections_is_weights(tmp_path: Path) -> None:
    _, tr, batch = _prepared(
        tmp_path, "algorithm.advantage=optimal_token_baseline", "algorithm.rollout_correction=token_is"
    )
    weights = batch["rollout_is_weights"]
    assert not torch.allclose(weights, torch.ones_like(weights))
    base = {
        "group_ids": batch["group_ids"],
        "old_log_probs": batch["old_log_probs"],
        "sum_pi_squared": batch["sum_pi_squared"],
    }
    args = (batch["token_level_rewards"], batch["response_mask"])
    with_w = F.optimal_token_baseline(
        AdvantageInputs(*args, **base, rollout_is_weights=weights), tr.setup.advantage.params
    )
    without = F.optimal_token_baseline(AdvantageInputs(*args, **base), tr.setup.advantage.params)
    torch.testing.assert_close(batch["advantages"], with_w.advantages)
    assert not torch.allclose(with_w.advantages, without.advantages)


def test_bypass_keeps_rollout_log_probs_and_still_gets_sum_pi_squared(tmp_path: Path) -> None:
    be, _, batch = _prepared(
        tmp_path,
        "algorithm.advantage=optimal_token_baseline",
        "algorithm.rollout_correction=seq_is",
        "+algorithm.rollout_correction.mode=bypass",
    )
    torch.testing.assert_close(batch["old_log_probs"], batch["rollout_log_probs"], atol=0, rtol=0)
    torch.testing.assert_close(batch["sum_pi_squared"], be.compute_log_probs_and_sum_pi_squared(batch)[1])


def test_a_backend_without_sum_pi_squared_is_refused(tmp_path: Path) -> None:
    class NoSumPiSquared:
        version = 0

        def compute_log_probs(self, batch: Batch, **kw: Any) -> Any:
            raise AssertionError("not reached")

    with pytest.raises(TypeError, match=r"needs sum_pi_squared.*NoSumPiSquared"):
        _trainer(tmp_path, NoSumPiSquared(), "algorithm.advantage=optimal_token_baseline")


INFOS = [
    {"score": s, "acc": s, "fmt": f, "pred": "7"}
    for s, f in zip([1.0, 0, 0, 1, 1, 1, 0, 0], [1.0, 1, 0, 0, 1, 0, 0.5, 1])
]


def test_gdpo_reads_reward_components_by_key(tmp_path: Path) -> None:
    _, tr, batch = _prepared(
        tmp_path,
        "algorithm.advantage=gdpo",
        "algorithm.advantage.reward_keys=[fmt,acc]",
        "algorithm.advantage.reward_weights=[0.5,1.0]",
        infos=INFOS,
    )
    assert tr.setup.reward_keys == ("fmt", "acc")
    comps = torch.tensor([[i["fmt"], i["acc"]] for i in INFOS])  # [B, 2]
    want = F.gdpo(
        AdvantageInputs(
            batch["token_level_scores"],
            batch["response_mask"],
            group_ids=batch["group_ids"],
            reward_components=comps,
        ),
        tr.setup.advantage.params,
    )
    torch.testing.assert_close(batch["advantages"], want.advantages)


def test_gdpo_fails_naming_a_key_the_scorer_did_not_return(tmp_path: Path) -> None:
    be = _backend()
    tr = _trainer(tmp_path, be, "algorithm.advantage=gdpo", "algorithm.advantage.reward_keys=[acc,format]")
    with pytest.raises(ValueError, match=r"reward key 'format'.*sample r0/0.*'acc': 1\.0.*'pred': '7'"):
        tr.prepare(_batch(be, INFOS), _null_timer)
    tr = _trainer(tmp_path, be, "algorithm.advantage=gdpo", "algorithm.advantage.reward_keys=[pred]")
    with pytest.raises(ValueError, match=r"reward key 'pred' of sample r0/0 is '7', not a number"):
        tr.prepare(_batch(be, INFOS), _null_timer)


def test_gdpo_failed_samples_get_zero_components(tmp_path: Path) -> None:
    be = _backend()
    infos = [dict(i) for i in INFOS]
    infos[2] = {"score": 0.0, "error": "TimeoutError"}  # a failed scorer call
    batch = _batch(be, infos)
    from rlzoo.train.rewards import reward_components

    comps = reward_components(batch, ("fmt",), "gdpo")
    assert comps.shape == (8, 1) and comps[2, 0] == 0.0 and comps[6, 0] == 0.5


def test_turn_grpo_gets_the_batchs_turn_ids(tmp_path: Path) -> None:
    """A multi-turn batch's ``turn_ids`` reach the advantage: here each response is declared two
    turns (its first token one, the rest the other), which its mask (one run) does not show."""
    be = _backend()
    tr = _trainer(tmp_path, be, "algorithm.advantage=turn_grpo", "algorithm.advantage.gamma=0.5")
    batch = _batch(be)
    mask = batch["response_mask"]
    first = mask.cumsum(-1) == 1  # [B, T] the first response token
    batch["turn_ids"] = torch.where(mask.bool(), torch.where(first, 0, 1), -1)
    tr.prepare(batch, _null_timer)
    args = (batch["token_level_rewards"], mask)
    want = F.turn_grpo(
        AdvantageInputs(*args, group_ids=batch["group_ids"], turn_ids=batch["turn_ids"]),
        tr.setup.advantage.params,
    )
    runs = F.turn_grpo(AdvantageInputs(*args, group_ids=batch["group_ids"]), tr.setup.advantage.params)
    torch.testing.assert_close(batch["advantages"], want.advantages)
    assert not torch.allclose(want.advantages, runs.advantages)

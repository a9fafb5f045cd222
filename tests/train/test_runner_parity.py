"""Behaviour parity: every runner honours the same sample filter, reward manager, KL-in-reward,
rollout correction and validation settings (they share one loop; only the batch source differs).

The fully-async runner used to filter on the raw reward whatever ``sample_filter.metric`` said; this
test failed for it before the one loop (groups with a constant ``acc`` but a varying reward were
trained on).
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from run_fixtures import build

import rlzoo
from rlzoo.backends.simulated import SimulatedTrainParams
from rlzoo.backends.simulated.backend import SimulatedTrainBackend
from rlzoo.kernel.plugins import PluginManager
from rlzoo.report.metrics import read_metrics
from rlzoo.testing.runs import SIMULATED_BACKENDS

MAX_LEN = 32  # data.max_response_length in SIMULATED_BACKENDS
BUFFER = 16  # DAPO overlong buffer
REF_OFFSET = 0.1  # the reference model's log-probs sit this far below the policy's: k1 KL = 0.1 per token
KL_COEF = 0.05


def scorer(
    response: str, ground_truth: Any, data_source: str, extra_info: Any, params: Any
) -> dict[str, float]:
    """``acc`` is constant within a group for half of the prompts (by their answer), varies with the
    response length for the others; ``score`` always varies with the length (so the reward does)."""
    words = response.split()
    constant = zlib.crc32(str(ground_truth).encode()) % 2 == 0
    acc = 1.0 if constant else float(len(words) % 2)
    return {"score": len(words) / 10.0, "acc": acc}


class Recorder(SimulatedTrainBackend):
    """The simulated trainer, recording what each update was given."""

    batches: list[dict[str, Any]] = []

    def compute_log_probs(self, batch: Any, *, model: str = "actor", with_entropy: bool = False) -> Any:
        lp, ent = super().compute_log_probs(batch, model=model, with_entropy=with_entropy)
        if model == "ref":
            return lp - REF_OFFSET, ent
        Recorder.batches.append(
            {
                "group_ids": batch["group_ids"].tolist(),
                "acc": list(batch["acc"]),
                "score": list(batch["score"]),
                "reward": batch["token_level_scores"].sum(-1).tolist(),
                "length": batch["response_mask"].sum(-1).tolist(),
            }
        )
        return lp, ent

    def update_policy(self, mini_batch: Any, objective: Any) -> dict[str, float]:
        assert "rollout_is_weights" in mini_batch, "the rollout correction's weights never reached the update"
        return super().update_policy(mini_batch, objective)


RUNNERS = {
    "sync": ["runner=sync"],
    "one_step_off": ["runner=one_step_off"],
    "fully_async": [
        "~runner",
        "+runner={name:fully_async,staleness_threshold:0.5,trigger_parameter_sync_step:1,partial_rollout:true}",
    ],
}

SHARED = [
    *SIMULATED_BACKENDS,
    "trainer.total_steps=4",
    "trainer.test_freq=2",
    "trainer.save_freq=-1",
    "trainer.ppo_mini_batch_size=8",
    "+algorithm.sample_filter={name:dynamic_sampling,metric:acc,max_num_gen_batches:6}",
    f"reward.manager={{name:dapo,overlong_buffer_len:{BUFFER},max_response_length:{MAX_LEN},penalty_factor:1.0}}",
    "algorithm.use_kl_in_reward=true",
    "algorithm.kl_penalty=k1",
    "algorithm.kl_ctrl.type=fixed",
    f"algorithm.kl_ctrl.kl_coef={KL_COEF}",
    "+algorithm.rollout_correction={name:token_is,threshold:2.0}",
]


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_every_runner_honours_the_same_settings(
    runner: str, pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    Recorder.batches = []
    trainer = rlzoo.part(Recorder, params=SimulatedTrainParams(update_s_per_token=2e-6), capabilities={})
    summary = build(
        pm,
        "quickstart",
        quickstart_dir,
        tmp_path / "run",
        *SHARED,
        *RUNNERS[runner],
        scorer=scorer,
        train_backend=trainer,
    ).train()
    recs = [r for r in read_metrics(Path(summary["run_dir"])) if r["step"] > 0]
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    assert len(Recorder.batches) == 4

    trained_groups = 0
    for b in Recorder.batches:
        groups: dict[int, list[int]] = defaultdict(list)
        for i, g in enumerate(b["group_ids"]):
            groups[g].append(i)
        for rows in groups.values():
            trained_groups += 1
            # the filter judged `acc`: no trained group has a constant acc (its advantage would be 0)
            assert len({b["acc"][i] for i in rows}) > 1, f"{runner}: a group with constant acc was trained"
        for i in range(len(b["score"])):
            # the DAPO manager's reward: score + min(-(len - (M - L)) / L * p, 0) (DAPO paper, eq. 13)
            penalty = min(-(b["length"][i] - (MAX_LEN - BUFFER)) / BUFFER * 1.0, 0.0)
            assert b["reward"][i] == pytest.approx(b["score"][i] + penalty, abs=1e-5)
    assert trained_groups > 0
    for r in recs:
        # KL in the reward with the fixed coefficient; per-sequence mean KL = k1 = REF_OFFSET
        assert r["actor/reward_kl_penalty_coeff"] == pytest.approx(KL_COEF)
        assert r["actor/reward_kl_penalty"] == pytest.approx(REF_OFFSET, abs=1e-5)
        # rewards after the penalty: scores - coef * KL summed over the response tokens
        assert "critic/rewards/mean" in r
        # the correction part ran (its own metrics, not only the diagnostics)
        assert "rollout_corr/masked_fraction" in r
    # validation every 2 steps and at the end
    assert [r["step"] for r in recs if "val/mean" in r] == [2, 4]
    # groups were filtered away on acc (half the prompts have a constant acc)
    dropped = sum(
        r.get("rollout/dropped_groups", 0.0) + r.get("rollouter/filtered_groups", 0.0) for r in recs
    )
    assert dropped > 0, runner


def test_kl_penalty_lowers_the_rewards_by_coef_times_kl(tmp_path: Path) -> None:
    """The hand value of the per-token penalty the parity test relies on (verl apply_kl_penalty)."""
    from rlzoo.train_kit.formulas import apply_kl_penalty

    scores = torch.tensor([[0.0, 0.0, 1.0]])  # [1, 3]
    kl = torch.full((1, 3), REF_OFFSET)  # [1, 3]
    mask = torch.ones(1, 3)  # [1, 3]
    rewards, m = apply_kl_penalty(scores, kl, mask, KL_COEF)
    # 1.0 - 0.05 * 0.1 = 0.995 at the last token, -0.005 elsewhere
    assert rewards[0].tolist() == pytest.approx([-0.005, -0.005, 0.995])
    assert m["reward_kl_penalty"] == pytest.approx(0.1)

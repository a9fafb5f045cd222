"""``turn_grpo``: per-turn rewards reach the advantage (numbers worked out from the formula by hand),
and a multi-turn trajectory's per-turn rewards sit on the last token of the turns they reward."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from agents.helpers import ScriptedBackend, requests
from rlzoo.agents.rollout import MultiTurnRollout
from rlzoo.agents.settings import MultiTurnSettings
from rlzoo.algorithms.advantage import GRPOParams, TurnGRPOParams
from rlzoo.algorithms.functional.advantage import grpo, turn_grpo
from rlzoo.kernel.protocols import AdvantageInputs, AgentTurn, EnvStep, RewardResult, Sample
from rlzoo.models.tiny import build_tokenizer
from rlzoo.tasks._tools import CHAT_TEMPLATE, WORDS
from rlzoo.testing import AdvantageConformance
from rlzoo.train.batching import samples_to_batch
from rlzoo.train.rewards import score_samples


class TestTurnGRPO(AdvantageConformance):
    name = "turn_grpo"
    masked_rewards_ignored = True


# trajectory 0: turns {0,1} {3} {6,7} rewarded 1, 0, 2; trajectory 1: turns {0} {2,3} rewarded 0, 1
# (same prompt); trajectory 2: one turn, reward 3, alone in its group
MASK = torch.tensor(
    [[1, 1, 0, 1, 0, 0, 1, 1, 0, 0], [1, 0, 1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0, 0, 0]]
)
REWARDS = torch.zeros(3, 10)
REWARDS[0, 1], REWARDS[0, 7], REWARDS[1, 3], REWARDS[2, 2] = 1.0, 2.0, 1.0, 3.0
TURNS = torch.tensor(
    [[0, 0, -1, 1, -1, -1, 2, 2, -1, -1], [0, -1, 1, 1, -1, -1, -1, -1, -1, -1], [0, 0, 0] + [-1] * 7]
)
GROUPS = torch.tensor([7, 7, 9])


def _inputs(turn_ids: torch.Tensor | None, rewards: torch.Tensor = REWARDS) -> AdvantageInputs:
    return AdvantageInputs(rewards, MASK, group_ids=GROUPS, turn_ids=turn_ids)


@pytest.mark.parametrize("turn_ids", [TURNS, None], ids=["turn_ids", "mask_runs"])
def test_turn_returns_and_group_baseline_by_hand(turn_ids: torch.Tensor | None) -> None:
    # gamma 0.5: G(traj 0) = [1 + .5 * 1, 0 + .5 * 2, 2] = [1.5, 1, 2]; G(traj 1) = [0 + .5 * 1, 1]
    # group {0, 1}: mean of G_0 = 1.0, unbiased std = sqrt(.25 + .25) = sqrt(.5); traj 2 alone: 3 / 1
    out = turn_grpo(_inputs(turn_ids), TurnGRPOParams(gamma=0.5, epsilon=0.0))
    s = math.sqrt(0.5)
    a0, a1, a2 = (1.5 - 1) / s, (1 - 1) / s, (2 - 1) / s
    b0, b1 = (0.5 - 1) / s, (1 - 1) / s
    expected = torch.tensor(
        [[a0, a0, 0, a1, 0, 0, a2, a2, 0, 0], [b0, 0, b1, b1, 0, 0, 0, 0, 0, 0], [3, 3, 3] + [0] * 7]
    )
    torch.testing.assert_close(out.advantages, expected)
    returns = torch.tensor(
        [[1.5, 1.5, 0, 1, 0, 0, 2, 2, 0, 0], [0.5, 0, 1, 1, 0, 0, 0, 0, 0, 0], [3, 3, 3] + [0] * 7]
    )
    torch.testing.assert_close(out.returns, returns)
    # without the std: G - mean
    plain = turn_grpo(_inputs(turn_ids), TurnGRPOParams(gamma=0.5, norm_by_std=False)).advantages
    torch.testing.assert_close(plain[0, [0, 3, 6]], torch.tensor([0.5, 0.0, 1.0]))
    torch.testing.assert_close(plain[1, [0, 2]], torch.tensor([-0.5, 0.0]))


def test_turn_ids_beat_mask_runs() -> None:
    """A rollout correction may mask a token inside a turn: the batch's turn ids keep it one turn."""
    mask = MASK.clone()
    mask[0, 6] = mask[0, 0] = 0  # masked tokens of traj 0's turns 2 and 0 (its G_0 stays 1.5)
    turns = TURNS.clone()
    turns[1] = torch.tensor([0, -1, 0, 0, -1, -1, -1, -1, -1, -1])  # traj 1: one turn, two runs
    out = turn_grpo(AdvantageInputs(REWARDS, mask, GROUPS, turn_ids=turns), TurnGRPOParams(gamma=0.5))
    # traj 1 as one turn: G = 0 + 1 = 1 on all its tokens; traj 0 unchanged: G_0 1.5; mean 1.25
    s = math.sqrt(2 * 0.25**2)
    torch.testing.assert_close(
        out.advantages[1, [0, 2, 3]], torch.full((3,), (1 - 1.25) / s), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(out.advantages[0, 0], torch.tensor(0.0))  # masked


def test_outcome_reward_and_gamma_one_is_grpo() -> None:
    """One reward at the end, gamma 1: every turn's return is the trajectory's reward, so the
    advantages are GRPO's (the default estimator's) on every token."""
    g = torch.Generator().manual_seed(0)
    outcome = torch.zeros(3, 10)
    for i, last in enumerate((7, 3, 2)):
        outcome[i, last] = torch.randn((), generator=g)
    groups = torch.tensor([1, 1, 1])
    inputs = AdvantageInputs(outcome, MASK, group_ids=groups, turn_ids=TURNS)
    torch.testing.assert_close(
        turn_grpo(inputs, TurnGRPOParams()).advantages, grpo(inputs, GRPOParams()).advantages
    )


# ---------------------------------------------------------------------------------------------
# the rollout records where each reward belongs, the batch puts it there
# ---------------------------------------------------------------------------------------------
TOK = build_tokenizer((*WORDS, "yes", "no"), CHAT_TEMPLATE, extra_special=("<|tool|>",))
EOS = int(TOK.eos_token_id)


class Stepwise:
    """Three turns; turn k is rewarded k + 1 when it says 'yes'; the reset gives 0.5."""

    def reset(self, row: Any) -> EnvStep:
        return EnvStep(messages=[{"role": "user", "content": "1"}], reward=0.5)

    def step(self, turn: AgentTurn) -> EnvStep:
        reward = float(turn.turn + 1) if turn.text.strip() == "yes" else 0.0
        return EnvStep(messages=[{"role": "user", "content": "2"}], reward=reward, done=turn.turn == 2)

    def tools(self) -> list[Any]:
        return []


def test_per_turn_rewards_sit_on_their_turns_last_token() -> None:
    script = {0: "yes", 1: "no", 2: "yes yes"}
    mt = MultiTurnRollout(
        ScriptedBackend(TOK, lambda turn, _: script[turn], EOS),  # type: ignore[arg-type]
        Stepwise,
        TOK,
        MultiTurnSettings(max_turns=4, tool_call_format="plain"),
        max_response_length=60,
        stop_ids=(EOS,),
    )
    (s,) = mt.generate(requests(n_prompts=1, n=1))
    rec = s.agent
    assert rec is not None and rec["turn_rewards"] == [0.5, 1.0, 0.0, 0.0]
    (result,) = score_samples(None, TOK, [s])
    assert result.reward == 1.5
    batch = samples_to_batch([s], [result], pad_token_id=0)
    mask = batch["response_mask"][0].tolist()
    ends = [j for j in range(len(mask)) if mask[j] and (j + 1 == len(mask) or not mask[j + 1])]
    assert len(ends) == 3  # three model turns, each ended by its stop token
    assert all(s.response_ids[e] == EOS for e in ends)
    scores = batch["token_level_scores"][0]
    expected = torch.zeros_like(scores)
    expected[ends[0]] = 0.5 + 1.0  # the reset's reward credits the first turn, with its own
    torch.testing.assert_close(scores, expected)
    assert batch["turn_ids"][0].tolist() == [
        (0 if j <= ends[0] else 1 if j <= ends[1] else 2) if m else -1 for j, m in enumerate(mask)
    ]
    # the same trajectory, "no" then "yes": the reward moves to the turn that earned it
    script[0], script[2] = "no", "yes"
    (s2,) = mt.generate(requests(n_prompts=1, n=1))
    (r2,) = score_samples(None, TOK, [s2])
    b2 = samples_to_batch([s2], [r2], pad_token_id=0)
    m2 = b2["response_mask"][0].tolist()
    ends2 = [j for j in range(len(m2)) if m2[j] and (j + 1 == len(m2) or not m2[j + 1])]
    assert b2["token_level_scores"][0][ends2].tolist() == [0.5, 0.0, 3.0]
    assert b2["token_level_scores"][0].sum().item() == r2.reward == 3.5
    mt.shutdown()


def test_a_reward_the_turns_do_not_account_for_goes_on_the_last_token() -> None:
    """The row always sums to the result's reward (a failed result: 0 on the last token)."""
    s = Sample(
        request_id="r",
        index=0,
        prompt_ids=[1],
        response_ids=[5, 6, 7, 8],
        rollout_log_probs=[0.0] * 4,
        versions=[0] * 4,
        finish_reason="stop",
        loss_mask=[1, 0, 1, 1],
        agent={"reward": 2.0, "turn_rewards": [2.0], "turn_reward_positions": [0]},
    )
    b = samples_to_batch([s], [RewardResult(2.0, 2.0, False, {})], pad_token_id=0)
    assert b["token_level_scores"][0].tolist() == [2.0, 0.0, 0.0, 0.0]
    b = samples_to_batch([s], [RewardResult(0.0, 0.0, True, {})], pad_token_id=0)
    assert b["token_level_scores"][0].tolist() == [0.0, 0.0, 0.0, 0.0]
    b = samples_to_batch([s], [RewardResult(5.0, 5.0, False, {})], pad_token_id=0)
    assert b["token_level_scores"][0].tolist() == [2.0, 0.0, 0.0, 3.0]

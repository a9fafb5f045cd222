"""Dense (per-token) rewards: an environment's ``EnvStep.token_rewards`` land on the very tokens
they score, ``token_grpo`` gives each token its own credit (numbers worked out from the formula by
hand), and ``tool_arithmetic``'s ``dense`` shaping scores the call and the answer word by word."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from agents.helpers import ScriptedBackend, requests
from rlzoo.agents.rollout import MultiTurnRollout
from rlzoo.agents.settings import MultiTurnSettings
from rlzoo.algorithms.advantage import TokenGRPOParams
from rlzoo.algorithms.functional.advantage import token_grpo
from rlzoo.kernel.protocols import AdvantageInputs, AgentTurn, EnvStep, Sample
from rlzoo.models.tiny import build_tokenizer
from rlzoo.tasks._tools import CHAT_TEMPLATE, WORDS, ToolArithmetic
from rlzoo.tasks.tools import ToolArithmeticParams
from rlzoo.testing import AdvantageConformance
from rlzoo.train.batching import samples_to_batch
from rlzoo.train.rewards import score_samples


class TestTokenGRPO(AdvantageConformance):
    name = "token_grpo"
    masked_rewards_ignored = True


# group 0: samples 0 and 1, turns {0, 1} and {3} (an observation at 2); sample 2 alone (group 1);
# group 2: sample 3 has turns {0} and {2, 3}, sample 4 turns {0, 1} and {3}: their second turns
# start at different positions but line up as (turn 1, index 0)
MASK = torch.tensor([[1, 1, 0, 1], [1, 1, 0, 1], [1, 1, 0, 0], [1, 0, 1, 1], [1, 1, 0, 1]])
TURNS = torch.tensor([[0, 0, -1, 1], [0, 0, -1, 1], [0, 0, -1, -1], [0, -1, 1, 1], [0, 0, -1, 1]])
REWARDS = torch.tensor([[1.0, 0, 0, 2], [0, 0, 0, 1], [3, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 3]])
GROUPS = torch.tensor([5, 5, 6, 8, 8])


def test_token_grpo_by_hand() -> None:
    out = token_grpo(
        AdvantageInputs(REWARDS, MASK, group_ids=GROUPS, turn_ids=TURNS),
        TokenGRPOParams(gamma=0.5, epsilon=0.0),
    )
    s = 1 / math.sqrt(2)  # (r - mean) / std for two rewards that differ: +-1/sqrt(2)
    # group 0: place (0,0) rewards 1, 0 -> +-s; (0,1) 0, 0 -> 0; (1,0) 2, 1 -> +-s
    # A_t = n_t + 0.5 A_(next trained token); the observation carries the sum through
    a0 = [s + 0.5 * (0.5 * s), 0.5 * s, 0.0, s]
    # sample 2 alone: every place has one reward -> 0
    # group 2: (1,0) is sample 3's position 2 (r 1) and sample 4's position 3 (r 3): -+s;
    # (0,1) and (1,1) are reached by one sample each -> 0
    a3 = [0.5 * -s, 0.0, -s, 0.0]
    a4 = [0.25 * s, 0.5 * s, 0.0, s]
    expected = torch.tensor([a0, [-x for x in a0], [0.0] * 4, a3, a4])
    torch.testing.assert_close(out.advantages, expected)
    torch.testing.assert_close(out.returns, expected)
    # gamma 0: each token's own normalized reward; without the std: r - mean
    own = token_grpo(AdvantageInputs(REWARDS, MASK, GROUPS, turn_ids=TURNS), TokenGRPOParams(gamma=0.0))
    torch.testing.assert_close(own.advantages[0], torch.tensor([s, 0.0, 0.0, s]), atol=1e-5, rtol=0)
    plain = token_grpo(
        AdvantageInputs(REWARDS, MASK, GROUPS, turn_ids=TURNS), TokenGRPOParams(gamma=0.0, norm_by_std=False)
    )
    torch.testing.assert_close(plain.advantages[4], torch.tensor([0.0, 0.0, 0.0, 1.0]))


# ---------------------------------------------------------------------------------------------
# the environment's dense rewards reach their tokens
# ---------------------------------------------------------------------------------------------
TOK = build_tokenizer(WORDS, CHAT_TEMPLATE, extra_special=("<|tool|>",))
EOS = int(TOK.eos_token_id)
ROW = {"extra_info": {"a": 123, "b": 456}}


def run(script: dict[int, str], make_env: Any, budget: int = 40) -> Sample:
    mt = MultiTurnRollout(
        ScriptedBackend(TOK, lambda turn, _: script[turn], EOS),  # type: ignore[arg-type]
        make_env,
        TOK,
        MultiTurnSettings(max_turns=2, max_tool_calls=1, tool_call_format="plain"),
        max_response_length=budget,
        stop_ids=(EOS,),
    )
    reqs = requests(n_prompts=1, n=1)
    reqs[0].data.update(ROW)
    (s,) = mt.generate(reqs)
    mt.shutdown()
    return s


def dense_env() -> ToolArithmetic:
    return ToolArithmetic(ToolArithmeticParams(call_credit=1.0, answer_credit=1.0, dense=True))


def test_tool_arithmetic_dense_rewards_sit_on_the_tokens_they_score() -> None:
    """By hand, question 1 2 3 + 4 5 6: the call "calc 1 2 3 + 4 5 7" <eos> has 8 words against 8
    wanted ("calc" and the question), each token worth 1/9: 7 words right and the stop token (the
    length is right) -> 8/9, the wrong "7" 0. The tool says 5 8 0; the answer "Answer: 5 8 1" <eos>
    repeats 2 of its 3 digits and stops at its length: each worth 1 / 4, "Answer:" and the wrong "1"
    0. The sum is wrong: no exact reward."""
    s = run({0: "calc 1 2 3 + 4 5 7", 1: "Answer: 5 8 1"}, dense_env)
    u = 1 / 9
    v = 1 / 4
    call = [u] * 7 + [0.0, u]  # calc 1 2 3 + 4 5 | 7 | <eos>
    answer = [0.0, v, v, 0.0, v]  # Answer: 5 8 | 1 | <eos>
    assert s.agent is not None and s.agent["reward"] == pytest.approx(sum(call) + sum(answer))
    (result,) = score_samples(None, TOK, [s])
    batch = samples_to_batch([s], [result], pad_token_id=0)
    mask = batch["response_mask"][0].tolist()
    turns = [[j for j, t in enumerate(batch["turn_ids"][0].tolist()) if t == k] for k in (0, 1)]
    assert [len(t) for t in turns] == [9, 5]
    scores = batch["token_level_scores"][0]
    torch.testing.assert_close(scores[turns[0]], torch.tensor(call))
    torch.testing.assert_close(scores[turns[1]], torch.tensor(answer))
    assert float(scores[[j for j, m in enumerate(mask) if not m]].abs().sum()) == 0.0  # observations
    assert float(scores.sum()) == pytest.approx(result.reward)
    # the right call and answer: every shaped token paid, and the exact sum's 1.0 on the last token
    s = run({0: "calc 1 2 3 + 4 5 6", 1: "5 7 9"}, dense_env)
    (result,) = score_samples(None, TOK, [s])
    scores = samples_to_batch([s], [result], pad_token_id=0)["token_level_scores"][0]
    assert result.reward == pytest.approx(1.0 + 1.0 + 1.0) and result.info["acc"] == 1.0
    assert float(scores[scores != 0][-1]) == pytest.approx(1.0 + 1 / 4)


def test_an_answer_given_at_once_is_scored_against_the_call() -> None:
    """No call: the first turn is still scored in place against "calc 1 2 3 + 4 5 6" (so the copy
    is taught from the first step on): "Answer: 1 2 3 + 4" <eos> repeats 5 words in place (not
    "calc"), has 6 words (not 8): 5/9, on those words' tokens."""
    s = run({0: "Answer: 1 2 3 + 4"}, dense_env)
    assert s.agent is not None
    assert [r for _, r in s.agent["token_rewards"]] == pytest.approx([0.0] + [1 / 9] * 5 + [0.0])
    assert s.agent["reward"] == pytest.approx(5 / 9)


def test_without_the_tool_only_the_exact_answer_pays() -> None:
    """with_tool=false: "calc ..." is an answer like any other; nothing is shaped."""
    env = lambda: ToolArithmetic(  # noqa: E731
        ToolArithmeticParams(with_tool=False, call_credit=1.0, answer_credit=1.0, dense=True)
    )
    s = run({0: "calc 1 2 3 + 4 5 6"}, env)
    assert s.agent is not None and s.agent["reward"] == 0.0
    assert all(r == 0.0 for _, r in s.agent["token_rewards"])
    s = run({0: "5 7 9"}, env)
    assert s.agent is not None and s.agent["reward"] == 1.0


class WrongShape:
    """Returns one dense reward too few: the trajectory fails, loudly, with what was expected."""

    def reset(self, row: Any) -> EnvStep:
        return EnvStep(messages=[{"role": "user", "content": "1 + 1"}])

    def step(self, turn: AgentTurn) -> EnvStep:
        return EnvStep(
            messages=[], reward=0.0, done=True, token_rewards=[[0.0] * (len(turn.turn_tokens[0]) - 1)]
        )

    def tools(self) -> list[Any]:
        return []


def test_token_rewards_of_the_wrong_shape_fail_the_trajectory() -> None:
    s = run({0: "2"}, WrongShape)
    assert s.agent is not None and "token_rewards" in str(s.agent["error"])
    assert "token counts [2], got reward counts [1]" in str(s.agent["error"])
    (result,) = score_samples(None, TOK, [s])
    assert result.failed


def test_echo_answer_is_scored_against_answer_and_the_whole_reply() -> None:
    """echo + blanks: the question reads "1 2 3 + 4 5 6 = ? ? ?"; the call is still scored against
    "calc 1 2 3 + 4 5 6" (8 words: each token worth 1 / 9). By hand, the call "calc 1 2 3 + 4 5 7 ="
    <eos> gets 7 words (the "=" is one word too many: its stop token is unpaid); calc (the equals
    key ends the expression) replies "1 2 3 + 4 5 7 = 5 8 0" (11 words). The answer "Answer: 1 2 3 + 4 5 7 =
    5 8 1" <eos> is scored in place against "Answer:" and those 11 words: 11 of its 12 words right
    and the stop token, each worth 1 / 13, the wrong "1" 0. Its number is 581 (after the last "="),
    not the sum 579: no exact reward. The right line answers 579: acc 1."""
    env = lambda: ToolArithmetic(  # noqa: E731
        ToolArithmeticParams(call_credit=1.0, answer_credit=1.0, dense=True, echo=True, blanks=True)
    )
    assert env().reset(ROW).messages[-1]["content"] == "1 2 3 + 4 5 6 = ? ? ?"
    s = run({0: "calc 1 2 3 + 4 5 7 =", 1: "Answer: 1 2 3 + 4 5 7 = 5 8 1"}, env)
    assert s.agent is not None and s.agent["env_info"]["acc"] == 0.0
    u, v = 1 / 9, 1 / 13
    call = [u] * 7 + [0.0, 0.0, 0.0]  # calc 1 2 3 + 4 5 | 7 | = <eos>
    answer = [v] * 11 + [0.0, v]  # Answer: 1 2 3 + 4 5 7 = 5 8 | 1 | <eos>
    assert [r for _, r in s.agent["token_rewards"]] == pytest.approx(call + answer)
    assert s.agent["env_info"]["answer_match"] == pytest.approx(10 / 11)
    assert s.agent["env_info"]["call_match"] == pytest.approx(6 / 8)
    s = run({0: "calc 1 2 3 + 4 5 6", 1: "Answer: 1 2 3 + 4 5 6 = 5 7 9"}, env)
    assert s.agent is not None and s.agent["env_info"]["acc"] == 1.0
    # every shaped token paid (the exact 1.0 is the trajectory's reward)
    assert [r for _, r in s.agent["token_rewards"]] == pytest.approx([u] * 9 + [v] * 13)

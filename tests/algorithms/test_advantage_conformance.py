"""The advantage conformance suite, run on the estimators whose inputs come from the train backend
(old log-probs, sum_pi_squared) or the scorers (reward components): the suite builds those inputs
from the parts' capabilities, as a plugin's estimator with the same capabilities gets them."""

from __future__ import annotations

from rlzoo.testing import AdvantageConformance


class TestGDPO(AdvantageConformance):
    name = "gdpo"


class TestOptimalTokenBaseline(AdvantageConformance):
    name = "optimal_token_baseline"
    masked_rewards_ignored = True


class TestTIROptimalTokenBaseline(AdvantageConformance):
    name = "tir_optimal_token_baseline"
    masked_rewards_ignored = True

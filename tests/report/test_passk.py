"""pass@k, maj@k and the bootstrap intervals of ``rlzoo eval`` (:mod:`rlzoo.report.passk`), against
hand computations and the binomial form of Chen et al. 2021, eq. 1."""

from __future__ import annotations

import math
import random

import pytest

from rlzoo.report.passk import (
    PromptResult,
    bootstrap,
    maj_at_k,
    majority_correct,
    paired_bootstrap,
    pass_at_k,
    per_prompt,
)


def test_pass_at_k_by_hand() -> None:
    # n=5 samples, c=2 correct: pass@k = 1 - C(3,k)/C(5,k)
    # k=1: 1 - 3/5 = 0.4; k=2: 1 - 3/10 = 0.7; k=3: 1 - 1/10 = 0.9; k=4, 5: C(3,k) = 0 -> 1
    assert [pass_at_k(5, 2, k) for k in range(1, 6)] == pytest.approx([0.4, 0.7, 0.9, 1.0, 1.0])
    assert pass_at_k(5, 0, 5) == 0.0 and pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0


def test_pass_at_k_matches_the_binomial_form_where_it_is_computable() -> None:
    for n, c, k in [(200, 13, 100), (200, 1, 1), (64, 10, 8), (1000, 3, 500)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12, abs=1e-15)


def test_pass_at_k_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(5, 1, 6)


def test_majority_vote() -> None:
    assert majority_correct(["7", "7", "3"], [True, True, False]) == 1.0
    assert majority_correct(["3", "7", "3"], [False, True, False]) == 0.0
    assert majority_correct(["7", "3"], [True, False]) == 1.0  # a tie: the answer seen first
    assert majority_correct([None, None], [False, False]) == 0.0
    # k = n: the one vote of all samples, no subsets
    assert maj_at_k(["3", "7", "3"], [False, True, False], 3, random.Random(0)) == 0.0
    # k = 1: the chance a random sample is correct, exactly (1/3; a sample without an answer counts 0)
    assert maj_at_k(["3", "7", "3"], [False, True, False], 1, random.Random(0)) == pytest.approx(1 / 3)
    assert maj_at_k([None, "7", "3"], [True, True, False], 1, random.Random(0)) == pytest.approx(1 / 3)
    # k = 2 of ["7", "7", "3"] (7 correct): the pairs are {7,7}, {7,3}, {7,3}; a tie goes to the
    # answer seen first (7), so every pair votes 7 -> 1.0
    assert maj_at_k(["7", "7", "3"], [True, True, False], 2, random.Random(0)) == 1.0


def test_per_prompt_metrics() -> None:
    a = PromptResult(
        acc=(1.0, 0.0, 1.0, 0.0, 0.0), correct=(True, False, True, False, False), preds=("4",) * 5
    )
    b = PromptResult(acc=(0.0,) * 5, correct=(False,) * 5, preds=("1", "2", "3", "4", "5"))
    m = per_prompt([a, b])
    assert m["avg@5"] == pytest.approx([0.4, 0.0])
    assert m["pass@2"] == pytest.approx([0.7, 0.0])
    assert m["maj@5"] == [1.0, 0.0]  # a: all answer "4" and two of them are correct


def test_bootstrap_intervals() -> None:
    flat = bootstrap([0.5] * 10, seed=1)
    assert (flat.value, flat.low, flat.high) == (0.5, 0.5, 0.5)
    est = bootstrap([0.0, 1.0] * 50, samples=2000, seed=3)
    # the mean of 100 fair coin flips: standard error 0.05, a 95% interval of about +-0.1
    assert est.value == 0.5 and 0.38 < est.low < 0.45 and 0.55 < est.high < 0.62
    assert bootstrap([0.0, 1.0] * 50, seed=3) == bootstrap([0.0, 1.0] * 50, seed=3)  # seeded
    diff = paired_bootstrap([0.1, 0.2, 0.3], [0.2, 0.3, 0.4])
    assert (
        diff.value == pytest.approx(0.1)
        and diff.low == pytest.approx(0.1)
        and diff.high == pytest.approx(0.1)
    )
    with pytest.raises(ValueError, match="same prompts"):
        paired_bootstrap([0.1], [0.1, 0.2])

"""Scorers against verl 0.9.1's reward functions (``verl.utils.reward_score``): the verdicts users
compare across frameworks (score, acc) must agree on every response."""

from __future__ import annotations

import random

import pytest

from rlzoo.algorithms.functional.scoring import dapo_math, gsm8k
from rlzoo.algorithms.scorers import DAPOMathParams, GSM8KParams

from ._verl import RECORD

verl_dapo = pytest.importorskip("verl.utils.reward_score.math_dapo")
verl_gsm8k = pytest.importorskip("verl.utils.reward_score.gsm8k")

PIECES = [
    "Let me think step by step.",
    "Answer: 18",
    "Answer: $18$",
    "answer: x = 18",
    "Answer: 18 degrees",
    "Answer: \\frac12",
    "Answer: \\boxed{18}",
    "so the result is \\boxed{18}",
    "\\boxed{\\frac{1}{2}}",
    "\\fbox{18}",
    "\\boxed 18",
    "\\boxed{18",
    "Answer: 1,000",
    "#### 18",
    "#### 1,000",
    "The answer is 72.",
    "#### $72",
    "x" * 120,
    "\n",
]
TRUTHS = ["18", "\\frac{1}{2}", "1000", "72"]


def responses(n: int = 300, seed: int = 0):
    rng = random.Random(seed)
    for _ in range(n):
        yield " ".join(rng.choice(PIECES) for _ in range(rng.randint(1, 4))), rng.choice(TRUTHS)


@pytest.mark.parametrize("strict", [False, True])
def test_dapo_math_verdicts(strict):
    params = DAPOMathParams(strict_box_verify=strict)
    disagree = []
    for response, gt in responses():
        ours = dapo_math.compute_score(response, gt, "math_dapo", {}, params)
        theirs = verl_dapo.compute_score(response, gt, strict_box_verify=strict)
        same_verdict = (ours["score"], ours["acc"]) == (theirs["score"], theirs["acc"])
        same_pred = theirs["pred"] is None or ours["pred"] == theirs["pred"]
        if not (same_verdict and same_pred):
            disagree.append((response, gt, ours, theirs))
    RECORD.rows[
        ("dapo_math" + (" strict_box_verify" if strict else ""), "score, acc, pred (300 responses)")
    ] = float(len(disagree))
    assert not disagree, disagree[:3]


@pytest.mark.parametrize("method", ["strict", "flexible"])
def test_gsm8k_verdicts(method):
    params = GSM8KParams(method=method, format_score=0.1, score=1.0)
    disagree, documented = [], 0
    for response, gt in responses(seed=1):
        ours = gsm8k.compute_score(response, gt, "openai/gsm8k", {}, params)["score"]
        theirs = verl_gsm8k.compute_score(response, gt, method=method, format_score=0.1, score=1.0)
        if method == "flexible":
            # documented difference (docs/components/scorer.md): flexible strips commas and a
            # trailing full stop, and a punctuation-only match is no answer; verl keeps them
            raw = verl_gsm8k.extract_solution(response, method)
            cleaned = None if raw is None else raw.replace(",", "").rstrip(".")
            if cleaned != raw:
                documented += 1
                theirs = 0.0 if not cleaned or cleaned == "-" else (1.0 if cleaned == gt else 0.1)
        if ours != theirs:
            disagree.append((response, gt, ours, theirs))
    RECORD.rows[(f"gsm8k {method}", f"score (300 responses, {documented} documented)")] = float(len(disagree))
    assert not disagree, disagree[:3]
    assert method == "strict" or documented > 0, "the documented difference was not exercised"

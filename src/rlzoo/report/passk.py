"""The numbers papers report for n samples per prompt, with bootstrap intervals (``rlzoo eval``).

Per prompt with ``n`` samples of which ``c`` are correct:

- ``avg@k``: the expected share of correct samples among k (= c / n for every k; reported as avg@n).
- ``pass@k``: the chance that at least one of k samples drawn without replacement from the n is
  correct, the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
  on Code", eq. 1): ``1 - C(n-c, k) / C(n, k)``, computed as the product
  ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``, which never forms the large binomials.
- ``maj@k``: the chance that the majority answer of k samples is a correct one; averaged over
  (up to :data:`MAJ_SUBSETS`) seeded random k-subsets of the n samples (all of them when k = n).

Each metric of a set of prompts is the mean of its per-prompt values; its interval is a percentile
bootstrap over prompts (seeded). Two targets evaluated on the same prompts are compared with a
paired bootstrap: the prompts are resampled together, the interval is of the mean difference.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

#: random k-subsets per prompt that maj@k averages over (k < n)
MAJ_SUBSETS = 32


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt: ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def majority_correct(preds: Sequence[str | None], correct: Sequence[bool]) -> float:
    """1.0 when the most frequent answer (ties: the one seen first) is a correct one; samples with
    no answer do not vote (none voted: 0.0)."""
    votes = Counter(p for p in preds if p is not None)
    if not votes:
        return 0.0
    best = max(votes.values())
    top = next(p for p in preds if p is not None and votes[p] == best)
    return float(any(ok for p, ok in zip(preds, correct) if p == top))


def maj_at_k(preds: Sequence[str | None], correct: Sequence[bool], k: int, rng: random.Random) -> float:
    n = len(preds)
    if k >= n:
        return majority_correct(preds, correct)
    if k == 1:  # one vote: the share of samples with a correct answer, exactly
        return sum(1.0 for p, ok in zip(preds, correct) if p is not None and ok) / n
    total = 0.0
    for _ in range(MAJ_SUBSETS):
        idx = sorted(rng.sample(range(n), k))
        total += majority_correct([preds[i] for i in idx], [correct[i] for i in idx])
    return total / MAJ_SUBSETS


@dataclass(frozen=True)
class PromptResult:
    """One prompt's n samples, as ``rlzoo eval`` scored them."""

    acc: tuple[float, ...]  # each sample's accuracy (the scorer's acc, else its score)
    correct: tuple[bool, ...]  # acc >= the threshold
    preds: tuple[str | None, ...]  # each sample's extracted answer (None: the scorer gives none)


def per_prompt(results: Sequence[PromptResult], seed: int = 0) -> dict[str, list[float]]:
    """Every metric's per-prompt values: ``avg@n``, ``pass@k`` for k = 1..n and, when the scorer
    gives answers, ``maj@k`` for k = 1..n. Every prompt must have the same n."""
    if not results:
        return {}
    ns = {len(r.acc) for r in results}
    if len(ns) != 1:
        raise ValueError(f"every prompt needs the same number of samples, got {sorted(ns)}")
    n = ns.pop()
    out: dict[str, list[float]] = {f"avg@{n}": [sum(r.acc) / n for r in results]}
    for k in range(1, n + 1):
        out[f"pass@{k}"] = [pass_at_k(n, sum(r.correct), k) for r in results]
    if all(p is not None for r in results for p in r.preds):
        rng = random.Random(seed)
        for k in range(1, n + 1):
            out[f"maj@{k}"] = [maj_at_k(r.preds, r.correct, k, rng) for r in results]
    return out


@dataclass(frozen=True)
class Estimate:
    value: float  # the mean over prompts
    low: float  # the interval's ends (percentile bootstrap)
    high: float


def bootstrap(
    values: Sequence[float], *, samples: int = 1000, level: float = 0.95, seed: int = 0
) -> Estimate:
    """The mean of ``values`` and its percentile bootstrap interval (prompts resampled, seeded)."""
    import numpy as np  # here: the command line builds its parser without numpy

    x = np.asarray(values, dtype=np.float64)  # [P]
    if x.size == 0:
        return Estimate(float("nan"), float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(samples, x.size))  # [S, P]
    means = x[idx].mean(axis=1)  # [S]
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return Estimate(float(x.mean()), float(lo), float(hi))


def paired_bootstrap(
    a: Sequence[float], b: Sequence[float], *, samples: int = 1000, level: float = 0.95, seed: int = 0
) -> Estimate:
    """``mean(b - a)`` over the same prompts and its paired bootstrap interval."""
    if len(a) != len(b):
        raise ValueError(f"a paired comparison needs the same prompts: {len(a)} vs {len(b)} values")
    return bootstrap([y - x for x, y in zip(a, b)], samples=samples, level=level, seed=seed)

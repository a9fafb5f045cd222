"""Validation metrics (rlzoo.train.rewards.validation_metrics): mean@n, best@n, maj@n per data source.

End to end (val_before_train, test_freq, the keys in metrics.jsonl) is in
test_recipes.py::test_tiny_variant_runs_end_to_end.
"""

from __future__ import annotations

import pytest

from rlzoo.kernel.protocols import RewardResult, Sample
from rlzoo.train.rewards import validation_metrics


def sample(request_id: str, index: int, source: str, length: int = 3) -> Sample:
    return Sample(
        request_id,
        index,
        [1],
        [5] * length,
        [0.0] * length,
        [0] * length,
        "stop",
        data={"data_source": source},
    )


def result(acc: float, pred: str | None) -> RewardResult:
    info = {"acc": acc} if pred is None else {"acc": acc, "pred": pred}
    return RewardResult(reward=2 * acc - 1, score=2 * acc - 1, failed=False, info=info)


def test_mean_best_maj_per_source_by_hand() -> None:
    # source A, prompt a1: preds 7, 7, 3 with acc 0, 0, 1 -> mean 1/3, best 1, maj (7) 0
    #           prompt a2: preds 5, 5, 5 with acc 1, 1, 1 -> mean 1,   best 1, maj 1
    #   A: mean@3 = (1/3 + 1) / 2 = 2/3; best@3 = 1; maj@3 = (0 + 1) / 2 = 0.5
    # source B, prompt b1: acc 0, 1, 0, no preds -> mean 1/3, best 1, no maj@3
    # val/mean over the 3 prompts: (1/3 + 1 + 1/3) / 3 = 5/9
    samples, results = [], []
    for i, (acc, pred) in enumerate([(0, "7"), (0, "7"), (1, "3")]):
        samples.append(sample("a1", i, "A"))
        results.append(result(acc, pred))
    for i in range(3):
        samples.append(sample("a2", i, "A"))
        results.append(result(1, "5"))
    for i, acc in enumerate([0, 1, 0]):
        samples.append(sample("b1", i, "B", length=6))
        results.append(result(acc, None))
    m = validation_metrics(samples, results, 3)
    assert m["val/A/mean@3"] == pytest.approx(2 / 3)
    assert m["val/A/best@3"] == 1.0
    assert m["val/A/maj@3"] == 0.5
    assert m["val/B/mean@3"] == pytest.approx(1 / 3) and m["val/B/best@3"] == 1.0
    assert "val/B/maj@3" not in m
    assert m["val/mean"] == pytest.approx(5 / 9)
    # response length over all 9 samples: (6 * 3 + 3 * 6) / 9 = 4
    assert m["val/response_length/mean"] == pytest.approx(4.0)

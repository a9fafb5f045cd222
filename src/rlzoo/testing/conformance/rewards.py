"""Conformance suites of the reward kinds: ``scorer`` and ``reward_manager``, and the stub scorers
a reward manager is tested with."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import pytest

from rlzoo.kernel.protocols import RewardItem, RewardResult
from rlzoo.testing.conformance.base import ComponentConformance
from rlzoo.testing.conformance.checks import assert_finite


# ---------------------------------------------------------------------------------------------
# scorer
# ---------------------------------------------------------------------------------------------
class ScorerConformance(ComponentConformance):
    """``fn(response, ground_truth, data_source, extra_info, params) -> float | {"score": ...}``.

    Set :attr:`cases` to ``(response, ground_truth, expected_score)`` triples worked out by hand.
    """

    kind = "scorer"
    cases: ClassVar[Sequence[tuple[str, Any, float]]] = ()
    ground_truth: ClassVar[Any] = "42"
    data_source: ClassVar[str] = "default"
    extra_info: ClassVar[Mapping[str, Any]] = {}
    #: odd responses every scorer must survive (finite score, no exception)
    odd_responses: ClassVar[Sequence[str]] = (
        "",
        " \n\t ",
        "\\boxed{",
        "}{\\boxed{}}",
        "答案是 42 ✓",
        "__import__('os').system('true')",
        "x" * 20000,
    )

    def score(self, response: str, ground_truth: Any = None, data_source: str | None = None) -> float:
        gt = self.ground_truth if ground_truth is None else ground_truth
        ds = self.data_source if data_source is None else data_source
        fn = self.make_part()
        if self.component.capability("batched"):
            raw = fn([response], [gt], [ds], [dict(self.extra_info)], self.params)
            assert isinstance(raw, (list, tuple)) and len(raw) == 1, f"batched scorer returned {raw!r}"
            raw = raw[0]
        else:
            raw = fn(response, gt, ds, dict(self.extra_info), self.params)
        return _score_value(raw)

    def test_returns_a_finite_score(self) -> None:
        self.score(f"The answer is {self.ground_truth}.")

    def test_empty_and_odd_responses(self) -> None:
        for response in self.odd_responses:
            self.score(response)

    def test_cases(self) -> None:
        if not self.cases:
            pytest.skip("no cases given (set `cases` to (response, ground_truth, expected) triples)")
        for response, gt, expected in self.cases:
            got = self.score(response, gt)
            assert math.isclose(got, expected, abs_tol=1e-6), (
                f"score({response!r}, {gt!r}) = {got}, expected {expected}"
            )

    def test_deterministic(self) -> None:
        r = f"so the result is {self.ground_truth}"
        assert self.score(r) == self.score(r)


def _score_value(raw: Any) -> float:
    if isinstance(raw, Mapping):
        assert "score" in raw, f"a scorer's dict must hold 'score', got keys {sorted(raw)}"
        raw = raw["score"]
    assert isinstance(raw, (int, float)) or hasattr(raw, "item"), (
        f"a score must be a number, got {type(raw).__name__} {raw!r}"
    )
    value = float(raw.item() if hasattr(raw, "item") else raw)
    assert math.isfinite(value), f"score is not finite: {value}"
    return value


# ---------------------------------------------------------------------------------------------
# reward manager
# ---------------------------------------------------------------------------------------------
def stub_scorer(response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any]) -> float:
    """A bound scorer for reward manager tests: 1.0 when the ground truth appears in the response."""
    return 1.0 if str(ground_truth) in response else 0.0


def dict_scorer(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any]
) -> dict[str, Any]:
    """Like :func:`stub_scorer`, returning a dict with an extra metric."""
    s = stub_scorer(response, ground_truth, data_source, extra_info)
    return {"score": s, "acc": s > 0}


def raising_scorer(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any]
) -> float:
    """A scorer that always raises (a reward manager must turn it into failed results)."""
    raise ValueError("scorer failed on purpose")


def nan_scorer(response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any]) -> float:
    """A scorer that returns NaN (a reward manager must turn it into failed results)."""
    return float("nan")


class RewardManagerConformance(ComponentConformance):
    """``factory(params, scorer) -> manager``; ``manager(items) -> [RewardResult]``, one per item."""

    kind = "reward_manager"

    def make_manager(self, scorer: Callable[..., Any]) -> Any:
        return self.make_part()(self.params, scorer)

    def make_items(self) -> list[RewardItem]:
        return [
            RewardItem(response="the answer is 42", ground_truth="42", response_length=5),
            RewardItem(response="no idea", ground_truth="7", response_length=2),
            RewardItem(response="", ground_truth="1", response_length=0),
            RewardItem(response="7 7 7", ground_truth="7", response_length=3, data_source="other"),
        ]

    def run(self, scorer: Callable[..., Any], items: Sequence[RewardItem]) -> list[RewardResult]:
        manager = self.make_manager(scorer)
        try:
            results = list(manager(items))
        finally:
            close = getattr(manager, "close", None)
            if callable(close):
                close()
        assert len(results) == len(items), f"{len(results)} results for {len(items)} items"
        for r in results:
            assert isinstance(r, RewardResult), f"expected RewardResult, got {type(r).__name__}"
            assert_finite(r.reward, "reward")
            assert_finite(r.score, "score")
        return results

    def test_one_result_per_item_in_order(self) -> None:
        items = self.make_items()
        results = self.run(stub_scorer, items)
        expected = [stub_scorer(i.response, i.ground_truth, i.data_source, i.extra_info) for i in items]
        assert [r.score for r in results] == expected
        assert not any(r.failed for r in results)

    def test_dict_scores(self) -> None:
        items = self.make_items()
        results = self.run(dict_scorer, items)
        assert [r.score for r in results] == [1.0, 0.0, 0.0, 1.0]

    def test_empty_batch(self) -> None:
        assert self.run(stub_scorer, []) == []

    def test_raising_scorer_gives_failed_results(self) -> None:
        results = self.run(raising_scorer, self.make_items())
        assert all(r.failed for r in results), "a raising scorer must yield failed results"

    def test_nan_scorer_gives_failed_results(self) -> None:
        results = self.run(nan_scorer, self.make_items())
        assert all(r.failed for r in results), "a NaN score must yield failed results"

    def test_deterministic(self) -> None:
        a, b = self.run(stub_scorer, self.make_items()), self.run(stub_scorer, self.make_items())
        assert [(r.reward, r.score) for r in a] == [(r.reward, r.score) for r in b]

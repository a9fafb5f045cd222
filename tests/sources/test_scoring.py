"""The fully-async runner's scoring stage: chunks come back oldest first, at most ``workers`` are
scored at once, a scorer's error reaches the Rollouter after the chunks before it, stop ends it."""

from __future__ import annotations

import threading
import time

import pytest

from rlzoo.sources.scoring import ScoringStage


def _drain(
    stage: ScoringStage[int, int], chunks: int, timeout: float = 10.0
) -> list[tuple[list[int], list[int]]]:
    out: list[tuple[list[int], list[int]]] = []
    deadline = time.monotonic() + timeout
    while len(out) < chunks:
        assert time.monotonic() < deadline, "the stage did not score every chunk"
        out += stage.harvest(wait=0.05)
    return out


def test_chunks_come_back_in_submission_order_and_at_most_workers_run_at_once() -> None:
    running, peak, lock = [0], [0], threading.Lock()

    def score(xs: list[int]) -> list[int]:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05 if xs[0] == 0 else 0.005)  # the first chunk is the slowest
        with lock:
            running[0] -= 1
        return [x * 10 for x in xs]

    stage: ScoringStage[int, int] = ScoringStage(score, workers=2)
    for i in range(6):
        stage.submit([i, i + 100])
    assert stage.harvest() == []  # nothing waited for: the oldest is still being scored
    out = _drain(stage, 6)
    assert [c for c, _ in out] == [
        [i, i + 100] for i in range(6)
    ]  # oldest first, though later ones finished earlier
    assert [r for _, r in out] == [[i * 10, (i + 100) * 10] for i in range(6)]
    assert peak[0] == 2  # six chunks, two workers
    assert stage.pending() == 0 and stage.busy_s > 0
    stage.stop()


def test_a_scorer_error_is_raised_after_the_chunks_before_it() -> None:
    def score(xs: list[int]) -> list[int]:
        if xs == [2]:
            raise ValueError("the grader is down")
        return xs

    stage: ScoringStage[int, int] = ScoringStage(score, workers=1)
    for i in range(4):
        stage.submit([i])
    got: list[list[int]] = []
    with pytest.raises(ValueError, match="the grader is down"):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got += [c for c, _ in stage.harvest(wait=0.05)]
    assert got == [[0], [1]]
    stage.stop()


def test_a_wrong_number_of_results_is_an_error() -> None:
    stage: ScoringStage[int, int] = ScoringStage(lambda xs: xs[:1], workers=1)
    stage.submit([1, 2])
    with pytest.raises(RuntimeError, match="returned 1 results for 2 samples"):
        _drain(stage, 1)
    stage.stop()


def test_stop_ends_the_workers_and_refuses_more() -> None:
    stage: ScoringStage[int, int] = ScoringStage(lambda xs: xs, workers=3, name="rlzoo-scorer-test")
    stage.submit([1])
    assert _drain(stage, 1) == [([1], [1])]
    stage.stop()
    deadline = time.monotonic() + 10
    while any(t.name.startswith("rlzoo-scorer-test") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "a scoring thread outlived stop()"
        time.sleep(0.01)
    with pytest.raises(RuntimeError, match="stopped"):
        stage.submit([2])
    with pytest.raises(ValueError, match="workers must be >= 1"):
        ScoringStage(lambda xs: xs, workers=0)

"""One failure policy for every runner (issue 39): failures counted over the TRAINED batch, per kind
and per part; non-finite rewards are failures, never NaN metrics; each distinct error printed once
with its count, its traceback kept in failures.jsonl; summary.json lists them by part and message."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from rlzoo.kernel.batch import Batch
from rlzoo.kernel.protocols import RewardResult, Sample
from rlzoo.train.batching import rollout_metrics, samples_to_batch
from rlzoo.train.failures import MAX_LOGGED_ERRORS, RewardFailureError, RewardFailures
from rlzoo.train.rewards import PartNames, guard_rewards, score_samples


def _failed(error: str, part: str = "scorer math", tb: str | None = None) -> RewardResult:
    info: dict[str, Any] = {"error": error, "failed_part": part}
    if tb is not None:
        info["traceback"] = tb
    return RewardResult(0.0, 0.0, True, info)


def _ok() -> RewardResult:
    return RewardResult(1.0, 1.0, False, {})


def _trained(results: list[RewardResult], agents: list[Any] | None = None) -> Batch:
    """What the loop sees of a collated batch: per-sample failed flags and reward info."""
    meta: dict[str, list[Any]] = {
        "failed": [r.failed for r in results],
        "reward_info": [{"score": r.score, **r.info} for r in results],
    }
    if agents is not None:
        meta["agent"] = agents
    return Batch({}, meta)


def test_the_share_is_of_the_trained_batch_not_of_everything_scored() -> None:
    # issue 39, finding 4: under fully_async the Rollouter scores far more than a step trains; the
    # share was taken over everything scored since the last step (0.79-0.90, under the 0.9 bar)
    # while 100 % of the trained batch failed. 10 trained, all failed: 10 / 10 = 1.0 >= 0.9.
    tracker = RewardFailures(limit=2, max_frac=0.9)
    for step in (1, 2):
        tracker.record([_failed("boom")] * 8 + [_ok()] * 2)  # scored: 8 / 10 = 0.8
        tracker.record([_ok()] * 10)  # scored, not trained (dropped or still queued)
        m = tracker.end_step(step, _trained([_failed("boom")] * 10), write=lambda line: None)
        assert m["reward/failed_frac"] == 1.0  # 10 / 10
        assert m["reward/failed/scorer"] == 10.0
    with pytest.raises(RewardFailureError, match=r"2 consecutive steps.*errors: scorer math: boom \(10x\)"):
        tracker.check()


def test_a_trained_batch_without_failures_breaks_the_streak() -> None:
    tracker = RewardFailures(limit=2, max_frac=0.9)
    tracker.record([_failed("boom")] * 10)
    tracker.end_step(1, _trained([_failed("boom")] * 4), write=lambda line: None)
    tracker.record([_failed("boom")] * 10)  # every scored sample failed, but the trained ones did not
    assert tracker.end_step(2, _trained([_ok()] * 4), write=lambda line: None)["reward/failed_frac"] == 0.0
    tracker.check()
    assert tracker.streak == 0


def test_a_skipped_step_counts_what_was_scored() -> None:
    # a filter that dropped every group (batch None): the scored samples are all there is to count
    tracker = RewardFailures(limit=1)
    tracker.record([_failed("boom")] * 3)
    assert tracker.end_step(1, None, write=lambda line: None)["reward/failed_frac"] == 1.0
    with pytest.raises(RewardFailureError):
        tracker.check()


def test_each_distinct_error_is_printed_once_with_its_count_then_counted() -> None:
    lines: list[str] = []
    tracker = RewardFailures(limit=0)
    batch = [_failed("boom")] * 3 + [_failed("bad env", "environment maze")] + [_ok()] * 4
    tracker.end_step(1, _trained(batch), write=lines.append)
    assert len(lines) == 2  # one line per distinct error, with its part and its count
    assert any("#1" in x and "scorer math" in x and "3x" in x and "boom" in x for x in lines)
    assert any("#2" in x and "environment maze" in x and "1x" in x and "bad env" in x for x in lines)
    lines.clear()
    tracker.end_step(2, _trained([_failed("boom")] * 2 + [_ok()] * 6), write=lines.append)
    assert lines == ["rlzoo: step 2: 2 of 8 trained samples failed: 2x #1 (scorer math)"]
    s = tracker.summary()
    assert s["failed_samples"] == 6 and s["trained_samples"] == 16
    assert s["by_part"] == {"scorer math": 5, "environment maze": 1}
    assert [(e["part"], e["message"], e["count"]) for e in s["errors"]] == [
        ("scorer math", "boom", 5),
        ("environment maze", "bad env", 1),
    ]


def test_tool_failures_reach_the_console_and_the_summary() -> None:
    # issue 39, finding 11: tool failures were only agent/* means
    lines: list[str] = []
    tracker = RewardFailures(limit=0)
    agents = [
        {"tool_errors": 2, "tool_failures": [["calc", "error: calc: ZeroDivisionError"]] * 2},
        {"tool_errors": 1, "tool_failures": [["calc", "error: calc timed out after 5 s"]]},
        {"tool_errors": 0},
    ]
    m = tracker.end_step(1, _trained([_ok()] * 3, agents), write=lines.append)
    assert m["tool/failed"] == 3.0
    assert any("tool calc" in x and "2x" in x and "ZeroDivisionError" in x for x in lines)
    assert any("tool calc" in x and "timed out" in x for x in lines)
    assert tracker.summary()["failed_tool_calls"] == 3


def test_failures_jsonl_keeps_each_distinct_traceback_once_and_is_bounded(tmp_path: Path) -> None:
    tracker = RewardFailures(limit=0)
    tracker.open_log(tmp_path)
    results = [_failed("boom", tb="Traceback...\n  in my_scorer\nValueError: boom")] * 5
    tracker.record(results)
    assert all("traceback" not in r.info for r in results)  # taken out: the batch carries only the text
    tracker.record([_failed(f"error {i}", tb=f"tb {i}") for i in range(2 * MAX_LOGGED_ERRORS)])
    lines = (tmp_path / "failures.jsonl").read_text().splitlines()
    assert len(lines) == MAX_LOGGED_ERRORS  # bounded
    first = json.loads(lines[0])
    assert first["part"] == "scorer math" and first["kind"] == "scorer" and first["message"] == "boom"
    assert "in my_scorer" in first["traceback"]
    assert all(json.loads(x) for x in lines)  # each line whole


def test_new_errors_past_the_cap_are_one_entry_a_part_in_the_step_line() -> None:
    # after 50 distinct errors, each new one had been its own "1x tool calc (a new error; 50 shown
    # already)" entry: a step with 40 new tool errors printed a line of 40 identical entries
    tracker = RewardFailures(limit=0)
    tracker.record([_failed(f"error {i}") for i in range(MAX_LOGGED_ERRORS)])
    tracker.end_step(
        1, _trained([_failed(f"error {i}") for i in range(MAX_LOGGED_ERRORS)]), write=lambda x: None
    )
    lines: list[str] = []
    agents = [{"tool_errors": 1, "tool_failures": [["calc", f"cannot parse {i}"]]} for i in range(40)]
    agents[0] = {"tool_errors": 2, "tool_failures": [["calc", "cannot parse 0"]] * 2}
    failed = [_failed(f"new {i}", part="scorer x") for i in range(3)]
    tracker.end_step(2, _trained([*failed, *[_ok()] * 37], agents), write=lines.append)
    assert lines == [
        "rlzoo: step 2: 3 of 40 trained samples failed: 3x scorer x (3 new errors, not shown: 50 shown already)",
        "rlzoo: step 2: 41 tool calls failed: 41x tool calc (40 new errors, not shown: 50 shown already)",
    ]


def _traj(reward: Any, turn_rewards: list[Any] | None = None) -> Sample:
    return Sample(
        request_id="r",
        index=0,
        prompt_ids=[1, 2],
        response_ids=[3, 4],
        rollout_log_probs=[-1.0, -1.0],
        versions=[0, 0],
        finish_reason="stop",
        loss_mask=[1, 1],
        agent={
            "reward": reward,
            "turn_rewards": [reward] if turn_rewards is None else turn_rewards,
            "turn_reward_positions": [1],
            "token_rewards": [],
            "error": None,
            "env_info": {},
            "turns": 1,
            "tool_calls": 0,
            "tool_errors": 0,
            "malformed_calls": 0,
            "env_time_s": 0.0,
            "truncated": False,
            "model_tokens": 2,
            "env_tokens": 0,
            "final_text": "",
        },
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e300])
def test_a_non_finite_or_huge_environment_reward_is_a_counted_failure(bad: float) -> None:
    # issue 39, finding 5: NaN / inf made the reward metrics null (and could zero the update), and
    # 1e300 (finite, beyond float32) was not even counted
    samples = [_traj(bad), _traj(0.5)]
    results = score_samples(None, None, samples, PartNames(environment="maze"))
    assert [r.failed for r in results] == [True, False]
    assert results[0].info["failed_part"] == "environment maze" and "finite" in results[0].info["error"]
    batch = samples_to_batch(samples, results, 0)
    m = rollout_metrics(batch, 2)
    assert math.isfinite(m["critic/score/mean"]) and m["critic/score/mean"] == pytest.approx(0.25)
    assert m["reward/failed"] == 1.0


def test_a_non_finite_reward_that_reaches_a_batch_is_failed_there() -> None:
    # a runner that collates its own rewards: the loop's guard zeroes the row and counts it
    samples = [_traj(0.5), _traj(0.5)]
    batch = samples_to_batch(samples, [_ok(), _ok()], 0)
    batch["token_level_scores"][0, 1] = float("nan")
    assert guard_rewards(batch) == 1
    assert batch["failed"] == [True, False]
    assert batch["token_level_scores"].isfinite().all()
    tracker = RewardFailures(limit=0)
    assert tracker.end_step(1, batch, write=lambda line: None)["reward/failed_frac"] == 0.5


def test_failures_no_trained_batch_shows_still_abort() -> None:
    # a sample filter drops every all-failed group: under fully_async no batch ever came, the
    # Rollouter drew the whole dataset and the run "stopped early" with exit 0. The scoring side's
    # backstop: max_failed_steps steps' worth of scored samples in a row failed -> abort
    # limit 2, 4 samples a step: (2 x 2 + 2) x 4 = 24 failed in a row, after the loop's own check
    tracker = RewardFailures(limit=2)
    tracker.step_samples = 4
    tracker.record([_failed("boom")] * 23 + [_ok()])
    tracker.check_scored()  # a success in between: no streak
    tracker.record([_failed("boom")] * 23)
    tracker.check_scored()  # 23 < 24
    tracker.record([_failed("boom")])
    with pytest.raises(RewardFailureError, match=r"last 24 scored samples all failed .*scorer math: boom"):
        tracker.check_scored()

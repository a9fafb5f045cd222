"""Loud reward failures: per-step counts, each distinct error logged once, and the abort rule
(a scorer that fails on every sample ends the run with a non-zero exit and its last error)."""

from __future__ import annotations

import logging
import types
from pathlib import Path

import pytest

import rlzoo
from rlzoo.algorithms.functional.reward import BoundScorer, NaiveRewardManager
from rlzoo.algorithms.reward import NaiveParams
from rlzoo.kernel.protocols import RewardItem
from rlzoo.train.failures import RewardFailureError, RewardFailures


def odd(response, ground_truth, data_source, extra_info, params):  # type: ignore[no-untyped-def]
    """A scorer with every way of failing: raises, NaN, inf, None, a string; else 1.0."""
    if response == "raise":
        raise RuntimeError("no answer found")
    return {"nan": float("nan"), "inf": float("inf"), "none": None, "str": "1.0"}.get(response, 1.0)


def _score(*responses: str) -> list:  # type: ignore[type-arg]
    mgr = NaiveRewardManager(NaiveParams(), BoundScorer(odd))
    return mgr([RewardItem(response=r, ground_truth="1") for r in responses])


def test_nan_inf_none_and_strings_count_as_failed(caplog: pytest.LogCaptureFixture) -> None:
    tracker = RewardFailures(limit=0)
    with caplog.at_level(logging.WARNING, logger="rlzoo"):
        tracker.record(_score("raise", "nan", "inf", "none", "str", "ok", "raise"))
        m = tracker.end_step(1)
    assert m["reward/failed_frac"] == pytest.approx(6 / 7)
    assert m["reward/failed_streak"] == 0.0  # one sample scored
    warnings = [r.getMessage() for r in caplog.records]
    # one line per distinct error: the repeated RuntimeError is logged once
    assert sum("no answer found" in w for w in warnings) == 1
    assert any("non-finite" in w for w in warnings) and any("NoneType" in w for w in warnings)
    assert any("str '1.0'" in w for w in warnings)
    tracker.check()  # limit 0: never aborts


def test_abort_after_limit_consecutive_all_failed_steps() -> None:
    tracker = RewardFailures(limit=2)
    tracker.record(_score("raise", "raise"))
    tracker.end_step(1)
    tracker.check()  # one step in a row: keep going
    tracker.record(_score("raise", "ok"))
    assert tracker.end_step(2)["reward/failed_streak"] == 0.0  # a sample scored: the streak resets
    tracker.record(_score("raise"))
    tracker.end_step(3)
    tracker.record(_score("nan", "raise"))
    tracker.end_step(4)
    with pytest.raises(RewardFailureError, match=r"2 consecutive steps.*errors: .*RuntimeError: no answer"):
        tracker.check()


def test_a_run_whose_scorer_always_raises_exits_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlzoo.cli import main

    plugin = types.ModuleType("raising_scorer_plugin")

    def always_raises(response, ground_truth, data_source, extra_info, params):  # type: ignore[no-untyped-def]
        raise ValueError("the grader service is down")

    @rlzoo.hookimpl
    def rlzoo_register_scorers(registry):  # type: ignore[no-untyped-def]
        registry.register("always_raises", always_raises)

    plugin.rlzoo_register_scorers = rlzoo_register_scorers  # type: ignore[attr-defined]
    pm = rlzoo.get_plugin_manager()
    name = pm.register(plugin, "raising-scorer")
    try:
        data = tmp_path / "data"
        comp = pm.get("dataset", "quickstart")
        comp.load()(data, comp.default_params())
        rc = main(
            [
                "train",
                "quickstart",
                f"data.dir={data}",
                f"run.output_dir={tmp_path / 'run'}",
                "run.loggers=[jsonl]",
                "run.progress=false",
                "reward.scorer=always_raises",
                "reward.max_failed_steps=2",
                "trainer.total_steps=10",
                "trainer.val_before_train=false",
                "trainer.test_freq=-1",
                "trainer.save_freq=-1",
                "rollout.n=2",
            ]
        )
    finally:
        pm.unregister(name)
    err = capsys.readouterr().err
    assert rc != 0
    assert "every trained sample failed in 2 consecutive steps" in err
    assert "the grader service is down" in err
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2  # both steps were logged before the abort


def test_mostly_failing_steps_abort_too() -> None:
    # issue 23: 95 % of samples failing never aborted (only an all-failed step counted); the
    # recipe's reward.max_failed_frac (default 0.9) makes such a step count toward the streak
    from rlzoo.recipe.types import RewardSection

    tracker = RewardFailures(limit=2, max_frac=RewardSection().max_failed_frac)
    for step in (1, 2):
        tracker.record(_score(*["raise"] * 19, "ok"))  # 95 % failed
        assert tracker.end_step(step)["reward/failed_frac"] == pytest.approx(0.95)
        if step == 1:
            tracker.check()
    with pytest.raises(
        RewardFailureError, match=r"at least 95% of the trained samples .* 2 consecutive steps"
    ):
        tracker.check()
    # a step below the share resets the streak
    tracker = RewardFailures(limit=2, max_frac=0.9)
    for step, batch in enumerate((["raise"] * 19 + ["ok"], ["raise"] * 8 + ["ok"] * 2, ["raise"] * 20)):
        tracker.record(_score(*batch))
        tracker.end_step(step)
    tracker.check()
    assert tracker.streak == 1

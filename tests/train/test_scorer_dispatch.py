"""The core's scorer dispatch hands a batched scorer whole lists (reward.manager=batch)."""

from __future__ import annotations

from typing import Any

import pytest

import rlzoo
from rlzoo.kernel.plugins import PluginManager
from rlzoo.kernel.protocols import RewardItem
from rlzoo.recipe.config import load_config
from rlzoo.train.rewards import build_reward_manager

CALLS: list[tuple[str, list[str]]] = []


def by_length(responses, ground_truths, data_sources, extra_infos, params):  # type: ignore[no-untyped-def]
    """Batched: len(response) / 10 per sample."""
    CALLS.append(("by_length", list(responses)))
    return [len(r) / 10 for r in responses]


def by_match(responses, ground_truths, data_sources, extra_infos, params):  # type: ignore[no-untyped-def]
    """Batched: 1.0 where the response equals the ground truth."""
    CALLS.append(("by_match", list(responses)))
    return [float(r == g) for r, g in zip(responses, ground_truths)]


def plain(response, ground_truth, data_source, extra_info, params):  # type: ignore[no-untyped-def]
    CALLS.append(("plain", [response]))
    return 0.5


class BatchedScorers:
    @rlzoo.hookimpl
    def rlzoo_register_scorers(self, registry: Any) -> None:
        registry.register("by_length", by_length, capabilities={"batched": True})
        registry.register("by_match", by_match, capabilities={"batched": True})
        registry.register("plain_half", plain)


@pytest.fixture
def scorer_pm() -> PluginManager:
    pm = PluginManager(load_entrypoints=False)
    pm.register(BatchedScorers(), "batched_scorers")
    CALLS.clear()
    return pm


def _manager(pm: PluginManager, *overrides: str) -> Any:
    cfg = load_config("quickstart", ["reward.manager=batch", *overrides], pm=pm)
    return build_reward_manager(cfg)


ITEMS = [
    RewardItem("ab", "ab", data_source="len"),
    RewardItem("abcd", "x", data_source="match"),
    RewardItem("a", "a", data_source="len"),
    RewardItem("zz", "zz", data_source="match"),
]


def test_a_batched_scorer_gets_one_call_with_the_whole_batch(scorer_pm: PluginManager) -> None:
    out = _manager(scorer_pm, "reward.scorer=by_length")(ITEMS)
    assert CALLS == [
        ("by_length", ["ab", "abcd", "a", "zz"])
    ]  # one call, lists (before: per sample, strings)
    assert [r.reward for r in out] == pytest.approx([0.2, 0.4, 0.1, 0.2])


def test_each_data_sources_batched_scorer_gets_its_share_in_one_call(scorer_pm: PluginManager) -> None:
    mgr = _manager(scorer_pm, "reward.scorer=by_length", "+reward.scorers={match: by_match}")
    out = mgr(ITEMS)
    assert sorted(CALLS) == [("by_length", ["ab", "a"]), ("by_match", ["abcd", "zz"])]
    assert [r.reward for r in out] == pytest.approx([0.2, 0.0, 0.1, 1.0])  # in the items' order


def test_a_batched_scorer_beside_a_plain_one_is_called_per_sample_with_lists(
    scorer_pm: PluginManager,
) -> None:
    mgr = _manager(scorer_pm, "reward.scorer=plain_half", "+reward.scorers={len: by_length}")
    out = mgr(ITEMS)
    assert [r.reward for r in out] == pytest.approx([0.2, 0.5, 0.1, 0.5])
    assert ("by_length", ["ab"]) in CALLS and ("plain", ["abcd"]) in CALLS

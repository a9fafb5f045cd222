"""rlzoo's conformance suites, run against this plugin's parts (through the installed entry point)."""

from __future__ import annotations

from rlzoo.testing import AdvantageConformance, ScorerConformance


class TestExampleRLOO(AdvantageConformance):
    name = "example_rloo"
    masked_rewards_ignored = True  # example_rloo selects rewards with the mask: check it


class TestExampleRLOOClipped(AdvantageConformance):
    name = "example_rloo"
    params_overrides = {"baseline_weight": 0.5, "clip": 0.75}
    masked_rewards_ignored = True


class TestExampleKeyword(ScorerConformance):
    name = "example_keyword"
    params_overrides = {"keyword": "Paris"}
    cases = [
        ("The capital of France is Paris.", "ignored", 1.0),
        ("the capital is paris", None, 1.0),  # case-insensitive by default
        ("I don't know.", "Paris", 0.0),
        ("", "Paris", 0.0),
    ]

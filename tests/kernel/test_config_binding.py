"""Binding a recipe: every problem at once, each with its key path."""

from __future__ import annotations

import pytest
from plugin_fixtures import MINIMAL_RECIPE

from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.plugins import PluginManager
from rlzoo.recipe.config import bind_config


def test_minimal_recipe_binds(pm: PluginManager) -> None:
    cfg = bind_config(MINIMAL_RECIPE, pm)
    assert cfg.algorithm.advantage.name == "grpo"  # defaults resolve to registered parts too
    kinds = {s.key: s.kind for s in cfg.selections()}
    assert kinds["algorithm.policy_loss"] == "policy_loss" and kinds["reward.scorer"] == "scorer"


def test_one_error_lists_every_problem_with_its_key(pm: PluginManager) -> None:
    raw = {
        **MINIMAL_RECIPE,
        "algorithm": {
            "advantage": "gpro",  # unknown name
            "policy_loss": {"name": "ppo_clip", "clip_ratio_hgh": 0.28},  # wrong param name
            "kl_loss": {"name": "k4"},  # unknown name, mapping form
            "entropy_coeff": "a lot",  # wrong type
        },
        "rollout": {"n": "four"},  # wrong type
        "trainer": {"total_stepz": 3},  # unknown section key
    }
    with pytest.raises(ConfigError) as e:
        bind_config(raw, pm)
    problems = e.value.problems
    by_key = {p.split(":", 1)[0]: p for p in problems}
    assert set(by_key) == {
        "algorithm.advantage.name",
        "algorithm.policy_loss.clip_ratio_hgh",
        "algorithm.kl_loss.name",
        "algorithm.entropy_coeff",
        "rollout.n",
        "trainer.total_stepz",
    }, problems
    assert "unknown advantage 'gpro'" in by_key["algorithm.advantage.name"]
    assert "Did you mean: grpo" in by_key["algorithm.advantage.name"]
    assert "did you mean 'clip_ratio_high'" in by_key["algorithm.policy_loss.clip_ratio_hgh"]
    assert "unknown kl 'k4'" in by_key["algorithm.kl_loss.name"]
    assert "expected a number" in by_key["algorithm.entropy_coeff"]
    assert "expected an integer" in by_key["rollout.n"]
    assert "did you mean 'total_steps'" in by_key["trainer.total_stepz"]
    assert f"{len(problems)} problem(s)" in str(e.value)


def test_wrong_param_type_of_a_part(pm: PluginManager) -> None:
    raw = {**MINIMAL_RECIPE, "algorithm": {"advantage": {"name": "grpo", "norm_by_std": "yes"}}}
    with pytest.raises(ConfigError) as e:
        bind_config(raw, pm)
    assert e.value.problems == ["algorithm.advantage.norm_by_std: expected true or false, got 'yes'"]


def test_capability_driven_cross_check(pm: PluginManager) -> None:
    raw = {**MINIMAL_RECIPE, "rollout": {"n": 1}}  # grpo needs groups
    with pytest.raises(ConfigError, match=r"rollout.n: advantage 'grpo' is group-relative"):
        bind_config(raw, pm)


def test_a_missing_required_section_does_not_hide_the_other_problems(pm: PluginManager) -> None:
    # before: "model: required" alone, and the range / cross-field problems only in a second round
    raw = {
        "data": {"train_batch_size": 4, "train_files": []},
        "trainer": {"ppo_mini_batch_size": 256},
        "rollout": {"n": 0},
    }
    with pytest.raises(ConfigError) as e:
        bind_config(raw, pm)
    msg = str(e.value)
    assert "model: required by the recipe but missing" in msg
    assert "rollout.n: must be >= 1, got 0" in msg
    assert "trainer.ppo_mini_batch_size: must divide data.train_batch_size (4), got 256" in msg
    assert "<missing>" not in msg  # the placeholder that lets the checks run is never reported


def test_every_missing_required_field_is_listed() -> None:
    import dataclasses

    from rlzoo.kernel.binding import bind_dataclass

    @dataclasses.dataclass
    class Two:
        a: int
        b: str

    problems: list[str] = []
    assert bind_dataclass(Two, {}, "x", problems) is None
    assert problems == ["x.a: required by Two but missing", "x.b: required by Two but missing"]

"""Mistakes a user can make are messages that say what to do, before anything is written
(issue 23, item 10 and the reward managers' settings of item 9)."""

from __future__ import annotations

import importlib.util

import pytest

from rlzoo.config import load_config
from rlzoo.errors import ConfigError


def problems_of(*overrides: str, recipe: str = "quickstart") -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(recipe, list(overrides))
    return list(e.value.problems)


@pytest.mark.parametrize("manager", ["naive", "dapo", "batch", "process_pool"])
@pytest.mark.parametrize("timeout", ["0", "-5"])
def test_a_reward_timeout_of_zero_or_less_is_refused(manager: str, timeout: str) -> None:
    extra = ", max_response_length: 128, overlong_buffer_len: 16" if manager == "dapo" else ""
    got = problems_of(f"reward.manager={{name: {manager}, timeout: {timeout}{extra}}}")
    assert got == [f"reward.manager.timeout: must be > 0, got {float(timeout)}"]


def test_dapo_overlong_buffer_without_a_length_is_refused_by_validate() -> None:
    # it passed validate and raised when the run built its reward manager
    (got,) = problems_of("reward.manager={name: dapo, enable: true, overlong_buffer_len: 1}")
    assert got.startswith("reward.manager: max_response_length must be set")
    assert "${data.max_response_length}" in got
    (got,) = problems_of("reward.manager={name: dapo, max_response_length: 64, overlong_buffer_len: 65}")
    assert "overlong_buffer_len (65) must be in (0, max_response_length=64]" in got
    cfg = load_config("quickstart", ["reward.manager={name: dapo, enable: false}"])  # plain naive: fine
    assert cfg.reward.manager.params.enable is False


def test_max_failed_frac_range() -> None:
    assert problems_of("reward.max_failed_frac=0") == ["reward.max_failed_frac: must be > 0, got 0.0"]
    assert problems_of("reward.max_failed_frac=1.5") == ["reward.max_failed_frac: must be <= 1, got 1.5"]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_without_vllm_is_refused_by_validate_naming_the_extra() -> None:
    # it passed validate and failed at train, after the run directory was made
    got = problems_of("rollout.backend=vllm")
    assert got == [
        "rollout.backend: rollout_backend 'vllm' needs the package 'vllm', which is not installed: "
        "pip install rlzoo[vllm]"
    ]
    # on Ray the backend runs in worker processes, whose environment may differ from the driver's
    cfg = load_config("quickstart", ["rollout.backend=vllm", "placement.name=ray"])
    assert cfg.rollout.backend.name == "vllm"

"""``rlzoo validate`` catches what ``train`` would reject, all at once: types, ranges, cross-field
rules, loggers, runner knobs; part switching on the command line; typed capability records."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rlzoo
import rlzoo.kernel.kinds
from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.plugins import PluginManager
from rlzoo.recipe.config import load_config


def problems_of(*overrides: str, recipe: str = "quickstart") -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(recipe, list(overrides))
    return list(e.value.problems)


# ---------------------------------------------------------------------------------------------
# types and ranges in one report
# ---------------------------------------------------------------------------------------------
def test_types_ranges_and_rules_are_reported_together() -> None:
    got = problems_of(
        "rollout.n=abc",  # a type error
        "trainer.optim.lr=-1e-4",
        "data.max_response_length=0",
        "rollout.temperature=-0.5",
        "trainer.ppo_epochs=0",
        "trainer.total_steps=-5",
        "trainer.ppo_mini_batch_size=5",  # a cross-field rule: 5 does not divide 16
    )
    text = "\n".join(got)
    assert "rollout.n: expected an integer, got str 'abc'" in text
    assert "trainer.optim: lr must be > 0, got -0.0001" in text
    assert "data.max_response_length: must be >= 1, got 0" in text
    assert "rollout.temperature: must be >= 0, got -0.5" in text
    assert "trainer.ppo_epochs: must be >= 1, got 0" in text
    assert "trainer.total_steps: must be >= 1, got -5" in text
    assert "trainer.ppo_mini_batch_size: must divide data.train_batch_size (16), got 5" in text


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.max_prompt_length=0", "data.max_prompt_length: must be >= 1"),
        ("rollout.top_p=0", "rollout.top_p: must be > 0"),
        ("rollout.top_p=1.5", "rollout.top_p: must be <= 1"),
        ("rollout.val.temperature=-1", "rollout.val.temperature: must be >= 0"),
        ("trainer.total_epochs=0", "trainer.total_epochs: must be >= 1"),
        ("algorithm.value_clip=0", "algorithm.value_clip: must be > 0"),
        ("reward.max_failed_steps=-1", "reward.max_failed_steps: must be >= 0"),
        ("trainer.max_checkpoints=0", "trainer.max_checkpoints: must be >= 1"),
    ],
)
def test_each_range(override: str, message: str) -> None:
    assert any(message in p for p in problems_of(override))


def test_unknown_logger_is_refused_by_validate() -> None:
    if "logger" not in rlzoo.kernel.kinds.KIND_BY_NAME:
        pytest.skip("loggers are not a plugin kind yet")
    got = problems_of("run.loggers=[console,wandbb]")
    assert any("unknown logger 'wandbb'" in p and "wandb" in p for p in got)


def test_async_knob_on_a_sync_recipe_names_the_knob_and_the_runner() -> None:
    (p,) = problems_of("runner.staleness_threshold=0.5")
    assert p.startswith("runner.staleness_threshold:")
    assert "runner 'fully_async'" in p and "runner=fully_async" in p
    assert "name: missing" not in p


def test_an_old_backend_optimizer_key_points_to_its_new_place() -> None:
    (p,) = problems_of("trainer.backend.lr=1e-3")
    assert "trainer.optim.lr" in p


# ---------------------------------------------------------------------------------------------
# switching parts on the command line
# ---------------------------------------------------------------------------------------------
def test_switching_keeps_the_params_the_new_part_declares(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config("quickstart", ["algorithm.policy_loss=gspo", "algorithm.loss_agg=seq-mean-token-mean"])
    # quickstart's ppo_clip sets clip_ratio_low / high; gspo declares both
    assert cfg.algorithm.policy_loss.name == "gspo"
    assert cfg.algorithm.policy_loss.params.clip_ratio_high == 0.28
    err = capsys.readouterr().err
    assert "algorithm.policy_loss: ppo_clip -> gspo; kept clip_ratio_high, clip_ratio_low" in err


def test_switching_prints_what_it_dropped(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config("quickstart", ["algorithm.advantage=rloo"])
    assert cfg.algorithm.advantage.name == "rloo"
    assert "dropped norm_by_std (advantage 'rloo' does not declare them)" in capsys.readouterr().err


def test_a_part_with_its_own_params_on_the_command_line() -> None:
    # used to fail with "algorithm.advantage.norm_by_std: unknown key" / "name: missing"
    cfg = load_config("quickstart", ["algorithm.advantage={name: gae, lam: 0.9}"])
    assert cfg.algorithm.advantage.name == "gae" and cfg.algorithm.advantage.params.lam == 0.9
    # without a name: params of the current part
    cfg = load_config("quickstart", ["algorithm.advantage={norm_by_std: false}"])
    assert cfg.algorithm.advantage.name == "grpo" and cfg.algorithm.advantage.params.norm_by_std is False
    # a part written as a bare name in the recipe takes one param
    cfg = load_config("quickstart", ["reward.manager.failure_reward=-1"])
    assert cfg.reward.manager.name == "naive" and cfg.reward.manager.params.failure_reward == -1.0


def test_a_local_recipe_shadowing_a_builtin_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "recipes").mkdir()
    builtin = Path(rlzoo.__file__).parent / "recipes" / "quickstart.yaml"
    if not builtin.exists():
        from rlzoo.recipe.files import list_recipes

        builtin = list_recipes()["quickstart"]
    (tmp_path / "recipes" / "quickstart.yaml").write_text(builtin.read_text())
    monkeypatch.chdir(tmp_path)
    load_config("quickstart")
    err = capsys.readouterr().err
    assert f"{tmp_path / 'recipes' / 'quickstart.yaml'}; it shadows" in err
    assert "quickstart.yaml" in err.split("it shadows", 1)[1]


# ---------------------------------------------------------------------------------------------
# typed capability records
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _one_part(
    pm: PluginManager, plugin: str, kind: str, name: str, caps: dict[str, object]
) -> Iterator[None]:
    """Plugin ``plugin`` registers a fake part ``name`` of ``kind`` with ``caps``, for the block."""

    def register(registry: rlzoo.Registrar[Any]) -> None:
        registry.register(name, _fn, capabilities=caps)

    mod = types.ModuleType(plugin)
    setattr(mod, rlzoo.kernel.kinds.KIND_BY_NAME[kind].hook, rlzoo.hookimpl(register))
    pm.register(mod, plugin)
    try:
        yield
    finally:
        pm.unregister(plugin)


def _fn(inputs, params):  # type: ignore[no-untyped-def]
    """A fake part."""


def test_a_misspelt_capability_is_an_error_at_registration(pm: PluginManager) -> None:
    with _one_part(pm, "typo_plugin", "advantage", "typo_adv", {"needs_critc": True}):
        with pytest.raises(rlzoo.kernel.errors.PluginError) as e:
            pm.registries()
        msg = str(e.value)
        assert "typo_adv" in msg and "typo_plugin" in msg
        assert "unknown capability 'needs_critc'; did you mean 'needs_critic'?" in msg


def test_a_capability_of_the_wrong_type_is_an_error(pm: PluginManager) -> None:
    with (
        _one_part(pm, "bad_caps", "runner", "bad_runner", {"placements": "local"}),
        pytest.raises(rlzoo.kernel.errors.PluginError, match=r"capability 'placements': expected a list"),
    ):
        pm.registries()


def test_capabilities_are_typed_and_an_unknown_key_is_not_false(pm: PluginManager) -> None:
    gae = pm.get("advantage", "gae")
    assert gae.caps.needs_critic is True and gae.caps.needs_group is False
    assert pm.get("runner", "sync").caps.placements == ("local", "ray")
    with pytest.raises(KeyError, match="no capability 'needs_critc'"):
        gae.capability("needs_critc")


def test_a_critic_needs_a_backend_that_can_train_one(pm: PluginManager) -> None:
    with (
        _one_part(pm, "nc", "train_backend", "no_critic", {"supports_critic": False}),
        pytest.raises(ConfigError, match=r"train backend 'no_critic' cannot train one"),
    ):
        load_config("quickstart", ["algorithm.advantage=gae", "trainer.backend=no_critic"], pm=pm)


def test_sum_pi_squared_needs_a_backend_that_supplies_it(pm: PluginManager) -> None:
    with _one_part(pm, "nsps", "train_backend", "no_sps", {"supports_critic": True}):
        for adv in ("optimal_token_baseline", "tir_optimal_token_baseline"):
            with pytest.raises(
                ConfigError, match=rf"advantage '{adv}' needs sum_pi_squared.*train backend 'no_sps' does not"
            ):
                load_config("quickstart", [f"algorithm.advantage={adv}", "trainer.backend=no_sps"], pm=pm)
        load_config("quickstart", ["algorithm.advantage=grpo", "trainer.backend=no_sps"], pm=pm)
        for backend in ("native", "fsdp2"):  # the built-in backends that compute it
            load_config(
                "quickstart", ["algorithm.advantage=optimal_token_baseline", f"trainer.backend={backend}"]
            )


def test_a_loss_with_a_fixed_aggregation_notes_another(capsys: pytest.CaptureFixture[str]) -> None:
    load_config("quickstart", ["algorithm.policy_loss=gspo", "algorithm.loss_agg=token-mean"])
    err = capsys.readouterr().err
    assert (
        "rlzoo: note: algorithm.loss_agg: policy loss 'gspo' is published with 'seq-mean-token-mean'" in err
    )
    load_config("quickstart", ["algorithm.policy_loss=gspo", "algorithm.loss_agg=seq-mean-token-mean"])
    assert "note:" not in capsys.readouterr().err

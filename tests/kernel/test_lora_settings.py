"""``trainer.lora`` is checked by ``rlzoo validate`` before anything loads: its ranges, its keys, and
that the selected train and rollout backends can train / apply adapters (capability ``supports_lora``)."""

from __future__ import annotations

import pytest

from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.settings import LoraSettings
from rlzoo.recipe.config import load_config


def problems_of(*overrides: str, recipe: str = "quickstart") -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(recipe, list(overrides))
    return list(e.value.problems)


def test_absent_means_full_fine_tuning_and_a_mapping_binds() -> None:
    assert load_config("quickstart", []).trainer.lora is None
    cfg = load_config("quickstart", ["trainer.lora.rank=8", "trainer.lora.target_modules=[q_proj,v_proj]"])
    assert cfg.trainer.lora == LoraSettings(rank=8, target_modules=("q_proj", "v_proj"))
    assert cfg.trainer.lora.scaling == 32.0 / 8


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.lora.rank=0", "trainer.lora: rank must be >= 1, got 0"),
        ("trainer.lora.rank=-4", "trainer.lora: rank must be >= 1, got -4"),
        ("trainer.lora.alpha=0", "trainer.lora: alpha must be > 0, got 0.0"),
        ("trainer.lora.dropout=1.5", "trainer.lora: dropout must be < 1, got 1.5"),
        ("trainer.lora.target_modules=[]", "trainer.lora: target_modules must be a non-empty list"),
        ("trainer.lora.target_modules=[all-linear,q_proj]", "'all-linear' selects every linear layer"),
        ("trainer.lora.rnk=8", "trainer.lora.rnk: unknown key for LoraSettings; did you mean 'rank'?"),
    ],
)
def test_bad_settings_are_refused(override: str, message: str) -> None:
    text = "\n".join(problems_of(override))
    assert message in text, text


def test_a_train_backend_without_supports_lora_is_refused() -> None:
    text = "\n".join(problems_of("trainer.lora.rank=8", "trainer.backend=megatron"))
    assert (
        "trainer.lora: train backend 'megatron' cannot train LoRA adapters (supports_lora is false)" in text
    )
    assert "use one that can (fsdp2, native)" in text


def test_a_rollout_backend_without_supports_lora_is_refused() -> None:
    text = "\n".join(problems_of("trainer.lora.rank=8", "rollout.backend=simulated"))
    assert "trainer.lora: rollout backend 'simulated' cannot apply LoRA adapter pushes" in text


def test_the_megatron_backend_refuses_lora_when_built_directly() -> None:
    pytest.importorskip("megatron.core")
    from rlzoo.backends.megatron import MegatronParams
    from rlzoo.backends.megatron.train import MegatronTrainBackend
    from rlzoo.kernel.settings import TrainSpec

    with pytest.raises(ValueError, match="not supported; use the native or fsdp2"):
        MegatronTrainBackend(MegatronParams(device="cpu"), TrainSpec(model_path="", lora=LoraSettings()))

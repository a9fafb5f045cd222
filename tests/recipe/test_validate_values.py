"""``rlzoo validate`` (and ``rlzoo train``, before its run directory exists) refuses the values of
issue 39's finding 7: non-finite floats, integers past 64 bits, seeds past 32 bits, a LoRA rank
above the model's width. Each reaches the user as a ``validate`` error naming the key, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlzoo.cli import main


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.optim.lr=inf", "trainer.optim: lr must be a finite number, got inf"),
        ("trainer.optim.weight_decay=nan", "trainer.optim: weight_decay must be a finite number, got nan"),
        ("run.seed=12345678901234567890", "run.seed: must fit a 64-bit integer"),
        ("run.seed=4294967296", "run.seed: must be <= 4294967295, got 4294967296"),
        ("algorithm.entropy_coeff=nan", "algorithm.entropy_coeff: must be a finite number, got nan"),
        ("algorithm.policy_loss.clip_ratio_low=nan", "clip_ratio_low must be a finite number, got nan"),
        ("trainer.optim.grad_clip=nan", "trainer.optim: grad_clip must be a finite number, got nan"),
        ("rollout.temperature=inf", "rollout.temperature: must be a finite number, got inf"),
        ("trainer.total_steps=1e30", "trainer.total_steps: must fit a 64-bit integer"),
    ],
)
def test_validate_refuses_what_cannot_train(override: str, message: str, capsys) -> None:
    assert main(["validate", "quickstart", override]) == 2
    err = capsys.readouterr().err
    assert "rlzoo validate: error: invalid recipe: 1 problem(s)" in err
    assert message in err


def test_train_refuses_before_the_run_directory_exists(tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    assert main(["train", "quickstart", "trainer.optim.lr=inf", f"run.dir={runs}"]) == 2
    assert "lr must be a finite number" in capsys.readouterr().err
    assert not runs.exists()


def test_a_lora_rank_above_the_models_width_is_refused_at_validate(tmp_path: Path, capsys) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    args = ["validate", "quickstart", f"model.path={model}"]
    assert main([*args, "+trainer.lora.rank=100000"]) == 2
    err = capsys.readouterr().err
    assert f"trainer.lora.rank: 100000 is more than the width of model.path {model} (hidden size 64)" in err
    assert main([*args, "+trainer.lora.rank=64"]) == 0

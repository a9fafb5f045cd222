"""Trainer settings shared by every train backend (``trainer.optim``, ``trainer.micro_batch``), the
LR schedule's length in optimizer steps, and the critic's value clip (``algorithm.value_clip``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import rlzoo
from rlzoo.kernel.errors import ConfigError
from rlzoo.recipe.config import load_config
from rlzoo.recipe.types import mini_batches_per_step, optimizer_steps
from rlzoo.train.inputs import train_spec

TOKENIZER = SimpleNamespace(pad_token_id=0)


# ---------------------------------------------------------------------------------------------
# optimizer settings survive a backend switch
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("switch", ["trainer.backend=fsdp2", "trainer.backend.name=fsdp2"])
def test_switching_the_train_backend_keeps_the_recipes_optimizer(switch: str) -> None:
    # quickstart trains with lr 3e-3, here micro-batches of 256; fsdp2's own default would be 1e-6 / chosen
    mb = ["trainer.micro_batch.size=256", "trainer.micro_batch.log_prob_size=256"]
    cfg = load_config("quickstart", [switch, *mb])
    assert cfg.trainer.backend.name == "fsdp2"
    spec = train_spec(cfg, 6, TOKENIZER)  # what the backend factory receives
    assert spec.optim.lr == 3e-3
    assert spec.optim.grad_clip == 1.0
    assert spec.micro_batch.size == 256 and spec.micro_batch.log_prob_size == 256


def test_the_fsdp2_backend_built_from_the_switched_recipe_trains_at_its_lr() -> None:
    """The backend the run builds (from the recipe's part and the spec) has AdamW at lr 3e-3."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from rlzoo.models.tiny import tiny_qwen2_config

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    cfg = load_config("quickstart", ["trainer.backend=fsdp2", "trainer.backend.device=cpu"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_qwen2_config(64, attn_implementation="sdpa")).float()
    sel = cfg.trainer.backend
    be = sel.fn(sel.params, train_spec(cfg, 6, TOKENIZER), model=model)
    try:
        assert [g["lr"] for g in be.optimizer.param_groups] == [3e-3]
        assert be.schedule.lr(0) == 3e-3  # constant schedule, no warmup (the recipe's)
    finally:
        be.shutdown()


def test_optimizer_settings_are_validated_all_at_once() -> None:
    with pytest.raises(ConfigError) as e:
        load_config("quickstart", ["trainer.optim.lr=-1e-4", "trainer.micro_batch.size=0"])
    text = str(e.value)
    assert "trainer.optim: lr must be > 0, got -0.0001" in text
    assert "trainer.micro_batch: size must be >= 1, got 0" in text


def test_backend_params_no_longer_hold_optimizer_settings() -> None:
    with pytest.raises(ConfigError, match=r"trainer\.backend\.lr: unknown key"):
        load_config("quickstart", ["trainer.backend.lr=1e-3"])


# ---------------------------------------------------------------------------------------------
# the LR schedule spans optimizer steps
# ---------------------------------------------------------------------------------------------
def test_optimizer_steps_sync_and_fully_async() -> None:
    # sync: 16 prompts per step in mini-batches of 8 -> 2 optimizer steps per step per epoch
    cfg = load_config("quickstart", ["trainer.ppo_epochs=3"])
    assert mini_batches_per_step(cfg) == 2
    assert optimizer_steps(cfg, 6) == 6 * 2 * 3
    assert train_spec(cfg, 6, TOKENIZER).total_steps == 36
    # whole batch as one mini-batch
    assert optimizer_steps(load_config("quickstart", ["trainer.ppo_mini_batch_size=null"]), 6) == 6
    # fully-async: require_batches (2) mini-batches of 8 prompts per trainer step
    cfg = load_config("quickstart_async", ["runner.require_batches=3"])
    assert mini_batches_per_step(cfg) == 3
    assert optimizer_steps(cfg, 5) == 15


def _hf_lrs(schedule: str, lr: float, warmup: int, total: int) -> list[float]:
    """LR of each optimizer step under HF's reference schedulers (stepped once per optimizer step)."""
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    make = get_linear_schedule_with_warmup if schedule == "linear" else get_cosine_schedule_with_warmup
    sched = make(opt, num_warmup_steps=warmup, num_training_steps=total)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize(
    ("schedule", "mini_batch", "warmup"),
    [("linear", 16, 0), ("linear", 4, 0), ("cosine", 16, 1), ("cosine", 8, 2)],
)
def test_lr_schedule_reaches_its_final_value_on_the_last_step(
    tmp_path: Path, quickstart_dir: Path, schedule: str, mini_batch: int, warmup: int
) -> None:
    """A sync run of 4 steps x (16 / mini_batch) mini-batches: every step's logged LR (the mean
    over its mini-batches) is HF's scheduler's, and the last step ends where the formula ends
    (before the fix, the schedule spanned 4 optimizer steps and hit 0 half-way)."""
    steps, lr = 4, 3e-3
    run = rlzoo.build_run(
        "quickstart",
        [
            f"data.dir={quickstart_dir}",
            f"run.output_dir={tmp_path / 'run'}",
            "run.loggers=[jsonl]",
            "run.progress=false",
            f"trainer.total_steps={steps}",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            f"trainer.ppo_mini_batch_size={mini_batch}",
            f"trainer.optim.lr_scheduler={schedule}",
            f"trainer.optim.warmup_steps={warmup}",
            "rollout.n=2",
        ],
    )
    run.train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [r["actor/lr"] for r in rows if "actor/lr" in r]
    per_step = 16 // mini_batch
    ref = _hf_lrs(schedule, lr, warmup, steps * per_step)
    expected = [sum(ref[i * per_step : (i + 1) * per_step]) / per_step for i in range(steps)]
    assert logged == pytest.approx(expected, rel=1e-6, abs=1e-12)
    assert logged[-1] > 0  # the last step still learns (the formula's final value is not reached early)


# ---------------------------------------------------------------------------------------------
# the critic's value clip
# ---------------------------------------------------------------------------------------------
def test_value_clip_is_a_declared_validated_setting_the_trainer_uses() -> None:
    from rlzoo.train.update import trainer_setup

    cfg = load_config("quickstart", ["algorithm.advantage=gae", "algorithm.value_clip=0.2"])
    assert cfg.algorithm.value_clip == 0.2
    with pytest.raises(ConfigError, match=r"algorithm\.value_clip"):
        load_config("quickstart", ["algorithm.value_clip=wide"])

    seen: list[float] = []

    class Backend:
        version = 0

        def update_critic(self, mb, objective):  # type: ignore[no-untyped-def]
            seen.append(objective.cliprange_value)
            return {}

        def update_policy(self, mb, objective):  # type: ignore[no-untyped-def]
            return {}

    from rlzoo.kernel.batch import Batch

    batch = Batch(
        {
            "response_mask": torch.ones(4, 2),
            "responses": torch.zeros(4, 2, dtype=torch.long),
        }
    )
    trainer_setup(cfg).build(Backend()).update(batch, lambda name: _Null())
    assert seen and set(seen) == {0.2}


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None

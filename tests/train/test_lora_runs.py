"""trainer.lora end to end on the quickstart task (real tiny model, native backends, real peft):
every runner trains, pushes only the adapter, exports a merged model + a PEFT adapter; PPO trains a
full critic beside the LoRA actor; a resumed LoRA run continues exactly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from run_fixtures import build

from rlzoo.kernel.errors import RlzooError
from rlzoo.kernel.plugins import PluginManager
from rlzoo.report.metrics import read_metrics

from .test_run_safety import RUNNER

pytest.importorskip("peft")

LORA = ["trainer.lora.rank=4", "trainer.lora.alpha=8", "trainer.optim.lr=1e-2", "algorithm.use_kl_loss=true"]


def adapter_bytes(model_dir: Path, rank: int) -> int:
    """Bytes of the rank-``rank`` adapter of every linear layer but the LM head, counted by peft."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir), LoraConfig(r=rank, target_modules="all-linear")
    )
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "lora_" in n)


@pytest.mark.parametrize("runner", list(RUNNER))
def test_every_runner_trains_the_adapter_and_pushes_only_it(
    runner: str, pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    summary = build(
        pm, "quickstart", quickstart_dir, out, *LORA, *RUNNER[runner], "trainer.total_steps=2"
    ).train()
    assert summary["last_step"] == 2
    rows = [r for r in read_metrics(out) if "perf/weight_push_bytes" in r]
    assert rows, "no weight push recorded"
    want = adapter_bytes(quickstart_dir / "model", 4)
    full = sum(f.stat().st_size for f in (quickstart_dir / "model").glob("*.safetensors"))
    assert {r["perf/weight_push_bytes"] for r in rows} == {float(want)}
    assert want < full / 3
    assert any(r.get("actor/kl_loss", 0.0) != 0.0 for r in read_metrics(out))  # the reference is used

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(out / "final")
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(quickstart_dir / "model"), out / "final" / "adapter"
    )
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(
            merged(input_ids=ids).logits, adapted(input_ids=ids).logits, atol=1e-5, rtol=0
        )
    config = json.loads((out / "final" / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8


def test_ppo_with_a_lora_actor_and_a_full_critic(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    build(
        pm, "quickstart", quickstart_dir, out, *LORA, "algorithm.advantage=gae", "trainer.total_steps=2"
    ).train()
    rows = read_metrics(out)
    assert any("critic/loss" in r for r in rows) and any("actor/pg_loss" in r for r in rows)


def test_a_resumed_lora_run_continues_exactly(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    keys = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/kl_loss")
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    build(
        pm, "quickstart", quickstart_dir, a_dir, *LORA, "trainer.total_steps=4", "trainer.save_freq=2"
    ).train()
    full = {r["step"]: r for r in read_metrics(a_dir)}
    shutil.copytree(a_dir / "checkpoints" / "step_2", b_dir / "checkpoints" / "step_2")
    (b_dir / "checkpoints" / "latest").write_text("step_2")
    shutil.copy(a_dir / "config.yaml", b_dir / "config.yaml")
    build(pm, "quickstart", quickstart_dir, b_dir, *LORA, "trainer.total_steps=4", "resume=true").train()
    resumed = {r["step"]: r for r in read_metrics(b_dir)}
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        for k in keys:
            assert resumed[step][k] == pytest.approx(full[step][k], rel=1e-5, abs=1e-7), (step, k)

    # rlzoo export writes the merged model (adapter/ inside), or with --adapter the adapter alone
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlzoo.cli import main

    assert main(["export", str(a_dir), "--step", "2", "--out", str(tmp_path / "merged")]) == 0
    assert main(["export", str(a_dir), "--step", "2", "--adapter", "--out", str(tmp_path / "adapter")]) == 0
    assert (tmp_path / "merged" / "adapter" / "adapter_config.json").is_file()
    assert not list((tmp_path / "adapter").glob("config.json"))  # the adapter only, no model
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(quickstart_dir / "model"), tmp_path / "adapter"
    )
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(
            merged(input_ids=ids).logits, adapted(input_ids=ids).logits, atol=1e-5, rtol=0
        )
    assert main(["export", str(a_dir), "--adapter", "--out", str(tmp_path / "merged")]) == 2  # not empty


def test_export_adapter_of_a_full_fine_tuning_run_is_refused(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    from rlzoo.train.export import export_checkpoint

    build(pm, "quickstart", quickstart_dir, tmp_path / "run", "trainer.total_steps=1").train()
    with pytest.raises(RlzooError, match=r"no trainer\.lora"):
        export_checkpoint(tmp_path / "run", tmp_path / "out", adapter=True)


def test_export_adapter_touches_nothing_but_its_out(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    """``rlzoo export --adapter`` builds the merged model in a staging folder of its own. Before: it
    used ``.OUT.merged`` next to ``--out`` and deleted whatever was there first (a user's folder of
    that name), and a kill -9 midway left it for the next export to delete as its own."""
    import os
    import subprocess
    import sys

    from rlzoo.cli import main

    run = tmp_path / "run"
    build(pm, "quickstart", quickstart_dir, run, *LORA, "trainer.total_steps=1").train()
    mine = tmp_path / ".adapter.merged"
    mine.mkdir()
    (mine / "notes.md").write_text("mine")
    assert main(["export", str(run), "--adapter", "--out", str(tmp_path / "adapter")]) == 0
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert (mine / "notes.md").read_text() == "mine"  # untouched
    # killed midway (the merged model written, the adapter not yet moved): the next export works
    # and leaves nothing of ours behind; the user's folder is still untouched
    env = {**os.environ, "RLZOO_KILL_AT": "export:installed@1", "RLZOO_DISABLE_PLUGIN_AUTOLOAD": "1"}
    cmd = [sys.executable, "-m", "rlzoo.cli", "export", str(run), "--adapter", "--out", str(tmp_path / "a2")]
    assert subprocess.run(cmd, env=env, capture_output=True, timeout=300).returncode == -9
    assert not (tmp_path / "a2").exists()
    assert main(["export", str(run), "--adapter", "--out", str(tmp_path / "a2")]) == 0
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    assert left == [".adapter.merged"], left
    assert (mine / "notes.md").read_text() == "mine"


def test_a_lora_resume_refuses_a_base_model_changed_in_place(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    """Issue 39, finding 10: the base model at model.path rewritten in place (another model of the same
    shape: every weight + 0.01) between a LoRA run and its resume. Before: the resume carried on, its
    adapter on a base it was never trained on."""
    import os

    from safetensors.torch import load_file, save_file

    from rlzoo.train.checkpoint import BaseModelChanged
    from rlzoo.train_kit.lora import base_model_fingerprint

    data = tmp_path / "data"
    shutil.copytree(quickstart_dir, data)
    out = tmp_path / "run"
    build(pm, "quickstart", data, out, *LORA, "trainer.total_steps=1", "trainer.save_freq=1").train()
    weights = data / "model" / "model.safetensors"
    before = base_model_fingerprint(str(data / "model"))
    assert before is not None and {"config.json", "model.safetensors"} <= set(before["files"])
    os.utime(weights, (1, 1))  # a touch (or a copy) is not a change of the model
    assert base_model_fingerprint(str(data / "model")) == before

    size = weights.stat().st_size
    save_file({k: v + 0.01 for k, v in load_file(weights).items()}, str(weights), metadata={"format": "pt"})
    assert weights.stat().st_size == size  # same shape, same size: only the bytes tell
    resume = build(pm, "quickstart", data, out, *LORA, "trainer.total_steps=2", "resume=latest")
    with pytest.raises(BaseModelChanged, match=r"model\.path=.*model.safetensors \(changed\)"):
        resume.train()
    assert [r["step"] for r in read_metrics(out)] == [1]  # nothing trained on the wrong base

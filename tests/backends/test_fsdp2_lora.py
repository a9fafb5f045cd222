"""The fsdp2 train backend with trainer.lora on CPU / gloo (2 ranks), against the native backend."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlzoo.backends.native.train import NativeTrainBackend
from rlzoo.backends.native.train_params import NativeTrainParams
from rlzoo.kernel.settings import TrainSpec
from rlzoo.train_kit import lora

from .conftest import torchrun

pytest.importorskip("peft")
sys.path.insert(0, str(Path(__file__).parent))
from fsdp2_lora_worker import LORA
from fsdp2_worker import PARAMS, SETTINGS, TokenMeanPG, TokenMeanValue, sample_batch, tiny_model

WORKER = Path(__file__).with_name("fsdp2_lora_worker.py")
ATOL = 1e-5


@pytest.fixture(scope="module")
def dist_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path]:
    out = tmp_path_factory.mktemp("fsdp2_lora")
    torchrun(str(WORKER), str(out), timeout=300)
    return load_file(str(out / "results.safetensors")), json.loads((out / "results.json").read_text()), out


@pytest.fixture(scope="module")
def native_run() -> dict:
    b1, b2 = sample_batch(1), sample_batch(2)
    spec = TrainSpec(
        model_path="", need_reference=True, need_critic=True, total_steps=10, lora=LORA, **SETTINGS
    )
    be = NativeTrainBackend.from_module(tiny_model(0), NativeTrainParams(**PARAMS), spec)
    r: dict = {"m1": be.update_policy(b1, TokenMeanPG(b1))}
    be.update_critic(b1, TokenMeanValue(b1))
    r["w1"] = {n: t.clone() for n, t in be.export_weights()}
    r["m2"] = be.update_policy(b2, TokenMeanPG(b2))
    r["w2"] = {n: t.clone() for n, t in be.export_weights()}
    base = NativeTrainBackend.from_module(
        tiny_model(0), NativeTrainParams(**PARAMS), TrainSpec(model_path="", **SETTINGS)
    )
    r["base_lp1"] = base.compute_log_probs(b1)[0]
    return r


def _weights(tensors: dict, prefix: str) -> dict:
    return {k[len(prefix) + 1 :]: v for k, v in tensors.items() if k.startswith(prefix + "/")}


def _close(ours: dict, theirs: dict, atol: float = ATOL) -> None:
    assert set(ours) == set(theirs) and ours
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], atol=atol, rtol=0, msg=name)


@pytest.mark.distributed
def test_only_adapters_train_and_push_and_they_equal_native(dist_results, native_run) -> None:
    tensors, numbers, _ = dist_results
    assert numbers["trainable"] and all(lora.is_adapter_name(n) for n in numbers["trainable"])
    assert {n.split(".")[-4] for n in numbers["trainable"]} == {"q_proj", "v_proj", "up_proj"}
    assert numbers["m1"]["actor/grad_norm"] == pytest.approx(native_run["m1"]["actor/grad_norm"], rel=1e-5)
    _close(_weights(tensors, "w1"), native_run["w1"])  # the push: adapter tensors only, same names


@pytest.mark.distributed
def test_reference_is_the_base_model_without_a_copy(dist_results, native_run) -> None:
    tensors, numbers, _ = dist_results
    assert numbers["ref_params"] == 0
    torch.testing.assert_close(tensors["ref_lp1"], native_run["base_lp1"], atol=ATOL, rtol=0)
    assert not torch.allclose(tensors["lp1"], native_run["base_lp1"], atol=1e-4)


@pytest.mark.distributed
def test_adapter_checkpoint_resume_is_exact(dist_results, native_run) -> None:
    tensors, numbers, out = dist_results
    assert numbers["resume/extra"] == {"step": 1}
    assert numbers["resume/m2"]["actor/loss"] == numbers["m2"]["actor/loss"]
    _close(_weights(tensors, "resumed/w2"), _weights(tensors, "uninterrupted/w2"), atol=0.0)
    _close(_weights(tensors, "uninterrupted/w2"), native_run["w2"])
    meta = json.loads((out / "ckpt" / "meta.json").read_text())
    assert meta["lora"]["rank"] == 4
    # the actor's checkpoint holds the adapter and its AdamW state only
    from torch.distributed.checkpoint import FileSystemReader

    keys = list(FileSystemReader(str(out / "ckpt" / "actor")).read_metadata().state_dict_metadata)
    model_keys = {k.split(".", 1)[1] for k in keys if k.startswith("model.")}
    assert model_keys == set(_weights(tensors, "w1"))
    assert all(lora.is_adapter_name(k) for k in keys if k.startswith("optim.state."))


@pytest.mark.distributed
def test_export_merged_and_adapter(dist_results) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tensors, _, out = dist_results
    b2 = sample_batch(2)
    merged = AutoModelForCausalLM.from_pretrained(str(out / "hf"), dtype=torch.float32)
    lp, _ = NativeTrainBackend.from_module(merged, NativeTrainParams(device="cpu")).compute_log_probs(b2)
    torch.testing.assert_close(lp, tensors["lp2"], atol=ATOL, rtol=0)
    adapted = PeftModel.from_pretrained(tiny_model(0), str(out / "hf" / "adapter"))
    lp, _ = NativeTrainBackend.from_module(
        adapted.merge_and_unload().requires_grad_(True), NativeTrainParams(device="cpu")
    ).compute_log_probs(b2)
    torch.testing.assert_close(lp, tensors["lp2"], atol=ATOL, rtol=0)

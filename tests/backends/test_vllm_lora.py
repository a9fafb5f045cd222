"""The vLLM backend's LoRA logic (src/rlzoo/backends/vllm/lora.py) on CPU: engine arguments, and each push
written as a PEFT folder that real peft loads into the base model and reproduces the trainer's
logits. vLLM itself is not needed (nor imported)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from rlzoo.backends.vllm import VLLMRolloutParams
from rlzoo.backends.vllm.lora import AdapterPushes, lora_engine_args, max_lora_rank
from rlzoo.kernel.errors import RlzooError
from rlzoo.kernel.settings import LoraSettings, RolloutSpec, TrainSpec

from .test_native_train import TokenMeanPG, backend, sample_batch, tiny_model

peft = pytest.importorskip("peft")

LORA = LoraSettings(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"))


def test_max_lora_rank_rounds_up_to_what_vllm_accepts() -> None:
    assert [max_lora_rank(r) for r in (1, 4, 8, 16, 17, 300, 512)] == [1, 8, 8, 16, 32, 320, 512]
    with pytest.raises(RlzooError, match="up to rank 512"):
        max_lora_rank(513)


def test_engine_args_enable_lora_only_for_a_lora_run() -> None:
    from rlzoo.backends.vllm.rollout import engine_args

    spec = RolloutSpec(model_path="/m", tokenizer_path="/t")
    assert "enable_lora" not in engine_args(VLLMRolloutParams(), spec)
    kw = engine_args(VLLMRolloutParams(), RolloutSpec(model_path="/m", tokenizer_path="/t", lora=LORA))
    assert kw["enable_lora"] is True and kw["max_lora_rank"] == 8 and kw["max_loras"] == 1
    assert lora_engine_args(LoraSettings(rank=16)) == {
        "enable_lora": True,
        "max_lora_rank": 16,
        "max_loras": 1,
    }
    # an explicit engine_kwargs entry still wins
    kw = engine_args(
        VLLMRolloutParams(engine_kwargs={"max_loras": 2}),
        RolloutSpec(model_path="/m", tokenizer_path="/t", lora=LORA),
    )
    assert kw["max_loras"] == 2


def test_each_push_is_a_peft_folder_with_a_new_request(tmp_path) -> None:
    from peft import PeftModel

    base = tiny_model()
    base.save_pretrained(tmp_path / "base")
    trainer = backend(copy.deepcopy(base), spec=TrainSpec(model_path="", lora=LORA), lr=1e-2)
    pushes = AdapterPushes(LORA, str(tmp_path / "base"), root=tmp_path / "pushes")
    assert pushes.request_kwargs() is None  # before the first push: the base model (B = 0)
    batch = sample_batch()
    fwd = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    ids = []
    for step in range(3):
        trainer.update_policy(batch, TokenMeanPG(float(batch["response_mask"].sum())))
        pushes.write(trainer.export_weights(), trainer.version)
        kw = pushes.request_kwargs()
        assert kw is not None
        ids.append(kw["lora_int_id"])
        loaded = PeftModel.from_pretrained(copy.deepcopy(base), kw["lora_path"]).eval()
        with torch.no_grad():
            torch.testing.assert_close(
                loaded(**fwd).logits, trainer.actor.eval()(**fwd).logits, atol=1e-6, rtol=0
            )
        assert kw["lora_name"].endswith(f"-v{step + 1}")
    assert ids == [1, 2, 3]  # new weights, new id: vLLM loads them instead of reusing its cache
    assert sorted(p.name for p in (tmp_path / "pushes").iterdir()) == ["push_2", "push_3"]
    with pytest.raises(RlzooError, match="not LoRA adapter tensors"):
        pushes.write(base.state_dict().items(), 9)
    pushes.close()
    assert list((tmp_path / "pushes").iterdir()) == []


def test_a_push_to_the_backend_writes_the_adapter_and_loads_no_weights(tmp_path) -> None:
    """Through VLLMRolloutBackend.update_weights around a recording engine (no vLLM)."""
    from .test_vllm_logic import _backend

    base = tiny_model()
    trainer = backend(copy.deepcopy(base), spec=TrainSpec(model_path="", lora=LORA))
    b = _backend()
    b._adapters = AdapterPushes(LORA, "/base", root=tmp_path / "pushes")
    try:
        b.update_weights(trainer.export_weights(), 5)
        assert b.version == 5
        assert not [c for c in b.engine.calls if c[0] == "rlzoo_load_weights"]  # the base stays
        assert b._adapters.request_kwargs()["lora_int_id"] == 1
        assert (tmp_path / "pushes" / "push_1" / "adapter_model.safetensors").is_file()
    finally:
        b._loop.call_soon_threadsafe(b._loop.stop)
        b._thread.join(5)


def test_before_the_first_push_a_continued_run_serves_its_start_adapter(tmp_path) -> None:
    """trainer.lora.adapter_path: vLLM generates the first step with that adapter (no push has come
    yet); the pushes that follow replace it under their own ids."""
    from rlzoo.backends.vllm.lora import START_ADAPTER_ID

    base = tiny_model()
    trainer = backend(copy.deepcopy(base), spec=TrainSpec(model_path="", lora=LORA), lr=1e-2)
    trainer.export_hf(tmp_path / "first")
    start = dataclasses.replace(LORA, adapter_path=str(tmp_path / "first" / "adapter"))
    pushes = AdapterPushes(start, "/base", root=tmp_path / "pushes")
    assert pushes.request_kwargs() == {
        "lora_name": "rlzoo-start-adapter",
        "lora_int_id": START_ADAPTER_ID,
        "lora_path": str(tmp_path / "first" / "adapter"),
    }
    pushes.write(trainer.export_weights(), 1)
    assert pushes.request_kwargs()["lora_int_id"] == 1
    pushes.close()

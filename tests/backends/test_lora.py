"""LoRA on the native train backend and the native rollout engine (tiny Qwen2, CPU, fp32, real peft)."""

from __future__ import annotations

import copy
import math
import random

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from rlzoo.backends.native.rollout import NativeRolloutBackend
from rlzoo.backends.native.rollout_params import NativeRolloutParams
from rlzoo.kernel.errors import RlzooError
from rlzoo.kernel.protocols import GenerationRequest, SamplingParams
from rlzoo.kernel.settings import LoraSettings, RolloutSpec, TrainSpec
from rlzoo.train_kit import lora

from .test_native_train import (
    TokenMeanPG,
    ValueMSE,
    backend,
    manual_log_probs,
    sample_batch,
    tiny_model,
    train_then_save,
)

peft = pytest.importorskip("peft")

LORA = LoraSettings(rank=4, alpha=8.0)


def lora_backend(model=None, *, lora_settings=LORA, **kw):
    spec = kw.pop("spec", None) or TrainSpec(model_path="", need_reference=True)
    spec = TrainSpec(**{**spec.__dict__, "lora": lora_settings})
    kw.setdefault("lr", 1e-2)
    return backend(model if model is not None else tiny_model(), spec=spec, **kw)


def trained(be, steps: int = 3, seed: int = 0):
    batch = sample_batch(seed=seed)
    obj = TokenMeanPG(float(batch["response_mask"].sum()))
    for _ in range(steps):
        be.update_policy(batch, obj)
    return batch


def test_only_the_adapter_trains_and_the_reference_is_the_base_model():
    base = tiny_model()
    be = lora_backend(copy.deepcopy(base))
    assert be.ref is not None and not list(be.ref.parameters())  # no second copy of the weights
    trainable = [n for n, p in be.actor.named_parameters() if p.requires_grad]
    assert trainable and all(lora.is_adapter_name(n) for n in trainable)
    frozen = {n: p.detach().clone() for n, p in be.actor.named_parameters() if not p.requires_grad}
    batch = trained(be)
    for n, p in be.actor.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n
    # the adapters moved the policy; the reference is exactly the untouched base model
    act, _ = be.compute_log_probs(batch)
    ref, _ = be.compute_log_probs(batch, model="ref")
    want, _ = manual_log_probs(base, batch)
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(ref[mask].double(), want[mask], atol=1e-5, rtol=0)
    assert not torch.allclose(act[mask].double(), want[mask], atol=1e-3)
    be.actor.train()  # the reference call restores the actor's mode
    be.ref(**{k: batch[k] for k in ("input_ids", "attention_mask")})
    assert be.actor.training


def test_a_push_is_the_adapter_only_and_the_engine_reproduces_the_trainers_log_probs():
    base = tiny_model()
    be = lora_backend(copy.deepcopy(base))
    trained(be)
    pushed = [(n, t.detach().clone()) for n, t in be.export_weights()]
    assert pushed and all(lora.is_adapter_name(n) for n, _ in pushed)
    n_adapter = sum(t.numel() for _, t in pushed)
    n_full = sum(t.numel() for t in base.state_dict().values())
    assert n_adapter < n_full / 5

    spec = RolloutSpec(
        model_path="", tokenizer_path="", max_prompt_length=16, max_response_length=6, lora=LORA
    )
    params = NativeRolloutParams(background_thread=False, max_num_seqs=4)
    engine = NativeRolloutBackend(params, spec, model=copy.deepcopy(base))
    engine.update_weights(pushed, version=be.version)
    requests = [
        GenerationRequest(
            request_id=f"r{i}",
            prompt_ids=list(range(1 + i, 5 + i)),
            sampling=SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=i),
        )
        for i in range(3)
    ]
    samples = engine.generate(requests)
    assert all(s.versions and set(s.versions) == {be.version} for s in samples)
    from rlzoo.train.batching import samples_to_batch

    batch = samples_to_batch(samples, None, pad_token_id=0)
    lp, _ = be.compute_log_probs(batch)
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(lp[mask], batch["rollout_log_probs"][mask], atol=1e-5, rtol=0)
    engine.shutdown()


def test_export_writes_the_merged_model_and_a_peft_adapter(tmp_path):
    base = tiny_model()
    base.save_pretrained(tmp_path / "base")
    be = lora_backend(copy.deepcopy(base))
    batch = trained(be)
    be.export_hf(tmp_path / "final")
    fwd = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        want = be.actor.eval()(**fwd).logits
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
        torch.testing.assert_close(merged(**fwd).logits, want, atol=1e-5, rtol=0)
        assert not any("lora" in k or "base_layer" in k for k in merged.state_dict())
        from peft import PeftModel

        adapted = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(tmp_path / "base"), tmp_path / "final" / "adapter"
        )
        torch.testing.assert_close(adapted(**fwd).logits, want, atol=1e-6, rtol=0)
        # peft's own merge gives the same weights as rlzoo's
        peft_merged = adapted.merge_and_unload().state_dict()
    for k, v in merged.state_dict().items():
        torch.testing.assert_close(v, peft_merged[k], atol=1e-6, rtol=0, msg=k)


def test_checkpoint_holds_the_adapter_and_resume_is_exact(tmp_path):
    spec = TrainSpec(model_path="", need_reference=True, need_critic=True, total_steps=10)
    kw = {"lr": 1e-2, "critic_lr": 1e-3, "lr_scheduler": "cosine", "warmup_steps": 2, "micro_batch_size": 2}
    model = tiny_model()
    a = lora_backend(copy.deepcopy(model), spec=spec, **kw)
    batch, pg, vf, draws = train_then_save(a, tmp_path / "ckpt", {"data_pos": 7})

    from rlzoo.train_kit import checkpoint as ckpt

    saved = ckpt.load_state_dict(tmp_path / "ckpt" / "actor" / "model.safetensors")
    assert set(saved) == {n for n, _ in lora.adapter_items(a.actor.state_dict())}  # the adapter only
    n_opt = len(ckpt.load_tree(tmp_path / "ckpt" / "actor", "optimizer")["state"])
    assert n_opt == len(saved)  # AdamW state for the adapter tensors only

    b = lora_backend(copy.deepcopy(model), spec=spec, **kw)
    assert b.load_checkpoint(tmp_path / "ckpt") == {"data_pos": 7}
    assert (random.random(), np.random.rand()) == draws[:2] and torch.equal(torch.rand(2), draws[2])
    ma, mb = a.update_policy(batch, pg), b.update_policy(batch, pg)
    a.update_critic(batch, vf)
    b.update_critic(batch, vf)
    assert ma["actor/lr"] == mb["actor/lr"] == pytest.approx(1e-2 * (1 + math.cos(math.pi / 8)) / 2)
    for (na, ta), (nb, tb) in zip(a.actor.state_dict().items(), b.actor.state_dict().items()):
        assert na == nb and torch.equal(ta, tb), na
    for (na, ta), (_, tb) in zip(a.critic.state_dict().items(), b.critic.state_dict().items()):
        assert torch.equal(ta, tb), na

    # a full fine-tuning backend refuses the adapter checkpoint, naming the difference
    full = backend(copy.deepcopy(model), spec=spec, **kw)
    with pytest.raises(ValueError, match=r"trainer\.lora"):
        full.load_checkpoint(tmp_path / "ckpt")


def test_ppo_critic_is_fully_trained_beside_a_lora_actor():
    spec = TrainSpec(model_path="", need_critic=True)
    be = lora_backend(spec=spec, critic_lr=1e-2)
    assert not any(lora.is_adapter_name(n) for n, _ in be.critic.named_parameters())
    assert all(p.requires_grad for p in be.critic.parameters())
    batch = sample_batch(seed=4)
    obj = ValueMSE(float(batch["response_mask"].sum()))
    losses = [be.update_critic(batch, obj)["critic/loss"] for _ in range(3)]
    assert losses[-1] < losses[0]


def test_bfloat16_weights_train_bfloat16_adapters():
    be = lora_backend(dtype="bfloat16")
    assert {p.dtype for p in be.actor.parameters()} == {torch.bfloat16}  # one dtype, as without LoRA
    before = {n: t.clone() for n, t in be.export_weights()}
    trained(be, steps=1)
    after = dict(be.export_weights())
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_unknown_target_modules_are_refused_with_the_models_module_names():
    with pytest.raises(RlzooError, match=r"\['qproj'\].*'q_proj'.*'v_proj'"):
        lora_backend(lora_settings=LoraSettings(target_modules=("qproj", "v_proj")))
    with pytest.raises(ValueError, match="rank must be >= 1"):
        LoraSettings(rank=0)


def test_exclude_modules_keeps_matching_layers_without_adapters():
    # everything linear but the layer-0 attention's projections (a full-name regular expression, as peft)
    be = lora_backend(
        lora_settings=LoraSettings(rank=4, alpha=8.0, exclude_modules=r".*layers\.0\.self_attn\..*")
    )
    adapted = {n.split(".lora_")[0] for n, p in be.actor.named_parameters() if p.requires_grad}
    assert adapted and not any(".layers.0.self_attn." in n for n in adapted)
    assert any(".layers.0.mlp." in n for n in adapted)
    full = {n.split(".lora_")[0] for n, p in lora_backend().actor.named_parameters() if p.requires_grad}
    assert {n for n in full if ".layers.0.self_attn." in n} == full - adapted
    with pytest.raises(ValueError, match=r"exclude_modules '\(' is not a regular expression"):
        LoraSettings(exclude_modules="(")


def test_a_rank_above_the_models_width_is_refused_before_training():
    # tiny_qwen2_config: hidden_size 32, so rank 33 can never be used; rank 32 can
    with pytest.raises(RlzooError, match=r"trainer.lora.rank: 33 is more than the width .*hidden size 32"):
        lora.check_target_modules(tiny_model(), LoraSettings(rank=33))
    lora.check_target_modules(tiny_model(), LoraSettings(rank=32))


def test_continuing_from_a_saved_adapter_starts_at_that_adapters_model(tmp_path):
    """trainer.lora.adapter_path: the first log-probs are the saved adapter's model (PEFT's own load),
    and its adapters keep training."""
    base = tiny_model()
    base.save_pretrained(tmp_path / "base")
    first = lora_backend(copy.deepcopy(base))
    batch = trained(first)
    first.export_hf(tmp_path / "final")
    folder = tmp_path / "final" / "adapter"

    settings = LoraSettings(rank=4, alpha=8.0, adapter_path=str(folder))
    cont = lora_backend(copy.deepcopy(base), lora_settings=settings)
    got, _ = cont.compute_log_probs(batch)
    from peft import PeftModel

    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "base"), folder)
    want, _ = manual_log_probs(adapted, batch)
    fresh, _ = lora_backend(copy.deepcopy(base)).compute_log_probs(batch)
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(got[mask].double(), want[mask], atol=1e-5, rtol=0)
    assert not torch.allclose(fresh[mask], got[mask], atol=1e-3)  # not the fresh adapters (B = 0)
    before = {n: p.detach().clone() for n, p in cont.actor.named_parameters() if p.requires_grad}
    assert before and all(lora.is_adapter_name(n) for n in before)
    trained(cont, steps=1)
    assert any(not torch.equal(p, before[n]) for n, p in cont.actor.named_parameters() if n in before)


def test_an_adapter_of_other_settings_or_a_bare_folder_is_refused(tmp_path):
    base = tiny_model()
    be = lora_backend(copy.deepcopy(base))
    be.export_hf(tmp_path / "final")
    folder = str(tmp_path / "final" / "adapter")
    with pytest.raises(ValueError, match=r"rank: 8, but the adapter .* was trained with 4; set rank to 4"):
        LoraSettings(rank=8, alpha=8.0, adapter_path=folder)
    with pytest.raises(ValueError, match=r"alpha: 16.0, but .* with 8.0"):
        LoraSettings(rank=4, alpha=16.0, adapter_path=folder)
    with pytest.raises(ValueError, match=r"target_modules: \['q_proj'\]"):
        LoraSettings(rank=4, alpha=8.0, target_modules=("q_proj",), adapter_path=folder)
    (tmp_path / "bare").mkdir()
    with pytest.raises(ValueError, match=r"has no adapter_config\.json and no adapter_model\.safetensors"):
        LoraSettings(adapter_path=str(tmp_path / "bare"))
    with pytest.raises(ValueError, match="is not a folder"):
        LoraSettings(adapter_path=str(tmp_path / "nowhere"))
    # the right settings, but a file that lacks one layer's tensors: refused when the adapters load
    from safetensors.torch import load_file, save_file

    tensors = load_file(f"{folder}/adapter_model.safetensors")
    dropped = sorted(tensors)[0]
    save_file({k: v for k, v in tensors.items() if k != dropped}, f"{folder}/adapter_model.safetensors")
    with pytest.raises(RlzooError, match="does not fit this model's adapters: 1 missing"):
        lora_backend(copy.deepcopy(base), lora_settings=LoraSettings(rank=4, alpha=8.0, adapter_path=folder))

"""The native train backend on a tiny Qwen2 (CPU, fp32)."""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import random

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from rlzoo.backends.native.train import NativeTrainBackend
from rlzoo.backends.native.train_params import NativeTrainParams
from rlzoo.kernel.batch import Batch
from rlzoo.kernel.protocols import TrainBackend
from rlzoo.kernel.settings import OptimSettings, TrainSpec
from rlzoo.models.tiny import tiny_qwen2_config
from rlzoo.testing.backends import padded_ids, response_logits
from rlzoo.train_kit import checkpoint as ckpt
from rlzoo.train_kit.update import lr_multiplier

V = 64


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(seed: int = 0, tie: bool = True) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = tiny_qwen2_config(V, tie_word_embeddings=tie)
    return AutoModelForCausalLM.from_config(cfg).float()


def make_batch(prompts, responses, P=None, T=None, seed=0) -> Batch:
    """Prompt left-padded to P, response right-padded to T (rlzoo.kernel.batch layout)."""
    ids, attn = padded_ids(prompts, responses, P, T)
    B, T = len(prompts), T or max(map(len, responses))
    P = ids.shape[1] - T
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    g = torch.Generator().manual_seed(seed)
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": pos,
            "responses": ids[:, P:],
            "response_mask": attn[:, P:].float(),
            "advantages": torch.randn(B, T, generator=g) * attn[:, P:],
            "returns": torch.randn(B, T, generator=g) * attn[:, P:],
        }
    )


def sample_batch(seed: int = 0, B: int = 5) -> Batch:
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, V) for _ in range(rng.randint(1, 6))] for _ in range(B)]
    responses = [[rng.randrange(1, V) for _ in range(rng.randint(1, 7))] for _ in range(B)]
    return make_batch(prompts, responses, seed=seed)


def manual_log_probs(model, batch: Batch, temperature: float = 1.0):
    """Full forward, full log_softmax: the obvious reference implementation."""
    logp = torch.log_softmax(response_logits(model, batch) / temperature, -1)  # [B, T, V]
    lp = logp.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)  # [B, T]
    ent = -(logp.exp() * logp).sum(-1)  # [B, T]
    return lp, ent


class TokenMeanPG:
    """-(log_probs * adv * mask).sum() / global_tokens, global over the whole mini-batch."""

    def __init__(self, global_tokens: float, needs_entropy: bool = False, scale: float = 1.0) -> None:
        self.global_tokens = global_tokens
        self.needs_entropy = needs_entropy
        self.scale = scale

    def __call__(self, mb, log_probs, entropy):
        mask = mb["response_mask"]  # [b, T]
        loss = -(log_probs * mb["advantages"] * mask).sum() / self.global_tokens * self.scale
        metrics = {"pg_loss": loss.detach(), "n": float(mask.sum())}
        if self.needs_entropy:
            assert entropy is not None and entropy.shape == log_probs.shape
            metrics["entropy"] = (entropy * mask).sum() / mask.sum()
        return loss, metrics


class ValueMSE:
    needs_entropy = False

    def __init__(self, global_tokens: float) -> None:
        self.global_tokens = global_tokens

    def __call__(self, mb, values, entropy):
        mask = mb["response_mask"]
        return (((values - mb["returns"]) ** 2) * mask).sum() / self.global_tokens, {}


_OPTIM = {f.name for f in dataclasses.fields(OptimSettings)}
_MICRO = {
    "micro_batch_size": "size",
    "log_prob_micro_batch_size": "log_prob_size",
    "max_tokens_per_micro_batch": "max_tokens",
}


def with_settings(spec: TrainSpec, kw: dict) -> TrainSpec:
    """``spec`` with the optimizer / micro-batch settings of ``kw`` (popped from it)."""
    optim = {k: kw.pop(k) for k in list(kw) if k in _OPTIM}
    micro = {_MICRO[k]: kw.pop(k) for k in list(kw) if k in _MICRO}
    return dataclasses.replace(
        spec,
        optim=dataclasses.replace(spec.optim, **optim),
        micro_batch=dataclasses.replace(spec.micro_batch, **micro),
    )


def backend(model=None, spec=None, **params) -> NativeTrainBackend:
    params.setdefault("device", "cpu")
    spec = with_settings(spec or TrainSpec(model_path=""), params)
    return NativeTrainBackend.from_module(
        model if model is not None else tiny_model(), NativeTrainParams(**params), spec
    )


def state(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_same_state(a, b, atol=0.0):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=k)


# ---------------------------------------------------------------------------------------------
# log-probs
# ---------------------------------------------------------------------------------------------
def test_satisfies_protocol():
    assert isinstance(backend(), TrainBackend)


def test_log_probs_match_a_full_forward_with_entropy_and_temperature():
    be = backend(log_prob_micro_batch_size=2)
    batch = sample_batch()
    mask = batch["response_mask"].bool()
    for temp in (1.0, 0.7):
        lp, ent = be.compute_log_probs(batch, with_entropy=True, temperature=temp)
        ref_lp, ref_ent = manual_log_probs(be.actor, batch, temperature=temp)
        assert lp.shape == ent.shape == batch["responses"].shape
        assert lp.dtype == torch.float32
        torch.testing.assert_close(lp[mask].double(), ref_lp[mask], atol=1e-6, rtol=0)
        torch.testing.assert_close(ent[mask].double(), ref_ent[mask], atol=1e-5, rtol=0)
        assert (lp[~mask] == 0).all() and (ent[~mask] == 0).all()
    assert be.compute_log_probs(batch)[1] is None


def test_log_probs_invariant_to_micro_batch_size_and_padding():
    batch = sample_batch(seed=1, B=6)
    mask = batch["response_mask"].bool()
    model = tiny_model()
    lp_1, _ = backend(copy.deepcopy(model), log_prob_micro_batch_size=1).compute_log_probs(batch)
    lp_all, _ = backend(copy.deepcopy(model), log_prob_micro_batch_size=6).compute_log_probs(batch)
    torch.testing.assert_close(lp_1[mask], lp_all[mask], atol=1e-6, rtol=0)

    # the same samples with 3 more prompt-pad columns and 2 more response-pad columns
    T = batch["responses"].shape[1]
    P = batch["input_ids"].shape[1] - T
    a = batch["attention_mask"].bool()
    prompts = [row[m].tolist() for row, m in zip(batch["input_ids"][:, :P], a[:, :P])]
    responses = [row[m].tolist() for row, m in zip(batch["responses"], a[:, P:])]
    wide = make_batch(prompts, responses, P=P + 3, T=T + 2)
    lp_wide, _ = backend(copy.deepcopy(model), log_prob_micro_batch_size=4).compute_log_probs(wide)
    torch.testing.assert_close(lp_wide[:, :T][mask], lp_all[mask], atol=1e-6, rtol=0)
    assert (lp_wide[:, T:] == 0).all()


# ---------------------------------------------------------------------------------------------
# updates
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("split", [{"micro_batch_size": 1}, {"max_tokens_per_micro_batch": 12}])
def test_gradient_accumulation_invariance(split):
    batch = sample_batch(seed=2, B=6)
    obj = TokenMeanPG(float(batch["response_mask"].sum()), needs_entropy=True)
    model = tiny_model()
    # eps large enough that fp32 rounding of tiny gradients cannot flip Adam's g / (|g| + eps)
    common = {"lr": 1e-3, "eps": 1e-6, "grad_clip": 1e9}
    full = backend(copy.deepcopy(model), micro_batch_size=6, **common)
    accum = backend(copy.deepcopy(model), **split, **common)
    m_full = full.update_policy(batch, obj)
    m_acc = accum.update_policy(batch, obj)
    assert m_full["actor/num_micro_batches"] == 1 and m_acc["actor/num_micro_batches"] > 1
    assert math.isclose(m_full["actor/loss"], m_acc["actor/loss"], rel_tol=1e-5, abs_tol=1e-7)
    assert math.isclose(m_full["actor/grad_norm"], m_acc["actor/grad_norm"], rel_tol=1e-5)
    assert full.version == accum.version == 1
    assert_same_state(state(full.actor), state(accum.actor), atol=1e-6)
    assert not torch.equal(state(full.actor)["lm_head.weight"], model.lm_head.weight)


def test_gradient_checkpointing_gives_the_same_update():
    batch = sample_batch(seed=6)
    obj = TokenMeanPG(float(batch["response_mask"].sum()))
    model = tiny_model()
    plain = backend(copy.deepcopy(model), lr=1e-3, eps=1e-6)
    ckpted = backend(copy.deepcopy(model), lr=1e-3, eps=1e-6, gradient_checkpointing=True)
    plain.update_policy(batch, obj)
    ckpted.update_policy(batch, obj)
    assert_same_state(state(plain.actor), state(ckpted.actor), atol=1e-6)


def test_bfloat16_runs_with_fp32_log_probs():
    be = backend(dtype="bfloat16", lr=1e-3)
    batch = sample_batch()
    assert next(be.actor.parameters()).dtype == torch.bfloat16
    lp, ent = be.compute_log_probs(batch, with_entropy=True)
    assert lp.dtype == ent.dtype == torch.float32 and torch.isfinite(lp).all()
    m = be.update_policy(batch, TokenMeanPG(float(batch["response_mask"].sum()), needs_entropy=True))
    assert m["actor/skipped_steps"] == 0.0 and math.isfinite(m["entropy"])


def test_token_packing_respects_the_budget():
    batch = sample_batch(seed=3, B=8)
    be = backend(max_tokens_per_micro_batch=10)
    mbs = be.micro_batches(batch)
    assert sum(len(mb) for mb in mbs) == 8
    for mb in mbs:
        assert len(mb) == 1 or int(mb["attention_mask"].sum()) <= 10
    # consecutive order is kept
    assert torch.equal(torch.cat([mb["input_ids"] for mb in mbs]), batch["input_ids"])


def test_non_finite_loss_skips_the_step(caplog):
    be = backend(lr=1e-2)
    batch = sample_batch()
    before = state(be.actor)
    with caplog.at_level(logging.WARNING):
        m = be.update_policy(batch, TokenMeanPG(1.0, scale=float("nan")))
    assert m["actor/skipped_steps"] == 1.0
    assert be.version == 0
    assert_same_state(state(be.actor), before)
    assert all(p.grad is None for p in be.actor.parameters())
    assert "skipped" in caplog.text
    # the next finite step goes through
    m = be.update_policy(batch, TokenMeanPG(float(batch["response_mask"].sum())))
    assert m["actor/skipped_steps"] == 0.0 and be.version == 1


def test_lr_multiplier_by_hand():
    # cosine, W=2, N=10, m=0.1: warmup 0.1 + 0.9*s/2; after, 0.1 + 0.9*(1+cos(pi*(s-2)/8))/2
    cos = {"schedule": "cosine", "warmup_steps": 2, "total_steps": 10, "min_lr_ratio": 0.1}
    assert lr_multiplier(0, **cos) == pytest.approx(0.1)
    assert lr_multiplier(1, **cos) == pytest.approx(0.55)  # 0.1 + 0.9 * 1/2
    assert lr_multiplier(2, **cos) == pytest.approx(1.0)
    assert lr_multiplier(6, **cos) == pytest.approx(0.55)  # p = 1/2, cos = 0
    assert lr_multiplier(4, **cos) == pytest.approx(0.1 + 0.9 * (1 + math.sqrt(0.5)) / 2)  # p = 1/4
    assert lr_multiplier(10, **cos) == pytest.approx(0.1)
    assert lr_multiplier(15, **cos) == pytest.approx(0.1)
    # linear, W=2, N=10: (10 - s) / 8
    lin = {"schedule": "linear", "warmup_steps": 2, "total_steps": 10}
    assert lr_multiplier(6, **lin) == pytest.approx(0.5)
    assert lr_multiplier(12, **lin) == 0.0
    # constant, W=4: s/4 then 1
    const = {"schedule": "constant", "warmup_steps": 4, "total_steps": 10, "min_lr_ratio": 0.5}
    assert [lr_multiplier(s, **const) for s in (0, 1, 4, 9)] == [0.0, 0.25, 1.0, 1.0]


def test_lr_schedule_through_updates():
    # warmup_ratio 0.25 of 8 steps -> W = 2; cosine to 0: lrs 0, 5e-4, 1e-3, 1e-3*(1+cos(pi/6))/2
    be = backend(
        spec=TrainSpec(model_path="", total_steps=8),
        lr=1e-3,
        lr_scheduler="cosine",
        warmup_ratio=0.25,
    )
    batch = sample_batch()
    obj = TokenMeanPG(float(batch["response_mask"].sum()))
    lrs = [be.update_policy(batch, obj)["actor/lr"] for _ in range(4)]
    expected = [0.0, 5e-4, 1e-3, 1e-3 * (1 + math.cos(math.pi / 6)) / 2]
    assert lrs == pytest.approx(expected)
    assert be.optimizer.param_groups[0]["lr"] == pytest.approx(expected[-1])


def test_params_validation():
    with pytest.raises(ValueError, match="lr_scheduler"):
        OptimSettings(lr_scheduler="step")
    with pytest.raises(ValueError, match="not both"):
        OptimSettings(warmup_steps=2, warmup_ratio=0.1)


# ---------------------------------------------------------------------------------------------
# reference and critic
# ---------------------------------------------------------------------------------------------
def test_reference_stays_frozen():
    be = backend(spec=TrainSpec(model_path="", need_reference=True), lr=1e-2)
    batch = sample_batch()
    ref0, _ = be.compute_log_probs(batch, model="ref")
    act0, _ = be.compute_log_probs(batch)
    torch.testing.assert_close(ref0, act0, atol=0, rtol=0)
    obj = TokenMeanPG(float(batch["response_mask"].sum()))
    for _ in range(3):
        be.update_policy(batch, obj)
    ref1, _ = be.compute_log_probs(batch, model="ref")
    act1, _ = be.compute_log_probs(batch)
    assert torch.equal(ref0, ref1)
    assert not torch.allclose(act0, act1)
    assert not any(p.requires_grad for p in be.ref.parameters())
    with pytest.raises(ValueError, match="no reference"):
        backend().compute_log_probs(batch, model="ref")


def test_critic_values_and_update_lowers_mse(tmp_path):
    # load through from_pretrained: the critic is AutoModel (the base model) of the same path
    tiny_model(tie=False).save_pretrained(tmp_path / "m")
    spec = TrainSpec(model_path=str(tmp_path / "m"), need_critic=True)
    be = NativeTrainBackend(
        NativeTrainParams(device="cpu"), with_settings(spec, {"critic_lr": 1e-2, "micro_batch_size": 2})
    )
    batch = sample_batch(seed=4)
    values = be.compute_values(batch)
    assert values.shape == batch["responses"].shape and values.dtype == torch.float32
    assert (values == 0).all()  # zero-initialised value head
    obj = ValueMSE(float(batch["response_mask"].sum()))
    losses = [be.update_critic(batch, obj)["critic/loss"] for _ in range(5)]
    assert losses[-1] < losses[0]
    values = be.compute_values(batch)
    assert (values[batch["response_mask"] == 0] == 0).all()
    assert be.critic_steps == 5 and be.version == 0


def test_the_critic_steps_on_its_own_schedule():
    spec = TrainSpec(model_path="", need_critic=True, total_steps=4)
    kw = {"lr": 1e-3, "critic_lr": 1e-2, "critic_lr_scheduler": "linear", "critic_warmup_steps": 2}
    be = backend(tiny_model(tie=False), spec=spec, **kw, micro_batch_size=2)
    batch = sample_batch(seed=4)
    obj = ValueMSE(float(batch["response_mask"].sum()))
    lrs = [be.update_critic(batch, obj)["critic/lr"] for _ in range(4)]
    # linear warmup over 2 steps from 0, then linear decay to 0 at step N=4: (N - s) / (N - W)
    assert lrs == pytest.approx([0.0, 0.5e-2, 1e-2, 0.5e-2])
    assert be.update_policy(batch, TokenMeanPG(float(batch["response_mask"].sum())))["actor/lr"] == 1e-3


# ---------------------------------------------------------------------------------------------
# checkpoints and weights
# ---------------------------------------------------------------------------------------------
def train_then_save(a, ckpt_dir, extra):
    """Three policy + critic updates of ``a`` on one batch, then the RNGs seeded (1, 2, 3), a
    checkpoint with ``extra`` saved to ``ckpt_dir`` and one draw of each RNG: what a backend resumed
    from it must draw next. Returns the batch, both objectives and the draws."""
    batch = sample_batch(seed=5)
    pg = TokenMeanPG(float(batch["response_mask"].sum()))
    vf = ValueMSE(float(batch["response_mask"].sum()))
    for _ in range(3):
        a.update_policy(batch, pg)
        a.update_critic(batch, vf)
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    a.save_checkpoint(ckpt_dir, extra)
    return batch, pg, vf, (random.random(), np.random.rand(), torch.rand(2))


def test_checkpoint_round_trip(tmp_path):
    spec = TrainSpec(model_path="", need_reference=True, need_critic=True, total_steps=10)
    kw = {"lr": 1e-3, "critic_lr": 1e-3, "lr_scheduler": "cosine", "warmup_steps": 2, "micro_batch_size": 2}
    model = tiny_model()
    a = backend(copy.deepcopy(model), spec=spec, **kw)
    batch, pg, vf, draws = train_then_save(a, tmp_path / "ckpt", {"data_pos": 7, "epoch": 1, "uids": ["x/0"]})
    assert (tmp_path / "ckpt" / ckpt.COMPLETE_MARKER).is_file()
    assert not (tmp_path / "ckpt.tmp").exists()

    b = backend(copy.deepcopy(model), spec=spec, **kw)
    extra = b.load_checkpoint(tmp_path / "ckpt")
    assert extra == {"data_pos": 7, "epoch": 1, "uids": ["x/0"]}
    assert (random.random(), np.random.rand()) == draws[:2]
    assert torch.equal(torch.rand(2), draws[2])
    assert b.version == a.version == 3 and b.critic_steps == 3
    assert_same_state(state(a.actor), state(b.actor))
    assert_same_state(state(a.critic), state(b.critic))
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    for pid in sa["state"]:
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sa["state"][pid][key], sb["state"][pid][key])
    assert sa["param_groups"] == sb["param_groups"]
    # the reference is the initial weights in both
    torch.testing.assert_close(
        a.compute_log_probs(batch, model="ref")[0], b.compute_log_probs(batch, model="ref")[0], atol=0, rtol=0
    )

    # a further step (same lr from the restored schedule position) gives identical weights
    ma, mb = a.update_policy(batch, pg), b.update_policy(batch, pg)
    a.update_critic(batch, vf)
    b.update_critic(batch, vf)
    assert ma["actor/lr"] == mb["actor/lr"] == pytest.approx(1e-3 * (1 + math.cos(math.pi / 8)) / 2)
    assert_same_state(state(a.actor), state(b.actor))
    assert_same_state(state(a.critic), state(b.critic))

    # tied embeddings are stored once and come back under both names
    assert b.actor.lm_head.weight.data_ptr() == b.actor.model.embed_tokens.weight.data_ptr()

    # saving again over the same path replaces it atomically
    a.save_checkpoint(tmp_path / "ckpt", {"data_pos": 8})
    assert b.load_checkpoint(tmp_path / "ckpt") == {"data_pos": 8}
    assert b.version == 4


def test_incomplete_checkpoint_is_rejected(tmp_path, monkeypatch):
    be = backend()
    be.save_checkpoint(tmp_path / "good", {"step": 1})
    (tmp_path / "good" / ckpt.COMPLETE_MARKER).unlink()
    with pytest.raises(ckpt.IncompleteCheckpointError, match="no COMPLETE marker"):
        be.load_checkpoint(tmp_path / "good")
    with pytest.raises(ckpt.IncompleteCheckpointError, match="does not exist"):
        be.load_checkpoint(tmp_path / "missing")

    # a save interrupted half way leaves the previous checkpoint intact and no valid new one
    be.save_checkpoint(tmp_path / "c", {"step": 1})

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt, "rng_state", boom)
    with pytest.raises(KeyboardInterrupt):
        be.save_checkpoint(tmp_path / "c", {"step": 2})
    assert be.load_checkpoint(tmp_path / "c") == {"step": 1}
    with pytest.raises(ckpt.IncompleteCheckpointError):
        be.load_checkpoint(tmp_path / "c.tmp")
    with pytest.raises(TypeError, match="JSON"):
        be.save_checkpoint(tmp_path / "d", {"x": object()})


def test_export_weights_round_trip(tmp_path):
    be = backend(lr=1e-2)
    batch = sample_batch()
    be.update_policy(batch, TokenMeanPG(float(batch["response_mask"].sum())))
    fresh = tiny_model(seed=123)
    fresh.load_state_dict(dict(be.export_weights()), strict=True)
    fwd = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        torch.testing.assert_close(fresh(**fwd).logits, be.actor(**fwd).logits, atol=0, rtol=0)

    be.export_hf(tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        torch.testing.assert_close(loaded(**fwd).logits, be.actor(**fwd).logits, atol=1e-6, rtol=0)


def test_shutdown_drops_models():
    be = backend(spec=TrainSpec(model_path="", need_reference=True))
    be.shutdown()
    assert be.actor is None and be.ref is None

"""Mixed precision in the native train backend: ``autocast: bfloat16`` (fp32 weights, bf16 matmuls)."""

from __future__ import annotations

import pytest
import torch

from rlzoo.backends.native.train_params import NativeTrainParams

from .test_native_train import TokenMeanPG, backend, sample_batch, state, tiny_model


def test_autocast_keeps_fp32_weights_and_gives_close_log_probs() -> None:
    batch = sample_batch(B=6)
    fp32 = backend(tiny_model(), lr=1e-3)
    mixed = backend(tiny_model(), lr=1e-3, autocast="bfloat16")
    assert {p.dtype for p in mixed.actor.parameters()} == {torch.float32}
    want, _ = fp32.compute_log_probs(batch)
    got, ent = mixed.compute_log_probs(batch, with_entropy=True)
    assert got.dtype == ent.dtype == torch.float32
    diff = (got - want).abs().max().item()
    assert 0.0 < diff < 0.05, diff  # bf16 matmuls really ran (not bit-equal), and stay close


def test_autocast_update_follows_the_fp32_update() -> None:
    batch = sample_batch(B=6)
    fp32 = backend(tiny_model(), lr=1e-3)
    mixed = backend(tiny_model(), lr=1e-3, autocast="bfloat16")
    before = state(fp32.actor)
    obj = TokenMeanPG(float(batch["response_mask"].sum()))
    fp32.update_policy(batch, obj)
    m = mixed.update_policy(batch, obj)
    assert m["actor/skipped_steps"] == 0.0
    a, b = state(fp32.actor), state(mixed.actor)
    da = torch.cat([(a[k] - before[k]).flatten() for k in before])
    db = torch.cat([(b[k] - before[k]).flatten() for k in before])
    assert {v.dtype for v in b.values()} == {torch.float32}
    # Adam's first step is ~lr * sign(grad): the same direction where the gradients agree in sign
    cos = torch.nn.functional.cosine_similarity(da, db, dim=0).item()
    assert cos > 0.9, cos


def test_autocast_params_are_validated() -> None:
    with pytest.raises(ValueError, match="needs dtype 'float32'"):
        NativeTrainParams(dtype="bfloat16", autocast="bfloat16")
    with pytest.raises(ValueError, match="autocast must be null, 'bfloat16' or 'auto'"):
        NativeTrainParams(autocast="float16")

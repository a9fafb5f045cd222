"""Padding-free (packed) micro-batches in the native trainer equal the padded path: log-probs,
entropy, values, losses and gradients (tiny Qwen2, CPU, fp32)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from rlzoo.backends.native.train import NativeTrainBackend
from rlzoo.backends.native.train_params import NativeTrainParams
from rlzoo.kernel.settings import MicroBatchSettings, TrainSpec
from rlzoo.train_kit.attention import PACKED_SDPA

from .test_native_train import TokenMeanPG, ValueMSE, sample_batch, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def _pair(max_tokens: int | None, attn: str):
    model = tiny_model(seed=1)
    spec = TrainSpec(
        model_path="",
        need_critic=True,
        micro_batch=MicroBatchSettings(size=2, max_tokens=max_tokens, log_prob_size=3, log_prob_chunk=4),
    )
    params = NativeTrainParams(device="cpu", attn_implementation=attn)
    padded = NativeTrainBackend.from_module(copy.deepcopy(model), params, spec)
    packed = NativeTrainBackend.from_module(
        copy.deepcopy(model), dataclasses.replace(params, use_remove_padding=True), spec
    )
    padded.actor.config._attn_implementation = attn
    padded.critic.backbone.config._attn_implementation = attn
    if attn == "sdpa":  # packed rows attend per sequence (rlzoo.train_kit.attention)
        assert packed.actor.config._attn_implementation == PACKED_SDPA
        assert packed.critic.backbone.config._attn_implementation == PACKED_SDPA
    else:
        packed.actor.config._attn_implementation = attn
        packed.critic.backbone.config._attn_implementation = attn
    return padded, packed


@pytest.mark.parametrize("max_tokens,attn", [(None, "sdpa"), (12, "sdpa"), (None, "eager")])
def test_packed_equals_padded(max_tokens, attn):
    padded, packed = _pair(max_tokens, attn)
    batch = sample_batch(seed=3, B=6)  # prompts 1-6 tokens left-padded, responses 1-7 right-padded
    for with_entropy in (False, True):
        a = padded.compute_log_probs(batch, with_entropy=with_entropy, temperature=0.8)
        b = packed.compute_log_probs(batch, with_entropy=with_entropy, temperature=0.8)
        torch.testing.assert_close(b[0], a[0], atol=1e-5, rtol=1e-5)
        if with_entropy:
            torch.testing.assert_close(b[1], a[1], atol=1e-5, rtol=1e-5)
    valid = batch["attention_mask"][:, -batch["responses"].shape[1] :].bool()
    assert torch.all(b[0][~valid] == 0) and torch.all(b[0][valid] < 0)
    torch.testing.assert_close(
        packed.compute_values(batch), padded.compute_values(batch), atol=1e-5, rtol=1e-5
    )

    n = float(batch["response_mask"].sum())
    ma = padded.update_policy(batch, TokenMeanPG(n, needs_entropy=True))
    mb = packed.update_policy(batch, TokenMeanPG(n, needs_entropy=True))
    assert ma["actor/num_micro_batches"] == mb["actor/num_micro_batches"]
    for k in ("actor/loss", "actor/grad_norm", "entropy"):
        assert mb[k] == pytest.approx(ma[k], rel=1e-5, abs=1e-7), k
    for (name, p), q in zip(padded.actor.named_parameters(), packed.actor.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-4, msg=name)
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-5, msg=name)
    ca = padded.update_critic(batch, ValueMSE(n))
    cb = packed.update_critic(batch, ValueMSE(n))
    assert cb["critic/loss"] == pytest.approx(ca["critic/loss"], rel=1e-5)


def test_packed_attention_stays_within_each_sequence():
    """A sample's log-probs do not depend on the other samples packed into its row."""
    _, packed = _pair(None, "sdpa")
    batch = sample_batch(seed=5, B=4)
    alone = torch.cat([packed.compute_log_probs(batch.select([i]))[0] for i in range(4)])
    together = packed.compute_log_probs(batch)[0]
    T = min(alone.shape[1], together.shape[1])
    torch.testing.assert_close(together[:, :T], alone[:, :T], atol=1e-5, rtol=1e-5)

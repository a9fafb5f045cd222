"""Padding-free attention per sequence (rlzoo.train_kit.attention): a packed row's attention costs
its sequences, not the whole row; results equal the padded forward; padded forwards of the same
model are transformers' sdpa unchanged; models it cannot be exact for keep their own attention."""

from __future__ import annotations

import copy
import json
import logging
import random

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from rlzoo.backends.native.train import NativeTrainBackend
from rlzoo.backends.native.train_params import NativeTrainParams
from rlzoo.kernel.settings import MicroBatchSettings, TrainSpec
from rlzoo.models.tiny import tiny_llama_config, tiny_qwen2_config
from rlzoo.train_kit import attention
from rlzoo.train_kit.logprobs import actor_log_probs, critic_values, pack
from rlzoo.train_kit.models import CriticModel

from .test_native_train import TokenMeanPG, V, make_batch, sample_batch

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(cfg_fn, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = cfg_fn(V)
    cfg._attn_implementation = "sdpa"
    return AutoModelForCausalLM.from_config(cfg).float()


class _SdpaShapes:
    """Records the (query length, key length, mask given) of every sdpa call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, int, bool]] = []
        real = F.scaled_dot_product_attention

        def spy(q, k, v, attn_mask=None, *args, **kwargs):  # type: ignore[no-untyped-def]
            self.calls.append((q.shape[-2], k.shape[-2], attn_mask is not None))
            return real(q, k, v, attn_mask, *args, **kwargs)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)


@pytest.mark.parametrize("cfg_fn", [tiny_qwen2_config, tiny_llama_config], ids=["qwen2", "llama"])
def test_a_packed_row_attends_per_sequence_and_equals_the_padded_forward(cfg_fn, monkeypatch) -> None:
    # before: transformers' sdpa built one [N, N] mask over the packed row and scored all N x N pairs
    model = _model(cfg_fn)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = sample_batch(seed=3, B=6)  # prompts 1-6 tokens left-padded, responses 1-7 right-padded
    lengths = batch["attention_mask"].sum(-1).tolist()

    def log_probs_and_grads(packed: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        lp, ent = actor_log_probs(
            model, batch, keep_arg=True, temperature=0.8, with_entropy=True, packed=packed
        )  # [b, T]
        ((lp * batch["response_mask"]).sum() + ent.sum()).backward()
        return lp.detach(), [p.grad.clone() for p in model.parameters()]

    padded_lp, padded_grads = log_probs_and_grads(False)
    assert attention.install(model, what="actor")
    spy = _SdpaShapes(monkeypatch)
    packed_lp, packed_grads = log_probs_and_grads(True)
    n_layers = model.config.num_hidden_layers
    # forward and the checkpointed layers' recompute: each layer, each sequence, no mask
    assert len(spy.calls) == 2 * n_layers * len(lengths)
    assert sorted({q for q, _, _ in spy.calls}) == sorted(set(lengths))
    assert all(q == k and not masked for q, k, masked in spy.calls)
    torch.testing.assert_close(packed_lp, padded_lp, atol=1e-5, rtol=1e-5)
    for a, b in zip(packed_grads, padded_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_padded_forwards_and_generation_of_an_installed_model_are_sdpa_unchanged() -> None:
    plain, installed = _model(tiny_qwen2_config), _model(tiny_qwen2_config)
    assert attention.install(installed)
    batch = sample_batch(seed=4, B=5)
    for packed_forward in (False,):
        a = actor_log_probs(
            plain, batch, keep_arg=True, temperature=1.0, with_entropy=False, packed=packed_forward
        )
        b = actor_log_probs(
            installed, batch, keep_arg=True, temperature=1.0, with_entropy=False, packed=packed_forward
        )
        assert torch.equal(a[0], b[0])
    prompt = batch["input_ids"][:2, :6]
    mask = batch["attention_mask"][:2, :6]
    kw = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    assert torch.equal(
        plain.generate(input_ids=prompt, attention_mask=mask, **kw),
        installed.generate(input_ids=prompt, attention_mask=mask, **kw),
    )


def test_critic_values_of_a_packed_row_equal_the_padded_ones() -> None:
    backbone = _model(tiny_qwen2_config).model
    critic = CriticModel(backbone, backbone.config.hidden_size)
    torch.nn.init.normal_(critic.value_head.weight)
    batch, _, _ = _group_batch(seed=6)  # groups: the critic's packed row shares their prompts too
    padded = critic_values(critic, batch)
    assert not attention.shares_prompts(critic)
    assert attention.install(backbone, what="critic")
    assert attention.shares_prompts(critic)  # found in the backbone
    torch.testing.assert_close(critic_values(critic, batch, packed=True), padded, atol=1e-5, rtol=1e-5)


def test_models_it_cannot_be_exact_for_keep_their_attention(caplog) -> None:
    eager = _model(tiny_qwen2_config)
    eager.set_attn_implementation("eager")
    windowed = _model(
        lambda v: tiny_qwen2_config(v, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    )
    with caplog.at_level(logging.INFO, logger="rlzoo"):
        assert not attention.install(eager, what="actor")
        assert not attention.install(windowed, what="actor")
    assert eager.config._attn_implementation == "eager"
    assert windowed.config._attn_implementation == "sdpa"
    assert "attn_implementation is 'eager', not sdpa" in caplog.text
    assert "sliding-window layers" in caplog.text


def test_a_packed_forward_whose_layers_get_no_positions_is_refused() -> None:
    model = _model(tiny_qwen2_config)
    attention.install(model)
    q = torch.zeros(1, 2, 6, 8)
    with attention.packed_forward(), pytest.raises(RuntimeError, match="got no position_ids"):
        attention.packed_sdpa(model.model.layers[0].self_attn, q, q, q, None, scaling=1.0)


def test_the_exported_config_names_no_rlzoo_attention(tmp_path) -> None:
    model = _model(tiny_qwen2_config)
    assert attention.install(model)
    model.save_pretrained(tmp_path)
    assert "rlzoo" not in json.dumps(json.loads((tmp_path / "config.json").read_text()))


def _group_batch(seed: int = 7):
    """3 prompts x 4 answers, the groups' rows interleaved, answers of 1-7 tokens (GRPO's layout)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, V) for _ in range(rng.randint(2, 6))] for _ in range(3)]
    rows = [(g, [rng.randrange(1, V) for _ in range(rng.randint(1, 7))]) for _ in range(4) for g in range(3)]
    return make_batch([prompts[g] for g, _ in rows], [r for _, r in rows], seed=seed), prompts, rows


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_group_shares_its_prompt_and_equals_the_padded_forward(checkpointing, monkeypatch) -> None:
    # each answer attends to the one copy of its prompt: the row holds every prompt once
    model = _model(tiny_qwen2_config, seed=2)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch, prompts, rows = _group_batch()

    def run(packed: bool) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        lp, ent = actor_log_probs(
            model, batch, keep_arg=True, temperature=0.9, with_entropy=True, packed=packed
        )
        ((lp * batch["advantages"]).sum() + 0.1 * ent.sum()).backward()
        return lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]

    padded = run(False)
    assert attention.install(model)
    pk = pack(batch, share_prompts=True)
    assert pk.input_ids.shape[1] == sum(map(len, prompts)) + sum(len(r) for _, r in rows)
    layout = attention.row_layout(pk.position_ids)
    assert layout is not None and sum(seg.prefix_len > 0 for seg in layout) == len(rows) - len(prompts)
    shared = run(True)
    for a, b in zip(shared[:2], padded[:2], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for a, b in zip(shared[2], padded[2], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_rows_that_share_no_prompt_pack_as_before() -> None:
    batch = sample_batch(seed=8, B=6)
    if len({tuple(r) for r in batch["input_ids"][:, : -batch["responses"].shape[1]].tolist()}) < 6:
        pytest.skip("two sampled prompts collided")
    a, b = pack(batch), pack(batch, share_prompts=True)
    for field in ("input_ids", "position_ids", "predict_at", "targets", "response_valid"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field


def test_the_native_trainer_updates_a_shared_prompt_batch_as_the_padded_one() -> None:
    batch, _, _ = _group_batch(seed=9)
    spec = TrainSpec(model_path="", micro_batch=MicroBatchSettings(size=12, log_prob_size=12))
    model = _model(tiny_qwen2_config, seed=3)
    padded = NativeTrainBackend.from_module(copy.deepcopy(model), NativeTrainParams(device="cpu"), spec)
    packed = NativeTrainBackend.from_module(
        copy.deepcopy(model), NativeTrainParams(device="cpu", use_remove_padding=True), spec
    )
    assert attention.shares_prompts(packed.actor)
    n = float(batch["response_mask"].sum())
    ma, mb = padded.update_policy(batch, TokenMeanPG(n)), packed.update_policy(batch, TokenMeanPG(n))
    assert mb["actor/loss"] == pytest.approx(ma["actor/loss"], rel=1e-5)
    assert mb["actor/grad_norm"] == pytest.approx(ma["actor/grad_norm"], rel=1e-4)
    for p, q in zip(padded.actor.parameters(), packed.actor.parameters(), strict=True):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-5)

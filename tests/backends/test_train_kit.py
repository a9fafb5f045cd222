"""rlzoo.train_kit: chunked log-probs / entropy equal the unchunked fp32 computation, values and
gradients, and keep no fp32 [B, T, V] copy for the backward."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlzoo.backends.megatron.vocab_parallel import simulate_vocab_parallel
from rlzoo.kernel.batch import Batch
from rlzoo.kernel.settings import MicroBatchSettings
from rlzoo.models.tiny import tiny_qwen2_config
from rlzoo.train_kit.logprobs import (
    actor_log_probs,
    chunked_token_fn,
    chunks,
    linear_token_log_probs,
    token_log_probs,
    token_log_probs_reference,
)


def _f64(logits: torch.Tensor, targets: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The textbook definition in float64: log_softmax at the target, -sum p log p."""
    logp = torch.log_softmax(logits.double() / tau, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


def _case(B: int, T: int, V: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g) * 2.0
    targets = torch.randint(0, V, (B, T), generator=g)
    # right padding as in a batch: row i has T - i real tokens; padding targets are the pad id 0
    valid = torch.arange(T).unsqueeze(0) < (T - torch.arange(B)).clamp(min=1).unsqueeze(1)  # [B, T]
    targets = torch.where(valid, targets, 0)
    w_lp = torch.randn(B, T, generator=g) * valid / valid.sum()  # a token-mean loss over valid tokens
    w_ent = torch.randn(B, T, generator=g) * valid / valid.sum()
    return logits, targets, valid, w_lp, w_ent


def _grads(fn, logits, targets, w_lp, w_ent, entropy):
    x = logits.clone().requires_grad_(True)
    lp, ent = fn(x, targets)
    loss = (lp * w_lp).sum() + ((ent * w_ent).sum() if entropy else 0.0)
    loss.backward()
    return lp.detach(), None if ent is None else ent.detach(), x.grad


@pytest.mark.parametrize(
    "B,T,V,chunk",
    [(3, 7, 50, 3), (3, 7, 50, 1), (2, 13, 40, 5), (4, 5, 33, 8), (4, 5, 33, 12), (2, 9, 17, 1024)],
)
@pytest.mark.parametrize("tau", [1.0, 0.7])
@pytest.mark.parametrize("entropy", [False, True])
def test_chunked_equals_unchunked_values_and_gradients(B, T, V, chunk, tau, entropy):
    """Chunk sizes that do not divide T, chunks of whole rows (T < chunk), masked padded tokens."""
    logits, targets, valid, w_lp, w_ent = _case(B, T, V)
    ref = _grads(
        lambda x, t: token_log_probs_reference(x, t, temperature=tau, with_entropy=entropy),
        logits, targets, w_lp, w_ent, entropy,
    )  # fmt: skip
    got = _grads(
        lambda x, t: token_log_probs(x, t, temperature=tau, with_entropy=entropy, chunk_tokens=chunk),
        logits, targets, w_lp, w_ent, entropy,
    )  # fmt: skip
    torch.testing.assert_close(got[0], ref[0], atol=1e-6, rtol=0)
    if entropy:
        torch.testing.assert_close(got[1], ref[1], atol=1e-6, rtol=0)
    else:
        assert got[1] is None and ref[1] is None
    torch.testing.assert_close(got[2], ref[2], atol=1e-6, rtol=0)
    assert got[2].dtype == torch.float32
    assert torch.all(got[2][~valid] == 0)  # masked (padded) tokens get no gradient
    # and both are the textbook definition (float64) to fp32 precision
    lp64, ent64 = _f64(logits, targets, tau)
    torch.testing.assert_close(got[0].double(), lp64, atol=1e-5, rtol=1e-5)
    if entropy:
        torch.testing.assert_close(got[1].double(), ent64, atol=1e-5, rtol=1e-5)


def test_chunked_gradient_no_less_accurate_than_unchunked():
    """Against a float64 autograd gradient, the chunked analytic backward's error is of the
    unchunked fp32 autograd's size (it is not the unchunked one that is exact)."""
    logits, targets, _, w_lp, w_ent = _case(4, 33, 500, seed=3)
    x64 = logits.double().requires_grad_(True)
    lp, ent = _f64(x64 * 1.0, targets, 0.8)
    ((lp * w_lp.double()).sum() + (ent * w_ent.double()).sum()).backward()
    ref = _grads(
        lambda x, t: token_log_probs_reference(x, t, temperature=0.8, with_entropy=True),
        logits, targets, w_lp, w_ent, True,
    )  # fmt: skip
    got = _grads(
        lambda x, t: token_log_probs(x, t, temperature=0.8, with_entropy=True, chunk_tokens=7),
        logits, targets, w_lp, w_ent, True,
    )  # fmt: skip
    err_ref = (ref[2].double() - x64.grad).abs().max()
    err_got = (got[2].double() - x64.grad).abs().max()
    assert err_got <= 2 * err_ref + 1e-9, (err_got, err_ref)


def test_strided_slice_and_bf16_logits():
    """A slice of a larger logits tensor is read in place; bf16 logits get a bf16 gradient equal
    to the unchunked one (which computes in fp32 from the same bf16 values) up to bf16 rounding."""
    logits, targets, _, w_lp, w_ent = _case(3, 9, 40)
    big = torch.randn(3, 11, 40)
    big[:, 1:10] = logits
    for dtype in (torch.float32, torch.bfloat16):
        outs = []
        for chunk in (0, 4):
            x = big.to(dtype).detach().requires_grad_(True)
            lp, ent = token_log_probs(
                x[:, 1:10], targets, temperature=0.9, with_entropy=True, chunk_tokens=chunk
            )
            ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()
            assert x.grad is not None and x.grad.dtype == dtype
            assert torch.all(x.grad[:, 0] == 0) and torch.all(x.grad[:, 10] == 0)
            outs.append((lp, ent, x.grad.float()))
        tol = 1e-6 if dtype == torch.float32 else 1e-2
        for a, b in zip(outs[0], outs[1]):
            torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=0)


def test_vocab_parallel_math_chunked_over_tokens():
    """Megatron's vocab-parallel formula (simulated TP=2, padded vocabulary) through
    chunked_token_fn equals the same formula on the whole tensor: values and gradients."""
    logits, targets, _, w_lp, w_ent = _case(3, 10, 48, seed=1)

    def fn(x, t):
        return simulate_vocab_parallel(x, t, 2, temperature=0.7, with_entropy=True, vocab_size=45)

    targets = targets.clamp(max=44)
    ref = _grads(fn, logits, targets, w_lp, w_ent, True)
    got = _grads(
        lambda x, t: chunked_token_fn(fn, x, t, with_entropy=True, chunk_tokens=4),
        logits, targets, w_lp, w_ent, True,
    )  # fmt: skip
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    # and equals the plain math over the real 45 columns
    lp64, ent64 = _f64(logits[..., :45], targets, 0.7)
    torch.testing.assert_close(got[0].double(), lp64, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1].double(), ent64, atol=1e-5, rtol=1e-5)


def _saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd saves for the backward while ``fn`` runs."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_fp32_copy_kept_for_backward(dtype):
    """The chunked path keeps the logits (their own dtype) and [B, T] statistics; the unchunked
    one keeps fp32 copies of [B, T, V] (the cast, the division, the softmax)."""
    B, T, V = 2, 64, 1000
    x = torch.randn(B, T, V, dtype=dtype).requires_grad_(True)
    t = torch.randint(0, V, (B, T))
    full = B * T * V * 4  # one fp32 [B, T, V]

    def run(chunk: int):
        return lambda: token_log_probs(x * 1.0, t, temperature=0.7, with_entropy=True, chunk_tokens=chunk)

    chunked, unchunked = _saved_bytes(run(16)), _saved_bytes(run(0))
    logits_bytes = B * T * V * x.element_size()
    assert chunked <= logits_bytes + 4 * B * T * 8, (chunked, logits_bytes)
    assert unchunked >= 2 * full, unchunked


def test_chunks_cover_each_position_once():
    for rows, width, step in [(3, 7, 3), (5, 2, 7), (2, 10, 10), (1, 0, 4), (4, 3, 1)]:
        hit = torch.zeros(rows, width, dtype=torch.int)
        for r, c in chunks(rows, width, step):
            hit[r, c] += 1
            assert (r.stop - r.start) * (c.stop - c.start) <= max(step, width)
        assert torch.all(hit == 1)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="chunk_tokens must be >= 0"):
        token_log_probs(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), chunk_tokens=-1)
    with pytest.raises(ValueError, match=r"logits must be \[B, T, V\]"):
        token_log_probs(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="log_prob_chunk must be >= 0"):
        MicroBatchSettings(log_prob_chunk=-2)


def test_native_actor_log_probs_chunked_equals_unchunked():
    """Through a real (tiny Qwen2) model and the native backend's padded micro-batch forward."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_qwen2_config(64)).float()
    P, T = 4, 6
    ids = torch.randint(1, 64, (3, P + T))
    attn = torch.ones(3, P + T, dtype=torch.long)
    attn[0, :2] = 0  # left-padded prompt
    attn[1, P + 3 :] = 0  # right-padded response
    ids = ids * attn
    mb = Batch({"input_ids": ids, "attention_mask": attn, "responses": ids[:, P:]})
    out = []
    for chunk in (0, 4):
        model.zero_grad()
        lp, ent = actor_log_probs(
            model, mb, keep_arg=True, temperature=0.8, with_entropy=True, chunk_tokens=chunk
        )
        (lp.sum() / 10 + ent.sum() / 10).backward()
        out.append((lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(out[0][0], out[1][0], atol=1e-6, rtol=0)
    torch.testing.assert_close(out[0][1], out[1][1], atol=1e-6, rtol=0)
    for a, b in zip(out[0][2], out[1][2]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert torch.all(out[1][0][1, 3:] == 0)  # padding stays zero


@pytest.mark.parametrize("chunk,tau", [(3, 1.0), (5, 0.7), (64, 1.3)])
def test_linear_token_log_probs_equal_logits_path(chunk, tau):
    """The LM head inside the chunks: log-probs, entropy and the gradients of hidden and weight
    equal the unchunked computation on ``hidden @ weight.T``."""
    g = torch.Generator().manual_seed(4)
    B, T, H, V = 3, 11, 16, 70
    hidden0, weight0 = torch.randn(B, T, H, generator=g), torch.randn(V, H, generator=g) / 4
    _, targets, valid, w_lp, w_ent = _case(B, T, V, seed=4)
    out = []
    for fused in (False, True):
        h, w = hidden0.clone().requires_grad_(True), weight0.clone().requires_grad_(True)
        if fused:
            lp, ent = linear_token_log_probs(
                h, w, targets, temperature=tau, with_entropy=True, chunk_tokens=chunk
            )
        else:
            lp, ent = token_log_probs_reference(h @ w.T, targets, temperature=tau, with_entropy=True)
        ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()
        out.append((lp.detach(), ent.detach(), h.grad, w.grad))
    for a, b in zip(out[1], out[0]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert torch.all(out[1][2][~valid] == 0)


def test_native_fused_lm_head_equals_logits_path():
    """The native backend with fused_lm_head (hidden states through the chunked head) and without
    (logits): same log-probs, entropy, loss and gradients, padded and packed."""
    import copy
    import dataclasses

    from rlzoo.backends.native.train import NativeTrainBackend
    from rlzoo.backends.native.train_params import NativeTrainParams
    from rlzoo.kernel.settings import TrainSpec
    from rlzoo.train_kit.models import fusable_lm_head

    from .test_native_train import TokenMeanPG, sample_batch, tiny_model

    model = tiny_model(seed=2, tie=True)
    assert fusable_lm_head(model) is model.lm_head
    spec = TrainSpec(model_path="", micro_batch=MicroBatchSettings(size=2, log_prob_size=4, log_prob_chunk=5))
    batch = sample_batch(seed=7, B=5)
    n = float(batch["response_mask"].sum())
    for packed in (False, True):
        base = NativeTrainParams(device="cpu", use_remove_padding=packed, temperature=0.9)
        res = []
        for fused in (False, True):
            be = NativeTrainBackend.from_module(
                copy.deepcopy(model), dataclasses.replace(base, fused_lm_head=fused), spec
            )
            lp, ent = be.compute_log_probs(batch, with_entropy=True)
            m = be.update_policy(batch, TokenMeanPG(n, needs_entropy=True))
            res.append((lp, ent, m, [p.grad for p in be.actor.parameters()]))
        (lp0, ent0, m0, g0), (lp1, ent1, m1, g1) = res
        torch.testing.assert_close(lp1, lp0, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(ent1, ent0, atol=1e-6, rtol=1e-5)
        assert m1["actor/loss"] == pytest.approx(m0["actor/loss"], rel=1e-5, abs=1e-8)
        for a, b in zip(g1, g0):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# the declared objective contract: accumulated metrics merged across data-parallel ranks
# ---------------------------------------------------------------------------------------------
def test_accumulated_metrics_merge_across_ranks_as_one_rank_would() -> None:
    from rlzoo.train.objective import _Accumulator

    ranks = [_Accumulator(), _Accumulator()]
    for acc in ranks:  # an earlier update, already merged: the same on both ranks
        acc.add("actor/pg_loss", 1.0)
        acc.mean("actor/clipfrac", 0.5)
    marks = [acc.mark() for acc in ranks]
    ranks[0].add("actor/pg_loss", 0.25)  # rank 0's shard: one micro-batch
    ranks[0].mean("actor/clipfrac", 0.1)
    ranks[1].add("actor/pg_loss", 0.5)  # rank 1's shard: two micro-batches
    ranks[1].add("actor/pg_loss", 0.125)
    ranks[1].mean("actor/clipfrac", 0.2)
    ranks[1].mean("actor/clipfrac", 0.3)
    added = [acc.since(m) for acc, m in zip(ranks, marks)]
    for acc, m in zip(ranks, marks):
        acc.merge(m, added)
    for acc in ranks:  # sums: 1 + 0.25 + 0.5 + 0.125; means over the 4 micro-batch values
        assert acc.summary() == {
            "actor/pg_loss": 1.875,
            "actor/clipfrac": pytest.approx((0.5 + 0.1 + 0.2 + 0.3) / 4),
        }


def test_accumulate_needs_a_dummy_for_padding_passes() -> None:
    from rlzoo.train_kit.update import accumulate

    class Never:
        needs_entropy = False

        def __call__(self, mb, out, entropy):  # type: ignore[no-untyped-def]
            raise AssertionError("a padding pass has no objective call")

    with pytest.raises(ValueError, match="dummy"):
        accumulate([None], Never(), lambda mb: (torch.zeros(1, 1), None), device=torch.device("cpu"))


def test_lr_schedule_record_is_what_a_checkpoint_keeps() -> None:
    from rlzoo.kernel.settings import OptimSettings, TrainSpec
    from rlzoo.train_kit.update import LRSchedule

    spec = TrainSpec(
        model_path="", total_steps=10, optim=OptimSettings(lr=1e-3, critic_lr=2e-3, warmup_ratio=0.2)
    )
    sched = LRSchedule.from_spec(spec)
    assert sched.warmup_steps == 2  # warmup_ratio 0.2 of 10 steps
    rec = sched.record(1, 3)
    assert rec["actor"] == {"steps": 1, "next_lr": pytest.approx(0.5e-3)}  # constant: s / W during warmup
    assert rec["critic"] == {  # no schedule of its own: the actor's, warmup included
        "steps": 3,
        "next_lr": pytest.approx(2e-3),
        "schedule": "constant",
        "warmup_steps": 2,
    }
    assert (rec["schedule"], rec["warmup_steps"], rec["total_steps"]) == ("constant", 2, 10)


def test_the_critic_has_its_own_schedule_when_set() -> None:
    import math

    from rlzoo.kernel.settings import OptimSettings, TrainSpec
    from rlzoo.train_kit.update import LRSchedule

    optim = OptimSettings(
        lr=1e-3,
        lr_scheduler="constant",
        warmup_steps=4,
        critic_lr=2e-3,
        critic_lr_scheduler="cosine",
        critic_warmup_ratio=0.1,
        critic_min_lr_ratio=0.5,
    )
    sched = LRSchedule.from_spec(TrainSpec(model_path="", total_steps=20, optim=optim))
    assert (sched.warmup_steps, sched.critic_warmup_steps) == (4, 2)  # 0.1 of 20 optimizer steps
    # the actor: constant after a 4-step linear warmup, untouched by the critic's settings
    assert [sched.lr(s) for s in (0, 2, 4, 19)] == pytest.approx([0.0, 0.5e-3, 1e-3, 1e-3])
    # the critic: 2-step warmup (from its floor, as HF), then cosine from 2e-3 to 0.5 * 2e-3 over the remaining 18 steps
    assert sched.lr(1, critic=True) == pytest.approx(2e-3 * (0.5 + 0.5 * 1 / 2))  # warmup from m = 0.5
    for s in (2, 11, 20):
        p = (s - 2) / 18
        expected = 2e-3 * (0.5 + 0.5 * 0.5 * (1 + math.cos(math.pi * p)))
        assert sched.lr(s, critic=True) == pytest.approx(expected)
    assert sched.record(0, 11)["critic"]["schedule"] == "cosine"


def test_the_critic_schedule_settings_are_checked() -> None:
    from rlzoo.kernel.settings import OptimSettings

    with pytest.raises(ValueError, match="critic_lr_scheduler must be one of constant, linear, cosine"):
        OptimSettings(critic_lr_scheduler="step")
    with pytest.raises(ValueError, match="set critic_warmup_steps or critic_warmup_ratio, not both"):
        OptimSettings(critic_warmup_steps=3, critic_warmup_ratio=0.1)
    with pytest.raises(ValueError, match="critic_warmup_ratio"):
        OptimSettings(critic_warmup_ratio=1.5)


def test_an_objective_without_needs_entropy_is_refused_with_the_contract() -> None:
    from rlzoo.backends.native.train import NativeTrainBackend

    from .test_native_train import sample_batch, tiny_model

    be = NativeTrainBackend.from_module(tiny_model())

    def plain(mb, log_probs, entropy):  # type: ignore[no-untyped-def]
        return log_probs.sum(), {}

    with pytest.raises(TypeError, match=r"not an rlzoo\.kernel\.protocols\.Objective.*needs_entropy"):
        be.update_policy(sample_batch(), plain)

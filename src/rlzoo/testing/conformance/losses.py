"""Conformance suites of the loss kinds: ``policy_loss``, ``loss_agg``, ``kl`` and
``rollout_correction``."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from rlzoo.kernel.protocols import AggContext, CorrectionInputs, PolicyLossInputs
from rlzoo.testing.conformance.base import ComponentConformance
from rlzoo.testing.conformance.checks import assert_close, assert_finite, garbage, lazy_torch, length_mask

if TYPE_CHECKING:
    from torch import Tensor


# ---------------------------------------------------------------------------------------------
# policy loss
# ---------------------------------------------------------------------------------------------
def token_mean_agg(mask: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
    """A reference ``agg(per_token_loss, mask)`` bound to the token count of ``mask`` [B, T]."""
    torch = lazy_torch()
    n = max(float(mask.bool().sum().item()), 1.0)

    def agg(per_token_loss: Tensor, m: Tensor) -> Tensor:
        return torch.where(m.bool(), per_token_loss, torch.zeros_like(per_token_loss)).sum() / n

    return agg


class PolicyLossConformance(ComponentConformance):
    """``fn(PolicyLossInputs, params) -> PolicyLossOutput``: a scalar aggregated with ``inputs.agg``."""

    kind = "policy_loss"

    def make_inputs(
        self, lengths: Sequence[int] = (5, 3, 1, 4), T: int | None = None, seed: int = 0
    ) -> PolicyLossInputs:
        torch = lazy_torch()
        g = torch.Generator().manual_seed(seed)
        B, T = len(lengths), T or max(max(lengths), 1)
        mask = length_mask(lengths, T)  # [B, T]
        old = -torch.rand(B, T, generator=g) * 2 - 0.05  # [B, T] log-probs < 0
        new = (old + torch.randn(B, T, generator=g) * 0.2).clamp(max=-1e-3)  # [B, T]
        return PolicyLossInputs(
            log_probs=new.requires_grad_(True),
            old_log_probs=old,
            advantages=torch.randn(B, T, generator=g) * mask,  # [B, T]
            response_mask=mask,
            agg=token_mean_agg(mask),
            entropy=torch.rand(B, T, generator=g) if self.component.capability("needs_entropy") else None,
        )

    def run(self, inputs: PolicyLossInputs) -> Any:
        out = self.make_part()(inputs, self.params)
        assert hasattr(out, "loss") and hasattr(out, "metrics"), (
            f"expected a PolicyLossOutput, got {type(out).__name__}"
        )
        return out

    def _check_valid(self, out: Any) -> None:
        assert out.loss.ndim == 0, f"loss must be a scalar, got shape {tuple(out.loss.shape)}"
        assert_finite(out.loss, "loss")
        assert isinstance(out.metrics, dict), f"metrics must be a dict, got {type(out.metrics).__name__}"
        for k, v in out.metrics.items():
            assert_finite(v, f"metric {k!r}")

    def test_scalar_loss_and_metrics(self) -> None:
        self._check_valid(self.run(self.make_inputs()))

    def test_aggregates_through_agg(self) -> None:
        inputs = self.make_inputs()
        calls: list[int] = []
        inner = inputs.agg

        def agg(per_token_loss: Tensor, mask: Tensor) -> Tensor:
            calls.append(1)
            return inner(per_token_loss, mask)

        inputs.agg = agg
        self._check_valid(self.run(inputs))
        if not calls:
            pytest.fail(
                f"policy loss {self.name!r} never called inputs.agg (the contract: aggregate through it)"
            )

    def test_gradients_finite_and_zero_where_masked(self) -> None:
        inputs = self.make_inputs()
        out = self.run(inputs)
        out.loss.backward()
        grad = inputs.log_probs.grad
        assert grad is not None, "loss does not depend on log_probs"
        assert_finite(grad, "d loss / d log_probs")
        masked = ~inputs.response_mask.bool()
        assert (grad[masked] == 0).all(), f"gradient reaches masked positions: {grad[masked]}"

    def test_masked_inputs_do_not_leak(self) -> None:
        torch = lazy_torch()
        inputs = self.make_inputs()
        base = self.run(inputs)
        masked = ~inputs.response_mask.bool()
        dirty = copy.copy(inputs)
        garbage_lp = -garbage(inputs.log_probs, 3, scale=20.0).abs()  # [B, T] in [-20, 0]
        dirty.log_probs = torch.where(masked, garbage_lp, inputs.log_probs.detach()).requires_grad_(True)
        dirty.old_log_probs = torch.where(
            masked, -garbage(inputs.old_log_probs, 4, scale=20.0).abs(), inputs.old_log_probs
        )
        dirty.advantages = torch.where(masked, garbage(inputs.advantages, 5, 100.0), inputs.advantages)
        if inputs.entropy is not None:
            dirty.entropy = torch.where(masked, garbage(inputs.entropy, 6).abs(), inputs.entropy)
        out = self.run(dirty)
        self._check_valid(out)
        assert_close(out.loss.detach(), base.loss.detach(), "loss after changing masked inputs")

    def test_unit_rollout_weights_change_nothing(self) -> None:
        torch = lazy_torch()
        base = self.run(self.make_inputs())
        inputs = self.make_inputs()
        inputs.rollout_is_weights = torch.ones_like(inputs.old_log_probs)
        assert_close(self.run(inputs).loss.detach(), base.loss.detach(), "loss with rollout_is_weights = 1")

    def test_fully_masked_row(self) -> None:
        self._check_valid(self.run(self.make_inputs(lengths=(4, 0, 2, 0))))

    def test_fully_masked_batch(self) -> None:
        inputs = self.make_inputs(lengths=(0, 0, 0), T=4)
        out = self.run(inputs)
        self._check_valid(out)
        out.loss.backward()
        if inputs.log_probs.grad is not None:
            assert_finite(inputs.log_probs.grad, "d loss / d log_probs (all masked)")

    def test_length_one_responses(self) -> None:
        self._check_valid(self.run(self.make_inputs(lengths=(1, 1, 1))))

    def test_deterministic(self) -> None:
        torch = lazy_torch()
        a, b = self.run(self.make_inputs()), self.run(self.make_inputs())
        assert torch.equal(a.loss.detach(), b.loss.detach())


# ---------------------------------------------------------------------------------------------
# loss aggregation
# ---------------------------------------------------------------------------------------------
class LossAggConformance(ComponentConformance):
    """``fn(per_token_loss [B, T], mask [B, T], ctx, params) -> scalar``; splits sum to the whole."""

    kind = "loss_agg"

    def make_inputs(
        self, lengths: Sequence[int] = (5, 3, 1, 4, 0, 2), T: int | None = None, seed: int = 0
    ) -> tuple[Tensor, Tensor, AggContext]:
        torch = lazy_torch()
        g = torch.Generator().manual_seed(seed)
        T = T or max(max(lengths), 1)
        mask = length_mask(lengths, T)  # [B, T]
        loss = torch.randn(len(lengths), T, generator=g).requires_grad_(True)  # [B, T]
        return loss, mask, self.context(mask)

    def context(self, mask: Tensor) -> AggContext:
        m = mask.bool()
        return AggContext(
            global_tokens=float(m.sum().item()),
            global_sequences=float(m.any(dim=-1).sum().item()),
            max_response_length=int(mask.shape[-1]),
        )

    def run(self, loss: Tensor, mask: Tensor, ctx: AggContext) -> Tensor:
        out = self.make_part()(loss, mask, ctx, self.params)
        assert out.ndim == 0, f"an aggregation returns a scalar, got shape {tuple(out.shape)}"
        assert_finite(out, "aggregated loss")
        return out  # type: ignore[no-any-return]

    def test_scalar_and_finite(self) -> None:
        self.run(*self.make_inputs())

    def test_masked_values_do_not_leak(self) -> None:
        torch = lazy_torch()
        loss, mask, ctx = self.make_inputs()
        base = self.run(loss, mask, ctx)
        dirty = torch.where(mask.bool(), loss, garbage(loss, 7, 1e4))
        assert_close(
            self.run(dirty, mask, ctx).detach(), base.detach(), "aggregate after changing masked losses"
        )

    def test_gradient_zero_where_masked(self) -> None:
        loss, mask, ctx = self.make_inputs()
        self.run(loss, mask, ctx).backward()
        assert loss.grad is not None
        assert_finite(loss.grad, "gradient")
        assert (loss.grad[~mask.bool()] == 0).all(), "gradient reaches masked positions"

    def test_micro_batch_splits_sum_to_the_whole(self) -> None:
        loss, mask, ctx = self.make_inputs()
        whole = self.run(loss, mask, ctx).detach()
        for sizes in ((1,) * 6, (2, 4), (3, 3), (5, 1)):
            parts, start = [], 0
            for s in sizes:
                parts.append(self.run(loss[start : start + s], mask[start : start + s], ctx).detach())
                start += s
            assert_close(
                lazy_torch().stack(parts).sum(), whole, f"sum over micro-batches {sizes} vs the whole batch"
            )

    def test_fully_masked_batch_is_zero(self) -> None:
        loss, mask, ctx = self.make_inputs(lengths=(0, 0, 0), T=3)
        out = self.run(loss, mask, ctx)
        assert float(out.detach()) == 0.0, f"aggregating nothing must give 0, got {float(out.detach())}"

    def test_length_one_responses(self) -> None:
        self.run(*self.make_inputs(lengths=(1, 1, 1)))

    def test_deterministic(self) -> None:
        torch = lazy_torch()
        assert torch.equal(self.run(*self.make_inputs()), self.run(*self.make_inputs()))


# ---------------------------------------------------------------------------------------------
# kl
# ---------------------------------------------------------------------------------------------
class KLConformance(ComponentConformance):
    """``fn(log_probs [B, T], ref_log_probs [B, T], params) -> kl [B, T]``, per token, not masked."""

    kind = "kl"

    def make_inputs(
        self, B: int = 4, T: int = 5, seed: int = 0, spread: float = 0.5
    ) -> tuple[Tensor, Tensor]:
        torch = lazy_torch()
        g = torch.Generator().manual_seed(seed)
        ref = -torch.rand(B, T, generator=g) * 3 - 0.01  # [B, T]
        lp = (ref + torch.randn(B, T, generator=g) * spread).clamp(max=-1e-4)  # [B, T]
        return lp.requires_grad_(True), ref

    def run(self, log_probs: Tensor, ref: Tensor) -> Tensor:
        out = self.make_part()(log_probs, ref, self.params)
        assert tuple(out.shape) == tuple(log_probs.shape), (
            f"kl shape {tuple(out.shape)}, expected {tuple(log_probs.shape)} [B, T]"
        )
        assert_finite(out, "kl")
        return out  # type: ignore[no-any-return]

    def test_shape_and_finite(self) -> None:
        self.run(*self.make_inputs())

    def test_zero_when_equal(self) -> None:
        _, ref = self.make_inputs()
        out = self.run(ref.clone().requires_grad_(True), ref)
        assert out.detach().abs().max() <= 1e-6, f"KL of a policy with itself must be 0: {out}"

    def test_per_token(self) -> None:
        torch = lazy_torch()
        lp, ref = self.make_inputs()
        base = self.run(lp, ref).detach()
        lp2 = lp.detach().clone()
        lp2[1, 2] -= 1.0
        out = self.run(lp2.requires_grad_(True), ref).detach()
        other = torch.ones_like(base, dtype=torch.bool)
        other[1, 2] = False
        assert_close(out[other], base[other], "kl at positions whose log-probs did not change")

    def test_extreme_differences_finite(self) -> None:
        lp, ref = self.make_inputs(spread=15.0)
        out = self.run(lp, ref)
        out.sum().backward()
        assert lp.grad is not None
        assert_finite(lp.grad, "d kl / d log_probs")

    def test_length_one_responses(self) -> None:
        self.run(*self.make_inputs(T=1))

    def test_deterministic(self) -> None:
        torch = lazy_torch()
        assert torch.equal(self.run(*self.make_inputs()), self.run(*self.make_inputs()))


# ---------------------------------------------------------------------------------------------
# rollout correction
# ---------------------------------------------------------------------------------------------
class RolloutCorrectionConformance(ComponentConformance):
    """``fn(CorrectionInputs, params) -> CorrectionOutput``: detached weights, a narrowed mask."""

    kind = "rollout_correction"

    def make_inputs(
        self, lengths: Sequence[int] = (5, 3, 1, 4), T: int | None = None, seed: int = 0, noise: float = 0.05
    ) -> CorrectionInputs:
        torch = lazy_torch()
        g = torch.Generator().manual_seed(seed)
        B, T = len(lengths), T or max(max(lengths), 1)
        mask = length_mask(lengths, T)  # [B, T]
        old = -torch.rand(B, T, generator=g) * 2 - 0.05  # [B, T]
        rollout = (old + torch.randn(B, T, generator=g) * noise).clamp(max=-1e-4)  # [B, T]
        return CorrectionInputs(old_log_probs=old, rollout_log_probs=rollout, response_mask=mask)

    def run(self, inputs: CorrectionInputs) -> Any:
        torch = lazy_torch()
        out = self.make_part()(inputs, self.params)
        shape = tuple(inputs.response_mask.shape)
        assert tuple(out.mask.shape) == shape, f"mask shape {tuple(out.mask.shape)}, expected {shape}"
        kept = out.mask.bool()
        assert not (kept & ~inputs.response_mask.bool()).any(), "the correction re-enabled masked tokens"
        if out.weights is not None:
            assert tuple(out.weights.shape) == shape, f"weights shape {tuple(out.weights.shape)}"
            assert not out.weights.requires_grad, "weights must be detached"
            assert_finite(out.weights, "weights")
            assert (out.weights[inputs.response_mask.bool()] >= 0).all(), "weights must be >= 0"
        assert out.mode in {"decoupled", "bypass"}, f"mode must be 'decoupled' or 'bypass', got {out.mode!r}"
        for k, v in (out.metrics or {}).items():
            assert_finite(v, f"metric {k!r}")
        del torch
        return out

    def test_output_contract(self) -> None:
        self.run(self.make_inputs())

    def test_on_policy_keeps_everything(self) -> None:
        torch = lazy_torch()
        inputs = self.make_inputs(noise=0.0)
        inputs.rollout_log_probs = inputs.old_log_probs.clone()
        out = self.run(inputs)
        valid = inputs.response_mask.bool()
        assert torch.equal(out.mask.bool(), valid), "identical log-probs must reject nothing"
        if out.weights is not None:
            assert_close(
                out.weights[valid], torch.ones_like(out.weights[valid]), "weights of identical log-probs"
            )

    def test_masked_inputs_do_not_leak(self) -> None:
        torch = lazy_torch()
        inputs = self.make_inputs()
        base = self.run(inputs)
        masked = ~inputs.response_mask.bool()
        dirty = CorrectionInputs(
            old_log_probs=torch.where(
                masked, -garbage(inputs.old_log_probs, 8, 20.0).abs(), inputs.old_log_probs
            ),
            rollout_log_probs=torch.where(
                masked, -garbage(inputs.rollout_log_probs, 9, 20.0).abs(), inputs.rollout_log_probs
            ),
            response_mask=inputs.response_mask,
        )
        out = self.run(dirty)
        valid = inputs.response_mask.bool()
        assert torch.equal(out.mask.bool(), base.mask.bool()), "rejection changed with masked inputs"
        if base.weights is not None:
            assert_close(out.weights[valid], base.weights[valid], "weights after changing masked inputs")

    def test_fully_masked_row(self) -> None:
        self.run(self.make_inputs(lengths=(4, 0, 2, 0)))

    def test_length_one_responses(self) -> None:
        self.run(self.make_inputs(lengths=(1, 1, 1)))

    def test_deterministic(self) -> None:
        torch = lazy_torch()
        a, b = self.run(self.make_inputs()), self.run(self.make_inputs())
        assert torch.equal(a.mask, b.mask)
        if a.weights is not None:
            assert torch.equal(a.weights, b.weights)

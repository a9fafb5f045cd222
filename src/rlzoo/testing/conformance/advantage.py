"""Conformance suites of the per-group kinds: ``advantage`` and ``sample_filter``."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import pytest

from rlzoo.kernel.protocols import AdvantageInputs
from rlzoo.testing.conformance.base import ComponentConformance
from rlzoo.testing.conformance.checks import assert_close, assert_finite, garbage, lazy_torch, length_mask

if TYPE_CHECKING:
    from torch import Tensor


# ---------------------------------------------------------------------------------------------
# advantage
# ---------------------------------------------------------------------------------------------
class AdvantageConformance(ComponentConformance):
    """``fn(AdvantageInputs, params) -> AdvantageOutput``; advantages zero where the mask is 0.

    Critic values at masked positions are whatever the critic computed on padding and must not
    change any unmasked output. Token rewards are zero where the mask is 0 (the reward manager
    and the in-reward KL penalty guarantee it), so an estimator may sum them unmasked, as verl
    does; set :attr:`masked_rewards_ignored` to also check that garbage rewards there do not leak.
    """

    kind = "advantage"
    #: also check that token rewards at masked positions do not change unmasked outputs
    masked_rewards_ignored: ClassVar[bool] = False

    def make_inputs(
        self,
        lengths: Sequence[int] = (5, 3, 1, 4, 5, 2),
        rewards: Sequence[float] | None = None,
        group_size: int = 3,
        T: int | None = None,
        seed: int = 0,
    ) -> AdvantageInputs:
        """Outcome rewards on the last response token; optional fields as capabilities ask."""
        torch = lazy_torch()
        g = torch.Generator().manual_seed(seed)
        B = len(lengths)
        T = T or max(max(lengths), 1)
        mask = length_mask(lengths, T)  # [B, T]
        r = torch.tensor(list(rewards)) if rewards is not None else torch.randn(B, generator=g)  # [B]
        last = (torch.tensor(list(lengths)) - 1).clamp(min=0)  # [B]
        tlr = torch.zeros(B, T)  # [B, T]
        tlr[torch.arange(B), last] = r * (torch.tensor(list(lengths)) > 0).float()
        comp = self.component
        return AdvantageInputs(
            token_level_rewards=tlr,
            response_mask=mask,
            group_ids=torch.arange(B) // group_size if comp.capability("needs_group") else None,
            values=torch.randn(B, T, generator=g) * mask if comp.capability("needs_critic") else None,
            baseline_rewards=torch.randn(B, generator=g)
            if comp.capability("needs_greedy_baseline")
            else None,
            # a softmax's log pi_t <= 0 and 1/V <= sum_v pi_v^2 <= 1 (masked positions: anything)
            old_log_probs=-torch.rand(B, T, generator=g) * 3
            if comp.capability("needs_old_log_probs")
            else None,
            sum_pi_squared=torch.rand(B, T, generator=g) * 0.9 + 0.05
            if comp.capability("needs_sum_pi_squared")
            else None,
            reward_components=torch.randn(B, 2, generator=g)
            if comp.capability("needs_reward_components")
            else None,
        )

    def run(self, inputs: AdvantageInputs) -> Any:
        out = self.make_part()(inputs, self.params)
        assert hasattr(out, "advantages") and hasattr(out, "returns"), (
            f"expected an AdvantageOutput, got {type(out).__name__}"
        )
        return out

    def _check_valid(self, inputs: AdvantageInputs, out: Any) -> None:
        shape = tuple(inputs.response_mask.shape)
        for field in ("advantages", "returns"):
            t = getattr(out, field)
            assert tuple(t.shape) == shape, f"{field}: shape {tuple(t.shape)}, expected {shape} [B, T]"
            assert t.is_floating_point(), f"{field}: dtype {t.dtype} is not floating point"
            assert_finite(t, field)
        masked = ~inputs.response_mask.bool()
        assert (out.advantages[masked] == 0).all(), (
            f"advantages must be zero where response_mask is 0: {out.advantages[masked]}"
        )

    def test_output_shapes_and_mask(self) -> None:
        inputs = self.make_inputs()
        self._check_valid(inputs, self.run(inputs))

    def test_masked_inputs_do_not_leak(self) -> None:
        torch = lazy_torch()
        inputs = self.make_inputs()
        base = self.run(inputs)
        masked = ~inputs.response_mask.bool()  # [B, T]
        dirty = copy.copy(inputs)
        if self.masked_rewards_ignored:
            dirty.token_level_rewards = torch.where(
                masked, garbage(inputs.token_level_rewards, 1), inputs.token_level_rewards
            )
        elif inputs.values is None:
            pytest.skip("no critic values, and masked_rewards_ignored is off: nothing masked to vary")
        if inputs.values is not None:
            dirty.values = torch.where(masked, garbage(inputs.values, 2), inputs.values)
        out = self.run(dirty)
        self._check_valid(dirty, out)
        valid = inputs.response_mask.bool()
        assert_close(out.advantages[valid], base.advantages[valid], "advantages after changing masked inputs")
        assert_close(out.returns[valid], base.returns[valid], "returns after changing masked inputs")

    def test_right_padding_does_not_change_outputs(self) -> None:
        import torch.nn.functional as F

        inputs = self.make_inputs()
        base = self.run(inputs)
        padded = AdvantageInputs(
            token_level_rewards=F.pad(inputs.token_level_rewards, (0, 3)),  # [B, T + 3]
            response_mask=F.pad(inputs.response_mask, (0, 3)),  # [B, T + 3]
            group_ids=inputs.group_ids,
            values=None if inputs.values is None else F.pad(inputs.values, (0, 3)),
            baseline_rewards=inputs.baseline_rewards,
            old_log_probs=None if inputs.old_log_probs is None else F.pad(inputs.old_log_probs, (0, 3)),
            sum_pi_squared=None if inputs.sum_pi_squared is None else F.pad(inputs.sum_pi_squared, (0, 3)),
            reward_components=inputs.reward_components,
        )
        out = self.run(padded)
        self._check_valid(padded, out)
        T = inputs.response_mask.shape[1]
        assert_close(out.advantages[:, :T], base.advantages, "advantages with extra right padding")

    def test_batch_permutation(self) -> None:
        torch = lazy_torch()
        inputs = self.make_inputs()
        base = self.run(inputs)
        perm = torch.tensor([4, 0, 5, 2, 1, 3])
        permuted = AdvantageInputs(
            **{  # type: ignore[arg-type]
                f.name: (None if (v := getattr(inputs, f.name)) is None else v[perm])
                for f in dataclasses.fields(AdvantageInputs)
            }
        )
        out = self.run(permuted)
        assert_close(out.advantages, base.advantages[perm], "advantages of a permuted batch", atol=self.atol)

    def test_group_of_one(self) -> None:
        for inputs in (self.make_inputs(lengths=(4,), group_size=1), self.make_inputs(group_size=1)):
            self._check_valid(inputs, self.run(inputs))

    def test_all_equal_rewards(self) -> None:
        inputs = self.make_inputs(rewards=[1.0] * 6)
        self._check_valid(inputs, self.run(inputs))
        inputs = self.make_inputs(rewards=[0.0] * 6)
        self._check_valid(inputs, self.run(inputs))

    def test_fully_masked_row(self) -> None:
        inputs = self.make_inputs(lengths=(4, 0, 2, 3, 0, 1))
        out = self.run(inputs)
        self._check_valid(inputs, out)
        assert (out.advantages[1] == 0).all() and (out.advantages[4] == 0).all()

    def test_length_one_responses(self) -> None:
        inputs = self.make_inputs(lengths=(1,) * 6)
        self._check_valid(inputs, self.run(inputs))

    def test_deterministic(self) -> None:
        torch = lazy_torch()
        a, b = self.run(self.make_inputs()), self.run(self.make_inputs())
        assert torch.equal(a.advantages, b.advantages) and torch.equal(a.returns, b.returns)

    def test_does_not_mutate_inputs(self) -> None:
        inputs = self.make_inputs()
        before = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)}
        before = {k: None if v is None else v.clone() for k, v in before.items()}
        self.run(inputs)
        for k, v in before.items():
            if v is not None:
                assert_close(getattr(inputs, k), v, f"inputs.{k} was modified in place", atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------
# sample filter
# ---------------------------------------------------------------------------------------------
class SampleFilterConformance(ComponentConformance):
    """``fn(rewards [N], group_ids [N], params) -> keep [N] bool``, decided per group."""

    kind = "sample_filter"

    def make_inputs(self, group_sizes: Sequence[int] = (4, 4, 4, 4), seed: int = 0) -> tuple[Tensor, Tensor]:
        torch = lazy_torch()
        g = torch.Generator().manual_seed(seed)
        ids = torch.cat([torch.full((n,), i) for i, n in enumerate(group_sizes)])  # [N]
        rewards = (torch.rand(len(ids), generator=g) > 0.5).float()  # [N]
        rewards[: group_sizes[0]] = 1.0  # one all-correct group
        if len(group_sizes) > 1:
            rewards[group_sizes[0] : group_sizes[0] + group_sizes[1]] = 0.0  # one all-wrong group
        return rewards, ids

    def run(self, rewards: Tensor, group_ids: Tensor) -> Tensor:
        torch = lazy_torch()
        keep = self.make_part()(rewards, group_ids, self.params)
        assert tuple(keep.shape) == tuple(rewards.shape), f"keep shape {tuple(keep.shape)}, expected [N]"
        assert keep.dtype == torch.bool, f"keep must be a bool tensor, got {keep.dtype}"
        for gid in group_ids.unique():
            members = keep[group_ids == gid]
            assert members.all() or not members.any(), f"group {int(gid)} is split: {members}"
        return keep  # type: ignore[no-any-return]

    def test_keeps_or_drops_whole_groups(self) -> None:
        self.run(*self.make_inputs())

    def test_group_of_one(self) -> None:
        self.run(*self.make_inputs(group_sizes=(1, 1, 1)))

    def test_all_equal_rewards(self) -> None:
        torch = lazy_torch()
        _, ids = self.make_inputs()
        self.run(torch.ones(len(ids)), ids)
        self.run(torch.zeros(len(ids)), ids)

    def test_permutation(self) -> None:
        torch = lazy_torch()
        rewards, ids = self.make_inputs()
        base = self.run(rewards, ids)
        perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(1))
        assert torch.equal(self.run(rewards[perm], ids[perm]), base[perm])

    def test_deterministic(self) -> None:
        torch = lazy_torch()
        assert torch.equal(self.run(*self.make_inputs()), self.run(*self.make_inputs()))

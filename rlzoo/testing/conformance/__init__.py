"""Conformance suites: the contract of each kind, as pytest classes a plugin subclasses.

Every suite derives from :class:`ComponentConformance`, which checks what all parts share
(registered, a doc line, documented params whose defaults bind). Each kind's suite adds the
contract written in :mod:`rlzoo.hookspecs` and :mod:`rlzoo.protocols`: output shapes, masks
respected, no NaN / inf on edge cases (a group of one, all-equal rewards, fully masked rows,
length-1 responses, empty responses), determinism.

A test method takes no fixture, so a suite can also be driven outside pytest: instantiate the
class and call its ``test_*`` methods (a failing check raises ``AssertionError``; a check that does
not apply calls ``pytest.skip``).

Extension point: a kind without a suite of its own (``train_backend``, ``rollout_backend``,
``runner``, ``dataset``) gets the generic checks from :func:`suite_for`. A backend suite subclasses
:class:`ComponentConformance`, sets ``kind`` and builds the part through :meth:`make_part`
(``factory(params, spec)``), then adds it to :data:`SUITES`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import pytest

from rlzoo.binding import bind_dataclass, to_plain
from rlzoo.kinds import KIND_BY_NAME
from rlzoo.protocols import (
    AdvantageInputs,
    AggContext,
    CorrectionInputs,
    PolicyLossInputs,
    RewardItem,
    RewardResult,
)
from rlzoo.registry import Component

if TYPE_CHECKING:
    from torch import Tensor

    from rlzoo.plugins import PluginManager


# ---------------------------------------------------------------------------------------------
# generic checks
# ---------------------------------------------------------------------------------------------
def component_problems(component: Component[Any], *, load: bool = True) -> list[str]:
    """Everything wrong with a part's registration, one message per problem (empty: conforms).

    Checks: a known kind; a non-empty one-line summary; params (if any) a frozen dataclass whose
    fields all carry ``help`` (declare them with :func:`rlzoo.param`), whose defaults instantiate
    and survive a round trip through the recipe binder; string capability keys; and, with
    ``load``, a target that imports and is callable.
    """
    where = f"{component.kind} {component.name!r} (plugin {component.plugin!r})"
    problems: list[str] = []
    if component.kind not in KIND_BY_NAME:
        problems.append(f"{where}: unknown kind {component.kind!r}")
    if not component.summary:
        problems.append(
            f"{where}: no doc line; give the params dataclass a docstring or pass doc= at registration"
        )
    for key in component.capabilities:
        if not isinstance(key, str) or not key:
            problems.append(f"{where}: capability keys must be non-empty strings, got {key!r}")
    params = component.params
    if params is not None:
        if not (isinstance(params, type) and dataclasses.is_dataclass(params)):
            problems.append(f"{where}: params must be a dataclass type, got {params!r}")
        else:
            if not params.__dataclass_params__.frozen:  # type: ignore[attr-defined]
                problems.append(f"{where}: params dataclass {params.__name__} must be frozen")
            required = []
            for f in dataclasses.fields(params):
                if not str(f.metadata.get("help", "")).strip():
                    problems.append(
                        f"{where}: param {f.name!r} has no help text; declare it with "
                        f"rlzoo.param(default, help=...)"
                    )
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    required.append(f.name)
            if not required:
                problems += _default_problems(params, where)
    if load:
        try:
            target = component.load()
        except Exception as exc:
            problems.append(
                f"{where}: target {component.target!r} does not import: {type(exc).__name__}: {exc}"
            )
        else:
            if not callable(target):
                problems.append(f"{where}: target {target!r} is not callable")
    return problems


def _default_problems(params: type, where: str) -> list[str]:
    try:
        defaults = params()
    except Exception as exc:
        return [f"{where}: params defaults do not instantiate: {type(exc).__name__}: {exc}"]
    bind: list[str] = []
    again = bind_dataclass(params, to_plain(defaults), "params", bind, what=where)
    if bind:
        return [f"{where}: defaults do not bind back from a recipe: {'; '.join(bind)}"]
    if again != defaults:
        return [f"{where}: defaults change in a round trip through the recipe binder: {defaults} != {again}"]
    return []


def check_component(component: Component[Any], *, load: bool = True) -> None:
    """Raise ``AssertionError`` listing every problem :func:`component_problems` finds."""
    problems = component_problems(component, load=load)
    if problems:
        raise AssertionError("\n".join(["part does not conform:", *(f"  - {p}" for p in problems)]))


# ---------------------------------------------------------------------------------------------
# helpers (torch imported lazily)
# ---------------------------------------------------------------------------------------------
def _torch() -> Any:
    import torch

    return torch


def _lengths_mask(lengths: Sequence[int], T: int) -> Tensor:
    torch = _torch()
    return (torch.arange(T)[None, :] < torch.tensor(list(lengths))[:, None]).float()  # [B, T]


def _assert_finite(x: Any, what: str) -> None:
    torch = _torch()
    if isinstance(x, torch.Tensor):
        assert torch.isfinite(x).all(), f"{what} has NaN or inf: {x}"
    elif isinstance(x, (int, float)):
        assert math.isfinite(float(x)), f"{what} is not finite: {x}"


def _close(a: Tensor, b: Tensor, what: str, *, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    torch = _torch()
    assert a.shape == b.shape, f"{what}: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}"
    assert torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=False), f"{what}:\n{a}\nvs\n{b}"


def _garbage_like(x: Tensor, seed: int, scale: float = 50.0) -> Tensor:
    """Large finite values, to be put where the mask is 0."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(x.shape, generator=g, dtype=x.dtype) * 2 - 1) * scale


# ---------------------------------------------------------------------------------------------
# the base suite
# ---------------------------------------------------------------------------------------------
class ComponentConformance:
    """Checks every part shares. Subclass a kind's suite and set :attr:`name`.

    Override :meth:`plugin_manager` to test a part that is not installed (e.g. a plugin object
    registered with :meth:`rlzoo.plugins.PluginManager.register`).
    """

    kind: ClassVar[str] = ""
    #: the registered name of the part under test
    name: ClassVar[str] = ""
    #: params (as in a recipe) bound on top of the defaults for the contract tests
    params_overrides: ClassVar[Mapping[str, Any]] = {}
    #: tolerances of the numeric comparisons
    atol: ClassVar[float] = 1e-5
    rtol: ClassVar[float] = 1e-5

    # -- how the suite reaches the part -------------------------------------------------------
    def plugin_manager(self) -> PluginManager:
        from rlzoo.plugins import get_plugin_manager

        return get_plugin_manager()

    @cached_property
    def component(self) -> Component[Any]:
        assert self.kind, f"{type(self).__name__}: set the class attribute 'kind'"
        assert self.name, (
            f"{type(self).__name__}: set the class attribute 'name' to the part's registered name"
        )
        return self.plugin_manager().get(self.kind, self.name, key=f"{type(self).__name__}.name")

    @cached_property
    def params(self) -> Any:
        """The part's params: defaults plus :attr:`params_overrides`, bound as a recipe would."""
        from rlzoo.config import bind_part

        problems: list[str] = []
        sel = bind_part(
            self.kind,
            {"name": self.name, **self.params_overrides},
            f"{type(self).__name__}",
            problems,
            self.plugin_manager(),
        )
        if problems or sel is None:
            pytest.fail("params do not bind:\n" + "\n".join(problems))
        return sel.params

    @cached_property
    def fn(self) -> Callable[..., Any]:
        return self.component.load()  # type: ignore[no-any-return]

    def make_part(self) -> Any:
        """The callable under test (a factory kind builds its object here)."""
        return self.fn

    # -- checks shared by every kind ------------------------------------------------------------
    def test_registered_under_kind(self) -> None:
        comp = self.component
        assert comp.kind == self.kind
        assert self.name == comp.name or self.name in comp.aliases

    def test_has_doc_line(self) -> None:
        assert self.component.summary, (
            f"{self.kind} {self.name!r}: no doc line (give the params dataclass a docstring or pass doc=)"
        )

    def test_params_documented(self) -> None:
        params = self.component.params
        if params is None:
            return
        undocumented = [
            f.name for f in dataclasses.fields(params) if not str(f.metadata.get("help", "")).strip()
        ]
        assert not undocumented, f"params without help text (use rlzoo.param(..., help=...)): {undocumented}"

    def test_params_defaults_bind(self) -> None:
        problems = [p for p in component_problems(self.component, load=False) if "param" in p]
        assert not problems, "\n".join(problems)
        self.params  # noqa: B018  (binds defaults + overrides, fails the test on a problem)

    def test_target_loads(self) -> None:
        assert callable(self.fn), f"{self.component.target!r} is not callable"

    def test_conforms(self) -> None:
        check_component(self.component)


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
        torch = _torch()
        g = torch.Generator().manual_seed(seed)
        B = len(lengths)
        T = T or max(max(lengths), 1)
        mask = _lengths_mask(lengths, T)  # [B, T]
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
            _assert_finite(t, field)
        masked = ~inputs.response_mask.bool()
        assert (out.advantages[masked] == 0).all(), (
            f"advantages must be zero where response_mask is 0: {out.advantages[masked]}"
        )

    def test_output_shapes_and_mask(self) -> None:
        inputs = self.make_inputs()
        self._check_valid(inputs, self.run(inputs))

    def test_masked_inputs_do_not_leak(self) -> None:
        torch = _torch()
        inputs = self.make_inputs()
        base = self.run(inputs)
        masked = ~inputs.response_mask.bool()  # [B, T]
        dirty = copy.copy(inputs)
        if self.masked_rewards_ignored:
            dirty.token_level_rewards = torch.where(
                masked, _garbage_like(inputs.token_level_rewards, 1), inputs.token_level_rewards
            )
        elif inputs.values is None:
            pytest.skip("no critic values, and masked_rewards_ignored is off: nothing masked to vary")
        if inputs.values is not None:
            dirty.values = torch.where(masked, _garbage_like(inputs.values, 2), inputs.values)
        out = self.run(dirty)
        self._check_valid(dirty, out)
        valid = inputs.response_mask.bool()
        _close(out.advantages[valid], base.advantages[valid], "advantages after changing masked inputs")
        _close(out.returns[valid], base.returns[valid], "returns after changing masked inputs")

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
        _close(out.advantages[:, :T], base.advantages, "advantages with extra right padding")

    def test_batch_permutation(self) -> None:
        torch = _torch()
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
        _close(out.advantages, base.advantages[perm], "advantages of a permuted batch", atol=self.atol)

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
        torch = _torch()
        a, b = self.run(self.make_inputs()), self.run(self.make_inputs())
        assert torch.equal(a.advantages, b.advantages) and torch.equal(a.returns, b.returns)

    def test_does_not_mutate_inputs(self) -> None:
        inputs = self.make_inputs()
        before = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)}
        before = {k: None if v is None else v.clone() for k, v in before.items()}
        self.run(inputs)
        for k, v in before.items():
            if v is not None:
                _close(getattr(inputs, k), v, f"inputs.{k} was modified in place", atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------
# policy loss
# ---------------------------------------------------------------------------------------------
def token_mean_agg(mask: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
    """A reference ``agg(per_token_loss, mask)`` bound to the token count of ``mask`` [B, T]."""
    torch = _torch()
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
        torch = _torch()
        g = torch.Generator().manual_seed(seed)
        B, T = len(lengths), T or max(max(lengths), 1)
        mask = _lengths_mask(lengths, T)  # [B, T]
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
        _assert_finite(out.loss, "loss")
        assert isinstance(out.metrics, dict), f"metrics must be a dict, got {type(out.metrics).__name__}"
        for k, v in out.metrics.items():
            _assert_finite(v, f"metric {k!r}")

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
        _assert_finite(grad, "d loss / d log_probs")
        masked = ~inputs.response_mask.bool()
        assert (grad[masked] == 0).all(), f"gradient reaches masked positions: {grad[masked]}"

    def test_masked_inputs_do_not_leak(self) -> None:
        torch = _torch()
        inputs = self.make_inputs()
        base = self.run(inputs)
        masked = ~inputs.response_mask.bool()
        dirty = copy.copy(inputs)
        garbage_lp = -_garbage_like(inputs.log_probs, 3, scale=20.0).abs()  # [B, T] in [-20, 0]
        dirty.log_probs = torch.where(masked, garbage_lp, inputs.log_probs.detach()).requires_grad_(True)
        dirty.old_log_probs = torch.where(
            masked, -_garbage_like(inputs.old_log_probs, 4, scale=20.0).abs(), inputs.old_log_probs
        )
        dirty.advantages = torch.where(masked, _garbage_like(inputs.advantages, 5, 100.0), inputs.advantages)
        if inputs.entropy is not None:
            dirty.entropy = torch.where(masked, _garbage_like(inputs.entropy, 6).abs(), inputs.entropy)
        out = self.run(dirty)
        self._check_valid(out)
        _close(out.loss.detach(), base.loss.detach(), "loss after changing masked inputs")

    def test_unit_rollout_weights_change_nothing(self) -> None:
        torch = _torch()
        base = self.run(self.make_inputs())
        inputs = self.make_inputs()
        inputs.rollout_is_weights = torch.ones_like(inputs.old_log_probs)
        _close(self.run(inputs).loss.detach(), base.loss.detach(), "loss with rollout_is_weights = 1")

    def test_fully_masked_row(self) -> None:
        self._check_valid(self.run(self.make_inputs(lengths=(4, 0, 2, 0))))

    def test_fully_masked_batch(self) -> None:
        inputs = self.make_inputs(lengths=(0, 0, 0), T=4)
        out = self.run(inputs)
        self._check_valid(out)
        out.loss.backward()
        if inputs.log_probs.grad is not None:
            _assert_finite(inputs.log_probs.grad, "d loss / d log_probs (all masked)")

    def test_length_one_responses(self) -> None:
        self._check_valid(self.run(self.make_inputs(lengths=(1, 1, 1))))

    def test_deterministic(self) -> None:
        torch = _torch()
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
        torch = _torch()
        g = torch.Generator().manual_seed(seed)
        T = T or max(max(lengths), 1)
        mask = _lengths_mask(lengths, T)  # [B, T]
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
        _assert_finite(out, "aggregated loss")
        return out  # type: ignore[no-any-return]

    def test_scalar_and_finite(self) -> None:
        self.run(*self.make_inputs())

    def test_masked_values_do_not_leak(self) -> None:
        torch = _torch()
        loss, mask, ctx = self.make_inputs()
        base = self.run(loss, mask, ctx)
        dirty = torch.where(mask.bool(), loss, _garbage_like(loss, 7, 1e4))
        _close(self.run(dirty, mask, ctx).detach(), base.detach(), "aggregate after changing masked losses")

    def test_gradient_zero_where_masked(self) -> None:
        loss, mask, ctx = self.make_inputs()
        self.run(loss, mask, ctx).backward()
        assert loss.grad is not None
        _assert_finite(loss.grad, "gradient")
        assert (loss.grad[~mask.bool()] == 0).all(), "gradient reaches masked positions"

    def test_micro_batch_splits_sum_to_the_whole(self) -> None:
        loss, mask, ctx = self.make_inputs()
        whole = self.run(loss, mask, ctx).detach()
        for sizes in ((1,) * 6, (2, 4), (3, 3), (5, 1)):
            parts, start = [], 0
            for s in sizes:
                parts.append(self.run(loss[start : start + s], mask[start : start + s], ctx).detach())
                start += s
            _close(_torch().stack(parts).sum(), whole, f"sum over micro-batches {sizes} vs the whole batch")

    def test_fully_masked_batch_is_zero(self) -> None:
        loss, mask, ctx = self.make_inputs(lengths=(0, 0, 0), T=3)
        out = self.run(loss, mask, ctx)
        assert float(out.detach()) == 0.0, f"aggregating nothing must give 0, got {float(out.detach())}"

    def test_length_one_responses(self) -> None:
        self.run(*self.make_inputs(lengths=(1, 1, 1)))

    def test_deterministic(self) -> None:
        torch = _torch()
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
        torch = _torch()
        g = torch.Generator().manual_seed(seed)
        ref = -torch.rand(B, T, generator=g) * 3 - 0.01  # [B, T]
        lp = (ref + torch.randn(B, T, generator=g) * spread).clamp(max=-1e-4)  # [B, T]
        return lp.requires_grad_(True), ref

    def run(self, log_probs: Tensor, ref: Tensor) -> Tensor:
        out = self.make_part()(log_probs, ref, self.params)
        assert tuple(out.shape) == tuple(log_probs.shape), (
            f"kl shape {tuple(out.shape)}, expected {tuple(log_probs.shape)} [B, T]"
        )
        _assert_finite(out, "kl")
        return out  # type: ignore[no-any-return]

    def test_shape_and_finite(self) -> None:
        self.run(*self.make_inputs())

    def test_zero_when_equal(self) -> None:
        _, ref = self.make_inputs()
        out = self.run(ref.clone().requires_grad_(True), ref)
        assert out.detach().abs().max() <= 1e-6, f"KL of a policy with itself must be 0: {out}"

    def test_per_token(self) -> None:
        torch = _torch()
        lp, ref = self.make_inputs()
        base = self.run(lp, ref).detach()
        lp2 = lp.detach().clone()
        lp2[1, 2] -= 1.0
        out = self.run(lp2.requires_grad_(True), ref).detach()
        other = torch.ones_like(base, dtype=torch.bool)
        other[1, 2] = False
        _close(out[other], base[other], "kl at positions whose log-probs did not change")

    def test_extreme_differences_finite(self) -> None:
        lp, ref = self.make_inputs(spread=15.0)
        out = self.run(lp, ref)
        out.sum().backward()
        assert lp.grad is not None
        _assert_finite(lp.grad, "d kl / d log_probs")

    def test_length_one_responses(self) -> None:
        self.run(*self.make_inputs(T=1))

    def test_deterministic(self) -> None:
        torch = _torch()
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
        torch = _torch()
        g = torch.Generator().manual_seed(seed)
        B, T = len(lengths), T or max(max(lengths), 1)
        mask = _lengths_mask(lengths, T)  # [B, T]
        old = -torch.rand(B, T, generator=g) * 2 - 0.05  # [B, T]
        rollout = (old + torch.randn(B, T, generator=g) * noise).clamp(max=-1e-4)  # [B, T]
        return CorrectionInputs(old_log_probs=old, rollout_log_probs=rollout, response_mask=mask)

    def run(self, inputs: CorrectionInputs) -> Any:
        torch = _torch()
        out = self.make_part()(inputs, self.params)
        shape = tuple(inputs.response_mask.shape)
        assert tuple(out.mask.shape) == shape, f"mask shape {tuple(out.mask.shape)}, expected {shape}"
        kept = out.mask.bool()
        assert not (kept & ~inputs.response_mask.bool()).any(), "the correction re-enabled masked tokens"
        if out.weights is not None:
            assert tuple(out.weights.shape) == shape, f"weights shape {tuple(out.weights.shape)}"
            assert not out.weights.requires_grad, "weights must be detached"
            _assert_finite(out.weights, "weights")
            assert (out.weights[inputs.response_mask.bool()] >= 0).all(), "weights must be >= 0"
        assert out.mode in {"decoupled", "bypass"}, f"mode must be 'decoupled' or 'bypass', got {out.mode!r}"
        for k, v in (out.metrics or {}).items():
            _assert_finite(v, f"metric {k!r}")
        del torch
        return out

    def test_output_contract(self) -> None:
        self.run(self.make_inputs())

    def test_on_policy_keeps_everything(self) -> None:
        torch = _torch()
        inputs = self.make_inputs(noise=0.0)
        inputs.rollout_log_probs = inputs.old_log_probs.clone()
        out = self.run(inputs)
        valid = inputs.response_mask.bool()
        assert torch.equal(out.mask.bool(), valid), "identical log-probs must reject nothing"
        if out.weights is not None:
            _close(out.weights[valid], torch.ones_like(out.weights[valid]), "weights of identical log-probs")

    def test_masked_inputs_do_not_leak(self) -> None:
        torch = _torch()
        inputs = self.make_inputs()
        base = self.run(inputs)
        masked = ~inputs.response_mask.bool()
        dirty = CorrectionInputs(
            old_log_probs=torch.where(
                masked, -_garbage_like(inputs.old_log_probs, 8, 20.0).abs(), inputs.old_log_probs
            ),
            rollout_log_probs=torch.where(
                masked, -_garbage_like(inputs.rollout_log_probs, 9, 20.0).abs(), inputs.rollout_log_probs
            ),
            response_mask=inputs.response_mask,
        )
        out = self.run(dirty)
        valid = inputs.response_mask.bool()
        assert torch.equal(out.mask.bool(), base.mask.bool()), "rejection changed with masked inputs"
        if base.weights is not None:
            _close(out.weights[valid], base.weights[valid], "weights after changing masked inputs")

    def test_fully_masked_row(self) -> None:
        self.run(self.make_inputs(lengths=(4, 0, 2, 0)))

    def test_length_one_responses(self) -> None:
        self.run(self.make_inputs(lengths=(1, 1, 1)))

    def test_deterministic(self) -> None:
        torch = _torch()
        a, b = self.run(self.make_inputs()), self.run(self.make_inputs())
        assert torch.equal(a.mask, b.mask)
        if a.weights is not None:
            assert torch.equal(a.weights, b.weights)


# ---------------------------------------------------------------------------------------------
# sample filter
# ---------------------------------------------------------------------------------------------
class SampleFilterConformance(ComponentConformance):
    """``fn(rewards [N], group_ids [N], params) -> keep [N] bool``, decided per group."""

    kind = "sample_filter"

    def make_inputs(self, group_sizes: Sequence[int] = (4, 4, 4, 4), seed: int = 0) -> tuple[Tensor, Tensor]:
        torch = _torch()
        g = torch.Generator().manual_seed(seed)
        ids = torch.cat([torch.full((n,), i) for i, n in enumerate(group_sizes)])  # [N]
        rewards = (torch.rand(len(ids), generator=g) > 0.5).float()  # [N]
        rewards[: group_sizes[0]] = 1.0  # one all-correct group
        if len(group_sizes) > 1:
            rewards[group_sizes[0] : group_sizes[0] + group_sizes[1]] = 0.0  # one all-wrong group
        return rewards, ids

    def run(self, rewards: Tensor, group_ids: Tensor) -> Tensor:
        torch = _torch()
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
        torch = _torch()
        _, ids = self.make_inputs()
        self.run(torch.ones(len(ids)), ids)
        self.run(torch.zeros(len(ids)), ids)

    def test_permutation(self) -> None:
        torch = _torch()
        rewards, ids = self.make_inputs()
        base = self.run(rewards, ids)
        perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(1))
        assert torch.equal(self.run(rewards[perm], ids[perm]), base[perm])

    def test_deterministic(self) -> None:
        torch = _torch()
        assert torch.equal(self.run(*self.make_inputs()), self.run(*self.make_inputs()))


# ---------------------------------------------------------------------------------------------
# scorer
# ---------------------------------------------------------------------------------------------
class ScorerConformance(ComponentConformance):
    """``fn(response, ground_truth, data_source, extra_info, params) -> float | {"score": ...}``.

    Set :attr:`cases` to ``(response, ground_truth, expected_score)`` triples worked out by hand.
    """

    kind = "scorer"
    cases: ClassVar[Sequence[tuple[str, Any, float]]] = ()
    ground_truth: ClassVar[Any] = "42"
    data_source: ClassVar[str] = "default"
    extra_info: ClassVar[Mapping[str, Any]] = {}
    #: odd responses every scorer must survive (finite score, no exception)
    odd_responses: ClassVar[Sequence[str]] = (
        "",
        " \n\t ",
        "\\boxed{",
        "}{\\boxed{}}",
        "答案是 42 ✓",
        "__import__('os').system('true')",
        "x" * 20000,
    )

    def score(self, response: str, ground_truth: Any = None, data_source: str | None = None) -> float:
        gt = self.ground_truth if ground_truth is None else ground_truth
        ds = self.data_source if data_source is None else data_source
        fn = self.make_part()
        if self.component.capability("batched"):
            raw = fn([response], [gt], [ds], [dict(self.extra_info)], self.params)
            assert isinstance(raw, (list, tuple)) and len(raw) == 1, f"batched scorer returned {raw!r}"
            raw = raw[0]
        else:
            raw = fn(response, gt, ds, dict(self.extra_info), self.params)
        return _score_value(raw)

    def test_returns_a_finite_score(self) -> None:
        self.score(f"The answer is {self.ground_truth}.")

    def test_empty_and_odd_responses(self) -> None:
        for response in self.odd_responses:
            self.score(response)

    def test_cases(self) -> None:
        if not self.cases:
            pytest.skip("no cases given (set `cases` to (response, ground_truth, expected) triples)")
        for response, gt, expected in self.cases:
            got = self.score(response, gt)
            assert math.isclose(got, expected, abs_tol=1e-6), (
                f"score({response!r}, {gt!r}) = {got}, expected {expected}"
            )

    def test_deterministic(self) -> None:
        r = f"so the result is {self.ground_truth}"
        assert self.score(r) == self.score(r)


def _score_value(raw: Any) -> float:
    if isinstance(raw, Mapping):
        assert "score" in raw, f"a scorer's dict must hold 'score', got keys {sorted(raw)}"
        raw = raw["score"]
    assert isinstance(raw, (int, float)) or hasattr(raw, "item"), (
        f"a score must be a number, got {type(raw).__name__} {raw!r}"
    )
    value = float(raw.item() if hasattr(raw, "item") else raw)
    assert math.isfinite(value), f"score is not finite: {value}"
    return value


# ---------------------------------------------------------------------------------------------
# reward manager
# ---------------------------------------------------------------------------------------------
def stub_scorer(response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any]) -> float:
    """A bound scorer for reward manager tests: 1.0 when the ground truth appears in the response."""
    return 1.0 if str(ground_truth) in response else 0.0


def dict_scorer(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any]
) -> dict[str, Any]:
    """Like :func:`stub_scorer`, returning a dict with an extra metric."""
    s = stub_scorer(response, ground_truth, data_source, extra_info)
    return {"score": s, "acc": s > 0}


def raising_scorer(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any]
) -> float:
    """A scorer that always raises (a reward manager must turn it into failed results)."""
    raise ValueError("scorer failed on purpose")


def nan_scorer(response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any]) -> float:
    """A scorer that returns NaN (a reward manager must turn it into failed results)."""
    return float("nan")


class RewardManagerConformance(ComponentConformance):
    """``factory(params, scorer) -> manager``; ``manager(items) -> [RewardResult]``, one per item."""

    kind = "reward_manager"

    def make_manager(self, scorer: Callable[..., Any]) -> Any:
        return self.make_part()(self.params, scorer)

    def make_items(self) -> list[RewardItem]:
        return [
            RewardItem(response="the answer is 42", ground_truth="42", response_length=5),
            RewardItem(response="no idea", ground_truth="7", response_length=2),
            RewardItem(response="", ground_truth="1", response_length=0),
            RewardItem(response="7 7 7", ground_truth="7", response_length=3, data_source="other"),
        ]

    def run(self, scorer: Callable[..., Any], items: Sequence[RewardItem]) -> list[RewardResult]:
        manager = self.make_manager(scorer)
        try:
            results = list(manager(items))
        finally:
            close = getattr(manager, "close", None)
            if callable(close):
                close()
        assert len(results) == len(items), f"{len(results)} results for {len(items)} items"
        for r in results:
            assert isinstance(r, RewardResult), f"expected RewardResult, got {type(r).__name__}"
            _assert_finite(r.reward, "reward")
            _assert_finite(r.score, "score")
        return results

    def test_one_result_per_item_in_order(self) -> None:
        items = self.make_items()
        results = self.run(stub_scorer, items)
        expected = [stub_scorer(i.response, i.ground_truth, i.data_source, i.extra_info) for i in items]
        assert [r.score for r in results] == expected
        assert not any(r.failed for r in results)

    def test_dict_scores(self) -> None:
        items = self.make_items()
        results = self.run(dict_scorer, items)
        assert [r.score for r in results] == [1.0, 0.0, 0.0, 1.0]

    def test_empty_batch(self) -> None:
        assert self.run(stub_scorer, []) == []

    def test_raising_scorer_gives_failed_results(self) -> None:
        results = self.run(raising_scorer, self.make_items())
        assert all(r.failed for r in results), "a raising scorer must yield failed results"

    def test_nan_scorer_gives_failed_results(self) -> None:
        results = self.run(nan_scorer, self.make_items())
        assert all(r.failed for r in results), "a NaN score must yield failed results"

    def test_deterministic(self) -> None:
        a, b = self.run(stub_scorer, self.make_items()), self.run(stub_scorer, self.make_items())
        assert [(r.reward, r.score) for r in a] == [(r.reward, r.score) for r in b]


# ---------------------------------------------------------------------------------------------
# logger
# ---------------------------------------------------------------------------------------------
class LoggerConformance(ComponentConformance):
    """``factory(params, LoggerContext) -> MetricSink``: takes every record, then closes.

    Each test builds the logger on a fresh run directory (``tmp_path``). Override :meth:`context`
    for a logger that needs more (a tracker in offline mode, a server URI in ``params_overrides``).
    """

    kind = "logger"

    def context(self, run_dir: Any) -> Any:
        from rlzoo.metrics import LoggerContext

        return LoggerContext(run_dir=run_dir, run_name="conformance", run_id=run_dir.name, progress=False)

    def records(self) -> list[dict[str, Any]]:
        """What a run sends: validation at step 0 (not a training step), floats, a null, a string."""
        return [
            {"step": 0, "time": 1000.0, "val/mean": 0.25},
            {"step": 1, "time": 1001.0, "critic/score/mean": 0.5, "actor/entropy": None, "note": "text"},
            {"step": 2, "time": 1002.0, "critic/score/mean": 0.75, "val/default/mean@4": 1.0},
        ]

    def test_takes_every_record_and_closes(self, tmp_path: Any) -> None:
        from rlzoo.metrics import MetricSink

        sink = self.make_part()(self.params, self.context(tmp_path))
        assert isinstance(sink, MetricSink), f"{self.name}: the factory must return a MetricSink (log, close)"
        for r in self.records():
            sink.log(int(r["step"]), r, advance=r["step"] > 0)
        sink.close()


# ---------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------
#: kind -> its conformance suite. Kinds missing here (backends, runners, datasets) get the
#: generic checks of :class:`ComponentConformance` from :func:`suite_for` until they have a suite.
SUITES: dict[str, type[ComponentConformance]] = {
    "advantage": AdvantageConformance,
    "policy_loss": PolicyLossConformance,
    "loss_agg": LossAggConformance,
    "kl": KLConformance,
    "rollout_correction": RolloutCorrectionConformance,
    "sample_filter": SampleFilterConformance,
    "scorer": ScorerConformance,
    "reward_manager": RewardManagerConformance,
    "logger": LoggerConformance,
}


def suite_for(kind: str) -> type[ComponentConformance]:
    """The conformance suite of ``kind`` (the generic one for kinds without their own yet)."""
    if kind not in KIND_BY_NAME:
        raise KeyError(f"unknown kind {kind!r}; kinds are {', '.join(sorted(KIND_BY_NAME))}")
    if kind in SUITES:
        return SUITES[kind]
    return type(f"{kind.title().replace('_', '')}Conformance", (ComponentConformance,), {"kind": kind})

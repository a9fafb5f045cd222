"""Built-in KL estimators (kind ``kl``): params and registration.

Import-light: the tensor code, the KL controllers and ``apply_kl_penalty`` live in
:mod:`rlzoo.algorithms.functional.kl`. See ``docs/components/kl.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import KLFn
    from rlzoo.kernel.registry import Registrar

_IMPL = "rlzoo.algorithms.functional.kl"
#: every KL estimator compares against a frozen reference policy
_CAPS = {"needs_reference": True}


@dataclass(frozen=True)
class K1Params:
    """k1: log p - log p_ref per token (unbiased for KL(p || p_ref), high variance, signed).

    Schulman, Approximating KL divergence, http://joschu.net/blog/kl-approx.html.
    """


@dataclass(frozen=True)
class AbsParams:
    """abs: |log p - log p_ref| per token."""


@dataclass(frozen=True)
class K2Params:
    """k2 (mse): (log p - log p_ref)^2 / 2 per token; its expected gradient is the KL's.

    Schulman, Approximating KL divergence, http://joschu.net/blog/kl-approx.html.
    """


@dataclass(frozen=True)
class K3Params:
    """k3 (low_var_kl): exp(log p_ref - log p) - (log p_ref - log p) - 1, clamped to [-10, 10].

    Unbiased, non-negative, low variance. The log-ratio is clamped to [-20, 20] before exp, as
    in verl. Schulman, http://joschu.net/blog/kl-approx.html.
    """


@dataclass(frozen=True)
class K1PlusParams:
    """k1+: the value of k1 with the gradient of k2 (straight-through, verl's '+' suffix)."""


@dataclass(frozen=True)
class AbsPlusParams:
    """abs+: the value of abs with the gradient of k2 (straight-through, verl's '+' suffix)."""


@dataclass(frozen=True)
class K3PlusParams:
    """k3+ (low_var_kl+): the value of k3 with the gradient of k2 (straight-through).

    k3's value is an unbiased estimate of the KL but its gradient is not the KL's gradient;
    k2's is. verl selects this with the '+' suffix (kl_penalty / kl_loss_type 'k3+').
    """


@dataclass(frozen=True)
class FullParams:
    """full: the exact KL(p || p_ref) = sum over the vocabulary of p (log p - log p_ref), per token.

    Needs log-probabilities over the whole vocabulary ([B, T, V]) for both policies, which no
    built-in train backend hands to the KL today; verl 0.9.1 lists 'full' but raises
    NotImplementedError. Schulman, http://joschu.net/blog/kl-approx.html.
    """


@hookimpl
def rlzoo_register_kls(registry: Registrar[KLFn]) -> None:
    registry.register("k1", f"{_IMPL}:k1", params=K1Params, capabilities=_CAPS, aliases=("kl",))
    registry.register("abs", f"{_IMPL}:abs_kl", params=AbsParams, capabilities=_CAPS)
    registry.register(
        "k2", f"{_IMPL}:k2", params=K2Params, capabilities=_CAPS, aliases=("mse", "k2+", "mse+")
    )
    registry.register("k3", f"{_IMPL}:k3", params=K3Params, capabilities=_CAPS, aliases=("low_var_kl",))
    registry.register("k1+", f"{_IMPL}:k1_plus", params=K1PlusParams, capabilities=_CAPS, aliases=("kl+",))
    registry.register("abs+", f"{_IMPL}:abs_kl_plus", params=AbsPlusParams, capabilities=_CAPS)
    registry.register("full", f"{_IMPL}:full", params=FullParams, capabilities=_CAPS)
    registry.register(
        "k3+", f"{_IMPL}:k3_plus", params=K3PlusParams, capabilities=_CAPS, aliases=("low_var_kl+",)
    )

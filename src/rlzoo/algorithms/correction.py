"""Built-in off-policy corrections (kind ``rollout_correction``): params and registration.

Import-light: the tensor code lives in :mod:`rlzoo.algorithms.functional.correction`. Every part
has a ``mode`` param: ``decoupled`` (three policies: the loss's PPO ratio is taken against the
trainer's recomputed ``old_log_probs`` and the importance weights multiply the per-token loss) or
``bypass`` (two policies: ``old_log_probs := rollout_log_probs``, no recomputation; the PPO ratio
itself corrects, so no weights are returned; rejection still applies). Names and metrics follow
verl's ``rollout_corr_helper.py``; see ``docs/components/rollout_correction.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl, param

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import CorrectionFn
    from rlzoo.kernel.registry import Registrar

_IMPL = "rlzoo.algorithms.functional.correction"

_VETO_HELP = (
    "reject a whole response when any token has pi_old / pi_rollout below this (verl's "
    "rollout_token_veto_threshold, e.g. 1e-4); None: off"
)

_MODE_HELP = (
    "'decoupled': PPO ratio vs the trainer's old log-probs, weights multiply the loss (three "
    "policies); 'bypass': old log-probs := rollout log-probs (two policies, no weights)"
)


#: verl's ``rollout_rs`` criteria: ``<level>_<estimator>``
RS_CRITERIA = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)


def parse_criteria(criteria: str, thresholds: str | float) -> list[tuple[str, float, float]]:
    """``[(criterion, lower, upper)]`` from verl's ``rollout_rs`` / ``rollout_rs_threshold`` strings.

    ``criteria`` is comma-separated (duplicates dropped, order kept); ``thresholds`` is one value
    shared by all criteria or one per criterion. A k1 criterion takes ``"lower_upper"`` bounds on
    the ratio pi_rollout / pi_old (a single ``u`` means ``[1/u, u]``); k2 / k3 take one upper bound
    (their lower bound is -inf).
    """
    names: list[str] = []
    for raw in str(criteria).split(","):
        name = raw.strip()
        if not name:
            continue
        if name not in RS_CRITERIA:
            raise ValueError(f"unknown rejection criterion {name!r}; choose from {', '.join(RS_CRITERIA)}")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError(f"rejection criteria must name at least one of {', '.join(RS_CRITERIA)}")
    specs = [t.strip() for t in str(thresholds).split(",") if t.strip()]
    if len(specs) == 1:
        specs = specs * len(names)
    if len(specs) != len(names):
        raise ValueError(
            f"rejection thresholds: give one value for all criteria or one per criterion "
            f"({len(names)}: {', '.join(names)}), got {thresholds!r}"
        )
    out = []
    for name, spec in zip(names, specs, strict=True):
        try:
            if name.endswith("k1"):
                lo_s, _, hi_s = spec.partition("_")
                hi = float(hi_s) if hi_s else float(lo_s)
                lo = float(lo_s) if hi_s else 1.0 / hi
            else:
                if "_" in spec:
                    raise ValueError("'_' bounds are for k1 criteria only")
                lo, hi = -math.inf, float(spec)
        except ValueError as e:
            raise ValueError(f"rejection threshold {spec!r} for {name!r}: {e}") from None
        if hi <= 0 or (name.endswith("k1") and not 0 < lo <= hi):
            raise ValueError(
                f"rejection threshold {spec!r} for {name!r} must be positive (and lower <= upper)"
            )
        out.append((name, lo, hi))
    return out


@dataclass(frozen=True)
class NoCorrectionParams:
    """No off-policy correction: no importance weights, response mask unchanged.

    With mode='bypass' the trainer still uses the rollout log-probs as old log-probs (plain
    two-policy PPO), skipping the recomputation.
    """

    mode: str = param("decoupled", help=_MODE_HELP)


@dataclass(frozen=True)
class TruncatedISParams:
    """The fields of both truncated importance samplings (``token_is``, ``seq_is``)."""

    threshold: float | None = param(2.0, help="upper truncation of the weights (None: no truncation)")
    batch_normalize: bool = param(False, help="rescale the weights to mean 1 over the batch's tokens")
    mode: str = param("decoupled", help=_MODE_HELP)
    token_veto_threshold: float | None = param(None, help=_VETO_HELP)


@dataclass(frozen=True)
class TokenISParams(TruncatedISParams):
    """Token-level truncated importance sampling (TIS): w_t = min(pi_old / pi_rollout, threshold).

    Corrects the mismatch between the rollout engine and the trainer token by token (biased, low
    variance). Yao et al., Your efficient RL framework secretly brings you off-policy RL training,
    https://fengyao.notion.site/off-policy-rl.
    """


@dataclass(frozen=True)
class SeqISParams(TruncatedISParams):
    """Sequence-level truncated importance sampling: w = min(prod_t pi_old / pi_rollout, threshold).

    One weight per response, exp(sum of token log-ratios), broadcast over its tokens (unbiased
    before truncation, high variance). https://fengyao.notion.site/off-policy-rl.
    """

    # redeclared for its help only (a field keeps its place in the order)
    batch_normalize: bool = param(False, help="rescale the weights to mean 1 over the batch's sequences")


@dataclass(frozen=True)
class IcePopParams:
    """IcePop: tokens whose ratio pi_old / pi_rollout is outside [low, high] get weight 0.

    Kept tokens are weighted by their ratio (apply_weights). As verl (rollout_is_threshold
    "low_high"), the gated tokens stay in the response mask, so they still count in a token-mean's
    denominator. Ling team, Every Step Evolves (Ring-1T), https://arxiv.org/abs/2510.18855.
    """

    low: float = param(0.5, help="smallest token ratio kept")
    high: float = param(5.0, help="largest token ratio kept")
    apply_weights: bool = param(True, help="weight kept tokens by their ratio (False: weight 1, a 0/1 gate)")
    mode: str = param("decoupled", help=_MODE_HELP)
    token_veto_threshold: float | None = param(None, help=_VETO_HELP)


@dataclass(frozen=True)
class RejectionParams:
    """Rejection sampling: drop tokens or whole responses whose k1 / k2 / k3 mismatch is too large.

    verl's rollout_rs: criteria "<level>_<k>" with level token, seq_sum, seq_mean or seq_max (not
    for k1), chained with commas ("token_k1,seq_mean_k3": every criterion must keep a token). With
    rho_t = log pi_old - log pi_rollout: k1 = -rho (kept when pi_rollout / pi_old lies in
    [lower, upper]), k2 = rho^2 / 2, k3 = exp(rho) - 1 - rho (kept when <= the threshold).
    is_level adds truncated IS weights (verl's rollout_is with rollout_rs).
    """

    criteria: str = param(
        "seq_mean_k3",
        help="verl's rollout_rs: comma-separated criteria from token_k1..seq_max_k3 (all must pass)",
    )
    thresholds: str = param(
        "0.01",
        help="verl's rollout_rs_threshold: one value, or one per criterion (comma-separated); a k1 "
        "criterion takes 'lower_upper' ratio bounds (a single u means [1/u, u])",
    )
    is_level: str = param("none", help="also return truncated IS weights: 'none', 'token' or 'sequence'")
    is_threshold: float = param(2.0, help="upper truncation of those IS weights")
    mode: str = param("decoupled", help=_MODE_HELP)
    token_veto_threshold: float | None = param(None, help=_VETO_HELP)

    def __post_init__(self) -> None:
        parse_criteria(self.criteria, self.thresholds)  # fails early, with the allowed values
        if self.is_level not in ("none", "token", "sequence"):
            raise ValueError(f"is_level must be 'none', 'token' or 'sequence', got {self.is_level!r}")


_NEEDS_OLD = {"needs_old_log_probs": True}


@hookimpl
def rlzoo_register_rollout_corrections(registry: Registrar[CorrectionFn]) -> None:
    registry.register(
        "none", f"{_IMPL}:none", params=NoCorrectionParams, capabilities={"needs_old_log_probs": False}
    )
    registry.register(
        "token_is", f"{_IMPL}:token_is", params=TokenISParams, capabilities=_NEEDS_OLD, aliases=("tis",)
    )
    registry.register(
        "seq_is", f"{_IMPL}:seq_is", params=SeqISParams, capabilities={**_NEEDS_OLD, "sequence_level": True}
    )
    registry.register("icepop", f"{_IMPL}:icepop", params=IcePopParams, capabilities=_NEEDS_OLD)
    registry.register("rejection", f"{_IMPL}:rejection", params=RejectionParams, capabilities=_NEEDS_OLD)

"""Per-micro-batch objectives composed from the selected parts.

A train backend calls ``objective(micro_batch, log_probs, entropy)`` for each micro-batch and
back-propagates the returned loss; the aggregation inside is bound to the **whole mini-batch's**
token / sequence counts, so gradients summed over micro-batches (and data-parallel ranks) equal
the full-batch gradient. Loss-like metrics are accumulated here the same way and read with
:meth:`PolicyObjective.summary` after the update.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlzoo.kernel.batch import Batch
from rlzoo.kernel.protocols import AggContext, PolicyLossInputs, TeacherDivergenceLoss
from rlzoo.recipe.types import Selection
from rlzoo.report.metrics import to_float
from rlzoo.train_kit.formulas import make_agg_context, value_loss


def agg_context(mini_batch: Batch, max_response_length: int | None = None) -> AggContext:
    return make_agg_context(mini_batch["response_mask"], max_response_length)


def _bind(loss_agg: Selection, ctx: AggContext) -> Any:
    fn = loss_agg.fn
    params = loss_agg.params

    def agg(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return fn(per_token, mask, ctx, params)

    return agg


class _Accumulator:
    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)  # additive (already globally normalised)
        self.means: dict[str, list[float]] = defaultdict(list)  # per micro-batch values

    def add(self, key: str, value: Any) -> None:
        f = to_float(value)
        if f is not None:
            self.sums[key] += f

    def mean(self, key: str, value: Any) -> None:
        f = to_float(value)
        if f is not None:
            self.means[key].append(f)

    def summary(self) -> dict[str, float]:
        out = dict(self.sums)
        out.update({k: sum(v) / len(v) for k, v in self.means.items() if v})
        return out

    # -- merging data-parallel ranks (:class:`rlzoo.kernel.protocols.MetricAccumulator`) -------------
    def mark(self) -> tuple[dict[str, float], dict[str, int]]:
        """What this accumulator holds now (sums, and how many values each mean has)."""
        return dict(self.sums), {k: len(v) for k, v in self.means.items()}

    def since(self, mark: tuple[dict[str, float], dict[str, int]]) -> dict[str, Any]:
        """What was added after ``mark``: additive sums, and the new per-micro-batch values."""
        sums0, lens0 = mark
        return {
            "sums": {k: v - sums0.get(k, 0.0) for k, v in self.sums.items()},
            "means": {k: list(v[lens0.get(k, 0) :]) for k, v in self.means.items()},
        }

    def merge(self, mark: tuple[dict[str, float], dict[str, int]], added: Sequence[dict[str, Any]]) -> None:
        """Back to ``mark``, then add every rank's :meth:`since`: sums are summed over ranks (each
        already globally normalised), per-micro-batch values concatenated (in rank order)."""
        sums0, lens0 = mark
        for k in list(self.sums):
            self.sums[k] = sums0.get(k, 0.0)
        for k in list(self.means):
            del self.means[k][lens0.get(k, 0) :]
        for part in added:
            for k, v in part["sums"].items():
                self.sums[k] += v
            for k, vs in part["means"].items():
                self.means[k].extend(vs)


@dataclass
class PolicyObjective:
    """policy_loss ∘ loss_agg  (+ kl_coef · agg(kl(logp, ref)))  (+ teacher_kl_coef · agg(kl(logp, teacher)))
    (− entropy_coeff · agg(entropy))."""

    policy_loss: Selection
    loss_agg: Selection
    ctx: AggContext
    kl_loss: Selection | None = None
    kl_coef: float = 0.0
    entropy_coeff: float = 0.0
    #: the teacher-KL loss term (RL + distillation): its estimator and coefficient; None / 0: off
    teacher_kl_loss: Selection | None = None
    teacher_kl_coef: float = 0.0
    #: ``fn(old, rollout, mask) -> metrics`` (rollout-vs-trainer drift), used when the micro-batch
    #: has no ``old_log_probs`` (an exactly on-policy update: they are this forward's, detached);
    #: measured once over all micro-batches, in :meth:`summary`
    offpolicy_metrics: Any = None

    def __post_init__(self) -> None:
        self.agg = _bind(self.loss_agg, self.ctx)
        self.acc = _Accumulator()
        #: the divergence to the teacher's whole distribution the backend computes in the update's
        #: forward (rlzoo.kernel.protocols.DistillingObjective), for a needs_teacher_distribution loss
        self.teacher_divergence: Any = None
        if self.policy_loss.caps.needs_teacher_distribution:
            fn = self.policy_loss.fn
            if not isinstance(fn, TeacherDivergenceLoss):
                raise TypeError(
                    f"policy loss {self.policy_loss.name!r} declares needs_teacher_distribution, but "
                    f"{type(fn).__name__} has no divergence(student_logits, teacher_logits, params) "
                    "(rlzoo.kernel.protocols.TeacherDivergenceLoss)"
                )
            self.teacher_divergence = functools.partial(fn.divergence, params=self.policy_loss.params)
        self.needs_entropy = True  # entropy is always reported as a metric; cheap next to the forward
        self._drift: list[tuple[Tensor, Tensor, Tensor]] = []  # (old, rollout, mask) per micro-batch

    def __call__(
        self, mb: Batch, log_probs: torch.Tensor, entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        mask = mb["response_mask"]  # [b, T]
        old = mb.get("old_log_probs")  # [b, T]
        if old is None:  # exactly on-policy (the old-log-prob forward was skipped): pi_old = pi_theta
            old = log_probs.detach()
            if self.offpolicy_metrics is not None and "rollout_log_probs" in mb:
                self._drift.append((old, mb["rollout_log_probs"], mask))
        inputs = PolicyLossInputs(
            log_probs=log_probs,  # [b, T]
            old_log_probs=old,  # [b, T]
            advantages=mb["advantages"],  # [b, T]
            response_mask=mask,
            agg=self.agg,
            rollout_is_weights=mb.get("rollout_is_weights"),
            entropy=entropy,
            teacher_divergence=mb.get("teacher_divergence"),
        )
        out = self.policy_loss(inputs)
        loss = out.loss
        self.acc.add("actor/pg_loss", loss.detach())
        for k, v in out.metrics.items():
            self.acc.mean(f"actor/{k}", v)
        if entropy is not None:
            ent = self.agg(entropy, mask)
            self.acc.add("actor/entropy", ent.detach())
            if self.entropy_coeff:
                loss = loss - self.entropy_coeff * ent
        if self.kl_loss is not None and self.kl_coef:
            kl = self.kl_loss(log_probs, mb["ref_log_probs"])  # [b, T]
            kl_value = self.agg(kl, mask)
            self.acc.add("actor/kl_loss", kl_value.detach())
            loss = loss + self.kl_coef * kl_value
        if self.teacher_kl_loss is not None and self.teacher_kl_coef:
            tkl = self.teacher_kl_loss(log_probs, mb["teacher_log_probs"])  # [b, T]
            tkl_value = self.agg(tkl, mask)
            self.acc.add("actor/teacher_kl_loss", tkl_value.detach())
            loss = loss + self.teacher_kl_coef * tkl_value
        self.acc.add("actor/loss", loss.detach())
        return loss, {}

    def summary(self) -> dict[str, float]:
        if self._drift:  # the drift of the whole update, from one call (not one per micro-batch)
            parts, self._drift = self._drift, []
            width = max(p[0].shape[-1] for p in parts)
            old, rollout, mask = (
                torch.cat([torch.nn.functional.pad(p[i], (0, width - p[i].shape[-1])) for p in parts])
                for i in range(3)
            )  # [B, T] each; padded columns are masked out
            for k, v in self.offpolicy_metrics(old, rollout, mask).items():
                self.acc.mean(k if k.startswith("rollout_corr/") else f"rollout_corr/{k}", v)
        return self.acc.summary()


@dataclass
class ValueObjective:
    """Clipped value loss for the critic, aggregated like the policy loss."""

    loss_agg: Selection
    ctx: AggContext
    cliprange_value: float = 0.5

    def __post_init__(self) -> None:
        self.agg = _bind(self.loss_agg, self.ctx)
        self.acc = _Accumulator()
        self.needs_entropy = False

    def __call__(
        self, mb: Batch, values: torch.Tensor, _unused: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        loss, metrics = value_loss(
            values, mb["values"], mb["returns"], mb["response_mask"], self.agg, self.cliprange_value
        )
        self.acc.add("critic/vf_loss", loss.detach())
        for k, v in metrics.items():
            self.acc.mean(f"critic/{k}", v)
        return loss, {}

    def summary(self) -> dict[str, float]:
        return self.acc.summary()

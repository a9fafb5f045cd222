"""Train kit: the LR schedule and the pieces of the update every train backend runs.

A backend owns its update: its ``update_policy`` / ``update_critic`` picks the LR of its next step
from :class:`LRSchedule`, hands its own forward (a closure) and micro-batches to the functions
below, and counts the steps it took. Nothing here calls a backend or reads its attributes.

- :class:`LRSchedule`: the LR of optimizer step ``s`` (0-based) of the actor or the critic, a pure
  function of ``s`` and ``trainer.optim`` (:func:`lr_multiplier`: verl's / HF's schedules), and
  the record of its position a checkpoint keeps.
- :func:`needs_entropy`: whether an objective wants the per-token entropy (its declared contract).
- :func:`accumulate`: the micro-batch loop of one update: forward, ``objective(mb, out, entropy)``,
  ``loss.backward()`` per micro-batch; gradients accumulate unscaled (the objective normalises by
  the mini-batch's global counts). ``None`` micro-batches are dummy passes (loss times zero) that
  keep a rank's collectives in step with the others'.
- :func:`optimizer_step`: clip, then step at the scheduled LR (:func:`set_lr`) unless the loss or
  the gradient norm is not finite (the step is skipped and the gradients dropped);
  :func:`warn_skipped` and :func:`step_metrics` say what happened.
- :func:`run_update`: one step of a :class:`Target` (the actor or the critic): the two above, with
  a data-parallel backend's :class:`Ranks` (loss sum, skip verdict, metrics merge) around them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from rlzoo.kernel.batch import Batch
from rlzoo.kernel.protocols import DistillingObjective, Objective
from rlzoo.kernel.settings import OptimSettings, TrainSpec
from rlzoo.system.machine import release_freed_memory

__all__ = [
    "Forward",
    "LRSchedule",
    "OneProcess",
    "Ranks",
    "Target",
    "accumulate",
    "clip_grad_norm",
    "lr_multiplier",
    "mean_metrics",
    "needs_entropy",
    "optimizer_step",
    "run_update",
    "set_lr",
    "step_metrics",
    "teacher_divergence",
    "warn_skipped",
]

logger = logging.getLogger(__name__)

Forward = Callable[[Batch], tuple[Tensor, Tensor | None]]
"""``forward(micro_batch) -> (log_probs or values [b, T], entropy [b, T] | None)``."""


def lr_multiplier(
    step: int, *, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0
) -> float:
    """LR of optimizer step ``step`` (0-based) as a fraction of the peak LR.

    verl / HF conventions (``verl/utils/torch_functional.py``), ``W`` warmup steps, ``N`` total::

        constant: s < W: s / W                 else 1
        linear:   s < W: m + (1 - m) s / W     else m + (1 - m) max(0, (N - s) / (N - W))
        cosine:   s < W: m + (1 - m) s / W     else m + (1 - m) (1 + cos(pi p)) / 2,
                  p = min(1, (s - W) / (N - W))

    (the first warmup step has multiplier ``m``, 0 by default, as in HF).
    """
    m = 0.0 if schedule == "constant" else min_lr_ratio
    if step < warmup_steps:
        return m + (1.0 - m) * step / max(1, warmup_steps)
    if schedule == "constant":
        return 1.0
    decay = max(1, total_steps - warmup_steps)
    if schedule == "linear":
        return m + (1.0 - m) * max(0.0, (total_steps - step) / decay)
    if schedule == "cosine":
        p = min(1.0, (step - warmup_steps) / decay)
        return m + (1.0 - m) * 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"unknown lr schedule {schedule!r}")


@dataclass(frozen=True)
class LRSchedule:
    """The actor's and the critic's LR per optimizer step (``trainer.optim``, ``spec.total_steps``).

    ``warmup_steps``: ``optim.warmup_steps``, else ``warmup_ratio`` of ``total_steps``; the critic's:
    its own ``critic_warmup_steps`` / ``critic_warmup_ratio`` where either is set, else the actor's.
    """

    optim: OptimSettings
    total_steps: int
    warmup_steps: int
    critic_warmup_steps: int

    @classmethod
    def from_spec(cls, spec: TrainSpec) -> LRSchedule:
        optim = spec.optim
        total = max(1, spec.total_steps)
        warmup = int(optim.warmup_steps or int(optim.warmup_ratio * total))
        if optim.critic_warmup_steps is None and optim.critic_warmup_ratio is None:
            critic_warmup = warmup
        else:
            critic_warmup = int(optim.critic_warmup_steps or int((optim.critic_warmup_ratio or 0.0) * total))
        return cls(optim, spec.total_steps, warmup, critic_warmup)

    def lr(self, step: int, *, critic: bool = False) -> float:
        """The LR of optimizer step ``step`` (0-based) of the actor or the critic."""
        o = self.optim
        if critic:
            peak, warmup = o.critic_lr, self.critic_warmup_steps
            schedule = o.critic_lr_scheduler or o.lr_scheduler
            floor = o.min_lr_ratio if o.critic_min_lr_ratio is None else o.critic_min_lr_ratio
        else:
            peak, warmup, schedule, floor = o.lr, self.warmup_steps, o.lr_scheduler, o.min_lr_ratio
        return float(
            peak
            * lr_multiplier(
                step,
                schedule=schedule,
                warmup_steps=warmup,
                total_steps=max(1, self.total_steps),
                min_lr_ratio=floor,
            )
        )

    def record(self, actor_steps: int, critic_steps: int) -> dict[str, Any]:
        """The schedule's position, as a checkpoint's ``meta.json`` keeps it."""
        o = self.optim
        return {
            "actor": {"steps": actor_steps, "next_lr": self.lr(actor_steps)},
            "critic": {
                "steps": critic_steps,
                "next_lr": self.lr(critic_steps, critic=True),
                "schedule": o.critic_lr_scheduler or o.lr_scheduler,
                "warmup_steps": self.critic_warmup_steps,
            },
            "schedule": o.lr_scheduler,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
        }


@dataclass(frozen=True)
class Target:
    """The model one update steps (the actor or the critic), its optimizer, LR and clip."""

    module: nn.Module
    optimizer: torch.optim.Optimizer
    lr: float
    grad_clip: float
    prefix: str
    """The metrics' prefix: "actor" or "critic"."""

    @classmethod
    def at_step(
        cls,
        prefix: str,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        schedule: LRSchedule,
        steps: int,
        optim: OptimSettings,
    ) -> Target:
        """The ``prefix`` model's ("actor" or "critic") step number ``steps`` (0-based): its LR from
        the schedule, its clip from ``optim``."""
        critic = prefix == "critic"
        clip = optim.critic_grad_clip if critic else optim.grad_clip
        return cls(module, optimizer, schedule.lr(steps, critic=critic), clip, prefix)

    def taken(self, metrics: Mapping[str, float]) -> int:
        """1 when the step this target ran was taken (a backend's step counter advances), 0 when skipped."""
        return 0 if metrics[f"{self.prefix}/skipped_steps"] else 1


class Ranks(Protocol):
    """The data-parallel ranks of one update, as :func:`run_update` joins them."""

    @property
    def rank(self) -> int: ...
    @property
    def world(self) -> int: ...
    def sum_loss(self, total: Tensor) -> Tensor:
        """The summed loss over all ranks."""
        ...

    def agree(self, bad: bool) -> bool:
        """Whether any rank's loss or gradient norm is not finite (every rank skips together)."""
        ...

    def mark(self, objective: Objective) -> Any:
        """What to merge from after the update (e.g. the objective's accumulator now)."""
        ...

    def metrics(self, collected: dict[str, list[Any]], objective: Objective, mark: Any) -> dict[str, float]:
        """The objective's metrics over every rank's micro-batches (and its accumulator merged)."""
        ...


class OneProcess:
    """:class:`Ranks` of a one-process backend: nothing to join."""

    rank = 0
    world = 1

    def sum_loss(self, total: Tensor) -> Tensor:
        return total

    def agree(self, bad: bool) -> bool:
        return bad

    def mark(self, objective: Objective) -> None:
        return None

    def metrics(self, collected: dict[str, list[Any]], objective: Objective, mark: Any) -> dict[str, float]:
        return mean_metrics(collected)


def needs_entropy(objective: Objective) -> bool:
    """Whether ``objective`` wants the per-token entropy (its declared ``needs_entropy``)."""
    try:
        return bool(objective.needs_entropy)
    except AttributeError:
        raise TypeError(
            f"update_policy: {objective!r} is not an rlzoo.kernel.protocols.Objective: it declares no "
            "needs_entropy (a bool: whether the backend computes and passes the per-token entropy)"
        ) from None


def teacher_divergence(objective: Objective) -> Callable[[Tensor, Tensor], Tensor] | None:
    """The divergence to the teacher ``objective`` wants computed in the update's forward
    (:class:`rlzoo.kernel.protocols.DistillingObjective`), or None."""
    if isinstance(objective, DistillingObjective):
        return objective.teacher_divergence
    return None


def accumulate(
    micro_batches: Iterable[Batch | None],
    objective: Objective,
    forward: Forward,
    *,
    device: torch.device,
    dummy: Callable[[], Batch] | None = None,
) -> tuple[Tensor, dict[str, list[Any]]]:
    """Forward and backward every micro-batch (already on the device); the summed loss (fp32
    scalar, detached) and each objective metric's per-micro-batch values (tensors kept on the
    device: no sync per micro-batch). ``None``: a dummy pass over ``dummy()`` whose loss is
    times zero (the same collectives, no gradient)."""
    collected: dict[str, list[Any]] = {}
    total_loss = torch.zeros((), device=device)
    for mb in micro_batches:
        if mb is None:
            if dummy is None:
                raise ValueError("accumulate: a dummy micro-batch (None) needs dummy=")
            out, _ = forward(dummy())
            (out.sum() * 0.0).backward()
            continue
        out, entropy = forward(mb)
        loss, mb_metrics = objective(mb, out, entropy)
        loss.backward()  # summed, never averaged: the objective divides by global counts
        total_loss += loss.detach().float()
        for k, v in mb_metrics.items():
            collected.setdefault(k, []).append(v.detach().float() if isinstance(v, Tensor) else v)
    return total_loss, collected


def run_update(
    target: Target,
    micro_batches: Iterable[Batch | None],
    objective: Objective,
    forward: Forward,
    *,
    device: torch.device,
    num_micro_batches: int,
    ranks: Ranks | None = None,
    dummy: Callable[[], Batch] | None = None,
) -> dict[str, float]:
    """One optimizer step of ``target`` over ``micro_batches`` (:func:`accumulate`, then
    :func:`optimizer_step`, skipped on every rank when any rank's loss or gradient norm is not
    finite). Metrics: the objective's (mean over micro-batches) and :func:`step_metrics`."""
    ranks = ranks if ranks is not None else OneProcess()
    target.module.train()
    target.optimizer.zero_grad(set_to_none=True)
    mark = ranks.mark(objective)
    total, collected = accumulate(micro_batches, objective, forward, device=device, dummy=dummy)
    loss_value, norm_value, skipped = optimizer_step(
        target.module,
        target.optimizer,
        loss=ranks.sum_loss(total),
        grad_clip=target.grad_clip,
        lr=target.lr,
        device=device,
        agree=ranks.agree,
    )
    if skipped and ranks.rank == 0:
        warn_skipped(target.prefix, loss=loss_value, grad_norm=norm_value, world=ranks.world)
    metrics = ranks.metrics(collected, objective, mark)
    metrics.update(
        step_metrics(
            target.prefix,
            loss=loss_value,
            grad_norm=norm_value,
            lr=target.lr,
            skipped=skipped,
            num_micro_batches=num_micro_batches,
        )
    )
    if device.type == "cpu":  # the step's freed activations back to the OS, or the process grows
        release_freed_memory()
    return metrics


def floats(collected: Mapping[str, list[Any]]) -> dict[str, list[float]]:
    """:func:`accumulate`'s metrics as plain floats."""
    return {k: [float(v) for v in vs] for k, vs in collected.items()}


def mean_metrics(collected: Mapping[str, list[Any]]) -> dict[str, float]:
    """The mean of each metric's values (those with none are left out)."""
    return {k: sum(vs) / len(vs) for k, vs in floats(collected).items() if vs}


def clip_grad_norm(module: nn.Module, grad_clip: float, device: torch.device) -> Tensor:
    """Clip the gradients of ``module`` to ``grad_clip`` (no clipping when <= 0); the total norm.

    A plain tensor also for sharded (DTensor) gradients; zero when no parameter has a gradient.
    """
    grads = [p for p in module.parameters() if p.requires_grad and p.grad is not None]
    if not grads:
        return torch.zeros((), device=device)
    norm = torch.nn.utils.clip_grad_norm_(grads, grad_clip if grad_clip > 0 else math.inf)
    full = getattr(norm, "full_tensor", None)  # a DTensor (FSDP2): the global norm
    return full() if full is not None else norm  # type: ignore[no-any-return]


def optimizer_step(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    loss: Tensor,
    grad_clip: float,
    lr: float,
    device: torch.device,
    agree: Callable[[bool], bool] | None = None,
) -> tuple[float, float, bool]:
    """Clip, then step at ``lr`` unless the loss or grad norm is not finite; drop the gradients.

    ``agree(bad)`` turns this process's verdict into the one every rank acts on (default: as is).
    Returns ``(loss, grad_norm, skipped)``.
    """
    grad_norm = clip_grad_norm(module, grad_clip, device)
    loss_value, norm_value = float(loss), float(grad_norm)
    bad = not (math.isfinite(loss_value) and math.isfinite(norm_value))
    skipped = agree(bad) if agree is not None else bad
    if not skipped:
        set_lr(optimizer, lr)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_value, norm_value, skipped


def set_lr(optimizer: Any, lr: float) -> None:
    """Set the LR of every parameter group of ``optimizer`` (a torch or megatron optimizer)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def warn_skipped(prefix: str, *, loss: float, grad_norm: float, world: int) -> None:
    """Log a skipped ``prefix`` ("actor" / "critic") step (one rank of ``world`` logs it)."""
    logger.warning(
        "%s update skipped%s: non-finite %s (loss=%s, grad_norm=%s); gradients dropped",
        prefix,
        "" if world == 1 else f" on all {world} ranks",
        "loss or grad norm" if world > 1 else "loss" if not math.isfinite(loss) else "grad norm",
        loss,
        grad_norm,
    )


def step_metrics(
    prefix: str, *, loss: float, grad_norm: float, lr: float, skipped: bool, num_micro_batches: int
) -> dict[str, float]:
    """The ``{prefix}/...`` metrics every update returns."""
    return {
        f"{prefix}/loss": loss,
        f"{prefix}/grad_norm": grad_norm,
        f"{prefix}/lr": lr,
        f"{prefix}/skipped_steps": float(skipped),
        f"{prefix}/num_micro_batches": float(num_micro_batches),
    }

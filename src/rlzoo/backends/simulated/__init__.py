"""The ``simulated`` rollout and train backends (import-light: params + registration, no torch).

They burn wall-clock time instead of compute, with the cost model of a real deployment (see
:mod:`rlzoo.backends.simulated.backend`), so runners can be benchmarked and tested on any laptop:
``rollout.backend=simulated trainer.backend=simulated``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl
from rlzoo.kernel.params import param

if TYPE_CHECKING:
    from rlzoo.kernel.registry import PartFactory, Registrar


@dataclass(frozen=True)
class SimulatedRolloutParams:
    """Simulated rollout: continuous batching whose decode steps cost time, long-tailed response lengths.

    ``devices * slots_per_device`` sequences decode together; every decode step costs
    ``decode_step_s`` for the whole running batch (so one long response holds its slot and, in a
    batch-synchronous loop, the whole batch). Response lengths are drawn per sample from a
    log-normal with mean ``mean_response_length`` and shape ``sigma`` (long tail), capped at
    ``data.max_response_length`` (finish reason ``length``). Tokens and log-probs are deterministic
    functions of the request seed; every token records the policy version it was produced under.
    Supports streaming, pause / resume keeping tokens, and weight updates between decode steps.
    """

    devices: int = param(1, help="devices of the rollout pool (slots scale with it)")
    slots_per_device: int = param(32, help="sequences decoded together per device")
    decode_step_s: float = param(0.002, help="seconds per decode step of the whole running batch")
    mean_response_length: float = param(64.0, help="mean of the log-normal response length (tokens)")
    sigma: float = param(1.0, help="shape of the log-normal: larger = longer tail")
    update_weights_s: float = param(0.0, help="seconds a weight update takes")
    token_low: int = param(3, help="smallest token id produced")
    token_high: int = param(13, help="one past the largest token id produced")


@dataclass(frozen=True)
class SimulatedTrainParams:
    """Simulated trainer: log-probs and updates cost time proportional to tokens; weights are a counter.

    ``compute_log_probs`` sleeps ``forward_s_per_token * tokens / devices`` and returns the rollout
    log-probs (ratios of 1); ``update_policy`` sleeps ``update_s_per_token * tokens / devices``,
    evaluates the objective on those log-probs (so loss metrics are real) and bumps ``version``.
    """

    devices: int = param(1, help="devices of the trainer pool (time scales with 1 / devices)")
    forward_s_per_token: float = param(2e-6, help="seconds per token of a forward pass on one device")
    update_s_per_token: float = param(6e-6, help="seconds per token of a forward + backward on one device")
    export_s: float = param(0.0, help="seconds exporting weights takes")
    checkpoint_bytes: int = param(4096, help="bytes of the weights file a checkpoint writes")
    checkpoint_s: float = param(
        0.0, help="seconds a checkpoint write takes (spent half-way through the weights)"
    )


_ROLLOUT = "rlzoo.backends.simulated.backend:SimulatedRolloutBackend"
_ROLLOUT_CAPS = {"supports_partial_rollout": True, "supports_streaming": True, "devices": ["cpu"]}


@hookimpl
def rlzoo_register_rollout_backends(registry: Registrar[PartFactory]) -> None:
    registry.register("simulated", _ROLLOUT, params=SimulatedRolloutParams, capabilities=_ROLLOUT_CAPS)


_TRAIN = "rlzoo.backends.simulated.backend:SimulatedTrainBackend"
_TRAIN_CAPS = {"devices": ["cpu"], "supports_critic": True, "distributed": False}


@hookimpl
def rlzoo_register_train_backends(registry: Registrar[PartFactory]) -> None:
    registry.register("simulated", _TRAIN, params=SimulatedTrainParams, capabilities=_TRAIN_CAPS)

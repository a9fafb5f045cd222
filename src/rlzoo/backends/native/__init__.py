"""The native backends: a one-process torch trainer and a continuous-batching rollout engine.

Both run any Hugging Face causal LM loaded by path, on CPU or one GPU. They are what the quickstart
and the tests use, and the reference the distributed backends are checked against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlzoo import hookimpl
from rlzoo.backends.native.rollout_params import NativeRolloutParams
from rlzoo.backends.native.train_params import NativeTrainParams

if TYPE_CHECKING:
    from rlzoo.kernel.registry import PartFactory, Registrar


_TRAIN = "rlzoo.backends.native.train:NativeTrainBackend"
_TRAIN_CAPS = {
    "devices": ["cpu", "cuda"],
    "supports_critic": True,
    "distributed": False,
    "supplies_sum_pi_squared": True,
    "supports_lora": True,
    "supports_teacher": True,
    "supplies_teacher_divergence": True,
}


@hookimpl
def rlzoo_register_train_backends(registry: Registrar[PartFactory]) -> None:
    registry.register("native", _TRAIN, params=NativeTrainParams, capabilities=_TRAIN_CAPS)


_ROLLOUT = "rlzoo.backends.native.rollout:NativeRolloutBackend"
_ROLLOUT_CAPS = {
    "supports_partial_rollout": True,
    "supports_streaming": True,
    "supports_lora": True,
    "records_routes": True,
    "devices": ["cpu", "cuda"],
}


@hookimpl
def rlzoo_register_rollout_backends(registry: Registrar[PartFactory]) -> None:
    registry.register("native", _ROLLOUT, params=NativeRolloutParams, capabilities=_ROLLOUT_CAPS)

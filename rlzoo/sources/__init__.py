"""Built-in runners (kind ``runner``): the batch sources that feed the core's one loop (:mod:`rlzoo.train.loop`).

Import-light: each runner's code is imported only when it is used.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlzoo import hookimpl


@dataclass(frozen=True)
class SyncParams:
    """Synchronous on-policy loop: generate a whole batch, score it, train on it, sync weights.

    The slowest response of a batch gates the step (see ``fully_async`` for overlap). Validation
    runs before training (``trainer.val_before_train``) and every ``trainer.test_freq`` steps;
    checkpoints every ``trainer.save_freq`` steps.
    """


@hookimpl
def rlzoo_register_runners(registry):  # type: ignore[no-untyped-def]
    registry.register(
        "sync",
        "rlzoo.sources.sync:SyncRunner",
        params=SyncParams,
        capabilities={"placements": ["local", "ray"]},
    )


# ---------------------------------------------------------------------------------------------
# Asynchronous runners (issue "fully-async and one-step-off runners"); params in async_params.py
# ---------------------------------------------------------------------------------------------
@hookimpl(specname="rlzoo_register_runners")
def rlzoo_register_async_runners(registry):  # type: ignore[no-untyped-def]
    from rlzoo.sources.params import FullyAsyncParams, OneStepOffParams

    registry.register(
        "fully_async",
        "rlzoo.sources.fully_async:FullyAsyncRunner",
        params=FullyAsyncParams,
        capabilities={"placements": ["local", "ray"]},
    )
    registry.register(
        "one_step_off",
        "rlzoo.sources.one_step_off:OneStepOffRunner",
        params=OneStepOffParams,
        capabilities={"placements": ["local", "ray"]},
    )

"""Built-in runners (kind ``runner``): the loops that move batches between parts.

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
        "rlzoo.runners.sync:SyncRunner",
        params=SyncParams,
        capabilities={"placements": ["local", "ray"]},
    )

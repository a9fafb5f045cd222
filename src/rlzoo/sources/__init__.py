"""Built-in runners (kind ``runner``): the batch sources (and ``sft``, demonstrations) that feed the core's one loop (:mod:`rlzoo.train.loop`).

A runner is registered as its batch-source factory ``(params, session) -> BatchSource``; here the
source classes themselves. Import-light: a source's code is imported only when a run uses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlzoo import hookimpl
from rlzoo.sources.params import FullyAsyncParams, OneStepOffParams, SFTParams, SyncParams

if TYPE_CHECKING:
    from rlzoo.kernel.registry import PartFactory, Registrar


@hookimpl
def rlzoo_register_runners(registry: Registrar[PartFactory]) -> None:
    both = {"placements": ["local", "ray"]}
    registry.register("sync", "rlzoo.sources.sync:GenerateNow", params=SyncParams, capabilities=both)
    registry.register(
        "one_step_off",
        "rlzoo.sources.one_step_off:GenerateOneAhead",
        params=OneStepOffParams,
        capabilities=both,
    )
    registry.register(
        "fully_async", "rlzoo.sources.fully_async:StreamFromQueue", params=FullyAsyncParams, capabilities=both
    )
    registry.register("sft", "rlzoo.sources.sft:FromDemonstrations", params=SFTParams, capabilities=both)

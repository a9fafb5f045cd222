"""Built-in sample filters (kind ``sample_filter``): params and registration.

Import-light: the tensor code lives in :mod:`rlzoo.algorithms.functional.filters`. See
``docs/components/sample_filter.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl, param

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import SampleFilterFn
    from rlzoo.kernel.registry import Registrar

_IMPL = "rlzoo.algorithms.functional.filters"


@dataclass(frozen=True)
class NoFilterParams:
    """Keep every sample."""


@dataclass(frozen=True)
class DynamicSamplingParams:
    """DAPO dynamic sampling: drop groups whose responses all got the same reward (std 0).

    Such groups give zero group-relative advantage and no gradient. The runner regenerates
    (capability refills) until the batch is full, at most max_num_gen_batches generation rounds.
    Yu et al. 2025, DAPO, https://arxiv.org/abs/2503.14476.
    """

    metric: str = param(
        "reward", help="per-sample value the runner passes as rewards (e.g. 'reward', 'score', 'acc')"
    )
    max_num_gen_batches: int = param(
        0, help="read by the runner: most generation rounds to fill one batch (0 = unlimited)"
    )
    keep_singletons: bool = param(True, help="keep groups of one response (verl does)")


@hookimpl
def rlzoo_register_sample_filters(registry: Registrar[SampleFilterFn]) -> None:
    registry.register("none", f"{_IMPL}:none", params=NoFilterParams, capabilities={})
    registry.register(
        "dynamic_sampling",
        f"{_IMPL}:dynamic_sampling",
        params=DynamicSamplingParams,
        capabilities={"needs_group": True, "refills": True},
        aliases=("dapo",),
    )

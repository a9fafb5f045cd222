"""Placements: where the backends run. Runners ask a placement for backends and never care where they live.

``local``: everything in this process (the quickstart's and the tests' default).
``ray``: backends become Ray actors on resource pools; the handles returned here expose the same
methods, so runner code does not change (see :mod:`rlzoo.distributed.ray_placement`).
"""

from __future__ import annotations

from typing import Any

from rlzoo.kernel.settings import RolloutSpec, TrainSpec
from rlzoo.recipe.types import PlacementSection, Selection


class LocalPlacement:
    """Build backends in this process."""

    name = "local"

    def train_backend(self, sel: Selection, spec: TrainSpec) -> Any:
        return sel.fn(sel.params, spec)

    def rollout_backend(self, sel: Selection, spec: RolloutSpec) -> Any:
        return sel.fn(sel.params, spec)

    def shutdown(self) -> None:
        return None


def make_placement(settings: PlacementSection) -> Any:
    """The placement ``settings.name`` names (the recipe's ``placement`` section)."""
    if settings.name == "ray":
        from rlzoo.distributed.ray_placement import RayPlacement

        return RayPlacement(settings)
    return LocalPlacement()

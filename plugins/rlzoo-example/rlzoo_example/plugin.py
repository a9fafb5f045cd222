"""The hook implementations of rlzoo-example (named by the ``rlzoo`` entry point).

This module is import-light on purpose: it holds the params dataclasses and the registrations, and
names the implementations as ``"module:attr"`` strings. rlzoo imports them the first time a part is
used, so listing parts (``rlzoo components``) stays fast and never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlzoo import Registrar, hookimpl, param
from rlzoo.kernel.protocols import AdvantageFn, ScorerFn

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"


@dataclass(frozen=True)
class ExampleRLOOParams:
    """REINFORCE leave-one-out: each response's reward minus the mean reward of the others in its group.

    r_i is the response's outcome reward (its token rewards summed over the response), and for a
    group of n responses to the same prompt::

        A_i = r_i - baseline_weight * (sum_group - r_i) / (n - 1)

    broadcast over the response's tokens (zero where the response mask is 0). A group of one has no
    other responses and keeps A_i = r_i. ``returns`` equal the advantages. Ahmadian et al. 2024,
    https://arxiv.org/abs/2402.14740.
    """

    baseline_weight: float = param(1.0, help="weight of the leave-one-out baseline (0: plain REINFORCE)")
    clip: float | None = param(None, help="clip advantages to [-clip, clip]; null: no clipping")

    def __post_init__(self) -> None:
        if self.clip is not None and self.clip <= 0:
            raise ValueError(f"clip must be positive or null, got {self.clip}")


@dataclass(frozen=True)
class KeywordParams:
    """Toy scorer: 1.0 when the keyword appears in the response, else 0.0.

    Ignores the ground truth. Useful to check that a reward signal flows end to end.
    """

    keyword: str = param("rlzoo", help="the text to look for in the response")
    case_sensitive: bool = param(False, help="match the keyword's case exactly")


@hookimpl
def rlzoo_register_advantages(registry: Registrar[AdvantageFn]) -> None:
    registry.register(
        "example_rloo",
        "rlzoo_example.advantage:example_rloo",  # imported on first use
        params=ExampleRLOOParams,
        capabilities={"needs_group": True},
    )


@hookimpl
def rlzoo_register_scorers(registry: Registrar[ScorerFn]) -> None:
    registry.register("example_keyword", "rlzoo_example.scorer:keyword_score", params=KeywordParams)


@hookimpl
def rlzoo_recipe_search_paths() -> list[str]:
    return [str(RECIPES_DIR)]

"""The tool-use arithmetic task: add two 3-digit numbers, with a ``calc`` tool or without.

Dataset ``tool_arithmetic`` writes ``train.parquet`` / ``val.parquet`` (rlzoo's schema, data source
``rlzoo/tool_arithmetic``; ``extra_info`` holds ``a`` and ``b``, which the ``tool_arithmetic``
environment reads) and ``model/``: a tiny Qwen2 with a word-level tokenizer of digits, ``+``,
``calc`` and ``Answer:`` whose chat template closes each assistant turn with ``<eos>`` and renders
tool results as ``<|tool|> ...`` (so an observation appends as the template's delta after the
model's stop token; see :mod:`rlzoo.agents.chat`). Numbers are written digit by digit.

Scorer ``tool_arithmetic``: 1.0 when the digits of the final turn (after ``Answer:`` if present)
equal the ground truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl, param

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import ScorerFn
    from rlzoo.kernel.registry import PartFactory, Registrar

_IMPL = "rlzoo.tasks._tools"


@dataclass(frozen=True)
class ToolArithmeticDataParams:
    """Tool-use arithmetic: ``a + b`` with ``a``, ``b`` of ``digits`` digits, plus a tiny model.

    Validation pairs are held out from training (no pair appears in both).
    """

    train_size: int = param(4096, ge=1, help="training prompts")
    val_size: int = param(64, ge=1, help="held-out validation prompts")
    digits: int = param(3, ge=1, le=6, help="digits of each number")
    sum_digits: int = param(
        0, ge=0, help="only pairs whose sum has this many digits (digits or digits + 1; 0: any)"
    )
    hidden_size: int = param(64, ge=8, help="hidden size of the tiny model")
    num_layers: int = param(2, ge=1, help="transformer layers of the tiny model")
    seed: int = param(0, help="seed of the model's initialisation and the data")
    overwrite: bool = param(False, help="rebuild even when the files exist")


@dataclass(frozen=True)
class ToolArithmeticScorerParams:
    """Tool arithmetic scorer: 1.0 when the final turn's digits (after ``Answer:``) equal the sum."""


@hookimpl
def rlzoo_register_datasets(registry: Registrar[PartFactory]) -> None:
    registry.register("tool_arithmetic", f"{_IMPL}:prepare", params=ToolArithmeticDataParams)


@hookimpl
def rlzoo_register_scorers(registry: Registrar[ScorerFn]) -> None:
    registry.register("tool_arithmetic", f"{_IMPL}:score", params=ToolArithmeticScorerParams)

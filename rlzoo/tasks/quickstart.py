"""The quickstart task: a synthetic digit task, a word-level tokenizer and a tiny model, all built offline.

Each prompt is ``<op> <a> <b>`` with ``op`` one of ``first`` / ``last`` and two different digits;
the answer is ``a`` for ``first`` and ``b`` for ``last``. The scorer gives 1.0 when the response's
first word is the answer. Validation prompts are held out from training (the model must learn the
rule, not a table). A ~100k-parameter Qwen2 model built from a config starts near chance
(about 1 in 20) and learns the task with GRPO in a couple of minutes on a laptop CPU.

Registered parts: dataset ``quickstart`` (writes train/val parquet, tokenizer and model into the
``data.dir`` folder), scorer ``quickstart``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlzoo import hookimpl, param

_IMPL = "rlzoo.tasks._quickstart"


@dataclass(frozen=True)
class QuickstartDataParams:
    """Synthetic digit task (first / last of two digits) with a tokenizer and a tiny model, offline.

    Writes ``train.parquet``, ``val.parquet`` (rlzoo's schema, data_source ``rlzoo/quickstart``)
    and ``model/`` (a Qwen2 config with random weights and a word-level tokenizer with a chat
    template) into the output folder.
    """

    train_size: int = param(2048, help="training prompts (drawn from the 180 - val_size distinct prompts)")
    val_size: int = param(40, help="distinct prompts held out for validation")
    hidden_size: int = param(64, help="hidden size of the tiny model")
    num_layers: int = param(2, help="transformer layers of the tiny model")
    seed: int = param(0, help="seed of the model's random initialisation and the data order")
    overwrite: bool = param(False, help="rebuild even when the files exist")


@dataclass(frozen=True)
class QuickstartScorerParams:
    """Quickstart scorer: 1.0 when the response's first word equals the answer, else 0.0."""


@hookimpl
def rlzoo_register_datasets(registry):  # type: ignore[no-untyped-def]
    registry.register("quickstart", f"{_IMPL}:prepare", params=QuickstartDataParams)


@hookimpl
def rlzoo_register_scorers(registry):  # type: ignore[no-untyped-def]
    registry.register("quickstart", f"{_IMPL}:score", params=QuickstartScorerParams)
